//! The container's cgroup counters, read by the init from inside the container.
//!
//! The parsers are pure (file contents in, figure or reason out) so both cgroup versions
//! can be tested on fixtures; [`read_counters`] only finds and reads the files.

use crate::wire::CgroupCounters;
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
            for key in [KEY_VERSION, KEY_MEMORY_PEAK, KEY_MEMORY_LIMIT, KEY_OOM_KILLS, KEY_CPU] {
                c.missing.insert(key.into(), why.clone());
            }
        }
    }
    c
}

/// Counters with every figure missing for `why`.
pub fn unavailable(why: &str) -> CgroupCounters {
    let mut c = CgroupCounters::default();
    for key in [KEY_VERSION, KEY_MEMORY_PEAK, KEY_MEMORY_LIMIT, KEY_OOM_KILLS, KEY_CPU] {
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
    c.memory_limit_bytes = limit(&mut c, memory, "memory.limit_in_bytes", parse_v1_limit);
    c
}

fn read_v2(root: &Path, c: &mut CgroupCounters) {
    c.version = Some(2);
    c.memory_peak_bytes = figure(c, KEY_MEMORY_PEAK, root, "memory.peak", Some("kernel < 5.19"), parse_single);
    c.oom_kills = figure(c, KEY_OOM_KILLS, root, "memory.events", None, |s| parse_keyed(s, "oom_kill"));
    c.cpu_usage_ns =
        figure(c, KEY_CPU, root, "cpu.stat", None, |s| parse_keyed(s, "usage_usec").map(|us| us.saturating_mul(1000)));
    c.memory_limit_bytes = limit(c, root, "memory.max", parse_v2_limit);
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
    c.memory_limit_bytes = limit(c, root, "memory/memory.limit_in_bytes", parse_v1_limit);
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
    root: &Path,
    file: &str,
    parse: fn(&str) -> Result<Option<u64>, String>,
) -> Option<u64> {
    match read(root, file, None).and_then(|s| parse(&s).map_err(|e| format!("{file} malformed: {e}"))) {
        Ok(Some(n)) => Some(n),
        Ok(None) => {
            c.missing.insert(KEY_MEMORY_LIMIT.into(), format!("{file} says no limit"));
            None
        }
        Err(why) => {
            c.missing.insert(KEY_MEMORY_LIMIT.into(), why);
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
        let c = read_counters(d.path());
        assert_eq!(c.version, Some(2));
        assert_eq!(c.memory_peak_bytes, Some(1 << 20));
        assert_eq!(c.oom_kills, Some(2));
        assert_eq!(c.cpu_usage_ns, Some(123_456_000));
        assert_eq!(c.memory_limit_bytes, None);
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
        let c = read_counters(d.path());
        assert_eq!(c.version, Some(1));
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
    fn no_cgroup_at_all() {
        let d = tempfile::tempdir().unwrap();
        let c = read_counters(d.path());
        assert_eq!(c.version, None);
        assert_eq!(c.missing.len(), 5);
        assert!(c.missing[KEY_CPU].starts_with("no cgroup filesystem"));
    }
}
