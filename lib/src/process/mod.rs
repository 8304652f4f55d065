//! The process rung: each attempt as a child process of the worker, supervised by
//! stevedore's init, under a dedicated uid when stevedore runs as root (level `process`).
//!
//! Pure or host-only parts: `config`, `dirs` (the rung's places on the host), `cgroup` (a
//! cgroup per attempt when one is delegated). The attempt: `attempt` (prepare, spawn,
//! supervise through `link`, judge), `recover`, `reclaim`, and `executor` (the rung).

mod attempt;
pub(crate) mod cgroup;
pub mod config;
pub mod dirs;
mod executor;
mod reclaim;
mod recover;
mod spawn;
pub mod uids;

pub use config::{DEFAULT_RUN_AS, Delegation, ProcessConfig};
pub use executor::{ProcessError, ProcessExecutor};
pub use uids::{DEFAULT_UIDS, UidError, UidRange};
