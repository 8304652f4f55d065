//! Supervising one attempt over its link, whatever runs the init: waiting for the record
//! and the outputs while enforcing the deadline, cancellation (the caller's, or the engine's
//! hook) and the grace (a Stop frame, then the rung's hard stop when the init does not finish
//! within grace + margin), resuming the link after a cut (a takeover within the host-loss
//! grace), then the ack.

use super::session::{Event, InboundStream, Received, Sender, Transport};
use crate::contract::{HOOK_TIMEOUT, HookError, Request};
use crate::util::BoxFuture;
use std::time::Duration;
use stevedore_init::wire::{self, InitRecord, KEY_LEN, Kind};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How the host's liveness reaches the init (`docs/link.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostLoss {
    /// How often the host says it is alive.
    pub heartbeat_every: Duration,
    /// Without a word from the host for this long, the init counts it as lost (the link's
    /// end counts at once). `None`: only the link's end.
    pub heartbeat_timeout: Option<Duration>,
    /// How long the init keeps the command running after losing the host, for another host
    /// to take over, or this one to resume a cut link (0, the default: stop it at once, as a
    /// dead-man switch).
    pub grace: Duration,
}

impl Default for HostLoss {
    fn default() -> Self {
        Self {
            heartbeat_every: Duration::from_secs(5),
            heartbeat_timeout: Some(Duration::from_secs(60)),
            grace: Duration::ZERO,
        }
    }
}

/// How long the outputs may take to come back once the command ended: at least `min`, plus
/// a second per `bytes_per_s` bytes the output dir holds (what its filesystem says, at most
/// the byte cap). The init stops sending at that deadline, keeping what it sent whole and
/// naming the rest (`collection_deadline`); the host waits a margin longer, then stops
/// reading, keeping every file it received whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Collection {
    /// The least time the collection gets.
    pub min: Duration,
    /// The slowest transport it allows for.
    pub bytes_per_s: u64,
}

impl Default for Collection {
    fn default() -> Self {
        Self { min: Duration::from_secs(30), bytes_per_s: 32 << 20 }
    }
}

impl Collection {
    /// The init's side of it, for the Start frame.
    pub(crate) fn spec(&self, dir: String, caps: crate::outputs::Caps) -> stevedore_init::wire::OutputSpec {
        stevedore_init::wire::OutputSpec {
            dir,
            max_files: caps.max_files as u64,
            max_bytes: caps.max_total_bytes,
            collect_min_ms: u64::try_from(self.min.as_millis()).unwrap_or(u64::MAX).max(1),
            collect_bytes_per_s: self.bytes_per_s.max(1),
            host_walks: false,
        }
    }
}

/// What the host saw of the attempt's end.
#[derive(Debug, Default)]
pub(crate) struct Ended {
    pub deadline_fired: bool,
    pub cancelled: bool,
    /// stevedore had to SIGKILL the container itself.
    pub hard_killed: bool,
    /// The record, verified and parsed, or why it was refused; `None`: none arrived.
    pub record: Option<Result<Box<InitRecord>, String>>,
    /// The sandbox's cgroup as the host read it before the ack, where the record read none.
    pub host_counters: Option<stevedore_init::wire::CgroupCounters>,
    /// The outputs tar did not end within its time.
    pub collection_timed_out: bool,
    /// The collection's deadline as the host worked it out, and how long it took.
    pub collection: Option<(Duration, Duration)>,
    /// From start to the record (or the link's end), by the host's clock.
    pub host_wall: Duration,
    pub received: Received,
    /// The engine's cancellation hook asked for the stop.
    pub cancelled_by_hook: bool,
    /// Polls of the cancellation hook that failed (the first few).
    pub poll_failures: Vec<String>,
    /// The link was cut and could not be resumed: why.
    pub resume_failed: Option<String>,
    /// When (unix ms) the init said the command runs, its record came, the outputs ended.
    pub command_started_at: Option<u64>,
    /// The kernel the init said it saw as the command started (`wire::Started::kernel`).
    pub kernel: Option<String>,
    pub record_at: Option<u64>,
    pub outputs_at: Option<u64>,
}

/// Past the init's own deadline, how long the host still reads (a fifth more, at least 5 s).
fn collection_margin(deadline: Duration) -> Duration {
    (deadline / 5).max(Duration::from_secs(5))
}

/// An attempt's link, once its init runs.
#[derive(Debug)]
pub(crate) struct Linked {
    pub started: std::time::Instant,
    pub sender: Sender,
    /// Stops the reader when the collection's time runs out.
    pub stop: tokio_util::sync::CancellationToken,
    pub events: mpsc::UnboundedReceiver<Event>,
    pub reader: super::session::ReaderTask,
    pub heartbeat: Option<tokio::task::JoinHandle<()>>,
    /// The command's stdin, sent as it takes it.
    pub stdin: Option<tokio::task::JoinHandle<()>>,
    /// How the link is resumed after a cut; `None`: a cut is its end.
    pub rejoin: Option<Rejoin>,
}

/// What resuming a cut link takes (`docs/link.md`, "Resuming a cut link").
#[derive(Debug, Clone)]
pub(crate) struct Rejoin {
    pub key: [u8; KEY_LEN],
    pub link_id: String,
    /// Hands the reader its next transport (the reader waits on the other end).
    pub more: mpsc::Sender<InboundStream>,
    /// How long after a cut a new transport may be looked for: the host-loss grace, for
    /// which the init keeps the command and what it sent.
    pub within: Duration,
}

impl Drop for Linked {
    fn drop(&mut self) {
        for h in [&self.heartbeat, &self.stdin].into_iter().flatten() {
            h.abort();
        }
    }
}

/// What supervision asks of the rung: the hard stop of a sandbox whose init did not finish
/// within grace + margin, and a new transport to the init after a cut.
pub(crate) trait Reach: Sync {
    /// SIGKILLs everything of the attempt.
    fn hard_stop(&self) -> BoxFuture<'_, ()>;
    /// A transport to the init's takeover socket (`link_id`); `within`: the time left.
    fn reopen<'a>(&'a self, link_id: &'a str, within: Duration) -> BoxFuture<'a, Result<Transport, String>>;
    /// Whether the init still runs (`None`: cannot tell now).
    fn init_runs(&self) -> BoxFuture<'_, Option<bool>>;
    /// The sandbox's cgroup as the host reads it, where it can (`attempt::host_cgroup`).
    fn sandbox_counters(&self) -> Option<stevedore_init::wire::CgroupCounters>;
}

/// The rung's timing rules for supervision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// Past grace, how long the init gets before the rung stops everything itself.
    pub kill_margin: Duration,
    /// The rung's per-call timeout (the reader's end is bounded by it).
    pub call_timeout: Duration,
    /// How long the outputs may take.
    pub collection: Collection,
    /// The byte cap of the outputs.
    pub max_output_bytes: u64,
}

/// Waits for the init's record and outputs while enforcing the request's deadline, the
/// caller's cancellation and the engine's cancellation hook (a Stop frame; then `stop`
/// after grace + margin), then acks.
pub(crate) async fn supervise(
    r: &mut Linked,
    req: &Request,
    rules: Rules,
    cancel: &CancellationToken,
    stop: &dyn Reach,
) -> Ended {
    let hooks = req.hooks.clone();
    let aref = req.attempt_ref();
    let mut next_poll = hooks.as_ref().map(|h| Instant::now() + h.0.poll_every());
    let mut polling: Option<crate::contract::HookResult<'_, bool>> = None;
    // A timeout counts from the command's start, on every rung (`Request::timeout`): until
    // the init says the command runs, only an absolute deadline applies, and the start's own
    // bound (the rung's per-call one) past the timeout.
    let mut deadline = before_start(req, r.started, rules.call_timeout);
    let grace = req.policy.grace();
    let mut ended = Ended::default();
    let mut t = Timers::default();
    let mut rejoining: Option<BoxFuture<'_, Result<(), String>>> = None;
    let closed = loop {
        // A stop is asked for once: not while one is under way, nor after the record.
        let may_stop = t.kill_at.is_none() && ended.record.is_none() && !ended.deadline_fired && !ended.cancelled;
        tokio::select! {
            biased;
            ev = r.events.recv() => match ev {
                Some(Event::Cut(count)) => if let Some(rj) = &r.rejoin {
                    let until = *t.rejoin_by.get_or_insert_with(|| Instant::now() + rj.within);
                    rejoining = Some(Box::pin(rejoin(rj.clone(), r.sender.clone(), stop, count, until)));
                },
                Some(Event::Started(s)) if s.resumed => {
                    t.rejoin_by = None;
                    tracing::info!(from = s.from, "the link was resumed after a cut");
                }
                ev => {
                    if let Some(Event::Started(_)) = &ev {
                        deadline = req.deadline_from(std::time::Instant::now()).map(Instant::from_std);
                    }
                    if let Some(closed) = heard(ev, r.started, &rules, &mut ended, &mut t) {
                        break closed;
                    }
                },
            },
            done = async { rejoining.as_mut().expect("guarded").await }, if rejoining.is_some() => {
                rejoining = None;
                if let Err(why) = done {
                    tracing::warn!(%why, "a cut link could not be resumed");
                    ended.resume_failed = Some(why);
                    // The reader's wait for another transport ends: so does the link.
                    r.rejoin = None;
                }
            }
            _ = async { tokio::time::sleep_until(deadline.expect("guarded")).await }, if deadline.is_some() && may_stop => {
                ended.deadline_fired = true;
                t.kill_at = Some(ask_to_stop(&r.sender, grace + rules.kill_margin).await);
            }
            _ = cancel.cancelled(), if may_stop => {
                ended.cancelled = true;
                t.kill_at = Some(ask_to_stop(&r.sender, grace + rules.kill_margin).await);
            }
            _ = async { tokio::time::sleep_until(t.kill_at.expect("guarded")).await }, if t.kill_at.is_some() => {
                ended.hard_killed = true;
                t.kill_at = None;
                stop.hard_stop().await;
            }
            _ = async { tokio::time::sleep_until(t.collect_by.expect("guarded")).await }, if t.collect_by.is_some() => {
                ended.collection_timed_out = true;
                break false;
            }
            _ = async { tokio::time::sleep_until(next_poll.expect("guarded")).await },
                if next_poll.is_some() && polling.is_none() && t.kill_at.is_none() && ended.record.is_none() => {
                polling = Some(ask_the_hook(hooks.as_ref().expect("a poll time means hooks"), &aref));
            }
            asked = async { polling.as_mut().expect("guarded").await }, if polling.is_some() => {
                polling = None;
                next_poll = hooks.as_ref().map(|h| Instant::now() + h.0.poll_every());
                match asked {
                    Ok(true) if may_stop => {
                        ended.cancelled = true;
                        ended.cancelled_by_hook = true;
                        t.kill_at = Some(ask_to_stop(&r.sender, grace + rules.kill_margin).await);
                    }
                    Ok(_) => {}
                    Err(e) if ended.poll_failures.len() < 4 => ended.poll_failures.push(format!("cancellation_requested: {e}")),
                    Err(_) => {}
                }
            }
        }
    };
    if ended.record.is_none() {
        ended.host_wall = r.started.elapsed();
    }
    if let Some((since, deadline)) = t.collecting {
        ended.collection = Some((deadline, since.elapsed()));
    }
    finish(r, ended, closed, rules.call_timeout, stop).await
}

/// The deadline until the init says the command started: the request's absolute one, and a
/// timeout's only past the start's own bound (a command that never says it started is not
/// waited for forever).
fn before_start(req: &Request, started: std::time::Instant, start_bound: Duration) -> Option<Instant> {
    let run = req.run_timeout.and_then(|t| started.checked_add(t.saturating_add(start_bound)));
    [req.deadline, run].into_iter().flatten().min().map(Instant::from_std)
}

/// The clocks of one supervision.
#[derive(Debug, Default)]
struct Timers {
    /// When the rung stops everything itself, once a stop was asked for.
    kill_at: Option<Instant>,
    /// When the host stops reading the outputs.
    collect_by: Option<Instant>,
    /// When the collection began, and its deadline.
    collecting: Option<(Instant, Duration)>,
    /// Until when a cut link may be resumed, once it was cut (reset when it was).
    rejoin_by: Option<Instant>,
}

/// Resumes a cut link: a new transport from the rung, the proof with the count of frames
/// the host has, the sender moved onto it, the reader handed its inbound. Tried again
/// until `until` (while the engine refuses connections, or the init does not answer).
async fn rejoin(rj: Rejoin, sender: Sender, reach: &dyn Reach, count: u64, until: Instant) -> Result<(), String> {
    let mut why = String::from("no try was made");
    let mut tries = 0u32;
    while Instant::now() < until {
        tries += 1;
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, reach.reopen(&rj.link_id, left)).await {
            Ok(Ok((inbound, new))) => {
                let nonce: [u8; wire::NONCE_LEN] = rand::random();
                match new.frame(Kind::Takeover, &wire::takeover_proof(&rj.key, &rj.link_id, &nonce, count)).await {
                    Ok(()) => {
                        // A failed write here fails on the new writer again, and is seen there.
                        let _ = sender.adopt(new).await;
                        return rj.more.send(inbound).await.map_err(|_| "the link's reader had ended".to_owned());
                    }
                    Err(e) => why = format!("sending the proof: {e}"),
                }
            }
            Ok(Err(e)) => why = e,
            Err(_) => break,
        }
        if reach.init_runs().await == Some(false) {
            return Err(format!("the link was cut and the init is gone: {why}"));
        }
        // The engine may be refusing connections for a while: a little later, not at once.
        let pause = Duration::from_millis(200 * u64::from(tries.min(5)));
        tokio::time::sleep(pause.min(until.saturating_duration_since(Instant::now()))).await;
    }
    Err(format!("the link was cut and not resumed: {why} ({tries} tries)"))
}

/// What the reader said, into `ended`; `Some(closed)` once supervision is over (`closed`:
/// the link ended, so there is nobody to ack).
fn heard(
    ev: Option<Event>,
    started: std::time::Instant,
    rules: &Rules,
    ended: &mut Ended,
    t: &mut Timers,
) -> Option<bool> {
    match ev {
        Some(Event::Record(rec)) => {
            ended.host_wall = started.elapsed();
            ended.record_at = Some(crate::contract::unix_ms_now());
            let deadline = collection_deadline(&rec, rules);
            t.collecting = Some((Instant::now(), deadline));
            t.collect_by = Some(Instant::now() + deadline + collection_margin(deadline));
            ended.record = Some(rec);
            t.kill_at = None;
            None
        }
        Some(Event::OutputsDone) => {
            ended.outputs_at = Some(crate::contract::unix_ms_now());
            Some(false)
        }
        Some(Event::Started(s)) => {
            ended.command_started_at = Some(crate::contract::unix_ms_now());
            ended.kernel = ended.kernel.take().or(s.kernel.clone());
            tracing::debug!(pid = s.pid, init = %s.init_version, "command started");
            None
        }
        Some(Event::Closed) | None => Some(true),
        // Handled by the caller.
        Some(Event::Cut(_)) => None,
    }
}

/// The init's own collection deadline, worked out from the same figures it used (a record
/// that lies about them moves it at most to the byte cap's).
fn collection_deadline(rec: &Result<Box<InitRecord>, String>, rules: &Rules) -> Duration {
    let fs = rec.as_ref().ok().and_then(|r| r.out_fs.as_ref());
    let budget = fs.map_or(rules.max_output_bytes, |f| rules.max_output_bytes.min(f.total_bytes));
    let used = fs.map_or(budget, |f| f.total_bytes.saturating_sub(f.free_bytes)).min(budget);
    let spec = rules.collection.spec(String::new(), crate::outputs::Caps { max_files: 0, max_total_bytes: budget });
    spec.deadline(used).unwrap_or(rules.collection.min)
}

/// Sends the init a Stop frame (a link already gone changes nothing); when the rung must
/// stop everything itself.
async fn ask_to_stop(sender: &Sender, grace_and_margin: Duration) -> Instant {
    let _ = sender.frame(Kind::Stop, b"").await;
    Instant::now() + grace_and_margin
}

/// One poll of the engine's cancellation hook, bounded by [`HOOK_TIMEOUT`].
fn ask_the_hook<'a>(
    hooks: &'a crate::contract::HookSet,
    aref: &'a crate::contract::AttemptRef,
) -> crate::contract::HookResult<'a, bool> {
    let asked = hooks.0.cancellation_requested(aref);
    Box::pin(async move {
        tokio::time::timeout(HOOK_TIMEOUT, asked)
            .await
            .unwrap_or_else(|_| Err(HookError::new(format!("no answer within {}s", HOOK_TIMEOUT.as_secs()))))
    })
}

/// Once the loop ended: the heartbeat stops, the init gets its ack (it may exit now), and
/// the reader's end is awaited within the rung's call timeout.
async fn finish(r: &mut Linked, mut ended: Ended, closed: bool, call_timeout: Duration, stop: &dyn Reach) -> Ended {
    for h in [r.heartbeat.take(), r.stdin.take()].into_iter().flatten() {
        h.abort();
    }
    // A record that read no cgroup (gVisor shows the init none): the host reads the sandbox's
    // own now, while the init waits for its ack, since the runtime removes that cgroup with
    // the sandbox once the init exits.
    if matches!(&ended.record, Some(Ok(rec)) if rec.cgroup.version.is_none()) {
        ended.host_counters = stop.sandbox_counters();
    }
    // The init may exit now; if the link is gone this changes nothing.
    if !closed {
        let _ = r.sender.frame(Kind::Ack, b"").await;
    }
    if ended.collection_timed_out {
        // The reader keeps every output it received whole, and ends.
        r.stop.cancel();
    }
    ended.received = match tokio::time::timeout(call_timeout, &mut r.reader).await {
        Ok(Ok(got)) => got,
        _ => {
            r.reader.abort();
            Received::default()
        }
    };
    ended
}
