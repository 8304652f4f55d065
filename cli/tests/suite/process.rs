//! The process rung on this machine: a child process under a dedicated uid (when the tests
//! run as root, as in CI), supervised by the real init, with a cgroup of its own when one
//! can be made. Statuses, usage, isolation, cleanup, handlers, hooks and the registry.

use crate::support;

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stevedore::contract::{Checkpoint, HookResult, Hooks, Reason, SandboxReport, Source, Status, Target};
use stevedore::process::{Delegation, ProcessConfig, ProcessExecutor};
use stevedore::{Executor, InProcessExecutor, Level, Policy, Registry, Request};
use support::{BIN, worker};
use tokio_util::sync::CancellationToken;

fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn config(cg: Delegation) -> ProcessConfig {
    support::time_limit();
    let cfg = ProcessConfig::default().cgroup(cg).worker_exe(BIN).log_dir(support::test_logs());
    if root() { cfg } else { cfg.as_worker_uid() }
}

fn rung(cg: Delegation) -> ProcessExecutor {
    ProcessExecutor::new(config(cg)).expect("the process rung sets up")
}

fn sh(w: &str, out: &Path, script: &str) -> Request {
    Request::command("job", ["sh", "-c", script], out).worker(w)
}

async fn run(r: &ProcessExecutor, req: &Request) -> stevedore::Outcome {
    r.run(req, CancellationToken::new()).await.expect("the attempt runs")
}

fn stdout_of(o: &stevedore::Outcome) -> String {
    std::fs::read_to_string(o.evidence.logs.stdout.path.as_ref().unwrap()).unwrap()
}

/// Nothing of the attempt is left: no dir under the rung's attempts dir for this worker.
fn nothing_left(r: &ProcessExecutor, w: &str) {
    let left: Vec<String> = std::fs::read_dir(r.attempts_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("{w}-")))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    for hierarchy in ["memory", "cpu", "pids", ""] {
        let parent = Path::new("/sys/fs/cgroup").join(hierarchy).join("stevedore-process");
        if let Ok(rd) = std::fs::read_dir(&parent) {
            for e in rd.flatten() {
                assert!(!e.file_name().to_string_lossy().starts_with(&format!("{w}-")), "cgroup left: {:?}", e.path());
            }
        }
    }
}

#[tokio::test]
async fn a_process_policy_selects_the_process_rung_and_downgrade_works_across_three() {
    let mut reg = Registry::new();
    reg.register(Arc::new(InProcessExecutor::new(stevedore::handlers::builtin(), "inc"))).unwrap();
    reg.register(Arc::new(rung(Delegation::None))).unwrap();
    if let Some((_docker, _image)) = support::setup().await {
        reg.register(Arc::new(support::rung().await)).unwrap();
        assert_eq!(reg.select(&Policy::at_least(Level::Sandboxed)).unwrap().name(), "docker");
    }
    assert_eq!(reg.select(&Policy::at_least(Level::Process)).unwrap().name(), "process");
    assert_eq!(reg.select(&Policy::at_least(Level::None)).unwrap().name(), "inprocess");
    let vm = Policy { allow_downgrade: true, ..Policy::at_least(Level::Vm) };
    assert_eq!(reg.select(&vm).unwrap().name(), "inprocess", "downgrade takes the default");
    assert!(reg.select(&Policy::at_least(Level::Vm)).is_err());
}

#[tokio::test]
async fn statuses_outputs_and_cleanup() {
    let r = rung(Delegation::None);
    let w = worker("proc-status");
    let out = tempfile::tempdir().unwrap();
    let o = run(&r, &sh(&w, out.path(), "echo hello > \"$STEVEDORE_OUT/h.txt\"; mkdir \"$STEVEDORE_OUT/d\"; echo x > \"$STEVEDORE_OUT/d/y\"; echo said")).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(o.evidence.level, Some(Level::Process));
    let names: Vec<&str> = o.outputs.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["d/y", "h.txt"]);
    let want = format!("sha256:{}", support::sha256_of(&out.path().join("h.txt")).unwrap());
    assert_eq!(o.outputs[1].hash, want);
    assert_eq!(stdout_of(&o), "said\n");

    let out = tempfile::tempdir().unwrap();
    let o = run(&r, &sh(&w, out.path(), "exit 3")).await;
    assert_eq!((o.status, o.exit_code), (Status::HandlerError, Some(3)));

    let out = tempfile::tempdir().unwrap();
    let o = run(&r, &Request::command("job", ["/nonexistent/prog"], out.path()).worker(&w)).await;
    assert_eq!((o.status, o.reason, o.permanent), (Status::LaunchFailed, Some(Reason::CommandNotFound), true));

    let out = tempfile::tempdir().unwrap();
    let req = sh(&w, out.path(), "trap '' TERM; while :; do sleep 1; done")
        .timeout(Duration::from_millis(500))
        .grace(Duration::from_millis(300));
    let o = run(&r, &req).await;
    assert_eq!((o.status, o.reason, o.signal), (Status::Timeout, Some(Reason::Deadline), Some(9)), "{}", o.to_json());

    let out = tempfile::tempdir().unwrap();
    let cancel = CancellationToken::new();
    let req = sh(&w, out.path(), "exec sleep 300").grace(Duration::from_secs(2));
    let (o, ()) = tokio::join!(r.run(&req, cancel.clone()), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cancel.cancel();
    });
    let o = o.unwrap();
    assert_eq!((o.status, o.reason), (Status::Killed, Some(Reason::Cancelled)));

    // A straggler that left the command's session is killed with the rest.
    let out = tempfile::tempdir().unwrap();
    let o = run(&r, &sh(&w, out.path(), "setsid sleep 300 & echo $! > \"$STEVEDORE_OUT/pid\"")).await;
    assert!(o.evidence.stragglers_killed, "{}", o.to_json());
    let pid: i32 = std::fs::read_to_string(out.path().join("pid")).unwrap().trim().parse().unwrap();
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "the escaped sleep {pid} is gone");
    nothing_left(&r, &w);
}

/// A timeout counts from the command's start on this rung too (the uid's lease, the copy of
/// the inputs and the init's spawn are not the command's time).
#[tokio::test]
async fn a_timeout_is_counted_from_the_commands_start() {
    let r = rung(Delegation::Auto);
    let w = worker("p-timeout");
    let input = tempfile::tempdir().unwrap();
    std::fs::write(input.path().join("a"), vec![7u8; 4 << 20]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let timeout = Duration::from_millis(500);
    let req = sh(&w, out.path(), "exec sleep 30").input_dir(input.path()).timeout(timeout);
    let o = run(&r, &req).await;
    assert_eq!((o.status, o.reason, o.signal), (Status::Timeout, Some(Reason::Deadline), Some(15)), "{}", o.to_json());
    let ran = Duration::from_millis(o.usage.wall_time_ms.expect("the init's clock"));
    assert!(ran >= timeout && ran < timeout + Duration::from_secs(2), "the command ran {ran:?}: {}", o.to_json());
    nothing_left(&r, &w);
}

#[tokio::test]
async fn the_command_runs_as_another_uid_with_only_its_environment_and_read_only_inputs() {
    let r = rung(Delegation::None);
    let w = worker("proc-iso");
    let inputs = tempfile::tempdir().unwrap();
    std::fs::write(inputs.path().join("a.txt"), b"input").unwrap();
    let out = tempfile::tempdir().unwrap();
    let script = format!(
        "id -u; id -g; cat /proc/{}/environ >/dev/null 2>&1 && echo read-worker-env || echo no-worker-env; \
         echo x >> \"$STEVEDORE_IN/a.txt\" 2>/dev/null && echo wrote-input || echo input-read-only; \
         cat \"$STEVEDORE_IN/a.txt\"; echo; ulimit -n; env | cut -d= -f1 | sort | tr '\\n' ' '",
        std::process::id()
    );
    let req = sh(&w, out.path(), &script).input_dir(inputs.path()).env("MINE", "1");
    let o = run(&r, &req).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    // The same phases as the container rung's, the inputs' copy among them, in order.
    let p = &o.evidence.phases;
    let phases = [p.prepared_ms, p.inputs_staged_ms, p.created_ms, p.started_ms, p.command_started_ms];
    let end = [p.command_ended_ms, p.outputs_collected_ms, p.concluded_ms];
    let all: Vec<_> = phases.iter().chain(&end).collect();
    assert!(all.iter().all(|x| x.is_some()) && all.windows(2).all(|w| w[0] <= w[1]), "{p:?}");
    let lines: Vec<String> = stdout_of(&o).lines().map(str::to_owned).collect();
    if root() {
        let range = stevedore::process::DEFAULT_UIDS;
        let (uid, gid): (u32, u32) = (lines[0].parse().unwrap(), lines[1].parse().unwrap());
        assert!(range.contains(uid) && uid == gid, "a uid and gid of the attempt's own: {uid}:{gid}");
        assert_eq!(lines[2], "no-worker-env", "the worker's /proc is not the command's to read");
        assert_eq!(lines[3], "input-read-only");
        assert!(o.evidence.enforcement.contains_key("uid"), "{:?}", o.evidence.enforcement);
        assert!(o.evidence.enforcement["inputs"].contains("read-only"));
    } else {
        assert!(o.evidence.skipped["uid"].contains("worker's own uid"));
    }
    assert_eq!(lines[4], "input");
    assert_eq!(lines[5], "4096");
    let keys: Vec<&str> = lines[6].split_whitespace().collect();
    for k in &keys {
        let allowed =
            ["PATH", "HOME", "TMPDIR", "MINE", "PWD", "SHLVL", "_"].contains(k) || k.starts_with("STEVEDORE_");
        assert!(allowed, "{k} leaked into the command's environment: {keys:?}");
    }
    assert!(keys.contains(&"MINE"));
    assert_eq!(std::fs::read(inputs.path().join("a.txt")).unwrap(), b"input", "the caller's inputs are untouched");
    assert_eq!(o.evidence.skipped["disk"], "no mount enforces it: outputs go to a directory on the host's filesystem");
    assert!(o.evidence.enforcement["rlimit.nofile"].starts_with("4096 soft"));
    assert_eq!(o.evidence.inputs.as_ref().map(|i| (i.files, i.bytes)), Some((1, 5)));
    nothing_left(&r, &w);
}

#[tokio::test]
async fn without_a_cgroup_cpu_comes_from_rusage_and_peak_memory_is_unknown() {
    let r = rung(Delegation::None);
    let w = worker("proc-rusage");
    let out = tempfile::tempdir().unwrap();
    let req = sh(&w, out.path(), "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done").memory(64 << 20);
    let o = run(&r, &req).await;
    assert_eq!(o.status, Status::Ok);
    assert_eq!(o.usage.sources.cpu_time_ms, Some(Source::Rusage));
    let cpu = o.usage.cpu_time_ms.unwrap();
    assert!(cpu > 0 && cpu <= o.usage.wall_time_ms.unwrap() + 50, "{}", o.to_json());
    assert_eq!(o.usage.peak_memory_bytes, None);
    assert!(o.usage.sources.peak_memory_bytes.as_ref().unwrap().to_string().contains("not knowable without one"));
    assert!(o.evidence.skipped["memory"].contains("RLIMIT_AS is not a memory limit"), "{:?}", o.evidence.skipped);
    // No cgroup of its own: nothing to sample, and the Outcome says so.
    assert_eq!(o.usage.timeline, None);
    let why = o.usage.sources.timeline.as_ref().map(ToString::to_string).unwrap_or_default();
    assert!(why.starts_with("unavailable: ") && why.contains("cgroup"), "{why}");
}

#[tokio::test]
async fn with_a_cgroup_usage_is_the_kernels_and_an_oom_kill_is_seen() {
    if !root() {
        support::skip("cgroups per attempt need root");
        return;
    }
    let r = rung(Delegation::Auto);
    let w = worker("proc-cgroup");
    let out = tempfile::tempdir().unwrap();
    // The shell keeps the whole substitution in memory: 40 MiB resident, at least.
    let req = sh(&w, out.path(), "x=$(head -c 41943040 /dev/zero | tr '\\0' a); echo ${#x}").memory(256 << 20);
    let o = run(&r, &req).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(o.usage.sources.cpu_time_ms, Some(Source::Cgroup), "{}", o.to_json());
    assert_eq!(o.usage.sources.peak_memory_bytes, Some(Source::Cgroup));
    let peak = o.usage.peak_memory_bytes.unwrap();
    assert_eq!(stdout_of(&o), "41943040\n");
    assert!((40 << 20..=256 << 20).contains(&peak), "peak {peak}");
    assert!(o.evidence.enforcement["memory"].contains("cgroup"), "{:?}", o.evidence.enforcement);
    // The init sampled the attempt's own cgroup, made on the host; /out is a directory of
    // the host's filesystem, which it says it does not sample.
    assert_eq!(o.usage.sources.timeline, Some(Source::Sampled), "{}", o.to_json());
    let line = o.usage.timeline.as_ref().unwrap();
    let n = line.t_ms.len();
    assert!(n >= 2 && line.memory_bytes.len() == n && line.cpu_ms.len() == n, "{line:?}");
    assert_eq!(line.peak.as_ref().map(|p| p.memory_bytes), Some(peak));
    assert!(line.missing.get("out_bytes").is_some_and(|w| w.contains("not a filesystem of its own")), "{line:?}");

    let out = tempfile::tempdir().unwrap();
    let req = sh(&w, out.path(), "x=$(head -c 209715200 /dev/zero | tr '\\0' a); echo ${#x}").memory(32 << 20);
    let o = run(&r, &req).await;
    assert_eq!((o.status, o.reason), (Status::OomKilled, Some(Reason::Oom)), "{}", o.to_json());
    assert!(o.evidence.oom_kills.unwrap() >= 1);
    nothing_left(&r, &w);
}

#[tokio::test]
async fn a_handler_runs_by_re_exec_of_the_worker_binary() {
    let r = rung(Delegation::None);
    let w = worker("proc-handler");
    let out = tempfile::tempdir().unwrap();
    let req = Request::handler("job", "echo", out.path()).worker(&w).payload("hi there");
    let o = run(&r, &req).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(std::fs::read_to_string(out.path().join("payload")).unwrap(), "hi there");
    let out = tempfile::tempdir().unwrap();
    let o = run(&r, &Request::handler("job", "no-such-handler", out.path()).worker(&w)).await;
    assert_eq!((o.status, o.reason), (Status::LaunchFailed, Some(Reason::UnknownHandler)));
    let out = tempfile::tempdir().unwrap();
    let o = run(&r, &Request::handler("job", "fail", out.path()).worker(&w).payload("nope")).await;
    assert_eq!((o.status, o.handler_error.as_str()), (Status::HandlerError, "nope"));
    nothing_left(&r, &w);
}

#[tokio::test]
async fn a_worker_binary_that_never_speaks_the_handler_protocol_is_a_launch_error_naming_it() {
    // The same behaviour as the container rung's (`docs/outcome.md`): the handler never ran,
    // and no retry changes the worker's build.
    let t = tempfile::tempdir().unwrap();
    let fake = t.path().join("not-a-worker");
    std::fs::write(&fake, "#!/bin/sh\necho I am no stevedore worker >&2\nexit 3\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let r = ProcessExecutor::new(config(Delegation::None).worker_exe(&fake)).expect("the process rung sets up");
    let w = worker("proc-silent");
    let out = t.path().join("out");
    let err = r.run(&Request::handler("job", "echo", &out).worker(&w), CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, stevedore::LaunchError::HandlerProtocol { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("not-a-worker") && text.contains("sandbox::main_hook"), "{text}");
    assert!(text.contains("exited with code 3") && text.contains("I am no stevedore worker"), "{text}");
    nothing_left(&r, &w);
}

#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

impl Hooks for Recorder {
    fn checkpoint<'a>(&'a self, c: &'a Checkpoint) -> HookResult<'a> {
        Box::pin(async move {
            let alive = matches!(c.target, Target::Process { pid, .. } if Path::new(&format!("/proc/{pid}")).exists());
            self.0.lock().unwrap().push(format!("checkpoint {} {alive}", c.rung));
            Ok(())
        })
    }
    fn report<'a>(&'a self, _: &'a stevedore::contract::AttemptRef, r: &'a SandboxReport) -> HookResult<'a> {
        Box::pin(async move {
            self.0.lock().unwrap().push(format!("report {} {:?}", r.seq, r.report.percent));
            Ok(())
        })
    }
    fn outcome<'a>(&'a self, o: &'a stevedore::Outcome) -> HookResult<'a> {
        Box::pin(async move {
            self.0.lock().unwrap().push(format!("outcome {}", o.status));
            Ok(())
        })
    }
}

#[tokio::test]
async fn hooks_and_reports_on_the_process_rung() {
    let r = rung(Delegation::None);
    let w = worker("proc-hooks");
    let out = tempfile::tempdir().unwrap();
    let hooks = Arc::new(Recorder::default());
    let script = r#""$STEVEDORE_INIT" report progress 25; "$STEVEDORE_INIT" report progress 75"#;
    let o = run(&r, &sh(&w, out.path(), script).hooks(hooks.clone())).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(
        *hooks.0.lock().unwrap(),
        ["checkpoint process true", "report 1 Some(25.0)", "report 2 Some(75.0)", "outcome ok"]
    );
    // The forwarding of reports ended with the attempt: nothing waited for it to time out
    // (it once held every attempt with hooks, `stevedore run --rung process` too, 30 s).
    assert!(o.evidence.hook_failures.is_empty(), "{:?}", o.evidence.hook_failures);
    // A handler reports through its context, over the same socket.
    let out = tempfile::tempdir().unwrap();
    let hooks = Arc::new(Recorder::default());
    let o = run(&r, &Request::handler("job", "progress", out.path()).worker(&w).hooks(hooks.clone())).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let events = hooks.0.lock().unwrap().clone();
    assert_eq!(&events[1..], ["report 1 Some(25.0)", "report 2 Some(50.0)", "report 3 Some(75.0)", "outcome ok"]);
}

#[test]
fn the_rung_refuses_to_run_commands_as_root_or_silently_as_the_worker() {
    let err = ProcessExecutor::new(ProcessConfig::default().run_as(0, 0)).unwrap_err();
    assert!(err.to_string().contains("uid other than 0"), "{err}");
    let me = nix::unistd::geteuid().as_raw();
    if me != 0 {
        let err = ProcessExecutor::new(ProcessConfig::default()).unwrap_err();
        assert!(err.to_string().contains("allow_worker_uid"), "{err}");
    }
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("base");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(12345), None).unwrap_or(());
    if std::fs::metadata(&dir).unwrap().uid() == 12345 {
        let err = ProcessExecutor::new(config(Delegation::None).base_dir(&dir)).unwrap_err();
        assert!(err.to_string().contains("cannot be trusted"), "{err}");
    }
}

#[tokio::test]
async fn reclaim_stops_what_a_killed_worker_left_and_removes_its_dir() {
    use std::io::BufRead;
    let w = worker("proc-reclaim");
    let t = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(BIN)
        .args(["run", "--rung", "process", "--worker", &w, "--host-loss-grace", "600s", "--output"])
        .arg(t.path().join("o"))
        .args(["--", "sh", "-c", "echo \"ready $$\" >&2; exec sleep 600"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let pid: i32 = loop {
        let l = lines.next().expect("ready").unwrap();
        if let Some(p) = l.strip_prefix("ready ") {
            break p.trim().parse().unwrap();
        }
    };
    child.kill().unwrap();
    child.wait().unwrap();
    // The command's captures are in the default dir: so is this rung's.
    let mut cfg = config(Delegation::Auto);
    cfg.log_dir = None;
    let r = ProcessExecutor::new(cfg).unwrap();
    let report = r.reclaim(&w).await.unwrap();
    // The attempt's dir and its two captures, nothing else.
    let attempts = r.attempts_dir().display().to_string();
    let (dirs, captures): (Vec<_>, Vec<_>) = report.paths_removed.iter().partition(|p| p.starts_with(&attempts));
    assert_eq!(dirs.len(), 1, "{report:?}");
    assert_eq!(captures.iter().filter(|p| p.ends_with(".stdout") || p.ends_with(".stderr")).count(), 2, "{report:?}");
    assert_eq!(captures.len(), 2, "{report:?}");
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "the command {pid} was stopped");
    nothing_left(&r, &w);
}

/// The dir of the one attempt of `w` in flight.
fn dir_of(r: &ProcessExecutor, w: &str) -> std::path::PathBuf {
    let mut dirs: Vec<_> = std::fs::read_dir(r.attempts_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&format!("{w}-")))
        .map(|e| e.path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.remove(0)
}

/// Two attempts side by side (as root): each runs as a uid of its own, and neither can
/// signal the other, ptrace it, read its environment (a secret), its descriptors or its
/// memory map, nor write into its outputs (which the other's Outcome would hash as its own).
#[tokio::test]
async fn attempts_side_by_side_cannot_reach_each_other() {
    if !root() {
        support::skip("one uid without root: the rung then runs one attempt at a time");
        return;
    }
    let r = rung(Delegation::None);
    let wb = worker("proc-victim");
    let out_b = tempfile::tempdir().unwrap();
    let b_input = out_b.path().join("in");
    std::fs::create_dir(&b_input).unwrap();
    std::fs::write(b_input.join("f"), b"b's input").unwrap();
    // Its pid, its uid and its parent's: the init, which the neighbour must not kill either.
    let mut b = sh(&wb, &out_b.path().join("o"), "echo $$ $(id -u) $PPID; exec sleep 120")
        .env("SECRET", "b-secret-value")
        .input_dir(&b_input);
    let mut watch = support::watch([&mut b]);
    let cancel_b = CancellationToken::new();
    let b_run = tokio::spawn({
        let (r, b, cancel) = (r.clone(), b.clone(), cancel_b.clone());
        async move { r.run(&b, cancel).await }
    });
    let said = watch.next_stdout().await.expect("b says its pid");
    let [b_pid, b_uid, b_init]: [&str; 3] = said.split_whitespace().collect::<Vec<_>>().try_into().unwrap();
    let b_out = dir_of(&r, &wb).join("out");
    let b_in = dir_of(&r, &wb).join("in");
    // What the neighbour is denied is there: b's input copy, and b's init as its parent.
    assert_eq!(std::fs::read(b_in.join("f")).unwrap(), b"b's input");
    let comm = std::fs::read_to_string(format!("/proc/{b_init}/comm")).unwrap();
    assert!(comm.starts_with("stevedore-init"), "b's parent is {comm:?}");
    let wa = worker("proc-neighbour");
    let out_a = tempfile::tempdir().unwrap();
    let script = format!(
        "id -u; \
         cat /proc/{b_pid}/environ >/dev/null 2>&1 && echo environ-read || echo environ-denied; \
         cat /proc/{b_pid}/maps >/dev/null 2>&1 && echo maps-read || echo maps-denied; \
         ls /proc/{b_pid}/fd >/dev/null 2>&1 && echo fds-read || echo fds-denied; \
         head -c1 /proc/{b_pid}/mem >/dev/null 2>&1 && echo mem-read || echo mem-denied; \
         kill -0 {b_pid} 2>/dev/null && echo signal-reaches || echo signal-denied; \
         kill -9 {b_init} 2>/dev/null && echo init-killed || echo init-kill-denied; \
         cat {}/f >/dev/null 2>&1 && echo input-read || echo input-denied; \
         echo forged > {}/forged 2>/dev/null && echo wrote || echo write-denied",
        b_in.display(),
        b_out.display()
    );
    let a = run(&r, &sh(&wa, out_a.path(), &script)).await;
    cancel_b.cancel();
    let b = b_run.await.unwrap().expect("b ran");
    assert_eq!(a.status, Status::Ok, "{}", a.to_json());
    let lines: Vec<String> = stdout_of(&a).lines().map(str::to_owned).collect();
    assert_ne!(lines[0], b_uid, "two attempts in flight never share a uid");
    assert_eq!(
        &lines[1..],
        [
            "environ-denied",
            "maps-denied",
            "fds-denied",
            "mem-denied",
            "signal-denied",
            "init-kill-denied",
            "input-denied",
            "write-denied"
        ]
    );
    assert_eq!((b.status, b.reason), (Status::Killed, Some(Reason::Cancelled)), "{}", b.to_json());
    assert!(b.outputs.is_empty(), "the neighbour wrote b's outputs: {:?}", b.outputs);
    assert!(b.evidence.enforcement["between_attempts"].contains("no other attempt has uid"), "{:?}", b.evidence);
    nothing_left(&r, &wa);
    nothing_left(&r, &wb);
}

/// A descriptor the worker holds without close-on-exec (here a file only root can read)
/// never reaches the command.
#[tokio::test]
async fn a_descriptor_the_worker_leaks_never_reaches_the_command() {
    let r = rung(Delegation::None);
    let w = worker("proc-fds");
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, b"root only").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let opened = std::fs::File::open(&secret).unwrap();
    // Inheritable (F_DUPFD leaves close-on-exec off), open in this process until it exits.
    let n = nix::fcntl::fcntl(&opened, nix::fcntl::FcntlArg::F_DUPFD(57)).unwrap();
    let script = format!("cat /proc/self/fd/{n} 2>/dev/null && echo leaked; ls /proc/self/fd | sort -n | tr '\\n' ' '");
    let o = run(&r, &sh(&w, &dir.path().join("o"), &script)).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let out = stdout_of(&o);
    assert!(!out.contains("leaked"), "fd {n} reached the command: {out}");
    let fds: Vec<u32> = out.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    assert_eq!(&fds[..fds.len() - 1], [0, 1, 2, 3], "{out}");
    nothing_left(&r, &w);
}

/// The takeover socket is in a dir of the worker's own: another uid (here `nobody`, and the
/// command's own) cannot even reach it, so it cannot charge the attempt for refusing it.
#[tokio::test]
async fn no_other_uid_can_reach_the_takeover_socket() {
    if !root() {
        support::skip("needs root to connect as another uid");
        return;
    }
    let r = rung(Delegation::None);
    let w = worker("proc-ctl");
    let out = tempfile::tempdir().unwrap();
    let mut req = sh(
        &w,
        &out.path().join("o"),
        "echo ready; [ -e \"$STEVEDORE_OUT/../ctl/t.sock\" ] && echo seen; exec sleep 120",
    );
    let mut watch = support::watch([&mut req]);
    let cancel = CancellationToken::new();
    let mut running = tokio::spawn({
        let (r, req, cancel) = (r.clone(), req.clone(), cancel.clone());
        async move { r.run(&req, cancel).await }
    });
    watch.until_or_end("ready", &mut running).await;
    let ctl = dir_of(&r, &w).join("ctl");
    let md = std::fs::metadata(&ctl).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o777), (0, 0o700), "only the worker may enter");
    let sock = ctl.join("t.sock");
    assert!(std::fs::symlink_metadata(&sock).is_ok(), "the socket is there");
    let probe = format!(
        "import socket\ns=socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({:?})\n    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)\n",
        sock.display().to_string()
    );
    let got = std::process::Command::new("/usr/bin/python3")
        .args(["-c", &probe])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("/usr/bin/python3 is on this machine kind");
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        "PermissionError",
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    cancel.cancel();
    let o = running.await.unwrap().expect("it ran");
    assert!(!stdout_of(&o).contains("seen"), "the command cannot see it either");
    nothing_left(&r, &w);
}

/// What an attempt leaves of its uid in the host's shared dirs (a file in /tmp, a POSIX
/// shared-memory file) is swept when it ends: the next attempt that gets the uid finds nothing.
#[tokio::test]
async fn what_an_attempt_leaves_in_the_shared_dirs_is_swept() {
    if !root() {
        support::skip("without root there is no dedicated uid to sweep");
        return;
    }
    let r = rung(Delegation::None);
    let w = worker("proc-sweep");
    let out = tempfile::tempdir().unwrap();
    let token = format!("stevedore-test-sweep-{:08x}", rand::random::<u32>());
    let script = format!("mkdir /tmp/{token}; echo x > /tmp/{token}/f; echo y > /dev/shm/{token}; id -u");
    let o = run(&r, &sh(&w, &out.path().join("o"), &script)).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert!(o.evidence.notes.iter().all(|n| !n.contains("still holds")), "{:?}", o.evidence.notes);
    for left in [format!("/tmp/{token}"), format!("/dev/shm/{token}")] {
        assert!(!Path::new(&left).exists(), "{left} is left behind");
    }
    nothing_left(&r, &w);
}

/// One fixed uid (as `run_as` names it): attempts take turns, a second one in flight is
/// refused, saying how to run them side by side; with sharing allowed they run at once, the
/// evidence says they are not isolated from each other, and the rung's level is `none`.
#[tokio::test]
async fn one_fixed_uid_takes_turns_unless_sharing_is_allowed() {
    if !root() {
        support::skip("needs root to run as a fixed uid");
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let cfg = |share: bool| {
        ProcessConfig::default()
            .cgroup(Delegation::None)
            .worker_exe(BIN)
            .base_dir(base.path())
            .log_dir(support::test_logs())
            .run_as(65534, 65534)
            .share_uid(share)
    };
    let r = ProcessExecutor::new(cfg(false)).unwrap();
    assert_eq!(r.level(), Level::Process);
    let w = worker("proc-turns");
    let out = tempfile::tempdir().unwrap();
    let mut first = sh(&w, &out.path().join("a"), "echo ready; exec sleep 120");
    let mut watch = support::watch([&mut first]);
    let cancel = CancellationToken::new();
    let mut running = tokio::spawn({
        let (r, first, cancel) = (r.clone(), first.clone(), cancel.clone());
        async move { r.run(&first, cancel).await }
    });
    watch.until_or_end("ready", &mut running).await;
    let err = r.run(&sh(&w, &out.path().join("b"), "true"), CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, stevedore::LaunchError::AdmissionRefused(_)), "{err}");
    assert!(err.to_string().contains("share_uid"), "{err}");
    cancel.cancel();
    running.await.unwrap().unwrap();
    let o = run(&r, &sh(&w, &out.path().join("c"), "id -u")).await;
    assert_eq!(stdout_of(&o).trim(), "65534", "its turn came");
    assert!(o.evidence.enforcement["between_attempts"].contains("one attempt at a time"), "{:?}", o.evidence);
    nothing_left(&r, &w);

    let shared = ProcessExecutor::new(cfg(true)).unwrap();
    assert_eq!(shared.level(), Level::None, "not counted as isolating attempts");
    let (d, e) =
        (sh(&w, &out.path().join("d"), "sleep 0.2; echo a"), sh(&w, &out.path().join("e"), "sleep 0.2; echo b"));
    let (a, b) = tokio::join!(shared.run(&d, CancellationToken::new()), shared.run(&e, CancellationToken::new()));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!((a.status, b.status), (Status::Ok, Status::Ok));
    assert!(
        a.evidence.skipped["between_attempts"].contains("can signal, ptrace and read each other"),
        "{:?}",
        a.evidence
    );
    nothing_left(&shared, &w);
}

/// Issue 41, 4: the process rung's `reclaim` matched attempts by the worker id cut to 40
/// characters, while ids may be 128: a worker sharing the first 40 characters of another's id
/// reclaimed that worker's live attempt (its init killed, its dir removed). Each attempt's
/// name now carries a hash of the whole id.
#[tokio::test]
async fn workers_sharing_their_first_40_characters_never_reclaim_each_others_attempts() {
    if !root() {
        support::skip("needs root: without it one uid runs one attempt at a time");
        return;
    }
    let stem = format!("{}{}", worker("same40"), "x".repeat(40))[..40].to_owned();
    let (a, b) = (format!("{stem}-a"), format!("{stem}-b"));
    let dir = tempfile::tempdir().unwrap();
    let (out, cp) = (dir.path().join("out"), dir.path().join("cp.json"));
    // A's attempt, left running within its host-loss grace by a worker that died.
    let script = r#"echo "ready $TMPDIR" >&2; sleep 300"#;
    let (worker_process, scratch) = crate::recover::start_process_worker(&a, &out, &cp, script);
    support::kill9(worker_process);
    let r = rung(Delegation::Auto);
    let report = r.reclaim(&b).await.unwrap();
    assert!(report.paths_removed.is_empty(), "b took a's attempt: {report:?}");
    assert!(scratch.exists(), "a's attempt is still there");
    let report = r.reclaim(&a).await.unwrap();
    assert_eq!(report.paths_removed.len(), 1, "{report:?}");
    assert!(!scratch.exists());
    nothing_left(&r, &a);
}
