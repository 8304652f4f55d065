//! Phase 2 of an attempt: the init in the engine, the inputs staged, the container created,
//! attached and started, the link's reader running and the Start frame sent. Every object
//! is recorded in the attempt's `Leftovers` before the call that creates it.

use super::cleanup::{Leftovers, created, creating, creating_later};
use super::executor::Shared;
use super::ledger::Ledger;
use super::prepare::Plan;
use super::spec::{self, volume_mount};
use super::tools::{self, ToolsVolume};
use crate::contract::{
    CHECKPOINT_VERSION, Checkpoint, HOOK_TIMEOUT, HookError, InputsStaged, LaunchError, LinkSecret, Request,
    StartedInfo, Target, Task,
};
use crate::engine::{ByteStream, Chunk};
use crate::link::reports::{self, ReportRoute};
use crate::link::session::{self, Inbound, OutputsSink, ReaderSetup, Sender};
use crate::link::supervise::{Ended, HardStop, Linked, Rules, supervise};
use crate::link::{CappedLog, LiveSink};
use bollard::models::{ContainerCreateBody, HostConfig, VolumeCreateRequest};
use futures_util::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stevedore_init::wire::{self, HandlerRequest, IN_DIR, KEY_LEN, OUT_DIR, Start};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A started container and the tasks around it.
#[derive(Debug)]
pub(crate) struct Running {
    pub ledger: Ledger,
    pub link: Linked,
    /// The task handing reports to the engine's hook.
    pub reports: Option<tokio::task::JoinHandle<reports::Delivered>>,
}

impl Running {
    /// Supervises the attempt to its end (`link::supervise`), SIGKILLing the container
    /// through the engine if its init does not finish in time.
    pub async fn supervise(&mut self, shared: &Shared, req: &Request, cancel: &CancellationToken) -> Ended {
        let cfg = &shared.config;
        let rules = Rules {
            kill_margin: cfg.kill_margin,
            call_timeout: shared.engine.timeout(),
            collection: cfg.collection,
            max_output_bytes: cfg.output_caps.max_total_bytes,
        };
        let stop = EngineKill { shared, id: &self.ledger.container_id };
        supervise(&mut self.link, req, rules, cancel, &stop).await
    }
}

/// SIGKILLs a container through the engine.
struct EngineKill<'a> {
    shared: &'a Shared,
    id: &'a str,
}

impl HardStop for EngineKill<'_> {
    fn hard_stop(&self) -> crate::util::BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Err(e) = self.shared.engine.api.kill(self.id, "SIGKILL").await {
                tracing::debug!(error = %e, "SIGKILL not delivered");
            }
        })
    }
}

/// Bytes per second an upload is allowed to be as slow as before it times out.
const SLOWEST_UPLOAD: u64 = 8 << 20;

/// A container ready for its attempt: created and attached (cold), or parked and claimed
/// (warm: already started, its init waiting for the Start frame).
pub(crate) struct Provisioned {
    pub container_id: String,
    pub attached: crate::engine::Attached,
    pub running: bool,
    pub enforcement: BTreeMap<String, String>,
    pub skipped: BTreeMap<String, String>,
    pub tools: ToolsVolume,
    pub inputs: Option<InputsStaged>,
    pub caches: Vec<(String, String, String)>,
    /// `Some(true)`: from the warm pool; `Some(false)`: the pool could not serve it.
    pub warm: Option<bool>,
}

pub(crate) async fn launch(
    shared: &Arc<Shared>,
    req: &Request,
    plan: &mut Plan,
    left: &mut Leftovers,
    cancel: &CancellationToken,
    warm: super::pool::Claim,
) -> Result<Running, LaunchError> {
    let prov = match warm {
        super::pool::Claim::Hit(parked) => super::pool::ready(shared, plan, left, *parked).await?,
        other => {
            let mut p = provision(shared, req, plan, left, cancel).await?;
            if let super::pool::Claim::Miss(why) = other {
                p.warm = Some(false);
                p.skipped.insert("warm_pool".into(), why);
            }
            p
        }
    };
    begin(shared, req, plan, left, prov).await
}

/// The cold path: the init, the inputs, the caches, the container created and attached.
async fn provision(
    shared: &Arc<Shared>,
    req: &Request,
    plan: &mut Plan,
    left: &mut Leftovers,
    cancel: &CancellationToken,
) -> Result<Provisioned, LaunchError> {
    let cfg = &shared.config;
    let tools = tools_volume(shared, &plan.image_ref).await?;
    let caches = super::caches::ensure(shared, req, &plan.image_ref).await?;
    // With inputs, the container is created while they upload: it only needs their volume
    // to exist, and the upload goes through the helper, never the container.
    let staging = match plan.inputs.take() {
        Some((dir, staged)) => {
            let volume = format!("{}-in", plan.name);
            let helper = prepare_staging(shared, plan, &volume, left).await?;
            Some((volume, helper, dir, staged))
        }
        None => None,
    };
    if cancel.is_cancelled() {
        return Err(LaunchError::CancelledBeforeStart);
    }
    let facts = shared.engine.facts();
    let spec::Spec { body, enforcement, skipped } = spec::build(&spec::SpecInput {
        config: cfg,
        image: &plan.image_ref,
        tools: &tools,
        labels: plan.labels.clone(),
        input_volume: staging.as_ref().map(|(v, ..)| v.as_str()),
        applied: &plan.applied,
        image_volumes: &plan.image.volumes,
        engine_seccomp: facts.seccomp(),
        podman: facts.is_podman(),
        publish_ip: if shared.engine.endpoint().is_local() { "127.0.0.1" } else { "0.0.0.0" },
        caches: &caches,
    });
    left.containers.push(plan.name.clone());
    let s = shared.clone();
    let name = plan.name.clone();
    let container = creating_later(shared, left, async move { s.engine.api.create_container(&name, body).await });
    let mut inputs = None;
    if let Some((_, helper, dir, staged)) = staging {
        let report = upload_inputs(shared, &helper, dir, staged.bytes).await;
        // The create runs on; its result is awaited even when the upload failed.
        let created_id = created(container).await;
        let report = report?;
        inputs = Some(InputsStaged { skipped: report.skipped, sparse: report.sparse, ..staged });
        let container_id = created_id?;
        let attached = shared.engine.api.attach(&plan.name).await?;
        return Ok(Provisioned {
            container_id,
            attached,
            running: false,
            enforcement,
            skipped,
            tools,
            inputs,
            caches,
            warm: None,
        });
    }
    let container_id = created(container).await?;
    let attached = shared.engine.api.attach(&plan.name).await?;
    Ok(Provisioned { container_id, attached, running: false, enforcement, skipped, tools, inputs, caches, warm: None })
}

/// The attempt on its container: captures, the link's reader, the start (cold), the
/// checkpoint hook, the Start frame.
async fn begin(
    shared: &Arc<Shared>,
    req: &Request,
    plan: &mut Plan,
    left: &mut Leftovers,
    prov: Provisioned,
) -> Result<Running, LaunchError> {
    let cfg = &shared.config;
    let Provisioned { container_id, attached, running, enforcement, skipped, tools, inputs, caches, warm } = prov;
    let logs = shared
        .log_base()
        .and_then(|base| base.subdir(&req.worker_id))
        .map_err(|e| LaunchError::Staging { what: "the capture dir".into(), source: Box::new(e) })?;
    let capture_names = [format!("{}.stdout", plan.name), format!("{}.stderr", plan.name)];
    let capture = |name: &str| {
        CappedLog::create(&logs, name, cfg.log_cap_bytes)
            .map_err(|e| LaunchError::Staging { what: format!("the capture {name}"), source: Box::new(e) })
    };
    let key: [u8; KEY_LEN] = rand::random();
    let link_id: String = rand::random::<[u8; 16]>().iter().map(|b| format!("{b:02x}")).collect();
    let (report_tx, report_task) = match &req.hooks {
        Some(h) => {
            let (tx, task) = reports::forward(h.clone(), req.attempt_ref());
            (Some(tx), Some(task))
        }
        None => (None, None),
    };
    let started_tx = report_tx.clone();
    let setup = ReaderSetup {
        key,
        stdout: capture(&capture_names[0])?,
        stderr: capture(&capture_names[1])?,
        live: LiveSink::new(req.live.clone()),
        outputs: OutputsSink {
            dest: plan
                .output_dir
                .try_clone()
                .map_err(|e| LaunchError::Staging { what: "the output dir".into(), source: Box::new(e) })?,
            caps: cfg.output_caps,
        },
        reports: ReportRoute::new(scope(req), report_tx),
        stop: Default::default(),
    };
    let (events_tx, events) = mpsc::unbounded_channel();
    let inbound = attached.output.map(|c| {
        c.map(|c| match c {
            Chunk::Stdout(b) => Inbound::Link(b),
            Chunk::Stderr(b) => Inbound::InitStderr(b),
        })
    });
    let stop = setup.stop.clone();
    let reader = session::ReaderTask::spawn(&shared.tracker, session::read(inbound, setup, events_tx));
    let sender = Sender::new(attached.input);

    let started = Instant::now();
    if !running && let Err(err) = shared.engine.api.start(&plan.name).await {
        reader.abort();
        shared.tools_suspect().await;
        return Err(spec::port_taken(cfg, err));
    }
    let mut ports = BTreeMap::new();
    if !cfg.ports.is_empty()
        && let Ok(state) = shared.engine.api.inspect_container(&plan.name).await
    {
        // On a remote engine the port is on the engine host, reached by its address.
        let remote_host =
            (!shared.engine.endpoint().is_local()).then(|| shared.engine.endpoint().host.clone()).flatten();
        for (container_port, bound) in state.ports {
            let shown = match (&remote_host, bound.rsplit_once(':')) {
                (Some(host), Some((_, port))) => format!("{host}:{port}"),
                _ => bound,
            };
            ports.insert(container_port, shown);
        }
    }
    let ledger = Ledger {
        attempt_id: plan.attempt_id.clone(),
        name: plan.name.clone(),
        container_id,
        image_ref: plan.image_ref.clone(),
        image_id: plan.image.id.clone(),
        memory: plan.applied.memory,
        cpu_millis: plan.applied.cpu_millis,
        disk: plan.applied.disk,
        narrowed: plan.applied.narrowed.clone(),
        env_overrides: plan.env.overrides.clone(),
        enforcement,
        skipped,
        ports,
        tools_volume: tools.volume.clone(),
        tools_digest: tools.digest.clone(),
        inputs,
        containers: left.containers.clone(),
        volumes: left.volumes.clone(),
        expects_handler: matches!(req.task, Task::Handler(_)),
        started_ms: plan.started_ms,
        captures: Some(capture_names),
        caches: caches.clone(),
        warm,
        max_files: cfg.output_caps.max_files as u64,
        max_total_bytes: cfg.output_caps.max_total_bytes,
    };
    // The container runs, its init waits for the start: the command has not started yet.
    if let Some(hooks) = &req.hooks {
        let cp = checkpoint(shared, req, &ledger, &key, &link_id, started);
        let answer = tokio::time::timeout(HOOK_TIMEOUT, hooks.0.checkpoint(&cp)).await;
        let failed = match answer {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(HookError::new(format!("no answer within {}s", HOOK_TIMEOUT.as_secs()))),
        };
        if let Some(e) = failed {
            reader.abort();
            return Err(LaunchError::Hook(e));
        }
    }
    if let Some(tx) = &started_tx {
        let info =
            StartedInfo { container_id: Some(ledger.container_id.clone()), pid: None, ports: ledger.ports.clone() };
        let _ = tx.try_send(reports::Delivery::Started(info));
    }
    let start = start_frame(req, plan, &key, &link_id, cfg, &ledger.caches, started);
    if let Err(e) = sender.raw(&wire::encode_start(&start, &req.payload)).await {
        // The init then sees no start and exits; the attempt ends as "no record".
        tracing::warn!(error = %e, "could not send the start to the init");
    }
    let heartbeat = cfg.host_loss.heartbeat_timeout.map(|_| sender.heartbeats(cfg.host_loss.heartbeat_every));
    let link = Linked { started, sender, stop, events, reader, heartbeat };
    Ok(Running { ledger, link, reports: report_task })
}

/// The attempt a link belongs to.
pub(crate) fn scope(req: &Request) -> wire::Scope {
    wire::Scope { job_id: req.job_id.clone(), attempt: req.attempt }
}

/// The checkpoint of a launched attempt.
fn checkpoint(
    shared: &Shared,
    req: &Request,
    ledger: &Ledger,
    key: &[u8; KEY_LEN],
    link_id: &str,
    started: Instant,
) -> Checkpoint {
    let now_ms = crate::contract::unix_ms_now();
    Checkpoint {
        version: CHECKPOINT_VERSION,
        job_id: req.job_id.clone(),
        attempt: req.attempt,
        worker: req.worker_id.clone(),
        rung: shared.config.name.clone(),
        level: shared.config.level(),
        incarnation: shared.incarnation.clone(),
        started_at_unix_ms: ledger.started_ms,
        deadline_at_unix_ms: req
            .deadline_from(started)
            .map(|d| now_ms.saturating_add(d.saturating_duration_since(Instant::now()).as_millis() as u64)),
        grace_ms: req.policy.grace().as_millis() as u64,
        output_dir: std::path::absolute(&req.output_dir).unwrap_or_else(|_| req.output_dir.clone()),
        target: Target::Container { id: ledger.container_id.clone(), name: ledger.name.clone() },
        link: LinkSecret { id: link_id.to_owned(), key: key.iter().map(|b| format!("{b:02x}")).collect() },
        state: serde_json::to_value(ledger).expect("a ledger always serialises"),
    }
}

fn start_frame(
    req: &Request,
    plan: &Plan,
    key: &[u8; KEY_LEN],
    link_id: &str,
    cfg: &super::ContainerConfig,
    caches: &[(String, String, String)],
    started: Instant,
) -> Start {
    let handler = match &req.task {
        Task::Handler(h) => Some(HandlerRequest {
            handler: h.clone(),
            fingerprint: req.fingerprint.clone(),
            job_id: req.job_id.clone(),
            attempt: req.attempt,
            inputs: req.inputs.iter().map(|(k, v)| (k.clone(), format!("{IN_DIR}/{}", v.display()))).collect(),
            prior_outputs: req.prior_outputs.iter().map(Into::into).collect(),
            deadline_ms: req
                .deadline_from(started)
                .map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64),
        }),
        Task::Command(_) => None,
    };
    Start {
        protocol: wire::PROTOCOL,
        key: key.iter().map(|b| format!("{b:02x}")).collect(),
        argv: plan.argv.clone(),
        env: plan.env.env.clone(),
        cwd: plan.cwd.clone(),
        grace_ms: req.policy.grace().as_millis() as u64,
        child_oom_score_adj: Some(500),
        handler,
        handshake_ms: cfg.handshake_timeout.as_millis() as u64,
        heartbeat_timeout_ms: cfg.host_loss.heartbeat_timeout.map_or(0, |t| t.as_millis() as u64),
        host_loss_grace_ms: cfg.host_loss.grace.as_millis() as u64,
        outputs: cfg.collection.spec(OUT_DIR.to_owned(), cfg.output_caps),
        scope: scope(req),
        link_id: Some(link_id.to_owned()),
        // The host's relay runs as root (`recover`), a uid the command never has.
        takeover_uid: (cfg.uid_gid().0 != 0).then_some(0),
        takeover_fd: None,
        rlimits: Vec::new(),
        cgroup_dir: Some(stevedore_init::cgroup::CGROUP_ROOT.to_owned()),
        measure: caches.iter().map(|(_, _, path)| path.clone()).collect(),
        mounts: plan.mounts.clone(),
    }
}

/// After this long, the rung checks that its tools volume is still its own before it mounts
/// it again (another process's `reclaim --tools` may have taken it for a crash's leftover);
/// after a failed launch it checks at once. An engine that ignores `NoCopy` would fill a
/// volume made again on mount from the image, whose files would then run as PID 1: there
/// the rung checks before every mount, which leaves only the moment between the check and
/// the create.
const TOOLS_RECHECK_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// This rung's init in the engine: its own tools volume, made on first use and made anew
/// when it is no longer its own.
pub(crate) async fn tools_volume(shared: &Arc<Shared>, image: &str) -> Result<ToolsVolume, LaunchError> {
    if let Some(t) = trusted(&*shared.tools.lock().await, &shared.engine) {
        return Ok(t);
    }
    // On the rung's tracked tasks, so an attempt dropped meanwhile (a caller's timeout)
    // leaves the volume made and recorded for `close`, never half made and unknown.
    let s = shared.clone();
    let image = image.to_owned();
    shared
        .tracker
        .spawn(async move {
            let mut slot = s.tools.lock().await;
            // Another attempt may have checked or made it while this one waited for the lock.
            if let Some(t) = trusted(&slot, &s.engine) {
                return Ok(t);
            }
            let now = std::time::Instant::now();
            if let Some((t, checked)) = &mut slot.current {
                if tools::is_ours(&s.engine, &t.volume, &s.incarnation).await? {
                    *checked = Some(now);
                    return Ok(t.clone());
                }
                // Gone, or made again empty by a mount: its name stays in `made` for `close`.
                tracing::warn!(volume = %t.volume, "the rung's tools volume was taken; making a new one");
                let _ = s.engine.api.remove_volume(&t.volume).await;
                slot.current = None;
            }
            let t = tools::create(&s.engine, &image, &s.incarnation).await?;
            slot.made.push(t.volume.clone());
            slot.current = Some((t.clone(), Some(now)));
            Ok::<_, LaunchError>(t)
        })
        .await
        .map_err(|e| LaunchError::Staging { what: "the init's tools volume".into(), source: Box::new(e) })?
}

/// The rung's tools volume when it was known to be its own less than [`TOOLS_RECHECK_AFTER`]
/// ago and the engine honours `NoCopy`: mounted without a check.
fn trusted(slot: &tools::Slot, engine: &crate::engine::Engine) -> Option<ToolsVolume> {
    let (t, checked) = slot.current.as_ref()?;
    let fresh = checked.is_some_and(|c| c.elapsed() < TOOLS_RECHECK_AFTER);
    (fresh && engine.facts().honours_nocopy()).then(|| t.clone())
}

/// Uploads the caller's input dir into `volume` through a created, never-started helper
/// container (the attempt's own mount of it is read-only, which the archive API refuses).
/// The input volume and the never-started helper that uploads into it (the attempt's own
/// mount of it is read-only, which the archive API refuses); returns the helper's name.
async fn prepare_staging(
    shared: &Arc<Shared>,
    plan: &Plan,
    volume: &str,
    left: &mut Leftovers,
) -> Result<String, LaunchError> {
    let req = VolumeCreateRequest {
        name: Some(volume.to_owned()),
        driver: Some("local".into()),
        labels: Some(plan.input_labels.clone()),
        ..Default::default()
    };
    left.volumes.push(volume.to_owned());
    let s = shared.clone();
    creating(shared, left, async move { s.engine.api.create_volume(req).await }).await?;
    let helper = format!("{}-stage", plan.name);
    let body = helper_body(&plan.image_ref, volume, plan.stage_labels.clone());
    // The helper stays in `left` and goes with the attempt's cleanup: removing it here would
    // put an engine call in front of every attempt with inputs.
    left.containers.push(helper.clone());
    let s = shared.clone();
    let h = helper.clone();
    creating(shared, left, async move { s.engine.api.create_container(&h, body).await }).await?;
    Ok(helper)
}

/// A never-started container that mounts `volume` read-write at `/in`: the archive API
/// refuses the attempt's own read-only mount, so inputs go in through it.
pub(crate) fn helper_body(image: &str, volume: &str, labels: HashMap<String, String>) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(image.to_owned()),
        entrypoint: Some(vec!["/.stevedore-helper-never-started".into()]),
        cmd: Some(vec![]),
        labels: Some(labels),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            mounts: Some(vec![volume_mount(volume, IN_DIR, false)]),
            log_config: Some(bollard::models::HostConfigLogConfig { typ: Some("none".into()), config: None }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Streams the input dir, as a tar written by descriptor, into `/in` of `helper`.
pub(crate) async fn upload_inputs(
    shared: &Arc<Shared>,
    helper: &str,
    dir: crate::inputs::InputDir,
    bytes: u64,
) -> Result<crate::inputs::StageReport, LaunchError> {
    let (uid, gid) = shared.config.uid_gid();
    let limit = shared.config.max_input_bytes;
    let (writer, chunks) = super::pipe::writer(8);
    let producer = tokio::task::spawn_blocking(move || dir.write_tar(uid, gid, limit, writer, &|_| {}));
    let body: ByteStream = Box::pin(chunks);
    let timeout = shared.engine.timeout() + Duration::from_secs(bytes / SLOWEST_UPLOAD);
    let up = shared.engine.api.upload(helper, IN_DIR, body, timeout).await;
    let report = producer
        .await
        .map_err(|e| LaunchError::Staging { what: "the input tar".into(), source: Box::new(e) })?
        .map_err(|e| match e {
            crate::inputs::StageError::TooLarge { limit } => LaunchError::InputTooLarge { bytes: limit + 1, limit },
            e => LaunchError::Staging { what: "reading the input dir".into(), source: Box::new(e) },
        })?;
    up.map_err(|e| LaunchError::Staging { what: "uploading the inputs".into(), source: Box::new(e) })?;
    Ok(report)
}
