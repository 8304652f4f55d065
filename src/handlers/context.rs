//! What a handler gets for one attempt.

use crate::contract::PriorOutput;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tokio_util::sync::CancellationToken;

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

    /// The payload as text, with invalid UTF-8 replaced.
    pub fn payload_text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.payload)
    }
}
