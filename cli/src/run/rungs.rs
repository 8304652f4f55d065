//! What `run`'s options change in each rung's configuration, within its profile; an option a
//! rung cannot keep is refused, named.

use super::RunArgs;
use super::args::publish_arg;
use crate::common;
use stevedore::container::CacheMount;
use stevedore::contract::parse_duration;

/// What the options change in the container rung's configuration, within its profile.
fn adjust(a: &RunArgs, cfg: &mut stevedore::container::ContainerConfig) -> Result<(), String> {
    let profile = cfg.profile.clone().unwrap_or_else(|| "default".into());
    // One attempt per process: a pool would make containers the attempt never gets (it
    // claims before the first is parked) and remove them again.
    if cfg.pool.as_ref().is_some_and(|p| p.size > 0) {
        return Err(format!(
            "profile {profile:?} has a warm pool, which serves a long-lived process (a job engine using the \
             library); `stevedore run` is one attempt per process and would only make containers it never uses: \
             use a profile without `pool` for the command"
        ));
    }
    if let Some(n) = &a.network {
        common::choose_network(cfg, n)?;
    }
    if let Some(g) = &a.host_loss_grace {
        cfg.link.host_loss.grace = parse_duration(g).map_err(|e| format!("--host-loss-grace: {e}"))?;
    }
    if let Some(p) = &a.pull {
        cfg.pull = pull_policy(p);
    }
    if !a.publish.is_empty() && !cfg.allow_publish {
        return Err(format!("profile {profile:?} forbids publishing ports (allow_publish = false)"));
    }
    for p in &a.publish {
        let (container, host) = publish_arg(p)?;
        cfg.ports.insert(container, host);
    }
    if let Some(u) = &a.user {
        let Some((uid, gid)) = stevedore::contract::parse_user(u) else {
            return Err(format!("--user {u:?}: give a numeric UID[:GID] (images have no user database here)"));
        };
        if (uid == 0 || gid == 0) && !cfg.allow_root {
            return Err(format!(
                "--user {u}: profile {profile:?} does not allow root (a profile allows it with allow_root = true)"
            ));
        }
        cfg.user = format!("{uid}:{gid}");
    }
    if !a.cache.is_empty() && !cfg.allow_caches {
        return Err(format!("profile {profile:?} forbids caches (allow_caches = false)"));
    }
    for c in &a.cache {
        let c = CacheMount::parse(c)?;
        cfg.caches.retain(|have| have.name != c.name);
        cfg.caches.push(c);
    }
    if let Some(dir) = &a.logs {
        cfg.log_dir = Some(dir.clone());
    }
    Ok(())
}

/// `--pull`'s word as a policy.
fn pull_policy(word: &str) -> stevedore::container::PullPolicy {
    use stevedore::container::PullPolicy;
    match word {
        "never" => PullPolicy::Never,
        "always" => PullPolicy::Always,
        _ => PullPolicy::IfMissing,
    }
}

/// What the options change in the kube rung's configuration; an option that has no
/// mapping to a Pod that keeps its promise is refused, named.
fn adjust_kube(a: &RunArgs, cfg: &mut stevedore::kube::KubeConfig) -> Result<(), String> {
    let refuse = |opt: &str, why: &str| Err(format!("{opt} is not available on the kube rung: {why}"));
    if a.handler.is_some() {
        return refuse(
            "--handler",
            "the API shows no image's dev.stevedore.entry label; run the worker's command, or use the library \
             with KubeConfig::worker_entry",
        );
    }
    if !a.cache.is_empty() {
        return refuse("--cache", "a Pod has no engine volume that outlives it (named caches are not mapped yet)");
    }
    if !a.publish.is_empty() {
        return refuse("-p/--publish", "a Pod's ports are reached through a Service, which the rung does not make");
    }
    match a.network.as_deref() {
        None => {}
        Some("none") if cfg.network_denied => {}
        Some(n) => {
            return Err(format!(
                "--network {n} is not available on the kube rung: every Pod has the cluster's network, denied only \
                 by a NetworkPolicy (say --network-denied once the namespace has one; without --network the \
                 evidence says the network was not enforced)"
            ));
        }
    }
    if let Some(p) = &a.pull {
        // The Pods' `imagePullPolicy`: the same promises.
        cfg.image_pull = pull_policy(p).into();
    }
    if let Some(g) = &a.host_loss_grace {
        cfg.link.host_loss.grace = parse_duration(g).map_err(|e| format!("--host-loss-grace: {e}"))?;
    }
    if let Some(u) = &a.user {
        match stevedore::contract::parse_user(u) {
            Some((0, _)) | Some((_, 0)) => {
                return Err(format!("--user {u}: the kube rung runs attempts as non-root only"));
            }
            Some(ids) => cfg.user = ids,
            None => return Err(format!("--user {u:?}: give a numeric UID[:GID]")),
        }
    }
    if let Some(dir) = &a.logs {
        cfg.log_dir = Some(dir.clone());
    }
    Ok(())
}

/// What the options change in the oci rung's configuration; an option it cannot keep yet is
/// refused, named.
fn adjust_oci(a: &RunArgs, cfg: &mut stevedore::oci::OciConfig) -> Result<(), String> {
    let refuse = |opt: &str, why: &str| Err(format!("{opt} is not available on the oci rung: {why}"));
    if !a.cache.is_empty() {
        return refuse("--cache", "named caches are not built on it yet");
    }
    if !a.publish.is_empty() {
        return refuse("-p/--publish", "its attempts have a network namespace with only lo");
    }
    if a.pull.is_some() {
        return refuse("--pull", "it pulls nothing: images come from the local engine");
    }
    match a.network.as_deref() {
        None | Some("none") => {}
        Some(n) => return Err(format!("--network {n} is not available on the oci rung: its only network is none")),
    }
    if let Some(u) = &a.user {
        match stevedore::contract::parse_user(u) {
            Some((0, _)) | Some((_, 0)) => {
                return Err(format!("--user {u}: the oci rung runs commands as non-root only"));
            }
            Some((uid, gid)) => cfg.user = (uid, gid),
            None => return Err(format!("--user {u:?}: give a numeric UID[:GID]")),
        }
    }
    if let Some(g) = &a.host_loss_grace {
        cfg.link.host_loss.grace = parse_duration(g).map_err(|e| format!("--host-loss-grace: {e}"))?;
    }
    if let Some(dir) = &a.logs {
        cfg.log_dir = Some(dir.clone());
    }
    Ok(())
}

impl common::Adjust for RunArgs {
    fn container(&self, cfg: &mut stevedore::container::ContainerConfig) -> Result<(), String> {
        adjust(self, cfg)
    }

    fn process(&self, cfg: &mut stevedore::process::ProcessConfig) -> Result<(), String> {
        if let Some(w) = &self.workdir {
            return Err(format!(
                "-w {w} is not available on the process rung: it has no root of its own, so no {w} to make; the \
                 command starts in its attempt's own directory ($TMPDIR, also $HOME)"
            ));
        }
        if let Some(grace) = &self.host_loss_grace {
            cfg.link.host_loss.grace = parse_duration(grace).map_err(|e| format!("--host-loss-grace: {e}"))?;
        }
        if let Some(dir) = &self.logs {
            cfg.log_dir = Some(dir.clone());
        }
        Ok(())
    }

    fn kube(&self, cfg: &mut stevedore::kube::KubeConfig) -> Result<(), String> {
        adjust_kube(self, cfg)
    }

    fn oci(&self, cfg: &mut stevedore::oci::OciConfig) -> Result<(), String> {
        adjust_oci(self, cfg)
    }
}
