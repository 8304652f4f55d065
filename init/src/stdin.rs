//! The command's stdin when it comes from the host (`Start.stdin`, `stevedore run -i`):
//! `Stdin` frames in, written into the command's pipe as fast as it takes them, the count of
//! what it took out (`StdinTaken`), and its end after `StdinEnd`. The host never sends more
//! than [`WINDOW`] past the last count, so what waits here is bounded; a frame is placed by its
//! offset, so one sent again after a resumed link is taken once.

use nix::errno::Errno;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// The most the host may send past what the command has taken.
pub const WINDOW: u64 = 1 << 20;

/// The command's stdin, host side of its pipe.
#[derive(Debug)]
pub(crate) struct StdinPump {
    fd: Option<OwnedFd>,
    buf: Vec<u8>,
    at: usize,
    /// The offset the next new byte has.
    received: u64,
    taken: u64,
    end_at: Option<u64>,
    /// The command closed its stdin: it takes nothing more.
    refused: bool,
    /// A count the host has not been told yet.
    news: bool,
    /// The command's stdin is a terminal: its end is typed (VEOF, ^D), since the terminal
    /// itself stays open.
    terminal: bool,
    /// The last byte received was not a newline: on a terminal a first ^D only hands that
    /// line over, a second is the end.
    mid_line: bool,
}

impl StdinPump {
    pub fn new(fd: OwnedFd) -> Self {
        crate::link::set_nonblocking(fd.as_fd(), true);
        Self {
            fd: Some(fd),
            buf: Vec::new(),
            at: 0,
            received: 0,
            taken: 0,
            end_at: None,
            refused: false,
            news: false,
            terminal: false,
            mid_line: false,
        }
    }

    /// A pump into a terminal's master side (`Start.tty`).
    pub fn terminal(fd: OwnedFd) -> Self {
        Self { terminal: true, ..Self::new(fd) }
    }

    /// The pipe, while something waits to be written into it.
    pub fn writable(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().filter(|_| self.at < self.buf.len()).map(AsFd::as_fd)
    }

    /// A `Stdin` frame's body; `Err` when it is not the host's to send (a gap, past the
    /// window), and then the command's stdin is closed.
    pub fn frame(&mut self, body: &[u8]) -> Result<(), String> {
        let Some((offset, data)) = crate::wire::stdin_parts(body) else {
            return self.refuse("a stdin frame without its offset".into());
        };
        if offset > self.received {
            return self.refuse(format!("stdin from byte {offset}, but {} came so far", self.received));
        }
        let skip = usize::try_from(self.received - offset).unwrap_or(usize::MAX).min(data.len());
        let new = &data[skip..];
        if self.received + new.len() as u64 > self.taken + WINDOW {
            return self.refuse("the host sent stdin past its window".into());
        }
        self.received += new.len() as u64;
        if let Some(&b) = new.last() {
            self.mid_line = b != b'\n';
        }
        if self.fd.is_some() {
            self.buf.extend_from_slice(new);
        }
        self.write_some();
        Ok(())
    }

    /// The command's stdin ends after `total` bytes.
    pub fn end(&mut self, total: u64) {
        self.end_at = Some(total);
        self.write_some();
    }

    fn refuse(&mut self, why: String) -> Result<(), String> {
        self.close();
        Err(why)
    }

    /// Writes what it can without blocking; closes the pipe once everything up to the end
    /// is in it.
    pub fn write_some(&mut self) {
        while let Some(fd) = &self.fd
            && self.at < self.buf.len()
        {
            match nix::unistd::write(fd, &self.buf[self.at..]) {
                Ok(n) => {
                    self.at += n;
                    self.taken += n as u64;
                    self.news = true;
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => break,
                Err(_) => {
                    // EPIPE: the command closed its stdin.
                    self.refused = true;
                    self.news = true;
                    self.close();
                }
            }
        }
        if self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
            // At the end the pipe closes (taken); a terminal is told with VEOF instead, best
            // effort: a full terminal buffer drops it (the command is not reading).
            if self.end_at.is_some_and(|e| e <= self.received)
                && let Some(fd) = self.fd.take().filter(|_| self.terminal)
            {
                let _ = nix::unistd::write(&fd, if self.mid_line { b"\x04\x04" } else { b"\x04" });
            }
        }
    }

    /// Closes the command's stdin now (the command ended, or the host broke the rules).
    pub fn close(&mut self) {
        self.fd = None;
        self.buf = Vec::new();
        self.at = 0;
    }

    /// The count to tell the host, once per change.
    pub fn count(&mut self) -> Option<u64> {
        std::mem::take(&mut self.news).then_some(if self.refused || self.fd.is_none() && self.end_at.is_none() {
            u64::MAX
        } else {
            self.taken
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn pump() -> (StdinPump, std::fs::File) {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        (StdinPump::new(w), std::fs::File::from(r))
    }

    #[test]
    fn bytes_go_in_order_once_and_the_end_closes_the_pipe() {
        let (mut p, mut r) = pump();
        p.frame(&crate::wire::stdin_body(0, b"hello ")).unwrap();
        // Sent again after a resume, overlapping: taken once.
        p.frame(&crate::wire::stdin_body(3, b"lo world")).unwrap();
        assert_eq!(p.count(), Some(11));
        assert_eq!(p.count(), None, "once per change");
        p.end(11);
        let mut got = String::new();
        r.read_to_string(&mut got).unwrap();
        assert_eq!(got, "hello world", "and EOF");
    }

    #[test]
    fn a_gap_or_more_than_the_window_closes_stdin() {
        let (mut p, _r) = pump();
        assert!(p.frame(&crate::wire::stdin_body(5, b"x")).is_err());
        assert!(p.writable().is_none());
        let (mut p, _r) = pump();
        let big = vec![0u8; (WINDOW + 1) as usize];
        assert!(p.frame(&crate::wire::stdin_body(0, &big)).is_err());
    }

    #[test]
    fn a_command_that_closed_its_stdin_takes_no_more() {
        let (mut p, r) = pump();
        drop(r);
        p.frame(&crate::wire::stdin_body(0, b"x")).unwrap();
        assert_eq!(p.count(), Some(u64::MAX));
    }
}
