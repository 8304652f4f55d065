//! Configuration of the process rung, with documented defaults and a builder.

use crate::contract::Limits;
use crate::link::{HostLoss, LinkConfig};
use std::path::PathBuf;
use stevedore_init::wire::{Rlimit, RlimitResource};

/// The uid and gid `nobody`, for a configuration that names it with [`ProcessConfig::run_as`]
/// (as root, the default is a uid of each attempt's own: [`super::uids::DEFAULT_UIDS`]).
pub const DEFAULT_RUN_AS: (u32, u32) = (65534, 65534);

/// Where the rung finds a cgroup of its own for each attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Delegation {
    /// None: CPU from `rusage`, peak memory unknown, memory/CPU/pids limits not enforced.
    None,
    /// As root: a cgroup per attempt under `stevedore-process/` of each v1 controller's
    /// hierarchy, or of the v2 root (when its controllers are available to it).
    Auto,
    /// A v2 subtree delegated to the worker (e.g. systemd's `Delegate=yes`): attempts get
    /// child cgroups under it.
    V2(PathBuf),
}

/// How the process rung runs commands.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProcessConfig {
    /// The rung's name in the registry and the evidence.
    pub name: String,
    /// As root: each attempt runs as a uid and gid of its own from this range, which no user
    /// database may name (checked when the rung starts; default
    /// [`super::uids::DEFAULT_UIDS`]). Two attempts then never share one.
    pub uids: Option<super::uids::UidRange>,
    /// Instead of a range: every attempt runs as this uid and gid, one at a time unless
    /// [`ProcessConfig::share_uid`]. `None` without a range: the worker's own (only with
    /// `allow_worker_uid`).
    pub run_as: Option<(u32, u32)>,
    /// Let attempts that run as one fixed uid (or the worker's) run side by side. They can
    /// then signal, ptrace and read each other: the evidence says so, and the rung's level
    /// is `none`, so the registry never picks it for a policy that needs isolation.
    pub share_uid: bool,
    /// Accept running commands as the worker's own uid (without root there is no other
    /// choice); they can then read the worker's files and `/proc`. The evidence says so.
    pub allow_worker_uid: bool,
    /// Limits for what a request leaves out (default: none: no limit unless asked).
    pub defaults: Limits,
    /// The most an attempt gets per dimension; a ceiling only narrows what is asked or
    /// defaulted (`docs/outcome.md`, "Limits").
    pub ceilings: Limits,
    /// `setrlimit` on every command.
    pub rlimits: Vec<Rlimit>,
    /// Where attempts' dirs, the init and copies of the worker binary live (default:
    /// `/run/stevedore-process` as root, else stevedore's private dir).
    pub base_dir: Option<PathBuf>,
    /// Cgroups per attempt.
    pub cgroup: Delegation,
    /// `PATH` for commands.
    pub path: String,
    /// The most bytes the input dir may hold.
    pub max_input_bytes: u64,
    /// Where the captures go (default: stevedore's private dir).
    pub log_dir: Option<PathBuf>,
    /// The link to the init: captures, outputs, times.
    pub link: LinkConfig,
    /// The worker binary re-exec'd for handlers (default: this process's own).
    pub worker_exe: Option<PathBuf>,
    /// The boot of the worker process (minted when not given).
    pub incarnation: Option<String>,
}

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

impl Default for ProcessConfig {
    fn default() -> Self {
        Self {
            name: "process".into(),
            uids: (euid() == 0).then_some(super::uids::DEFAULT_UIDS),
            run_as: None,
            share_uid: false,
            allow_worker_uid: false,
            defaults: Limits::NONE,
            ceilings: Limits::NONE,
            rlimits: vec![
                Rlimit { resource: RlimitResource::Nofile, soft: 4096, hard: 4096 },
                Rlimit { resource: RlimitResource::Core, soft: 0, hard: 0 },
            ],
            base_dir: None,
            cgroup: if euid() == 0 { Delegation::Auto } else { Delegation::None },
            path: "/usr/local/bin:/usr/bin:/bin".into(),
            max_input_bytes: 4 << 30,
            log_dir: None,
            link: LinkConfig::default(),
            worker_exe: None,
            incarnation: None,
        }
    }
}

impl ProcessConfig {
    /// The limits an attempt that asks for none gets: the configured defaults under the
    /// ceilings (no fallback: without a cgroup nothing holds one) (`replay` holds an untrusted
    /// action to them).
    pub fn default_limits(&self) -> crate::contract::Limits {
        use crate::contract::limits::{Limits, ResourceLimits, RungLimits, resolve};
        let rung =
            RungLimits { defaults: &self.defaults, ceilings: &self.ceilings, fallback: &Limits::NONE, cannot: &[] };
        resolve(&ResourceLimits::new(), rung).limits
    }

    /// Names the rung.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
    /// Runs every attempt as `uid:gid` (one at a time unless [`ProcessConfig::share_uid`]).
    pub fn run_as(mut self, uid: u32, gid: u32) -> Self {
        self.run_as = Some((uid, gid));
        self.uids = None;
        self
    }
    /// Runs each attempt as a uid of its own from `count` uids starting at `first` (root only).
    pub fn uids(mut self, first: u32, count: u32) -> Self {
        self.uids = Some(super::uids::UidRange { first, count });
        self.run_as = None;
        self
    }
    /// Runs commands as the worker's own uid (see [`ProcessConfig::allow_worker_uid`]).
    pub fn as_worker_uid(mut self) -> Self {
        self.run_as = None;
        self.uids = None;
        self.allow_worker_uid = true;
        self
    }
    /// Lets attempts of one fixed uid run side by side (see [`ProcessConfig::share_uid`]).
    pub fn share_uid(mut self, share: bool) -> Self {
        self.share_uid = share;
        self
    }
    /// Sets where cgroups come from.
    pub fn cgroup(mut self, d: Delegation) -> Self {
        self.cgroup = d;
        self
    }
    /// Sets the base dir.
    pub fn base_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.base_dir = Some(dir.into());
        self
    }
    /// Sets the worker binary for handlers.
    pub fn worker_exe(mut self, exe: impl Into<PathBuf>) -> Self {
        self.worker_exe = Some(exe.into());
        self
    }
    /// Sets the rlimits.
    pub fn rlimits(mut self, rlimits: Vec<Rlimit>) -> Self {
        self.rlimits = rlimits;
        self
    }
    /// Sets the limits an attempt gets when it names none.
    pub fn defaults(mut self, limits: Limits) -> Self {
        self.defaults = limits;
        self
    }
    /// Sets the most an attempt may ask for.
    pub fn ceilings(mut self, limits: Limits) -> Self {
        self.ceilings = limits;
        self
    }
    /// Sets the host-loss behaviour.
    pub fn host_loss(mut self, h: HostLoss) -> Self {
        self.link.host_loss = h;
        self
    }
    /// Sets the capture dir.
    pub fn log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.log_dir = Some(dir.into());
        self
    }
    /// Sets the incarnation.
    pub fn incarnation(mut self, i: impl Into<String>) -> Self {
        self.incarnation = Some(i.into());
        self
    }
}
