//! Removing an attempt's Pod, whichever way the attempt ends: explicitly and awaited at its
//! end, or, if its future is dropped, by a `Drop` backstop that hands the removal to the
//! rung's tracked tasks (`close` waits for them). A Pod whose containers may still run is
//! deleted with a second of grace and followed until the API no longer has it (the kubelet
//! removes it only once its containers stopped), so "removed" means "nothing runs".

use super::error::ClusterError;
use super::site::KubeSite;
use super::state;
use super::watch::{self, Look};
use crate::attempt::{InFlight, Removed, Teardown};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

/// The create call's answer.
const UNSURE: u8 = 0;
const MADE: u8 = 1;
const REFUSED: u8 = 2;
/// The name was taken: the Pod of that name is someone else's.
const TAKEN: u8 = 3;
/// Pauses between the tries of a removal that failed, or whose Pod may appear late.
const RETRY: [Duration; 5] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
];

/// How long a removal follows a deleted Pod until the kubelet stopped it.
const GONE_WITHIN: Duration = Duration::from_secs(90);
/// How long a removal waits for a Pod whose init is ending to end by itself.
const SETTLE_WITHIN: Duration = Duration::from_secs(3);

/// What must be removed when the attempt ends.
#[derive(Debug)]
pub(crate) struct Cleanup {
    site: Arc<KubeSite>,
    pod: Option<String>,
    /// The create call, run on the tracked tasks: a removal waits for it, so a Pod made
    /// after its removal was decided is never left.
    creating: Option<tokio::task::JoinHandle<()>>,
    /// What the create call's answer was (`UNSURE` until it came, or when it never did).
    made: Arc<AtomicU8>,
    /// This attempt's mark in the rung's in-flight set, until the removal is done.
    in_flight: Option<InFlight>,
}

impl Cleanup {
    pub fn new(site: Arc<KubeSite>, attempt_id: String) -> Self {
        let in_flight = Some(site.base.enter(attempt_id));
        Self { site, pod: None, creating: None, in_flight, made: Arc::new(AtomicU8::new(UNSURE)) }
    }

    /// Records the Pod the attempt is about to make (before the call that makes it).
    pub fn pod(&mut self, name: String) {
        self.pod = Some(name);
    }

    /// Runs the create on the rung's tracked tasks, so that it completes even if the
    /// attempt's future is dropped meanwhile; returns its result.
    pub fn creating<T: Send + 'static, F: Future<Output = Result<T, ClusterError>> + Send + 'static>(
        &mut self,
        call: F,
    ) -> impl Future<Output = Result<T, ClusterError>> + use<T, F> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let made = self.made.clone();
        self.creating = Some(self.site.base.tracker.spawn(async move {
            let r = call.await;
            let answer = match &r {
                Ok(_) => MADE,
                // A Pod of that name is someone else's: it is never touched.
                Err(e) if e.code() == Some(409) => TAKEN,
                // No answer, or the server's own failure: it may have made it all the same.
                Err(e) if e.is_unreachable() || e.code().is_some_and(|c| c == 429 || c >= 500) => UNSURE,
                Err(_) => REFUSED,
            };
            made.store(answer, Ordering::Release);
            let _ = tx.send(r);
        }));
        async move {
            rx.await.unwrap_or_else(|_| {
                Err(ClusterError::PodFailed { what: "the call that creates the Pod was abandoned".into() })
            })
        }
    }

    /// The Pod exists already (a recovered attempt's).
    pub fn made(&mut self) {
        self.made.store(MADE, Ordering::Release);
    }

    fn take(&mut self) -> Work {
        Work {
            site: self.site.clone(),
            pod: self.pod.take(),
            creating: self.creating.take(),
            in_flight: self.in_flight.take(),
            made: self.made.clone(),
        }
    }
}

/// One removal's work, apart from the attempt.
struct Work {
    site: Arc<KubeSite>,
    pod: Option<String>,
    creating: Option<tokio::task::JoinHandle<()>>,
    in_flight: Option<InFlight>,
    made: Arc<AtomicU8>,
}

impl Work {
    async fn run(self) -> Removed {
        let mut removed = Removed::default();
        if let Some(h) = self.creating {
            let _ = h.await;
        }
        let taken = self.made.load(Ordering::Acquire) == TAKEN;
        if let Some(name) = self.pod.as_ref().filter(|_| !taken) {
            let ours = self.site.hard_stopped.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(name);
            let concluded = self.site.concluded.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(name);
            let unsure = self.made.load(Ordering::Acquire) == UNSURE;
            // Once a delete was accepted, a Pod found gone is this removal's doing.
            let mut deleted = false;
            let mut last = None;
            // An API server out of reach for a moment, or a create that was never answered
            // (its Pod may appear late), is tried again before the removal gives up; a wait
            // for a Pod whose delete was accepted is not (the kubelet has it, or never will).
            for (i, wait) in RETRY.iter().enumerate() {
                let removal = if concluded {
                    // The init's last frame came and the host acked it: nothing of the attempt
                    // runs but the init's exit, which the kubelet need not be waited for.
                    self.site.delete_pod(name, true).await.inspect(|_| deleted = true)
                } else {
                    remove_pod(&self.site, name, &mut deleted).await
                };
                match removal {
                    Ok(true) => {
                        last = None;
                        break;
                    }
                    Ok(false) if unsure && !deleted => last = None,
                    Ok(false) => {
                        if !ours && !deleted && self.made.load(Ordering::Acquire) == MADE {
                            removed.by_others.push(name.clone());
                        }
                        last = None;
                        break;
                    }
                    Err(e) => {
                        let again = e.is_unreachable() && !deleted;
                        last = Some(e);
                        if !again {
                            break;
                        }
                    }
                }
                if i + 1 < RETRY.len() {
                    tokio::time::sleep(*wait).await;
                }
            }
            if let Some(e) = last {
                removed.errors.push(format!("Pod {name}: {}", crate::util::error_chain(&e)));
            }
        }
        drop(self.in_flight);
        removed
    }
}

/// Deletes the Pod; whether it was there. A Pod in which nothing runs (it ended, or nothing of
/// it started) goes at once; one whose init is ending (after the host's ack) is given
/// [`SETTLE_WITHIN`] to end; any other is deleted with a second of grace and followed until
/// the API no longer has it: the kubelet removes it only once its containers stopped.
pub(crate) async fn remove_pod(site: &KubeSite, name: &str, deleted: &mut bool) -> Result<bool, ClusterError> {
    /// What the Pod is ready for.
    enum Next {
        Gone,
        AtOnce,
        WithGrace,
    }
    // One read decides, and is followed only while the init is ending.
    let next = watch::until(site, name, SETTLE_WITHIN, |p| match p {
        None => Look::Done(Next::Gone),
        Some(p) if state::nothing_runs(p) => Look::Done(Next::AtOnce),
        Some(p) if !state::main_runs(p) => Look::Done(Next::WithGrace),
        Some(_) => Look::Wait("its init to end".into()),
    })
    .await;
    let ended = match next {
        Ok(Next::Gone) => return Ok(false),
        Ok(Next::AtOnce) => true,
        Ok(Next::WithGrace) | Err(ClusterError::StartTimeout { .. }) => false,
        Err(e) => return Err(e),
    };
    let was = site.delete_pod(name, ended).await?;
    *deleted = true;
    if !ended {
        watch::until(site, name, GONE_WITHIN, |p| match p {
            None => Look::Done(()),
            Some(_) => Look::Wait("the kubelet to stop the Pod's containers".into()),
        })
        .await
        .map_err(|e| match e {
            ClusterError::StartTimeout { waited, state } => {
                ClusterError::Timeout { what: format!("waiting for {state}"), after: waited }
            }
            e => e,
        })?;
    }
    Ok(was)
}

impl Teardown for Cleanup {
    /// The removal runs on the rung's tracked tasks: a caller that stops waiting for it
    /// (a dropped future) never cuts it short.
    fn remove(mut self) -> impl Future<Output = Removed> + Send + 'static {
        let work = self.take();
        let tracker = work.site.base.tracker.clone();
        let removal = tracker.spawn(work.run());
        async move { removal.await.unwrap_or_default() }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.pod.is_none() && self.creating.is_none() {
            return;
        }
        let work = self.take();
        let site = work.site.clone();
        if !site.base.backstop(async move {
            let r = work.run().await;
            if !r.errors.is_empty() {
                tracing::warn!(errors = ?r.errors, "removing a dropped attempt's Pod");
            }
        }) {
            tracing::warn!("an attempt's Pod was dropped without a runtime: `reclaim` removes it");
        }
    }
}
