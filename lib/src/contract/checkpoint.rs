//! What a restarted worker needs to find an attempt again: written through the
//! [`crate::Hooks::checkpoint`] hook before the command starts, given back to
//! [`crate::Executor::recover`].

use super::Level;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The checkpoint format's version.
pub const CHECKPOINT_VERSION: u32 = 1;

/// One attempt's checkpoint. It holds the attempt's link key: store it as a secret.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// [`CHECKPOINT_VERSION`].
    pub version: u32,
    /// The job.
    pub job_id: String,
    /// The attempt number.
    pub attempt: u32,
    /// The worker it runs for (a restarted worker must have the same ID).
    pub worker: String,
    /// The rung that ran it, by name (the registry recovers through it).
    pub rung: String,
    /// The rung's level.
    pub level: Level,
    /// The boot of the worker process that started it.
    pub incarnation: String,
    /// When it started (Unix epoch ms).
    pub started_at_unix_ms: u64,
    /// When it must end (Unix epoch ms), if it has a deadline.
    pub deadline_at_unix_ms: Option<u64>,
    /// The grace between SIGTERM and SIGKILL, ms.
    pub grace_ms: u64,
    /// Where its outputs go.
    pub output_dir: PathBuf,
    /// What runs it.
    pub target: Target,
    /// The link's identity and key.
    pub link: LinkSecret,
    /// The rung's own state, opaque to the engine.
    pub state: serde_json::Value,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("job_id", &self.job_id)
            .field("attempt", &self.attempt)
            .field("worker", &self.worker)
            .field("rung", &self.rung)
            .field("target", &self.target)
            .field("link", &self.link)
            .finish_non_exhaustive()
    }
}

/// What runs the attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum Target {
    /// A container.
    Container {
        /// Its ID.
        id: String,
        /// Its name.
        name: String,
    },
    /// A process (the init of the process rung).
    Process {
        /// Its pid.
        pid: i32,
        /// Its start time in clock ticks since boot (`/proc/<pid>/stat` field 22), so a
        /// reused pid is not mistaken for it.
        start_ticks: u64,
    },
    /// A container an OCI runtime runs itself (the oci rung).
    Runtime {
        /// Its id in the runtime's state dir (the attempt's name).
        id: String,
        /// The runtime's state dir (`--root`).
        root: String,
    },
    /// A Pod (the kube rung).
    Pod {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Its UID (a Pod made again under the same name is another).
        uid: String,
    },
}

/// The link's identity and key.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSecret {
    /// Names the init's takeover socket.
    pub id: String,
    /// The attempt key, hex.
    pub key: String,
}

impl std::fmt::Debug for LinkSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkSecret").field("id", &self.id).field("key", &"<secret>").finish()
    }
}

impl Checkpoint {
    /// Parses a checkpoint, refusing other versions.
    pub fn from_json(json: &[u8]) -> Result<Self, String> {
        let c: Checkpoint = serde_json::from_slice(json).map_err(|e| format!("not a checkpoint: {e}"))?;
        if c.version != CHECKPOINT_VERSION {
            return Err(format!("checkpoint version {} is not {CHECKPOINT_VERSION}", c.version));
        }
        Ok(c)
    }

    /// As JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a checkpoint always serialises")
    }
}

/// Why an attempt could not be recovered. What could not be recovered is reclaimed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoverError {
    /// the rung cannot recover attempts
    #[error("executor {0} cannot recover attempts")]
    Unsupported(String),
    /// no rung of that name is registered
    #[error("no executor named {0:?} is registered")]
    UnknownRung(String),
    /// the checkpoint is not valid for this rung
    #[error("invalid checkpoint: {0}")]
    Invalid(String),
    /// the attempt is gone (its sandbox ended without a host, or was removed)
    #[error("the attempt is gone: {0}")]
    Gone(String),
    /// the init refused or did not answer the takeover
    #[error("the takeover failed: {0}")]
    Takeover(String),
    /// an engine call failed
    #[cfg(feature = "docker")]
    #[error(transparent)]
    Engine(#[from] crate::engine::EngineError),
    /// a cluster call failed (the kube rung's `ClusterError`)
    #[cfg(feature = "kube")]
    #[error(transparent)]
    Cluster(crate::util::Cause),
    /// the output dir cannot take the outputs
    #[error("the output dir cannot take the outputs")]
    OutputDir(#[source] super::RequestError),
}
