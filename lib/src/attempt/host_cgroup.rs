//! The host's read of a sandbox's cgroup, for a sandbox that shows its init none (gVisor's:
//! its `/sys/fs/cgroup` is empty inside), while the init waits for its ack: every process of
//! the attempt but the init is gone, and the runtime removes the cgroup with the sandbox.

use std::path::{Path, PathBuf};
use stevedore_init::cgroup::{self, Version};
use stevedore_init::wire::CgroupCounters;

const ROOT: &str = "/sys/fs/cgroup";

/// The counters of the first of `candidates` (paths below each hierarchy's root, e.g.
/// `docker/<id>`) that exists on this machine: on cgroup v1 its `memory` and `cpuacct`
/// hierarchies, on v2 the unified one.
pub(crate) fn read(candidates: &[PathBuf]) -> Option<CgroupCounters> {
    let root = Path::new(ROOT);
    match cgroup::detect(root)? {
        Version::V2 => candidates.iter().map(|c| root.join(c)).find(|d| d.is_dir()).map(|d| cgroup::read_counters(&d)),
        Version::V1 => candidates.iter().find_map(|c| {
            let memory = Some(root.join("memory").join(c)).filter(|d| d.is_dir())?;
            let cpuacct = ["cpuacct", "cpu,cpuacct"].map(|h| root.join(h).join(c)).into_iter().find(|d| d.is_dir())?;
            Some(cgroup::read_v1_dirs(&memory, &cpuacct))
        }),
    }
}
