//! The life of an attempt whose PID 1 is stevedore's init, written once for every rung
//! that runs it: the front (`front`: admission, the rung's prepare and provision, the
//! rung's `Executor`), begin (captures, reader, start, checkpoint, Start frame) → supervise
//! → conclude (witness, teardown, judge, outcome hook), and recover (takeover). What differs
//! between the rungs is two small traits: [`front::Launch`] (the front half) and
//! [`site::Site`] (the back half).
//!
//! Invariant: nothing here names a rung; the rungs import this module, never the reverse.

pub(crate) mod action;
mod begin;
mod conclude;
pub(crate) mod front;
#[cfg(feature = "docker")]
pub(crate) mod host_cgroup;
mod recover;
pub(crate) mod site;

pub(crate) use begin::scope;
pub(crate) use recover::recover;
pub(crate) use site::{
    Decided, Layout, Ledger, Plan, Ports, Provisioned, Removed, Rung, Settings, Site, SiteBase, Teardown,
};
pub(crate) use site::{InFlight, since};

use crate::contract::{LaunchError, Outcome, Request};
use crate::link::supervise::{Ended, Reach, Rules, supervise};
use tokio_util::sync::CancellationToken;

/// The span every attempt runs in; the rung's target is recorded once it exists.
pub(crate) fn span(req: &Request) -> tracing::Span {
    tracing::info_span!(
        "attempt",
        job = %req.job_id,
        attempt = req.attempt,
        worker = %req.worker_id,
        target = tracing::field::Empty
    )
}

/// Runs a provisioned attempt to its outcome: `teardown` removes what the rung made, on
/// every path (awaited here; its `Drop` is the backstop for a dropped future).
pub(crate) async fn run<S: Site>(
    site: &S,
    req: &Request,
    plan: Plan<'_>,
    prov: Provisioned<S::Own>,
    teardown: S::Teardown,
    cancel: &CancellationToken,
) -> Result<Outcome, LaunchError> {
    let mut running = match begin::begin(site, req, plan, prov).await {
        Ok(r) => r,
        Err(e) => return Err(abandon(teardown, e).await),
    };
    tracing::Span::current().record("target", describe(&site.target(&running.ledger.own)));
    let ended = supervised(site, &mut running.link, req, &running.ledger, cancel).await;
    let begin::Running { ledger, link, reports, captures } = running;
    drop(link);
    let worker = site.worker_named(&ledger.own);
    let how = conclude::How::Fresh { background: site.background_cleanup() };
    let (outcome, silent) =
        conclude::conclude(site, req, conclude::Ending { ledger, ended, reports }, teardown, how).await;
    if let Some(detail) = silent {
        return Err(LaunchError::HandlerProtocol { worker, detail });
    }
    captures.handed_over();
    Ok(conclude::deliver(req, outcome).await)
}

/// Removes what an attempt that never ran made; the launch error, to return.
pub(crate) async fn abandon(teardown: impl Teardown, e: LaunchError) -> LaunchError {
    let removed = teardown.remove().await;
    if !removed.errors.is_empty() {
        tracing::warn!(errors = ?removed.errors, "cleanup after a launch error left things behind");
    }
    e
}

/// The target as the span shows it.
fn describe(t: &crate::contract::Target) -> String {
    match t {
        crate::contract::Target::Container { id, .. } => format!("container {}", &id[..id.len().min(12)]),
        crate::contract::Target::Process { pid, .. } => format!("pid {pid}"),
        crate::contract::Target::Runtime { id, .. } => format!("runtime container {id}"),
        crate::contract::Target::Pod { namespace, name, .. } => format!("pod {namespace}/{name}"),
    }
}

/// Supervises the attempt to its end (`link::supervise`) under the rung's settings, with the
/// rung's own hard stop.
async fn supervised<S: Site>(
    site: &S,
    link: &mut crate::link::supervise::Linked,
    req: &Request,
    ledger: &Ledger<S::Own>,
    cancel: &CancellationToken,
) -> Ended {
    let cfg = site.rung().settings;
    let rules = Rules {
        kill_margin: cfg.link.kill_margin,
        call_timeout: cfg.call_timeout,
        collection: cfg.link.collection,
        max_output_bytes: cfg.link.output_caps.max_total_bytes,
    };
    supervise(link, req, rules, cancel, &SiteReach { site, ledger }).await
}

/// What supervision asks of a site for one attempt: its hard stop, a new transport.
struct SiteReach<'a, S: Site> {
    site: &'a S,
    ledger: &'a Ledger<S::Own>,
}

impl<S: Site> Reach for SiteReach<'_, S> {
    fn hard_stop(&self) -> crate::util::BoxFuture<'_, ()> {
        Box::pin(self.site.hard_stop(&self.ledger.own))
    }

    fn init_runs(&self) -> crate::util::BoxFuture<'_, Option<bool>> {
        Box::pin(self.site.init_runs(&self.ledger.own))
    }

    fn sandbox_counters(&self) -> Option<stevedore_init::wire::CgroupCounters> {
        self.site.sandbox_counters(&self.ledger.own)
    }

    fn reopen<'a>(
        &'a self,
        link_id: &'a str,
        within: std::time::Duration,
    ) -> crate::util::BoxFuture<'a, Result<crate::link::session::Transport, String>> {
        Box::pin(self.site.takeover(self.ledger, link_id, within))
    }
}

/// Removes the captures of `worker`'s attempts that are not in flight (`<name>.<stream>`,
/// the name ending in the attempt id): what a previous life of the worker left.
pub(crate) fn reclaim_captures(
    base: &SiteBase,
    worker: &str,
    in_flight: &std::collections::HashSet<String>,
    report: &mut crate::contract::ReclaimReport,
) {
    use crate::contract::{ObjectKind, ReclaimFailure};
    let Ok(dir) = base.captures.of_worker(worker) else { return };
    let Ok(files) = dir.files() else { return };
    for name in files {
        let attempt = name.split('.').next().and_then(|stem| stem.rsplit('-').next()).unwrap_or("");
        if in_flight.contains(attempt) {
            continue;
        }
        let path = dir.path().join(&name).display().to_string();
        match dir.remove_file(&name) {
            Ok(()) => report.paths_removed.push(path),
            Err(e) => report.failed.push(ReclaimFailure { kind: ObjectKind::Path, id: path, error: e.to_string() }),
        }
    }
    // The worker's dir too, once nothing is left in it (an attempt starting now makes it again).
    if let Ok(base) = base.captures.base() {
        let _ = base.remove_subdir_if_empty(worker);
    }
}
