//! Taking over a process-rung attempt a previous life of this worker started: the init
//! (found by pid and start time, so a reused pid is not mistaken for it) is reached on its
//! takeover socket in the host's abstract namespace (it accepts only this uid), the host
//! answers its challenge with the attempt key, and the attempt is supervised and judged as
//! if it had never been left. What cannot be recovered is removed.

use super::attempt::{Cleanup, Ledger, conclude, scope, start_ticks, supervise_it};
use super::executor::Shared;
use crate::contract::{Checkpoint, HookSet, Outcome, RecoverError, Request, Target, valid_worker_id};
use crate::link::reports::{self, ReportRoute};
use crate::link::session::{self, Inbound, OutputsSink, ReaderSetup, Sender};
use crate::link::supervise::Linked;
use crate::link::{CappedLog, LiveSink};
use crate::outputs::Caps;
use futures_util::StreamExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stevedore_init::wire;
use tokio_util::sync::CancellationToken;

/// How long a takeover may take, tries included.
const TAKEOVER_WITHIN: Duration = Duration::from_secs(30);

/// Whether the ledger's places are this rung's own for that attempt (a checkpoint is input:
/// it must not make the rung remove or kill anything else).
fn owned(shared: &Shared, l: &Ledger) -> bool {
    let d = &l.dir;
    let name_ok = crate::hostdir::safe_name(&l.name);
    let dir_ok = d.root == shared.attempts.join(&l.name)
        && d.input == d.root.join("in")
        && d.output == d.root.join("out")
        && d.tmp == d.root.join("tmp");
    let cg_ok = l.cgroup.as_ref().is_none_or(|c| {
        let fine = |p: &Path| {
            p.file_name().and_then(|n| n.to_str()) == Some(l.name.as_str())
                && p.starts_with("/sys/fs/cgroup")
                && !p.components().any(|c| matches!(c, std::path::Component::ParentDir))
        };
        match c {
            super::cgroup::Cgroup::V1 { memory, cpu, cpuacct, pids } => {
                [memory, cpu, cpuacct, pids].iter().all(|p| fine(p))
            }
            super::cgroup::Cgroup::V2(dir) => fine(dir),
        }
    });
    name_ok && dir_ok && cg_ok
}

pub(crate) async fn recover(
    shared: Arc<Shared>,
    cp: &Checkpoint,
    hooks: Option<HookSet>,
    cancel: CancellationToken,
) -> Result<Outcome, RecoverError> {
    let invalid = |why: &str| RecoverError::Invalid(why.to_owned());
    if cp.rung != shared.config.name {
        return Err(invalid("the checkpoint is another rung's"));
    }
    let Target::Process { pid, start_ticks: ticks } = cp.target else {
        return Err(invalid("the checkpoint is not of a process"));
    };
    let ledger: Ledger = serde_json::from_value(cp.state.clone()).map_err(|e| invalid(&format!("its state: {e}")))?;
    let key = wire::parse_key(&cp.link.key).ok_or_else(|| invalid("its key is not 32 hex bytes"))?;
    if !wire::valid_link_id(&cp.link.id) || !valid_worker_id(&cp.worker) || ledger.init_pid != pid {
        return Err(invalid("its link id, worker id or pid is malformed"));
    }
    if !owned(&shared, &ledger) {
        return Err(invalid("its places are not this rung's"));
    }
    let mut cleanup = Cleanup::new(shared.clone(), ledger.attempt_id.clone());
    cleanup.dir = Some(ledger.dir.clone());
    cleanup.cgroup = ledger.cgroup.clone();
    if start_ticks(pid) != Some(ticks) {
        let _ = cleanup.run().await;
        return Err(RecoverError::Gone("its init ended while no host was there; the record went with it".into()));
    }
    cleanup.adopted = Some((pid, ticks));
    if let (Some(uids), Some(uid)) = (shared.uids.clone(), ledger.uid) {
        // The dead worker's lock went with it: the uid's lease is this process's now.
        cleanup.lease = tokio::task::spawn_blocking(move || uids.adopt(uid)).await.ok().and_then(Result::ok).flatten();
    }
    let fail = |cleanup: Cleanup, e: RecoverError| async move {
        let _ = cleanup.run().await;
        Err(e)
    };
    let mut req = Request::command(cp.job_id.clone(), ["recovered"], cp.output_dir.clone())
        .attempt(cp.attempt)
        .worker(cp.worker.clone())
        .grace(Duration::from_millis(cp.grace_ms));
    if let Some(at) = cp.deadline_at_unix_ms {
        let now = crate::contract::unix_ms_now();
        req = req.deadline(Instant::now() + Duration::from_millis(at.saturating_sub(now)));
    }
    req.hooks = hooks;
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
        let [out, err] = &ledger.captures;
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
    let dir = &ledger.dir;
    let open = |_: Duration| async move {
        let s = dir.connect_takeover().map_err(|e| crate::util::error_chain(&e))?;
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        let (read, write) = tokio::net::UnixStream::from_std(s).map_err(|e| e.to_string())?.into_split();
        let inbound = tokio_util::io::ReaderStream::new(read).map(|r| r.map(Inbound::Link));
        Ok::<session::Transport, String>((Box::pin(inbound), Sender::new(Box::pin(write))))
    };
    let taken = session::take_over(open, setup, &key, &cp.link.id, &shared.tracker, TAKEOVER_WITHIN).await;
    // The reader's route holds the only sender now: the forwarding ends with the reader.
    drop(report_tx);
    let session::TakenOver { sender, stop, events, reader, resumed } = match taken {
        Ok(t) => t,
        Err(e) => {
            // Stopped (the cleanup kills what it adopted) and judged from what the host saw.
            let why = format!("the takeover failed: {e}");
            let mut o = conclude(&shared, &req, &ledger, Default::default(), cleanup, report_task, Some(why)).await;
            o.handler_error = format!("the takeover failed: {e}");
            return Ok(o);
        }
    };
    let away_ms = crate::contract::unix_ms_now().saturating_sub(ledger.started_ms);
    let started = Instant::now().checked_sub(Duration::from_millis(away_ms)).unwrap_or_else(Instant::now);
    let heartbeat = cfg.host_loss.heartbeat_timeout.map(|_| sender.heartbeats(cfg.host_loss.heartbeat_every));
    let mut link = Linked { started, sender, stop, events, reader, heartbeat };
    let ended = supervise_it(&shared, &req, &mut link, &ledger, &cancel).await;
    drop(link);
    let how = if resumed.ended {
        "taken over by a restarted worker after the command had ended; the record and outputs were kept for it"
    } else {
        "taken over by a restarted worker while the command was running"
    };
    Ok(conclude(&shared, &req, &ledger, ended, cleanup, report_task, Some(how.to_owned())).await)
}
