//! The in-process rung.

use crate::contract::{
    BoxFuture, Executor, Exit, Facts, LaunchError, Level, Outcome, ReclaimError, ReclaimReport, Request, Status, Task,
    decide, reason, valid_worker_id,
};
use crate::handlers::{HandlerContext, HandlerError, Handlers, cap_text, error_chain, panic_text};
use crate::outputs::{self, Caps, WalkReport};
use crate::protocol::MAX_ERROR_TEXT;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The rung's name unless configured otherwise.
pub const DEFAULT_NAME: &str = "inprocess";

/// How long a cancelled handler gets to wind down before `run` returns without it: long
/// enough for a cooperative handler to be seen finished, short enough to stay on time.
const SETTLE: Duration = Duration::from_millis(100);

const SHARED_PROCESS: &str = "unavailable: in-process rung shares the worker's process";

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
        if self.tracker.is_closed() {
            return Err(LaunchError::Closed(self.name.clone()));
        }
        request.validate()?;
        let name = match &request.task {
            Task::Handler(name) => name,
            Task::Command(_) => {
                return Err(LaunchError::NotAllowed(format!("{} runs handlers, not plain commands", self.name)));
            }
        };
        if cancel.is_cancelled() {
            return Err(LaunchError::CancelledBeforeStart);
        }

        let start = Instant::now();
        let mut outcome = self.outcome_for(request);
        if let Some(expected) = request.fingerprint.as_deref()
            && expected != self.fingerprint
        {
            let msg = format!(
                "handler set fingerprint mismatch: request expects {expected}, this worker has {}",
                self.fingerprint
            );
            return Ok(launch_failed(outcome, start, msg, reason::FINGERPRINT_MISMATCH));
        }
        let Some(handler) = self.handlers.get(name).cloned() else {
            return Ok(launch_failed(outcome, start, format!("unknown handler {name:?}"), reason::UNKNOWN_HANDLER));
        };
        tokio::fs::create_dir_all(&request.output_dir)
            .await
            .map_err(|e| LaunchError::Staging { what: "output dir".into(), source: Box::new(e) })?;

        let end = if request.deadline.is_some_and(|d| d <= start) {
            // Not started at all, so nothing of it can still be running.
            End::Deadline { still_running: false }
        } else {
            let ctx = context(request, cancel.child_token());
            let handler_cancel = ctx.cancel.clone();
            let caller_cancel = cancel.clone();
            let task = tokio::spawn(async move {
                // Called inside the task, so that a handler panicking before its first
                // await is caught like any other panic.
                let result = handler(ctx).await;
                Returned { result, at: Instant::now(), cancelled: caller_cancel.is_cancelled() }
            });
            let settle = SETTLE.min(request.policy.grace());
            wait(task, request.deadline, &cancel, &handler_cancel, settle).await
        };

        let mut facts = Facts::default();
        let mut walked = None;
        match end {
            End::Returned(result) => {
                facts.exit = Exit::Code(0);
                if let Err(e) = result {
                    let text = cap_text(&error_chain(&e), MAX_ERROR_TEXT);
                    facts.handler_error = Some(text.clone());
                    outcome.handler_error = text;
                    outcome.permanent = e.permanent;
                    outcome.cause = Some(Arc::new(e));
                }
                let report = self.walk(request.output_dir.clone()).await;
                if let Ok(r) = &report {
                    facts.output_limit = r.limit_hit;
                }
                walked = Some(report);
            }
            End::Panicked(text) => {
                facts.panicked = true;
                outcome.handler_error = cap_text(&text, MAX_ERROR_TEXT);
            }
            End::Deadline { still_running } | End::Cancelled { still_running } => {
                facts.deadline_fired = matches!(end, End::Deadline { .. });
                facts.cancelled = !facts.deadline_fired;
                if still_running {
                    outcome.evidence.still_running = true;
                    outcome.evidence.notes.push(
                        "the handler was cancelled but has not returned; an in-process handler cannot be killed".into(),
                    );
                }
            }
        }
        let verdict = decide(&facts);
        outcome.status = verdict.status;
        outcome.reason = verdict.reason.map(str::to_owned);
        record_outputs(&mut outcome, walked, verdict.status);
        finish(&mut outcome, start);
        Ok(outcome)
    }

    /// An outcome with everything known before the handler runs.
    fn outcome_for(&self, request: &Request) -> Outcome {
        let mut o = Outcome::new(Status::LaunchFailed);
        let ev = &mut o.evidence;
        ev.executor = self.name.clone();
        ev.level = Some(Level::None);
        ev.worker = request.worker_id.clone();
        ev.incarnation = self.incarnation.clone();
        ev.started_at_unix_ms = Some(crate::contract::unix_ms_now());
        for (key, amount) in &request.limits.0 {
            if *amount > 0 {
                ev.skipped.insert(format!("limit.{key}"), "the in-process rung enforces no limits".into());
            }
        }
        if !request.env.is_empty() {
            ev.skipped.insert("env".into(), "in-process handlers see the worker's own environment".into());
        }
        o.usage.sources.insert("cpu_time_ms".into(), SHARED_PROCESS.into());
        o.usage.sources.insert("peak_memory_bytes".into(), SHARED_PROCESS.into());
        o
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
    }
}

fn launch_failed(mut o: Outcome, start: Instant, msg: String, why: &'static str) -> Outcome {
    let verdict = decide(&Facts { launch_failed: Some(msg.clone()), ..Facts::default() });
    o.status = verdict.status;
    o.reason = Some(verdict.reason.unwrap_or(why).to_owned());
    o.handler_error = msg;
    o.permanent = true;
    o.usage.sources.insert("disk_written_bytes".into(), "unavailable: the handler did not run".into());
    finish(&mut o, start);
    o
}

fn record_outputs(o: &mut Outcome, walked: Option<Result<WalkReport, String>>, status: Status) {
    let sources = &mut o.usage.sources;
    match walked {
        Some(Ok(report)) => {
            o.usage.disk_written_bytes = Some(report.total_bytes);
            sources.insert("disk_written_bytes".into(), "walked".into());
            o.evidence.refused_outputs = report.refused;
            o.outputs = report.files;
        }
        Some(Err(e)) => {
            sources.insert("disk_written_bytes".into(), format!("unavailable: walking the outputs failed: {e}"));
            o.evidence.notes.push(format!("walking the output dir failed: {e}"));
        }
        None => {
            sources.insert("disk_written_bytes".into(), format!("unavailable: outputs are not walked for {status}"));
        }
    }
}

fn finish(o: &mut Outcome, start: Instant) {
    o.usage.wall_time_ms = Some(u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX));
    o.usage.sources.insert("wall_time_ms".into(), "host_clock".into());
    o.evidence.finished_at_unix_ms = Some(crate::contract::unix_ms_now());
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
