//! Runs the real, static `stevedore-init` outside a container (not PID 1, so it signals the
//! command's process group instead of the whole namespace), speaking the link to it as the
//! host does.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use stevedore::wire::{
    self, Decoder, Frame, HandlerRequest, InitRecord, Kind, OutputEnd, OutputSpec, SpawnFailureKind, Start, StoppedBy,
    WaitStatus,
};
use tempfile::TempDir;

/// The embedded init, written once to a file of this test process.
fn init_path() -> &'static Path {
    static PATH: OnceLock<(TempDir, PathBuf)> = OnceLock::new();
    &PATH
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("stevedore-init");
            std::fs::write(&path, stevedore::sandbox::init_binary::bytes().unwrap()).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            (dir, path)
        })
        .1
}

const KEY: &str = "1111111111111111111111111111111111111111111111111111111111111111";

fn spec(argv: &[&str], out: &Path) -> Start {
    Start {
        protocol: wire::PROTOCOL,
        key: KEY.into(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: "/".into(),
        grace_ms: 200,
        child_oom_score_adj: None,
        handler: None,
        handshake_ms: 5000,
        heartbeat_timeout_ms: 0,
        host_loss_grace_ms: 0,
        outputs: OutputSpec { dir: out.display().to_string(), max_files: 100, max_bytes: 1 << 20 },
    }
}

struct Init {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
    decoder: Decoder,
    /// The outputs dir the init reads; removed with the test.
    _out: TempDir,
    /// The command's streams as received so far.
    cmd_stdout: Vec<u8>,
    cmd_stderr: Vec<u8>,
}

struct Finished {
    record: InitRecord,
    status: ExitStatus,
    stdout: String,
    stderr: String,
    tar: Vec<u8>,
    end: OutputEnd,
    init_stderr: String,
}

fn launch(start: impl FnOnce(&Path) -> Start, payload: &[u8]) -> Init {
    let out = tempfile::tempdir().unwrap();
    let s = start(out.path());
    launch_raw(out, &wire::encode_start(&s, payload))
}

fn launch_raw(out: TempDir, bytes: &[u8]) -> Init {
    let mut child =
        Command::new(init_path()).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(bytes).unwrap();
    let stdout = child.stdout.take().unwrap();
    let accept = |k: Kind| {
        matches!(
            k,
            Kind::Started | Kind::Stdout | Kind::Stderr | Kind::Record | Kind::Output | Kind::OutputEnd | Kind::Diag
        )
    };
    Init {
        child,
        stdin: Some(stdin),
        stdout,
        decoder: Decoder::new(accept),
        _out: out,
        cmd_stdout: Vec::new(),
        cmd_stderr: Vec::new(),
    }
}

impl Init {
    /// The next frame, `None` at EOF. The command's streams are kept as they pass.
    fn next(&mut self) -> Option<Frame> {
        let mut buf = [0u8; 65536];
        loop {
            if let Some(f) = self.decoder.next_frame().expect("only the init writes the link") {
                match f.kind {
                    Kind::Stdout => self.cmd_stdout.extend_from_slice(&f.body),
                    Kind::Stderr => self.cmd_stderr.extend_from_slice(&f.body),
                    _ => {}
                }
                return Some(f);
            }
            match self.stdout.read(&mut buf).unwrap() {
                0 => return None,
                n => self.decoder.feed(&buf[..n]),
            }
        }
    }

    /// Reads until the command's stdout holds `text`.
    fn stdout_until(&mut self, text: &str) {
        while !String::from_utf8_lossy(&self.cmd_stdout).contains(text) {
            assert!(self.next().is_some(), "EOF before {text:?}");
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    fn send(&mut self, kind: Kind) {
        if let Some(s) = &mut self.stdin {
            s.write_all(&wire::encode(kind, b"")).unwrap();
        }
    }

    /// Reads the record (checking its MAC) and the outputs, acks, and collects the exit.
    fn finish(mut self) -> Finished {
        let key = wire::parse_key(KEY).unwrap();
        let mut record = None;
        let mut tar = Vec::new();
        let mut end = None;
        while end.is_none() {
            let f = self.next().expect("the link ended before the outputs' end");
            match f.kind {
                Kind::Record => {
                    let json = wire::open_sealed(&key, &f.body).expect("the record is MACed with the key");
                    record = Some(wire::parse_claim::<InitRecord>(json, 1 << 20).unwrap());
                }
                Kind::Output => tar.extend_from_slice(&f.body),
                Kind::OutputEnd => end = Some(serde_json::from_slice::<OutputEnd>(&f.body).unwrap()),
                _ => {}
            }
        }
        // The init keeps its record until the host acks.
        assert!(self.child.try_wait().unwrap().is_none(), "the init exited before the ack");
        self.send(Kind::Ack);
        while self.next().is_some() {}
        let status = self.child.wait().unwrap();
        let mut init_stderr = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut init_stderr).unwrap();
        Finished {
            record: record.expect("a record"),
            status,
            stdout: String::from_utf8_lossy(&self.cmd_stdout).into_owned(),
            stderr: String::from_utf8_lossy(&self.cmd_stderr).into_owned(),
            tar,
            end: end.unwrap(),
            init_stderr,
        }
    }
}

fn run(argv: &[&str]) -> Finished {
    launch(|o| spec(argv, o), b"").finish()
}

fn sh(script: &str) -> Finished {
    run(&["/bin/sh", "-c", script])
}

fn tar_names(tar: &[u8]) -> Vec<String> {
    tar::Archive::new(tar).entries().unwrap().map(|e| e.unwrap().path().unwrap().display().to_string()).collect()
}

#[test]
fn streams_record_and_outputs_ride_the_link() {
    let f = launch(
        |o| {
            spec(
                &[
                    "/bin/sh",
                    "-c",
                    &format!("echo out; echo err >&2; echo data > {0}/a.txt; ln -s /etc/passwd {0}/l", o.display()),
                ],
                o,
            )
        },
        b"",
    )
    .finish();
    assert!(f.status.success(), "{:?}", f.status);
    assert_eq!(f.record.wait, WaitStatus::Code(0));
    assert_eq!((f.record.stopped_by, f.record.stragglers_killed), (None, 0));
    assert_eq!((f.stdout.as_str(), f.stderr.as_str()), ("out\n", "err\n"));
    assert_eq!((f.record.stdout_bytes, f.record.stderr_bytes), (4, 4));
    assert_eq!(tar_names(&f.tar), ["a.txt"]);
    assert_eq!(f.end.refused.len(), 1, "the symlink is named, not sent: {:?}", f.end.refused);
    assert_eq!(f.end.refused[0].why, "symlink");
}

#[test]
fn exit_codes_and_signals_are_told_apart() {
    assert_eq!(sh("exit 3").record.wait, WaitStatus::Code(3));
    assert_eq!(sh("exit 137").record.wait, WaitStatus::Code(137));
    assert_eq!(sh("kill -9 $$").record.wait, WaitStatus::Signal(9));
    // A real-time signal, which nix cannot name.
    assert_eq!(sh("kill -s 40 $$").record.wait, WaitStatus::Signal(40));
}

#[test]
fn env_is_exactly_the_start_and_cwd_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let f = launch(
        |o| Start {
            env: vec![("A".into(), "1".into()), ("B".into(), "two words".into())],
            ..spec(&["/usr/bin/env"], o)
        },
        b"",
    )
    .finish();
    assert_eq!(f.stdout, "A=1\nB=two words\n", "nothing of the init's own environment is inherited");
    let cwd = dir.path().to_str().unwrap().to_owned();
    let f = launch(|o| Start { cwd: cwd.clone(), ..spec(&["/bin/pwd"], o) }, b"").finish();
    assert_eq!(f.stdout.trim_end(), dir.path().canonicalize().unwrap().to_str().unwrap());
}

#[test]
fn a_stop_frame_with_a_term_ignoring_child_ends_in_kill() {
    let mut init = launch(|o| spec(&["/bin/sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"], o), b"");
    init.stdout_until("ready");
    init.send(Kind::Stop);
    let f = init.finish();
    assert_eq!((f.record.stopped_by, f.record.wait.clone()), (Some(StoppedBy::Kill), WaitStatus::Signal(9)));
    assert!(f.record.wall_time_ms >= 200, "{}", f.record.wall_time_ms);
}

#[test]
fn sigterm_from_the_engine_with_a_cooperative_child_is_term() {
    let mut init = launch(|o| spec(&["/bin/sh", "-c", "echo ready; exec sleep 30"], o), b"");
    init.stdout_until("ready");
    kill(init.pid(), Signal::SIGTERM).unwrap();
    let f = init.finish();
    assert_eq!((f.record.stopped_by, f.record.wait.clone()), (Some(StoppedBy::Term), WaitStatus::Signal(15)));
}

#[test]
fn the_link_closing_before_the_end_is_the_dead_man_switch() {
    let mut init = launch(|o| spec(&["/bin/sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"], o), b"");
    init.stdout_until("ready");
    let t = Instant::now();
    drop(init.stdin.take());
    let mut record = None;
    while let Some(f) = init.next() {
        if f.kind == Kind::Record {
            let key = wire::parse_key(KEY).unwrap();
            record = Some(wire::parse_claim::<InitRecord>(wire::open_sealed(&key, &f.body).unwrap(), 1 << 20).unwrap());
        }
    }
    // With nobody to ack, the init finishes and exits on its own, without sending outputs.
    let status = init.child.wait().unwrap();
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
    let record = record.expect("the record is still sent");
    assert_eq!(
        (record.stopped_by, record.wait, record.host_lost),
        (Some(StoppedBy::DeadMan), WaitStatus::Signal(9), true)
    );
}

#[test]
fn a_silent_host_is_lost_after_the_heartbeat_timeout() {
    let mut init = launch(|o| Start { heartbeat_timeout_ms: 300, ..spec(&["/bin/sleep", "30"], o) }, b"");
    let t = Instant::now();
    let mut record = None;
    while let Some(f) = init.next() {
        if f.kind == Kind::Record {
            let key = wire::parse_key(KEY).unwrap();
            record = Some(wire::parse_claim::<InitRecord>(wire::open_sealed(&key, &f.body).unwrap(), 1 << 20).unwrap());
        }
    }
    // Lost, so it stops the command, reports into the void, and exits without an ack.
    assert!(init.child.wait().unwrap().success());
    assert!(t.elapsed() < Duration::from_secs(10));
    let record = record.expect("a record");
    assert_eq!((record.stopped_by, record.host_lost), (Some(StoppedBy::DeadMan), true));
}

#[test]
fn spawn_failures_say_which() {
    let f = run(&["/nonexistent/prog", "x"]);
    match &f.record.wait {
        WaitStatus::SpawnFailed(why) => {
            assert_eq!(why.kind, SpawnFailureKind::NotFound);
            assert!(why.message.starts_with("/nonexistent/prog"), "{}", why.message);
        }
        other => panic!("{other:?}"),
    }
    assert!(f.status.success());
    match run(&["/etc/passwd"]).record.wait {
        WaitStatus::SpawnFailed(why) => assert_eq!(why.kind, SpawnFailureKind::NotExecutable),
        other => panic!("{other:?}"),
    }
    assert!(matches!(run(&[]).record.wait, WaitStatus::SpawnFailed(_)));
}

#[test]
fn stragglers_are_killed_and_counted() {
    let t = Instant::now();
    let f = sh("sleep 30 & sleep 30 & exit 0");
    assert_eq!(f.record.wait, WaitStatus::Code(0));
    assert_eq!(f.record.stragglers_killed, 2);
    assert!(t.elapsed() < Duration::from_secs(20));
}

#[test]
fn child_oom_score_adj_is_applied() {
    let f =
        launch(|o| Start { child_oom_score_adj: Some(500), ..spec(&["/bin/cat", "/proc/self/oom_score_adj"], o) }, b"")
            .finish();
    assert_eq!(f.stdout, "500\n");
    assert!(f.record.oom_guard.unwrap().starts_with("child oom_score_adj 500"));
}

#[test]
fn a_malformed_start_exits_125_and_says_why() {
    let out = tempfile::tempdir().unwrap();
    let mut init = launch_raw(out, b"GARBAGE that is not a frame\n");
    drop(init.stdin.take());
    let mut diag = String::new();
    while let Some(f) = init.next() {
        if f.kind == Kind::Diag {
            diag.push_str(&String::from_utf8_lossy(&f.body));
        }
    }
    assert!(diag.contains("broken"), "{diag}");
    assert_eq!(init.child.wait().unwrap().code(), Some(125));
}

#[test]
fn command_starts_with_a_clean_signal_state() {
    // Run directly, not through sh, which would reset its own mask.
    let f = run(&["/bin/grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"]);
    let field = |name: &str| {
        let line = f.stdout.lines().find_map(|l| l.strip_prefix(name)).unwrap();
        u64::from_str_radix(line.trim(), 16).unwrap()
    };
    assert_eq!(field("SigBlk:"), 0, "{}", f.stdout);
    // HUP, INT, QUIT, PIPE, TERM and CHLD: those the init blocks or ignores.
    assert_eq!(field("SigIgn:") & 0x15007, 0, "{}", f.stdout);
}

#[test]
fn output_files_that_would_hang_or_overflow_are_refused() {
    let f = launch(
        |o| {
            let script = format!("mkfifo {0}/fifo; truncate -s 1T {0}/sparse; echo real > {0}/result.txt", o.display());
            spec(&["/bin/sh", "-c", &script], o)
        },
        b"",
    );
    let t = Instant::now();
    let f = f.finish();
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(tar_names(&f.tar), ["result.txt"], "the real output still goes");
    let why: Vec<(&str, &str)> = f.end.refused.iter().map(|r| (r.name.as_str(), r.why.as_str())).collect();
    assert_eq!(why, [("fifo", "fifo"), ("sparse", "over_cap")]);
    assert!(f.end.over_cap);
}

#[test]
fn a_handler_runner_speaks_the_protocol_and_a_plain_binary_does_not() {
    let req = HandlerRequest {
        handler: "echo".into(),
        fingerprint: None,
        job_id: "j1".into(),
        attempt: 1,
        inputs: Default::default(),
        prior_outputs: vec![],
        deadline_ms: None,
    };
    let runner = env!("CARGO_BIN_EXE_stevedore");
    let f = launch(
        |o| Start {
            handler: Some(req.clone()),
            env: vec![("STEVEDORE_OUT".into(), o.display().to_string())],
            ..spec(&[runner, wire::HANDLER_MARKER], o)
        },
        b"the payload",
    )
    .finish();
    let ch = f.record.handler.expect("a handler channel");
    assert!(ch.hello.is_some(), "{:?} {}", ch.refused, f.stderr);
    assert_eq!(ch.record.unwrap().result, wire::HandlerResult::Ok);
    assert_eq!(tar_names(&f.tar), ["payload"]);

    // /bin/true is no worker binary: it says nothing and exits.
    let f = launch(|o| Start { handler: Some(req.clone()), ..spec(&["/bin/true"], o) }, b"").finish();
    let ch = f.record.handler.unwrap();
    assert!(ch.hello.is_none() && ch.record.is_none());

    // One that neither speaks nor ends is stopped at the handshake's bound.
    let t = Instant::now();
    let f = launch(|o| Start { handler: Some(req), handshake_ms: 300, ..spec(&["/bin/sleep", "30"], o) }, b"").finish();
    assert_eq!(f.record.stopped_by, Some(StoppedBy::Handshake));
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(f.init_stderr.contains("did not say hello"), "{}", f.init_stderr);
}
