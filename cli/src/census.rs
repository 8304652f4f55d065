//! `stevedore census`: one JSON line about the engine and what it can enforce.

use crate::common::{self, Global, Rung, RungKind};
use crate::error::CliError;
use stevedore::container::ContainerExecutor;
use stevedore::contract::Executor;

/// The census as JSON.
pub fn line(rung: &ContainerExecutor) -> serde_json::Value {
    let f = rung.engine().facts();
    let client_max = stevedore::engine::client_max_api();
    let skew = serde_json::json!({
        "client_min": "1.41",
        "client_max": client_max,
        "engine_min": f.min_api_version,
        "engine_max": f.max_api_version,
        "negotiated": f.api_version,
        "status": if f.max_api_version == client_max { "none" } else { "negotiated" },
    });
    serde_json::json!({
        "engine_version": f.engine_version,
        "api_version": f.api_version,
        "cgroup_version": f.cgroup_version,
        "runtimes": f.runtimes,
        "default_runtime": f.default_runtime,
        "level": rung.level(),
        "features": f.features,
        "skew": skew,
        "incarnation": rung.incarnation(),
        "stevedore_version": env!("CARGO_PKG_VERSION"),
        "endpoint": rung.engine().endpoint().url,
        "transport": rung.engine().endpoint().transport,
        "os": f.os_type,
        "architecture": f.architecture,
        "product": f.product,
    })
}

/// Which rung `census` and `smoke` look at.
#[derive(Debug, clap::Args)]
pub struct CensusArgs {
    /// The rung: container (a Docker-API engine), kube (a Kubernetes cluster; see the
    /// Kubernetes options) or oci (the runtime and what it enforces; no smoke for it yet)
    #[arg(long, value_name = "RUNG", default_value = "container", value_enum)]
    pub rung: RungKind,
}

/// Runs `stevedore census`.
pub async fn census(g: &Global, a: &CensusArgs) -> u8 {
    let line = match common::open(g, a.rung, &()).await {
        Ok(Rung::Container(rung)) => line(&rung),
        Ok(Rung::Kube(rung)) => crate::kube::line(&rung).await,
        Ok(Rung::Process(_)) => {
            return CliError::Failed(
                "census: the process rung has no engine to describe (--rung container or kube)".into(),
            )
            .said();
        }
        Ok(Rung::Oci(rung)) => match serde_json::to_value(rung.census()) {
            Ok(v) => v,
            Err(e) => return CliError::Failed(format!("census: {e}")).said(),
        },
        Err(e) => return e.exiting(1).said(),
    };
    println!("{line}");
    0
}
