//! One attempt in one container, as typed phases: `prepare` → `launch` → `supervise` →
//! clean up → `assess` → the judge. `Err` only when the container never ran the command.

use super::cleanup::Cleanup;
use super::executor::Shared;
use super::finish::assess;
use super::launch::Running;
use super::launch::launch;
use super::prepare::prepare;
use super::spec::Applied;
use crate::contract::{LaunchError, Outcome, Request, judge};
use crate::engine::ContainerState;
use crate::link::supervise::Ended;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Runs one attempt under the limits admission already worked out.
///
/// # Cancellation safety
/// Dropping the future at any point leaves nothing behind for long: every object is in the
/// attempt's `Cleanup`, whose `Drop` hands the removals to the rung's tracked tasks.
pub(crate) async fn run(
    shared: Arc<Shared>,
    req: &Request,
    applied: Applied,
    cancel: CancellationToken,
) -> Result<Outcome, LaunchError> {
    let span = tracing::info_span!(
        "attempt",
        job = %req.job_id,
        attempt = req.attempt,
        worker = %req.worker_id,
        container_id = tracing::field::Empty
    );
    attempt(shared, req, applied, cancel).instrument(span).await
}

async fn attempt(
    shared: Arc<Shared>,
    req: &Request,
    applied: Applied,
    cancel: CancellationToken,
) -> Result<Outcome, LaunchError> {
    let mut plan = prepare(&shared, req, applied).await?;
    let dests = plan.mounts.clone();
    let probe = format!("{}-probe", plan.name);
    let image_id = if plan.image.id.is_empty() { plan.image_ref.clone() } else { plan.image.id.clone() };
    if let Some(r) = super::mounts::check(&shared, &image_id, probe, plan.probe_labels.clone(), &dests).await? {
        return Ok(redirected(&shared, req, &plan, &r));
    }
    let warm = super::pool::claim(&shared, &plan);
    if let super::pool::Claim::Hit(p) = &warm {
        // The attempt takes the parked container's identity: its objects, labels and in-flight entry.
        plan.attempt_id = p.attempt_id.clone();
        plan.name = p.name.clone();
    }
    let mut cleanup = Cleanup::new(shared.clone(), plan.attempt_id.clone());
    let mut running = match launch(&shared, req, &mut plan, &mut cleanup.left, &cancel, warm).await {
        Ok(r) => r,
        Err(e) => {
            let removed = cleanup.run().await;
            if !removed.errors.is_empty() {
                tracing::warn!(errors = ?removed.errors, "cleanup after a launch error left objects behind");
            }
            return Err(e);
        }
    };
    tracing::Span::current().record("container_id", running.ledger.container_id.as_str());
    let ended = running.supervise(&shared, req, &cancel).await;
    let background = shared.config.background_cleanup;
    let (outcome, silent) = conclude(&shared, req, &mut running, ended, cleanup, background).await;
    if let Some(detail) = silent {
        return Err(LaunchError::HandlerProtocol { image: plan.image_ref.clone(), detail });
    }
    Ok(outcome)
}

/// After supervision: the engine's state if the record is missing, the cleanup, the
/// assessment, the judge, the outcome hook. Returns the outcome, and what was seen of a
/// handler runner that never spoke the protocol (the caller decides what that means).
pub(crate) async fn conclude(
    shared: &Arc<Shared>,
    req: &Request,
    running: &mut Running,
    ended: Ended,
    cleanup: Cleanup,
    background: bool,
) -> (Outcome, Option<String>) {
    // Without a verified record the engine's own state is the only witness left.
    let state = if ended.record.as_ref().is_some_and(Result::is_ok) {
        None
    } else {
        match shared.engine.api.inspect_container(&running.ledger.name).await {
            Ok(s) => Some(s),
            Err(e) if e.is_not_found() => None,
            Err(e) => {
                tracing::warn!(error = %e, "inspecting the container failed");
                Some(ContainerState::default())
            }
        }
    };
    let removed = if background && ended.record.as_ref().is_some_and(Result::is_ok) {
        // With a verified record nothing the removal finds changes the outcome: it runs on
        // the rung's tracked tasks (`close` waits for them) while the outcome is returned.
        shared.tracker.spawn(async move {
            let removed = cleanup.run().await;
            if !removed.errors.is_empty() {
                tracing::warn!(errors = ?removed.errors, "removing a finished attempt's objects left some behind");
            }
        });
        super::cleanup::Removed::default()
    } else {
        cleanup.run().await
    };
    let stderr_path = ended.received.stderr.path.clone();
    let delivered = crate::link::reports::finish(running.reports.take()).await;
    let assessed = assess(shared, req, &running.ledger, ended, state, removed, delivered);
    let silent = assessed.handler_silent.then(|| {
        let exit = match assessed.judgement.facts.exit {
            crate::contract::Exit::Code(c) => format!("it exited with code {c}"),
            crate::contract::Exit::Signal(s) => format!("it was killed by signal {s}"),
            crate::contract::Exit::Unknown => "it never said hello".to_owned(),
        };
        let tail = stderr_path.as_deref().map(tail_of).unwrap_or_default();
        if tail.is_empty() { exit } else { format!("{exit}; its stderr ends with: {tail}") }
    });
    let mut outcome = judge(req, assessed.judgement);
    tracing::info!(status = %outcome.status, reason = ?outcome.reason, "attempt finished");
    if silent.is_none()
        && let Some(hooks) = &req.hooks
    {
        hooks.deliver_outcome(&mut outcome).await;
    }
    (outcome, silent)
}

/// The last line or so of a capture file.
fn tail_of(path: &str) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(512)));
    let mut buf = Vec::new();
    let _ = f.take(512).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).trim().to_owned()
}

/// The Outcome of an attempt refused because the image would move one of its mounts: it
/// never ran (`launch_failed`, `mount_redirected`, permanent: the image is what it is).
fn redirected(shared: &Shared, req: &Request, plan: &super::prepare::Plan, r: &super::mounts::Redirect) -> Outcome {
    use crate::contract::{Evidence, Facts, Judgement, LaunchFailure, Source};
    let facts = shared.engine.facts();
    let mut j = Judgement {
        facts: Facts { launch_failed: Some(LaunchFailure::MountRedirected), ..Facts::default() },
        error_text: r.explain(&plan.image_ref),
        permanent: true,
        evidence: Evidence {
            executor: shared.config.name.clone(),
            level: Some(shared.config.level()),
            incarnation: shared.incarnation.clone(),
            started_at_unix_ms: Some(plan.started_ms),
            finished_at_unix_ms: Some(crate::contract::unix_ms_now()),
            image: Some(plan.image_ref.clone()),
            image_id: Some(plan.image.id.clone()),
            engine_version: Some(facts.engine_version.clone()),
            api_version: Some(facts.api_version.clone()),
            ..Evidence::default()
        },
        ..Judgement::default()
    };
    for figure in [&mut j.usage.sources.wall_time_ms, &mut j.usage.sources.cpu_time_ms] {
        *figure = Some(Source::unavailable("nothing ran"));
    }
    j.usage.sources.peak_memory_bytes = Some(Source::unavailable("nothing ran"));
    let o = judge(req, j);
    tracing::info!(path = %r.path, target = %r.target, "refused: a mount destination is a symlink in the image");
    o
}
