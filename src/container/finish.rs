//! Phase 4 of an attempt: from what the host saw, the init's record and the outputs, to the
//! judge's inputs. Without a verified record only the host's own facts count (the engine's
//! exit state and OOM flag, the deadline and cancellation as the host saw them).

use super::cleanup::Removed;
use super::executor::Shared;
use super::ledger::Ledger;
use super::supervise::Ended;
use crate::contract::{Evidence, Exit, Judgement, Record, Request, Source, Usage};
use crate::engine::ContainerState;
use crate::link::claims::{self, Bounds};
use crate::link::reports::{self, Delivered};

/// The judge's inputs, and whether the handler runner never spoke the protocol.
pub(crate) struct Assessed {
    pub judgement: Judgement,
    pub handler_silent: bool,
}

pub(crate) fn assess(
    shared: &Shared,
    req: &Request,
    ledger: &Ledger,
    ended: Ended,
    state: Option<ContainerState>,
    removed: Removed,
    delivered: Option<Delivered>,
) -> Assessed {
    let cfg = &shared.config;
    let facts_e = shared.engine.facts();
    let got = &ended.received;
    let mut ev = Evidence {
        executor: cfg.name.clone(),
        level: Some(cfg.level()),
        worker: req.worker_id.clone(),
        incarnation: shared.incarnation.clone(),
        started_at_unix_ms: Some(ledger.started_ms),
        finished_at_unix_ms: Some(crate::contract::unix_ms_now()),
        container_id: Some(ledger.container_id.clone()),
        image: Some(ledger.image_ref.clone()),
        image_id: Some(ledger.image_id.clone()),
        engine_version: Some(facts_e.engine_version.clone()),
        api_version: Some(facts_e.api_version.clone()),
        runtime: Some(cfg.runtime.clone().unwrap_or_else(|| facts_e.default_runtime.clone())),
        enforcement: ledger.enforcement.clone(),
        skipped: ledger.skipped.clone(),
        limits_narrowed: ledger.narrowed.clone(),
        env_overrides: ledger.env_overrides.clone(),
        ports: ledger.ports.clone(),
        init: Some(format!("volume {} (init sha256:{})", ledger.tools_volume, ledger.tools_digest)),
        inputs: ledger.inputs.clone(),
        live_dropped_bytes: got.live_dropped,
        ..Evidence::default()
    };
    ev.logs.stdout = got.stdout.clone();
    ev.logs.stderr = got.stderr.clone();
    ev.engine_oom_killed = state.as_ref().and_then(|s| s.oom_killed);
    ev.init_diagnostics = got.diag.clone();
    if !got.init_stderr.is_empty() {
        ev.init_diagnostics.push(format!("init stderr: {}", got.init_stderr));
    }
    if let Some(e) = &got.link_error {
        ev.notes.push(e.clone());
    }
    for err in &removed.errors {
        ev.notes.push(format!("cleanup: {err}"));
    }
    if ended.hard_killed {
        ev.notes.push("the init did not finish within the grace; the container was SIGKILLed".into());
    }
    if ended.collection_timed_out {
        ev.notes.push("collecting the outputs took too long and was stopped".into());
    }
    if ended.cancelled_by_hook {
        ev.notes.push("the engine's cancellation hook asked for the stop".into());
    }
    ev.hook_failures.extend(ended.poll_failures.iter().cloned());
    if got.live_dropped > 0 {
        ev.notes.push(format!("{} bytes of live output did not fit the caller's channel", got.live_dropped));
    }
    let expects_handler = ledger.expects_handler;
    let mut j = Judgement::default();
    let mut handler_silent = false;
    match &ended.record {
        Some(Ok(rec)) => {
            let cpus = ledger.cpu_millis.map(|m| m as f64 / 1000.0).unwrap_or(facts_e.ncpu.max(1) as f64);
            let bounds = Bounds {
                host_wall: ended.host_wall,
                cpus: cpus.min(facts_e.ncpu.max(1) as f64),
                memory: ledger.memory,
            };
            let c = claims::apply(rec, bounds, expects_handler, ended.deadline_fired, ended.cancelled, &mut ev);
            handler_silent = expects_handler && c.handler_silent;
            j.facts = c.facts;
            j.usage = c.usage;
            j.error_text = c.error_text;
            j.permanent = c.permanent;
            if j.facts.oom_kills == 0 && ev.oom_kills.is_none() && ev.engine_oom_killed == Some(true) {
                claims::oom_from_engine(&mut ev, &mut j.facts, &mut j.usage, "no cgroup count");
            }
            if let Some(fs) = &rec.out_fs
                && fs.free_bytes < (1 << 20).max(fs.total_bytes / 100)
                && fs.total_bytes.saturating_sub(fs.free_bytes) + (2 << 20) >= ledger.disk
            {
                j.facts.disk_full = true;
            }
        }
        other => {
            if let Some(Err(why)) = other {
                ev.refused_claims.push(format!("init record: {why}"));
            }
            j.facts.record = if other.is_some() { Record::Invalid } else { Record::Missing };
            j.facts.deadline_fired = ended.deadline_fired;
            j.facts.cancelled = ended.cancelled;
            j.facts.removed_externally = state.is_none()
                || state.as_ref().is_some_and(|s| s.removing)
                || removed.by_others.iter().any(|c| c == &ledger.name);
            // stevedore's init never exits above 128 by itself: such a code is a signal from outside.
            j.facts.exit = match state.as_ref().and_then(|s| s.exit_code) {
                Some(c) if c > 128 => Exit::Signal((c - 128) as i32),
                _ => Exit::Unknown,
            };
            if ev.engine_oom_killed == Some(true) {
                claims::oom_from_engine(&mut ev, &mut j.facts, &mut j.usage, "the init left no record");
            }
            j.usage.wall_time_ms = Some(ended.host_wall.as_millis() as u64);
            j.usage.sources.wall_time_ms = Some(Source::HostClock);
            j.usage.sources.cpu_time_ms = Some(Source::unavailable("no record from the init"));
            j.usage.sources.peak_memory_bytes = Some(Source::unavailable("no record from the init"));
        }
    }
    let init_reports = ended.record.as_ref().and_then(|r| r.as_ref().ok()).map(|r| &r.reports);
    ev.reports = reports::seen(init_reports, &got.reports, delivered, &mut ev.hook_failures);
    outputs(&ended, &mut j, &mut ev);
    j.evidence = ev;
    Assessed { judgement: j, handler_silent }
}

/// The outputs as extracted (hashed once, on the way in), and what the init saw of `/out`.
fn outputs(ended: &Ended, j: &mut Judgement, ev: &mut Evidence) {
    let usage: &mut Usage = &mut j.usage;
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
    let mut limit = out.report.limit_hit;
    match &out.end {
        Some(end) => {
            limit |= end.over_cap || end.seen.truncated;
            for r in &end.refused {
                if !ev.refused_outputs.iter().any(|e| e.name == r.name) {
                    ev.refused_outputs.push(crate::contract::RefusedEntry { name: r.name.clone(), why: r.why.clone() });
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
