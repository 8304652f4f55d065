//! `stevedore reclaim`: remove what a worker left behind.

use super::common::{self, Global};
use crate::contract::Executor;

/// Arguments of `stevedore reclaim`.
#[derive(Debug, clap::Args)]
pub struct ReclaimArgs {
    /// The worker whose objects to remove
    #[arg(long, value_name = "ID")]
    worker: String,
}

/// Runs `stevedore reclaim`.
pub async fn reclaim(g: &Global, a: ReclaimArgs) -> u8 {
    let rung = match common::rung(g, 1, |_| Ok(())).await {
        Ok(r) => r,
        Err(code) => return code,
    };
    match rung.reclaim(&a.worker).await {
        Ok(r) => {
            let v = serde_json::json!({
                "worker": r.worker,
                "containers_removed": r.containers_removed.len(),
                "volumes_removed": r.volumes_removed.len(),
                "paths_removed": r.paths_removed.len(),
                "containers": r.containers_removed,
                "volumes": r.volumes_removed,
                "kept_in_flight": r.kept_in_flight,
                "failed": r.failed,
            });
            println!("{v}");
            0
        }
        Err(e) => {
            eprintln!("stevedore: {}", crate::contract::error_chain(&e));
            1
        }
    }
}
