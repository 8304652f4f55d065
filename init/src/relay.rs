//! `stevedore-init relay <link-id> [within-ms]`: run by the host through the engine's exec
//! in an attempt's sandbox, it carries a takeover between its own stdin/stdout (the exec's
//! attach) and the init's takeover socket. It proves nothing itself: the host's first
//! frame is the proof (`wire::takeover_proof`), which the relay reads whole before it
//! connects and writes in one go right after, so the init finds it there the moment it
//! accepts. A connection the init drops unanswered (evicted by a flood from inside the
//! sandbox, or refused) is made again, until `within-ms` (default 30 s) has passed.

use crate::wire::{self, HEADER_LEN, Kind, TAKEOVER_LEN};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{AddressFamily, Shutdown, SockFlag, SockType, UnixAddr, connect, shutdown, socket};
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

/// Exit code when the takeover could not be carried to the init.
pub const EXIT_NO_SOCKET: i32 = 3;

/// How long the relay keeps trying by default.
const DEFAULT_WITHIN: Duration = Duration::from_secs(30);
/// How long a connection may stay unanswered before it is made again.
const ANSWER_WITHIN: Duration = Duration::from_secs(3);

/// Runs the relay; returns the exit code.
pub fn main(link_id: &str, within_ms: Option<&str>) -> i32 {
    // The command may run as the same uid: it must not be able to read this process's
    // memory (the proof) or take its descriptors through /proc.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("stevedore-init relay: cannot become non-dumpable: {e}");
        return EXIT_NO_SOCKET;
    }
    if !wire::valid_link_id(link_id) {
        eprintln!("stevedore-init relay: invalid link id {link_id:?}");
        return EXIT_NO_SOCKET;
    }
    let within = match within_ms.map(str::parse::<u64>) {
        None => DEFAULT_WITHIN,
        Some(Ok(ms)) => Duration::from_millis(ms.min(3_600_000)),
        Some(Err(_)) => {
            eprintln!("stevedore-init relay: the deadline must be a number of milliseconds");
            return EXIT_NO_SOCKET;
        }
    };
    let until = Instant::now() + within;
    let input = io::stdin();
    let Some(proof) = read_proof(input.as_fd()) else {
        eprintln!("stevedore-init relay: the host sent no takeover proof");
        return EXIT_NO_SOCKET;
    };
    let mut tries = 0u32;
    let mut why = String::from("no attempt made");
    while Instant::now() < until {
        tries += 1;
        match offer(link_id, &proof, until) {
            Ok((sock, first)) => {
                if !write_all(io::stdout().as_fd(), &first) {
                    return 0;
                }
                pump(input.as_fd(), sock.as_fd(), io::stdout().as_fd());
                return 0;
            }
            Err(e) => why = e,
        }
        // Backing off a little: a flood that evicted the last connection goes on meanwhile.
        let pause = Duration::from_millis(u64::from(tries.min(10)) * 20);
        std::thread::sleep(pause.min(until.saturating_duration_since(Instant::now())));
    }
    eprintln!("stevedore-init relay: the init did not take the takeover within {within:?} ({tries} tries; {why})");
    EXIT_NO_SOCKET
}

/// Reads the host's Takeover frame whole from `input`.
fn read_proof(input: BorrowedFd<'_>) -> Option<Vec<u8>> {
    let want = HEADER_LEN + TAKEOVER_LEN;
    let mut buf = vec![0u8; want];
    let mut got = 0;
    while got < want {
        match nix::unistd::read(input, &mut buf[got..]) {
            Ok(0) => return None,
            Ok(n) => got += n,
            Err(Errno::EINTR) => {}
            Err(_) => return None,
        }
    }
    (buf[0] == Kind::Takeover as u8 && buf[1..5] == (TAKEOVER_LEN as u32).to_be_bytes()).then_some(buf)
}

/// Connects, writes the proof, and waits for the init's first bytes: the connection and
/// those bytes once the init took it, or why not.
fn offer(link_id: &str, proof: &[u8], until: Instant) -> Result<(OwnedFd, Vec<u8>), String> {
    let sock = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
        .map_err(|e| format!("socket: {e}"))?;
    let addr =
        UnixAddr::new_abstract(wire::takeover_socket_name(link_id).as_bytes()).map_err(|e| format!("address: {e}"))?;
    connect(sock.as_raw_fd(), &addr).map_err(|e| format!("the init's takeover socket: {e}"))?;
    if !write_all(sock.as_fd(), proof) {
        return Err("the init closed the connection before the proof was written".into());
    }
    let answer_by = (Instant::now() + ANSWER_WITHIN).min(until);
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let left = answer_by.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("no answer from the init".into());
        }
        let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
        let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => continue,
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(format!("poll: {e}")),
        }
        match nix::unistd::read(&sock, &mut buf) {
            Ok(0) | Err(Errno::ECONNRESET) => return Err("the init dropped the connection unanswered".into()),
            Ok(n) => return Ok((sock, buf[..n].to_vec())),
            Err(Errno::EINTR | Errno::EAGAIN) => {}
            Err(e) => return Err(format!("read: {e}")),
        }
    }
}

fn write_all(fd: BorrowedFd<'_>, mut data: &[u8]) -> bool {
    while !data.is_empty() {
        match nix::unistd::write(fd, data) {
            Ok(n) => data = &data[n..],
            Err(Errno::EINTR) => {}
            Err(_) => return false,
        }
    }
    true
}

/// Copies `input` → `sock` and `sock` → `output` until the socket ends.
fn pump(input: BorrowedFd<'_>, sock: BorrowedFd<'_>, output: BorrowedFd<'_>) {
    let mut buf = vec![0u8; 64 << 10];
    let mut input_open = true;
    loop {
        let mut fds = vec![PollFd::new(sock, PollFlags::POLLIN)];
        if input_open {
            fds.push(PollFd::new(input, PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return,
        }
        let ready: Vec<bool> = fds.iter().map(|f| f.revents().is_some_and(|r| !r.is_empty())).collect();
        drop(fds);
        if ready[0] {
            match nix::unistd::read(sock, &mut buf) {
                Ok(0) | Err(Errno::ECONNRESET) => return,
                Ok(n) => {
                    if !write_all(output, &buf[..n]) {
                        return;
                    }
                }
                Err(Errno::EINTR | Errno::EAGAIN) => {}
                Err(_) => return,
            }
        }
        if input_open && ready.get(1).copied().unwrap_or(false) {
            match nix::unistd::read(input, &mut buf) {
                Ok(0) => {
                    input_open = false;
                    let _ = shutdown(sock.as_raw_fd(), Shutdown::Write);
                }
                Ok(n) => {
                    if !write_all(sock, &buf[..n]) {
                        return;
                    }
                }
                Err(Errno::EINTR | Errno::EAGAIN) => {}
                Err(_) => {
                    input_open = false;
                    let _ = shutdown(sock.as_raw_fd(), Shutdown::Write);
                }
            }
        }
        let _ = io::stdout().flush();
    }
}
