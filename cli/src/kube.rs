//! The kube rung from the command line (`--rung kube`): its configuration from the global
//! options, its census line, and what of `run`'s options it maps or refuses.

use crate::common::Global;
use stevedore::contract::Executor;
use stevedore::kube::{KubeConfig, KubeExecutor};

/// The kube rung's configuration for these options: the profile's (`--config`,
/// `--profile`), then the flags over it.
pub fn config(g: &Global) -> Result<KubeConfig, String> {
    let mut cfg = match (&g.config, &g.profile) {
        (None, None) => KubeConfig::default(),
        _ => stevedore::profiles::load_kube(g.config.as_deref(), g.profile.as_deref())
            .map_err(|e| stevedore::error_chain(&e))?,
    };
    if g.kubeconfig.is_some() {
        cfg.kubeconfig = g.kubeconfig.clone();
    }
    for (flag, set) in
        [(&g.context, &mut cfg.context), (&g.namespace, &mut cfg.namespace), (&g.init_image, &mut cfg.init_image)]
    {
        if flag.is_some() {
            *set = flag.clone();
        }
    }
    cfg.network_denied |= g.network_denied;
    Ok(cfg)
}

/// The rung the options' profile names (its `rung`), if any.
pub fn profile_rung(g: &Global) -> Result<Option<String>, String> {
    if g.config.is_none() && g.profile.is_none() {
        return Ok(None);
    }
    stevedore::profiles::rung(g.config.as_deref(), g.profile.as_deref()).map_err(|e| stevedore::error_chain(&e))
}

/// The census of the cluster as JSON: what `census` prints for the container rung, in a
/// cluster's words.
pub async fn line(rung: &KubeExecutor) -> serde_json::Value {
    let c = rung.census().await;
    let access = match rung.check_access().await {
        Ok(()) => "ok".to_owned(),
        Err(e) => stevedore::error_chain(&e),
    };
    serde_json::json!({
        "engine": "kubernetes",
        "engine_version": c.server_version,
        "api_version": "v1",
        "endpoint": c.server,
        "namespace": c.namespace,
        "nodes": c.nodes,
        "runtimes": c.runtime_classes,
        "unreadable": c.unreadable,
        "level": rung.level(),
        "network_denied": rung.denies_network(),
        "init_image": c.init_image,
        "inputs": c.inputs,
        "access": access,
        "incarnation": rung.incarnation(),
        "stevedore_version": env!("CARGO_PKG_VERSION"),
    })
}
