//! The sandbox's reports, host side: checked again as they arrive (they are claims), handed
//! to the engine's report hook through a bounded queue the link's reader never waits on,
//! and summed up for the evidence.

use crate::contract::{AttemptRef, HookSet, ReportKind, ReportsSeen, SandboxReport, StartedInfo};
use stevedore_init::report::Forwarded;
use stevedore_init::wire::{self, Kind, ReportCounts, Scope};
use tokio::sync::mpsc;

/// Reports waiting for a slow hook; more are dropped and counted.
pub(crate) const QUEUE: usize = 256;

/// What goes to the engine's hooks, in order, on the hooks' own task.
#[derive(Debug)]
pub(crate) enum Delivery {
    /// The command is about to start (queued before the Start frame, so first).
    Started(StartedInfo),
    /// A report from the sandbox.
    Report(SandboxReport),
}

/// The reader's end: checks and routes each report frame.
#[derive(Debug)]
pub(crate) struct ReportRoute {
    tx: Option<mpsc::Sender<Delivery>>,
    scope: Scope,
    last_seq: u64,
    /// What the host saw.
    pub seen: ReportsSeen,
}

impl ReportRoute {
    /// A route for `scope`, to `tx` when the attempt has a report hook.
    pub fn new(scope: Scope, tx: Option<mpsc::Sender<Delivery>>) -> Self {
        Self { tx, scope, last_seq: 0, seen: ReportsSeen::default() }
    }

    fn refuse(&mut self, why: String) {
        self.seen.refused += 1;
        if self.seen.refusals.len() < 8 {
            self.seen.refusals.push(format!("host: {why}"));
        }
    }

    /// Takes one Report frame's body.
    pub fn take(&mut self, body: &[u8]) {
        self.seen.received += 1;
        let parsed = wire::parse_claim::<Forwarded>(body, Kind::Report.max_body()).map_err(|e| e.to_string());
        match parsed {
            Ok(r) if r.seq <= self.last_seq => self.refuse(format!("sequence {} after {}", r.seq, self.last_seq)),
            Ok(r) => match r.report.clone().check(&self.scope) {
                Ok(_) => {
                    self.pass(super::convert::sandbox_report(r));
                }
                Err(why) => self.refuse(why),
            },
            Err(why) => self.refuse(why),
        }
    }

    /// Hands a checked report on; `false` when the hook's queue could not take it.
    fn pass(&mut self, r: SandboxReport) -> bool {
        self.last_seq = r.seq;
        if r.report.kind == ReportKind::Progress {
            self.seen.last_progress = r.report.percent;
        }
        let Some(tx) = &self.tx else { return false };
        match tx.try_send(Delivery::Report(r)) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.seen.dropped_slow_hook += 1;
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.tx = None;
                false
            }
        }
    }
}

/// Reports made in the worker's own process (the in-process rung's handlers): the same
/// checks and limits as the init applies to a sandbox's, then the same route.
#[derive(Debug)]
pub(crate) struct Direct {
    limiter: stevedore_init::report::Limiter,
    route: ReportRoute,
    started: std::time::Instant,
}

impl Direct {
    pub fn new(scope: Scope, tx: Option<mpsc::Sender<Delivery>>) -> Self {
        let now = std::time::Instant::now();
        Self { limiter: stevedore_init::report::Limiter::new(now), route: ReportRoute::new(scope, tx), started: now }
    }

    /// Checks, limits and routes one report; `false` when it was not taken.
    pub fn take(&mut self, report: crate::contract::Report) -> bool {
        let report = match super::convert::report_out(report).check(&self.route.scope) {
            Ok(r) => r,
            Err(why) => {
                self.limiter.refuse(why);
                return false;
            }
        };
        let now = std::time::Instant::now();
        if !self.limiter.admit(now) {
            return false;
        }
        self.route.seen.received += 1;
        let at_ms = u64::try_from(now.saturating_duration_since(self.started).as_millis()).unwrap_or(u64::MAX);
        self.route.pass(SandboxReport::new(self.limiter.counts.forwarded, at_ms, super::convert::report_in(report)))
    }

    /// The limiter's counts and what the route saw.
    pub fn counts(&self) -> (ReportCounts, ReportsSeen) {
        (self.limiter.counts.clone(), self.route.seen.clone())
    }
}

/// What the forwarding task delivered.
#[derive(Debug, Default)]
pub(crate) struct Delivered {
    pub delivered: u64,
    pub failures: Vec<String>,
}

/// Starts the task that hands queued deliveries to `hooks` one at a time, in order.
pub(crate) fn forward(
    hooks: HookSet,
    attempt: AttemptRef,
) -> (mpsc::Sender<Delivery>, tokio::task::JoinHandle<Delivered>) {
    let (tx, mut rx) = mpsc::channel::<Delivery>(QUEUE);
    let task = tokio::spawn(async move {
        let mut d = Delivered::default();
        while let Some(item) = rx.recv().await {
            let done = match &item {
                Delivery::Started(info) => hooks.call("started", hooks.0.started(&attempt, info)).await,
                Delivery::Report(r) => hooks.call("report", hooks.0.report(&attempt, r)).await,
            };
            match done {
                Ok(()) if matches!(item, Delivery::Report(_)) => d.delivered += 1,
                Ok(()) => {}
                Err(e) if d.failures.len() < 8 => d.failures.push(e),
                Err(_) => {}
            }
        }
        d
    });
    (tx, task)
}

/// Waits (bounded) for the forwarding task to deliver what is queued.
pub(crate) async fn finish(task: Option<tokio::task::JoinHandle<Delivered>>) -> Option<Delivered> {
    let mut task = task?;
    match tokio::time::timeout(crate::contract::HOOK_TIMEOUT, &mut task).await {
        Ok(Ok(d)) => Some(d),
        Ok(Err(_)) => {
            Some(Delivered { failures: vec!["report: the forwarding task failed".into()], ..Delivered::default() })
        }
        Err(_) => {
            task.abort();
            Some(Delivered {
                failures: vec!["report: the hook did not keep up; the rest was not delivered".into()],
                ..Delivered::default()
            })
        }
    }
}

/// The evidence: the init's counts, the host's, and the hook's.
pub(crate) fn seen(
    init: Option<&ReportCounts>,
    host: &ReportsSeen,
    hook: Option<Delivered>,
    failures: &mut Vec<String>,
) -> Option<ReportsSeen> {
    let mut s = host.clone();
    if let Some(c) = init {
        s.dropped_rate = c.dropped_rate;
        s.dropped_total = c.dropped_total;
        s.refused += c.refused;
        let mut refusals: Vec<String> = c.refusals.iter().map(|r| format!("init: {r}")).collect();
        refusals.append(&mut s.refusals);
        refusals.truncate(8);
        s.refusals = refusals;
    }
    if let Some(d) = hook {
        s.delivered = d.delivered;
        failures.extend(d.failures);
    }
    let any = s.received + s.dropped_rate + s.dropped_total + s.refused + s.dropped_slow_hook > 0;
    any.then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use stevedore_init::report::Report;

    fn body(seq: u64, report: Report) -> Vec<u8> {
        serde_json::to_vec(&Forwarded { seq, at_ms: 5, report }).unwrap()
    }

    #[test]
    fn reports_are_checked_again_and_in_order() {
        let (tx, mut rx) = mpsc::channel(2);
        let mut route = ReportRoute::new(Scope { job_id: "j".into(), attempt: 1 }, Some(tx));
        route.take(&body(1, Report::progress(10.0, None)));
        route.take(&body(1, Report::progress(20.0, None)));
        let mut other = Report::note("x");
        other.attempt = Some(2);
        route.take(&body(2, other));
        route.take(b"{\"seq\":3}");
        route.take(&body(3, Report::progress(30.0, None)));
        route.take(&body(4, Report::heartbeat()));
        assert_eq!(route.seen.received, 6);
        assert_eq!(route.seen.refused, 3, "{:?}", route.seen.refusals);
        assert_eq!(route.seen.dropped_slow_hook, 1, "the queue holds two");
        assert_eq!(route.seen.last_progress, Some(30.0));
        let seq = |d: Delivery| match d {
            Delivery::Report(r) => r.seq,
            Delivery::Started(_) => 0,
        };
        assert_eq!(seq(rx.try_recv().unwrap()), 1);
        assert_eq!(seq(rx.try_recv().unwrap()), 3);
    }
}
