//! Starting the command: its own process group, clean signal state, an OOM score above the
//! init's, its streams on pipes the init reads, and for a handler runner the socket to the
//! init as its stdin (fd [`HANDLER_FD`]; a plain command's stdin is `/dev/null`).

use crate::wire::{HANDLER_FD, SpawnFailure, SpawnFailureKind, Start, env as wire_env};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use nix::unistd::Pid;
use std::fs;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// The command, started, and the init's ends of its streams.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub child: Child,
    pub pid: Pid,
    pub started: Instant,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// The init's end of the handler socket, for a handler attempt.
    pub handler: Option<OwnedFd>,
    pub oom_guard: Option<String>,
}

fn classify(e: &std::io::Error) -> SpawnFailureKind {
    match (e.kind(), e.raw_os_error()) {
        (std::io::ErrorKind::NotFound, _) => SpawnFailureKind::NotFound,
        (std::io::ErrorKind::PermissionDenied, _) => SpawnFailureKind::NotExecutable,
        // ENOEXEC: not a format the kernel runs; EISDIR: a directory.
        (_, Some(8 | 21)) => SpawnFailureKind::NotExecutable,
        _ => SpawnFailureKind::Other,
    }
}

/// Starts the command `start` describes.
pub(crate) fn spawn(start: &Start) -> Result<Spawned, SpawnFailure> {
    let other = |message: String| SpawnFailure { kind: SpawnFailureKind::Other, message };
    let Some((prog, rest)) = start.argv.split_first() else {
        return Err(other("cannot execute an empty argv".into()));
    };
    let (out_r, out_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| other(format!("pipe: {e}")))?;
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| other(format!("pipe: {e}")))?;
    let mut cmd = Command::new(prog);
    cmd.args(rest)
        .env_clear()
        .envs(start.env.iter().filter(|(k, _)| k != wire_env::HANDLER_FD).map(|(k, v)| (k, v)))
        .current_dir(&start.cwd)
        .stdout(Stdio::from(out_w))
        .stderr(Stdio::from(err_w))
        .process_group(0);
    let handler = match &start.handler {
        Some(_) => {
            let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)
                .map_err(|e| other(format!("socketpair: {e}")))?;
            cmd.env(wire_env::HANDLER_FD, HANDLER_FD.to_string());
            cmd.stdin(Stdio::from(theirs));
            Some(ours)
        }
        None => {
            cmd.stdin(Stdio::null());
            None
        }
    };
    let oom_rx =
        raw::prepare(&mut cmd, start.child_oom_score_adj).map_err(|e| other(format!("cannot set up {prog}: {e}")))?;
    let started = Instant::now();
    let child = cmd.spawn().map_err(|e| SpawnFailure { kind: classify(&e), message: format!("{prog}: {e}") })?;
    // Closes the parent's copies of the child's ends (stream write ends, socket, errno pipe),
    // so EOF on ours means the command's side is gone.
    drop(cmd);
    let pid = Pid::from_raw(child.id() as i32);
    let oom_guard = start.child_oom_score_adj.zip(oom_rx).map(|(n, rx)| oom_report(n, pid, rx));
    Ok(Spawned { child, pid, started, stdout: out_r, stderr: err_r, handler, oom_guard })
}

fn oom_report(n: i32, pid: Pid, rx: OwnedFd) -> String {
    let mut errno = [0u8; 4];
    let mut f = fs::File::from(rx);
    if f.read_exact(&mut errno).is_ok() {
        return format!("not applied: {}", Errno::from_raw(i32::from_ne_bytes(errno)));
    }
    let read = |p: String| fs::read_to_string(p).map(|s| s.trim().to_owned());
    let init = read("/proc/self/oom_score_adj".into()).unwrap_or_else(|_| "unknown".into());
    match read(format!("/proc/{pid}/oom_score_adj")) {
        Ok(v) if v == n.to_string() => format!("child oom_score_adj {v} (init {init})"),
        Ok(v) => format!("not applied: child oom_score_adj is {v}, wanted {n} (init {init})"),
        Err(e) => format!("unknown: cannot read the child's oom_score_adj: {e}"),
    }
}

/// The crate's only unsafe code: signal dispositions and the fork-to-exec window, which the
/// safe APIs do not reach.
pub(crate) mod raw {
    #![expect(
        unsafe_code,
        reason = "sigaction to SIG_DFL/SIG_IGN, and pre_exec to clean the command's signal state \
                  and set its OOM score before it runs; the pre_exec closure does not allocate \
                  and makes only async-signal-safe calls (sigaction, sigprocmask, prctl, open, \
                  write, close)"
    )]

    use nix::fcntl::OFlag;
    use nix::sys::prctl;
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal, sigaction, sigprocmask};
    use nix::sys::stat::Mode;
    use std::io;
    use std::os::fd::OwnedFd;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    /// The signals the init handles through its signalfd.
    pub(crate) const HANDLED: [Signal; 5] =
        [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGCHLD];

    fn set_all(handler: SigHandler, signals: &[Signal]) {
        let action = SigAction::new(handler, SaFlags::empty(), SigSet::empty());
        for &sig in signals {
            // SAFETY: SIG_DFL and SIG_IGN run no code of ours in signal context.
            let _ = unsafe { sigaction(sig, &action) };
        }
    }

    /// The init's own dispositions: an inherited SIG_IGN on SIGCHLD would make the kernel
    /// reap the command behind its back (losing its status); SIGPIPE is ignored so a host
    /// that went away shows up as EPIPE, not as the init's death.
    pub(crate) fn init_dispositions() {
        set_all(SigHandler::SigDfl, &HANDLED);
        set_all(SigHandler::SigIgn, &[Signal::SIGPIPE]);
    }

    /// Sets up the fork-to-exec window: default dispositions and an empty mask (std leaves
    /// the init's blocked set in place), and, when `oom` is set, the child's own
    /// `oom_score_adj` so even its first instruction runs with it. Returns the read end of a
    /// pipe on which the child reports that write's errno.
    pub(crate) fn prepare(cmd: &mut Command, oom: Option<i32>) -> io::Result<Option<OwnedFd>> {
        let value = oom.map(|n| n.to_string().into_bytes());
        let (rx, tx) = match value {
            Some(_) => {
                let (rx, tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
                (Some(rx), Some(tx))
            }
            None => (None, None),
        };
        // SAFETY: the closure runs in the forked child; it only uses memory prepared before
        // the fork and makes async-signal-safe calls.
        unsafe {
            cmd.pre_exec(move || {
                set_all(SigHandler::SigDfl, &HANDLED);
                set_all(SigHandler::SigDfl, &[Signal::SIGPIPE]);
                let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
                if let (Some(value), Some(tx)) = (&value, &tx) {
                    // Inherited non-dumpability makes /proc/self/* root-owned until exec, and
                    // the command is not root; exec makes it dumpable again anyway, and no
                    // other process of the container exists yet to look at this one's memory.
                    let _ = prctl::set_dumpable(true);
                    let path = c"/proc/self/oom_score_adj";
                    let failed = match nix::fcntl::open(path, OFlag::O_WRONLY | OFlag::O_CLOEXEC, Mode::empty()) {
                        Ok(fd) => nix::unistd::write(&fd, value).err(),
                        Err(e) => Some(e),
                    };
                    if let Some(e) = failed {
                        let _ = nix::unistd::write(tx, &(e as i32).to_ne_bytes());
                    }
                }
                Ok(())
            });
        }
        Ok(rx)
    }
}
