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
    matches!(k, Kind::Start | Kind::Heartbeat | Kind::Stop | Kind::Ack)
}

/// The link to the host.
#[derive(Debug)]
pub(crate) struct Link {
    input: OwnedFd,
    output: OwnedFd,
    pub decoder: Decoder,
    pub in_open: bool,
    /// Writes failed for good (no reader at all): what is queued waits for a takeover.
    pub out_dead: bool,
    out: Vec<u8>,
    out_at: usize,
    /// A frame boundary at or before `out_at`.
    boundary: usize,
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
            out: Vec::new(),
            out_at: 0,
            boundary: 0,
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

    pub fn queued(&self) -> usize {
        self.out.len() - self.out_at
    }

    pub fn push(&mut self, kind: Kind, body: &[u8]) {
        wire::encode_into(&mut self.out, kind, body);
    }

    /// Moves `boundary` to the last frame start at or before `out_at`.
    fn advance_boundary(&mut self) {
        while self.boundary + HEADER_LEN <= self.out.len() {
            let len = u32::from_be_bytes(self.out[self.boundary + 1..self.boundary + 5].try_into().expect("4 bytes"));
            let end = self.boundary + HEADER_LEN + len as usize;
            if end > self.out_at {
                break;
            }
            self.boundary = end;
        }
    }

    /// Writes what it can without blocking.
    pub fn flush_some(&mut self) {
        while self.queued() > 0 && !self.out_dead {
            match nix::unistd::write(&self.output, &self.out[self.out_at..]) {
                Ok(n) => self.out_at += n,
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => break,
                Err(_) => self.out_dead = true,
            }
        }
        if self.queued() == 0 {
            self.out.clear();
            self.out_at = 0;
            self.boundary = 0;
        } else if self.out_at >= HIGH_WATER {
            // What was written is dropped as it goes (up to a frame boundary, so a takeover
            // can resume on a whole frame).
            self.advance_boundary();
            self.out.drain(..self.boundary);
            self.out_at -= self.boundary;
            self.boundary = 0;
        }
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

    /// Moves the link to `socket`, a host that proved the key. What the old host was sent
    /// in part is cut at the next frame boundary; everything after it is sent to the new one.
    pub fn take_over(&mut self, socket: OwnedFd) -> io::Result<()> {
        let output = socket.try_clone()?;
        set_nonblocking(socket.as_fd(), true);
        self.advance_boundary();
        let mut from = self.boundary;
        while from < self.out_at {
            let len = u32::from_be_bytes(self.out[from + 1..from + 5].try_into().expect("4 bytes"));
            from += HEADER_LEN + len as usize;
        }
        self.cut_bytes += (from - self.out_at) as u64;
        self.out.drain(..from.min(self.out.len()));
        self.out_at = 0;
        self.boundary = 0;
        self.input = socket;
        self.output = output;
        self.decoder = Decoder::new(host_kinds);
        self.in_open = true;
        self.out_dead = false;
        self.last_heard = Instant::now();
        Ok(())
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
}
