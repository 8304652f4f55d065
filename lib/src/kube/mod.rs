//! The kube rung: each attempt in a fresh Pod on a Kubernetes cluster (1.20 and later), the
//! same init-backed attempt as the container and process rungs, over the API alone.
//!
//! One Pod per attempt: an init container of stevedore's init image copies the init into a
//! fresh `emptyDir` (and unpacks the inputs it is sent on its attached stdin into another);
//! the attempt's container, of any image, runs that init as PID 1, hardened (non-root,
//! read-only root filesystem, no capability, no privilege escalation, the runtime's seccomp
//! profile, no service-account token), with `/out` and `/tmp` as memory-backed `emptyDir`s of
//! their sizes. The host attaches to it and speaks the link (`docs/link.md`) over the attach;
//! a restarted worker takes over through `exec` of the relay. Nothing is read from the
//! kubelet's logs. What a Pod cannot do per attempt (a pids limit; a network denied, unless
//! the configuration says the namespace has a deny-all NetworkPolicy) is in the evidence's
//! `skipped`.
//!
//! Pure parts (tested without a cluster): `config`, `sizes`, `spec` (the Pod body), `names`
//! (labels fitted to Kubernetes' rules, Pod names, selectors), `state` (what a Pod's status
//! says). Shared state: `site`. The attempt: `prepare`, `launch`, then the shared `attempt`
//! through this rung's `Site` (`attempt`, `finish`, `cleanup`, `recover`), following Pods with
//! `watch`; `access` (what the credentials may do), `reclaim`, `census`. `executor` is the
//! rung's face: nothing imports it.

mod access;
mod admission;
mod attempt;
mod capacity;
mod census;
mod cleanup;
pub mod config;
mod error;
mod executor;
mod finish;
mod launch;
mod ledger;
mod names;
mod prepare;
mod reclaim;
mod recover;
mod site;
mod sizes;
mod spec;
mod state;
mod watch;

pub use census::{ClusterCensus, NodeFacts};
pub use config::{ImagePull, KubeConfig};
pub use error::ClusterError;
pub use executor::KubeExecutor;
pub use site::default_init_image;
