//! One attempt as a bundle run by the OCI runtime, as this rung's `Launch` (`prepare` →
//! `provision`) and `Site` (what the shared attempt asks of it).

use super::cleanup::{Cleanup, start_ticks};
use super::ledger::Own;
use super::prepare::Plan;
use super::site::OciSite;
use super::spec::Sizes;
use crate::attempt::front::{Gate, Launch, Made, Prepared};
use crate::attempt::{self, Ledger, Ports, Rung, Settings, Site};
use crate::contract::{Checkpoint, Evidence, LaunchError, ReclaimError, ReclaimReport, RecoverError, Request, Target};
use crate::link::claims::{self, Bounds};
use crate::link::judgement::{Account, Witness};
use crate::link::session::Transport;
use crate::link::supervise::Ended;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long the host waits on anything of the attempt's link that has no time of its own.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

impl Launch for Arc<OciSite> {
    type Sizes = Sizes;
    type Plan = Plan;

    fn gate(&self) -> &Gate {
        &self.gate
    }

    /// A new network namespace with only `lo`.
    fn denies_network(&self) -> bool {
        true
    }

    /// Its census's features, by the policy's names (no census made: it looks for crun).
    fn enforces(&self) -> Vec<&'static str> {
        let features = super::OciExecutor::features_of(self);
        features.into_iter().filter(|f| crate::contract::ENFORCEABLE.contains(f)).collect()
    }

    fn sizes(&self, req: &Request) -> (Sizes, u32) {
        (super::spec::sizes(&req.limits, &self.config), 0)
    }

    async fn prepare(&self, req: &Request, sizes: Sizes) -> Result<Prepared<Plan>, LaunchError> {
        super::prepare::prepare(self, req, sizes).await.map(Prepared::Ready)
    }

    async fn provision(
        &self,
        req: &Request,
        plan: &mut Plan,
        cancel: &CancellationToken,
    ) -> (Cleanup, Result<Made<Own>, LaunchError>) {
        let mut cleanup = Cleanup::new(self.clone(), plan.decided.attempt_id.clone(), &req.worker_id);
        let made = super::provision::provision(self, req, plan, &mut cleanup, cancel)
            .await
            .map(|(prov, staged_at)| Made { prov, staged_at });
        (cleanup, made)
    }

    fn decided(plan: &Plan) -> &attempt::Decided {
        &plan.decided
    }

    async fn reclaim(&self, worker: &str) -> Result<ReclaimReport, ReclaimError> {
        super::reclaim::reclaim(self, worker).await
    }
}

impl Site for Arc<OciSite> {
    type Own = Own;
    type Teardown = Cleanup;

    fn rung(&self) -> Rung<'_> {
        let settings = Settings { link: self.config.link, call_timeout: CALL_TIMEOUT };
        Rung { name: &self.config.name, level: self.config.level(), base: &self.base, settings }
    }

    /// `provision` ran the runtime already, and nothing is published.
    async fn start(&self, _: &Own, _: bool) -> Result<Ports, LaunchError> {
        Ok(Ports::new())
    }

    fn target(&self, own: &Own) -> Target {
        Target::Runtime { id: own.id.clone(), root: self.state.display().to_string() }
    }

    /// SIGKILL to the container's PID 1: its pid namespace goes with it.
    async fn hard_stop(&self, own: &Own) {
        if let Err(e) = self.runtime_call(&["kill", &own.id, "KILL"]).await {
            tracing::debug!(error = %e, "SIGKILL through the runtime not delivered");
        }
    }

    /// The cgroup the runtime made under the rung's parent (runsc removes it with the sandbox).
    fn sandbox_counters(&self, own: &Own) -> Option<stevedore_init::wire::CgroupCounters> {
        crate::attempt::host_cgroup::read(&[std::path::Path::new(super::spec::CGROUP_PARENT).join(&own.id)])
    }

    /// `runtime run` lives exactly as long as the container's PID 1.
    async fn init_runs(&self, own: &Own) -> Option<bool> {
        Some(start_ticks(own.runtime_pid) == Some(own.start_ticks))
    }

    /// The runtime destroys the container (and its cgroup) as its PID 1 ends: what it says of
    /// an end without a record is how PID 1 ended (its exit status is the runtime's own:
    /// 128 + the signal that killed it).
    async fn witness(&self, own: &Own, link_verdict: bool) -> Witness {
        let none = Witness { why_no_record: "no record from the init", ..Witness::default() };
        let Some(mut exit) = self.exit_of(&own.id).filter(|_| !link_verdict) else { return none };
        let within = self.config.link.kill_margin + Duration::from_secs(3);
        let code = match tokio::time::timeout(within, exit.wait_for(Option::is_some)).await {
            Ok(Ok(code)) => *code,
            _ => None,
        };
        // stevedore's init never exits above 128 by itself: such a code is a signal from outside.
        match code {
            Some(c) if c > 128 => Witness { exit: crate::contract::Exit::Signal(c - 128), ..none },
            _ => none,
        }
    }

    fn action(&self, own: &Own, action: &mut crate::contract::Action) {
        action.image = Some(own.image_ref.clone());
        action.image_id = Some(own.image_id.clone()).filter(|i| !i.is_empty());
        action.init = Some(format!("sha256:{}", self.init_digest));
        action.network = "none".to_owned();
        action.user = format!("{}:{}", self.config.user.0, self.config.user.1);
        action.read_only_root = true;
        action.limits =
            crate::contract::limits::requested(&action.limits, &self.config.defaults, &self.config.ceilings);
    }

    fn account(&self, ledger: &Ledger<Own>, ended: &Ended, ev: &mut Evidence) -> Account {
        let own = &ledger.own;
        ev.container_id = Some(own.id.clone());
        ev.image = Some(own.image_ref.clone());
        ev.image_id = Some(own.image_id.clone());
        ev.runtime = Some(format!("{} ({})", self.runtime.display(), self.runtime_version));
        ev.init = Some(format!("host dir {} bound read-only (init sha256:{})", self.tools.display(), self.init_digest));
        let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        Account {
            expects_handler: ledger.expects_handler,
            bounds: Bounds {
                host_wall: ended.host_wall,
                cpus: own.cpu_millis.map_or(ncpu, |m| (m as f64 / 1000.0).min(ncpu)),
                memory: own.memory,
                cpu_limit_millis: own.cpu_millis,
                reserve: self.config.link.delivery_reserve,
                cgroup_note: claims::CONTAINER_CGROUP,
            },
            disk_limit: Some(own.disk),
            hard_stop: "the container was SIGKILLed through the runtime",
            no_peak_memory: None,
        }
    }

    /// This machine's: the runtime runs here.
    fn host_kernel(&self) -> Option<String> {
        crate::attempt::site::local_kernel()
    }

    fn worker_named(&self, own: &Own) -> String {
        format!("of image {:?}", own.image_ref)
    }

    /// The tmpfs this rung mounted in the bundle (`provision::OUT_MOUNT`), by the rung's own
    /// bundles' dir and the attempt's name (a checkpoint's was checked by `reattach`).
    fn outputs_in_place(&self, own: &Own) -> Option<std::path::PathBuf> {
        Some(self.bundles.join(&own.id).join(super::provision::OUT_MOUNT))
    }

    async fn reattach(&self, cp: &Checkpoint, ledger: &Ledger<Own>) -> Result<Cleanup, RecoverError> {
        super::recover::reattach(self, cp, ledger).await
    }

    async fn takeover(&self, ledger: &Ledger<Own>, _: &str, _: Duration) -> Result<Transport, String> {
        super::recover::takeover(ledger).await
    }
}
