//! The container rung: each attempt in a fresh container on a Docker-API engine.
//!
//! Pure parts (tested without an engine): `config`, `sizes` (limits in the engine's terms),
//! `spec` (every container body: the attempt's, the staging helper's, the tools filler's,
//! the probe's), `labels`, `env`, `ledger`. Shared state: `site` (imports no sibling but
//! `config` and `sizes`). The attempt: this rung's `Launch` and `Site` (`attempt`):
//! `prepare`, `mounts` (the image's paths checked), `launch` (cold) or `pool` (warm), both
//! staging inputs through `stage`, then the shared attempt (`finish`, `cleanup`, `recover`);
//! `tools` (the init in the engine, and the rung's trust in it), `caches`, `reclaim`,
//! `backstop` (a rung dropped without `close`). `executor` is the rung's public face:
//! nothing imports it.

mod attempt;
mod backstop;
pub mod caches;
mod cleanup;
pub mod config;
mod executor;
mod finish;
mod journal;
pub use crate::labels;
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
mod stage;
#[cfg(test)]
mod tests;
pub(crate) mod tools;

pub use config::{CacheMount, ContainerConfig, Hardening, HostLoss, PullPolicy, SANDBOX_USER};
pub use executor::ContainerExecutor;
pub use pool::PoolConfig;
pub use site::PoolStats;
