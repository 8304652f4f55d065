//! What a container is made with: the limits resolved by the one rule every rung follows
//! (`contract::limits::resolve`), over this rung's fallback, in the engine's terms (pure).

use super::config::ContainerConfig;
use crate::contract::limits::{self, RungLimits};
use crate::contract::{NarrowedLimit, ResourceLimits};

/// One attempt's container, sized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sizes {
    /// Memory in bytes (swap off).
    pub memory: u64,
    /// Processes.
    pub pids: u64,
    /// Bytes in `/out`.
    pub disk: u64,
    /// CPU in millicores, if capped.
    pub cpu_millis: Option<u64>,
    /// Open files.
    pub nofile: u64,
    /// Size of `/tmp` (a tmpfs: it counts as memory, so never above it).
    pub tmp: u64,
    /// Whole GPUs, if any.
    pub gpus: Option<u64>,
    /// What the request asked above a ceiling.
    pub narrowed: Vec<NarrowedLimit>,
}

/// The request's limits on this rung.
pub(crate) fn of(req: &ResourceLimits, cfg: &ContainerConfig) -> Sizes {
    let rung = RungLimits {
        defaults: &cfg.defaults,
        ceilings: &cfg.ceilings,
        fallback: &super::config::FALLBACK,
        cannot: &[],
    };
    let a = limits::resolve(req, rung);
    let l = a.limits;
    // `resolve` fills these from the fallback (a ceiling only lowers them): never `None`.
    let given = |v: Option<u64>, fallback: Option<u64>| v.or(fallback).unwrap_or(0);
    let memory = given(l.memory_bytes, super::config::FALLBACK.memory_bytes);
    Sizes {
        memory,
        pids: given(l.pids, super::config::FALLBACK.pids),
        disk: given(l.disk_bytes, super::config::FALLBACK.disk_bytes),
        cpu_millis: l.cpu_millis,
        nofile: given(l.nofile, super::config::FALLBACK.nofile),
        tmp: cfg.max_tmp_bytes.min(memory),
        gpus: l.gpu_millis.map(|m| m.div_ceil(1000)),
        narrowed: a.narrowed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::limits::Limits;

    #[test]
    fn defaults_are_never_unlimited() {
        let cfg = ContainerConfig::default();
        let a = of(&ResourceLimits::new(), &cfg);
        assert_eq!((a.memory, a.pids, a.disk, a.nofile, a.cpu_millis), (1 << 30, 512, 512 << 20, 4096, None));
        assert_eq!(a.tmp, 256 << 20);
        let small = of(&ResourceLimits::new().with("memory", 64 << 20), &cfg);
        assert_eq!(small.tmp, 64 << 20, "/tmp no larger than the memory limit");
    }

    #[test]
    fn ceilings_narrow_and_say_so() {
        let cfg = ContainerConfig::default().ceilings(Limits::NONE.memory(128 << 20).pids(100));
        let a = of(&ResourceLimits::new().with("memory", 1 << 30).with("gpu", 1500), &cfg);
        assert_eq!(a.memory, 128 << 20);
        assert_eq!(
            a.narrowed,
            vec![NarrowedLimit { key: "memory".into(), from: 1 << 30, to: 128 << 20, why: "profile ceiling".into() }]
        );
        assert_eq!(a.gpus, Some(2));
        // The fallback is under the ceiling too, and nothing asked was narrowed for it.
        assert_eq!(a.pids, 100);
    }

    #[test]
    fn a_default_fills_only_what_is_left_out() {
        let cfg = ContainerConfig::default().defaults(Limits::NONE.memory(256 << 20).cpu(500));
        let a = of(&ResourceLimits::new().with("memory", 64 << 20), &cfg);
        assert_eq!((a.memory, a.cpu_millis), (64 << 20, Some(500)));
    }
}
