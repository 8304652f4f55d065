//! What a handler gets for one attempt.

use crate::contract::{PriorOutput, Report};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// Where a handler's reports go: the engine's report hook, through the rung (rate- and
/// size-limited like a command's; see `stevedore_init::report`). Reports never change the
/// attempt's status or usage.
#[derive(Clone, Default)]
pub struct Reporter(Option<Arc<dyn Fn(Report) -> bool + Send + Sync>>);

impl Reporter {
    /// Reports go to `f`, which says whether it took the report.
    pub fn new(f: impl Fn(Report) -> bool + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(f)))
    }

    /// Reports go nowhere.
    pub fn none() -> Self {
        Self(None)
    }

    /// Sends `report`; `false` when it was not taken (no hook, over a limit, refused).
    pub fn send(&self, report: Report) -> bool {
        self.0.as_ref().is_some_and(|f| f(report))
    }
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Reporter" } else { "Reporter(none)" })
    }
}

/// Everything a handler gets for one attempt.
#[derive(Debug, Clone)]
pub struct HandlerContext {
    /// The job's ID.
    pub job_id: String,
    /// Which attempt of the job this is (1-based).
    pub attempt: u32,
    /// The bytes the caller handed over.
    pub payload: Vec<u8>,
    /// The input dir (read-only by convention; read-only by mount in the container).
    pub input_dir: PathBuf,
    /// Where the handler writes its outputs.
    pub output_dir: PathBuf,
    /// Named input slots: slot → absolute path of its file.
    pub inputs: BTreeMap<String, PathBuf>,
    /// Outputs of earlier steps, passed through untouched.
    pub prior_outputs: Vec<PriorOutput>,
    /// When the attempt must end, if it has a deadline.
    pub deadline: Option<Instant>,
    /// Cancelled at the deadline, on cancellation of the attempt, or on SIGTERM in the
    /// container: a handler should stop soon after.
    pub cancel: CancellationToken,
    /// Where [`HandlerContext::progress`] and friends send reports.
    pub reporter: Reporter,
}

impl HandlerContext {
    /// The path of input slot `slot`, if the request named it.
    pub fn input(&self, slot: &str) -> Option<&Path> {
        self.inputs.get(slot).map(PathBuf::as_path)
    }

    /// `rel` under the output dir.
    pub fn output(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.output_dir.join(rel)
    }

    /// Reports progress (0 to 100) with an optional text; `false` when it was not taken.
    pub fn progress(&self, percent: f64, text: Option<&str>) -> bool {
        self.reporter.send(Report::progress(percent, text.map(str::to_owned)))
    }

    /// Reports a line of text.
    pub fn note(&self, text: impl Into<String>) -> bool {
        self.reporter.send(Report::note(text))
    }

    /// Reports any report (a heartbeat, a small JSON value, ...).
    pub fn report(&self, report: Report) -> bool {
        self.reporter.send(report)
    }

    /// The payload as text, with invalid UTF-8 replaced.
    pub fn payload_text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.payload)
    }
}
