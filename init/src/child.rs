//! Starting the command: its own session and process group, clean signal state, an OOM
//! score above the init's, the start's rlimits, its streams on pipes the init reads, the
//! report socket as fd [`REPORT_FD`], and for a handler runner the socket to the init as its
//! stdin (fd [`HANDLER_FD`]; a plain command's stdin is `/dev/null`).

use crate::wire::{HANDLER_FD, REPORT_FD, SpawnFailure, SpawnFailureKind, Start, env as wire_env};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use nix::unistd::Pid;
use std::fs;
use std::io::Read;
use std::os::fd::OwnedFd;
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
    /// The init's end of the report socket.
    pub report: OwnedFd,
    pub oom_guard: Option<String>,
    /// The write end of the command's stdin, when it comes from the host.
    pub stdin: Option<OwnedFd>,
    /// The terminal's master side, when the command has one (`Start::tty`): for its size.
    pub tty: Option<OwnedFd>,
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

/// The first component of `dest` (absolute) that is a symlink, and where it points: a mount
/// the engine made there landed at the target instead.
pub(crate) fn redirected(dest: &str) -> Option<(String, String)> {
    let mut at = std::path::PathBuf::from("/");
    for c in std::path::Path::new(dest).components().skip(1) {
        at.push(c);
        match fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = fs::read_link(&at).map(|t| t.display().to_string()).unwrap_or_else(|_| "?".into());
                return Some((at.display().to_string(), target));
            }
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}

/// The command's working directory, made when the image lacks it, as docker does (the
/// container rung's engine makes it at create; this covers a container made before the
/// request, whose root may be read-only): a failure names the directory, never the program.
fn working_dir(cwd: &str) -> Result<(), String> {
    match fs::metadata(cwd) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("the working directory {cwd} is not a directory in the image")),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => {
            fs::create_dir_all(cwd)
                .map_err(|e| format!("the working directory {cwd} is not in the image and cannot be made: {e}"))
        }
        Err(e) => Err(format!("the working directory {cwd}: {e}")),
    }
}

/// Starts the command `start` describes.
pub(crate) fn spawn(start: &Start) -> Result<Spawned, SpawnFailure> {
    let other = |message: String| SpawnFailure { kind: SpawnFailureKind::Other, message };
    if let Some((path, target)) = start.mounts.iter().find_map(|m| redirected(m)) {
        return Err(SpawnFailure {
            kind: SpawnFailureKind::MountRedirected,
            message: format!(
                "{path} is a symlink to {target} in the image: the mount there went elsewhere, so nothing of this \
                 sandbox can be trusted"
            ),
        });
    }
    // Before anything of the command exists: a limit demanded and not held means it never runs.
    crate::cgroup::check_held(start.cgroup_dir.as_deref().map(std::path::Path::new), &start.held)
        .map_err(|message| SpawnFailure { kind: SpawnFailureKind::NotEnforced, message })?;
    let Some((prog, rest)) = start.argv.split_first() else {
        return Err(other("cannot execute an empty argv".into()));
    };
    working_dir(&start.cwd).map_err(other)?;
    let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| other(format!("pipe: {e}")));
    // With a terminal, its slave side is the command's stdin, stdout and stderr (one stream
    // the init reads from the master, as a terminal merges them); stderr's pipe then only
    // ends at once.
    let tty = match start.tty {
        Some(size) => Some(terminal(size).map_err(|e| other(format!("cannot make a terminal: {e}")))?),
        None => None,
    };
    let ((out_r, out_w), (err_r, err_w)) = match &tty {
        Some(t) => {
            let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| other(format!("dup: {e}")));
            let (err_r, err_w) = pipe()?;
            drop(err_w);
            ((dup(&t.master)?, dup(&t.slave)?), (err_r, dup(&t.slave)?))
        }
        None => (pipe()?, pipe()?),
    };
    let mut cmd = Command::new(prog);
    cmd.args(rest)
        .env_clear()
        .envs(
            start
                .env
                .iter()
                .filter(|(k, _)| k != wire_env::HANDLER_FD && k != wire_env::REPORT_FD)
                .map(|(k, v)| (k, v)),
        )
        .env(wire_env::REPORT_FD, REPORT_FD.to_string())
        .current_dir(&start.cwd)
        .stdout(Stdio::from(out_w))
        .stderr(Stdio::from(err_w));
    let (report, report_theirs) = socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)
        .map_err(|e| other(format!("socketpair: {e}")))?;
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
    let stdin = match (&start.handler, start.stdin, &tty) {
        (None, _, Some(t)) => {
            cmd.stdin(Stdio::from(t.slave.try_clone().map_err(|e| other(format!("dup: {e}")))?));
            if start.stdin { Some(t.master.try_clone().map_err(|e| other(format!("dup: {e}")))?) } else { None }
        }
        (None, true, None) => {
            let (r, w) = pipe()?;
            cmd.stdin(Stdio::from(r));
            Some(w)
        }
        _ => None,
    };
    let ctty = tty.is_some() && start.handler.is_none();
    let own = std::fs::read_to_string("/proc/self/oom_score_adj").ok().and_then(|s| s.trim().parse().ok());
    let child_adj = child_oom_adj(start.child_oom_score_adj, own);
    let oom_rx = raw::prepare(&mut cmd, child_adj, report_theirs, &start.rlimits, ctty)
        .map_err(|e| other(format!("cannot set up {prog}: {e}")))?;
    let started = Instant::now();
    let child = spawn_when_not_busy(&mut cmd)
        .map_err(|e| SpawnFailure { kind: classify(&e), message: format!("{prog}: {e}") })?;
    // Closes the parent's copies of the child's ends (stream write ends, socket, errno pipe),
    // so EOF on ours means the command's side is gone.
    drop(cmd);
    let pid = Pid::from_raw(child.id() as i32);
    let oom_guard = child_adj.zip(oom_rx).map(|(n, rx)| oom_report(n, pid, rx));
    // The init keeps only the master: the slave's last copy is the command's (its end, and
    // its descendants', is the master's EOF).
    let tty = tty.map(|t| t.master);
    Ok(Spawned { child, pid, started, stdout: out_r, stderr: err_r, handler, report, oom_guard, stdin, tty })
}

/// A new terminal pair, both sides close-on-exec (the command gets the slave as 0, 1, 2).
struct Terminal {
    master: OwnedFd,
    slave: OwnedFd,
}

fn terminal(size: crate::wire::TermSize) -> nix::Result<Terminal> {
    let ws = nix::pty::Winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 };
    let pair = nix::pty::openpty(Some(&ws), None)?;
    for fd in [&pair.master, &pair.slave] {
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))?;
    }
    Ok(Terminal { master: pair.master, slave: pair.slave })
}

/// Sets the size of the terminal whose master is `master` (the kernel tells the command's
/// foreground process group with SIGWINCH).
pub(crate) fn resize(master: &OwnedFd, size: crate::wire::TermSize) -> std::io::Result<()> {
    let ws = rustix::termios::Winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 };
    rustix::termios::tcsetwinsize(master, ws).map_err(std::io::Error::from)
}

/// How long a program may be busy (`ETXTBSY`) before that is its failure.
const BUSY_FOR_AT_MOST: std::time::Duration = std::time::Duration::from_secs(10);

/// Spawns `cmd`, again while its program is busy: a copy the host has just written (the
/// process rung's worker) may still be open for writing in a child another thread of the
/// host forked meanwhile, until that child execs, and an exec meets `ETXTBSY` for that
/// short while. The same rule as the host's own (`lib/src/process/spawn.rs`).
fn spawn_when_not_busy(cmd: &mut Command) -> std::io::Result<Child> {
    let started = Instant::now();
    let mut pause = std::time::Duration::from_millis(2);
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) && started.elapsed() < BUSY_FOR_AT_MOST => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// The command's `oom_score_adj`: the one asked, unless the init's own is already at or above
/// it (a Burstable Pod's kubelet puts every process of the container near 1000): then the
/// highest, so that at the memory limit the kernel picks the command, never the init (which
/// can only raise a score without privileges).
pub(crate) fn child_oom_adj(asked: Option<i32>, own: Option<i32>) -> Option<i32> {
    match (asked, own) {
        (Some(n), Some(o)) if o >= n => Some(1000),
        (asked, _) => asked,
    }
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

/// The descriptor numbers in a buffer of `linux_dirent64` records (`getdents64` of
/// `/proc/self/fd`): entries whose name is not a number (`.`, `..`) are skipped, a record cut
/// short ends the list. No allocation: it runs between fork and exec.
pub(crate) fn dirent_fds(buf: &[u8]) -> impl Iterator<Item = i32> + '_ {
    // d_ino (8), d_off (8), d_reclen (2), d_type (1), then the NUL-terminated name.
    const NAME: usize = 19;
    let mut off = 0usize;
    std::iter::from_fn(move || {
        loop {
            let head = buf.get(off..off + NAME)?;
            let reclen = u16::from_ne_bytes([head[16], head[17]]) as usize;
            let record = buf.get(off..off + reclen).filter(|_| reclen > NAME)?;
            off += reclen;
            let name = record[NAME..].split(|b| *b == 0).next().unwrap_or_default();
            let fd = (!name.is_empty() && name.iter().all(u8::is_ascii_digit))
                .then(|| name.iter().try_fold(0i32, |n, d| n.checked_mul(10)?.checked_add(i32::from(d - b'0'))))
                .flatten();
            if fd.is_some() {
                return fd;
            }
        }
    })
}

/// The crate's only unsafe code: signal dispositions and the fork-to-exec window, which the
/// safe APIs do not reach.
pub(crate) mod raw {
    #![expect(
        unsafe_code,
        reason = "sigaction to SIG_DFL/SIG_IGN; pre_exec to clean the command's signal state, \
                  start its session, set its rlimits, put its report socket on fd 3 and set its \
                  OOM score before it runs (the closure does not allocate and makes only \
                  async-signal-safe calls: sigaction, sigprocmask, setsid, setrlimit, dup2, \
                  fcntl, close_range, getdents64, prctl, open, write, close); borrowing an inherited fd by number; \
                  seccomp(2) with a program the init decoded"
    )]

    use crate::wire::{REPORT_FD, Rlimit, RlimitResource};
    use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
    use nix::sys::prctl;
    use nix::sys::resource::{Resource, setrlimit};
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal, sigaction, sigprocmask};
    use nix::sys::stat::Mode;
    use std::io;
    use std::os::fd::OwnedFd;
    use std::os::fd::{AsRawFd, BorrowedFd};
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

    /// An fd this process inherited, by number, if it is open. The caller never closes it;
    /// it stays open for the rest of the process's life.
    pub fn inherited_fd(n: i32) -> Option<BorrowedFd<'static>> {
        // SAFETY: the fd is checked to be open, and nothing in this crate closes an
        // inherited descriptor by number, so it outlives the borrow.
        let fd = unsafe { BorrowedFd::borrow_raw(n) };
        fcntl(fd, FcntlArg::F_GETFD).ok().map(|_| fd)
    }

    /// Installs one classic BPF program as a seccomp filter on this thread (the init is
    /// single-threaded: the whole process), `no_new_privs` already set (`seccomp`).
    pub(crate) fn install_filter(program: &[crate::seccomp::Insn]) -> io::Result<()> {
        use nix::libc;
        let mut filter: Vec<libc::sock_filter> =
            program.iter().map(|i| libc::sock_filter { code: i.code, jt: i.jt, jf: i.jf, k: i.k }).collect();
        let len = libc::c_ushort::try_from(filter.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let prog = libc::sock_fprog { len, filter: filter.as_mut_ptr() };
        // SAFETY: `prog` points at `len` initialised instructions that outlive the call; the
        // kernel copies the program and keeps no pointer into it.
        let done = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0 as libc::c_uint,
                &prog as *const libc::sock_fprog,
            )
        };
        if done == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
    }

    /// Marks every descriptor from `first` on close-on-exec, so nothing the init inherited
    /// (or holds) reaches the command. Async-signal-safe: also used between fork and exec.
    pub(crate) fn cloexec_from(first: i32) {
        use nix::libc;
        let first = libc::c_uint::try_from(first).unwrap_or(0);
        // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors.
        let done = unsafe { libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC) };
        if done == 0 || cloexec_listed(first as libc::c_int) {
            return;
        }
        // Without /proc either: every descriptor up to the soft limit, one by one.
        let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes into the struct given.
        let limit = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
            rl.rlim_cur.min(1 << 20) as libc::c_int
        } else {
            1 << 16
        };
        for fd in first as libc::c_int..limit {
            // SAFETY: F_SETFD on a closed descriptor only fails with EBADF.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }

    /// Where `close_range` cannot set close-on-exec (kernels before 5.11; gVisor, whose
    /// every system call is dear under ptrace: 4,096 `fcntl`s there took ~0.4 s), the open
    /// descriptors as `/proc/self/fd` lists them, one `fcntl` each. Raw system calls on a stack
    /// buffer: async-signal-safe. `false` when the list cannot be read.
    pub(crate) fn cloexec_listed(first: nix::libc::c_int) -> bool {
        use nix::libc;
        // SAFETY: a NUL-terminated path; the descriptor is closed below.
        let dir =
            unsafe { libc::open(c"/proc/self/fd".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        if dir < 0 {
            return false;
        }
        let mut buf = [0u8; 2048];
        let listed = loop {
            // SAFETY: getdents64 writes at most `buf.len()` bytes into `buf`.
            let n = unsafe { libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len()) };
            if n <= 0 {
                break n == 0;
            }
            for fd in super::dirent_fds(&buf[..n as usize]) {
                if fd >= first && fd != dir {
                    // SAFETY: F_SETFD on a descriptor only sets its flag (EBADF if it went).
                    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
                }
            }
        };
        // SAFETY: the descriptor opened above.
        unsafe { libc::close(dir) };
        listed
    }

    /// The listening unix socket the host passed as descriptor `fd` (the process rung's
    /// takeover socket), checked to be one.
    pub(crate) fn take_listener(fd: i32) -> Result<OwnedFd, String> {
        use nix::sys::socket::{AddressFamily, SockaddrLike, UnixAddr, getsockname, getsockopt, sockopt};
        use std::os::fd::FromRawFd;
        if fd < 3 {
            return Err(format!("descriptor {fd} cannot be the takeover socket"));
        }
        let borrowed = inherited_fd(fd).ok_or_else(|| format!("no descriptor {fd} was inherited"))?;
        let listening = getsockopt(&borrowed, sockopt::AcceptConn).map_err(|e| format!("descriptor {fd}: {e}"))?;
        let unix = getsockname::<UnixAddr>(borrowed.as_raw_fd()).is_ok_and(|a| a.family() == Some(AddressFamily::Unix));
        if !listening || !unix {
            return Err(format!("descriptor {fd} is not a listening unix socket"));
        }
        // SAFETY: the descriptor is open, ours by inheritance, and owned by nothing else in
        // this process (the host passed it for this use alone).
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        fcntl(&owned, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(|e| format!("descriptor {fd}: {e}"))?;
        Ok(owned)
    }

    /// Takes ownership of a descriptor `accept4` just returned.
    pub fn own_accepted(fd: std::os::fd::RawFd) -> OwnedFd {
        use std::os::fd::FromRawFd;
        // SAFETY: accept4 returned a new descriptor that nothing else owns.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    fn resource(r: RlimitResource) -> Resource {
        match r {
            RlimitResource::Nofile => Resource::RLIMIT_NOFILE,
            RlimitResource::Nproc => Resource::RLIMIT_NPROC,
            RlimitResource::Core => Resource::RLIMIT_CORE,
            RlimitResource::Cpu => Resource::RLIMIT_CPU,
            RlimitResource::Fsize => Resource::RLIMIT_FSIZE,
        }
    }

    /// Sets up the fork-to-exec window: default dispositions and an empty mask (std leaves
    /// the init's blocked set in place), a session of its own, the rlimits, the report
    /// socket on [`REPORT_FD`], and, when `oom` is set, the child's own `oom_score_adj` so
    /// even its first instruction runs with it. Returns the read end of a pipe on which the
    /// child reports that write's errno.
    pub(crate) fn prepare(
        cmd: &mut Command,
        oom: Option<i32>,
        report: OwnedFd,
        rlimits: &[Rlimit],
        ctty: bool,
    ) -> io::Result<Option<OwnedFd>> {
        let limits: Vec<(Resource, u64, u64)> =
            rlimits.iter().map(|l| (resource(l.resource), l.soft, l.hard)).collect();
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
                nix::unistd::setsid()?;
                if ctty {
                    // Its terminal (fd 0 by now) becomes the new session's controlling one, so
                    // ^C typed there is its SIGINT and a resize its SIGWINCH.
                    rustix::process::ioctl_tiocsctty(std::os::fd::BorrowedFd::borrow_raw(0))?;
                }
                for &(r, soft, hard) in &limits {
                    setrlimit(r, soft, hard)?;
                }
                if report.as_raw_fd() == REPORT_FD {
                    fcntl(&report, FcntlArg::F_SETFD(FdFlag::empty()))?;
                } else {
                    // fd 3 of the child is free to take: stdio is already in place, and
                    // whatever the init had there is close-on-exec. dup2 leaves the copy
                    // inheritable.
                    nix::errno::Errno::result(nix::libc::dup2(report.as_raw_fd(), REPORT_FD))?;
                }
                // Exactly 0, 1, 2 and the report socket reach the command, whatever the init
                // was given (std's own error pipe is close-on-exec already).
                cloexec_from(REPORT_FD + 1);
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

#[cfg(test)]
mod tests {
    use super::{child_oom_adj, dirent_fds, working_dir};

    fn record(name: &str, pad: usize) -> Vec<u8> {
        let reclen = (19 + name.len() + 1 + pad) as u16;
        let mut r = vec![0u8; 16];
        r.extend(reclen.to_ne_bytes());
        r.push(4);
        r.extend(name.as_bytes());
        r.extend(std::iter::repeat_n(0u8, 1 + pad));
        r
    }

    /// The records' numbers, nothing else: dots and other names skipped, a record cut short
    /// or of an impossible length ends the list, a number past `i32` is no descriptor.
    #[test]
    fn descriptors_are_read_from_dirent_records() {
        let mut buf = Vec::new();
        for (name, pad) in [(".", 4), ("..", 3), ("0", 4), ("17", 3), ("x1", 3), ("99999999999", 4), ("1024", 1)] {
            buf.extend(record(name, pad));
        }
        assert_eq!(dirent_fds(&buf).collect::<Vec<_>>(), [0, 17, 1024]);
        assert_eq!(dirent_fds(&buf[..buf.len() - 3]).collect::<Vec<_>>(), [0, 17], "the last record cut short");
        let mut zero = record("5", 4);
        zero[16..18].copy_from_slice(&0u16.to_ne_bytes());
        assert_eq!(dirent_fds(&zero).count(), 0, "a zero length never loops");
    }

    /// Against the real `/proc/self/fd`: a descriptor opened without close-on-exec gets it,
    /// one below `first` keeps what it had.
    #[test]
    fn the_listed_descriptors_are_marked_close_on_exec() {
        use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl, open};
        let open_plain = || open("/proc/self/status", OFlag::O_RDONLY, nix::sys::stat::Mode::empty()).unwrap();
        let low = open_plain();
        // At the top of the descriptor range: the descriptors of the other tests' threads
        // (below it) are not marked.
        let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        let at = i32::try_from(soft.saturating_sub(4)).unwrap_or(i32::MAX - 4);
        let high = rustix::io::fcntl_dupfd_cloexec(open_plain(), at).unwrap();
        rustix::io::fcntl_setfd(&high, rustix::io::FdFlags::empty()).unwrap();
        let raw = std::os::fd::AsRawFd::as_raw_fd;
        let flags = |fd: &std::os::fd::OwnedFd| FdFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFD).unwrap());
        assert!(!flags(&low).contains(FdFlag::FD_CLOEXEC) && !flags(&high).contains(FdFlag::FD_CLOEXEC));
        let first = raw(&high);
        assert!(super::raw::cloexec_listed(first), "/proc/self/fd is read");
        assert!(flags(&high).contains(FdFlag::FD_CLOEXEC));
        assert!(!flags(&low).contains(FdFlag::FD_CLOEXEC), "below first: untouched");
    }

    /// A working directory the image lacks is made; one that cannot be is named, never taken
    /// for a missing program.
    #[test]
    fn a_missing_working_dir_is_made_or_named() {
        let t = tempfile::tempdir().unwrap();
        let made = t.path().join("a/b");
        working_dir(made.to_str().unwrap()).unwrap();
        assert!(made.is_dir());
        let file = t.path().join("f");
        std::fs::write(&file, "").unwrap();
        let err = working_dir(file.to_str().unwrap()).unwrap_err();
        assert!(err.contains(&format!("{} is not a directory", file.display())), "{err}");
        let under = file.join("sub");
        let err = working_dir(under.to_str().unwrap()).unwrap_err();
        assert!(
            err.contains(&format!("the working directory {} is not in the image and cannot be made", under.display())),
            "{err}"
        );
    }

    #[test]
    fn the_command_is_always_above_the_init_at_the_memory_limit() {
        assert_eq!(child_oom_adj(Some(500), Some(0)), Some(500), "Docker's default: as asked");
        assert_eq!(child_oom_adj(Some(500), Some(-997)), Some(500), "a Guaranteed Pod: as asked");
        assert_eq!(child_oom_adj(Some(500), Some(958)), Some(1000), "a Burstable Pod: above the init");
        assert_eq!(child_oom_adj(Some(500), Some(500)), Some(1000));
        assert_eq!(child_oom_adj(Some(500), None), Some(500));
        assert_eq!(child_oom_adj(None, Some(958)), None, "nothing asked, nothing set");
    }
}
