//! The connection to an engine: API version negotiation, what the engine is, and a timeout
//! of stevedore's own on every call.

use super::api::{BollardApi, EngineApi};
use super::endpoint::{Connection, Endpoint, Transport};
use super::error::EngineError;
use bollard::Docker;
use std::sync::Arc;
use std::time::Duration;

/// The newest Docker API version this build speaks (it negotiates down to the engine's).
pub fn client_max_api() -> String {
    bollard::API_DEFAULT_VERSION.to_string()
}

/// What stevedore learned about the engine when it connected.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineFacts {
    /// The engine's product (`Docker Engine`, `Podman Engine`, ...).
    pub product: String,
    /// The engine's version.
    pub engine_version: String,
    /// The API version in use after negotiation.
    pub api_version: String,
    /// The engine's oldest supported API version.
    pub min_api_version: String,
    /// The engine's newest API version.
    pub max_api_version: String,
    /// `1` or `2`.
    pub cgroup_version: String,
    /// OCI runtimes the engine knows.
    pub runtimes: Vec<String>,
    /// The default runtime.
    pub default_runtime: String,
    /// CPUs of the engine host.
    pub ncpu: u64,
    /// Memory of the engine host.
    pub mem_total_bytes: u64,
    /// Security options (seccomp, userns, rootless, ...).
    pub security_options: Vec<String>,
    /// The storage driver.
    pub storage_driver: String,
    /// The engine host's OS (`linux`).
    pub os_type: String,
    /// The engine host's CPU architecture (`x86_64`, `aarch64`).
    pub architecture: String,
    /// The enforcement this engine reports it can apply (probed from its info).
    pub features: Vec<String>,
    /// The engine host's name, as it says (`info.Name`).
    pub host_name: String,
    /// The engine host's kernel release (`info.KernelVersion`): what a container shares
    /// unless a VM-grade runtime runs it (`contract::level_shown`).
    pub kernel_version: String,
    /// The user a rootless local engine runs as (its socket's owner): a container's ids are
    /// that user's subordinate ids outside.
    pub rootless_uid: Option<u32>,
}

impl EngineFacts {
    /// Whether this is Podman answering the Docker API.
    pub fn is_podman(&self) -> bool {
        self.product.to_ascii_lowercase().contains("podman")
    }

    /// Whether a volume mount's `NoCopy` is honoured: an empty named volume made on mount is
    /// then never filled from the image. Podman 4's Docker API ignores it (seen with 4.3.1).
    pub fn honours_nocopy(&self) -> bool {
        !self.is_podman()
    }

    /// Whether the engine applies a seccomp profile.
    pub fn seccomp(&self) -> bool {
        self.security_options.iter().any(|o| o.contains("seccomp"))
    }
}

/// Whether a local engine's socket belongs to a user other than root: a rootless engine
/// (Podman's Docker API says `Rootless` in a field the Docker API lacks, and says
/// `MemoryLimit` true where it cannot apply one; rootless Docker says `name=rootless`).
fn rootless_socket(endpoint: &super::endpoint::Endpoint) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    match (endpoint.transport, endpoint.url.strip_prefix("unix://")) {
        (super::endpoint::Transport::Unix, Some(path)) => {
            std::fs::metadata(path).ok().map(|m| m.uid()).filter(|u| *u != 0)
        }
        _ => None,
    }
}

/// What the engine can apply. A rootless engine on cgroup v1 has no cgroup of its own to
/// limit a container with, whatever its info says: no memory, CPU or pids limits.
fn features(info: &bollard::models::SystemInfo, rootless_socket: bool) -> Vec<String> {
    let flags = [
        (info.memory_limit, "memory"),
        (info.swap_limit, "memory_swap"),
        (info.cpu_cfs_quota, "cpu"),
        (info.cpu_shares, "cpu_shares"),
        (info.pids_limit, "pids"),
        (info.oom_kill_disable, "oom_kill_disable"),
    ];
    let security = [
        ("seccomp", "seccomp"),
        ("apparmor", "apparmor"),
        ("selinux", "selinux"),
        ("userns", "user_namespaces"),
        ("rootless", "rootless"),
        ("cgroupns", "cgroup_namespaces"),
    ];
    let sec = info.security_options.clone().unwrap_or_default();
    let mut f: Vec<&str> = flags.iter().filter(|(on, _)| *on == Some(true)).map(|(_, name)| *name).collect();
    f.extend(
        security.iter().filter(|(opt, _)| sec.iter().any(|s| s.contains(&format!("name={opt}")))).map(|(_, n)| *n),
    );
    // Flags of the create API that every engine speaking ≥ 1.41 honours.
    f.extend([
        "no_new_privileges",
        "read_only_rootfs",
        "cap_drop",
        "network_none",
        "tmpfs",
        "ulimits",
        "log_driver_none",
    ]);
    if rootless_socket && !f.contains(&"rootless") {
        f.push("rootless");
    }
    if f.contains(&"rootless") && info.cgroup_version.as_ref().map(ToString::to_string).as_deref() == Some("1") {
        f.retain(|k| !["memory", "memory_swap", "cpu", "cpu_shares", "pids", "oom_kill_disable"].contains(k));
    }
    f.into_iter().map(str::to_owned).collect()
}

/// How long an engine call that changes state may take by default (`connect_with` sets
/// another): long enough for an engine slowed by load, never forever.
pub const CHANGE_TIMEOUT: Duration = Duration::from_secs(600);

/// The bound of each of the connection's first calls (negotiation, version, info): four
/// reads' worth, within what a change may take.
fn connect_timeout(timeout: Duration, change: Duration) -> Duration {
    (timeout * 4).min(change.max(timeout))
}

/// One of the connection's first calls: each try under `per_try`, tried again while no
/// answer came, for `total` in all.
async fn first_call<T, F, Fut>(op: &'static str, per_try: Duration, total: Duration, call: F) -> Result<T, EngineError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, bollard::errors::Error>>,
{
    let until = tokio::time::Instant::now() + total;
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(per_try.min(left), call()).await {
            Ok(r) => return r.map_err(|source| EngineError::Api { op, source: Box::new(source) }),
            Err(_) if tokio::time::Instant::now() < until => {
                tracing::debug!(op, "no answer from the engine in {per_try:?}: asked again");
            }
            Err(_) => return Err(EngineError::Timeout { op, after: total }),
        }
    }
}

/// A client of `endpoint` that speaks `version` (nothing is sent yet).
fn dial(endpoint: &Endpoint, secs: u64, version: &bollard::ClientVersion) -> Result<Docker, EngineError> {
    let url = endpoint.dial.clone();
    let connect_err = |source| EngineError::Connect { endpoint: endpoint.url.clone(), source: Box::new(source) };
    match endpoint.transport {
        Transport::Unix => Docker::connect_with_unix(url.trim_start_matches("unix://"), secs, version),
        Transport::Tcp => Docker::connect_with_http(&url, secs, version),
        Transport::Tls => {
            let dir = endpoint.cert_path.clone().unwrap_or_default();
            Docker::connect_with_ssl(
                &url,
                &dir.join("key.pem"),
                &dir.join("cert.pem"),
                &dir.join("ca.pem"),
                secs,
                version,
            )
        }
        Transport::Ssh => Docker::connect_with_ssh(&url, secs, version, None),
    }
    .map_err(connect_err)
}

/// The version both speak: the engine's newest, where it is older than this build's.
fn negotiated(engine_api: Option<&str>) -> Option<bollard::ClientVersion> {
    let engine = parse_version(engine_api?)?;
    Some(if engine < *bollard::API_DEFAULT_VERSION { engine } else { *bollard::API_DEFAULT_VERSION })
}

/// `1.41` as bollard's version.
fn parse_version(v: &str) -> Option<bollard::ClientVersion> {
    let (major, minor) = v.split_once('.')?;
    Some(bollard::ClientVersion { major_version: major.parse().ok()?, minor_version: minor.parse().ok()? })
}

/// A negotiated connection to one engine, with per-call timeouts.
#[derive(Debug, Clone)]
pub struct Engine {
    pub(crate) api: Arc<dyn EngineApi>,
    endpoint: Endpoint,
    facts: EngineFacts,
    timeout: Duration,
    change: Duration,
    /// Whether the engine went away while an attempt ran (`watch`).
    watcher: Arc<super::watch::Watcher>,
    /// Whether `api` is a client of `endpoint` (else another implementation, which holds no
    /// connection a runtime owns: `redial` shares it).
    dialed: bool,
}

impl Engine {
    /// Connects as `connection` says (defaults: `DOCKER_HOST`, `DOCKER_TLS_VERIFY`,
    /// `DOCKER_CERT_PATH`, else the local socket), negotiates the API version (an old engine
    /// speaks 1.41, Docker 29 wants ≥ 1.44) and reads what the engine is.
    pub async fn connect(connection: &Connection, timeout: Duration) -> Result<Self, EngineError> {
        Self::connect_with(connection, timeout, CHANGE_TIMEOUT.max(timeout)).await
    }

    /// As [`Engine::connect`], with `timeout` for calls that only read and `change` for calls
    /// that change state (create, start, update, kill, remove, upload).
    pub async fn connect_with(
        connection: &Connection,
        timeout: Duration,
        change: Duration,
    ) -> Result<Self, EngineError> {
        let endpoint = super::endpoint::resolve(connection, |k| std::env::var(k).ok())?;
        // bollard's own bound on a request: never shorter than stevedore's own per class.
        let secs = change.max(timeout).as_secs().max(1);
        let docker = dial(&endpoint, secs, bollard::API_DEFAULT_VERSION)?;
        // Nothing exists yet, so a slow engine is waited for longer than one read (an engine
        // that is not there refuses at once; only one that answers slowly meets this bound),
        // and a request that got no answer within a read's bound is sent again on a new
        // connection (a burst of new connections can lose one on the way, e.g. through
        // qemu's user network: it then waits for ever).
        let first = connect_timeout(timeout, change);
        // One round trip, paid by every process before its first attempt: `/version` and
        // `/info` side by side, the negotiation done from that `/version` (bollard's own
        // `negotiate_version` asks it once more first). Both paths answer whatever version the
        // client speaks: bollard joins each path onto the base URL as an absolute path, so its
        // requests carry no version prefix and the engine answers at its own (an engine that
        // refuses a version refuses `/v1.xx/…`, never `/info`).
        let (version, info) = tokio::join!(
            first_call("version", timeout, first, || docker.version()),
            first_call("info", timeout, first, || docker.info())
        );
        let (version, info) = (version?, info?);
        let docker = match negotiated(version.api_version.as_deref()) {
            Some(v) if v < *bollard::API_DEFAULT_VERSION => dial(&endpoint, secs, &v)?,
            Some(_) => docker,
            None => {
                let source = bollard::errors::Error::APIVersionParseError {};
                return Err(EngineError::Api { op: "negotiate version", source: Box::new(source) });
            }
        };
        // Podman names itself in its components (its platform name is the OS); Docker in its
        // platform name, which a distribution's build may leave empty.
        let components: Vec<String> = version.components.iter().flatten().map(|c| c.name.clone()).collect();
        let product = components
            .iter()
            .find(|n| n.to_ascii_lowercase().contains("podman"))
            .cloned()
            .or_else(|| version.platform.as_ref().map(|p| p.name.clone()).filter(|n| n.contains("Docker")))
            .unwrap_or_else(|| "Docker Engine".into());
        let podman = product.to_ascii_lowercase().contains("podman");
        let rootless_uid = rootless_socket(&endpoint);
        let facts = EngineFacts {
            product,
            engine_version: version.version.clone().unwrap_or_default(),
            api_version: docker.client_version().to_string(),
            min_api_version: version.min_api_version.clone().unwrap_or_default(),
            max_api_version: version.api_version.clone().unwrap_or_default(),
            cgroup_version: info.cgroup_version.map(|v| v.to_string()).unwrap_or_default(),
            runtimes: {
                let mut r: Vec<String> = info.runtimes.clone().unwrap_or_default().into_keys().collect();
                // Podman lists every runtime it knows of (crun, kata, krun, runsc, ...) whether
                // or not it is installed; only the one it uses is known to work.
                if podman {
                    r = info.default_runtime.iter().cloned().collect();
                }
                r.sort();
                r
            },
            default_runtime: info.default_runtime.clone().unwrap_or_default(),
            ncpu: info.ncpu.unwrap_or(0).max(0) as u64,
            mem_total_bytes: info.mem_total.unwrap_or(0).max(0) as u64,
            security_options: info.security_options.clone().unwrap_or_default(),
            storage_driver: info.driver.clone().unwrap_or_default(),
            os_type: info.os_type.clone().unwrap_or_default(),
            architecture: info.architecture.clone().unwrap_or_default(),
            features: features(&info, rootless_uid.is_some()),
            rootless_uid,
            host_name: info.name.clone().unwrap_or_default(),
            kernel_version: info.kernel_version.clone().unwrap_or_default(),
        };
        let api = Arc::new(BollardApi::new(docker, timeout, change.max(timeout)));
        Ok(Self { api, endpoint, facts, timeout, change: change.max(timeout), watcher: Arc::default(), dialed: true })
    }

    /// The same engine through a client of its own, at the version already negotiated (no
    /// call is made): for a removal that must outlive the runtime this one's connections
    /// live on (a Drop backstop runs it on a thread of its own).
    pub(crate) fn redial(&self) -> Result<Self, EngineError> {
        if !self.dialed {
            return Ok(self.clone());
        }
        let version = parse_version(&self.facts.api_version).unwrap_or(*bollard::API_DEFAULT_VERSION);
        let docker = dial(&self.endpoint, self.change.as_secs().max(1), &version)?;
        let api = Arc::new(BollardApi::new(docker, self.timeout, self.change));
        Ok(Self { api, watcher: Arc::default(), ..self.clone() })
    }

    /// An engine behind another implementation of the calls (tests use a fake).
    #[cfg(test)]
    pub(crate) fn with_api(api: Arc<dyn EngineApi>, facts: EngineFacts, timeout: Duration) -> Self {
        let endpoint = Endpoint {
            url: "unix:///fake.sock".into(),
            transport: Transport::Unix,
            host: None,
            cert_path: None,
            dial: "unix:///fake.sock".into(),
        };
        Self { api, endpoint, facts, timeout, change: timeout, watcher: Arc::default(), dialed: false }
    }

    /// Where it is and how it is reached.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// What it is.
    pub fn facts(&self) -> &EngineFacts {
        &self.facts
    }

    /// stevedore's own timeout per call that only reads.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// stevedore's own timeout per call that changes state.
    pub fn change_timeout(&self) -> Duration {
        self.change
    }

    /// Marks now in the engine's life (and starts watching it, once): see
    /// [`Engine::lost_since`].
    pub(crate) fn mark(&self) -> super::Mark {
        self.watcher.mark(&self.api)
    }

    /// Waits (at most `within`, pinging with backoff) until the engine answers; whether it
    /// did.
    pub(crate) async fn answers_again(&self, within: Duration) -> bool {
        let until = tokio::time::Instant::now() + within;
        let mut wait = Duration::from_millis(100);
        loop {
            match tokio::time::timeout_at(until, self.api.ping()).await {
                Ok(Ok(())) => {
                    self.watcher.back();
                    return true;
                }
                Ok(Err(_)) if tokio::time::Instant::now() + wait < until => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                _ => return false,
            }
        }
    }

    /// What the engine's going away looked like, if it went away after `mark`: its event
    /// stream ended and a ping failed, or it does not answer a ping now.
    pub(crate) async fn lost_since(&self, mark: super::Mark) -> Option<String> {
        if let Some(lost) = self.watcher.lost_since(mark, self.timeout).await {
            return Some(lost);
        }
        match self.api.ping().await {
            Err(e) => {
                let what = format!("the engine did not answer a ping after the attempt's end ({})", e.message());
                // Every attempt that ran through this is told, not only the one that asked.
                self.watcher.lost(what.clone());
                Some(what)
            }
            // A stream that ended just now has been decided by the time a ping comes back.
            Ok(()) => {
                let lost = self.watcher.lost_since(mark, self.timeout).await;
                self.watcher.back();
                lost
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_spoken_is_the_older_of_the_two() {
        let v = |s: &str| negotiated(Some(s)).map(|v| v.to_string());
        assert_eq!(v("1.41").as_deref(), Some("1.41"));
        assert_eq!(v("1.44").as_deref(), Some("1.44"));
        assert_eq!(v("9.99"), Some(bollard::API_DEFAULT_VERSION.to_string()));
        assert_eq!(v("one.41"), None);
        assert_eq!(v("1.41.2"), None);
        assert_eq!(negotiated(None).map(|v| v.to_string()), None);
    }
}
