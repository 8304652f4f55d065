//! Byte pipes between async engine streams and blocking tar code, with bounded memory.

use bytes::Bytes;
use std::io::{self, Read};
use tokio::sync::mpsc;

/// A blocking reader fed by an async producer through a bounded channel.
#[derive(Debug)]
pub struct ChannelReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
}

/// Creates a reader and the sender that feeds it (`depth` chunks in flight).
pub fn reader(depth: usize) -> (mpsc::Sender<io::Result<Bytes>>, ChannelReader) {
    let (tx, rx) = mpsc::channel(depth);
    (tx, ChannelReader { rx, current: Bytes::new() })
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.current = b,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// The writing half (an upload's body), only the container rung's.
#[cfg(feature = "docker")]
pub use writing::ChannelWriter;
#[cfg(any(feature = "docker", feature = "kube"))]
pub use writing::writer;

#[cfg(any(feature = "docker", feature = "kube"))]
mod writing {
    use bytes::Bytes;
    use std::io::{self, Write};
    use tokio::sync::mpsc;

    /// A blocking writer whose chunks an async consumer receives through a bounded channel.
    #[derive(Debug)]
    pub struct ChannelWriter {
        tx: mpsc::Sender<Result<Bytes, io::Error>>,
        buf: Vec<u8>,
    }

    const CHUNK: usize = 256 << 10;

    /// Creates a writer and the stream of its chunks (an engine request body).
    pub fn writer(
        depth: usize,
    ) -> (ChannelWriter, impl futures_util::Stream<Item = Result<Bytes, io::Error>> + Send + 'static) {
        let (tx, rx) = mpsc::channel(depth);
        let chunks = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
        (ChannelWriter { tx, buf: Vec::with_capacity(CHUNK) }, chunks)
    }

    impl ChannelWriter {
        #[cfg(feature = "docker")]
        /// Ends the stream with `why` as its error, so the request it is the body of fails
        /// rather than sending a body cut short as if whole.
        pub fn abort(mut self, why: io::Error) {
            self.buf.clear();
            let _ = self.tx.blocking_send(Err(why));
        }

        fn send(&mut self) -> io::Result<()> {
            if self.buf.is_empty() {
                return Ok(());
            }
            let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
            self.tx.blocking_send(Ok(chunk)).map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "consumer gone"))
        }
    }

    impl Write for ChannelWriter {
        fn write(&mut self, data: &[u8]) -> io::Result<usize> {
            self.buf.extend_from_slice(data);
            if self.buf.len() >= CHUNK {
                self.send()?;
            }
            Ok(data.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            self.send()
        }
    }

    impl Drop for ChannelWriter {
        fn drop(&mut self) {
            // The consumer may be gone already; nothing to report from a destructor.
            let _ = self.send();
        }
    }
}
