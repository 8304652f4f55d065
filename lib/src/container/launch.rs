//! Phase 2 of an attempt: the init in the engine, the inputs staged, the container created
//! and attached (cold), or a parked one claimed (warm). Every object is recorded in the
//! attempt's `Leftovers` before the call that creates it. The rest is `attempt`'s.

use super::cleanup::{Leftovers, created, creating, creating_later};
use super::prepare::Plan;
use super::site::{ContainerSite, Ready, ToolsVolume};
use super::spec;
use super::stage::{UploadTo, prepare_staging, upload_inputs};
use super::tools::{host_tools_refused, tools_volume};
use crate::contract::{InputsStaged, LaunchError, Request};
use crate::engine::{Attached, Chunk};
use crate::link::session::{Inbound, Sender, Transport};
use crate::link::stage::NotStaged;
use futures_util::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use stevedore_init::wire::{IN_DIR, STAGE_DIR};
use tokio_util::sync::CancellationToken;

/// The cold path: the init, the inputs, the caches, the container created and attached. With
/// inputs, over the link where `stage::not_over_link` finds it fit, else (or when the
/// sandbox refused them) through the engine.
pub(crate) async fn provision(
    shared: &Arc<ContainerSite>,
    req: &Request,
    plan: &mut Plan,
    left: &mut Leftovers,
    cancel: &CancellationToken,
) -> Result<Ready, LaunchError> {
    // Asked of the engine once, whichever way the inputs go (a refusal over the link then
    // makes no second round of calls).
    let tools = tools_volume(shared, &plan.image_ref).await?;
    let caches = super::caches::ensure(shared, req, &plan.image_ref, &tools).await?;
    let mut made = (tools, caches);
    if plan.inputs.is_some() && plan.not_over_link.is_none() {
        match over_link(shared, plan, left, cancel, made).await? {
            Ok(ready) => return Ok(ready),
            Err((why, back)) => {
                made = back;
                plan.not_over_link = Some(format!("the sandbox refused them: {why}"));
                plan.mounts.retain(|m| m != STAGE_DIR);
            }
        }
    }
    through_engine(shared, plan, left, cancel, made).await
}

/// The init's volume and the attempt's caches (name, target, kind), made once per attempt.
type Made = (ToolsVolume, Vec<(String, String, String)>);

/// The inputs over the link (`docs/outcome.md`, "Inputs over the link"): the input volume, the
/// container with the init as root and the volume writable at `STAGE_DIR`, started, and the
/// inputs sent to the init, which writes them and waits for the Start frame. `Ok(Err(why))`:
/// the init refused the sandbox before it wrote anything; the container and input volume are
/// removed, and the init's volume and the caches handed back, for the other path.
async fn over_link(
    shared: &Arc<ContainerSite>,
    plan: &mut Plan,
    left: &mut Leftovers,
    cancel: &CancellationToken,
    (mut tools, caches): Made,
) -> Result<Result<Ready, (String, Made)>, LaunchError> {
    // The input volume is made by the container's create, from its first mount's options
    // (labelled as the attempt's, never filled from the image): one engine call fewer. The
    // init's checks find it root's and empty, or refuse it.
    let volume = format!("{}-in", plan.decided.name);
    left.volume(volume.clone());
    if cancel.is_cancelled() {
        return Err(LaunchError::CancelledBeforeStart);
    }
    let spec_of = |tools: &ToolsVolume| {
        let mut spec = spec_of(shared, plan, tools, Some(&volume), true, &caches);
        labelled_by_create(&mut spec.body, &volume, &plan.input_labels);
        spec
    };
    let spec::Spec { body, mut enforcement, skipped } = spec_of(&tools);
    left.container(plan.decided.name.clone());
    let s = shared.clone();
    let name = plan.decided.name.clone();
    let created = creating(shared, left, async move { s.engine.api.create_container(&name, body).await }).await;
    let (container_id, skipped) = match created {
        Err(e) if host_tools_refused(shared, &tools, &e) => {
            tools = tools_volume(shared, &plan.image_ref).await?;
            let again = spec_of(&tools);
            enforcement = again.enforcement;
            let s = shared.clone();
            let name = plan.decided.name.clone();
            let id =
                creating(shared, left, async move { s.engine.api.create_container(&name, again.body).await }).await?;
            (id, again.skipped)
        }
        other => (other?, skipped),
    };
    let mut transport = transport(shared.engine.api.attach(&plan.decided.name).await?);
    if let Err(err) = shared.engine.api.start(&plan.decided.name).await {
        shared.tools_suspect().await;
        return Err(spec::port_taken(&shared.config, err));
    }
    let (dir, staged) = plan.inputs.as_ref().expect("over the link only with inputs");
    let limit = shared.config.link_inputs_max_bytes.min(shared.config.max_input_bytes);
    let within = shared.engine.timeout() + Duration::from_secs(staged.bytes / super::stage::SLOWEST_UPLOAD);
    let sent = crate::link::stage::over_link(
        &mut transport,
        crate::link::stage::Staging { stage_dir: STAGE_DIR, in_dir: IN_DIR, tighten: false },
        Some((dir, staged)),
        limit,
        within,
        plan.progress.clone(),
    )
    .await;
    let inputs = match sent {
        Ok(inputs) => inputs,
        Err(NotStaged::Failed(e)) => return Err(e),
        Err(NotStaged::Refused(why)) => {
            drop(transport);
            remove_now(shared, left, &plan.decided.name, &volume).await?;
            return Ok(Err((why, (tools, caches))));
        }
    };
    enforcement.insert("inputs_staging".into(), super::stage::over_link_evidence(&volume));
    Ok(Ok(Ready {
        container_id,
        transport,
        running: true,
        enforcement,
        skipped,
        tools,
        inputs,
        caches,
        warm: None,
        staged_at: Some(crate::contract::unix_ms_now()),
        credentials: super::stage::credentials(shared),
    }))
}

/// A container and a volume the attempt made, removed now (the inputs go another way, with
/// the same names); one the engine could not remove ends the launch.
async fn remove_now(
    shared: &ContainerSite,
    left: &mut Leftovers,
    container: &str,
    volume: &str,
) -> Result<(), LaunchError> {
    for handle in std::mem::take(&mut left.creating) {
        let _ = handle.await;
    }
    shared.engine.api.remove_container(container).await?;
    left.containers.retain(|c| c != container);
    shared.engine.api.remove_volume(volume).await?;
    left.volumes.retain(|v| v != volume);
    left.record();
    Ok(())
}

/// Every mount of `volume` in `body` carries `labels` for the engine to create it with.
fn labelled_by_create(
    body: &mut bollard::models::ContainerCreateBody,
    volume: &str,
    labels: &std::collections::HashMap<String, String>,
) {
    let mounts = body.host_config.iter_mut().flat_map(|h| h.mounts.iter_mut().flatten());
    for m in mounts.filter(|m| m.source.as_deref() == Some(volume)) {
        m.volume_options.get_or_insert_with(Default::default).labels = Some(labels.clone());
    }
}

/// The attempt's container body.
fn spec_of(
    shared: &ContainerSite,
    plan: &Plan,
    tools: &ToolsVolume,
    input_volume: Option<&str>,
    stage: bool,
    caches: &[(String, String, String)],
) -> spec::Spec {
    let facts = shared.engine.facts();
    let mut spec = spec::build(&spec::SpecInput {
        config: &shared.config,
        image: &plan.image_ref,
        tools,
        labels: plan.labels.clone(),
        input_volume,
        stage,
        applied: &plan.applied,
        image_volumes: &plan.image.volumes,
        engine_seccomp: facts.seccomp(),
        podman: facts.is_podman(),
        publish_ip: if shared.engine.endpoint().is_local() { "127.0.0.1" } else { "0.0.0.0" },
        caches,
        warm: None,
    });
    // As docker: the engine makes the working directory at create, beneath the root, even a
    // read-only one (the init makes or names it in a container made before the request).
    spec.body.working_dir = Some(plan.decided.cwd.clone()).filter(|w| !w.is_empty());
    spec
}

/// The inputs through the engine: the input volume, a never-started helper the archive API
/// uploads into while the container is created.
async fn through_engine(
    shared: &Arc<ContainerSite>,
    plan: &mut Plan,
    left: &mut Leftovers,
    cancel: &CancellationToken,
    (mut tools, caches): Made,
) -> Result<Ready, LaunchError> {
    // With inputs, the container is created while they upload: it only needs their volume
    // to exist, and the upload goes through the helper, never the container.
    let staging = match plan.inputs.take() {
        Some((dir, staged)) => {
            let volume = format!("{}-in", plan.decided.name);
            let helper = prepare_staging(shared, plan, &volume, left).await?;
            Some((volume, helper, dir, staged))
        }
        None => None,
    };
    if cancel.is_cancelled() {
        return Err(LaunchError::CancelledBeforeStart);
    }
    let input_volume = staging.as_ref().map(|(v, ..)| v.clone());
    let spec_of = |tools: &ToolsVolume| spec_of(shared, plan, tools, input_volume.as_deref(), false, &caches);
    let spec::Spec { body, mut enforcement, mut skipped } = spec_of(&tools);
    left.container(plan.decided.name.clone());
    let s = shared.clone();
    let name = plan.decided.name.clone();
    let container = creating_later(shared, left, async move { s.engine.api.create_container(&name, body).await });
    let mut inputs = None;
    let (container_id, staged_at) = match staging {
        Some((volume, helper, dir, staged)) => {
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
            let why = plan.not_over_link.as_deref().unwrap_or("not asked");
            enforcement.insert("inputs_staging".into(), super::stage::through_engine_evidence(&volume, why));
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
            let name = plan.decided.name.clone();
            creating(shared, left, async move { s.engine.api.create_container(&name, again.body).await }).await?
        }
        other => other?,
    };
    let transport = transport(shared.engine.api.attach(&plan.decided.name).await?);
    Ok(Ready {
        container_id,
        transport,
        running: false,
        enforcement,
        skipped,
        tools,
        inputs,
        caches,
        warm: None,
        staged_at,
        credentials: None,
    })
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
