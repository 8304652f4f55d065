//! What a Pod is made with: the limits resolved by the one rule every rung follows
//! (`contract::limits::resolve`), over this rung's fallback (pure).

use super::config::KubeConfig;
use crate::contract::limits::{self, RungLimits};
use crate::contract::{NarrowedLimit, ResourceLimits};
use std::collections::BTreeMap;

/// What a Pod cannot enforce per attempt.
const CANNOT: &[(&str, &str)] = &[("pids", "Kubernetes limits processes per node (podPidsLimit), not per Pod")];

/// One attempt's Pod, sized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sizes {
    pub memory: u64,
    pub cpu_millis: Option<u64>,
    /// Bytes in `/out`.
    pub disk: u64,
    /// Size of `/tmp` (memory-backed: never above the memory limit).
    pub tmp: u64,
    pub nofile: u64,
    pub gpus: Option<u64>,
    pub narrowed: Vec<NarrowedLimit>,
    /// What was asked that a Pod cannot enforce.
    pub skipped: BTreeMap<String, String>,
}

/// The request's limits on this rung.
pub(crate) fn of(req: &ResourceLimits, cfg: &KubeConfig) -> Sizes {
    let rung = RungLimits {
        defaults: &cfg.defaults,
        ceilings: &cfg.ceilings,
        fallback: &super::config::FALLBACK,
        cannot: CANNOT,
    };
    let a = limits::resolve(req, rung);
    let l = a.limits;
    let given = |v: Option<u64>, fallback: Option<u64>| v.or(fallback).unwrap_or(0);
    let memory = given(l.memory_bytes, super::config::FALLBACK.memory_bytes);
    Sizes {
        memory,
        cpu_millis: l.cpu_millis,
        disk: given(l.disk_bytes, super::config::FALLBACK.disk_bytes),
        tmp: cfg.max_tmp_bytes.min(memory),
        nofile: given(l.nofile, super::config::FALLBACK.nofile),
        gpus: l.gpu_millis.map(|m| m.div_ceil(1000)),
        narrowed: a.narrowed,
        skipped: a.skipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::limits::Limits;

    #[test]
    fn never_unlimited_and_pids_are_said_to_be_skipped() {
        let cfg = KubeConfig::default();
        let a = of(&ResourceLimits::new(), &cfg);
        assert_eq!((a.memory, a.disk, a.nofile, a.cpu_millis, a.tmp), (1 << 30, 512 << 20, 4096, None, 256 << 20));
        assert!(a.skipped.is_empty(), "no pids asked, none configured: nothing to say");
        let b = of(&ResourceLimits::new().with("pids", 64).with("memory", 32 << 20).with("gpu", 1200), &cfg);
        assert!(b.skipped["pids"].contains("64 asked, not enforced"), "{:?}", b.skipped);
        assert_eq!((b.memory, b.tmp, b.gpus), (32 << 20, 32 << 20, Some(2)));
        let narrow = KubeConfig::default().ceilings(Limits::NONE.memory(16 << 20));
        assert_eq!(of(&ResourceLimits::new().with("memory", 1 << 30), &narrow).narrowed.len(), 1);
    }
}
