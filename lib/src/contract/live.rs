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
