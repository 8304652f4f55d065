//! Reclaim: remove everything a worker left behind, except this process's attempts in flight.

use super::attempt::Shared;
use super::engine::EngineError;
use super::labels;
use crate::contract::{ReclaimError, ReclaimFailure, ReclaimReport};
use bollard::query_parameters::{ListContainersOptionsBuilder, ListVolumesOptionsBuilder};
use futures_util::StreamExt;
use std::future::Future;

/// Removals in parallel at once.
const PARALLEL: usize = 8;

/// Runs `remove` on every id, [`PARALLEL`] at once; returns the ids removed and the failures.
async fn remove_each<F, Fut>(ids: Vec<String>, kind: &str, remove: F) -> (Vec<String>, Vec<ReclaimFailure>)
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<(), EngineError>>,
{
    let results: Vec<(String, Result<(), EngineError>)> = futures_util::stream::iter(ids)
        .map(|id| {
            let fut = remove(id.clone());
            async move { (id, fut.await) }
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let mut removed = Vec::new();
    let mut failed = Vec::new();
    for (id, r) in results {
        match r {
            Ok(()) => removed.push(id),
            Err(err) => failed.push(ReclaimFailure { kind: kind.to_owned(), id, error: err.message() }),
        }
    }
    (removed, failed)
}

/// Sweeps the engine (and the host log area) for `worker`.
pub(crate) async fn reclaim(shared: &Shared, worker: &str) -> Result<ReclaimReport, ReclaimError> {
    if !crate::contract::valid_worker_id(worker) {
        return Err(ReclaimError::WorkerId(worker.to_owned()));
    }
    let e = &shared.engine;
    let mut report = ReclaimReport { worker: worker.to_owned(), ..ReclaimReport::default() };
    let in_flight: std::collections::HashSet<String> = shared.in_flight().clone();
    let mine = |l: &std::collections::HashMap<String, String>| {
        l.get(labels::INCARNATION).map(String::as_str) == Some(shared.incarnation.as_str())
            && l.get(labels::ATTEMPT_ID).is_some_and(|a| in_flight.contains(a))
    };

    let opts = ListContainersOptionsBuilder::default().all(true).filters(&labels::worker_filter(worker)).build();
    let containers = e
        .call("list containers", e.docker.list_containers(Some(opts)))
        .await
        .map_err(|err| ReclaimError::List { what: "containers", source: Box::new(err) })?;
    let mut targets = Vec::new();
    for c in containers {
        let l = c.labels.unwrap_or_default();
        let id = c.id.unwrap_or_default();
        if !labels::belongs_to(&l, worker) {
            continue;
        }
        if mine(&l) {
            report.kept_in_flight.push(id);
        } else {
            targets.push(id);
        }
    }
    let (removed, failed) =
        remove_each(targets, "container", |id| async move { e.remove_container(&id).await.map(|_| ()) }).await;
    report.containers_removed = removed;
    report.failed.extend(failed);

    let opts = ListVolumesOptionsBuilder::default().filters(&labels::worker_filter(worker)).build();
    let volumes = e
        .call("list volumes", e.docker.list_volumes(Some(opts)))
        .await
        .map_err(|err| ReclaimError::List { what: "volumes", source: Box::new(err) })?;
    let mut targets = Vec::new();
    for v in volumes.volumes.unwrap_or_default() {
        if !labels::belongs_to(&v.labels, worker) {
            continue;
        }
        if mine(&v.labels) {
            report.kept_in_flight.push(v.name);
        } else {
            targets.push(v.name);
        }
    }
    let (removed, failed) = remove_each(targets, "volume", |name| async move { e.remove_volume(&name).await }).await;
    report.volumes_removed = removed;
    report.failed.extend(failed);

    // Log captures of attempts that are not in flight.
    let dir = shared.config.log_dir.join(worker);
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for ent in entries.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            if in_flight.iter().any(|a| name.contains(a.as_str())) {
                continue;
            }
            match std::fs::remove_file(ent.path()) {
                Ok(()) => report.paths_removed.push(ent.path().display().to_string()),
                Err(err) => report.failed.push(ReclaimFailure {
                    kind: "path".into(),
                    id: ent.path().display().to_string(),
                    error: err.to_string(),
                }),
            }
        }
    }
    Ok(report)
}
