//! The container rung's site: what the rung shares with each of its attempts (the engine,
//! the configuration, the tools volume, the warm pool, what is known of images' paths, the
//! tasks). State only: what is done with it is in `tools`, `pool` and `mounts`, which import
//! this file; it imports none of them.

use super::config::ContainerConfig;
use super::sizes::Sizes;
use crate::attempt::SiteBase;
use crate::engine::{Attached, Engine, PathKind};
use crate::hostdir::Captures;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Instant;

/// What the rung shares with each attempt.
#[derive(Debug)]
pub(crate) struct ContainerSite {
    pub engine: Engine,
    pub config: ContainerConfig,
    pub base: SiteBase,
    /// This rung's tools volume once made, and the names it made.
    pub tools: tokio::sync::Mutex<Slot>,
    /// The warm pool, when configured.
    pub pool: Option<Pool>,
    /// What is known of images' paths where the attempts mount something (`mounts`).
    pub mounts: Mutex<Seen>,
}

impl ContainerSite {
    pub fn new(engine: Engine, config: ContainerConfig, incarnation: String) -> Self {
        let pool = config.pool.as_ref().filter(|p| p.size > 0).map(|_| Pool::default());
        let base = SiteBase::new(incarnation, Captures::new(config.log_dir.clone()));
        Self { engine, config, base, tools: tokio::sync::Mutex::default(), pool, mounts: Mutex::default() }
    }

    /// After a launch failed: check the tools volume before the next mount (another process's
    /// `prune` may have taken it, and the failed container then found an empty one).
    pub async fn tools_suspect(&self) {
        if let Some((_, checked)) = &mut self.tools.lock().await.current {
            *checked = None;
        }
    }
}

/// This rung's tools volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolsVolume {
    /// The volume to mount.
    pub volume: String,
    /// The init's sha256.
    pub digest: String,
}

/// A rung's tools volume, and the names it made.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    /// The volume attempts mount, and when it was last known to be this rung's (`None`: check
    /// before the next mount).
    pub current: Option<(ToolsVolume, Option<std::time::Instant>)>,
    /// Every volume name this rung made: what `close` removes.
    pub made: Vec<String>,
}

/// The pool's state, shared by the rung.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    pub(super) parked: std::sync::Mutex<VecDeque<Parked>>,
    pub(super) filling: AtomicUsize,
    pub(super) closed: AtomicBool,
    /// The settings every parked container was made with.
    pub(super) template: tokio::sync::OnceCell<Template>,
}

/// What every parked container is made with.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    pub image: String,
    pub applied: Sizes,
}

/// One parked container and what belongs to it.
pub(crate) struct Parked {
    pub attempt_id: String,
    pub name: String,
    pub container_id: String,
    pub attached: Attached,
    pub input_volume: String,
    pub helper: String,
    pub parked_at: Instant,
    pub enforcement: BTreeMap<String, String>,
    pub skipped: BTreeMap<String, String>,
    pub tools: ToolsVolume,
}

impl std::fmt::Debug for Parked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parked").field("name", &self.name).finish_non_exhaustive()
    }
}

/// What the rung remembers of images' paths.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub(super) images: HashMap<String, HashMap<String, PathKind>>,
}
