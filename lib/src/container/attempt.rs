//! One attempt in one container, as this rung's `Launch` (`prepare` → the mount check →
//! `launch` (cold, or a parked container from the pool)) and `Site` (what the shared attempt
//! asks of a container). `Err` only when the container never ran the command.

use super::cleanup::Cleanup;
use super::launch::provision;
use super::ledger::Own;
use super::prepare::{Plan, prepare};
use super::site::{ContainerSite, Ready};
use super::sizes::Sizes;
use crate::attempt::front::{Gate, Launch, Made, Prepared};
use crate::attempt::{self, Layout, Ledger, Ports, Provisioned, Rung, Settings, Site};
use crate::contract::{
    Checkpoint, Evidence, LaunchError, Outcome, ReclaimError, ReclaimReport, RecoverError, Request, Target, judge,
};
use crate::link::judgement::{Account, Witness};
use crate::link::session::Transport;
use crate::link::supervise::Ended;
use std::sync::Arc;
use std::time::Duration;
use stevedore_init::wire::{IN_DIR, OUT_DIR, TMP_DIR};
use tokio_util::sync::CancellationToken;

impl Launch for Arc<ContainerSite> {
    type Sizes = Sizes;
    type Plan = Plan;

    fn gate(&self) -> &Gate {
        &self.gate
    }

    fn denies_network(&self) -> bool {
        self.config.network == "none"
    }

    /// The limits the engine says it applies (`engine::Facts::features`), `/out`'s and
    /// `/tmp`'s sizes, and the hardening the configuration keeps.
    fn enforces(&self) -> Vec<&'static str> {
        let features = &self.engine.facts().features;
        let mut v: Vec<&'static str> =
            ["memory", "cpu", "pids", "seccomp"].into_iter().filter(|k| features.iter().any(|f| f == k)).collect();
        v.push("disk");
        let h = &self.config.hardening;
        for (on, k) in [
            (self.denies_network(), "network"),
            (h.read_only_rootfs, "read_only_rootfs"),
            (h.drop_all_capabilities, "capabilities"),
            (h.no_new_privileges, "no_new_privileges"),
            (self.config.uid_gid().0 != 0 && !self.config.user.starts_with("root"), "non_root"),
        ] {
            if on {
                v.push(k);
            }
        }
        v
    }

    fn sizes(&self, req: &Request) -> (Sizes, u32) {
        let applied = super::sizes::of(&req.limits, &self.config);
        // The cgroup's whole limit: the delivery reserve is the host's memory too.
        let limit = applied.memory.saturating_add(self.config.link.delivery_reserve);
        (applied, u32::try_from(limit.div_ceil(1 << 20)).unwrap_or(u32::MAX))
    }

    /// Parked containers hold budget only while attempts leave it free.
    fn make_room(&self, mib: u32) {
        super::pool::yield_budget(self, mib);
    }

    /// The image, the argv, the environment, the inputs measured; then every mount
    /// destination checked in the image (an image that would move one is refused here).
    async fn prepare(&self, req: &Request, applied: Sizes) -> Result<Prepared<Plan>, LaunchError> {
        let plan = prepare(self, req, applied).await?;
        let probe = format!("{}-probe", plan.decided.name);
        let image_id = if plan.image.id.is_empty() { plan.image_ref.clone() } else { plan.image.id.clone() };
        match super::mounts::check(self, &image_id, probe, plan.probe_labels.clone(), &plan.mounts).await? {
            Some(r) => Ok(Prepared::Refused(Box::new(redirected(self, req, &plan, &r)))),
            None => Ok(Prepared::Ready(plan)),
        }
    }

    /// A parked container of the attempt's size class from the warm pool, else a cold one.
    async fn provision(
        &self,
        req: &Request,
        plan: &mut Plan,
        cancel: &CancellationToken,
    ) -> (Cleanup, Result<Made<Own>, LaunchError>) {
        let warm = super::pool::claim(self, plan);
        let own = (plan.decided.attempt_id.clone(), plan.decided.name.clone());
        if let super::pool::Claim::Hit(p) = &warm {
            // The attempt takes the parked container's identity: its objects, labels and in-flight entry.
            plan.decided.attempt_id = p.attempt_id.clone();
            plan.decided.name = p.name.clone();
        }
        let mut cleanup = Cleanup::new(self.clone(), plan.decided.attempt_id.clone(), &req.worker_id);
        let missed = |why: String| {
            move |mut ready: Ready| {
                ready.warm = Some(false);
                ready.skipped.insert("warm_pool".into(), why);
                ready
            }
        };
        let launched = match warm {
            super::pool::Claim::Hit(parked) => match super::pool::ready(self, plan, &mut cleanup.left, *parked).await {
                Ok(Ok(ready)) => Ok(ready),
                Ok(Err(refused)) => {
                    // The parked container goes, and the attempt runs cold under its own name.
                    (plan.decided.attempt_id, plan.decided.name) = own;
                    let fresh = Cleanup::new(self.clone(), plan.decided.attempt_id.clone(), &req.worker_id);
                    let removed = attempt::Teardown::remove(std::mem::replace(&mut cleanup, fresh)).await;
                    tracing::warn!(why = %refused, errors = ?removed.errors, "a parked container refused its claim");
                    let why = format!("the parked container refused the claim and was discarded: {refused}");
                    provision(self, req, plan, &mut cleanup.left, cancel).await.map(missed(why))
                }
                Err(e) => Err(e),
            },
            super::pool::Claim::Miss(why) => {
                provision(self, req, plan, &mut cleanup.left, cancel).await.map(missed(why))
            }
            super::pool::Claim::None => provision(self, req, plan, &mut cleanup.left, cancel).await,
        };
        let made = launched.map(|ready| {
            let staged_at = ready.staged_at;
            Made { prov: provisioned(self, plan, &cleanup, ready), staged_at }
        });
        (cleanup, made)
    }

    fn decided(plan: &Plan) -> &attempt::Decided {
        &plan.decided
    }

    async fn reclaim(&self, worker: &str) -> Result<ReclaimReport, ReclaimError> {
        super::reclaim::reclaim(self, worker).await
    }

    /// The warm pool stops filling and its parked containers go.
    async fn closing(&self) {
        super::pool::drain(self).await;
    }

    async fn closed(&self) {
        // A fill that was under way when the pool closed removes its own container.
        super::pool::drain(self).await;
        // Nothing of this rung mounts its tools volumes any more.
        let slot = std::mem::take(&mut *self.tools.lock().await);
        if let Err(e) = super::tools::remove_made(&self.engine, &slot.made).await {
            tracing::warn!(volumes = ?slot.made, error = %e, "removing the tools volumes");
        }
    }

    /// The dead process's tools volume goes with its last attempt (the engine refuses while
    /// another of its containers mounts it). Not for a checkpoint refused as invalid: then
    /// nothing is touched.
    async fn recovered(&self, cp: &Checkpoint, invalid: bool) {
        if !invalid
            && let Err(e) = super::tools::remove_of(&self.engine, &[&cp.incarnation], &self.base.incarnation).await
        {
            tracing::warn!(error = %e, "removing the recovered process's tools volume");
        }
    }
}

/// The ready container as the shared attempt takes it: its transport, its facts, the
/// sandbox's layout.
fn provisioned(site: &ContainerSite, plan: &Plan, cleanup: &Cleanup, ready: Ready) -> Provisioned<Own> {
    let Ready {
        container_id,
        transport,
        running,
        mut enforcement,
        mut skipped,
        tools,
        inputs,
        caches,
        warm,
        credentials,
        ..
    } = ready;
    let features = &site.engine.facts().features;
    super::spec::engine_limits(features, &mut enforcement, &mut skipped);
    // A rootless engine on cgroup v1 gives the container no cgroup of its own: what the init
    // would read there is its user's session's, so it reads none.
    let has = |k: &str| features.iter().any(|f| f == k);
    let own_cgroup = !has("rootless") || has("memory");
    if let (Some(owner), Some(said)) = (site.engine.facts().rootless_uid, enforcement.get_mut("non_root")) {
        let sandbox = site.config.uid_gid().0;
        let outside = match super::spec::subordinate(owner, sandbox, std::path::Path::new("/etc/subuid")) {
            Some(id) => format!("the subordinate id {id} of uid {owner}"),
            None => format!("a subordinate id of uid {owner}"),
        };
        said.push_str(&format!(" (a rootless engine's user namespace: outside, {outside})"));
    }
    let layout = Layout {
        in_dir: IN_DIR.to_owned(),
        out_dir: OUT_DIR.to_owned(),
        // The host's relay runs as root (`recover`), a uid the command never has.
        takeover_uid: (site.config.uid_gid().0 != 0).then_some(0),
        takeover_fd: None,
        rlimits: Vec::new(),
        cgroup_dir: own_cgroup.then(|| stevedore_init::cgroup::CGROUP_ROOT.to_owned()),
        measure: caches.iter().map(|(_, _, path)| path.clone()).collect(),
        mounts: plan.mounts.clone(),
        image_env: None,
        tmp_dir: Some(TMP_DIR.to_owned()),
        sampled_cgroup: None,
        credentials,
        held: crate::link::held(
            plan.applied.memory.saturating_add(site.config.link.delivery_reserve),
            Some(plan.applied.pids),
            plan.applied.cpu_millis,
            &enforcement,
        ),
    };
    let own = Own {
        container_id,
        image_ref: plan.image_ref.clone(),
        image_id: plan.image.id.clone(),
        memory: plan.applied.memory,
        cpu_millis: plan.applied.cpu_millis,
        disk: plan.applied.disk,
        tools_volume: match tools.bind {
            Some(d) => format!(
                "host dir {d} bound read-only (checked before the create: every directory from / this user's or \
                 root's, none writable by others)"
            ),
            None => match super::tools::host_tools_refusal(site) {
                Some(why) => format!("volume {} (the host dir was not used: {why})", tools.volume),
                None => format!("volume {}", tools.volume),
            },
        },
        tools_digest: tools.digest,
        containers: cleanup.left.containers.clone(),
        volumes: cleanup.left.volumes.clone(),
        caches,
        warm,
        engine_mark: site.engine.mark(),
    };
    Provisioned { transport, running, own, layout, enforcement, skipped, inputs }
}

/// The Outcome of an attempt refused because the image would move one of its mounts: it
/// never ran (`launch_failed`, `mount_redirected`, permanent: the image is what it is).
fn redirected(site: &ContainerSite, req: &Request, plan: &Plan, r: &super::mounts::Redirect) -> Outcome {
    use crate::contract::{Evidence, Facts, Judgement, LaunchFailure, Source};
    let facts = site.engine.facts();
    let mut j = Judgement {
        facts: Facts { launch_failed: Some(LaunchFailure::MountRedirected), ..Facts::default() },
        error_text: r.explain(&plan.image_ref),
        permanent: true,
        evidence: Evidence {
            executor: site.config.name.clone(),
            // Nothing ran, so nothing was shown (`contract::level_shown`).
            level: Some(crate::contract::level_shown(site.config.level(), None, None).0),
            incarnation: site.base.incarnation.clone(),
            started_at_unix_ms: Some(plan.decided.started_ms),
            finished_at_unix_ms: Some(crate::contract::unix_ms_now()),
            image: Some(plan.image_ref.clone()),
            image_id: Some(plan.image.id.clone()),
            engine_version: Some(facts.engine_version.clone()),
            api_version: Some(facts.api_version.clone()),
            ..Evidence::default()
        },
        ..Judgement::default()
    };
    for figure in [&mut j.usage.sources.wall_time_ms, &mut j.usage.sources.cpu_time_ms] {
        *figure = Some(Source::unavailable("nothing ran"));
    }
    j.usage.sources.peak_memory_bytes = Some(Source::unavailable("nothing ran"));
    let o = judge(req, j);
    tracing::info!(path = %r.path, target = %r.target, "refused: a mount destination is a symlink in the image");
    o
}

impl Site for Arc<ContainerSite> {
    type Own = Own;
    type Teardown = Cleanup;

    fn rung(&self) -> Rung<'_> {
        let settings = Settings { link: self.config.link, call_timeout: self.engine.timeout() };
        Rung { name: &self.config.name, level: self.config.level(), base: &self.base, settings }
    }

    async fn start(&self, own: &Own, running: bool) -> Result<Ports, LaunchError> {
        if !running && let Err(err) = self.engine.api.start(&own.container_id).await {
            // No answer in time: the engine may have started it all the same. What it says
            // now decides; a container that runs is this attempt's to supervise.
            if !(err.is_timeout() && super::launch::runs(self, &own.container_id).await) {
                self.tools_suspect().await;
                return Err(super::spec::port_taken(&self.config, err));
            }
            tracing::warn!(error = %err, "the start was answered late; the container runs and is supervised");
        }
        Ok(super::launch::published(self, &own.container_id).await)
    }

    fn target(&self, own: &Own) -> Target {
        Target::Container { id: own.container_id.clone(), name: own.containers.first().cloned().unwrap_or_default() }
    }

    async fn hard_stop(&self, own: &Own) {
        if let Err(e) = self.engine.api.kill(&own.container_id, "SIGKILL").await {
            tracing::debug!(error = %e, "SIGKILL not delivered");
        }
    }

    async fn init_runs(&self, own: &Own) -> Option<bool> {
        match self.engine.api.inspect_container(&own.container_id).await {
            Ok(state) => Some(state.running),
            Err(e) if e.is_not_found() => Some(false),
            Err(_) => None,
        }
    }

    async fn witness(&self, own: &Own, verified: bool) -> Witness {
        super::finish::witness(self, own, verified).await
    }

    async fn engine_lost(&self, own: &Own) -> Option<String> {
        self.engine.lost_since(own.engine_mark).await
    }

    fn account(&self, ledger: &Ledger<Own>, ended: &Ended, ev: &mut Evidence) -> Account {
        super::finish::account(self, ledger, ended, ev)
    }

    fn action(&self, own: &Own, action: &mut crate::contract::Action) {
        action.image = Some(own.image_ref.clone());
        action.image_id = Some(own.image_id.clone()).filter(|i| !i.is_empty());
        action.init = Some(format!("sha256:{}", own.tools_digest));
        action.network.clone_from(&self.config.network);
        action.user.clone_from(&self.config.user);
        action.read_only_root = self.config.hardening.read_only_rootfs;
        action.limits =
            crate::contract::limits::requested(&action.limits, &self.config.defaults, &self.config.ceilings);
        action.caches = own.caches.iter().map(|(name, _, path)| (name.clone(), path.clone())).collect();
    }

    /// Where the local engine's cgroup driver puts the container (Docker's cgroupfs and
    /// systemd layouts, Podman's); a remote engine's are not on this machine.
    fn sandbox_counters(&self, own: &Own) -> Option<stevedore_init::wire::CgroupCounters> {
        if !self.engine.endpoint().is_local() {
            return None;
        }
        let id = &own.container_id;
        let candidates = [
            format!("docker/{id}"),
            format!("system.slice/docker-{id}.scope"),
            format!("machine.slice/libpod-{id}.scope"),
            format!("libpod_parent/libpod-{id}"),
        ];
        crate::attempt::host_cgroup::read(&candidates.map(std::path::PathBuf::from))
    }

    /// The engine host's, as its info says (a remote engine's is not this machine's).
    fn host_kernel(&self) -> Option<String> {
        Some(self.engine.facts().kernel_version.clone()).filter(|k| !k.is_empty())
    }

    fn worker_named(&self, own: &Own) -> String {
        format!("of image {:?}", own.image_ref)
    }

    fn background_cleanup(&self) -> bool {
        self.config.background_cleanup
    }

    async fn reattach(&self, cp: &Checkpoint, ledger: &Ledger<Own>) -> Result<Cleanup, RecoverError> {
        super::recover::reattach(self, cp, ledger).await
    }

    async fn takeover(&self, ledger: &Ledger<Own>, link_id: &str, within: Duration) -> Result<Transport, String> {
        super::recover::takeover(self, ledger, link_id, within).await
    }
}
