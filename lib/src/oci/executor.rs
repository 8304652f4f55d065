//! `OciExecutor`: the oci rung's public face (level `sandboxed`): its setup on the host (the
//! runtime found and asked its version, the rung's private dirs, the init's host copy, the
//! engine the images come from). Its `Executor` is the shared front's (`attempt::front`), over
//! this rung's `Launch` (`attempt`).

use super::cache::Cache;
use super::config::OciConfig;
use super::site::{OciSite, Seccomp};
use crate::attempt::SiteBase;
use crate::attempt::front::Gate;
use crate::engine::{Engine, EngineError};
use crate::hostdir::{Captures, HostDirError, PrivateDir};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why the oci rung cannot be set up as configured.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OciError {
    /// the rung runs containers as root only (rootless runtimes are not supported yet)
    #[error("the oci rung needs root (this worker is uid {0}); a rootless runtime is not supported yet")]
    NotRoot(u32),
    /// commands would run as root
    #[error("the oci rung runs commands as non-root only: configure a user other than 0")]
    RootUser,
    /// the runtime cannot be found or does not run
    #[error("the OCI runtime {runtime} cannot be used: {why}")]
    Runtime {
        /// The runtime configured.
        runtime: PathBuf,
        /// Why.
        why: String,
    },
    /// this build carries no init for this platform
    #[error("this build of stevedore carries no init for this platform")]
    NoInit,
    /// a place on the host could not be made or trusted
    #[error(transparent)]
    Dir(#[from] HostDirError),
    /// the seccomp profile cannot be used on this machine
    #[error(transparent)]
    Seccomp(#[from] super::seccomp::SeccompError),
    /// the engine the images come from cannot be reached
    #[error("the engine the images come from cannot be reached")]
    Engine(#[source] EngineError),
}

/// Runs each attempt as a bundle run by an OCI runtime (runc) directly, with no daemon in
/// the attempt's path (level `sandboxed`). Cheap to clone.
#[derive(Debug, Clone)]
pub struct OciExecutor {
    shared: Arc<OciSite>,
}

/// `name` as a path: as is when it has a slash, else the first executable of that name on
/// `PATH` (and the sbin dirs, where Debian puts runc).
fn find_runtime(name: &Path) -> Option<PathBuf> {
    if name.components().count() > 1 {
        return Some(name.to_owned());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let extra = ["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from);
    std::env::split_paths(&path).chain(extra).map(|d| d.join(name)).find(|p| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// This host's cgroup hierarchies as a runtime sees them: v1 controllers mounted, and the
/// controllers of a unified hierarchy mounted beside them (`None`: no such hierarchy).
#[derive(Debug, Default)]
struct HostCgroups {
    v1: bool,
    unified_controllers: Option<String>,
}

fn host_cgroups() -> HostCgroups {
    let root = Path::new("/sys/fs/cgroup");
    HostCgroups {
        v1: root.join("memory/memory.limit_in_bytes").exists(),
        unified_controllers: std::fs::read_to_string(root.join("unified/cgroup.controllers")).ok(),
    }
}

/// Why a runtime cannot apply cgroup limits on this host, if it is one that refuses it:
/// crun (1.8, Debian's) refuses a hybrid host, v1 controllers beside a unified hierarchy that
/// carries any ("cgroups in hybrid mode not supported, drop all controllers from cgroupv2"),
/// while runc applies the limits there.
fn limits_refused(runtime_version: &str, host: &HostCgroups) -> Option<String> {
    if !runtime_version.starts_with("crun") || !host.v1 {
        return None;
    }
    let unified = host.unified_controllers.as_deref().map(str::trim).filter(|c| !c.is_empty())?;
    Some(format!(
        "crun refuses cgroup limits on a hybrid host (v1 controllers, and the unified hierarchy carries {unified});          runc applies them"
    ))
}

impl OciExecutor {
    /// Sets the rung up: root, the runtime (asked its version), the seccomp profile for this
    /// machine, the rung's private dirs
    /// (`<base>/state` the runtime's `--root`, `bundles`, `images`), the init's host copy,
    /// the engine.
    pub async fn new(config: OciConfig) -> Result<Self, OciError> {
        let euid = nix::unistd::geteuid().as_raw();
        if euid != 0 {
            return Err(OciError::NotRoot(euid));
        }
        if config.user.0 == 0 || config.user.1 == 0 {
            return Err(OciError::RootUser);
        }
        let runtime_err = |why: String| OciError::Runtime { runtime: config.runtime.clone(), why };
        let runtime = find_runtime(&config.runtime).ok_or_else(|| runtime_err("not found".into()))?;
        let out = tokio::process::Command::new(&runtime)
            .arg("--version")
            .env_clear()
            .output()
            .await
            .map_err(|e| runtime_err(e.to_string()))?;
        if !out.status.success() {
            return Err(runtime_err(format!("--version: {}", out.status)));
        }
        let runtime_version = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().trim().to_owned();
        if let Some(why) = limits_refused(&runtime_version, &host_cgroups()) {
            return Err(runtime_err(why));
        }
        // Whether `run` takes `--preserve-fds` (runc, crun; not gVisor's runsc): the init's
        // takeover socket goes through it.
        let help =
            tokio::process::Command::new(&runtime).args(["run", "--help"]).env_clear().kill_on_drop(true).output();
        let help = tokio::time::timeout(std::time::Duration::from_secs(30), help).await;
        let takeover = help.is_ok_and(|h| {
            h.is_ok_and(|h| {
                String::from_utf8_lossy(&h.stdout).contains("preserve-fds")
                    || String::from_utf8_lossy(&h.stderr).contains("preserve-fds")
            })
        });
        let base_path = config.base_dir.clone().unwrap_or_else(|| PathBuf::from("/run/stevedore-oci"));
        let base = PrivateDir::open(&base_path)?;
        // One state dir per runtime: runc's and runsc's state do not mix.
        let state = match runtime.file_name().and_then(|n| n.to_str()) {
            Some("runc") | None => base.subdir("state")?,
            Some(other) => base.subdir(&format!("state-{other}"))?,
        }
        .path()
        .to_owned();
        let bundles = base.subdir("bundles")?.path().to_owned();
        let images = base.subdir("images")?.path().to_owned();
        let init = crate::sandbox::init_binary::bytes().ok_or(OciError::NoInit)?;
        let init_digest = crate::sandbox::init_binary::sha256().to_owned();
        let tools_dir = base.subdir("tools")?;
        let tools = tools_dir.readable_copy(&init_digest[..16], stevedore_init::wire::INIT_NAME, init)?;
        let seccomp = match config.seccomp {
            true => {
                let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
                let profile = super::seccomp::for_attempt(std::env::consts::ARCH, release.trim())?;
                match config.seccomp_by_runtime {
                    true => Seccomp::ByRuntime { profile, why: "configured (seccomp_by_runtime)".into() },
                    false => match super::seccomp::compile(&profile, std::env::consts::ARCH) {
                        Ok((bpf, syscalls)) => {
                            tools_dir.readable_copy(&init_digest[..16], stevedore_init::seccomp::FILE_NAME, &bpf)?;
                            Seccomp::ByInit { profile, syscalls }
                        }
                        Err(e) => Seccomp::ByRuntime { profile, why: e.to_string() },
                    },
                }
            }
            false => Seccomp::Off,
        };
        let engine =
            Engine::connect(&config.connection, std::time::Duration::from_secs(30)).await.map_err(OciError::Engine)?;
        let incarnation =
            config.incarnation.clone().unwrap_or_else(|| crate::contract::incarnation::current().to_owned());
        let site = OciSite {
            base: SiteBase::new(incarnation, Captures::new(config.log_dir.clone())),
            gate: Gate::new(config.max_in_flight, true, None),
            engine,
            runtime,
            runtime_version: runtime_version.clone(),
            state,
            bundles,
            tools,
            init_digest,
            images: Cache::new(
                images.clone(),
                config.image_cache_max_bytes.unwrap_or_else(|| super::cache::default_max_bytes(&images)),
            ),
            seccomp,
            apparmor: super::spec::host_apparmor(&config.apparmor_profile),
            takeover,
            holds_cgroup: runtime_version.starts_with("runsc"),
            exits: std::sync::Mutex::default(),
            config,
        };
        Ok(Self { shared: Arc::new(site) })
    }

    /// The runtime's state dir (`--root`): one entry per container it holds.
    pub fn state_dir(&self) -> &Path {
        &self.shared.state
    }

    /// The attempts' bundles' dir.
    pub fn bundles_dir(&self) -> &Path {
        &self.shared.bundles
    }

    /// What the rung is on this machine: the runtime, its version, the cgroups it drives and
    /// how, what it enforces and what it cannot (`stevedore census --rung oci`).
    pub fn census(&self) -> OciCensus {
        Self::census_of(&self.shared)
    }

    /// What every attempt of a rung's site gets enforced (the census's `features`, and
    /// `Executor::enforces`: read from the site, nothing probed).
    pub(crate) fn features_of(s: &OciSite) -> Vec<&'static str> {
        let mut features = vec![
            "memory",
            "cpu",
            "pids",
            "disk",
            "tmp",
            "nofile",
            "network",
            "read_only_rootfs",
            "capabilities",
            "no_new_privileges",
            "non_root",
            "namespaces",
            "proc",
            "devices",
            "init",
            "inputs",
        ];
        if s.seccomp.profile().is_some() {
            features.push("seccomp");
        }
        if s.apparmor.is_ok() {
            features.push("apparmor");
        }
        features
    }

    /// The census of a rung's site.
    pub(crate) fn census_of(s: &Arc<OciSite>) -> OciCensus {
        let cgroup_version = match stevedore_init::cgroup::detect(Path::new("/sys/fs/cgroup")) {
            Some(stevedore_init::cgroup::Version::V1) => "1",
            Some(stevedore_init::cgroup::Version::V2) => "2",
            None => "none",
        };
        let features = Self::features_of(s);
        let mut cannot = std::collections::BTreeMap::new();
        if let Err(why) = &s.apparmor {
            cannot.insert("apparmor", why.clone());
        }
        cannot.insert("gpu", "no GPU passed through yet".into());
        if !s.takeover {
            cannot.insert(
                "recovery",
                "the runtime's run takes no --preserve-fds: the init gets no takeover socket".into(),
            );
        }
        if s.seccomp.profile().is_none() {
            cannot.insert("seccomp", "relaxed by configuration".into());
        }
        // crun as the runtime, tried here: by configuration (`OciConfig::runtime("crun")`).
        let crun = match find_runtime(Path::new("crun")) {
            None => "not installed".to_owned(),
            Some(path) => match limits_refused("crun", &host_cgroups()) {
                Some(why) => format!("{}: cannot be the runtime here: {why}", path.display()),
                None => format!("{}: can be the runtime (OciConfig::runtime)", path.display()),
            },
        };
        OciCensus {
            runtime: s.runtime.display().to_string(),
            runtime_version: s.runtime_version.clone(),
            cgroup_version,
            cgroup_driver: "cgroupfs",
            cgroup_parent: super::spec::CGROUP_PARENT,
            level: crate::attempt::front::level(s),
            level_claimed: s.config.level(),
            features,
            cannot,
            crun,
            incarnation: s.base.incarnation.clone(),
            state_dir: s.state.display().to_string(),
            seccomp: match &s.seccomp {
                Seccomp::Off => "off".into(),
                Seccomp::ByInit { syscalls, .. } => {
                    format!("init: compiled once to BPF for this machine's ABI, {syscalls} system calls named")
                }
                Seccomp::ByRuntime { why, .. } => format!("runtime: compiled by it on every start ({why})"),
            },
        }
    }

    /// The engine the images come from (where a worker image is packed for handlers).
    pub fn engine(&self) -> &crate::engine::Engine {
        &self.shared.engine
    }

    /// Prunes the image cache down to `max_bytes` (the configured bound when `None`; 0 empties
    /// it): the oldest-used images first, never one an attempt of any process holds.
    pub async fn prune_images(&self, max_bytes: Option<u64>) -> Result<super::Pruned, super::ImageError> {
        self.shared.images.prune(max_bytes.unwrap_or(self.shared.images.max_bytes)).await
    }

    /// The runtime this rung runs, and what its `--version` says.
    pub fn runtime(&self) -> (&Path, &str) {
        (&self.shared.runtime, &self.shared.runtime_version)
    }
}

/// What the oci rung is on this machine ([`OciExecutor::census`]).
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct OciCensus {
    /// The runtime's path.
    pub runtime: String,
    /// The first line of its `--version`.
    pub runtime_version: String,
    /// `1`, `2` or `none`: the host's cgroup hierarchy.
    pub cgroup_version: &'static str,
    /// How the runtime is asked for cgroups: by path (`cgroupfs`).
    pub cgroup_driver: &'static str,
    /// The parent of every attempt's cgroup.
    pub cgroup_parent: &'static str,
    /// The rung's isolation level, as its attempts showed it (`Executor::level`).
    pub level: crate::contract::Level,
    /// The level its runtime's name claims (`vm` only counts once shown: `Executor::probe_level`).
    pub level_claimed: crate::contract::Level,
    /// What every attempt gets enforced (the evidence's `enforcement` keys).
    pub features: Vec<&'static str>,
    /// What it cannot do, and why.
    pub cannot: std::collections::BTreeMap<&'static str, String>,
    /// Whether crun could be this rung's runtime on this host, and why not.
    pub crun: String,
    /// This process's incarnation.
    pub incarnation: String,
    /// The runtime's `--root`.
    pub state_dir: String,
    /// Who installs the seccomp filter: `init` (compiled once to BPF for this machine's ABI),
    /// `runtime` (compiled by it on every start, and why), or `off`.
    pub seccomp: String,
}

crate::attempt::front::executor!(OciExecutor, shared);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crun_is_refused_on_a_hybrid_host_and_nothing_else_is() {
        let hybrid = HostCgroups { v1: true, unified_controllers: Some("hugetlb\n".into()) };
        let why = limits_refused("crun version 1.8.1", &hybrid).expect("refused");
        assert!(why.contains("hybrid") && why.contains("hugetlb"), "{why}");
        assert_eq!(limits_refused("runc version 1.1.5", &hybrid), None);
        assert_eq!(limits_refused("runsc version 0.0~20221219.0", &hybrid), None);
        let empty = HostCgroups { v1: true, unified_controllers: Some("\n".into()) };
        assert_eq!(limits_refused("crun version 1.8.1", &empty), None, "a unified hierarchy with no controller");
        let v1 = HostCgroups { v1: true, unified_controllers: None };
        assert_eq!(limits_refused("crun version 1.8.1", &v1), None);
        let v2 = HostCgroups { v1: false, unified_controllers: None };
        assert_eq!(limits_refused("crun version 1.8.1", &v2), None);
    }
}
