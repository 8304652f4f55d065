//! One attempt as a child process of the worker: the attempt's dir (a private copy of the
//! inputs, `out/`, `tmp/`), a cgroup when one is delegated, stevedore's init started as the
//! dedicated uid with the link on its stdin/stdout, the checkpoint hook, the Start frame;
//! then the same supervision, claims and judge as the container rung.

use super::cgroup::{self, Cgroup};
use super::config::ProcessConfig;
use super::dirs::AttemptDir;
use super::executor::Shared;
use crate::contract::{
    CHECKPOINT_VERSION, Checkpoint, Evidence, Exit, HOOK_TIMEOUT, HookError, InputsStaged, LaunchError, Level,
    LinkSecret, NarrowedLimit, Outcome, Request, Target, Task, judge, limits::key,
};
use crate::inputs::{InputDir, StageError};
use crate::link::claims::Bounds;
use crate::link::judgement::{self, Frame, Witness};
use crate::link::reports::{self, ReportRoute};
use crate::link::session::{self, Inbound, OutputsSink, ReaderSetup, Sender};
use crate::link::supervise::{Ended, HardStop, Linked, Rules, supervise};
use crate::link::{CappedLog, LiveSink};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stevedore_init::wire::CgroupCounters;
use stevedore_init::wire::{self, HANDLER_MARKER, HandlerRequest, KEY_LEN, RlimitResource, Start, env as wire_env};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The file in an attempt's dir naming its init (`<pid> <start ticks>`).
pub(crate) const PID_FILE: &str = "init.pid";

/// What the rung knows of one attempt that must outlive the worker (see `recover`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Ledger {
    pub attempt_id: String,
    pub name: String,
    pub dir: AttemptDir,
    pub cgroup: Option<Cgroup>,
    pub init_pid: i32,
    pub start_ticks: u64,
    pub memory: Option<u64>,
    pub cpu_millis: Option<u64>,
    pub narrowed: Vec<NarrowedLimit>,
    pub enforcement: BTreeMap<String, String>,
    pub skipped: BTreeMap<String, String>,
    pub inputs: Option<InputsStaged>,
    pub expects_handler: bool,
    pub started_ms: u64,
    pub captures: [String; 2],
    pub max_files: u64,
    pub max_total_bytes: u64,
    /// The uid the command runs as (its lease is taken over with the attempt).
    #[serde(default)]
    pub uid: Option<u32>,
}

/// The limits after defaults and ceilings.
#[derive(Debug, Default)]
struct Applied {
    memory: Option<u64>,
    cpu_millis: Option<u64>,
    pids: Option<u64>,
    narrowed: Vec<NarrowedLimit>,
}

fn apply_limits(req: &Request, cfg: &ProcessConfig) -> Applied {
    let mut a = Applied::default();
    for k in [key::MEMORY, key::CPU, key::PIDS] {
        let asked = req.limits.get(k).or_else(|| cfg.defaults.get(k));
        let v = match (asked, cfg.ceilings.get(k)) {
            (Some(v), Some(c)) if v > c => {
                a.narrowed.push(NarrowedLimit { key: k.into(), from: v, to: c, why: "rung ceiling".into() });
                Some(c)
            }
            (None, Some(c)) => Some(c),
            (v, _) => v,
        };
        match k {
            key::MEMORY => a.memory = v,
            key::CPU => a.cpu_millis = v,
            _ => a.pids = v,
        }
    }
    a
}

/// What the process rung enforces, and what it does not, for the evidence.
fn enforcement(
    shared: &Shared,
    applied: &Applied,
    cg: &Result<Option<Cgroup>, String>,
    inputs_sealed: Option<bool>,
    identity: Option<(u32, u32)>,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let cfg = &shared.config;
    let mut on = BTreeMap::new();
    let mut off = BTreeMap::new();
    match identity {
        Some((u, g)) if cfg.uids.is_some() => {
            on.insert(
                "uid".into(),
                format!("uid {u} gid {g} of the attempt's own, not the worker's uid {}", shared.euid),
            );
            on.insert(
                "between_attempts".into(),
                format!(
                    "no other attempt has uid {u} while anything of it is left (range {}): none can signal, ptrace or \
                     read the other's /proc entries or files; its processes, its files in /tmp, /var/tmp and /dev/shm \
                     and its IPC objects are swept when it ends",
                    cfg.uids.map(|r| r.to_string()).unwrap_or_default()
                ),
            );
        }
        Some((u, g)) => {
            on.insert("uid".into(), format!("uid {u} gid {g}, not the worker's uid {}", shared.euid));
        }
        None => {
            off.insert(
                "uid".into(),
                format!(
                    "the worker's own uid {} (allowed by configuration): it can read the worker's files",
                    shared.euid
                ),
            );
        }
    }
    if cfg.uids.is_none() {
        let shared_uid = identity.map_or(shared.euid, |(u, _)| u);
        if shared.uids.is_none() {
            off.insert(
                "between_attempts".into(),
                format!(
                    "attempts run side by side as uid {shared_uid} (allowed by configuration): they can signal, \
                     ptrace and read each other"
                ),
            );
        } else {
            on.insert(
                "between_attempts".into(),
                format!(
                    "one attempt at a time as uid {shared_uid}; what one leaves in the host's shared dirs is not swept \
                     (the uid is not the rung's own)"
                ),
            );
        }
    }
    on.insert("session".into(), "own session and process group; SIGTERM, grace, SIGKILL; stragglers killed".into());
    on.insert("env".into(), "the request's variables plus PATH, HOME and TMPDIR only".into());
    for l in &cfg.rlimits {
        let (name, what) = match l.resource {
            RlimitResource::Nofile => ("nofile", "open files per process".to_owned()),
            RlimitResource::Nproc => ("nproc", "processes of the attempt's uid in all".into()),
            RlimitResource::Core => ("core", "largest core dump, bytes".into()),
            RlimitResource::Cpu => ("cpu", "CPU seconds per process, in total (not a rate)".into()),
            RlimitResource::Fsize => ("fsize", "largest file written, bytes".into()),
        };
        on.insert(format!("rlimit.{name}"), format!("{} soft, {} hard: {what}", l.soft, l.hard));
    }
    match cg {
        Ok(Some(c)) => {
            let where_ = c.describe();
            if let Some(m) = applied.memory {
                on.insert("memory".into(), format!("{m} bytes, swap off ({where_})"));
            }
            if let Some(m) = applied.cpu_millis {
                on.insert("cpu".into(), format!("{} cores of CPU time per period ({where_})", m as f64 / 1000.0));
            }
            if let Some(p) = applied.pids {
                on.insert("pids".into(), format!("{p} ({where_})"));
            }
        }
        other => {
            let why = match other {
                Err(e) => format!("no cgroup could be made ({e}): not enforced"),
                _ => "no cgroup is delegated to stevedore: not enforced".into(),
            };
            if applied.memory.is_some() {
                off.insert("memory".into(), format!("{why} (RLIMIT_AS is not a memory limit)"));
            }
            if applied.cpu_millis.is_some() {
                off.insert("cpu".into(), why.clone());
            }
            if applied.pids.is_some() {
                off.insert("pids".into(), format!("{why} (RLIMIT_NPROC counts every process of the uid)"));
            }
        }
    }
    off.insert("disk".into(), "no mount enforces it: outputs go to a directory on the host's filesystem".into());
    off.insert("network".into(), "the process rung shares the host's network".into());
    match inputs_sealed {
        Some(true) => {
            on.insert("inputs".into(), "a private copy, read-only (owned by the worker, not the command's uid)".into());
        }
        Some(false) => {
            off.insert(
                "inputs.read_only".into(),
                "a private copy owned by the command's own uid: it can make it writable again".into(),
            );
        }
        None => {}
    }
    (on, off)
}

/// `/proc/<pid>/stat` field 22: when the process started, in clock ticks since boot.
pub(crate) fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// Kills the init and every process of the command's session(s), or the whole cgroup.
pub(crate) struct ProcessStop<'a> {
    pub init_pid: i32,
    pub cgroup: Option<&'a Cgroup>,
}

impl HardStop for ProcessStop<'_> {
    fn hard_stop(&self) -> crate::util::BoxFuture<'_, ()> {
        Box::pin(async move {
            kill_tree(self.init_pid, self.cgroup);
        })
    }
}

/// SIGKILLs the init and what it runs: the cgroup's processes, or those of the sessions its
/// children lead.
pub(crate) fn kill_tree(init_pid: i32, cgroup: Option<&Cgroup>) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    if let Some(c) = cgroup {
        c.kill_all();
    }
    let mut sessions = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return };
    let stats: Vec<(i32, i32, i32)> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let mut f = stat.rsplit_once(')')?.1.split_whitespace();
            let ppid = f.nth(1)?.parse().ok()?;
            let sid = f.nth(1)?.parse().ok()?;
            Some((pid, ppid, sid))
        })
        .collect();
    for &(pid, ppid, _) in &stats {
        if ppid == init_pid {
            sessions.push(pid);
        }
    }
    let _ = kill(Pid::from_raw(init_pid), Signal::SIGKILL);
    for &(pid, _, sid) in &stats {
        if sessions.contains(&sid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Removes an attempt's dir and cgroup, whichever way it ends: awaited at its end, or by a
/// `Drop` backstop that stops the init (SIGTERM: it stops the command and exits) and hands
/// the rest to the rung's tracked tasks.
pub(crate) struct Cleanup {
    shared: Arc<Shared>,
    pub attempt_id: String,
    pub dir: Option<AttemptDir>,
    pub cgroup: Option<Cgroup>,
    pub init: Option<tokio::process::Child>,
    /// An init that is not this process's child (a recovered attempt's): pid, start ticks.
    pub adopted: Option<(i32, u64)>,
    /// The attempt's uid, released (and swept) once everything else is gone.
    pub lease: Option<super::uids::Lease>,
    done: bool,
}

impl std::fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cleanup").field("attempt_id", &self.attempt_id).field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl Cleanup {
    pub fn new(shared: Arc<Shared>, attempt_id: String) -> Self {
        shared.in_flight().insert(attempt_id.clone());
        Self { shared, attempt_id, dir: None, cgroup: None, init: None, adopted: None, lease: None, done: false }
    }

    /// Waits (bounded) for the init to exit, kills what is left, reads the cgroup's final
    /// counters, removes the dir and the cgroup. Returns the counters and what could not be
    /// removed.
    pub async fn run(mut self) -> (Option<CgroupCounters>, Vec<String>) {
        if let Some((pid, ticks)) = self.adopted.take() {
            wait_gone(pid, ticks, self.shared.config.kill_margin + Duration::from_secs(3), self.cgroup.as_ref()).await;
        }
        let mut done =
            finish(self.init.take(), self.dir.take(), self.cgroup.take(), self.shared.config.kill_margin).await;
        done.1.extend(release(self.lease.take()).await);
        self.done = true;
        self.shared.in_flight().remove(&self.attempt_id);
        done
    }
}

/// Leases the attempt's uid, when the rung leases them (off the runtime's threads: it reads
/// `/proc` and may sweep).
async fn lease_uid(shared: &Arc<Shared>) -> Result<Option<super::uids::Lease>, LaunchError> {
    let s = shared.clone();
    let leased = tokio::task::spawn_blocking(move || s.uids.as_ref().map(|u| u.lease()).transpose())
        .await
        .map_err(|e| staging("leasing a uid", e))?;
    leased.map_err(|e| match e {
        e @ (super::uids::UidError::Exhausted { .. } | super::uids::UidError::Taken { .. }) => {
            LaunchError::AdmissionRefused(e.to_string())
        }
        e => staging("leasing a uid", e),
    })
}

/// Ends a uid's lease once nothing of its attempt runs: what it left is swept. The errors.
async fn release(lease: Option<super::uids::Lease>) -> Vec<String> {
    let Some(lease) = lease else { return Vec::new() };
    let uid = lease.uid;
    match tokio::task::spawn_blocking(move || lease.release()).await {
        Ok(true) => Vec::new(),
        Ok(false) => vec![format!(
            "uid {uid} still holds something (a process, a file in a shared dir, an IPC object): it is kept back \
             until a sweep finds it clean"
        )],
        Err(e) => vec![format!("releasing uid {uid}: {e}")],
    }
}

/// Waits (bounded) for a process that is not our child to exit; then kills what is left.
pub(crate) async fn wait_gone(pid: i32, ticks: u64, within: Duration, cgroup: Option<&Cgroup>) {
    let until = Instant::now() + within;
    while start_ticks(pid) == Some(ticks) {
        if Instant::now() >= until {
            kill_tree(pid, cgroup);
            return;
        }
        // Not our child: there is no exit to wait on, only /proc to look at.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn finish(
    init: Option<tokio::process::Child>,
    dir: Option<AttemptDir>,
    cgroup: Option<Cgroup>,
    margin: Duration,
) -> (Option<CgroupCounters>, Vec<String>) {
    let mut errors = Vec::new();
    let mut counters = None;
    if let Some(mut child) = init
        && tokio::time::timeout(margin + Duration::from_secs(3), child.wait()).await.is_err()
    {
        if let Some(pid) = child.id() {
            kill_tree(pid as i32, cgroup.as_ref());
        }
        let _ = child.wait().await;
    }
    if let Some(c) = &cgroup {
        // Processes SIGKILLed a moment ago may still be on their way out of the cgroup.
        for _ in 0..50 {
            c.kill_all();
            if c.procs().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        counters = Some(c.read());
        errors.extend(c.remove());
    }
    if let Some(d) = dir {
        let removed = tokio::task::spawn_blocking(move || d.remove()).await;
        match removed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(crate::util::error_chain(&e)),
            Err(e) => errors.push(e.to_string()),
        }
    }
    (counters, errors)
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(pid) = self.init.as_ref().and_then(tokio::process::Child::id) {
            // The init stops its command within the grace and exits; it does not wait for
            // a takeover after a SIGTERM.
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
        }
        let (init, dir, cgroup) = (self.init.take(), self.dir.take(), self.cgroup.take());
        let lease = self.lease.take();
        let shared = self.shared.clone();
        let id = self.attempt_id.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let tracker = shared.tracker.clone();
            tracker.spawn_on(
                async move {
                    let (_, mut errors) = finish(init, dir, cgroup, shared.config.kill_margin).await;
                    errors.extend(release(lease).await);
                    shared.in_flight().remove(&id);
                    if !errors.is_empty() {
                        tracing::warn!(attempt_id = %id, ?errors, "backstop cleanup left things behind");
                    }
                },
                &handle,
            );
        }
    }
}

pub(crate) async fn run(shared: Arc<Shared>, req: &Request, cancel: CancellationToken) -> Result<Outcome, LaunchError> {
    let span = tracing::info_span!(
        "attempt",
        job = %req.job_id,
        attempt = req.attempt,
        worker = %req.worker_id,
        pid = tracing::field::Empty
    );
    attempt(shared, req, cancel).instrument(span).await
}

fn random_hex(bytes: usize) -> String {
    (0..bytes).map(|_| format!("{:02x}", rand::random::<u8>())).collect()
}

fn staging(what: impl Into<String>, e: impl std::error::Error + Send + Sync + 'static) -> LaunchError {
    LaunchError::Staging { what: what.into(), source: Box::new(e) }
}

/// Copies the input dir into `dir.input` (regular files, dirs and symlinks, through
/// descriptors, within the limit) and seals it.
async fn copy_inputs(
    src: PathBuf,
    dir: &AttemptDir,
    limit: u64,
    run_as: Option<(u32, u32)>,
) -> Result<(InputsStaged, bool), LaunchError> {
    let input = InputDir::open(&src).map_err(|e| staging(format!("input dir {}", src.display()), e))?;
    let (bytes, files) = input.measure().map_err(|e| staging(format!("input dir {}", src.display()), e))?;
    if bytes > limit {
        return Err(LaunchError::InputTooLarge { bytes, limit });
    }
    let dest = dir.clone();
    let (report, sealed) = tokio::task::spawn_blocking(move || {
        let (reader, writer) = std::io::pipe().map_err(|e| staging("a pipe", e))?;
        let into = dest.input.clone();
        let unpack = std::thread::spawn(move || {
            let mut a = tar::Archive::new(reader);
            a.set_preserve_permissions(false);
            a.unpack(&into)
        });
        let written = input.write_tar(0, 0, limit, writer, &|_| {});
        let unpacked = unpack.join().map_err(|_| staging("copying the inputs", std::io::Error::other("panicked")))?;
        let report = written.map_err(|e| match e {
            StageError::TooLarge { limit } => LaunchError::InputTooLarge { bytes: limit + 1, limit },
            e => staging("reading the input dir", e),
        })?;
        unpacked.map_err(|e| staging("copying the inputs", e))?;
        let sealed = dest.seal_inputs(run_as).map_err(|e| staging("sealing the inputs", e))?;
        Ok::<_, LaunchError>((report, sealed))
    })
    .await
    .map_err(|e| staging("copying the inputs", e))??;
    Ok((InputsStaged { files, bytes, limit_bytes: limit, skipped: report.skipped, sparse: report.sparse }, sealed))
}

async fn attempt(shared: Arc<Shared>, req: &Request, cancel: CancellationToken) -> Result<Outcome, LaunchError> {
    let cfg = &shared.config;
    let started_ms = crate::contract::unix_ms_now();
    let output_dir = req.open_output_dir()?;
    let argv = match &req.task {
        Task::Command(argv) => argv.clone(),
        Task::Handler(_) => vec![shared.worker_exe()?.display().to_string(), HANDLER_MARKER.to_owned()],
    };
    let applied = apply_limits(req, cfg);
    let attempt_id = random_hex(6);
    let name = format!("{}-{attempt_id}", &req.worker_id[..req.worker_id.len().min(40)]);
    let mut cleanup = Cleanup::new(shared.clone(), attempt_id.clone());
    cleanup.lease = lease_uid(&shared).await?;
    // Who the command runs as: `None` is the worker's own uid.
    let identity = match (&cleanup.lease, cfg.run_as) {
        (Some(l), None) if cfg.uids.is_some() => Some((l.uid, l.uid)),
        (_, Some((u, g))) if u != shared.euid => Some((u, g)),
        _ => None,
    };
    let dir = AttemptDir::create(&shared.attempts, &name, identity).map_err(|e| staging("the attempt's dir", e))?;
    cleanup.dir = Some(dir.clone());
    let (inputs, sealed) = match &req.input_dir {
        Some(src) => {
            let (i, s) = copy_inputs(src.clone(), &dir, cfg.max_input_bytes, identity).await?;
            (Some(i), Some(s))
        }
        None => (None, None),
    };
    let limits = cgroup::Limits { memory: applied.memory, cpu_millis: applied.cpu_millis, pids: applied.pids };
    let cg = cgroup::create(&cfg.cgroup, &name, limits);
    let (enforcement, skipped) = enforcement(&shared, &applied, &cg, sealed, identity);
    cleanup.cgroup = cg.clone().ok().flatten();
    if cancel.is_cancelled() {
        let _ = cleanup.run().await;
        return Err(LaunchError::CancelledBeforeStart);
    }

    let mut cmd = tokio::process::Command::new(&shared.init);
    cmd.env_clear()
        .current_dir(&dir.tmp)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Out of the worker's process group: a terminal's Ctrl-C is the worker's to handle.
        .process_group(0);
    if let Some((uid, gid)) = identity {
        cmd.uid(uid).gid(gid);
    }
    let listener = dir.takeover_listener().map_err(|e| staging("the attempt's takeover socket", e))?;
    super::spawn::with_takeover_fd(&mut cmd, listener);
    let mut child = cmd.spawn().map_err(|e| staging(format!("starting the init {}", shared.init.display()), e))?;
    // Closes this process's copy of the takeover socket: the init holds it now.
    drop(cmd);
    let spawned_at = Instant::now();
    let init_pid = child.id().map_or(0, |p| p as i32);
    tracing::Span::current().record("pid", init_pid);
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    cleanup.init = Some(child);
    let ticks = start_ticks(init_pid).unwrap_or(0);
    // For `reclaim` after a crash: which process this attempt's init is.
    let uid = identity.map_or(shared.euid, |(u, _)| u);
    if let Err(e) = std::fs::write(dir.root.join(PID_FILE), format!("{init_pid} {ticks} {uid}\n")) {
        let _ = cleanup.run().await;
        return Err(staging("the attempt's pid file", e));
    }
    if let Some(c) = &cleanup.cgroup
        && let Err(e) = c.enter(init_pid as u32)
    {
        let _ = cleanup.run().await;
        return Err(LaunchError::Staging { what: "moving the init into its cgroup".into(), source: e.into() });
    }
    let (Some(stdin), Some(stdout), Some(stderr)) = (stdin, stdout, stderr) else {
        let _ = cleanup.run().await;
        return Err(LaunchError::Staging { what: "the init's pipes".into(), source: "missing".into() });
    };

    let logs = shared.log_base().and_then(|b| b.subdir(&req.worker_id)).map_err(|e| staging("the capture dir", e))?;
    let captures = [format!("{name}.stdout"), format!("{name}.stderr")];
    let capture =
        |n: &str| CappedLog::create(&logs, n, cfg.log_cap_bytes).map_err(|e| staging(format!("the capture {n}"), e));
    let key: [u8; KEY_LEN] = rand::random();
    let link_id = random_hex(16);
    let (report_tx, report_task) = match &req.hooks {
        Some(h) => {
            let (tx, task) = reports::forward(h.clone(), req.attempt_ref());
            (Some(tx), Some(task))
        }
        None => (None, None),
    };
    let started_tx = report_tx.clone();
    let setup = ReaderSetup {
        key,
        stdout: capture(&captures[0])?,
        stderr: capture(&captures[1])?,
        live: LiveSink::new(req.live.clone()),
        outputs: OutputsSink { dest: output_dir, caps: cfg.output_caps },
        reports: ReportRoute::new(scope(req), report_tx),
        stop: Default::default(),
    };
    let inbound = futures_util::stream::select(
        tokio_util::io::ReaderStream::new(stdout).map(|r| r.map(Inbound::Link)),
        tokio_util::io::ReaderStream::new(stderr).map(|r| r.map(Inbound::InitStderr)),
    );
    let (events_tx, events) = mpsc::unbounded_channel();
    let stop = setup.stop.clone();
    let reader = session::ReaderTask::spawn(&shared.tracker, session::read(inbound, setup, events_tx));
    let sender = Sender::new(Box::pin(stdin));
    let ledger = Ledger {
        attempt_id,
        name,
        dir,
        cgroup: cleanup.cgroup.clone(),
        init_pid,
        start_ticks: ticks,
        memory: applied.memory,
        cpu_millis: applied.cpu_millis,
        narrowed: applied.narrowed,
        enforcement,
        skipped,
        inputs,
        expects_handler: matches!(req.task, Task::Handler(_)),
        started_ms,
        captures,
        max_files: cfg.output_caps.max_files as u64,
        max_total_bytes: cfg.output_caps.max_total_bytes,
        uid: identity.map(|(u, _)| u),
    };
    if let Some(hooks) = &req.hooks {
        let cp = checkpoint(&shared, req, &ledger, &key, &link_id, spawned_at);
        let failed = match tokio::time::timeout(HOOK_TIMEOUT, hooks.0.checkpoint(&cp)).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(HookError::new(format!("no answer within {}s", HOOK_TIMEOUT.as_secs()))),
        };
        if let Some(e) = failed {
            reader.abort();
            drop(sender);
            let _ = cleanup.run().await;
            return Err(LaunchError::Hook(e));
        }
    }
    // Sent, and the sender let go: the forwarding task ends once the reader's is gone too,
    // and the attempt's end waits for nothing more.
    if let Some(tx) = started_tx {
        let info = crate::contract::StartedInfo { container_id: None, pid: Some(init_pid), ports: BTreeMap::new() };
        let _ = tx.try_send(reports::Delivery::Started(info));
    }
    let started = spawned_at;
    let start = start_frame(&shared, req, &ledger, &argv, &key, &link_id, spawned_at);
    if let Err(e) = sender.raw(&wire::encode_start(&start, &req.payload)).await {
        tracing::warn!(error = %e, "could not send the start to the init");
    }
    let heartbeat = cfg.host_loss.heartbeat_timeout.map(|_| sender.heartbeats(cfg.host_loss.heartbeat_every));
    let mut link = Linked { started, sender, stop, events, reader, heartbeat };
    let ended = supervise_it(&shared, req, &mut link, &ledger, &cancel).await;
    drop(link);
    let outcome = conclude(&shared, req, &ledger, ended, cleanup, report_task, None).await;
    Ok(outcome)
}

pub(crate) async fn supervise_it(
    shared: &Shared,
    req: &Request,
    link: &mut Linked,
    ledger: &Ledger,
    cancel: &CancellationToken,
) -> Ended {
    let cfg = &shared.config;
    let rules = Rules {
        kill_margin: cfg.kill_margin,
        call_timeout: Duration::from_secs(30),
        collection: cfg.collection,
        max_output_bytes: cfg.output_caps.max_total_bytes,
    };
    let stop = ProcessStop { init_pid: ledger.init_pid, cgroup: ledger.cgroup.as_ref() };
    supervise(link, req, rules, cancel, &stop).await
}

/// After supervision: the cgroup's counters into the record, the cleanup, the judge, the
/// outcome hook.
pub(crate) async fn conclude(
    shared: &Arc<Shared>,
    req: &Request,
    ledger: &Ledger,
    mut ended: Ended,
    cleanup: Cleanup,
    report_task: Option<tokio::task::JoinHandle<reports::Delivered>>,
    recovered: Option<String>,
) -> Outcome {
    let (counters, mut errors) = cleanup.run().await;
    // Read once everything in the cgroup was gone, so final. The host read them itself, so
    // they replace the init's (which has no cgroup of its own to read).
    if let (Some(c), Some(Ok(rec))) = (counters, &mut ended.record) {
        rec.cgroup = c;
    }
    let delivered = reports::finish(report_task).await;
    let cfg = &shared.config;
    let mut ev = Evidence {
        executor: cfg.name.clone(),
        level: Some(Level::Process),
        worker: req.worker_id.clone(),
        incarnation: shared.incarnation.clone(),
        started_at_unix_ms: Some(ledger.started_ms),
        finished_at_unix_ms: Some(crate::contract::unix_ms_now()),
        enforcement: ledger.enforcement.clone(),
        skipped: ledger.skipped.clone(),
        limits_narrowed: ledger.narrowed.clone(),
        init: Some(format!("pid {} ({})", ledger.init_pid, shared.init.display())),
        inputs: ledger.inputs.clone(),
        recovered,
        ..Evidence::default()
    };
    for e in errors.drain(..) {
        ev.notes.push(format!("cleanup: {e}"));
    }
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let frame = Frame {
        expects_handler: ledger.expects_handler,
        bounds: Bounds {
            host_wall: ended.host_wall,
            cpus: ledger.cpu_millis.map_or(ncpu, |m| (m as f64 / 1000.0).min(ncpu)),
            memory: ledger.memory.unwrap_or(u64::MAX),
            cgroup_note: "usage read by stevedore from the attempt's own cgroup once everything in it ended: cpu, \
                          memory high-water mark (the init's own included), oom_kill count",
        },
        disk_limit: None,
        hard_stop: "the init and the command's session were SIGKILLed",
    };
    let witness = Witness {
        exit: Exit::Unknown,
        oom_killed: None,
        removed_externally: false,
        why_no_record: "no record from the init",
    };
    let (mut j, silent) = judgement::judgement(&ended, &frame, witness, delivered, ev);
    if ledger.cgroup.is_none() {
        let why = "no cgroup: the high-water mark of a process tree is not knowable without one";
        j.usage.sources.peak_memory_bytes = Some(crate::contract::Source::unavailable(why));
    }
    if silent {
        j.evidence.notes.push(
            "the worker binary did not answer the handler protocol: does its main call stevedore::sandbox::main_hook?"
                .into(),
        );
    }
    let mut outcome = judge(req, j);
    tracing::info!(status = %outcome.status, reason = ?outcome.reason, "attempt finished");
    if let Some(hooks) = &req.hooks {
        hooks.deliver_outcome(&mut outcome).await;
    }
    outcome
}

pub(crate) fn scope(req: &Request) -> wire::Scope {
    wire::Scope { job_id: req.job_id.clone(), attempt: req.attempt }
}

fn checkpoint(
    shared: &Shared,
    req: &Request,
    ledger: &Ledger,
    key: &[u8; KEY_LEN],
    link_id: &str,
    started: Instant,
) -> Checkpoint {
    let now_ms = crate::contract::unix_ms_now();
    Checkpoint {
        version: CHECKPOINT_VERSION,
        job_id: req.job_id.clone(),
        attempt: req.attempt,
        worker: req.worker_id.clone(),
        rung: shared.config.name.clone(),
        level: Level::Process,
        incarnation: shared.incarnation.clone(),
        started_at_unix_ms: ledger.started_ms,
        deadline_at_unix_ms: req
            .deadline_from(started)
            .map(|d| now_ms.saturating_add(d.saturating_duration_since(Instant::now()).as_millis() as u64)),
        grace_ms: req.policy.grace().as_millis() as u64,
        output_dir: std::path::absolute(&req.output_dir).unwrap_or_else(|_| req.output_dir.clone()),
        target: Target::Process { pid: ledger.init_pid, start_ticks: ledger.start_ticks },
        link: LinkSecret { id: link_id.to_owned(), key: key.iter().map(|b| format!("{b:02x}")).collect() },
        state: serde_json::to_value(ledger).expect("a ledger always serialises"),
    }
}

fn start_frame(
    shared: &Shared,
    req: &Request,
    ledger: &Ledger,
    argv: &[String],
    key: &[u8; KEY_LEN],
    link_id: &str,
    started: Instant,
) -> Start {
    let cfg = &shared.config;
    let d = &ledger.dir;
    let input = d.input.display().to_string();
    let output = d.output.display().to_string();
    let tmp = d.tmp.display().to_string();
    // The allowlist first, then the request, then stevedore's own: later ones win.
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    env.insert("PATH".into(), cfg.path.clone());
    env.insert("HOME".into(), tmp.clone());
    env.insert("TMPDIR".into(), tmp.clone());
    env.extend(req.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.insert(wire_env::JOB_ID.into(), req.job_id.clone());
    env.insert(wire_env::ATTEMPT.into(), req.attempt.to_string());
    env.insert(wire_env::IN.into(), input.clone());
    env.insert(wire_env::OUT.into(), output.clone());
    env.insert(wire_env::INIT.into(), shared.init.display().to_string());
    let handler = match &req.task {
        Task::Handler(h) => Some(HandlerRequest {
            handler: h.clone(),
            fingerprint: req.fingerprint.clone(),
            job_id: req.job_id.clone(),
            attempt: req.attempt,
            inputs: req.inputs.iter().map(|(k, v)| (k.clone(), format!("{input}/{}", v.display()))).collect(),
            prior_outputs: req.prior_outputs.iter().map(Into::into).collect(),
            deadline_ms: req
                .deadline_from(started)
                .map(|dl| dl.saturating_duration_since(Instant::now()).as_millis() as u64),
        }),
        Task::Command(_) => None,
    };
    Start {
        protocol: wire::PROTOCOL,
        key: key.iter().map(|b| format!("{b:02x}")).collect(),
        argv: argv.to_vec(),
        env: env.into_iter().collect(),
        cwd: tmp,
        grace_ms: req.policy.grace().as_millis() as u64,
        child_oom_score_adj: Some(500),
        handler,
        handshake_ms: cfg.handshake_timeout.as_millis() as u64,
        heartbeat_timeout_ms: cfg.host_loss.heartbeat_timeout.map_or(0, |t| t.as_millis() as u64),
        host_loss_grace_ms: cfg.host_loss.grace.as_millis() as u64,
        outputs: cfg.collection.spec(output, cfg.output_caps),
        scope: scope(req),
        link_id: Some(link_id.to_owned()),
        takeover_uid: Some(shared.euid),
        takeover_fd: Some(super::spawn::TAKEOVER_FD),
        rlimits: cfg.rlimits.clone(),
        cgroup_dir: None,
        measure: Vec::new(),
        mounts: Vec::new(),
    }
}
