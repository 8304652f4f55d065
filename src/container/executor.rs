//! `ContainerExecutor`: the container rung, implementing `Executor`.

use super::attempt::{self, Shared};
use super::config::ContainerConfig;
use super::engine::Engine;
use super::tools::ToolsBundle;
use crate::contract::{BoxFuture, Executor, LaunchError, Level, Outcome, ReclaimError, ReclaimReport, Request};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Runs each attempt in a fresh container on a Docker Engine.
#[derive(Debug, Clone)]
pub struct ContainerExecutor {
    shared: Arc<Shared>,
    closed: Arc<AtomicBool>,
    slots: Arc<Semaphore>,
    memory_mib: Arc<Semaphore>,
    memory_budget_mib: u32,
}

impl ContainerExecutor {
    /// Connects to the engine, negotiates the API version and prepares the init bundle.
    pub async fn connect(config: ContainerConfig, incarnation: impl Into<String>) -> Result<Self, LaunchError> {
        let engine = Engine::connect(config.endpoint.as_deref(), config.engine_timeout)
            .await
            .map_err(|(endpoint, e)| LaunchError::EngineUnreachable { endpoint, source: Box::new(e) })?;
        let exe = match &config.init_exe {
            Some(p) => p.clone(),
            None => std::env::current_exe()
                .map_err(|e| LaunchError::Staging { what: "locating the init binary".into(), source: Box::new(e) })?,
        };
        let base = config.tools_dir.clone();
        let bundle = tokio::task::spawn_blocking(move || ToolsBundle::prepare(&exe, &base))
            .await
            .map_err(|e| LaunchError::Staging { what: "init bundle".into(), source: Box::new(e) })?
            .map_err(|e| LaunchError::Staging { what: "init bundle".into(), source: Box::new(e) })?;
        let budget = (engine.facts.mem_total_bytes / (1 << 20)) * 8 / 10;
        let memory_budget_mib =
            u32::try_from(budget.max(64)).unwrap_or(u32::MAX >> 4).min(Semaphore::MAX_PERMITS as u32);
        let shared = Shared::new(
            engine,
            config,
            bundle.host_dir().to_path_buf(),
            bundle.argv(crate::protocol::TOOLS_DIR),
            incarnation.into(),
        );
        Ok(Self {
            slots: Arc::new(Semaphore::new(shared.config.max_in_flight.max(1))),
            memory_mib: Arc::new(Semaphore::new(memory_budget_mib as usize)),
            memory_budget_mib,
            shared: Arc::new(shared),
            closed: Arc::new(AtomicBool::new(false)),
        })
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
        &self.shared.incarnation
    }

    async fn admitted(&self, req: &Request, cancel: &CancellationToken) -> Result<Outcome, LaunchError> {
        let name = self.shared.config.name.clone();
        if self.closed.load(Ordering::SeqCst) {
            return Err(LaunchError::Closed(name));
        }
        // Holding a tracker token makes `close` wait for this attempt.
        let _token = self.shared.tracker.token();
        let applied = super::spec::apply_limits(&req.limits, &self.shared.config);
        let mib = u32::try_from(applied.memory.div_ceil(1 << 20)).unwrap_or(u32::MAX);
        if mib > self.memory_budget_mib {
            return Err(LaunchError::AdmissionRefused(format!(
                "memory limit {} MiB exceeds the rung's budget of {} MiB (80% of the engine host)",
                mib, self.memory_budget_mib
            )));
        }
        let acquire = async {
            let slot = self.slots.clone().acquire_owned().await;
            let mem = self.memory_mib.clone().acquire_many_owned(mib).await;
            (slot, mem)
        };
        let permits = if self.shared.config.wait_for_admission {
            tokio::select! {
                p = acquire => p,
                _ = cancel.cancelled() => return Err(LaunchError::CancelledBeforeStart),
            }
        } else {
            let slot = self.slots.clone().try_acquire_owned();
            let mem = self.memory_mib.clone().try_acquire_many_owned(mib);
            match (slot, mem) {
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
        if self.closed.load(Ordering::SeqCst) {
            return Err(LaunchError::Closed(name));
        }
        attempt::run(self.shared.clone(), req, applied, cancel.clone()).await
    }
}

impl Executor for ContainerExecutor {
    fn name(&self) -> &str {
        &self.shared.config.name
    }

    fn level(&self) -> Level {
        self.shared.config.level()
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
            self.closed.store(true, Ordering::SeqCst);
            self.shared.tracker.close();
            self.shared.tracker.wait().await;
        })
    }
}
