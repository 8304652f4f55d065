//! The container's cgroup counters, read by the init from inside the container.
//!
//! The parsers are pure (file contents in, figure or reason out) so both cgroup versions
//! can be tested on fixtures; [`read_counters`] only finds and reads the files.

use crate::wire::{CgroupCounters, Held, HeldLimit};
use std::io;
use std::path::Path;

/// The cgroup root inside a container.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Key in [`CgroupCounters::missing`] for the cgroup version.
pub const KEY_VERSION: &str = "version";
/// Key in [`CgroupCounters::missing`] for the memory high-water mark.
pub const KEY_MEMORY_PEAK: &str = "memory_peak_bytes";
/// Key in [`CgroupCounters::missing`] for the memory limit.
pub const KEY_MEMORY_LIMIT: &str = "memory_limit_bytes";
/// Key in [`CgroupCounters::missing`] for the process limit.
pub const KEY_PIDS_LIMIT: &str = "pids_limit";
/// Key in [`CgroupCounters::missing`] for the CPU limit.
pub const KEY_CPU_LIMIT: &str = "cpu_limit_millis";
/// Key in [`CgroupCounters::missing`] for the OOM kill count.
pub const KEY_OOM_KILLS: &str = "oom_kills";
/// Key in [`CgroupCounters::missing`] for the CPU usage.
pub const KEY_CPU: &str = "cpu_usage_ns";

/// v1 reports "no limit" as the largest page-aligned `i64`; anything from 2^62 up is
/// treated as unlimited, since no machine has that much memory.
const V1_UNLIMITED_FROM: u64 = 1 << 62;

/// Parses a file holding one unsigned integer (`memory.peak`, `cpuacct.usage`, ...).
pub fn parse_single(content: &str) -> Result<u64, String> {
    let t = content.trim();
    t.parse().map_err(|_| format!("not an unsigned integer: {:?}", truncate(t)))
}

/// Parses a v2 limit file (`memory.max`): a number, or `max` for no limit (`Ok(None)`).
pub fn parse_v2_limit(content: &str) -> Result<Option<u64>, String> {
    match content.trim() {
        "max" => Ok(None),
        _ => parse_single(content).map(Some),
    }
}

/// Parses a v1 limit file (`memory.limit_in_bytes`): a huge value means no limit (`Ok(None)`).
pub fn parse_v1_limit(content: &str) -> Result<Option<u64>, String> {
    parse_single(content).map(|n| (n < V1_UNLIMITED_FROM).then_some(n))
}

/// Parses v2's `cpu.max` (`QUOTA PERIOD`, `max PERIOD` for no limit) into thousandths of a CPU.
pub fn parse_v2_cpu_max(content: &str) -> Result<Option<u64>, String> {
    let mut words = content.split_whitespace();
    let (quota, period) = (words.next().unwrap_or(""), words.next().unwrap_or("100000"));
    if quota == "max" {
        return Ok(None);
    }
    millis(parse_single(quota)?, parse_single(period)?).map(Some)
}

/// Parses v1's `cpu.cfs_quota_us` (`-1`: no limit) over `cpu.cfs_period_us` into thousandths
/// of a CPU.
pub fn parse_v1_cpu(quota: &str, period: &str) -> Result<Option<u64>, String> {
    if quota.trim() == "-1" {
        return Ok(None);
    }
    millis(parse_single(quota)?, parse_single(period)?).map(Some)
}

fn millis(quota: u64, period: u64) -> Result<u64, String> {
    if period == 0 {
        return Err("a period of 0".into());
    }
    // Rounded up, and saturated rather than wrapped: a quota is never read back as less than
    // it allows.
    let millis = (u128::from(quota) * 1000).div_ceil(u128::from(period));
    Ok(u64::try_from(millis).unwrap_or(u64::MAX))
}

/// Finds `key N` in a flat-keyed file (`memory.events`, `cpu.stat`, `memory.oom_control`).
pub fn parse_keyed(content: &str, key: &str) -> Result<u64, String> {
    let mut found = None;
    for line in content.lines() {
        let mut words = line.split_whitespace();
        if words.next() == Some(key) {
            found = Some(words.next().unwrap_or(""));
            break;
        }
    }
    let value = found.ok_or_else(|| format!("no {key} line"))?;
    value.parse().map_err(|_| format!("{key} is not an unsigned integer: {:?}", truncate(value)))
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Which cgroup hierarchy is mounted at a root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// Legacy per-controller hierarchies (`memory/`, `cpuacct/`, ...).
    V1,
    /// The unified hierarchy.
    V2,
}

/// Detects the cgroup version mounted at `root`, if any.
pub fn detect(root: &Path) -> Option<Version> {
    if root.join("cgroup.controllers").is_file() {
        Some(Version::V2)
    } else if root.join("memory").is_dir() || root.join("cpuacct").is_dir() || root.join("cpu,cpuacct").is_dir() {
        Some(Version::V1)
    } else {
        None
    }
}

/// Reads the counters of the cgroup mounted at `root` (in a container: its own cgroup).
/// Never fails: every figure it cannot get is `None` with a reason in `missing`.
pub fn read_counters(root: &Path) -> CgroupCounters {
    let mut c = CgroupCounters::default();
    match detect(root) {
        Some(Version::V2) => read_v2(root, &mut c),
        Some(Version::V1) => read_v1(root, &mut c),
        None => {
            let why = format!("no cgroup filesystem at {}", root.display());
            for key in ALL_KEYS {
                c.missing.insert(key.into(), why.clone());
            }
        }
    }
    c
}

const ALL_KEYS: [&str; 7] =
    [KEY_VERSION, KEY_MEMORY_PEAK, KEY_MEMORY_LIMIT, KEY_OOM_KILLS, KEY_CPU, KEY_PIDS_LIMIT, KEY_CPU_LIMIT];

/// Counters with every figure missing for `why`.
pub fn unavailable(why: &str) -> CgroupCounters {
    let mut c = CgroupCounters::default();
    for key in ALL_KEYS {
        c.missing.insert(key.into(), why.to_owned());
    }
    c
}

/// Reads a v1 cgroup whose controllers live in separate directories (a cgroup made for one
/// attempt under each controller's hierarchy): `memory` and `cpuacct` are those dirs.
pub fn read_v1_dirs(memory: &Path, cpuacct: &Path) -> CgroupCounters {
    let mut c = CgroupCounters { version: Some(1), ..CgroupCounters::default() };
    c.memory_peak_bytes = figure(&mut c, KEY_MEMORY_PEAK, memory, "memory.max_usage_in_bytes", None, parse_single);
    c.oom_kills = figure(&mut c, KEY_OOM_KILLS, memory, "memory.oom_control", None, |s| {
        parse_keyed(s, "oom_kill").map_err(|e| format!("{e} (kernel < 4.13?)"))
    });
    c.cpu_usage_ns = figure(&mut c, KEY_CPU, cpuacct, "cpuacct.usage", None, parse_single);
    c.memory_limit_bytes = limit(&mut c, KEY_MEMORY_LIMIT, memory, "memory.limit_in_bytes", parse_v1_limit);
    c
}

fn read_v2(root: &Path, c: &mut CgroupCounters) {
    c.version = Some(2);
    c.memory_peak_bytes = figure(c, KEY_MEMORY_PEAK, root, "memory.peak", Some("kernel < 5.19"), parse_single);
    c.oom_kills = figure(c, KEY_OOM_KILLS, root, "memory.events", None, |s| parse_keyed(s, "oom_kill"));
    c.cpu_usage_ns =
        figure(c, KEY_CPU, root, "cpu.stat", None, |s| parse_keyed(s, "usage_usec").map(|us| us.saturating_mul(1000)));
    read_limits(root, Version::V2, c);
}

fn read_v1(root: &Path, c: &mut CgroupCounters) {
    c.version = Some(1);
    c.memory_peak_bytes = figure(c, KEY_MEMORY_PEAK, root, "memory/memory.max_usage_in_bytes", None, parse_single);
    // The oom_kill line only exists from kernel 4.13.
    c.oom_kills = figure(c, KEY_OOM_KILLS, root, "memory/memory.oom_control", None, |s| {
        parse_keyed(s, "oom_kill").map_err(|e| format!("{e} (kernel < 4.13?)"))
    });
    let cpu =
        if root.join("cpuacct/cpuacct.usage").exists() { "cpuacct/cpuacct.usage" } else { "cpu,cpuacct/cpuacct.usage" };
    c.cpu_usage_ns = figure(c, KEY_CPU, root, cpu, None, parse_single);
    read_limits(root, Version::V1, c);
}

/// The memory, pids and CPU limits of the cgroup at `root`: all a check before the command
/// needs ([`check_held`]), the rest of the counters being the end's.
fn read_limits(root: &Path, version: Version, c: &mut CgroupCounters) {
    match version {
        Version::V2 => {
            c.memory_limit_bytes = limit(c, KEY_MEMORY_LIMIT, root, "memory.max", parse_v2_limit);
            c.pids_limit = limit(c, KEY_PIDS_LIMIT, root, "pids.max", parse_v2_limit);
            c.cpu_limit_millis = limit(c, KEY_CPU_LIMIT, root, "cpu.max", parse_v2_cpu_max);
        }
        Version::V1 => {
            c.memory_limit_bytes = limit(c, KEY_MEMORY_LIMIT, root, "memory/memory.limit_in_bytes", parse_v1_limit);
            // v1's pids.max reads "max" for no limit, as v2's does.
            c.pids_limit = limit(c, KEY_PIDS_LIMIT, root, "pids/pids.max", parse_v2_limit);
            let dir = if root.join("cpu/cpu.cfs_quota_us").exists() { "cpu" } else { "cpu,cpuacct" };
            let period = read(root, &format!("{dir}/cpu.cfs_period_us"), None);
            c.cpu_limit_millis = limit(c, KEY_CPU_LIMIT, root, &format!("{dir}/cpu.cfs_quota_us"), |quota| {
                parse_v1_cpu(quota, period.as_deref().map_err(Clone::clone)?)
            });
        }
    }
}

/// Checks, before the command starts, that the cgroup at `root` holds each limit of `held`
/// (`wire::Start::held`): the engine that took a limit may not apply it (a rootless engine
/// without a delegated cgroup takes it and ignores it). The error names what was read.
pub fn check_held(root: Option<&Path>, held: &[Held]) -> Result<(), String> {
    if held.is_empty() {
        return Ok(());
    }
    let Some(root) = root else {
        let names: Vec<&str> = held.iter().map(|h| h.limit.name()).collect();
        return Err(format!("{}: the sandbox has no cgroup of its own to read the limits back from", names.join(", ")));
    };
    // The limits alone: the command's start waits on this.
    let mut c = CgroupCounters::default();
    match detect(root) {
        Some(version) => read_limits(root, version, &mut c),
        None => {
            let why = format!("no cgroup filesystem at {}", root.display());
            for key in [KEY_MEMORY_LIMIT, KEY_PIDS_LIMIT, KEY_CPU_LIMIT] {
                c.missing.insert(key.into(), why.clone());
            }
        }
    }
    let mut wrong = Vec::new();
    for h in held {
        let (read, key, unit) = match h.limit {
            HeldLimit::Memory => (c.memory_limit_bytes, KEY_MEMORY_LIMIT, " bytes"),
            HeldLimit::Pids => (c.pids_limit, KEY_PIDS_LIMIT, " processes"),
            HeldLimit::Cpu => (c.cpu_limit_millis, KEY_CPU_LIMIT, " thousandths of a CPU"),
        };
        match read {
            Some(n) if n <= h.at_most => {}
            Some(n) => wrong.push(format!("{}: the cgroup holds {n}{unit}, not at most {}", h.limit.name(), h.at_most)),
            None => {
                let why = c.missing.get(key).map_or("not read", String::as_str);
                wrong.push(format!("{}: {why}", h.limit.name()));
            }
        }
    }
    if wrong.is_empty() { Ok(()) } else { Err(format!("not held by the sandbox's cgroup: {}", wrong.join("; "))) }
}

/// Reads and parses one figure; on failure records why under `key`.
fn figure(
    c: &mut CgroupCounters,
    key: &str,
    root: &Path,
    file: &str,
    absent_hint: Option<&str>,
    parse: impl FnOnce(&str) -> Result<u64, String>,
) -> Option<u64> {
    match read(root, file, absent_hint).and_then(|s| parse(&s).map_err(|e| format!("{file} malformed: {e}"))) {
        Ok(n) => Some(n),
        Err(why) => {
            c.missing.insert(key.into(), why);
            None
        }
    }
}

fn limit(
    c: &mut CgroupCounters,
    key: &str,
    root: &Path,
    file: &str,
    parse: impl FnOnce(&str) -> Result<Option<u64>, String>,
) -> Option<u64> {
    match read(root, file, None).and_then(|s| parse(&s).map_err(|e| format!("{file} malformed: {e}"))) {
        Ok(Some(n)) => Some(n),
        Ok(None) => {
            c.missing.insert(key.into(), format!("{file} says no limit"));
            None
        }
        Err(why) => {
            c.missing.insert(key.into(), why);
            None
        }
    }
}

fn read(root: &Path, file: &str, absent_hint: Option<&str>) -> Result<String, String> {
    // The kernel's cgroup files are small; the cap guards against a bind-mounted impostor.
    use std::io::Read;
    let open = std::fs::File::open(root.join(file));
    let mut s = String::new();
    match open.and_then(|f| f.take(64 << 10).read_to_string(&mut s)) {
        Ok(_) => Ok(s),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(match absent_hint {
            Some(h) => format!("{file} absent ({h})"),
            None => format!("{file} absent"),
        }),
        Err(e) => Err(format!("{file} unreadable: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    const V2_EVENTS: &str = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
    const V2_CPU: &str = "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\nnr_periods 0\n";
    const V1_OOM: &str = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n";

    #[test]
    fn parses_single_values_and_limits() {
        assert_eq!(parse_single("4096\n"), Ok(4096));
        assert!(parse_single("").is_err());
        assert!(parse_single("-1\n").is_err());
        assert_eq!(parse_v2_limit("max\n"), Ok(None));
        assert_eq!(parse_v2_limit("33554432\n"), Ok(Some(32 << 20)));
        assert!(parse_v2_limit("lots\n").is_err());
        assert_eq!(parse_v1_limit("9223372036854771712\n"), Ok(None));
        assert_eq!(parse_v1_limit("33554432\n"), Ok(Some(32 << 20)));
        assert!(parse_v1_limit("max\n").is_err());
    }

    #[test]
    fn parses_keyed_files_of_both_versions() {
        assert_eq!(parse_keyed(V2_EVENTS, "oom_kill"), Ok(2));
        assert_eq!(parse_keyed(V2_CPU, "usage_usec"), Ok(123456));
        assert_eq!(parse_keyed(V1_OOM, "oom_kill"), Ok(1));
        // A key that is a prefix of another must not match it.
        assert_eq!(parse_keyed("oom_kill_disable 0\noom_kill 5\n", "oom_kill"), Ok(5));
        assert!(parse_keyed("oom_kill_disable 0\nunder_oom 0\n", "oom_kill").unwrap_err().contains("no oom_kill"));
        assert!(parse_keyed("oom_kill x\n", "oom_kill").is_err());
        assert!(parse_keyed("oom_kill\n", "oom_kill").is_err());
    }

    fn put(root: &Path, file: &str, content: &str) {
        let p = root.join(file);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, content).unwrap();
    }

    #[test]
    fn reads_v2() {
        let d = tempfile::tempdir().unwrap();
        put(d.path(), "cgroup.controllers", "cpu memory pids\n");
        put(d.path(), "memory.peak", "1048576\n");
        put(d.path(), "memory.events", V2_EVENTS);
        put(d.path(), "cpu.stat", V2_CPU);
        put(d.path(), "memory.max", "max\n");
        put(d.path(), "pids.max", "64\n");
        put(d.path(), "cpu.max", "50000 100000\n");
        let c = read_counters(d.path());
        assert_eq!(c.version, Some(2));
        assert_eq!(c.memory_peak_bytes, Some(1 << 20));
        assert_eq!(c.oom_kills, Some(2));
        assert_eq!(c.cpu_usage_ns, Some(123_456_000));
        assert_eq!(c.memory_limit_bytes, None);
        assert_eq!((c.pids_limit, c.cpu_limit_millis), (Some(64), Some(500)));
        assert_eq!(c.missing.keys().collect::<Vec<_>>(), [KEY_MEMORY_LIMIT]);
    }

    #[test]
    fn v2_without_memory_peak_says_why() {
        let d = tempfile::tempdir().unwrap();
        put(d.path(), "cgroup.controllers", "");
        put(d.path(), "memory.events", "oom_kill nope\n");
        put(d.path(), "memory.max", "67108864\n");
        let c = read_counters(d.path());
        assert_eq!(c.memory_peak_bytes, None);
        assert_eq!(c.missing[KEY_MEMORY_PEAK], "memory.peak absent (kernel < 5.19)");
        assert_eq!(c.missing[KEY_PIDS_LIMIT], "pids.max absent");
        assert_eq!(c.oom_kills, None);
        assert!(c.missing[KEY_OOM_KILLS].starts_with("memory.events malformed"));
        assert!(c.missing[KEY_CPU].contains("cpu.stat absent"));
        assert_eq!(c.memory_limit_bytes, Some(64 << 20));
    }

    #[test]
    fn reads_v1() {
        let d = tempfile::tempdir().unwrap();
        put(d.path(), "memory/memory.max_usage_in_bytes", "2097152\n");
        put(d.path(), "memory/memory.oom_control", V1_OOM);
        put(d.path(), "memory/memory.limit_in_bytes", "33554432\n");
        put(d.path(), "cpu,cpuacct/cpuacct.usage", "987654321\n");
        put(d.path(), "cpu,cpuacct/cpu.cfs_quota_us", "150000\n");
        put(d.path(), "cpu,cpuacct/cpu.cfs_period_us", "100000\n");
        put(d.path(), "pids/pids.max", "max\n");
        let mut c = read_counters(d.path());
        assert_eq!(c.version, Some(1));
        assert_eq!((c.pids_limit, c.cpu_limit_millis), (None, Some(1500)));
        assert_eq!(c.missing.remove(KEY_PIDS_LIMIT).as_deref(), Some("pids/pids.max says no limit"));
        assert_eq!(c.memory_peak_bytes, Some(2 << 20));
        assert_eq!(c.oom_kills, Some(1));
        assert_eq!(c.cpu_usage_ns, Some(987_654_321));
        assert_eq!(c.memory_limit_bytes, Some(32 << 20));
        assert!(c.missing.is_empty(), "{:?}", c.missing);
    }

    #[test]
    fn v1_old_kernel_and_no_limit() {
        let d = tempfile::tempdir().unwrap();
        put(d.path(), "memory/memory.max_usage_in_bytes", "garbage\n");
        put(d.path(), "memory/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n");
        put(d.path(), "memory/memory.limit_in_bytes", "9223372036854771712\n");
        put(d.path(), "cpuacct/cpuacct.usage", "5\n");
        let c = read_counters(d.path());
        assert_eq!((c.memory_peak_bytes, c.oom_kills, c.memory_limit_bytes), (None, None, None));
        assert_eq!(c.cpu_usage_ns, Some(5));
        assert!(c.missing[KEY_MEMORY_PEAK].starts_with("memory/memory.max_usage_in_bytes malformed"));
        assert!(c.missing[KEY_OOM_KILLS].contains("kernel < 4.13"));
        assert!(c.missing[KEY_MEMORY_LIMIT].contains("no limit"));
    }

    #[test]
    fn parses_cpu_quotas_of_both_versions() {
        assert_eq!(parse_v2_cpu_max("max 100000\n"), Ok(None));
        assert_eq!(parse_v2_cpu_max("50000 100000\n"), Ok(Some(500)));
        assert_eq!(parse_v2_cpu_max("1 3\n"), Ok(Some(334)), "rounded up, never under what it allows");
        assert!(parse_v2_cpu_max("50000 0\n").is_err());
        assert!(parse_v2_cpu_max("lots 100000\n").is_err());
        assert_eq!(parse_v1_cpu("-1\n", "100000\n"), Ok(None));
        assert_eq!(parse_v1_cpu("200000\n", "100000\n"), Ok(Some(2000)));
        assert!(parse_v1_cpu("-2\n", "100000\n").is_err());
    }

    /// Before the command: every demanded limit found at or under what was applied, else one
    /// error naming each that is not, with what the cgroup holds; no cgroup is an error too.
    #[test]
    fn a_demanded_limit_is_checked_against_what_the_cgroup_holds() {
        let d = tempfile::tempdir().unwrap();
        put(d.path(), "cgroup.controllers", "cpu memory pids\n");
        put(d.path(), "memory.max", "67108864\n");
        put(d.path(), "pids.max", "max\n");
        put(d.path(), "cpu.max", "200000 100000\n");
        let held = |limit, at_most| Held { limit, at_most };
        assert_eq!(check_held(Some(d.path()), &[]), Ok(()));
        assert_eq!(check_held(Some(d.path()), &[held(HeldLimit::Memory, 64 << 20)]), Ok(()));
        let all = [held(HeldLimit::Memory, 32 << 20), held(HeldLimit::Pids, 64), held(HeldLimit::Cpu, 500)];
        let why = check_held(Some(d.path()), &all).unwrap_err();
        assert_eq!(
            why,
            "not held by the sandbox's cgroup: memory: the cgroup holds 67108864 bytes, not at most 33554432; \
             pids: pids.max says no limit; cpu: the cgroup holds 2000 thousandths of a CPU, not at most 500"
        );
        let why = check_held(None, &all[..1]).unwrap_err();
        assert!(why.starts_with("memory: the sandbox has no cgroup of its own"), "{why}");
        let empty = tempfile::tempdir().unwrap();
        let why = check_held(Some(empty.path()), &all[1..2]).unwrap_err();
        assert!(why.contains("pids: no cgroup filesystem"), "{why}");
    }

    #[test]
    fn no_cgroup_at_all() {
        let d = tempfile::tempdir().unwrap();
        let c = read_counters(d.path());
        assert_eq!(c.version, None);
        assert_eq!(c.missing.len(), 7);
        assert!(c.missing[KEY_CPU].starts_with("no cgroup filesystem"));
    }
}
