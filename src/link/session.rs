//! One attempt's link, host side: the frames the host sends (start, heartbeats, stop, ack)
//! and the task that reads the init's frames and routes them: the command's streams to the
//! captures and the live copy, the record and the outputs to the attempt.
//!
//! The reader never waits for a consumer it does not own: captures are local files, the
//! live copy is dropped when the caller's channel is full. It only waits for the outputs
//! extractor, which is the attempt's own and runs after the command has ended.

use super::capture::{CappedLog, LiveSink, Stream, Tail};
use super::reports::ReportRoute;
use crate::contract::LogCapture;
use crate::outputs::{Caps, ExtractReport, extract_into};
use crate::wire::{self, Decoder, HEADER_LEN, InitRecord, KEY_LEN, Kind, MAC_LEN, OutputEnd, Started};
use bytes::Bytes;
use futures_util::{Stream as FutStream, StreamExt};
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// The host → init half of a transport.
pub(crate) type LinkWriter = Pin<Box<dyn AsyncWrite + Send>>;

/// What a transport delivers from the init.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// Bytes of the link (the init's stdout).
    Link(Bytes),
    /// Bytes the init wrote on its stderr: its own diagnostics, never the command's.
    InitStderr(Bytes),
}

/// Sends frames to the init. Clones share one writer, so frames never interleave.
#[derive(Clone)]
pub(crate) struct Sender {
    w: Arc<tokio::sync::Mutex<LinkWriter>>,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sender")
    }
}

impl Sender {
    pub fn new(w: LinkWriter) -> Self {
        Self { w: Arc::new(tokio::sync::Mutex::new(w)) }
    }

    /// Writes raw bytes (already framed) and flushes.
    pub async fn raw(&self, bytes: &[u8]) -> io::Result<()> {
        let mut w = self.w.lock().await;
        w.write_all(bytes).await?;
        w.flush().await
    }

    /// Writes one frame and flushes.
    pub async fn frame(&self, kind: Kind, body: &[u8]) -> io::Result<()> {
        self.raw(&wire::encode(kind, body)).await
    }

    /// Sends a heartbeat every `every` until the returned task is aborted or a write fails.
    pub fn heartbeats(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                if me.frame(Kind::Heartbeat, b"").await.is_err() {
                    return;
                }
            }
        })
    }
}

/// Where the outputs go.
#[derive(Debug)]
pub(crate) struct OutputsSink {
    /// The caller's output dir, opened once (never by path again).
    pub dest: OwnedFd,
    pub caps: Caps,
}

/// What the reader starts with.
#[derive(Debug)]
pub(crate) struct ReaderSetup {
    pub key: [u8; KEY_LEN],
    pub stdout: CappedLog,
    pub stderr: CappedLog,
    pub live: LiveSink,
    pub outputs: OutputsSink,
    pub reports: ReportRoute,
}

/// What the attempt hears from the reader as it happens.
#[derive(Debug)]
pub(crate) enum Event {
    /// The command started.
    Started(Started),
    /// The init's record arrived (verified and parsed, or why not).
    Record(Result<Box<InitRecord>, String>),
    /// The outputs tar ended.
    OutputsDone,
    /// The link ended.
    Closed,
}

/// The outputs as received.
#[derive(Debug, Default)]
pub(crate) struct OutputsReceived {
    pub report: ExtractReport,
    /// The init's end record, if it arrived.
    pub end: Option<OutputEnd>,
    /// Why the tar could not be read whole.
    pub error: Option<String>,
}

/// Everything the reader kept, once the link ended.
#[derive(Debug, Default)]
pub(crate) struct Received {
    pub stdout: LogCapture,
    pub stderr: LogCapture,
    pub live_dropped: u64,
    /// The init's own diagnostics (Diag frames and its stderr).
    pub diag: Vec<String>,
    pub init_stderr: String,
    pub outputs: Option<OutputsReceived>,
    /// The link broke (a frame that is not the init's): nothing after it was read.
    pub link_error: Option<String>,
    /// The sandbox's reports, as the host saw them.
    pub reports: crate::contract::ReportsSeen,
}

struct Extraction {
    tx: Option<mpsc::Sender<io::Result<Bytes>>>,
    join: tokio::task::JoinHandle<OutputsReceived>,
}

impl Extraction {
    fn start(sink: OutputsSink) -> Self {
        let (tx, reader) = crate::container::pipe::reader(16);
        let join = tokio::task::spawn_blocking(move || {
            let mut got = OutputsReceived::default();
            if let Err(e) = extract_into(reader, &sink.dest, &sink.caps, &mut got.report) {
                got.error = Some(format!("reading the outputs tar: {e}"));
            }
            got
        });
        Self { tx: Some(tx), join }
    }

    async fn feed(&mut self, body: Vec<u8>) {
        if let Some(tx) = &self.tx
            && tx.send(Ok(Bytes::from(body))).await.is_err()
        {
            // The extractor stopped at a cap: the rest is not read.
            self.tx = None;
        }
    }

    async fn finish(mut self, end: Option<OutputEnd>, cut: Option<&str>) -> OutputsReceived {
        if let (Some(tx), Some(why)) = (self.tx.take(), cut) {
            let _ = tx.send(Err(io::Error::other(why.to_owned()))).await;
        }
        let mut got = self.join.await.unwrap_or_else(|e| OutputsReceived {
            error: Some(format!("the extractor failed: {e}")),
            ..OutputsReceived::default()
        });
        got.end = end;
        got
    }
}

/// Reads the init's frames until the transport ends; routes them as the module says.
pub(crate) async fn read(
    mut inbound: impl FutStream<Item = io::Result<Inbound>> + Unpin,
    setup: ReaderSetup,
    events: mpsc::UnboundedSender<Event>,
) -> Received {
    let ReaderSetup { key, mut stdout, mut stderr, mut live, outputs, mut reports } = setup;
    let accept = |k: Kind| {
        matches!(
            k,
            Kind::Started
                | Kind::Stdout
                | Kind::Stderr
                | Kind::Record
                | Kind::Output
                | Kind::OutputEnd
                | Kind::Report
                | Kind::Diag
        )
    };
    let mut decoder = Decoder::new(accept);
    let mut got = Received::default();
    let mut init_stderr = Tail::new(16 << 10);
    let mut outputs = Some(outputs);
    let mut extraction: Option<Extraction> = None;
    let mut record_seen = false;
    'read: while let Some(item) = inbound.next().await {
        let bytes = match item {
            Ok(Inbound::Link(b)) => b,
            Ok(Inbound::InitStderr(b)) => {
                init_stderr.push(&b);
                continue;
            }
            Err(e) => {
                got.link_error = Some(format!("the transport failed: {e}"));
                break;
            }
        };
        decoder.feed(&bytes);
        loop {
            let frame = match decoder.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    got.link_error = Some(format!("the link is broken: {e}"));
                    break 'read;
                }
            };
            match frame.kind {
                Kind::Stdout => {
                    stdout.write(&frame.body);
                    live.offer(Stream::Stdout, &frame.body);
                }
                Kind::Stderr => {
                    stderr.write(&frame.body);
                    live.offer(Stream::Stderr, &frame.body);
                }
                Kind::Started => {
                    if let Ok(s) = wire::parse_claim::<Started>(&frame.body, Kind::Started.max_body()) {
                        let _ = events.send(Event::Started(s));
                    }
                }
                Kind::Diag => {
                    if got.diag.len() < 32 {
                        got.diag.push(String::from_utf8_lossy(&frame.body).into_owned());
                    }
                }
                Kind::Report => reports.take(&frame.body),
                Kind::Record if !record_seen => {
                    record_seen = true;
                    let parsed = wire::open_sealed(&key, &frame.body)
                        .and_then(|json| wire::parse_claim::<InitRecord>(json, 2 * wire::MAX_RECORD_BYTES))
                        .map(Box::new)
                        .map_err(|e| e.to_string());
                    let _ = events.send(Event::Record(parsed));
                }
                Kind::Output if record_seen => {
                    if extraction.is_none()
                        && let Some(sink) = outputs.take()
                    {
                        extraction = Some(Extraction::start(sink));
                    }
                    if let Some(x) = &mut extraction {
                        x.feed(frame.body).await;
                    }
                }
                Kind::OutputEnd if record_seen => {
                    let end = wire::parse_claim::<OutputEnd>(&frame.body, Kind::OutputEnd.max_body()).ok();
                    let x = extraction.take().or_else(|| outputs.take().map(Extraction::start));
                    if let Some(x) = x {
                        got.outputs = Some(x.finish(end, None).await);
                    }
                    let _ = events.send(Event::OutputsDone);
                }
                other => {
                    got.link_error = Some(format!("unexpected {other:?} frame"));
                    break 'read;
                }
            }
        }
    }
    if let Some(x) = extraction.take() {
        got.outputs = Some(x.finish(None, Some("the link ended inside the outputs tar")).await);
    }
    got.stdout = stdout.capture();
    got.stderr = stderr.capture();
    got.live_dropped = live.dropped;
    got.init_stderr = init_stderr.text();
    got.reports = reports.seen;
    let _ = events.send(Event::Closed);
    got
}

/// On a fresh transport to the init's takeover socket: reads the init's challenge, sends the
/// answer (which proves the attempt key), and returns the transport positioned after the
/// challenge. Whether the init accepted shows as its `Started` frame (`resumed`).
pub(crate) async fn answer_challenge<S>(
    mut inbound: S,
    sender: &Sender,
    key: &[u8; KEY_LEN],
    within: Duration,
) -> Result<impl FutStream<Item = io::Result<Inbound>> + Send + Unpin + 'static, String>
where
    S: FutStream<Item = io::Result<Inbound>> + Send + Unpin + 'static,
{
    let mut buf = Vec::new();
    let mut stderr = Tail::new(2048);
    let read = async {
        while buf.len() < HEADER_LEN + MAC_LEN {
            match inbound.next().await {
                Some(Ok(Inbound::Link(b))) => buf.extend_from_slice(&b),
                Some(Ok(Inbound::InitStderr(b))) => stderr.push(&b),
                Some(Err(e)) => return Err(format!("the transport failed: {e}")),
                None => return Err("the transport ended before the init's challenge".to_owned()),
            }
        }
        Ok(())
    };
    let read = tokio::time::timeout(within, read).await.unwrap_or_else(|_| Err("no challenge in time".into()));
    if let Err(e) = read {
        let said = stderr.text();
        return Err(if said.is_empty() { e } else { format!("{e} ({})", said.trim()) });
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if buf[0] != Kind::Challenge as u8 || len != MAC_LEN {
        return Err("the first frame is not the init's challenge".into());
    }
    let answer = wire::takeover_answer(key, &buf[HEADER_LEN..HEADER_LEN + MAC_LEN]);
    sender.frame(Kind::Takeover, &answer).await.map_err(|e| format!("sending the answer: {e}"))?;
    let rest = Bytes::copy_from_slice(&buf[HEADER_LEN + MAC_LEN..]);
    Ok(futures_util::stream::iter([Ok(Inbound::Link(rest))]).chain(inbound))
}
