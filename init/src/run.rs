//! The init's life, in order: wait for the host's Start frame; bind the takeover socket;
//! start the command; forward its streams and reports as frames, the host's stop as
//! SIGTERM, SIGKILL after the grace; when the command ends, kill and reap every straggler,
//! drain the streams, read the cgroup counters; send the MACed record and the outputs; wait
//! for the host's ack. A host that is lost may come back within the host-loss grace through
//! a takeover (see `link`); the record and outputs are then sent to it.
//!
//! Single-threaded on purpose: signals arrive through a signalfd polled beside the link and
//! the command's pipes, so no handler ever runs concurrently with the bookkeeping.

use crate::child::{self, Spawned};
use crate::handler::HandlerSocket;
use crate::link::{HIGH_WATER, Link, RETAIN_CAP, Takeover, set_nonblocking};
use crate::report::Inbox;
use crate::wire::{
    self, Decoder, FsSpace, HandlerChannel, InitRecord, KEY_LEN, Kind, Start, Started, StoppedBy, WaitStatus,
};
use crate::{cgroup, outdir};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::prctl;
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, killpg, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus as NixWait, waitid, waitpid};
use nix::unistd::{Pid, getpid};
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

/// Exit code when the init cannot do its job at all (no valid Start, no signal handling).
pub const EXIT_SETUP_FAILED: i32 = 125;

/// The dead-man switch does not honour a long grace: nobody waits for a clean shutdown.
const DEAD_MAN_GRACE_CAP: Duration = Duration::from_secs(2);
const CHUNK: usize = wire::MAX_CHUNK;
/// What is still taken from the command's pipes after it ended, per pipe.
const AFTER_END_DRAIN: u64 = 16 << 20;

/// How the rung started the init (its arguments).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// Give up when no Start frame came within this long (a Pod whose host died before it
    /// spoke: nothing else would ever end it). `None`: wait as long as it takes.
    pub start_within: Option<Duration>,
    /// Bytes to hold in the attempt's cgroup until every process of the attempt is gone
    /// (`reserve`): the rung added them to the cgroup's limit.
    pub reserve_bytes: u64,
    /// A seccomp filter to install on itself before anything else (`seccomp`): the oci rung's,
    /// compiled once by the host instead of by the runtime on every start.
    pub seccomp: Option<std::path::PathBuf>,
}

impl Options {
    /// Parses the init's arguments (`[--start-within-ms MS] [--reserve BYTES] [--seccomp
    /// PATH]`, each at most once, in any order).
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Self::default();
        let mut it = args.iter();
        let (mut within, mut reserve) = (false, false);
        while let Some(flag) = it.next() {
            let number = |it: &mut std::slice::Iter<'_, String>, what: &str| {
                it.next().and_then(|v| v.parse::<u64>().ok()).ok_or_else(|| format!("{flag} takes a number of {what}"))
            };
            match flag.as_str() {
                "--start-within-ms" if !within => {
                    within = true;
                    o.start_within = Some(Duration::from_millis(number(&mut it, "milliseconds")?));
                }
                "--reserve" if !reserve => {
                    reserve = true;
                    o.reserve_bytes = number(&mut it, "bytes")?;
                }
                "--seccomp" if o.seccomp.is_none() => {
                    let path = it.next().filter(|p| p.starts_with('/')).ok_or("--seccomp takes an absolute path")?;
                    o.seccomp = Some(path.into());
                }
                other => return Err(format!("unexpected argument {other:?}")),
            }
        }
        Ok(o)
    }
}

/// Runs the init; returns the process exit code.
pub fn main() -> i32 {
    main_with(Options::default())
}

/// Runs the init as the rung's [`Options`] say; returns the process exit code.
pub fn main_with(options: Options) -> i32 {
    // Before anything else, the link's first frame included: from here on the init is under
    // the same filter as the command it will start, as when the runtime installed it.
    if let Some(path) = &options.seccomp
        && let Err(why) = crate::seccomp::install_from(path)
    {
        let _ = writeln!(io::stderr(), "stevedore-init: {why}");
        return EXIT_SETUP_FAILED;
    }
    // Whatever the host inherited to this process (a worker's stray descriptors) goes no
    // further than the init: nothing from 3 on survives the command's exec.
    child::raw::cloexec_from(3);
    let link = match Link::on_stdio() {
        Ok(l) => l,
        Err(e) => {
            let _ = writeln!(io::stderr(), "stevedore-init: cannot take the link: {e}");
            return EXIT_SETUP_FAILED;
        }
    };
    match setup() {
        Ok((signals, pid1)) => {
            let mut init = Init::new(signals, pid1, link);
            init.start_by = options.start_within.map(|w| Instant::now() + w);
            // Before the Start frame, so a parked init holds it while it waits and a cold
            // one while the host sends the frame: never on the command's path.
            init.reserve = crate::reserve::Reserve::hold(options.reserve_bytes);
            // Likewise off the command's path: done before the first frame is read, and
            // ended by the host's first bytes (the claim never waits for it). Hints that do
            // not parse warm nothing; the attempt is not the hints'.
            if let Ok(Some(w)) = crate::warm::Warm::from_env() {
                let link = init.link.input();
                let claimed = || {
                    let mut fds = [PollFd::new(link, PollFlags::POLLIN)];
                    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
                };
                init.read_ahead = crate::warm::before_park(&w, &claimed);
            }
            init.run()
        }
        Err(why) => {
            let _ = writeln!(io::stderr(), "stevedore-init: {why}");
            EXIT_SETUP_FAILED
        }
    }
}

fn setup() -> Result<(SignalFd, bool), String> {
    // Blocked before anything else, so a SIGTERM that arrives early stays pending in the
    // signalfd and is honoured once there is a command to forward it to.
    let mut mask = SigSet::empty();
    for s in child::raw::HANDLED {
        mask.add(s);
    }
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None).map_err(|e| format!("cannot block signals: {e}"))?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| format!("cannot open a signalfd: {e}"))?;
    child::raw::init_dispositions();
    // Before the key is in memory: the command runs as the same uid and could otherwise read
    // it from /proc/1/mem, or take the init's descriptors through /proc/1/fd.
    prctl::set_dumpable(false).map_err(|e| format!("cannot make the init non-dumpable: {e}"))?;
    let pid1 = getpid() == Pid::from_raw(1);
    if !pid1 {
        // Outside a pid namespace (tests, the process rung), orphans would go to the host's
        // init; as a subreaper they come back here, to be counted and reaped.
        let _ = prctl::set_child_subreaper(true);
    }
    Ok((signals, pid1))
}

/// Where "kill everything" sends a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KillTarget {
    /// `kill(-1)`: every process in the pid namespace but the init itself.
    Namespace,
    /// `killpg`: the command's process group.
    Group(Pid),
    /// There is nothing the init may signal.
    Nobody,
}

/// The one guard on `kill(-1)`: outside a pid namespace it would reach every process of the
/// user on the host, so only PID 1 may use it; everyone else signals the command's group,
/// and never a group id that `kill` would read as "mine" (0) or "everyone" (1).
pub(crate) fn kill_target(is_pid1: bool, pgid: Option<Pid>) -> KillTarget {
    match pgid {
        _ if is_pid1 => KillTarget::Namespace,
        Some(g) if g.as_raw() > 1 => KillTarget::Group(g),
        _ => KillTarget::Nobody,
    }
}

/// The direct children of `parent`, from `/proc` (outside a pid namespace, the processes
/// that left the command's group and were reparented to the init as subreaper).
fn children_of(parent: Pid) -> Vec<Pid> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // The command name may hold spaces and parentheses: fields start after the last ')'.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
        if ppid == Some(parent.as_raw()) {
            found.push(Pid::from_raw(pid));
        }
    }
    found
}

/// Every process `/proc` lists but `spare`.
fn all_but(spare: &[Pid]) -> Vec<Pid> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .map(Pid::from_raw)
        .filter(|p| !spare.contains(p))
        .collect()
}

/// The first line of this sandbox's `/proc/version`, bounded and printable: what kernel the
/// attempt ran on (gVisor's own, a VM's, or the host's).
fn kernel_line() -> Option<String> {
    let mut line = std::fs::read_to_string("/proc/version").ok()?.lines().next()?.to_owned();
    line.retain(|c| !c.is_control());
    if line.len() > wire::MAX_KERNEL_LINE {
        let mut at = wire::MAX_KERNEL_LINE;
        while !line.is_char_boundary(at) {
            at -= 1;
        }
        line.truncate(at);
    }
    Some(line)
}

fn wait_status(st: ExitStatus) -> WaitStatus {
    match (st.code(), st.signal()) {
        (Some(c), _) => WaitStatus::Code(c),
        (None, Some(s)) => WaitStatus::Signal(s),
        // waitpid without WUNTRACED reports only exits and deaths.
        (None, None) => WaitStatus::Signal(0),
    }
}

/// Writes Output frames straight to the link, blocking (the command is gone by then).
struct OutputFrames<'a> {
    link: &'a mut Link,
    buf: Vec<u8>,
}

/// Output frames go out this many bytes at a time (16 frames in one `writev`): the engine's
/// copy of the init's stdout costs far less per byte fed large writes (containerd-shim, here:
/// 1.6 CPU-seconds per GiB written 1 MiB at a time, 2.5 at 64 KiB, 4.4 one frame at a time).
const OUTPUT_BATCH: usize = 1 << 20;

impl OutputFrames<'_> {
    /// Frames what `buf` holds (not written yet).
    fn stage(&mut self) {
        if !self.buf.is_empty() {
            self.link.push(Kind::Output, &self.buf);
            self.buf.clear();
        }
    }

    fn alive(&self) -> io::Result<()> {
        if self.link.out_dead { Err(io::Error::new(io::ErrorKind::BrokenPipe, "the host is gone")) } else { Ok(()) }
    }
}

impl Write for OutputFrames<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = if data.len() >= CHUNK / 4 {
            // A large write is framed as it is, never copied into `buf` first (the frame
            // holds its own copy for a resume anyway). `tar` writes a file's content 8 KiB at
            // a time today: those go through `buf` below.
            self.stage();
            let n = data.len().min(CHUNK);
            self.link.push(Kind::Output, &data[..n]);
            n
        } else {
            let n = data.len().min(CHUNK - self.buf.len());
            self.buf.extend_from_slice(&data[..n]);
            if self.buf.len() == CHUNK {
                self.stage();
            }
            n
        };
        if self.link.queued() >= OUTPUT_BATCH {
            self.link.flush_all();
        }
        self.alive().map(|()| n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stage();
        self.link.flush_all();
        self.alive()
    }
}

/// One of the command's output pipes.
#[derive(Debug)]
struct Pipe {
    fd: Option<OwnedFd>,
    kind: Kind,
    bytes: u64,
}

impl Pipe {
    /// Reads one chunk into frames; `false` once the pipe is closed.
    fn read_into(&mut self, link: &mut Link, buf: &mut [u8]) -> bool {
        let Some(fd) = &self.fd else { return false };
        loop {
            match nix::unistd::read(fd, buf) {
                Ok(0) => break,
                Ok(n) => {
                    self.bytes += n as u64;
                    link.push(self.kind, &buf[..n]);
                    return true;
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return true,
                Err(_) => break,
            }
        }
        self.fd = None;
        false
    }
}

#[derive(Debug)]
struct Init {
    /// What the init read ahead while parked (`warm`), for the record.
    read_ahead: Option<crate::warm::ReadAhead>,
    /// The file the command's program resolved to (`warm::resolve`), for the record.
    program: Option<String>,
    signals: SignalFd,
    pid1: bool,
    link: Link,
    start: Option<Start>,
    key: [u8; KEY_LEN],
    payload: Vec<u8>,
    /// The host is lost right now (no takeover since).
    host_lost: bool,
    host_lost_ever: bool,
    /// Told to stop (SIGTERM), or the host-loss grace ran out: nobody waits for a takeover.
    dismissed: bool,
    abandon_at: Option<Instant>,
    takeover: Option<Takeover>,
    takeovers: u32,
    command_pid: i32,
    /// The first line of the sandbox's `/proc/version`, read once.
    kernel: Option<String>,
    /// The process carrying the link since a takeover (`stevedore-init relay`, run by the
    /// engine's exec in the same pid namespace): spared when everything else is killed.
    relay: Option<Pid>,
    /// The number of the record's frame once a delivery began: a delivery a takeover
    /// interrupts starts again from there.
    record_number: Option<u64>,
    /// The command's stdin, when it comes from the host.
    stdin: Option<crate::stdin::StdinPump>,
    /// The master side of the command's terminal, when it has one: `Resize` sets its size.
    tty: Option<OwnedFd>,
    /// When a Start frame must have come by (`None`: wait for it as long as it takes).
    start_by: Option<Instant>,
    /// Samples the attempt's resources while the command runs, when the Start frame asks.
    sampler: Option<crate::sampler::Sampler>,
    /// Held until every process of the attempt is gone, then let go for the delivery.
    reserve: crate::reserve::Reserve,
    /// What the kernel said of the init once it gave up root (`Start::credentials`).
    credentials: Option<wire::CredentialsSeen>,
}

/// The command's channels the supervision loop reads and writes.
#[derive(Debug)]
struct Channels {
    pipes: [Pipe; 2],
    handler: Option<HandlerSocket>,
    inbox: Inbox,
}

/// The handler runner's socket, its request and payload queued to be written.
fn handler_socket(start: &Start, fd: OwnedFd, payload: &[u8]) -> HandlerSocket {
    let mut out = Vec::new();
    let request = serde_json::to_vec(start.handler.as_ref().expect("a socket means a handler"))
        .expect("a request always serialises");
    wire::encode_into(&mut out, Kind::HandlerRequest, &request);
    wire::encode_into(&mut out, Kind::HandlerPayload, payload);
    set_nonblocking(fd.as_fd(), true);
    HandlerSocket {
        fd: Some(fd),
        decoder: Decoder::new(|k| matches!(k, Kind::HandlerHello | Kind::HandlerRecord)),
        out,
        out_at: 0,
        received: 0,
        channel: HandlerChannel::default(),
    }
}

/// What running the command found out.
#[derive(Debug)]
struct Ended {
    wait: WaitStatus,
    stopped_by: Option<StoppedBy>,
    wall_time: Duration,
    pgid: Option<Pid>,
    oom_guard: Option<String>,
    pipes: [Pipe; 2],
    handler: Option<HandlerSocket>,
    inbox: Option<Inbox>,
}

/// How waiting after the record ended.
enum AfterRecord {
    Acked,
    TakenOver,
    Abandoned,
}

/// What a poll slot is.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Signals,
    HostIn,
    HostOut,
    Pipe(usize),
    Handler,
    Inbox,
    Takeover,
    Stdin,
}

impl Init {
    fn new(signals: SignalFd, pid1: bool, link: Link) -> Self {
        Self {
            signals,
            pid1,
            link,
            start: None,
            key: [0; KEY_LEN],
            payload: Vec::new(),
            host_lost: false,
            host_lost_ever: false,
            dismissed: false,
            abandon_at: None,
            takeover: None,
            takeovers: 0,
            command_pid: 0,
            kernel: None,
            relay: None,
            record_number: None,
            stdin: None,
            tty: None,
            start_by: None,
            sampler: None,
            reserve: crate::reserve::Reserve::default(),
            credentials: None,
            read_ahead: None,
            program: None,
        }
    }

    fn diag(&mut self, text: &str) {
        let _ = writeln!(io::stderr(), "stevedore-init: {text}");
        self.link.push(Kind::Diag, wire::cap_text(text, Kind::Diag.max_body()).as_bytes());
    }

    fn kill_everything(&self, sig: Signal, pgid: Option<Pid>) {
        // ESRCH (nobody left) is the expected answer near the end, and nothing else can be
        // done about an error here anyway.
        let _ = match kill_target(self.pid1, pgid) {
            KillTarget::Namespace if self.relay.is_some() => {
                for pid in all_but(&[getpid(), self.relay.expect("checked")]) {
                    let _ = kill(pid, sig);
                }
                Ok(())
            }
            KillTarget::Namespace => kill(Pid::from_raw(-1), sig),
            KillTarget::Group(g) => killpg(g, sig),
            KillTarget::Nobody => Ok(()),
        };
    }

    fn run(mut self) -> i32 {
        if let Err(why) = self.await_start() {
            self.diag(&why);
            self.link.flush_all();
            return EXIT_SETUP_FAILED;
        }
        let start = self.start.clone().expect("await_start set it");
        // Root no longer, before anything else of the attempt: nothing of the command has
        // run and nothing it could write has been read.
        let dropped = match &start.credentials {
            Some(to) => crate::privileges::drop_to(to).map(|()| {
                self.credentials = Some(crate::privileges::seen());
            }),
            None => Ok(()),
        };
        if let Some(id) = &start.link_id {
            match Takeover::bind(id, start.takeover_uid, start.takeover_fd) {
                Ok(t) => self.takeover = Some(t),
                Err(e) => self.diag(&format!("no takeover for this attempt: {e}")),
            }
        }
        // Only a host that may come back needs what went out kept.
        self.link.retain = self.may_wait(&start);
        // Made before the command exists: its OOM baseline is then the cgroup's before it.
        self.sampler = start
            .timeline
            .as_ref()
            .map(|t| crate::sampler::Sampler::new(t, start.cgroup_dir.as_deref(), Instant::now()));
        let spawned = dropped
            .map_err(|why| wire::SpawnFailure {
                kind: wire::SpawnFailureKind::Other,
                message: format!("the init could not give up root, so no command runs: {why}"),
            })
            .and_then(|()| child::spawn(&start));
        let ended = match spawned {
            Ok(spawned) => self.supervise(&start, spawned),
            Err(failure) => {
                // Nothing ran: no timeline, rather than one of no samples.
                self.sampler = None;
                self.diag(&format!("cannot start the command: {}", failure.message));
                Ended {
                    wait: WaitStatus::SpawnFailed(failure),
                    stopped_by: None,
                    wall_time: Duration::ZERO,
                    pgid: None,
                    oom_guard: None,
                    pipes: [
                        Pipe { fd: None, kind: Kind::Stdout, bytes: 0 },
                        Pipe { fd: None, kind: Kind::Stderr, bytes: 0 },
                    ],
                    handler: None,
                    inbox: None,
                }
            }
        };
        let record = self.finish(&start, ended);
        self.deliver(&start, record);
        0
    }

    /// Reads frames until the Start frame is complete; honours SIGTERM meanwhile (a parked
    /// init that is stopped just exits).
    fn await_start(&mut self) -> Result<(), String> {
        loop {
            match self.link.decoder.next_frame() {
                Ok(Some(f)) if f.kind == Kind::Stage => self.stage(&f.body),
                Ok(Some(f)) if f.kind == Kind::Start => {
                    let (mut start, payload) = wire::decode_start_owned(f.body)?;
                    self.key = wire::parse_key(&start.key).ok_or("the start's key is not 32 hex bytes")?;
                    // Non-UTF-8 variables of the image are left out, as the host's layers are UTF-8.
                    let cwd = std::env::current_dir().ok().and_then(|p| p.into_os_string().into_string().ok());
                    start.take_image_env(
                        std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
                        cwd,
                    );
                    self.start = Some(start);
                    self.payload = payload;
                    return Ok(());
                }
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => return Err(format!("the link from the host is broken: {e}")),
            }
            if !self.link.in_open {
                return Err("the host closed the link before sending a start".into());
            }
            let mut fds = [
                PollFd::new(self.signals.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.link.input(), PollFlags::POLLIN),
            ];
            let timeout = match self.start_by {
                None => PollTimeout::NONE,
                Some(by) => {
                    let left = by.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err("no start came in time: the host is gone".into());
                    }
                    PollTimeout::from(u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX))
                }
            };
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(format!("poll failed: {e}")),
            }
            while let Ok(Some(info)) = self.signals.read_signal() {
                if matches!(Signal::try_from(info.ssi_signo as i32), Ok(Signal::SIGTERM | Signal::SIGINT)) {
                    return Err("stopped before a start arrived".into());
                }
            }
            self.link.read();
        }
    }

    /// A [`Kind::Stage`] before the Start frame (`stage`): the checks, the inputs written, the
    /// answer sent outside the numbering (the host reads it before the Start frame).
    fn stage(&mut self, body: &[u8]) {
        let answer = match serde_json::from_slice::<wire::StageSpec>(body) {
            Err(e) => Err(format!("the stage request is invalid: {e}")),
            Ok(spec) => {
                let checked = if nix::unistd::geteuid().is_root() {
                    crate::stage::check(&spec)
                } else {
                    Err("the init is not root: it cannot write root's entries".into())
                };
                let mut frames =
                    crate::stage::InputFrames { link: &mut self.link, chunk: Vec::new(), at: 0, ended: false };
                frames.ended = spec.inputs.is_none();
                let written = match (checked, &spec.inputs) {
                    (Ok(dir), Some(sent)) => crate::stage::write(&dir, &mut frames, sent),
                    (Ok(_), None) => Ok(wire::Staged::default()),
                    (Err(why), _) => Err(why),
                };
                // What the host sent and was not written is read to its end all the same.
                let _ = io::copy(&mut frames, &mut io::sink());
                written
            }
        };
        let answer = answer.unwrap_or_else(|why| wire::Staged { refused: Some(why), ..wire::Staged::default() });
        self.link.hello(Kind::Staged, &serde_json::to_vec(&answer).expect("an answer always serialises"));
        self.link.flush_all();
    }

    fn supervise(&mut self, start: &Start, s: Spawned) -> Ended {
        let (mut sup, mut ch, oom_guard) = self.channels(start, s);
        self.push_started();
        // Resolved now, just after the exec found the same path (its lookups are cached), and
        // never at the end: a command that filled its memory leaves the init nothing to spare
        // for lookups before its record (the delivery reserve is for the delivery).
        self.program = start.argv.first().and_then(|p| {
            let path = start.env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str());
            crate::warm::resolve(p, path, &start.cwd)
        });
        if let Some(sampler) = &mut self.sampler {
            sampler.begin(sup.started);
        }
        let mut buf = vec![0u8; CHUNK];
        // The command may have ended before the first SIGCHLD could be read.
        sup.reap_ready();
        while sup.end.is_none() {
            self.host_frames(&mut sup);
            self.timers(&mut sup, start, ch.handler.as_ref());
            if sup.end.is_some() {
                break;
            }
            let timeout = poll_timeout(self.next_timer(&sup, start));
            let (mut fds, slots, takeover_at) = self.poll_set(&ch);
            let polled = poll(&mut fds, timeout);
            let revents: Vec<Option<PollFlags>> = fds.iter().map(PollFd::revents).collect();
            drop(fds);
            if let Err(e) = polled
                && e != Errno::EINTR
            {
                // Cannot happen with valid fds; if it does, end the attempt rather than spin.
                self.diag(&format!("poll failed: {e}; killing the command"));
                self.kill_everything(Signal::SIGKILL, Some(sup.pid));
                sup.stopped_by = Some(StoppedBy::Kill);
                let st = sup.child.wait().map(wait_status).unwrap_or(WaitStatus::Signal(0));
                sup.end = Some((st, Instant::now()));
                break;
            }
            let takeover_ready = self.dispatch(&mut sup, &mut ch, &slots, &revents, &mut buf);
            if let Some(n) = self.stdin.as_mut().and_then(|p| p.count()) {
                self.link.push(Kind::StdinTaken, &n.to_be_bytes());
            }
            if takeover_ready {
                let ended = sup.end.is_some();
                self.try_takeover(&revents[takeover_at..], ended);
            }
            if self.link.queued() > 0 && !self.host_lost {
                self.link.flush_some();
                if self.link.out_dead {
                    self.lose_host(&mut sup, start, "the link to the host broke");
                }
            }
        }
        let (wait, at) = sup.end.take().expect("the loop only ends with the command");
        // The last sample, as the command ended: what its stragglers and the end do after is
        // not the command's.
        if let Some(s) = &mut self.sampler {
            s.sample(at);
        }
        Ended {
            wait,
            stopped_by: sup.stopped_by,
            wall_time: at.saturating_duration_since(sup.started),
            pgid: Some(sup.pid),
            oom_guard,
            pipes: ch.pipes,
            handler: ch.handler,
            inbox: Some(ch.inbox),
        }
    }

    /// The spawned command as the loop watches it: its supervisor, its pipes, its handler's
    /// socket (the request and payload queued for it), its reports' inbox, its stdin.
    fn channels(&mut self, start: &Start, s: Spawned) -> (Supervisor, Channels, Option<String>) {
        let sup = Supervisor {
            pid: s.pid,
            child: s.child,
            started: s.started,
            end: None,
            stopped_by: None,
            kill_at: None,
            grace: Duration::from_millis(start.grace_ms),
            handshake_by: start.handler.as_ref().map(|_| s.started + Duration::from_millis(start.handshake_ms)),
        };
        self.command_pid = s.pid.as_raw();
        let pipes = [
            Pipe { fd: Some(s.stdout), kind: Kind::Stdout, bytes: 0 },
            Pipe { fd: Some(s.stderr), kind: Kind::Stderr, bytes: 0 },
        ];
        let handler = s.handler.map(|fd| handler_socket(start, fd, &self.payload));
        let inbox = Inbox::new(s.report, start.scope.clone(), s.started);
        self.stdin = match &s.tty {
            Some(_) => s.stdin.map(crate::stdin::StdinPump::terminal),
            None => s.stdin.map(crate::stdin::StdinPump::new),
        };
        self.tty = s.tty;
        self.payload = Vec::new();
        for p in &pipes {
            if let Some(fd) = &p.fd {
                set_nonblocking(fd.as_fd(), true);
            }
        }
        (sup, Channels { pipes, handler, inbox }, s.oom_guard)
    }

    /// What the loop waits on now, each slot named; where the takeover's slots begin.
    fn poll_set<'a>(&'a self, ch: &'a Channels) -> (Vec<PollFd<'a>>, Vec<Slot>, usize) {
        // The command's pipes wait while the host is behind (up to the high-water mark).
        let flow = self.link.queued() < HIGH_WATER && self.link.kept() < RETAIN_CAP;
        let mut fds = vec![PollFd::new(self.signals.as_fd(), PollFlags::POLLIN)];
        let mut slots = vec![Slot::Signals];
        if self.link.in_open {
            fds.push(PollFd::new(self.link.input(), PollFlags::POLLIN));
            slots.push(Slot::HostIn);
        }
        // While the host is lost, what it has not been sent stays queued for a takeover.
        if self.link.queued() > 0 && !self.link.out_dead && !self.host_lost {
            fds.push(PollFd::new(self.link.output(), PollFlags::POLLOUT));
            slots.push(Slot::HostOut);
        }
        for (i, p) in ch.pipes.iter().enumerate() {
            if let (Some(fd), true) = (&p.fd, flow) {
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                slots.push(Slot::Pipe(i));
            }
        }
        if let Some(h) = &ch.handler
            && let Some(fd) = &h.fd
        {
            let mut ev = PollFlags::POLLIN;
            if h.out_at < h.out.len() {
                ev |= PollFlags::POLLOUT;
            }
            fds.push(PollFd::new(fd.as_fd(), ev));
            slots.push(Slot::Handler);
        }
        if let Some(fd) = ch.inbox.fd() {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
            slots.push(Slot::Inbox);
        }
        if let Some(fd) = self.stdin.as_ref().and_then(|p| p.writable()) {
            fds.push(PollFd::new(fd, PollFlags::POLLOUT));
            slots.push(Slot::Stdin);
        }
        let takeover_at = fds.len();
        if let Some(t) = &self.takeover {
            let more = t.poll_fds();
            slots.extend(std::iter::repeat_n(Slot::Takeover, more.len()));
            fds.extend(more);
        }
        (fds, slots, takeover_at)
    }

    /// Acts on what a poll found ready; whether a takeover candidate is.
    fn dispatch(
        &mut self,
        sup: &mut Supervisor,
        ch: &mut Channels,
        slots: &[Slot],
        revents: &[Option<PollFlags>],
        buf: &mut [u8],
    ) -> bool {
        let any = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
        let is = |i: usize, f: PollFlags| revents[i].is_some_and(|r| r.intersects(f));
        let mut takeover_ready = false;
        for (i, slot) in slots.iter().enumerate() {
            match slot {
                Slot::Signals if is(i, PollFlags::POLLIN) => self.drain_signals(sup),
                Slot::HostIn if is(i, any) => self.link.read(),
                Slot::Pipe(k) if is(i, any) => {
                    ch.pipes[*k].read_into(&mut self.link, buf);
                }
                Slot::Handler => {
                    if let Some(h) = &mut ch.handler {
                        if is(i, PollFlags::POLLOUT) {
                            h.write_some();
                        }
                        if is(i, any) {
                            h.read();
                        }
                    }
                }
                Slot::Inbox if is(i, any) => {
                    let link = &mut self.link;
                    ch.inbox.read(&mut |body| link.push(Kind::Report, body));
                }
                Slot::Takeover => takeover_ready = true,
                Slot::Stdin if revents[i].is_some_and(|r| !r.is_empty()) => {
                    if let Some(p) = &mut self.stdin {
                        p.write_some();
                    }
                }
                _ => {}
            }
        }
        takeover_ready
    }

    fn push_started(&mut self) {
        self.kernel = kernel_line();
        let started = Started {
            pid: self.command_pid,
            init_version: env!("CARGO_PKG_VERSION").to_owned(),
            resumed: false,
            ended: false,
            from: 0,
            kernel: self.kernel.clone(),
        };
        self.link.push(Kind::Started, &serde_json::to_vec(&started).expect("serialises"));
    }

    /// Checks the takeover candidates; on a winner, moves the link to it. Empty `revents`:
    /// look at everything now.
    fn try_takeover(&mut self, revents: &[Option<PollFlags>], ended: bool) -> bool {
        let Some(t) = &mut self.takeover else { return false };
        let won = t.ready(&self.key, revents);
        let refused = std::mem::take(&mut t.refused);
        let count = std::mem::take(&mut t.refused_count);
        for why in &refused {
            self.diag(why);
        }
        if count > refused.len() as u64 {
            self.diag(&format!("{} more takeover connections refused", count - refused.len() as u64));
        }
        let Some(won) = won else { return false };
        let from = match self.link.take_over(won.socket, won.resume) {
            Ok(from) => from,
            Err(e) => {
                self.diag(&format!("a takeover could not be completed: {e}"));
                return false;
            }
        };
        // A delivery under way starts again, whole, for the new host.
        if let Some(n) = self.record_number {
            self.link.truncate_to(n);
        }
        let hello = Started {
            pid: self.command_pid,
            init_version: env!("CARGO_PKG_VERSION").to_owned(),
            resumed: true,
            ended,
            from,
            kernel: self.kernel.clone(),
        };
        self.link.hello(Kind::Started, &serde_json::to_vec(&hello).expect("serialises"));
        self.takeovers += 1;
        // Whoever held the link before is gone or replaced: the record says the host was lost,
        // even when the new one came before the old one's end was read.
        self.host_lost_ever = true;
        self.relay = won.pid.map(Pid::from_raw);
        if won.resume == 0
            && let Some(p) = &mut self.stdin
        {
            // A restarted worker has nothing of the old one's stdin: the command's ends here.
            p.close();
        }
        if from > won.resume && won.resume > 0 {
            let text = format!("{} frames the new host did not have were no longer kept", from - won.resume);
            self.diag(&text);
        }
        self.host_lost = false;
        self.abandon_at = None;
        if self.link.cut_bytes > 0 {
            let text = format!("{} bytes of a frame to the previous host were cut", self.link.cut_bytes);
            self.diag(&text);
        }
        true
    }

    fn host_frames(&mut self, sup: &mut Supervisor) {
        loop {
            match self.link.decoder.next_frame() {
                Ok(Some(f)) => match f.kind {
                    Kind::Stop => self.begin_stop(sup, StoppedBy::Term, sup.grace),
                    Kind::Heartbeat => self.link.ack(wire::heartbeat_count(&f.body)),
                    Kind::Stdin => {
                        if let Some(Err(why)) = self.stdin.as_mut().map(|p| p.frame(&f.body)) {
                            self.diag(&format!("the command's stdin was closed: {why}"));
                        }
                    }
                    Kind::StdinEnd => {
                        if let Some(p) = &mut self.stdin {
                            p.end(wire::heartbeat_count(&f.body));
                        }
                    }
                    Kind::Resize => {
                        if let (Some(master), Some(size)) = (&self.tty, wire::resize_of(&f.body))
                            && let Err(e) = crate::child::resize(master, size)
                        {
                            self.diag(&format!("cannot resize the command's terminal: {e}"));
                        }
                    }
                    _ => {}
                },
                Ok(None) => break,
                Err(e) => {
                    let text = format!("the link from the host is broken: {e}");
                    self.diag(&text);
                    self.link.in_open = false;
                    break;
                }
            }
        }
        if !self.link.in_open && !self.host_lost {
            let start = self.start.clone().expect("started");
            self.lose_host(sup, &start, "the host closed the link");
        }
    }

    /// Whether the init may wait for a takeover after losing the host.
    fn may_wait(&self, start: &Start) -> bool {
        self.takeover.is_some() && start.host_loss_grace_ms > 0 && !self.dismissed
    }

    fn lose_host(&mut self, sup: &mut Supervisor, start: &Start, why: &str) {
        self.host_lost = true;
        self.host_lost_ever = true;
        self.diag(why);
        if self.may_wait(start) {
            self.abandon_at = Some(Instant::now() + Duration::from_millis(start.host_loss_grace_ms));
        } else {
            self.begin_stop(sup, StoppedBy::DeadMan, sup.grace.min(DEAD_MAN_GRACE_CAP));
        }
    }

    fn heartbeat_deadline(&self, start: &Start) -> Option<Instant> {
        (start.heartbeat_timeout_ms > 0 && !self.host_lost)
            .then(|| self.link.last_heard + Duration::from_millis(start.heartbeat_timeout_ms))
    }

    fn next_timer(&self, sup: &Supervisor, start: &Start) -> Option<Instant> {
        let takeover = self.takeover.as_ref().and_then(Takeover::next_timer);
        let sample = self.sampler.as_ref().map(crate::sampler::Sampler::next);
        [sup.kill_at, sup.handshake_by, self.heartbeat_deadline(start), self.abandon_at, takeover, sample]
            .into_iter()
            .flatten()
            .min()
    }

    fn timers(&mut self, sup: &mut Supervisor, start: &Start, handler: Option<&HandlerSocket>) {
        let now = Instant::now();
        if let Some(s) = self.sampler.as_mut().filter(|_| sup.end.is_none()) {
            s.tick(now);
        }
        if sup.kill_at.is_some_and(|t| now >= t) {
            self.kill_everything(Signal::SIGKILL, Some(sup.pid));
            if !matches!(sup.stopped_by, Some(StoppedBy::DeadMan | StoppedBy::Handshake)) {
                sup.stopped_by = Some(StoppedBy::Kill);
            }
            sup.kill_at = None;
        }
        if handler.is_some_and(|h| h.channel.hello.is_some()) {
            sup.handshake_by = None;
        }
        if sup.handshake_by.is_some_and(|t| now >= t) {
            sup.handshake_by = None;
            self.diag("the handler runner did not say hello in time: is it a stevedore worker binary?");
            self.begin_stop(sup, StoppedBy::Handshake, sup.grace.min(DEAD_MAN_GRACE_CAP));
        }
        if self.heartbeat_deadline(start).is_some_and(|t| now >= t) {
            self.lose_host(sup, start, "no frame from the host within the heartbeat timeout");
        }
        if self.abandon_at.is_some_and(|t| now >= t) {
            self.abandon_at = None;
            self.dismissed = true;
            self.diag("no host took the attempt over within the host-loss grace");
            self.begin_stop(sup, StoppedBy::DeadMan, sup.grace.min(DEAD_MAN_GRACE_CAP));
        }
    }

    fn drain_signals(&mut self, sup: &mut Supervisor) {
        loop {
            let info = match self.signals.read_signal() {
                Ok(Some(info)) => info,
                Err(Errno::EINTR) => continue,
                Ok(None) | Err(_) => return,
            };
            match Signal::try_from(info.ssi_signo as i32) {
                Ok(Signal::SIGCHLD) => sup.reap_ready(),
                // As PID 1, a stop comes from outside the pid namespace (the engine), where the
                // sender shows as pid 0; the command (same uid) could otherwise stop itself
                // and have it look like the host's doing.
                Ok(Signal::SIGTERM | Signal::SIGINT) if self.pid1 && info.ssi_pid != 0 => {
                    self.diag(&format!(
                        "ignored signal {} from pid {} inside the sandbox",
                        info.ssi_signo, info.ssi_pid
                    ));
                }
                Ok(Signal::SIGTERM | Signal::SIGINT) => {
                    self.dismissed = true;
                    self.begin_stop(sup, StoppedBy::Term, sup.grace);
                }
                // Not the host's stop protocol, but the command may want them (reload, dump).
                Ok(sig @ (Signal::SIGHUP | Signal::SIGQUIT)) if sup.end.is_none() => {
                    let _ = killpg(sup.pid, sig);
                }
                _ => {}
            }
        }
    }

    /// SIGTERMs everything once and arms (or shortens) the SIGKILL timer.
    fn begin_stop(&mut self, sup: &mut Supervisor, cause: StoppedBy, grace: Duration) {
        if sup.end.is_some() {
            return;
        }
        if sup.stopped_by.is_none() {
            sup.stopped_by = Some(cause);
            self.kill_everything(Signal::SIGTERM, Some(sup.pid));
        }
        let at = Instant::now().checked_add(grace);
        sup.kill_at = match (sup.kill_at, at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// After the command: stragglers, streams, reports, counters; returns the record.
    fn finish(&mut self, start: &Start, mut ended: Ended) -> InitRecord {
        // Nobody reads it any more (a straggler that does is killed next).
        self.stdin = None;
        self.tty = None;
        // A relay that has connected and proved the key is the new host, not a straggler:
        // found before everything else is killed, so it is spared.
        if self.takeover.is_some() && self.relay.is_none() {
            self.try_takeover(&[], true);
        }
        let stragglers_killed = self.reap_stragglers(ended.pgid);
        // Nothing of the command is left to take it: the room is the delivery's now, before
        // the counters are read (their files, the record and the outputs all need pages).
        let reserve_bytes = self.reserve.held_bytes();
        self.reserve.release();
        if let Some(why) = self.reserve.failed.take() {
            self.diag(&format!("no delivery reserve was held: {why}"));
        }
        // Every writer is gone (or, outside a pid namespace, escaped the group): take what
        // is in the pipes without waiting for more.
        let mut buf = vec![0u8; CHUNK];
        for p in &mut ended.pipes {
            // Bounded: outside a pid namespace an escaped process may still hold the pipe.
            let limit = p.bytes.saturating_add(AFTER_END_DRAIN);
            while p.bytes < limit && p.read_into(&mut self.link, &mut buf) && has_more(p) {
                if self.link.queued() >= HIGH_WATER {
                    self.link.flush_all();
                }
            }
        }
        if let Some(h) = &mut ended.handler {
            h.read();
        }
        let reports = match &mut ended.inbox {
            Some(inbox) => {
                let link = &mut self.link;
                inbox.read(&mut |body| link.push(Kind::Report, body));
                inbox.counts()
            }
            None => wire::ReportCounts::default(),
        };
        InitRecord {
            wait: ended.wait,
            stopped_by: ended.stopped_by,
            stragglers_killed,
            wall_time_ms: u64::try_from(ended.wall_time.as_millis()).unwrap_or(u64::MAX),
            cgroup: match &start.cgroup_dir {
                Some(dir) => cgroup::read_counters(Path::new(dir)),
                None => cgroup::unavailable("no cgroup of the attempt's own"),
            },
            rusage: children_rusage(),
            out_fs: fs_space(Path::new(&start.outputs.dir)),
            oom_guard: ended.oom_guard,
            handler: ended.handler.map(|h| h.channel),
            stdout_bytes: ended.pipes[0].bytes,
            stderr_bytes: ended.pipes[1].bytes,
            host_lost: self.host_lost_ever,
            takeovers: self.takeovers,
            reports,
            measured: start
                .measure
                .iter()
                .map(|d| wire::Measured { path: d.clone(), seen: outdir::measure(d) })
                .collect(),
            timeline: self.sampler.take().map(crate::sampler::Sampler::finish),
            reserve_bytes,
            credentials: self.credentials.take(),
            kernel: self.kernel.clone().or_else(kernel_line),
            program: self.program.take(),
            program_name: start.argv.first().filter(|p| crate::warm::valid_name(p)).cloned(),
            read_ahead: self.read_ahead.take(),
        }
    }

    /// The record as it stands now (a takeover after the end counts), MACed.
    fn sealed(&self, record: &mut InitRecord) -> Vec<u8> {
        record.takeovers = self.takeovers;
        record.host_lost |= self.host_lost_ever;
        let json = serde_json::to_vec(record).expect("a record always serialises");
        wire::seal(&self.key, &json)
    }

    /// Sends the record and the outputs, and waits for the ack; on a takeover meanwhile,
    /// sends them again to the new host.
    fn deliver(&mut self, start: &Start, mut record: InitRecord) {
        loop {
            let sealed = self.sealed(&mut record);
            if !self.link.out_dead {
                if !self.host_lost {
                    self.send_record(start, &sealed);
                } else if !self.may_wait(start) {
                    // Nobody will take over: the record goes out for whoever still reads
                    // the old link; the outputs would only be written into the void.
                    self.record_number.get_or_insert(self.link.next_number());
                    self.link.push(Kind::Record, &sealed);
                    self.link.flush_all();
                    return;
                }
            }
            match self.after_record(start) {
                AfterRecord::Acked | AfterRecord::Abandoned => return,
                AfterRecord::TakenOver => {}
            }
        }
    }

    fn send_record(&mut self, start: &Start, sealed: &[u8]) {
        self.record_number.get_or_insert(self.link.next_number());
        self.link.push(Kind::Record, sealed);
        self.link.flush_all();
        if self.link.out_dead {
            return;
        }
        // Where the host walks the output dir in place, the end only says nothing was sent.
        let mut end = match start.outputs.host_walks {
            true => wire::OutputEnd::default(),
            false => {
                let mut frames = OutputFrames { link: &mut self.link, buf: Vec::with_capacity(CHUNK) };
                let end = outdir::send(&start.outputs, &mut frames);
                let _ = frames.flush();
                end
            }
        };
        let mut body = serde_json::to_vec(&end).expect("an output end always serialises");
        if body.len() > Kind::OutputEnd.max_body() {
            end.refused.truncate(16);
            body = serde_json::to_vec(&end).expect("an output end always serialises");
        }
        self.link.push(Kind::OutputEnd, &body);
        self.link.flush_all();
    }

    /// Waits for the host's ack, so the record stays available until it arrived; a host lost
    /// meanwhile may be replaced by a takeover within the host-loss grace.
    fn after_record(&mut self, start: &Start) -> AfterRecord {
        loop {
            loop {
                match self.link.decoder.next_frame() {
                    Ok(Some(f)) if f.kind == Kind::Ack => return AfterRecord::Acked,
                    Ok(Some(f)) if f.kind == Kind::Heartbeat => self.link.ack(wire::heartbeat_count(&f.body)),
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => {
                        self.link.in_open = false;
                        break;
                    }
                }
            }
            let now = Instant::now();
            let lost =
                !self.link.in_open || self.link.out_dead || self.heartbeat_deadline(start).is_some_and(|t| now >= t);
            if lost && !self.host_lost {
                self.host_lost = true;
                self.host_lost_ever = true;
                if self.may_wait(start) {
                    self.abandon_at = Some(now + Duration::from_millis(start.host_loss_grace_ms));
                }
            }
            if self.host_lost && (!self.may_wait(start) || self.abandon_at.is_none_or(|t| now >= t)) {
                return AfterRecord::Abandoned;
            }
            let takeover = self.takeover.as_ref().and_then(Takeover::next_timer);
            let timeout =
                poll_timeout([self.heartbeat_deadline(start), self.abandon_at, takeover].into_iter().flatten().min());
            let mut fds = vec![PollFd::new(self.signals.as_fd(), PollFlags::POLLIN)];
            if self.link.in_open {
                fds.push(PollFd::new(self.link.input(), PollFlags::POLLIN));
            }
            let takeover_at = fds.len();
            if let Some(t) = &self.takeover {
                fds.extend(t.poll_fds());
            }
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => return AfterRecord::Abandoned,
            }
            let revents: Vec<Option<PollFlags>> = fds.iter().map(PollFd::revents).collect();
            drop(fds);
            while let Ok(Some(info)) = self.signals.read_signal() {
                if matches!(Signal::try_from(info.ssi_signo as i32), Ok(Signal::SIGTERM | Signal::SIGINT)) {
                    return AfterRecord::Abandoned;
                }
            }
            if self.takeover.is_some() && self.try_takeover(&revents[takeover_at..], true) {
                return AfterRecord::TakenOver;
            }
            self.link.read();
        }
    }

    /// SIGKILLs whatever is left after the main child ended and reaps it all; returns how
    /// many had to be killed. Those that had already exited by themselves are reaped first
    /// and not counted. Outside a pid namespace, processes that left the command's group
    /// come back to the init (a subreaper) as their parents die, and are killed in turn.
    fn reap_stragglers(&self, pgid: Option<Pid>) -> u32 {
        loop {
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(NixWait::StillAlive) => break,
                // EINVAL: reaped, but dead of a signal nix cannot name.
                Ok(_) | Err(Errno::EINVAL | Errno::EINTR) => {}
                Err(_) => break,
            }
        }
        let me = getpid();
        let mut n = 0u32;
        loop {
            self.kill_everything(Signal::SIGKILL, pgid);
            if !self.pid1 {
                for pid in children_of(me) {
                    let _ = kill(pid, Signal::SIGKILL);
                }
            }
            match waitpid(None::<Pid>, None) {
                Ok(_) | Err(Errno::EINVAL) => n = n.saturating_add(1),
                Err(Errno::EINTR) => {}
                Err(_) => return n,
            }
        }
    }
}

fn poll_timeout(at: Option<Instant>) -> PollTimeout {
    at.map_or(PollTimeout::NONE, |t| {
        // Rounded up, so the loop does not wake just before the deadline.
        let ms = t.saturating_duration_since(Instant::now()).as_micros().div_ceil(1000);
        PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
    })
}

/// The supervision loop's view of the command.
#[derive(Debug)]
struct Supervisor {
    pid: Pid,
    child: std::process::Child,
    started: Instant,
    end: Option<(WaitStatus, Instant)>,
    stopped_by: Option<StoppedBy>,
    kill_at: Option<Instant>,
    grace: Duration,
    handshake_by: Option<Instant>,
}

impl Supervisor {
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
        match self.child.try_wait() {
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
                    Some(pid) if pid == self.pid => {
                        if self.end.is_some() {
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
                    // Some child died of a signal nix cannot name, pid unknown. If it was not
                    // the main child (checked first), reap it blindly.
                    self.reap_main();
                    match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                        Ok(NixWait::Exited(pid, c)) if pid == self.pid => self.record_main(WaitStatus::Code(c)),
                        Ok(NixWait::Signaled(pid, s, _)) if pid == self.pid => {
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

/// Whether a pipe has something (data or EOF) to read right now.
fn has_more(p: &Pipe) -> bool {
    let Some(fd) = &p.fd else { return false };
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

fn children_rusage() -> wire::ChildrenRusage {
    let micros = |tv: nix::sys::time::TimeVal| {
        u64::try_from(tv.tv_sec()).unwrap_or(0) * 1_000_000 + u64::try_from(tv.tv_usec()).unwrap_or(0)
    };
    match getrusage(UsageWho::RUSAGE_CHILDREN) {
        Ok(u) => wire::ChildrenRusage {
            user_us: micros(u.user_time()),
            system_us: micros(u.system_time()),
            max_rss_kib: u64::try_from(u.max_rss()).unwrap_or(0),
        },
        Err(_) => wire::ChildrenRusage::default(),
    }
}

/// Space on the output filesystem.
fn fs_space(path: &Path) -> Option<FsSpace> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    let frag = st.fragment_size();
    Some(FsSpace {
        total_bytes: st.blocks().saturating_mul(frag),
        // f_bavail, not f_bfree: the command is not root, the reserved blocks are not its.
        free_bytes: st.blocks_available().saturating_mul(frag),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_pid1_never_kills_minus_one() {
        for g in [None, Some(-1), Some(0), Some(1), Some(2), Some(4242), Some(i32::MAX), Some(i32::MIN)] {
            match kill_target(false, g.map(Pid::from_raw)) {
                KillTarget::Namespace => panic!("kill(-1) outside PID 1 for {g:?}"),
                KillTarget::Group(p) => assert!(p.as_raw() > 1, "{g:?} -> {p}"),
                KillTarget::Nobody => assert!(g.is_none_or(|g| g <= 1)),
            }
        }
        assert_eq!(kill_target(true, None), KillTarget::Namespace);
    }

    #[test]
    fn the_options_are_each_given_once_with_a_number() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let o = Options::parse(&args(&["--reserve", "8388608", "--start-within-ms", "300"])).unwrap();
        assert_eq!(
            o,
            Options { start_within: Some(Duration::from_millis(300)), reserve_bytes: 8 << 20, seccomp: None }
        );
        assert_eq!(Options::parse(&[]).unwrap(), Options::default());
        let o = Options::parse(&args(&["--seccomp", "/t/seccomp.bpf"])).unwrap();
        assert_eq!(o.seccomp.as_deref(), Some(Path::new("/t/seccomp.bpf")));
        for bad in [
            &["--reserve"][..],
            &["--reserve", "8m"],
            &["--reserve", "1", "--reserve", "2"],
            &["--other"],
            &["--seccomp"],
            &["--seccomp", "relative.bpf"],
            &["--seccomp", "/a", "--seccomp", "/b"],
        ] {
            assert!(Options::parse(&args(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn wait_status_keeps_raw_numbers() {
        assert_eq!(wait_status(ExitStatus::from_raw(3 << 8)), WaitStatus::Code(3));
        assert_eq!(wait_status(ExitStatus::from_raw(9)), WaitStatus::Signal(9));
        // A real-time signal, which nix's WaitStatus cannot represent.
        assert_eq!(wait_status(ExitStatus::from_raw(40)), WaitStatus::Signal(40));
    }
}
