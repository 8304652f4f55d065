//! What the host keeps of the command's streams: a capped capture file per stream (0600, in
//! a private dir), and a live copy for the caller that never blocks the drain.

use crate::contract::{LiveChunk, LiveOutput, LogCapture, Stream};
use crate::hostdir::PrivateDir;
use bytes::Bytes;
use std::fs::File;
use std::io::Write;
use tokio::sync::mpsc;

/// Delivers chunks to a [`LiveOutput`] without ever waiting.
#[derive(Debug)]
pub(crate) struct LiveSink {
    tx: Option<mpsc::Sender<LiveChunk>>,
    /// Bytes the caller missed because its channel was full.
    pub dropped: u64,
}

impl LiveSink {
    pub fn new(live: Option<LiveOutput>) -> Self {
        Self { tx: live.map(LiveOutput::into_sender), dropped: 0 }
    }

    pub fn offer(&mut self, stream: Stream, bytes: &[u8]) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(LiveChunk { stream, bytes: Bytes::copy_from_slice(bytes) }) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(c)) => self.dropped += c.bytes.len() as u64,
            // The caller stopped listening: nothing more to deliver.
            Err(mpsc::error::TrySendError::Closed(_)) => self.tx = None,
        }
    }
}

/// A capture file that keeps at most `cap` bytes and counts everything.
#[derive(Debug)]
pub(crate) struct CappedLog {
    file: Option<File>,
    path: String,
    cap: u64,
    kept: u64,
    total: u64,
}

impl CappedLog {
    /// Creates `name` in `dir` (a new 0600 file; an existing entry is an error).
    pub fn create(dir: &PrivateDir, name: &str, cap: u64) -> Result<Self, crate::hostdir::HostDirError> {
        let file = dir.create_file(name)?;
        let path = dir.path().join(name).display().to_string();
        Ok(Self { file: Some(file), path, cap, kept: 0, total: 0 })
    }

    /// Continues the capture `name` in `dir` (after a restart): what it holds counts.
    pub fn append(dir: &PrivateDir, name: &str, cap: u64) -> Result<Self, crate::hostdir::HostDirError> {
        use std::io::Seek;
        let mut file = dir.open_file(name)?;
        let kept = file.seek(std::io::SeekFrom::End(0)).unwrap_or(0);
        let path = dir.path().join(name).display().to_string();
        Ok(Self { file: Some(file), path, cap, kept, total: kept })
    }

    /// Appends what fits under the cap; counts all of it. A write error stops keeping, never
    /// the draining.
    pub fn write(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        let room = self.cap.saturating_sub(self.kept) as usize;
        let part = &chunk[..chunk.len().min(room)];
        if part.is_empty() {
            return;
        }
        if let Some(f) = &mut self.file {
            match f.write_all(part) {
                Ok(()) => self.kept += part.len() as u64,
                Err(_) => self.file = None,
            }
        }
    }

    /// What was captured.
    pub fn capture(&self) -> LogCapture {
        LogCapture {
            path: (!self.path.is_empty()).then(|| self.path.clone()),
            bytes: self.total,
            truncated: self.kept < self.total,
        }
    }
}

/// The last `cap` bytes of a stream (the init's own stderr, for diagnostics).
#[derive(Debug, Default)]
pub(crate) struct Tail {
    buf: Vec<u8>,
    cap: usize,
}

impl Tail {
    pub fn new(cap: usize) -> Self {
        Self { buf: Vec::new(), cap }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() > self.cap {
            let cut = self.buf.len() - self.cap;
            self.buf.drain(..cut);
        }
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.buf).trim().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_log_counts_past_the_cap() {
        let t = tempfile::tempdir().unwrap();
        let dir = PrivateDir::open(&t.path().join("logs")).unwrap();
        let mut l = CappedLog::create(&dir, "x.log", 10).unwrap();
        l.write(b"12345");
        l.write(b"6789012345");
        l.write(b"more");
        let c = l.capture();
        assert_eq!((c.bytes, c.truncated), (19, true));
        assert_eq!(std::fs::read(dir.path().join("x.log")).unwrap(), b"1234567890");
    }

    #[test]
    fn a_slow_live_reader_never_blocks_and_what_it_missed_is_counted() {
        let (live, mut rx) = LiveOutput::channel(2);
        let mut sink = LiveSink::new(Some(live));
        for _ in 0..5 {
            sink.offer(Stream::Stdout, b"abc");
        }
        assert_eq!(sink.dropped, 9);
        assert_eq!(rx.try_recv().unwrap().bytes, Bytes::from_static(b"abc"));
        drop(rx);
        sink.offer(Stream::Stderr, b"x");
        assert_eq!(sink.dropped, 9, "a closed channel is not counted as missed");
    }

    #[test]
    fn tail_keeps_the_end() {
        let mut t = Tail::new(4);
        t.push(b"abc");
        t.push(b"defg");
        assert_eq!(t.text(), "defg");
    }
}
