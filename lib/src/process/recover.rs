//! The process rung's part of a takeover (`attempt::recover` does the rest): the init is
//! found by pid and start time (a reused pid is not mistaken for it), the ledger's places
//! must be this rung's own for that attempt, and the init's takeover socket (it accepts
//! only this uid) is reached in the attempt's dir.

use super::cleanup::Cleanup;
use super::ledger::Own;
use super::site::ProcessSite;
use super::tree::start_ticks;
use crate::attempt::{Ledger, Teardown};
use crate::contract::{Checkpoint, RecoverError, Target};
use crate::link::session::{Inbound, Sender, Transport};
use futures_util::StreamExt;
use std::path::Path;
use std::sync::Arc;

/// Whether the ledger's places are this rung's own for that attempt (a checkpoint is input:
/// it must not make the rung remove or kill anything else).
fn owned(site: &ProcessSite, l: &Ledger<Own>) -> bool {
    let d = &l.own.dir;
    let name_ok = crate::hostdir::safe_name(&l.name);
    let dir_ok = d.root == site.attempts.join(&l.name)
        && d.input == d.root.join("in")
        && d.output == d.root.join("out")
        && d.tmp == d.root.join("tmp");
    let cg_ok = l.own.cgroup.as_ref().is_none_or(|c| {
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

/// The checkpoint's init, if it is that attempt's and still runs; else what is left of the
/// attempt is removed.
pub(crate) async fn reattach(
    site: &Arc<ProcessSite>,
    cp: &Checkpoint,
    ledger: &Ledger<Own>,
) -> Result<Cleanup, RecoverError> {
    let invalid = |why: &str| RecoverError::Invalid(why.to_owned());
    let Target::Process { pid, start_ticks: ticks } = cp.target else {
        return Err(invalid("the checkpoint is not of a process"));
    };
    if ledger.own.init_pid != pid || ledger.own.start_ticks != ticks {
        return Err(invalid("its pid is not its ledger's"));
    }
    if !owned(site, ledger) {
        return Err(invalid("its places are not this rung's"));
    }
    let mut cleanup = Cleanup::new(site.clone(), ledger.attempt_id.clone());
    cleanup.dir = Some(ledger.own.dir.clone());
    cleanup.cgroup = ledger.own.cgroup.clone();
    if start_ticks(pid) != Some(ticks) {
        cleanup.remove().await;
        return Err(RecoverError::Gone("its init ended while no host was there; the record went with it".into()));
    }
    cleanup.adopted = Some((pid, ticks));
    if let (Some(uids), Some(uid)) = (site.uids.clone(), ledger.own.uid) {
        // The dead worker's lock went with it: the uid's lease is this process's now.
        cleanup.lease = tokio::task::spawn_blocking(move || uids.adopt(uid)).await.ok().and_then(Result::ok).flatten();
    }
    Ok(cleanup)
}

/// A connection to the init's takeover socket in the attempt's dir.
pub(crate) async fn takeover(ledger: &Ledger<Own>) -> Result<Transport, String> {
    let s = ledger.own.dir.connect_takeover().map_err(|e| crate::util::error_chain(&e))?;
    s.set_nonblocking(true).map_err(|e| e.to_string())?;
    let (read, write) = tokio::net::UnixStream::from_std(s).map_err(|e| e.to_string())?.into_split();
    let inbound = tokio_util::io::ReaderStream::new(read).map(|r| r.map(Inbound::Link));
    Ok((Box::pin(inbound), Sender::new(Box::pin(write))))
}
