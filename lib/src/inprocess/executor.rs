//! The in-process rung.

use crate::contract::HOOK_TIMEOUT;
use crate::contract::{
    Evidence, Executor, Exit, Judgement, LaunchError, Level, Outcome, ReclaimError, ReclaimReport, Request, Source,
    Task, Usage, judge, valid_worker_id,
};
use crate::handlers::{HandlerContext, HandlerError, Handlers, Reporter, cap_text, error_chain, panic_text};
use crate::link::reports;
use crate::outputs::{self, Caps, WalkReport};
use crate::util::BoxFuture;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use stevedore_init::wire::{LaunchFailure as WireLaunch, MAX_ERROR_TEXT};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The rung's name unless configured otherwise.
pub const DEFAULT_NAME: &str = "inprocess";

/// How long a cancelled handler gets to wind down before `run` returns without it: long
/// enough for a cooperative handler to be seen finished, short enough to stay on time.
const SETTLE: Duration = Duration::from_millis(100);

const SHARED_PROCESS: &str = "in-process rung shares the worker's process";

/// Runs handlers on tasks of the worker's own runtime: no isolation (level `none`).
///
/// A handler that ignores cancellation cannot be stopped: at the deadline `run` returns
/// `timeout` on time and the evidence says the handler is `still_running`.
#[derive(Debug)]
pub struct InProcessExecutor {
    name: String,
    handlers: Handlers,
    fingerprint: String,
    incarnation: String,
    caps: Caps,
    tracker: TaskTracker,
}

/// How the handler's task was found when `run` stopped waiting for it.
enum End {
    Returned(Result<(), HandlerError>),
    Panicked(String),
    Deadline { still_running: bool },
    Cancelled { still_running: bool },
}

/// What the handler's task reports when the handler returns.
struct Returned {
    result: Result<(), HandlerError>,
    at: Instant,
    /// The caller had cancelled before the handler returned.
    cancelled: bool,
}

impl InProcessExecutor {
    /// A rung running `handlers`, for the worker boot `incarnation`.
    pub fn new(handlers: Handlers, incarnation: impl Into<String>) -> Self {
        Self {
            name: DEFAULT_NAME.to_owned(),
            fingerprint: handlers.fingerprint(),
            handlers,
            incarnation: incarnation.into(),
            caps: Caps::default(),
            tracker: TaskTracker::new(),
        }
    }

    /// Names the rung (builder style).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the caps on outputs (builder style).
    pub fn with_caps(mut self, caps: Caps) -> Self {
        self.caps = caps;
        self
    }

    /// The handlers this rung runs.
    pub fn handlers(&self) -> &Handlers {
        &self.handlers
    }

    async fn attempt(&self, request: &Request, cancel: CancellationToken) -> Result<Outcome, LaunchError> {
        // Taken before the check so that `close` either refuses this attempt or waits for it.
        let _in_flight = self.tracker.token();
        let name = self.admit(request, &cancel)?;
        let start = Instant::now();
        let mut j = Judgement {
            evidence: self.evidence_for(request),
            usage: usage_for(),
            in_process: true,
            ..Judgement::default()
        };
        // Nothing is enforced in the worker's own process: what the policy requires is not.
        if !request.policy.require_enforced.is_empty() {
            j.facts.launch_failed = Some(crate::contract::LaunchFailure::NotEnforced);
            j.error_text = format!(
                "the policy requires {} enforced, and the in-process rung enforces nothing",
                request.policy.require_enforced.join(", ")
            );
            j.permanent = true;
            return Ok(finish(request, j, start));
        }
        let handler = match crate::handlers::check(&self.handlers, &self.fingerprint, name, None) {
            Ok(h) => h,
            Err((why, text)) => {
                j.facts.launch_failed = Some(launch_failure(why));
                j.error_text = text;
                j.usage.sources.disk_written_bytes = Some(Source::unavailable("the handler did not run"));
                return Ok(finish(request, j, start));
            }
        };
        let output_dir = request.open_output_dir()?;
        drop(output_dir);
        j.evidence.action = Some(self.action(request, &j.evidence).await);

        let cancel = cancel.child_token();
        let (hooks, reporter) = HookWiring::new(request, &cancel);
        let deadline = request.deadline_from(start);
        let end = if deadline.is_some_and(|d| d <= start) {
            // Not started at all, so nothing of it can still be running.
            End::Deadline { still_running: false }
        } else {
            let mut ctx = context(request, cancel.child_token());
            ctx.deadline = deadline;
            ctx.reporter = reporter;
            let handler_cancel = ctx.cancel.clone();
            let caller_cancel = cancel.clone();
            let task = tokio::spawn(async move {
                // Called inside the task, so that a handler panicking before its first
                // await is caught like any other panic.
                let result = handler(ctx).await;
                Returned { result, at: Instant::now(), cancelled: caller_cancel.is_cancelled() }
            });
            let settle = SETTLE.min(request.policy.grace());
            wait(task, deadline, &cancel, &handler_cancel, settle).await
        };
        record_end(end, &mut j);
        hooks.stop_polling(&mut j.evidence);
        // Outputs are listed for every attempt whose handler ran, whatever its status.
        record_outputs(&mut j, self.walk(request.output_dir.clone()).await);
        hooks.finish(&mut j.evidence).await;
        let mut outcome = finish(request, j, start);
        if let Some(h) = &request.hooks {
            h.deliver_outcome(&mut outcome).await;
        }
        Ok(outcome)
    }

    /// What is refused before anything runs; the handler's name.
    fn admit<'r>(&self, request: &'r Request, cancel: &CancellationToken) -> Result<&'r str, LaunchError> {
        if self.tracker.is_closed() {
            return Err(LaunchError::Closed(self.name.clone()));
        }
        request.validate()?;
        request.policy.admit_network(&self.name, false)?;
        let name = match &request.task {
            Task::Handler(name) => name,
            Task::Command(_) => {
                return Err(LaunchError::NotAllowed(format!("{} runs handlers, not plain commands", self.name)));
            }
        };
        // Known before anything runs, as an image's label is for the container rung.
        if let Some(want) = request.fingerprint.as_deref()
            && want != self.fingerprint
        {
            return Err(LaunchError::FingerprintMismatch {
                image: format!("{} (in-process)", self.name),
                expected: want.to_owned(),
                actual: self.fingerprint.clone(),
            });
        }
        if cancel.is_cancelled() {
            return Err(LaunchError::CancelledBeforeStart);
        }
        Ok(name)
    }

    /// The evidence known before the handler runs.
    fn evidence_for(&self, request: &Request) -> Evidence {
        let mut ev = Evidence {
            executor: self.name.clone(),
            level: Some(Level::None),
            incarnation: self.incarnation.clone(),
            started_at_unix_ms: Some(crate::contract::unix_ms_now()),
            ..Evidence::default()
        };
        for (key, amount) in &request.limits.0 {
            if *amount > 0 {
                ev.skipped.insert(format!("limit.{key}"), "the in-process rung enforces no limits".into());
            }
        }
        if !request.env.is_empty() {
            ev.skipped.insert("env".into(), "in-process handlers see the worker's own environment".into());
        }
        ev
    }

    /// The attempt's action (`docs/outcome.md`, "Action digest"): no image and no init; the
    /// worker's network and user. The handler reads the input dir itself, so the tree digest
    /// is the one read of the inputs this rung makes (on a blocking thread); a dir that
    /// cannot be walked leaves the tree empty, and the handler finds out for itself.
    async fn action(&self, request: &Request, ev: &Evidence) -> crate::contract::Action {
        let mut action = crate::contract::Action::of_request(request, &self.name, Some(Level::None));
        action.network = "host".to_owned();
        action.user = "the worker's".to_owned();
        if let Some(dir) = request.input_dir.clone() {
            let staged = tokio::task::spawn_blocking(move || crate::inputs::tree_digest(&dir)).await;
            if let Ok(Ok(r)) = staged {
                let staged = crate::contract::InputsStaged {
                    files: r.files,
                    bytes: r.bytes,
                    tree: Some(r.tree),
                    ..Default::default()
                };
                action.staged(Some(&staged));
            }
        }
        action.seal(&ev.enforcement, &ev.skipped, request.action_key.as_ref());
        action
    }

    async fn walk(&self, dir: PathBuf) -> Result<WalkReport, String> {
        let caps = self.caps;
        match tokio::task::spawn_blocking(move || outputs::walk(&dir, &caps)).await {
            Ok(Ok(report)) => Ok(report),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }
}

fn usage_for() -> Usage {
    let mut u = Usage::default();
    u.sources.cpu_time_ms = Some(Source::unavailable(SHARED_PROCESS));
    u.sources.peak_memory_bytes = Some(Source::unavailable(SHARED_PROCESS));
    u
}

fn launch_failure(w: WireLaunch) -> crate::contract::LaunchFailure {
    match w {
        WireLaunch::UnknownHandler => crate::contract::LaunchFailure::UnknownHandler,
        WireLaunch::FingerprintMismatch => crate::contract::LaunchFailure::FingerprintMismatch,
        WireLaunch::BadRequest => crate::contract::LaunchFailure::BadRequest,
    }
}

/// Waits for the handler, the deadline or the caller's cancellation, whichever comes
/// first; on the latter two, cancels the handler and gives it `settle` to return.
async fn wait(
    mut task: JoinHandle<Returned>,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
    handler_cancel: &CancellationToken,
    settle: Duration,
) -> End {
    let sleep = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d.into()).await,
            None => std::future::pending().await,
        }
    };
    let joined = tokio::select! {
        // The task first: a handler already done when we look is not overtaken.
        biased;
        joined = &mut task => Some(joined),
        () = sleep => None,
        () = cancel.cancelled() => None,
    };
    let joined = match joined {
        Some(j) => Some(j),
        None => {
            handler_cancel.cancel();
            tokio::time::timeout(settle, &mut task).await.ok()
        }
    };
    let late = |at: Instant| deadline.is_some_and(|d| at >= d);
    match joined {
        // What happened first wins: the task notes when the handler returned and whether
        // the caller had cancelled by then.
        Some(Ok(r)) if late(r.at) => End::Deadline { still_running: false },
        Some(Ok(r)) if r.cancelled => End::Cancelled { still_running: false },
        Some(Ok(r)) => End::Returned(r.result),
        Some(Err(e)) if e.is_panic() => End::Panicked(panic_text(&*e.into_panic())),
        // The runtime is shutting down under us.
        Some(Err(_)) => End::Cancelled { still_running: false },
        None if late(Instant::now()) => End::Deadline { still_running: true },
        None => End::Cancelled { still_running: true },
    }
}

fn context(request: &Request, cancel: CancellationToken) -> HandlerContext {
    // The handler gets absolute paths: a relative one would depend on the worker's cwd.
    let abs = |p: &PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
    let input_dir = request.input_dir.as_ref().map(abs).unwrap_or_default();
    HandlerContext {
        job_id: request.job_id.clone(),
        attempt: request.attempt,
        payload: request.payload.clone(),
        inputs: request.inputs.iter().map(|(slot, rel)| (slot.clone(), input_dir.join(rel))).collect(),
        input_dir,
        output_dir: abs(&request.output_dir),
        prior_outputs: request.prior_outputs.clone(),
        deadline: request.deadline,
        cancel,
        reporter: Reporter::none(),
    }
}

fn record_outputs(j: &mut Judgement, walked: Result<WalkReport, String>) {
    match walked {
        Ok(report) => {
            j.usage.disk_written_bytes = Some(report.total_bytes);
            j.usage.sources.disk_written_bytes = Some(Source::Walked);
            j.facts.output_limit = report.limit_hit;
            j.evidence.refused_outputs = report.refused;
            j.outputs = report.files;
        }
        Err(e) => {
            j.usage.sources.disk_written_bytes = Some(Source::unavailable(format!("walking the outputs failed: {e}")));
            j.evidence.notes.push(format!("walking the output dir failed: {e}"));
        }
    }
}

fn finish(request: &Request, mut j: Judgement, start: Instant) -> Outcome {
    j.usage.wall_time_ms = Some(u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX));
    j.usage.sources.wall_time_ms = Some(Source::HostClock);
    j.evidence.finished_at_unix_ms = Some(crate::contract::unix_ms_now());
    judge(request, j)
}

impl Executor for InProcessExecutor {
    fn name(&self) -> &str {
        &self.name
    }

    fn level(&self) -> Level {
        Level::None
    }

    fn run<'a>(
        &'a self,
        request: &'a Request,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<Outcome, LaunchError>> {
        Box::pin(self.attempt(request, cancel))
    }

    fn reclaim<'a>(&'a self, worker_id: &'a str) -> BoxFuture<'a, Result<ReclaimReport, ReclaimError>> {
        Box::pin(async move {
            if !valid_worker_id(worker_id) {
                return Err(ReclaimError::WorkerId(worker_id.to_owned()));
            }
            // Nothing outlives the worker's process, so nothing can leak across a restart.
            Ok(ReclaimReport { worker: worker_id.to_owned(), ..ReclaimReport::default() })
        })
    }

    /// Refuses new attempts and waits for the `run` calls in flight. Handlers abandoned
    /// after a deadline or cancellation (`still_running`) are not waited for: they may
    /// never return.
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.tracker.close();
            self.tracker.wait().await;
        })
    }
}

/// The engine's hooks for one attempt: reports through the same checks and limits as a
/// sandbox's, and a cancellation poll that cancels like the caller does.
struct HookWiring {
    direct: Arc<Mutex<reports::Direct>>,
    report_task: Option<JoinHandle<reports::Delivered>>,
    poller: Option<JoinHandle<()>>,
    asked: Arc<AtomicBool>,
}

impl HookWiring {
    /// The wiring, and the reporter the handler gets.
    fn new(request: &Request, cancel: &CancellationToken) -> (Self, Reporter) {
        let scope = stevedore_init::wire::Scope { job_id: request.job_id.clone(), attempt: request.attempt };
        let (report_tx, report_task) = match &request.hooks {
            Some(h) => {
                let (tx, task) = reports::forward(h.clone(), request.attempt_ref());
                (Some(tx), Some(task))
            }
            None => (None, None),
        };
        let direct = Arc::new(Mutex::new(reports::Direct::new(scope, report_tx)));
        let reporter = {
            let d = direct.clone();
            Reporter::new(move |r| d.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take(r))
        };
        let asked = Arc::new(AtomicBool::new(false));
        let poller = request.hooks.clone().map(|h| {
            let (token, asked, attempt) = (cancel.clone(), asked.clone(), request.attempt_ref());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(h.0.poll_every()).await;
                    if let Ok(Ok(true)) = tokio::time::timeout(HOOK_TIMEOUT, h.0.cancellation_requested(&attempt)).await
                    {
                        asked.store(true, Ordering::SeqCst);
                        token.cancel();
                        return;
                    }
                }
            })
        });
        (Self { direct, report_task, poller, asked }, reporter)
    }

    /// The handler has ended (or been given up on): no more polls.
    fn stop_polling(&self, ev: &mut Evidence) {
        if let Some(p) = &self.poller {
            p.abort();
        }
        if self.asked.load(Ordering::SeqCst) {
            ev.notes.push("the engine's cancellation hook asked for the stop".into());
        }
    }

    /// The reports as seen and delivered.
    async fn finish(self, ev: &mut Evidence) {
        // The handler's reporter (which holds the hook's queue) may outlive the attempt in a
        // handler that keeps running; the queue is closed by dropping the route here.
        let (init_like, host) = self.direct.lock().unwrap_or_else(std::sync::PoisonError::into_inner).counts();
        *self.direct.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            reports::Direct::new(stevedore_init::wire::Scope::default(), None);
        let delivered = reports::finish(self.report_task).await;
        ev.reports = reports::seen(Some(&init_like), &host, delivered, &mut ev.hook_failures);
    }
}

/// How the handler ended, into the facts.
fn record_end(end: End, j: &mut Judgement) {
    let facts = &mut j.facts;
    match end {
        End::Returned(result) => {
            facts.exit = Exit::Code(0);
            if let Err(e) = result {
                let text = cap_text(&error_chain(&e), MAX_ERROR_TEXT);
                facts.handler_error = Some(text.clone());
                j.error_text = text;
                j.permanent = e.permanent;
                j.cause = Some(Arc::new(e));
            }
        }
        End::Panicked(text) => {
            facts.panicked = true;
            j.error_text = cap_text(&text, MAX_ERROR_TEXT);
        }
        End::Deadline { still_running } | End::Cancelled { still_running } => {
            facts.deadline_fired = matches!(end, End::Deadline { .. });
            facts.cancelled = !facts.deadline_fired;
            if still_running {
                j.evidence.still_running = true;
                j.evidence.notes.push(
                    "the handler was cancelled but has not returned; an in-process handler cannot be killed".into(),
                );
            }
        }
    }
}
