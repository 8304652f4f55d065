//! Memory the init holds in the attempt's cgroup while the command runs, and lets go once
//! every process of the attempt is gone: the room that sending the record and the outputs
//! needs in a cgroup the command filled.
//!
//! A command that fills `/out` or `/tmp` (memory-backed: their pages cannot be reclaimed with
//! swap off) leaves its cgroup at the limit after the kernel OOM-killed it; the init, the last
//! process left, then needs pages of its own (pipe and socket buffers, page tables, the
//! tar's buffers, all charged to the same cgroup) and is OOM-killed in turn, with the outputs
//! unsent. The rung sizes the cgroup's limit as the command's limit plus the reserve
//! (`docs/outcome.md`, "Memory and the delivery reserve"), so the command has what it asked
//! for, and the reserve is free again exactly when the delivery starts.
//!
//! The reserve is the pages of an anonymous in-memory file (`memfd_create`), allocated with
//! `fallocate`: charged to the cgroup like any page, but mapped by nobody, so they are not
//! the init's resident set, which the kernel's OOM killer weighs when it picks a victim. Held
//! as the init's own anonymous memory, they made the init the biggest process of the attempt
//! wherever its OOM score adjustment is as high as the command's (a Kubernetes Burstable Pod:
//! the kubelet gives the container 998 and the init cannot lower it), and the kernel killed the
//! init instead of the command (seen on the kube rung). The file is close-on-exec, and the
//! init is not dumpable: the command reaches neither it nor its descriptor.

use nix::fcntl::{FallocateFlags, fallocate};
use nix::sys::memfd::{MFdFlags, memfd_create};
use std::os::fd::OwnedFd;

/// The most the init holds, whatever it is asked: the reserve is room for a delivery, not a
/// way to make the sandbox's cgroup large.
pub const MAX_RESERVE: u64 = 256 << 20;

/// Held memory, freed on [`Reserve::release`] (or drop).
#[derive(Debug, Default)]
pub(crate) struct Reserve {
    held: Option<(OwnedFd, u64)>,
    /// Why the reserve asked for is not held.
    pub failed: Option<String>,
}

impl Reserve {
    /// Holds `bytes` (at most [`MAX_RESERVE`]), every page allocated and charged now.
    pub fn hold(bytes: u64) -> Self {
        if bytes == 0 {
            return Self::default();
        }
        let n = bytes.min(MAX_RESERVE);
        let failed = |why: String| Self { held: None, failed: Some(why) };
        let fd = match memfd_create(c"stevedore-reserve", MFdFlags::MFD_CLOEXEC) {
            Ok(fd) => fd,
            Err(e) => return failed(format!("memfd_create: {e}")),
        };
        let len = nix::libc::off_t::try_from(n).unwrap_or(nix::libc::off_t::MAX);
        match fallocate(&fd, FallocateFlags::empty(), 0, len) {
            Ok(()) => Self { held: Some((fd, n)), failed: None },
            Err(e) => failed(format!("fallocate of {n} bytes: {e}")),
        }
    }

    /// Bytes held now.
    pub fn held_bytes(&self) -> u64 {
        self.held.as_ref().map_or(0, |(_, n)| *n)
    }

    /// Lets the memory go: the file's last reference closes, its pages are freed and the
    /// cgroup uncharged at once.
    pub fn release(&mut self) {
        self.held = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file's allocated bytes, as `fstat` counts its blocks.
    fn allocated(r: &Reserve) -> u64 {
        let (fd, _) = r.held.as_ref().expect("held");
        let st = nix::sys::stat::fstat(fd).unwrap();
        u64::try_from(st.st_blocks).unwrap() * 512
    }

    #[test]
    fn a_reserve_is_allocated_until_released_and_is_no_ones_resident_set() {
        let rss = || {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap().to_owned();
            line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() << 10
        };
        let before = rss();
        let mut r = Reserve::hold(4 << 20);
        assert_eq!((r.held_bytes(), r.failed.as_deref()), (4 << 20, None));
        assert_eq!(allocated(&r), 4 << 20, "every page allocated");
        assert!(rss() < before + (1 << 20), "the pages are not the init's resident set");
        r.release();
        assert_eq!(r.held_bytes(), 0);
        assert_eq!(Reserve::hold(0).held_bytes(), 0);
    }
}
