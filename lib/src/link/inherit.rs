//! Starting a program with exactly the descriptors it is meant to have: its stdio, and the
//! init's takeover socket as fd [`TAKEOVER_FD`]. Whatever the worker itself inherited
//! without close-on-exec (an engine's socket, a credentials file a parent left open) never
//! reaches the program, and so never the command. The process rung starts its init so; the
//! oci rung its runtime, which hands fd 3 on to the container's init (`--preserve-fds 1`).
#![expect(
    unsafe_code,
    reason = "pre_exec, to put the takeover socket on fd 3 and mark every other descriptor from 4 on \
              close-on-exec between fork and exec (dup2, fcntl and close_range only: async-signal-safe, \
              no allocation)"
)]

use std::os::fd::{AsRawFd, OwnedFd};

/// The descriptor the init finds its takeover socket on (`wire::Start::takeover_fd`).
pub(crate) const TAKEOVER_FD: i32 = 3;

/// Makes `cmd` start its program with `listener` as fd [`TAKEOVER_FD`] and nothing else open
/// past its stdio. `listener` stays open in this process until `cmd` is dropped.
pub(crate) fn with_takeover_fd(cmd: &mut tokio::process::Command, listener: OwnedFd) {
    use nix::libc;
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe system
    // calls on descriptors; `listener` is moved in, so it stays open until the command is dropped.
    unsafe {
        cmd.pre_exec(move || {
            let fd = listener.as_raw_fd();
            if fd == TAKEOVER_FD {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, TAKEOVER_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let first = (TAKEOVER_FD + 1) as libc::c_uint;
            if libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC) != 0 {
                // Kernels before 5.11: one by one, up to the soft limit.
                let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                let limit =
                    if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 { rl.rlim_cur.min(1 << 20) } else { 1 << 16 };
                for n in first as libc::c_int..limit as libc::c_int {
                    libc::fcntl(n, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
            Ok(())
        });
    }
}
