//! The connection to the Docker Engine: API version negotiation and a timeout of
//! stevedore's own on every call.

use bollard::Docker;
use bollard::query_parameters::{
    RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder, WaitContainerOptionsBuilder,
};
use futures_util::StreamExt;
use std::future::Future;
use std::time::Duration;

/// What stevedore learned about the engine when it connected.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineFacts {
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
    /// The enforcement this engine reports it can apply (probed from its info).
    pub features: Vec<String>,
}

fn features(info: &bollard::models::SystemInfo) -> Vec<String> {
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
    if info.runtimes.as_ref().is_some_and(|r| r.keys().any(|k| k.contains("runsc") || k.contains("kata"))) {
        f.push("vm_runtime");
    }
    f.into_iter().map(str::to_owned).collect()
}

/// `fut`, or a timeout error once `timeout` has passed.
async fn timed<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<T, bollard::errors::Error>>,
) -> Result<T, bollard::errors::Error> {
    tokio::time::timeout(timeout, fut).await.unwrap_or(Err(bollard::errors::Error::RequestTimeoutError))
}

fn gone_is_ok(r: Result<(), EngineError>) -> Result<(), EngineError> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        r => r,
    }
}

/// Who removed a container that [`Engine::remove_container`] made sure is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// This call removed it.
    Removed,
    /// It was already gone, or someone else was removing it and it is gone now.
    ByOthers,
}

/// An engine call that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// the call took longer than stevedore's own timeout
    #[error("engine call {op} timed out after {after:?}")]
    Timeout {
        /// The call.
        op: &'static str,
        /// The timeout.
        after: Duration,
    },
    /// the engine answered with an error
    #[error("engine call {op} failed")]
    Api {
        /// The call.
        op: &'static str,
        /// The cause.
        #[source]
        source: bollard::errors::Error,
    },
}

impl EngineError {
    /// Whether the engine said the object does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            EngineError::Api { source: bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }, .. }
        )
    }

    /// Whether the engine refused because someone else is removing the object.
    fn is_removal_in_progress(&self) -> bool {
        matches!(
            self,
            EngineError::Api {
                source: bollard::errors::Error::DockerResponseServerError { status_code: 409, message }, ..
            } if message.contains("already in progress")
        )
    }

    /// The engine's message, if it sent one.
    pub fn message(&self) -> String {
        match self {
            EngineError::Api { source: bollard::errors::Error::DockerResponseServerError { message, .. }, .. } => {
                message.clone()
            }
            EngineError::Api { source, .. } => source.to_string(),
            other => other.to_string(),
        }
    }
}

/// A negotiated connection with per-call timeouts.
#[derive(Debug, Clone)]
pub struct Engine {
    /// The client.
    pub docker: Docker,
    /// Where it is.
    pub endpoint: String,
    /// What it is.
    pub facts: EngineFacts,
    /// stevedore's own timeout per call.
    pub timeout: Duration,
}

/// The endpoint that `connect(None)` uses.
pub fn default_endpoint() -> String {
    std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".to_owned())
}

impl Engine {
    /// Connects to `endpoint` (default: `DOCKER_HOST`, else the local socket), negotiates
    /// the API version (an old engine speaks 1.41, Docker 29 wants ≥ 1.44) and reads the
    /// engine's facts.
    pub async fn connect(endpoint: Option<&str>, timeout: Duration) -> Result<Self, (String, bollard::errors::Error)> {
        let endpoint = endpoint.map(str::to_owned).unwrap_or_else(default_endpoint);
        let docker = if endpoint.starts_with("unix://") || endpoint.starts_with('/') {
            let path = endpoint.trim_start_matches("unix://");
            Docker::connect_with_unix(path, timeout.as_secs().max(1), bollard::API_DEFAULT_VERSION)
        } else {
            Docker::connect_with_http(&endpoint, timeout.as_secs().max(1), bollard::API_DEFAULT_VERSION)
        }
        .map_err(|e| (endpoint.clone(), e))?;
        let fail = |e| (endpoint.clone(), e);
        let docker = timed(timeout, docker.negotiate_version()).await.map_err(fail)?;
        let version = timed(timeout, docker.version()).await.map_err(fail)?;
        let info = timed(timeout, docker.info()).await.map_err(fail)?;
        let facts = EngineFacts {
            engine_version: version.version.clone().unwrap_or_default(),
            api_version: docker.client_version().to_string(),
            min_api_version: version.min_api_version.clone().unwrap_or_default(),
            max_api_version: version.api_version.clone().unwrap_or_default(),
            cgroup_version: info.cgroup_version.map(|v| v.to_string()).unwrap_or_default(),
            runtimes: {
                let mut r: Vec<String> = info.runtimes.clone().unwrap_or_default().into_keys().collect();
                r.sort();
                r
            },
            default_runtime: info.default_runtime.clone().unwrap_or_default(),
            ncpu: info.ncpu.unwrap_or(0).max(0) as u64,
            mem_total_bytes: info.mem_total.unwrap_or(0).max(0) as u64,
            security_options: info.security_options.clone().unwrap_or_default(),
            storage_driver: info.driver.clone().unwrap_or_default(),
            features: features(&info),
        };
        Ok(Self { docker, endpoint, facts, timeout })
    }

    /// Removes a container in any state with its anonymous volumes. One already gone is
    /// removed as far as stevedore is concerned; one that someone else is removing is waited
    /// for, because until it is gone its volumes are in use and cannot be removed.
    pub async fn remove_container(&self, id: &str) -> Result<Removal, EngineError> {
        let opts = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
        match self.call("remove container", self.docker.remove_container(id, Some(opts))).await {
            Ok(()) => Ok(Removal::Removed),
            Err(e) if e.is_not_found() => Ok(Removal::ByOthers),
            Err(e) if e.is_removal_in_progress() => {
                if self.wait_removed(id).await.is_err() {
                    // The other removal may have failed and left the container: try ours again.
                    let opts = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
                    gone_is_ok(self.call("remove container", self.docker.remove_container(id, Some(opts))).await)?;
                }
                Ok(Removal::ByOthers)
            }
            Err(e) => Err(e),
        }
    }

    /// Waits (under stevedore's timeout) until the container no longer exists.
    async fn wait_removed(&self, id: &str) -> Result<(), EngineError> {
        let opts = WaitContainerOptionsBuilder::default().condition("removed").build();
        let mut waiting = self.docker.wait_container(id, Some(opts));
        let first = self.call("wait for removal", async { waiting.next().await.transpose() }).await;
        match first {
            // A non-zero exit code arrives as an error, yet the container is gone.
            Ok(_) | Err(EngineError::Api { source: bollard::errors::Error::DockerContainerWaitError { .. }, .. }) => {
                Ok(())
            }
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Removes a volume; one already gone counts as removed.
    pub async fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        let opts = RemoveVolumeOptionsBuilder::default().force(true).build();
        gone_is_ok(self.call("remove volume", self.docker.remove_volume(name, Some(opts))).await)
    }

    /// Runs one engine call under stevedore's own timeout.
    pub async fn call<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, bollard::errors::Error>>,
    ) -> Result<T, EngineError> {
        let started = std::time::Instant::now();
        let res = tokio::time::timeout(self.timeout, fut).await;
        // Where an attempt's time goes (`STEVEDORE_LOG=stevedore=debug`).
        tracing::debug!(op, ms = started.elapsed().as_secs_f64() * 1000.0, "engine call");
        match res {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(EngineError::Api { op, source }),
            Err(_) => Err(EngineError::Timeout { op, after: self.timeout }),
        }
    }
}
