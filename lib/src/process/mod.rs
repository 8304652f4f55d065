//! The process rung: each attempt as a child process of the worker, supervised by
//! stevedore's init, under a dedicated uid when stevedore runs as root (level `process`).
//!
//! Pure parts (unit-tested): `config`, `prepare` (argv, limits, uid, environment),
//! `enforcement` (what the evidence says is enforced), `ledger`. On the host: `dirs` (the
//! rung's places), `cgroup` (one per attempt when delegated), `uids` (leases), `tree` (the
//! init's process tree), `spawn`, `provision`, `cleanup`. The attempt: `attempt` (this
//! rung's `attempt::Site`), `recover`, `reclaim`; `site` holds what attempts share;
//! `executor` is the rung's face, and nothing imports it.

mod attempt;
pub(crate) mod cgroup;
mod cleanup;
pub mod config;
pub mod dirs;
mod enforcement;
mod executor;
mod ledger;
mod prepare;
mod provision;
mod reclaim;
mod recover;
mod site;
mod spawn;
mod tree;
pub mod uids;

pub use config::{DEFAULT_RUN_AS, Delegation, ProcessConfig};
pub use executor::{ProcessError, ProcessExecutor};
pub use uids::{DEFAULT_UIDS, UidError, UidRange};
