//! What differs between the rungs that run stevedore's init: where the init runs and how it
//! is started and stopped hard, the sandbox's layout as the Start frame names it, the
//! target a checkpoint points at, the rung's removal of what it made, and what the rung
//! knows when no record arrives. Everything else of an attempt is `attempt`'s, once.

use crate::contract::{
    Checkpoint, EnvOverride, Evidence, InputsStaged, LaunchError, Level, NarrowedLimit, Phases, RecoverError, Target,
};
use crate::hostdir::Captures;
use crate::link::LinkConfig;
use crate::link::judgement::{Account, Witness};
use crate::link::session::Transport;
use crate::link::supervise::Ended;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use stevedore_init::wire::{CgroupCounters, Rlimit};
use tokio_util::task::TaskTracker;

/// The link's settings, as the rung is configured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub link: LinkConfig,
    /// The rung's per-call bound (the reader's end waits at most this long).
    pub call_timeout: Duration,
}

/// What every rung that runs the init keeps for all its attempts.
#[derive(Debug)]
pub(crate) struct SiteBase {
    /// Stamped on everything the rung makes.
    pub incarnation: String,
    /// The rung's own tasks: `close` waits for them (removals, fills, background cleanups).
    pub tracker: TaskTracker,
    /// Where the attempts' captures go.
    pub captures: Captures,
    in_flight: Arc<Mutex<HashSet<String>>>,
    /// The level the rung's last attempt showed of a `vm` claim (`contract::level_shown`):
    /// what `Executor::level` says, and so what the registry selects by.
    shown: Mutex<Option<Level>>,
}

/// An attempt's mark in its rung's in-flight set (this process's `reclaim` spares what it
/// names), until the mark is dropped: with the attempt's removal, once that is done.
#[derive(Debug)]
pub(crate) struct InFlight {
    set: Arc<Mutex<HashSet<String>>>,
    pub id: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.set.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.id);
    }
}

impl SiteBase {
    pub fn new(incarnation: String, captures: Captures) -> Self {
        Self { incarnation, tracker: TaskTracker::new(), captures, in_flight: Arc::default(), shown: Mutex::default() }
    }

    /// Records the level an attempt showed of the rung's `vm` claim.
    pub fn show(&self, level: Level) {
        *self.shown.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(level);
    }

    /// The level the last attempt showed of a `vm` claim, if one did.
    pub fn shown(&self) -> Option<Level> {
        *self.shown.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks `id` in flight until the mark is dropped.
    pub fn enter(&self, id: String) -> InFlight {
        self.in_flight().insert(id.clone());
        InFlight { set: self.in_flight.clone(), id }
    }

    /// The attempt ids in flight (this process's `reclaim` spares them). Never panics: a
    /// poisoned lock still holds a valid set (a Drop backstop and reclaim must work after a
    /// panic elsewhere).
    pub fn in_flight(&self) -> MutexGuard<'_, HashSet<String>> {
        self.in_flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs a removal left by a dropped attempt on the rung's tracked tasks; never blocks or
    /// panics. Without a runtime it runs nowhere (the objects stay labelled for `reclaim`):
    /// `false`.
    pub fn backstop(&self, removal: impl Future<Output = ()> + Send + 'static) -> bool {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                self.tracker.spawn_on(removal, &handle);
                true
            }
            Err(_) => false,
        }
    }
}

/// Who the rung is, for the evidence and the checkpoint.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rung<'a> {
    pub name: &'a str,
    pub level: Level,
    pub base: &'a SiteBase,
    pub settings: Settings,
}

/// What every rung decides of an attempt before its sandbox exists: each rung's own plan
/// holds one (`Launch::decided`), and the shared attempt reads nothing else of it.
#[derive(Debug)]
pub(crate) struct Decided {
    pub attempt_id: String,
    /// Names the attempt's objects and captures.
    pub name: String,
    /// The caller's output dir, opened once.
    pub output_dir: OwnedFd,
    pub argv: Vec<String>,
    /// The command's whole environment (the process rung's, once its dir exists).
    pub env: Vec<(String, String)>,
    pub env_overrides: Vec<EnvOverride>,
    pub cwd: String,
    pub narrowed: Vec<NarrowedLimit>,
    /// When the attempt began (unix ms): its phases count from it.
    pub started_ms: u64,
}

impl Decided {
    /// A new attempt's id, and its name as `name` makes it of the id; the rest to be filled.
    pub fn new(started_ms: u64, output_dir: OwnedFd, argv: Vec<String>, name: impl FnOnce(&str) -> String) -> Self {
        let attempt_id = crate::util::random_hex(6);
        Self {
            name: name(&attempt_id),
            attempt_id,
            output_dir,
            argv,
            env: Vec::new(),
            env_overrides: Vec::new(),
            cwd: String::new(),
            narrowed: Vec::new(),
            started_ms,
        }
    }
}

/// What the rung decided, and the phases it timed before handing over (prepared, inputs
/// staged, created).
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    pub decided: &'a Decided,
    pub phases: Phases,
}

impl std::ops::Deref for Plan<'_> {
    type Target = Decided;

    fn deref(&self) -> &Decided {
        self.decided
    }
}

/// A sandbox the rung provisioned: the init waits for its Start frame on `transport`.
pub(crate) struct Provisioned<O> {
    pub transport: Transport,
    /// It runs already (a parked container, a spawned init); else [`Site::start`] starts it.
    pub running: bool,
    pub own: O,
    pub layout: Layout,
    pub enforcement: BTreeMap<String, String>,
    pub skipped: BTreeMap<String, String>,
    pub inputs: Option<InputsStaged>,
}

impl<O> std::fmt::Debug for Provisioned<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provisioned").field("running", &self.running).finish_non_exhaustive()
    }
}

/// How the Start frame describes the sandbox to the init.
#[derive(Debug, Clone, Default)]
pub(crate) struct Layout {
    /// Where the inputs are (`/in`, or the process rung's copy).
    pub in_dir: String,
    /// Where the outputs go.
    pub out_dir: String,
    pub takeover_uid: Option<u32>,
    pub takeover_fd: Option<i32>,
    pub rlimits: Vec<Rlimit>,
    pub cgroup_dir: Option<String>,
    /// Directories whose size the record reports (caches).
    pub measure: Vec<String>,
    /// Where the rung mounted something (`wire::Start::mounts`).
    pub mounts: Vec<String>,
    /// The image's environment is PID 1's, which the host cannot read (`wire::Start::image_env`):
    /// the keys the rung set for PID 1 alone.
    pub image_env: Option<Vec<String>>,
    /// The scratch dir, sampled for the timeline when it is a filesystem of its own.
    pub tmp_dir: Option<String>,
    /// The cgroup the timeline samples when it is not at `cgroup_dir` (the process rung's,
    /// made on the host); with neither, the Outcome says why there is no timeline.
    pub sampled_cgroup: Option<stevedore_init::wire::SampledCgroup>,
    /// The init runs as root and drops to these before the command (`wire::Start::credentials`).
    pub credentials: Option<stevedore_init::wire::Credentials>,
    /// The cgroup limits an engine the rung does not control applied (the container and kube
    /// rungs'), for the init to read back before the command where the policy demands them
    /// (`wire::Start::held`).
    pub held: Vec<stevedore_init::wire::Held>,
}

/// This machine's kernel (`/proc/version`): `Site::host_kernel` of the rungs that run here.
#[cfg(any(feature = "process", feature = "oci"))]
pub(crate) fn local_kernel() -> Option<String> {
    std::fs::read_to_string("/proc/version").ok()
}

/// Milliseconds from `started_ms` (unix) to now: a phase's offset.
pub(crate) fn since(started_ms: u64) -> Option<u64> {
    Some(crate::contract::unix_ms_now().saturating_sub(started_ms))
}

/// What one attempt's removal found.
#[derive(Debug, Default)]
pub(crate) struct Removed {
    pub errors: Vec<String>,
    /// Objects someone else had removed or was removing.
    pub by_others: Vec<String>,
    /// The attempt's cgroup counters, read by the host once everything in it ended.
    pub counters: Option<CgroupCounters>,
}

/// Removes what a rung made for one attempt. Explicit removal awaits [`Teardown::remove`]; a
/// teardown dropped first hands its work to the rung's tracked tasks (its `Drop`).
pub(crate) trait Teardown: Send + 'static {
    fn remove(self) -> impl Future<Output = Removed> + Send + 'static;
}

/// What must outlive the worker of an attempt: the shared facts and the rung's own (`own`).
/// It is the checkpoint's `state`, and what the end of the attempt is judged from.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Ledger<O> {
    pub attempt_id: String,
    pub name: String,
    pub started_ms: u64,
    pub expects_handler: bool,
    /// The capture files' names in the worker's capture dir.
    pub captures: [String; 2],
    pub max_files: u64,
    pub max_total_bytes: u64,
    pub narrowed: Vec<NarrowedLimit>,
    pub env_overrides: Vec<EnvOverride>,
    pub enforcement: BTreeMap<String, String>,
    pub skipped: BTreeMap<String, String>,
    pub inputs: Option<InputsStaged>,
    pub ports: BTreeMap<String, String>,
    /// The phases timed until the command was told to start.
    #[serde(default)]
    pub phases: Phases,
    /// The attempt's action, unsealed: its digest is taken once the rung's evidence is in
    /// (`attempt::action`).
    #[serde(default)]
    pub action: Option<crate::contract::Action>,
    pub own: O,
}

/// One rung that runs stevedore's init (`attempt` does the rest).
pub(crate) trait Site: Sync {
    /// The rung's own facts of an attempt.
    type Own: Clone + Serialize + for<'de> Deserialize<'de> + Send + Sync + std::fmt::Debug + 'static;
    /// Its removal of an attempt's objects.
    type Teardown: Teardown;

    fn rung(&self) -> Rung<'_>;
    /// Starts a provisioned sandbox unless it runs already (`running`); its published ports
    /// (container port → the address that reaches it).
    fn start(&self, own: &Self::Own, running: bool) -> impl Future<Output = Result<Ports, LaunchError>> + Send;
    /// What the checkpoint points at.
    fn target(&self, own: &Self::Own) -> Target;
    /// SIGKILLs everything of the attempt, when its init did not finish in time.
    fn hard_stop(&self, own: &Self::Own) -> impl Future<Output = ()> + Send;
    /// Whether the attempt's init still runs (`None`: the rung cannot tell now, as while
    /// the engine is out of reach): a cut link is not waited for once it is gone.
    fn init_runs(&self, own: &Self::Own) -> impl Future<Output = Option<bool>> + Send;
    /// What the rung saw of the end, asked before the removal. `link_verdict`: the init's
    /// last frame arrived (its verified record, then the outputs' end), and only the rung's
    /// cheap facts are worth having; else the rung waits, bounded, for its engine's view of
    /// the end (exit, OOM), and lists `/out` where it can still reach it.
    fn witness(&self, own: &Self::Own, link_verdict: bool) -> impl Future<Output = Witness> + Send;
    /// The init's last frame arrived (before the witness and the removal): nothing of the
    /// attempt runs but the init's own exit, so the removal need not wait for the rung's
    /// engine to see the end (the kube rung deletes the Pod with grace 0 at once).
    fn last_frame(&self, _own: &Self::Own) {}
    /// What the engine's going away looked like, if it went away while the attempt ran;
    /// asked only when the end is one that explains (a signal, no verified record). A rung
    /// without an engine to lose has nothing to say.
    fn engine_lost(&self, _own: &Self::Own) -> impl Future<Output = Option<String>> + Send {
        std::future::ready(None)
    }
    /// The rung's evidence of the attempt, after its removal, and the bounds its claims are
    /// checked against.
    fn account(&self, ledger: &Ledger<Self::Own>, ended: &Ended, ev: &mut Evidence) -> Account;
    /// Sets the rung's part of an attempt's action: the image by id (when known before the
    /// command starts), the network, the user, the root's writability, the caches
    /// (`docs/outcome.md`, "Action digest").
    fn action(&self, own: &Self::Own, action: &mut crate::contract::Action);
    /// The worker binary a handler attempt ran, for the error when it never spoke.
    fn worker_named(&self, own: &Self::Own) -> String;
    /// The sandbox's cgroup as the host reads it (`attempt::host_cgroup`), asked at the init's
    /// last frame when the init read none (gVisor shows it no cgroup files); `None`: the host
    /// cannot (a remote engine, a cluster's node).
    fn sandbox_counters(&self, _own: &Self::Own) -> Option<stevedore_init::wire::CgroupCounters> {
        None
    }
    /// The kernel the rung's sandboxes share unless a VM-grade runtime runs them (a
    /// `/proc/version` line or a bare release), to show a `vm` level against what the init saw
    /// (`contract::level_shown`); `None`: not known here.
    fn host_kernel(&self) -> Option<String> {
        None
    }
    /// The host path of the attempt's output dir where the rung holds it (a filesystem it
    /// mounted, derived from what it made, never from a checkpoint's words): the host walks it
    /// in place at the init's end (`outputs::in_place`) and the init sends no tar. `None`: the
    /// outputs come over the link.
    fn outputs_in_place(&self, _own: &Self::Own) -> Option<std::path::PathBuf> {
        None
    }
    /// Whether a finished attempt with a verified record is removed after its outcome is
    /// returned, on the rung's tracked tasks.
    fn background_cleanup(&self) -> bool {
        false
    }
    /// Finds a checkpoint's attempt again (its rung, key and ids were checked): its
    /// teardown, or why not (after removing what was left of it).
    fn reattach(
        &self,
        cp: &Checkpoint,
        ledger: &Ledger<Self::Own>,
    ) -> impl Future<Output = Result<Self::Teardown, RecoverError>> + Send;
    /// A transport to the init's takeover socket; `within`: how long the takeover has left.
    fn takeover(
        &self,
        ledger: &Ledger<Self::Own>,
        link_id: &str,
        within: Duration,
    ) -> impl Future<Output = Result<Transport, String>> + Send;
}

/// Published ports: container port → the address that reaches it.
pub(crate) type Ports = BTreeMap<String, String>;
