//! The narrow seam between stevedore and an engine: exactly the calls the rungs make, each
//! under stevedore's own timeout. [`BollardApi`] is the real one; the tests' fake
//! (`engine::fake`) lets cleanup, claims and engine failures be tested without a daemon.

use super::error::EngineError;
use crate::util::BoxFuture;
use bollard::Docker;
use bollard::models::{ContainerCreateBody, ContainerStateStatusEnum, VolumeCreateRequest};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, KillContainerOptionsBuilder,
    ListContainersOptionsBuilder, ListVolumesOptionsBuilder, RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder,
    UploadToContainerOptionsBuilder, WaitContainerOptionsBuilder,
};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::time::Duration;
use tokio::io::AsyncWrite;

/// What a call returns.
pub(crate) type Call<'a, T> = BoxFuture<'a, Result<T, EngineError>>;

/// A subscription to the engine's events, as far as a watcher cares: an item per event, an
/// end (or an error) when the engine or the connection to it goes away.
pub(crate) type Watch = Pin<Box<dyn Stream<Item = Result<(), EngineError>> + Send>>;

/// A byte stream the engine produces.
pub(crate) type ByteStream = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>;

/// One chunk of an attached container's output.
#[derive(Debug)]
pub(crate) enum Chunk {
    /// From its stdout.
    Stdout(Bytes),
    /// From its stderr.
    Stderr(Bytes),
}

/// An attached container's streams.
pub(crate) struct Attached {
    pub output: Pin<Box<dyn Stream<Item = io::Result<Chunk>> + Send>>,
    pub input: Pin<Box<dyn AsyncWrite + Send>>,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Attached")
    }
}

/// The image facts the rungs need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ImageFacts {
    pub id: String,
    pub env: Vec<String>,
    pub volumes: Vec<String>,
    pub working_dir: Option<String>,
    pub labels: HashMap<String, String>,
    /// The image's `ENTRYPOINT`: a plain command runs after it, as with `docker run IMAGE ARGV`.
    pub entrypoint: Vec<String>,
    pub user: Option<String>,
    pub architecture: String,
}

impl ImageFacts {
    /// The argv an attempt of `req` runs in this image (`image_ref`): a plain command after
    /// the image's `ENTRYPOINT` (as with `docker run IMAGE ARGV`); a handler through the
    /// worker image's entry label. A fingerprint mismatch visible on the image is refused
    /// before anything is made. Written once for the rungs that run an engine's images.
    pub fn argv(
        &self,
        req: &crate::contract::Request,
        image_ref: &str,
    ) -> Result<Vec<String>, crate::contract::LaunchError> {
        use crate::contract::{LaunchError, Task};
        use crate::labels;
        match &req.task {
            Task::Command(argv) => {
                let entry = req.entrypoint.as_ref().unwrap_or(&self.entrypoint);
                let all: Vec<String> = entry.iter().chain(argv).cloned().collect();
                if all.first().is_none_or(String::is_empty) {
                    return Err(LaunchError::InvalidRequest(crate::contract::RequestError::EmptyCommand));
                }
                Ok(all)
            }
            Task::Handler(_) => {
                let not_worker = |why: String| LaunchError::NotAWorkerImage { image: image_ref.to_owned(), why };
                let entry =
                    self.labels.get(labels::ENTRY).ok_or_else(|| not_worker(format!("no {} label", labels::ENTRY)))?;
                let mut argv: Vec<String> =
                    serde_json::from_str(entry).map_err(|e| not_worker(format!("bad {} label: {e}", labels::ENTRY)))?;
                if argv.is_empty() {
                    return Err(not_worker(format!("empty {} label", labels::ENTRY)));
                }
                if let (Some(want), Some(have)) = (&req.fingerprint, self.labels.get(labels::FINGERPRINT))
                    && want != have
                {
                    return Err(LaunchError::FingerprintMismatch {
                        image: image_ref.to_owned(),
                        expected: want.clone(),
                        actual: have.clone(),
                    });
                }
                argv.push(stevedore_init::wire::HANDLER_MARKER.to_owned());
                Ok(argv)
            }
        }
    }
}

/// What a container's state says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ContainerState {
    pub running: bool,
    pub removing: bool,
    pub exit_code: Option<i64>,
    pub oom_killed: Option<bool>,
    /// Published ports: container port → host address.
    pub ports: Vec<(String, String)>,
    /// Its labels.
    pub labels: HashMap<String, String>,
}

/// What a path in a container's filesystem is, as the archive API says (the last component
/// not followed; the ones before it resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PathKind {
    Dir,
    File,
    /// A symlink, and where it points as the engine resolves it.
    Symlink(String),
    /// Something else (a device, a FIFO, a socket).
    Other,
    Missing,
}

impl PathKind {
    /// Its kind as kept in the state dir (`container::mounts`).
    pub(crate) fn kept_kind(&self) -> &'static str {
        match self {
            PathKind::Dir => "dir",
            PathKind::File => "file",
            PathKind::Symlink(_) => "symlink",
            PathKind::Other => "other",
            PathKind::Missing => "missing",
        }
    }

    /// A symlink's target as kept (empty for every other kind).
    pub(crate) fn kept_target(&self) -> &str {
        match self {
            PathKind::Symlink(t) => t,
            _ => "",
        }
    }

    /// Back from [`Self::kept_kind`] and [`Self::kept_target`]; `None` for an unknown kind.
    pub(crate) fn from_kept(kind: &str, target: String) -> Option<Self> {
        Some(match kind {
            "dir" => PathKind::Dir,
            "file" => PathKind::File,
            "symlink" => PathKind::Symlink(target),
            "other" => PathKind::Other,
            "missing" => PathKind::Missing,
            _ => return None,
        })
    }

    /// From the archive API's stat: a Go `os.FileMode` and the link target.
    fn of(mode: u32, link_target: String) -> Self {
        const DIR: u32 = 1 << 31;
        const SYMLINK: u32 = 1 << 27;
        const SPECIAL: u32 = (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19);
        if mode & SYMLINK != 0 {
            PathKind::Symlink(if link_target.is_empty() { "?".into() } else { link_target })
        } else if mode & DIR != 0 {
            PathKind::Dir
        } else if mode & SPECIAL != 0 {
            PathKind::Other
        } else {
            PathKind::File
        }
    }
}

/// A container as a listing shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Listed {
    pub id: String,
    pub name: String,
    pub labels: HashMap<String, String>,
}

/// An image as the engine describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ImageInfo {
    pub id: String,
    /// Its tags (`<none>:<none>` left out).
    pub tags: Vec<String>,
    pub labels: HashMap<String, String>,
    /// Its configured user.
    pub user: Option<String>,
    pub size_bytes: i64,
}

/// What an image build or import made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Built {
    /// The image, and its id when the engine said it.
    Made(Option<String>),
    /// The build itself failed (a Dockerfile step, a bad context): the builder's message.
    Failed(String),
}

/// Who removed a container that `remove_container` made sure is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// This call removed it.
    Removed,
    /// It was already gone, or someone else was removing it and it is gone now.
    ByOthers,
}

/// One item of an attached stream, as a [`Chunk`] (stdin echoes are dropped).
async fn log_chunk(item: Result<bollard::container::LogOutput, bollard::errors::Error>) -> Option<io::Result<Chunk>> {
    match item {
        Ok(bollard::container::LogOutput::StdOut { message })
        | Ok(bollard::container::LogOutput::Console { message }) => Some(Ok(Chunk::Stdout(message))),
        Ok(bollard::container::LogOutput::StdErr { message }) => Some(Ok(Chunk::Stderr(message))),
        Ok(bollard::container::LogOutput::StdIn { .. }) => None,
        Err(e) => Some(Err(io::Error::other(e))),
    }
}

/// The calls the rungs make.
pub(crate) trait EngineApi: Send + Sync + std::fmt::Debug {
    /// Whether the engine answers (under the call timeout).
    fn ping(&self) -> Call<'_, ()>;
    /// Subscribes to the engine's daemon events: a stream that stays idle while the engine
    /// is up (no timeout applies to it), ended by the engine's going away.
    fn watch(&self) -> Watch;
    fn inspect_image<'a>(&'a self, image: &'a str) -> Call<'a, ImageFacts>;
    /// Pulls an image from its registry, with `auth` when given (under the bound of a
    /// change: a large image takes minutes; a registry that is not there fails at once).
    fn pull<'a>(&'a self, image: &'a str, auth: Option<&'a super::credentials::RegistryAuth>) -> Call<'a, ()>;
    /// Creates a volume; one that exists is returned as it is (Docker) or refused with a
    /// conflict (Podman).
    fn create_volume(&self, req: VolumeCreateRequest) -> Call<'_, Listed>;
    /// A volume's labels, `None` when it does not exist.
    fn inspect_volume<'a>(&'a self, name: &'a str) -> Call<'a, Option<Listed>>;
    /// Removes a volume; one already gone counts as removed.
    fn remove_volume<'a>(&'a self, name: &'a str) -> Call<'a, ()>;
    fn list_volumes(&self, filters: HashMap<String, Vec<String>>) -> Call<'_, Vec<Listed>>;
    fn create_container<'a>(&'a self, name: &'a str, body: ContainerCreateBody) -> Call<'a, String>;
    /// Removes a container in any state with its anonymous volumes; see [`Removal`].
    fn remove_container<'a>(&'a self, name: &'a str) -> Call<'a, Removal>;
    fn list_containers(&self, filters: HashMap<String, Vec<String>>) -> Call<'_, Vec<Listed>>;
    fn attach<'a>(&'a self, name: &'a str) -> Call<'a, Attached>;
    /// Runs `argv` in a running container with its stdin, stdout and stderr attached, as
    /// `user` (`uid:gid`; `None`: the container's).
    fn exec<'a>(&'a self, name: &'a str, argv: Vec<String>, user: Option<&'a str>) -> Call<'a, Attached>;
    fn start<'a>(&'a self, name: &'a str) -> Call<'a, ()>;
    /// Changes the limits of a (running) container: memory (swap off), CPU, pids.
    fn update<'a>(&'a self, name: &'a str, memory: u64, nano_cpus: Option<u64>, pids: u64) -> Call<'a, ()>;
    /// Waits (under the call timeout) for a started container to exit; its exit code.
    fn wait_exit<'a>(&'a self, name: &'a str) -> Call<'a, i64>;
    fn kill<'a>(&'a self, name: &'a str, signal: &'a str) -> Call<'a, ()>;
    fn inspect_container<'a>(&'a self, name: &'a str) -> Call<'a, ContainerState>;
    /// What `path` is in a (created, not necessarily started) container's filesystem.
    fn stat_path<'a>(&'a self, name: &'a str, path: &'a str) -> Call<'a, PathKind>;
    /// Uploads a tar into `path` of a (created, not necessarily started) container, under
    /// `timeout` instead of the per-call one (a large upload takes longer).
    fn upload<'a>(&'a self, name: &'a str, path: &'a str, tar: ByteStream, timeout: Duration) -> Call<'a, ()>;
    /// A (created, not necessarily started) container's whole filesystem as one tar: the
    /// image's layers flattened by the engine (`docker export`); the oci rung's images.
    #[cfg(feature = "oci")]
    fn export(&self, name: &str) -> ByteStream;
    /// An image by reference or id, `None` when there is none.
    fn image_info<'a>(&'a self, reference: &'a str) -> Call<'a, Option<ImageInfo>>;
    /// Images matching `filters`, intermediate ones included.
    fn list_images(&self, filters: HashMap<String, Vec<String>>) -> Call<'_, Vec<ImageInfo>>;
    /// The ids of the images some container (running or not) was made from.
    fn images_in_use(&self) -> Call<'_, std::collections::HashSet<String>>;
    /// Removes an image (or one tag of it), never forced: one a container uses stays (409).
    fn remove_image<'a>(&'a self, name: &'a str) -> Call<'a, ()>;
    /// Imports a root filesystem tar as a one-layer image `reference` with Dockerfile
    /// `changes` applied. Not under the per-call timeout: it takes what the tar's size takes.
    fn import_image<'a>(&'a self, reference: &'a str, rootfs: ByteStream, changes: Vec<String>) -> Call<'a, Built>;
    /// Builds a Dockerfile context (a tar with `Dockerfile` at its root) into `tag` with the
    /// engine's legacy builder. Not under the per-call timeout: its steps take what they take.
    fn build_image<'a>(&'a self, tag: &'a str, context: Vec<u8>) -> Call<'a, Built>;
}

/// The real engine, through bollard.
#[derive(Debug, Clone)]
pub(crate) struct BollardApi {
    docker: Docker,
    /// The bound of a call that only reads.
    timeout: Duration,
    /// The bound of a call that changes state: longer, so a slow engine is not abandoned
    /// halfway through something it will then finish alone.
    change: Duration,
}

impl BollardApi {
    pub fn new(docker: Docker, timeout: Duration, change: Duration) -> Self {
        Self { docker, timeout, change }
    }

    /// Runs one call that only reads under stevedore's own timeout.
    async fn call<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, bollard::errors::Error>>,
    ) -> Result<T, EngineError> {
        timed(op, self.timeout, fut).await
    }

    /// Runs one call that changes state under the longer bound.
    async fn change<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, bollard::errors::Error>>,
    ) -> Result<T, EngineError> {
        timed(op, self.change, fut).await
    }

    async fn remove(&self, name: &str) -> Result<(), EngineError> {
        let opts = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
        self.change("remove container", self.docker.remove_container(name, Some(opts))).await
    }

    /// Waits (under stevedore's timeout) until the container no longer exists.
    async fn wait_removed(&self, name: &str) -> Result<(), EngineError> {
        let opts = WaitContainerOptionsBuilder::default().condition("removed").build();
        let mut waiting = self.docker.wait_container(name, Some(opts));
        match self.call("wait for removal", async { waiting.next().await.transpose() }).await {
            // A non-zero exit code arrives as an error, yet the container is gone.
            Ok(_) => Ok(()),
            Err(EngineError::Api { source, .. })
                if matches!(source.as_ref(), bollard::errors::Error::DockerContainerWaitError { .. }) =>
            {
                Ok(())
            }
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// `fut` under `timeout`, logged with its duration (`STEVEDORE_LOG=stevedore=debug` shows
/// where an attempt's time goes).
pub(crate) async fn timed<T>(
    op: &'static str,
    timeout: Duration,
    fut: impl Future<Output = Result<T, bollard::errors::Error>>,
) -> Result<T, EngineError> {
    let started = std::time::Instant::now();
    let res = tokio::time::timeout(timeout, fut).await;
    tracing::debug!(op, ms = started.elapsed().as_secs_f64() * 1000.0, "engine call");
    match res {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(EngineError::Api { op, source: Box::new(source) }),
        Err(_) => Err(EngineError::Timeout { op, after: timeout }),
    }
}

fn gone_is_ok(r: Result<(), EngineError>) -> Result<(), EngineError> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        r => r,
    }
}

/// The builder's message of a failed build or import, if the error is one.
fn build_failure(e: &bollard::errors::Error) -> Option<String> {
    match e {
        bollard::errors::Error::DockerStreamError { error: message }
        | bollard::errors::Error::DockerResponseServerError { message, .. } => Some(message.trim().to_owned()),
        _ => None,
    }
}

/// `repo:tag` of a reference (`latest` when it has none; a registry's port is no tag).
fn split_tag(reference: &str) -> (&str, &str) {
    match reference.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, tag),
        _ => (reference, "latest"),
    }
}

fn image_info(i: bollard::models::ImageInspect) -> ImageInfo {
    let cfg = i.config.unwrap_or_default();
    ImageInfo {
        id: i.id.unwrap_or_default(),
        tags: i.repo_tags.unwrap_or_default().into_iter().filter(|t| !t.is_empty() && t != "<none>:<none>").collect(),
        labels: cfg.labels.unwrap_or_default(),
        user: cfg.user.filter(|u| !u.is_empty()),
        size_bytes: i.size.unwrap_or(0),
    }
}

impl EngineApi for BollardApi {
    fn ping(&self) -> Call<'_, ()> {
        Box::pin(async move { self.call("ping", self.docker.ping()).await.map(|_| ()) })
    }

    fn watch(&self) -> Watch {
        let filters = HashMap::from([("type".to_owned(), vec!["daemon".to_owned()])]);
        let opts = bollard::query_parameters::EventsOptionsBuilder::default().filters(&filters).build();
        Box::pin(self.docker.events(Some(opts)).map(|item| {
            item.map(|_| ()).map_err(|source| EngineError::Api { op: "watch events", source: Box::new(source) })
        }))
    }

    fn inspect_image<'a>(&'a self, image: &'a str) -> Call<'a, ImageFacts> {
        Box::pin(async move {
            let i = self.call("inspect image", self.docker.inspect_image(image)).await?;
            let cfg = i.config.unwrap_or_default();
            Ok(ImageFacts {
                id: i.id.unwrap_or_default(),
                env: cfg.env.unwrap_or_default(),
                volumes: cfg.volumes.map(|v| v.into_iter().collect()).unwrap_or_default(),
                working_dir: cfg.working_dir.filter(|w| !w.is_empty()),
                labels: cfg.labels.unwrap_or_default(),
                entrypoint: cfg.entrypoint.unwrap_or_default().into_iter().filter(|a| !a.is_empty()).collect(),
                user: cfg.user.filter(|u| !u.is_empty()),
                architecture: i.architecture.unwrap_or_default(),
            })
        })
    }

    fn pull<'a>(&'a self, image: &'a str, auth: Option<&'a super::credentials::RegistryAuth>) -> Call<'a, ()> {
        Box::pin(async move {
            let opts = bollard::query_parameters::CreateImageOptionsBuilder::default().from_image(image).build();
            let mut s = self.docker.create_image(Some(opts), None, auth.map(|a| a.creds.clone()));
            let drained = async {
                while let Some(item) = s.next().await {
                    item?;
                }
                Ok(())
            };
            self.change("pull image", drained).await
        })
    }

    fn create_volume(&self, req: VolumeCreateRequest) -> Call<'_, Listed> {
        Box::pin(async move {
            let v = self.change("create volume", self.docker.create_volume(req)).await?;
            Ok(Listed { id: v.name.clone(), name: v.name, labels: v.labels })
        })
    }

    fn inspect_volume<'a>(&'a self, name: &'a str) -> Call<'a, Option<Listed>> {
        Box::pin(async move {
            match self.call("inspect volume", self.docker.inspect_volume(name)).await {
                Ok(v) => Ok(Some(Listed { id: v.name.clone(), name: v.name, labels: v.labels })),
                Err(e) if e.is_not_found() => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    fn remove_volume<'a>(&'a self, name: &'a str) -> Call<'a, ()> {
        Box::pin(async move {
            let opts = RemoveVolumeOptionsBuilder::default().force(true).build();
            gone_is_ok(self.change("remove volume", self.docker.remove_volume(name, Some(opts))).await)
        })
    }

    fn list_volumes(&self, filters: HashMap<String, Vec<String>>) -> Call<'_, Vec<Listed>> {
        Box::pin(async move {
            let opts = ListVolumesOptionsBuilder::default().filters(&filters).build();
            let v = self.call("list volumes", self.docker.list_volumes(Some(opts))).await?;
            Ok(v.volumes
                .unwrap_or_default()
                .into_iter()
                .map(|v| Listed { id: v.name.clone(), name: v.name, labels: v.labels })
                .collect())
        })
    }

    fn create_container<'a>(&'a self, name: &'a str, body: ContainerCreateBody) -> Call<'a, String> {
        Box::pin(async move {
            let opts = CreateContainerOptionsBuilder::default().name(name).build();
            let created = self.change("create container", self.docker.create_container(Some(opts), body)).await?;
            Ok(created.id)
        })
    }

    fn remove_container<'a>(&'a self, name: &'a str) -> Call<'a, Removal> {
        Box::pin(async move {
            match self.remove(name).await {
                Ok(()) => Ok(Removal::Removed),
                Err(e) if e.is_not_found() => Ok(Removal::ByOthers),
                Err(e) if e.is_removal_in_progress() => {
                    // Until it is gone its volumes are in use: wait for the other removal.
                    if self.wait_removed(name).await.is_err() {
                        // The other removal may have failed and left the container.
                        gone_is_ok(self.remove(name).await)?;
                    }
                    Ok(Removal::ByOthers)
                }
                Err(e) => Err(e),
            }
        })
    }

    fn list_containers(&self, filters: HashMap<String, Vec<String>>) -> Call<'_, Vec<Listed>> {
        Box::pin(async move {
            let opts = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
            let c = self.call("list containers", self.docker.list_containers(Some(opts))).await?;
            Ok(c.into_iter()
                .map(|c| Listed {
                    id: c.id.unwrap_or_default(),
                    name: c
                        .names
                        .and_then(|n| n.into_iter().next())
                        .unwrap_or_default()
                        .trim_start_matches('/')
                        .to_owned(),
                    labels: c.labels.unwrap_or_default(),
                })
                .collect())
        })
    }

    fn attach<'a>(&'a self, name: &'a str) -> Call<'a, Attached> {
        Box::pin(async move {
            let opts = AttachContainerOptionsBuilder::default()
                .stdin(true)
                .stdout(true)
                .stderr(true)
                .stream(true)
                .logs(false)
                .build();
            let a = self.call("attach container", self.docker.attach_container(name, Some(opts))).await?;
            Ok(Attached { output: Box::pin(a.output.filter_map(log_chunk)), input: a.input })
        })
    }

    fn exec<'a>(&'a self, name: &'a str, argv: Vec<String>, user: Option<&'a str>) -> Call<'a, Attached> {
        Box::pin(async move {
            let create = bollard::exec::CreateExecOptions::<String> {
                user: user.map(str::to_owned),
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(false),
                cmd: Some(argv),
                ..Default::default()
            };
            let id = self.call("create exec", self.docker.create_exec(name, create)).await?.id;
            let start = bollard::exec::StartExecOptions { detach: false, tty: false, output_capacity: None };
            match self.call("start exec", self.docker.start_exec(&id, Some(start))).await? {
                bollard::exec::StartExecResults::Attached { output, input } => {
                    Ok(Attached { output: Box::pin(output.filter_map(log_chunk)), input })
                }
                bollard::exec::StartExecResults::Detached => Err(EngineError::Refused {
                    op: "start exec",
                    status: 500,
                    message: "the engine started the exec detached".into(),
                }),
            }
        })
    }

    fn start<'a>(&'a self, name: &'a str) -> Call<'a, ()> {
        Box::pin(async move { self.change("start container", self.docker.start_container(name, None)).await })
    }

    fn update<'a>(&'a self, name: &'a str, memory: u64, nano_cpus: Option<u64>, pids: u64) -> Call<'a, ()> {
        Box::pin(async move {
            let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            let body = bollard::models::ContainerUpdateBody {
                memory: Some(clamp(memory)),
                memory_swap: Some(clamp(memory)),
                // 0 lifts a quota the container was created with.
                nano_cpus: Some(nano_cpus.map_or(0, clamp)),
                pids_limit: Some(clamp(pids)),
                ..Default::default()
            };
            self.change("update container", self.docker.update_container(name, body)).await
        })
    }

    fn wait_exit<'a>(&'a self, name: &'a str) -> Call<'a, i64> {
        Box::pin(async move {
            let mut waiting = self.docker.wait_container(name, None::<bollard::query_parameters::WaitContainerOptions>);
            // bollard reports a non-zero exit as an error: it is an exit code here.
            match self.call("wait container", async { waiting.next().await.transpose() }).await {
                Ok(Some(r)) => Ok(r.status_code),
                Ok(None) => Ok(0),
                Err(EngineError::Api { source, .. })
                    if matches!(source.as_ref(), bollard::errors::Error::DockerContainerWaitError { .. }) =>
                {
                    match *source {
                        bollard::errors::Error::DockerContainerWaitError { code, .. } => Ok(code),
                        _ => unreachable!("matched above"),
                    }
                }
                Err(e) => Err(e),
            }
        })
    }

    fn kill<'a>(&'a self, name: &'a str, signal: &'a str) -> Call<'a, ()> {
        Box::pin(async move {
            let opts = KillContainerOptionsBuilder::default().signal(signal).build();
            self.change("kill container", self.docker.kill_container(name, Some(opts))).await
        })
    }

    fn inspect_container<'a>(&'a self, name: &'a str) -> Call<'a, ContainerState> {
        Box::pin(async move {
            let i = self.call("inspect container", self.docker.inspect_container(name, None)).await?;
            let state = i.state.unwrap_or_default();
            let mut ports = Vec::new();
            for (k, v) in i.network_settings.and_then(|n| n.ports).unwrap_or_default() {
                if let Some(b) = v.and_then(|b| b.into_iter().next()) {
                    ports.push((k, format!("{}:{}", b.host_ip.unwrap_or_default(), b.host_port.unwrap_or_default())));
                }
            }
            Ok(ContainerState {
                running: state.running.unwrap_or(false),
                removing: state.status == Some(ContainerStateStatusEnum::REMOVING),
                exit_code: state.exit_code,
                oom_killed: state.oom_killed,
                ports,
                labels: i.config.and_then(|c| c.labels).unwrap_or_default(),
            })
        })
    }

    fn stat_path<'a>(&'a self, name: &'a str, path: &'a str) -> Call<'a, PathKind> {
        Box::pin(async move {
            let opts = bollard::query_parameters::ContainerArchiveInfoOptionsBuilder::default().path(path).build();
            match self.call("stat path", self.docker.get_container_archive_info(name, Some(opts))).await {
                Ok(st) => Ok(PathKind::of(st.file_mode, st.link_target)),
                Err(e) if e.is_not_found() => Ok(PathKind::Missing),
                Err(e) => Err(e),
            }
        })
    }

    fn upload<'a>(&'a self, name: &'a str, path: &'a str, tar: ByteStream, timeout: Duration) -> Call<'a, ()> {
        Box::pin(async move {
            let opts = UploadToContainerOptionsBuilder::default().path(path).build();
            let body = bollard::body_try_stream(tar);
            let bound = timeout.max(self.change);
            timed("upload archive", bound, self.docker.upload_to_container(name, Some(opts), body)).await
        })
    }

    #[cfg(feature = "oci")]
    fn export(&self, name: &str) -> ByteStream {
        Box::pin(self.docker.export_container(name).map(|r| r.map_err(io::Error::other)))
    }

    fn image_info<'a>(&'a self, reference: &'a str) -> Call<'a, Option<ImageInfo>> {
        Box::pin(async move {
            match self.call("inspect image", self.docker.inspect_image(reference)).await {
                Ok(i) => Ok(Some(image_info(i))),
                Err(e) if e.is_not_found() => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    fn list_images(&self, filters: HashMap<String, Vec<String>>) -> Call<'_, Vec<ImageInfo>> {
        Box::pin(async move {
            let opts = bollard::query_parameters::ListImagesOptionsBuilder::new().all(true).filters(&filters).build();
            let images = self.call("list images", self.docker.list_images(Some(opts))).await?;
            Ok(images
                .into_iter()
                .map(|i| ImageInfo {
                    id: i.id,
                    tags: i.repo_tags.into_iter().filter(|t| t != "<none>:<none>").collect(),
                    labels: i.labels,
                    user: None,
                    size_bytes: i.size,
                })
                .collect())
        })
    }

    fn images_in_use(&self) -> Call<'_, std::collections::HashSet<String>> {
        Box::pin(async move {
            let opts = ListContainersOptionsBuilder::default().all(true).build();
            let c = self.call("list containers", self.docker.list_containers(Some(opts))).await?;
            Ok(c.into_iter().filter_map(|c| c.image_id).collect())
        })
    }

    fn remove_image<'a>(&'a self, name: &'a str) -> Call<'a, ()> {
        Box::pin(async move {
            let opts = bollard::query_parameters::RemoveImageOptionsBuilder::new().force(false).noprune(false).build();
            self.call("remove image", self.docker.remove_image(name, Some(opts), None)).await.map(|_| ())
        })
    }

    fn import_image<'a>(&'a self, reference: &'a str, rootfs: ByteStream, changes: Vec<String>) -> Call<'a, Built> {
        Box::pin(async move {
            let (repo, tag) = split_tag(reference);
            let opts = bollard::query_parameters::CreateImageOptionsBuilder::new()
                .from_src("-")
                .repo(repo)
                .tag(tag)
                .changes(changes)
                .build();
            let mut stream = self.docker.create_image(Some(opts), Some(bollard::body_try_stream(rootfs)), None);
            let started = std::time::Instant::now();
            let mut id = None;
            while let Some(item) = stream.next().await {
                match item {
                    // The import's one record carries the new image id as its status.
                    Ok(info) => id = info.status.filter(|s| s.starts_with("sha256:")).or(id),
                    Err(e) => match build_failure(&e) {
                        Some(message) => return Ok(Built::Failed(message)),
                        None => return Err(EngineError::Api { op: "import image", source: Box::new(e) }),
                    },
                }
            }
            tracing::debug!(op = "import image", ms = started.elapsed().as_secs_f64() * 1000.0, "engine call");
            Ok(Built::Made(id))
        })
    }

    fn build_image<'a>(&'a self, tag: &'a str, context: Vec<u8>) -> Call<'a, Built> {
        Box::pin(async move {
            let opts = bollard::query_parameters::BuildImageOptionsBuilder::new()
                .dockerfile("Dockerfile")
                .t(tag)
                // Intermediate containers of RUN steps must not outlive the build, failed or not.
                .rm(true)
                .forcerm(true)
                .build();
            let mut stream = self.docker.build_image(opts, None, Some(bollard::body_full(context.into())));
            let mut id = None;
            while let Some(item) = stream.next().await {
                match item {
                    Ok(info) => {
                        if let Some(line) = info.stream.as_deref().map(str::trim_end).filter(|l| !l.is_empty()) {
                            tracing::debug!(tag, "build: {line}");
                        }
                        id = info.aux.and_then(|aux| aux.id).or(id);
                    }
                    Err(e) => match build_failure(&e) {
                        Some(message) => return Ok(Built::Failed(message)),
                        None => return Err(EngineError::Api { op: "build image", source: Box::new(e) }),
                    },
                }
            }
            Ok(Built::Made(id))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_tags() {
        assert_eq!(split_tag("a/b:1"), ("a/b", "1"));
        assert_eq!(split_tag("a/b"), ("a/b", "latest"));
        assert_eq!(split_tag("host:5000/b"), ("host:5000/b", "latest"));
    }

    #[test]
    fn only_real_tags_count() {
        let tags = |t: &[&str]| {
            let i = bollard::models::ImageInspect {
                repo_tags: Some(t.iter().map(|s| (*s).to_owned()).collect()),
                ..Default::default()
            };
            image_info(i).tags
        };
        assert!(tags(&[]).is_empty());
        assert!(tags(&["<none>:<none>"]).is_empty());
        assert_eq!(tags(&["<none>:<none>", "a/b:1"]), ["a/b:1"]);
    }
}
