//! Phase 4 of an attempt: the container rung's evidence, and what it knows without a record
//! (the engine's exit state and OOM flag); the rest is the link's (`link::judgement`).

use super::cleanup::Removed;
use super::executor::Shared;
use super::ledger::Ledger;
use crate::contract::{Evidence, Exit, Judgement, Request};
use crate::engine::ContainerState;
use crate::link::claims::{self, Bounds};
use crate::link::judgement::{self, Frame, Witness};
use crate::link::reports::Delivered;
use crate::link::supervise::Ended;

/// The judge's inputs, and whether the handler runner never spoke the protocol.
pub(crate) struct Assessed {
    pub judgement: Judgement,
    pub handler_silent: bool,
}

pub(crate) fn assess(
    shared: &Shared,
    req: &Request,
    ledger: &Ledger,
    ended: Ended,
    state: Option<ContainerState>,
    removed: Removed,
    delivered: Option<Delivered>,
) -> Assessed {
    let cfg = &shared.config;
    let facts_e = shared.engine.facts();
    let mut ev = Evidence {
        executor: cfg.name.clone(),
        level: Some(cfg.level()),
        worker: req.worker_id.clone(),
        incarnation: shared.incarnation.clone(),
        started_at_unix_ms: Some(ledger.started_ms),
        finished_at_unix_ms: Some(crate::contract::unix_ms_now()),
        container_id: Some(ledger.container_id.clone()),
        image: Some(ledger.image_ref.clone()),
        image_id: Some(ledger.image_id.clone()),
        engine_version: Some(facts_e.engine_version.clone()),
        api_version: Some(facts_e.api_version.clone()),
        runtime: Some(cfg.runtime.clone().unwrap_or_else(|| facts_e.default_runtime.clone())),
        enforcement: ledger.enforcement.clone(),
        skipped: ledger.skipped.clone(),
        limits_narrowed: ledger.narrowed.clone(),
        env_overrides: ledger.env_overrides.clone(),
        ports: ledger.ports.clone(),
        init: Some(format!("volume {} (init sha256:{})", ledger.tools_volume, ledger.tools_digest)),
        inputs: ledger.inputs.clone(),
        warm: ledger.warm,
        ..Evidence::default()
    };
    if ledger.warm == Some(true) {
        ev.notes.push(
            "warm: the container was created and started ahead, its init parked; the wall time and the command's \
             usage start at the Start frame (the parked init's own idle CPU and ~1 MiB are in the cgroup's counters)"
                .into(),
        );
    }
    for err in &removed.errors {
        ev.notes.push(format!("cleanup: {err}"));
    }
    let measured = ended.record.as_ref().and_then(|r| r.as_ref().ok()).map(|r| r.measured.clone()).unwrap_or_default();
    for (name, volume, path) in &ledger.caches {
        let bytes = measured.iter().find(|m| &m.path == path).map(|m| m.seen.written_bytes);
        ev.caches.insert(name.clone(), crate::contract::CacheUse { volume: volume.clone(), path: path.clone(), bytes });
    }
    let ncpu = facts_e.ncpu.max(1) as f64;
    let cpus = ledger.cpu_millis.map_or(ncpu, |m| m as f64 / 1000.0);
    let frame = Frame {
        expects_handler: ledger.expects_handler,
        bounds: Bounds {
            host_wall: ended.host_wall,
            cpus: cpus.min(ncpu),
            memory: ledger.memory,
            cgroup_note: claims::CONTAINER_CGROUP,
        },
        disk_limit: Some(ledger.disk),
        hard_stop: "the container was SIGKILLed",
    };
    let witness = Witness {
        removed_externally: state.is_none()
            || state.as_ref().is_some_and(|s| s.removing)
            || removed.by_others.iter().any(|c| c == &ledger.name),
        // stevedore's init never exits above 128 by itself: such a code is a signal from outside.
        exit: match state.as_ref().and_then(|s| s.exit_code) {
            Some(c) if c > 128 => Exit::Signal((c - 128) as i32),
            _ => Exit::Unknown,
        },
        oom_killed: state.as_ref().and_then(|s| s.oom_killed),
        why_no_record: "no record from the init",
    };
    let (judgement, handler_silent) = judgement::judgement(&ended, &frame, witness, delivered, ev);
    Assessed { judgement, handler_silent }
}
