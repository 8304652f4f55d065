//! Taking over an attempt a previous life of this worker started (`Executor::recover`): the
//! checkpoint is checked (it is input: it must not point the rung at anything else), the
//! rung finds its attempt again, the host proves it holds the attempt's key to the init's
//! takeover socket (`docs/link.md`), and the attempt is supervised and judged as if it had
//! never been left. Whatever cannot be recovered is stopped and removed, with an Outcome
//! that says why.

use super::conclude::{Ending, How, conclude, deliver};
use super::site::{Ledger, Site, Teardown};
use crate::contract::{Checkpoint, HookSet, Outcome, RecoverError, Request, valid_worker_id};
use crate::link::reports::ReportRoute;
use crate::link::session::{self, OutputsSink, ReaderSetup};
use crate::link::supervise::{Ended, Linked};
use crate::link::{CappedLog, LiveSink};
use crate::outputs::Caps;
use std::time::{Duration, Instant};
use stevedore_init::wire;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// How long a takeover may take, tries included.
const TAKEOVER_WITHIN: Duration = Duration::from_secs(30);

pub(crate) async fn recover<S: Site>(
    site: &S,
    cp: &Checkpoint,
    hooks: Option<HookSet>,
    cancel: &CancellationToken,
) -> Result<Outcome, RecoverError> {
    let span = tracing::info_span!(
        "recover",
        job = %cp.job_id,
        attempt = cp.attempt,
        worker = %cp.worker,
        target = tracing::field::Empty
    );
    take_over(site, cp, hooks, cancel).instrument(span).await
}

async fn take_over<S: Site>(
    site: &S,
    cp: &Checkpoint,
    hooks: Option<HookSet>,
    cancel: &CancellationToken,
) -> Result<Outcome, RecoverError> {
    let invalid = |why: &str| RecoverError::Invalid(why.to_owned());
    let rung = site.rung();
    if cp.rung != rung.name {
        return Err(invalid("the checkpoint is another rung's"));
    }
    let ledger: Ledger<S::Own> =
        serde_json::from_value(cp.state.clone()).map_err(|e| invalid(&format!("its state: {e}")))?;
    let key = wire::parse_key(&cp.link.key).ok_or_else(|| invalid("its key is not 32 hex bytes"))?;
    if !wire::valid_link_id(&cp.link.id) || !valid_worker_id(&cp.worker) {
        return Err(invalid("its link id or worker id is malformed"));
    }
    let teardown = site.reattach(cp, &ledger).await?;
    tracing::Span::current().record("target", super::describe(&cp.target));
    let req = request_of(cp, hooks);
    let dest = match req.open_output_dir() {
        Ok(d) => d,
        Err(e) => {
            teardown.remove().await;
            return Err(RecoverError::OutputDir(e));
        }
    };
    let (report_tx, reports) = super::begin::report_forwarding(&req);
    let cfg = rung.settings;
    let caps = Caps { max_files: ledger.max_files as usize, max_total_bytes: ledger.max_total_bytes };
    let (rejoin, more) = super::begin::rejoin(&cfg, key, &cp.link.id);
    let mut more = Some(more);
    let setup = || {
        let dir = rung.base.captures.of_worker(&cp.worker).map_err(|e| e.to_string())?;
        let [out, err] = &ledger.captures;
        Ok(ReaderSetup {
            key,
            stdout: CappedLog::append(&dir, out, cfg.link.log_cap_bytes).map_err(|e| e.to_string())?,
            stderr: CappedLog::append(&dir, err, cfg.link.log_cap_bytes).map_err(|e| e.to_string())?,
            live: LiveSink::new(None),
            outputs: OutputsSink {
                dest: dest.try_clone().map_err(|e| e.to_string())?,
                caps,
                in_place: site
                    .outputs_in_place(&ledger.own)
                    .map(|dir| cfg.link.collection.spec(dir.display().to_string(), caps)),
            },
            reports: ReportRoute::new(super::scope(&req), report_tx.clone()),
            stop: Default::default(),
            count: Default::default(),
            // Only the try that succeeds uses it; a failed one hands it back through nothing,
            // so a later try goes without (its cut then ends the link).
            more: more.take().flatten(),
            taking_over: true,
            progress: None,
        })
    };
    let open = |within: Duration| site.takeover(&ledger, &cp.link.id, within);
    let taken = session::take_over(open, setup, &key, &cp.link.id, &rung.base.tracker, TAKEOVER_WITHIN).await;
    // The reader's route holds the only sender now: the forwarding ends with the reader.
    drop(report_tx);
    let session::TakenOver { sender, stop, events, reader, resumed, count } = match taken {
        Ok(t) => t,
        Err(why) => {
            let ending = Ending { ledger, ended: Ended::default(), reports };
            let (outcome, _) = conclude(site, &req, ending, teardown, How::Unrecovered(why)).await;
            return Ok(deliver(&req, outcome).await);
        }
    };
    let away_ms = crate::contract::unix_ms_now().saturating_sub(ledger.started_ms);
    let started = Instant::now().checked_sub(Duration::from_millis(away_ms)).unwrap_or_else(Instant::now);
    let heartbeat = super::begin::heartbeats(&sender, &cfg, count);
    // A restarted worker has no stdin to give: the command's ends where the old one left it.
    let mut link = Linked { started, sender, stop, events, reader, heartbeat, stdin: None, rejoin };
    let ended = super::supervised(site, &mut link, &req, &ledger, cancel).await;
    drop(link);
    let how = if resumed.ended {
        "taken over by a restarted worker after the command had ended; the record and outputs were kept for it"
    } else {
        "taken over by a restarted worker while the command was running"
    };
    let ending = Ending { ledger, ended, reports };
    let (outcome, _) = conclude(site, &req, ending, teardown, How::Recovered(how.to_owned())).await;
    Ok(deliver(&req, outcome).await)
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
