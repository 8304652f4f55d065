//! The resource timeline: the attempt's cgroup (memory in use, CPU used, tasks, OOM kills)
//! and the bytes in its output and scratch dirs, sampled while the command runs.
//!
//! Invariant: at most `max_samples` samples are ever held, so a long attempt costs the same
//! memory and the same record size as a short one. At that many, every second sample is
//! dropped (the first is kept) and the period doubles: the timeline covers the whole run
//! evenly, more coarsely the longer it is. A sample is a handful of small reads of kernel
//! files and two `statvfs`; one that fails leaves its column empty with the reason.
//!
//! The kernel files are opened once, before the command starts, and read again from their
//! start at every sample: a sample then needs no new memory of the kernel's (a `struct
//! file`, a read buffer) or of the init's, so sampling a cgroup the command has filled does
//! not make the init the next process the OOM killer takes (`reserve`).

use crate::cgroup::{self, Version};
use crate::wire::{MAX_TIMELINE_SAMPLES, MIN_SAMPLE_PERIOD_MS, SampledCgroup, Timeline, TimelineSpec};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Column names, as in [`Timeline::missing`].
const MEMORY: &str = "memory_bytes";
const CPU: &str = "cpu_ms";
const PIDS: &str = "pids";
const OUT: &str = "out_bytes";
const TMP: &str = "tmp_bytes";

/// Where each figure is read.
#[derive(Debug, Default)]
struct Files {
    /// `memory.current` (v2) or `memory.usage_in_bytes` (v1).
    memory: Option<Kernel>,
    /// `cpu.stat` (v2, `usage_usec`) or `cpuacct.usage` (v1, ns).
    cpu: Option<(Kernel, Version)>,
    pids: Option<Kernel>,
    /// `memory.events` (v2) or `memory.oom_control` (v1): the `oom_kill` line.
    oom: Option<Kernel>,
    out: Option<PathBuf>,
    tmp: Option<PathBuf>,
}

/// A kernel file read at every sample, open from the sampler's start (or why it could not be).
#[derive(Debug)]
struct Kernel {
    path: PathBuf,
    file: Result<std::fs::File, String>,
}

impl Kernel {
    fn open(path: PathBuf) -> Self {
        let file = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()));
        Self { path, file }
    }

    /// The file's figure, read from its start into a buffer of the stack.
    fn read(&self, parse: impl FnOnce(&str) -> Result<u64, String>) -> Result<u64, String> {
        let file = self.file.as_ref().map_err(Clone::clone)?;
        // Kernel files are small; the cap guards against an impostor bind-mounted in their place.
        let mut buf = [0u8; 4096];
        let mut n = 0;
        while n < buf.len() {
            match file.read_at(&mut buf[n..], n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("{}: {e}", self.path.display())),
            }
        }
        let text = std::str::from_utf8(&buf[..n]).map_err(|e| format!("{} malformed: {e}", self.path.display()))?;
        parse(text).map_err(|e| format!("{} malformed: {e}", self.path.display()))
    }
}

/// Samples at its period while the command runs; [`Sampler::finish`] gives the timeline.
#[derive(Debug)]
pub(crate) struct Sampler {
    files: Files,
    started: Instant,
    period: Duration,
    max: usize,
    next: Instant,
    oom_base: Option<u64>,
    line: Timeline,
}

impl Sampler {
    /// A sampler for `spec`, counting from `started` (the command's start, or see
    /// [`Sampler::begin`]); `cgroup_dir` is the Start frame's, read when the spec names no
    /// cgroup of its own. The OOM kill count read here is the baseline a mark needs it above.
    pub fn new(spec: &TimelineSpec, cgroup_dir: Option<&str>, started: Instant) -> Self {
        let period = Duration::from_millis(spec.period_ms.max(MIN_SAMPLE_PERIOD_MS));
        let max = usize::try_from(spec.max_samples.clamp(2, MAX_TIMELINE_SAMPLES)).unwrap_or(2);
        let mut line =
            Timeline { first_period_ms: u64::try_from(period.as_millis()).unwrap_or(u64::MAX), ..Timeline::default() };
        line.period_ms = line.first_period_ms;
        let mut files = Files::default();
        match (&spec.cgroup, cgroup_dir) {
            (Some(SampledCgroup::V2(dir)), _) => v2(&mut files, Path::new(dir)),
            (Some(SampledCgroup::V1 { memory, cpuacct, pids }), _) => {
                let at = |d: &String, f: &str| Kernel::open(Path::new(d).join(f));
                files.memory = memory.as_ref().map(|d| at(d, "memory.usage_in_bytes"));
                files.oom = memory.as_ref().map(|d| at(d, "memory.oom_control"));
                files.cpu = cpuacct.as_ref().map(|d| (at(d, "cpuacct.usage"), Version::V1));
                files.pids = pids.as_ref().map(|d| at(d, "pids.current"));
            }
            (None, Some(root)) => match cgroup::detect(Path::new(root)) {
                Some(Version::V2) => v2(&mut files, Path::new(root)),
                Some(Version::V1) => {
                    let root = Path::new(root);
                    files.memory = Some(Kernel::open(root.join("memory/memory.usage_in_bytes")));
                    files.oom = Some(Kernel::open(root.join("memory/memory.oom_control")));
                    let cpu = if root.join("cpuacct/cpuacct.usage").exists() { "cpuacct" } else { "cpu,cpuacct" };
                    files.cpu = Some((Kernel::open(root.join(cpu).join("cpuacct.usage")), Version::V1));
                    files.pids = Some(Kernel::open(root.join("pids/pids.current")));
                }
                None => {}
            },
            (None, None) => {}
        }
        let no_cgroup = "no cgroup of the attempt's own to read";
        for (col, found) in [(MEMORY, files.memory.is_some()), (CPU, files.cpu.is_some()), (PIDS, files.pids.is_some())]
        {
            if !found {
                line.missing.insert(col.into(), no_cgroup.into());
            }
        }
        for (col, dir, slot) in [(OUT, &spec.out_dir, &mut files.out), (TMP, &spec.tmp_dir, &mut files.tmp)] {
            match dir.as_deref().map(own_filesystem) {
                Some(Ok(p)) => *slot = Some(p),
                Some(Err(why)) => {
                    line.missing.insert(col.into(), why);
                }
                None => {
                    line.missing.insert(col.into(), "not asked for".into());
                }
            }
        }
        let oom_base = files.oom.as_ref().and_then(oom_kills);
        Self { files, started, period, max, next: started, oom_base, line }
    }

    /// Counts from `started` (the command's start), the first sample due at once.
    pub fn begin(&mut self, started: Instant) {
        self.started = started;
        self.next = started;
    }

    /// When the next sample is due.
    pub fn next(&self) -> Instant {
        self.next
    }

    /// Takes a sample if one is due at `now`.
    pub fn tick(&mut self, now: Instant) {
        if now < self.next {
            return;
        }
        self.sample(now);
        // Due again a period after this one, never in a burst after a late wake-up.
        self.next = now.checked_add(self.period).unwrap_or(now);
    }

    /// Takes one sample now, whatever the period.
    pub fn sample(&mut self, now: Instant) {
        if self.line.t_ms.len() >= self.max {
            self.thin();
        }
        let t = u64::try_from(now.saturating_duration_since(self.started).as_millis()).unwrap_or(u64::MAX);
        // Times only go forward, whatever order the caller's instants came in.
        let t = t.max(self.line.t_ms.last().copied().unwrap_or(0));
        let f = &self.files;
        let memory = f.memory.as_ref().map(|k| k.read(cgroup::parse_single));
        let cpu = f.cpu.as_ref().map(|(k, v)| match v {
            Version::V2 => k.read(|s| cgroup::parse_keyed(s, "usage_usec").map(|us| us / 1000)),
            Version::V1 => k.read(cgroup::parse_single).map(|ns| ns / 1_000_000),
        });
        let pids = f.pids.as_ref().map(|k| k.read(cgroup::parse_single));
        let out = f.out.as_deref().map(used_bytes);
        let tmp = f.tmp.as_deref().map(used_bytes);
        if self.line.oom_kill_ms.is_none()
            && let (Some(base), Some(now_kills)) = (self.oom_base, f.oom.as_ref().and_then(oom_kills))
            && now_kills > base
        {
            self.line.oom_kill_ms = Some(t);
        }
        let line = &mut self.line;
        line.t_ms.push(t);
        for (col, name, figure) in [
            (&mut line.memory_bytes, MEMORY, memory),
            (&mut line.cpu_ms, CPU, cpu),
            (&mut line.pids, PIDS, pids),
            (&mut line.out_bytes, OUT, out),
            (&mut line.tmp_bytes, TMP, tmp),
        ] {
            match figure {
                Some(Ok(v)) if !line.missing.contains_key(name) => col.push(v),
                Some(Err(why)) if !line.missing.contains_key(name) => {
                    // One column, all or nothing: a gap would misplace every later figure.
                    col.clear();
                    line.missing.insert(name.into(), why);
                }
                _ => {}
            }
        }
    }

    /// Drops every second sample (keeping the first) and doubles the period.
    fn thin(&mut self) {
        let line = &mut self.line;
        crate::wire::thin_columns([
            &mut line.t_ms,
            &mut line.memory_bytes,
            &mut line.cpu_ms,
            &mut line.pids,
            &mut line.out_bytes,
            &mut line.tmp_bytes,
        ]);
        self.period = self.period.saturating_mul(2);
        line.period_ms = u64::try_from(self.period.as_millis()).unwrap_or(u64::MAX);
    }

    /// The timeline (its last sample taken by the caller at the command's end) and, when the
    /// OOM killer acted but no sample saw it rise, the mark at the end.
    pub fn finish(mut self) -> Timeline {
        if self.line.oom_kill_ms.is_none()
            && let (Some(base), Some(kills)) = (self.oom_base, self.files.oom.as_ref().and_then(oom_kills))
            && kills > base
        {
            self.line.oom_kill_ms = self.line.t_ms.last().copied();
        }
        self.line
    }
}

fn v2(files: &mut Files, dir: &Path) {
    files.memory = Some(Kernel::open(dir.join("memory.current")));
    files.cpu = Some((Kernel::open(dir.join("cpu.stat")), Version::V2));
    files.pids = Some(Kernel::open(dir.join("pids.current")));
    files.oom = Some(Kernel::open(dir.join("memory.events")));
}

/// The cgroup's OOM kill count, if it can be read.
fn oom_kills(k: &Kernel) -> Option<u64> {
    k.read(|s| cgroup::parse_keyed(s, "oom_kill")).ok()
}

/// `dir` when it is the root of a filesystem of its own (its `statvfs` then counts only what
/// is in it); else why its bytes cannot be sampled cheaply.
fn own_filesystem(dir: &str) -> Result<PathBuf, String> {
    let path = Path::new(dir);
    let parent = path.parent().unwrap_or(Path::new("/"));
    let (here, above) = match (std::fs::symlink_metadata(path), std::fs::metadata(parent)) {
        (Ok(h), Ok(a)) => (h, a),
        (Err(e), _) | (_, Err(e)) => return Err(format!("{dir}: {e}")),
    };
    if !here.is_dir() {
        return Err(format!("{dir} is not a directory"));
    }
    if here.dev() == above.dev() {
        return Err(format!("{dir} is not a filesystem of its own: its bytes are counted once, after the command"));
    }
    // A disk mounted there holds more than the attempt's bytes: only a tmpfs is the attempt's.
    match nix::sys::statfs::statfs(path) {
        Ok(fs) if fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC => Ok(path.to_owned()),
        Ok(_) => Err(format!(
            "{dir} is a mount of a filesystem that is not a tmpfs: its bytes are counted once, after the command"
        )),
        Err(e) => Err(format!("{dir}: statfs: {e}")),
    }
}

fn used_bytes(path: &Path) -> Result<u64, String> {
    let st = nix::sys::statvfs::statvfs(path).map_err(|e| format!("{}: statvfs: {e}", path.display()))?;
    Ok(st.blocks().saturating_sub(st.blocks_free()).saturating_mul(st.fragment_size()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(max: u32) -> TimelineSpec {
        TimelineSpec { period_ms: 100, max_samples: max, cgroup: None, out_dir: None, tmp_dir: None }
    }

    fn put(dir: &Path, file: &str, content: &str) {
        let p = dir.join(file);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    #[test]
    fn a_v2_cgroup_gives_every_column_and_the_oom_mark_when_the_count_rises() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        put(root, "cgroup.controllers", "memory pids cpu\n");
        put(root, "memory.current", "1048576\n");
        put(root, "cpu.stat", "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n");
        put(root, "pids.current", "3\n");
        put(root, "memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n");
        let t0 = Instant::now();
        let mut s = Sampler::new(&spec(16), Some(root.to_str().unwrap()), t0);
        s.tick(t0);
        put(root, "memory.current", "2097152\n");
        put(root, "memory.events", "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n");
        s.tick(t0 + Duration::from_millis(100));
        s.sample(t0 + Duration::from_millis(150));
        let line = s.finish();
        assert_eq!(line.t_ms, [0, 100, 150]);
        assert_eq!(line.memory_bytes, [1 << 20, 2 << 20, 2 << 20]);
        assert_eq!(line.cpu_ms, [2, 2, 2]);
        assert_eq!(line.pids, [3, 3, 3]);
        assert_eq!(line.oom_kill_ms, Some(100));
        assert_eq!(line.missing.get("out_bytes").map(String::as_str), Some("not asked for"));
    }

    #[test]
    fn a_v1_root_reads_the_controllers_files() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        put(root, "memory/memory.usage_in_bytes", "4096\n");
        put(root, "memory/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n");
        put(root, "cpuacct/cpuacct.usage", "3000000\n");
        put(root, "pids/pids.current", "1\n");
        let t0 = Instant::now();
        let mut s = Sampler::new(&spec(16), Some(root.to_str().unwrap()), t0);
        s.sample(t0);
        let line = s.finish();
        assert_eq!((line.memory_bytes, line.cpu_ms, line.pids), (vec![4096], vec![3], vec![1]));
        assert_eq!(line.oom_kill_ms, None);
    }

    #[test]
    fn a_column_that_fails_once_is_empty_with_why_and_the_others_go_on() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        put(root, "cgroup.controllers", "memory\n");
        put(root, "memory.current", "1\n");
        put(root, "cpu.stat", "usage_usec 1000\n");
        put(root, "pids.current", "1\n");
        let t0 = Instant::now();
        let mut s = Sampler::new(&spec(16), Some(root.to_str().unwrap()), t0);
        s.tick(t0);
        put(root, "pids.current", "max\n");
        s.sample(t0 + Duration::from_millis(100));
        let line = s.finish();
        assert_eq!(line.memory_bytes, [1, 1]);
        assert!(line.pids.is_empty());
        assert!(line.missing["pids"].contains("malformed"), "{:?}", line.missing);
    }

    #[test]
    fn thinning_keeps_the_samples_bounded_and_the_whole_run_covered() {
        let t0 = Instant::now();
        let mut s = Sampler::new(&spec(8), None, t0);
        let mut now = t0;
        for _ in 0..40 {
            s.tick(now);
            now = s.next();
        }
        let end = now;
        s.sample(end);
        let line = s.finish();
        assert!(line.t_ms.len() <= 8, "{}", line.t_ms.len());
        assert_eq!(line.t_ms[0], 0);
        assert_eq!(*line.t_ms.last().unwrap(), u64::try_from((end - t0).as_millis()).unwrap());
        assert!(line.period_ms > 100 && line.period_ms.is_multiple_of(100) && (line.period_ms / 100).is_power_of_two());
        assert!(line.t_ms.windows(2).all(|w| w[0] < w[1]), "{:?}", line.t_ms);
        assert!(line.memory_bytes.is_empty() && line.missing.contains_key("memory_bytes"));
    }

    #[test]
    fn a_dir_on_its_parents_filesystem_is_not_sampled() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("out")).unwrap();
        let why = own_filesystem(d.path().join("out").to_str().unwrap()).unwrap_err();
        assert!(why.contains("not a filesystem of its own"), "{why}");
        let why = own_filesystem("/proc").unwrap_err();
        assert!(why.contains("not a tmpfs"), "procfs is a filesystem of its own, not the attempt's: {why}");
        if let Ok(fs) = nix::sys::statfs::statfs("/dev/shm")
            && fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC
        {
            assert!(own_filesystem("/dev/shm").is_ok());
        }
    }
}
