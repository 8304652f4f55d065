//! The engine's hooks into an attempt: a checkpoint before the command starts, a
//! cancellation poll while it runs, the sandbox's reports as they arrive, and the outcome
//! once it is known. Every method is optional (the defaults do nothing) and async.
//!
//! Order, per attempt: `checkpoint` → `started` → `report`* (in the order the sandbox sent
//! them) → `outcome`. `cancellation_requested` is polled every [`Hooks::poll_every`] meanwhile.
//!
//! Failures: a `checkpoint` that fails stops the attempt before its command starts
//! ([`crate::LaunchError::Hook`]), leaving nothing behind. A `report` or `outcome` that
//! fails (or takes longer than [`HOOK_TIMEOUT`]) never loses the outcome or its outputs: it
//! is recorded in `evidence.hook_failures`. Reports reach the hook through a bounded queue,
//! so a slow hook never stalls the draining of the sandbox's output; what does not fit is
//! counted in `evidence.reports.dropped_slow_hook`.

use super::{Checkpoint, Outcome};
use crate::util::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

/// The longest one hook call may take before it counts as failed.
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(30);

/// What a report from the sandbox is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReportKind {
    /// How far along the work is (`percent`, with an optional `text`).
    Progress,
    /// Still alive, nothing else to say.
    Heartbeat,
    /// A line of text (`text`).
    Note,
    /// A small JSON value (`value`).
    Data,
}

/// A report a handler or a command sends (`docs/link.md`, "Reports from the sandbox"): a
/// claim, which never changes the status or the usage.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Report {
    /// What it is.
    pub kind: ReportKind,
    /// For `progress`: 0 to 100.
    pub percent: Option<f64>,
    /// For `progress` (optional) and `note`.
    pub text: Option<String>,
    /// For `data`.
    pub value: Option<serde_json::Value>,
}

impl Report {
    /// A progress report.
    pub fn progress(percent: f64, text: Option<String>) -> Self {
        Self { kind: ReportKind::Progress, percent: Some(percent), text, value: None }
    }
    /// A heartbeat.
    pub fn heartbeat() -> Self {
        Self { kind: ReportKind::Heartbeat, percent: None, text: None, value: None }
    }
    /// A note.
    pub fn note(text: impl Into<String>) -> Self {
        Self { kind: ReportKind::Note, text: Some(text.into()), ..Self::heartbeat() }
    }
    /// A small JSON value.
    pub fn data(value: serde_json::Value) -> Self {
        Self { kind: ReportKind::Data, value: Some(value), ..Self::heartbeat() }
    }
}

/// A report from the sandbox as the host got it, in the order the sandbox sent them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct SandboxReport {
    /// 1, 2, 3, ... in the order they were admitted.
    pub seq: u64,
    /// Milliseconds since the command started, by the sandbox's clock.
    pub at_ms: u64,
    /// The report.
    pub report: Report,
}

impl SandboxReport {
    /// A report numbered `seq`, made at `at_ms`.
    pub fn new(seq: u64, at_ms: u64, report: Report) -> Self {
        Self { seq, at_ms, report }
    }
}

/// The attempt a hook call is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRef {
    /// The job.
    pub job_id: String,
    /// The attempt number.
    pub attempt: u32,
    /// The worker it runs for.
    pub worker: String,
}

/// What [`Hooks::started`] says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StartedInfo {
    /// The container, on the container rung (`namespace/name` of the Pod, on the kube rung).
    pub container_id: Option<String>,
    /// The init's pid, on the process rung.
    pub pid: Option<i32>,
    /// Published ports: container port → host address.
    pub ports: std::collections::BTreeMap<String, String>,
}

/// Why a hook failed.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct HookError {
    /// What went wrong.
    pub message: String,
    /// The cause, if any.
    #[source]
    pub source: Option<crate::util::Cause>,
}

impl HookError {
    /// A failure with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), source: None }
    }

    /// A failure carrying `err`, with its text as the message.
    pub fn from_error<E: std::error::Error + Send + Sync + 'static>(err: E) -> Self {
        Self { message: err.to_string(), source: Some(Box::new(err)) }
    }
}

/// What a hook returns.
pub type HookResult<'a, T = ()> = BoxFuture<'a, Result<T, HookError>>;

/// The engine's hooks. Implement the methods you need.
pub trait Hooks: Send + Sync {
    /// Called once the sandbox exists and before the command starts, with what a restarted
    /// worker needs to find the attempt again ([`crate::Executor::recover`]). Persist it
    /// before returning: it holds the attempt's link key, a secret.
    fn checkpoint<'a>(&'a self, checkpoint: &'a Checkpoint) -> HookResult<'a> {
        let _ = checkpoint;
        Box::pin(async { Ok(()) })
    }

    /// Polled while the command runs; `Ok(true)` stops the attempt as a cancellation does.
    fn cancellation_requested<'a>(&'a self, attempt: &'a AttemptRef) -> HookResult<'a, bool> {
        let _ = attempt;
        Box::pin(async { Ok(false) })
    }

    /// How often [`Hooks::cancellation_requested`] is polled.
    fn poll_every(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// The command started: where it runs, and the host addresses of its published ports.
    fn started<'a>(&'a self, attempt: &'a AttemptRef, info: &'a StartedInfo) -> HookResult<'a> {
        let _ = (attempt, info);
        Box::pin(async { Ok(()) })
    }

    /// A report from the sandbox (a claim: it changes neither the status nor the usage).
    fn report<'a>(&'a self, attempt: &'a AttemptRef, report: &'a SandboxReport) -> HookResult<'a> {
        let _ = (attempt, report);
        Box::pin(async { Ok(()) })
    }

    /// The attempt's outcome, once known (also for a recovered attempt).
    fn outcome<'a>(&'a self, outcome: &'a Outcome) -> HookResult<'a> {
        let _ = outcome;
        Box::pin(async { Ok(()) })
    }
}

/// A request's hooks: cheap to clone, printed as a name only.
#[derive(Clone)]
pub struct HookSet(pub Arc<dyn Hooks>);

impl std::fmt::Debug for HookSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookSet")
    }
}

impl HookSet {
    /// Calls `f` with [`HOOK_TIMEOUT`]; a timeout is a failure.
    pub(crate) async fn call<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T, HookError>>,
    ) -> Result<T, String> {
        match tokio::time::timeout(HOOK_TIMEOUT, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(format!("{what}: {}", crate::util::error_chain(&e))),
            Err(_) => Err(format!("{what}: no answer within {}s", HOOK_TIMEOUT.as_secs())),
        }
    }

    /// Delivers the outcome; a failure is recorded in the outcome's evidence.
    pub(crate) async fn deliver_outcome(&self, outcome: &mut Outcome) {
        if let Err(e) = self.call("outcome", self.0.outcome(outcome)).await {
            outcome.evidence.hook_failures.push(e);
        }
    }
}
