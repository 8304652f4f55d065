//! The one judge: the facts a rung gathered in, the [`Outcome`] out. Every rung ends with it,
//! so the rungs agree on every status, reason, exit code and text.

use super::status::{Exit, Facts, LaunchFailure, Reason, decide};
use super::{Evidence, Outcome, OutputFile, Request, Usage};
use std::sync::Arc;

/// Everything a rung knows at the end of an attempt.
#[derive(Debug, Default)]
pub struct Judgement {
    /// What decides the status.
    pub facts: Facts,
    /// The handler's or command's error text (may be empty: the judge then says what it can).
    pub error_text: String,
    /// The sandbox says retrying cannot help.
    pub permanent: bool,
    /// Resources used.
    pub usage: Usage,
    /// The outputs collected (for every attempt whose sandbox ran).
    pub outputs: Vec<OutputFile>,
    /// Facts gathered along the way.
    pub evidence: Evidence,
    /// The in-process handler's own error value.
    pub cause: Option<Arc<dyn std::error::Error + Send + Sync>>,
    /// The attempt ran in the worker's own process: there is no exit code to report.
    pub in_process: bool,
}

/// Turns what a rung found into the attempt's outcome.
pub fn judge(req: &Request, j: Judgement) -> Outcome {
    let verdict = decide(&j.facts);
    let mut o = Outcome::new(verdict.status);
    o.reason = verdict.reason;
    o.job_id = req.job_id.clone();
    o.attempt = req.attempt;
    o.worker = req.worker_id.clone();
    (o.exit_code, o.signal) = match j.facts.exit {
        _ if j.in_process => (None, None),
        Exit::Code(c) => (Some(c), None),
        Exit::Signal(s) => (None, Some(s)),
        Exit::Unknown => (None, None),
    };
    o.handler_error = match (j.error_text.is_empty(), j.facts.exit, verdict.reason) {
        (false, _, _) => j.error_text,
        (true, _, Some(Reason::InitLost)) => "the sandbox's init left no record".into(),
        (true, _, Some(Reason::RecordInvalid)) => "the sandbox's record was refused (see evidence)".into(),
        (true, Exit::Code(c), _) if c != 0 => format!("exited with code {c}"),
        _ => String::new(),
    };
    o.permanent = j.permanent
        || matches!(
            j.facts.launch_failed,
            Some(
                LaunchFailure::UnknownHandler
                    | LaunchFailure::FingerprintMismatch
                    | LaunchFailure::NotFound
                    | LaunchFailure::NotExecutable
                    | LaunchFailure::BadRequest
                    | LaunchFailure::MountRedirected
                    | LaunchFailure::NotEnforced
            )
        );
    o.usage = j.usage;
    o.outputs = j.outputs;
    o.evidence = j.evidence;
    o.evidence.worker = req.worker_id.clone();
    o.cause = j.cause;
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Status;

    #[test]
    fn the_judge_fills_identity_exit_and_text() {
        let req = Request::command("job-1", ["false"], "/tmp/o").attempt(3).worker("w");
        let j = Judgement { facts: Facts { exit: Exit::Code(3), ..Facts::default() }, ..Judgement::default() };
        let o = judge(&req, j);
        assert_eq!((o.status, o.exit_code, o.signal), (Status::HandlerError, Some(3), None));
        assert_eq!(o.handler_error, "exited with code 3");
        assert_eq!((o.job_id.as_str(), o.attempt, o.worker.as_str()), ("job-1", 3, "w"));

        let j = Judgement {
            facts: Facts { launch_failed: Some(LaunchFailure::NotFound), ..Facts::default() },
            error_text: "nope: not found".into(),
            ..Judgement::default()
        };
        let o = judge(&req, j);
        assert_eq!((o.status, o.reason, o.permanent), (Status::LaunchFailed, Some(Reason::CommandNotFound), true));
        assert_eq!(o.handler_error, "nope: not found");

        let j = Judgement { facts: Facts { exit: Exit::Signal(9), ..Facts::default() }, ..Judgement::default() };
        let o = judge(&req, j);
        assert_eq!((o.exit_code, o.signal, o.handler_error.as_str()), (None, Some(9), ""));
    }
}
