//! Whether the engine went away while an attempt ran: one idle subscription to the engine's
//! events per connection, which the engine ends when it stops (Docker closes its API before
//! it signals the containers it stops) and which breaks when the connection is cut; an end
//! counts as a loss only when a ping right after it fails too, so a stream closed for any
//! other reason is reopened and forgotten.
//!
//! Invariant: the watching task holds only the calls, never the engine or a rung; it is
//! aborted when the last `Engine` clone goes, so nothing of it outlives its owner.

use super::api::EngineApi;
use futures_util::StreamExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// What the watching task has seen.
#[derive(Debug, Clone, Default)]
struct Seen {
    /// How many times the engine went away.
    losses: u64,
    /// What the last loss looked like.
    last: Option<String>,
    /// A stream ended and the ping that decides whether it was a loss is under way.
    checking: bool,
    /// The engine is away now: a loss seen by the task and by an attempt's own ping is
    /// one loss, until a ping answers again.
    away: bool,
}

impl Seen {
    fn lost(&mut self, what: String) {
        if !self.away {
            self.losses += 1;
            self.last = Some(what);
        }
        self.away = true;
    }
}

/// A point in the engine's life, taken when an attempt starts: [`Watcher::lost_since`]
/// says whether the engine went away after it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Mark(u64);

/// The watching task of one engine connection, started by the first [`Watcher::mark`].
#[derive(Debug, Default)]
pub(crate) struct Watcher {
    seen: Mutex<Option<(Arc<watch::Sender<Seen>>, tokio::task::AbortHandle)>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Some((_, task)) = self.seen.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
            task.abort();
        }
    }
}

/// The longest wait between two pings while the engine is away, and between two opens of
/// a stream the engine keeps closing.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

impl Watcher {
    fn sender(&self) -> Option<Arc<watch::Sender<Seen>>> {
        self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref().map(|(tx, _)| tx.clone())
    }

    /// Starts watching `api` if not yet (only inside a runtime; outside one nothing is
    /// watched and no loss is ever seen), and marks now.
    pub fn mark(&self, api: &Arc<dyn EngineApi>) -> Mark {
        let mut slot = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.is_none()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            let tx = Arc::new(watch::Sender::new(Seen::default()));
            let task = handle.spawn(watching(api.clone(), tx.clone()));
            *slot = Some((tx, task.abort_handle()));
        }
        Mark(slot.as_ref().map_or(0, |(tx, _)| tx.borrow().losses))
    }

    /// The engine did not answer an attempt's own ping: a loss (one under way counts once).
    pub fn lost(&self, what: String) {
        if let Some(tx) = self.sender() {
            tx.send_modify(|s| s.lost(what));
        }
    }

    /// A ping answered: the engine is back.
    pub fn back(&self) {
        if let Some(tx) = self.sender() {
            tx.send_if_modified(|s| std::mem::replace(&mut s.away, false));
        }
    }

    /// What the engine's going away looked like, if it went away after `mark`. When a
    /// stream has just ended, waits (at most `within`) for the ping that decides it.
    pub async fn lost_since(&self, mark: Mark, within: Duration) -> Option<String> {
        let mut rx = self.sender()?.subscribe();
        let _ = tokio::time::timeout(within, rx.wait_for(|s| !s.checking)).await;
        let seen = rx.borrow().clone();
        (seen.losses > mark.0).then(|| seen.last.unwrap_or_else(|| "the engine went away".into()))
    }
}

/// Opens the subscription, waits for its end, decides with a ping whether the engine went
/// away, and opens it again once the engine answers.
async fn watching(api: Arc<dyn EngineApi>, tx: Arc<watch::Sender<Seen>>) {
    let mut backoff = Duration::from_millis(250);
    loop {
        let opened = tokio::time::Instant::now();
        let mut stream = api.watch();
        let end = loop {
            match stream.next().await {
                Some(Ok(())) => {}
                Some(Err(e)) if !e.is_transient() => {
                    // The engine refuses the subscription (an engine without events, or
                    // without that filter): nothing is watched from now on.
                    tracing::debug!(error = %e, "the engine's events cannot be watched");
                    return;
                }
                Some(Err(e)) => break format!("its event stream failed: {}", e.message()),
                None => break "it closed its event stream".to_owned(),
            }
        };
        drop(stream);
        tx.send_modify(|s| s.checking = true);
        match api.ping().await {
            Ok(()) => {
                tx.send_modify(|s| {
                    s.checking = false;
                    s.away = false;
                });
                tracing::debug!(end, "the engine's event stream ended while the engine still answers");
                // A stream the engine keeps closing at once is not opened in a busy loop.
                if opened.elapsed() < Duration::from_secs(1) {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                } else {
                    backoff = Duration::from_millis(250);
                }
                continue;
            }
            Err(e) => {
                let what = format!("the engine went away: {end}, then did not answer a ping ({})", e.message());
                tracing::warn!(what, "engine lost");
                tx.send_modify(|s| {
                    s.lost(what);
                    s.checking = false;
                });
            }
        }
        // Back when it answers again.
        let mut wait = Duration::from_millis(250);
        while api.ping().await.is_err() {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(BACKOFF_MAX);
        }
        tx.send_modify(|s| s.away = false);
        tracing::info!("the engine answers again");
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::fake::FakeApi;

    #[tokio::test]
    async fn a_loss_is_seen_by_the_attempts_that_ran_through_it_only() {
        let fake = FakeApi::new("img");
        let engine = fake.engine();
        let before = engine.mark();
        assert_eq!(engine.lost_since(before).await, None, "an engine that answers is not lost");
        fake.lose();
        let lost = engine.lost_since(before).await;
        assert!(lost.as_deref().is_some_and(|l| l.contains("ping")), "{lost:?}");
        fake.restore();
        let after = engine.mark();
        assert_eq!(engine.lost_since(after).await, None, "an attempt that started after the loss saw none");
        assert!(engine.lost_since(before).await.is_some(), "the one that ran through it still sees it");
    }
}
