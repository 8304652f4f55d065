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

/// A rung that claims `vm` (a VM-grade runtime's name) shows it before its level is said:
/// one attempt of stevedore's init, in its init image packed here; the claim and, if the
/// probe could not run, why, beside the level.
async fn shown(
    rung: &dyn Executor,
    engine: &stevedore::engine::Engine,
    claimed: stevedore::Level,
) -> serde_json::Value {
    let mut v = serde_json::json!({ "level_claimed": claimed });
    if claimed == stevedore::Level::Vm {
        let tag = stevedore::kube::default_init_image();
        let probed = match stevedore::image::pack_init_image(engine, &tag).await {
            Ok(_) => rung.probe_level(&tag).await.map_err(|e| stevedore::error_chain(&e)),
            Err(e) => Err(stevedore::error_chain(&e)),
        };
        if let Err(why) = probed {
            v["level_probe_failed"] = why.into();
        }
    }
    v["level"] = serde_json::json!(rung.level());
    v
}

fn merged(mut line: serde_json::Value, more: serde_json::Value) -> serde_json::Value {
    if let (Some(l), serde_json::Value::Object(m)) = (line.as_object_mut(), more) {
        l.extend(m);
    }
    line
}

/// Runs `stevedore census`.
pub async fn census(g: &Global, a: &CensusArgs) -> u8 {
    let line = match common::open(g, a.rung, &()).await {
        Ok(Rung::Container(rung)) => {
            let level = shown(&rung, rung.engine(), rung.config().level()).await;
            rung.close().await;
            merged(line(&rung), level)
        }
        Ok(Rung::Kube(rung)) => crate::kube::line(&rung).await,
        Ok(Rung::Process(_)) => {
            return CliError::Failed(
                "census: the process rung has no engine to describe (--rung container or kube)".into(),
            )
            .said();
        }
        Ok(Rung::Oci(rung)) => {
            let level = shown(&rung, rung.engine(), rung.census().level_claimed).await;
            rung.close().await;
            match serde_json::to_value(rung.census()) {
                Ok(v) => merged(v, level),
                Err(e) => return CliError::Failed(format!("census: {e}")).said(),
            }
        }
        Err(e) => return e.exiting(1).said(),
    };
    println!("{line}");
    0
}
