//! After supervision: the rung's witness (when no verified record arrived), the removal of
//! what the rung made, the evidence every rung gives and the rung's own, the judge, the
//! outcome hook.
//!
//! A handler runner that never speaks the protocol (the worker binary does not call
//! `sandbox::main_hook`) is `Err(LaunchError::HandlerProtocol)` on every rung: the handler
//! never ran, and the fault is the worker's build, which no retry changes
//! (`docs/outcome.md`). A recovered attempt had spoken before it was left, so it ends
//! with its Outcome.

use super::site::{Ledger, Removed, Site, Teardown};
use crate::contract::{Evidence, Exit, Outcome, Record, Request, Source, judge};
use crate::link::judgement::{self, OomWitness};
use crate::link::reports::{self, Delivered};
use crate::link::supervise::Ended;

/// What supervision left of an attempt.
#[derive(Debug)]
pub(crate) struct Ending<O> {
    pub ledger: Ledger<O>,
    pub ended: Ended,
    /// The task handing reports to the engine's hook.
    pub reports: Option<tokio::task::JoinHandle<Delivered>>,
}

/// How the attempt came to its end.
#[derive(Debug)]
pub(crate) enum How {
    /// Launched by this process; `background`: a finished attempt with a verified record is
    /// removed after its outcome is returned.
    Fresh { background: bool },
    /// Taken over from a previous life of the worker (the evidence's `recovered`).
    Recovered(String),
    /// The takeover failed for this reason: judged from what the host saw.
    Unrecovered(String),
}

/// The attempt's Outcome, before the outcome hook ([`deliver`]) sees it; and, for a fresh
/// attempt whose handler runner never spoke, what was seen of it (the caller's error).
pub(crate) async fn conclude<S: Site>(
    site: &S,
    req: &Request,
    ending: Ending<S::Own>,
    teardown: S::Teardown,
    how: How,
) -> (Outcome, Option<String>) {
    let Ending { ledger, mut ended, reports } = ending;
    let verified = ended.record.as_ref().is_some_and(Result::is_ok);
    // The init's last frame is the outputs' end: with it the link is the verdict, and the
    // rung is asked only its cheap facts; without it the rung's witness is what is left
    // (`ARCHITECTURE.md`, "Judging").
    let last_frame = verified && ended.received.outputs.as_ref().is_some_and(|o| o.end.is_some());
    if last_frame {
        site.last_frame(&ledger.own);
    }
    // A sandbox that showed its init no cgroup: the host's read of it, made before the init's
    // ack (`link::supervise`), else now, before the runtime removes it with the sandbox.
    let mut host_read = false;
    let before_ack = ended.host_counters.take();
    if let Some(Ok(rec)) = ended.record.as_mut().filter(|_| last_frame)
        && rec.cgroup.version.is_none()
        && let Some(c) = before_ack.or_else(|| site.sandbox_counters(&ledger.own))
    {
        rec.cgroup = c;
        host_read = true;
    }
    let mut witness = site.witness(&ledger.own, last_frame || ended.collection_timed_out).await;
    let removed = match how {
        How::Fresh { background: true } if last_frame => {
            // Nothing the removal finds changes the outcome: it runs on the rung's tracked
            // tasks (`close` waits for them) while the outcome is returned.
            site.rung().base.tracker.spawn(async move {
                let removed = teardown.remove().await;
                if !removed.errors.is_empty() {
                    tracing::warn!(errors = ?removed.errors, "removing a finished attempt's objects left some behind");
                }
            });
            Removed::default()
        }
        _ => teardown.remove().await,
    };
    // The rung's main object (its container) was gone when the removal came: someone else's doing.
    witness.removed_externally |= removed.by_others.iter().any(|o| o == &ledger.name);
    // Read by the rung once everything of the attempt had ended, so final: they replace the
    // init's own figures.
    if let (Some(c), Some(Ok(rec))) = (removed.counters.clone(), &mut ended.record) {
        // A kill the kernel counted after the init's own read: the init's, while it sent
        // the outputs (nothing else of the attempt was left).
        if !last_frame && c.oom_kills.unwrap_or(0) > rec.cgroup.oom_kills.unwrap_or(0) {
            witness.oom_killed = Some(true);
            witness.oom_by = OomWitness::Cgroup;
        }
        rec.cgroup = c;
    } else if ended.record.is_none() {
        witness.counters = removed.counters.clone();
    }
    let delivered = reports::finish(reports).await;
    let mut ev = evidence(site, req, &ledger, &removed, &how);
    // The level as shown, not as named: the kernel the init saw against the host's.
    // The sealed record's word first; the Started frame's where no record came.
    let seen =
        ended.record.as_ref().and_then(|r| r.as_ref().ok()).and_then(|r| r.kernel.clone()).or(ended.kernel.clone());
    let claimed = site.rung().level;
    // Only a `vm` claim has anything to show: no host read on any other attempt.
    let host = (claimed == crate::contract::Level::Vm).then(|| site.host_kernel()).flatten();
    let (level, note) = crate::contract::level_shown(claimed, seen.as_deref(), host.as_deref());
    if claimed == crate::contract::Level::Vm && seen.is_some() {
        site.rung().base.show(level);
    }
    ev.level = Some(level);
    ev.kernel = seen;
    ev.notes.extend(note);
    let mut account = site.account(&ledger, &ended, &mut ev);
    if host_read {
        account.bounds.cgroup_note = crate::link::claims::SANDBOX_CGROUP;
    }
    if let How::Unrecovered(_) = how {
        witness.why_no_record = "the takeover failed";
    }
    ev.phases = phases(&ledger, &ended);
    let (mut j, silent) = judgement::judgement(&ended, &account, witness, delivered, ev);
    // Sealed once the init's claims are in the evidence too (the record adds `oom_guard` to
    // the enforcement): the applied limits' digest is of the evidence the Outcome carries.
    j.evidence.action = super::action::sealed(ledger.action.clone(), &j.evidence, req.action_key.as_ref());
    // Only an end the engine's going away explains makes the question worth a call.
    let explained = j.facts.record != Record::Present || !matches!(j.facts.exit, Exit::Code(_)) || j.facts.outputs_lost;
    if explained
        && !j.facts.deadline_fired
        && !j.facts.cancelled
        && let Some(lost) = site.engine_lost(&ledger.own).await
    {
        j.facts.engine_lost = true;
        j.evidence.notes.push(lost.clone());
        j.error_text = if j.error_text.is_empty() { lost } else { format!("{lost}; {}", j.error_text) };
    }
    if let How::Unrecovered(why) = &how {
        j.error_text = format!("the takeover failed: {why}");
        j.usage.wall_time_ms = None;
        j.usage.sources.wall_time_ms = Some(Source::unavailable("the takeover failed"));
    }
    let silent = (silent && matches!(how, How::Fresh { .. })).then(|| silent_detail(&ended, &j.facts.exit));
    let outcome = judge(req, j);
    tracing::info!(status = %outcome.status, reason = ?outcome.reason, "attempt finished");
    (outcome, silent)
}

/// Hands the Outcome to the engine's outcome hook, when the request has hooks.
pub(crate) async fn deliver(req: &Request, mut outcome: Outcome) -> Outcome {
    if let Some(hooks) = &req.hooks {
        hooks.deliver_outcome(&mut outcome).await;
    }
    outcome
}

/// The evidence every rung gives: who ran the attempt, when, what it decided and enforced,
/// how it was recovered, what its removal left.
fn evidence<S: Site>(site: &S, req: &Request, ledger: &Ledger<S::Own>, removed: &Removed, how: &How) -> Evidence {
    let rung = site.rung();
    let mut ev = Evidence {
        executor: rung.name.to_owned(),
        level: Some(rung.level),
        worker: req.worker_id.clone(),
        incarnation: rung.base.incarnation.to_owned(),
        started_at_unix_ms: Some(ledger.started_ms),
        finished_at_unix_ms: Some(crate::contract::unix_ms_now()),
        enforcement: ledger.enforcement.clone(),
        skipped: ledger.skipped.clone(),
        limits_narrowed: ledger.narrowed.clone(),
        env_overrides: ledger.env_overrides.clone(),
        ports: ledger.ports.clone(),
        inputs: ledger.inputs.clone(),
        recovered: match how {
            How::Fresh { .. } => None,
            How::Recovered(r) => Some(r.clone()),
            How::Unrecovered(why) => {
                Some(format!("the takeover failed: {why}; the attempt was stopped and what it made removed"))
            }
        },
        ..Evidence::default()
    };
    ev.notes.extend(rung.base.captures.note());
    ev.notes.extend(removed.errors.iter().map(|e| format!("cleanup: {e}")));
    ev
}

/// Every phase's offset from the attempt's start, the rung's and the link's.
fn phases<O>(ledger: &Ledger<O>, ended: &Ended) -> crate::contract::Phases {
    let at = |unix: Option<u64>| unix.map(|t| t.saturating_sub(ledger.started_ms));
    crate::contract::Phases {
        command_started_ms: at(ended.command_started_at),
        command_ended_ms: at(ended.record_at),
        outputs_collected_ms: at(ended.outputs_at),
        concluded_ms: super::site::since(ledger.started_ms),
        ..ledger.phases.clone()
    }
}

/// What was seen of a handler runner that never spoke: its exit, and the end of its stderr.
fn silent_detail(ended: &Ended, exit: &Exit) -> String {
    let exit = match exit {
        Exit::Code(c) => format!("it exited with code {c}"),
        Exit::Signal(s) => format!("it was killed by signal {s}"),
        Exit::Unknown => "it never said hello".to_owned(),
    };
    let tail = ended.received.stderr.path.as_deref().map(tail_of).unwrap_or_default();
    if tail.is_empty() { exit } else { format!("{exit}; its stderr ends with: {tail}") }
}

/// The last line or so of a capture file.
fn tail_of(path: &str) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(512)));
    let mut buf = Vec::new();
    let _ = f.take(512).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).trim().to_owned()
}
