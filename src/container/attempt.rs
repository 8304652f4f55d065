//! One attempt in one container, from staging to removal.

use super::config::{ContainerConfig, Stream};
use super::engine::{Engine, EngineError};
use super::labels::{self, AttemptLabels, Owner};
use super::logs::{CappedLog, SentinelScanner};
use super::spec::{self, Applied, CONTROL_BYTES, Volumes};
use super::{env as envlayer, pipe, staging};
use crate::contract::{Evidence, Exit, Facts, LaunchError, Outcome, Request, Status, Task, Usage, decide, reason};
use crate::outputs;
use crate::protocol::{
    self, CONTROL_DIR, HANDLER_FILE, HANDLER_MARKER, HandlerRecord, HandlerRequest, HandlerResult, IN_DIR, InitRecord,
    InitSpec, OUT_DIR, RESULT_FILE, StoppedBy, WaitStatus,
};
use bollard::models::{ContainerCreateBody, HostConfig, VolumeCreateRequest};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, DownloadFromContainerOptionsBuilder,
    KillContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use futures_util::StreamExt;
use rand::Rng;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Things the rung shares with each attempt.
#[derive(Debug)]
pub(crate) struct Shared {
    pub engine: Engine,
    pub config: ContainerConfig,
    pub tools_dir: PathBuf,
    pub init_argv: Vec<String>,
    pub incarnation: String,
    in_flight: Mutex<HashSet<String>>,
    pub tracker: TaskTracker,
}

impl Shared {
    /// The rung's shared state, with no attempt in flight yet.
    pub fn new(
        engine: Engine,
        config: ContainerConfig,
        tools_dir: PathBuf,
        init_argv: Vec<String>,
        incarnation: String,
    ) -> Self {
        let in_flight = Mutex::default();
        Self { engine, config, tools_dir, init_argv, incarnation, in_flight, tracker: TaskTracker::new() }
    }

    /// The attempt ids in flight. Never panics: a poisoned lock still holds a valid set (a
    /// Drop backstop and reclaim must work after a panic elsewhere).
    pub fn in_flight(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.in_flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn random_hex(bytes: usize) -> String {
    let mut rng = rand::rng();
    (0..bytes).map(|_| format!("{:02x}", rng.random::<u8>())).collect()
}

fn engine_err(op: &'static str, e: EngineError) -> LaunchError {
    LaunchError::Engine { op, source: Box::new(e) }
}

/// What must be removed when the attempt ends, whichever way it ends.
#[derive(Debug, Default)]
struct Leftovers {
    containers: Vec<String>,
    volumes: Vec<String>,
    /// Tracked tasks running calls that create objects; removal waits for them.
    creating: Vec<tokio::task::JoinHandle<()>>,
}

/// Runs an engine call that creates an object on the rung's tracked tasks, so that it
/// completes even if the attempt's future is dropped meanwhile: a removal racing an
/// unfinished create would find nothing, and the object would appear afterwards and leak.
async fn creating<T: Send + 'static>(
    shared: &Shared,
    left: &mut Leftovers,
    op: &'static str,
    call: impl Future<Output = Result<T, EngineError>> + Send + 'static,
) -> Result<T, LaunchError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    left.creating.push(shared.tracker.spawn(async move {
        let _ = tx.send(call.await);
    }));
    match rx.await {
        Ok(r) => r.map_err(|err| engine_err(op, err)),
        Err(_) => Err(LaunchError::Staging { what: format!("engine call {op} was abandoned"), source: op.into() }),
    }
}

/// Removes the attempt's objects. Explicit cleanup awaits [`Cleanup::run`]; if the attempt's
/// future is dropped first, `Drop` hands the rest of the work to the rung's tracked tasks.
struct Cleanup {
    shared: Arc<Shared>,
    attempt_id: String,
    left: Leftovers,
    done: bool,
}

impl std::fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cleanup").field("attempt_id", &self.attempt_id).field("left", &self.left).finish()
    }
}

/// What removing an attempt's objects found.
#[derive(Debug, Default)]
struct Removed {
    errors: Vec<String>,
    /// Containers that someone else had removed or was removing.
    by_others: Vec<String>,
}

/// Removes what `left` lists. Each object leaves the list only once its removal was tried,
/// so a removal interrupted by a dropped future leaves the rest to the backstop.
async fn remove_all(shared: &Shared, left: &mut Leftovers) -> Removed {
    for handle in std::mem::take(&mut left.creating) {
        let _ = handle.await;
    }
    let mut removed = Removed::default();
    let e = &shared.engine;
    // Containers first: a volume in use cannot be removed.
    while let Some(c) = left.containers.first() {
        match e.remove_container(c).await {
            Ok(super::engine::Removal::Removed) => {}
            Ok(super::engine::Removal::ByOthers) => removed.by_others.push(c.clone()),
            Err(err) => removed.errors.push(format!("container {c}: {}", err.message())),
        }
        left.containers.remove(0);
    }
    while let Some(v) = left.volumes.first() {
        if let Err(err) = e.remove_volume(v).await {
            removed.errors.push(format!("volume {v}: {}", err.message()));
        }
        left.volumes.remove(0);
    }
    removed
}

fn forget_in_flight(shared: &Shared, attempt_id: &str) {
    // Never panics: a poisoned set is still a set.
    shared.in_flight().remove(attempt_id);
}

impl Cleanup {
    async fn run(mut self) -> Removed {
        let removed = remove_all(&self.shared, &mut self.left).await;
        // Only now: dropped halfway, `Drop` must still see what is left.
        self.done = true;
        forget_in_flight(&self.shared, &self.attempt_id);
        removed
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let shared = self.shared.clone();
        let mut left = std::mem::take(&mut self.left);
        let id = self.attempt_id.clone();
        // Never panic or block here: without a runtime the objects stay labelled for `reclaim`.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let tracker = shared.tracker.clone();
            tracker.spawn_on(
                async move {
                    let removed = remove_all(&shared, &mut left).await;
                    forget_in_flight(&shared, &id);
                    if !removed.errors.is_empty() {
                        tracing::warn!(attempt_id = %id, errors = ?removed.errors, "backstop cleanup left objects behind");
                    }
                },
                &handle,
            );
        } else {
            tracing::warn!(attempt_id = %id, "attempt dropped without a runtime; reclaim will remove its objects");
        }
    }
}

/// The image facts an attempt needs.
struct ImageFacts {
    id: String,
    env: Vec<String>,
    volumes: Vec<String>,
    working_dir: Option<String>,
    labels: HashMap<String, String>,
    /// The image's `ENTRYPOINT`: a plain command runs after it, as with `docker run IMAGE ARGV`.
    entrypoint: Vec<String>,
}

async fn resolve_image(shared: &Shared, image: &str) -> Result<ImageFacts, LaunchError> {
    use super::config::PullPolicy;
    let e = &shared.engine;
    let pull = |why: String| async move {
        let opts = bollard::query_parameters::CreateImageOptionsBuilder::default().from_image(image).build();
        let mut s = e.docker.create_image(Some(opts), None, None);
        let res = tokio::time::timeout(e.timeout, async {
            while let Some(item) = s.next().await {
                item.map_err(|err| err.to_string())?;
            }
            Ok::<(), String>(())
        })
        .await;
        match res {
            Ok(Ok(())) => Ok(()),
            Ok(Err(msg)) => Err(LaunchError::ImageUnavailable {
                image: image.to_owned(),
                why: format!("{why}; pull failed: {msg}"),
            }),
            Err(_) => {
                Err(LaunchError::ImageUnavailable { image: image.to_owned(), why: format!("{why}; pull timed out") })
            }
        }
    };
    if shared.config.pull == PullPolicy::Always {
        pull("pull policy always".into()).await?;
    }
    let inspect = match e.call("inspect image", e.docker.inspect_image(image)).await {
        Ok(i) => i,
        Err(err) if err.is_not_found() => {
            if shared.config.pull == PullPolicy::Never {
                return Err(LaunchError::ImageUnavailable {
                    image: image.into(),
                    why: "not present and pull policy is never".into(),
                });
            }
            pull("not present".into()).await?;
            e.call("inspect image", e.docker.inspect_image(image))
                .await
                .map_err(|err| LaunchError::ImageUnavailable { image: image.into(), why: err.message() })?
        }
        Err(err) => return Err(engine_err("inspect image", err)),
    };
    let cfg = inspect.config.unwrap_or_default();
    Ok(ImageFacts {
        id: inspect.id.unwrap_or_default(),
        env: cfg.env.unwrap_or_default(),
        volumes: cfg.volumes.map(|v| v.into_iter().collect()).unwrap_or_default(),
        working_dir: cfg.working_dir.filter(|w| !w.is_empty()),
        labels: cfg.labels.unwrap_or_default(),
        entrypoint: cfg.entrypoint.unwrap_or_default().into_iter().filter(|a| !a.is_empty()).collect(),
    })
}

fn tmpfs_volume(name: &str, size: u64, uid: u32, gid: u32, labels: HashMap<String, String>) -> VolumeCreateRequest {
    VolumeCreateRequest {
        name: Some(name.to_owned()),
        driver: Some("local".into()),
        driver_opts: Some(HashMap::from([
            ("type".into(), "tmpfs".into()),
            ("device".into(), "tmpfs".into()),
            ("o".into(), format!("size={size},uid={uid},gid={gid},mode=0755")),
        ])),
        labels: Some(labels),
        ..Default::default()
    }
}

/// Uploads the caller's input dir into `volume` through a created, never-started helper
/// container (the attempt's own mount of it is read-only, which the archive API refuses).
async fn stage_inputs(
    shared: &Arc<Shared>,
    dir: &Path,
    volume: &str,
    image: &str,
    name: &str,
    labels: HashMap<String, String>,
    left: &mut Leftovers,
) -> Result<staging::StageReport, LaunchError> {
    let e = &shared.engine;
    let body = ContainerCreateBody {
        image: Some(image.to_owned()),
        entrypoint: Some(vec!["/.stevedore-stage-never-started".into()]),
        cmd: Some(vec![]),
        labels: Some(labels),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            mounts: Some(vec![spec::volume_mount(volume, IN_DIR, false)]),
            log_config: Some(bollard::models::HostConfigLogConfig { typ: Some("none".into()), config: None }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let opts = CreateContainerOptionsBuilder::default().name(name).build();
    left.containers.push(name.to_owned());
    let s = shared.clone();
    creating(shared, left, "create staging container", async move {
        s.engine.call("create staging container", s.engine.docker.create_container(Some(opts), body)).await
    })
    .await?;
    let (uid, gid) = shared.config.uid_gid();
    let (writer, body_stream) = pipe::writer(8);
    let src = dir.to_path_buf();
    let producer = tokio::task::spawn_blocking(move || staging::write_input_tar(&src, uid, gid, writer));
    let opts = UploadToContainerOptionsBuilder::default().path(IN_DIR).build();
    let upload =
        e.call("upload inputs", e.docker.upload_to_container(name, Some(opts), bollard::body_try_stream(body_stream)));
    let up = upload.await;
    let report =
        producer.await.map_err(|err| LaunchError::Staging { what: "input tar".into(), source: Box::new(err) })?;
    let report = report.map_err(|err| LaunchError::Staging {
        what: format!("reading input dir {}", dir.display()),
        source: Box::new(err),
    })?;
    up.map_err(|err| LaunchError::Staging { what: "uploading inputs".into(), source: Box::new(err) })?;
    // The helper stays in `left` and goes with the attempt's cleanup: removing it here would
    // put an engine call in front of every attempt with inputs.
    Ok(report)
}

/// Downloads `path` from the container as a tar and hands it to `consume` on a blocking thread.
async fn download<T: Send + 'static>(
    shared: &Shared,
    container: &str,
    path: &str,
    consume: impl FnOnce(pipe::ChannelReader) -> std::io::Result<T> + Send + 'static,
) -> Result<T, String> {
    let e = &shared.engine;
    let started = std::time::Instant::now();
    let opts = DownloadFromContainerOptionsBuilder::default().path(path).build();
    let mut stream = e.docker.download_from_container(container, Some(opts));
    let (tx, reader) = pipe::reader(8);
    let consumer = tokio::task::spawn_blocking(move || consume(reader));
    let feed = async {
        while let Some(item) = stream.next().await {
            let item = item.map_err(|err| std::io::Error::other(err.to_string()));
            let failed = item.is_err();
            if tx.send(item).await.is_err() || failed {
                break;
            }
        }
        drop(tx);
    };
    // A large /out may take long; bound it generously but never forever.
    if tokio::time::timeout(e.timeout * 20, feed).await.is_err() {
        return Err(format!("download of {path} timed out"));
    }
    let consumed = consumer.await.map_err(|err| err.to_string())?.map_err(|err| err.to_string());
    tracing::debug!(op = "download", path, ms = started.elapsed().as_secs_f64() * 1000.0, "engine call");
    consumed
}

/// The control area's records, read from a tar with caps.
#[derive(Debug, Default)]
struct Records {
    init: Option<Result<InitRecord, String>>,
    handler: Option<Result<HandlerRecord, String>>,
}

fn read_records(r: impl std::io::Read) -> std::io::Result<Records> {
    let mut records = Records::default();
    let mut ar = tar::Archive::new(std::io::Read::take(r, 4 << 20));
    for entry in ar.entries()? {
        let entry = entry?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let path = entry.path()?.into_owned();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name == RESULT_FILE {
            records.init = Some(protocol::parse_claim(entry).map_err(|e| e.to_string()));
        } else if name == HANDLER_FILE {
            records.handler = Some(protocol::parse_claim(entry).map_err(|e| e.to_string()));
        }
    }
    Ok(records)
}

/// What the drain task kept of the streams.
struct Drained {
    stdout: CappedLog,
    stderr: CappedLog,
    /// The panic message, if the live-output callback panicked.
    live_panicked: Option<String>,
}

/// Hands a chunk to the live-output callback. One that panics is switched off for the rest
/// of the attempt and named in the evidence: the caller's view of the output must not end the
/// drain, and with it the attempt's record and cleanup.
fn show_live(live: &mut Option<super::config::LiveOutput>, panicked: &mut Option<String>, s: Stream, bytes: &[u8]) {
    let Some(callback) = live else { return };
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(s, bytes))) {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|m| (*m).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-text panic payload".to_owned());
        *panicked = Some(msg);
        *live = None;
    }
}

/// Runs one attempt under the limits admission already worked out. `Err` only when the
/// container never started.
pub(crate) async fn run(
    shared: Arc<Shared>,
    req: &Request,
    applied: Applied,
    cancel: CancellationToken,
) -> Result<Outcome, LaunchError> {
    use tracing::Instrument;
    let span = tracing::info_span!(
        "attempt",
        job = %req.job_id,
        attempt = req.attempt,
        container = tracing::field::Empty,
        container_id = tracing::field::Empty
    );
    run_inner(shared, req, applied, cancel, span.clone()).instrument(span).await
}

async fn run_inner(
    shared: Arc<Shared>,
    req: &Request,
    applied: Applied,
    cancel: CancellationToken,
    span: tracing::Span,
) -> Result<Outcome, LaunchError> {
    req.validate()?;
    let cfg = &shared.config;
    let started_ms = crate::contract::unix_ms_now();
    let attempt_id = random_hex(6);
    let name = format!("sd-{}-{}", &req.worker_id[..req.worker_id.len().min(40)], attempt_id);
    span.record("container", name.as_str());

    let image_ref = if !req.policy.image.is_empty() {
        req.policy.image.clone()
    } else {
        cfg.worker_image
            .clone()
            .ok_or_else(|| LaunchError::NotAllowed("no image given and no worker image configured".into()))?
    };
    let image = resolve_image(&shared, &image_ref).await?;
    let argv: Vec<String> = match &req.task {
        Task::Command(argv) => image.entrypoint.iter().chain(argv).cloned().collect(),
        Task::Handler(_) => {
            let entry = image.labels.get(labels::ENTRY).ok_or_else(|| LaunchError::ImageUnavailable {
                image: image_ref.clone(),
                why: format!("not a stevedore worker image (no {} label)", labels::ENTRY),
            })?;
            let mut argv: Vec<String> = serde_json::from_str(entry).map_err(|e| LaunchError::ImageUnavailable {
                image: image_ref.clone(),
                why: format!("bad {} label: {e}", labels::ENTRY),
            })?;
            if let (Some(want), Some(have)) = (&req.fingerprint, image.labels.get(labels::FINGERPRINT))
                && want != have
            {
                return Err(LaunchError::FingerprintMismatch {
                    image: image_ref.clone(),
                    expected: want.clone(),
                    actual: have.clone(),
                });
            }
            argv.push(HANDLER_MARKER.to_owned());
            argv
        }
    };

    if !req.output_dir.exists() {
        std::fs::create_dir(&req.output_dir).map_err(|e| LaunchError::Staging {
            what: format!("creating output dir {}", req.output_dir.display()),
            source: Box::new(e),
        })?;
    }

    // Environment: image ENV < profile < request < protocol.
    let protocol_env = vec![
        (protocol::env::JOB_ID.to_owned(), req.job_id.clone()),
        (protocol::env::ATTEMPT.to_owned(), req.attempt.to_string()),
        (protocol::env::IN.to_owned(), IN_DIR.to_owned()),
        (protocol::env::OUT.to_owned(), OUT_DIR.to_owned()),
        (protocol::env::CONTROL.to_owned(), CONTROL_DIR.to_owned()),
    ];
    let mut image_env = envlayer::parse_pairs(&image.env);
    if !image_env.iter().any(|(k, _)| k == "PATH") {
        image_env.insert(0, ("PATH".into(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()));
    }
    let layered = envlayer::layer(&[
        ("image", image_env),
        ("profile", cfg.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        ("request", req.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        ("protocol", protocol_env),
    ]);

    shared.in_flight().insert(attempt_id.clone());
    let mut cleanup =
        Cleanup { shared: shared.clone(), attempt_id: attempt_id.clone(), left: Leftovers::default(), done: false };
    let owner = Owner { worker: &req.worker_id, incarnation: &shared.incarnation, executor: &cfg.name };
    let attempt_labels = AttemptLabels {
        owner,
        attempt_id: &attempt_id,
        job: Some((&req.job_id, req.attempt)),
        app: req.app_id.as_deref(),
        org: req.org_id.as_deref(),
        extra: &cfg.labels,
    };

    let launched = launch(
        &shared,
        req,
        &cancel,
        &name,
        &image_ref,
        &image,
        argv,
        &applied,
        &layered,
        &attempt_labels,
        &mut cleanup.left,
    )
    .await;
    let mut running = match launched {
        Ok(r) => r,
        Err(e) => {
            let removed = cleanup.run().await;
            if !removed.errors.is_empty() {
                tracing::warn!(errors = ?removed.errors, "cleanup after launch error left objects behind");
            }
            return Err(e);
        }
    };
    span.record("container_id", running.container_id.as_str());

    // Wait for the init's sentinel, the deadline, cancellation or the container's end.
    let deadline = req.deadline.map(tokio::time::Instant::from_std);
    let grace = req.policy.grace();
    let mut stop_by: Option<tokio::time::Instant> = None;
    let mut deadline_fired = false;
    let mut cancelled = false;
    let mut hard_killed = false;
    // `Some` when the init said it was done (with what followed its sentinel), `None` when
    // the container's streams ended without it.
    let sentinel = loop {
        tokio::select! {
            biased;
            r = &mut running.done_rx => break r.ok().flatten(),
            _ = async { tokio::time::sleep_until(deadline.expect("guarded")).await }, if deadline.is_some() && stop_by.is_none() => {
                deadline_fired = true;
                signal(&shared, &name, "SIGTERM").await;
                stop_by = Some(tokio::time::Instant::now() + grace + cfg.kill_margin);
            }
            _ = cancel.cancelled(), if stop_by.is_none() => {
                cancelled = true;
                signal(&shared, &name, "SIGTERM").await;
                stop_by = Some(tokio::time::Instant::now() + grace + cfg.kill_margin);
            }
            _ = async { tokio::time::sleep_until(stop_by.expect("guarded")).await }, if stop_by.is_some() && !hard_killed => {
                hard_killed = true;
                signal(&shared, &name, "SIGKILL").await;
            }
        }
    };
    let host_wall = running.started.elapsed();

    // Collect what the init recorded and what the attempt left in /out, while the
    // container (and so its tmpfs volumes) still exists.
    let mut records = Records::default();
    let mut extract: Option<Result<outputs::ExtractReport, String>> = None;
    let mut out_seen_empty = false;
    if let Some(trailer) = sentinel {
        records = match trailer {
            protocol::Trailer::Complete { init, handler } => Records {
                init: Some(protocol::parse_claim(&init[..]).map_err(|e| e.to_string())),
                handler: handler.map(|h| protocol::parse_claim(&h[..]).map_err(|e| e.to_string())),
            },
            _ => download(&shared, &name, CONTROL_DIR, read_records).await.unwrap_or_else(|e| Records {
                init: Some(Err(format!("control area unreadable: {e}"))),
                handler: None,
            }),
        };
        let dest = req.output_dir.clone();
        let max = applied.disk + (1 << 20);
        // An /out holding nothing but its root needs no archive call (~70 ms). A command that
        // lies about it only loses its own outputs.
        out_seen_empty = matches!(&records.init, Some(Ok(rec))
            if rec.out_space.as_ref().and_then(|s| s.inodes_used) == Some(1));
        extract = Some(if out_seen_empty {
            Ok(outputs::ExtractReport::default())
        } else {
            download(&shared, &name, OUT_DIR, move |r| outputs::extract_tar(r, "out", &dest, max)).await
        });
    }
    signal(&shared, &name, "SIGKILL").await;
    let _ = running.input.shutdown().await;
    let drained = match tokio::time::timeout(cfg.engine_timeout, &mut running.drain).await {
        Ok(Ok(d)) => Some(d),
        _ => {
            running.drain.abort();
            None
        }
    };
    let e = &shared.engine;
    let inspect = e.call("inspect container", e.docker.inspect_container(&name, None)).await;
    let state = inspect.as_ref().ok().and_then(|i| i.state.clone());
    let removal_seen =
        state.as_ref().is_some_and(|s| s.status == Some(bollard::models::ContainerStateStatusEnum::REMOVING));
    let removed = cleanup.run().await;
    // Gone, being removed, or removed under our own removal: someone else did it.
    let removed_externally = matches!(&inspect, Err(err) if err.is_not_found())
        || removal_seen
        || removed.by_others.iter().any(|c| c == &name);

    // Facts.
    let mut ev = Evidence {
        executor: cfg.name.clone(),
        level: Some(cfg.level()),
        worker: req.worker_id.clone(),
        incarnation: shared.incarnation.clone(),
        started_at_unix_ms: Some(started_ms),
        finished_at_unix_ms: Some(crate::contract::unix_ms_now()),
        container_id: Some(running.container_id.clone()),
        image: Some(image_ref.clone()),
        image_id: Some(image.id.clone()),
        engine_version: Some(e.facts.engine_version.clone()),
        api_version: Some(e.facts.api_version.clone()),
        runtime: Some(cfg.runtime.clone().unwrap_or_else(|| e.facts.default_runtime.clone())),
        enforcement: running.enforcement.clone(),
        skipped: running.skipped.clone(),
        limits_narrowed: applied.narrowed.clone(),
        env_overrides: layered.overrides.clone(),
        ports: running.ports.clone(),
        ..Evidence::default()
    };
    if let Some(d) = &drained {
        ev.logs.stdout = d.stdout.capture();
        ev.logs.stderr = d.stderr.capture();
        if let Some(msg) = &d.live_panicked {
            ev.notes.push(format!("the live_output callback panicked ({msg}); live output was switched off"));
        }
    }
    ev.engine_oom_killed = state.as_ref().and_then(|s| s.oom_killed);
    for err in removed.errors {
        ev.notes.push(format!("cleanup: {err}"));
    }
    if hard_killed {
        ev.notes.push("the init did not finish within the grace; the container was SIGKILLed".into());
    }

    let mut facts = Facts { expects_record: matches!(req.task, Task::Handler(_)), ..Facts::default() };
    let init = match records.init {
        Some(Ok(r)) => Some(r),
        Some(Err(why)) => {
            ev.refused_claims.push(format!("init record: {why}"));
            None
        }
        None => None,
    };
    let mut usage = Usage::default();
    let mut handler_error = String::new();
    let mut permanent = false;
    match &init {
        Some(rec) => {
            let stopped = rec.stopped_by.is_some();
            facts.deadline_fired = deadline_fired && stopped;
            // What happened first wins: a command that ended before the init was told to
            // stop it was neither timed out nor cancelled (`decide` orders the rest).
            facts.cancelled = cancelled && stopped;
            match &rec.wait {
                WaitStatus::Code(c) => facts.exit = Exit::Code(*c),
                WaitStatus::Signal(s) => facts.exit = Exit::Signal(*s),
                WaitStatus::SpawnFailed(why) => {
                    facts.launch_failed = Some(why.clone());
                    handler_error = why.clone();
                    permanent = true;
                }
            }
            if rec.stopped_by == Some(StoppedBy::DeadMan) {
                ev.notes.push("the init lost its lifeline (stdin) and stopped the command".into());
            }
            ev.stragglers_killed = rec.stragglers_killed > 0;
            if let Some(g) = &rec.oom_guard {
                ev.enforcement.insert("oom_guard".into(), g.clone());
            }
            apply_counters(rec, &applied, &e.facts, host_wall, &mut usage, &mut ev, &mut facts);
        }
        None => {
            facts.deadline_fired = deadline_fired;
            facts.cancelled = cancelled;
            facts.removed_externally = removed_externally;
            let code = state.as_ref().and_then(|s| s.exit_code);
            // stevedore's init never exits above 128 by itself: such a code is a signal from outside.
            facts.exit = match code {
                Some(c) if c > 128 => Exit::Signal((c - 128) as i32),
                _ => Exit::Unknown,
            };
            if ev.engine_oom_killed == Some(true) {
                oom_from_engine(&mut ev, &mut facts, &mut usage, "the init left no record");
            }
            usage.wall_time_ms = Some(host_wall.as_millis() as u64);
            usage.sources.insert("wall_time_ms".into(), "host_clock".into());
            for f in ["cpu_time_ms", "peak_memory_bytes"] {
                usage.sources.insert(f.into(), "unavailable: no record from the init".into());
            }
        }
    }
    if facts.expects_record {
        match records.handler {
            Some(Ok(h)) => {
                facts.has_record = true;
                permanent = h.permanent;
                let text: String = h.error.chars().take(protocol::MAX_ERROR_TEXT).collect();
                match h.result {
                    HandlerResult::Ok => {}
                    HandlerResult::Error => {
                        facts.handler_error = Some(text.clone());
                        handler_error = text;
                    }
                    HandlerResult::Panicked => {
                        facts.panicked = true;
                        handler_error = text;
                    }
                    HandlerResult::LaunchFailed => {
                        facts.launch_failed = Some(text.clone());
                        handler_error = text;
                        permanent = true;
                    }
                }
            }
            Some(Err(why)) => ev.refused_claims.push(format!("handler record: {why}")),
            None => {}
        }
    }
    // Disk: the init saw /out (nearly) full and the outputs fill the allowance.
    let extracted_bytes = match &extract {
        Some(Ok(r)) => {
            for s in &r.skipped {
                ev.refused_outputs.push(s.clone());
            }
            Some(r.bytes)
        }
        Some(Err(why)) => {
            ev.notes.push(format!("outputs could not be collected: {why}"));
            None
        }
        None => None,
    };
    if let (Some(rec), Some(bytes)) = (&init, extracted_bytes)
        && let Some(space) = &rec.out_space
        && space.free_bytes < (1 << 20).max(space.total_bytes / 100)
        && bytes + (2 << 20) >= applied.disk
    {
        facts.disk_full = true;
    }
    match extracted_bytes {
        Some(b) => {
            usage.disk_written_bytes = Some(b);
            let how = if out_seen_empty { "init" } else { "archive" };
            usage.sources.insert("disk_written_bytes".into(), how.into());
        }
        None => {
            usage.sources.insert("disk_written_bytes".into(), "unavailable: /out could not be collected".into());
        }
    }

    // Outputs: only for ok and handler_error, walked by stevedore itself.
    let pre = decide(&facts);
    let mut listed = Vec::new();
    if matches!(pre.status, Status::Ok | Status::HandlerError) && extract.as_ref().is_some_and(|r| r.is_ok()) {
        let dir = req.output_dir.clone();
        let caps = cfg.output_caps;
        match tokio::task::spawn_blocking(move || outputs::walk(&dir, &caps)).await {
            Ok(Ok(w)) => {
                facts.output_limit = w.limit_hit;
                ev.refused_outputs.extend(w.refused);
                listed = w.files;
            }
            Ok(Err(err)) => ev.notes.push(format!("walking outputs failed: {err}")),
            Err(err) => ev.notes.push(format!("walking outputs failed: {err}")),
        }
    }
    let verdict = decide(&facts);
    let mut outcome = Outcome::new(verdict.status);
    outcome.reason = verdict.reason.map(str::to_owned);
    outcome.exit_code = match facts.exit {
        Exit::Code(c) => Some(c),
        _ => None,
    };
    outcome.signal = match facts.exit {
        Exit::Signal(s) => Some(s),
        _ => None,
    };
    if handler_error.is_empty()
        && let Exit::Code(c) = facts.exit
        && c != 0
    {
        handler_error = format!("exited with code {c}");
    }
    if verdict.reason == Some(reason::OUTPUT_LIMIT) {
        handler_error = format!(
            "outputs exceed the caps ({} files, {} bytes)",
            cfg.output_caps.max_files, cfg.output_caps.max_total_bytes
        );
    }
    outcome.handler_error = handler_error;
    outcome.permanent = permanent;
    if matches!(verdict.status, Status::Ok | Status::HandlerError) {
        outcome.outputs = listed;
    }
    outcome.usage = usage;
    outcome.evidence = ev;
    tracing::info!(status = %outcome.status, reason = ?outcome.reason, "attempt finished");
    Ok(outcome)
}

/// Puts the init's counters into usage after bound checks; a figure that fails one is
/// refused and named.
fn apply_counters(
    rec: &InitRecord,
    applied: &Applied,
    engine: &super::engine::EngineFacts,
    host_wall: Duration,
    usage: &mut Usage,
    ev: &mut Evidence,
    facts: &mut Facts,
) {
    let wall_ms = if rec.wall_time_ms <= host_wall.as_millis() as u64 + 1000 {
        usage.sources.insert("wall_time_ms".into(), "init_clock".into());
        rec.wall_time_ms
    } else {
        ev.refused_claims.push(format!(
            "wall_time_ms {} exceeds the host's {} ms",
            rec.wall_time_ms,
            host_wall.as_millis()
        ));
        usage.sources.insert("wall_time_ms".into(), "host_clock".into());
        host_wall.as_millis() as u64
    };
    usage.wall_time_ms = Some(wall_ms);
    let cpus = applied
        .cpu_millis
        .map(|m| m as f64 / 1000.0)
        .unwrap_or(engine.ncpu.max(1) as f64)
        .min(engine.ncpu.max(1) as f64);
    let max_cpu_ms = (host_wall.as_millis() as f64 * cpus * 1.05) as u64 + 200;
    let c = &rec.cgroup;
    if let Some(v) = c.version {
        // The sources say `cgroup`; the note says which files, once.
        ev.notes.push(format!(
            "usage read by the init from cgroup v{v} just before the container ended: cpu of the whole \
             container, memory high-water mark (including tmpfs /out and /tmp pages), oom_kill count"
        ));
    }
    let rusage_cpu = (rec.rusage.user_us + rec.rusage.system_us) / 1000;
    match c.cpu_usage_ns.map(|ns| ns / 1_000_000) {
        Some(ms) if ms <= max_cpu_ms => {
            usage.cpu_time_ms = Some(ms);
            usage.sources.insert("cpu_time_ms".into(), "cgroup".into());
        }
        other => {
            if let Some(ms) = other {
                ev.refused_claims.push(format!("cpu_time_ms {ms} exceeds wall × cpus ({max_cpu_ms} ms)"));
            }
            if rusage_cpu <= max_cpu_ms {
                usage.cpu_time_ms = Some(rusage_cpu);
                usage.sources.insert("cpu_time_ms".into(), "rusage".into());
            } else {
                usage.sources.insert("cpu_time_ms".into(), "unavailable: claims failed bound checks".into());
            }
        }
    }
    let max_peak = applied.memory + (4 << 20);
    match c.memory_peak_bytes {
        Some(p) if p <= max_peak => {
            usage.peak_memory_bytes = Some(p);
            usage.sources.insert("peak_memory_bytes".into(), "cgroup".into());
        }
        other => {
            if let Some(p) = other {
                ev.refused_claims.push(format!("peak_memory_bytes {p} exceeds the limit {}", applied.memory));
            }
            let why = c.missing.get("memory_peak_bytes").cloned().unwrap_or_else(|| "refused".into());
            usage.sources.insert("peak_memory_bytes".into(), format!("unavailable: {why}"));
        }
    }
    match c.oom_kills {
        Some(n) if n < 1_000_000 => {
            ev.oom_kills = Some(n);
            facts.oom_kills = n;
            usage.sources.insert("oom_kills".into(), "cgroup".into());
            if n == 0 && ev.engine_oom_killed == Some(true) {
                ev.notes.push("the engine reports OOMKilled but the cgroup counted no OOM kill".into());
            }
        }
        _ => {
            let why = c.missing.get("oom_kills").cloned().unwrap_or_else(|| "refused".into());
            usage.sources.insert("oom_kills".into(), format!("unavailable: {why}"));
            if ev.engine_oom_killed == Some(true) {
                oom_from_engine(ev, facts, usage, &format!("no cgroup count ({why})"));
            }
        }
    }
}

/// Without the kernel's count, the engine's `State.OOMKilled` says at least one OOM kill.
fn oom_from_engine(ev: &mut Evidence, facts: &mut Facts, usage: &mut Usage, why: &str) {
    ev.oom_kills = Some(1);
    facts.oom_kills = 1;
    usage.sources.insert("oom_kills".into(), "engine".into());
    ev.notes.push(format!("oom_kills from the engine's State.OOMKilled: {why}"));
}

async fn signal(shared: &Shared, name: &str, sig: &str) {
    let e = &shared.engine;
    let opts = KillContainerOptionsBuilder::default().signal(sig).build();
    if let Err(err) = e.call("kill container", e.docker.kill_container(name, Some(opts))).await {
        tracing::debug!(container = name, signal = sig, error = %err.message(), "signal not delivered");
    }
}

/// A started container and the tasks around it.
struct Running {
    container_id: String,
    started: Instant,
    input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    /// `Some` once the init's sentinel (and what followed it) was seen, `None` when the
    /// streams ended without it.
    done_rx: tokio::sync::oneshot::Receiver<Option<protocol::Trailer>>,
    drain: tokio::task::JoinHandle<Drained>,
    enforcement: BTreeMap<String, String>,
    skipped: BTreeMap<String, String>,
    ports: BTreeMap<String, String>,
}

#[expect(clippy::too_many_arguments, reason = "one call site; the pieces are computed by the caller")]
async fn launch(
    shared: &Arc<Shared>,
    req: &Request,
    cancel: &CancellationToken,
    name: &str,
    image_ref: &str,
    image: &ImageFacts,
    argv: Vec<String>,
    applied: &Applied,
    layered: &envlayer::Layered,
    attempt_labels: &AttemptLabels<'_>,
    left: &mut Leftovers,
) -> Result<Running, LaunchError> {
    let cfg = &shared.config;
    let e = &shared.engine;
    let (uid, gid) = cfg.uid_gid();
    let volumes = Volumes {
        input: req.input_dir.as_ref().map(|_| format!("{name}-in")),
        output: format!("{name}-out"),
        control: format!("{name}-ctl"),
    };
    let out_req = tmpfs_volume(&volumes.output, applied.disk, uid, gid, attempt_labels.for_role("out"));
    let create_volume = |req: VolumeCreateRequest| {
        let s = shared.clone();
        async move { s.engine.call("create volume", s.engine.docker.create_volume(req)).await }
    };
    left.volumes.push(volumes.output.clone());
    creating(shared, left, "create volume", create_volume(out_req)).await?;
    let control_size = CONTROL_BYTES + req.payload.len() as u64;
    let ctl_req = tmpfs_volume(&volumes.control, control_size, uid, gid, attempt_labels.for_role("control"));
    left.volumes.push(volumes.control.clone());
    creating(shared, left, "create volume", create_volume(ctl_req)).await?;
    if let (Some(dir), Some(vol)) = (&req.input_dir, &volumes.input) {
        let in_req = VolumeCreateRequest {
            name: Some(vol.clone()),
            driver: Some("local".into()),
            labels: Some(attempt_labels.for_role("in")),
            ..Default::default()
        };
        left.volumes.push(vol.clone());
        creating(shared, left, "create volume", create_volume(in_req)).await?;
        let report =
            stage_inputs(shared, dir, vol, image_ref, &format!("{name}-stage"), attempt_labels.for_role("stage"), left)
                .await?;
        if !report.skipped.is_empty() {
            tracing::info!(skipped = ?report.skipped, "input entries that are not files, dirs or symlinks were not staged");
        }
    }
    if cancel.is_cancelled() {
        return Err(LaunchError::CancelledBeforeStart);
    }

    let spec::Spec { body, enforcement, skipped } = spec::build(&spec::SpecInput {
        config: cfg,
        image: image_ref,
        init_argv: &shared.init_argv,
        tools_host_dir: shared.tools_dir.display().to_string(),
        labels: attempt_labels.for_role("attempt"),
        volumes: &volumes,
        applied,
        image_volumes: &image.volumes,
        engine_seccomp: e.facts.security_options.iter().any(|o| o.contains("seccomp")),
    });
    let opts = CreateContainerOptionsBuilder::default().name(name).build();
    left.containers.push(name.to_owned());
    let s = shared.clone();
    let created = creating(shared, left, "create container", async move {
        s.engine.call("create container", s.engine.docker.create_container(Some(opts), body)).await
    })
    .await?;

    let opts =
        AttachContainerOptionsBuilder::default().stdin(true).stdout(true).stderr(true).stream(true).logs(false).build();
    let attached = e
        .call("attach container", e.docker.attach_container(name, Some(opts)))
        .await
        .map_err(|err| engine_err("attach container", err))?;

    let log_dir = cfg.log_dir.join(&req.worker_id);
    std::fs::create_dir_all(&log_dir).map_err(|err| LaunchError::Staging {
        what: format!("log dir {}", log_dir.display()),
        source: Box::new(err),
    })?;
    let stdout_log = CappedLog::create(&log_dir.join(format!("{name}.stdout")), cfg.log_cap_bytes)
        .map_err(|err| LaunchError::Staging { what: "stdout log".into(), source: Box::new(err) })?;
    let stderr_log = CappedLog::create(&log_dir.join(format!("{name}.stderr")), cfg.log_cap_bytes)
        .map_err(|err| LaunchError::Staging { what: "stderr log".into(), source: Box::new(err) })?;

    let nonce = random_hex(16);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let mut live = cfg.live_output.clone();
    let sentinel = protocol::done_sentinel(&nonce);
    let mut output = attached.output;
    let drain = tokio::spawn(async move {
        let mut d = Drained { stdout: stdout_log, stderr: stderr_log, live_panicked: None };
        let mut scanner = SentinelScanner::new(sentinel.as_bytes());
        let mut done_tx = Some(done_tx);
        while let Some(item) = output.next().await {
            let Ok(item) = item else { break };
            match item {
                bollard::container::LogOutput::StdOut { message }
                | bollard::container::LogOutput::Console { message } => {
                    d.stdout.write(&message);
                    show_live(&mut live, &mut d.live_panicked, Stream::Stdout, &message);
                }
                bollard::container::LogOutput::StdErr { message } => {
                    let (pass, found) = scanner.feed(&message);
                    d.stderr.write(&pass);
                    if !pass.is_empty() {
                        show_live(&mut live, &mut d.live_panicked, Stream::Stderr, &pass);
                    }
                    if found && done_tx.is_some() {
                        let trailer = protocol::decode_trailer(scanner.trailer());
                        if trailer != protocol::Trailer::Incomplete
                            && let Some(tx) = done_tx.take()
                        {
                            let _ = tx.send(Some(trailer));
                        }
                    }
                }
                bollard::container::LogOutput::StdIn { .. } => {}
            }
        }
        let rest = scanner.finish();
        d.stderr.write(&rest);
        if let Some(tx) = done_tx.take() {
            // A sentinel whose records were cut short still ends the attempt; the records
            // are then read from the control area.
            let trailer = scanner.found().then(|| protocol::Trailer::Invalid("cut short".into()));
            let _ = tx.send(trailer);
        }
        d
    });

    let started = Instant::now();
    if let Err(err) = e.call("start container", e.docker.start_container(name, None)).await {
        drain.abort();
        let msg = err.message();
        return Err(spec::port_taken(cfg, &msg, Box::new(err))
            .unwrap_or_else(|source| LaunchError::Engine { op: "start container", source }));
    }
    let handler_request = match &req.task {
        Task::Handler(h) => Some(HandlerRequest {
            handler: h.clone(),
            fingerprint: req.fingerprint.clone(),
            job_id: req.job_id.clone(),
            attempt: req.attempt,
            inputs: req.inputs.iter().map(|(k, v)| (k.clone(), format!("{IN_DIR}/{}", v.display()))).collect(),
            prior_outputs: req.prior_outputs.clone(),
            deadline_ms: req.deadline.map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64),
        }),
        Task::Command(_) => None,
    };
    let spec_init = InitSpec {
        argv,
        env: layered.env.clone(),
        cwd: image.working_dir.clone().unwrap_or_else(|| "/".into()),
        grace_ms: req.policy.grace().as_millis() as u64,
        handler_request,
        child_oom_score_adj: Some(500),
    };
    let frame = protocol::encode_stdin_frame(&nonce, &spec_init, &req.payload);
    let mut input = attached.input;
    if let Err(err) = async {
        input.write_all(&frame).await?;
        input.flush().await
    }
    .await
    {
        tracing::warn!(error = %err, "could not hand the spec to the init");
    }
    let mut ports = BTreeMap::new();
    if !cfg.ports.is_empty()
        && let Ok(i) = e.call("inspect container", e.docker.inspect_container(name, None)).await
        && let Some(map) = i.network_settings.and_then(|n| n.ports)
    {
        for (k, v) in map {
            if let Some(b) = v.and_then(|b| b.into_iter().next()) {
                ports.insert(k, format!("{}:{}", b.host_ip.unwrap_or_default(), b.host_port.unwrap_or_default()));
            }
        }
    }
    Ok(Running { container_id: created.id, started, input, done_rx, drain, enforcement, skipped, ports })
}
