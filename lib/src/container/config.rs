//! Configuration of the container rung, with documented defaults and a builder.

use crate::contract::Limits;
pub use crate::link::{Collection, HostLoss, LinkConfig};
use crate::outputs::Caps;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

pub use stevedore_parse::profiles::PullPolicy;

/// A named cache: a volume of kind `cache` that outlives attempts (dependency caches), mounted
/// read-write at `path`. Its volume's name is scoped by the request's app and org ids, so jobs
/// of different apps never share one; it is outside the `disk` limit (its size is in the
/// evidence) and only `stevedore cache rm` removes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheMount {
    /// The cache's name: 1-64 of `[a-z0-9_.-]`, starting with a letter or digit.
    pub name: String,
    /// Where it is mounted in the sandbox (absolute; not one of stevedore's own dirs).
    pub path: String,
}

impl CacheMount {
    /// Parses `NAME:/path`, checking both.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (name, path) = s.split_once(':').ok_or_else(|| format!("cache {s:?}: expected NAME:/path"))?;
        let c = Self { name: name.to_owned(), path: path.to_owned() };
        c.check()?;
        Ok(c)
    }

    /// Checks the name and the path.
    pub fn check(&self) -> Result<(), String> {
        stevedore_parse::ids::check_cache(&self.name, &self.path)
    }
}

/// Hardening items; each is on by default and can be relaxed only here.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Hardening {
    /// Mount the image's root filesystem read-only.
    pub read_only_rootfs: bool,
    /// Drop every capability.
    pub drop_all_capabilities: bool,
    /// Set no-new-privileges.
    pub no_new_privileges: bool,
}

impl Default for Hardening {
    fn default() -> Self {
        Self { read_only_rootfs: true, drop_all_capabilities: true, no_new_privileges: true }
    }
}

/// The default sandbox user: not root, and not any user an image is likely to define.
pub use stevedore_init::wire::SANDBOX_USER;

pub use crate::link::LINK_INPUTS_MAX_BYTES;

/// How the container rung is set up. `ContainerConfig::default()` documents every default;
/// the builder methods set one item each.
#[derive(Clone)]
#[non_exhaustive]
pub struct ContainerConfig {
    /// The rung's name (default `docker`).
    pub name: String,
    /// The OCI runtime (default: the engine's). `runsc` or a `kata*` runtime makes the rung `vm`.
    pub runtime: Option<String>,
    /// How to reach the engine (default: `DOCKER_HOST`, `DOCKER_TLS_VERIFY` and
    /// `DOCKER_CERT_PATH` as the docker CLI reads them, else the local socket).
    pub connection: crate::engine::Connection,
    /// The image for handler attempts whose request names none.
    pub worker_image: Option<String>,
    /// The non-root `uid:gid` the sandbox runs as (default [`SANDBOX_USER`]).
    pub user: String,
    /// The sandbox user's supplementary groups (default none): set by the engine, or by a
    /// root init as it drops to the user (`docs/outcome.md`, "Inputs over the link"); never
    /// read from the image's files.
    pub groups: Vec<u32>,
    /// The network mode (default `none`).
    pub network: String,
    /// Other network modes a caller (e.g. `stevedore run --network`) may switch to; `None`
    /// (the default without a profile) allows any. A profile allows only its own mode and
    /// its `allow_networks`.
    pub network_choices: Option<BTreeSet<String>>,
    /// Limits for what a request leaves out (default: none, and the rung's own
    /// fallback (`container/sizes.rs`) fills the rest: memory 1 GiB, pids 512, disk 512 MiB,
    /// nofile 4096, no CPU cap).
    pub defaults: Limits,
    /// The most an attempt gets per dimension; a request asking for more is narrowed, and the
    /// evidence says so (default: none). A ceiling only narrows (`docs/outcome.md`, "Limits").
    pub ceilings: Limits,
    /// The largest `/tmp` tmpfs (default 256 MiB; never more than the memory limit).
    pub max_tmp_bytes: u64,
    /// The largest input dir staged, by apparent size (default 4 GiB).
    pub max_input_bytes: u64,
    /// Inputs up to this apparent size travel over the link to a root init that writes them
    /// and then drops to the sandbox user (default [`LINK_INPUTS_MAX_BYTES`]; 0: never);
    /// larger ones go through the engine's archive upload (`docs/outcome.md`, "Inputs over
    /// the link").
    pub link_inputs_max_bytes: u64,
    /// Profile environment (below the request's).
    pub env: BTreeMap<String, String>,
    /// Extra labels on every container and volume.
    pub labels: BTreeMap<String, String>,
    /// Where captures are kept (default: a private dir per user, see `hostdir`).
    pub log_dir: Option<PathBuf>,
    /// The link to the init: captures, outputs, times.
    pub link: LinkConfig,
    /// Pull policy (default `if_missing`; without a registry any pull fails fast).
    pub pull: PullPolicy,
    /// The docker CLI's config dir whose `config.json` gives registry credentials for a pull
    /// (`auths`, `credsStore`, `credHelpers`; `engine::credentials`). Default: `DOCKER_CONFIG`,
    /// else `~/.docker`; `None` pulls anonymously.
    pub docker_config: Option<PathBuf>,
    /// Hardening items.
    pub hardening: Hardening,
    /// Timeout of stevedore's own on every engine call that only reads (inspect, list,
    /// attach; default 30 s).
    pub engine_timeout: Duration,
    /// Timeout of stevedore's own on an engine call that changes state (create, start,
    /// update, kill, remove, upload; default 10 min): a slow engine is waited for, never
    /// abandoned halfway; past it the rung asks the engine what happened
    /// (`docs/outcome.md`, "A slow engine").
    pub engine_change_timeout: Duration,
    /// Attempts in flight at once (default 8).
    pub max_in_flight: usize,
    /// When the bound is reached: wait (default) or refuse.
    pub wait_for_admission: bool,
    /// Published ports (`container_port` → host port, 0 = ephemeral), on the engine host's
    /// loopback.
    pub ports: BTreeMap<u16, u16>,
    /// Whether a caller may add published ports (`stevedore run -p`; default true).
    pub allow_publish: bool,
    /// Whether the sandbox user may be root (`user = "0"`; default false).
    pub allow_root: bool,
    /// Named caches mounted read-write in every attempt (see [`CacheMount`]).
    pub caches: Vec<CacheMount>,
    /// Whether caches may be used (default true).
    pub allow_caches: bool,
    /// A warm pool of parked containers (opt-in; see [`super::PoolConfig`]).
    pub pool: Option<super::PoolConfig>,
    /// Remove a finished attempt's container and volumes after its outcome is returned, on
    /// the rung's tracked tasks (`close` waits for them), when its record was verified
    /// (default false: `run` returns once they are removed).
    pub background_cleanup: bool,
    /// Bind the init from a host directory when the engine is on this machine's unix socket
    /// (default true; `false`: a tools volume of the rung's own, filled through the engine,
    /// as on every remote engine). The command sets it false for `STEVEDORE_INIT_FROM=volume`.
    pub init_from_host: bool,
    /// The profile name, for messages.
    pub profile: Option<String>,
    /// The incarnation stamped on what the rung creates (default: the process's one, shared
    /// by every rung of the process). Set it only to stand in for another process (tests).
    pub incarnation: Option<String>,
}

impl std::fmt::Debug for ContainerConfig {
    // Environment values can be secrets (a profile's `env_files`): only the keys are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerConfig")
            .field("name", &self.name)
            .field("runtime", &self.runtime)
            .field("connection", &self.connection)
            .field("worker_image", &self.worker_image)
            .field("user", &self.user)
            .field("network", &self.network)
            .field("defaults", &self.defaults)
            .field("ceilings", &self.ceilings)
            .field("env_keys", &self.env.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Default for ContainerConfig {
    fn default() -> Self {
        Self {
            name: "docker".into(),
            runtime: None,
            connection: crate::engine::Connection::default(),
            worker_image: None,
            user: SANDBOX_USER.into(),
            groups: Vec::new(),
            network: "none".into(),
            network_choices: None,
            defaults: Limits::NONE,
            ceilings: Limits::NONE,
            max_tmp_bytes: 256 << 20,
            max_input_bytes: 4 << 30,
            link_inputs_max_bytes: LINK_INPUTS_MAX_BYTES,
            env: BTreeMap::new(),
            labels: BTreeMap::new(),
            log_dir: None,
            link: LinkConfig::default(),
            pull: PullPolicy::IfMissing,
            docker_config: crate::engine::credentials::default_config_dir(),
            hardening: Hardening::default(),
            engine_timeout: Duration::from_secs(30),
            engine_change_timeout: crate::engine::CHANGE_TIMEOUT,
            max_in_flight: 8,
            wait_for_admission: true,
            ports: BTreeMap::new(),
            allow_publish: true,
            allow_root: false,
            caches: Vec::new(),
            allow_caches: true,
            pool: None,
            background_cleanup: false,
            init_from_host: true,
            profile: None,
            incarnation: None,
        }
    }
}

/// What the container rung applies where neither the request nor a default says: never
/// unlimited by accident. A ceiling narrows these too.
pub(crate) const FALLBACK: crate::contract::Limits =
    crate::contract::Limits::NONE.memory(1 << 30).pids(512).disk(512 << 20).nofile(4096);

impl ContainerConfig {
    /// Binds the init from a host directory where the engine can (`true`, the default), or
    /// always fills a tools volume (`false`).
    pub fn init_from_host(mut self, on: bool) -> Self {
        self.init_from_host = on;
        self
    }

    /// The limits an attempt that asks for none gets: the configured defaults, else the
    /// rung's fallback, under the ceilings (`replay` holds an untrusted action to them).
    pub fn default_limits(&self) -> crate::contract::Limits {
        use crate::contract::limits::{self, RungLimits};
        let rung = RungLimits { defaults: &self.defaults, ceilings: &self.ceilings, fallback: &FALLBACK, cannot: &[] };
        limits::resolve(&crate::contract::ResourceLimits::new(), rung).limits
    }

    /// The isolation level this configuration provides.
    pub fn level(&self) -> crate::contract::Level {
        match self.runtime.as_deref() {
            Some(r) if crate::contract::named_vm_grade(r) => crate::contract::Level::Vm,
            _ => crate::contract::Level::Sandboxed,
        }
    }

    /// The sandbox user as (uid, gid).
    pub fn uid_gid(&self) -> (u32, u32) {
        let mut it = self.user.split(':');
        let uid = it.next().and_then(|u| u.parse().ok()).unwrap_or(stevedore_init::wire::SANDBOX_UID);
        let gid = it.next().and_then(|g| g.parse().ok()).unwrap_or(uid);
        (uid, gid)
    }

    /// The sandbox user as `uid:gid` numbers, when the configuration gives both as numbers:
    /// what a root init may drop to without reading the image's files.
    pub(crate) fn numeric_user(&self) -> Option<(u32, u32)> {
        let (u, g) = self.user.split_once(':')?;
        Some((u.parse().ok()?, g.parse().ok()?))
    }

    /// Names the rung.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
    /// Sets the engine's address (`unix://…`, `tcp://…`, `https://…`, `ssh://…`).
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.connection.host = Some(endpoint.into());
        self
    }
    /// Uses TLS with the client certificate, key and CA in `dir` (`cert.pem`, `key.pem`, `ca.pem`).
    pub fn tls(mut self, dir: impl Into<PathBuf>) -> Self {
        self.connection.tls_cert_path = Some(dir.into());
        self
    }
    /// Sets the OCI runtime.
    pub fn runtime(mut self, runtime: impl Into<String>) -> Self {
        self.runtime = Some(runtime.into());
        self
    }
    /// Sets the image for handler attempts whose request names none.
    pub fn worker_image(mut self, image: impl Into<String>) -> Self {
        self.worker_image = Some(image.into());
        self
    }
    /// Sets the network mode.
    pub fn network(mut self, mode: impl Into<String>) -> Self {
        self.network = mode.into();
        self
    }
    /// Sets the defaults: what fills a dimension a request leaves out.
    pub fn defaults(mut self, limits: Limits) -> Self {
        self.defaults = limits;
        self
    }
    /// Sets the ceilings: the most an attempt gets per dimension.
    pub fn ceilings(mut self, limits: Limits) -> Self {
        self.ceilings = limits;
        self
    }
    /// Sets the caps on outputs.
    pub fn output_caps(mut self, caps: Caps) -> Self {
        self.link.output_caps = caps;
        self
    }
    /// Sets the largest input dir staged.
    pub fn max_input_bytes(mut self, bytes: u64) -> Self {
        self.max_input_bytes = bytes;
        self
    }
    /// Sets the largest inputs that travel over the link (0: never).
    pub fn link_inputs_max_bytes(mut self, bytes: u64) -> Self {
        self.link_inputs_max_bytes = bytes;
        self
    }
    /// Sets the sandbox user's supplementary groups.
    pub fn groups(mut self, groups: impl IntoIterator<Item = u32>) -> Self {
        self.groups = groups.into_iter().collect();
        self
    }
    /// Sets the docker config dir that registry credentials come from (`None`: anonymous).
    pub fn docker_config(mut self, dir: Option<PathBuf>) -> Self {
        self.docker_config = dir;
        self
    }

    /// Sets the pull policy.
    pub fn pull(mut self, pull: PullPolicy) -> Self {
        self.pull = pull;
        self
    }
    /// Sets the attempts in flight at once, and whether to wait (or refuse) beyond them.
    pub fn max_in_flight(mut self, n: usize, wait: bool) -> Self {
        self.max_in_flight = n;
        self.wait_for_admission = wait;
        self
    }
    /// Sets where captures are kept.
    pub fn log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.log_dir = Some(dir.into());
        self
    }
    /// Sets the bytes of each stream kept on disk.
    pub fn log_cap(mut self, bytes: u64) -> Self {
        self.link.log_cap_bytes = bytes;
        self
    }
    /// Sets the host-loss behaviour of the link.
    pub fn host_loss(mut self, host_loss: HostLoss) -> Self {
        self.link.host_loss = host_loss;
        self
    }
    /// Sets the timeout of engine calls that only read.
    pub fn engine_timeout(mut self, timeout: Duration) -> Self {
        self.engine_timeout = timeout;
        self
    }
    /// Sets the timeout of engine calls that change state.
    pub fn engine_change_timeout(mut self, timeout: Duration) -> Self {
        self.engine_change_timeout = timeout;
        self
    }
    /// Sets an environment variable of the rung's layer (below the request's).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }
    /// Adds a label to every object the rung creates.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }
    /// Sets the hardening items.
    pub fn hardening(mut self, hardening: Hardening) -> Self {
        self.hardening = hardening;
        self
    }
    /// Stamps another incarnation than the process's own (to stand in for another process).
    pub fn incarnation(mut self, incarnation: impl Into<String>) -> Self {
        self.incarnation = Some(incarnation.into());
        self
    }
    /// Publishes a container port on the engine host's loopback (`host` 0: ephemeral).
    pub fn publish(mut self, container: u16, host: u16) -> Self {
        self.ports.insert(container, host);
        self
    }
}
