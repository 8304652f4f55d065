//! Reclaim: remove everything a worker left behind, except this process's attempts in flight.

use super::attempt::Shared;
use super::labels;
use crate::contract::{ReclaimError, ReclaimFailure, ReclaimReport};
use bollard::query_parameters::{
    ListContainersOptionsBuilder, ListVolumesOptionsBuilder, RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder,
};
use futures_util::StreamExt;

/// Removals in parallel at once.
const PARALLEL: usize = 8;

/// Sweeps the engine (and the host log area) for `worker`.
pub(crate) async fn reclaim(shared: &Shared, worker: &str) -> Result<ReclaimReport, ReclaimError> {
    if !crate::contract::valid_worker_id(worker) {
        return Err(ReclaimError::WorkerId(worker.to_owned()));
    }
    let e = &shared.engine;
    let mut report = ReclaimReport { worker: worker.to_owned(), ..ReclaimReport::default() };
    let in_flight: std::collections::HashSet<String> = shared.in_flight.lock().expect("in-flight set").clone();
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
    let results: Vec<(String, Result<(), String>)> = futures_util::stream::iter(targets)
        .map(|id| async move {
            let opts = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
            let r = e.call("remove container", e.docker.remove_container(&id, Some(opts))).await;
            let r = match r {
                Ok(()) => Ok(()),
                Err(err) if err.is_not_found() => Ok(()),
                Err(err) => Err(err.message()),
            };
            (id, r)
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    for (id, r) in results {
        match r {
            Ok(()) => report.containers_removed.push(id),
            Err(error) => report.failed.push(ReclaimFailure { kind: "container".into(), id, error }),
        }
    }

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
    let results: Vec<(String, Result<(), String>)> = futures_util::stream::iter(targets)
        .map(|name| async move {
            let opts = RemoveVolumeOptionsBuilder::default().force(true).build();
            let r = match e.call("remove volume", e.docker.remove_volume(&name, Some(opts))).await {
                Ok(()) => Ok(()),
                Err(err) if err.is_not_found() => Ok(()),
                Err(err) => Err(err.message()),
            };
            (name, r)
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    for (name, r) in results {
        match r {
            Ok(()) => report.volumes_removed.push(name),
            Err(error) => report.failed.push(ReclaimFailure { kind: "volume".into(), id: name, error }),
        }
    }

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
