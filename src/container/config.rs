//! Configuration of the container rung, with documented defaults.

use crate::outputs::Caps;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// When to pull an image that is not present.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PullPolicy {
    /// Never pull; a missing image is a launch error.
    Never,
    /// Pull only when the image is missing (the default).
    #[default]
    IfMissing,
    /// Always pull before the attempt.
    Always,
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Receives the container's output as it arrives (e.g. the command's live view).
pub type LiveOutput = Arc<dyn Fn(Stream, &[u8]) + Send + Sync>;

/// Hardening items; each is on by default and can be relaxed only here.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Per-job ceilings a profile imposes: a request asking for more is narrowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ceilings {
    /// Limit key → the most a request may get.
    pub limits: BTreeMap<String, u64>,
}

/// How the container rung is set up. `ContainerConfig::default()` documents every default.
#[derive(Clone)]
pub struct ContainerConfig {
    /// The rung's name (default `docker`).
    pub name: String,
    /// The OCI runtime (default: the engine's). `runsc` or a `kata*` runtime makes the rung `vm`.
    pub runtime: Option<String>,
    /// The engine endpoint (default: `DOCKER_HOST`, else the local socket).
    pub endpoint: Option<String>,
    /// The binary injected as the container's init (default: the current executable).
    pub init_exe: Option<PathBuf>,
    /// Where the init bundle is prepared on the host (default: `$TMPDIR/stevedore-tools`).
    pub tools_dir: PathBuf,
    /// Where stdout/stderr captures are kept (default: `$TMPDIR/stevedore-logs`).
    pub log_dir: PathBuf,
    /// The image for handler attempts whose policy names none.
    pub worker_image: Option<String>,
    /// The non-root `uid:gid` the sandbox runs as (default `65532:65532`).
    pub user: String,
    /// The network mode (default `none`).
    pub network: String,
    /// Other network modes a caller (e.g. `stevedore run --network`) may switch to; `None`
    /// (the default without a profile) allows any. A profile allows only its own mode and
    /// its `allow_networks`.
    pub network_choices: Option<std::collections::BTreeSet<String>>,
    /// Memory when the request sets none (default 1 GiB).
    pub default_memory_bytes: u64,
    /// Process count when the request sets none (default 512).
    pub default_pids: u64,
    /// Disk (`/out`) when the request sets none (default 512 MiB).
    pub default_disk_bytes: u64,
    /// Open files per process (default 4096).
    pub default_nofile: u64,
    /// CPU in millicores when the request sets none (default: no CPU cap).
    pub default_cpu_millis: Option<u64>,
    /// The largest `/tmp` tmpfs (default 256 MiB; never more than the memory limit).
    pub max_tmp_bytes: u64,
    /// Profile ceilings.
    pub ceilings: Ceilings,
    /// Profile environment (below the request's).
    pub env: BTreeMap<String, String>,
    /// Extra labels on every container and volume.
    pub labels: BTreeMap<String, String>,
    /// Bytes of each stream kept on disk (default 4 MiB).
    pub log_cap_bytes: u64,
    /// Caps on outputs.
    pub output_caps: Caps,
    /// Pull policy (default `if_missing`; without a registry any pull fails fast).
    pub pull: PullPolicy,
    /// Hardening items.
    pub hardening: Hardening,
    /// Timeout of stevedore's own on every engine call (default 30 s).
    pub engine_timeout: Duration,
    /// Time after the grace before stevedore SIGKILLs the container itself (default 2 s).
    pub kill_margin: Duration,
    /// Attempts in flight at once (default 8).
    pub max_in_flight: usize,
    /// When the bound is reached: wait (default) or refuse.
    pub wait_for_admission: bool,
    /// Receives output live.
    pub live_output: Option<LiveOutput>,
    /// Published ports (`container_port` → host port, 0 = ephemeral), on 127.0.0.1.
    pub ports: BTreeMap<u16, u16>,
    /// The profile name, for messages.
    pub profile: Option<String>,
}

impl std::fmt::Debug for ContainerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerConfig")
            .field("name", &self.name)
            .field("runtime", &self.runtime)
            .field("endpoint", &self.endpoint)
            .field("worker_image", &self.worker_image)
            .field("user", &self.user)
            .field("network", &self.network)
            .field("env_keys", &self.env.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Default for ContainerConfig {
    fn default() -> Self {
        let tmp = std::env::temp_dir();
        Self {
            name: "docker".into(),
            runtime: None,
            endpoint: None,
            init_exe: None,
            tools_dir: super::tools::default_base(),
            log_dir: tmp.join("stevedore-logs"),
            worker_image: None,
            user: "65532:65532".into(),
            network: "none".into(),
            network_choices: None,
            default_memory_bytes: 1 << 30,
            default_pids: 512,
            default_disk_bytes: 512 << 20,
            default_nofile: 4096,
            default_cpu_millis: None,
            max_tmp_bytes: 256 << 20,
            ceilings: Ceilings::default(),
            env: BTreeMap::new(),
            labels: BTreeMap::new(),
            log_cap_bytes: 4 << 20,
            output_caps: Caps::default(),
            pull: PullPolicy::IfMissing,
            hardening: Hardening::default(),
            engine_timeout: Duration::from_secs(30),
            kill_margin: Duration::from_secs(2),
            max_in_flight: 8,
            wait_for_admission: true,
            live_output: None,
            ports: BTreeMap::new(),
            profile: None,
        }
    }
}

impl ContainerConfig {
    /// The isolation level this configuration provides.
    pub fn level(&self) -> crate::contract::Level {
        match self.runtime.as_deref() {
            Some(r) if r.contains("runsc") || r.contains("kata") || r.contains("gvisor") => crate::contract::Level::Vm,
            _ => crate::contract::Level::Sandboxed,
        }
    }

    /// The sandbox user as (uid, gid).
    pub fn uid_gid(&self) -> (u32, u32) {
        let mut it = self.user.split(':');
        let uid = it.next().and_then(|u| u.parse().ok()).unwrap_or(65532);
        let gid = it.next().and_then(|g| g.parse().ok()).unwrap_or(uid);
        (uid, gid)
    }
}
