//! `stevedore reclaim`: remove what a worker left behind, and list or remove stale worker images.

use crate::common::{self, Global, Rung, RungKind};
use crate::error::CliError;
use stevedore::contract::Executor;

/// Arguments of `stevedore reclaim`.
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("what").required(true).multiple(true).args(["worker", "images", "tools"]))]
pub struct ReclaimArgs {
    /// The worker whose containers, volumes and log files to remove
    #[arg(long, value_name = "ID")]
    worker: Option<String>,
    /// Also remove stale worker images (images stevedore packed that no container uses,
    /// except this binary's own); without it they are only listed. With `--rung oci`: empty
    /// the rung's image cache of every image no attempt holds
    #[arg(long)]
    images: bool,
    /// Remove copies of stevedore's init that crashed processes left in the engine (volumes
    /// of kind `tools` of other processes, over an hour old, that no container uses; a live
    /// but idle rung whose volume is taken makes a new one)
    #[arg(long)]
    tools: bool,
    /// The rung: container (a Docker-API engine), kube (the worker's Pods in the namespace) or
    /// oci (the worker's runtime containers, bundles and cgroups on this host)
    #[arg(long, value_name = "RUNG", default_value = "container", value_enum)]
    rung: RungKind,
}

/// Runs `stevedore reclaim`: one JSON line; exit 0 when the sweep ran (failures on single
/// objects are in `failed`), 1 when it could not run.
pub async fn reclaim(g: &Global, a: ReclaimArgs) -> u8 {
    if a.rung == RungKind::Oci && a.tools {
        return CliError::Failed(
            "--rung oci keeps no copy of the init in an engine: --tools is the container rung's (--worker W reclaims \
             a worker's runtime containers, bundles and cgroups; --images empties the rung's image cache)"
                .into(),
        )
        .said();
    }
    if a.rung == RungKind::Kube && a.worker.is_none() {
        return CliError::Failed(
            "--rung kube reclaims a worker's Pods: give --worker (--images and --tools are the engine's)".into(),
        )
        .said();
    }
    let rung = match common::open(g, a.rung, &()).await {
        Ok(Rung::Container(r)) => r,
        Ok(Rung::Kube(r)) => return reclaim_kube(r, &a).await,
        Ok(Rung::Oci(r)) => return reclaim_oci(r, &a).await,
        Ok(Rung::Process(_)) => {
            return CliError::Failed(
                "reclaim: the process rung removes what it left when it starts again (--rung container or kube)".into(),
            )
            .said();
        }
        Err(e) => return e.exiting(1).said(),
    };
    let mut v = serde_json::Map::new();
    if let Some(worker) = &a.worker {
        match rung.reclaim(worker).await {
            Ok(r) => {
                let report = serde_json::json!({
                    "worker": r.worker,
                    "containers_removed": r.containers_removed.len(),
                    "volumes_removed": r.volumes_removed.len(),
                    "paths_removed": r.paths_removed.len(),
                    "containers": r.containers_removed,
                    "volumes": r.volumes_removed,
                    "kept_in_flight": r.kept_in_flight,
                    "failed": r.failed,
                });
                if let serde_json::Value::Object(m) = report {
                    v.extend(m);
                }
            }
            Err(e) => {
                return CliError::Failed(stevedore::error_chain(&e)).said();
            }
        }
    }
    if a.tools {
        match rung.prune_tools().await {
            Ok(p) => {
                v.insert("tools_volumes_removed".into(), serde_json::json!(p.volumes_removed));
                v.insert("tools_volumes_in_use".into(), serde_json::json!(p.in_use));
            }
            Err(e) => {
                return CliError::Failed(stevedore::error_chain(&e)).said();
            }
        }
    }
    // The running binary's own image is never stale: it would be packed again on next use.
    let keep: Vec<String> = common::own_tag().map(|(_, tag)| vec![tag]).unwrap_or_default();
    let docker = rung.engine();
    match stevedore::image::stale_images(docker, &keep, &[]).await {
        Ok(stale) => {
            if a.images {
                let removal = stevedore::image::remove_images(docker, &stale).await;
                v.insert("images_removed".into(), removal.removed.len().into());
                v.insert("images_failed".into(), serde_json::json!(removal.failed));
            }
            v.insert("stale_images".into(), serde_json::json!(stale));
        }
        Err(e) if a.images => {
            return CliError::Failed(stevedore::error_chain(&e)).said();
        }
        // Listing is a courtesy when only a worker was asked for.
        Err(e) => {
            v.insert("stale_images_error".into(), stevedore::error_chain(&e).into());
        }
    }
    println!("{}", serde_json::Value::Object(v));
    0
}

/// `reclaim --rung kube --worker W`: the worker's Pods in the namespace, by label.
async fn reclaim_kube(rung: stevedore::kube::KubeExecutor, a: &ReclaimArgs) -> u8 {
    let worker = a.worker.as_deref().unwrap_or_default();
    match rung.reclaim(worker).await {
        Ok(r) => {
            let report = serde_json::json!({
                "worker": r.worker,
                "namespace": rung.namespace(),
                "pods_removed": r.pods_removed.len(),
                "containers_removed": 0,
                "volumes_removed": 0,
                "paths_removed": r.paths_removed.len(),
                "pods": r.pods_removed,
                "kept_in_flight": r.kept_in_flight,
                "failed": r.failed,
            });
            println!("{report}");
            0
        }
        Err(e) => CliError::Failed(stevedore::error_chain(&e)).said(),
    }
}

/// `reclaim --rung oci --worker W`: the worker's runtime containers, bundles and cgroups on
/// this host, by the names that carry its whole id (`stevedore::oci`).
async fn reclaim_oci(rung: stevedore::oci::OciExecutor, a: &ReclaimArgs) -> u8 {
    let mut v = serde_json::Map::new();
    if let Some(worker) = &a.worker {
        match rung.reclaim(worker).await {
            Ok(r) => {
                v.insert("worker".into(), r.worker.into());
                v.insert("state_dir".into(), rung.state_dir().display().to_string().into());
                v.insert("containers_removed".into(), r.containers_removed.len().into());
                v.insert("volumes_removed".into(), 0.into());
                v.insert("paths_removed".into(), r.paths_removed.len().into());
                v.insert("containers".into(), serde_json::json!(r.containers_removed));
                v.insert("paths".into(), serde_json::json!(r.paths_removed));
                v.insert("kept_in_flight".into(), serde_json::json!(r.kept_in_flight));
                v.insert("failed".into(), serde_json::json!(r.failed));
            }
            Err(e) => return CliError::Failed(stevedore::error_chain(&e)).said(),
        }
    }
    if a.images {
        // Every image no attempt holds: each is unpacked again on its next use.
        match rung.prune_images(Some(0)).await {
            Ok(p) => {
                v.insert("images_removed".into(), serde_json::json!(p.removed));
                v.insert("images_in_use".into(), serde_json::json!(p.in_use));
                v.insert("image_bytes_freed".into(), p.bytes_freed.into());
            }
            Err(e) => return CliError::Failed(stevedore::error_chain(&e)).said(),
        }
    }
    rung.close().await;
    println!("{}", serde_json::Value::Object(v));
    0
}
