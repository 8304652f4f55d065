//! What the container rung knows of one attempt that must outlive the worker process
//! (`attempt::Ledger::own`): built at launch, judged from at the end, and written into the
//! attempt's checkpoint so that a restarted worker can finish the attempt (`recover`).

use serde::{Deserialize, Serialize};

/// One attempt's container facts, decided before its command starts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Own {
    pub container_id: String,
    pub image_ref: String,
    pub image_id: String,
    pub memory: u64,
    pub cpu_millis: Option<u64>,
    pub disk: u64,
    /// Where the init came from: `volume NAME` or `host dir PATH`.
    pub tools_volume: String,
    pub tools_digest: String,
    /// Every container of the attempt (the attempt's and its staging helper's).
    pub containers: Vec<String>,
    /// Every volume of the attempt.
    pub volumes: Vec<String>,
    /// Named caches mounted: (name, volume, path).
    pub caches: Vec<(String, String, String)>,
    /// Whether the attempt came from the warm pool (`None`: the rung has none).
    pub warm: Option<bool>,
    /// The engine's life when the attempt started (this process's; a recovered attempt
    /// counts from the process's start).
    #[serde(skip)]
    pub engine_mark: crate::engine::Mark,
}
