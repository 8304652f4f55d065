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

/// Whether a runtime's (or runtime class's) name says it is VM-grade (`runsc`, `kata`,
/// `gvisor`): what a rung may claim, for [`shown`] to check.
pub fn named_vm_grade(name: &str) -> bool {
    ["runsc", "kata", "gvisor"].iter().any(|v| name.contains(v))
}

/// The level an attempt showed: a rung named `vm` (by its runtime's name) keeps it only when
/// the init saw a kernel other than the host's (`seen` and `host`: `/proc/version` lines or
/// bare releases); otherwise it is `sandboxed`, and the note says why. Any other level stands.
pub fn shown(claimed: Level, seen: Option<&str>, host: Option<&str>) -> (Level, Option<String>) {
    use stevedore_init::wire::kernel_release;
    if claimed != Level::Vm {
        return (claimed, None);
    }
    let not = |why: String| (Level::Sandboxed, Some(format!("level vm not shown, so sandboxed: {why}")));
    match (seen, host) {
        (None, _) => not("the init reported no kernel".into()),
        (Some(_), None) => not("the host's kernel is not known to compare with".into()),
        (Some(s), Some(h)) if kernel_release(s) == kernel_release(h) => not(format!(
            "the init saw the host's own kernel ({}): the runtime's name alone does not make a VM",
            kernel_release(h)
        )),
        (Some(s), Some(h)) => (
            Level::Vm,
            Some(format!("level vm shown: the init saw the kernel {s:?}, not the host's {}", kernel_release(h))),
        ),
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

    #[test]
    fn vm_is_shown_by_another_kernel_never_by_a_name() {
        let host = "Linux version 6.1.0-18-amd64 (debian-kernel@lists.debian.org) (gcc-12) #1 SMP PREEMPT_DYNAMIC";
        let gvisor = "Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016";
        assert_eq!(shown(Level::Vm, Some(gvisor), Some(host)).0, Level::Vm);
        assert_eq!(shown(Level::Vm, Some(gvisor), Some("6.1.0-18-amd64")).0, Level::Vm, "a bare release");
        let (level, note) = shown(Level::Vm, Some(host), Some("6.1.0-18-amd64"));
        assert_eq!(level, Level::Sandboxed);
        assert!(note.unwrap().contains("host's own kernel (6.1.0-18-amd64)"));
        assert_eq!(shown(Level::Vm, None, Some(host)).0, Level::Sandboxed, "no record, nothing shown");
        assert_eq!(shown(Level::Vm, Some(gvisor), None).0, Level::Sandboxed, "nothing to compare with");
        assert_eq!(shown(Level::Sandboxed, Some(gvisor), Some(host)), (Level::Sandboxed, None));
        assert_eq!(shown(Level::Process, None, None), (Level::Process, None));
    }
}
