//! `stevedore-init relay <link-id>`: run by the host through `docker exec` in an attempt's
//! container, it connects to the init's takeover socket and copies bytes both ways between
//! its own stdin/stdout (the exec's attach) and the socket. It proves nothing itself: the
//! host answers the init's challenge through it.

use crate::wire;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{AddressFamily, Shutdown, SockFlag, SockType, UnixAddr, connect, shutdown, socket};
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

/// Exit code when the socket cannot be reached.
pub const EXIT_NO_SOCKET: i32 = 3;

/// Runs the relay; returns the exit code.
pub fn main(link_id: &str) -> i32 {
    // The command runs as the same uid: it must not be able to read this process's memory
    // or take its descriptors through /proc.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("stevedore-init relay: cannot become non-dumpable: {e}");
        return EXIT_NO_SOCKET;
    }
    if !wire::valid_link_id(link_id) {
        eprintln!("stevedore-init relay: invalid link id {link_id:?}");
        return EXIT_NO_SOCKET;
    }
    let sock = match socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("stevedore-init relay: socket: {e}");
            return EXIT_NO_SOCKET;
        }
    };
    let addr = match UnixAddr::new_abstract(wire::takeover_socket_name(link_id).as_bytes()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("stevedore-init relay: address: {e}");
            return EXIT_NO_SOCKET;
        }
    };
    if let Err(e) = connect(sock.as_raw_fd(), &addr) {
        eprintln!("stevedore-init relay: the init's takeover socket is not there: {e}");
        return EXIT_NO_SOCKET;
    }
    pump(io::stdin().as_fd(), sock.as_fd(), io::stdout().as_fd());
    0
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
