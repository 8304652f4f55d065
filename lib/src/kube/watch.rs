//! Waiting for a Pod to reach a state: read it once, then follow the API's watch from that
//! version, so no change between the read and the watch is missed and no poll is needed.
//! A watch the server ends (its timeout, a compaction) is opened again from a fresh read.

use super::error::ClusterError;
use super::site::KubeSite;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{WatchEvent, WatchParams};
use std::time::{Duration, Instant};

/// How long a watch that brought nothing is left before the next one.
const EMPTY_WATCH_PAUSE: Duration = Duration::from_millis(500);

/// What a look at the Pod decided.
pub(crate) enum Look<T> {
    /// Keep waiting; the words say what for (the timeout's message).
    Wait(String),
    /// Done.
    Done(T),
}

/// Waits until `look` is done with the Pod (`None`: it is gone), or `within` passes: then
/// `ClusterError::StartTimeout` with what it was last waiting for.
pub(crate) async fn until<T>(
    site: &KubeSite,
    name: &str,
    within: Duration,
    mut look: impl FnMut(Option<&Pod>) -> Look<T>,
) -> Result<T, ClusterError> {
    let start = Instant::now();
    let mut waiting;
    let timeout = |waiting: String| ClusterError::StartTimeout { waited: within, state: waiting };
    loop {
        // The Pod is always looked at once, however little time is left.
        let pod = site.get_pod(name).await?;
        let version = match &pod {
            Some(p) => p.metadata.resource_version.clone().unwrap_or_default(),
            None => String::new(),
        };
        match look(pod.as_ref()) {
            Look::Done(v) => return Ok(v),
            Look::Wait(w) => waiting = w,
        }
        if pod.is_none() {
            // Gone, and `look` waits on: nothing will change.
            return Err(timeout(waiting));
        }
        let left = within.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(timeout(waiting));
        }
        let secs = u32::try_from(left.as_secs().clamp(1, 290)).unwrap_or(290);
        let wp = WatchParams::default().fields(&format!("metadata.name={name}")).timeout(secs);
        let stream = match site.call(format!("watching Pod {name}"), site.pods.watch(&wp, &version)).await {
            Ok(s) => s,
            Err(e) if e.is_unreachable() => {
                tokio::time::sleep(EMPTY_WATCH_PAUSE.min(left)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut stream = std::pin::pin!(stream);
        let mut events = 0u32;
        let followed = tokio::time::timeout(left, async {
            while let Some(event) = stream.next().await {
                let seen = match event {
                    Ok(WatchEvent::Added(p) | WatchEvent::Modified(p)) => Some(p),
                    Ok(WatchEvent::Deleted(_)) => None,
                    // A bookmark says nothing of the Pod; an error (410 Gone) ends this watch.
                    Ok(WatchEvent::Bookmark(_)) => continue,
                    Ok(WatchEvent::Error(_)) | Err(_) => return None,
                };
                events += 1;
                match look(seen.as_ref()) {
                    Look::Done(v) => return Some(Ok(v)),
                    Look::Wait(w) => waiting = w,
                }
                if seen.is_none() {
                    return Some(Err(()));
                }
            }
            None
        })
        .await;
        match followed {
            Ok(Some(Ok(v))) => return Ok(v),
            Ok(Some(Err(()))) => return Err(timeout(waiting)),
            // The watch ended: read again and follow again; after a pause when it brought
            // nothing (a proxy that does not stream), so that this is never a busy loop.
            Ok(None) if events == 0 => tokio::time::sleep(EMPTY_WATCH_PAUSE.min(left)).await,
            Ok(None) => {}
            Err(_) => return Err(timeout(waiting)),
        }
    }
}
