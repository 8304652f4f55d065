//! What the oci rung knows of one attempt that must outlive the worker process
//! (`attempt::Ledger::own`): the runtime's container, its bundle, the runtime's process.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// One attempt's places and process, decided before its command starts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Own {
    /// The runtime's container id (the attempt's name).
    pub id: String,
    pub bundle: PathBuf,
    /// `runtime run`'s pid and start ticks (it lives as long as the container).
    pub runtime_pid: i32,
    pub start_ticks: u64,
    pub image_ref: String,
    pub image_id: String,
    pub memory: u64,
    pub cpu_millis: Option<u64>,
    pub disk: u64,
}
