//! The status of an attempt, the reason words, and the one function that decides them.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What became of an attempt. Serialised exactly as the variant names in snake_case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Status {
    /// The handler or command succeeded.
    Ok,
    /// It ran and failed (non-zero exit or a handler error).
    HandlerError,
    /// The deadline fired.
    Timeout,
    /// The kernel OOM-killed a process of the attempt and the attempt failed.
    OomKilled,
    /// It was stopped: by a signal, by cancellation, or without a record.
    Killed,
    /// The sandbox could not start the handler or command.
    LaunchFailed,
}

impl Status {
    /// Whether an attempt with this status uses up one of the job's retries.
    pub fn counts_against_retries(self) -> bool {
        !matches!(self, Status::Ok | Status::LaunchFailed)
    }

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::HandlerError => "handler_error",
            Status::Timeout => "timeout",
            Status::OomKilled => "oom_killed",
            Status::Killed => "killed",
            Status::LaunchFailed => "launch_failed",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why, when the status alone does not say: a stable word (`docs/outcome.md` lists them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reason {
    /// The deadline fired.
    Deadline,
    /// The caller cancelled the attempt.
    Cancelled,
    /// A handler exited 0 without its record.
    NoResultRecord,
    /// The attempt filled its disk allowance.
    DiskLimit,
    /// The outputs exceeded the caps on file count or total size; what fits was collected.
    OutputLimit,
    /// The handler panicked.
    Panicked,
    /// The container was removed by someone else mid-attempt.
    RemovedExternally,
    /// The kernel OOM-killed a process.
    Oom,
    /// The main process died of a signal stevedore did not send.
    Signalled,
    /// The handler is not in the image's handler set.
    UnknownHandler,
    /// The image's handler set differs from the one the caller expects.
    FingerprintMismatch,
    /// The command does not exist in the image.
    CommandNotFound,
    /// The command exists but cannot be executed.
    CommandNotExecutable,
    /// The handler runner could not read its request.
    BadRequest,
    /// The init left no record: the status comes from what the host saw.
    InitLost,
    /// A record arrived but failed verification (MAC, size, shape): it was ignored and the
    /// status comes from what the host saw.
    RecordInvalid,
    /// A mount destination has a symlink in one of its components in the image: the engine
    /// would follow it and put the mount elsewhere (over stevedore's own, or out of a limit's
    /// reach), so the attempt is not run.
    MountRedirected,
    /// The engine went away mid-attempt (restarted, stopped, or the connection to it was
    /// cut), and that explains the end: the engine's error is in `handler_error`.
    EngineLost,
    /// The outputs were not all delivered: the init died while sending them (by the kernel's
    /// OOM killer: `oom_killed`), so `outputs` is not all that `/out` held
    /// (`evidence.outputs_lost` says what is known of the rest).
    OutputsLost,
    /// The policy requires a limit or a hardening (`Policy::require_enforced`) that the rung
    /// did not apply to this attempt, as it read back what it applied: nothing ran
    /// (`evidence.skipped` says why each was not applied).
    NotEnforced,
}

impl Reason {
    /// The word.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Deadline => "deadline",
            Reason::Cancelled => "cancelled",
            Reason::NoResultRecord => "no_result_record",
            Reason::DiskLimit => "disk_limit",
            Reason::OutputLimit => "output_limit",
            Reason::Panicked => "panicked",
            Reason::RemovedExternally => "removed_externally",
            Reason::Oom => "oom",
            Reason::Signalled => "signalled",
            Reason::UnknownHandler => "unknown_handler",
            Reason::FingerprintMismatch => "fingerprint_mismatch",
            Reason::CommandNotFound => "command_not_found",
            Reason::CommandNotExecutable => "command_not_executable",
            Reason::BadRequest => "bad_request",
            Reason::InitLost => "init_lost",
            Reason::RecordInvalid => "record_invalid",
            Reason::MountRedirected => "mount_redirected",
            Reason::EngineLost => "engine_lost",
            Reason::OutputsLost => "outputs_lost",
            Reason::NotEnforced => "not_enforced",
        }
    }

    /// Every reason, for the reference's check.
    pub const ALL: &'static [Reason] = &[
        Reason::Deadline,
        Reason::Cancelled,
        Reason::NoResultRecord,
        Reason::DiskLimit,
        Reason::OutputLimit,
        Reason::Panicked,
        Reason::RemovedExternally,
        Reason::Oom,
        Reason::Signalled,
        Reason::UnknownHandler,
        Reason::FingerprintMismatch,
        Reason::CommandNotFound,
        Reason::CommandNotExecutable,
        Reason::BadRequest,
        Reason::InitLost,
        Reason::RecordInvalid,
        Reason::MountRedirected,
        Reason::EngineLost,
        Reason::OutputsLost,
        Reason::NotEnforced,
    ];
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the attempt's main process ended, as seen by whoever waited for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Exit {
    /// Nobody saw it end (it never started, or the record was lost).
    #[default]
    Unknown,
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal.
    Signal(i32),
}

/// What the sandbox reported when it could not start the handler or command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchFailure {
    /// The handler is not in the set.
    UnknownHandler,
    /// The handler set is not the expected one.
    FingerprintMismatch,
    /// The command does not exist.
    NotFound,
    /// The command cannot be executed.
    NotExecutable,
    /// The handler runner could not read its request.
    BadRequest,
    /// A mount destination is a symlink in the image (see [`Reason::MountRedirected`]).
    MountRedirected,
    /// What the policy requires was not applied (see [`Reason::NotEnforced`]).
    NotEnforced,
    /// Anything else.
    Other,
}

impl LaunchFailure {
    fn reason(self) -> Option<Reason> {
        match self {
            LaunchFailure::UnknownHandler => Some(Reason::UnknownHandler),
            LaunchFailure::FingerprintMismatch => Some(Reason::FingerprintMismatch),
            LaunchFailure::NotFound => Some(Reason::CommandNotFound),
            LaunchFailure::NotExecutable => Some(Reason::CommandNotExecutable),
            LaunchFailure::BadRequest => Some(Reason::BadRequest),
            LaunchFailure::MountRedirected => Some(Reason::MountRedirected),
            LaunchFailure::NotEnforced => Some(Reason::NotEnforced),
            LaunchFailure::Other => None,
        }
    }
}

/// Whether the attempt's record from inside the sandbox is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Record {
    /// A rung that needs none (in-process), or a verified one arrived.
    #[default]
    Present,
    /// None arrived.
    Missing,
    /// One arrived and was refused.
    Invalid,
}

/// The facts a rung gathered about an attempt; [`decide`] turns them into a status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// stevedore stopped the attempt because its deadline fired.
    pub deadline_fired: bool,
    /// stevedore stopped the attempt because it was cancelled.
    pub cancelled: bool,
    /// The sandbox reported that it could not start the handler or command.
    pub launch_failed: Option<LaunchFailure>,
    /// How many processes the kernel OOM-killed in the attempt (0 when none or unknown).
    pub oom_kills: u64,
    /// How the main process ended.
    pub exit: Exit,
    /// The handler returned an error with this text.
    pub handler_error: Option<String>,
    /// The attempt runs a handler, which must leave a result record.
    pub expects_result: bool,
    /// The handler's result record was found.
    pub has_result: bool,
    /// The handler panicked.
    pub panicked: bool,
    /// The attempt filled its disk allowance.
    pub disk_full: bool,
    /// The outputs exceeded the caps.
    pub output_limit: bool,
    /// The container was removed by someone else.
    pub removed_externally: bool,
    /// The engine went away while the attempt ran (asked only when the end is not the
    /// command's own exit code).
    pub engine_lost: bool,
    /// The sandbox's own record.
    pub record: Record,
    /// The record arrived, the outputs did not all: the init died while sending them.
    pub outputs_lost: bool,
    /// The init died while sending the outputs because the kernel OOM-killed it (or what the
    /// delivery needed), as a witness with the kernel's word says.
    pub delivery_oom: bool,
}

/// The status decided from the facts, with a reason when the status alone does not say why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The status.
    pub status: Status,
    /// Why, or `None`.
    pub reason: Option<Reason>,
}

fn verdict(status: Status, reason: Option<Reason>) -> Verdict {
    Verdict { status, reason }
}

/// Decides the status of an attempt from its facts (`docs/outcome.md`, "Which status"):
/// the first rule that applies wins. Every rung's judge calls this and only this.
pub fn decide(f: &Facts) -> Verdict {
    if f.deadline_fired {
        return verdict(Status::Timeout, Some(Reason::Deadline));
    }
    if f.cancelled {
        return verdict(Status::Killed, Some(Reason::Cancelled));
    }
    if let Some(l) = f.launch_failed {
        return verdict(Status::LaunchFailed, l.reason());
    }
    if f.removed_externally {
        return verdict(Status::Killed, Some(Reason::RemovedExternally));
    }
    if f.panicked {
        return verdict(Status::Killed, Some(Reason::Panicked));
    }
    // Outputs the kernel's OOM killer kept from arriving: whatever the command did, the
    // attempt's result is not all there, and a retry with more memory may deliver it.
    if f.outputs_lost && f.delivery_oom {
        return verdict(Status::OomKilled, Some(Reason::OutputsLost));
    }
    let succeeded = f.exit == Exit::Code(0)
        && f.record == Record::Present
        && f.handler_error.is_none()
        && (!f.expects_result || f.has_result);
    if !succeeded && f.oom_kills > 0 {
        return verdict(Status::OomKilled, Some(Reason::Oom));
    }
    // An exit code is the command's own answer, whatever the engine did afterwards; a signal
    // or a lost record is what an engine going away does to an attempt.
    if f.engine_lost && (f.record != Record::Present || !matches!(f.exit, Exit::Code(_)) || f.outputs_lost) {
        return verdict(Status::Killed, Some(Reason::EngineLost));
    }
    let lost = match f.record {
        Record::Present => None,
        Record::Missing => Some(Reason::InitLost),
        Record::Invalid => Some(Reason::RecordInvalid),
    };
    if let Some(lost) = lost {
        // Without the init's record, only what the host saw counts, and that is never ok.
        return match f.exit {
            Exit::Signal(_) => verdict(Status::Killed, Some(Reason::Signalled)),
            _ => verdict(Status::Killed, Some(lost)),
        };
    }
    let disk = f.disk_full.then_some(Reason::DiskLimit);
    let outputs = f.outputs_lost.then_some(Reason::OutputsLost).or(f.output_limit.then_some(Reason::OutputLimit));
    match f.exit {
        Exit::Signal(_) => return verdict(Status::Killed, disk.or(Some(Reason::Signalled))),
        Exit::Unknown => return verdict(Status::Killed, disk.or(Some(Reason::InitLost))),
        Exit::Code(c) if c != 0 => return verdict(Status::HandlerError, disk.or(outputs)),
        Exit::Code(_) => {}
    }
    if f.handler_error.is_some() {
        return verdict(Status::HandlerError, disk.or(outputs));
    }
    if f.expects_result && !f.has_result {
        return verdict(Status::Killed, Some(Reason::NoResultRecord));
    }
    // Never `ok` with outputs missing: what the command made did not all arrive.
    if f.outputs_lost {
        return verdict(Status::Killed, Some(Reason::OutputsLost));
    }
    // Success stays success: the reason says the outputs or the disk hit a limit.
    verdict(Status::Ok, disk.or(outputs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_gone_away_explains_a_signal_or_a_lost_record_never_an_exit_code() {
        let lost = |exit, record| Facts { engine_lost: true, exit, record, ..Facts::default() };
        let engine_lost = verdict(Status::Killed, Some(Reason::EngineLost));
        assert_eq!(decide(&lost(Exit::Signal(15), Record::Present)), engine_lost);
        assert_eq!(decide(&lost(Exit::Unknown, Record::Missing)), engine_lost);
        assert_eq!(decide(&lost(Exit::Signal(9), Record::Invalid)), engine_lost);
        assert_eq!(decide(&lost(Exit::Code(0), Record::Present)), verdict(Status::Ok, None));
        assert_eq!(decide(&lost(Exit::Code(3), Record::Present)), verdict(Status::HandlerError, None));
        // What stevedore did itself, and what the kernel counted, come first.
        let f = Facts { deadline_fired: true, ..lost(Exit::Signal(15), Record::Present) };
        assert_eq!(decide(&f), verdict(Status::Timeout, Some(Reason::Deadline)));
        let f = Facts { oom_kills: 1, ..lost(Exit::Signal(9), Record::Present) };
        assert_eq!(decide(&f), verdict(Status::OomKilled, Some(Reason::Oom)));
    }

    fn ok_facts() -> Facts {
        Facts { exit: Exit::Code(0), ..Facts::default() }
    }

    #[test]
    fn counts_against_retries_for_every_status() {
        assert!(!Status::Ok.counts_against_retries());
        assert!(!Status::LaunchFailed.counts_against_retries());
        for s in [Status::HandlerError, Status::Timeout, Status::OomKilled, Status::Killed] {
            assert!(s.counts_against_retries());
        }
    }

    #[test]
    fn words_serialise_exactly() {
        for (s, name) in [
            (Status::Ok, "ok"),
            (Status::HandlerError, "handler_error"),
            (Status::Timeout, "timeout"),
            (Status::OomKilled, "oom_killed"),
            (Status::Killed, "killed"),
            (Status::LaunchFailed, "launch_failed"),
        ] {
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{name}\""));
            assert_eq!(serde_json::from_str::<Status>(&format!("\"{name}\"")).unwrap(), s);
            assert_eq!(s.to_string(), name);
        }
        for r in Reason::ALL {
            assert_eq!(serde_json::to_string(r).unwrap(), format!("\"{}\"", r.as_str()));
        }
    }

    #[test]
    fn outputs_not_delivered_are_never_ok() {
        let lost = Facts { outputs_lost: true, ..ok_facts() };
        // The kernel's OOM killer took the delivery: an OOM, whatever the command did.
        let oom = verdict(Status::OomKilled, Some(Reason::OutputsLost));
        assert_eq!(decide(&Facts { delivery_oom: true, ..lost.clone() }), oom);
        assert_eq!(decide(&Facts { delivery_oom: true, oom_kills: 1, ..lost.clone() }), oom);
        assert_eq!(decide(&Facts { delivery_oom: true, exit: Exit::Code(3), ..lost.clone() }), oom);
        // Otherwise a success is not one, and a failure keeps its status.
        assert_eq!(decide(&lost), verdict(Status::Killed, Some(Reason::OutputsLost)));
        assert_eq!(decide(&Facts { oom_kills: 1, ..lost.clone() }), verdict(Status::Killed, Some(Reason::OutputsLost)));
        let failed = Facts { exit: Exit::Code(3), ..lost.clone() };
        assert_eq!(decide(&failed), verdict(Status::HandlerError, Some(Reason::OutputsLost)));
        // What stevedore did first still wins, and an engine gone away explains the loss.
        assert_eq!(decide(&Facts { deadline_fired: true, ..lost.clone() }).status, Status::Timeout);
        let gone = Facts { engine_lost: true, ..lost };
        assert_eq!(decide(&gone), verdict(Status::Killed, Some(Reason::EngineLost)));
        // A child OOM-killed in an attempt that delivered everything is still ok.
        assert_eq!(decide(&Facts { oom_kills: 1, ..ok_facts() }), verdict(Status::Ok, None));
    }

    #[test]
    fn deadline_wins_over_everything() {
        let f = Facts { deadline_fired: true, cancelled: true, oom_kills: 3, record: Record::Missing, ..ok_facts() };
        assert_eq!(decide(&f), verdict(Status::Timeout, Some(Reason::Deadline)));
    }

    #[test]
    fn cancellation_is_killed_cancelled() {
        let f = Facts { cancelled: true, exit: Exit::Signal(15), ..Facts::default() };
        assert_eq!(decide(&f), verdict(Status::Killed, Some(Reason::Cancelled)));
    }

    #[test]
    fn sandbox_launch_failure_keeps_its_kind() {
        for (l, r) in [
            (LaunchFailure::NotFound, Some(Reason::CommandNotFound)),
            (LaunchFailure::NotExecutable, Some(Reason::CommandNotExecutable)),
            (LaunchFailure::UnknownHandler, Some(Reason::UnknownHandler)),
            (LaunchFailure::FingerprintMismatch, Some(Reason::FingerprintMismatch)),
            (LaunchFailure::Other, None),
        ] {
            let f = Facts { launch_failed: Some(l), ..ok_facts() };
            assert_eq!(decide(&f), verdict(Status::LaunchFailed, r));
        }
    }

    #[test]
    fn failed_after_oom_kill_is_oom_killed_even_without_a_record() {
        let f = Facts { oom_kills: 1, exit: Exit::Code(1), ..Facts::default() };
        assert_eq!(decide(&f), verdict(Status::OomKilled, Some(Reason::Oom)));
        let f = Facts { oom_kills: 1, exit: Exit::Signal(9), record: Record::Missing, ..Facts::default() };
        assert_eq!(decide(&f).status, Status::OomKilled);
    }

    #[test]
    fn succeeded_despite_oom_kill_is_ok() {
        let f = Facts { oom_kills: 2, ..ok_facts() };
        assert_eq!(decide(&f), verdict(Status::Ok, None));
    }

    #[test]
    fn without_a_record_nothing_is_ok() {
        let f = Facts { record: Record::Missing, ..ok_facts() };
        assert_eq!(decide(&f), verdict(Status::Killed, Some(Reason::InitLost)));
        let f = Facts { record: Record::Invalid, ..ok_facts() };
        assert_eq!(decide(&f), verdict(Status::Killed, Some(Reason::RecordInvalid)));
        let f = Facts { record: Record::Invalid, exit: Exit::Signal(9), ..Facts::default() };
        assert_eq!(decide(&f), verdict(Status::Killed, Some(Reason::Signalled)));
    }

    #[test]
    fn signal_is_killed_and_137_by_itself_is_handler_error() {
        assert_eq!(
            decide(&Facts { exit: Exit::Signal(9), ..Facts::default() }),
            verdict(Status::Killed, Some(Reason::Signalled))
        );
        assert_eq!(decide(&Facts { exit: Exit::Code(137), ..Facts::default() }), verdict(Status::HandlerError, None));
    }

    #[test]
    fn handler_outcomes() {
        let f = Facts { handler_error: Some("boom".into()), expects_result: true, has_result: true, ..ok_facts() };
        assert_eq!(decide(&f).status, Status::HandlerError);
        let f = Facts { expects_result: true, has_result: false, ..ok_facts() };
        assert_eq!(decide(&f), verdict(Status::Killed, Some(Reason::NoResultRecord)));
        let f = Facts { panicked: true, ..Facts::default() };
        assert_eq!(decide(&f), verdict(Status::Killed, Some(Reason::Panicked)));
        let f = Facts { removed_externally: true, ..Facts::default() };
        assert_eq!(decide(&f), verdict(Status::Killed, Some(Reason::RemovedExternally)));
        assert_eq!(decide(&Facts::default()), verdict(Status::Killed, Some(Reason::InitLost)));
    }

    #[test]
    fn limits_keep_the_status_true() {
        assert_eq!(decide(&ok_facts()), verdict(Status::Ok, None));
        let f = Facts { disk_full: true, exit: Exit::Code(1), ..Facts::default() };
        assert_eq!(decide(&f), verdict(Status::HandlerError, Some(Reason::DiskLimit)));
        let f = Facts { disk_full: true, ..ok_facts() };
        assert_eq!(decide(&f), verdict(Status::Ok, Some(Reason::DiskLimit)));
        let f = Facts { output_limit: true, ..ok_facts() };
        assert_eq!(decide(&f), verdict(Status::Ok, Some(Reason::OutputLimit)));
        let f = Facts { output_limit: true, exit: Exit::Code(3), ..Facts::default() };
        assert_eq!(decide(&f), verdict(Status::HandlerError, Some(Reason::OutputLimit)));
    }
}
