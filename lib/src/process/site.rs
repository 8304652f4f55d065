//! The process rung's site: what the rung shares with each of its attempts (its places on
//! the host, the init and the worker binary installed there, the uid leases, the tasks).

use super::config::ProcessConfig;
use super::dirs;
use crate::attempt::SiteBase;
use crate::attempt::front::Gate;
use crate::contract::LaunchError;
use crate::hostdir::Captures;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// What the rung shares with each attempt.
#[derive(Debug)]
pub(crate) struct ProcessSite {
    pub config: ProcessConfig,
    pub base: SiteBase,
    pub euid: u32,
    pub attempts: PathBuf,
    pub bin: PathBuf,
    pub init: PathBuf,
    workers: Mutex<HashMap<PathBuf, PathBuf>>,
    /// Leases of the attempts' uids; `None`: attempts share one uid (the worker's or a fixed
    /// one) side by side, by configuration.
    pub uids: Option<Arc<super::uids::Uids>>,
    /// Admission: no bound of its own (the uid leases refuse when none is free).
    pub gate: Gate,
    /// Whether a cgroup with memory, CPU and pids limits could be made here, tried once as
    /// the rung was set up (`Executor::enforces`): a delegation that cannot deliver is no claim.
    pub cgroups: bool,
}

/// Where the rung lives on the host, as `ProcessExecutor::new` set it up.
#[derive(Debug)]
pub(crate) struct Places {
    pub euid: u32,
    pub attempts: PathBuf,
    pub bin: PathBuf,
    pub init: PathBuf,
}

/// One cgroup made as `how` says, with a memory, a CPU and a pids limit, then removed.
fn cgroups_work(how: &super::config::Delegation) -> bool {
    let limits = crate::contract::Limits::NONE.memory(64 << 20).cpu(500).pids(64);
    let name = format!("census-{}-{:08x}", std::process::id(), rand::random::<u32>());
    match super::cgroup::create(how, &name, limits) {
        Ok(Some(cg)) => {
            let _ = cg.remove();
            true
        }
        Ok(None) | Err(_) => false,
    }
}

impl ProcessSite {
    pub fn new(
        config: ProcessConfig,
        incarnation: String,
        places: Places,
        uids: Option<Arc<super::uids::Uids>>,
    ) -> Self {
        let Places { euid, attempts, bin, init } = places;
        let base = SiteBase::new(incarnation, Captures::new(config.log_dir.clone()));
        let gate = Gate::unbounded();
        let cgroups = cgroups_work(&config.cgroup);
        Self { config, base, euid, attempts, bin, init, workers: Mutex::default(), uids, gate, cgroups }
    }

    /// The worker binary, copied into the rung's dir (by digest) so that the command's
    /// uid can run it and nobody can swap it.
    pub fn worker_exe(&self) -> Result<PathBuf, LaunchError> {
        let exe = match &self.config.worker_exe {
            Some(e) => e.clone(),
            None => std::env::current_exe()
                .map_err(|e| LaunchError::Staging { what: "locating the worker binary".into(), source: Box::new(e) })?,
        };
        let mut cache = self.workers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(p) = cache.get(&exe) {
            return Ok(p.clone());
        }
        let bytes = std::fs::read(&exe).map_err(|e| LaunchError::Staging {
            what: format!("reading the worker binary {}", exe.display()),
            source: Box::new(e),
        })?;
        let installed = dirs::install(&self.bin, "worker", &bytes)
            .map_err(|e| LaunchError::Staging { what: "installing the worker binary".into(), source: Box::new(e) })?;
        cache.insert(exe, installed.clone());
        Ok(installed)
    }
}
