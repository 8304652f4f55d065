//! `stevedore cache`: list and remove named caches (volumes of kind `cache`; a worker's
//! reclaim never removes them).

use crate::common::{self, Global};
use crate::error::CliError;

/// `stevedore cache` commands.
#[derive(Debug, clap::Subcommand)]
pub enum CacheCommand {
    /// List the named caches as JSON lines: name, app, org, volume
    Ls,
    /// Remove a named cache (of the app and org given, if any)
    Rm {
        /// The cache's name
        #[arg(value_name = "NAME")]
        name: String,
        /// Its app scope
        #[arg(long, value_name = "ID")]
        app: Option<String>,
        /// Its org scope
        #[arg(long, value_name = "ID")]
        org: Option<String>,
    },
}

/// Runs `stevedore cache`: exit 0 on success, 1 otherwise.
pub async fn cache(g: &Global, cmd: CacheCommand) -> u8 {
    let rung = match common::engine(g).await {
        Ok(r) => r,
        Err(e) => return e.said(),
    };
    match cmd {
        CacheCommand::Ls => match stevedore::container::caches::list(rung.engine()).await {
            Ok(caches) => {
                for c in caches {
                    println!("{}", serde_json::json!(c));
                }
                0
            }
            Err(e) => CliError::Failed(format!("listing caches failed: {}", stevedore::error_chain(&e))).said(),
        },
        CacheCommand::Rm { name, app, org } => {
            match stevedore::container::caches::remove(rung.engine(), &name, app.as_deref(), org.as_deref()).await {
                Ok(volume) => {
                    println!("{}", serde_json::json!({"removed": volume}));
                    0
                }
                Err(e) => CliError::Failed(stevedore::error_chain(&e)).said(),
            }
        }
    }
}
