//! Taking over an attempt a previous life of this worker started (`Executor::recover`): the
//! container is checked to be the checkpoint's (by its labels), the init's takeover socket
//! is reached through `stevedore-init relay` run by `docker exec`, the host answers the
//! init's challenge with the attempt key, and the attempt is then supervised and judged as
//! if it had never been left. Whatever cannot be recovered is removed.

use super::attempt::conclude;
use super::cleanup::Cleanup;
use super::executor::Shared;
use super::labels;
use super::launch::{Running, scope};
use super::ledger::Ledger;
use crate::contract::{Checkpoint, HookSet, Outcome, RecoverError, Request, Target, valid_worker_id};
use crate::engine::Chunk;
use crate::link::reports::{self, ReportRoute};
use crate::link::session::{self, Inbound, OutputsSink, ReaderSetup, Sender};
use crate::link::{CappedLog, LiveSink};
use crate::outputs::Caps;
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stevedore_init::wire::{self, INIT_NAME, TOOLS_DIR};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// How long a takeover may take, tries included.
const TAKEOVER_WITHIN: Duration = Duration::from_secs(30);

pub(crate) async fn recover(
    shared: Arc<Shared>,
    cp: &Checkpoint,
    hooks: Option<HookSet>,
    cancel: CancellationToken,
) -> Result<Outcome, RecoverError> {
    let span = tracing::info_span!(
        "recover",
        job = %cp.job_id,
        attempt = cp.attempt,
        worker = %cp.worker,
        container_id = tracing::field::Empty
    );
    let result = take_over(shared.clone(), cp, hooks, cancel).instrument(span).await;
    // The dead process's tools volume goes with its last attempt (the engine refuses while
    // another of its containers mounts it). Not for a checkpoint refused as invalid: then
    // nothing is touched.
    if !matches!(result, Err(RecoverError::Invalid(_)))
        && let Err(e) = super::tools::remove_of(&shared.engine, &[&cp.incarnation], &shared.incarnation).await
    {
        tracing::warn!(error = %e, "removing the recovered process's tools volume");
    }
    result
}

/// The request the attempt was, as far as judging it needs.
fn request_of(cp: &Checkpoint, hooks: Option<HookSet>) -> Request {
    let now_ms = crate::contract::unix_ms_now();
    let mut req = Request::command(cp.job_id.clone(), ["recovered"], cp.output_dir.clone())
        .attempt(cp.attempt)
        .worker(cp.worker.clone())
        .grace(Duration::from_millis(cp.grace_ms));
    if let Some(at) = cp.deadline_at_unix_ms {
        req = req.deadline(Instant::now() + Duration::from_millis(at.saturating_sub(now_ms)));
    }
    req.hooks = hooks;
    req
}

async fn take_over(
    shared: Arc<Shared>,
    cp: &Checkpoint,
    hooks: Option<HookSet>,
    cancel: CancellationToken,
) -> Result<Outcome, RecoverError> {
    let invalid = |why: &str| RecoverError::Invalid(why.to_owned());
    if cp.rung != shared.config.name {
        return Err(invalid("the checkpoint is another rung's"));
    }
    let Target::Container { id, .. } = &cp.target else {
        return Err(invalid("the checkpoint is not of a container"));
    };
    let ledger: Ledger = serde_json::from_value(cp.state.clone()).map_err(|e| invalid(&format!("its state: {e}")))?;
    let key = wire::parse_key(&cp.link.key).ok_or_else(|| invalid("its key is not 32 hex bytes"))?;
    if !wire::valid_link_id(&cp.link.id) || !valid_worker_id(&cp.worker) {
        return Err(invalid("its link id or worker id is malformed"));
    }
    let api = &shared.engine.api;
    // The engine says what the container is: a checkpoint cannot point stevedore at
    // someone else's container.
    let state = match api.inspect_container(id).await {
        Ok(s) => s,
        Err(e) if e.is_not_found() => {
            let mut cleanup = Cleanup::new(shared.clone(), ledger.attempt_id.clone());
            cleanup.left.volumes = ledger.volumes.clone();
            cleanup.left.containers = ledger.containers.clone();
            cleanup.run().await;
            return Err(RecoverError::Gone("its container no longer exists".into()));
        }
        Err(e) => return Err(RecoverError::Engine(e)),
    };
    let label = |k: &str| state.labels.get(k).map(String::as_str);
    if label(labels::WORKER) != Some(&cp.worker) || label(labels::ATTEMPT_ID) != Some(&ledger.attempt_id) {
        return Err(invalid("the container's labels are not this attempt's"));
    }
    tracing::Span::current().record("container_id", id.as_str());
    let mut cleanup = Cleanup::new(shared.clone(), ledger.attempt_id.clone());
    cleanup.left.containers = ledger.containers.clone();
    cleanup.left.volumes = ledger.volumes.clone();
    if !state.running {
        cleanup.run().await;
        return Err(RecoverError::Gone(format!(
            "its init ended while no host was there (exit code {:?}); the record went with it",
            state.exit_code
        )));
    }
    let req = request_of(cp, hooks);
    let fail = |cleanup: Cleanup, e: RecoverError| async move {
        cleanup.run().await;
        Err(e)
    };
    let dest = match req.open_output_dir() {
        Ok(d) => d,
        Err(e) => return fail(cleanup, RecoverError::OutputDir(e)).await,
    };
    let cfg = &shared.config;
    let (report_tx, report_task) = match &req.hooks {
        Some(h) => {
            let (tx, task) = reports::forward(h.clone(), req.attempt_ref());
            (Some(tx), Some(task))
        }
        None => (None, None),
    };
    let caps = Caps { max_files: ledger.max_files as usize, max_total_bytes: ledger.max_total_bytes };
    let setup = || {
        let dir = shared.log_base().and_then(|b| b.subdir(&cp.worker)).map_err(|e| e.to_string())?;
        let [out, err] = ledger.captures.as_ref().ok_or("its capture files are not named")?;
        Ok(ReaderSetup {
            key,
            stdout: CappedLog::append(&dir, out, cfg.log_cap_bytes).map_err(|e| e.to_string())?,
            stderr: CappedLog::append(&dir, err, cfg.log_cap_bytes).map_err(|e| e.to_string())?,
            live: LiveSink::new(None),
            outputs: OutputsSink { dest: dest.try_clone().map_err(|e| e.to_string())?, caps },
            reports: ReportRoute::new(scope(&req), report_tx.clone()),
            stop: Default::default(),
        })
    };
    // The relay runs as root when the command does not: the init then takes a takeover only
    // from uid 0, which nothing in the sandbox has.
    let relay_user = (cfg.uid_gid().0 != 0).then_some("0:0");
    let open = |left: Duration| {
        let argv = vec![
            format!("{TOOLS_DIR}/{INIT_NAME}"),
            "relay".to_owned(),
            cp.link.id.clone(),
            left.as_millis().to_string(),
        ];
        async move {
            let attached = api.exec(id, argv, relay_user).await.map_err(|e| crate::util::error_chain(&e))?;
            let inbound = attached.output.map(|c| {
                c.map(|c| match c {
                    Chunk::Stdout(b) => Inbound::Link(b),
                    Chunk::Stderr(b) => Inbound::InitStderr(b),
                })
            });
            Ok::<session::Transport, String>((Box::pin(inbound), Sender::new(attached.input)))
        }
    };
    let taken = session::take_over(open, setup, &key, &cp.link.id, &shared.tracker, TAKEOVER_WITHIN).await;
    // The reader's route holds the only sender now: the forwarding ends with the reader.
    drop(report_tx);
    let session::TakenOver { sender, stop, events, reader, resumed } = match taken {
        Ok(t) => t,
        Err(e) => return Ok(unrecovered(&shared, &req, ledger, cleanup, e).await),
    };
    let away_ms = crate::contract::unix_ms_now().saturating_sub(ledger.started_ms);
    let started = Instant::now().checked_sub(Duration::from_millis(away_ms)).unwrap_or_else(Instant::now);
    let heartbeat = cfg.host_loss.heartbeat_timeout.map(|_| sender.heartbeats(cfg.host_loss.heartbeat_every));
    let link = crate::link::supervise::Linked { started, sender, stop, events, reader, heartbeat };
    let mut running = Running { ledger, link, reports: report_task };
    let ended = running.supervise(&shared, &req, &cancel).await;
    let (mut outcome, _silent) = conclude_recovered(&shared, &req, &mut running, ended, cleanup, resumed.ended).await;
    outcome.evidence.incarnation = shared.incarnation.clone();
    Ok(outcome)
}

/// Concludes like any attempt, saying how it was recovered before the outcome hook runs.
async fn conclude_recovered(
    shared: &Arc<Shared>,
    req: &Request,
    running: &mut Running,
    ended: crate::link::supervise::Ended,
    cleanup: Cleanup,
    had_ended: bool,
) -> (Outcome, Option<String>) {
    let how = if had_ended {
        "taken over by a restarted worker after the command had ended; the record and outputs were kept for it"
    } else {
        "taken over by a restarted worker while the command was running"
    };
    let hooks = req.hooks.clone();
    let mut quiet = req.clone();
    quiet.hooks = None;
    // Removed before returning, whatever `background_cleanup` says: the dead process's tools
    // volume is removed next, and the engine refuses while this container still mounts it.
    let (mut outcome, silent) = conclude(shared, &quiet, running, ended, cleanup, false).await;
    outcome.evidence.recovered = Some(how.to_owned());
    if let Some(h) = hooks {
        h.deliver_outcome(&mut outcome).await;
    }
    (outcome, silent)
}

/// An attempt that could not be taken over: its container is stopped and removed, and the
/// Outcome says why (only what the host saw counts: there is no record).
async fn unrecovered(shared: &Arc<Shared>, req: &Request, ledger: Ledger, cleanup: Cleanup, why: String) -> Outcome {
    let state = shared.engine.api.inspect_container(&ledger.name).await.ok();
    cleanup.run().await;
    let mut o = crate::contract::judge(
        req,
        crate::contract::Judgement {
            facts: crate::contract::Facts {
                record: crate::contract::Record::Missing,
                exit: match state
                    .as_ref()
                    .and_then(|s| s.exit_code)
                    .filter(|_| state.as_ref().is_some_and(|s| !s.running))
                {
                    Some(c) if c > 128 => crate::contract::Exit::Signal((c - 128) as i32),
                    _ => crate::contract::Exit::Unknown,
                },
                ..Default::default()
            },
            error_text: format!("the takeover failed: {why}"),
            ..Default::default()
        },
    );
    o.evidence.executor = shared.config.name.clone();
    o.evidence.level = Some(shared.config.level());
    o.evidence.incarnation = shared.incarnation.clone();
    o.evidence.container_id = Some(ledger.container_id.clone());
    o.evidence.image = Some(ledger.image_ref.clone());
    o.evidence.image_id = Some(ledger.image_id.clone());
    o.evidence.recovered = Some(format!("the takeover failed: {why}; the container was stopped and removed"));
    o.usage.sources.wall_time_ms = Some(crate::contract::Source::unavailable("the takeover failed"));
    o.usage.sources.cpu_time_ms = Some(crate::contract::Source::unavailable("the takeover failed"));
    o.usage.sources.peak_memory_bytes = Some(crate::contract::Source::unavailable("the takeover failed"));
    if let Some(h) = &req.hooks {
        h.deliver_outcome(&mut o).await;
    }
    o
}
