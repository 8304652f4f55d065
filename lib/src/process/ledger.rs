//! What the process rung knows of one attempt that must outlive the worker process
//! (`attempt::Ledger::own`): where its init and dirs are, so that a restarted worker can
//! finish the attempt (`recover`) or remove it (`reclaim`).

use super::cgroup::Cgroup;
use super::dirs::AttemptDir;
use serde::{Deserialize, Serialize};

/// One attempt's places and process, decided before its command starts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Own {
    pub dir: AttemptDir,
    pub cgroup: Option<Cgroup>,
    pub init_pid: i32,
    pub start_ticks: u64,
    pub memory: Option<u64>,
    pub cpu_millis: Option<u64>,
    /// The uid the command runs as, when not the worker's (its lease is taken over with the
    /// attempt).
    pub uid: Option<u32>,
}
