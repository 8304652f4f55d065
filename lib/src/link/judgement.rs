//! From what the link delivered (the verified record, the outputs, the reports, what the
//! host saw) to the judge's inputs, for every rung that runs the init. The rung adds its own
//! evidence first, and says what it knows when there is no record (`Witness`).

use super::claims::{self, Bounds};
use super::reports::{self, Delivered};
use super::supervise::Ended;
use crate::contract::{Evidence, Exit, Judgement, Record, RefusedEntry, Source};
use stevedore_init::wire::{InitRecord, StoppedBy};

/// What the rung itself knows of the end, for when the init left no verified record.
#[derive(Debug, Default)]
pub(crate) struct Witness {
    /// How the sandbox ended, as the rung saw it.
    pub exit: Exit,
    /// The rung's own OOM flag (the engine's), if it has one.
    pub oom_killed: Option<bool>,
    /// Someone else removed the sandbox.
    pub removed_externally: bool,
    /// Why there is no record, for the usage sources.
    pub why_no_record: &'static str,
}

/// What the rung says about the attempt, beyond the record.
#[derive(Debug)]
pub(crate) struct Account {
    pub expects_handler: bool,
    pub bounds: Bounds,
    /// The disk limit, when a filesystem of that size holds `/out`.
    pub disk_limit: Option<u64>,
    /// What "stopped everything" meant, for the note (e.g. "the container was SIGKILLed").
    pub hard_stop: &'static str,
    /// Why the rung cannot know the peak memory even with a record (no cgroup of its own).
    pub no_peak_memory: Option<&'static str>,
}

/// The judge's inputs, and whether a handler runner never spoke the protocol.
pub(crate) fn judgement(
    ended: &Ended,
    account: &Account,
    witness: Witness,
    delivered: Option<Delivered>,
    mut ev: Evidence,
) -> (Judgement, bool) {
    link_evidence(ended, account, &mut ev);
    ev.engine_oom_killed = witness.oom_killed;
    let mut j = Judgement::default();
    let mut handler_silent = false;
    match &ended.record {
        Some(Ok(rec)) => {
            handler_silent = from_record(rec, ended, account, &mut j, &mut ev);
            // Stopped by a signal the host never asked for, while someone else removed the
            // sandbox (a Pod's deletion TERMs its init first): the removal is the why.
            if witness.removed_externally && matches!(rec.stopped_by, Some(StoppedBy::Term | StoppedBy::Kill)) {
                j.facts.removed_externally = true;
            }
        }
        other => without_record(other.as_ref().map(|r| r.as_ref().map(|_| ())), ended, witness, &mut j, &mut ev),
    }
    let init_reports = ended.record.as_ref().and_then(|r| r.as_ref().ok()).map(|r| &r.reports);
    ev.reports = reports::seen(init_reports, &ended.received.reports, delivered, &mut ev.hook_failures);
    outputs(ended, &mut j, &mut ev);
    if let Some(why) = account.no_peak_memory {
        j.usage.sources.peak_memory_bytes = Some(Source::unavailable(why));
    }
    j.evidence = ev;
    (j, handler_silent)
}

/// What the host saw of the link and the attempt's end, into the evidence.
fn link_evidence(ended: &Ended, account: &Account, ev: &mut Evidence) {
    let got = &ended.received;
    ev.logs.stdout = got.stdout.clone();
    ev.logs.stderr = got.stderr.clone();
    ev.live_dropped_bytes = got.live_dropped;
    ev.init_diagnostics = got.diag.clone();
    if !got.init_stderr.is_empty() {
        ev.init_diagnostics.push(format!("init stderr: {}", got.init_stderr));
    }
    if let Some(e) = &got.link_error {
        ev.notes.push(e.clone());
    }
    if got.resumed > 0 {
        ev.link_resumed = Some(crate::contract::LinkResumed {
            times: got.resumed,
            frames_lost: got.frames_lost,
            frames_again: got.frames_again,
        });
        if got.frames_lost > 0 {
            ev.notes.push(format!(
                "{} frames the init sent before a cut were lost: the captured streams miss part of the command's output",
                got.frames_lost
            ));
        }
    }
    if let Some(why) = &ended.resume_failed {
        ev.notes.push(why.clone());
    }
    if ended.hard_killed {
        ev.notes.push(format!("the init did not finish within the grace; {}", account.hard_stop));
    }
    if ended.collection_timed_out {
        ev.notes.push(
            "collecting the outputs took longer than its deadline and was stopped; what came whole is kept".into(),
        );
    }
    if let Some((deadline, elapsed)) = ended.collection {
        let init_cut = got.outputs.as_ref().and_then(|o| o.end.as_ref()).is_some_and(|e| e.deadline_hit);
        ev.collection = Some(crate::contract::CollectionSeen {
            deadline_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
            elapsed_ms: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
            cut: init_cut || ended.collection_timed_out,
        });
    }
    if ended.cancelled_by_hook {
        ev.notes.push("the engine's cancellation hook asked for the stop".into());
    }
    ev.hook_failures.extend(ended.poll_failures.iter().cloned());
    if got.live_dropped > 0 {
        ev.notes.push(format!("{} bytes of live output did not fit the caller's channel", got.live_dropped));
    }
}

/// The facts and usage from a verified record; whether a handler runner never spoke the
/// protocol.
fn from_record(rec: &InitRecord, ended: &Ended, account: &Account, j: &mut Judgement, ev: &mut Evidence) -> bool {
    let c = claims::apply(rec, account.bounds, account.expects_handler, ended.deadline_fired, ended.cancelled, ev);
    j.facts = c.facts;
    j.usage = c.usage;
    j.error_text = c.error_text;
    j.permanent = c.permanent;
    if j.facts.oom_kills == 0 && ev.oom_kills.is_none() && ev.engine_oom_killed == Some(true) {
        claims::oom_from_engine(ev, &mut j.facts, &mut j.usage, "no cgroup count");
    }
    if let (Some(fs), Some(disk)) = (&rec.out_fs, account.disk_limit)
        && fs.free_bytes < (1 << 20).max(fs.total_bytes / 100)
        && fs.total_bytes.saturating_sub(fs.free_bytes) + (2 << 20) >= disk
    {
        j.facts.disk_full = true;
    }
    account.expects_handler && c.handler_silent
}

/// The facts from what the rung saw when no record came (`None`) or one was refused
/// (`Some(Err(why))`).
fn without_record(
    record: Option<Result<(), &String>>,
    ended: &Ended,
    witness: Witness,
    j: &mut Judgement,
    ev: &mut Evidence,
) {
    if let Some(Err(why)) = record {
        ev.refused_claims.push(format!("init record: {why}"));
    }
    j.facts.record = if record.is_some() { Record::Invalid } else { Record::Missing };
    j.facts.deadline_fired = ended.deadline_fired;
    j.facts.cancelled = ended.cancelled;
    j.facts.removed_externally = witness.removed_externally;
    j.facts.exit = witness.exit;
    if ev.engine_oom_killed == Some(true) {
        claims::oom_from_engine(ev, &mut j.facts, &mut j.usage, "the init left no record");
    }
    j.usage.wall_time_ms = Some(ended.host_wall.as_millis() as u64);
    j.usage.sources.wall_time_ms = Some(Source::HostClock);
    j.usage.sources.cpu_time_ms = Some(Source::unavailable(witness.why_no_record));
    j.usage.sources.peak_memory_bytes = Some(Source::unavailable(witness.why_no_record));
}

/// The outputs as extracted (hashed once, on the way in), and what the init saw of the
/// output dir.
fn outputs(ended: &Ended, j: &mut Judgement, ev: &mut Evidence) {
    let usage = &mut j.usage;
    let Some(out) = &ended.received.outputs else {
        let why = if ended.record.as_ref().is_some_and(Result::is_ok) {
            "the outputs did not arrive"
        } else {
            "no record from the init"
        };
        usage.sources.disk_written_bytes = Some(Source::unavailable(why));
        return;
    };
    ev.refused_outputs.extend(out.report.refused.iter().cloned());
    if let Some(e) = &out.error {
        ev.notes.push(format!("outputs: {e}"));
    }
    j.outputs = out.report.files.clone();
    let mut limit = out.report.limit_hit || ended.collection_timed_out;
    match &out.end {
        Some(end) => {
            limit |= end.over_cap || end.seen.truncated || end.deadline_hit;
            for r in &end.refused {
                if !ev.refused_outputs.iter().any(|e| e.name == r.name) {
                    ev.refused_outputs.push(RefusedEntry { name: r.name.clone(), why: r.why.clone() });
                }
            }
            if let Some(e) = &end.error {
                ev.notes.push(format!("outputs (init): {e}"));
            }
            usage.disk_written_bytes = Some(end.seen.written_bytes);
            usage.sources.disk_written_bytes = Some(Source::Init);
        }
        None => {
            usage.disk_written_bytes = Some(out.report.bytes);
            usage.sources.disk_written_bytes = Some(Source::Extracted);
        }
    }
    j.facts.output_limit = limit;
    ev.refused_outputs.sort_by(|a, b| a.name.cmp(&b.name));
}
