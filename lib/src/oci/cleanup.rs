//! Removing what an oci attempt made, whichever way it ends: awaited at its end
//! (`attempt::Teardown`), or by a `Drop` backstop that hands the same removal to the rung's
//! tracked tasks. In order: the runtime's process waited for (bounded; then the container
//! SIGKILLed through the runtime), `runtime delete -f` (its state, its cgroup), any cgroup
//! dir the runtime left, the bundle (with the inputs' copy), after its owner marker was
//! checked, its outputs' tmpfs unmounted first. The runtime's mounts live in the container's
//! mount namespace and go with it.

use super::provision::OWNER_FILE;
use super::site::OciSite;
use crate::attempt::{InFlight, Removed, Teardown};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// What an attempt made, to be removed.
#[derive(Debug)]
pub(crate) struct Cleanup {
    shared: Arc<OciSite>,
    /// `None` once removed, or handed to the backstop.
    entry: Option<InFlight>,
    /// The worker whose marker the bundle carries.
    worker: String,
    pub bundle: Option<PathBuf>,
    /// The runtime's container id, once `run` was asked for.
    pub id: Option<String>,
    /// The runtime's process (`runtime run`, or one a previous life started) and its pid.
    pub runtime: Option<(i32, Runtime)>,
    /// The image's root filesystem, held against the cache's prune until the container is gone.
    pub held: Option<super::cache::Held>,
    /// The cgroup the rung holds above the runtime's (`held`), read once the sandbox ended.
    pub cgroup: Option<super::held::Held>,
}

impl Cleanup {
    /// Marks `attempt_id` in flight (so this process's `reclaim` spares it) until removed.
    pub fn new(shared: Arc<OciSite>, attempt_id: String, worker: &str) -> Self {
        let entry = Some(shared.base.enter(attempt_id));
        Self {
            shared,
            entry,
            worker: worker.to_owned(),
            bundle: None,
            id: None,
            runtime: None,
            held: None,
            cgroup: None,
        }
    }
}

/// `/proc/<pid>/stat` field 22 (start ticks since boot), of a process that is not a zombie.
pub(crate) fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// The cgroup dirs an attempt named `id` may have under the rung's parent (v1: one per
/// hierarchy; v2: one), the runtime's own below a held one (`held::LEAF`) first.
pub(crate) fn cgroup_dirs(id: &str) -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let mut hierarchies = vec![root.to_owned()];
    if let Ok(rd) = std::fs::read_dir(root) {
        hierarchies.extend(rd.flatten().map(|h| h.path()));
    }
    let at = |h: &PathBuf| h.join(super::spec::CGROUP_PARENT).join(id);
    let mut dirs: Vec<PathBuf> = hierarchies.iter().map(|h| at(h).join(super::held::LEAF)).collect();
    dirs.extend(hierarchies.iter().map(at));
    // Co-mounted hierarchies are one dir under several names (`cpu` and `cpuacct` links to
    // `cpu,cpuacct` on many hosts): each once.
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| d.is_dir() && std::fs::canonicalize(d).is_ok_and(|c| seen.insert(c)));
    dirs
}

/// Removes the runtime's container `id` and anything of it the runtime left; the errors.
pub(crate) async fn remove_container(site: &OciSite, id: &str) -> Vec<String> {
    let mut errors = remove_runtime_container(site, id).await;
    errors.extend(remove_cgroups(id));
    errors
}

/// `runtime delete -f`, when the runtime still knows the container.
async fn remove_runtime_container(site: &OciSite, id: &str) -> Vec<String> {
    match site.state.join(id).exists() {
        true => site.runtime_call(&["delete", "-f", id]).await.err().into_iter().collect(),
        false => Vec::new(),
    }
}

/// Every cgroup dir of `id` left: the runtime's (it deletes its own, normally), then the
/// rung's held one.
fn remove_cgroups(id: &str) -> Vec<String> {
    let mut errors = Vec::new();
    for d in cgroup_dirs(id) {
        match std::fs::remove_dir(&d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => errors.push(format!("cgroup {}: {e}", d.display())),
        }
    }
    errors
}

/// Removes a bundle once its marker names `worker` (a bundle that is not what this rung made
/// for that worker is left, and said).
pub(crate) async fn remove_bundle(bundle: PathBuf, worker: &str) -> Vec<String> {
    let owner = std::fs::read_to_string(bundle.join(OWNER_FILE)).unwrap_or_default();
    if !bundle.exists() {
        return Vec::new();
    }
    if !owner.is_empty() && owner.lines().next() != Some(worker) {
        return vec![format!("bundle {} belongs to another worker: left", bundle.display())];
    }
    // The outputs' tmpfs first: its files go with it, and no removal descends into a mount.
    let out = bundle.join(super::provision::OUT_MOUNT);
    let flags = nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW;
    match nix::mount::umount2(&out, flags) {
        Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {}
        Err(e) => return vec![format!("the outputs' tmpfs {}: {e}", out.display())],
    }
    match tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&bundle).map_err(|e| (bundle, e))).await {
        Ok(Ok(())) => Vec::new(),
        Ok(Err((b, e))) => vec![format!("bundle {}: {e}", b.display())],
        Err(e) => vec![e.to_string()],
    }
}

/// The runtime's process: this process's child (its waiter reports its end), or one a
/// previous life of the worker started (its end is seen in `/proc`).
#[derive(Debug)]
pub(crate) enum Runtime {
    /// Its end, as its waiter reports it.
    Child(super::site::Exit),
    /// Its start ticks: not this process's child, its end is seen in `/proc`.
    Adopted(u64),
}

/// Waits (at most `within`) for the runtime's process to end; whether it did.
async fn ended(runtime: &mut Runtime, pid: i32, within: Duration) -> bool {
    match runtime {
        Runtime::Child(exit) => {
            matches!(tokio::time::timeout(within, exit.wait_for(Option::is_some)).await, Ok(Ok(_)) | Ok(Err(_)))
        }
        // Not a child: no wait(2) and no pidfd here; `/proc` is asked at a short interval.
        Runtime::Adopted(ticks) => {
            let until = tokio::time::Instant::now() + within;
            while start_ticks(pid) == Some(*ticks) {
                if tokio::time::Instant::now() >= until {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            true
        }
    }
}

async fn finish(
    shared: Arc<OciSite>,
    worker: String,
    runtime: Option<(i32, Runtime)>,
    id: Option<String>,
    bundle: Option<PathBuf>,
    cgroup: Option<super::held::Held>,
) -> (Vec<String>, Option<stevedore_init::wire::CgroupCounters>) {
    let mut errors = Vec::new();
    if let Some((pid, mut runtime)) = runtime {
        let margin = shared.config.link.kill_margin + Duration::from_secs(3);
        if !ended(&mut runtime, pid, margin).await {
            if let Some(id) = &id
                && let Err(e) = shared.runtime_call(&["kill", id, "KILL"]).await
            {
                tracing::debug!(error = %e, "SIGKILL through the runtime");
            }
            if !ended(&mut runtime, pid, Duration::from_secs(10)).await {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                ended(&mut runtime, pid, Duration::from_secs(10)).await;
            }
        }
    }
    let mut counters = None;
    if let Some(id) = &id {
        shared.exits.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(id);
        // Final once the runtime deleted its own cgroup below it: everything in it ended.
        let delete = remove_runtime_container(&shared, id).await;
        counters = cgroup.as_ref().filter(|_| delete.is_empty()).map(super::held::Held::counters);
        errors.extend(delete);
        errors.extend(remove_cgroups(id));
    }
    if let Some(b) = bundle {
        errors.extend(remove_bundle(b, &worker).await);
    }
    (errors, counters)
}

impl Teardown for Cleanup {
    async fn remove(mut self) -> Removed {
        let runtime = self.runtime.take();
        let (errors, counters) = finish(
            self.shared.clone(),
            self.worker.clone(),
            runtime,
            self.id.take(),
            self.bundle.take(),
            self.cgroup.take(),
        )
        .await;
        self.held = None;
        self.entry = None;
        Removed { errors, by_others: Vec::new(), counters }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some(entry) = self.entry.take() else { return };
        if let Some(id) = self.id.clone() {
            // The init stops its command within the grace and exits on SIGTERM.
            // A std command: a drop may come without a runtime.
            let _ = std::process::Command::new(&self.shared.runtime)
                .arg("--root")
                .arg(&self.shared.state)
                .args(["kill", &id, "TERM"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .and_then(|mut c| c.wait());
        }
        let shared = self.shared.clone();
        let (worker, runtime, id, bundle) =
            (self.worker.clone(), self.runtime.take(), self.id.take(), self.bundle.take());
        let (held, cgroup) = (self.held.take(), self.cgroup.take());
        let attempt = entry.id.clone();
        let removal = async move {
            let (errors, _) = finish(shared, worker, runtime, id, bundle, cgroup).await;
            drop(held);
            if !errors.is_empty() {
                tracing::warn!(attempt_id = %entry.id, ?errors, "backstop cleanup left things behind");
            }
        };
        if !self.shared.base.backstop(removal) {
            tracing::warn!(attempt_id = %attempt, "attempt dropped without a runtime; reclaim will remove what it made");
        }
    }
}
