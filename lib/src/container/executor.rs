//! `ContainerExecutor`: the container rung's public face: connecting to the engine, the warm
//! pool's and the tools' own calls. Its `Executor` is the shared front's
//! (`attempt::front`), over this rung's `Launch` (`attempt`).

use super::config::ContainerConfig;
use super::site::ContainerSite;
use crate::contract::LaunchError;
use crate::engine::Engine;
use std::sync::Arc;

/// Runs each attempt in a fresh container on a Docker-API engine (Docker or Podman, local or
/// remote). Cheap to clone; clones share the engine, the admission bounds and the tasks.
#[derive(Debug, Clone)]
pub struct ContainerExecutor {
    shared: Arc<ContainerSite>,
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
        Self { shared }
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
}

crate::attempt::front::executor!(ContainerExecutor, shared);
