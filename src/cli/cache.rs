//! `stevedore cache`: list and remove named caches (volumes of kind `cache`; a worker's
//! reclaim never removes them).

use super::common::{self, Global};
use crate::container::labels;
use bollard::query_parameters::{ListVolumesOptionsBuilder, RemoveVolumeOptionsBuilder};

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
    let rung = match common::rung(g, 1, |_| Ok(())).await {
        Ok(r) => r,
        Err(code) => return code,
    };
    let docker = rung.engine().docker();
    match cmd {
        CacheCommand::Ls => {
            let opts = ListVolumesOptionsBuilder::default().filters(&labels::cache_filter()).build();
            match docker.list_volumes(Some(opts)).await {
                Ok(list) => {
                    for v in list.volumes.unwrap_or_default() {
                        let get = |k: &str| v.labels.get(k).cloned();
                        // Checked again: Podman ORs repeated label filters.
                        if get(labels::KIND).as_deref() != Some("cache") {
                            continue;
                        }
                        let line = serde_json::json!({
                            "name": get(labels::CACHE),
                            "app": get(labels::APP),
                            "org": get(labels::ORG),
                            "volume": v.name,
                        });
                        println!("{line}");
                    }
                    0
                }
                Err(e) => {
                    super::say::say(format!("listing caches failed: {e}"));
                    1
                }
            }
        }
        CacheCommand::Rm { name, app, org } => {
            let volume = labels::cache_volume(&name, app.as_deref(), org.as_deref());
            match docker.inspect_volume(&volume).await {
                Ok(v) if labels::is_cache(&v.labels, &name, app.as_deref(), org.as_deref()) => {}
                Ok(_) => {
                    super::say::say(format!("volume {volume} is not cache {name:?} of that scope; left alone"));
                    return 1;
                }
                Err(e) => {
                    super::say::say(format!("no cache {name:?} in that scope ({volume}): {e}"));
                    return 1;
                }
            }
            match docker.remove_volume(&volume, Some(RemoveVolumeOptionsBuilder::default().build())).await {
                Ok(()) => {
                    println!("{}", serde_json::json!({"removed": volume}));
                    0
                }
                Err(e) => {
                    super::say::say(format!("removing {volume} failed (is an attempt using it?): {e}"));
                    1
                }
            }
        }
    }
}
