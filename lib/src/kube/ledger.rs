//! What the kube rung knows of one attempt that must outlive the worker process
//! (`attempt::Ledger::own`): built at launch, judged from at the end, and written into the
//! attempt's checkpoint so that a restarted worker can finish the attempt (`recover`).

use super::state::MainEnd;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};

/// One attempt's Pod facts, decided before its command starts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Own {
    pub namespace: String,
    pub pod: String,
    /// The Pod's UID: a Pod made again under the same name is not this attempt's.
    pub uid: String,
    pub image: String,
    pub init_image: String,
    pub memory: u64,
    pub cpu_millis: Option<u64>,
    pub disk: u64,
    /// What the kubelet said of the attempt's container at the end (`witness` reads it,
    /// `account` reports it).
    #[serde(skip)]
    pub seen: Arc<Mutex<Option<MainEnd>>>,
    /// How long the Pod waited for room on a node, and why (`launch::wait`), for the notes.
    #[serde(skip)]
    pub waited: Option<String>,
}

impl Own {
    /// What was seen of the end, if anything.
    pub fn seen(&self) -> Option<MainEnd> {
        self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}
