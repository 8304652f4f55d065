//! What a previous life of this worker left in the process rung: attempts' dirs, their
//! inits (still running within a host-loss grace nobody came back for) and cgroups.

use super::cgroup::Cgroup;
use super::config::Delegation;
use super::dirs::AttemptDir;
use super::site::ProcessSite;
use super::tree::{PID_FILE, kill_tree, start_ticks, wait_gone};
use crate::contract::{ObjectKind, ReclaimError, ReclaimFailure, ReclaimReport, valid_worker_id};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The name of `worker`'s attempt `attempt_id` (its dir, its cgroup):
/// `<worker, its first 40 characters>-<12 hex of the whole id's SHA-256>-<attempt id>`. Ids
/// may be 128 characters and a name must stay short; the hash makes it the whole id's, so
/// two workers whose ids share their first 40 characters never take each other's.
pub(crate) fn attempt_name(worker: &str, attempt_id: &str) -> String {
    format!("{}-{}-{attempt_id}", &worker[..worker.len().min(40)], worker_hash(worker))
}

fn worker_hash(worker: &str) -> String {
    use sha2::Digest;
    crate::util::hex(&sha2::Sha256::digest(worker.as_bytes())[..6])
}

/// The attempt id of `name` when it is one of `worker`'s attempts ([`attempt_name`]; or, for an
/// id of 40 characters at most, `<worker>-<12 hex>` as older versions named them, which held
/// the whole id).
pub(crate) fn attempt_of(name: &str, worker: &str) -> Option<String> {
    let id = |rest: &str| (rest.len() == 12 && rest.bytes().all(|b| b.is_ascii_hexdigit())).then(|| rest.to_owned());
    let prefix = format!("{}-{}-", &worker[..worker.len().min(40)], worker_hash(worker));
    if let Some(rest) = name.strip_prefix(prefix.as_str()) {
        return id(rest);
    }
    name.strip_prefix(worker).and_then(|r| r.strip_prefix('-')).filter(|_| worker.len() <= 40).and_then(id)
}

/// The cgroups an attempt named `name` may have under `how`.
fn cgroups_of(how: &Delegation, name: &str) -> Vec<Cgroup> {
    let root = Path::new("/sys/fs/cgroup");
    match how {
        Delegation::Auto => {
            let v1 = |c: &str| root.join(c).join("stevedore-process").join(name);
            vec![
                Cgroup::V1 { memory: v1("memory"), cpu: v1("cpu"), cpuacct: v1("cpuacct"), pids: v1("pids") },
                Cgroup::V2(root.join("stevedore-process").join(name)),
            ]
        }
        Delegation::V2(base) => vec![Cgroup::V2(base.join(name))],
        _ => Vec::new(),
    }
}

pub(crate) async fn reclaim(shared: &ProcessSite, worker: &str) -> Result<ReclaimReport, ReclaimError> {
    if !valid_worker_id(worker) {
        return Err(ReclaimError::WorkerId(worker.to_owned()));
    }
    let mut report = ReclaimReport { worker: worker.to_owned(), ..ReclaimReport::default() };
    let in_flight = shared.base.in_flight().clone();
    crate::attempt::reclaim_captures(&shared.base, worker, &in_flight, &mut report);
    let Ok(entries) = std::fs::read_dir(&shared.attempts) else { return Ok(report) };
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
        let Some(id) = attempt_of(&name, worker) else { continue };
        if in_flight.contains(&id) {
            report.kept_in_flight.push(name);
            continue;
        }
        let root: PathBuf = shared.attempts.join(&name);
        let cgroups = cgroups_of(&shared.config.cgroup, &name);
        let mut uid = None;
        if let Ok(pidfile) = std::fs::read_to_string(root.join(PID_FILE)) {
            let mut it = pidfile.split_whitespace().filter_map(|w| w.parse::<u64>().ok());
            let (pid, ticks) = (it.next(), it.next());
            uid = it.next().and_then(|u| u32::try_from(u).ok());
            if let (Some(pid), Some(ticks)) = (pid, ticks)
                && start_ticks(pid as i32) == Some(ticks)
            {
                // A SIGTERM makes the init stop its command within the grace and exit.
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
                wait_gone(pid as i32, ticks, Duration::from_secs(10), None).await;
                kill_tree(pid as i32, None);
            }
        }
        for c in &cgroups {
            if c.procs().is_empty() && !c.remove().is_empty() {
                continue;
            }
        }
        // The attempt's own uid: what it left (processes, files in the shared dirs) goes, and
        // the uid can be leased again.
        if let (Some(uids), Some(uid)) = (shared.uids.clone(), uid) {
            let swept = tokio::task::spawn_blocking(move || uids.reclaim(uid)).await;
            let why = match swept {
                Ok(Ok(true)) => None,
                Ok(Ok(false)) => {
                    Some("it still holds something (a process, a file in a shared dir, an IPC object)".into())
                }
                Ok(Err(e)) => Some(crate::util::error_chain(&e)),
                Err(e) => Some(e.to_string()),
            };
            if let Some(error) = why {
                report.failed.push(ReclaimFailure { kind: ObjectKind::Path, id: format!("uid {uid}"), error });
            }
        }
        let dir =
            AttemptDir { input: root.join("in"), output: root.join("out"), tmp: root.join("tmp"), root: root.clone() };
        match tokio::task::spawn_blocking(move || dir.remove()).await {
            Ok(Ok(())) => report.paths_removed.push(root.display().to_string()),
            Ok(Err(e)) => report.failed.push(ReclaimFailure {
                kind: ObjectKind::Path,
                id: root.display().to_string(),
                error: crate::util::error_chain(&e),
            }),
            Err(e) => report.failed.push(ReclaimFailure {
                kind: ObjectKind::Path,
                id: root.display().to_string(),
                error: e.to_string(),
            }),
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 41, 4: ids may be 128 characters, and names were cut to 40: two workers sharing
    /// their first 40 took each other's attempts for their own.
    #[test]
    fn workers_sharing_their_first_40_characters_are_told_apart() {
        let a = format!("{}-a", "w".repeat(40));
        let b = format!("{}-b", "w".repeat(40));
        let of_a = attempt_name(&a, "0123456789ab");
        assert_eq!(attempt_of(&of_a, &a).as_deref(), Some("0123456789ab"));
        assert_eq!(attempt_of(&of_a, &b), None, "b's reclaim must not take a's attempt");
        assert_eq!(attempt_of(&attempt_name(&b, "0123456789ab"), &a), None);
        assert!(of_a.len() <= 70 && crate::hostdir::safe_name(&of_a), "{of_a}");
        // An older name of a 128-character id (cut to 40) is no one's.
        assert_eq!(attempt_of(&format!("{}-0123456789ab", &a[..40]), &a), None);
    }

    #[test]
    fn only_this_workers_attempts_are_its() {
        assert_eq!(attempt_of(&attempt_name("w", "0123456789ab"), "w").as_deref(), Some("0123456789ab"));
        assert_eq!(attempt_of(&attempt_name("w-x", "0123456789ab"), "w"), None);
        assert_eq!(attempt_of(&attempt_name("w", "0123456789ab"), "w-x"), None);
        assert_eq!(attempt_of("w-0123456789ab", "w").as_deref(), Some("0123456789ab"), "an older name");
        assert_eq!(attempt_of("w-x-0123456789ab", "w"), None, "another worker's (w-x)");
        assert_eq!(attempt_of("w-0123456789ab", "w-x"), None);
        assert_eq!(attempt_of("w-0123", "w"), None);
        assert_eq!(attempt_of("w-0123456789zz", "w"), None);
    }
}
