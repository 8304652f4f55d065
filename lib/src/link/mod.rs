//! The host side of the link to stevedore's init (`docs/link.md`): the frames the host
//! sends, the reader that routes the init's frames, the command's captures and live output,
//! and the checks on the init's record. Shared by every rung that runs the init.

mod capture;
pub(crate) mod claims;
pub(crate) mod convert;
#[cfg(any(feature = "process", feature = "oci"))]
pub(crate) mod inherit;
pub(crate) mod judgement;
pub(crate) mod reports;
pub(crate) mod session;
#[cfg(any(feature = "docker", feature = "kube"))]
pub(crate) mod stage;
pub(crate) mod stdin;
pub(crate) mod supervise;

pub(crate) use capture::{CappedLog, LiveSink};
pub use supervise::{Collection, HostLoss};

use crate::outputs::Caps;
use std::time::Duration;

/// The delivery reserve a rung applies unless configured otherwise
/// ([`LinkConfig::delivery_reserve`]).
pub const DELIVERY_RESERVE: u64 = 8 << 20;

/// The largest inputs that travel over the link by default (`docs/outcome.md`, "Inputs over
/// the link"): past this the engine's archive upload, or the kube rung's init container, which
/// stream to disk without a frame per chunk, are as fast.
#[cfg(any(feature = "docker", feature = "kube"))]
pub const LINK_INPUTS_MAX_BYTES: u64 = 256 << 20;

/// The evidence's `memory` line where the cgroup's limit is the attempt's `memory` plus the
/// init's delivery `reserve` (the container and kube rungs; `how`: the rung's own words on
/// swap and how the limit was set).
#[cfg(any(feature = "docker", feature = "kube"))]
pub(crate) fn memory_limit_text(memory: u64, reserve: u64, how: &str) -> String {
    match reserve {
        0 => format!("cgroup memory limit {memory} bytes, {how}"),
        r => format!(
            "cgroup memory limit {} bytes: the attempt's {memory}, and {r} the init holds until the command and \
             every process it started are gone, then lets go to deliver the outputs; {how}",
            memory.saturating_add(r)
        ),
    }
}

/// The cgroup limits a rung applied through an engine it does not control (the container's,
/// the kubelet's), for the init to read back before the command (`wire::Start::held`): only
/// those the evidence claims enforced (one already skipped is refused before the launch).
#[cfg(any(feature = "docker", feature = "kube"))]
pub(crate) fn held(
    memory: u64,
    pids: Option<u64>,
    cpu_millis: Option<u64>,
    enforcement: &std::collections::BTreeMap<String, String>,
) -> Vec<stevedore_init::wire::Held> {
    use stevedore_init::wire::{Held, HeldLimit};
    [(HeldLimit::Memory, Some(memory)), (HeldLimit::Pids, pids), (HeldLimit::Cpu, cpu_millis)]
        .into_iter()
        .filter_map(|(limit, at_most)| Some(Held { limit, at_most: at_most? }))
        .filter(|h| enforcement.contains_key(h.limit.name()))
        .collect()
}

/// How every rung that runs the init keeps its link: the captures, the outputs, the times.
/// The same on every rung (`ContainerConfig::link`, `ProcessConfig::link`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinkConfig {
    /// Bytes of each stream kept on disk (default 4 MiB).
    pub log_cap_bytes: u64,
    /// Caps on outputs.
    pub output_caps: Caps,
    /// How long the outputs may take to come back (default: 30 s, plus a second per 32 MiB).
    pub collection: Collection,
    /// Past the grace, how long the init gets before the rung stops everything itself
    /// (default 2 s).
    pub kill_margin: Duration,
    /// How long a handler runner has to answer the protocol (default 10 s).
    pub handshake_timeout: Duration,
    /// The host's liveness, as the init sees it.
    pub host_loss: HostLoss,
    /// How often the init samples the attempt's resources at first (`usage.timeline`,
    /// default 100 ms; at least 10 ms); `None`: no timeline.
    pub timeline_period: Option<Duration>,
    /// Bytes the init holds in the attempt's cgroup while the command runs and lets go for
    /// the delivery of the record and the outputs, added to the cgroup's memory limit by the
    /// rungs whose `/out` and `/tmp` are memory-backed (the container and kube rungs), so a
    /// command that fills its memory leaves room to deliver what it wrote (default 8 MiB;
    /// 0: none, and such an attempt may lose its outputs, told as `outputs_lost`).
    /// `docs/outcome.md`, "Memory and the delivery reserve".
    pub delivery_reserve: u64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            log_cap_bytes: 4 << 20,
            output_caps: Caps::default(),
            collection: Collection::default(),
            kill_margin: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(10),
            host_loss: HostLoss::default(),
            timeline_period: Some(Duration::from_millis(crate::contract::TIMELINE_FIRST_PERIOD_MS)),
            delivery_reserve: DELIVERY_RESERVE,
        }
    }
}
