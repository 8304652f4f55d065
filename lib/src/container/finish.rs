//! The end of an attempt as the container rung sees it: the engine's state when no verified
//! record arrived (its exit code, its OOM flag, whether someone removed the container), and
//! the rung's evidence and bounds for the judge (`attempt::Site::account`).

use super::ledger::Own;
use super::site::ContainerSite;
use crate::attempt::Ledger;
use crate::contract::{CacheUse, Evidence, Exit};
use crate::engine::ContainerState;
use crate::link::claims::{self, Bounds};
use crate::link::judgement::{Account, Witness};
use crate::link::supervise::Ended;
use std::time::Duration;

/// How long the rung waits for the engine to see the container's end once the link ended
/// without the init's last frame: the attach's end can come a moment before the engine's
/// state says so, and the judgement needs the engine's exit code and OOM flag.
const END_SEEN_WITHIN: Duration = Duration::from_secs(5);

/// What the engine says of the container, before it is removed. Once the init's last frame
/// arrived the link is the verdict and nothing is asked (`ARCHITECTURE.md`, "Judging");
/// without it the engine's own state is the only witness left, read once the container ended
/// (bounded by [`END_SEEN_WITHIN`]).
pub(crate) async fn witness(site: &ContainerSite, own: &Own, link_verdict: bool) -> Witness {
    if link_verdict {
        return Witness { why_no_record: "no record from the init", ..Witness::default() };
    }
    let inspect = || async {
        match site.engine.api.inspect_container(&own.container_id).await {
            Ok(s) => Some(s),
            Err(e) if e.is_not_found() => None,
            Err(e) => {
                tracing::warn!(error = %e, "inspecting the container failed");
                Some(ContainerState::default())
            }
        }
    };
    let mut state = inspect().await;
    // Running, or ended without its exit code recorded yet (Podman shows that state for a
    // moment): the engine's wait says when it ended, and how.
    if state.as_ref().is_some_and(|s| s.running || s.exit_code.is_none()) {
        let waited = tokio::time::timeout(END_SEEN_WITHIN, site.engine.api.wait_exit(&own.container_id)).await;
        state = inspect().await;
        if let (Some(s), Ok(Ok(code))) = (&mut state, waited) {
            s.exit_code = s.exit_code.or(Some(code));
        }
    }
    Witness {
        removed_externally: state.as_ref().is_none_or(|s| s.removing),
        // stevedore's init never exits above 128 by itself: such a code is a signal from outside.
        exit: match state.as_ref().and_then(|s| s.exit_code) {
            Some(c) if c > 128 => Exit::Signal((c - 128) as i32),
            _ => Exit::Unknown,
        },
        oom_killed: state.as_ref().and_then(|s| s.oom_killed),
        why_no_record: "no record from the init",
        ..Witness::default()
    }
}

/// What the parked init said it read ahead, in words.
fn read_ahead_note(ra: &stevedore_init::warm::ReadAhead) -> String {
    if ra.failed {
        return "read ahead: the parked init's reader could not run; nothing was read ahead".into();
    }
    format!(
        "read ahead: the parked init looked up {} program name(s) and read {} file(s), {} bytes, as uid {} in {} ms \
         before the claim (the programs the pool's last attempts ran; the pages read are in this sandbox's memory \
         counters){}",
        ra.names,
        ra.files,
        ra.bytes,
        ra.uid,
        ra.ms,
        if ra.cut { "; cut short by its bound or the claim" } else { "" }
    )
}

/// The rung's evidence, and the bounds the record's claims are checked against.
pub(crate) fn account(site: &ContainerSite, ledger: &Ledger<Own>, ended: &Ended, ev: &mut Evidence) -> Account {
    let cfg = &site.config;
    let engine = site.engine.facts();
    let own = &ledger.own;
    ev.container_id = Some(own.container_id.clone());
    ev.image = Some(own.image_ref.clone());
    ev.image_id = Some(own.image_id.clone());
    ev.engine_version = Some(engine.engine_version.clone());
    ev.api_version = Some(engine.api_version.clone());
    ev.runtime = Some(cfg.runtime.clone().unwrap_or_else(|| engine.default_runtime.clone()));
    ev.init = Some(format!("{} (init sha256:{})", own.tools_volume, own.tools_digest));
    ev.warm = own.warm;
    if own.warm == Some(true) {
        ev.notes.push(
            "warm: the container was created and started ahead, its init parked; the wall time and the command's \
             usage start at the Start frame (the parked init's own idle CPU and ~1 MiB are in the cgroup's counters)"
                .into(),
        );
    }
    let record = ended.record.as_ref().and_then(|r| r.as_ref().ok());
    if let Some(r) = record {
        super::pool::learn(site, &own.image_ref, r.program_name.as_deref(), r.program.as_deref());
        if let Some(ra) = r.read_ahead.as_ref().filter(|_| own.warm == Some(true)) {
            ev.notes.push(read_ahead_note(ra));
        }
    }
    let measured = record.map(|r| r.measured.clone()).unwrap_or_default();
    for (name, volume, path) in &own.caches {
        let bytes = measured.iter().find(|m| &m.path == path).map(|m| m.seen.written_bytes);
        ev.caches.insert(name.clone(), CacheUse { volume: volume.clone(), path: path.clone(), bytes });
    }
    let ncpu = engine.ncpu.max(1) as f64;
    let cpus = own.cpu_millis.map_or(ncpu, |m| m as f64 / 1000.0);
    Account {
        expects_handler: ledger.expects_handler,
        bounds: Bounds {
            host_wall: ended.host_wall,
            cpus: cpus.min(ncpu),
            memory: own.memory,
            cpu_limit_millis: own.cpu_millis,
            reserve: site.config.link.delivery_reserve,
            cgroup_note: claims::CONTAINER_CGROUP,
        },
        disk_limit: Some(own.disk),
        hard_stop: "the container was SIGKILLed",
        no_peak_memory: None,
    }
}
