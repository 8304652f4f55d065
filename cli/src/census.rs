//! `stevedore census`: one JSON line about the engine and what it can enforce.

use crate::common::{self, Global};
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
    /// The rung: container (a Docker-API engine) or kube (a Kubernetes cluster; see the
    /// Kubernetes options)
    #[arg(long, value_name = "RUNG", default_value = "container", value_parser = ["container", "kube"])]
    pub rung: String,
}

/// Runs `stevedore census`.
pub async fn census(g: &Global, a: &CensusArgs) -> u8 {
    if a.rung == "kube" {
        return match crate::kube::rung(g, 1, |_| Ok(())).await {
            Ok(rung) => {
                println!("{}", crate::kube::line(&rung).await);
                0
            }
            Err(code) => code,
        };
    }
    match common::rung(g, 1, |_| Ok(())).await {
        Ok(rung) => {
            println!("{}", line(&rung));
            0
        }
        Err(code) => code,
    }
}
