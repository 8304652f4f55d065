//! The request for one attempt, its builder and its validation.

use super::{LiveOutput, ProgressSink, StdinFeed, Terminal};
use super::{Policy, ResourceLimits};
use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, OFlag, openat};
use nix::sys::stat::Mode;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

/// The largest payload a request may carry.
pub const MAX_PAYLOAD_BYTES: usize = stevedore_init::wire::MAX_PAYLOAD_BYTES;

/// The output of an earlier step, passed to the handler untouched.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PriorOutput {
    /// Its name.
    pub name: String,
    /// The opaque artifact reference.
    pub reference: String,
}

/// What the attempt runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Task {
    /// A handler registered in the worker, by name.
    Handler(String),
    /// A plain command.
    Command(Vec<String>),
}

/// Everything one attempt needs. Build it with [`Request::handler`] or [`Request::command`].
#[derive(Debug, Clone)]
pub struct Request {
    /// The job's ID.
    pub job_id: String,
    /// What to run.
    pub task: Task,
    /// Bytes handed to the handler.
    pub payload: Vec<u8>,
    /// Which attempt of the job this is (1-based).
    pub attempt: u32,
    /// When the attempt must end, whatever happened before it started.
    pub deadline: Option<Instant>,
    /// The longest the command may run, counted from its start (as `docker run` users and
    /// `timeout(1)` count it); with `deadline` too, the earlier wins.
    pub run_timeout: Option<std::time::Duration>,
    /// Fingerprint of the handler set the caller expects.
    pub fingerprint: Option<String>,
    /// Mounted whole, read-only, at `/in`.
    pub input_dir: Option<PathBuf>,
    /// Where outputs land; must be empty.
    pub output_dir: PathBuf,
    /// Named slots: name → path relative to the input dir.
    pub inputs: BTreeMap<String, PathBuf>,
    /// Outputs of earlier steps, passed through.
    pub prior_outputs: Vec<PriorOutput>,
    /// Isolation policy.
    pub policy: Policy,
    /// Resource limits.
    pub limits: ResourceLimits,
    /// Scope: application ID (a label, never a credential).
    pub app_id: Option<String>,
    /// Scope: organisation ID (a label, never a credential).
    pub org_id: Option<String>,
    /// Environment for the handler or command.
    pub env: BTreeMap<String, String>,
    /// The worker this attempt runs for.
    pub worker_id: String,
    /// Where the command's output goes live, if anywhere (see [`LiveOutput`]).
    pub live: Option<LiveOutput>,
    /// Where the command's stdin comes from (see [`StdinFeed`]); `None`: `/dev/null`.
    pub stdin: Option<StdinFeed>,
    /// A terminal for the command (see [`Terminal`]); `None`: pipes.
    pub tty: Option<Terminal>,
    /// Where the attempt reports the progress of its inputs and outputs, if anywhere.
    pub progress: Option<ProgressSink>,
    /// The engine's hooks into this attempt (see [`super::Hooks`]).
    pub hooks: Option<super::HookSet>,
    /// The working directory in the sandbox (default: the image's, else `/`).
    pub workdir: Option<String>,
    /// Replaces the image's `ENTRYPOINT` (an empty vector clears it).
    pub entrypoint: Option<Vec<String>>,
    /// The key the environment's values are HMACed under in the action digest
    /// (`evidence.action`); without one the values are left out of it.
    pub action_key: Option<super::ActionKey>,
}

/// Why a request is invalid. Always permanent: retrying the same request cannot help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// the job id is not of the safe alphabet
    #[error("invalid job id {0:?}: must be 1-256 characters of [A-Za-z0-9_.:@+=-], starting with a letter or digit")]
    JobId(String),
    /// the worker id is not of the safe alphabet
    #[error("invalid worker id {0:?}: must be 1-128 characters of [A-Za-z0-9_.-], starting with a letter or digit")]
    WorkerId(String),
    /// the handler name is empty
    #[error("empty handler name")]
    EmptyHandler,
    /// the command has no argv
    #[error("empty command: give at least the program to run")]
    EmptyCommand,
    /// the working directory is not an absolute path
    #[error("working directory {0:?} is not an absolute path")]
    Workdir(String),
    /// an argument has a NUL byte
    #[error("argument {0} of the command contains a NUL byte")]
    NulInArgv(usize),
    /// the attempt number is 0
    #[error("attempt numbers start at 1")]
    AttemptZero,
    /// the policy requires enforcing something no rung names
    #[error("the policy requires {0:?} enforced: not one of {known}", known = super::policy::ENFORCEABLE.join(", "))]
    UnknownEnforcement(String),
    /// a handler was given a stdin
    #[error("a handler takes its payload, not a stdin: stdin is for a command")]
    StdinForHandler,
    /// a handler was given a terminal
    #[error("a handler speaks the protocol on its streams: a terminal is for a command")]
    TtyForHandler,
    /// the payload is too large
    #[error("payload of {size} bytes exceeds the {max}-byte limit")]
    PayloadTooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// an input slot name is empty
    #[error("input slot with an empty name")]
    SlotName,
    /// an input slot path is absolute
    #[error("input slot {name:?}: path {path:?} is absolute; give a path relative to the input dir")]
    SlotAbsolute {
        /// The slot.
        name: String,
        /// Its path.
        path: PathBuf,
    },
    /// an input slot path climbs out
    #[error("input slot {name:?}: path {path:?} contains '..'")]
    SlotParent {
        /// The slot.
        name: String,
        /// Its path.
        path: PathBuf,
    },
    /// an input slot is given without an input dir
    #[error("input slot {0:?} given but the request has no input dir")]
    SlotWithoutInputDir(String),
    /// an input slot does not exist
    #[error("input slot {name:?}: {path:?} does not exist in the input dir")]
    SlotMissing {
        /// The slot.
        name: String,
        /// Its path.
        path: PathBuf,
    },
    /// the input dir is missing
    #[error("input dir {0:?} does not exist: give the directory whose files the attempt reads at /in")]
    InputDirMissing(PathBuf),
    /// the input dir is not a directory
    #[error("input dir {0:?} is a file, not a directory: give the directory whose files the attempt reads at /in")]
    InputDirNotADirectory(PathBuf),
    /// the input dir cannot be read
    #[error("input dir {path:?} cannot be read: {why}")]
    InputDirUnreadable {
        /// The dir.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// the output dir is not given
    #[error("no output dir given")]
    NoOutputDir,
    /// the output dir exists and is not empty
    #[error(
        "output dir {0:?} is not empty: give a new or empty directory (the outputs are this attempt's alone), or \
         empty this one first"
    )]
    OutputDirNotEmpty(PathBuf),
    /// the output dir is not a directory
    #[error("output dir {0:?} is a file, not a directory: give a new or empty directory")]
    OutputDirNotADirectory(PathBuf),
    /// the output dir is a symlink
    #[error("output dir {0:?} is a symlink; give the directory itself")]
    OutputDirSymlink(PathBuf),
    /// the output dir cannot be written
    #[error("output dir {path:?} is not writable: {why}")]
    OutputDirUnwritable {
        /// The dir.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// an environment key is invalid
    #[error("invalid environment key {0:?}: must be non-empty, without '=' or NUL")]
    EnvKey(String),
    /// an environment value has a NUL byte
    #[error("environment value of {0:?} contains a NUL byte")]
    EnvValue(String),
    /// a label value is invalid
    #[error("invalid {what} {value:?}: must be 1-256 characters without control characters")]
    Label {
        /// Which field.
        what: &'static str,
        /// Its value.
        value: String,
    },
    /// a limit is invalid
    #[error("invalid limit {key}={value}: {why}")]
    Limit {
        /// The key.
        key: String,
        /// The value.
        value: u64,
        /// Why.
        why: &'static str,
    },
}

fn plain_label(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && !s.chars().any(char::is_control)
}

pub use stevedore_parse::ids::{parse_user, valid_job_id, valid_worker_id};

impl Request {
    /// A request to run the handler `name`.
    pub fn handler(job_id: impl Into<String>, name: impl Into<String>, output_dir: impl Into<PathBuf>) -> Self {
        Self::new(job_id.into(), Task::Handler(name.into()), output_dir.into())
    }

    /// A request to run a plain command.
    pub fn command<I, S>(job_id: impl Into<String>, argv: I, output_dir: impl Into<PathBuf>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::new(job_id.into(), Task::Command(argv.into_iter().map(Into::into).collect()), output_dir.into())
    }

    fn new(job_id: String, task: Task, output_dir: PathBuf) -> Self {
        Self {
            job_id,
            task,
            payload: Vec::new(),
            attempt: 1,
            deadline: None,
            run_timeout: None,
            fingerprint: None,
            input_dir: None,
            output_dir,
            inputs: BTreeMap::new(),
            prior_outputs: Vec::new(),
            policy: Policy::default(),
            limits: ResourceLimits::default(),
            app_id: None,
            org_id: None,
            env: BTreeMap::new(),
            worker_id: "worker".to_owned(),
            live: None,
            stdin: None,
            tty: None,
            progress: None,
            hooks: None,
            workdir: None,
            entrypoint: None,
            action_key: None,
        }
    }

    /// Sets the payload.
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.payload = payload.into();
        self
    }
    /// Sets the attempt number.
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }
    /// Sets the deadline.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }
    /// Lets the command run at most `timeout`, counted from its start (waiting for
    /// admission, staging inputs and starting the sandbox do not count).
    pub fn timeout(mut self, timeout: std::time::Duration) -> Self {
        self.run_timeout = Some(timeout);
        self
    }
    /// The deadline of an attempt whose command started at `started`.
    pub fn deadline_from(&self, started: Instant) -> Option<Instant> {
        let run = self.run_timeout.and_then(|t| started.checked_add(t));
        match (self.deadline, run) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
    /// Sets the expected handler-set fingerprint.
    pub fn fingerprint(mut self, fp: impl Into<String>) -> Self {
        self.fingerprint = Some(fp.into());
        self
    }
    /// Sets the input dir.
    pub fn input_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.input_dir = Some(dir.into());
        self
    }
    /// Adds a named input slot.
    pub fn input(mut self, name: impl Into<String>, rel: impl Into<PathBuf>) -> Self {
        self.inputs.insert(name.into(), rel.into());
        self
    }
    /// Adds a prior output.
    pub fn prior_output(mut self, name: impl Into<String>, reference: impl Into<String>) -> Self {
        self.prior_outputs.push(PriorOutput { name: name.into(), reference: reference.into() });
        self
    }
    /// Sets the policy. What it leaves unset (an empty `image`, no grace) keeps what
    /// [`Request::image`] and [`Request::grace`] set, so the order of the builder's calls
    /// never drops a value; what both set, the later call decides.
    pub fn policy(mut self, mut policy: Policy) -> Self {
        if policy.image.is_empty() {
            policy.image = std::mem::take(&mut self.policy.image);
        }
        if policy.grace_period_ms <= 0 {
            policy.grace_period_ms = self.policy.grace_period_ms;
        }
        self.policy = policy;
        self
    }
    /// Adds `limits` to those already set ([`Request::memory`] and the like); a dimension
    /// both set takes `limits`' value.
    pub fn limits(mut self, limits: ResourceLimits) -> Self {
        self.limits.0.extend(limits.0);
        self
    }
    /// Sets an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }
    /// Sets the worker ID.
    pub fn worker(mut self, worker_id: impl Into<String>) -> Self {
        self.worker_id = worker_id.into();
        self
    }
    /// Sets the image to run in (empty: the rung's worker image).
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.policy.image = image.into();
        self
    }
    /// Sets the memory limit in bytes.
    pub fn memory(mut self, bytes: u64) -> Self {
        self.limits.0.insert(super::limits::key::MEMORY.into(), bytes);
        self
    }
    /// Sets the CPU limit in cores (e.g. `0.5`).
    pub fn cpus(mut self, cores: f64) -> Self {
        self.limits.0.insert(super::limits::key::CPU.into(), (cores * 1000.0).round().max(0.0) as u64);
        self
    }
    /// Sets the process limit.
    pub fn pids(mut self, n: u64) -> Self {
        self.limits.0.insert(super::limits::key::PIDS.into(), n);
        self
    }
    /// Sets the disk limit (`/out` and other writable space) in bytes.
    pub fn disk(mut self, bytes: u64) -> Self {
        self.limits.0.insert(super::limits::key::DISK.into(), bytes);
        self
    }
    /// Sets the grace period between SIGTERM and SIGKILL.
    pub fn grace(mut self, grace: std::time::Duration) -> Self {
        self.policy = self.policy.with_grace(grace);
        self
    }
    /// Sends the command's output, live, to `live` (see [`LiveOutput::channel`]).
    pub fn live_output(mut self, live: LiveOutput) -> Self {
        self.live = Some(live);
        self
    }
    /// Feeds the command's stdin from `feed` (see [`StdinFeed::channel`]); a command only.
    pub fn stdin(mut self, feed: StdinFeed) -> Self {
        self.stdin = Some(feed);
        self
    }
    /// Reports the progress of the inputs going in and the outputs coming back to `sink`.
    pub fn progress(mut self, sink: ProgressSink) -> Self {
        self.progress = Some(sink);
        self
    }
    /// Gives the command a terminal (see [`Terminal::new`]); a command only.
    pub fn tty(mut self, terminal: Terminal) -> Self {
        self.tty = Some(terminal);
        self
    }
    /// Sets the working directory in the sandbox (absolute).
    pub fn workdir(mut self, dir: impl Into<String>) -> Self {
        self.workdir = Some(dir.into());
        self
    }
    /// Replaces the image's `ENTRYPOINT` (empty: none).
    pub fn entrypoint<I: IntoIterator<Item = S>, S: Into<String>>(mut self, argv: I) -> Self {
        self.entrypoint = Some(argv.into_iter().map(Into::into).collect());
        self
    }
    /// Sets the key the environment's values enter the action digest under.
    pub fn action_key(mut self, key: super::ActionKey) -> Self {
        self.action_key = Some(key);
        self
    }
    /// Sets the engine's hooks into this attempt.
    pub fn hooks(mut self, hooks: std::sync::Arc<dyn super::Hooks>) -> Self {
        self.hooks = Some(super::HookSet(hooks));
        self
    }
    /// The attempt this request is, for hook calls.
    pub fn attempt_ref(&self) -> super::AttemptRef {
        super::AttemptRef { job_id: self.job_id.clone(), attempt: self.attempt, worker: self.worker_id.clone() }
    }
    /// Sets the scope IDs.
    pub fn scope(mut self, app_id: Option<String>, org_id: Option<String>) -> Self {
        self.app_id = app_id;
        self.org_id = org_id;
        self
    }

    /// The handler name, if this runs a handler.
    pub fn handler_name(&self) -> Option<&str> {
        match &self.task {
            Task::Handler(h) => Some(h),
            Task::Command(_) => None,
        }
    }

    /// Checks everything that can be checked before anything is created: fields, slots,
    /// the input dir (exists, readable, slots exist) and the output dir (empty or absent
    /// with an existing parent, writable).
    pub fn validate(&self) -> Result<(), RequestError> {
        if !valid_job_id(&self.job_id) {
            return Err(RequestError::JobId(self.job_id.clone()));
        }
        if !valid_worker_id(&self.worker_id) {
            return Err(RequestError::WorkerId(self.worker_id.clone()));
        }
        match &self.task {
            Task::Handler(h) if h.trim().is_empty() => return Err(RequestError::EmptyHandler),
            Task::Handler(_) if self.stdin.is_some() => return Err(RequestError::StdinForHandler),
            Task::Handler(_) if self.tty.is_some() => return Err(RequestError::TtyForHandler),
            // An empty argv runs the image's ENTRYPOINT alone; the rung refuses it if there is none.
            Task::Command(argv) if argv.first().is_some_and(String::is_empty) && self.entrypoint.is_none() => {
                return Err(RequestError::EmptyCommand);
            }
            Task::Command(argv) => {
                let all = self.entrypoint.iter().flatten().chain(argv);
                if let Some(i) = all.clone().position(|a| a.contains('\0')) {
                    return Err(RequestError::NulInArgv(i));
                }
            }
            Task::Handler(_) => {}
        }
        if self.attempt == 0 {
            return Err(RequestError::AttemptZero);
        }
        if let Some(k) = self.policy.require_enforced.iter().find(|k| !super::policy::ENFORCEABLE.contains(&k.as_str()))
        {
            return Err(RequestError::UnknownEnforcement(k.clone()));
        }
        if self.payload.len() > MAX_PAYLOAD_BYTES {
            return Err(RequestError::PayloadTooLarge { size: self.payload.len(), max: MAX_PAYLOAD_BYTES });
        }
        for (what, v) in [("app id", &self.app_id), ("org id", &self.org_id)] {
            if let Some(v) = v
                && !plain_label(v, 256)
            {
                return Err(RequestError::Label { what, value: v.clone() });
            }
        }
        for (k, v) in &self.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(RequestError::EnvKey(k.clone()));
            }
            if v.contains('\0') {
                return Err(RequestError::EnvValue(k.clone()));
            }
        }
        if let Some(cpu) = self.limits.cpu_millis()
            && cpu < 10
        {
            return Err(RequestError::Limit { key: "cpu".into(), value: cpu, why: "below 10 millicores" });
        }
        if let Some(m) = self.limits.memory_bytes()
            && m < (6 << 20)
        {
            return Err(RequestError::Limit {
                key: "memory".into(),
                value: m,
                why: "below the engine's 6 MiB minimum",
            });
        }
        if let Some(d) = self.limits.disk_bytes()
            && d < (1 << 20)
        {
            return Err(RequestError::Limit { key: "disk".into(), value: d, why: "below 1 MiB" });
        }
        if let Some(w) = &self.workdir
            && (!w.starts_with('/') || w.contains('\0'))
        {
            return Err(RequestError::Workdir(w.clone()));
        }
        self.validate_slots()?;
        self.validate_dirs()
    }

    fn validate_slots(&self) -> Result<(), RequestError> {
        for (name, path) in &self.inputs {
            if name.is_empty() {
                return Err(RequestError::SlotName);
            }
            if path.is_absolute() || path.has_root() {
                return Err(RequestError::SlotAbsolute { name: name.clone(), path: path.clone() });
            }
            if path.components().any(|c| matches!(c, Component::ParentDir)) {
                return Err(RequestError::SlotParent { name: name.clone(), path: path.clone() });
            }
            let Some(dir) = &self.input_dir else {
                return Err(RequestError::SlotWithoutInputDir(name.clone()));
            };
            if std::fs::symlink_metadata(dir.join(path)).is_err() {
                return Err(RequestError::SlotMissing { name: name.clone(), path: path.clone() });
            }
        }
        Ok(())
    }

    fn validate_dirs(&self) -> Result<(), RequestError> {
        if let Some(dir) = &self.input_dir {
            match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(RequestError::InputDirNotADirectory(dir.clone())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(RequestError::InputDirMissing(dir.clone()));
                }
                Err(e) => return Err(RequestError::InputDirUnreadable { path: dir.clone(), why: e.to_string() }),
            }
            if let Err(e) = std::fs::read_dir(dir) {
                return Err(RequestError::InputDirUnreadable { path: dir.clone(), why: e.to_string() });
            }
        }
        let out = &self.output_dir;
        if out.as_os_str().is_empty() {
            return Err(RequestError::NoOutputDir);
        }
        match std::fs::symlink_metadata(out) {
            Ok(m) if m.file_type().is_symlink() => Err(RequestError::OutputDirSymlink(out.clone())),
            Ok(m) if !m.is_dir() => Err(RequestError::OutputDirNotADirectory(out.clone())),
            Ok(_) => {
                let mut entries = std::fs::read_dir(out)
                    .map_err(|e| RequestError::OutputDirUnwritable { path: out.clone(), why: e.to_string() })?;
                if entries.next().is_some() {
                    return Err(RequestError::OutputDirNotEmpty(out.clone()));
                }
                writable(out)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // It will be created, parents included: the nearest existing ancestor must
                // be a directory this process can write in.
                let mut ancestor = out.parent();
                while let Some(a) = ancestor.filter(|a| !a.as_os_str().is_empty()) {
                    match std::fs::metadata(a) {
                        Ok(m) if m.is_dir() => {
                            return writable(a).map_err(|_| RequestError::OutputDirUnwritable {
                                path: out.clone(),
                                why: format!("cannot create it in {a:?}"),
                            });
                        }
                        Ok(_) => {
                            return Err(RequestError::OutputDirUnwritable {
                                path: out.clone(),
                                why: format!("{a:?} is not a directory"),
                            });
                        }
                        Err(_) => ancestor = a.parent(),
                    }
                }
                writable(Path::new("."))
            }
            Err(e) => Err(RequestError::OutputDirUnwritable { path: out.clone(), why: e.to_string() }),
        }
    }

    /// Creates the output dir when missing (parents included), then opens it once, without
    /// following a symlink, and checks by that descriptor that it is empty: the rung writes
    /// the outputs through it and never resolves the path again.
    pub fn open_output_dir(&self) -> Result<OwnedFd, RequestError> {
        let out = &self.output_dir;
        let unwritable = |why: String| RequestError::OutputDirUnwritable { path: out.clone(), why };
        if std::fs::symlink_metadata(out).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(RequestError::OutputDirSymlink(out.clone()));
        }
        if let Err(e) = std::fs::create_dir_all(out)
            && e.kind() != std::io::ErrorKind::AlreadyExists
        {
            return Err(unwritable(e.to_string()));
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = match openat(AT_FDCWD, out.as_path(), flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ELOOP) => return Err(RequestError::OutputDirSymlink(out.clone())),
            Err(Errno::ENOTDIR) => return Err(RequestError::OutputDirNotADirectory(out.clone())),
            Err(e) => return Err(unwritable(e.desc().to_owned())),
        };
        let mut dir = nix::dir::Dir::from_fd(fd.try_clone().map_err(|e| unwritable(e.to_string()))?)
            .map_err(|e| unwritable(e.desc().to_owned()))?;
        let empty = dir.iter().flatten().all(|e| matches!(e.file_name().to_bytes(), b"." | b".."));
        if !empty {
            return Err(RequestError::OutputDirNotEmpty(out.clone()));
        }
        Ok(fd)
    }
}

fn writable(dir: &Path) -> Result<(), RequestError> {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK)
        .map_err(|e| RequestError::OutputDirUnwritable { path: dir.to_path_buf(), why: e.desc().to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The builder's order never drops a value: an image or grace set before a policy that
    /// leaves them unset is kept, and limits add up.
    #[test]
    fn the_order_of_builder_calls_drops_nothing() {
        use crate::contract::Level;
        let p = Policy::at_least(Level::Sandboxed);
        let grace = std::time::Duration::from_secs(3);
        let a = Request::command("j", ["true"], "/o")
            .image("x:1")
            .grace(grace)
            .policy(p.clone())
            .memory(64)
            .limits(ResourceLimits::new().with(super::super::limits::key::PIDS, 10));
        let b = Request::command("j", ["true"], "/o")
            .limits(ResourceLimits::new().with(super::super::limits::key::PIDS, 10))
            .policy(p)
            .memory(64)
            .grace(grace)
            .image("x:1");
        for r in [&a, &b] {
            assert_eq!((r.policy.image.as_str(), r.policy.grace(), r.policy.level), ("x:1", grace, Level::Sandboxed));
            assert_eq!(r.limits, ResourceLimits::new().with("memory", 64).with("pids", 10));
        }
        let later =
            Request::command("j", ["true"], "/o").image("a").policy(Policy { image: "b".into(), ..Policy::default() });
        assert_eq!(later.policy.image, "b", "what both set, the later call decides");
    }

    fn base(dir: &Path) -> Request {
        Request::command("job-1", ["true"], dir.join("out")).worker("w1")
    }

    /// A handler speaks the protocol on its streams: neither a stdin nor a terminal for it.
    #[test]
    fn a_handler_takes_no_stdin_and_no_terminal() {
        let h = || Request::handler("j", "echo", "/o").worker("w");
        let (_tx, feed) = super::super::StdinFeed::channel(1);
        assert!(matches!(h().stdin(feed).validate(), Err(RequestError::StdinForHandler)));
        let (_size, term) = super::super::Terminal::new(24, 80);
        assert!(matches!(h().tty(term.clone()).validate(), Err(RequestError::TtyForHandler)));
        assert_eq!(term.size(), (24, 80));
    }

    #[test]
    fn valid_request_passes() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("in")).unwrap();
        std::fs::write(t.path().join("in/a.txt"), b"x").unwrap();
        let r = base(t.path()).input_dir(t.path().join("in")).input("a", "a.txt");
        r.validate().unwrap();
    }

    #[test]
    fn each_rejection() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path();
        std::fs::create_dir(p.join("in")).unwrap();
        std::fs::write(p.join("afile"), b"").unwrap();
        type Case = (Request, fn(&RequestError) -> bool);
        let cases: Vec<Case> = vec![
            (Request::command("", ["true"], p.join("out")), |e| matches!(e, RequestError::JobId(_))),
            (base(p).worker("bad worker!"), |e| matches!(e, RequestError::WorkerId(_))),
            (Request::handler("j", " ", p.join("out")), |e| matches!(e, RequestError::EmptyHandler)),
            (Request::command("j", [""], p.join("out")), |e| matches!(e, RequestError::EmptyCommand)),
            (Request::command("j", ["a\0b"], p.join("out")), |e| matches!(e, RequestError::NulInArgv(0))),
            (base(p).attempt(0), |e| matches!(e, RequestError::AttemptZero)),
            (base(p).input_dir(p.join("in")).input("x", "/etc/passwd"), |e| {
                matches!(e, RequestError::SlotAbsolute { .. })
            }),
            (base(p).input_dir(p.join("in")).input("x", "a/../../b"), |e| matches!(e, RequestError::SlotParent { .. })),
            (base(p).input("x", "a"), |e| matches!(e, RequestError::SlotWithoutInputDir(_))),
            (base(p).input_dir(p.join("in")).input("x", "nope"), |e| matches!(e, RequestError::SlotMissing { .. })),
            (base(p).input_dir(p.join("missing")), |e| matches!(e, RequestError::InputDirMissing(_))),
            (base(p).input_dir(p.join("afile")), |e| matches!(e, RequestError::InputDirNotADirectory(_))),
            (base(p).env("A=B", "1"), |e| matches!(e, RequestError::EnvKey(_))),
            (base(p).env("A", "x\0"), |e| matches!(e, RequestError::EnvValue(_))),
            (base(p).limits(ResourceLimits::new().with("memory", 1024)), |e| matches!(e, RequestError::Limit { .. })),
            (base(p).limits(ResourceLimits::new().with("cpu", 1)), |e| matches!(e, RequestError::Limit { .. })),
            (base(p).scope(Some("a\nb".into()), None), |e| matches!(e, RequestError::Label { .. })),
            (Request::command("j", ["true"], p.join("afile/deeper")), |e| {
                matches!(e, RequestError::OutputDirUnwritable { .. })
            }),
            (base(p).worker(".."), |e| matches!(e, RequestError::WorkerId(_))),
            (Request::command("../j", ["true"], p.join("out")), |e| matches!(e, RequestError::JobId(_))),
            (Request::command("a/b", ["true"], p.join("out")), |e| matches!(e, RequestError::JobId(_))),
            (base(p).payload(vec![0u8; MAX_PAYLOAD_BYTES + 1]), |e| matches!(e, RequestError::PayloadTooLarge { .. })),
        ];
        for (i, (req, check)) in cases.into_iter().enumerate() {
            let err = req.validate().expect_err(&format!("case {i} should fail"));
            assert!(check(&err), "case {i}: wrong error {err:?}");
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn non_empty_output_dir_rejected() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("out")).unwrap();
        std::fs::write(t.path().join("out/x"), b"").unwrap();
        let err = base(t.path()).validate().unwrap_err();
        assert!(matches!(err, RequestError::OutputDirNotEmpty(_)), "{err:?}");
        assert!(err.to_string().contains("give a new or empty directory"), "what to do next: {err}");
    }

    #[test]
    fn output_file_not_dir_rejected() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("out"), b"").unwrap();
        let err = base(t.path()).validate().unwrap_err();
        assert!(matches!(err, RequestError::OutputDirNotADirectory(_)), "{err:?}");
        assert!(err.to_string().contains("is a file, not a directory"), "{err}");
        let err = base(t.path()).open_output_dir().unwrap_err();
        assert!(matches!(err, RequestError::OutputDirNotADirectory(_)), "{err:?}");
    }
}

#[cfg(test)]
mod output_dir_tests {
    use super::*;

    #[test]
    fn a_missing_output_dir_is_created_with_its_parents() {
        let t = tempfile::tempdir().unwrap();
        let req = Request::command("j", ["true"], t.path().join("a/b/out"));
        req.validate().unwrap();
        req.open_output_dir().unwrap();
        assert!(t.path().join("a/b/out").is_dir());
    }

    #[test]
    fn a_symlinked_output_dir_is_refused() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("real")).unwrap();
        std::os::unix::fs::symlink(t.path().join("real"), t.path().join("out")).unwrap();
        let req = Request::command("j", ["true"], t.path().join("out"));
        assert!(matches!(req.validate(), Err(RequestError::OutputDirSymlink(_))));
        assert!(matches!(req.open_output_dir(), Err(RequestError::OutputDirSymlink(_))));
    }
}
