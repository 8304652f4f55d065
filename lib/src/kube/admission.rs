//! Where the inputs go on the kube rung (`docs/outcome.md`, "Inputs over the link"): over the
//! link to a root init, where the configuration allows it and the namespace admits the Pod of
//! a root init, else through the init container's stdin; the evidence says which, and why.
//!
//! The namespace's word is asked once per rung by a server-side dry run of such a Pod
//! (admission plugins, PodSecurityPolicy among them, run on a dry run and persist nothing).
//! A refusal counts as the namespace's only when the same Pod without the root init is
//! admitted; anything else (quota, an unreachable server) decides nothing and is asked again.
//! A real create refused later turns the root init off for the rung's life as well.

use super::config::KubeConfig;
use super::error::ClusterError;
use super::site::KubeSite;
use super::spec;
use kube::api::PostParams;
use std::collections::BTreeMap;

/// Why inputs of `bytes` cannot go over the link by configuration, or `None`.
pub(crate) fn not_over_link(cfg: &KubeConfig, bytes: u64) -> Option<String> {
    if cfg.link_inputs_max_bytes == 0 {
        return Some("link_inputs_max_bytes is 0 by configuration".into());
    }
    if cfg.user.0 == 0 || cfg.user.1 == 0 {
        return Some(format!("the sandbox user {}:{} is root's (it would own what it reads)", cfg.user.0, cfg.user.1));
    }
    if bytes > cfg.link_inputs_max_bytes {
        return Some(format!("{bytes} bytes of inputs, above link_inputs_max_bytes ({})", cfg.link_inputs_max_bytes));
    }
    None
}

/// Whether the namespace admits the Pod of a root init: `Ok` when it does, else why not.
pub(crate) async fn root_init(site: &KubeSite) -> Result<(), String> {
    let mut known = site.root_init.lock().await;
    if let Some(k) = &*known {
        return k.clone();
    }
    match probe(site).await {
        Probe::Decided(answer) => {
            *known = Some(answer.clone());
            answer
        }
        Probe::Undecided(why) => Err(why),
    }
}

/// A real create of a root init's Pod was refused: the namespace's word from now on.
pub(crate) async fn refused(site: &KubeSite, why: String) {
    *site.root_init.lock().await = Some(Err(why));
}

/// Whether a create's refusal is admission's (a policy, a webhook), not the server's state.
pub(crate) fn is_admission_refusal(e: &ClusterError) -> bool {
    matches!(e.code(), Some(400 | 403 | 422))
}

enum Probe {
    Decided(Result<(), String>),
    Undecided(String),
}

async fn probe(site: &KubeSite) -> Probe {
    let dry = PostParams { dry_run: true, ..PostParams::default() };
    let name = format!("sd-admission-{}", &crate::contract::incarnation::mint()[..8].to_ascii_lowercase());
    let sizes = super::sizes::of(&crate::contract::ResourceLimits::new(), &site.config);
    let body = |root_init| {
        spec::pod(&spec::PodInput {
            config: &site.config,
            name: &name,
            image: &site.init_image,
            init_image: &site.init_image,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            sizes: &sizes,
            inputs: Some(0),
            root_init,
            workdir: None,
            grace_secs: 1,
            active_deadline_secs: None,
            host_within_ms: 1000,
        })
        .pod
    };
    let what = "asking whether the namespace admits a root init (a dry run)";
    let refusal = match site.call(what, site.pods.create(&dry, &body(true))).await {
        Ok(_) => return Probe::Decided(Ok(())),
        Err(e) if is_admission_refusal(&e) => e,
        Err(e) => return Probe::Undecided(format!("the dry run failed: {}", crate::util::error_chain(&e))),
    };
    match site.call("the same dry run without the root init", site.pods.create(&dry, &body(false))).await {
        Ok(_) => Probe::Decided(Err(format!(
            "the namespace's admission refuses a Pod whose init starts as root: {}",
            crate::util::error_chain(&refusal)
        ))),
        Err(e) => Probe::Undecided(format!(
            "the namespace refuses the dry run with or without the root init: {}",
            crate::util::error_chain(&e)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_can_keep_the_inputs_off_the_link() {
        let cfg = KubeConfig::default();
        assert_eq!(not_over_link(&cfg, 1000), None);
        let off = KubeConfig::default().link_inputs_max_bytes(0);
        assert!(not_over_link(&off, 1).unwrap().contains("is 0 by configuration"));
        let small = KubeConfig::default().link_inputs_max_bytes(10);
        assert!(not_over_link(&small, 11).unwrap().contains("above link_inputs_max_bytes (10)"));
        let root = KubeConfig { user: (0, 0), ..KubeConfig::default() };
        assert!(not_over_link(&root, 1).unwrap().contains("root's"));
    }
}
