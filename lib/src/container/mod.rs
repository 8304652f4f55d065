//! The container rung: each attempt in a fresh container on a Docker-API engine.
//!
//! Pure parts (tested without an engine): `config`, `labels`, `env`, `spec`. Parts that talk
//! to the engine or the host: `executor` (admission), the attempt's phases (`attempt`:
//! `prepare`, `launch`, supervision (`link::supervise`), `finish`, with `cleanup`), `tools` (the init in the
//! engine), `staging` (inputs), `reclaim`.

mod attempt;
pub mod caches;
mod cleanup;
pub mod config;
pub(crate) mod env;
mod executor;
mod finish;
pub mod labels;
mod launch;
mod ledger;
mod mounts;
mod pool;
mod prepare;
mod reclaim;
mod recover;
mod site;
mod sizes;
pub(crate) mod spec;
#[cfg(test)]
mod tests;
pub(crate) mod tools;

pub use config::{CacheMount, ContainerConfig, Hardening, HostLoss, PullPolicy, SANDBOX_USER};
pub use executor::ContainerExecutor;
pub use pool::PoolConfig;
