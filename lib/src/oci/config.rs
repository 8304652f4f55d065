//! Configuration of the oci rung, with documented defaults and a builder.

use crate::contract::Limits;
use crate::link::LinkConfig;
use std::path::PathBuf;

/// What the oci rung applies where neither the request nor a default says: the container
/// rung's fallback, never unlimited by accident. A ceiling narrows these too.
pub(crate) const FALLBACK: Limits = Limits::NONE.memory(1 << 30).pids(512).disk(512 << 20).nofile(4096);

/// How the oci rung runs attempts.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OciConfig {
    /// The rung's name in the registry and the evidence.
    pub name: String,
    /// The OCI runtime: any program that speaks runc's command line (`runc`, `crun`); a bare
    /// name is looked up in `PATH` once, when the rung starts.
    pub runtime: PathBuf,
    /// Global flags the runtime gets before every command (gVisor's `runsc` here:
    /// `--platform=ptrace`, `--network=none`).
    pub runtime_args: Vec<String>,
    /// Where the rung keeps its places (the runtime's `--root` state dir, bundles, the image
    /// cache, the init): default `/run/stevedore-oci` (the rung runs as root).
    pub base_dir: Option<PathBuf>,
    /// The image attempts run when the request's policy names none.
    pub image: Option<String>,
    /// The worker's own image (stevedore's entry label): where handlers run when the request
    /// names no image (`stevedore::image::pack` makes one).
    pub worker_image: Option<String>,
    /// The command's `uid:gid` (never 0).
    pub user: (u32, u32),
    /// Limits for what a request leaves out (under the ceilings; below both, the container
    /// rung's fallback).
    pub defaults: Limits,
    /// The most an attempt gets per dimension.
    pub ceilings: Limits,
    /// The largest `/tmp` (a tmpfs, counted as memory: never above the memory limit).
    pub max_tmp_bytes: u64,
    /// The most the image cache keeps, in bytes (images in use are kept regardless); default
    /// 8 GiB, or a quarter of the filesystem holding it when smaller.
    pub image_cache_max_bytes: Option<u64>,
    /// The most bytes the input dir may hold.
    pub max_input_bytes: u64,
    /// The most attempts in flight (waiting for a slot beyond it).
    pub max_in_flight: usize,
    /// Where the captures go (default: stevedore's private dir).
    pub log_dir: Option<PathBuf>,
    /// The link to the init: captures, outputs, times, the delivery reserve.
    pub link: LinkConfig,
    /// The local engine the images' filesystems are exported from.
    pub connection: crate::engine::Connection,
    /// The boot of the worker process (minted when not given).
    pub incarnation: Option<String>,
    /// Docker's default seccomp profile on every command (default); `false` relaxes it, and
    /// the evidence says so.
    pub seccomp: bool,
    /// The profile handed to the runtime in `config.json`, which compiles it on every start
    /// (about 20 ms with runc here) and also allows its list to 32-bit (i386, x32) system
    /// calls; by default it is compiled once and the init installs it for the machine's own
    /// ABI only (`lib/src/oci/seccomp.rs`).
    pub seccomp_by_runtime: bool,
    /// The AppArmor profile every command runs under where the host has AppArmor and that
    /// profile loaded (default `docker-default`, Docker's); elsewhere the evidence says why not.
    pub apparmor_profile: String,
}

impl Default for OciConfig {
    fn default() -> Self {
        Self {
            name: "oci".into(),
            runtime: PathBuf::from("runc"),
            runtime_args: Vec::new(),
            base_dir: None,
            image: None,
            worker_image: None,
            user: (stevedore_init::wire::SANDBOX_UID, stevedore_init::wire::SANDBOX_UID),
            defaults: Limits::NONE,
            ceilings: Limits::NONE,
            max_tmp_bytes: 256 << 20,
            image_cache_max_bytes: None,
            max_input_bytes: 4 << 30,
            max_in_flight: 64,
            log_dir: None,
            link: LinkConfig::default(),
            connection: crate::engine::Connection::default(),
            incarnation: None,
            seccomp: true,
            seccomp_by_runtime: false,
            apparmor_profile: "docker-default".into(),
        }
    }
}

impl OciConfig {
    /// The limits an attempt that asks for none gets: the configured defaults under the
    /// ceilings, over the rung's fallback (`replay` holds an untrusted action to them).
    pub fn default_limits(&self) -> Limits {
        use crate::contract::limits::{self, RungLimits};
        let rung = RungLimits { defaults: &self.defaults, ceilings: &self.ceilings, fallback: &FALLBACK, cannot: &[] };
        limits::resolve(&crate::contract::ResourceLimits::new(), rung).limits
    }

    /// Names the rung.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
    /// Sets the runtime (a path, or a name looked up in `PATH`).
    pub fn runtime(mut self, runtime: impl Into<PathBuf>) -> Self {
        self.runtime = runtime.into();
        self
    }
    /// Sets the global flags the runtime gets before every command.
    pub fn runtime_args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.runtime_args = args.into_iter().map(Into::into).collect();
        self
    }
    /// The level the configuration claims: `vm` under a runtime named VM-grade (`runsc`,
    /// `kata`, `gvisor`), else `sandboxed`; an attempt keeps `vm` only where its init saw a
    /// kernel other than the host's (`contract::level_shown`).
    pub fn level(&self) -> crate::contract::Level {
        let name = self.runtime.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        match crate::contract::named_vm_grade(&name) {
            true => crate::contract::Level::Vm,
            false => crate::contract::Level::Sandboxed,
        }
    }
    /// Sets the base dir.
    pub fn base_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.base_dir = Some(dir.into());
        self
    }
    /// Sets the image attempts run when the request names none.
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.image = Some(image.into());
        self
    }
    /// Sets the worker's own image, where handlers run.
    pub fn worker_image(mut self, image: impl Into<String>) -> Self {
        self.worker_image = Some(image.into());
        self
    }
    /// Sets the command's uid and gid.
    pub fn user(mut self, uid: u32, gid: u32) -> Self {
        self.user = (uid, gid);
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
    /// Bounds the image cache.
    pub fn image_cache_max_bytes(mut self, bytes: u64) -> Self {
        self.image_cache_max_bytes = Some(bytes);
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
    /// Hands the seccomp profile to the runtime, which compiles it on every start
    /// ([`Self::seccomp_by_runtime`](OciConfig#structfield.seccomp_by_runtime)).
    pub fn seccomp_by_runtime(mut self, yes: bool) -> Self {
        self.seccomp_by_runtime = yes;
        self
    }
}
