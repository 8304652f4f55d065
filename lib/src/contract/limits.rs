//! Resource limits: the request's map (dimension → amount, the contract's form, custom keys
//! allowed), the typed [`Limits`] everything else uses, and the one rule that resolves what
//! a rung applies (`resolve`). Sizes, CPU amounts and durations as people type them are
//! parsed by `stevedore_parse::limits` (re-exported here).

use super::NarrowedLimit;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
pub use stevedore_parse::limits::{Limits, ParseError, parse_cpus, parse_duration, parse_size};

/// Known limit keys.
pub mod key {
    /// CPU in millicores (1000 = one core).
    pub const CPU: &str = "cpu";
    /// Memory in bytes (swap disabled).
    pub const MEMORY: &str = "memory";
    /// Bytes the attempt may occupy in `/out` and any other writable volume.
    pub const DISK: &str = "disk";
    /// Number of processes (and threads).
    pub const PIDS: &str = "pids";
    /// GPUs in milli-devices, rounded up to whole devices.
    pub const GPU: &str = "gpu";
    /// Open file descriptors per process.
    pub const NOFILE: &str = "nofile";
}

/// A map of dimension → amount. Absent or zero means "no per-job ceiling": the rung
/// applies its own configured default, never "unlimited" by accident.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ResourceLimits(pub BTreeMap<String, u64>);

impl ResourceLimits {
    /// No per-job limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `amount` (builder style).
    pub fn with(mut self, key: &str, amount: u64) -> Self {
        self.0.insert(key.to_owned(), amount);
        self
    }

    /// The amount for `key`, `None` when absent or zero.
    pub fn get(&self, key: &str) -> Option<u64> {
        self.0.get(key).copied().filter(|v| *v > 0)
    }

    /// CPU in millicores.
    pub fn cpu_millis(&self) -> Option<u64> {
        self.get(key::CPU)
    }
    /// Memory in bytes.
    pub fn memory_bytes(&self) -> Option<u64> {
        self.get(key::MEMORY)
    }
    /// Disk in bytes.
    pub fn disk_bytes(&self) -> Option<u64> {
        self.get(key::DISK)
    }
    /// Process count.
    pub fn pids(&self) -> Option<u64> {
        self.get(key::PIDS)
    }
    /// Whole GPU devices (milli-devices rounded up).
    pub fn gpu_devices(&self) -> Option<u64> {
        self.get(key::GPU).map(|m| m.div_ceil(1000))
    }

    /// The known dimensions, typed (custom keys are the rungs' to ignore).
    pub fn typed(&self) -> Limits {
        let mut l = Limits::NONE;
        for (k, v) in &self.0 {
            if let Some(slot) = l.dim_mut(k) {
                *slot = Some(*v).filter(|v| *v > 0);
            }
        }
        l
    }
}

/// The limits as requested after a rung's configured defaults and ceilings (a profile's
/// limits): the request's map, each dimension it leaves out taken from `defaults`, each above
/// its ceiling narrowed to it. What the rung then applies depends on the machine too (its
/// fallbacks, what it cannot enforce): that is the evidence's.
pub(crate) fn requested(asked: &BTreeMap<String, u64>, defaults: &Limits, ceilings: &Limits) -> BTreeMap<String, u64> {
    // 0 asks for nothing (as no entry does): the same request, the same digest.
    let mut out: BTreeMap<String, u64> = asked.iter().filter(|(_, v)| **v > 0).map(|(k, v)| (k.clone(), *v)).collect();
    for ((key, default), (_, ceiling)) in defaults.dims().into_iter().zip(ceilings.dims()) {
        let want = out.get(key).copied().filter(|v| *v > 0).or(default);
        if let Some(v) = want {
            out.insert(key.to_owned(), ceiling.map_or(v, |c| v.min(c)));
        }
    }
    out
}

/// What a rung's configuration and nature say of limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RungLimits<'a> {
    /// Fill what the request left out.
    pub defaults: &'a Limits,
    /// Only narrow: the applied value is never above one.
    pub ceilings: &'a Limits,
    /// The rung's own, for what neither the request nor a default gives (never "unlimited"
    /// by accident where the rung can enforce it).
    pub fallback: &'a Limits,
    /// Dimensions the rung cannot enforce, and why (for the evidence's `skipped`).
    pub cannot: &'a [(&'static str, &'static str)],
}

/// The limits a rung applies to one attempt, and what the evidence says of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Applied {
    pub limits: Limits,
    /// What the request asked above a ceiling.
    pub narrowed: Vec<NarrowedLimit>,
    /// What was asked (or defaulted) that the rung cannot enforce.
    pub skipped: BTreeMap<String, String>,
}

/// The one rule of every rung (`docs/outcome.md`, "Limits"): the request's value, else the
/// default, else the rung's fallback; then a ceiling only narrows (the smaller wins, and a
/// request narrowed is in the evidence); a dimension the rung cannot enforce is skipped.
pub(crate) fn resolve(asked: &ResourceLimits, rung: RungLimits<'_>) -> Applied {
    let asked = asked.typed();
    let mut out = Applied::default();
    let dims = asked.dims().into_iter().zip(rung.defaults.dims()).zip(rung.fallback.dims()).zip(rung.ceilings.dims());
    for ((((key, want), (_, default)), (_, fallback)), (_, ceiling)) in dims {
        let Some(v) = want.or(default).or(fallback) else { continue };
        if let Some((_, why)) = rung.cannot.iter().find(|(k, _)| *k == key) {
            out.skipped.insert(key.to_owned(), format!("{v} asked, not enforced: {why}"));
            continue;
        }
        let applied = match ceiling {
            Some(c) if v > c => {
                if want.is_some() {
                    out.narrowed.push(NarrowedLimit { key: key.into(), from: v, to: c, why: "profile ceiling".into() });
                }
                c
            }
            _ => v,
        };
        *out.limits.dim_mut(key).expect("a known key") = Some(applied);
    }
    out
}

#[cfg(test)]
mod tests {

    #[test]
    fn requested_is_the_request_after_the_profiles_defaults_and_ceilings() {
        let asked: BTreeMap<String, u64> = [("memory".to_owned(), 512 << 20), ("cpu".to_owned(), 4000)].into();
        let mut defaults = Limits::NONE;
        (defaults.pids, defaults.memory_bytes) = (Some(100), Some(64 << 20));
        let mut ceilings = Limits::NONE;
        (ceilings.cpu_millis, ceilings.pids) = (Some(2000), Some(50));
        let got = requested(&asked, &defaults, &ceilings);
        let want: BTreeMap<String, u64> =
            [("memory".to_owned(), 512 << 20), ("cpu".to_owned(), 2000), ("pids".to_owned(), 50)].into();
        assert_eq!(got, want, "the request wins over a default; a ceiling narrows both");
        assert_eq!(requested(&BTreeMap::new(), &Limits::NONE, &Limits::NONE), BTreeMap::new());
        let zero: BTreeMap<String, u64> = [("memory".to_owned(), 0)].into();
        assert_eq!(requested(&zero, &Limits::NONE, &Limits::NONE), BTreeMap::new(), "0 asks for nothing");
    }

    use super::*;

    fn rung<'a>(d: &'a Limits, c: &'a Limits, f: &'a Limits) -> RungLimits<'a> {
        RungLimits { defaults: d, ceilings: c, fallback: f, cannot: &[("gpu", "no GPUs here")] }
    }

    #[test]
    fn a_ceiling_only_narrows_and_a_default_only_fills() {
        let (d, c, f) = (Limits::NONE.memory(256), Limits::NONE.memory(512).pids(100), Limits::NONE.pids(512).disk(9));
        // Asked above the ceiling: narrowed, and said so.
        let a = resolve(&ResourceLimits::new().with(key::MEMORY, 1024), rung(&d, &c, &f));
        assert_eq!(a.limits.memory_bytes, Some(512));
        assert_eq!(
            a.narrowed,
            [NarrowedLimit { key: "memory".into(), from: 1024, to: 512, why: "profile ceiling".into() }]
        );
        // Asked below: as asked. Left out: the default fills it.
        assert_eq!(
            resolve(&ResourceLimits::new().with(key::MEMORY, 64), rung(&d, &c, &f)).limits.memory_bytes,
            Some(64)
        );
        let a = resolve(&ResourceLimits::new(), rung(&d, &c, &f));
        assert_eq!(a.limits.memory_bytes, Some(256));
        // The rung's fallback under a ceiling is the ceiling, not a narrowing of anything asked.
        assert_eq!((a.limits.pids, a.limits.disk_bytes), (Some(100), Some(9)));
        assert!(a.narrowed.is_empty(), "{a:?}");
        // Nothing given and no fallback: no limit, whatever the ceiling (it only narrows).
        let a = resolve(&ResourceLimits::new(), rung(&Limits::NONE, &Limits::NONE.cpu(500), &Limits::NONE));
        assert_eq!(a.limits, Limits::NONE);
        // What the rung cannot enforce is skipped, with why.
        let a = resolve(&ResourceLimits::new().with(key::GPU, 1000).with("custom", 3), rung(&d, &c, &f));
        assert_eq!(a.limits.gpu_millis, None);
        assert!(a.skipped["gpu"].contains("no GPUs here"), "{a:?}");
        // Zero is "not given".
        assert_eq!(
            resolve(&ResourceLimits::new().with(key::MEMORY, 0), rung(&d, &c, &f)).limits.memory_bytes,
            Some(256)
        );
    }

    #[test]
    fn limits_accessors() {
        let l = ResourceLimits::new().with(key::GPU, 1500).with(key::MEMORY, 0).with("custom", 7);
        assert_eq!(l.gpu_devices(), Some(2));
        assert_eq!(l.memory_bytes(), None, "zero means no per-job ceiling");
        assert_eq!(l.get("custom"), Some(7));
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(json, r#"{"custom":7,"gpu":1500,"memory":0}"#);
    }
}
