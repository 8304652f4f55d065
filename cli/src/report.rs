//! What `stevedore run` tells people and shells: the exit status of an Outcome (the table in
//! `docs/outcome.md`) and the one line that says what happened.

use std::path::Path;
use std::time::Duration;
use stevedore::contract::{ActionTask, Outcome, Reason, Status};

/// Whether the attempt ran a plain command (its action says; an Outcome without one, when its
/// error is only the exit line a command leaves).
pub fn plain_command(o: &Outcome) -> bool {
    match o.evidence.action.as_ref().map(|a| &a.task) {
        Some(ActionTask::Command(_)) => true,
        Some(_) => false,
        None => {
            o.handler_error.is_empty()
                || o.exit_code.is_some_and(|c| o.handler_error == format!("exited with code {c}"))
        }
    }
}

/// The status in people's words: a plain command that exits non-zero "failed (exit N)" (the
/// Outcome keeps `handler_error`, the contract's word, which a handler's failure keeps here too).
pub fn status_word(o: &Outcome) -> String {
    match (o.status, o.exit_code) {
        (Status::HandlerError, Some(c)) if plain_command(o) => format!("failed (exit {c})"),
        (s, _) => s.to_string(),
    }
}

/// The exit status for an attempt that ran, as shells and CI expect.
pub fn exit_code(o: &Outcome) -> u8 {
    let byte = |n: i64| u8::try_from(n.clamp(0, 255)).unwrap_or(255);
    match o.status {
        Status::Ok => 0,
        Status::HandlerError => match o.exit_code {
            Some(c) if c != 0 => byte(i64::from(c) & 0xff).max(1),
            _ => 1,
        },
        Status::Timeout => 124,
        Status::OomKilled => 137,
        Status::LaunchFailed => match o.reason {
            Some(Reason::CommandNotFound) => 127,
            _ => 126,
        },
        Status::Killed => match (o.reason, o.signal) {
            (Some(Reason::Panicked), _) => 101,
            // The engine's doing, as docker's own failures are 125, whatever signal it sent.
            (Some(Reason::EngineLost), _) => 125,
            (
                Some(Reason::RemovedExternally | Reason::InitLost | Reason::RecordInvalid | Reason::NoResultRecord),
                None,
            ) => 125,
            (_, Some(s)) => byte(128 + i64::from(s)),
            _ => 101,
        },
        _ => 125,
    }
}

/// A duration for people: `?` when unknown, ms below a second, else seconds.
pub(crate) fn secs(ms: Option<u64>) -> String {
    match ms {
        None => "?".into(),
        Some(ms) if ms < 1000 => format!("{ms} ms"),
        Some(ms) => format!("{:.1} s", ms as f64 / 1000.0),
    }
}

/// Bytes in MiB, one decimal.
pub(crate) fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

fn signal_name(s: i32) -> String {
    match s {
        9 => "SIGKILL".into(),
        15 => "SIGTERM".into(),
        2 => "SIGINT".into(),
        6 => "SIGABRT".into(),
        11 => "SIGSEGV".into(),
        n => format!("signal {n}"),
    }
}

/// How a stop went: whether the command ended at SIGTERM or needed SIGKILL; the grace is
/// named when known (the run's, not the Outcome's).
fn stop_story(o: &Outcome, grace: Option<Duration>) -> String {
    let g = grace.map_or_else(|| "grace".to_owned(), |g| format!("{} s grace", g.as_secs_f64()));
    match (o.signal, o.exit_code) {
        (Some(9), _) => format!("SIGTERM, then SIGKILL after the {g}"),
        (Some(s), _) => format!("SIGTERM; it ended by {} within the {g}", signal_name(s)),
        (None, Some(c)) => format!("SIGTERM; it exited {c} within the {g}"),
        (None, None) => "SIGTERM".into(),
    }
}

/// One line for people: status, why, exit or signal, times, peak memory, outputs.
pub fn summary(o: &Outcome, grace: Duration, out_dir: &Path) -> String {
    line(o, Some(grace), Some(out_dir))
}

/// The same line from the Outcome alone (`stevedore report --html`): the grace and the output
/// dir were the run's and are not in the Outcome, so they go unnamed.
pub fn summary_of(o: &Outcome) -> String {
    line(o, None, None)
}

fn line(o: &Outcome, grace: Option<Duration>, out_dir: Option<&Path>) -> String {
    let wall = secs(o.usage.wall_time_ms);
    let head = match (o.status, o.reason) {
        (Status::Ok, None) => format!("ok in {wall}"),
        (Status::Ok, Some(r)) => format!("ok in {wall} ({r})"),
        (Status::HandlerError, _) => match o.exit_code {
            // The user's words, not the status's: a CI log reads "failed" (the Outcome keeps
            // `handler_error`).
            Some(c) if plain_command(o) => format!("failed (exit {c}) after {wall}"),
            _ => format!("handler_error after {wall}: {}", first_line(&o.handler_error)),
        },
        (Status::Timeout, _) => format!("timeout after {wall}: {}", stop_story(o, grace)),
        (Status::OomKilled, _) => {
            let n = o.evidence.oom_kills.unwrap_or(1);
            let what = if n == 1 { "a process".to_owned() } else { format!("{n} processes") };
            format!("oom_killed after {wall}: the kernel killed {what} of the attempt at its memory limit")
        }
        (Status::Killed, Some(Reason::Cancelled)) => {
            format!("killed after {wall}: cancelled, {}", stop_story(o, grace))
        }
        (Status::Killed, Some(Reason::EngineLost)) => {
            format!("killed after {wall} (engine_lost): {}", first_line(&o.handler_error))
        }
        (Status::Killed, Some(r)) if o.signal.is_some() => {
            format!("killed after {wall} by {} ({r})", signal_name(o.signal.unwrap_or(0)))
        }
        (Status::Killed, r) => {
            let why = if o.handler_error.is_empty() {
                r.map(|r| r.to_string()).unwrap_or_default()
            } else {
                first_line(&o.handler_error)
            };
            format!("killed after {wall}: {why}")
        }
        (Status::LaunchFailed, r) => {
            format!(
                "launch_failed ({}): {}",
                r.map(|r| r.to_string()).unwrap_or_default(),
                first_line(&o.handler_error)
            )
        }
        (s, _) => format!("{s} after {wall}"),
    };
    let mut facts = Vec::new();
    if let Some(cpu) = o.usage.cpu_time_ms {
        facts.push(format!("cpu {}", secs(Some(cpu))));
    }
    if let Some(p) = o.usage.peak_memory_bytes {
        facts.push(format!("peak {}", mib(p)));
    }
    let n = o.outputs.len();
    let outputs = format!("{n} output{}", if n == 1 { "" } else { "s" });
    facts.push(match out_dir {
        Some(dir) => format!("{outputs} in {}", dir.display()),
        None => outputs,
    });
    let mut line = format!("{head} ({})", facts.join(", "));
    if let Some(skipped) = o.evidence.inputs.as_ref().map(|i| &i.skipped).filter(|s| !s.is_empty()) {
        line.push_str(&not_staged(skipped));
    }
    line
}

/// What of the input dir is not in `/in`: the entries no tar can carry (FIFOs, sockets,
/// devices), the first few named (the Outcome names up to 1000).
fn not_staged(skipped: &[String]) -> String {
    const NAMED: usize = 3;
    let n = skipped.len();
    let mut names: Vec<String> = skipped.iter().take(NAMED).map(|p| format!("{p:?}")).collect();
    if n > NAMED {
        names.push(format!("{} more", n - NAMED));
    }
    let what = if n == 1 { "input is" } else { "inputs are" };
    format!("; {n} {what} not in /in (a FIFO, socket or device: {})", names.join(", "))
}

fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    stevedore_init::wire::cap_text(line, 200)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(status: Status, reason: Option<Reason>, exit: Option<i32>, signal: Option<i32>) -> Outcome {
        let mut o = Outcome::new(status);
        o.reason = reason;
        o.exit_code = exit;
        o.signal = signal;
        o
    }

    /// One row of the table in docs/outcome.md each.
    #[test]
    fn the_exit_table() {
        assert_eq!(exit_code(&o(Status::Ok, None, Some(0), None)), 0);
        assert_eq!(exit_code(&o(Status::Ok, Some(Reason::DiskLimit), Some(0), None)), 0, "ok, any reason");
        assert_eq!(exit_code(&o(Status::HandlerError, None, Some(3), None)), 3);
        assert_eq!(exit_code(&o(Status::HandlerError, None, None, None)), 1, "a handler's error without a code");
        assert_eq!(
            exit_code(&o(Status::HandlerError, None, Some(256), None)),
            1,
            "a code that is 0 mod 256 is still a failure"
        );
        assert_eq!(exit_code(&o(Status::Killed, Some(Reason::Signalled), None, Some(9))), 137);
        assert_eq!(exit_code(&o(Status::Killed, Some(Reason::Signalled), None, Some(15))), 143);
        assert_eq!(exit_code(&o(Status::Killed, Some(Reason::Panicked), None, None)), 101);
        assert_eq!(exit_code(&o(Status::Killed, Some(Reason::Cancelled), None, Some(15))), 143);
        for r in [Reason::RemovedExternally, Reason::InitLost, Reason::RecordInvalid, Reason::NoResultRecord] {
            assert_eq!(exit_code(&o(Status::Killed, Some(r), None, None)), 125, "{r}");
        }
        assert_eq!(exit_code(&o(Status::Killed, Some(Reason::EngineLost), None, Some(15))), 125);
        assert_eq!(exit_code(&o(Status::OomKilled, Some(Reason::Oom), None, Some(9))), 137);
        assert_eq!(exit_code(&o(Status::Timeout, Some(Reason::Deadline), None, Some(9))), 124);
        assert_eq!(exit_code(&o(Status::LaunchFailed, Some(Reason::CommandNotFound), None, None)), 127);
        assert_eq!(exit_code(&o(Status::LaunchFailed, Some(Reason::CommandNotExecutable), None, None)), 126);
        assert_eq!(exit_code(&o(Status::LaunchFailed, Some(Reason::FingerprintMismatch), None, None)), 126);
        assert_eq!(exit_code(&o(Status::LaunchFailed, Some(Reason::UnknownHandler), None, None)), 126);
    }

    #[test]
    fn the_line_says_what_happened() {
        let mut t = o(Status::Timeout, Some(Reason::Deadline), None, Some(9));
        t.usage.wall_time_ms = Some(2040);
        t.usage.cpu_time_ms = Some(10);
        let line = summary(&t, Duration::from_secs(1), Path::new("out"));
        assert_eq!(
            line,
            "timeout after 2.0 s: SIGTERM, then SIGKILL after the 1 s grace (cpu 10 ms, 0 outputs in out)"
        );
        let mut h = o(Status::HandlerError, None, Some(3), None);
        h.handler_error = "exited with code 3".into();
        h.usage.wall_time_ms = Some(500);
        h.usage.peak_memory_bytes = Some(3 << 20);
        assert_eq!(
            summary(&h, Duration::from_secs(30), Path::new("o")),
            "failed (exit 3) after 500 ms (peak 3.0 MiB, 0 outputs in o)"
        );
        assert_eq!(status_word(&h), "failed (exit 3)");
        // A handler's failure keeps the contract's word.
        h.handler_error = "no such file: input.csv".into();
        let mut action = stevedore::contract::Action::default();
        action.task = ActionTask::Handler("convert".into());
        h.evidence.action = Some(action);
        assert_eq!(status_word(&h), "handler_error");
        assert!(
            summary(&h, Duration::from_secs(30), Path::new("o"))
                .starts_with("handler_error after 500 ms: no such file"),
            "{}",
            summary(&h, Duration::from_secs(30), Path::new("o"))
        );
        let mut f = o(Status::Ok, None, Some(0), None);
        f.usage.wall_time_ms = Some(20);
        f.evidence.inputs = Some(stevedore::contract::InputsStaged {
            skipped: ["fifo", "a/sock", "c", "d"].map(String::from).to_vec(),
            ..Default::default()
        });
        assert_eq!(
            summary(&f, Duration::from_secs(1), Path::new("o")),
            "ok in 20 ms (0 outputs in o); 4 inputs are not in /in (a FIFO, socket or device: \"fifo\", \"a/sock\", \"c\", 1 more)"
        );
        let mut m = o(Status::OomKilled, Some(Reason::Oom), None, Some(9));
        m.evidence.oom_kills = Some(1);
        assert!(summary(&m, Duration::from_secs(1), Path::new("o")).contains("the kernel killed a process"));
        assert_eq!(
            summary_of(&t),
            "timeout after 2.0 s: SIGTERM, then SIGKILL after the grace (cpu 10 ms, 0 outputs)",
            "from the Outcome alone: no grace, no output dir"
        );
    }
}
