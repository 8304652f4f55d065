//! The handler runner's socket, init side: the request and payload down, the runner's hello
//! and record up, everything it sends capped and parsed strictly.

use crate::wire::{self, Decoder, Frame, HandlerChannel, HandlerHello, HandlerRecord, Kind};
use nix::errno::Errno;
use std::os::fd::OwnedFd;

/// The most a handler runner may send over its socket in all.
const HANDLER_CHANNEL_CAP: usize = 2 * wire::MAX_RECORD_BYTES + (64 << 10);

/// The handler runner's socket.
#[derive(Debug)]
pub(crate) struct HandlerSocket {
    pub fd: Option<OwnedFd>,
    pub decoder: Decoder,
    pub out: Vec<u8>,
    pub out_at: usize,
    pub received: usize,
    pub channel: HandlerChannel,
}

impl HandlerSocket {
    fn refuse(&mut self, why: String) {
        if self.channel.refused.len() < 16 {
            self.channel.refused.push(why);
        }
    }

    fn take(&mut self, frame: Frame) {
        match frame.kind {
            Kind::HandlerHello if self.channel.hello.is_none() => {
                match wire::parse_claim::<HandlerHello>(&frame.body, Kind::HandlerHello.max_body()) {
                    Ok(h) if h.protocol == wire::PROTOCOL => self.channel.hello = Some(h),
                    Ok(h) => self.refuse(format!("hello of protocol {}, not {}", h.protocol, wire::PROTOCOL)),
                    Err(e) => self.refuse(format!("hello: {e}")),
                }
            }
            Kind::HandlerRecord if self.channel.record.is_none() => {
                match wire::parse_claim::<HandlerRecord>(&frame.body, wire::MAX_RECORD_BYTES) {
                    Ok(mut r) => {
                        r.error = wire::cap_text(&r.error, wire::MAX_ERROR_TEXT);
                        self.channel.record = Some(r);
                    }
                    Err(e) => self.refuse(format!("record: {e}")),
                }
            }
            other => self.refuse(format!("unexpected {other:?} frame")),
        }
    }

    /// Reads what is there; closes the socket at EOF, on error or past the cap.
    pub fn read(&mut self) {
        let Some(fd) = self.fd.take() else { return };
        let mut buf = vec![0u8; wire::MAX_CHUNK];
        loop {
            match nix::unistd::read(&fd, &mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    self.received += n;
                    if self.received > HANDLER_CHANNEL_CAP {
                        self.refuse(format!("more than {HANDLER_CHANNEL_CAP} bytes on the handler socket"));
                        break;
                    }
                    self.decoder.feed(&buf[..n]);
                    loop {
                        match self.decoder.next_frame() {
                            Ok(Some(f)) => self.take(f),
                            Ok(None) => break,
                            Err(e) => {
                                self.refuse(e.to_string());
                                return;
                            }
                        }
                    }
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => {
                    self.fd = Some(fd);
                    return;
                }
                Err(_) => break,
            }
        }
    }

    pub fn write_some(&mut self) {
        let Some(fd) = &self.fd else { return };
        while self.out_at < self.out.len() {
            match nix::unistd::write(fd, &self.out[self.out_at..]) {
                Ok(n) => self.out_at += n,
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return,
                // The runner closed its end: what it did not read, it did not want.
                Err(_) => break,
            }
        }
        self.out = Vec::new();
        self.out_at = 0;
    }
}
