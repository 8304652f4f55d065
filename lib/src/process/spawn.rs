//! Starting the process rung's init with exactly the descriptors it is meant to have: its
//! stdio pipes, and its takeover socket as fd [`TAKEOVER_FD`]. Whatever the worker itself
//! inherited without close-on-exec (an engine's socket, a credentials file a parent left
//! open) never reaches the init, and so never the command.
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

/// How long a program just written may stay busy (`ETXTBSY`) before starting it fails.
const BUSY_FOR_AT_MOST: std::time::Duration = std::time::Duration::from_secs(10);

/// Starts `cmd`, waiting while its program is "text file busy": the worker writes the init
/// and its own copy into the rung's dir, and a process this worker forks at that moment on
/// another thread holds a copy of the write descriptor until it execs (close-on-exec acts
/// only then), so an exec right after the write can meet `ETXTBSY` for that short while.
pub(crate) async fn spawn_when_not_busy(cmd: &mut tokio::process::Command) -> std::io::Result<tokio::process::Child> {
    let started = tokio::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(2);
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) && started.elapsed() < BUSY_FOR_AT_MOST => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;

    /// A program whose write descriptor a short-lived child still holds starts once the
    /// child is gone, where a plain spawn fails with `ETXTBSY`.
    #[tokio::test]
    async fn a_program_busy_for_a_moment_is_started_once_it_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let prog = dir.path().join("prog");
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o755).open(&prog).unwrap();
        f.write_all(b"#!/bin/sh\necho started\n").unwrap();
        // A child that inherits the write descriptor (close-on-exec cleared for it alone),
        // holding the file busy until it exits when its stdin closes.
        let fd = f.as_raw_fd();
        let mut holder = std::process::Command::new("/bin/sh");
        holder.args(["-c", "read _"]).stdin(std::process::Stdio::piped());
        // SAFETY: fcntl on one descriptor between fork and exec: async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut holder, move || {
                if nix::libc::fcntl(fd, nix::libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut holder = holder.spawn().unwrap();
        drop(f);
        let plain = tokio::process::Command::new(&prog).spawn();
        assert_eq!(plain.err().and_then(|e| e.raw_os_error()), Some(nix::libc::ETXTBSY), "the file is busy");

        let mut cmd = tokio::process::Command::new(&prog);
        cmd.stdout(std::process::Stdio::piped());
        let waiting = tokio::spawn(async move { spawn_when_not_busy(&mut cmd).await.map(|c| c.wait_with_output()) });
        drop(holder.stdin.take());
        holder.wait().unwrap();
        let out = waiting.await.unwrap().expect("started once free").await.unwrap();
        assert_eq!(out.stdout, b"started\n");
    }
}
