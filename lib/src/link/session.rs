//! One attempt's link, host side: the frames the host sends (start, heartbeats, stop, ack)
//! and the task that reads the init's frames and routes them: the command's streams to the
//! captures and the live copy, the record and the outputs to the attempt.
//!
//! The reader never waits for a consumer it does not own: captures are local files, the
//! live copy is dropped when the caller's channel is full. It only waits for the outputs
//! extractor, which is the attempt's own and runs after the command has ended.
//!
//! It counts the init's frames (`docs/link.md`, "Resuming a cut link"): the heartbeats carry
//! the count, and when its transport ends before the outputs did, a reader that may resume
//! says how many it has ([`Event::Cut`]) and waits for the next transport, on which the
//! init's `Started` says where it goes on from.

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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// What the init's frames look like from the host: a transport's bytes.
pub(crate) type InboundStream = Pin<Box<dyn FutStream<Item = io::Result<Inbound>> + Send>>;

/// Bytes of the init's frames between two counts sent without waiting for the timer, well
/// below what the init keeps (`init/src/link.rs`, `RETAIN_CAP`), so that it never waits for one.
const COUNT_EVERY_BYTES: u64 = 256 << 10;

/// What the reader heard that the host's senders act on: how many of the init's frames it
/// has (the heartbeats carry it), how much of its stdin the command took and how often the
/// link was resumed (the stdin pump).
#[derive(Debug, Default)]
pub(crate) struct Heard {
    frames: AtomicU64,
    bytes_since: AtomicU64,
    due: tokio::sync::Notify,
    stdin_taken: AtomicU64,
    resumes: AtomicU64,
    stdin_news: tokio::sync::Notify,
}

impl Heard {
    /// Bytes of its stdin the command took (`u64::MAX`: it takes no more).
    pub fn stdin_taken(&self) -> u64 {
        self.stdin_taken.load(Ordering::Acquire)
    }

    /// How often the link was resumed.
    pub fn resumes(&self) -> u64 {
        self.resumes.load(Ordering::Acquire)
    }

    /// Waits for a change of either.
    pub async fn stdin_news(&self) {
        self.stdin_news.notified().await;
    }

    pub fn get(&self) -> u64 {
        self.frames.load(Ordering::Acquire)
    }

    fn set(&self, n: u64) {
        self.frames.store(n, Ordering::Release);
    }

    /// One more frame of `len` bytes.
    fn one(&self, len: usize) {
        self.frames.fetch_add(1, Ordering::AcqRel);
        if self.bytes_since.fetch_add(len as u64, Ordering::AcqRel) + len as u64 >= COUNT_EVERY_BYTES {
            self.bytes_since.store(0, Ordering::Release);
            self.due.notify_one();
        }
    }
}

/// Sends frames to the init. Clones share one writer, so frames never interleave; after a
/// cut the writer is replaced ([`Sender::adopt`]) and every clone writes to the new one.
#[derive(Clone)]
pub(crate) struct Sender {
    w: Arc<tokio::sync::Mutex<LinkWriter>>,
    /// A stop was asked for: said again on a writer adopted after a cut (it may have been
    /// written into the cut one).
    stop_asked: Arc<AtomicBool>,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sender")
    }
}

impl Sender {
    pub fn new(w: LinkWriter) -> Self {
        Self { w: Arc::new(tokio::sync::Mutex::new(w)), stop_asked: Arc::default() }
    }

    /// Writes to `other`'s writer from now on (a resumed link; its proof already went out
    /// on it); a stop asked for before is asked again.
    pub async fn adopt(&self, other: Sender) -> io::Result<()> {
        let new = std::mem::replace(&mut *other.w.lock().await, Box::pin(tokio::io::sink()));
        *self.w.lock().await = new;
        if self.stop_asked.load(Ordering::Acquire) {
            self.frame(Kind::Stop, b"").await?;
        }
        Ok(())
    }

    /// Writes raw bytes (already framed) and flushes.
    pub async fn raw(&self, bytes: &[u8]) -> io::Result<()> {
        let mut w = self.w.lock().await;
        w.write_all(bytes).await?;
        w.flush().await
    }

    /// Writes `parts` one after the other, then flushes: one frame written from where its
    /// pieces are.
    pub async fn raw_parts(&self, parts: &[&[u8]]) -> io::Result<()> {
        let mut w = self.w.lock().await;
        for p in parts {
            w.write_all(p).await?;
        }
        w.flush().await
    }

    /// Writes one frame and flushes.
    pub async fn frame(&self, kind: Kind, body: &[u8]) -> io::Result<()> {
        if kind == Kind::Stop {
            self.stop_asked.store(true, Ordering::Release);
        }
        self.raw(&wire::encode(kind, body)).await
    }

    /// Sends a heartbeat, with `count`, every `every` and whenever the count is due, until
    /// the returned task is aborted. A write that fails is not the end: the link may be
    /// resumed on another writer.
    pub fn heartbeats(&self, every: Duration, count: Arc<Heard>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = count.due.notified() => {}
                }
                let _ = me.frame(Kind::Heartbeat, &wire::heartbeat_body(count.get())).await;
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
    /// The output dir as the host holds it, walked in place at the init's end instead of a
    /// tar over the link (`outputs::in_place`); its `dir` a host path.
    pub in_place: Option<wire::OutputSpec>,
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
    /// The count of the init's frames received.
    pub count: Arc<Heard>,
    /// The next transports after a cut; `None`: a cut is the end.
    pub more: Option<mpsc::Receiver<InboundStream>>,
    /// The first frame is a takeover's `Started`, for a host that has nothing of the link
    /// (a restarted worker): the count starts where it says.
    pub taking_over: bool,
    /// Where the outputs' arrival is reported.
    pub progress: Option<crate::contract::ProgressSink>,
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
    /// The transport ended with this many of the init's frames received, before the
    /// outputs did: the reader waits for another (see [`ReaderSetup::more`]).
    Cut(u64),
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
    /// How often the link was resumed after a cut.
    pub resumed: u32,
    /// Frames of the init's that went out before a cut and were no longer kept for the resume.
    pub frames_lost: u64,
    /// Frames sent again on a resume that the host already had (not routed again).
    pub frames_again: u64,
}

struct Extraction {
    tx: Option<mpsc::Sender<io::Result<Bytes>>>,
    /// Frame bodies gathered into one chunk for the extractor: one hand-over (and one wake
    /// of its thread) per [`EXTRACT_CHUNK`] bytes rather than per 64 KiB frame.
    pending: Vec<u8>,
    join: tokio::task::JoinHandle<OutputsReceived>,
}

/// Bytes of the outputs tar handed to the extractor at once; with [`EXTRACT_DEPTH`] of them
/// in flight, what the host holds of the tar (4 MiB).
const EXTRACT_CHUNK: usize = 512 << 10;
const EXTRACT_DEPTH: usize = 8;

impl Extraction {
    fn start(sink: OutputsSink) -> Self {
        let (tx, reader) = crate::pipe::reader(EXTRACT_DEPTH);
        let join = tokio::task::spawn_blocking(move || {
            let mut got = OutputsReceived::default();
            if let Err(e) = extract_into(reader, &sink.dest, &sink.caps, &mut got.report) {
                got.error = Some(format!("reading the outputs tar: {e}"));
            }
            got
        });
        Self { tx: Some(tx), pending: Vec::new(), join }
    }

    async fn feed(&mut self, body: Vec<u8>) {
        if self.tx.is_none() {
            // The extractor stopped at a cap: nothing more is kept.
            return;
        }
        // A frame (at most `wire::MAX_CHUNK`) never takes a chunk past its size.
        if self.pending.len() + body.len() > EXTRACT_CHUNK {
            let chunk = std::mem::take(&mut self.pending);
            self.send(chunk).await;
        }
        if self.pending.capacity() == 0 {
            self.pending.reserve_exact(EXTRACT_CHUNK.max(body.len()));
        }
        self.pending.extend_from_slice(&body);
    }

    async fn send(&mut self, chunk: Vec<u8>) {
        if let Some(tx) = &self.tx
            && tx.send(Ok(Bytes::from(chunk))).await.is_err()
        {
            // The extractor stopped at a cap: the rest is not read.
            self.tx = None;
        }
    }

    async fn finish(mut self, end: Option<OutputEnd>, cut: Option<&str>) -> OutputsReceived {
        // What came before the end (or the cut) is the extractor's, whole frames as ever.
        let rest = std::mem::take(&mut self.pending);
        if !rest.is_empty() {
            self.send(rest).await;
        }
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

/// The outputs walked in place (every process of the attempt but the init is gone once its end
/// came): the walk's own end record stands for the init's, which sent nothing.
#[cfg(feature = "oci")]
async fn collect_in_place(sink: OutputsSink) -> OutputsReceived {
    let Some(spec) = sink.in_place else { return OutputsReceived::default() };
    let collected =
        tokio::task::spawn_blocking(move || crate::outputs::in_place::collect(&spec, &sink.dest, &sink.caps)).await;
    match collected {
        Ok(c) => OutputsReceived { report: c.report, end: Some(c.end), error: c.error },
        Err(e) => OutputsReceived { error: Some(format!("the collection failed: {e}")), ..OutputsReceived::default() },
    }
}

#[cfg(not(feature = "oci"))]
async fn collect_in_place(_: OutputsSink) -> OutputsReceived {
    OutputsReceived { error: Some("no rung of this build walks outputs in place".into()), ..OutputsReceived::default() }
}

/// Reads the init's frames until the transport ends (and no other follows); routes them as
/// the module says.
pub(crate) async fn read(
    mut inbound: InboundStream,
    mut setup: ReaderSetup,
    events: mpsc::UnboundedSender<Event>,
) -> Received {
    let stop = setup.stop.clone();
    let mut more = setup.more.take();
    let decoder = || Decoder::new(Kind::init_to_host);
    let mut d = decoder();
    let mut router = Router::new(setup, events);
    let mut cut = None;
    'read: loop {
        let item = tokio::select! {
            biased;
            () = stop.cancelled() => {
                cut = Some("collection_deadline: the collection's time ran out");
                break;
            }
            item = inbound.next() => item,
        };
        let bytes = match item {
            Some(Ok(Inbound::Link(b))) => b,
            Some(Ok(Inbound::InitStderr(b))) => {
                router.init_stderr.push(&b);
                continue;
            }
            end => {
                let failed = match end {
                    Some(Err(e)) => Some(format!("the transport failed: {e}")),
                    _ => None,
                };
                match router.next_transport(&mut more, &stop).await {
                    Some(next) => {
                        inbound = next;
                        d = decoder();
                        continue;
                    }
                    None => {
                        router.got.link_error = router.got.link_error.take().or(failed);
                        break;
                    }
                }
            }
        };
        d.feed(&bytes);
        loop {
            let routed = match d.next_frame() {
                Ok(Some(frame)) => router.route(frame).await,
                Ok(None) => break,
                Err(e) => Err(format!("the link is broken: {e}")),
            };
            if let Err(e) = routed {
                router.got.link_error = Some(e);
                break 'read;
            }
            // The outputs' end is the last thing the init says: the rest is its exit, which
            // the container's end (tens of ms after the Ack) would only delay. What the init
            // might still write on its stderr after it is not waited for.
            if router.got.outputs.is_some() {
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
    count: Arc<Heard>,
    /// The next frame is a takeover's `Started` (outside the numbering).
    hello: Hello,
    /// Frames sent again that this host already has: not routed again.
    skip: u64,
    progress: Option<crate::contract::ProgressSink>,
    /// Bytes of the outputs tar received.
    out_bytes: u64,
}

fn outputs_progress(done: u64, finished: bool) -> crate::contract::Progress {
    let total = finished.then_some(done);
    crate::contract::Progress { phase: crate::contract::Phase::Outputs, done, total, finished }
}

/// What the first frame on a transport is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hello {
    /// The link's first transport: the frames are numbered from its first.
    None,
    /// A resume: the `Started` says the number of the frame after it.
    Resume,
    /// A restarted worker's takeover: the count starts where the `Started` says.
    Fresh,
}

impl Router {
    fn new(setup: ReaderSetup, events: mpsc::UnboundedSender<Event>) -> Self {
        let ReaderSetup { key, stdout, stderr, live, outputs, reports, stop: _, count, more: _, taking_over, progress } =
            setup;
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
            count,
            hello: if taking_over { Hello::Fresh } else { Hello::None },
            skip: 0,
            progress,
            out_bytes: 0,
        }
    }

    /// After a cut: the next transport, if the link may be resumed and one comes before the
    /// reader is stopped. Not once the record is here: a delivery is not resumed (the init
    /// starts it again for a restarted worker only).
    async fn next_transport(
        &mut self,
        more: &mut Option<mpsc::Receiver<InboundStream>>,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Option<InboundStream> {
        if self.record_seen {
            return None;
        }
        let rx = more.as_mut()?;
        let _ = self.events.send(Event::Cut(self.count.get()));
        let next = tokio::select! {
            () = stop.cancelled() => None,
            next = rx.recv() => next,
        };
        if next.is_some() {
            self.hello = Hello::Resume;
        }
        next
    }

    fn diag(&mut self, body: &[u8]) {
        if self.got.diag.len() < 32 {
            self.got.diag.push(String::from_utf8_lossy(body).into_owned());
        }
    }

    /// A takeover's `Started`: where the numbering goes on.
    fn hello(&mut self, frame: &wire::Frame) -> Result<(), String> {
        let s = (frame.kind == Kind::Started)
            .then(|| wire::parse_claim::<Started>(&frame.body, Kind::Started.max_body()).ok())
            .flatten()
            .filter(|s| s.resumed)
            .ok_or_else(|| format!("the init's first frame on a takeover is {:?}, not its Started", frame.kind))?;
        let have = self.count.get();
        if self.hello == Hello::Resume {
            self.got.resumed += 1;
            self.count.resumes.fetch_add(1, Ordering::AcqRel);
            self.count.stdin_news.notify_one();
            if s.from > have {
                self.got.frames_lost += s.from - have;
            }
            self.skip = have.saturating_sub(s.from);
            self.got.frames_again += self.skip;
        }
        self.count.set(have.max(s.from));
        self.hello = Hello::None;
        let _ = self.events.send(Event::Started(s));
        Ok(())
    }

    /// Routes one frame; `Err` says why the link cannot be trusted past it.
    async fn route(&mut self, frame: wire::Frame) -> Result<(), String> {
        if self.hello != Hello::None {
            if frame.kind == Kind::Diag {
                // Before the hello only a refusal can come (`wire::TAKEOVER_REFUSED`): the init
                // did not take this connection, so it is outside the numbering too.
                self.diag(&frame.body);
                return Ok(());
            }
            return self.hello(&frame);
        }
        if self.skip > 0 {
            self.skip -= 1;
            return Ok(());
        }
        self.count.one(frame.body.len());
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
            Kind::Diag => self.diag(&frame.body),
            Kind::StdinTaken => {
                self.count.stdin_taken.fetch_max(wire::heartbeat_count(&frame.body), Ordering::AcqRel);
                self.count.stdin_news.notify_one();
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
                let before = self.out_bytes;
                self.out_bytes += frame.body.len() as u64;
                if let Some(s) = &self.progress
                    && before / crate::contract::REPORT_EVERY != self.out_bytes / crate::contract::REPORT_EVERY
                {
                    s.report(outputs_progress(self.out_bytes, false));
                }
                if let Some(x) = &mut self.extraction {
                    x.feed(frame.body).await;
                }
            }
            Kind::OutputEnd if self.record_seen => {
                let end = wire::parse_claim::<OutputEnd>(&frame.body, Kind::OutputEnd.max_body()).ok();
                let in_place = self.outputs.as_ref().is_some_and(|s| s.in_place.is_some());
                if in_place && self.extraction.is_none() {
                    let sink = self.outputs.take().expect("checked");
                    self.got.outputs = Some(collect_in_place(sink).await);
                } else if let Some(x) = self.extraction.take().or_else(|| self.outputs.take().map(Extraction::start)) {
                    self.got.outputs = Some(x.finish(end, None).await);
                }
                if let Some(s) = &self.progress {
                    s.report(outputs_progress(self.out_bytes, true));
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
pub(crate) type Transport = (InboundStream, Sender);

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
    /// The count of the init's frames, for the heartbeats.
    pub count: Arc<Heard>,
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
        let mut setup = setup()?;
        setup.taking_over = true;
        let stop = setup.stop.clone();
        let count = setup.count.clone();
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
            Ok(Some(resumed)) => return Ok(TakenOver { sender, stop, events, reader, resumed, count }),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostdir::PrivateDir;

    fn setup(dir: &std::path::Path, more: Option<mpsc::Receiver<InboundStream>>) -> (ReaderSetup, Arc<Heard>) {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let logs = PrivateDir::open(dir).unwrap();
        let out = dir.join("out");
        std::fs::create_dir(&out).unwrap();
        let count = Arc::new(Heard::default());
        let setup = ReaderSetup {
            key: [1; KEY_LEN],
            stdout: CappedLog::create(&logs, "a.stdout", 1 << 20).unwrap(),
            stderr: CappedLog::create(&logs, "a.stderr", 1 << 20).unwrap(),
            live: LiveSink::new(None),
            outputs: OutputsSink {
                in_place: None,
                dest: std::fs::File::open(&out).unwrap().into(),
                caps: Caps { max_files: 10, max_total_bytes: 1 << 20 },
            },
            reports: ReportRoute::new(wire::Scope { job_id: "j".into(), attempt: 1 }, None),
            stop: Default::default(),
            count: count.clone(),
            more,
            taking_over: false,
            progress: None,
        };
        (setup, count)
    }

    fn stream(frames: &[(Kind, Vec<u8>)]) -> InboundStream {
        let bytes: Vec<u8> = frames.iter().flat_map(|(k, b)| wire::encode(*k, b)).collect();
        // Split mid-frame, as a transport may.
        let (a, b) = bytes.split_at(bytes.len() / 2 + 1);
        let items = vec![Ok(Inbound::Link(Bytes::copy_from_slice(a))), Ok(Inbound::Link(Bytes::copy_from_slice(b)))];
        Box::pin(futures_util::stream::iter(items))
    }

    fn started(resumed: bool, from: u64) -> (Kind, Vec<u8>) {
        let s = Started { pid: 2, init_version: "t".into(), resumed, ended: false, from, kernel: None };
        (Kind::Started, serde_json::to_vec(&s).unwrap())
    }

    fn line(n: u32) -> (Kind, Vec<u8>) {
        (Kind::Stdout, format!("{n}\n").into_bytes())
    }

    /// The first transport carries `Started` and lines 1..=3 and ends; the next one starts
    /// with the init's hello saying `from`, then lines from the number `from` names.
    async fn resumed_with(from: u64) -> (String, Received, u64) {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = mpsc::channel(1);
        let (setup, count) = setup(dir.path(), Some(rx));
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let first = stream(&[started(false, 0), line(1), line(2), line(3)]);
        let reader = tokio::spawn(read(first, setup, events_tx));
        let have = loop {
            match events.recv().await.unwrap() {
                Event::Cut(n) => break n,
                Event::Closed => panic!("closed without a cut"),
                _ => {}
            }
        };
        assert_eq!(have, 4, "Started and three lines");
        // Frame number k (from 1 on) is line k.
        let mut again = vec![started(true, from)];
        again.extend((from as u32..=6).map(line));
        tx.send(stream(&again)).await.unwrap();
        drop(tx);
        let got = reader.await.unwrap();
        let text = std::fs::read_to_string(dir.path().join("a.stdout")).unwrap();
        (text, got, count.get())
    }

    #[tokio::test]
    async fn a_resume_from_the_count_loses_and_repeats_nothing() {
        let (text, got, count) = resumed_with(4).await;
        assert_eq!(text, "1\n2\n3\n4\n5\n6\n");
        assert_eq!((got.resumed, got.frames_lost, got.frames_again, count), (1, 0, 0, 7));
    }

    #[tokio::test]
    async fn frames_sent_again_are_dropped_once() {
        let (text, got, count) = resumed_with(2).await;
        assert_eq!(text, "1\n2\n3\n4\n5\n6\n");
        assert_eq!((got.frames_lost, got.frames_again, count), (0, 2, 7));
    }

    #[tokio::test]
    async fn frames_the_init_no_longer_had_are_counted_as_lost() {
        let (text, got, count) = resumed_with(6).await;
        assert_eq!(text, "1\n2\n3\n6\n");
        assert_eq!((got.frames_lost, got.frames_again, count), (2, 0, 7));
    }

    /// Without a way to resume, the end of the transport is the end of the link.
    #[tokio::test]
    async fn without_a_next_transport_a_cut_is_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let (setup, _) = setup(dir.path(), None);
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let got = read(stream(&[started(false, 0), line(1)]), setup, events_tx).await;
        assert_eq!(got.resumed, 0);
        let mut seen = Vec::new();
        while let Ok(e) = events.try_recv() {
            seen.push(format!("{e:?}"));
        }
        assert!(seen.last().is_some_and(|e| e == "Closed") && !seen.iter().any(|e| e.starts_with("Cut")), "{seen:?}");
    }
}
