//! The status of an attempt and the one function that decides it.

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
    /// It was stopped: by a signal, by cancellation, or without a result record.
    Killed,
    /// The sandbox could not start the handler.
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

/// Stable machine-readable words for `Outcome::reason`.
pub mod reason {
    /// The deadline fired.
    pub const DEADLINE: &str = "deadline";
    /// The caller cancelled the attempt.
    pub const CANCELLED: &str = "cancelled";
    /// A handler exited 0 without writing its result record.
    pub const NO_RESULT_RECORD: &str = "no_result_record";
    /// The attempt filled its disk allowance.
    pub const DISK_LIMIT: &str = "disk_limit";
    /// The outputs exceeded the caps on file count or total size.
    pub const OUTPUT_LIMIT: &str = "output_limit";
    /// The in-process handler panicked.
    pub const PANICKED: &str = "panicked";
    /// The container was removed by someone else mid-attempt.
    pub const REMOVED_EXTERNALLY: &str = "removed_externally";
    /// The kernel OOM-killed a process.
    pub const OOM: &str = "oom";
    /// The main process died of a signal it was not sent by stevedore.
    pub const SIGNALLED: &str = "signalled";
    /// The handler is not in the image's handler set.
    pub const UNKNOWN_HANDLER: &str = "unknown_handler";
    /// The image's handler set differs from the one the caller expects.
    pub const FINGERPRINT_MISMATCH: &str = "fingerprint_mismatch";
    /// The sandbox's own init died, so the attempt has no record from inside.
    pub const INIT_LOST: &str = "init_lost";
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

/// The facts a rung gathered about an attempt; [`decide`] turns them into a status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// stevedore stopped the attempt because its deadline fired.
    pub deadline_fired: bool,
    /// stevedore stopped the attempt because it was cancelled.
    pub cancelled: bool,
    /// The sandbox reported that it could not start the handler (with why).
    pub launch_failed: Option<String>,
    /// How many processes the kernel OOM-killed in the attempt (0 when none or unknown).
    pub oom_kills: u64,
    /// How the main process ended.
    pub exit: Exit,
    /// The handler returned an error with this text.
    pub handler_error: Option<String>,
    /// The attempt runs a handler, which must leave a result record.
    pub expects_record: bool,
    /// A result record was found.
    pub has_record: bool,
    /// The handler panicked (in-process rung).
    pub panicked: bool,
    /// The attempt filled its disk allowance.
    pub disk_full: bool,
    /// The outputs exceeded the caps.
    pub output_limit: bool,
    /// The container was removed by someone else.
    pub removed_externally: bool,
}

/// The status decided from the facts, with a reason when the status alone does not say why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The status.
    pub status: Status,
    /// A stable word from [`reason`], or `None`.
    pub reason: Option<&'static str>,
}

fn verdict(status: Status, reason: Option<&'static str>) -> Verdict {
    Verdict { status, reason }
}

/// Decides the status of an attempt from its facts (CONTRACT §3 "Which status"): the
/// first rule that applies wins. Every rung calls this and only this.
pub fn decide(f: &Facts) -> Verdict {
    if f.deadline_fired {
        return verdict(Status::Timeout, Some(reason::DEADLINE));
    }
    if f.cancelled {
        return verdict(Status::Killed, Some(reason::CANCELLED));
    }
    if f.launch_failed.is_some() {
        return verdict(Status::LaunchFailed, None);
    }
    if f.removed_externally {
        return verdict(Status::Killed, Some(reason::REMOVED_EXTERNALLY));
    }
    if f.panicked {
        return verdict(Status::Killed, Some(reason::PANICKED));
    }
    let succeeded = f.exit == Exit::Code(0) && f.handler_error.is_none() && (!f.expects_record || f.has_record);
    if !succeeded && f.oom_kills > 0 {
        return verdict(Status::OomKilled, Some(reason::OOM));
    }
    let disk = f.disk_full.then_some(reason::DISK_LIMIT);
    match f.exit {
        Exit::Signal(_) => return verdict(Status::Killed, disk.or(Some(reason::SIGNALLED))),
        Exit::Unknown => return verdict(Status::Killed, disk.or(Some(reason::INIT_LOST))),
        Exit::Code(c) if c != 0 => return verdict(Status::HandlerError, disk),
        Exit::Code(_) => {}
    }
    if f.handler_error.is_some() {
        return verdict(Status::HandlerError, disk);
    }
    if f.expects_record && !f.has_record {
        return verdict(Status::Killed, Some(reason::NO_RESULT_RECORD));
    }
    if f.output_limit {
        return verdict(Status::HandlerError, Some(reason::OUTPUT_LIMIT));
    }
    // A handler that hit ENOSPC and still exited 0 succeeded, but the caller should know
    // its outputs were cut at the limit.
    verdict(Status::Ok, disk)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok_facts() -> Facts {
        Facts { exit: Exit::Code(0), ..Facts::default() }
    }

    #[test]
    fn counts_against_retries_for_every_status() {
        assert!(!Status::Ok.counts_against_retries());
        assert!(!Status::LaunchFailed.counts_against_retries());
        assert!(Status::HandlerError.counts_against_retries());
        assert!(Status::Timeout.counts_against_retries());
        assert!(Status::OomKilled.counts_against_retries());
        assert!(Status::Killed.counts_against_retries());
    }

    #[test]
    fn serialises_exactly() {
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
    }

    #[test]
    fn deadline_wins_over_everything() {
        let f = Facts { deadline_fired: true, cancelled: true, oom_kills: 3, ..ok_facts() };
        assert_eq!(decide(&f), verdict(Status::Timeout, Some("deadline")));
    }

    #[test]
    fn cancellation_is_killed_cancelled() {
        let f = Facts { cancelled: true, exit: Exit::Signal(15), ..Facts::default() };
        assert_eq!(decide(&f), verdict(Status::Killed, Some("cancelled")));
    }

    #[test]
    fn sandbox_launch_failure() {
        let f = Facts { launch_failed: Some("unknown handler".into()), exit: Exit::Code(0), ..Facts::default() };
        assert_eq!(decide(&f).status, Status::LaunchFailed);
    }

    #[test]
    fn failed_after_oom_kill_is_oom_killed() {
        let f = Facts { oom_kills: 1, exit: Exit::Code(1), ..Facts::default() };
        assert_eq!(decide(&f), verdict(Status::OomKilled, Some("oom")));
        let f = Facts { oom_kills: 1, exit: Exit::Signal(9), ..Facts::default() };
        assert_eq!(decide(&f).status, Status::OomKilled);
    }

    #[test]
    fn succeeded_despite_oom_kill_is_ok() {
        let f = Facts { oom_kills: 2, ..ok_facts() };
        assert_eq!(decide(&f), verdict(Status::Ok, None));
    }

    #[test]
    fn signal_is_killed() {
        let f = Facts { exit: Exit::Signal(9), ..Facts::default() };
        assert_eq!(decide(&f), verdict(Status::Killed, Some("signalled")));
    }

    #[test]
    fn exit_137_by_itself_is_handler_error() {
        let f = Facts { exit: Exit::Code(137), ..Facts::default() };
        assert_eq!(decide(&f), verdict(Status::HandlerError, None));
    }

    #[test]
    fn handler_error_with_exit_zero() {
        let f = Facts { handler_error: Some("boom".into()), expects_record: true, has_record: true, ..ok_facts() };
        assert_eq!(decide(&f).status, Status::HandlerError);
    }

    #[test]
    fn exit_zero_without_record_is_killed() {
        let f = Facts { expects_record: true, has_record: false, ..ok_facts() };
        assert_eq!(decide(&f), verdict(Status::Killed, Some("no_result_record")));
    }

    #[test]
    fn plain_success_is_ok() {
        assert_eq!(decide(&ok_facts()), verdict(Status::Ok, None));
    }

    #[test]
    fn disk_full_failure_says_disk_limit() {
        let f = Facts { disk_full: true, exit: Exit::Code(1), ..Facts::default() };
        assert_eq!(decide(&f), verdict(Status::HandlerError, Some("disk_limit")));
    }

    #[test]
    fn disk_full_success_is_ok_and_says_disk_limit() {
        let f = Facts { disk_full: true, ..ok_facts() };
        assert_eq!(decide(&f), verdict(Status::Ok, Some("disk_limit")));
    }

    #[test]
    fn output_cap_turns_success_into_handler_error() {
        let f = Facts { output_limit: true, ..ok_facts() };
        assert_eq!(decide(&f), verdict(Status::HandlerError, Some("output_limit")));
    }

    #[test]
    fn panic_and_external_removal_are_killed() {
        let f = Facts { panicked: true, ..Facts::default() };
        assert_eq!(decide(&f), verdict(Status::Killed, Some("panicked")));
        let f = Facts { removed_externally: true, ..Facts::default() };
        assert_eq!(decide(&f), verdict(Status::Killed, Some("removed_externally")));
    }

    #[test]
    fn lost_exit_is_killed_init_lost() {
        assert_eq!(decide(&Facts::default()), verdict(Status::Killed, Some("init_lost")));
    }
}
