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
use futures_util::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

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
    let spec_of = |tools: &ToolsVolume| {
        let facts = shared.engine.facts();
        let mut spec = spec::build(&spec::SpecInput {
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
        });
        // As docker: the engine makes the working directory at create, beneath the root, even
        // a read-only one (the init makes or names it in a container made before the request).
        spec.body.working_dir = Some(plan.decided.cwd.clone()).filter(|w| !w.is_empty());
        spec
    };
    let spec::Spec { body, mut enforcement, mut skipped } = spec_of(&tools);
    left.container(plan.decided.name.clone());
    let s = shared.clone();
    let name = plan.decided.name.clone();
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
            let name = plan.decided.name.clone();
            creating(shared, left, async move { s.engine.api.create_container(&name, again.body).await }).await?
        }
        other => other?,
    };
    let attached = shared.engine.api.attach(&plan.decided.name).await?;
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
