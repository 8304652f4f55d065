//! From what the link delivered (the verified record, the outputs, the reports, what the
//! host saw) to the judge's inputs, for every rung that runs the init. The rung adds its own
//! evidence first, and says what it knows when there is no record (`Witness`).

use super::claims::{self, Bounds};
use super::reports::{self, Delivered};
use super::supervise::Ended;
use crate::contract::{Evidence, Exit, Judgement, OutputsLost, Record, RefusedEntry, Source};
use stevedore_init::wire::{InitRecord, StoppedBy};

/// What the rung itself knows of the end, for when the init's last frame did not arrive
/// (no verified record, or outputs that did not all come).
#[derive(Debug, Default)]
pub(crate) struct Witness {
    /// How the sandbox ended, as the rung saw it.
    pub exit: Exit,
    /// The rung's own OOM flag (the engine's `State.OOMKilled`, the kubelet's `OOMKilled`
    /// of a SIGKILLed init, the host's read of the cgroup), if it has one.
    pub oom_killed: Option<bool>,
    /// Who says `oom_killed`.
    pub oom_by: OomWitness,
    /// Someone else removed the sandbox.
    pub removed_externally: bool,
    /// Why there is no record, for the usage sources.
    pub why_no_record: &'static str,
    /// What `/out` held when the outputs did not all arrive, listed by the host (`None`: it
    /// cannot list it, as `/out` went with the init).
    pub listed: Option<Vec<String>>,
    /// The host's read of the sandbox's cgroup once everything in it ended, where no record
    /// came (a cgroup the rung holds outlives the sandbox: `oci/held.rs`).
    pub counters: Option<stevedore_init::wire::CgroupCounters>,
}

/// Who has the kernel's word on an OOM kill when the init could not say it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OomWitness {
    /// The engine's `State.OOMKilled` (its runtime's OOM event for the container's cgroup).
    #[default]
    Engine,
    /// The kubelet's `OOMKilled` for the attempt's container.
    #[cfg(feature = "kube")]
    Kubelet,
    /// The host's own read of the attempt's cgroup after everything in it ended.
    Cgroup,
}

impl OomWitness {
    fn source(self) -> Source {
        match self {
            OomWitness::Engine => Source::Engine,
            #[cfg(feature = "kube")]
            OomWitness::Kubelet => Source::Kubelet,
            OomWitness::Cgroup => Source::Cgroup,
        }
    }

    fn words(self) -> &'static str {
        match self {
            OomWitness::Engine => "the engine's State.OOMKilled",
            #[cfg(feature = "kube")]
            OomWitness::Kubelet => "the kubelet's OOMKilled",
            OomWitness::Cgroup => "the host's read of the attempt's cgroup",
        }
    }
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
    // The engine's or the kubelet's flag, as evidence; the host's own read is the cgroup's.
    ev.engine_oom_killed = witness.oom_killed.filter(|_| witness.oom_by != OomWitness::Cgroup);
    let mut j = Judgement::default();
    let mut handler_silent = false;
    match &ended.record {
        Some(Ok(rec)) => {
            handler_silent = from_record(rec, ended, account, witness.oom_by, &mut j, &mut ev);
            // Stopped by a signal the host never asked for, while someone else removed the
            // sandbox (a Pod's deletion TERMs its init first): the removal is the why.
            if witness.removed_externally && matches!(rec.stopped_by, Some(StoppedBy::Term | StoppedBy::Kill)) {
                j.facts.removed_externally = true;
            }
        }
        other => without_record(other.as_ref().map(|r| r.as_ref().map(|_| ())), ended, &witness, &mut j, &mut ev),
    }
    let init_reports = ended.record.as_ref().and_then(|r| r.as_ref().ok()).map(|r| &r.reports);
    ev.reports = reports::seen(init_reports, &ended.received.reports, delivered, &mut ev.hook_failures);
    outputs(ended, &mut j, &mut ev);
    if j.facts.outputs_lost {
        lost(ended, &witness, &mut j, &mut ev);
    }
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
fn from_record(
    rec: &InitRecord,
    ended: &Ended,
    account: &Account,
    by: OomWitness,
    j: &mut Judgement,
    ev: &mut Evidence,
) -> bool {
    limits_read_back(rec, &account.bounds, ev);
    let c = claims::apply(rec, account.bounds, account.expects_handler, ended.deadline_fired, ended.cancelled, ev);
    j.facts = c.facts;
    j.usage = c.usage;
    j.error_text = c.error_text;
    j.permanent = c.permanent;
    if j.facts.oom_kills == 0 && ev.oom_kills.is_none() && ev.engine_oom_killed == Some(true) {
        claims::oom_from_witness(ev, &mut j.facts, &mut j.usage, by.source(), "no cgroup count");
    }
    if let (Some(fs), Some(disk)) = (&rec.out_fs, account.disk_limit)
        && fs.free_bytes < (1 << 20).max(fs.total_bytes / 100)
        && fs.total_bytes.saturating_sub(fs.free_bytes) + (2 << 20) >= disk
    {
        j.facts.disk_full = true;
    }
    account.expects_handler && c.handler_silent
}

/// The cgroup limits the init read in its own cgroup, against the ones the rung applied: a
/// limit the kernel does not hold is not enforced, whatever the engine took (a rootless
/// engine without a delegated cgroup takes it and ignores it). Only where the init found and
/// read a cgroup: a sandbox that shows none (gVisor) says nothing here. Memory and CPU are
/// compared with what was applied; pids (whose applied figure the bounds do not carry) only
/// for a cgroup that holds no limit at all.
fn limits_read_back(rec: &InitRecord, b: &Bounds, ev: &mut Evidence) {
    use stevedore_init::cgroup::{KEY_CPU_LIMIT, KEY_MEMORY_LIMIT, KEY_PIDS_LIMIT};
    let c = &rec.cgroup;
    if c.version.is_none() {
        return;
    }
    let applied_memory = b.memory.saturating_add(b.reserve);
    for (name, read, key, applied, unit) in [
        ("memory", c.memory_limit_bytes, KEY_MEMORY_LIMIT, Some(applied_memory), " bytes"),
        ("pids", c.pids_limit, KEY_PIDS_LIMIT, None, " processes"),
        ("cpu", c.cpu_limit_millis, KEY_CPU_LIMIT, b.cpu_limit_millis, " thousandths of a CPU"),
    ] {
        let no_limit = c.missing.get(key).is_some_and(|w| w.ends_with("says no limit"));
        let held = match read {
            // The kernel rounds a memory limit down to a page, a CPU quota to its unit.
            Some(n) if applied.is_none_or(|a| n <= a) => {
                // Applied and held, though the rung did not claim it (Podman 4.3 says no CFS
                // quota on cgroup v2, and applies one): the kernel's word is the evidence.
                if let (Some(a), false) = (applied, ev.enforcement.contains_key(name))
                    && let Some(why) = ev.skipped.remove(name)
                {
                    let said =
                        format!("read back: the sandbox's cgroup holds a limit of {n}{unit} for the {a} applied");
                    ev.enforcement.insert(name.into(), format!("{said} (the rung had said: {why})"));
                }
                continue;
            }
            Some(n) => format!("a limit of {n}{unit}"),
            None if no_limit => "no limit".to_owned(),
            None => continue,
        };
        if ev.enforcement.remove(name).is_none() {
            continue;
        }
        let against = applied.map_or_else(String::new, |a| format!(", not the {a}{unit} applied"));
        ev.skipped.insert(name.into(), format!("read back: the sandbox's cgroup holds {held}{against}"));
    }
}

/// The facts from what the rung saw when no record came (`None`) or one was refused
/// (`Some(Err(why))`).
fn without_record(
    record: Option<Result<(), &String>>,
    ended: &Ended,
    witness: &Witness,
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
        claims::oom_from_witness(ev, &mut j.facts, &mut j.usage, witness.oom_by.source(), "the init left no record");
    }
    j.usage.wall_time_ms = Some(ended.host_wall.as_millis() as u64);
    j.usage.sources.wall_time_ms = Some(Source::HostClock);
    j.usage.sources.cpu_time_ms = Some(Source::unavailable(witness.why_no_record));
    j.usage.sources.peak_memory_bytes = Some(Source::unavailable(witness.why_no_record));
    if let Some(c) = &witness.counters {
        from_host_read(c, witness, j, ev);
    }
}

/// The host's final read of the sandbox's cgroup, for an end without a record: the figures
/// the kernel kept, each by its own source; an OOM it counted is the kernel's word on an end
/// by SIGKILL (or one nobody saw), not on an end by anything else.
fn from_host_read(c: &stevedore_init::wire::CgroupCounters, witness: &Witness, j: &mut Judgement, ev: &mut Evidence) {
    let why_no_record = witness.why_no_record;
    if let Some(ns) = c.cpu_usage_ns {
        j.usage.cpu_time_ms = Some(ns / 1_000_000);
        j.usage.sources.cpu_time_ms = Some(Source::Cgroup);
    }
    if let Some(b) = c.memory_peak_bytes {
        j.usage.peak_memory_bytes = Some(b);
        j.usage.sources.peak_memory_bytes = Some(Source::Cgroup);
    }
    let killed = matches!(witness.exit, Exit::Signal(9) | Exit::Unknown);
    if let Some(n) = c.oom_kills.filter(|n| *n > 0 && killed) {
        ev.oom_kills = Some(n);
        j.facts.oom_kills = n;
        j.usage.sources.oom_kills = Some(Source::Cgroup);
        ev.notes.push(format!(
            "oom_kills from {}: {why_no_record}, and the kernel counted {n} OOM kill(s) in it",
            OomWitness::Cgroup.words()
        ));
    }
}

/// The outputs did not all arrive: why, as the rung's witness says (the kernel's OOM killer,
/// by the witness that has its word, is an OOM kill of its own), and what is known of the rest.
fn lost(ended: &Ended, witness: &Witness, j: &mut Judgement, ev: &mut Evidence) {
    let verified = ended.record.as_ref().is_some_and(Result::is_ok);
    // The init SIGKILLed (or, read by the host, one more kill in the cgroup than the record
    // counted) while the witness says OOM, and not by stevedore's own hard stop.
    let sigkilled = witness.exit == Exit::Signal(9) || witness.oom_by == OomWitness::Cgroup;
    let by_oom = verified && witness.oom_killed == Some(true) && sigkilled && !ended.hard_killed;
    let why = if by_oom {
        j.facts.delivery_oom = true;
        let counted = ev.oom_kills.unwrap_or(0);
        // The host's own read already counts the init's kill; the others' word is one more.
        if witness.oom_by != OomWitness::Cgroup {
            ev.oom_kills = Some(counted + 1);
        }
        j.usage.sources.oom_kills = Some(witness.oom_by.source());
        ev.notes.push(format!(
            "the init was OOM-killed while it sent the outputs ({}); the init's cgroup read had counted {counted} \
             kill(s) before it",
            witness.oom_by.words()
        ));
        "the kernel's OOM killer killed the init while it sent them".to_owned()
    } else if !verified {
        "the init left no verified record, and sends the outputs only after it".to_owned()
    } else {
        match witness.exit {
            Exit::Signal(s) => format!("the init was killed by signal {s} while it sent them"),
            _ => "the link ended while the init sent them".to_owned(),
        }
    };
    ev.outputs_lost = Some(OutputsLost { why, unknown: witness.listed.is_none() });
    for name in witness.listed.iter().flatten() {
        if !j.outputs.iter().any(|o| &o.name == name) && !ev.refused_outputs.iter().any(|r| &r.name == name) {
            ev.refused_outputs.push(RefusedEntry { name: name.clone(), why: "not_delivered".into() });
        }
    }
    ev.refused_outputs.sort_by(|a, b| a.name.cmp(&b.name));
}

/// The outputs as extracted (hashed once, on the way in), and what the init saw of the
/// output dir. Without the outputs' end (the init's last frame), they did not all arrive:
/// `outputs_lost`, unless the host itself stopped reading them (their deadline).
fn outputs(ended: &Ended, j: &mut Judgement, ev: &mut Evidence) {
    let usage = &mut j.usage;
    let ran = ended.command_started_at.is_some() || ended.record.is_some();
    let ended_whole = ended.received.outputs.as_ref().is_some_and(|o| o.end.is_some());
    j.facts.outputs_lost = ran && !ended_whole && !ended.collection_timed_out;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Request;
    use crate::contract::{Reason, Status, judge};
    use crate::link::session::OutputsReceived;
    use crate::outputs::ExtractReport;
    use stevedore_init::cgroup::KEY_MEMORY_LIMIT;
    use stevedore_init::wire::{CgroupCounters, ChildrenRusage, OutputEnd, ReportCounts, WaitStatus};

    fn record() -> InitRecord {
        InitRecord {
            wait: WaitStatus::Code(0),
            stopped_by: None,
            stragglers_killed: 0,
            wall_time_ms: 100,
            cgroup: CgroupCounters { oom_kills: Some(1), ..CgroupCounters::default() },
            rusage: ChildrenRusage::default(),
            out_fs: None,
            oom_guard: None,
            handler: None,
            stdout_bytes: 0,
            stderr_bytes: 0,
            host_lost: false,
            takeovers: 0,
            reports: ReportCounts::default(),
            measured: Vec::new(),
            timeline: None,
            reserve_bytes: 0,
            credentials: None,
            kernel: None,
            program: None,
            program_name: None,
            read_ahead: None,
        }
    }

    fn account() -> Account {
        Account {
            expects_handler: false,
            bounds: Bounds {
                host_wall: std::time::Duration::from_secs(1),
                cpus: 1.0,
                memory: 64 << 20,
                cpu_limit_millis: None,
                reserve: 0,
                cgroup_note: "the test's cgroup",
            },
            disk_limit: None,
            hard_stop: "stopped",
            no_peak_memory: None,
        }
    }

    /// A record, and outputs that stopped before their end (`end`: they ended).
    fn ended(end: bool) -> Ended {
        let mut e = Ended { record: Some(Ok(Box::new(record()))), ..Ended::default() };
        e.received.outputs = Some(OutputsReceived {
            report: ExtractReport::default(),
            end: end.then(OutputEnd::default),
            error: (!end).then(|| "the link ended inside the outputs tar".into()),
        });
        e
    }

    /// The status, the reason, the evidence and the usage the judge gives.
    fn judged(e: &Ended, w: Witness) -> (Status, Option<Reason>, Evidence, crate::contract::Usage) {
        let (j, _) = judgement(e, &account(), w, None, Evidence::default());
        let o = judge(&Request::command("j", ["true"], "/nonexistent"), j);
        (o.status, o.reason, o.evidence, o.usage)
    }

    #[test]
    fn outputs_whose_end_arrived_are_the_verdict_a_child_oom_kill_stays_ok() {
        let (status, reason, ev, _) = judged(&ended(true), Witness::default());
        assert_eq!((status, reason, ev.outputs_lost, ev.oom_kills), (Status::Ok, None, None, Some(1)));
    }

    #[test]
    fn an_init_the_oom_killer_took_mid_delivery_is_oom_killed_by_the_witness_that_says_so() {
        let witnesses = [
            (OomWitness::Engine, "engine"),
            #[cfg(feature = "kube")]
            (OomWitness::Kubelet, "kubelet"),
        ];
        for (by, word) in witnesses {
            let w = Witness { exit: Exit::Signal(9), oom_killed: Some(true), oom_by: by, ..Witness::default() };
            let (status, reason, ev, usage) = judged(&ended(false), w);
            assert_eq!((status, reason), (Status::OomKilled, Some(Reason::OutputsLost)));
            let lost = ev.outputs_lost.expect("said");
            assert!(lost.unknown && lost.why.contains("OOM"), "{lost:?}");
            // The record's count, and the init's own kill the witness saw.
            assert_eq!(ev.oom_kills, Some(2));
            assert_eq!(usage.sources.oom_kills.map(|s| s.to_string()).as_deref(), Some(word));
        }
        // The host's own read of the cgroup already counts the init's kill.
        let w = Witness { oom_killed: Some(true), oom_by: OomWitness::Cgroup, ..Witness::default() };
        let (status, _, ev, _) = judged(&ended(false), w);
        assert_eq!((status, ev.oom_kills), (Status::OomKilled, Some(1)));
    }

    #[test]
    fn outputs_lost_otherwise_are_killed_and_what_the_host_listed_is_named() {
        // SIGKILLed without the kernel's word on an OOM: not an OOM, and never ok.
        let w = Witness { exit: Exit::Signal(9), oom_killed: Some(false), ..Witness::default() };
        let (status, reason, ev, _) = judged(&ended(false), w);
        assert_eq!((status, reason), (Status::Killed, Some(Reason::OutputsLost)));
        assert!(ev.outputs_lost.unwrap().why.contains("signal 9"));
        // Stevedore's own hard stop is not the kernel's.
        let mut e = ended(false);
        e.hard_killed = true;
        let w = Witness { exit: Exit::Signal(9), oom_killed: Some(true), ..Witness::default() };
        assert_eq!(judged(&e, w).0, Status::Killed);
        // A host that still reaches /out names each file that did not arrive.
        let w = Witness { listed: Some(vec!["a.txt".into(), "d/b.txt".into()]), ..Witness::default() };
        let (_, _, ev, _) = judged(&ended(false), w);
        assert!(!ev.outputs_lost.unwrap().unknown);
        let named: Vec<(&str, &str)> = ev.refused_outputs.iter().map(|r| (r.name.as_str(), r.why.as_str())).collect();
        assert_eq!(named, [("a.txt", "not_delivered"), ("d/b.txt", "not_delivered")]);
    }

    /// No record, a sandbox SIGKILLed, and the host's final read of a cgroup it holds: the
    /// kernel's OOM count makes it `oom_killed`, and its peak and CPU are the usage; without
    /// a count it stays a kill, the figures still there.
    #[test]
    fn without_a_record_the_host_s_final_cgroup_read_is_the_word() {
        let counters = |oom| CgroupCounters {
            version: Some(1),
            memory_peak_bytes: Some(64 << 20),
            cpu_usage_ns: Some(3_000_000_000),
            oom_kills: Some(oom),
            ..CgroupCounters::default()
        };
        let none = Ended::default();
        let w = Witness { exit: Exit::Signal(9), counters: Some(counters(1)), ..Witness::default() };
        let (status, reason, ev, usage) = judged(&none, w);
        assert_eq!((status, reason, ev.oom_kills), (Status::OomKilled, Some(Reason::Oom), Some(1)));
        assert_eq!((usage.peak_memory_bytes, usage.cpu_time_ms), (Some(64 << 20), Some(3000)));
        assert_eq!(usage.sources.oom_kills, Some(Source::Cgroup));
        assert_eq!(usage.sources.peak_memory_bytes, Some(Source::Cgroup));
        assert!(ev.notes.iter().any(|n| n.contains("counted 1 OOM kill")), "{:?}", ev.notes);
        let w = Witness { exit: Exit::Signal(9), counters: Some(counters(0)), ..Witness::default() };
        let (status, reason, _, usage) = judged(&none, w);
        assert_eq!((status, reason), (Status::Killed, Some(Reason::Signalled)));
        assert_eq!(usage.peak_memory_bytes, Some(64 << 20));
        // An OOM counted, but the sandbox ended by something other than a SIGKILL: not its end.
        let w = Witness { exit: Exit::Signal(15), counters: Some(counters(1)), ..Witness::default() };
        assert_eq!(judged(&none, w).0, Status::Killed);
    }

    /// The limit the init read back: held (at or below what was applied) stays enforced; a
    /// larger one (no limit at all) moves to `skipped`, saying both figures; a sandbox that
    /// showed no cgroup says nothing.
    #[test]
    fn a_memory_limit_the_kernel_does_not_hold_is_not_enforced() {
        let b = account().bounds;
        let applied = b.memory + b.reserve;
        let judged_with = |version: Option<u8>, limit: Option<u64>| {
            let mut rec = record();
            rec.cgroup.version = version;
            rec.cgroup.memory_limit_bytes = limit;
            let mut ev = Evidence::default();
            ev.enforcement.insert("memory".into(), "asked".into());
            limits_read_back(&rec, &b, &mut ev);
            ev
        };
        let ev = judged_with(Some(1), Some(applied - 4096));
        assert!(ev.enforcement.contains_key("memory") && !ev.skipped.contains_key("memory"));
        let ev = judged_with(Some(1), Some(applied + (64 << 20)));
        assert!(!ev.enforcement.contains_key("memory"));
        let why = &ev.skipped["memory"];
        assert!(why.contains(&(applied + (64 << 20)).to_string()) && why.contains(&applied.to_string()), "{why}");
        // What the init's parser gives for v1's huge value and v2's `max`: no figure, and why.
        let mut rec = record();
        (rec.cgroup.version, rec.cgroup.memory_limit_bytes) = (Some(1), None);
        let said = stevedore_init::cgroup::parse_v1_limit("9223372036854771712\n").unwrap();
        assert_eq!(said, None);
        rec.cgroup.missing.insert(KEY_MEMORY_LIMIT.into(), "memory/memory.limit_in_bytes says no limit".into());
        let mut ev = Evidence::default();
        ev.enforcement.insert("memory".into(), "asked".into());
        limits_read_back(&rec, &b, &mut ev);
        assert!(ev.skipped["memory"].contains("holds no limit"), "{:?}", ev.skipped);
        let ev = judged_with(None, Some(applied + (64 << 20)));
        assert!(ev.enforcement.contains_key("memory"), "no cgroup read: nothing said");
    }

    /// Pids and CPU read back too: a cgroup that holds no process limit, or a CPU quota above
    /// the one applied, moves the claim to `skipped`; one that holds them keeps it.
    #[test]
    fn pids_and_cpu_limits_the_kernel_does_not_hold_are_not_enforced() {
        use stevedore_init::cgroup::KEY_PIDS_LIMIT;
        let mut b = account().bounds;
        b.cpu_limit_millis = Some(500);
        let judged_with = |pids: Option<u64>, cpu: Option<u64>| {
            let mut rec = record();
            rec.cgroup.version = Some(2);
            (rec.cgroup.pids_limit, rec.cgroup.cpu_limit_millis) = (pids, cpu);
            if pids.is_none() {
                rec.cgroup.missing.insert(KEY_PIDS_LIMIT.into(), "pids.max says no limit".into());
            }
            let mut ev = Evidence::default();
            ev.enforcement.insert("pids".into(), "asked".into());
            ev.enforcement.insert("cpu".into(), "asked".into());
            limits_read_back(&rec, &b, &mut ev);
            ev
        };
        let ev = judged_with(Some(64), Some(500));
        assert!(ev.enforcement.contains_key("pids") && ev.enforcement.contains_key("cpu"), "{ev:?}");
        let ev = judged_with(None, Some(2000));
        assert_eq!(ev.skipped["pids"], "read back: the sandbox's cgroup holds no limit");
        assert!(ev.skipped["cpu"].contains("2000") && ev.skipped["cpu"].contains("500"), "{:?}", ev.skipped);
        assert!(ev.enforcement.is_empty(), "{ev:?}");
        // Held where the rung had not claimed it (the engine's info said it applies none).
        let mut rec = record();
        (rec.cgroup.version, rec.cgroup.cpu_limit_millis) = (Some(2), Some(500));
        let mut ev = Evidence::default();
        ev.skipped.insert("cpu".into(), "the engine does not apply it".into());
        limits_read_back(&rec, &b, &mut ev);
        assert!(!ev.skipped.contains_key("cpu"), "{ev:?}");
        assert!(ev.enforcement["cpu"].starts_with("read back: the sandbox's cgroup holds a limit of 500"), "{ev:?}");
    }

    #[test]
    fn outputs_stopped_by_their_deadline_are_a_limit_not_a_loss() {
        let mut e = ended(false);
        e.collection_timed_out = true;
        let (status, reason, ev, _) = judged(&e, Witness::default());
        assert_eq!((status, reason, ev.outputs_lost), (Status::Ok, Some(Reason::OutputLimit), None));
    }
}
