//! The backstop of a container rung dropped without `close()` (a caller that forgot it, a
//! panic unwinding through its runtime): what it holds beyond its attempts (parked containers,
//! fills cut short, its tools volumes) is removed before the drop returns.

use super::site::{ContainerSite, Parked};

/// How long a rung dropped without `close()` waits for its backstop removal.
const BACKSTOP_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// Backstop for a rung dropped without `close()` (a caller that forgot it, a panic): its parked
/// containers and its tools volumes are removed before the drop returns, through a client of
/// their own on a thread of their own, so a runtime that is shutting down loses nothing. An
/// engine that does not answer within [`BACKSTOP_WAIT`] keeps them: they stay labelled, and
/// `prune` (another process's) takes the volumes, `reclaim` the containers.
impl Drop for ContainerSite {
    fn drop(&mut self) {
        let made = std::mem::take(&mut self.tools.get_mut().made);
        let (parked, pending): (Vec<Parked>, Vec<_>) = match &self.pool {
            Some(pool) => {
                (pool.parked().drain(..).collect(), pool.pending().drain().map(|(_, objects)| objects).collect())
            }
            None => (Vec::new(), Vec::new()),
        };
        if made.is_empty() && parked.is_empty() && pending.is_empty() {
            return;
        }
        let (mut containers, mut volumes): (Vec<Vec<String>>, Vec<String>) =
            parked.into_iter().map(|p| (std::iter::once(p.name).chain(p.helper).collect(), p.input_volume)).unzip();
        // Fills (and discards) a runtime going away cut short.
        for (c, v) in pending {
            containers.push(c);
            volumes.extend(v);
        }
        let engine = match self.engine.redial() {
            Ok(engine) => engine,
            Err(e) => {
                tracing::warn!(volumes = ?made, error = %e, "a rung dropped without close keeps its tools volumes");
                return;
            }
        };
        let removal = async move {
            for name in containers.iter().flatten() {
                let _ = engine.api.remove_container(name).await;
            }
            for v in &volumes {
                let _ = engine.api.remove_volume(v).await;
            }
            if let Err(e) = super::tools::remove_made(&engine, &made).await {
                tracing::warn!(volumes = ?made, error = %e, "a rung dropped without close: removing its tools volumes");
            }
        };
        if !crate::util::finish_apart("stevedore-rung-backstop", BACKSTOP_WAIT, removal) {
            tracing::warn!("a rung dropped without close: its removal did not end in {BACKSTOP_WAIT:?}");
        }
    }
}
