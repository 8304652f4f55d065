//! The init's record is a claim: bound-checked here before any figure becomes usage, and
//! turned into the facts the judge decides from. Shared by every rung that runs the init.

use crate::contract::{Evidence, Exit, Facts, LaunchFailure, Source, Usage};
use std::time::Duration;
use stevedore_init::wire::{
    HandlerResult, InitRecord, LaunchFailure as WireLaunch, SpawnFailureKind, StoppedBy, WaitStatus,
};

/// What the host knows that bounds the record's figures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// Wall time from start to the record, by the host's clock.
    pub host_wall: Duration,
    /// CPUs the attempt could use (its quota, or the engine host's CPUs).
    pub cpus: f64,
    /// The memory limit applied.
    pub memory: u64,
    /// The init's delivery reserve the rung added to the cgroup's limit (0: none).
    pub reserve: u64,
    /// The CPU limit applied, thousandths of a CPU (drawn on the timeline).
    pub cpu_limit_millis: Option<u64>,
    /// Who read the cgroup counters, and what they cover, for the evidence.
    pub cgroup_note: &'static str,
}

/// Where usage comes from when the host read the sandbox's cgroup (`attempt::host_cgroup`).
pub(crate) const SANDBOX_CGROUP: &str = "usage read by the host from the sandbox's cgroup at the init's end (the \
                                         sandbox shows its init no cgroup files): cpu and memory high-water mark of \
                                         the whole sandbox, its own kernel (gVisor's Sentry) and file proxy \
                                         included; oom_kill count";
/// The container rung's cgroup note.
#[cfg(feature = "docker")]
pub(crate) const CONTAINER_CGROUP: &str = "usage read by the init from the container's cgroup after the command and \
    its stragglers ended: cpu of the whole container, memory high-water mark (tmpfs /out and /tmp pages \
    included), oom_kill count";

/// What the record says, checked, as the judge's inputs.
#[derive(Debug, Default)]
pub(crate) struct Claimed {
    pub facts: Facts,
    pub usage: Usage,
    pub error_text: String,
    pub permanent: bool,
    /// The handler runner never said hello: it does not speak the protocol.
    pub handler_silent: bool,
}

/// Turns a verified record into facts and usage. `deadline_fired`/`cancelled` are what the
/// host did; they count only if the init then had to stop the command (what happened
/// first wins).
pub(crate) fn apply(
    rec: &InitRecord,
    bounds: Bounds,
    expects_handler: bool,
    deadline_fired: bool,
    cancelled: bool,
    ev: &mut Evidence,
) -> Claimed {
    let mut c = Claimed::default();
    let stopped = rec.stopped_by.is_some_and(|s| matches!(s, StoppedBy::Term | StoppedBy::Kill));
    c.facts.deadline_fired = deadline_fired && stopped;
    c.facts.cancelled = cancelled && stopped && !c.facts.deadline_fired;
    match &rec.wait {
        WaitStatus::Code(code) => c.facts.exit = Exit::Code(*code),
        WaitStatus::Signal(s) => c.facts.exit = Exit::Signal(*s),
        WaitStatus::SpawnFailed(f) => {
            c.facts.launch_failed = Some(match f.kind {
                SpawnFailureKind::NotFound => LaunchFailure::NotFound,
                SpawnFailureKind::NotExecutable => LaunchFailure::NotExecutable,
                SpawnFailureKind::MountRedirected => LaunchFailure::MountRedirected,
                SpawnFailureKind::NotEnforced => LaunchFailure::NotEnforced,
                SpawnFailureKind::Other => LaunchFailure::Other,
            });
            c.error_text = stevedore_init::wire::cap_text(&f.message, stevedore_init::wire::MAX_ERROR_TEXT);
        }
    }
    match rec.stopped_by {
        Some(StoppedBy::DeadMan) => ev.notes.push("the init lost the host and stopped the command".into()),
        Some(StoppedBy::Handshake) => ev.notes.push("the handler runner did not answer the protocol in time".into()),
        _ => {}
    }
    ev.stragglers_killed = rec.stragglers_killed > 0;
    ev.init_privileges.clone_from(&rec.credentials);
    if let Some(g) = &rec.oom_guard {
        ev.enforcement.insert("oom_guard".into(), g.clone());
    }
    if expects_handler {
        c.facts.expects_result = true;
        let channel = rec.handler.clone().unwrap_or_default();
        // Silent by itself (it ended, or the handshake's bound ran out), not because the host
        // stopped it before it could speak.
        c.handler_silent = channel.hello.is_none() && matches!(rec.stopped_by, None | Some(StoppedBy::Handshake));
        for r in &channel.refused {
            ev.refused_claims.push(format!("handler: {r}"));
        }
        if let Some(h) = channel.record {
            c.facts.has_result = true;
            c.permanent = h.permanent;
            let text = stevedore_init::wire::cap_text(&h.error, stevedore_init::wire::MAX_ERROR_TEXT);
            match h.result {
                HandlerResult::Ok => {}
                HandlerResult::Error => {
                    c.facts.handler_error = Some(text.clone());
                    c.error_text = text;
                }
                HandlerResult::Panicked => {
                    c.facts.panicked = true;
                    c.error_text = text;
                }
                HandlerResult::LaunchFailed => {
                    c.facts.launch_failed = Some(match h.launch {
                        Some(WireLaunch::UnknownHandler) => LaunchFailure::UnknownHandler,
                        Some(WireLaunch::FingerprintMismatch) => LaunchFailure::FingerprintMismatch,
                        Some(WireLaunch::BadRequest) => LaunchFailure::BadRequest,
                        None => LaunchFailure::Other,
                    });
                    c.error_text = text;
                    c.permanent = true;
                }
            }
        }
    }
    counters(rec, bounds, &mut c, ev);
    c
}

/// Puts the init's counters into usage after bound checks; a figure that fails one is
/// refused and named.
fn counters(rec: &InitRecord, b: Bounds, c: &mut Claimed, ev: &mut Evidence) {
    let usage = &mut c.usage;
    let host_ms = u64::try_from(b.host_wall.as_millis()).unwrap_or(u64::MAX);
    if rec.wall_time_ms <= host_ms.saturating_add(1000) {
        usage.wall_time_ms = Some(rec.wall_time_ms);
        usage.sources.wall_time_ms = Some(Source::InitClock);
    } else {
        ev.refused_claims.push(format!("wall_time_ms {} exceeds the host's {host_ms} ms", rec.wall_time_ms));
        usage.wall_time_ms = Some(host_ms);
        usage.sources.wall_time_ms = Some(Source::HostClock);
    }
    let max_cpu_ms = (host_ms as f64 * b.cpus * 1.05) as u64 + 200;
    let cg = &rec.cgroup;
    if let Some(v) = cg.version {
        ev.notes.push(format!("{} (cgroup v{v})", b.cgroup_note));
    }
    let rusage_cpu = (rec.rusage.user_us + rec.rusage.system_us) / 1000;
    match cg.cpu_usage_ns.map(|ns| ns / 1_000_000) {
        Some(ms) if ms <= max_cpu_ms => {
            usage.cpu_time_ms = Some(ms);
            usage.sources.cpu_time_ms = Some(Source::Cgroup);
        }
        other => {
            if let Some(ms) = other {
                ev.refused_claims.push(format!("cpu_time_ms {ms} exceeds wall × cpus ({max_cpu_ms} ms)"));
            }
            if rusage_cpu <= max_cpu_ms {
                usage.cpu_time_ms = Some(rusage_cpu);
                usage.sources.cpu_time_ms = Some(Source::Rusage);
            } else {
                usage.sources.cpu_time_ms = Some(Source::unavailable("claims failed bound checks"));
            }
        }
    }
    // The init's reserve was in the cgroup all along the command's run: the attempt's own
    // figures leave it out (it is let go before the delivery, which fits in it).
    let held = rec.reserve_bytes.min(b.reserve);
    if held > 0 {
        ev.notes.push(format!(
            "peak_memory_bytes and the timeline's memory leave out the {held} bytes the init held for the delivery"
        ));
    }
    // What the init could not hold was the command's to use.
    let max_peak = b.memory.saturating_add(b.reserve - held).saturating_add(4 << 20);
    match cg.memory_peak_bytes.map(|p| p.saturating_sub(held)) {
        Some(p) if p <= max_peak => {
            usage.peak_memory_bytes = Some(p);
            usage.sources.peak_memory_bytes = Some(Source::Cgroup);
        }
        other => {
            if let Some(p) = other {
                ev.refused_claims.push(format!("peak_memory_bytes {p} exceeds the limit {}", b.memory));
            }
            let why = cg.missing.get("memory_peak_bytes").cloned().unwrap_or_else(|| "refused".into());
            usage.sources.peak_memory_bytes = Some(Source::Unavailable(why));
        }
    }
    match cg.oom_kills {
        Some(n) if n < 1_000_000 => {
            ev.oom_kills = Some(n);
            c.facts.oom_kills = n;
            usage.sources.oom_kills = Some(Source::Cgroup);
        }
        _ => {
            let why = cg.missing.get("oom_kills").cloned().unwrap_or_else(|| "refused".into());
            usage.sources.oom_kills = Some(Source::Unavailable(why));
        }
    }
    timeline(rec, b, Memory { held, max_peak }, max_cpu_ms, usage, ev);
}

/// The memory figures' part of the bounds: the init's reserve, left out of every figure,
/// and the most a figure may then be.
#[derive(Debug, Clone, Copy)]
struct Memory {
    held: u64,
    max_peak: u64,
}

/// Puts the init's samples into `usage.timeline` after bound checks, ending it with the
/// peak `usage` already holds. The samples are claims from inside the sandbox: a column that
/// fails a check is left out and named; times that go backwards or past the host's
/// clock refuse the whole timeline.
fn timeline(rec: &InitRecord, b: Bounds, mem: Memory, max_cpu_ms: u64, usage: &mut Usage, ev: &mut Evidence) {
    use crate::contract::{TIMELINE_MAX_SAMPLES, Timeline, TimelinePeak};
    let Some(t) = &rec.timeline else {
        if let WaitStatus::SpawnFailed(_) = rec.wait {
            usage.sources.timeline = Some(Source::unavailable("the command never started"));
            return;
        }
        usage.sources.timeline = Some(Source::unavailable(
            "the init sampled nothing: the rung has no cgroup of the attempt's own to read, or sampling is off \
                 (LinkConfig::timeline_period)",
        ));
        return;
    };
    let host_ms = u64::try_from(b.host_wall.as_millis()).unwrap_or(u64::MAX).saturating_add(1000);
    let n = t.t_ms.len();
    let refuse = |ev: &mut Evidence, usage: &mut Usage, why: String| {
        ev.refused_claims.push(format!("timeline: {why}"));
        usage.sources.timeline = Some(Source::unavailable("the init's samples failed bound checks"));
    };
    if n == 0 || n > TIMELINE_MAX_SAMPLES + 1 {
        return refuse(ev, usage, format!("{n} samples"));
    }
    if !t.t_ms.windows(2).all(|w| w[0] <= w[1]) || t.t_ms[n - 1] > host_ms {
        return refuse(ev, usage, format!("times out of order or past the host's {host_ms} ms"));
    }
    let mut line = Timeline {
        first_period_ms: t.first_period_ms,
        period_ms: t.period_ms,
        t_ms: t.t_ms.clone(),
        // The limit as the attempt has it: the cgroup's, less the reserve the rung added.
        memory_limit_bytes: rec
            .cgroup
            .memory_limit_bytes
            .map(|l| l.saturating_sub(b.reserve))
            .filter(|&l| l <= b.memory),
        cpu_limit_millicpus: b.cpu_limit_millis,
        // A mark only where the kernel's count (checked above) says a kill happened.
        oom_kill_ms: t.oom_kill_ms.filter(|&ms| ms <= t.t_ms[n - 1] && ev.oom_kills.is_some_and(|k| k > 0)),
        missing: t
            .missing
            .iter()
            .take(8)
            .map(|(k, v)| (stevedore_init::wire::cap_text(k, 32), stevedore_init::wire::cap_text(v, 200)))
            .collect(),
        ..Timeline::default()
    };
    let memory: Vec<u64> = t.memory_bytes.iter().map(|v| v.saturating_sub(mem.held)).collect();
    let ok = |name: &str, c: &[u64]| match name {
        "memory_bytes" => c.iter().all(|&v| v <= mem.max_peak),
        "cpu_ms" => c.windows(2).all(|w| w[0] <= w[1]) && c.iter().all(|&v| v <= max_cpu_ms),
        "pids" => c.iter().all(|&v| v <= 1 << 22),
        _ => true,
    };
    let checks = [
        ("memory_bytes", &memory, &mut line.memory_bytes),
        ("cpu_ms", &t.cpu_ms, &mut line.cpu_ms),
        ("pids", &t.pids, &mut line.pids),
        ("out_bytes", &t.out_bytes, &mut line.out_bytes),
        ("tmp_bytes", &t.tmp_bytes, &mut line.tmp_bytes),
    ];
    for (name, col, into) in checks {
        if col.is_empty() {
            line.missing.entry(name.into()).or_insert_with(|| "not sampled".into());
        } else if col.len() != n || !ok(name, col) {
            ev.refused_claims.push(format!("timeline: {name} failed a bound check"));
            line.missing.insert(name.into(), "refused: failed a bound check".into());
        } else {
            into.clone_from(col);
            line.missing.remove(name);
        }
    }
    if let (Some(p), Some(Source::Cgroup)) = (usage.peak_memory_bytes, &usage.sources.peak_memory_bytes) {
        line.peak = Some(TimelinePeak { t_ms: t.t_ms[n - 1], memory_bytes: p });
    }
    fit(&mut line);
    usage.timeline = Some(line);
    usage.sources.timeline = Some(Source::Sampled);
}

/// The most bytes a timeline takes of an Outcome's JSON.
pub(crate) const TIMELINE_MAX_JSON: usize = 16 << 10;

/// Thins `line` by its own rule (every second sample dropped, the first kept, the period
/// doubled) until its JSON takes at most [`TIMELINE_MAX_JSON`] bytes.
fn fit(line: &mut crate::contract::Timeline) {
    while line.t_ms.len() > 2 && serde_json::to_vec(&*line).map_or(usize::MAX, |j| j.len()) > TIMELINE_MAX_JSON {
        // The last sample is the command's end: kept, as the first is.
        let even = line.t_ms.len().is_multiple_of(2);
        let ends = columns(line).map(|c| c.last().copied());
        stevedore_init::wire::thin_columns(columns(line));
        if even {
            for (col, end) in columns(line).into_iter().zip(ends) {
                col.extend(end);
            }
        }
        line.period_ms = line.period_ms.saturating_mul(2);
    }
}

/// Every column of `line`, `t_ms` first.
fn columns(line: &mut crate::contract::Timeline) -> [&mut Vec<u64>; 6] {
    [&mut line.t_ms, &mut line.memory_bytes, &mut line.cpu_ms, &mut line.pids, &mut line.out_bytes, &mut line.tmp_bytes]
}

/// Without the init's read of the kernel's count, the rung's witness (the engine's
/// `State.OOMKilled`, the kubelet's `OOMKilled`) says at least one OOM kill.
pub(crate) fn oom_from_witness(ev: &mut Evidence, facts: &mut Facts, usage: &mut Usage, by: Source, why: &str) {
    ev.oom_kills = Some(1);
    facts.oom_kills = 1;
    let whose = match by {
        Source::Kubelet => "the kubelet's OOMKilled",
        _ => "the engine's State.OOMKilled",
    };
    ev.notes.push(format!("oom_kills from {whose}: {why}"));
    usage.sources.oom_kills = Some(by);
}

#[cfg(test)]
mod tests {
    use super::*;
    use stevedore_init::wire::{CgroupCounters, ChildrenRusage, HandlerChannel, HandlerHello, HandlerRecord};

    fn record() -> InitRecord {
        InitRecord {
            wait: WaitStatus::Code(0),
            stopped_by: None,
            stragglers_killed: 0,
            wall_time_ms: 900,
            cgroup: CgroupCounters {
                version: Some(2),
                memory_peak_bytes: Some(10 << 20),
                memory_limit_bytes: Some(64 << 20),
                oom_kills: Some(0),
                cpu_usage_ns: Some(500_000_000),
                missing: Default::default(),
                pids_limit: None,
                cpu_limit_millis: None,
            },
            rusage: ChildrenRusage { user_us: 100_000, system_us: 50_000, max_rss_kib: 1000 },
            out_fs: None,
            oom_guard: None,
            handler: None,
            stdout_bytes: 0,
            stderr_bytes: 0,
            host_lost: false,
            takeovers: 0,
            reports: Default::default(),
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

    fn bounds() -> Bounds {
        Bounds {
            host_wall: Duration::from_millis(1000),
            cpus: 1.0,
            memory: 64 << 20,
            cpu_limit_millis: None,
            reserve: 0,
            cgroup_note: "the test's cgroup",
        }
    }

    fn timeline(n: u64) -> stevedore_init::wire::Timeline {
        stevedore_init::wire::Timeline {
            first_period_ms: 100,
            period_ms: 100,
            t_ms: (0..n).map(|i| i * 100).collect(),
            memory_bytes: (0..n).map(|i| (i + 1) << 20).collect(),
            cpu_ms: (0..n).map(|i| i * 10).collect(),
            pids: vec![1; n as usize],
            out_bytes: vec![0; n as usize],
            tmp_bytes: Vec::new(),
            oom_kill_ms: None,
            missing: [("tmp_bytes".to_owned(), "/tmp is not a filesystem of its own".to_owned())].into(),
        }
    }

    #[test]
    fn a_timeline_ends_at_the_peak_and_keeps_what_passed_its_checks() {
        let mut rec = record();
        rec.timeline = Some(timeline(9));
        let mut ev = Evidence::default();
        let c = apply(&rec, bounds(), false, false, false, &mut ev);
        let line = c.usage.timeline.expect("a timeline");
        assert_eq!(c.usage.sources.timeline, Some(Source::Sampled));
        assert_eq!(line.t_ms.len(), 9);
        assert_eq!(line.peak, Some(crate::contract::TimelinePeak { t_ms: 800, memory_bytes: 10 << 20 }));
        assert_eq!(line.memory_limit_bytes, Some(64 << 20));
        assert!(line.tmp_bytes.is_empty() && line.missing["tmp_bytes"].contains("own"), "{line:?}");
        assert!(ev.refused_claims.is_empty(), "{:?}", ev.refused_claims);

        // Memory above the limit, CPU going backwards: those columns are refused and named.
        let mut t = timeline(9);
        t.memory_bytes[3] = 1 << 40;
        t.cpu_ms[5] = 0;
        rec.timeline = Some(t);
        let mut ev = Evidence::default();
        let line = apply(&rec, bounds(), false, false, false, &mut ev).usage.timeline.unwrap();
        assert!(line.memory_bytes.is_empty() && line.cpu_ms.is_empty() && line.pids.len() == 9, "{line:?}");
        assert_eq!(ev.refused_claims.len(), 2, "{:?}", ev.refused_claims);
    }

    #[test]
    fn the_inits_delivery_reserve_is_left_out_of_the_attempts_memory() {
        let reserve = 8 << 20;
        let mut rec = record();
        rec.reserve_bytes = reserve;
        rec.cgroup.memory_peak_bytes = Some((64 << 20) + reserve);
        rec.cgroup.memory_limit_bytes = Some((64 << 20) + reserve);
        let mut t = timeline(9);
        t.memory_bytes = t.memory_bytes.iter().map(|v| v + reserve).collect();
        rec.timeline = Some(t);
        let b = Bounds { reserve, ..bounds() };
        let mut ev = Evidence::default();
        let c = apply(&rec, b, false, false, false, &mut ev);
        assert_eq!(c.usage.peak_memory_bytes, Some(64 << 20), "{:?}", ev.refused_claims);
        let line = c.usage.timeline.expect("a timeline");
        assert_eq!(line.memory_limit_bytes, Some(64 << 20));
        assert_eq!(line.memory_bytes, timeline(9).memory_bytes);
        assert!(ev.notes.iter().any(|n| n.contains("leave out the 8388608 bytes")), "{:?}", ev.notes);
        // A reserve the init could not hold was the command's to use: its peak may reach it.
        rec.reserve_bytes = 0;
        let mut ev = Evidence::default();
        let c = apply(&rec, b, false, false, false, &mut ev);
        assert_eq!(c.usage.peak_memory_bytes, Some((64 << 20) + reserve), "{:?}", ev.refused_claims);
        // A record claiming more than the rung's reserve leaves out only the rung's.
        rec.reserve_bytes = 1 << 30;
        let c = apply(&rec, b, false, false, false, &mut Evidence::default());
        assert_eq!(c.usage.peak_memory_bytes, Some(64 << 20));
    }

    #[test]
    fn a_timeline_out_of_order_or_past_the_hosts_clock_is_refused_whole() {
        for bad in [vec![0, 200, 100], vec![0, 100, 5000], Vec::new()] {
            let mut t = timeline(bad.len() as u64);
            t.t_ms = bad.clone();
            let mut rec = record();
            rec.timeline = Some(t);
            let mut ev = Evidence::default();
            let c = apply(&rec, bounds(), false, false, false, &mut ev);
            assert_eq!(c.usage.timeline, None, "{bad:?}");
            assert!(c.usage.sources.timeline.as_ref().unwrap().to_string().starts_with("unavailable"), "{bad:?}");
            assert!(ev.refused_claims.iter().any(|r| r.starts_with("timeline: ")), "{bad:?}");
        }
        let mut ev = Evidence::default();
        let c = apply(&record(), bounds(), false, false, false, &mut ev);
        assert!(c.usage.sources.timeline.unwrap().to_string().contains("sampled nothing"));
    }

    #[test]
    fn a_timeline_of_huge_figures_is_thinned_to_16_kb() {
        let mut line = crate::contract::Timeline::default();
        for i in 0..192u64 {
            line.t_ms.push(u64::MAX / 4 + i);
            for col in
                [&mut line.memory_bytes, &mut line.cpu_ms, &mut line.pids, &mut line.out_bytes, &mut line.tmp_bytes]
            {
                col.push(u64::MAX - i);
            }
        }
        line.period_ms = 100;
        fit(&mut line);
        let json = serde_json::to_vec(&line).unwrap();
        assert!(json.len() <= TIMELINE_MAX_JSON, "{}", json.len());
        assert_eq!((line.t_ms[0], line.period_ms), (u64::MAX / 4, 200), "the first kept, the period doubled");
        assert!(line.memory_bytes.len() == line.t_ms.len() && line.t_ms.len() >= 64);
        assert_eq!(line.t_ms.last(), Some(&(u64::MAX / 4 + 191)), "the end is kept");
    }

    #[test]
    fn honest_figures_pass() {
        let mut ev = Evidence::default();
        let c = apply(&record(), bounds(), false, false, false, &mut ev);
        assert_eq!(c.usage.wall_time_ms, Some(900));
        assert_eq!(c.usage.cpu_time_ms, Some(500));
        assert_eq!(c.usage.peak_memory_bytes, Some(10 << 20));
        assert_eq!(c.usage.sources.cpu_time_ms, Some(Source::Cgroup));
        assert_eq!(ev.oom_kills, Some(0));
        assert!(ev.refused_claims.is_empty());
    }

    #[test]
    fn impossible_figures_are_refused_and_named() {
        let mut r = record();
        r.wall_time_ms = 60_000;
        r.cgroup.cpu_usage_ns = Some(50_000_000_000);
        r.cgroup.memory_peak_bytes = Some(1 << 40);
        r.rusage.user_us = 90_000_000;
        let mut ev = Evidence::default();
        let c = apply(&r, bounds(), false, false, false, &mut ev);
        assert_eq!((c.usage.wall_time_ms, c.usage.sources.wall_time_ms.clone()), (Some(1000), Some(Source::HostClock)));
        assert_eq!(c.usage.cpu_time_ms, None, "neither the cgroup's nor rusage's cpu fits");
        assert_eq!(c.usage.peak_memory_bytes, None, "unknown is null, never a forged figure");
        assert_eq!(ev.refused_claims.len(), 3, "{:?}", ev.refused_claims);
    }

    #[test]
    fn what_happened_first_wins() {
        let mut ev = Evidence::default();
        let c = apply(&record(), bounds(), false, true, false, &mut ev);
        assert!(!c.facts.deadline_fired, "the command ended before the init was told to stop it");
        let mut r = record();
        r.stopped_by = Some(StoppedBy::Kill);
        r.wait = WaitStatus::Signal(9);
        let c = apply(&r, bounds(), false, true, true, &mut ev);
        assert!(c.facts.deadline_fired && !c.facts.cancelled);
    }

    #[test]
    fn handler_channel() {
        let mut r = record();
        let mut ev = Evidence::default();
        r.handler = Some(HandlerChannel::default());
        let c = apply(&r, bounds(), true, false, false, &mut ev);
        assert!(c.handler_silent && !c.facts.has_result);
        r.handler = Some(HandlerChannel {
            hello: Some(HandlerHello { protocol: stevedore_init::wire::PROTOCOL, fingerprint: "f".into() }),
            record: Some(HandlerRecord {
                result: HandlerResult::LaunchFailed,
                error: "unknown handler \"x\"".into(),
                permanent: true,
                fingerprint: "f".into(),
                launch: Some(WireLaunch::UnknownHandler),
            }),
            refused: vec![],
        });
        let c = apply(&r, bounds(), true, false, false, &mut ev);
        assert_eq!(c.facts.launch_failed, Some(LaunchFailure::UnknownHandler));
        assert!(c.permanent && !c.handler_silent);
    }
}
