//! What the rung knows of one attempt that must outlive the worker process: built at
//! launch, judged from at the end, and written into the attempt's checkpoint so that a
//! restarted worker can finish the attempt (`recover`).

use crate::contract::{EnvOverride, InputsStaged, NarrowedLimit};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One attempt's facts, decided before its command starts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Ledger {
    pub attempt_id: String,
    /// The container's name.
    pub name: String,
    pub container_id: String,
    pub image_ref: String,
    pub image_id: String,
    pub memory: u64,
    pub cpu_millis: Option<u64>,
    pub disk: u64,
    pub narrowed: Vec<NarrowedLimit>,
    pub env_overrides: Vec<EnvOverride>,
    pub enforcement: BTreeMap<String, String>,
    pub skipped: BTreeMap<String, String>,
    pub ports: BTreeMap<String, String>,
    pub tools_volume: String,
    pub tools_digest: String,
    pub inputs: Option<InputsStaged>,
    /// Every container of the attempt (the attempt's and its staging helper's).
    pub containers: Vec<String>,
    /// Every volume of the attempt.
    pub volumes: Vec<String>,
    pub expects_handler: bool,
    pub started_ms: u64,
    /// The capture files' names in the worker's capture dir.
    pub captures: Option<[String; 2]>,
    pub max_files: u64,
    pub max_total_bytes: u64,
    /// Named caches mounted: (name, volume, path).
    #[serde(default)]
    pub caches: Vec<(String, String, String)>,
    /// Whether the attempt came from the warm pool (`None`: the rung has none).
    #[serde(default)]
    pub warm: Option<bool>,
}
