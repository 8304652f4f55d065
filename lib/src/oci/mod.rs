//! The oci rung: each attempt a bundle run by the OCI runtime itself (`runc`, or any runtime
//! that speaks its command line), no daemon in the attempt's path (level `sandboxed`).
//!
//! Pure parts (unit-tested): `config`, `spec` (the sizes, `config.json` through `oci-spec`,
//! the evidence's enforcement), `ledger`. On the host: `image` (each image's root filesystem,
//! exported from the local engine and unpacked once per image id into the rung's private
//! cache), `provision` (the bundle, the inputs' private copy, `runtime run` with the link on
//! its stdio), `cleanup`, `reclaim`. The attempt: `attempt` (this rung's `Launch` and `Site`);
//! `prepare`; `site` holds what attempts share; `executor` is the rung's face, and nothing
//! imports it.
//!
//! `seccomp` resolves Docker's default profile, vendored as data, for the attempts.
//!
//! Not built yet: AppArmor, recovery after a worker restart, the host's read of the cgroup
//! for an end without a record (the runtime destroys the cgroup as PID 1 ends; the witness
//! has `runtime run`'s exit status only), handlers, `/out` walked in place, a bounded and
//! pruned image cache, layers from `docker save` or an OCI layout (whiteouts).

mod attempt;
mod cleanup;
pub mod config;
mod executor;
pub mod image;
mod ledger;
mod prepare;
mod provision;
mod reclaim;
pub mod seccomp;
mod site;
mod spec;

pub use config::OciConfig;
pub use executor::{OciCensus, OciError, OciExecutor};
pub use image::ImageError;
pub use seccomp::SeccompError;
