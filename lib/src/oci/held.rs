//! The cgroup the rung holds above a runtime that removes its own with the sandbox (gVisor's
//! `runsc`). Under such a runtime nothing of the attempt's cgroup outlives the sandbox, and
//! the kernel counts an OOM kill in the victim's cgroup (cgroup v1 does not carry it up): a
//! Sentry OOM-killed whole would leave no record and no counter, told as a plain SIGKILL.
//!
//! So the rung makes `stevedore-oci/<id>` itself, writes the memory limit there (the runtime's
//! own cgroup, `<id>/sandbox`, gets none), and keeps the witness: on v1 an eventfd registered
//! on the held cgroup's `memory.oom_control`, which the kernel signals for an OOM of that
//! cgroup (the limit is here, so the OOM is here too); on v2 `memory.events`, which counts
//! its descendants' kills. Its peak memory and CPU (both hierarchical) are read once the
//! sandbox ended, then the rung removes it (`cleanup::cgroup_dirs`).

use super::spec::CGROUP_PARENT;
use nix::sys::eventfd::{EfdFlags, EventFd};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use stevedore_init::cgroup::{self, Version};
use stevedore_init::wire::CgroupCounters;

/// The runtime's own cgroup below the held one (`cgroupsPath` is `/<PARENT>/<id>/<LEAF>`).
pub(crate) const LEAF: &str = "sandbox";

const ROOT: &str = "/sys/fs/cgroup";

/// One attempt's held cgroup.
#[derive(Debug)]
pub(crate) enum Held {
    /// v1: the memory and cpuacct hierarchies' dirs, and the OOM eventfd.
    V1 { memory: PathBuf, cpuacct: PathBuf, oom: EventFd },
    /// v2: the one dir.
    V2(PathBuf),
}

fn mkdir(p: &Path) -> Result<(), String> {
    match std::fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("mkdir {}: {e}", p.display())),
    }
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), String> {
    std::fs::write(dir.join(file), value).map_err(|e| format!("writing {value:?} to {}: {e}", dir.join(file).display()))
}

impl Held {
    /// Makes the held cgroup of attempt `id` with `memory` (bytes, swap off) as its limit.
    /// On an error what was made is in `cleanup::cgroup_dirs(id)`, removed with the attempt.
    pub fn make(id: &str, memory: u64) -> Result<Self, String> {
        let root = Path::new(ROOT);
        match cgroup::detect(root) {
            Some(Version::V1) => {
                let dir = |h: &str| -> Result<PathBuf, String> {
                    let parent = root.join(h).join(CGROUP_PARENT);
                    mkdir(&parent)?;
                    let dir = parent.join(id);
                    mkdir(&dir)?;
                    Ok(dir)
                };
                let memory_dir = dir("memory")?;
                // Without hierarchy (kernels before 5.11 could have it off) the limit here
                // would not hold the runtime's cgroup below: on, while it has no child yet.
                let hierarchy = std::fs::read_to_string(memory_dir.join("memory.use_hierarchy")).unwrap_or_default();
                if hierarchy.trim() == "0" {
                    write(&memory_dir, "memory.use_hierarchy", "1")?;
                }
                write(&memory_dir, "memory.limit_in_bytes", &memory.to_string())?;
                if memory_dir.join("memory.memsw.limit_in_bytes").exists() {
                    write(&memory_dir, "memory.memsw.limit_in_bytes", &memory.to_string())?;
                }
                let cpuacct = match ["cpuacct", "cpu,cpuacct"].into_iter().find(|h| root.join(h).is_dir()) {
                    Some(h) => dir(h)?,
                    None => return Err("no v1 cpuacct hierarchy".into()),
                };
                let oom = oom_eventfd(&memory_dir)?;
                Ok(Held::V1 { memory: memory_dir, cpuacct, oom })
            }
            Some(Version::V2) => {
                let parent = root.join(CGROUP_PARENT);
                mkdir(&parent)?;
                // Neither holds a process: both may hand their controllers down (those the
                // parent has; memory it must).
                let available = std::fs::read_to_string(parent.join("cgroup.controllers"))
                    .map_err(|e| format!("{}: {e}", parent.display()))?;
                let controllers = ["memory", "cpu", "pids"]
                    .into_iter()
                    .filter(|c| available.split_whitespace().any(|a| a == *c))
                    .map(|c| format!("+{c}"))
                    .collect::<Vec<_>>()
                    .join(" ");
                if !controllers.contains("+memory") {
                    return Err(format!("no memory controller in {}", parent.display()));
                }
                write(&parent, "cgroup.subtree_control", &controllers)?;
                let dir = parent.join(id);
                mkdir(&dir)?;
                write(&dir, "memory.max", &memory.to_string())?;
                if dir.join("memory.swap.max").exists() {
                    write(&dir, "memory.swap.max", "0")?;
                }
                write(&dir, "cgroup.subtree_control", &controllers)?;
                Ok(Held::V2(dir))
            }
            None => Err(format!("no cgroup filesystem at {ROOT}")),
        }
    }

    /// Its counters, once everything in it ended: peak memory and CPU as the kernel kept them
    /// for the whole subtree; the OOM kills as the held cgroup's witness saw them (v1: the
    /// OOMs the eventfd was signalled for; each ends in a kill unless the kernel found no
    /// victim).
    pub fn counters(&self) -> CgroupCounters {
        match self {
            Held::V1 { memory, cpuacct, oom } => {
                let mut c = cgroup::read_v1_dirs(memory, cpuacct);
                match oom_events(oom) {
                    Ok(n) => {
                        c.oom_kills = Some(n);
                        c.missing.remove(cgroup::KEY_OOM_KILLS);
                    }
                    Err(e) => {
                        c.oom_kills = None;
                        c.missing.insert(cgroup::KEY_OOM_KILLS.into(), format!("the OOM eventfd: {e}"));
                    }
                }
                c
            }
            Held::V2(dir) => cgroup::read_counters(dir),
        }
    }
}

/// An eventfd the kernel signals for every OOM of the memory cgroup `dir` (v1's
/// `cgroup.event_control` on `memory.oom_control`); nonblocking, read once at the end.
fn oom_eventfd(dir: &Path) -> Result<EventFd, String> {
    let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
        .map_err(|e| format!("eventfd: {e}"))?;
    let control = std::fs::File::open(dir.join("memory.oom_control"))
        .map_err(|e| format!("{}: {e}", dir.join("memory.oom_control").display()))?;
    // The kernel keeps its own reference to both files once registered.
    write(dir, "cgroup.event_control", &format!("{} {}", efd.as_raw_fd(), control.as_raw_fd()))?;
    Ok(efd)
}

/// The eventfd's count (0 when it was never signalled).
fn oom_events(efd: &EventFd) -> nix::Result<u64> {
    match efd.read() {
        Err(nix::errno::Errno::EAGAIN) => Ok(0),
        other => other,
    }
}
