//! Runs the real `stevedore __stevedore_init` outside a container (not PID 1, so it signals
//! the command's process group instead of the whole namespace).

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use stevedore::protocol::{
    HandlerRequest, INIT_MARKER, InitRecord, InitSpec, PAYLOAD_FILE, REQUEST_FILE, RESULT_FILE, StoppedBy, Trailer,
    WaitStatus, decode_trailer, done_sentinel, encode_stdin_frame,
};
use tempfile::TempDir;

const NONCE: &str = "0123abcd";

struct Init {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    stderr: ChildStderr,
    stderr_seen: Vec<u8>,
    control: TempDir,
}

fn spec(argv: &[&str]) -> InitSpec {
    InitSpec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: "/".into(),
        grace_ms: 200,
        handler_request: None,
        child_oom_score_adj: None,
    }
}

fn sh(script: &str) -> InitSpec {
    spec(&["/bin/sh", "-c", script])
}

fn start_raw(stdin_bytes: &[u8]) -> Init {
    start_in(tempfile::tempdir().unwrap(), stdin_bytes)
}

fn start_in(control: TempDir, stdin_bytes: &[u8]) -> Init {
    let mut child = Command::new(env!("CARGO_BIN_EXE_stevedore"))
        .arg(INIT_MARKER)
        .arg(control.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(stdin_bytes).unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let stderr = child.stderr.take().unwrap();
    Init { child, stdin: Some(stdin), stdout, stderr, stderr_seen: Vec::new(), control }
}

fn start(spec: &InitSpec, payload: &[u8]) -> Init {
    start_raw(&encode_stdin_frame(NONCE, spec, payload))
}

impl Init {
    /// Reads stderr until `needle` shows up; false at EOF.
    fn stderr_until(&mut self, needle: &[u8]) -> bool {
        let mut buf = [0u8; 4096];
        loop {
            if self.stderr_seen.windows(needle.len()).any(|w| w == needle) {
                return true;
            }
            match self.stderr.read(&mut buf).unwrap() {
                0 => return false,
                n => self.stderr_seen.extend_from_slice(&buf[..n]),
            }
        }
    }

    fn stdout_line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line
    }

    fn record(&self) -> InitRecord {
        let f = std::fs::File::open(self.control.path().join(RESULT_FILE)).unwrap();
        stevedore::protocol::parse_claim(f).unwrap()
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Waits for the sentinel (checking the record is already in place), then closes stdin
    /// and collects the exit status and the rest of the output.
    fn finish(mut self) -> Finished {
        let sentinel = done_sentinel(NONCE);
        assert!(self.stderr_until(sentinel.as_bytes()), "no sentinel: {}", String::from_utf8_lossy(&self.stderr_seen));
        assert!(self.control.path().join(RESULT_FILE).is_file(), "sentinel before the record");
        let record = self.record();
        // The init waits for the host to close stdin, and ignores SIGTERM meanwhile.
        assert!(self.child.try_wait().unwrap().is_none(), "init exited before stdin EOF");
        kill(self.pid(), Signal::SIGTERM).unwrap();
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        self.finish_output(record, status)
    }

    /// `stderr` is everything up to and including the sentinel; what follows it must be the
    /// records, the init's the same bytes as its result file.
    fn finish_output(mut self, record: InitRecord, status: ExitStatus) -> Finished {
        self.stderr.read_to_end(&mut self.stderr_seen).unwrap();
        let mut stdout = String::new();
        self.stdout.read_to_string(&mut stdout).unwrap();
        let sentinel = done_sentinel(NONCE);
        let seen = &self.stderr_seen;
        let end = seen.windows(sentinel.len()).position(|w| w == sentinel.as_bytes()).map(|p| p + sentinel.len());
        if let Some(end) = end {
            match decode_trailer(&seen[end..]) {
                Trailer::Complete { init, .. } => {
                    assert_eq!(init, std::fs::read(self.control.path().join(RESULT_FILE)).unwrap());
                }
                other => panic!("no records after the sentinel: {other:?}"),
            }
        }
        Finished {
            record,
            status,
            stdout,
            stderr: String::from_utf8_lossy(&seen[..end.unwrap_or(seen.len())]).into_owned(),
            control: self.control,
        }
    }
}

struct Finished {
    record: InitRecord,
    status: ExitStatus,
    stdout: String,
    stderr: String,
    control: TempDir,
}

fn run(spec: &InitSpec) -> Finished {
    start(spec, b"").finish()
}

#[test]
fn ok_run_stages_files_and_reports() {
    let control = tempfile::tempdir().unwrap();
    // The payload is in place before the command starts.
    let mut s = sh("echo out; echo err >&2; cat payload");
    s.cwd = control.path().to_str().unwrap().into();
    let req = HandlerRequest {
        handler: "echo".into(),
        fingerprint: None,
        job_id: "j1".into(),
        attempt: 1,
        inputs: Default::default(),
        prior_outputs: vec![],
        deadline_ms: Some(1000),
    };
    s.handler_request = Some(req.clone());
    let f = start_in(control, &encode_stdin_frame(NONCE, &s, b"the payload")).finish();
    assert!(f.status.success(), "{:?}", f.status);
    assert_eq!(f.record.wait, WaitStatus::Code(0));
    assert_eq!((f.record.stopped_by, f.record.stragglers_killed), (None, 0));
    assert_eq!(f.stdout, "out\nthe payload");
    assert!(f.stderr.starts_with("err\n"), "{}", f.stderr);
    assert!(f.stderr.ends_with(&done_sentinel(NONCE)), "{}", f.stderr);
    let control = f.control.path();
    assert_eq!(std::fs::read(control.join(PAYLOAD_FILE)).unwrap(), b"the payload");
    let back: HandlerRequest = serde_json::from_slice(&std::fs::read(control.join(REQUEST_FILE)).unwrap()).unwrap();
    assert_eq!(back, req);
    assert_eq!(f.record.oom_guard, None);
}

#[test]
fn exit_codes_and_signals_are_told_apart() {
    assert_eq!(run(&sh("exit 3")).record.wait, WaitStatus::Code(3));
    assert_eq!(run(&sh("exit 137")).record.wait, WaitStatus::Code(137));
    assert_eq!(run(&sh("kill -9 $$")).record.wait, WaitStatus::Signal(9));
    // A real-time signal, which nix cannot name.
    assert_eq!(run(&sh("kill -s 40 $$")).record.wait, WaitStatus::Signal(40));
}

#[test]
fn env_is_exactly_the_spec_and_cwd_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(&["/usr/bin/env"]);
    s.env = vec![("A".into(), "1".into()), ("B".into(), "two words".into())];
    assert_eq!(run(&s).stdout, "A=1\nB=two words\n");
    let mut s = spec(&["/bin/pwd"]);
    s.cwd = dir.path().to_str().unwrap().into();
    assert_eq!(run(&s).stdout.trim_end(), dir.path().canonicalize().unwrap().to_str().unwrap());
}

#[test]
fn term_with_a_term_ignoring_child_ends_in_kill() {
    let mut init = start(&sh("trap '' TERM; echo ready; while :; do sleep 1; done"), b"");
    assert_eq!(init.stdout_line(), "ready\n");
    kill(init.pid(), Signal::SIGTERM).unwrap();
    let f = init.finish();
    assert_eq!(f.record.stopped_by, Some(StoppedBy::Kill));
    assert_eq!(f.record.wait, WaitStatus::Signal(9));
    assert!(f.record.wall_time_ms >= 200, "{}", f.record.wall_time_ms);
}

#[test]
fn term_with_a_cooperative_child_is_term() {
    let mut init = start(&sh("echo ready; exec sleep 30"), b"");
    assert_eq!(init.stdout_line(), "ready\n");
    kill(init.pid(), Signal::SIGTERM).unwrap();
    let f = init.finish();
    assert_eq!(f.record.stopped_by, Some(StoppedBy::Term), "{:?}", f.record);
    assert_eq!(f.record.wait, WaitStatus::Signal(15));
}

#[test]
fn stdin_eof_before_the_end_is_the_dead_man_switch() {
    let mut init = start(&sh("trap '' TERM; echo ready; while :; do sleep 1; done"), b"");
    assert_eq!(init.stdout_line(), "ready\n");
    let t = Instant::now();
    drop(init.stdin.take());
    // The init finishes and exits on its own: nobody will close its stdin any more.
    let status = init.child.wait().unwrap();
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
    assert!(init.control.path().join(RESULT_FILE).is_file());
    let record = init.record();
    let f = init.finish_output(record, status);
    assert!(f.stderr.ends_with(&done_sentinel(NONCE)), "{}", f.stderr);
    assert_eq!(f.record.stopped_by, Some(StoppedBy::DeadMan));
    assert_eq!(f.record.wait, WaitStatus::Signal(9));
}

#[test]
fn spawn_failure_is_reported() {
    let f = run(&spec(&["/nonexistent/prog", "x"]));
    match &f.record.wait {
        WaitStatus::SpawnFailed(why) => assert!(why.starts_with("cannot execute /nonexistent/prog: "), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(f.stderr.contains("stevedore: cannot execute /nonexistent/prog"), "{}", f.stderr);
    assert!(f.status.success());
    let f = run(&spec(&[]));
    assert!(matches!(f.record.wait, WaitStatus::SpawnFailed(_)));
}

#[test]
fn stragglers_are_killed_and_counted() {
    let t = Instant::now();
    let f = run(&sh("sleep 30 & sleep 30 & exit 0"));
    assert_eq!(f.record.wait, WaitStatus::Code(0));
    assert_eq!(f.record.stragglers_killed, 2);
    assert!(t.elapsed() < Duration::from_secs(20));
}

#[test]
fn child_oom_score_adj_is_applied() {
    let mut s = spec(&["/bin/cat", "/proc/self/oom_score_adj"]);
    s.child_oom_score_adj = Some(500);
    let f = run(&s);
    assert_eq!(f.stdout, "500\n");
    let guard = f.record.oom_guard.unwrap();
    assert!(guard.starts_with("child oom_score_adj 500"), "{guard}");
}

#[test]
fn malformed_frame_exits_125() {
    let mut init = start_raw(b"GARBAGE\n");
    drop(init.stdin.take());
    let status = init.child.wait().unwrap();
    assert_eq!(status.code(), Some(125));
    let mut err = String::new();
    init.stderr.read_to_string(&mut err).unwrap();
    assert!(err.contains("stdin frame malformed"), "{err}");
    assert!(!init.control.path().join(RESULT_FILE).exists());
}

#[test]
fn unwritable_control_dir_exits_125() {
    let mut init = Command::new(env!("CARGO_BIN_EXE_stevedore"))
        .args([INIT_MARKER, "/nonexistent/control"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    init.stdin.take().unwrap().write_all(&encode_stdin_frame(NONCE, &sh("true"), b"")).unwrap();
    let out = init.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot write payload"));
}

#[test]
fn command_starts_with_a_clean_signal_state() {
    // Run directly, not through sh, which would reset its own mask.
    let f = run(&spec(&["/bin/grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"]));
    let field = |name: &str| {
        let line = f.stdout.lines().find_map(|l| l.strip_prefix(name)).unwrap();
        u64::from_str_radix(line.trim(), 16).unwrap()
    };
    assert_eq!(field("SigBlk:"), 0, "{}", f.stdout);
    // HUP, INT, QUIT, TERM and CHLD: those the init blocks and might have inherited ignored.
    assert_eq!(field("SigIgn:") & 0x14007, 0, "{}", f.stdout);
}
