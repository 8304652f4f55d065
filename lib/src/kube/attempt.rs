//! One attempt in one Pod, as this rung's `Launch` (`prepare` → `launch`: the Pod made, the
//! inputs staged, the attempt's container attached) and `Site` (what this rung alone knows
//! of it). `Err` only when the Pod never ran the command.

use super::cleanup::Cleanup;
use super::ledger::Own;
use super::prepare::Plan;
use super::site::KubeSite;
use super::sizes::Sizes;
use crate::attempt::front::{Gate, Launch, Made, Prepared};
use crate::attempt::{self, Layout, Ledger, Ports, Provisioned, Rung, Settings, Site};
use crate::contract::{Checkpoint, Evidence, LaunchError, ReclaimError, ReclaimReport, RecoverError, Request, Target};
use crate::link::judgement::{Account, Witness};
use crate::link::session::Transport;
use crate::link::supervise::Ended;
use std::sync::Arc;
use std::time::Duration;
use stevedore_init::wire::{self, IN_DIR, OUT_DIR};
use tokio_util::sync::CancellationToken;

impl Launch for Arc<KubeSite> {
    type Sizes = Sizes;
    type Plan = Plan;

    fn gate(&self) -> &Gate {
        &self.gate
    }

    fn denies_network(&self) -> bool {
        self.config.network_denied
    }

    /// Memory and CPU as the Pod's limits, no capabilities, the network where the namespace
    /// denies it; never pids (Kubernetes limits them per node), and disk only where the
    /// cluster sizes memory-backed volumes (read back per attempt, so not claimed here).
    fn enforces(&self) -> Vec<&'static str> {
        let mut v = vec!["memory", "cpu", "capabilities"];
        if self.config.user.0 != 0 {
            v.push("non_root");
        }
        if self.config.network_denied {
            v.push("network");
        }
        v
    }

    fn sizes(&self, req: &Request) -> (Sizes, u32) {
        (super::sizes::of(&req.limits, &self.config), 0)
    }

    async fn prepare(&self, req: &Request, sizes: Sizes) -> Result<Prepared<Plan>, LaunchError> {
        super::prepare::prepare(&self.config, &self.base.incarnation, req, sizes).map(Prepared::Ready)
    }

    /// The Pod made, the inputs staged, the attempt's container attached.
    async fn provision(
        &self,
        req: &Request,
        plan: &mut Plan,
        cancel: &CancellationToken,
    ) -> (Cleanup, Result<Made<Own>, LaunchError>) {
        let mut cleanup = Cleanup::new(self.clone(), plan.decided.attempt_id.clone());
        let made = super::launch::provision(self, req, plan, &mut cleanup, cancel)
            .await
            .map(|ready| Made { staged_at: ready.staged_at, prov: provisioned(self, plan, ready) });
        (cleanup, made)
    }

    fn decided(plan: &Plan) -> &attempt::Decided {
        &plan.decided
    }

    async fn reclaim(&self, worker: &str) -> Result<ReclaimReport, ReclaimError> {
        super::reclaim::reclaim(self, worker).await
    }
}

/// The attached Pod as the shared attempt takes it: its transport, its facts, the sandbox's
/// layout.
fn provisioned(site: &KubeSite, plan: &Plan, ready: super::launch::Ready) -> Provisioned<Own> {
    let mut skipped = ready.skipped;
    skipped.extend(plan.sizes.skipped.clone());
    let layout = Layout {
        in_dir: IN_DIR.to_owned(),
        out_dir: OUT_DIR.to_owned(),
        // `exec` runs as the container's user, the command's: the takeover's proof of the
        // attempt's key is all that tells a host apart (`docs/link.md`).
        takeover_uid: None,
        takeover_fd: None,
        rlimits: vec![wire::Rlimit {
            resource: wire::RlimitResource::Nofile,
            soft: plan.sizes.nofile,
            hard: plan.sizes.nofile,
        }],
        cgroup_dir: Some(stevedore_init::cgroup::CGROUP_ROOT.to_owned()),
        measure: Vec::new(),
        mounts: plan.mounts.clone(),
        image_env: Some(wire::env::INIT_READS.iter().map(|k| (*k).to_owned()).collect()),
        tmp_dir: Some("/tmp".to_owned()),
        sampled_cgroup: None,
        credentials: ready.credentials,
        held: crate::link::held(
            plan.sizes.memory.saturating_add(site.config.link.delivery_reserve),
            None,
            plan.sizes.cpu_millis,
            &ready.enforcement,
        ),
    };
    let own = Own {
        namespace: site.namespace.clone(),
        pod: plan.decided.name.clone(),
        uid: ready.uid,
        image: plan.image.clone(),
        init_image: site.init_image.clone(),
        memory: plan.sizes.memory,
        cpu_millis: plan.sizes.cpu_millis,
        disk: plan.sizes.disk,
        seen: Arc::default(),
        waited: ready.waited,
    };
    Provisioned {
        transport: ready.attached,
        running: true,
        own,
        layout,
        enforcement: ready.enforcement,
        skipped,
        inputs: ready.inputs,
    }
}

impl Site for Arc<KubeSite> {
    type Own = Own;
    type Teardown = Cleanup;

    fn rung(&self) -> Rung<'_> {
        let settings = Settings { link: self.config.link, call_timeout: self.config.api_timeout };
        Rung { name: &self.config.name, level: self.config.level(), base: &self.base, settings }
    }

    /// The Pod runs already: its init waits for the Start frame on the attach.
    async fn start(&self, _: &Own, _: bool) -> Result<Ports, LaunchError> {
        Ok(Ports::new())
    }

    fn target(&self, own: &Own) -> Target {
        Target::Pod { namespace: own.namespace.clone(), name: own.pod.clone(), uid: own.uid.clone() }
    }

    /// Deletes the Pod with a second of grace: the kubelet TERMs, then KILLs what is left.
    async fn hard_stop(&self, own: &Own) {
        self.hard_stopped.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(own.pod.clone());
        if let Err(e) = self.delete_pod(&own.pod, false).await {
            tracing::warn!(error = %e, "deleting the Pod to stop it failed");
        }
    }

    async fn init_runs(&self, own: &Own) -> Option<bool> {
        match self.get_pod(&own.pod).await {
            Ok(None) => Some(false),
            Ok(Some(p)) => Some(super::state::main_runs(&p)),
            Err(_) => None,
        }
    }

    fn last_frame(&self, own: &Own) {
        self.concluded.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(own.pod.clone());
    }

    async fn witness(&self, own: &Own, verified: bool) -> Witness {
        super::finish::witness(self, own, verified).await
    }

    fn account(&self, ledger: &Ledger<Own>, ended: &Ended, ev: &mut Evidence) -> Account {
        super::finish::account(self, ledger, ended, ev)
    }

    /// The image's id is the Pod's status's, learnt at the end (`attempt::action::sealed`).
    fn action(&self, own: &Own, action: &mut crate::contract::Action) {
        action.image = Some(own.image.clone());
        action.network = if self.config.network_denied { "none" } else { "cluster" }.to_owned();
        let (uid, gid) = self.config.user;
        action.user = format!("{uid}:{gid}");
        action.read_only_root = true;
        action.limits =
            crate::contract::limits::requested(&action.limits, &self.config.defaults, &self.config.ceilings);
    }

    fn worker_named(&self, own: &Own) -> String {
        format!("of image {:?}", own.image)
    }

    fn background_cleanup(&self) -> bool {
        self.config.background_cleanup
    }

    async fn reattach(&self, cp: &Checkpoint, ledger: &Ledger<Own>) -> Result<Cleanup, RecoverError> {
        super::recover::reattach(self, cp, ledger).await
    }

    async fn takeover(&self, ledger: &Ledger<Own>, link_id: &str, within: Duration) -> Result<Transport, String> {
        super::recover::exec(self, &ledger.own.pod, wire::relay_argv(link_id, within))
            .await
            .map_err(|e| crate::util::error_chain(&e))
    }
}
