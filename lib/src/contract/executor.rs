//! The trait every rung implements.

use super::{Checkpoint, HookSet, LaunchError, Level, Outcome, RecoverError, Request};
use crate::util::BoxFuture;
use tokio_util::sync::CancellationToken;

/// What `reclaim` removed and what it could not.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReclaimReport {
    /// The worker swept.
    pub worker: String,
    /// Containers removed.
    pub containers_removed: Vec<String>,
    /// Volumes removed.
    pub volumes_removed: Vec<String>,
    /// Pods removed (the kube rung), as `namespace/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods_removed: Vec<String>,
    /// Host-side areas removed.
    pub paths_removed: Vec<String>,
    /// Objects kept because they belong to this process's attempts in flight.
    pub kept_in_flight: Vec<String>,
    /// Objects that could not be removed, with why.
    pub failed: Vec<ReclaimFailure>,
}

/// What kind of object a reclaim touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ObjectKind {
    /// An engine container.
    Container,
    /// An engine volume.
    Volume,
    /// A host path (a capture file).
    Path,
    /// An engine image.
    Image,
    /// A Pod (the kube rung).
    Pod,
}

/// One object `reclaim` could not remove.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReclaimFailure {
    /// What it is.
    pub kind: ObjectKind,
    /// Its ID or path.
    pub id: String,
    /// Why.
    pub error: String,
}

/// Why `reclaim` could not sweep at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReclaimError {
    /// the worker id is invalid
    #[error("invalid worker id {0:?}")]
    WorkerId(String),
    /// the engine could not be listed
    #[cfg(feature = "docker")]
    #[error("listing {what} failed")]
    List {
        /// What was listed.
        what: &'static str,
        /// The cause.
        #[source]
        source: crate::engine::EngineError,
    },
    /// the cluster could not be listed or asked (the kube rung's `ClusterError`)
    #[cfg(feature = "kube")]
    #[error(transparent)]
    Cluster(crate::util::Cause),
}

/// One rung of the isolation ladder.
pub trait Executor: Send + Sync + std::fmt::Debug {
    /// Identifies the rung in configuration, logs and metrics.
    fn name(&self) -> &str;

    /// The isolation this rung actually provides: a `vm` claim (a VM-grade runtime's name)
    /// counts only once an attempt showed it (the kernel its init saw was not the host's),
    /// `sandboxed` until then. The registry selects by it.
    fn level(&self) -> Level;

    /// Shows the rung's level now, when it claims `vm`: one attempt in `image` (any image the
    /// rung can run; the command is stevedore's init, bound in as in every attempt); then
    /// [`Executor::level`]. Call it before registering a VM-grade rung (`stevedore census`
    /// does). Default: [`Executor::level`], nothing run.
    fn probe_level<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<Level, LaunchError>> {
        let _ = image;
        Box::pin(async move { Ok(self.level()) })
    }

    /// Whether the rung's attempts have no network (a policy with `no_network` selects only
    /// such rungs). Default `false`: a rung claims it only when it enforces it.
    fn denies_network(&self) -> bool {
        false
    }

    /// What the rung applies to every attempt, by the names of
    /// [`crate::contract::ENFORCEABLE`] (its census): a policy's `require_enforced`
    /// selects only rungs that name all it requires, and each attempt is checked again against
    /// what its rung read back it applied. Default: nothing.
    fn enforces(&self) -> Vec<&'static str> {
        Vec::new()
    }

    /// Runs one attempt. `Err` only when the attempt never ran; a handler that ran and
    /// failed is an `Ok(Outcome)` with a non-`ok` status.
    ///
    /// # Cancellation safety
    /// Cancelling `cancel` stops the attempt as the contract says (SIGTERM, grace, SIGKILL)
    /// and returns its outcome. Dropping the future instead abandons the outcome, never the
    /// cleanup: whatever the attempt created is removed by the rung's own tasks, which
    /// `close` waits for.
    fn run<'a>(
        &'a self,
        request: &'a Request,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<Outcome, LaunchError>>;

    /// Removes what `worker_id` leaked across a restart, except this process's own
    /// attempts in flight. Called once at startup; a failure is reported, not fatal.
    fn reclaim<'a>(&'a self, worker_id: &'a str) -> BoxFuture<'a, Result<ReclaimReport, ReclaimError>>;

    /// Refuses new attempts, waits for the ones in flight, releases the rung's resources.
    fn close(&self) -> BoxFuture<'_, ()>;

    /// Takes over an attempt a previous life of this worker started, from its checkpoint
    /// (see [`crate::Hooks::checkpoint`]), and finishes it: if it is still running, it is
    /// supervised to its end; if it ended while the worker was away, its authenticated
    /// record and outputs are collected. Either way the Outcome says `evidence.recovered`.
    /// What cannot be recovered is removed. Call it before [`Executor::reclaim`], which
    /// spares only attempts in flight.
    fn recover<'a>(
        &'a self,
        checkpoint: &'a Checkpoint,
        hooks: Option<HookSet>,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<Outcome, RecoverError>> {
        let _ = (checkpoint, hooks, cancel);
        Box::pin(async move { Err(RecoverError::Unsupported(self.name().to_owned())) })
    }
}
