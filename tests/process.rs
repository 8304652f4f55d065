//! The process rung on this machine: a child process under a dedicated uid (when the tests
//! run as root, as in CI), supervised by the real init, with a cgroup of its own when one
//! can be made. Statuses, usage, isolation, cleanup, handlers, hooks and the registry.

mod support;

use std::os::unix::fs::MetadataExt;
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
    let cfg = ProcessConfig::default().cgroup(cg).worker_exe(BIN);
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
    let lines: Vec<String> = stdout_of(&o).lines().map(str::to_owned).collect();
    if root() {
        assert_eq!(&lines[..2], ["65534", "65534"]);
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
}

#[tokio::test]
async fn with_a_cgroup_usage_is_the_kernels_and_an_oom_kill_is_seen() {
    if !root() {
        eprintln!("SKIP: cgroups per attempt need root");
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
    let r = rung(Delegation::Auto);
    let report = r.reclaim(&w).await.unwrap();
    assert_eq!(report.paths_removed.len(), 1, "{report:?}");
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "the command {pid} was stopped");
    nothing_left(&r, &w);
}
