//! The command's output as it arrives, for a caller that wants it live.

use bytes::Bytes;
use tokio::sync::mpsc;

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// A chunk of the command's output, as it arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveChunk {
    /// Which stream.
    pub stream: Stream,
    /// The bytes.
    pub bytes: Bytes,
}

/// Where one attempt's output goes live: the sending half of a bounded channel the caller
/// reads. stevedore never waits for it: a chunk that does not fit is dropped and counted in
/// the evidence (`notes`), and the capture files stay complete up to their caps.
#[derive(Debug, Clone)]
pub struct LiveOutput(mpsc::Sender<LiveChunk>);

impl LiveOutput {
    /// A live-output channel holding up to `chunks` chunks, and its receiving half.
    pub fn channel(chunks: usize) -> (LiveOutput, mpsc::Receiver<LiveChunk>) {
        let (tx, rx) = mpsc::channel(chunks.max(1));
        (LiveOutput(tx), rx)
    }

    /// The sending half.
    pub(crate) fn into_sender(self) -> mpsc::Sender<LiveChunk> {
        self.0
    }
}

/// Where one attempt's stdin comes from: the receiving half of a bounded channel the caller
/// writes chunks into (`stevedore run -i` writes its own stdin); the command reads them in
/// order, and reaches the end of its stdin when every sender was dropped. Back-pressure is
/// the channel's: stevedore takes a chunk only as the command takes what came before (at
/// most 1 MiB ahead). Taken by the first attempt run with it; without one the command's
/// stdin is `/dev/null`.
#[derive(Debug, Clone)]
pub struct StdinFeed(std::sync::Arc<std::sync::Mutex<Option<mpsc::Receiver<Bytes>>>>);

impl StdinFeed {
    /// A stdin feed holding up to `chunks` chunks, and its sending half.
    pub fn channel(chunks: usize) -> (mpsc::Sender<Bytes>, StdinFeed) {
        let (tx, rx) = mpsc::channel(chunks.max(1));
        (tx, StdinFeed(std::sync::Arc::new(std::sync::Mutex::new(Some(rx)))))
    }

    /// The receiving half, once.
    pub(crate) fn take(&self) -> Option<mpsc::Receiver<Bytes>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }
}

/// A terminal for one attempt's command (`stevedore run -t`): its stdin, stdout and stderr
/// are one terminal inside the sandbox, of the size given, its controlling terminal (so ^C
/// typed into it is the command's SIGINT); what it writes comes as [`Stream::Stdout`]. The
/// sending half changes the size (the command sees SIGWINCH). Give a [`StdinFeed`] too for
/// what is typed. A command only, never a handler.
#[derive(Debug, Clone)]
pub struct Terminal(tokio::sync::watch::Receiver<(u16, u16)>);

impl Terminal {
    /// A terminal of `rows` × `cols`, and the half that resizes it.
    pub fn new(rows: u16, cols: u16) -> (tokio::sync::watch::Sender<(u16, u16)>, Terminal) {
        let (tx, rx) = tokio::sync::watch::channel((rows, cols));
        (tx, Terminal(rx))
    }

    /// Its size now: rows, columns.
    pub fn size(&self) -> (u16, u16) {
        *self.0.borrow()
    }

    /// Its changes of size, from now on.
    pub(crate) fn watch(&self) -> tokio::sync::watch::Receiver<(u16, u16)> {
        let mut rx = self.0.clone();
        rx.mark_unchanged();
        rx
    }
}

/// What a long transfer of an attempt has moved so far (`Request::progress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Progress {
    /// Which transfer.
    pub phase: Phase,
    /// Bytes moved so far.
    pub done: u64,
    /// Bytes in all, when known before the end.
    pub total: Option<u64>,
    /// Whether this is its last report.
    pub finished: bool,
}

/// The transfers an attempt reports progress on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Phase {
    /// The input dir going into the sandbox (its total is known).
    Inputs,
    /// The outputs coming back (their total is known only at the end).
    Outputs,
}

/// Where an attempt reports its progress: called on the attempt's tasks (keep it quick; it is
/// called at most every 64 KiB moved).
#[derive(Clone)]
pub struct ProgressSink(std::sync::Arc<dyn Fn(Progress) + Send + Sync>);

impl ProgressSink {
    /// A sink that calls `f`.
    pub fn new(f: impl Fn(Progress) + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(f))
    }

    pub(crate) fn report(&self, p: Progress) {
        (self.0)(p);
    }
}

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressSink")
    }
}

/// How often progress is reported: each time this many more bytes moved.
pub(crate) const REPORT_EVERY: u64 = 64 << 10;

/// Counts what goes through a writer and reports it to a sink.
pub(crate) struct Counting<W> {
    pub inner: W,
    pub sink: Option<ProgressSink>,
    pub phase: Phase,
    pub total: Option<u64>,
    pub done: u64,
}

impl<W: std::io::Write> std::io::Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        let before = self.done;
        self.done += n as u64;
        if let Some(s) = &self.sink
            && before / REPORT_EVERY != self.done / REPORT_EVERY
        {
            // A tar's headers make it a little longer than the files it counts.
            let done = self.total.map_or(self.done, |t| self.done.min(t));
            s.report(Progress { phase: self.phase, done, total: self.total, finished: false });
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
