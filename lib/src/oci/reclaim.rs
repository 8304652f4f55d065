//! What a previous life of this worker left on the oci rung: bundles (named for the whole
//! worker id by its hash, with an owner marker inside), the runtime's containers of the same
//! names, their cgroups. The captures as on every rung.

use super::site::OciSite;
use crate::contract::{ObjectKind, ReclaimError, ReclaimFailure, ReclaimReport, valid_worker_id};

/// The name of `worker`'s attempt `attempt_id` (its runtime container, bundle and cgroup):
/// `<worker, its first 40 characters>-<12 hex of the whole id's SHA-256>-<attempt id>`, so two
/// workers whose ids share a long prefix never take each other's.
pub(crate) fn attempt_name(worker: &str, attempt_id: &str) -> String {
    format!("{}-{}-{attempt_id}", prefix(worker), worker_hash(worker))
}

fn prefix(worker: &str) -> &str {
    let mut end = worker.len().min(40);
    while !worker.is_char_boundary(end) {
        end -= 1;
    }
    &worker[..end]
}

fn worker_hash(worker: &str) -> String {
    use sha2::Digest;
    crate::util::hex(&sha2::Sha256::digest(worker.as_bytes())[..6])
}

/// The attempt id of `name` when it is one of `worker`'s attempts ([`attempt_name`]).
pub(crate) fn attempt_of(name: &str, worker: &str) -> Option<String> {
    let rest = name.strip_prefix(&format!("{}-{}-", prefix(worker), worker_hash(worker)))?;
    (rest.len() == 12 && rest.bytes().all(|b| b.is_ascii_hexdigit())).then(|| rest.to_owned())
}

pub(crate) async fn reclaim(site: &OciSite, worker: &str) -> Result<ReclaimReport, ReclaimError> {
    if !valid_worker_id(worker) {
        return Err(ReclaimError::WorkerId(worker.to_owned()));
    }
    let mut report = ReclaimReport { worker: worker.to_owned(), ..ReclaimReport::default() };
    let in_flight = site.base.in_flight().clone();
    crate::attempt::reclaim_captures(&site.base, worker, &in_flight, &mut report);
    let Ok(entries) = std::fs::read_dir(&site.bundles) else { return Ok(report) };
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
        let Some(id) = attempt_of(&name, worker) else { continue };
        if in_flight.contains(&id) {
            report.kept_in_flight.push(name);
            continue;
        }
        // Another runtime's container (its state is in that runtime's own dir): removing its
        // bundle under it would leave it running unsupervised.
        if let Some(other) = other_runtime(site, &entry.path()) {
            let why = format!("made by the runtime {other}: reclaim it with --oci-runtime {other}");
            report.failed.push(ReclaimFailure {
                kind: ObjectKind::Path,
                id: entry.path().display().to_string(),
                error: why,
            });
            continue;
        }
        // SIGKILL first: `delete -f` of a running container does the same, and this reaches
        // one whose state says it is still being made.
        let _ = site.runtime_call(&["kill", &name, "KILL"]).await;
        let mut errors = super::cleanup::remove_container(site, &name).await;
        if errors.is_empty() {
            report.containers_removed.push(name.clone());
        }
        let bundle = entry.path();
        let path = bundle.display().to_string();
        errors.extend(super::cleanup::remove_bundle(bundle, worker).await);
        if errors.is_empty() {
            report.paths_removed.push(path);
        } else {
            report.failed.push(ReclaimFailure { kind: ObjectKind::Path, id: path, error: errors.join("; ") });
        }
    }
    Ok(report)
}

/// The runtime a bundle's owner marker names when it is not this rung's. Markers made before
/// the runtime was recorded name none: their state is in `state`, so they are this rung's
/// only when its runtime keeps its state there (runc).
fn other_runtime(site: &OciSite, bundle: &std::path::Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut owner = String::new();
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(bundle.join(super::provision::OWNER_FILE))
        .and_then(|f| f.take(4096).read_to_string(&mut owner))
        .ok()?;
    match owner.lines().nth(2).filter(|r| !r.is_empty()) {
        Some(runtime) => (std::path::Path::new(runtime) != site.runtime).then(|| runtime.to_owned()),
        None => (site.state.file_name() != Some(std::ffi::OsStr::new("state"))).then(|| "runc".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_sharing_a_long_prefix_are_told_apart() {
        let a = format!("{}-a", "w".repeat(40));
        let b = format!("{}-b", "w".repeat(40));
        let of_a = attempt_name(&a, "0123456789ab");
        assert_eq!(attempt_of(&of_a, &a).as_deref(), Some("0123456789ab"));
        assert_eq!(attempt_of(&of_a, &b), None);
        assert!(crate::hostdir::safe_name(&of_a) && of_a.len() <= 70, "{of_a}");
    }
}
