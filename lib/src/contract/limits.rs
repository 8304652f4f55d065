//! Resource limits (dimension → amount); sizes, CPU amounts and durations as people type them
//! are parsed by `stevedore_parse::limits` (re-exported here).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
pub use stevedore_parse::limits::{ParseError, parse_cpus, parse_duration, parse_size};

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
}

#[cfg(test)]
mod tests {
    use super::*;

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
