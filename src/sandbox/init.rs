//! stevedore's init: PID 1 of every attempt's container.
//!
//! It reads the stdin frame, stages the payload and request in the control dir, runs the
//! command in its own process group, forwards the host's SIGTERM, SIGKILLs after the grace,
//! reaps everything, and writes an [`InitRecord`] before telling the host it is done with the
//! nonce sentinel on stderr. Its stdin is a dead-man switch: EOF before the command ended
//! means the host is gone, so the init stops everything by itself.
//!
//! Single-threaded on purpose: signals arrive through a signalfd polled beside stdin, so no
//! handler ever runs concurrently with the bookkeeping.

use super::atomic::write_atomic;
use super::cgroup;
use crate::contract::error_chain;
use crate::protocol::{
    self, ChildrenRusage, FsSpace, InitRecord, InitSpec, PAYLOAD_FILE, REQUEST_FILE, RESULT_FILE, StoppedBy, WaitStatus,
};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::prctl;
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, killpg, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus as NixWait, waitid, waitpid};
use nix::unistd::{Pid, getpid};
use std::fs;
use std::io::{self, BufReader, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Exit code of the init when it cannot do its job at all (malformed frame, unusable
/// control dir); the host then finds no sentinel and no record.
pub const EXIT_SETUP_FAILED: i32 = 125;

/// The dead-man switch does not honour a long grace: nobody is waiting for a clean shutdown.
const DEAD_MAN_GRACE_CAP: Duration = Duration::from_secs(2);

/// Why the init could not get to the point of running the command (or of reporting on it).
#[derive(Debug, thiserror::Error)]
enum InitError {
    #[error("unexpected arguments after the control dir: {0:?}")]
    Args(Vec<String>),
    #[error("cannot read the stdin frame")]
    Frame(#[from] protocol::FrameError),
    #[error("cannot set up signal handling")]
    Signals(#[source] Errno),
    #[error("cannot make the init non-dumpable")]
    Dumpable(#[source] Errno),
    #[error("cannot write {file} in the control dir {dir}")]
    Control {
        file: &'static str,
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Runs the init; `args` are the arguments after [`protocol::INIT_MARKER`]: an optional
/// control dir (default [`protocol::CONTROL_DIR`]). Returns the process exit code.
pub fn main(args: &[String]) -> i32 {
    match run(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("stevedore: init: {}", error_chain(&e));
            EXIT_SETUP_FAILED
        }
    }
}

fn run(args: &[String]) -> Result<(), InitError> {
    let control = match args {
        [] => PathBuf::from(protocol::CONTROL_DIR),
        [dir] => PathBuf::from(dir),
        [_, rest @ ..] => return Err(InitError::Args(rest.to_vec())),
    };
    // Blocked before anything else, so a SIGTERM that arrives while the frame is read stays
    // pending in the signalfd and is forwarded once the command exists.
    let signals = block_signals().map_err(InitError::Signals)?;
    raw::reset_own_dispositions();
    // Before the nonce is in memory: the command runs as the same uid and could otherwise
    // read it from /proc/1/mem.
    prctl::set_dumpable(false).map_err(InitError::Dumpable)?;
    if !is_pid1() {
        // Outside a pid namespace (tests), orphans would go to the host's init; as a
        // subreaper they come back here, to be counted and reaped like in a container.
        let _ = prctl::set_child_subreaper(true);
    }
    let (nonce, spec, payload) = read_frame(RawStdin)?;
    let control_err = |file: &'static str| {
        let dir = control.clone();
        move |source| InitError::Control { file, dir, source }
    };
    write_atomic(&control, PAYLOAD_FILE, &payload).map_err(control_err(PAYLOAD_FILE))?;
    if let Some(req) = &spec.handler_request {
        let json = serde_json::to_vec(req).expect("a handler request always serialises");
        write_atomic(&control, REQUEST_FILE, &json).map_err(control_err(REQUEST_FILE))?;
    }
    drop(payload);

    let ended = match spawn(&spec) {
        Ok(running) => running.supervise(&signals, &spec),
        Err(why) => {
            eprintln!("stevedore: {why}");
            Ended {
                wait: WaitStatus::SpawnFailed(why),
                stopped_by: None,
                wall_time: Duration::ZERO,
                pgid: None,
                stdin_open: true,
                oom_guard: None,
            }
        }
    };

    let stragglers_killed = reap_stragglers(ended.pgid);
    let record = InitRecord {
        wait: ended.wait,
        stopped_by: ended.stopped_by,
        stragglers_killed,
        wall_time_ms: u64::try_from(ended.wall_time.as_millis()).unwrap_or(u64::MAX),
        cgroup: cgroup::read_counters(Path::new(cgroup::CGROUP_ROOT)),
        rusage: children_rusage(),
        out_space: fs_space(Path::new(protocol::OUT_DIR)),
        oom_guard: ended.oom_guard,
    };
    let json = serde_json::to_vec(&record).expect("an init record always serialises");
    write_atomic(&control, RESULT_FILE, &json).map_err(control_err(RESULT_FILE))?;
    // The records ride behind the sentinel in one write; one byte over the cap is enough for
    // the host to refuse a handler record as too large.
    let handler = std::fs::File::open(control.join(protocol::HANDLER_FILE))
        .ok()
        .and_then(|f| protocol::read_capped(f, protocol::MAX_RECORD_BYTES).ok());
    let mut done = protocol::done_sentinel(&nonce).into_bytes();
    done.extend(protocol::encode_trailer(&json, handler.as_deref()));
    write_all_raw(io::stderr().as_fd(), &done);
    if ended.stdin_open {
        // The host downloads outputs now; SIGTERM stays blocked and is simply never read.
        wait_for_eof(stdin_fd());
    }
    Ok(())
}

fn is_pid1() -> bool {
    getpid() == Pid::from_raw(1)
}

fn block_signals() -> Result<SignalFd, Errno> {
    let mut mask = SigSet::empty();
    for s in raw::HANDLED {
        mask.add(s);
    }
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None)?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
}

fn stdin_fd() -> BorrowedFd<'static> {
    static STDIN: std::sync::LazyLock<io::Stdin> = std::sync::LazyLock::new(io::stdin);
    STDIN.as_fd()
}

/// Reads fd 0 directly: std's `Stdin` buffers, and a read-ahead would hide from `poll` what
/// is already consumed (and the host's EOF is all that may follow the frame).
#[derive(Debug)]
struct RawStdin;

impl Read for RawStdin {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match nix::unistd::read(stdin_fd(), buf) {
                Err(Errno::EINTR) => continue,
                r => return r.map_err(io::Error::from),
            }
        }
    }
}

/// Decodes the stdin frame without consuming a byte past its end: a one-byte buffer makes
/// `read_line` go byte by byte and lets `read_exact` read straight into its target.
fn read_frame(r: impl Read) -> Result<(String, InitSpec, Vec<u8>), protocol::FrameError> {
    protocol::decode_stdin_frame(&mut BufReader::with_capacity(1, r))
}

fn write_all_raw(fd: BorrowedFd<'_>, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        match nix::unistd::write(fd, bytes) {
            Ok(0) => return,
            Ok(n) => bytes = &bytes[n..],
            Err(Errno::EINTR | Errno::EAGAIN) => continue,
            // The host may be gone (dead-man): there is nobody left to tell.
            Err(_) => return,
        }
    }
}

fn wait_for_eof(fd: BorrowedFd<'_>) {
    let mut buf = [0u8; 4096];
    loop {
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return,
        }
        match nix::unistd::read(fd, &mut buf) {
            Ok(0) => return,
            Ok(_) | Err(Errno::EINTR | Errno::EAGAIN) => {}
            Err(_) => return,
        }
    }
}

/// Where "kill everything" sends a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KillTarget {
    /// `kill(-1)`: every process in the pid namespace but the init itself.
    Namespace,
    /// `killpg`: the command's process group.
    Group(Pid),
    /// There is nothing the init may signal.
    Nobody,
}

/// The one guard on `kill(-1)`: outside a pid namespace it would reach every process of
/// the user on the host, so only PID 1 may use it; everyone else signals the command's
/// group, and never a group id that `kill` would read as "mine" (0) or "everyone" (1).
fn kill_target(is_pid1: bool, pgid: Option<Pid>) -> KillTarget {
    match pgid {
        _ if is_pid1 => KillTarget::Namespace,
        Some(g) if g.as_raw() > 1 => KillTarget::Group(g),
        _ => KillTarget::Nobody,
    }
}

fn kill_everything(sig: Signal, pgid: Option<Pid>) {
    // ESRCH (nobody left) is the expected answer near the end, and nothing else can be done
    // about an error here anyway.
    let _ = match kill_target(is_pid1(), pgid) {
        KillTarget::Namespace => kill(Pid::from_raw(-1), sig),
        KillTarget::Group(g) => killpg(g, sig),
        KillTarget::Nobody => Ok(()),
    };
}

/// The command, started.
#[derive(Debug)]
struct Running {
    child: Child,
    pid: Pid,
    started: Instant,
    oom_guard: Option<String>,
}

/// What the supervision found out.
#[derive(Debug)]
struct Ended {
    wait: WaitStatus,
    stopped_by: Option<StoppedBy>,
    wall_time: Duration,
    pgid: Option<Pid>,
    stdin_open: bool,
    oom_guard: Option<String>,
}

fn spawn(spec: &InitSpec) -> Result<Running, String> {
    let Some((prog, rest)) = spec.argv.split_first() else {
        return Err("cannot execute an empty argv".into());
    };
    let mut cmd = Command::new(prog);
    cmd.args(rest)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.cwd)
        .stdin(Stdio::null())
        .process_group(0);
    let rx =
        raw::prepare_child(&mut cmd, spec.child_oom_score_adj).map_err(|e| format!("cannot set up {prog}: {e}"))?;
    let started = Instant::now();
    let child = cmd.spawn().map_err(|e| format!("cannot execute {prog}: {e}"))?;
    // Closes the parent's copy of the errno pipe's write end, so its read below ends.
    drop(cmd);
    let pid = Pid::from_raw(child.id() as i32);
    let oom_guard = spec.child_oom_score_adj.zip(rx).map(|(n, rx)| oom_report(n, pid, rx));
    Ok(Running { child, pid, started, oom_guard })
}

/// The crate's only unsafe code: signal dispositions and the fork-to-exec window, which
/// the safe APIs do not reach.
mod raw {
    #![expect(
        unsafe_code,
        reason = "sigaction to SIG_DFL, and pre_exec to clean the command's signal state and set \
                  its OOM score before it runs; the pre_exec closure does not allocate and makes \
                  only async-signal-safe calls (sigaction, sigprocmask, prctl, open, write, close)"
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
    pub(super) const HANDLED: [Signal; 5] =
        [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGCHLD];

    fn default_dispositions() {
        let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
        for sig in HANDLED {
            // SAFETY: installing SIG_DFL runs no code of ours in signal context.
            let _ = unsafe { sigaction(sig, &dfl) };
        }
    }

    /// Undoes an inherited SIG_IGN: an ignored SIGCHLD would make the kernel reap the
    /// command behind the init's back, losing its status.
    pub(super) fn reset_own_dispositions() {
        default_dispositions();
    }

    /// Sets up the fork-to-exec window: the command starts with default dispositions and an
    /// empty mask (std leaves the init's blocked set in place), and, when `oom` is set,
    /// writes it to its own `oom_score_adj` so even its first instruction runs with it.
    /// Returns the read end of a pipe on which the child reports that write's errno.
    pub(super) fn prepare_child(cmd: &mut Command, oom: Option<i32>) -> io::Result<Option<OwnedFd>> {
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
                default_dispositions();
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

fn wait_status(st: ExitStatus) -> WaitStatus {
    match (st.code(), st.signal()) {
        (Some(c), _) => WaitStatus::Code(c),
        (None, Some(s)) => WaitStatus::Signal(s),
        // waitpid without WUNTRACED reports only exits and deaths.
        (None, None) => WaitStatus::Signal(0),
    }
}

/// The supervision loop's state.
#[derive(Debug)]
struct Supervisor {
    running: Running,
    end: Option<(WaitStatus, Instant)>,
    stopped_by: Option<StoppedBy>,
    kill_at: Option<Instant>,
    stdin_open: bool,
    grace: Duration,
}

impl Running {
    fn supervise(self, signals: &SignalFd, spec: &InitSpec) -> Ended {
        let mut s = Supervisor {
            running: self,
            end: None,
            stopped_by: None,
            kill_at: None,
            stdin_open: true,
            grace: Duration::from_millis(spec.grace_ms),
        };
        s.run(signals);
        let (wait, at) = s.end.expect("the loop only ends with the command");
        Ended {
            wait,
            stopped_by: s.stopped_by,
            wall_time: at.saturating_duration_since(s.running.started),
            pgid: Some(s.running.pid),
            stdin_open: s.stdin_open,
            oom_guard: s.running.oom_guard,
        }
    }
}

impl Supervisor {
    fn pgid(&self) -> Option<Pid> {
        Some(self.running.pid)
    }

    fn run(&mut self, signals: &SignalFd) {
        // The command may have ended before the first SIGCHLD could be read.
        self.reap_ready();
        while self.end.is_none() {
            let now = Instant::now();
            if self.kill_at.is_some_and(|t| now >= t) {
                kill_everything(Signal::SIGKILL, self.pgid());
                if self.stopped_by != Some(StoppedBy::DeadMan) {
                    self.stopped_by = Some(StoppedBy::Kill);
                }
                self.kill_at = None;
            }
            let timeout = match self.kill_at {
                None => PollTimeout::NONE,
                Some(t) => {
                    // Rounded up, so the loop does not wake just before the deadline.
                    let ms = t.saturating_duration_since(now).as_micros().div_ceil(1000);
                    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
                }
            };
            let (sig_ready, in_ready) = {
                let mut fds = vec![PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
                if self.stdin_open {
                    fds.push(PollFd::new(stdin_fd(), PollFlags::POLLIN));
                }
                match poll(&mut fds, timeout) {
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(e) => {
                        // Cannot happen with two valid fds; if it does, end the attempt
                        // rather than spin.
                        eprintln!("stevedore: init: poll failed: {e}; killing the command");
                        kill_everything(Signal::SIGKILL, self.pgid());
                        self.stopped_by = Some(StoppedBy::Kill);
                        let st = self.running.child.wait().map(wait_status).unwrap_or(WaitStatus::Signal(0));
                        self.end = Some((st, Instant::now()));
                        return;
                    }
                }
                let ready = |i: usize| fds.get(i).and_then(PollFd::revents).is_some_and(|r| !r.is_empty());
                (ready(0), ready(1))
            };
            if sig_ready {
                self.drain_signals(signals);
            }
            if in_ready {
                self.read_stdin();
            }
        }
    }

    fn drain_signals(&mut self, signals: &SignalFd) {
        loop {
            let info = match signals.read_signal() {
                Ok(Some(info)) => info,
                Err(Errno::EINTR) => continue,
                Ok(None) | Err(_) => return,
            };
            match Signal::try_from(info.ssi_signo as i32) {
                Ok(Signal::SIGCHLD) => self.reap_ready(),
                Ok(Signal::SIGTERM | Signal::SIGINT) => self.begin_stop(StoppedBy::Term, self.grace),
                // Not the host's stop protocol, but the command may want them (reload, dump).
                Ok(sig @ (Signal::SIGHUP | Signal::SIGQUIT)) if self.end.is_none() => {
                    let _ = killpg(self.running.pid, sig);
                }
                _ => {}
            }
        }
    }

    fn read_stdin(&mut self) {
        let mut buf = [0u8; 512];
        match nix::unistd::read(stdin_fd(), &mut buf) {
            // Nothing is expected after the frame; whatever comes is ignored.
            Ok(n) if n > 0 => {}
            Err(Errno::EINTR | Errno::EAGAIN) => {}
            Ok(_) | Err(_) => {
                self.stdin_open = false;
                self.begin_stop(StoppedBy::DeadMan, self.grace.min(DEAD_MAN_GRACE_CAP));
            }
        }
    }

    /// SIGTERMs everything once and arms (or shortens) the SIGKILL timer.
    fn begin_stop(&mut self, cause: StoppedBy, grace: Duration) {
        if self.end.is_some() {
            return;
        }
        if self.stopped_by.is_none() {
            self.stopped_by = Some(cause);
            kill_everything(Signal::SIGTERM, self.pgid());
        }
        let at = Instant::now().checked_add(grace);
        self.kill_at = match (self.kill_at, at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    fn record_main(&mut self, st: WaitStatus) {
        if self.end.is_none() {
            self.end = Some((st, Instant::now()));
        }
    }

    /// Reaps the main child through std (which keeps the raw status: nix cannot name
    /// real-time signals) and every other exited process through nix.
    fn reap_main(&mut self) {
        if self.end.is_some() {
            return;
        }
        match self.running.child.try_wait() {
            Ok(Some(st)) => self.record_main(wait_status(st)),
            Ok(None) => {}
            // Reaped by the catch-all below in a race with an unnamed-signal death: the
            // status is lost, but the command is certainly gone.
            Err(_) => self.record_main(WaitStatus::Signal(0)),
        }
    }

    fn reap_ready(&mut self) {
        loop {
            self.reap_main();
            // WNOWAIT: look before reaping, so the main child is left for std.
            let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
            match waitid(Id::All, flags) {
                Ok(NixWait::StillAlive) | Err(Errno::ECHILD) => return,
                Ok(st) => match st.pid() {
                    Some(pid) if pid == self.running.pid => {
                        if self.end.is_some() {
                            // std reaped it already; cannot be here twice.
                            return;
                        }
                    }
                    Some(pid) => {
                        let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
                    }
                    None => return,
                },
                Err(Errno::EINTR) => {}
                Err(_) => {
                    // Some child died of a signal nix cannot name, pid unknown. If it was
                    // not the main child (checked first), reap it blindly.
                    self.reap_main();
                    match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                        Ok(NixWait::Exited(pid, c)) if pid == self.running.pid => self.record_main(WaitStatus::Code(c)),
                        Ok(NixWait::Signaled(pid, s, _)) if pid == self.running.pid => {
                            self.record_main(WaitStatus::Signal(s as i32))
                        }
                        Ok(NixWait::StillAlive) | Err(Errno::ECHILD) => return,
                        _ => {}
                    }
                }
            }
        }
    }
}

/// After the main child ended: SIGKILLs whatever is left and reaps it all, returning how
/// many had to be killed. Those that already exited by themselves are reaped first and not
/// counted.
fn reap_stragglers(pgid: Option<Pid>) -> u32 {
    loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(NixWait::StillAlive) => break,
            // EINVAL: reaped, but dead of a signal nix cannot name.
            Ok(_) | Err(Errno::EINVAL | Errno::EINTR) => {}
            Err(_) => break,
        }
    }
    kill_everything(Signal::SIGKILL, pgid);
    let mut n = 0u32;
    loop {
        match waitpid(None::<Pid>, None) {
            Ok(_) | Err(Errno::EINVAL) => n = n.saturating_add(1),
            Err(Errno::EINTR) => {}
            Err(_) => return n,
        }
    }
}

fn children_rusage() -> ChildrenRusage {
    let micros = |tv: nix::sys::time::TimeVal| {
        u64::try_from(tv.tv_sec()).unwrap_or(0) * 1_000_000 + u64::try_from(tv.tv_usec()).unwrap_or(0)
    };
    match getrusage(UsageWho::RUSAGE_CHILDREN) {
        Ok(u) => ChildrenRusage {
            user_us: micros(u.user_time()),
            system_us: micros(u.system_time()),
            max_rss_kib: u64::try_from(u.max_rss()).unwrap_or(0),
        },
        Err(_) => ChildrenRusage::default(),
    }
}

fn fs_space(path: &Path) -> Option<FsSpace> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    let frag = st.fragment_size();
    Some(FsSpace {
        total_bytes: st.blocks().saturating_mul(frag),
        // f_bavail, not f_bfree: the command is not root, the reserved blocks are not its.
        free_bytes: st.blocks_available().saturating_mul(frag),
        inodes_used: Some(st.files().saturating_sub(st.files_free())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::encode_stdin_frame;

    fn spec() -> InitSpec {
        InitSpec {
            argv: vec!["true".into()],
            env: vec![],
            cwd: "/".into(),
            grace_ms: 10,
            handler_request: None,
            child_oom_score_adj: None,
        }
    }

    #[test]
    fn frame_is_read_without_read_ahead() {
        let frame = encode_stdin_frame("00ff", &spec(), b"payload\nbytes");
        let mut bytes = frame.clone();
        bytes.extend_from_slice(b"AFTER");
        let mut cur = io::Cursor::new(bytes);
        let (nonce, got, payload) = read_frame(&mut cur).unwrap();
        assert_eq!((nonce.as_str(), got, payload.as_slice()), ("00ff", spec(), &b"payload\nbytes"[..]));
        assert_eq!(cur.position() as usize, frame.len());
    }

    #[test]
    fn malformed_frames_are_refused() {
        let frame = encode_stdin_frame("00ff", &spec(), b"xyz");
        assert!(read_frame(&frame[..frame.len() - 1]).is_err(), "truncated payload");
        assert!(read_frame(&b""[..]).is_err(), "empty stdin");
        assert!(read_frame(&b"STEVEDORE/1 nonce!\n"[..]).is_err(), "non-hex nonce");
        let bad_spec = b"STEVEDORE/1 ab\n2\n{}0\n";
        assert!(matches!(read_frame(&bad_spec[..]), Err(protocol::FrameError::Spec(_))));
    }

    #[test]
    fn non_pid1_never_kills_minus_one() {
        for g in [None, Some(-1), Some(0), Some(1), Some(2), Some(4242), Some(i32::MAX), Some(i32::MIN)] {
            let t = kill_target(false, g.map(Pid::from_raw));
            match t {
                KillTarget::Namespace => panic!("kill(-1) outside PID 1 for {g:?}"),
                KillTarget::Group(p) => assert!(p.as_raw() > 1, "{g:?} -> {p}"),
                KillTarget::Nobody => assert!(g.is_none_or(|g| g <= 1)),
            }
        }
        assert_eq!(kill_target(true, None), KillTarget::Namespace);
    }

    #[test]
    fn kill_everything_outside_pid1_kills_only_the_group() {
        assert!(!is_pid1());
        let mut child = Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        kill_everything(Signal::SIGKILL, Some(Pid::from_raw(child.id() as i32)));
        assert_eq!(child.wait().unwrap().signal(), Some(9));
    }

    #[test]
    fn wait_status_keeps_raw_numbers() {
        assert_eq!(wait_status(ExitStatus::from_raw(3 << 8)), WaitStatus::Code(3));
        assert_eq!(wait_status(ExitStatus::from_raw(9)), WaitStatus::Signal(9));
        // A real-time signal, which nix's WaitStatus cannot represent.
        assert_eq!(wait_status(ExitStatus::from_raw(40)), WaitStatus::Signal(40));
    }

    #[test]
    fn error_chain_names_the_cause() {
        let e = InitError::Control {
            file: RESULT_FILE,
            dir: "/c".into(),
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        };
        assert_eq!(error_chain(&e), "cannot write result.json in the control dir /c: permission denied");
    }
}
