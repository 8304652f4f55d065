//! One attempt's link, host side: the frames the host sends (start, heartbeats, stop, ack)
//! and the task that reads the init's frames and routes them: the command's streams to the
//! captures and the live copy, the record and the outputs to the attempt.
//!
//! The reader never waits for a consumer it does not own: captures are local files, the
//! live copy is dropped when the caller's channel is full. It only waits for the outputs
//! extractor, which is the attempt's own and runs after the command has ended.

use super::capture::{CappedLog, LiveSink, Tail};
use super::reports::ReportRoute;
use crate::contract::LogCapture;
use crate::contract::Stream;
use crate::outputs::{Caps, ExtractReport, extract_into};
use bytes::Bytes;
use futures_util::{Stream as FutStream, StreamExt};
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use stevedore_init::wire::{self, Decoder, InitRecord, KEY_LEN, Kind, OutputEnd, Started};
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

/// The link's reader, on the rung's tracked tasks. Aborted when dropped: an attempt dropped
/// anywhere (before its container started, during supervision) never leaves a reader waiting
/// on a transport that may never end, which would keep `close` waiting for ever. Awaiting it
/// to its end first makes the abort a no-op.
#[derive(Debug)]
pub(crate) struct ReaderTask(tokio::task::JoinHandle<Received>);

impl ReaderTask {
    /// Runs `reader` on `tracker`.
    pub fn spawn(
        tracker: &tokio_util::task::TaskTracker,
        reader: impl std::future::Future<Output = Received> + Send + 'static,
    ) -> Self {
        Self(tracker.spawn(reader))
    }

    /// Stops it now.
    pub fn abort(&self) {
        self.0.abort();
    }
}

impl std::future::Future for ReaderTask {
    type Output = Result<Received, tokio::task::JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl Drop for ReaderTask {
    fn drop(&mut self) {
        self.0.abort();
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
    /// Cancelled when the collection's time ran out: the reader stops reading, keeps every
    /// output it received whole, and ends.
    pub stop: tokio_util::sync::CancellationToken,
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
        let (tx, reader) = crate::pipe::reader(16);
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
    let stop = setup.stop.clone();
    let mut decoder = Decoder::new(|k: Kind| {
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
    });
    let mut router = Router::new(setup, events);
    let mut cut = None;
    'read: loop {
        let item = tokio::select! {
            biased;
            () = stop.cancelled() => {
                cut = Some("collection_deadline: the collection's time ran out");
                break;
            }
            item = inbound.next() => match item {
                Some(item) => item,
                None => break,
            },
        };
        let bytes = match item {
            Ok(Inbound::Link(b)) => b,
            Ok(Inbound::InitStderr(b)) => {
                router.init_stderr.push(&b);
                continue;
            }
            Err(e) => {
                router.got.link_error = Some(format!("the transport failed: {e}"));
                break;
            }
        };
        decoder.feed(&bytes);
        loop {
            let routed = match decoder.next_frame() {
                Ok(Some(frame)) => router.route(frame).await,
                Ok(None) => break,
                Err(e) => Err(format!("the link is broken: {e}")),
            };
            if let Err(e) = routed {
                router.got.link_error = Some(e);
                break 'read;
            }
        }
    }
    router.finish(cut).await
}

/// The reader's state between frames: where each kind goes, and what it gathered.
struct Router {
    key: [u8; KEY_LEN],
    stdout: CappedLog,
    stderr: CappedLog,
    live: LiveSink,
    reports: ReportRoute,
    events: mpsc::UnboundedSender<Event>,
    /// The sink until the first output frame (or the end) starts the extraction.
    outputs: Option<OutputsSink>,
    extraction: Option<Extraction>,
    record_seen: bool,
    init_stderr: Tail,
    got: Received,
}

impl Router {
    fn new(setup: ReaderSetup, events: mpsc::UnboundedSender<Event>) -> Self {
        let ReaderSetup { key, stdout, stderr, live, outputs, reports, stop: _ } = setup;
        Self {
            key,
            stdout,
            stderr,
            live,
            reports,
            events,
            outputs: Some(outputs),
            extraction: None,
            record_seen: false,
            init_stderr: Tail::new(16 << 10),
            got: Received::default(),
        }
    }

    /// Routes one frame; `Err` says why the link cannot be trusted past it.
    async fn route(&mut self, frame: wire::Frame) -> Result<(), String> {
        match frame.kind {
            Kind::Stdout => {
                self.stdout.write(&frame.body);
                self.live.offer(Stream::Stdout, &frame.body);
            }
            Kind::Stderr => {
                self.stderr.write(&frame.body);
                self.live.offer(Stream::Stderr, &frame.body);
            }
            Kind::Started => {
                if let Ok(s) = wire::parse_claim::<Started>(&frame.body, Kind::Started.max_body()) {
                    let _ = self.events.send(Event::Started(s));
                }
            }
            Kind::Diag => {
                if self.got.diag.len() < 32 {
                    self.got.diag.push(String::from_utf8_lossy(&frame.body).into_owned());
                }
            }
            Kind::Report => self.reports.take(&frame.body),
            Kind::Record if !self.record_seen => {
                self.record_seen = true;
                let parsed = wire::open_sealed(&self.key, &frame.body)
                    .and_then(|json| wire::parse_claim::<InitRecord>(json, 2 * wire::MAX_RECORD_BYTES))
                    .map(Box::new)
                    .map_err(|e| e.to_string());
                let _ = self.events.send(Event::Record(parsed));
            }
            Kind::Output if self.record_seen => {
                if self.extraction.is_none()
                    && let Some(sink) = self.outputs.take()
                {
                    self.extraction = Some(Extraction::start(sink));
                }
                if let Some(x) = &mut self.extraction {
                    x.feed(frame.body).await;
                }
            }
            Kind::OutputEnd if self.record_seen => {
                let end = wire::parse_claim::<OutputEnd>(&frame.body, Kind::OutputEnd.max_body()).ok();
                let x = self.extraction.take().or_else(|| self.outputs.take().map(Extraction::start));
                if let Some(x) = x {
                    self.got.outputs = Some(x.finish(end, None).await);
                }
                let _ = self.events.send(Event::OutputsDone);
            }
            other => return Err(format!("unexpected {other:?} frame")),
        }
        Ok(())
    }

    /// The link ended (or was cut: `cut` says why): an extraction under way keeps what it
    /// received whole.
    async fn finish(mut self, cut: Option<&str>) -> Received {
        if let Some(x) = self.extraction.take() {
            self.got.outputs = Some(x.finish(None, Some(cut.unwrap_or("the link ended inside the outputs tar"))).await);
        }
        let mut got = self.got;
        got.stdout = self.stdout.capture();
        got.stderr = self.stderr.capture();
        got.live_dropped = self.live.dropped;
        got.init_stderr = self.init_stderr.text();
        got.reports = self.reports.seen;
        let _ = self.events.send(Event::Closed);
        got
    }
}

/// A transport to an init's takeover socket: what it delivers, and a sender on it.
pub(crate) type Transport = (Pin<Box<dyn FutStream<Item = io::Result<Inbound>> + Send>>, Sender);

/// A link taken over: the reader runs on the new transport.
#[derive(Debug)]
pub(crate) struct TakenOver {
    pub sender: Sender,
    /// The reader's stop (see [`ReaderSetup::stop`]).
    pub stop: tokio_util::sync::CancellationToken,
    pub events: mpsc::UnboundedReceiver<Event>,
    pub reader: ReaderTask,
    /// The init's `Started` (`resumed`, and whether the command had already ended).
    pub resumed: Started,
}

/// Takes an attempt's link over (`docs/link.md`, "Taking over an attempt"): opens a
/// transport with `open` (the relay through the engine's exec, or a direct connection),
/// proves the attempt key in the first frame, and waits for the init's `Started` again. A
/// transport that ends unanswered (the relay gave up, or was killed as the command ended)
/// is opened again until `within` has passed; each try starts a reader on a fresh `setup`.
pub(crate) async fn take_over<F, Fut>(
    mut open: F,
    mut setup: impl FnMut() -> Result<ReaderSetup, String>,
    key: &[u8; KEY_LEN],
    link_id: &str,
    tracker: &tokio_util::task::TaskTracker,
    within: Duration,
) -> Result<TakenOver, String>
where
    F: FnMut(Duration) -> Fut,
    Fut: std::future::Future<Output = Result<Transport, String>>,
{
    let until = tokio::time::Instant::now() + within;
    let mut why = String::from("no try was made");
    let mut tries = 0u32;
    while tokio::time::Instant::now() < until {
        tries += 1;
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        let (inbound, sender) = match tokio::time::timeout(left, open(left)).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                why = e;
                tokio::time::sleep(Duration::from_millis(100).min(left)).await;
                continue;
            }
            Err(_) => break,
        };
        let nonce: [u8; wire::NONCE_LEN] = rand::random();
        if let Err(e) = sender.frame(Kind::Takeover, &wire::takeover_proof(key, link_id, &nonce, 0)).await {
            why = format!("sending the proof: {e}");
            continue;
        }
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let setup = setup()?;
        let stop = setup.stop.clone();
        let reader = ReaderTask::spawn(tracker, read(inbound, setup, events_tx));
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        let answer = tokio::time::timeout(left, async {
            loop {
                match events.recv().await {
                    Some(Event::Started(s)) if s.resumed => return Some(s),
                    Some(Event::Closed) | None => return None,
                    Some(_) => {}
                }
            }
        })
        .await;
        match answer {
            Ok(Some(resumed)) => return Ok(TakenOver { sender, stop, events, reader, resumed }),
            Ok(None) => {
                let got = reader.await.unwrap_or_default();
                if let Some(no) = got.diag.iter().find(|d| d.starts_with(wire::TAKEOVER_REFUSED)) {
                    // The init said no on this very connection: trying again cannot help.
                    return Err(no.clone());
                }
                let said = got.init_stderr;
                why = if said.trim().is_empty() {
                    "the transport ended before the init took it".into()
                } else {
                    said.trim().to_owned()
                };
            }
            Err(_) => {
                reader.abort();
                why = "the init did not take the proof in time".into();
                break;
            }
        }
    }
    Err(format!("{why} ({tries} tries in {}s)", within.as_secs()))
}
