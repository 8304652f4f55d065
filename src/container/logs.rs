//! Capped capture of stdout/stderr and the scanner for the init's done sentinel.

use crate::contract::LogCapture;
use crate::protocol::MAX_TRAILER_BYTES;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A log file that keeps at most `cap` bytes and counts everything.
#[derive(Debug)]
pub struct CappedLog {
    file: Option<File>,
    path: PathBuf,
    cap: u64,
    kept: u64,
    total: u64,
}

impl CappedLog {
    /// Creates (truncates) the file at `path`.
    pub fn create(path: &Path, cap: u64) -> io::Result<Self> {
        let file = File::create(path)?;
        Ok(Self { file: Some(file), path: path.to_path_buf(), cap, kept: 0, total: 0 })
    }

    /// Appends what fits under the cap; counts all of it. A write error stops keeping,
    /// never the draining.
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
        LogCapture { path: Some(self.path.display().to_string()), bytes: self.total, truncated: self.kept < self.total }
    }
}

/// Finds the init's sentinel in a byte stream split into arbitrary chunks, and passes on
/// everything before it.
#[derive(Debug)]
pub struct SentinelScanner {
    needle: Vec<u8>,
    held: Vec<u8>,
    found: bool,
    /// What followed the sentinel (the init's records), capped.
    trailer: Vec<u8>,
}

impl SentinelScanner {
    /// Looks for `needle`.
    pub fn new(needle: &[u8]) -> Self {
        Self { needle: needle.to_vec(), held: Vec::new(), found: false, trailer: Vec::new() }
    }

    /// Feeds a chunk; returns the bytes that are certainly not part of the sentinel, and
    /// whether the sentinel has now been seen (bytes after it go to [`Self::trailer`], never
    /// to the log).
    pub fn feed(&mut self, chunk: &[u8]) -> (Vec<u8>, bool) {
        if self.found {
            self.keep_trailer(chunk);
            return (Vec::new(), true);
        }
        self.held.extend_from_slice(chunk);
        if let Some(pos) = find(&self.held, &self.needle) {
            self.found = true;
            let out = self.held[..pos].to_vec();
            let after = self.held.split_off(pos + self.needle.len());
            self.held.clear();
            self.keep_trailer(&after);
            return (out, true);
        }
        // Hold back only a tail that could be the start of the sentinel, so live output
        // is never delayed by more than a partial match.
        let keep = (1..self.needle.len().min(self.held.len() + 1))
            .rev()
            .find(|&k| self.held.ends_with(&self.needle[..k]))
            .unwrap_or(0);
        let out: Vec<u8> = self.held.drain(..self.held.len() - keep).collect();
        (out, false)
    }

    /// Whether the sentinel was seen.
    pub fn found(&self) -> bool {
        self.found
    }

    /// The bytes that followed the sentinel so far (at most [`MAX_TRAILER_BYTES`] + 1).
    pub fn trailer(&self) -> &[u8] {
        &self.trailer
    }

    fn keep_trailer(&mut self, bytes: &[u8]) {
        let room = (MAX_TRAILER_BYTES + 1).saturating_sub(self.trailer.len());
        self.trailer.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// The bytes still held back when the stream ends without a sentinel.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_log_counts_past_the_cap() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("x.log");
        let mut l = CappedLog::create(&p, 10).unwrap();
        l.write(b"12345");
        l.write(b"6789012345");
        l.write(b"more");
        let c = l.capture();
        assert_eq!(c.bytes, 19);
        assert!(c.truncated);
        assert_eq!(std::fs::read(&p).unwrap(), b"1234567890");
    }

    #[test]
    fn sentinel_split_across_chunks() {
        let needle = b"abc:done\n";
        let stream = b"hello world\nabc:done\nTRAILING".to_vec();
        for split in 0..stream.len() {
            let mut s = SentinelScanner::new(needle);
            let (mut out, mut found) = s.feed(&stream[..split]);
            if !found {
                let (o2, f2) = s.feed(&stream[split..]);
                out.extend(o2);
                found = f2;
            }
            assert!(found, "split {split}");
            assert_eq!(out, b"hello world\n", "split {split}");
        }
    }

    #[test]
    fn no_sentinel_passes_everything() {
        let mut s = SentinelScanner::new(b"zz:done\n");
        let (mut out, found) = s.feed(b"abc\nzz:do");
        assert!(!found);
        assert_eq!(out, b"abc\n", "only a possible start of the sentinel is held back");
        out.extend(s.finish());
        assert_eq!(out, b"abc\nzz:do");
    }

    #[test]
    fn what_follows_the_sentinel_is_the_trailer_not_the_log() {
        let mut s = SentinelScanner::new(b"zz:done\n");
        let (out, found) = s.feed(b"log\nzz:done\n3\n{}");
        assert_eq!((out.as_slice(), found), (&b"log\n"[..], true));
        assert_eq!(s.feed(b"x-\n"), (Vec::new(), true));
        assert_eq!(s.trailer(), b"3\n{}x-\n");
    }

    #[test]
    fn live_lines_are_not_held_back() {
        let mut s = SentinelScanner::new(b"0123abcd:done\n");
        assert_eq!(s.feed(b"ready\n"), (b"ready\n".to_vec(), false));
    }
}
