//! Removing what an attempt made on the host, whichever way it ends: awaited at its end
//! (`attempt::Teardown`), or by a `Drop` backstop that stops the init (SIGTERM: it stops the
//! command and exits) and hands the rest to the rung's tracked tasks. The uid's lease goes
//! last, once nothing of the attempt runs (what it left is swept then).

use super::cgroup::Cgroup;
use super::dirs::AttemptDir;
use super::site::ProcessSite;
use super::tree::{kill_tree, wait_gone};
use crate::attempt::{InFlight, Removed, Teardown};
use std::sync::Arc;
use std::time::Duration;

/// What an attempt made on the host, to be removed.
#[derive(Debug)]
pub(crate) struct Cleanup {
    shared: Arc<ProcessSite>,
    /// `None` once removed, or handed to the backstop.
    entry: Option<InFlight>,
    pub dir: Option<AttemptDir>,
    pub cgroup: Option<Cgroup>,
    pub init: Option<tokio::process::Child>,
    /// An init that is not this process's child (a recovered attempt's): pid, start ticks.
    pub adopted: Option<(i32, u64)>,
    /// The attempt's uid, released (and swept) once everything else is gone.
    pub lease: Option<super::uids::Lease>,
}

impl Cleanup {
    /// Marks `attempt_id` in flight (so this process's `reclaim` spares it) until removed.
    pub fn new(shared: Arc<ProcessSite>, attempt_id: String) -> Self {
        let entry = Some(shared.base.enter(attempt_id));
        Self { shared, entry, dir: None, cgroup: None, init: None, adopted: None, lease: None }
    }
}

/// Ends a uid's lease once nothing of its attempt runs: what it left is swept. The errors.
async fn release(lease: Option<super::uids::Lease>) -> Vec<String> {
    let Some(lease) = lease else { return Vec::new() };
    let uid = lease.uid;
    match tokio::task::spawn_blocking(move || lease.release()).await {
        Ok(true) => Vec::new(),
        Ok(false) => vec![format!(
            "uid {uid} still holds something (a process, a file in a shared dir, an IPC object): it is kept back \
             until a sweep finds it clean"
        )],
        Err(e) => vec![format!("releasing uid {uid}: {e}")],
    }
}

async fn finish(
    init: Option<tokio::process::Child>,
    dir: Option<AttemptDir>,
    cgroup: Option<Cgroup>,
    margin: Duration,
) -> (Option<stevedore_init::wire::CgroupCounters>, Vec<String>) {
    let mut errors = Vec::new();
    let mut counters = None;
    if let Some(mut child) = init
        && tokio::time::timeout(margin + Duration::from_secs(3), child.wait()).await.is_err()
    {
        if let Some(pid) = child.id() {
            kill_tree(pid as i32, cgroup.as_ref());
        }
        let _ = child.wait().await;
    }
    if let Some(c) = &cgroup {
        // Processes SIGKILLed a moment ago may still be on their way out of the cgroup.
        for _ in 0..50 {
            c.kill_all();
            if c.procs().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        counters = Some(c.read());
        errors.extend(c.remove());
    }
    if let Some(d) = dir {
        let removed = tokio::task::spawn_blocking(move || d.remove()).await;
        match removed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(crate::util::error_chain(&e)),
            Err(e) => errors.push(e.to_string()),
        }
    }
    (counters, errors)
}

impl Teardown for Cleanup {
    /// Waits (bounded) for the init to exit, kills what is left, reads the cgroup's final
    /// counters, removes the dir and the cgroup, ends the uid's lease.
    async fn remove(mut self) -> Removed {
        if let Some((pid, ticks)) = self.adopted.take() {
            wait_gone(pid, ticks, self.shared.config.link.kill_margin + Duration::from_secs(3), self.cgroup.as_ref())
                .await;
        }
        let (counters, mut errors) =
            finish(self.init.take(), self.dir.take(), self.cgroup.take(), self.shared.config.link.kill_margin).await;
        errors.extend(release(self.lease.take()).await);
        self.entry = None;
        Removed { errors, by_others: Vec::new(), counters }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some(entry) = self.entry.take() else { return };
        if let Some(pid) = self.init.as_ref().and_then(tokio::process::Child::id) {
            // The init stops its command within the grace and exits; it does not wait for
            // a takeover after a SIGTERM.
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
        }
        let (init, dir, cgroup) = (self.init.take(), self.dir.take(), self.cgroup.take());
        let lease = self.lease.take();
        let shared = self.shared.clone();
        let id = entry.id.clone();
        let removal = async move {
            let (_, mut errors) = finish(init, dir, cgroup, shared.config.link.kill_margin).await;
            errors.extend(release(lease).await);
            if !errors.is_empty() {
                tracing::warn!(attempt_id = %entry.id, ?errors, "backstop cleanup left things behind");
            }
        };
        if !self.shared.base.backstop(removal) {
            tracing::warn!(attempt_id = %id, "attempt dropped without a runtime; reclaim will remove what it made");
        }
    }
}
