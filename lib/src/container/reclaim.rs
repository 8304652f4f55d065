//! Reclaim: remove what a worker left behind (its attempts and pool, by label), except this
//! process's attempts in flight (spared by attempt id), and never anything else.

use super::labels;
use super::site::ContainerSite;
use crate::contract::{ObjectKind, ReclaimError, ReclaimFailure, ReclaimReport};
use crate::engine::EngineError;
use futures_util::StreamExt;
use std::collections::{HashMap, HashSet};
use std::future::Future;

/// Removals in parallel at once.
const PARALLEL: usize = 8;

/// Runs `remove` on every id, [`PARALLEL`] at once; returns the ids removed and the failures.
async fn remove_each<F, Fut>(ids: Vec<String>, kind: ObjectKind, remove: F) -> (Vec<String>, Vec<ReclaimFailure>)
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
            Err(err) => failed.push(ReclaimFailure { kind, id, error: err.message() }),
        }
    }
    (removed, failed)
}

/// Whether an object is one of this process's attempts in flight.
fn in_flight_here(l: &HashMap<String, String>, incarnation: &str, in_flight: &HashSet<String>) -> bool {
    l.get(labels::INCARNATION).map(String::as_str) == Some(incarnation)
        && l.get(labels::ATTEMPT_ID).is_some_and(|a| in_flight.contains(a))
}

/// Removes what `worker`'s attempts not in flight put on record in the state dir
/// (`journal`), by name; a record is forgotten once everything it names is gone. Adds the
/// processes that made them to `gone`.
async fn recorded(
    shared: &ContainerSite,
    worker: &str,
    in_flight: &HashSet<String>,
    gone: &mut HashSet<String>,
    report: &mut ReclaimReport,
) {
    let api = &shared.engine.api;
    let records = match super::journal::recorded(worker) {
        Ok(r) => r,
        Err(e) => {
            let id = match &e {
                crate::hostdir::HostDirError::Untrusted { path, .. } => path.display().to_string(),
                _ => "the state dir".to_owned(),
            };
            report.failed.push(ReclaimFailure { kind: ObjectKind::Path, id, error: crate::util::error_chain(&e) });
            Vec::new()
        }
    };
    for (attempt, entry) in records {
        if in_flight.contains(&attempt) {
            continue;
        }
        gone.extend(entry.incarnation.clone());
        let mut left = 0;
        for c in &entry.containers {
            match api.remove_container(c).await {
                Ok(crate::engine::Removal::Removed) => report.containers_removed.push(c.clone()),
                Ok(crate::engine::Removal::ByOthers) => {}
                Err(e) => {
                    left += 1;
                    report.failed.push(ReclaimFailure {
                        kind: ObjectKind::Container,
                        id: c.clone(),
                        error: e.message(),
                    });
                }
            }
        }
        for v in &entry.volumes {
            // Counted as removed only when it was there to remove.
            let removed = match api.inspect_volume(v).await {
                Ok(None) => Ok(false),
                Ok(Some(_)) => api.remove_volume(v).await.map(|()| true),
                Err(e) => Err(e),
            };
            match removed {
                Ok(true) => report.volumes_removed.push(v.clone()),
                Ok(false) => {}
                Err(e) => {
                    left += 1;
                    report.failed.push(ReclaimFailure { kind: ObjectKind::Volume, id: v.clone(), error: e.message() });
                }
            }
        }
        if left == 0 {
            super::journal::forget(worker, &attempt);
        }
    }
}

/// Sweeps the engine (and the host capture area) for `worker`.
pub(crate) async fn reclaim(shared: &ContainerSite, worker: &str) -> Result<ReclaimReport, ReclaimError> {
    if !crate::contract::valid_worker_id(worker) {
        return Err(ReclaimError::WorkerId(worker.to_owned()));
    }
    let api = &shared.engine.api;
    let mut report = ReclaimReport { worker: worker.to_owned(), ..ReclaimReport::default() };
    let in_flight: HashSet<String> = shared.base.in_flight().clone();
    let mine = |l: &HashMap<String, String>| in_flight_here(l, &shared.base.incarnation, &in_flight);
    // The incarnations whose attempts are reclaimed: what they left of their tools goes too.
    let mut gone: HashSet<String> = HashSet::new();
    // First what the worker's attempts put on record: it needs no listing from the engine.
    recorded(shared, worker, &in_flight, &mut gone, &mut report).await;

    let containers = api
        .list_containers(labels::worker_filter(worker))
        .await
        .map_err(|source| ReclaimError::List { what: "containers", source })?;
    let mut targets = Vec::new();
    for c in containers.into_iter().filter(|c| labels::reclaimable_by(&c.labels, worker)) {
        if mine(&c.labels) {
            report.kept_in_flight.push(c.id);
        } else {
            gone.extend(c.labels.get(labels::INCARNATION).cloned());
            targets.push(c.id);
        }
    }
    let (removed, failed) =
        remove_each(targets, ObjectKind::Container, |id| async move { api.remove_container(&id).await.map(|_| ()) })
            .await;
    report.containers_removed.extend(removed);
    report.failed.extend(failed);

    let volumes = api
        .list_volumes(labels::worker_filter(worker))
        .await
        .map_err(|source| ReclaimError::List { what: "volumes", source })?;
    let mut targets = Vec::new();
    for v in volumes.into_iter().filter(|v| labels::reclaimable_by(&v.labels, worker)) {
        if mine(&v.labels) {
            report.kept_in_flight.push(v.name);
        } else {
            targets.push(v.name);
        }
    }
    let (removed, failed) =
        remove_each(targets, ObjectKind::Volume, |name| async move { api.remove_volume(&name).await }).await;
    report.volumes_removed.extend(removed);
    report.failed.extend(failed);
    // Their tools volumes, unless another of their containers still mounts one.
    let gone: Vec<&str> = gone.iter().map(String::as_str).collect();
    match super::tools::remove_of(&shared.engine, &gone, &shared.base.incarnation).await {
        Ok(names) => report.volumes_removed.extend(names),
        Err(e) => {
            report.failed.push(ReclaimFailure { kind: ObjectKind::Volume, id: "tools".into(), error: e.message() })
        }
    }

    crate::attempt::reclaim_captures(&shared.base, worker, &in_flight, &mut report);
    Ok(report)
}
