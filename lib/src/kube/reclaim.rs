//! Reclaim: delete what a worker left behind in the namespace (its attempts' Pods, found by
//! label and checked by annotation), except this process's attempts in flight, and never
//! anything else: another worker's Pod, an unlabelled one, one of another kind.

use super::names;
use super::site::KubeSite;
use crate::contract::{ObjectKind, ReclaimError, ReclaimFailure, ReclaimReport, valid_worker_id};
use crate::labels;
use futures_util::StreamExt;
use kube::api::ListParams;
use std::collections::BTreeMap;

/// Removals in parallel at once.
const PARALLEL: usize = 8;

pub(crate) async fn reclaim(site: &KubeSite, worker: &str) -> Result<ReclaimReport, ReclaimError> {
    if !valid_worker_id(worker) {
        return Err(ReclaimError::WorkerId(worker.to_owned()));
    }
    let mut report = ReclaimReport { worker: worker.to_owned(), ..ReclaimReport::default() };
    let lp = ListParams::default().labels(&names::worker_selector(worker));
    let pods = site.call(format!("listing the Pods of worker {worker}"), site.pods.list(&lp)).await?;
    // Taken after the list: an attempt of this process that began meanwhile is spared too.
    let in_flight = site.base.in_flight().clone();
    crate::attempt::reclaim_captures(&site.base, worker, &in_flight, &mut report);
    let empty = BTreeMap::new();
    let mut doomed = Vec::new();
    for pod in pods.items {
        let meta = &pod.metadata;
        let (Some(name), l, a) =
            (meta.name.clone(), meta.labels.as_ref().unwrap_or(&empty), meta.annotations.as_ref().unwrap_or(&empty))
        else {
            continue;
        };
        if !names::is_of_worker(l, a, worker) {
            continue;
        }
        let ours = l.get(labels::INCARNATION) == Some(&names::fit(&site.base.incarnation));
        if ours && l.get(labels::ATTEMPT_ID).is_some_and(|id| in_flight.contains(id)) {
            report.kept_in_flight.push(format!("{}/{name}", site.namespace));
            continue;
        }
        doomed.push(name);
    }
    let results: Vec<(String, Result<bool, super::ClusterError>)> = futures_util::stream::iter(doomed)
        .map(|name| async move {
            let r = super::cleanup::remove_pod(site, &name, &mut false).await;
            (name, r)
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    for (name, r) in results {
        let id = format!("{}/{name}", site.namespace);
        match r {
            Ok(true) => report.pods_removed.push(id),
            Ok(false) => {}
            Err(e) => {
                report.failed.push(ReclaimFailure { kind: ObjectKind::Pod, id, error: crate::util::error_chain(&e) })
            }
        }
    }
    report.pods_removed.sort();
    Ok(report)
}
