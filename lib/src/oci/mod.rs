//! The oci rung: each attempt a bundle run by the OCI runtime itself (`runc`, or any runtime
//! that speaks its command line), no daemon in the attempt's path (level `sandboxed`).
//!
//! Pure parts (unit-tested): `config`, `spec` (the sizes, `config.json` through `oci-spec`,
//! the evidence's enforcement, the host's AppArmor), `ledger`. On the host: `image` (each
//! image's root filesystem, exported from the local engine and unpacked beneath its root),
//! `cache` (where those trees live, bounded, pruned oldest-used first, an image an attempt
//! holds never removed), `provision` (the bundle, the inputs' private copy, `runtime run`
//! with the link on its stdio), `cleanup`, `reclaim`. The attempt: `attempt` (this rung's `Launch` and `Site`);
//! `prepare`; `site` holds what attempts share; `executor` is the rung's face, and nothing
//! imports it.
//!
//! `seccomp` resolves Docker's default profile, vendored as data, for the attempts.
//!
//! Handlers run by re-exec in the worker's image (`OciConfig::worker_image`), as on the
//! container rung (`engine::ImageFacts::argv`, shared).
//!
//! A restarted worker takes its attempts over (`recover`): the init's takeover socket is in the
//! bundle, handed to it as fd 3 through the runtime.
//!
//! Not built yet: the host's read of the cgroup for an end without a record (the runtime
//! destroys the cgroup as PID 1 ends; the witness has `runtime run`'s exit status only),
//! `/out` walked in place, layers from `docker save` or an OCI layout (whiteouts).

mod attempt;
mod cache;
mod cleanup;
pub mod config;
mod executor;
mod held;
pub mod image;
mod ledger;
mod prepare;
mod provision;
mod reclaim;
mod recover;
pub mod seccomp;
mod site;
mod spec;

pub use cache::Pruned;
pub use config::OciConfig;
pub use executor::{OciCensus, OciError, OciExecutor};
pub use image::ImageError;
pub use seccomp::SeccompError;
