//! `ContainerExecutor`: the container rung's face, implementing `Executor`: validation,
//! admission, then the attempt (`attempt`) on the rung's site (`site`).

use super::config::ContainerConfig;
use super::site::ContainerSite;
use crate::contract::{
    Checkpoint, Executor, HookSet, LaunchError, Level, Outcome, ReclaimError, ReclaimReport, RecoverError, Request,
};
use crate::engine::Engine;
use crate::util::BoxFuture;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Runs each attempt in a fresh container on a Docker-API engine (Docker or Podman, local or
/// remote). Cheap to clone; clones share the engine, the admission bounds and the tasks.
#[derive(Debug, Clone)]
pub struct ContainerExecutor {
    shared: Arc<ContainerSite>,
    slots: Arc<Semaphore>,
}

impl ContainerExecutor {
    /// Connects to the engine, negotiates the API version and learns what the engine is.
    /// Every rung of a process shares the process's incarnation.
    pub async fn connect(config: ContainerConfig) -> Result<Self, LaunchError> {
        let timeouts = (config.engine_timeout, config.engine_change_timeout);
        let engine = Engine::connect_with(&config.connection, timeouts.0, timeouts.1).await.map_err(|source| {
            let endpoint = match crate::engine::endpoint::resolve(&config.connection, |k| std::env::var(k).ok()) {
                Ok(e) => e.url,
                Err(_) => config
                    .connection
                    .host
                    .as_deref()
                    .map_or_else(|| "DOCKER_HOST".into(), crate::engine::endpoint::redact),
            };
            LaunchError::EngineUnreachable { endpoint, source }
        })?;
        Ok(Self::on(engine, config))
    }

    /// The rung on an engine already connected.
    pub fn on(engine: Engine, config: ContainerConfig) -> Self {
        let incarnation =
            config.incarnation.clone().unwrap_or_else(|| crate::contract::incarnation::current().to_owned());
        let shared = Arc::new(ContainerSite::new(engine, config, incarnation));
        // The pool fills in the background from the start (when there is a runtime to do it on).
        if tokio::runtime::Handle::try_current().is_ok() {
            super::pool::start(&shared);
        }
        Self { slots: Arc::new(Semaphore::new(shared.config.max_in_flight.max(1))), shared }
    }

    /// Waits until the warm pool holds its configured number of parked containers, or
    /// `within` passes; whether it does. `false` at once without a pool.
    pub async fn warm_up(&self, within: std::time::Duration) -> bool {
        super::pool::wait_full(&self.shared, within).await
    }

    /// How many containers are parked in the warm pool now.
    pub fn parked(&self) -> usize {
        super::pool::parked(&self.shared)
    }

    /// What the warm pool did so far (all zero without a pool).
    pub fn pool_stats(&self) -> super::PoolStats {
        super::pool::stats(&self.shared)
    }

    /// The engine this rung talks to.
    pub fn engine(&self) -> &Engine {
        &self.shared.engine
    }

    /// The configuration.
    pub fn config(&self) -> &ContainerConfig {
        &self.shared.config
    }

    /// The incarnation stamped on everything this rung creates.
    pub fn incarnation(&self) -> &str {
        &self.shared.base.incarnation
    }

    /// Removes the tools volumes other processes left (older than an hour, of another
    /// incarnation, mounted by no container); this rung's own is kept. An idle live rung of
    /// another process cannot be told from a crashed one: it makes a new volume when its own
    /// is gone.
    pub async fn prune_tools(&self) -> Result<super::tools::ToolsPruned, crate::engine::EngineError> {
        super::tools::prune(&self.shared.engine, &self.shared.base.incarnation).await
    }

    async fn admitted(&self, req: &Request, cancel: &CancellationToken) -> Result<Outcome, LaunchError> {
        let name = self.shared.config.name.clone();
        // Holding a tracker token makes `close` wait for this attempt.
        let _token = self.shared.base.tracker.token();
        if self.shared.base.tracker.is_closed() {
            return Err(LaunchError::Closed(name));
        }
        // An invalid request is refused before it waits for anything.
        req.validate()?;
        req.policy.admit_network(&name, self.shared.config.network == "none")?;
        let applied = super::sizes::of(&req.limits, &self.shared.config);
        // The cgroup's whole limit: the delivery reserve is the host's memory too.
        let limit = applied.memory.saturating_add(self.shared.config.link.delivery_reserve);
        let mib = u32::try_from(limit.div_ceil(1 << 20)).unwrap_or(u32::MAX);
        let budget = &self.shared.budget;
        if mib > self.shared.budget_mib {
            return Err(LaunchError::AdmissionRefused(format!(
                "memory limit {} MiB exceeds the rung's budget of {} MiB (80% of the engine host)",
                mib, self.shared.budget_mib
            )));
        }
        // Parked containers hold budget only while attempts leave it free.
        super::pool::yield_budget(&self.shared, mib);
        let acquire = async {
            let slot = self.slots.clone().acquire_owned().await;
            let mem = budget.clone().acquire_many_owned(mib).await;
            (slot, mem)
        };
        let permits = if self.shared.config.wait_for_admission {
            tokio::select! {
                p = acquire => p,
                _ = cancel.cancelled() => return Err(LaunchError::CancelledBeforeStart),
            }
        } else {
            match (self.slots.clone().try_acquire_owned(), budget.clone().try_acquire_many_owned(mib)) {
                (Ok(s), Ok(m)) => (Ok(s), Ok(m)),
                _ => {
                    return Err(LaunchError::AdmissionRefused(format!(
                        "{} attempts in flight or memory budget used up",
                        self.shared.config.max_in_flight
                    )));
                }
            }
        };
        let (Ok(_slot), Ok(_mem)) = permits else {
            return Err(LaunchError::Closed(name));
        };
        if self.shared.base.tracker.is_closed() {
            return Err(LaunchError::Closed(name));
        }
        super::attempt::run(self.shared.clone(), req, applied, cancel.clone()).await
    }
}

impl Executor for ContainerExecutor {
    fn name(&self) -> &str {
        &self.shared.config.name
    }

    fn level(&self) -> Level {
        self.shared.config.level()
    }

    fn denies_network(&self) -> bool {
        self.shared.config.network == "none"
    }

    fn run<'a>(
        &'a self,
        request: &'a Request,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<Outcome, LaunchError>> {
        Box::pin(async move { self.admitted(request, &cancel).await })
    }

    fn reclaim<'a>(&'a self, worker_id: &'a str) -> BoxFuture<'a, Result<ReclaimReport, ReclaimError>> {
        Box::pin(super::reclaim::reclaim(&self.shared, worker_id))
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            super::pool::drain(&self.shared).await;
            self.shared.base.tracker.close();
            self.shared.base.tracker.wait().await;
            // A fill that was under way when the pool closed removes its own container.
            super::pool::drain(&self.shared).await;
            // Nothing of this rung mounts its tools volumes any more.
            let slot = std::mem::take(&mut *self.shared.tools.lock().await);
            if let Err(e) = super::tools::remove_made(&self.shared.engine, &slot.made).await {
                tracing::warn!(volumes = ?slot.made, error = %e, "removing the tools volumes");
            }
        })
    }

    fn recover<'a>(
        &'a self,
        checkpoint: &'a Checkpoint,
        hooks: Option<HookSet>,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<Outcome, RecoverError>> {
        Box::pin(super::recover::recover(self.shared.clone(), checkpoint, hooks, cancel))
    }
}
