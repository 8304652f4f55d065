//! Reports from the sandbox: progress, heartbeats and small structured notes a command (or
//! handler) sends while it runs, over the report socket its init gave it ([`REPORT_FD`]).
//!
//! A report is a claim: it never changes the status or the usage. The socket belongs to
//! one attempt, so a report can name nothing else; one that names another job or attempt
//! is refused. The init admits a burst of [`BURST`] and then [`PER_SECOND`] a second, at
//! most [`MAX_REPORTS`] in all, each at most [`MAX_REPORT_BYTES`]; the rest is dropped and
//! counted, so a flood can neither fill the link nor delay the record.
//!
//! The client half ([`send`]) is what `stevedore-init report ...` and the handler context
//! use; it writes one frame and returns.

use crate::wire::{self, Kind, MAX_REPORT_BYTES, REPORT_FD, ReportCounts, Scope};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Instant;

/// Reports admitted at once before the rate applies.
pub const BURST: u32 = 50;
/// Reports admitted per second after the burst.
pub const PER_SECOND: u32 = 20;
/// Reports forwarded per attempt in all.
pub const MAX_REPORTS: u64 = 1000;
/// Bytes the init reads from the report socket in all before it closes it.
pub const MAX_SOCKET_BYTES: usize = 8 << 20;
/// Refusal reasons kept in the record.
const MAX_REFUSALS_KEPT: usize = 8;

/// What a report says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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

/// A report as the command sends it (and, without the scope fields, as the host gets it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// What it is.
    pub kind: ReportKind,
    /// For `progress`: 0 to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
    /// For `progress` (optional) and `note`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// For `data`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
    /// May be given; must then be this attempt's job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// May be given; must then be this attempt's number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

impl Report {
    /// A progress report.
    pub fn progress(percent: f64, text: Option<String>) -> Self {
        Self { kind: ReportKind::Progress, percent: Some(percent), text, value: None, job_id: None, attempt: None }
    }

    /// A heartbeat.
    pub fn heartbeat() -> Self {
        Self { kind: ReportKind::Heartbeat, percent: None, text: None, value: None, job_id: None, attempt: None }
    }

    /// A note.
    pub fn note(text: impl Into<String>) -> Self {
        Self { kind: ReportKind::Note, text: Some(text.into()), ..Self::heartbeat() }
    }

    /// A structured value.
    pub fn data(value: serde_json::Value) -> Self {
        Self { kind: ReportKind::Data, value: Some(value), ..Self::heartbeat() }
    }

    /// Checks the fields each kind needs and has, the scope, and the size as forwarded
    /// (at most [`MAX_REPORT_BYTES`]). The scope fields are removed: the link already says
    /// which attempt a report belongs to.
    pub fn check(mut self, scope: &Scope) -> Result<Self, String> {
        if let Some(j) = &self.job_id
            && *j != scope.job_id
        {
            return Err(format!("names job {j:?}, not this attempt's"));
        }
        if let Some(a) = self.attempt
            && a != scope.attempt
        {
            return Err(format!("names attempt {a}, not this one"));
        }
        self.job_id = None;
        self.attempt = None;
        let (percent, text, value) = (self.percent.is_some(), self.text.is_some(), self.value.is_some());
        let ok = match self.kind {
            ReportKind::Progress => percent && !value && self.percent.is_some_and(|p| (0.0..=100.0).contains(&p)),
            ReportKind::Heartbeat => !percent && !text && !value,
            ReportKind::Note => text && !percent && !value,
            ReportKind::Data => value && !percent && !text,
        };
        if !ok {
            return Err(format!("fields do not fit a {:?} report (progress: percent 0-100)", self.kind));
        }
        if self.text.as_ref().is_some_and(|t| t.chars().any(|c| c.is_control() && c != '\t')) {
            return Err("text with control characters".into());
        }
        // The cap holds for the report as the init forwards it, not only as it was sent: a
        // number's shortest spelling can be longer than the sender's (`9E15` is
        // `9000000000000000.0`), and a Report frame over its cap cannot be sent at all.
        let len = serde_json::to_vec(&self).expect("a report always serialises").len();
        if len > MAX_REPORT_BYTES {
            return Err(format!("{len} bytes as forwarded, over the {MAX_REPORT_BYTES}-byte limit"));
        }
        Ok(self)
    }
}

/// A report as the init forwards it to the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Forwarded {
    /// 1, 2, 3, ... in the order the init admitted them.
    pub seq: u64,
    /// Milliseconds since the command started, by the init's clock.
    pub at_ms: u64,
    /// The report, checked.
    pub report: Report,
}

/// The token bucket and the totals.
#[derive(Debug)]
pub struct Limiter {
    tokens: f64,
    last: Instant,
    /// The counts so far.
    pub counts: ReportCounts,
}

impl Limiter {
    /// A full bucket at `now`.
    pub fn new(now: Instant) -> Self {
        Self { tokens: f64::from(BURST), last: now, counts: ReportCounts::default() }
    }

    /// Whether a report arriving at `now` may be forwarded; counts it either way.
    pub fn admit(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last);
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed.as_secs_f64() * f64::from(PER_SECOND)).min(f64::from(BURST));
        if self.counts.forwarded >= MAX_REPORTS {
            self.counts.dropped_total += 1;
            return false;
        }
        if self.tokens < 1.0 {
            self.counts.dropped_rate += 1;
            return false;
        }
        self.tokens -= 1.0;
        self.counts.forwarded += 1;
        true
    }

    /// Counts a refused report.
    pub fn refuse(&mut self, why: String) {
        self.counts.refused += 1;
        if self.counts.refusals.len() < MAX_REFUSALS_KEPT {
            self.counts.refusals.push(wire::cap_text(&why, 200));
        }
    }
}

/// Why a report could not be sent.
#[derive(Debug)]
#[non_exhaustive]
pub enum SendError {
    /// there is no report socket here
    NoSocket(String),
    /// the report is too large
    TooLarge(usize),
    /// writing to the socket failed
    Write(std::io::Error),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::NoSocket(why) => write!(f, "no report socket: {why}"),
            SendError::TooLarge(n) => write!(f, "report of {n} bytes is over the {MAX_REPORT_BYTES}-byte limit"),
            SendError::Write(e) => write!(f, "sending the report failed: {e}"),
        }
    }
}

impl std::error::Error for SendError {}

/// The report socket this process inherited, if it did: the fd named by
/// `$STEVEDORE_REPORT_FD` (which must be [`REPORT_FD`]), checked to be a socket.
pub fn socket_from_env() -> Result<BorrowedFd<'static>, SendError> {
    match std::env::var(wire::env::REPORT_FD) {
        Ok(v) if v == REPORT_FD.to_string() => {}
        Ok(v) => return Err(SendError::NoSocket(format!("{} is {v:?}", wire::env::REPORT_FD))),
        Err(_) => return Err(SendError::NoSocket(format!("{} is not set", wire::env::REPORT_FD))),
    }
    let fd = crate::child::raw::inherited_fd(REPORT_FD)
        .ok_or_else(|| SendError::NoSocket(format!("fd {REPORT_FD} is not open")))?;
    let st = nix::sys::stat::fstat(fd).map_err(|e| SendError::NoSocket(format!("fd {REPORT_FD}: {e}")))?;
    if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFSOCK {
        return Err(SendError::NoSocket(format!("fd {REPORT_FD} is not a socket")));
    }
    Ok(fd)
}

/// Sends one report on `socket`.
pub fn send_on(socket: BorrowedFd<'_>, report: &Report) -> Result<(), SendError> {
    let json = serde_json::to_vec(report).map_err(|e| SendError::Write(e.into()))?;
    if json.len() > MAX_REPORT_BYTES {
        return Err(SendError::TooLarge(json.len()));
    }
    let frame = wire::encode(Kind::Report, &json);
    let mut f = std::fs::File::from(socket.try_clone_to_owned().map_err(SendError::Write)?);
    f.write_all(&frame).map_err(SendError::Write)
}

/// Sends one report on the inherited report socket.
pub fn send(report: &Report) -> Result<(), SendError> {
    send_on(socket_from_env()?, report)
}

/// How the report client is used.
pub const USAGE: &str =
    "usage: report [--job ID] [--attempt N] progress PERCENT [TEXT...] | heartbeat | note TEXT... | data JSON";

/// Parses the report client's arguments (after `report`).
pub fn parse_args(args: &[String]) -> Result<Report, String> {
    let mut job_id = None;
    let mut attempt = None;
    let mut rest = args;
    loop {
        match rest {
            [flag, value, tail @ ..] if flag == "--job" => {
                job_id = Some(value.clone());
                rest = tail;
            }
            [flag, value, tail @ ..] if flag == "--attempt" => {
                attempt = Some(value.parse::<u32>().map_err(|_| format!("--attempt {value:?} is not a number"))?);
                rest = tail;
            }
            _ => break,
        }
    }
    let text = |words: &[String]| (!words.is_empty()).then(|| words.join(" "));
    let mut report = match rest {
        [kind, percent, words @ ..] if kind == "progress" => {
            let p =
                percent.trim_end_matches('%').parse::<f64>().map_err(|_| format!("{percent:?} is not a percentage"))?;
            Report::progress(p, text(words))
        }
        [kind] if kind == "heartbeat" => Report::heartbeat(),
        [kind, words @ ..] if kind == "note" && !words.is_empty() => Report::note(words.join(" ")),
        [kind, json] if kind == "data" => {
            Report::data(serde_json::from_str(json).map_err(|e| format!("data is not JSON: {e}"))?)
        }
        _ => return Err(USAGE.to_owned()),
    };
    report.job_id = job_id;
    report.attempt = attempt;
    Ok(report)
}

/// `report ...`: sends one report on the inherited socket; returns the exit code (0 sent,
/// 1 not sent, 2 bad arguments).
pub fn cli_main(args: &[String]) -> i32 {
    let report = match parse_args(args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    match send(&report) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("report: {e}");
            1
        }
    }
}

/// The init's end of the report socket: reads, checks, limits and forwards.
#[derive(Debug)]
pub(crate) struct Inbox {
    fd: Option<std::os::fd::OwnedFd>,
    decoder: wire::Decoder,
    received: usize,
    limiter: Limiter,
    scope: Scope,
    started: Instant,
}

impl Inbox {
    pub fn new(fd: std::os::fd::OwnedFd, scope: Scope, started: Instant) -> Self {
        crate::link::set_nonblocking(fd.as_fd(), true);
        Self {
            fd: Some(fd),
            decoder: wire::Decoder::new(|k| k == Kind::Report),
            received: 0,
            limiter: Limiter::new(started),
            scope,
            started,
        }
    }

    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(AsFd::as_fd)
    }

    /// Reads what is there now and hands each admitted report's frame body to `forward`.
    pub fn read(&mut self, forward: &mut dyn FnMut(&[u8])) {
        let Some(fd) = self.fd.take() else { return };
        let mut buf = [0u8; 16 << 10];
        loop {
            match nix::unistd::read(&fd, &mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    self.received += n;
                    if self.received > MAX_SOCKET_BYTES {
                        self.limiter.counts.dropped_total += 1;
                        self.limiter
                            .refuse(format!("more than {MAX_SOCKET_BYTES} bytes: the report socket was closed"));
                        return;
                    }
                    self.decoder.feed(&buf[..n]);
                    if !self.take_frames(forward) {
                        return;
                    }
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(_) => return,
            }
        }
        self.fd = Some(fd);
    }

    /// `false` when the stream broke (the socket is then closed).
    fn take_frames(&mut self, forward: &mut dyn FnMut(&[u8])) -> bool {
        loop {
            let frame = match self.decoder.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => return true,
                Err(e) => {
                    self.limiter.refuse(format!("{e}: the report socket was closed"));
                    return false;
                }
            };
            let checked = wire::parse_claim::<Report>(&frame.body, MAX_REPORT_BYTES)
                .map_err(|e| e.to_string())
                .and_then(|r| r.check(&self.scope));
            let report = match checked {
                Ok(r) => r,
                Err(why) => {
                    self.limiter.refuse(why);
                    continue;
                }
            };
            let now = Instant::now();
            if !self.limiter.admit(now) {
                continue;
            }
            let fwd = Forwarded {
                seq: self.limiter.counts.forwarded,
                at_ms: u64::try_from(now.saturating_duration_since(self.started).as_millis()).unwrap_or(u64::MAX),
                report,
            };
            forward(&serde_json::to_vec(&fwd).expect("a report always serialises"));
        }
    }

    pub fn counts(&self) -> ReportCounts {
        self.limiter.counts.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn scope() -> Scope {
        Scope { job_id: "job".into(), attempt: 2 }
    }

    #[test]
    fn a_data_report_keeps_its_numbers_through_the_init() {
        // Found by the `report` fuzz target: without serde_json's float_roundtrip a number
        // past u64 came back one ulp off after the init re-serialised the report.
        let sent = br#"{"kind":"data","value":[9999999999000000000000004089650035136921600,0.1,1e-300]}"#;
        let first: Report = serde_json::from_slice(sent).unwrap();
        let again: Report = serde_json::from_slice(&serde_json::to_vec(&first).unwrap()).unwrap();
        assert_eq!(again, first);
    }

    #[test]
    fn a_report_that_grows_when_the_init_rewrites_it_is_refused_not_forwarded() {
        // Found by the `report` fuzz target: `9E15` is 4 bytes as sent and 18
        // (`9000000000000000.0`) as the init re-serialises it, so a report under the cap
        // became a Report frame over its cap, and the init (PID 1) panicked encoding it.
        let mut sent = br#"{"kind":"data","value":["#.to_vec();
        while sent.len() < MAX_REPORT_BYTES - 10 {
            sent.extend_from_slice(b"9E15,");
        }
        sent.extend_from_slice(b"1]}");
        assert!(sent.len() <= MAX_REPORT_BYTES);
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        (&theirs).write_all(&wire::encode(Kind::Report, &sent)).unwrap();
        (&theirs).write_all(&wire::encode(Kind::Report, br#"{"kind":"heartbeat"}"#)).unwrap();
        drop(theirs);
        let mut inbox = Inbox::new(ours.into(), scope(), Instant::now());
        let mut frames = Vec::new();
        // What the init's link does with each forwarded body.
        inbox.read(&mut |body| frames.push(wire::encode(Kind::Report, body)));
        assert_eq!(frames.len(), 1, "only the heartbeat is forwarded");
        let counts = inbox.counts();
        assert_eq!((counts.forwarded, counts.refused), (1, 1));
        assert!(counts.refusals[0].contains("bytes"), "{:?}", counts.refusals);
        let grown: Report = serde_json::from_slice(&sent).unwrap();
        assert!(grown.check(&scope()).unwrap_err().contains(&MAX_REPORT_BYTES.to_string()));
    }

    #[test]
    fn kinds_need_their_fields() {
        assert!(Report::progress(40.0, None).check(&scope()).is_ok());
        assert!(Report::progress(100.5, None).check(&scope()).is_err());
        assert!(Report::progress(f64::NAN, None).check(&scope()).is_err());
        assert!(Report::heartbeat().check(&scope()).is_ok());
        assert!(Report::note("hi").check(&scope()).is_ok());
        assert!(Report::note("a\u{1b}[2J").check(&scope()).is_err());
        assert!(Report::data(serde_json::json!({"a": 1})).check(&scope()).is_ok());
        let mut r = Report::heartbeat();
        r.text = Some("x".into());
        assert!(r.check(&scope()).is_err());
        let strict = serde_json::from_str::<Report>(r#"{"kind":"heartbeat","evil":1}"#);
        assert!(strict.is_err(), "unknown fields are refused");
    }

    #[test]
    fn scope_is_this_attempt_only() {
        let mut r = Report::note("x");
        r.job_id = Some("job".into());
        r.attempt = Some(2);
        let checked = r.clone().check(&scope()).unwrap();
        assert_eq!((checked.job_id, checked.attempt), (None, None), "the scope fields are dropped");
        r.attempt = Some(1);
        assert!(r.clone().check(&scope()).unwrap_err().contains("attempt 1"));
        r.attempt = None;
        r.job_id = Some("other".into());
        assert!(r.check(&scope()).unwrap_err().contains("other"));
    }

    #[test]
    fn the_client_parses_its_arguments() {
        let args = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            parse_args(&args("progress 40% half way")).unwrap(),
            Report::progress(40.0, Some("half way".into()))
        );
        assert_eq!(parse_args(&args("heartbeat")).unwrap(), Report::heartbeat());
        let r = parse_args(&args("--job j --attempt 3 note hello")).unwrap();
        assert_eq!((r.job_id.as_deref(), r.attempt, r.text.as_deref()), (Some("j"), Some(3), Some("hello")));
        assert!(parse_args(&args("data {\"a\":1}")).is_ok());
        for bad in ["", "progress", "progress x", "note", "data {", "--attempt x heartbeat", "shout"] {
            assert!(parse_args(&args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_limiter_takes_a_burst_then_a_rate_then_stops() {
        let t0 = Instant::now();
        let mut l = Limiter::new(t0);
        let burst = (0..100).filter(|_| l.admit(t0)).count();
        assert_eq!(burst, BURST as usize);
        assert_eq!(l.counts.dropped_rate, 100 - u64::from(BURST));
        let later = t0 + Duration::from_secs(1);
        let refilled = (0..100).filter(|_| l.admit(later)).count();
        assert_eq!(refilled, PER_SECOND as usize);
        let mut t = later;
        while l.counts.forwarded < MAX_REPORTS {
            t += Duration::from_secs(10);
            l.admit(t);
        }
        assert!(!l.admit(t + Duration::from_secs(100)));
        assert_eq!(l.counts.dropped_total, 1);
    }
}
