//! Removing an attempt's objects, whichever way the attempt ends: explicitly and awaited at
//! its end, or, if its future is dropped, by a `Drop` backstop that hands what is left to
//! the rung's tracked tasks (`close` waits for them) and never blocks or panics.

use super::journal::{Entry, Journal};
use super::site::ContainerSite;
use crate::attempt::{InFlight, Removed, Teardown};
use crate::contract::LaunchError;
use crate::engine::{EngineError, Removal};
use std::sync::Arc;

/// What must be removed when the attempt ends, whichever way it ends.
#[derive(Debug, Default)]
pub(crate) struct Leftovers {
    pub containers: Vec<String>,
    pub volumes: Vec<String>,
    /// Tracked tasks running calls that create objects; removal waits for them.
    pub creating: Vec<tokio::task::JoinHandle<()>>,
    /// The attempt's record in the state dir, kept as these lists change.
    pub journal: Option<std::sync::Arc<Journal>>,
}

impl Leftovers {
    /// Records a container the attempt is about to make (before the call that makes it).
    pub fn container(&mut self, name: impl Into<String>) {
        self.containers.push(name.into());
        self.record();
    }

    /// Records a volume the attempt is about to make.
    pub fn volume(&mut self, name: impl Into<String>) {
        self.volumes.push(name.into());
        self.record();
    }

    /// Writes the lists to the attempt's record.
    pub fn record(&self) {
        if let Some(j) = &self.journal {
            j.write(&Entry { containers: self.containers.clone(), volumes: self.volumes.clone(), incarnation: None });
        }
    }

    fn is_empty(&self) -> bool {
        self.containers.is_empty() && self.volumes.is_empty()
    }
}

/// Runs an engine call that creates an object on the rung's tracked tasks, so that it
/// completes even if the attempt's future is dropped meanwhile: a removal racing an
/// unfinished create would find nothing, and the object would appear afterwards and leak.
pub(crate) async fn creating<T: Send + 'static>(
    shared: &ContainerSite,
    left: &mut Leftovers,
    call: impl Future<Output = Result<T, EngineError>> + Send + 'static,
) -> Result<T, LaunchError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    left.creating.push(shared.base.tracker.spawn(async move {
        let _ = tx.send(call.await);
    }));
    match rx.await {
        Ok(r) => r.map_err(LaunchError::Engine),
        Err(_) => Err(LaunchError::Staging {
            what: "an engine call that creates an object was abandoned".into(),
            source: "task ended".into(),
        }),
    }
}

/// Like [`creating`], but the call starts now and is awaited later through the returned
/// receiver, so that other work overlaps it.
pub(crate) fn creating_later<T: Send + 'static>(
    shared: &ContainerSite,
    left: &mut Leftovers,
    call: impl Future<Output = Result<T, EngineError>> + Send + 'static,
) -> tokio::sync::oneshot::Receiver<Result<T, EngineError>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    left.creating.push(shared.base.tracker.spawn(async move {
        let _ = tx.send(call.await);
    }));
    rx
}

/// Awaits what [`creating_later`] started.
pub(crate) async fn created<T>(rx: tokio::sync::oneshot::Receiver<Result<T, EngineError>>) -> Result<T, LaunchError> {
    match rx.await {
        Ok(r) => r.map_err(LaunchError::Engine),
        Err(_) => Err(LaunchError::Staging {
            what: "an engine call that creates an object was abandoned".into(),
            source: "task ended".into(),
        }),
    }
}

/// Removes what `left` lists. Each object leaves the list only once its removal was tried,
/// so a removal interrupted by a dropped future leaves the rest to the backstop. What the
/// engine could not remove for a reason that may pass (no answer, a lost connection, its
/// own failure) goes back into `retry`.
async fn remove_all(shared: &ContainerSite, left: &mut Leftovers, retry: &mut Leftovers) -> Removed {
    for handle in std::mem::take(&mut left.creating) {
        let _ = handle.await;
    }
    let mut removed = Removed::default();
    let api = &shared.engine.api;
    // Containers first: a volume in use cannot be removed.
    while let Some(c) = left.containers.first() {
        match api.remove_container(c).await {
            Ok(Removal::Removed) => {}
            Ok(Removal::ByOthers) => removed.by_others.push(c.clone()),
            Err(err) => {
                removed.errors.push(format!("container {c}: {}", err.message()));
                if err.is_transient() {
                    retry.containers.push(c.clone());
                }
            }
        }
        left.containers.remove(0);
    }
    while let Some(v) = left.volumes.first() {
        if let Err(err) = api.remove_volume(v).await {
            removed.errors.push(format!("volume {v}: {}", err.message()));
            // A volume a container still holds goes once the container is gone.
            if err.is_transient() || !retry.containers.is_empty() {
                retry.volumes.push(v.clone());
            }
        }
        left.volumes.remove(0);
    }
    removed
}

/// How long the removal of what an attempt left is tried again while the process lives
/// (what is still left after it is `reclaim`'s, by its labels).
const RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(120);

/// Tries the removal of `left` again with backoff (1 s, doubling, at most a minute apart)
/// for [`RETRY_FOR`]; `entry` stays in flight until it ends.
async fn retry_removal(shared: Arc<ContainerSite>, mut left: Leftovers, entry: InFlight) {
    let until = std::time::Instant::now() + RETRY_FOR;
    let mut wait = std::time::Duration::from_secs(1);
    left.record();
    while !left.is_empty() {
        if std::time::Instant::now() + wait > until {
            tracing::warn!(attempt_id = %entry.id, ?left, "gave up removing; the worker's reclaim removes them by their labels");
            return;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(std::time::Duration::from_secs(60));
        let mut again = Leftovers { journal: left.journal.clone(), ..Leftovers::default() };
        let removed = remove_all(&shared, &mut left, &mut again).await;
        tracing::debug!(attempt_id = %entry.id, errors = ?removed.errors, "removal tried again");
        again.record();
        left = again;
    }
}

/// Removes the attempt's objects. Explicit cleanup awaits [`Cleanup::run`]; if the attempt's
/// future is dropped first, `Drop` hands the rest of the work to the rung's tracked tasks.
pub(crate) struct Cleanup {
    shared: Arc<ContainerSite>,
    /// `None` once removed, or handed to the backstop.
    entry: Option<InFlight>,
    pub left: Leftovers,
}

impl std::fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cleanup").field("entry", &self.entry).field("left", &self.left).finish()
    }
}

impl Cleanup {
    /// Marks `attempt_id` in flight (so this process's `reclaim` spares it) until removed,
    /// and keeps what it makes on record in `worker`'s state dir (`journal`).
    pub fn new(shared: Arc<ContainerSite>, attempt_id: String, worker: &str) -> Self {
        let journal = Journal::open(worker, &attempt_id, &shared.base.incarnation).map(std::sync::Arc::new);
        let entry = Some(shared.base.enter(attempt_id));
        Self { shared, entry, left: Leftovers { journal, ..Leftovers::default() } }
    }
}

impl Teardown for Cleanup {
    /// Removes everything now (also what `Teardown::run` does).
    async fn remove(mut self) -> Removed {
        let mut retry = Leftovers { journal: self.left.journal.clone(), ..Leftovers::default() };
        let mut removed = remove_all(&self.shared, &mut self.left, &mut retry).await;
        retry.record();
        // Only now: dropped halfway, `Drop` must still see what is left.
        let entry = self.entry.take();
        if let Some(entry) = entry.filter(|_| !(retry.containers.is_empty() && retry.volumes.is_empty())) {
            removed.errors.push("tried again in the background while this process lives".into());
            let retrying = retry_removal(self.shared.clone(), retry, entry);
            self.shared.base.backstop(retrying);
        }
        removed
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some(entry) = self.entry.take() else { return };
        let id = entry.id.clone();
        let shared = self.shared.clone();
        let mut left = std::mem::take(&mut self.left);
        let removal = async move {
            let mut retry = Leftovers { journal: left.journal.clone(), ..Leftovers::default() };
            let removed = remove_all(&shared, &mut left, &mut retry).await;
            retry.record();
            if !removed.errors.is_empty() {
                tracing::warn!(attempt_id = %entry.id, errors = ?removed.errors, "backstop cleanup left objects behind");
            }
            retry_removal(shared, retry, entry).await;
        };
        if !self.shared.base.backstop(removal) {
            tracing::warn!(attempt_id = %id, "attempt dropped without a runtime; reclaim will remove its objects");
        }
    }
}
