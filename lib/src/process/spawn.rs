//! Starting the process rung's init when its program is not busy (`ETXTBSY`). Its
//! descriptors (stdio, the takeover socket on fd 3, nothing else) are `link::inherit`'s.
#![cfg_attr(test, expect(unsafe_code, reason = "the test's pre_exec: fcntl on one descriptor between fork and exec"))]

pub(crate) use crate::link::inherit::{TAKEOVER_FD, with_takeover_fd};

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
    use std::os::fd::AsRawFd;
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
