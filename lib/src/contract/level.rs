//! Isolation levels of the ladder.

use serde::{Deserialize, Serialize};
use std::fmt;

/// How strongly a rung isolates an attempt from the worker and the host.
///
/// Ordered: `None < Process < Sandboxed < Vm`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// In the worker's own process.
    #[default]
    None = 0,
    /// In a child process of the worker.
    Process = 1,
    /// In a runc/crun container.
    Sandboxed = 2,
    /// In a container under a VM-grade runtime (runsc, kata).
    Vm = 3,
}

impl Level {
    /// The lowercase name used in JSON, logs and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::None => "none",
            Level::Process => "process",
            Level::Sandboxed => "sandboxed",
            Level::Vm => "vm",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_names() {
        assert!(Level::None < Level::Process);
        assert!(Level::Process < Level::Sandboxed);
        assert!(Level::Sandboxed < Level::Vm);
        assert_eq!(Level::Vm.to_string(), "vm");
        assert_eq!(serde_json::to_string(&Level::Sandboxed).unwrap(), "\"sandboxed\"");
        assert_eq!(Level::Process as u8, 1);
    }
}
