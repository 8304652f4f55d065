//! `ProcessExecutor`: the process rung's public face (level `process`): its setup on the host.
//! Its `Executor` is the shared front's (`attempt::front`), over this rung's `Launch`
//! (`attempt`).

use super::config::ProcessConfig;
use super::dirs::{self, DirError};
use super::site::{Places, ProcessSite};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why the process rung cannot be set up as configured.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// commands would run as root
    #[error("the process rung runs as root: configure run_as with a dedicated uid other than 0")]
    RunAsRoot,
    /// commands would run as the worker's uid without it being accepted
    #[error(
        "commands would run as the worker's own uid {0} (they could read its files and /proc): run stevedore as \
         root with a dedicated run_as uid, or accept it with allow_worker_uid"
    )]
    SameUid(u32),
    /// another uid was asked for without root
    #[error("running commands as uid {wanted} needs root; this worker is uid {have}")]
    NotRoot {
        /// The uid asked for.
        wanted: u32,
        /// This process's.
        have: u32,
    },
    /// this build carries no init for this platform
    #[error("this build of stevedore carries no init for this platform")]
    NoInit,
    /// a place on the host could not be made or trusted
    #[error(transparent)]
    Dir(#[from] DirError),
    /// the uid range cannot be used
    #[error(transparent)]
    Uids(#[from] super::uids::UidError),
}

/// Runs each attempt as a child process of the worker, supervised by stevedore's init,
/// under a dedicated uid when stevedore runs as root (level `process`). Cheap to clone.
#[derive(Debug, Clone)]
pub struct ProcessExecutor {
    shared: Arc<ProcessSite>,
}

impl ProcessExecutor {
    /// Sets the rung up: checks the uid rules, makes its dirs, installs the init.
    pub fn new(config: ProcessConfig) -> Result<Self, ProcessError> {
        let euid = nix::unistd::geteuid().as_raw();
        match config.run_as {
            _ if config.uids.is_some() => {}
            Some((0, _)) => return Err(ProcessError::RunAsRoot),
            Some((uid, _)) if uid != euid && euid != 0 => {
                return Err(ProcessError::NotRoot { wanted: uid, have: euid });
            }
            Some((uid, _)) if uid == euid && !config.allow_worker_uid => return Err(ProcessError::SameUid(euid)),
            None if euid == 0 => return Err(ProcessError::RunAsRoot),
            None if !config.allow_worker_uid => return Err(ProcessError::SameUid(euid)),
            _ => {}
        }
        if config.uids.is_some() && euid != 0 {
            return Err(ProcessError::NotRoot { wanted: config.uids.map_or(0, |r| r.first), have: euid });
        }
        let separate = config.uids.is_some() || config.run_as.is_some_and(|(u, _)| u != euid);
        let base = match &config.base_dir {
            Some(b) => b.clone(),
            None if euid == 0 => PathBuf::from("/run/stevedore-process"),
            None => crate::hostdir::default_base().join("process"),
        };
        // The command's uid must reach the init, the worker copy and its attempt's dir, and
        // list nothing.
        let (traverse, readable) = if separate { (0o711, 0o755) } else { (0o700, 0o700) };
        dirs::ensure_dir(&base, traverse)?;
        let bin = base.join("bin");
        dirs::ensure_dir(&bin, readable)?;
        let attempts = base.join("attempts");
        dirs::ensure_dir(&attempts, traverse)?;
        let init_bytes = crate::sandbox::init_binary::bytes().ok_or(ProcessError::NoInit)?;
        let init = dirs::install(&bin, "stevedore-init", init_bytes)?;
        let incarnation =
            config.incarnation.clone().unwrap_or_else(|| crate::contract::incarnation::current().to_owned());
        let leases = base.join("uids");
        let uids = match (config.uids, config.run_as) {
            (Some(range), _) => {
                super::uids::check_range(range, Path::new("/etc"))?;
                Some(Arc::new(super::uids::Uids::new(range, true, leases)?))
            }
            _ if config.share_uid => None,
            (None, fixed) => {
                let uid = fixed.map_or(euid, |(u, _)| u);
                Some(Arc::new(super::uids::Uids::new(super::uids::UidRange { first: uid, count: 1 }, false, leases)?))
            }
        };
        let places = Places { euid, attempts, bin, init };
        Ok(Self { shared: Arc::new(ProcessSite::new(config, incarnation, places, uids)) })
    }

    /// The rung's attempts dir (for tests and reclaim).
    pub fn attempts_dir(&self) -> &Path {
        &self.shared.attempts
    }
}

crate::attempt::front::executor!(ProcessExecutor, shared);
