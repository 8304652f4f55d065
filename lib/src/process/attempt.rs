//! One attempt as a child process of the worker, as this rung's `Launch` (`prepare` →
//! `provision`: the attempt's dir, a cgroup when one is delegated, stevedore's init spawned
//! as the command's uid) and `Site` (what this rung alone knows of it).

use super::cleanup::Cleanup;
use super::ledger::Own;
use super::prepare::Plan;
use super::site::ProcessSite;
use crate::attempt::front::{Gate, Launch, Made, Prepared};
use crate::attempt::{self, Ledger, Ports, Rung, Settings, Site};
use crate::contract::{
    Checkpoint, Evidence, LaunchError, Level, ReclaimError, ReclaimReport, RecoverError, Request, Target,
};
use crate::link::claims::Bounds;
use crate::link::judgement::{Account, Witness};
use crate::link::session::Transport;
use crate::link::supervise::Ended;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long the host waits on anything of the attempt's link that has no time of its own.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

impl Launch for Arc<ProcessSite> {
    type Sizes = ();
    type Plan = Plan;

    fn gate(&self) -> &Gate {
        &self.gate
    }

    fn sizes(&self, _: &Request) -> ((), u32) {
        ((), 0)
    }

    /// A child of the worker has the worker's network.
    fn denies_network(&self) -> bool {
        false
    }

    /// Memory, CPU and pids, where a cgroup of its own per attempt could be made when the
    /// rung was set up; never disk or network.
    fn enforces(&self) -> Vec<&'static str> {
        match self.cgroups {
            true => vec!["memory", "cpu", "pids"],
            false => Vec::new(),
        }
    }

    async fn prepare(&self, req: &Request, (): ()) -> Result<Prepared<Plan>, LaunchError> {
        super::prepare::prepare(req, &self.config, || self.worker_exe()).map(Prepared::Ready)
    }

    async fn provision(
        &self,
        req: &Request,
        plan: &mut Plan,
        cancel: &CancellationToken,
    ) -> (Cleanup, Result<Made<Own>, LaunchError>) {
        let mut cleanup = Cleanup::new(self.clone(), plan.decided.attempt_id.clone());
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

impl Site for Arc<ProcessSite> {
    type Own = Own;
    type Teardown = Cleanup;

    fn rung(&self) -> Rung<'_> {
        // What the checkpoint and the evidence say, as `Executor::level` does for the registry.
        let level = if self.uids.is_none() { Level::None } else { Level::Process };
        let settings = Settings { link: self.config.link, call_timeout: CALL_TIMEOUT };
        Rung { name: &self.config.name, level, base: &self.base, settings }
    }

    /// The init was spawned by `provision`, and it publishes nothing.
    async fn start(&self, _: &Own, _: bool) -> Result<Ports, LaunchError> {
        Ok(Ports::new())
    }

    fn target(&self, own: &Own) -> Target {
        Target::Process { pid: own.init_pid, start_ticks: own.start_ticks }
    }

    async fn hard_stop(&self, own: &Own) {
        super::tree::kill_tree(own.init_pid, own.cgroup.as_ref());
    }

    async fn init_runs(&self, own: &Own) -> Option<bool> {
        Some(super::tree::start_ticks(own.init_pid) == Some(own.start_ticks))
    }

    /// The host has no exit state of an init that left no record: what is known is the
    /// cgroup's, read at the removal (`account`).
    /// The init's end is the host's to see (its own child); `/out` is a directory of the
    /// host's: when the outputs did not all arrive it is listed, so each file is named.
    async fn witness(&self, own: &Own, link_verdict: bool) -> Witness {
        let listed = (!link_verdict)
            .then(|| crate::outputs::list(&own.dir.output, self.config.link.output_caps.max_files))
            .and_then(Result::ok);
        Witness { why_no_record: "no record from the init", listed, ..Witness::default() }
    }

    /// No image: the host's own files; the host's network; a uid of the attempt's own (which
    /// one does not change the result), a fixed one, or the worker's.
    fn action(&self, _: &Own, action: &mut crate::contract::Action) {
        action.network = "host".to_owned();
        action.user = match (&self.uids, self.config.run_as) {
            (Some(_), _) => "a uid of the attempt's own".to_owned(),
            (None, Some((uid, gid))) => format!("{uid}:{gid}"),
            (None, None) => "the worker's".to_owned(),
        };
        action.limits =
            crate::contract::limits::requested(&action.limits, &self.config.defaults, &self.config.ceilings);
    }

    fn account(&self, ledger: &Ledger<Own>, ended: &Ended, ev: &mut Evidence) -> Account {
        let own = &ledger.own;
        ev.init = Some(format!("pid {} ({})", own.init_pid, self.init.display()));
        let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        Account {
            expects_handler: ledger.expects_handler,
            bounds: Bounds {
                host_wall: ended.host_wall,
                cpus: own.cpu_millis.map_or(ncpu, |m| (m as f64 / 1000.0).min(ncpu)),
                memory: own.memory.unwrap_or(u64::MAX),
                cpu_limit_millis: own.cpu_millis,
                reserve: 0,
                cgroup_note: "usage read by stevedore from the attempt's own cgroup once everything in it ended: cpu, \
                              memory high-water mark (the init's own included), oom_kill count",
            },
            disk_limit: None,
            hard_stop: "the init and the command's session were SIGKILLed",
            no_peak_memory: own
                .cgroup
                .is_none()
                .then_some("no cgroup: the high-water mark of a process tree is not knowable without one"),
        }
    }

    /// This machine's: the command runs on it.
    fn host_kernel(&self) -> Option<String> {
        crate::attempt::site::local_kernel()
    }

    fn worker_named(&self, _: &Own) -> String {
        match &self.config.worker_exe {
            Some(p) => p.display().to_string(),
            None => "(this worker's own binary)".to_owned(),
        }
    }

    async fn reattach(&self, cp: &Checkpoint, ledger: &Ledger<Own>) -> Result<Cleanup, RecoverError> {
        super::recover::reattach(self, cp, ledger).await
    }

    async fn takeover(&self, ledger: &Ledger<Own>, _: &str, _: Duration) -> Result<Transport, String> {
        super::recover::takeover(ledger).await
    }
}
