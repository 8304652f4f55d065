//! A small job engine on stevedore: a queue of jobs, a registry of two rungs (in-process and
//! container), up to 4 attempts in flight, and retries driven by `Outcome::next()` and
//! `LaunchError::next()`. It prints one line per attempt and a summary table, and exits 1 when
//! a job did not end as expected or when the engine holds anything of its worker afterwards.
//!
//! ```sh
//! cargo run --example job_engine
//! ```
//!
//! Needs a Docker-API engine (nothing is pulled) and Debian's static `/bin/busybox`: the
//! image `stevedore-test/busybox:latest` is built `FROM scratch` from it when missing.

#[path = "common/mod.rs"]
mod common;
use common::{BUSYBOX_IMAGE, build_busybox, leftovers};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stevedore::{
    CancellationToken, ContainerConfig, ContainerExecutor, InProcessExecutor, LaunchError, Level, Next, Outcome,
    Policy, Registry, Request, Stream,
};
use tokio::sync::Semaphore;

/// Attempts in flight at once, over both rungs.
const IN_FLIGHT: usize = 4;
/// Attempts that count against retries (`Next::Retry`) a job may spend.
const MAX_ATTEMPTS: u32 = 3;
/// Times a job may be requeued (`Next::Requeue`: it never ran) before the engine gives up.
const MAX_REQUEUES: u32 = 3;
/// What a `cancel` job prints once it runs; the engine cancels it on seeing the word.
const STARTED: &str = "started";

/// What a job runs.
#[derive(Debug, Clone)]
enum Work {
    /// `sh -c SCRIPT` in the busybox image.
    Shell(&'static str),
    /// A plain command, as argv.
    Argv(&'static [&'static str]),
    /// A built-in handler with a payload.
    Handler(&'static str, &'static str),
}

/// A check of a job's final outcome and its output dir.
type Check = fn(&Outcome, &Path) -> Result<(), String>;

/// A live-output channel: the request's end and the engine's.
type Watch = (stevedore::LiveOutput, tokio::sync::mpsc::Receiver<stevedore::LiveChunk>);

/// One job of the queue, with the end it is expected to reach.
#[derive(Debug)]
struct Job {
    id: &'static str,
    /// The isolation the job needs: the registry picks the rung from it.
    level: Level,
    work: Work,
    memory: Option<u64>,
    timeout: Option<Duration>,
    /// Stage the engine's input dir at `/in`.
    inputs: bool,
    /// Cancel the attempt once it printed [`STARTED`].
    cancel_after_start: bool,
    /// Final status word, reason word and number of attempts expected.
    expect: (&'static str, &'static str, u32),
    /// A check of the final attempt's outputs.
    check: Option<Check>,
}

impl Job {
    fn new(id: &'static str, level: Level, work: Work, expect: (&'static str, &'static str, u32)) -> Self {
        Job {
            id,
            level,
            work,
            memory: None,
            timeout: None,
            inputs: false,
            cancel_after_start: false,
            expect,
            check: None,
        }
    }
}

fn queue() -> Vec<Job> {
    use Level::{None as InProcess, Sandboxed, Vm};
    vec![
        Job {
            check: Some(|_, out| expect_file(&out.join("hello.txt"), "hello from a container\n")),
            ..Job::new(
                "hello",
                Sandboxed,
                Work::Shell("echo 'hello from a container' > /out/hello.txt"),
                ("ok", "-", 1),
            )
        },
        Job {
            inputs: true,
            check: Some(check_sums),
            ..Job::new("checksums", Sandboxed, Work::Shell("cd /in && sha256sum * > /out/sums.txt"), ("ok", "-", 1))
        },
        Job {
            check: Some(|_, out| expect_file(&out.join("flaky.txt"), "made it on attempt 3\n")),
            ..Job::new(
                "flaky-command",
                Sandboxed,
                Work::Shell(
                    "[ \"$STEVEDORE_ATTEMPT\" -ge 3 ] || { echo \"attempt $STEVEDORE_ATTEMPT: not yet\" >&2; exit 1; }; \
                     echo \"made it on attempt $STEVEDORE_ATTEMPT\" > /out/flaky.txt",
                ),
                ("ok", "-", 3),
            )
        },
        Job {
            cancel_after_start: true,
            ..Job::new("cancelled", Sandboxed, Work::Shell("echo started; sleep 60"), ("killed", "cancelled", 1))
        },
        Job {
            timeout: Some(Duration::from_millis(1500)),
            ..Job::new("too-slow", Sandboxed, Work::Shell("sleep 60"), ("timeout", "deadline", MAX_ATTEMPTS))
        },
        Job {
            // One 128 MiB buffer under a 32 MiB limit: the kernel's OOM killer ends it at once
            // (a buffer grown a page at a time can make cgroup v1 reclaim for a long while).
            memory: Some(32 << 20),
            ..Job::new(
                "memory-hog",
                Sandboxed,
                Work::Shell("dd if=/dev/zero of=/dev/null bs=128M count=1"),
                ("oom_killed", "oom", MAX_ATTEMPTS),
            )
        },
        Job::new(
            "missing-program",
            Sandboxed,
            Work::Argv(&["/no/such/program", "--help"]),
            ("launch_failed", "command_not_found", 1),
        ),
        Job {
            check: Some(|_, out| expect_file(&out.join("payload"), "hello from the in-process rung")),
            ..Job::new(
                "echo-handler",
                InProcess,
                Work::Handler("echo", "hello from the in-process rung"),
                ("ok", "-", 1),
            )
        },
        Job::new(
            "failing-handler",
            InProcess,
            Work::Handler("fail", "the database is down"),
            ("handler_error", "-", MAX_ATTEMPTS),
        ),
        Job::new("command-at-level-none", InProcess, Work::Argv(&["true"]), ("launch_error", "not_allowed", 1)),
        Job::new("needs-a-vm", Vm, Work::Handler("true", ""), ("no_rung", "unsatisfiable", 0)),
    ]
}

/// The end of one job, for the table.
#[derive(Debug)]
struct Done {
    job: &'static str,
    rung: String,
    attempts: u32,
    status: String,
    reason: String,
    next: String,
    /// What did not match the expectation, if anything.
    problems: Vec<String>,
}

/// What every job task shares.
struct Engine {
    registry: Registry,
    slots: Semaphore,
    worker: String,
    out: PathBuf,
    input_dir: PathBuf,
    started: Instant,
}

fn main() -> ExitCode {
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    match rt.block_on(run()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("job_engine: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool, String> {
    let started = Instant::now();
    let worker = format!("example-jobs-{:08x}", rand::random::<u32>());
    let scratch = tempfile::tempdir().map_err(|e| format!("a scratch dir: {e}"))?;
    let input_dir = scratch.path().join("in");
    std::fs::create_dir_all(&input_dir).map_err(|e| format!("the input dir: {e}"))?;
    std::fs::write(input_dir.join("a.txt"), b"alpha\n").map_err(|e| e.to_string())?;
    std::fs::write(input_dir.join("b.txt"), b"beta\n").map_err(|e| e.to_string())?;

    // The rungs. Captures go to the scratch dir, so nothing of this run stays on the host.
    let config = ContainerConfig::default().log_dir(scratch.path().join("logs"));
    let docker_rung = Arc::new(
        ContainerExecutor::connect(config).await.map_err(|e| format!("no engine: {}", stevedore::error_chain(&e)))?,
    );
    let docker = common::raw_docker().await?;
    build_busybox(&docker, docker_rung.engine()).await?;
    let in_process =
        InProcessExecutor::new(stevedore::handlers::builtin(), stevedore::contract::incarnation::current());
    let mut registry = Registry::new();
    // The first registered is the default: the one level `none` selects.
    registry.register(Arc::new(in_process)).map_err(|e| e.to_string())?;
    registry.register(docker_rung.clone()).map_err(|e| e.to_string())?;
    for rung in registry.rungs() {
        match rung.reclaim(&worker).await {
            Ok(r) => {
                let n = r.containers_removed.len() + r.volumes_removed.len() + r.paths_removed.len();
                println!("reclaim {} on {}: {n} leftovers removed", worker, rung.name());
            }
            Err(e) => println!("reclaim {} on {}: {e} (going on)", worker, rung.name()),
        }
    }

    let engine = Arc::new(Engine {
        registry,
        slots: Semaphore::new(IN_FLIGHT),
        worker: worker.clone(),
        out: scratch.path().join("out"),
        input_dir,
        started,
    });
    let jobs = queue();
    println!("{} jobs, up to {IN_FLIGHT} attempts in flight, worker {worker}", jobs.len());
    let mut tasks = tokio::task::JoinSet::new();
    for (i, job) in jobs.into_iter().enumerate() {
        let engine = engine.clone();
        tasks.spawn(async move { (i, run_job(&engine, job).await) });
    }
    let mut done = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        done.push(joined.map_err(|e| format!("a job task failed: {e}"))?);
    }
    done.sort_by_key(|(i, _)| *i);
    let done: Vec<Done> = done.into_iter().map(|(_, d)| d).collect();

    for rung in engine.registry.rungs() {
        rung.close().await;
    }
    let leftovers = leftovers(&docker, &worker).await?;

    print_table(&done);
    let mut ok = true;
    for d in &done {
        for p in &d.problems {
            println!("MISMATCH {}: {p}", d.job);
            ok = false;
        }
    }
    if !leftovers.is_empty() {
        println!("LEFT BEHIND in the engine for {worker}: {}", leftovers.join(", "));
        ok = false;
    }
    let secs = started.elapsed().as_secs_f64();
    if ok {
        println!("all {} jobs ended as expected; nothing left in the engine ({secs:.1} s)", done.len());
    } else {
        println!("FAILED ({secs:.1} s)");
    }
    Ok(ok)
}

/// Runs one job to its end: selects its rung, runs attempts until `next()` says done or give
/// up, or its retries run out.
async fn run_job(engine: &Engine, job: Job) -> Done {
    let policy = Policy::at_least(job.level).with_grace(Duration::from_secs(1));
    let mut done = Done {
        job: job.id,
        rung: "-".into(),
        attempts: 0,
        status: String::new(),
        reason: "-".into(),
        next: "-".into(),
        problems: Vec::new(),
    };
    let rung = match engine.registry.select(&policy) {
        Ok(rung) => rung,
        Err(e) => {
            println!("[{:5.1}s] {:<22} not run: {e}", engine.started.elapsed().as_secs_f64(), job.id);
            done.status = "no_rung".into();
            done.reason = "unsatisfiable".into();
            done.next = next_word(Next::GiveUp).to_owned();
            return judge(done, &job, None, None);
        }
    };
    done.rung = rung.name().to_owned();
    let (mut spent, mut requeues) = (0, 0);
    let (result, out) = loop {
        done.attempts += 1;
        let attempt = done.attempts;
        let out = engine.out.join(job.id).join(attempt.to_string());
        // Wait for a slot first: a deadline runs from when the attempt is built.
        let slot = engine.slots.acquire().await.expect("the semaphore is never closed");
        let (mut req, cancel, watcher) = request(engine, &job, &policy, attempt, &out);
        if let Some(w) = &watcher {
            req.live = Some(w.0.clone());
        }
        let watcher = watcher.map(|(_, rx)| tokio::spawn(cancel_on_start(rx, cancel.clone())));
        let result = rung.run(&req, cancel).await;
        drop(slot);
        if let Some(w) = watcher {
            w.abort();
        }
        let next = match &result {
            Ok(o) => o.next(),
            Err(e) => e.next(),
        };
        let (status, reason) = match &result {
            Ok(o) => (o.status.to_string(), o.reason.map_or("-".into(), |r| r.to_string())),
            Err(e) => ("launch_error".to_owned(), launch_word(e).to_owned()),
        };
        let counted = matches!(&result, Ok(o) if o.status.counts_against_retries());
        spent += u32::from(counted);
        // What the engine does: the rung's advice, within the job's budget.
        let (verdict, again) = match next {
            Next::Done => ("done", false),
            Next::GiveUp => ("give up", false),
            Next::Retry if spent < MAX_ATTEMPTS => ("retry", true),
            Next::Retry => ("retry, but no retries left: give up", false),
            Next::Requeue if requeues < MAX_REQUEUES => ("requeue", true),
            Next::Requeue => ("requeue, but requeued too often: give up", false),
            _ => ("unknown advice: give up", false),
        };
        requeues += u32::from(matches!(next, Next::Requeue));
        let why = match &result {
            Err(e) => format!(": {}", stevedore::error_chain(e)),
            Ok(o) if !o.handler_error.is_empty() => format!(": {}", first_line(&o.handler_error)),
            Ok(_) => String::new(),
        };
        println!(
            "[{:5.1}s] {:<22} #{attempt} on {:<9} {status} ({reason}){why} -> {verdict}",
            engine.started.elapsed().as_secs_f64(),
            job.id,
            rung.name()
        );
        done.status = status;
        done.reason = reason;
        done.next = next_word(next).to_owned();
        if !again {
            break (result, out);
        }
        tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
    };
    judge(done, &job, result.ok().as_ref(), Some(&out))
}

/// The request of one attempt, its cancellation token, and for a job cancelled after its
/// start the live output it is watched through.
fn request(
    engine: &Engine,
    job: &Job,
    policy: &Policy,
    attempt: u32,
    out: &Path,
) -> (Request, CancellationToken, Option<Watch>) {
    let mut req = match &job.work {
        Work::Shell(script) => Request::command(job.id, ["sh", "-c", script], out),
        Work::Argv(argv) => Request::command(job.id, argv.iter().copied(), out),
        Work::Handler(name, payload) => Request::handler(job.id, *name, out).payload(payload.as_bytes()),
    };
    req = req.policy(policy.clone()).worker(&engine.worker).attempt(attempt);
    if matches!(job.work, Work::Shell(_) | Work::Argv(_)) {
        req = req.image(BUSYBOX_IMAGE);
    }
    if let Some(m) = job.memory {
        req = req.memory(m);
    }
    if let Some(t) = job.timeout {
        req = req.timeout(t);
    }
    if job.inputs {
        req = req.input_dir(&engine.input_dir);
    }
    let watch = job.cancel_after_start.then(|| stevedore::LiveOutput::channel(64));
    (req, CancellationToken::new(), watch)
}

/// Cancels `cancel` once the command's stdout says [`STARTED`].
async fn cancel_on_start(mut rx: tokio::sync::mpsc::Receiver<stevedore::LiveChunk>, cancel: CancellationToken) {
    let mut seen = String::new();
    while let Some(chunk) = rx.recv().await {
        if chunk.stream == Stream::Stdout {
            seen.push_str(&String::from_utf8_lossy(&chunk.bytes));
            if seen.contains(STARTED) {
                cancel.cancel();
                return;
            }
        }
    }
}

/// A word for the rung's advice in the table.
fn next_word(next: Next) -> &'static str {
    match next {
        Next::Done => "done",
        Next::Retry => "retry",
        Next::Requeue => "requeue",
        Next::GiveUp => "give_up",
        _ => "unknown",
    }
}

/// A word for a launch error in the table.
fn launch_word(e: &LaunchError) -> &'static str {
    match e {
        LaunchError::InvalidRequest(_) => "invalid_request",
        LaunchError::NotAllowed(_) => "not_allowed",
        LaunchError::ImageUnavailable { .. } => "image_unavailable",
        LaunchError::CancelledBeforeStart => "cancelled_before_start",
        LaunchError::Closed(_) => "closed",
        _ => "other",
    }
}

/// Compares the job's end with what was expected, and runs its output check.
fn judge(mut done: Done, job: &Job, outcome: Option<&Outcome>, out: Option<&Path>) -> Done {
    let (status, reason, attempts) = job.expect;
    if done.status != status || done.reason != reason || done.attempts != attempts {
        done.problems.push(format!(
            "expected {status} ({reason}) after {attempts} attempt(s), got {} ({}) after {}",
            done.status, done.reason, done.attempts
        ));
    }
    if let (Some(check), Some(o), Some(out)) = (job.check, outcome, out)
        && let Err(e) = check(o, out)
    {
        done.problems.push(e);
    }
    done
}

fn expect_file(path: &Path, want: &str) -> Result<(), String> {
    match std::fs::read_to_string(path) {
        Ok(got) if got == want => Ok(()),
        Ok(got) => Err(format!("{} holds {got:?}, expected {want:?}", path.display())),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// `sums.txt` names both inputs with their sha256, and the outcome lists it, hashed.
fn check_sums(o: &Outcome, out: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(out.join("sums.txt")).map_err(|e| format!("sums.txt: {e}"))?;
    for (name, body) in [("a.txt", &b"alpha\n"[..]), ("b.txt", b"beta\n")] {
        let h = stevedore::hash_reader(body, 0).map_err(|e| e.to_string())?;
        let line = format!("{}  {name}", h.hash.trim_start_matches("sha256:"));
        if !text.lines().any(|l| l == line) {
            return Err(format!("sums.txt lacks {line:?}: {text:?}"));
        }
    }
    let listed = o.outputs.iter().find(|f| f.name == "sums.txt").ok_or("the outcome does not list sums.txt")?;
    let on_disk = stevedore::hash_reader(text.as_bytes(), 0).map_err(|e| e.to_string())?;
    if listed.hash != on_disk.hash {
        return Err(format!("sums.txt listed as {}, is {}", listed.hash, on_disk.hash));
    }
    Ok(())
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

fn print_table(done: &[Done]) {
    let head = ["job", "rung", "attempts", "final status", "reason", "next"];
    let rows: Vec<[String; 6]> = done
        .iter()
        .map(|d| {
            let mark = if d.problems.is_empty() { "" } else { " (!)" };
            [
                format!("{}{mark}", d.job),
                d.rung.clone(),
                d.attempts.to_string(),
                d.status.clone(),
                d.reason.clone(),
                d.next.clone(),
            ]
        })
        .collect();
    let mut width = head.map(str::len);
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: [&str; 6]| {
        let padded: Vec<String> = cells.iter().zip(width).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("  {}", padded.join("  ").trim_end());
    };
    println!();
    line(head);
    line(width.map(|w| "-".repeat(w)).each_ref().map(String::as_str));
    for row in &rows {
        line(row.each_ref().map(String::as_str));
    }
    println!("  (next: the last attempt's advice; \"retry\" with no retries left means the engine gave up)");
    println!();
}
