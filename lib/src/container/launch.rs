//! Phase 2 of an attempt: the init in the engine, the inputs staged, the container created
//! and attached (cold), or a parked one claimed (warm). Every object is recorded in the
//! attempt's `Leftovers` before the call that creates it. The rest is `attempt`'s.

use super::cleanup::{Leftovers, created, creating, creating_later};
use super::prepare::Plan;
use super::site::ContainerSite;
use super::site::{Slot, ToolsVolume};
use super::spec;
use super::tools;
use crate::contract::{InputsStaged, LaunchError, Request};
use crate::engine::{Attached, ByteStream, Chunk};
use crate::link::session::{Inbound, Sender, Transport};
use bollard::models::VolumeCreateRequest;
use futures_util::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use stevedore_init::wire::IN_DIR;
use tokio_util::sync::CancellationToken;

/// Bytes per second an upload is allowed to be as slow as before it times out.
const SLOWEST_UPLOAD: u64 = 8 << 20;

/// A container ready for its attempt: created and attached (cold), or parked and claimed
/// (warm: already started, its init waiting for the Start frame).
pub(crate) struct Ready {
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
    /// When (unix ms) the inputs were in their volume.
    pub staged_at: Option<u64>,
}

/// The cold path: the init, the inputs, the caches, the container created and attached.
pub(crate) async fn provision(
    shared: &Arc<ContainerSite>,
    req: &Request,
    plan: &mut Plan,
    left: &mut Leftovers,
    cancel: &CancellationToken,
) -> Result<Ready, LaunchError> {
    let mut tools = tools_volume(shared, &plan.image_ref).await?;
    let caches = super::caches::ensure(shared, req, &plan.image_ref, &tools).await?;
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
    let input_volume = staging.as_ref().map(|(v, ..)| v.clone());
    let spec_of = |tools: &ToolsVolume| {
        let facts = shared.engine.facts();
        spec::build(&spec::SpecInput {
            config: &shared.config,
            image: &plan.image_ref,
            tools,
            labels: plan.labels.clone(),
            input_volume: input_volume.as_deref(),
            stage: false,
            applied: &plan.applied,
            image_volumes: &plan.image.volumes,
            engine_seccomp: facts.seccomp(),
            podman: facts.is_podman(),
            publish_ip: if shared.engine.endpoint().is_local() { "127.0.0.1" } else { "0.0.0.0" },
            caches: &caches,
        })
    };
    let spec::Spec { body, mut enforcement, mut skipped } = spec_of(&tools);
    left.container(plan.name.clone());
    let s = shared.clone();
    let name = plan.name.clone();
    let container = creating_later(shared, left, async move { s.engine.api.create_container(&name, body).await });
    let mut inputs = None;
    let (container_id, staged_at) = match staging {
        Some((_, helper, dir, staged)) => {
            let report =
                upload_inputs(shared, UploadTo::helper(shared, &helper), dir, staged.bytes, plan.progress.clone())
                    .await;
            // The create runs on; its result is awaited even when the upload failed.
            let created_id = created(container).await;
            let report = report?;
            inputs = Some(InputsStaged {
                skipped: report.skipped,
                sparse: report.sparse,
                tree: Some(report.tree),
                ..staged
            });
            (created_id, Some(crate::contract::unix_ms_now()))
        }
        None => (created(container).await, None),
    };
    let container_id = match container_id {
        Err(e) if host_tools_refused(shared, &tools, &e) => {
            tools = tools_volume(shared, &plan.image_ref).await?;
            let again = spec_of(&tools);
            (enforcement, skipped) = (again.enforcement, again.skipped);
            let s = shared.clone();
            let name = plan.name.clone();
            creating(shared, left, async move { s.engine.api.create_container(&name, again.body).await }).await?
        }
        other => other?,
    };
    let attached = shared.engine.api.attach(&plan.name).await?;
    Ok(Ready {
        container_id,
        attached,
        running: false,
        enforcement,
        skipped,
        tools,
        inputs,
        caches,
        warm: None,
        staged_at,
    })
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
pub(crate) async fn tools_volume(shared: &Arc<ContainerSite>, image: &str) -> Result<ToolsVolume, LaunchError> {
    if let Some(t) = host_tools(shared).await {
        return Ok(t);
    }
    if let Some(t) = trusted(&*shared.tools.lock().await, &shared.engine) {
        return Ok(t);
    }
    // On the rung's tracked tasks, so an attempt dropped meanwhile (a caller's timeout)
    // leaves the volume made and recorded for `close`, never half made and unknown.
    let s = shared.clone();
    let image = image.to_owned();
    shared
        .base
        .tracker
        .spawn(async move {
            let mut slot = s.tools.lock().await;
            // Another attempt may have checked or made it while this one waited for the lock.
            if let Some(t) = trusted(&slot, &s.engine) {
                return Ok(t);
            }
            let now = std::time::Instant::now();
            if let Some((t, checked)) = &mut slot.current {
                if tools::is_ours(&s.engine, &t.volume, &s.base.incarnation).await? {
                    *checked = Some(now);
                    return Ok(t.clone());
                }
                // Gone, or made again empty by a mount: its name stays in `made` for `close`.
                tracing::warn!(volume = %t.volume, "the rung's tools volume was taken; making a new one");
                let _ = s.engine.api.remove_volume(&t.volume).await;
                slot.current = None;
            }
            let t = tools::create(&s.engine, &image, &s.base.incarnation).await?;
            slot.made.push(t.volume.clone());
            slot.current = Some((t.clone(), Some(now)));
            Ok::<_, LaunchError>(t)
        })
        .await
        .map_err(|e| LaunchError::Staging { what: "the init's tools volume".into(), source: Box::new(e) })?
}

/// The init from a host directory, when the engine can bind one (`tools::host_copy`);
/// looked at once per rung.
async fn host_tools(shared: &ContainerSite) -> Option<ToolsVolume> {
    use super::site::HostTools;
    let state = |s: &ContainerSite| match &*s.host_tools.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
        HostTools::Untried => None,
        HostTools::Ready(t) => Some(Some(t.clone())),
        HostTools::Unusable(_) => Some(None),
    };
    if !shared.config.init_from_host {
        return None;
    }
    match state(shared) {
        // Checked again before every container that binds it: a directory on the way may
        // have changed hands since (a few `openat`s and `fstat`s).
        Some(Some(t)) => {
            let bind = t.bind.as_deref().unwrap_or_default();
            return match super::tools::checked_bind(std::path::Path::new(bind)) {
                Ok(real) if real.as_os_str() == bind => Some(t),
                checked => {
                    let why = checked.map_or_else(
                        |e| crate::util::error_chain(&e),
                        |real| format!("{bind} now resolves to {}", real.display()),
                    );
                    tracing::warn!(error = %why, "the init's host directory changed: a tools volume instead");
                    *shared.host_tools.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                        HostTools::Unusable(Some(why));
                    None
                }
            };
        }
        Some(None) => return None,
        None => {}
    }
    let engine = shared.engine.clone();
    let found = tokio::task::spawn_blocking(move || super::tools::host_copy(&engine)).await.unwrap_or(Err(None));
    let mut slot = shared.host_tools.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if matches!(*slot, HostTools::Untried) {
        *slot = found.map_or_else(HostTools::Unusable, HostTools::Ready);
    }
    match &*slot {
        HostTools::Ready(t) => Some(t.clone()),
        _ => None,
    }
}

/// Why the init does not come from its host directory, when that was for want of trust in
/// it (the evidence names it beside the volume used instead).
pub(crate) fn host_tools_refusal(shared: &ContainerSite) -> Option<String> {
    match &*shared.host_tools.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
        super::site::HostTools::Unusable(why) => why.clone(),
        _ => None,
    }
}

/// After the engine refused `tools`' host directory: volumes from now on. Whether it was that.
pub(crate) fn host_tools_refused(shared: &ContainerSite, tools: &ToolsVolume, err: &LaunchError) -> bool {
    if !super::tools::bind_refused(tools, err) {
        return false;
    }
    tracing::info!("the engine cannot bind the init's host directory (not on this machine's filesystem): volumes");
    *shared.host_tools.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
        super::site::HostTools::Unusable(None);
    true
}

/// The rung's tools volume when it was known to be its own less than [`TOOLS_RECHECK_AFTER`]
/// ago and the engine honours `NoCopy`: mounted without a check.
fn trusted(slot: &Slot, engine: &crate::engine::Engine) -> Option<ToolsVolume> {
    let (t, checked) = slot.current.as_ref()?;
    let fresh = checked.is_some_and(|c| c.elapsed() < TOOLS_RECHECK_AFTER);
    (fresh && engine.facts().honours_nocopy()).then(|| t.clone())
}

/// Uploads the caller's input dir into `volume` through a created, never-started helper
/// container (the attempt's own mount of it is read-only, which the archive API refuses).
/// The input volume and the never-started helper that uploads into it (the attempt's own
/// mount of it is read-only, which the archive API refuses); returns the helper's name.
async fn prepare_staging(
    shared: &Arc<ContainerSite>,
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
    left.volume(volume.to_owned());
    let s = shared.clone();
    creating(shared, left, async move { s.engine.api.create_volume(req).await }).await?;
    let helper = format!("{}-stage", plan.name);
    let body = spec::staging_helper(&plan.image_ref, volume, plan.stage_labels.clone());
    // The helper stays in `left` and goes with the attempt's cleanup: removing it here would
    // put an engine call in front of every attempt with inputs.
    left.container(helper.clone());
    let s = shared.clone();
    let h = helper.clone();
    creating(shared, left, async move { s.engine.api.create_container(&h, body).await }).await?;
    Ok(helper)
}

/// Where the inputs' tar goes: a container, the path in it, and whose the entries are.
pub(crate) struct UploadTo<'a> {
    pub container: &'a str,
    pub path: &'a str,
    pub owners: crate::inputs::Owners,
}

impl<'a> UploadTo<'a> {
    /// `/in` of a never-started helper whose mount of the input volume is writable, the
    /// entries the sandbox user's (the attempt's own mount of it is read-only, which the
    /// archive API refuses).
    pub fn helper(shared: &ContainerSite, helper: &'a str) -> Self {
        let (uid, gid) = shared.config.uid_gid();
        Self { container: helper, path: IN_DIR, owners: crate::inputs::Owners::User(uid, gid) }
    }
}

/// Streams the input dir, as a tar written by descriptor, to where `to` says.
pub(crate) async fn upload_inputs(
    shared: &Arc<ContainerSite>,
    to: UploadTo<'_>,
    dir: crate::inputs::InputDir,
    bytes: u64,
    progress: Option<crate::contract::ProgressSink>,
) -> Result<crate::inputs::StageReport, LaunchError> {
    let (producer, chunks) =
        crate::inputs::tar_stream(dir, to.owners, shared.config.max_input_bytes, bytes, progress.clone());
    let body: ByteStream = Box::pin(chunks);
    let timeout = shared.engine.timeout() + Duration::from_secs(bytes / SLOWEST_UPLOAD);
    let up = shared.engine.api.upload(to.container, to.path, body, timeout).await;
    let report = crate::inputs::finish(producer, bytes, None).await?;
    up.map_err(|e| LaunchError::Staging { what: "uploading the inputs".into(), source: Box::new(e) })?;
    if let Some(s) = &progress {
        crate::inputs::finished(s, bytes);
    }
    Ok(report)
}

/// The link over a container's attached (or exec'd) streams: the init's stdout carries the
/// link, its stderr the init's own diagnostics.
pub(crate) fn transport(attached: Attached) -> Transport {
    let inbound = attached.output.map(|c| {
        c.map(|c| match c {
            Chunk::Stdout(b) => Inbound::Link(b),
            Chunk::Stderr(b) => Inbound::InitStderr(b),
        })
    });
    (Box::pin(inbound), Sender::new(attached.input))
}

/// The container's published ports: container port → the address that reaches it (on a
/// remote engine, the engine host's).
pub(crate) async fn published(site: &ContainerSite, id: &str) -> BTreeMap<String, String> {
    let mut ports = BTreeMap::new();
    if site.config.ports.is_empty() {
        return ports;
    }
    let Ok(state) = site.engine.api.inspect_container(id).await else { return ports };
    let endpoint = site.engine.endpoint();
    let remote_host = (!endpoint.is_local()).then(|| endpoint.host.clone()).flatten();
    for (container_port, bound) in state.ports {
        let shown = match (&remote_host, bound.rsplit_once(':')) {
            (Some(host), Some((_, port))) => format!("{host}:{port}"),
            _ => bound,
        };
        ports.insert(container_port, shown);
    }
    ports
}

/// Whether the container runs, as the engine says now (asked again while it cannot say).
pub(crate) async fn runs(site: &ContainerSite, id: &str) -> bool {
    for wait in [1, 2, 4, 8, 16] {
        match site.engine.api.inspect_container(id).await {
            Ok(state) => return state.running,
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_secs(wait)).await,
            Err(_) => return false,
        }
    }
    false
}
