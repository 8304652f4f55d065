//! The oci rung's part of a takeover (`attempt::recover` does the rest): the checkpoint is
//! input, so its runtime container must be this rung's (its state dir), named for that
//! worker's attempt, in this rung's bundles' dir with that worker's owner marker; the
//! runtime's process is found by pid and start time (a reused pid is not mistaken for it);
//! the init's takeover socket (it accepts only this uid) is in the bundle, 0700 and root's.

use super::cleanup::{Cleanup, start_ticks};
use super::ledger::Own;
use super::provision::{OWNER_FILE, TAKEOVER_SOCKET};
use super::site::OciSite;
use crate::attempt::{Ledger, Teardown};
use crate::contract::{Checkpoint, RecoverError, Target};
use crate::link::session::{Inbound, Sender, Transport};
use futures_util::StreamExt;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

/// Why the checkpoint does not name one of this rung's attempts of that worker; `None`: it does.
fn not_ours(site: &OciSite, cp: &Checkpoint, l: &Ledger<Own>) -> Option<&'static str> {
    let Target::Runtime { id, root } = &cp.target else {
        return Some("the checkpoint is not of a runtime's container");
    };
    if *id != l.own.id || *id != l.name || Path::new(root) != site.state {
        return Some("its container is not its ledger's, or another state dir's");
    }
    if super::reclaim::attempt_of(id, &cp.worker).as_deref() != Some(l.attempt_id.as_str()) {
        return Some("its container is not named for that worker's attempt");
    }
    if l.own.bundle != site.bundles.join(id) {
        return Some("its bundle is not in this rung's bundles' dir");
    }
    let mut owner = String::new();
    let read = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(l.own.bundle.join(OWNER_FILE))
        .and_then(|f| f.take(4096).read_to_string(&mut owner));
    if read.is_err() || owner.lines().next() != Some(cp.worker.as_str()) {
        return Some("its bundle is not that worker's");
    }
    None
}

/// The checkpoint's container, if it is that attempt's and its runtime still runs; else what
/// is left of the attempt is removed.
pub(crate) async fn reattach(
    site: &Arc<OciSite>,
    cp: &Checkpoint,
    ledger: &Ledger<Own>,
) -> Result<Cleanup, RecoverError> {
    if let Some(why) = not_ours(site, cp, ledger) {
        return Err(RecoverError::Invalid(why.to_owned()));
    }
    if !site.takeover {
        return Err(RecoverError::Invalid(format!(
            "{} hands the init no takeover socket (its run takes no --preserve-fds): its attempts cannot be recovered",
            site.runtime.display()
        )));
    }
    let own = &ledger.own;
    let mut cleanup = Cleanup::new(site.clone(), ledger.attempt_id.clone(), &cp.worker);
    cleanup.bundle = Some(own.bundle.clone());
    cleanup.id = Some(own.id.clone());
    cleanup.held = site.images.held(&own.image_id);
    if start_ticks(own.runtime_pid) != Some(own.start_ticks) {
        cleanup.remove().await;
        return Err(RecoverError::Gone("its container ended while no host was there; the record went with it".into()));
    }
    cleanup.runtime = Some((own.runtime_pid, super::cleanup::Runtime::Adopted(own.start_ticks)));
    Ok(cleanup)
}

/// A connection to the init's takeover socket in the bundle.
pub(crate) async fn takeover(ledger: &Ledger<Own>) -> Result<Transport, String> {
    let ctl = ledger.own.bundle.join(TAKEOVER_SOCKET);
    let s = tokio::net::UnixStream::connect(&ctl).await.map_err(|e| format!("connecting to {}: {e}", ctl.display()))?;
    let (read, write) = s.into_split();
    let inbound = tokio_util::io::ReaderStream::new(read).map(|r| r.map(Inbound::Link));
    Ok((Box::pin(inbound), Sender::new(Box::pin(write))))
}
