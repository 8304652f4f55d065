//! The container rung's site: what the rung shares with each of its attempts (the engine,
//! the configuration, the tools volume, the warm pool, what is known of images' paths, the
//! tasks). State only: what is done with it is in `tools`, `pool` and `mounts`, which import
//! this file; it imports none of them.

use super::config::ContainerConfig;
use super::sizes::Sizes;
use crate::attempt::SiteBase;
use crate::attempt::front::{Budget, Gate};
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
    /// The init from a host directory, where the engine can bind it.
    pub host_tools: Mutex<HostTools>,
    /// The warm pool, when configured.
    pub pool: Option<Pool>,
    /// What is known of images' paths where the attempts mount something (`mounts`).
    pub mounts: Mutex<Seen>,
    /// The memory the rung's attempts (and parked containers) may hold at once, in MiB.
    pub budget: std::sync::Arc<tokio::sync::Semaphore>,
    /// Admission: the attempts in flight and the budget.
    pub gate: Gate,
}

impl ContainerSite {
    pub fn new(engine: Engine, config: ContainerConfig, incarnation: String) -> Self {
        let pool = config.pool.as_ref().filter(|p| p.size > 0).map(|_| Pool::default());
        let budget = (engine.facts().mem_total_bytes / (1 << 20)) * 8 / 10;
        let budget_mib =
            u32::try_from(budget.max(64)).unwrap_or(u32::MAX >> 4).min(tokio::sync::Semaphore::MAX_PERMITS as u32);
        let base = SiteBase::new(incarnation, Captures::new(config.log_dir.clone()));
        let budget = std::sync::Arc::new(tokio::sync::Semaphore::new(budget_mib as usize));
        let of = "80% of the engine host";
        let gate = Gate::new(
            config.max_in_flight,
            config.wait_for_admission,
            Some(Budget { permits: budget.clone(), mib: budget_mib, of }),
        );
        Self {
            engine,
            config,
            base,
            tools: tokio::sync::Mutex::default(),
            host_tools: Mutex::default(),
            pool,
            mounts: Mutex::default(),
            budget,
            gate,
        }
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
    /// Instead of the volume: the host directory holding the init, bind-mounted read-only
    /// (an engine on this machine: `tools::host_copy`).
    pub bind: Option<String>,
}

/// A container ready for its attempt: created and attached (cold), or parked and claimed
/// (warm, or cold with its inputs sent over the link: already started, its init waiting for
/// the Start frame).
pub(crate) struct Ready {
    pub container_id: String,
    pub transport: crate::link::session::Transport,
    pub running: bool,
    pub enforcement: BTreeMap<String, String>,
    pub skipped: BTreeMap<String, String>,
    pub tools: ToolsVolume,
    pub inputs: Option<crate::contract::InputsStaged>,
    pub caches: Vec<(String, String, String)>,
    /// `Some(true)`: from the warm pool; `Some(false)`: the pool could not serve it.
    pub warm: Option<bool>,
    /// When (unix ms) the inputs were in their volume.
    pub staged_at: Option<u64>,
    /// The init starts as root and drops to these before the command (inputs over the link).
    pub credentials: Option<stevedore_init::wire::Credentials>,
}

/// Whether the init can come from a host directory (`tools::host_copy`).
#[derive(Debug, Default)]
pub(crate) enum HostTools {
    /// Not looked at yet.
    #[default]
    Untried,
    /// The directory, ready.
    Ready(ToolsVolume),
    /// The engine cannot bind it (not on this machine, SELinux, refused once), or it cannot be
    /// trusted (`Some`: why, for the evidence): volumes.
    Unusable(Option<String>),
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
    /// The sizes of the fills asked for and not started yet, oldest first.
    pub(super) wanted: std::sync::Mutex<VecDeque<Sizes>>,
    pub(super) closed: AtomicBool,
    /// The image every parked container runs, once known to exist.
    pub(super) image: tokio::sync::OnceCell<String>,
    pub(super) stats: std::sync::Mutex<PoolStats>,
    /// What fills under way (or parked containers being discarded) made, by their id: a
    /// fill cut short by a runtime going away leaves them to the rung's `Drop` backstop.
    pub(super) pending: std::sync::Mutex<HashMap<String, Objects>>,
    /// What the last attempts on the pool's image ran: the next fills warm it.
    pub(super) hints: std::sync::Mutex<Hints>,
}

/// What the pool's last attempts ran, for the next fills to read ahead (`pool::learn`,
/// `init/src/warm.rs`), the most recent first.
#[derive(Debug, Default)]
pub(crate) struct Hints {
    pub(super) names: VecDeque<String>,
    pub(super) files: VecDeque<String>,
}

/// What the warm pool did since the rung was made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Attempts served by a parked container.
    pub hits: u64,
    /// Attempts of the pool's image it could not serve (they ran cold).
    pub misses: u64,
    /// Fills started (the first `size`, then one per claim).
    pub fills_started: u64,
    /// Fills that failed (their objects removed).
    pub fills_failed: u64,
    /// Parked containers removed to make room for another size class.
    pub evicted: u64,
    /// The most fills ever under way at once.
    pub most_filling: usize,
    /// Parked now.
    pub parked: usize,
    /// Fills under way now.
    pub filling: usize,
}

/// Containers and volumes, by name.
pub(crate) type Objects = (Vec<String>, Vec<String>);

/// One parked container and what belongs to it.
pub(crate) struct Parked {
    pub attempt_id: String,
    pub name: String,
    pub container_id: String,
    pub attached: Attached,
    pub input_volume: String,
    /// The never-started helper the inputs go through (`None`: over the link, to a root
    /// init that writes them into its staging mount, `wire::STAGE_DIR`).
    pub helper: Option<String>,
    /// What it was made with: its size class and the limits it runs under until updated.
    pub sizes: Sizes,
    /// Its share of the rung's memory budget while it waits (given back when an attempt
    /// needs it: `pool::yield_budget`).
    pub budget: Option<tokio::sync::OwnedSemaphorePermit>,
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
