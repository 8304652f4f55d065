//! The init's end of the link to the host: frames in, a queue of frames out, and the
//! takeover socket through which a host that restarted (and proves the attempt key) gets the
//! link back.
//!
//! The link starts on the init's stdin and stdout (the container's attach, or the process
//! rung's pipes). A takeover moves it to the accepted socket: what the old host had not
//! been sent stays queued (from the next whole frame on), and the init carries on.

use crate::wire::{self, Decoder, HEADER_LEN, KEY_LEN, Kind};
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags};
use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, UnixAddr, accept4, bind, getsockopt, listen, socket, sockopt,
};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

/// Above this many bytes queued for the host, the command's pipes are not read (the command
/// then blocks on its own writes, as with any slow reader).
pub(crate) const HIGH_WATER: usize = 1 << 20;
/// How long a connection on the takeover socket has to prove the key (a real host's proof
/// arrives with its connection).
const PROVE_WITHIN: Duration = Duration::from_secs(2);
/// Bytes of frames that went out that are kept for a resume until the host counts them;
/// while this many wait, the command's pipes are not read (as for a slow reader).
pub(crate) const RETAIN_CAP: usize = 4 << 20;
/// Connections without a proof kept at once; past it, the oldest is evicted.
const MAX_CANDIDATES: usize = 64;
/// Connections accepted in one pass, so a flood cannot keep the init from its other work.
const MAX_ACCEPTS_AT_ONCE: usize = 256;

pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) {
    if let Ok(bits) = fcntl(fd, FcntlArg::F_GETFL) {
        let mut flags = OFlag::from_bits_truncate(bits);
        flags.set(OFlag::O_NONBLOCK, on);
        let _ = fcntl(fd, FcntlArg::F_SETFL(flags));
    }
}

fn host_kinds(k: Kind) -> bool {
    matches!(
        k,
        Kind::Start
            | Kind::Heartbeat
            | Kind::Stop
            | Kind::Ack
            | Kind::Stdin
            | Kind::StdinEnd
            | Kind::Resize
            | Kind::Stage
            | Kind::Inputs
            | Kind::InputsEnd
    )
}

/// The link to the host.
///
/// What goes out is a sequence of numbered frames (`docs/link.md`, "Resuming a cut link"):
/// the host counts what it received and says so in its heartbeats, and a host that comes
/// back through a takeover says how many it has, so what went out but never arrived is
/// sent again, once.
#[derive(Debug)]
pub(crate) struct Link {
    input: OwnedFd,
    output: OwnedFd,
    pub decoder: Decoder,
    pub in_open: bool,
    /// Writes failed for good (no reader at all): what is queued waits for a takeover.
    pub out_dead: bool,
    /// Frames numbered from `base`: the first `written` went out whole and are kept until
    /// the host counts them (when `retain`), then one of which `partial` bytes went out,
    /// then those queued.
    frames: VecDeque<Vec<u8>>,
    base: u64,
    written: usize,
    partial: usize,
    /// Bytes of the first `written` frames.
    kept_bytes: usize,
    /// Bytes of numbered frames not written yet.
    queued_bytes: usize,
    /// An unnumbered frame that goes first on a new connection (a takeover's `Started`).
    hello: Vec<u8>,
    /// Whether frames that went out are kept for a resume (a host may come back).
    pub retain: bool,
    /// Frames that went out and were dropped before the host counted them (past
    /// [`RETAIN_CAP`]): a resume from before them has a gap.
    pub dropped_unacked: u64,
    pub last_heard: Instant,
    /// Bytes of a frame cut off by a takeover (the old host got its start, never its end).
    pub cut_bytes: u64,
}

impl Link {
    /// The link on the init's own stdin and stdout, which are replaced by `/dev/null` so
    /// that dropping the link really closes them.
    pub fn on_stdio() -> io::Result<Self> {
        let input = nix::unistd::dup(io::stdin().as_fd())?;
        let output = nix::unistd::dup(io::stdout().as_fd())?;
        for fd in [&input, &output] {
            fcntl(fd.as_fd(), FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))?;
            set_nonblocking(fd.as_fd(), true);
        }
        let null = nix::fcntl::open("/dev/null", OFlag::O_RDWR | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())?;
        nix::unistd::dup2_stdin(&null)?;
        nix::unistd::dup2_stdout(&null)?;
        Ok(Self::new(input, output))
    }

    fn new(input: OwnedFd, output: OwnedFd) -> Self {
        Self {
            input,
            output,
            decoder: Decoder::new(host_kinds),
            in_open: true,
            out_dead: false,
            frames: VecDeque::new(),
            base: 0,
            written: 0,
            partial: 0,
            kept_bytes: 0,
            queued_bytes: 0,
            hello: Vec::new(),
            retain: false,
            dropped_unacked: 0,
            last_heard: Instant::now(),
            cut_bytes: 0,
        }
    }

    pub fn input(&self) -> BorrowedFd<'_> {
        self.input.as_fd()
    }

    pub fn output(&self) -> BorrowedFd<'_> {
        self.output.as_fd()
    }

    /// Bytes waiting to be written.
    pub fn queued(&self) -> usize {
        self.queued_bytes + self.hello.len()
    }

    /// Bytes that went out and wait for the host's count.
    pub fn kept(&self) -> usize {
        self.kept_bytes
    }

    /// The number the next frame pushed gets.
    pub fn next_number(&self) -> u64 {
        self.base + self.frames.len() as u64
    }

    pub fn push(&mut self, kind: Kind, body: &[u8]) {
        let mut frame = Vec::with_capacity(HEADER_LEN + body.len());
        wire::encode_into(&mut frame, kind, body);
        self.queued_bytes += frame.len();
        self.frames.push_back(frame);
    }

    /// Sends `kind` first on the current connection, outside the numbering.
    pub fn hello(&mut self, kind: Kind, body: &[u8]) {
        self.hello.clear();
        wire::encode_into(&mut self.hello, kind, body);
    }

    /// The host has the first `count` frames: they need not be kept.
    pub fn ack(&mut self, count: u64) {
        while self.base < count && self.written > 0 {
            self.pop_kept();
        }
    }

    fn pop_kept(&mut self) {
        let f = self.frames.pop_front().expect("a written frame is there");
        self.kept_bytes -= f.len();
        self.base += 1;
        self.written -= 1;
    }

    /// `n` more bytes went out.
    fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let rest = self.frames[self.written].len() - self.partial;
            if n < rest {
                self.partial += n;
                self.queued_bytes -= n;
                return;
            }
            n -= rest;
            self.queued_bytes -= rest;
            self.kept_bytes += self.frames[self.written].len();
            self.written += 1;
            self.partial = 0;
        }
    }

    /// Drops what went out and need not (or cannot) be kept.
    fn trim(&mut self) {
        while self.written > 0 && (!self.retain || self.kept_bytes > RETAIN_CAP) {
            if self.retain {
                self.dropped_unacked += 1;
            }
            self.pop_kept();
        }
    }

    /// Writes what it can without blocking.
    pub fn flush_some(&mut self) {
        while !self.out_dead {
            let wrote = if !self.hello.is_empty() {
                nix::unistd::write(&self.output, &self.hello).map(|n| {
                    self.hello.drain(..n);
                })
            } else if self.written < self.frames.len() {
                let first = &self.frames[self.written][self.partial..];
                let slices: Vec<io::IoSlice<'_>> = std::iter::once(io::IoSlice::new(first))
                    .chain(self.frames.range(self.written + 1..).take(63).map(|f| io::IoSlice::new(f)))
                    .collect();
                nix::sys::uio::writev(&self.output, &slices).map(|n| self.advance(n))
            } else {
                break;
            };
            match wrote {
                Ok(()) | Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => break,
                Err(_) => self.out_dead = true,
            }
        }
        self.trim();
    }

    /// Writes everything, blocking (unless the host is gone for good).
    pub fn flush_all(&mut self) {
        set_nonblocking(self.output.as_fd(), false);
        self.flush_some();
        set_nonblocking(self.output.as_fd(), true);
    }

    /// Reads what the host sent; the caller takes the frames from `decoder`.
    pub fn read(&mut self) {
        if !self.in_open {
            return;
        }
        let mut buf = [0u8; 16 << 10];
        loop {
            match nix::unistd::read(&self.input, &mut buf) {
                Ok(0) => {
                    self.in_open = false;
                    return;
                }
                Ok(n) => {
                    self.last_heard = Instant::now();
                    self.decoder.feed(&buf[..n]);
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return,
                Err(_) => {
                    self.in_open = false;
                    return;
                }
            }
        }
    }

    /// Moves the link to `socket`, a host that proved the key and has the first `resume`
    /// frames; returns the number of the first frame it will be sent. A host with none
    /// (`resume` 0: a restarted worker) gets what had not gone out yet, a frame the old host
    /// got only part of cut; a host with some gets everything after them that is still
    /// kept (a gap, if the cap dropped some).
    pub fn take_over(&mut self, socket: OwnedFd, resume: u64) -> io::Result<u64> {
        let output = socket.try_clone()?;
        set_nonblocking(socket.as_fd(), true);
        if resume == 0 || !self.retain {
            while self.written > 0 {
                self.pop_kept();
            }
            if self.partial > 0 {
                let f = self.frames.pop_front().expect("a frame in part");
                self.cut_bytes += (f.len() - self.partial) as u64;
                self.queued_bytes -= f.len() - self.partial;
                self.base += 1;
                self.partial = 0;
            }
        } else {
            self.queued_bytes += self.kept_bytes + self.partial;
            self.kept_bytes = 0;
            self.written = 0;
            self.partial = 0;
            while self.base < resume.min(self.next_number()) {
                let f = self.frames.pop_front().expect("below next_number");
                self.queued_bytes -= f.len();
                self.base += 1;
            }
        }
        self.hello.clear();
        self.input = socket;
        self.output = output;
        self.decoder = Decoder::new(host_kinds);
        self.in_open = true;
        self.out_dead = false;
        self.last_heard = Instant::now();
        Ok(self.base)
    }

    /// Drops the queued frames numbered `from` on (none of them went out on this
    /// connection), so that what is pushed next is numbered `from`: a delivery that starts
    /// again after a takeover replaces the one that was cut.
    pub fn truncate_to(&mut self, from: u64) {
        let sent = self.written + usize::from(self.partial > 0);
        while self.next_number() > from && self.frames.len() > sent {
            let f = self.frames.pop_back().expect("more than sent");
            self.queued_bytes -= f.len();
        }
    }
}

/// One connection on the takeover socket whose proof has not arrived (yet).
#[derive(Debug)]
struct Candidate {
    fd: OwnedFd,
    /// The peer's pid, as the kernel says (in the init's pid namespace).
    pid: Option<i32>,
    decoder: Decoder,
    prove_by: Instant,
}

/// A connection that proved the attempt key.
#[derive(Debug)]
pub(crate) struct Won {
    pub socket: OwnedFd,
    /// The peer's pid (the relay, spared when everything else is killed).
    pub pid: Option<i32>,
    /// How many of the init's frames the new host already has.
    pub resume: u64,
}

/// The takeover socket and the candidates on it.
///
/// A host proves the attempt key in its first frame, written right after it connects
/// (`wire::takeover_proof`), so a real host's proof is normally readable the moment its
/// connection is accepted. Connections are accepted as they come, the backlog drained every
/// time, and those without a proof wait in a bounded set from which the oldest is evicted:
/// a flood of silent connections from inside the sandbox costs the sandbox its own CPU and
/// can make a host retry (the relay does, until its deadline), but cannot hold a slot the
/// host needs.
#[derive(Debug)]
pub(crate) struct Takeover {
    listener: OwnedFd,
    link_id: String,
    only_uid: Option<u32>,
    candidates: VecDeque<Candidate>,
    /// Nonces of takeovers that succeeded: a proof works once.
    used: Vec<[u8; wire::NONCE_LEN]>,
    /// Candidates that failed, for the record's diagnostics (the first few), and how many.
    pub refused: Vec<String>,
    pub refused_count: u64,
}

impl Takeover {
    /// Binds the abstract socket named for `link_id`, or takes the listening socket the init
    /// inherited as `inherited`. Done before the command starts, so nothing of the sandbox can
    /// hold the name first.
    pub fn bind(link_id: &str, only_uid: Option<u32>, inherited: Option<i32>) -> Result<Self, String> {
        if !wire::valid_link_id(link_id) {
            return Err(format!("invalid link id {link_id:?}"));
        }
        let listener = match inherited {
            Some(fd) => crate::child::raw::take_listener(fd)?,
            None => {
                let listener = socket(
                    AddressFamily::Unix,
                    SockType::Stream,
                    SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
                    None,
                )
                .map_err(|e| format!("socket: {e}"))?;
                let addr = UnixAddr::new_abstract(wire::takeover_socket_name(link_id).as_bytes())
                    .map_err(|e| format!("address: {e}"))?;
                bind(std::os::fd::AsRawFd::as_raw_fd(&listener), &addr).map_err(|e| format!("bind: {e}"))?;
                listen(&listener, Backlog::new(64).expect("64 is a valid backlog"))
                    .map_err(|e| format!("listen: {e}"))?;
                listener
            }
        };
        set_nonblocking(listener.as_fd(), true);
        Ok(Self {
            listener,
            link_id: link_id.to_owned(),
            only_uid,
            candidates: VecDeque::new(),
            used: Vec::new(),
            refused: Vec::new(),
            refused_count: 0,
        })
    }

    /// The fds to poll, in the order [`Takeover::ready`] expects: the listener, then each
    /// candidate.
    pub fn poll_fds(&self) -> Vec<PollFd<'_>> {
        let mut fds = Vec::with_capacity(1 + self.candidates.len());
        fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
        for c in &self.candidates {
            fds.push(PollFd::new(c.fd.as_fd(), PollFlags::POLLIN));
        }
        fds
    }

    /// The earliest proof deadline.
    pub fn next_timer(&self) -> Option<Instant> {
        self.candidates.iter().map(|c| c.prove_by).min()
    }

    fn refuse(&mut self, why: String) {
        self.refused_count += 1;
        if self.refused.len() < 8 {
            self.refused.push(why);
        }
    }

    /// Reads what `c` sent; a verified proof wins.
    fn check(&mut self, key: &[u8; KEY_LEN], c: &mut Candidate) -> Result<Option<u64>, String> {
        let mut buf = [0u8; 128];
        loop {
            match nix::unistd::read(&c.fd, &mut buf) {
                Ok(0) => return Err("closed before proving the key".into()),
                Ok(n) => c.decoder.feed(&buf[..n]),
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => break,
                Err(e) => return Err(e.to_string()),
            }
            if c.decoder.pending() >= HEADER_LEN + wire::TAKEOVER_LEN {
                break;
            }
        }
        let refused = |c: &Candidate, why: &str| {
            // Said on that connection, so the host stops trying (an evicted one is only closed,
            // and the host tries again). Nobody else reads it.
            let text = format!("{}{why}", wire::TAKEOVER_REFUSED);
            let _ = nix::unistd::write(&c.fd, &wire::encode(Kind::Diag, text.as_bytes()));
            Err(format!("a takeover was refused: {why}"))
        };
        match c.decoder.next_frame() {
            Ok(Some(f)) => match wire::takeover_open(key, &self.link_id, &f.body) {
                Some((nonce, _)) if self.used.contains(&nonce) => refused(c, "its proof was used before"),
                Some((nonce, resume)) => {
                    self.used.push(nonce);
                    Ok(Some(resume))
                }
                None => refused(c, "its proof is not of this attempt's key"),
            },
            Ok(None) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Accepts what waits, checks every candidate that has something to read, drops those
    /// past their time; returns a connection whose peer proved `key`. `revents` are the
    /// results of polling [`Takeover::poll_fds`] (an empty slice: look at everything now).
    pub fn ready(&mut self, key: &[u8; KEY_LEN], revents: &[Option<PollFlags>]) -> Option<Won> {
        let now = Instant::now();
        let everything = revents.is_empty();
        let mut kept = VecDeque::with_capacity(self.candidates.len());
        let mut won = None;
        for (i, mut c) in std::mem::take(&mut self.candidates).into_iter().enumerate() {
            let readable = everything || revents.get(i + 1).copied().flatten().is_some_and(|r| !r.is_empty());
            if won.is_some() || !readable {
                if now < c.prove_by {
                    kept.push_back(c);
                } else {
                    self.refuse("a takeover did not prove the key in time".into());
                }
                continue;
            }
            match self.check(key, &mut c) {
                Ok(Some(resume)) => won = Some(Won { socket: c.fd, pid: c.pid, resume }),
                Ok(None) if now < c.prove_by => kept.push_back(c),
                Ok(None) => self.refuse("a takeover did not prove the key in time".into()),
                Err(e) => self.refuse(e),
            }
        }
        self.candidates = kept;
        if won.is_none() && (everything || revents.first().copied().flatten().is_some_and(|r| !r.is_empty())) {
            won = self.accept(key);
        }
        won
    }

    /// Drains the backlog: each new connection is checked at once (a real host's proof is
    /// already there), kept as a candidate otherwise, evicting the oldest past the cap.
    fn accept(&mut self, key: &[u8; KEY_LEN]) -> Option<Won> {
        for _ in 0..MAX_ACCEPTS_AT_ONCE {
            let raw = match accept4(
                std::os::fd::AsRawFd::as_raw_fd(&self.listener),
                SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            ) {
                Ok(fd) => fd,
                Err(Errno::EINTR | Errno::ECONNABORTED) => continue,
                Err(_) => return None,
            };
            let fd = crate::child::raw::own_accepted(raw);
            let cred = getsockopt(&fd, sockopt::PeerCredentials).ok();
            if let Some(uid) = self.only_uid {
                match &cred {
                    Some(c) if c.uid() == uid => {}
                    Some(c) => {
                        self.refuse(format!("a takeover from uid {} (only {uid} may)", c.uid()));
                        continue;
                    }
                    None => {
                        self.refuse("a takeover without peer credentials".into());
                        continue;
                    }
                }
            }
            let pid = cred.map(|c| c.pid()).filter(|p| *p > 0);
            let mut c = Candidate {
                fd,
                pid,
                decoder: Decoder::new(|k| k == Kind::Takeover),
                prove_by: Instant::now() + PROVE_WITHIN,
            };
            match self.check(key, &mut c) {
                Ok(Some(resume)) => return Some(Won { socket: c.fd, pid: c.pid, resume }),
                Ok(None) => {
                    let oldest =
                        if self.candidates.len() >= MAX_CANDIDATES { self.candidates.pop_front() } else { None };
                    self.candidates.push_back(c);
                    // The oldest gets a last look first: a host whose proof came after it was
                    // accepted, while the flood kept the init busy accepting, still wins.
                    if let Some(mut oldest) = oldest {
                        match self.check(key, &mut oldest) {
                            Ok(Some(resume)) => return Some(Won { socket: oldest.fd, pid: oldest.pid, resume }),
                            Ok(None) => self.refuse("a silent takeover connection was evicted".into()),
                            Err(e) => self.refuse(e),
                        }
                    }
                }
                Err(e) => self.refuse(e),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixStream};

    fn link_id() -> String {
        let mut b = [0u8; 16];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut b).unwrap();
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn connect(id: &str) -> UnixStream {
        let addr = SocketAddr::from_abstract_name(wire::takeover_socket_name(id)).unwrap();
        UnixStream::connect_addr(&addr).unwrap()
    }

    /// The host connected while the init was busy accepting a flood, so its connection was
    /// taken in before its proof came; when the flood pushes it out of the candidates, the
    /// proof that has come since is still read, and the host wins instead of being closed.
    #[test]
    fn a_candidate_evicted_by_a_flood_gets_a_last_look() {
        let id = link_id();
        let key = [7u8; KEY_LEN];
        let mut t = Takeover::bind(&id, None, None).unwrap();
        let mut host = connect(&id);
        assert!(t.ready(&key, &[]).is_none(), "nothing proven yet");
        assert_eq!(t.candidates.len(), 1);
        let silent: Vec<_> = (1..MAX_CANDIDATES).map(|_| connect(&id)).collect();
        // Only the listener is said to be readable: the candidates were not looked at again.
        let listener_only = [Some(PollFlags::POLLIN)];
        assert!(t.ready(&key, &listener_only).is_none());
        assert_eq!(t.candidates.len(), MAX_CANDIDATES);
        host.write_all(&wire::encode(Kind::Takeover, &wire::takeover_proof(&key, &id, &[1; wire::NONCE_LEN], 5)))
            .unwrap();
        let _one_more = connect(&id);
        let won = t.ready(&key, &listener_only).expect("the host's proof is read before it is evicted");
        assert_eq!(won.resume, 5);
        assert_eq!(t.refused_count, 0, "{:?}", t.refused);
        drop(silent);
    }

    fn pair() -> (OwnedFd, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (OwnedFd::from(a), b)
    }

    /// The frames `peer` has, in order: (kind, body).
    fn frames_on(peer: &mut UnixStream) -> Vec<(Kind, Vec<u8>)> {
        peer.set_nonblocking(true).unwrap();
        let mut d = Decoder::new(|_| true);
        let mut buf = [0u8; 4096];
        while let Ok(n) = std::io::Read::read(peer, &mut buf) {
            if n == 0 {
                break;
            }
            d.feed(&buf[..n]);
        }
        std::iter::from_fn(|| d.next_frame().unwrap()).map(|f| (f.kind, f.body)).collect()
    }

    fn link_on(fd: OwnedFd) -> Link {
        let mut l = Link::new(fd.try_clone().unwrap(), fd);
        l.retain = true;
        l
    }

    /// What went out is kept until the host counts it; a host that comes back with a count
    /// gets a hello, then exactly the frames after it, once.
    #[test]
    fn a_resume_sends_what_the_host_did_not_count_once() {
        let (fd, mut old) = pair();
        let mut l = link_on(fd);
        for b in [b"a", b"b", b"c"] {
            l.push(Kind::Stdout, b);
        }
        l.flush_some();
        assert_eq!(frames_on(&mut old).len(), 3);
        assert_eq!((l.kept(), l.queued()), (3 * (HEADER_LEN + 1), 0));
        l.ack(1);
        assert_eq!(l.kept(), 2 * (HEADER_LEN + 1), "the counted frame is dropped");
        l.push(Kind::Stdout, b"d");
        // Cut before "d" went out; the host had "a" and "b" only.
        let (fd, mut new) = pair();
        assert_eq!(l.take_over(fd, 2).unwrap(), 2);
        l.hello(Kind::Started, b"{}");
        l.flush_some();
        let got = frames_on(&mut new);
        let bodies: Vec<&[u8]> = got.iter().map(|(_, b)| b.as_slice()).collect();
        assert_eq!(bodies, [&b"{}"[..], b"c", b"d"]);
        assert_eq!(got[0].0, Kind::Started);
        assert_eq!(l.next_number(), 4);
    }

    /// A restarted worker (count 0) gets only what had not gone out, never the old stream
    /// again; a delivery cut by a takeover is replaced, numbered from where it began.
    #[test]
    fn a_fresh_host_gets_what_had_not_gone_out_and_a_delivery_starts_again() {
        let (fd, mut old) = pair();
        let mut l = link_on(fd);
        l.push(Kind::Stdout, b"out");
        l.flush_some();
        frames_on(&mut old);
        drop(old);
        let record = l.next_number();
        l.push(Kind::Record, b"r1");
        l.push(Kind::Output, b"tar");
        l.flush_some();
        assert!(l.out_dead, "nobody reads the old link");
        let (fd, mut new) = pair();
        assert_eq!(l.take_over(fd, 0).unwrap(), 1);
        l.truncate_to(record);
        assert_eq!(l.next_number(), record);
        l.push(Kind::Record, b"r2");
        l.flush_some();
        let got = frames_on(&mut new);
        assert_eq!(got, [(Kind::Record, b"r2".to_vec())]);
    }

    /// Past the cap, the oldest frames that went out are dropped and counted: a resume from
    /// before them starts later, and says so by its number.
    #[test]
    fn past_the_cap_the_oldest_kept_go_and_a_resume_says_where_it_starts() {
        let (fd, mut old) = pair();
        let mut l = link_on(fd);
        let chunk = vec![0u8; 1 << 16];
        let n = RETAIN_CAP / chunk.len() + 4;
        for _ in 0..n {
            l.push(Kind::Stdout, &chunk);
            l.flush_all();
            frames_on(&mut old);
        }
        assert!(l.kept() <= RETAIN_CAP);
        assert!(l.dropped_unacked >= 4, "{}", l.dropped_unacked);
        let (fd, _new) = pair();
        assert_eq!(l.take_over(fd, 1).unwrap(), l.dropped_unacked);
    }
}
