//! A cgroup per attempt, when one can be had: made before the command starts, the init
//! moved into it (so everything the command starts is in it too), limits written, counters
//! read by the host once everything in it is gone, then removed. Both hierarchies: v1 (a
//! dir per controller) and v2 (one dir).

use super::config::Delegation;
use crate::contract::Limits;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use stevedore_init::cgroup as counters;
use stevedore_init::wire::CgroupCounters;

const ROOT: &str = "/sys/fs/cgroup";
/// The group stevedore makes its attempts' cgroups in.
const PARENT: &str = "stevedore-process";

/// One attempt's cgroup.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cgroup {
    /// v1: one dir per controller.
    V1 {
        /// `memory/<...>`.
        memory: PathBuf,
        /// `cpu/<...>` (with cpuacct when co-mounted).
        cpu: PathBuf,
        /// `cpuacct/<...>`.
        cpuacct: PathBuf,
        /// `pids/<...>`.
        pids: PathBuf,
    },
    /// v2: one dir.
    V2(PathBuf),
}

/// Makes the cgroup `name` as `how` says, with `limits`. `Ok(None)` when there is no
/// delegation; `Err` says why one could not be made (the attempt then runs without).
pub fn create(how: &Delegation, name: &str, limits: Limits) -> Result<Option<Cgroup>, String> {
    let cg = match how {
        Delegation::None => return Ok(None),
        Delegation::Auto => match stevedore_init::cgroup::detect(Path::new(ROOT)) {
            Some(counters::Version::V2) => make_v2(&Path::new(ROOT).join(PARENT), name)?,
            Some(counters::Version::V1) => make_v1(name)?,
            None => return Err(format!("no cgroup filesystem at {ROOT}")),
        },
        Delegation::V2(base) => make_v2(base, name)?,
        #[expect(unreachable_patterns, reason = "non_exhaustive")]
        _ => return Ok(None),
    };
    if let Err(e) = cg.write_limits(limits) {
        cg.remove();
        return Err(e);
    }
    Ok(Some(cg))
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), String> {
    fs::write(dir.join(file), value).map_err(|e| format!("writing {value:?} to {}: {e}", dir.join(file).display()))
}

fn mkdir(p: &Path) -> Result<(), String> {
    match fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("mkdir {}: {e}", p.display())),
    }
}

fn make_v2(base: &Path, name: &str) -> Result<Cgroup, String> {
    mkdir(base)?;
    // The parent holds no process of its own, so it may hand its controllers down.
    let available =
        fs::read_to_string(base.join("cgroup.controllers")).map_err(|e| format!("{}: {e}", base.display()))?;
    let want: Vec<&str> =
        ["memory", "cpu", "pids"].into_iter().filter(|c| available.split_whitespace().any(|a| a == *c)).collect();
    if !want.is_empty() {
        let line = want.iter().map(|c| format!("+{c}")).collect::<Vec<_>>().join(" ");
        write(base, "cgroup.subtree_control", &line)?;
    }
    let dir = base.join(name);
    mkdir(&dir)?;
    Ok(Cgroup::V2(dir))
}

fn make_v1(name: &str) -> Result<Cgroup, String> {
    let root = Path::new(ROOT);
    let hierarchy = |c: &str| -> Result<PathBuf, String> {
        let candidates = [c.to_owned(), "cpu,cpuacct".to_owned()];
        let h = candidates.iter().map(|c| root.join(c)).find(|p| p.is_dir()).ok_or(format!("no v1 {c} hierarchy"))?;
        let parent = h.join(PARENT);
        mkdir(&parent)?;
        let dir = parent.join(name);
        mkdir(&dir)?;
        Ok(dir)
    };
    let memory = hierarchy("memory")?;
    let cpu = hierarchy("cpu")?;
    let cpuacct = hierarchy("cpuacct")?;
    let pids = hierarchy("pids")?;
    Ok(Cgroup::V1 { memory, cpu, cpuacct, pids })
}

impl Cgroup {
    fn dirs(&self) -> Vec<&Path> {
        match self {
            Cgroup::V1 { memory, cpu, cpuacct, pids } => {
                let mut d = vec![memory.as_path(), cpu.as_path(), cpuacct.as_path(), pids.as_path()];
                d.dedup();
                d
            }
            Cgroup::V2(dir) => vec![dir.as_path()],
        }
    }

    fn write_limits(&self, l: Limits) -> Result<(), String> {
        match self {
            Cgroup::V1 { memory, cpu, pids, .. } => {
                if let Some(m) = l.memory_bytes {
                    write(memory, "memory.limit_in_bytes", &m.to_string())?;
                    // No swap beyond the limit, as the container rung does; absent without swap accounting.
                    if memory.join("memory.memsw.limit_in_bytes").exists() {
                        write(memory, "memory.memsw.limit_in_bytes", &m.to_string())?;
                    }
                }
                if let Some(c) = l.cpu_millis {
                    write(cpu, "cpu.cfs_period_us", "100000")?;
                    write(cpu, "cpu.cfs_quota_us", &(c * 100).to_string())?;
                }
                if let Some(p) = l.pids {
                    write(pids, "pids.max", &p.to_string())?;
                }
            }
            Cgroup::V2(dir) => {
                if let Some(m) = l.memory_bytes {
                    write(dir, "memory.max", &m.to_string())?;
                    if dir.join("memory.swap.max").exists() {
                        write(dir, "memory.swap.max", "0")?;
                    }
                }
                if let Some(c) = l.cpu_millis {
                    write(dir, "cpu.max", &format!("{} 100000", c * 100))?;
                }
                if let Some(p) = l.pids {
                    write(dir, "pids.max", &p.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// Moves `pid` (the init, before its command starts) into the cgroup.
    pub fn enter(&self, pid: u32) -> Result<(), String> {
        for d in self.dirs() {
            write(d, "cgroup.procs", &pid.to_string())?;
        }
        Ok(())
    }

    /// The processes in it now.
    pub fn procs(&self) -> Vec<i32> {
        let mut all: Vec<i32> = self
            .dirs()
            .iter()
            .filter_map(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect::<Vec<i32>>())
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Where the init samples it for the timeline.
    pub fn sampled(&self) -> stevedore_init::wire::SampledCgroup {
        let s = |p: &Path| Some(p.display().to_string());
        match self {
            Cgroup::V1 { memory, cpuacct, pids, .. } => {
                stevedore_init::wire::SampledCgroup::V1 { memory: s(memory), cpuacct: s(cpuacct), pids: s(pids) }
            }
            Cgroup::V2(dir) => stevedore_init::wire::SampledCgroup::V2(dir.display().to_string()),
        }
    }

    /// The counters, once nothing runs in it.
    pub fn read(&self) -> CgroupCounters {
        match self {
            Cgroup::V1 { memory, cpuacct, .. } => counters::read_v1_dirs(memory, cpuacct),
            Cgroup::V2(dir) => counters::read_counters(dir),
        }
    }

    /// SIGKILLs everything in it.
    pub fn kill_all(&self) {
        for pid in self.procs() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }

    /// Removes it (killing what is left in it first).
    pub fn remove(&self) -> Vec<String> {
        let mut errors = Vec::new();
        self.kill_all();
        for d in self.dirs() {
            if let Err(e) = fs::remove_dir(d)
                && e.kind() != io::ErrorKind::NotFound
            {
                errors.push(format!("cgroup {}: {e}", d.display()));
            }
        }
        errors
    }

    /// What it enforces, for the evidence.
    pub fn describe(&self) -> String {
        match self {
            Cgroup::V1 { memory, .. } => format!("cgroup v1 {}", memory.display()),
            Cgroup::V2(dir) => format!("cgroup v2 {}", dir.display()),
        }
    }
}
