//! The end of an attempt as the kube rung sees it: the kubelet's word on the attempt's
//! container (its exit code, `OOMKilled`, whether someone deleted the Pod), read before the
//! removal, and the rung's evidence and bounds for the judge (`attempt::Site::account`).
//!
//! Judging (`ARCHITECTURE.md`, "Judging"): once the init's last frame arrived, the link is the
//! verdict, and the kubelet's `OOMKilled` is evidence only (on cgroup v1 it says so when any
//! process of the container was killed: a memory hog's child, the shell going on, exit code
//! 0). When the link ended without it, the kubelet has the kernel's word the init could not
//! give: the rung waits (bounded) for the kubelet to report the container terminated, and an
//! init that was itself SIGKILLed while the kubelet says `OOMKilled` is an OOM kill, named
//! `kubelet` in `usage.sources`.

use super::error::ClusterError;
use super::ledger::Own;
use super::site::KubeSite;
use super::state;
use super::watch::Look;
use crate::attempt::Ledger;
use crate::contract::{Evidence, Exit};
use crate::link::claims::Bounds;
use crate::link::judgement::{Account, OomWitness, Witness};
use crate::link::supervise::Ended;
use std::time::Duration;

/// What `claims` says the usage figures are, on this rung.
const POD_CGROUP: &str = "usage read by the init from its container's cgroup after the command and its stragglers \
    ended: cpu of the whole container, memory high-water mark (the memory-backed /out and /tmp included), oom_kill \
    count; the Pod's init container is not counted";

/// How long the rung waits for the kubelet to report the attempt's container terminated, once
/// the link ended without the init's last frame: a 1.20 kubelet sees a container's end at its
/// next relist (every second) and then updates the Pod's status.
const END_SEEN_WITHIN: Duration = Duration::from_secs(10);

/// What the kubelet says of the attempt's container, before the Pod is removed: read once
/// when the link is the verdict (`link_verdict`), else followed until the kubelet reports the
/// container's end (bounded by [`END_SEEN_WITHIN`]).
pub(crate) async fn witness(site: &KubeSite, own: &Own, link_verdict: bool) -> Witness {
    let ours = site.hard_stopped.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(&own.pod);
    let read = if link_verdict {
        // Evidence only: the link is the verdict.
        site.cached_pod(&own.pod).await
    } else {
        let ended = super::watch::until(site, &own.pod, END_SEEN_WITHIN, |pod| match pod {
            Some(p) if state::main_end(p).exit_code.is_none() => Look::Wait("the kubelet to report the end".into()),
            other => Look::Done(other.cloned()),
        })
        .await;
        match ended {
            Ok(p) => Ok(p),
            // Not seen within the bound: judged from what the Pod says now.
            Err(ClusterError::StartTimeout { .. }) => site.get_pod(&own.pod).await,
            Err(e) => Err(e),
        }
    };
    let pod = match read {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "reading the Pod at the end failed");
            return Witness {
                why_no_record: "no record from the init",
                oom_by: OomWitness::Kubelet,
                ..Witness::default()
            };
        }
    };
    let end = pod.as_ref().map(state::main_end);
    *own.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = end.clone();
    // A Pod deleted by someone else: its kubelet TERMs the init first, which then stops the
    // command and still sends its record, so this is said whether or not a record came.
    let deleted = pod.as_ref().is_none_or(|p| p.metadata.deletion_timestamp.is_some());
    if link_verdict {
        return Witness {
            removed_externally: deleted && !ours,
            why_no_record: "no record from the init",
            oom_by: OomWitness::Kubelet,
            ..Witness::default()
        };
    }
    let exit_code = end.as_ref().and_then(|e| e.exit_code);
    Witness {
        removed_externally: deleted && !ours,
        // stevedore's init never exits above 128 by itself: such a code is a signal from outside.
        exit: match exit_code {
            Some(c) if c > 128 => Exit::Signal(c - 128),
            _ => Exit::Unknown,
        },
        oom_killed: end.as_ref().map(|e| e.oom_killed && exit_code == Some(137)),
        oom_by: OomWitness::Kubelet,
        why_no_record: "no record from the init",
        ..Witness::default()
    }
}

/// The rung's evidence, and the bounds the record's claims are checked against.
pub(crate) fn account(site: &KubeSite, ledger: &Ledger<Own>, ended: &Ended, ev: &mut Evidence) -> Account {
    let own = &ledger.own;
    let seen = own.seen();
    ev.pod = Some(format!("{}/{}", own.namespace, own.pod));
    ev.image = Some(own.image.clone());
    ev.engine_version = Some(format!("kubernetes {}", site.server_version));
    ev.api_version = Some("v1".into());
    ev.runtime = Some(site.config.runtime_class.clone().unwrap_or_else(|| "the cluster's default".into()));
    ev.init = Some(format!(
        "image {} copied by init container {} into an emptyDir (init sha256:{})",
        own.init_image,
        super::spec::PREPARE,
        crate::sandbox::init_binary::sha256()
    ));
    if let Some(waited) = &own.waited {
        ev.notes.push(waited.clone());
    }
    if let Some(end) = &seen {
        ev.container_id = end.container_id.clone();
        if end.container_id.is_none() {
            // The attach is made as soon as the runtime runs the container, and the Pod deleted
            // at the init's last frame: a short attempt can end before the kubelet's relist.
            ev.notes.push("the kubelet had not reported the attempt's container id when it ended".into());
        }
        ev.node = end.node.clone();
        ev.image_id = end.image_id.clone();
        if let Some(why) = &end.pod_ended_by {
            ev.notes.push(format!("the kubelet ended the Pod itself: {why}"));
        }
        if end.oom_killed {
            ev.notes.push(format!(
                "the kubelet said OOMKilled (exit code {}): the init's cgroup count is the verdict when its record \
                 came, the kubelet's word when it did not",
                end.exit_code.map_or_else(|| "unknown".into(), |c| c.to_string())
            ));
        }
    }
    ev.notes.push(format!(
        "the image's ENV and WORKDIR come from the runtime, below every other layer (the API shows neither), with \
         the kubelet's own variables (KUBERNETES_SERVICE_HOST and the like): env_overrides name only the layers \
         stevedore set; the image's values of {} do not reach the command (the init's libc reads them, so they are \
         empty for it)",
        stevedore_init::wire::env::INIT_READS.join(", ")
    ));
    // `/out` is a tmpfs of the sizeLimit only where the cluster sizes memory-backed volumes.
    let out_fs = ended.record.as_ref().and_then(|r| r.as_ref().ok()).and_then(|r| r.out_fs.clone());
    let sized = out_fs.as_ref().map(|fs| fs.total_bytes.abs_diff(own.disk) <= (1 << 20).max(own.disk / 100));
    let disk_limit = match sized {
        Some(true) | None => Some(own.disk),
        Some(false) => {
            let total = out_fs.map_or(0, |f| f.total_bytes);
            ev.enforcement.remove("disk");
            ev.skipped.insert(
                "disk".into(),
                format!(
                    "/out is a tmpfs of {total} bytes, not the {} asked: this cluster does not size memory-backed \
                     emptyDirs (feature SizeMemoryBackedVolumes), so the limit is enforced only by eviction, after \
                     the fact",
                    own.disk
                ),
            );
            None
        }
    };
    let cpus = own.cpu_millis.map_or(1024.0, |m| m as f64 / 1000.0);
    Account {
        expects_handler: ledger.expects_handler,
        bounds: Bounds {
            host_wall: ended.host_wall,
            cpus,
            memory: own.memory,
            cpu_limit_millis: own.cpu_millis,
            reserve: site.config.link.delivery_reserve,
            cgroup_note: POD_CGROUP,
        },
        disk_limit,
        hard_stop: "the Pod was deleted (the kubelet SIGKILLs what is left after a second)",
        no_peak_memory: None,
    }
}
