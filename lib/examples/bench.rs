//! The benchmark of stevedore: what one attempt costs against the bare engine, how many
//! attempts per second it sustains, how fast it collects and hashes outputs, how much memory
//! the host process holds meanwhile, and how fast it reclaims leaked containers.
//!
//! It prints medians (with p10/p90) and ratios, letter by letter, then one summary table with
//! the targets, each marked met or not met. A slow figure never fails it: it exits non-zero
//! only when it cannot run (no engine, no build, no image, an attempt that does not run).
//!
//! ```sh
//! cargo build --release                             # (d) packs target/release/stevedore
//! cargo run --release --example bench               # full: about 5 to 10 minutes
//! cargo run --release --example bench -- --short    # short (CI): well under 2 minutes
//! STEVEDORE_BENCH=short cargo run --release --example bench
//! ```
//!
//! `STEVEDORE_LOG=stevedore=debug` shows the time of every engine call stevedore makes.
//! `STEVEDORE_BENCH_ONLY=g` (or `e`, `h`, `k`, `gh`, ...) runs only those letters (the warm
//! pool against (b), the outputs, the timeline), in the chosen mode, with their summary.
//! `STEVEDORE_BENCH_READ_AHEAD=off` parks containers whose init reads nothing ahead
//! (`PoolConfig::read_ahead`), to compare.
//!
//! # What each letter measures
//! Every container runs `stevedore-test/busybox:latest`, built here from Debian's static
//! `/bin/busybox` when missing, exactly as the integration tests build it (same tag, same
//! labels: the two share it).
//!
//! - **(a)** the raw engine sequence of a trivial container through bollard: create, start,
//!   wait, remove of `true` with network none and stevedore's hardening flags (read-only
//!   rootfs, all capabilities dropped, no-new-privileges, user 65532, log driver none).
//! - **(b)** `docker run --rm` (the CLI) of the same container, same flags.
//! - **(c)** one stevedore attempt of the plain command `true` ([`Executor::run`]), with
//!   everything an attempt does (init, `/out` and `/tmp` tmpfs, limits, captures, record),
//!   as a job engine runs it: the Outcome returned before the container's removal, which
//!   runs on the rung's tasks (`background_cleanup`; `close` waits for it). "(c), removal
//!   awaited" is the same with the removal inside the timed call (the default), which (f)
//!   uses.
//!   **(c')** is (c) with a small input dir (4 files, 16 KiB) staged at `/in` (over the link
//!   where the rung can: `docs/outcome.md`, "Inputs over the link"), the removal not awaited.
//! - **(d)** the handler `true` through the re-exec path: this build's `stevedore` binary
//!   (`target/release/stevedore`) packed as a `FROM scratch` worker image labelled with the
//!   fingerprint of `handlers::builtin()`, under the tag and labels `stevedore run --handler`
//!   uses (so an image that command already packed is reused).
//! - **(e)** an attempt from a warm pool ([`WARM_POOL`] parked containers), without and with
//!   small inputs; the summary says how many were served warm (a miss runs cold). Then the
//!   warm path's profile: the median of each phase the evidence carries (prepared, inputs
//!   staged, claimed, Start sent, command started, record, outputs end, concluded) and what
//!   each step adds.
//! - **(j)** the command as people run it: `stevedore run --image … --output DIR -- true` as
//!   a whole process against `docker run --rm` of the same, in pairs, alternating which goes
//!   first.
//! - **(f)** sustained throughput with 1, 2, 4 and 8 in flight: attempts per second of (a)
//!   and (c) (and (e) with the small inputs), in ABBA order per level, and the ratio to (a). After them the bench
//!   checks that every warm attempt ran in a container of its own and that the pool made
//!   exactly one fill per container taken (its refills are paid inside the run, none ahead
//!   of it), and says how many times the pool turned over.
//! - **(g)** collecting outputs: a command writing 1 GiB in 1,000 files, and one writing
//!   1 GiB in one file (`head -c` from `/dev/zero`): the attempt's wall time and implied
//!   MB/s, and how much of it the command itself took (by the init's clock). Then the
//!   extracted files are hashed on the host by `sha256sum` (the CLI) and by
//!   `stevedore::hash_reader` in-process, one thread each, alternately: MB/s per
//!   core (per CPU-second of the hashing thread or process, which other load on the machine
//!   barely changes; MB/s by wall time too) and the ratio. stevedore's own hashing of the
//!   outputs is already inside the attempt's time.
//!   First the two ceilings the collection cannot beat on this engine: a raw attach stream
//!   (bollard) of the same size of zeros in the busybox image, read and discarded (MB/s from
//!   its first byte to its end; written by `head -c`, in 4 KiB writes, and by `dd bs=1M`:
//!   the better is the transport's), and in-process sha256 alone (MB/s per CPU-second of one
//!   thread, 1 MiB updates; the backend is named). Each layout's collection
//!   (the outcome's `collection.elapsed_ms`: the record's arrival to the outputs extracted
//!   and hashed) is compared with 50 % of the lower ceiling.
//! - **(h)** the host RSS (`VmRSS` sampled every 5 ms, `VmHWM` reset just before) while one
//!   attempt collects 4 GiB of outputs and 1 GiB of stdout. The capture keeps 4 MiB (the
//!   default cap) but the whole stream is drained and counted.
//! - **(i)** `reclaim(worker)` of 200 leaked containers (one in ten running, the rest only
//!   created) against a raw parallel removal (8 at once, bollard `remove_container` with
//!   force) of 200 identical ones.
//! - **(k)** what the resource timeline costs an attempt: the CPU its cgroup counted (the
//!   init's sampling included) for `sleep 5` with the timeline (10 Hz) and without
//!   (`LinkConfig::timeline_period = None`), alternating; the difference as a share of one CPU
//!   over the attempt's wall time.
//!
//! Short mode (`--short`, or `STEVEDORE_BENCH=short`): fewer rounds and attempts, (g) of
//! 128 MiB, (h) of 512 MiB + 128 MiB, (i) of 30 containers per set. Every letter still prints.
//!
//! # Honest timing
//! `Instant` is taken around exactly the compared operation, never its setup. (a), (b), (c),
//! (c') and (d) run in rounds, one of each per round, in an order that rotates every round,
//! after a warm-up round that is not counted; the throughput levels and (i) (two sets per
//! side) run in ABBA order.
//! Medians are reported; ratios are ratios of medians. MB is 10^6 bytes; MiB and GiB are
//! 2^20 and 2^30.
//!
//! # What it leaves
//! Every container and volume it creates (also those of (a), (b) and (i)) carries the labels
//! of a worker `bench-<random>`; before exiting, on error paths and after Ctrl-C too, it
//! reclaims them, sweeps what is left by label, checks with `docker ps -a --filter
//! label=dev.stevedore.worker=...` and prints `leftovers: N`. The worker image is removed
//! too when this run packed it (never forced). It keeps the busybox image (shared with the
//! tests) and stevedore's shared tools volume, and never removes anything it did not create.

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptions, ListContainersOptionsBuilder, ListVolumesOptionsBuilder,
    RemoveContainerOptionsBuilder, RemoveVolumeOptions, StartContainerOptions, WaitContainerOptions,
};
use futures_util::StreamExt;
use nix::sys::resource::{UsageWho, getrusage};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use stevedore::container::labels::{KIND, MANAGED, WORKER};
use stevedore::{
    CancellationToken, ContainerConfig, ContainerExecutor, Executor, Outcome, OutputFile, Request, Status,
};

/// What makes the benchmark unable to run (or one of its measurements).
type Res<T> = Result<T, String>;

/// The shared busybox test image (the integration tests build the same).
const BUSYBOX_IMAGE: &str = "stevedore-test/busybox:latest";
/// The label every test image carries.
const TEST_LABEL: &str = "dev.stevedore.test";
/// The label saying which `/bin/busybox` the test image holds.
const BUSYBOX_SHA_LABEL: &str = "dev.stevedore.test.busybox_sha256";
/// Debian's static busybox (`busybox-static`).
const BUSYBOX: &str = "/bin/busybox";
/// The sandbox user stevedore uses by default.
const USER: &str = "65532:65532";
/// Parallel engine calls when setting up (and in the raw removal of (i)).
const PARALLEL: usize = 8;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("STEVEDORE_LOG").unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let mode = match Mode::from_args() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(mode)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: cannot run: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------
// Modes
// ---------------------------------------------------------------------------------------

/// How much of everything to do.
#[derive(Debug, Clone, Copy)]
struct Mode {
    /// `full` or `short`.
    name: &'static str,
    /// Rounds of (a)/(b)/(c)/(c')/(d), one of each per round.
    rounds: usize,
    /// Attempts per kind and throughput level (at least twice the level, for ABBA halves).
    per_level: usize,
    /// (g): bytes written in each of the two layouts, and the file count of the first.
    g_bytes: u64,
    g_files: usize,
    /// (g): alternating repetitions of `sha256sum` and `hash_reader`.
    hash_reps: usize,
    /// (h): bytes of outputs (in 4 files) and of stdout.
    h_outputs: u64,
    h_logs: u64,
    /// (i): leaked containers per set, and sets per side (1: reclaim then raw; 2: ABBA).
    leaks: usize,
    leak_rounds: usize,
    /// (j): pairs of whole processes, `stevedore run` and `docker run --rm`, alternating.
    command_pairs: usize,
}

impl Mode {
    const FULL: Mode = Mode {
        name: "full",
        rounds: 25,
        per_level: 24,
        g_bytes: GIB,
        g_files: 1000,
        hash_reps: 3,
        h_outputs: 4 * GIB,
        h_logs: GIB,
        leaks: 200,
        leak_rounds: 2,
        command_pairs: 16,
    };
    const SHORT: Mode = Mode {
        name: "short",
        rounds: 5,
        per_level: 4,
        g_bytes: 128 * MIB,
        g_files: 1000,
        hash_reps: 3,
        h_outputs: 512 * MIB,
        h_logs: 128 * MIB,
        leaks: 30,
        leak_rounds: 2,
        command_pairs: 4,
    };

    /// `--short` / `--full`, else `STEVEDORE_BENCH=short|full`, else full.
    fn from_args() -> Res<Mode> {
        let mut mode = match std::env::var("STEVEDORE_BENCH").as_deref() {
            Ok("short") => Mode::SHORT,
            Ok("full") | Ok("") | Err(_) => Mode::FULL,
            Ok(other) => return Err(format!("STEVEDORE_BENCH={other:?}: expected short or full")),
        };
        for arg in std::env::args().skip(1) {
            match arg.as_str() {
                "--short" => mode = Mode::SHORT,
                "--full" => mode = Mode::FULL,
                "-h" | "--help" => {
                    println!("usage: cargo run --release --example bench [-- --short|--full]  (see the file's docs)");
                    std::process::exit(0);
                }
                other => return Err(format!("unknown argument {other:?} (expected --short or --full)")),
            }
        }
        Ok(mode)
    }
}

// ---------------------------------------------------------------------------------------
// The bench's state
// ---------------------------------------------------------------------------------------

/// Everything the measurements share.
struct Bench {
    mode: Mode,
    rung: ContainerExecutor,
    /// The same engine connection, for the raw calls.
    docker: Docker,
    /// The worker ID of everything (a) to (h) create.
    worker: String,
    /// Every worker ID used (cleaned and checked at the end).
    workers: Mutex<Vec<String>>,
    /// The packed worker image of (d), and whether this run packed it (then it removes it).
    worker_image: String,
    worker_image_packed: bool,
    fingerprint: String,
    /// Output dirs and inputs live under here (removed when dropped).
    root: tempfile::TempDir,
    /// A small input dir for (c') and (e).
    small_inputs: PathBuf,
    seq: AtomicU64,
    /// Where stevedore keeps captures (one dir per worker), learnt from an outcome.
    capture_base: Mutex<Option<PathBuf>>,
    /// For each (e) attempt: whether the pool served it (a miss ran cold).
    warm_served: Mutex<Vec<bool>>,
    /// For each (e) attempt served warm: its container and phases, and whether it had inputs.
    warm_seen: Mutex<Vec<(String, bool, stevedore::contract::Phases)>>,
    /// The `stevedore` command of this build ((d) packs it; (j) runs it).
    bin: PathBuf,
}

impl Bench {
    /// A fresh (absent) output dir under the bench's temp dir.
    fn out_dir(&self, tag: &str) -> PathBuf {
        self.root.path().join(format!("{tag}-{}", self.next()))
    }

    fn next(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    fn remember_worker(&self, worker: &str) {
        lock(&self.workers).push(worker.to_owned());
    }

    /// A new worker ID, remembered for the cleanup.
    fn new_worker(&self, tag: &str) -> String {
        let w = format!("{}-{tag}", self.worker);
        self.remember_worker(&w);
        w
    }

    /// A request for `argv` in the busybox image, for this bench's worker.
    fn command(&self, tag: &str, argv: &[&str]) -> Request {
        let job = format!("bench-{tag}-{}", self.next());
        Request::command(job, argv.iter().copied(), self.out_dir(tag)).worker(&self.worker).image(BUSYBOX_IMAGE)
    }

    /// Runs `req` to an `ok` outcome; the time is that of `Executor::run` alone.
    async fn attempt(&self, req: &Request) -> Res<(Duration, Outcome)> {
        let start = Instant::now();
        let outcome = self.rung.run(req, CancellationToken::new()).await;
        let took = start.elapsed();
        let outcome = outcome.map_err(|e| format!("attempt {}: launch error: {}", req.job_id, chain(&e)))?;
        if let Some(base) = outcome.evidence.logs.stdout.path.as_deref().and_then(|p| Path::new(p).parent()?.parent()) {
            lock(&self.capture_base).get_or_insert_with(|| base.to_owned());
        }
        if outcome.status != Status::Ok {
            return Err(format!("attempt {} ended {}: {}", req.job_id, outcome.status, outcome.to_json()));
        }
        Ok((took, outcome))
    }

    /// (a): create, start, wait, remove of `true` through bollard.
    async fn raw_true(&self) -> Res<Duration> {
        let body = hardened(&self.worker, &["true"]);
        let start = Instant::now();
        let id = self
            .docker
            .create_container(None::<CreateContainerOptions>, body)
            .await
            .map_err(|e| format!("(a) create: {}", chain(&e)))?
            .id;
        let ran = async {
            self.docker
                .start_container(&id, None::<StartContainerOptions>)
                .await
                .map_err(|e| format!("(a) start: {}", chain(&e)))?;
            match self.docker.wait_container(&id, None::<WaitContainerOptions>).next().await {
                Some(Ok(r)) if r.status_code == 0 => Ok(()),
                Some(Ok(r)) => Err(format!("(a) `true` exited {}", r.status_code)),
                Some(Err(e)) => Err(format!("(a) wait: {}", chain(&e))),
                None => Err("(a) wait: no answer".to_owned()),
            }
        }
        .await;
        // Removed whatever happened (force: a failed wait may leave it running).
        let removed =
            self.docker.remove_container(&id, Some(RemoveContainerOptionsBuilder::new().force(true).build())).await;
        let took = start.elapsed();
        ran?;
        removed.map_err(|e| format!("(a) remove: {}", chain(&e)))?;
        Ok(took)
    }

    /// (b): `docker run --rm` of the same container.
    async fn cli_true(&self) -> Res<Duration> {
        let mut cmd = tokio::process::Command::new("docker");
        cmd.args(["run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL"]).args([
            "--security-opt",
            "no-new-privileges",
            "--user",
            USER,
            "--log-driver",
            "none",
        ]);
        for (k, v) in labels(&self.worker) {
            cmd.arg("--label").arg(format!("{k}={v}"));
        }
        cmd.args([BUSYBOX_IMAGE, "true"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let start = Instant::now();
        let out = cmd.output().await.map_err(|e| format!("(b) cannot run the docker CLI: {e}"))?;
        let took = start.elapsed();
        if !out.status.success() {
            return Err(format!("(b) docker run: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(took)
    }

    /// (c) and (c'): a stevedore attempt of `true`, without or with the small inputs.
    async fn attempt_true(&self, inputs: bool) -> Res<Duration> {
        let mut req = self.command(if inputs { "cin" } else { "c" }, &["true"]);
        if inputs {
            req = req.input_dir(&self.small_inputs);
        }
        Ok(self.attempt(&req).await?.0)
    }

    /// (c) as a job engine runs it: the Outcome returned before the removal, which runs on
    /// the rung's tasks (`background_cleanup`; `close` waits for it).
    async fn attempt_true_background(&self, inputs: bool) -> Res<Duration> {
        let rung = BACKGROUND
            .get_or_try_init(|| async {
                let mut cfg = ContainerConfig::default();
                cfg.background_cleanup = true;
                ContainerExecutor::connect(cfg).await.map_err(|e| format!("(c) the rung: {}", chain(&e)))
            })
            .await?;
        let mut req = self.command(if inputs { "cin" } else { "cbg" }, &["true"]);
        if inputs {
            req = req.input_dir(&self.small_inputs);
        }
        let start = Instant::now();
        let outcome = rung.run(&req, CancellationToken::new()).await;
        let took = start.elapsed();
        let outcome = outcome.map_err(|e| format!("attempt {}: launch error: {}", req.job_id, chain(&e)))?;
        if outcome.status != Status::Ok {
            return Err(format!("attempt {} ended {}: {}", req.job_id, outcome.status, outcome.to_json()));
        }
        Ok(took)
    }

    /// (d): the handler `true` in the packed worker image (re-exec of the worker binary).
    async fn handler_true(&self) -> Res<Duration> {
        let job = format!("bench-d-{}", self.next());
        let req = Request::handler(job, "true", self.out_dir("d"))
            .worker(&self.worker)
            .image(&self.worker_image)
            .fingerprint(&self.fingerprint);
        Ok(self.attempt(&req).await?.0)
    }
}

/// The rung of (c) whose removals run after the Outcome is returned, made on first use.
static BACKGROUND: tokio::sync::OnceCell<ContainerExecutor> = tokio::sync::OnceCell::const_new();

/// The rung with a warm pool of [`WARM_POOL`] parked containers, made on first use.
static WARM: tokio::sync::OnceCell<ContainerExecutor> = tokio::sync::OnceCell::const_new();
/// Containers the warm rung keeps parked: throughput runs at least 10 × this many attempts
/// per level in the full mode, so refills are paid for.
const WARM_POOL: usize = 4;

async fn warm_rung(b: &Bench) -> Res<&'static ContainerExecutor> {
    WARM.get_or_try_init(|| async {
        let mut cfg = ContainerConfig::default();
        // `STEVEDORE_BENCH_READ_AHEAD=off`: the parked inits read nothing ahead (the A of an A/B).
        let read_ahead = std::env::var("STEVEDORE_BENCH_READ_AHEAD").map_or(true, |v| v != "off");
        cfg.pool = Some(
            stevedore::container::PoolConfig::new(WARM_POOL, b.new_worker("warm"))
                .image(BUSYBOX_IMAGE)
                .read_ahead(read_ahead),
        );
        // Every attempt of the bench asks for the same limits: /tmp of the default size class.
        // A warm attempt's container is removed after its outcome is returned (close waits).
        cfg.background_cleanup = true;
        let rung = ContainerExecutor::connect(cfg).await.map_err(|e| format!("(e) the warm rung: {}", chain(&e)))?;
        if !rung.warm_up(Duration::from_secs(120)).await {
            return Err("(e) the warm pool did not fill within 120 s".to_owned());
        }
        Ok(rung)
    })
    .await
}

/// (e): one attempt of `true` taken from the warm pool, without or with the small inputs
/// (`b.small_inputs`). It waits (untimed) until a container is parked, then times exactly
/// the attempt, as [`Bench::attempt`] does; in a throughput batch that wait is part of the
/// batch's time, so the pool's refills are paid for.
async fn warm_attempt(b: &Bench, small_inputs: bool) -> Res<Option<Duration>> {
    let rung = warm_rung(b).await?;
    let until = Instant::now() + Duration::from_secs(120);
    while rung.parked() == 0 {
        if Instant::now() > until {
            return Err("(e) no container was parked within 120 s".to_owned());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut req = b.command(if small_inputs { "ein" } else { "e" }, &["true"]);
    if small_inputs {
        req = req.input_dir(&b.small_inputs);
    }
    let start = Instant::now();
    let outcome = rung.run(&req, CancellationToken::new()).await;
    let took = start.elapsed();
    let outcome = outcome.map_err(|e| format!("attempt {}: launch error: {}", req.job_id, chain(&e)))?;
    if outcome.status != Status::Ok {
        return Err(format!("attempt {} ended {}: {}", req.job_id, outcome.status, outcome.to_json()));
    }
    lock(&b.warm_served).push(outcome.evidence.warm == Some(true));
    if outcome.evidence.warm == Some(true) {
        let id = outcome.evidence.container_id.clone().unwrap_or_default();
        lock(&b.warm_seen).push((id, small_inputs, outcome.evidence.phases.clone()));
    }
    Ok(Some(took))
}

/// The labels of everything the bench creates: reclaimable objects of `worker`.
fn labels(worker: &str) -> HashMap<String, String> {
    HashMap::from([
        (MANAGED.to_owned(), "true".to_owned()),
        (WORKER.to_owned(), worker.to_owned()),
        (KIND.to_owned(), "attempt".to_owned()),
    ])
}

/// A busybox container running `cmd` with network none and stevedore's hardening flags.
fn hardened(worker: &str, cmd: &[&str]) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(BUSYBOX_IMAGE.to_owned()),
        cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
        user: Some(USER.to_owned()),
        labels: Some(labels(worker)),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            readonly_rootfs: Some(true),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            log_config: Some(HostConfigLogConfig { typ: Some("none".into()), config: None }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The value behind a mutex, even after a panic elsewhere (cleanup must still run).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An error and its sources, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    stevedore::error_chain(e)
}

// ---------------------------------------------------------------------------------------
// Figures
// ---------------------------------------------------------------------------------------

/// Samples of one figure (seconds, or any unit the caller keeps to).
#[derive(Debug, Clone, Default)]
struct Stats(Vec<f64>);

impl Stats {
    fn push(&mut self, x: f64) {
        self.0.push(x);
    }

    fn sorted(&self) -> Vec<f64> {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        v
    }

    fn median(&self) -> f64 {
        let v = self.sorted();
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    /// The nearest-rank percentile `q` (0..1).
    fn pct(&self, q: f64) -> f64 {
        let v = self.sorted();
        if v.is_empty() {
            return f64::NAN;
        }
        let rank = (q * v.len() as f64).ceil() as usize;
        v[rank.clamp(1, v.len()) - 1]
    }

    /// `median X (p10 Y, p90 Z; n=N)` of durations in seconds.
    fn times(&self) -> String {
        format!(
            "median {} (p10 {}, p90 {}; n={})",
            secs(self.median()),
            secs(self.pct(0.1)),
            secs(self.pct(0.9)),
            self.0.len()
        )
    }
}

/// A duration in seconds, in ms below 10 s.
fn secs(s: f64) -> String {
    if s.is_nan() {
        "-".into()
    } else if s < 10.0 {
        format!("{:.1} ms", s * 1000.0)
    } else {
        format!("{s:.2} s")
    }
}

/// Bytes per second as MB/s (10^6 bytes).
fn mbps(bytes: u64, s: f64) -> f64 {
    bytes as f64 / 1e6 / s
}

/// A byte count in MiB or GiB.
fn size(bytes: u64) -> String {
    if bytes >= GIB && bytes.is_multiple_of(GIB) {
        format!("{} GiB", bytes / GIB)
    } else {
        format!("{} MiB", bytes / MIB)
    }
}

/// One line of the summary table.
struct Row {
    figure: String,
    median: String,
    reference: String,
    ratio: Option<f64>,
    target: String,
    /// `None`: no target, or not measured.
    met: Option<bool>,
    note: &'static str,
}

impl Row {
    fn info(
        figure: impl Into<String>,
        median: impl Into<String>,
        reference: impl Into<String>,
        ratio: Option<f64>,
    ) -> Row {
        Row {
            figure: figure.into(),
            median: median.into(),
            reference: reference.into(),
            ratio,
            target: String::new(),
            met: None,
            note: "",
        }
    }

    fn target(mut self, target: impl Into<String>, met: Option<bool>) -> Row {
        self.target = target.into();
        self.met = met;
        self.note = match met {
            Some(true) => "met",
            Some(false) => "not met",
            None => "not measured",
        };
        self
    }
}

fn print_summary(rows: &[Row]) {
    let head = ["figure", "median", "reference", "ratio", "target", "met?"];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.figure.clone(),
                r.median.clone(),
                r.reference.clone(),
                // Three decimals: a ratio just under its target must not print as the target.
                r.ratio.map_or("-".into(), |x| format!("{x:.3}")),
                if r.target.is_empty() { "-".into() } else { r.target.clone() },
                r.note.to_owned(),
            ]
        })
        .collect();
    let mut width = head.map(str::len);
    for c in &cells {
        for (w, s) in width.iter_mut().zip(c) {
            *w = (*w).max(s.chars().count());
        }
    }
    let line = |c: &[String]| {
        let mut s = String::new();
        for (i, (cell, w)) in c.iter().zip(width).enumerate() {
            let pad = w.saturating_sub(cell.chars().count());
            if i == 1 || i == 3 {
                s.push_str(&" ".repeat(pad));
                s.push_str(cell);
            } else {
                s.push_str(cell);
                s.push_str(&" ".repeat(pad));
            }
            s.push_str("  ");
        }
        println!("{}", s.trim_end());
    };
    println!();
    println!(
        "summary ({} rows; ratios against the reference's median; targets are the issue's, never enforced)",
        rows.len()
    );
    line(&head.map(str::to_owned));
    line(&width.map(|w| "-".repeat(w)));
    for c in &cells {
        line(c);
    }
}

// ---------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------

async fn run(mode: Mode) -> Res<()> {
    let began = Instant::now();
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate this executable: {e}"))?;
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("stevedore"))
        .ok_or_else(|| format!("{} has no grandparent dir", exe.display()))?;
    if !bin.is_file() {
        return Err(format!(
            "the worker binary {} is missing: run `cargo build --release` first (examples do not build it)",
            bin.display()
        ));
    }
    let rung = ContainerExecutor::connect(ContainerConfig::default())
        .await
        .map_err(|e| format!("no engine: {}", chain(&e)))?;
    let docker = Docker::connect_with_defaults().map_err(|e| format!("no engine: {e}"))?;
    let docker = docker.negotiate_version().await.map_err(|e| format!("no engine: {e}"))?;
    let worker = format!("bench-{:08x}", rand::random::<u32>());
    let root = tempfile::Builder::new()
        .prefix("stevedore-bench-")
        .tempdir()
        .map_err(|e| format!("cannot create a temp dir: {e}"))?;
    let small_inputs = root.path().join("inputs");
    write_small_inputs(&small_inputs).map_err(|e| format!("writing the small inputs: {e}"))?;
    header(&rung, mode, &worker, &bin).await;

    let t = Instant::now();
    let built = busybox_image(&docker, rung.engine()).await?;
    println!("image {BUSYBOX_IMAGE}: {} ({})", if built { "built" } else { "reused" }, secs(t.elapsed().as_secs_f64()));
    let fingerprint = stevedore::handlers::builtin().fingerprint();
    let t = Instant::now();
    let (worker_image, reused) = worker_image(rung.engine(), &bin, &fingerprint).await?;
    println!(
        "worker image {worker_image}: {} ({})",
        if reused { "reused" } else { "packed" },
        secs(t.elapsed().as_secs_f64())
    );

    let bench = Bench {
        mode,
        rung,
        docker,
        worker: worker.clone(),
        workers: Mutex::new(vec![worker]),
        worker_image,
        worker_image_packed: !reused,
        fingerprint,
        root,
        small_inputs,
        seq: AtomicU64::new(0),
        capture_base: Mutex::new(None),
        warm_served: Mutex::new(Vec::new()),
        warm_seen: Mutex::new(Vec::new()),
        bin: bin.clone(),
    };
    let measured = tokio::select! {
        r = measure(&bench) => r,
        _ = tokio::signal::ctrl_c() => Err("interrupted (Ctrl-C)".to_owned()),
    };
    let leftovers = cleanup(&bench).await;
    let workers = lock(&bench.workers).len();
    println!("leftovers: {leftovers} (containers and volumes labelled with any of this run's worker IDs: {workers})");
    let rows = measured?;
    print_summary(&rows);
    println!(
        "\ntotal: {} ({} mode); load average now {}",
        secs(began.elapsed().as_secs_f64()),
        mode.name,
        load_average()
    );
    Ok(())
}

/// The machine facts.
async fn header(rung: &ContainerExecutor, mode: Mode, worker: &str, bin: &Path) {
    let f = rung.engine().facts();
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu.lines().find_map(|l| l.strip_prefix("model name")).map(|m| m.trim_start_matches([' ', '\t', ':']));
    let sha_ni = cpu.lines().any(|l| l.starts_with("flags") && l.split_whitespace().any(|w| w == "sha_ni"));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cli = tokio::process::Command::new("docker")
        .args(["version", "--format", "{{.Client.Version}}"])
        .output()
        .await
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unavailable".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let age = std::fs::metadata(bin)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .map_or("?".into(), |d| format!("{} s", d.as_secs()));
    println!("stevedore bench, {} mode, worker {worker}", mode.name);
    println!(
        "engine: {} {}, API {} (engine max {}), cgroup v{}, storage {}, runtime {}, {} CPUs, {:.1} GiB",
        f.product,
        f.engine_version,
        f.api_version,
        f.max_api_version,
        f.cgroup_version,
        f.storage_driver,
        f.default_runtime,
        f.ncpu,
        f.mem_total_bytes as f64 / GIB as f64
    );
    println!(
        "host: {cpus} CPUs ({}), sha_ni {}, kernel {}; docker CLI {cli}",
        model.unwrap_or("?"),
        if sha_ni { "yes" } else { "no" },
        kernel.trim()
    );
    println!("stevedore {}; worker binary {} (modified {age} ago)", env!("CARGO_PKG_VERSION"), bin.display());
    println!("load average at start: {} (other work on the machine skews every figure)", load_average());
}

/// The 1, 5 and 15 minute load averages.
fn load_average() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// Four files of 4 KiB.
fn write_small_inputs(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for i in 0..4 {
        std::fs::write(dir.join(format!("in-{i}.txt")), vec![b'a' + i as u8; 4096])?;
    }
    Ok(())
}

/// Makes sure the busybox test image exists, built as the integration tests build it;
/// returns whether it was built here.
async fn busybox_image(docker: &Docker, engine: &stevedore::engine::Engine) -> Res<bool> {
    let sha = std::fs::File::open(BUSYBOX)
        .and_then(|f| stevedore::hash_reader(f, 0))
        .map(|h| h.hash.trim_start_matches("sha256:").to_owned());
    match docker.inspect_image(BUSYBOX_IMAGE).await {
        Ok(image) => {
            let labels = image.config.and_then(|c| c.labels).unwrap_or_default();
            let ours = labels.get(TEST_LABEL).is_some_and(|v| v == "true");
            // Without /bin/busybox to compare with, the tests' own image is still good.
            let same = sha.as_ref().map_or(true, |s| labels.get(BUSYBOX_SHA_LABEL) == Some(s));
            if ours && same {
                return Ok(false);
            }
        }
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
        Err(e) => return Err(format!("inspecting {BUSYBOX_IMAGE}: {}", chain(&e))),
    }
    let sha =
        sha.map_err(|e| format!("{BUSYBOX} is needed to build {BUSYBOX_IMAGE} (apt-get install busybox-static): {e}"))?;
    let busybox = std::fs::read(BUSYBOX).map_err(|e| format!("reading {BUSYBOX}: {e}"))?;
    let dockerfile = format!(
        "FROM scratch\nCOPY busybox /bin/busybox\n\
         RUN [\"/bin/busybox\",\"--install\",\"-s\",\"/bin\"]\n\
         LABEL {TEST_LABEL}=true {BUSYBOX_SHA_LABEL}={sha}\n"
    );
    let mut tar = tar::Builder::new(Vec::new());
    for (path, mode, data) in [("Dockerfile", 0o644, dockerfile.as_bytes()), ("busybox", 0o755, &busybox[..])] {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        tar.append_data(&mut header, path, data).map_err(|e| format!("build context: {e}"))?;
    }
    let context = tar.into_inner().map_err(|e| format!("build context: {e}"))?;
    stevedore::image::build_image_from_dir_tar(engine, BUSYBOX_IMAGE, context)
        .await
        .map_err(|e| format!("building {BUSYBOX_IMAGE}: {}", chain(&e)))?;
    Ok(true)
}

/// Packs the worker binary as `stevedore run --handler` does (same tag, same labels, so the
/// two share the image); returns the tag and whether it was reused.
async fn worker_image(engine: &stevedore::engine::Engine, bin: &Path, fingerprint: &str) -> Res<(String, bool)> {
    use stevedore::image::bundle::{default_base, exe_digest};
    let digest = exe_digest(bin, &default_base()).map_err(|e| format!("reading {}: {}", bin.display(), chain(&e)))?;
    let tag = format!("stevedore-worker:{}", &digest[..16.min(digest.len())]);
    let mut spec = stevedore::image::PackSpec::new(bin, tag.clone());
    spec.fingerprint = Some(fingerprint.to_owned());
    let packed = stevedore::image::ensure_image(engine, &spec)
        .await
        .map_err(|e| format!("packing {} as {tag}: {}", bin.display(), chain(&e)))?;
    Ok((tag, packed.reused))
}

/// Every measurement, in letter order; the summary rows.
async fn measure(b: &Bench) -> Res<Vec<Row>> {
    if let Ok(only) = std::env::var("STEVEDORE_BENCH_ONLY") {
        return only_outputs(b, &only).await;
    }
    let mut rows = Vec::new();
    let single = single_attempts(b).await?;
    single.print();
    single.rows(&mut rows);
    if single.warm {
        warm_profile(b);
    }
    command(b, &mut rows).await?;
    let levels = throughput(b, single.warm).await?;
    levels_rows(&levels, &mut rows);
    if single.warm {
        pool_turnover(b).await?;
    }
    outputs(b, &mut rows).await?;
    rss(b, &mut rows).await?;
    reclaim(b, &mut rows).await?;
    sampling(b, &mut rows).await?;
    Ok(rows)
}

// ---------------------------------------------------------------------------------------
// (a)-(e): one attempt at a time, interleaved
// ---------------------------------------------------------------------------------------

/// What is compared one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Raw,
    Cli,
    Attempt,
    AttemptBackground,
    AttemptInputs,
    Handler,
    Warm,
    WarmInputs,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Raw => "(a) raw bollard create→start→wait→remove",
            Kind::Cli => "(b) docker run --rm",
            Kind::Attempt => "(c) stevedore attempt `true`, removal awaited",
            Kind::AttemptBackground => "(c) stevedore attempt `true`",
            Kind::AttemptInputs => "(c') stevedore attempt `true`, small inputs",
            Kind::Handler => "(d) handler `true` (re-exec, worker image)",
            Kind::Warm => "(e) warm pool attempt, no inputs",
            Kind::WarmInputs => "(e) warm pool attempt, small inputs",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Kind::Raw => "(a)",
            Kind::Cli => "(b)",
            Kind::Attempt => "(c) awaited",
            Kind::AttemptBackground => "(c)",
            Kind::AttemptInputs => "(c')",
            Kind::Handler => "(d)",
            Kind::Warm => "(e)",
            Kind::WarmInputs => "(e) inputs",
        }
    }

    /// One run, timed by the kind itself; `None` when the kind is not available.
    async fn once(self, b: &Bench) -> Res<Option<Duration>> {
        Ok(Some(match self {
            Kind::Raw => b.raw_true().await?,
            Kind::Cli => b.cli_true().await?,
            Kind::Attempt => b.attempt_true(false).await?,
            Kind::AttemptBackground => b.attempt_true_background(false).await?,
            Kind::AttemptInputs => b.attempt_true_background(true).await?,
            Kind::Handler => b.handler_true().await?,
            Kind::Warm => return warm_attempt(b, false).await,
            Kind::WarmInputs => return warm_attempt(b, true).await,
        }))
    }
}

/// The results of the interleaved rounds.
struct Single {
    stats: BTreeMap<Kind, Stats>,
    /// Whether (e) is available.
    warm: bool,
    warmup: Vec<(Kind, Duration)>,
}

async fn single_attempts(b: &Bench) -> Res<Single> {
    let kinds = [
        Kind::Raw,
        Kind::Cli,
        Kind::Attempt,
        Kind::AttemptBackground,
        Kind::AttemptInputs,
        Kind::Handler,
        Kind::Warm,
        Kind::WarmInputs,
    ];
    single_attempts_of(b, &kinds).await
}

async fn single_attempts_of(b: &Bench, kinds: &[Kind]) -> Res<Single> {
    // Warm-up, not counted: the first attempt of a process finds (or publishes) stevedore's
    // init volume, the first handler loads the worker image, the CLI warms its caches.
    let mut warmup = Vec::new();
    let mut available = Vec::new();
    for &k in kinds {
        if let Some(d) = k.once(b).await? {
            warmup.push((k, d));
            available.push(k);
        }
    }
    let warm = available.contains(&Kind::Warm);
    let mut stats: BTreeMap<Kind, Stats> = available.iter().map(|k| (*k, Stats::default())).collect();
    for round in 0..b.mode.rounds {
        // Rotate the order every round: each kind runs at each position equally often.
        let n = available.len();
        for i in 0..n {
            let k = available[(i + round) % n];
            let d = k.once(b).await?.ok_or_else(|| format!("{} became unavailable", k.label()))?;
            stats.get_mut(&k).expect("every available kind has stats").push(d.as_secs_f64());
        }
    }
    Ok(Single { stats, warm, warmup })
}

impl Single {
    fn median(&self, k: Kind) -> f64 {
        self.stats.get(&k).map_or(f64::NAN, Stats::median)
    }

    fn ratio(&self, k: Kind, against: Kind) -> f64 {
        self.median(k) / self.median(against)
    }

    fn print(&self) {
        let warm: Vec<String> =
            self.warmup.iter().map(|(k, d)| format!("{} {}", k.short(), secs(d.as_secs_f64()))).collect();
        println!("\nwarm-up (not counted): {}", warm.join(", "));
        let width = self.stats.keys().map(|k| k.label().chars().count()).max().unwrap_or(0);
        for (k, s) in &self.stats {
            let against = match k {
                Kind::Raw => String::new(),
                Kind::Cli => format!("; {:.2} × (a)", self.ratio(*k, Kind::Raw)),
                Kind::AttemptInputs | Kind::Handler => {
                    format!("; {:.2} × (c), {:.2} × (b)", self.ratio(*k, Kind::Attempt), self.ratio(*k, Kind::Cli))
                }
                _ => format!("; {:.2} × (a), {:.2} × (b)", self.ratio(*k, Kind::Raw), self.ratio(*k, Kind::Cli)),
            };
            let pad = width - k.label().chars().count();
            println!("{}:{} {}{against}", k.label(), " ".repeat(pad), s.times());
        }
        if !self.warm {
            println!("(e) warm pool: not available in this build");
        }
    }

    fn rows(&self, rows: &mut Vec<Row>) {
        let m = |k: Kind| secs(self.median(k));
        rows.push(Row::info(Kind::Raw.label(), m(Kind::Raw), "", None));
        rows.push(Row::info(Kind::Cli.label(), m(Kind::Cli), "(a)", Some(self.ratio(Kind::Cli, Kind::Raw))));
        let c = self.ratio(Kind::AttemptBackground, Kind::Cli);
        rows.push(
            Row::info(Kind::AttemptBackground.label(), m(Kind::AttemptBackground), "(b)", Some(c))
                .target("≤ 0.8 × (b)", Some(c <= 0.8)),
        );
        let awaited = self.ratio(Kind::Attempt, Kind::Cli);
        rows.push(Row::info(Kind::Attempt.label(), m(Kind::Attempt), "(b)", Some(awaited)));
        let ci = self.ratio(Kind::AttemptInputs, Kind::Cli);
        rows.push(
            Row::info(Kind::AttemptInputs.label(), m(Kind::AttemptInputs), "(b)", Some(ci))
                .target("≤ 0.85 × (b)", Some(ci <= 0.85)),
        );
        rows.push(Row::info(
            Kind::Handler.label(),
            m(Kind::Handler),
            "(c)",
            Some(self.ratio(Kind::Handler, Kind::Attempt)),
        ));
        let b = self.median(Kind::Cli);
        // The warm path's targets: absolute for an attempt without inputs (milliseconds, as
        // the speed issue sets them), a ratio to (b) with small inputs.
        let warm: [(Kind, &str, f64, Option<f64>, f64); 3] = [
            (Kind::Warm, "median", 0.5, Some(0.005), 0.0),
            (Kind::Warm, "p90", 0.9, Some(0.010), 0.0),
            (Kind::WarmInputs, "median", 0.5, None, 0.07),
        ];
        for (k, which, q, absolute, limit) in warm {
            let target = match absolute {
                Some(a) => format!("≤ {}", secs(a)),
                None => format!("≤ {limit} × (b)"),
            };
            let label = if which == "median" { k.label().to_owned() } else { format!("{}, {which}", k.label()) };
            let row = match self.stats.get(&k).filter(|_| self.warm) {
                Some(s) => {
                    let v = if which == "median" { s.median() } else { s.pct(q) };
                    let met = absolute.map_or(v / b <= limit, |a| v <= a);
                    Row::info(label, secs(v), "(b)", Some(v / b)).target(target, Some(met))
                }
                None => Row::info(label, "n/a", "(b)", None).target(target, None),
            };
            rows.push(row);
        }
    }
}

/// One phase of an attempt's evidence.
type PhaseOf = fn(&stevedore::contract::Phases) -> Option<u64>;

/// The warm path, phase by phase: the medians of the phases the (e) attempts' evidence
/// carries (ms from the attempt's start: prepared, inputs staged, claimed (`created`),
/// started, the command started (the init's `Started`), its record (command ended),
/// outputs collected, concluded), and the step each phase adds.
fn warm_profile(b: &Bench) {
    let seen = lock(&b.warm_seen).clone();
    for inputs in [false, true] {
        let phases: Vec<&stevedore::contract::Phases> = seen.iter().filter(|s| s.1 == inputs).map(|s| &s.2).collect();
        if phases.is_empty() {
            continue;
        }
        let median = |f: PhaseOf| {
            let mut v: Vec<u64> = phases.iter().filter_map(|p| f(p)).collect();
            v.sort_unstable();
            v.get(v.len() / 2).copied()
        };
        let steps: [(&str, PhaseOf); 8] = [
            ("prepared", |p| p.prepared_ms),
            ("inputs staged", |p| p.inputs_staged_ms),
            ("claimed", |p| p.created_ms),
            ("Start sent", |p| p.started_ms),
            ("command started", |p| p.command_started_ms),
            ("record", |p| p.command_ended_ms),
            ("outputs end", |p| p.outputs_collected_ms),
            ("concluded", |p| p.concluded_ms),
        ];
        let mut line = Vec::new();
        let mut before = 0;
        for (name, f) in steps {
            if let Some(at) = median(f) {
                line.push(format!("{name} {at} (+{})", at.saturating_sub(before)));
                before = at;
            }
        }
        println!(
            "(e) warm profile{}, median ms from the attempt's start (n={}): {}",
            if inputs { ", small inputs" } else { "" },
            phases.len(),
            line.join(" → ")
        );
    }
}

/// (j): the command as people run it: `stevedore run --image busybox --output DIR -- true`
/// as a whole process against `docker run --rm` of the same, in pairs, alternating which
/// goes first; the ratio of the medians.
async fn command(b: &Bench, rows: &mut Vec<Row>) -> Res<()> {
    let run_ours = |out: PathBuf| {
        let mut cmd = tokio::process::Command::new(&b.bin);
        cmd.args(["run", "-q", "--worker", &b.worker, "--image", BUSYBOX_IMAGE, "--output"])
            .arg(out)
            .args(["--", "true"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        async move {
            let start = Instant::now();
            let out = cmd.output().await.map_err(|e| format!("(j) cannot run stevedore: {e}"))?;
            let took = start.elapsed();
            if !out.status.success() {
                return Err(format!(
                    "(j) stevedore run: {}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok::<_, String>(took)
        }
    };
    // Warm-up of both (not counted).
    run_ours(b.out_dir("j")).await?;
    b.cli_true().await?;
    let (mut ours, mut theirs) = (Stats::default(), Stats::default());
    for i in 0..b.mode.command_pairs {
        if i % 2 == 0 {
            ours.push(run_ours(b.out_dir("j")).await?.as_secs_f64());
            theirs.push(b.cli_true().await?.as_secs_f64());
        } else {
            theirs.push(b.cli_true().await?.as_secs_f64());
            ours.push(run_ours(b.out_dir("j")).await?.as_secs_f64());
        }
    }
    let r = ours.median() / theirs.median();
    println!(
        "(j) `stevedore run … true` as a process:  {}; {r:.2} × `docker run --rm` ({})",
        ours.times(),
        secs(theirs.median())
    );
    rows.push(
        Row::info("(j) the command `stevedore run … true`", secs(ours.median()), "docker run --rm", Some(r))
            .target("≤ 1.0 ×", Some(r <= 1.0)),
    );
    Ok(())
}

/// After the throughput runs: every warm attempt ran in a container of its own, and each
/// container taken from the pool was replaced by exactly one fill (no burst, no fill ahead
/// of the attempts); how many times over the pool turned.
async fn pool_turnover(b: &Bench) -> Res<()> {
    let rung = warm_rung(b).await?;
    // The last fills end before the pool's figures are read.
    rung.warm_up(Duration::from_secs(120)).await;
    let seen = lock(&b.warm_seen).clone();
    let mut ids: Vec<&str> = seen.iter().map(|s| s.0.as_str()).collect();
    ids.sort_unstable();
    let before = ids.len();
    ids.dedup();
    if ids.len() != before {
        return Err(format!("(e) {} warm attempts ran in only {} containers", before, ids.len()));
    }
    let s = rung.pool_stats();
    if s.fills_started != WARM_POOL as u64 + s.hits + s.fills_failed {
        return Err(format!("(e) the pool's fills do not follow its claims one for one: {s:?}"));
    }
    println!(
        "(e) pool: {} attempts served warm, each in a container of its own; {} fills ({WARM_POOL} first, then one per \
         container taken); {} misses ran cold; at most {} fills at once; the pool turned over {:.1} times",
        s.hits,
        s.fills_started,
        s.misses,
        s.most_filling,
        s.hits as f64 / WARM_POOL as f64
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// (f): throughput
// ---------------------------------------------------------------------------------------

/// Attempts per second of each kind at one level of concurrency.
struct Level {
    in_flight: usize,
    attempts: usize,
    rate: BTreeMap<Kind, f64>,
}

/// Runs `n` of `kind`, `level` at a time; the wall time of the whole batch.
async fn batch(b: &Bench, kind: Kind, n: usize, level: usize) -> Res<Duration> {
    let start = Instant::now();
    let results: Vec<Res<Option<Duration>>> =
        futures_util::stream::iter(0..n).map(|_| kind.once(b)).buffer_unordered(level).collect().await;
    let took = start.elapsed();
    for r in results {
        r?;
    }
    Ok(took)
}

async fn throughput(b: &Bench, warm: bool) -> Res<Vec<Level>> {
    let mut kinds = vec![Kind::Raw, Kind::Attempt];
    if warm {
        // The warm path as a job engine feeds it: each attempt with the small inputs.
        kinds.push(Kind::WarmInputs);
    }
    let mut levels = Vec::new();
    for in_flight in [1, 2, 4, 8] {
        // Two halves per kind, in ABBA order (ABCCBA with (e)), each at least one full level.
        let half = (b.mode.per_level / 2).max(in_flight);
        let mut order = kinds.clone();
        order.extend(kinds.iter().rev());
        let mut took: BTreeMap<Kind, Duration> = BTreeMap::new();
        for k in order {
            *took.entry(k).or_default() += batch(b, k, half, in_flight).await?;
        }
        let rate = took.iter().map(|(k, d)| (*k, (2 * half) as f64 / d.as_secs_f64())).collect();
        levels.push(Level { in_flight, attempts: 2 * half, rate });
    }
    let counts: Vec<String> = levels.iter().map(|l| l.attempts.to_string()).collect();
    println!(
        "(f) throughput, attempts/s, each kind in two halves in ABBA order ({} attempts per kind at 1, 2, 4, 8 in flight):",
        counts.join(", ")
    );
    let mut head = format!("    {:>9}  {:>8}  {:>8}  {:>7}", "in flight", "(a) raw", "(c)", "(c)/(a)");
    if warm {
        head.push_str(&format!("  {:>8}  {:>7}", "(e) in", "(e)/(a)"));
    }
    println!("{head}");
    for l in &levels {
        let a = l.rate[&Kind::Raw];
        let c = l.rate[&Kind::Attempt];
        let mut line = format!("    {:>9}  {a:>8.2}  {c:>8.2}  {:>7.2}", l.in_flight, c / a);
        if let Some(e) = l.rate.get(&Kind::WarmInputs) {
            line.push_str(&format!("  {e:>8.2}  {:>7.2}", e / a));
        }
        println!("{line}");
    }
    Ok(levels)
}

fn levels_rows(levels: &[Level], rows: &mut Vec<Row>) {
    for l in levels {
        let a = l.rate[&Kind::Raw];
        let c = l.rate[&Kind::Attempt];
        let at = |k: &str| format!("(f) {k} throughput, {} in flight", l.in_flight);
        let row = Row::info(at("(c)"), format!("{c:.2}/s"), format!("(a) {a:.2}/s"), Some(c / a));
        rows.push(if l.in_flight == 4 { row.target("≥ 0.95 × (a)", Some(c / a >= 0.95)) } else { row });
        if l.in_flight == 4 {
            let at = |k: &str| format!("(f) {k} throughput, small inputs, {} in flight", l.in_flight);
            let row = match l.rate.get(&Kind::WarmInputs) {
                Some(e) => Row::info(at("(e)"), format!("{e:.2}/s"), format!("(a) {a:.2}/s"), Some(e / a))
                    .target("≥ 1.5 × (a)", Some(e / a >= 1.5)),
                None => Row::info(at("(e)"), "n/a", "(a)", None).target("≥ 1.5 × (a)", None),
            };
            rows.push(row);
        }
    }
}

// ---------------------------------------------------------------------------------------
// (g): collecting and hashing outputs
// ---------------------------------------------------------------------------------------

/// A `sh` script writing `bytes` of zeros into `files` files under `/out`.
fn fill_script(files: usize, bytes: u64) -> String {
    let each = bytes / files as u64;
    let first = each + bytes % files as u64;
    format!(
        "head -c {first} /dev/zero > /out/f0000 && i=1 && while [ $i -lt {files} ]; do \
         head -c {each} /dev/zero > /out/f$(printf %04d $i) || exit 1; i=$((i+1)); done"
    )
}

/// Checks that an outcome lists `files` outputs holding `bytes` in all.
fn check_outputs(o: &Outcome, files: usize, bytes: u64) -> Res<()> {
    let total: u64 = o.outputs.iter().map(|f| f.size).sum();
    if o.outputs.len() != files || total != bytes {
        return Err(format!(
            "expected {files} outputs of {bytes} bytes, the outcome lists {} of {total}",
            o.outputs.len()
        ));
    }
    Ok(())
}

/// `STEVEDORE_BENCH_ONLY`: (g), (h) and/or (k) alone, for iterating on one of them.
async fn only_outputs(b: &Bench, only: &str) -> Res<Vec<Row>> {
    let mut rows = Vec::new();
    if only.contains('e') {
        let single = single_attempts_of(b, &[Kind::Cli, Kind::Warm, Kind::WarmInputs]).await?;
        single.print();
        single.rows(&mut rows);
        rows.retain(|r| r.figure.starts_with("(e)") || r.figure.starts_with("(b)"));
        warm_profile(b);
    }
    if only.contains('g') {
        outputs(b, &mut rows).await?;
    }
    if only.contains('h') {
        rss(b, &mut rows).await?;
    }
    if only.contains('k') {
        sampling(b, &mut rows).await?;
    }
    if rows.is_empty() {
        return Err(format!("STEVEDORE_BENCH_ONLY={only:?}: expected e, g, h, k or a mix"));
    }
    Ok(rows)
}

/// The transport's ceiling: `bytes` of zeros on a raw attach stream, read and discarded;
/// MB/s from the first byte to the end (the container's start is not the stream's). Written
/// by `head -c` (busybox's 4 KiB writes) or by `dd` in 1 MiB writes (as large as the init's
/// 64 KiB frames or larger: what the transport itself carries).
async fn attach_ceiling(b: &Bench, bytes: u64, large_writes: bool) -> Res<f64> {
    let (n, count) = (bytes.to_string(), format!("count={}", bytes.div_ceil(MIB)));
    let argv: &[&str] =
        if large_writes { &["dd", "if=/dev/zero", "bs=1048576", &count] } else { &["head", "-c", &n, "/dev/zero"] };
    let bytes = if large_writes { bytes.div_ceil(MIB) * MIB } else { bytes };
    let body = hardened(&b.worker, argv);
    let id = b
        .docker
        .create_container(None::<CreateContainerOptions>, body)
        .await
        .map_err(|e| format!("(g) ceiling: create: {}", chain(&e)))?
        .id;
    let streamed = async {
        let opts = AttachContainerOptionsBuilder::default().stdout(true).stderr(true).stream(true).build();
        let mut attached = b
            .docker
            .attach_container(&id, Some(opts))
            .await
            .map_err(|e| format!("(g) ceiling: attach: {}", chain(&e)))?;
        b.docker
            .start_container(&id, None::<StartContainerOptions>)
            .await
            .map_err(|e| format!("(g) ceiling: start: {}", chain(&e)))?;
        let (mut got, mut first) = (0u64, None);
        while let Some(item) = attached.output.next().await {
            match item {
                Ok(LogOutput::StdOut { message }) => {
                    first.get_or_insert_with(Instant::now);
                    got += message.len() as u64;
                }
                Ok(_) => {}
                Err(e) => return Err(format!("(g) ceiling: the stream failed: {}", chain(&e))),
            }
        }
        let took = first.map_or(Duration::ZERO, |t| t.elapsed());
        if got != bytes {
            return Err(format!("(g) ceiling: the stream carried {got} bytes of {bytes}"));
        }
        Ok(mbps(bytes, took.as_secs_f64().max(1e-6)))
    }
    .await;
    let _ = b.docker.remove_container(&id, Some(RemoveContainerOptionsBuilder::new().force(true).build())).await;
    streamed
}

/// Hashing alone: sha256 of `bytes` in 1 MiB updates from memory, MB/s per CPU-second of
/// the hashing thread.
async fn hash_ceiling(bytes: u64) -> Res<f64> {
    tokio::task::spawn_blocking(move || {
        use sha2::Digest;
        let block: Vec<u8> = (0..MIB as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
        let cpu = cpu_time(UsageWho::RUSAGE_THREAD);
        let mut h = sha2::Sha256::new();
        for _ in 0..bytes.div_ceil(MIB) {
            h.update(&block);
        }
        std::hint::black_box(h.finalize());
        let cpu = cpu_time(UsageWho::RUSAGE_THREAD).saturating_sub(cpu);
        mbps(bytes.div_ceil(MIB) * MIB, cpu.as_secs_f64().max(1e-6))
    })
    .await
    .map_err(|e| format!("(g) the hashing thread failed: {e}"))
}

/// The ceilings of (g): the best of a few runs of each (other load only lowers them).
/// The lower of the two ceilings, and sha256 alone (MB/s per CPU-second).
async fn ceilings(b: &Bench, rows: &mut Vec<Row>) -> Res<(f64, f64)> {
    let bytes = b.mode.g_bytes;
    let (mut head, mut dd, mut hash) = (Stats::default(), Stats::default(), Stats::default());
    for _ in 0..b.mode.hash_reps.max(1) {
        head.push(attach_ceiling(b, bytes, false).await?);
        dd.push(attach_ceiling(b, bytes, true).await?);
        hash.push(hash_ceiling(bytes).await?);
    }
    // The transport's ceiling is the better of the two writers: head's small writes say
    // more about head than about the transport.
    let (a, h) = (max(&head).max(max(&dd)), max(&hash));
    let backend = stevedore::hash_backend();
    println!(
        "(g) ceilings: raw attach stream of {}: head -c {:.0} MB/s (median {:.0}), dd bs=1M {:.0} MB/s (median \
         {:.0}); sha256 alone ({backend}) {h:.0} MB/s per CPU-second (median {:.0}); the lower {:.0} MB/s",
        size(bytes),
        max(&head),
        head.median(),
        max(&dd),
        dd.median(),
        hash.median(),
        a.min(h)
    );
    rows.push(Row::info("(g) ceiling: raw attach, head -c", format!("{:.0} MB/s", max(&head)), "", None));
    rows.push(Row::info("(g) ceiling: raw attach, dd bs=1M", format!("{:.0} MB/s", max(&dd)), "", None));
    // The 2 GB/s a core target is retired: above this CPU's `sha2` (the speed issue).
    rows.push(Row::info(format!("(g) ceiling: sha256 per core, {backend}"), format!("{h:.0} MB/s"), "", None));
    Ok((a.min(h), h))
}

fn max(s: &Stats) -> f64 {
    s.sorted().last().copied().unwrap_or(0.0)
}

async fn outputs(b: &Bench, rows: &mut Vec<Row>) -> Res<()> {
    let bytes = b.mode.g_bytes;
    let (ceiling, sha2_alone) = ceilings(b, rows).await?;
    for files in [b.mode.g_files, 1] {
        let script = fill_script(files, bytes);
        let req = b
            .command("g", &["sh", "-c", &script])
            .memory(bytes + 2 * GIB)
            .disk(bytes + bytes / 2)
            .timeout(Duration::from_secs(1800));
        let (took, o) = b.attempt(&req).await?;
        check_outputs(&o, files, bytes)?;
        let wall = took.as_secs_f64();
        let command = o.usage.wall_time_ms.map(|ms| ms as f64 / 1000.0);
        let rest = command.map(|c| (wall - c).max(1e-3));
        let what = format!("{} in {files} file{}", size(bytes), if files == 1 { "" } else { "s" });
        println!(
            "(g) outputs, {what}: attempt {} → {:.0} MB/s; of it the command {} (init clock), the rest {}{}",
            secs(wall),
            mbps(bytes, wall),
            command.map_or("?".into(), secs),
            rest.map_or("?".into(), secs),
            rest.map_or(String::new(), |r| format!(" → {:.0} MB/s launch+collect+hash+cleanup", mbps(bytes, r)))
        );
        rows.push(Row::info(format!("(g) collect {what}"), secs(wall), format!("{:.0} MB/s", mbps(bytes, wall)), None));
        let collected = o.evidence.collection.as_ref().map(|c| c.elapsed_ms as f64 / 1000.0);
        let rate = collected.map(|c| mbps(bytes, c.max(1e-3)));
        println!(
            "(g) collection of {what} (record to outputs extracted and hashed): {} → {} MB/s = {} of the lower \
             ceiling ({ceiling:.0} MB/s)",
            collected.map_or("?".into(), secs),
            rate.map_or("?".into(), |r| format!("{r:.0}")),
            rate.map_or("?".into(), |r| format!("{:.0} %", 100.0 * r / ceiling)),
        );
        rows.push(
            Row::info(
                format!("(g) collection MB/s, {what}"),
                rate.map_or("n/a".into(), |r| format!("{r:.0} MB/s")),
                format!("{ceiling:.0} MB/s"),
                rate.map(|r| r / ceiling),
            )
            .target("≥ 0.5 × lower ceiling", rate.map(|r| r >= 0.5 * ceiling)),
        );

        let race = hash_race(&req.output_dir, &o.outputs, b.mode.hash_reps).await?;
        let (s, h) = (race.cli_cpu.median(), race.reader_cpu.median());
        println!(
            "(g) hashing {what} on the host, one thread each, median of {}: sha256sum {s:.0} MB/s per CPU-second \
             ({:.0} MB/s wall), hash_reader {h:.0} MB/s per CPU-second (p10 {:.0}, p90 {:.0}; {:.0} MB/s wall) = \
             {:.2} × sha256sum ({:.2} × by wall); both agree with the outcome's hashes",
            b.mode.hash_reps,
            race.cli_wall.median(),
            race.reader_cpu.pct(0.1),
            race.reader_cpu.pct(0.9),
            race.reader_wall.median(),
            h / s,
            race.reader_wall.median() / race.cli_wall.median()
        );
        rows.push(
            Row::info(
                format!("(g) hash_reader per core, {what}"),
                format!("{h:.0} MB/s"),
                format!("sha2 {sha2_alone:.0} MB/s"),
                Some(h / sha2_alone),
            )
            .target("≥ 0.95 × sha2 alone", Some(h >= 0.95 * sha2_alone)),
        );
        rows.push(
            Row::info(
                format!("(g) hash_reader vs sha256sum, {what}"),
                format!("{h:.0} MB/s"),
                format!("{s:.0} MB/s"),
                Some(h / s),
            )
            .target("≥ 3 × sha256sum", Some(h / s >= 3.0)),
        );
        remove_dir(req.output_dir.clone()).await;
    }
    Ok(())
}

/// MB/s of each hasher over the same files, alternately: per CPU-second (user + system time
/// of the hashing thread or process, which other load on the machine barely changes) and by
/// wall time.
#[derive(Default)]
struct HashRace {
    cli_cpu: Stats,
    cli_wall: Stats,
    reader_cpu: Stats,
    reader_wall: Stats,
}

/// The wall and CPU time of one hashing pass.
struct Pass {
    wall: Duration,
    cpu: Duration,
}

/// User + system time of `who` so far.
fn cpu_time(who: UsageWho) -> Duration {
    let d = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64) + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    getrusage(who).map_or(Duration::ZERO, |u| d(u.user_time()) + d(u.system_time()))
}

async fn hash_race(dir: &Path, files: &[OutputFile], reps: usize) -> Res<HashRace> {
    let bytes: u64 = files.iter().map(|f| f.size).sum();
    let want: HashMap<String, String> =
        files.iter().map(|f| (f.name.clone(), f.hash.trim_start_matches("sha256:").to_owned())).collect();
    let mut race = HashRace::default();
    for rep in 0..reps.max(1) {
        // Alternate which goes first.
        for cli in [rep % 2 == 0, rep % 2 == 1] {
            let (pass, got) = if cli { sha256sum(dir, files).await? } else { hash_in_process(dir, files).await? };
            if got != want {
                let who = if cli { "sha256sum" } else { "hash_reader" };
                return Err(format!("(g) {who} disagrees with the outcome's hashes"));
            }
            let (cpu, wall) = if cli {
                (&mut race.cli_cpu, &mut race.cli_wall)
            } else {
                (&mut race.reader_cpu, &mut race.reader_wall)
            };
            cpu.push(mbps(bytes, pass.cpu.as_secs_f64().max(1e-6)));
            wall.push(mbps(bytes, pass.wall.as_secs_f64()));
        }
    }
    Ok(race)
}

/// `sha256sum` over the files: its pass (CPU from `RUSAGE_CHILDREN`: nothing else is reaped
/// meanwhile) and the digests by name.
async fn sha256sum(dir: &Path, files: &[OutputFile]) -> Res<(Pass, HashMap<String, String>)> {
    let mut cmd = tokio::process::Command::new("sha256sum");
    cmd.arg("--").args(files.iter().map(|f| &f.name)).current_dir(dir).kill_on_drop(true);
    let cpu = cpu_time(UsageWho::RUSAGE_CHILDREN);
    let start = Instant::now();
    let out = cmd.output().await.map_err(|e| format!("(g) cannot run sha256sum: {e}"))?;
    let wall = start.elapsed();
    let cpu = cpu_time(UsageWho::RUSAGE_CHILDREN).saturating_sub(cpu);
    if !out.status.success() {
        return Err(format!("(g) sha256sum: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
    }
    let got = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once("  ").map(|(h, n)| (n.to_owned(), h.to_owned())))
        .collect();
    Ok((Pass { wall, cpu }, got))
}

/// `stevedore::hash_reader` over the files, in one blocking thread (CPU from
/// `RUSAGE_THREAD`).
async fn hash_in_process(dir: &Path, files: &[OutputFile]) -> Res<(Pass, HashMap<String, String>)> {
    let paths: Vec<(String, PathBuf)> = files.iter().map(|f| (f.name.clone(), dir.join(&f.name))).collect();
    tokio::task::spawn_blocking(move || {
        let cpu = cpu_time(UsageWho::RUSAGE_THREAD);
        let start = Instant::now();
        let mut got = HashMap::new();
        for (name, path) in paths {
            let file = std::fs::File::open(&path).map_err(|e| format!("(g) {}: {e}", path.display()))?;
            let h = stevedore::hash_reader(file, 0).map_err(|e| format!("(g) {}: {e}", path.display()))?;
            got.insert(name, h.hash.trim_start_matches("sha256:").to_owned());
        }
        let wall = start.elapsed();
        Ok((Pass { wall, cpu: cpu_time(UsageWho::RUSAGE_THREAD).saturating_sub(cpu) }, got))
    })
    .await
    .map_err(|e| format!("(g) the hashing thread failed: {e}"))?
}

/// Removes a dir of outputs (best effort; the temp dir goes at the end anyway).
async fn remove_dir(dir: PathBuf) {
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
}

// ---------------------------------------------------------------------------------------
// (h): host RSS while collecting
// ---------------------------------------------------------------------------------------

/// A `kB` field of `/proc/self/status`, in bytes.
fn proc_status(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?;
    line[field.len() + 1..].trim().trim_end_matches("kB").trim().parse::<u64>().ok().map(|kb| kb * 1024)
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("?".into(), |b| format!("{:.1} MiB", b as f64 / MIB as f64))
}

async fn rss(b: &Bench, rows: &mut Vec<Row>) -> Res<()> {
    let (outputs, logs) = (b.mode.h_outputs, b.mode.h_logs);
    let each = outputs / 4;
    let script = format!(
        "head -c {logs} /dev/zero && i=0 && while [ $i -lt 4 ]; do head -c {each} /dev/zero > /out/o$i || exit 1; \
         i=$((i+1)); done"
    );
    let req = b
        .command("h", &["sh", "-c", &script])
        .memory(outputs + 2 * GIB)
        .disk(outputs + outputs / 4)
        .timeout(Duration::from_secs(3600));
    // Writing 5 to clear_refs resets VmHWM to the current RSS: the peak is then this attempt's.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = proc_status("VmRSS");
    let stop = CancellationToken::new();
    let sampler = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut max = 0;
            loop {
                max = max.max(proc_status("VmRSS").unwrap_or(0));
                tokio::select! {
                    () = stop.cancelled() => return max,
                    () = tokio::time::sleep(Duration::from_millis(5)) => {}
                }
            }
        }
    });
    let result = b.attempt(&req).await;
    stop.cancel();
    let sampled = sampler.await.ok();
    let hwm = proc_status("VmHWM");
    let (took, o) = result?;
    check_outputs(&o, 4, outputs)?;
    let out = &o.evidence.logs.stdout;
    if out.bytes != logs {
        return Err(format!("(h) stdout carried {logs} bytes, the outcome counted {}", out.bytes));
    }
    let kept = out.path.as_ref().and_then(|p| std::fs::metadata(p).ok()).map(|m| m.len());
    println!(
        "(h) host RSS while collecting {} of outputs + {} of stdout ({}): VmRSS before {}, max sampled {}, \
         VmHWM {} ({}); stdout counted {} bytes, kept {}{}",
        size(outputs),
        size(logs),
        secs(took.as_secs_f64()),
        mib(before),
        mib(sampled),
        mib(hwm),
        if reset { "reset just before" } else { "not resettable: the process's peak" },
        out.bytes,
        mib(kept),
        if out.truncated { " (truncated at the cap)" } else { "" }
    );
    let peak = if reset { hwm } else { sampled };
    rows.push(
        Row::info(
            format!("(h) host RSS, {} outputs + {} stdout", size(outputs), size(logs)),
            mib(peak),
            if reset { "VmHWM" } else { "VmRSS sampled" },
            None,
        )
        .target("≤ 64 MiB", peak.map(|p| p <= 64 * MIB)),
    );
    remove_dir(req.output_dir.clone()).await;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// (i): reclaim against raw parallel removal
// ---------------------------------------------------------------------------------------

/// Creates `n` leaked containers of `worker`, 8 at once; one in ten is started (`sleep`),
/// the rest only created. Returns their ids.
async fn leak(b: &Bench, worker: &str, n: usize) -> Res<Vec<String>> {
    let results: Vec<Res<String>> = futures_util::stream::iter(0..n)
        .map(|i| async move {
            let running = i % 10 == 0;
            let cmd: &[&str] = if running { &["sleep", "3600"] } else { &["true"] };
            let id = b
                .docker
                .create_container(None::<CreateContainerOptions>, hardened(worker, cmd))
                .await
                .map_err(|e| format!("(i) create: {}", chain(&e)))?
                .id;
            if running {
                b.docker
                    .start_container(&id, None::<StartContainerOptions>)
                    .await
                    .map_err(|e| format!("(i) start: {}", chain(&e)))?;
            }
            Ok(id)
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Force-removes `ids`, 8 at once.
async fn remove_raw(docker: &Docker, ids: &[String]) -> Res<()> {
    let results: Vec<Result<(), bollard::errors::Error>> = futures_util::stream::iter(ids)
        .map(|id| docker.remove_container(id, Some(RemoveContainerOptionsBuilder::new().force(true).build())))
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>, _>>().map(drop).map_err(|e| format!("(i) raw remove: {}", chain(&e)))
}

/// (k) What the resource timeline costs the attempt: the CPU the attempt's cgroup counted
/// (the init's sampling included) for `sleep`, with the timeline and without, alternating.
async fn sampling(b: &Bench, rows: &mut Vec<Row>) -> Res<()> {
    let mut cfg = ContainerConfig::default();
    cfg.link.timeline_period = None;
    let off = ContainerExecutor::connect(cfg).await.map_err(|e| format!("(k) the rung: {}", chain(&e)))?;
    let secs = if b.mode.name == "full" { 5 } else { 3 };
    let pairs = if b.mode.name == "full" { 4 } else { 1 };
    let (mut on_cpu, mut off_cpu, mut wall, mut samples) = (Stats::default(), Stats::default(), 0.0, 0);
    let sleep = secs.to_string();
    let result = async {
        for pair in 0..pairs {
            // ABBA: each side runs first equally often.
            let sides = if pair % 2 == 0 { [true, false] } else { [false, true] };
            for sampled in sides {
                let req = b.command("k", &["sleep", &sleep]);
                let o = if sampled {
                    b.attempt(&req).await?.1
                } else {
                    let o = off.run(&req, CancellationToken::new()).await.map_err(|e| format!("(k): {}", chain(&e)))?;
                    if o.status != Status::Ok {
                        return Err(format!("(k) ended {}: {}", o.status, o.to_json()));
                    }
                    o
                };
                let cpu = o.usage.cpu_time_ms.ok_or("(k) no cpu figure")? as f64;
                if sampled {
                    let line = o.usage.timeline.as_ref().ok_or("(k) no timeline with sampling on")?;
                    samples += line.t_ms.len();
                    wall += o.usage.wall_time_ms.unwrap_or(0) as f64;
                    on_cpu.push(cpu);
                } else if o.usage.timeline.is_some() {
                    return Err("(k) a timeline with sampling off".into());
                } else {
                    off_cpu.push(cpu);
                }
            }
        }
        Ok(())
    }
    .await;
    off.close().await;
    result?;
    let (on, offm) = (on_cpu.median(), off_cpu.median());
    let share = (on - offm) / (wall / pairs as f64);
    println!(
        "(k) `sleep {secs}` x{pairs}: cgroup cpu (median) {on:.1} ms with the timeline ({} samples an attempt), {offm:.1} ms \
         without: {:+.1} ms, {:.3} % of one CPU over the attempt",
        samples / pairs,
        on - offm,
        share * 100.0
    );
    rows.push(
        Row::info(
            "(k) the timeline's sampling, CPU of the attempt",
            format!("{:+.1} ms", on - offm),
            "wall",
            Some(share),
        )
        .target("< 1 %", Some(share < 0.01)),
    );
    Ok(())
}

async fn reclaim(b: &Bench, rows: &mut Vec<Row>) -> Res<()> {
    let n = b.mode.leaks;
    let (mut by_reclaim, mut by_raw) = (Stats::default(), Stats::default());
    let (mut creating, mut listing) = (Stats::default(), Stats::default());
    for round in 0..b.mode.leak_rounds {
        // ABBA over the rounds: reclaim, raw, raw, reclaim.
        let sides = if round % 2 == 0 { [true, false] } else { [false, true] };
        for use_reclaim in sides {
            let worker = b.new_worker(&format!("i{round}{}", if use_reclaim { "r" } else { "x" }));
            let start = Instant::now();
            let ids = leak(b, &worker, n).await?;
            creating.push(start.elapsed().as_secs_f64());
            let start = Instant::now();
            if use_reclaim {
                let report = b.rung.reclaim(&worker).await;
                let took = start.elapsed();
                let report = report.map_err(|e| format!("(i) reclaim: {}", chain(&e)))?;
                if report.containers_removed.len() != n || !report.failed.is_empty() {
                    return Err(format!(
                        "(i) reclaim removed {} of {n} containers; failures: {:?}",
                        report.containers_removed.len(),
                        report.failed
                    ));
                }
                by_reclaim.push(took.as_secs_f64());
            } else {
                // What listing them by label costs (reclaim must; the raw side knows its ids),
                // timed apart, before the removal's own timer starts.
                let filters = stevedore::container::labels::worker_filter(&worker);
                let options = ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
                let listed = b.docker.list_containers(Some(options)).await;
                listing.push(start.elapsed().as_secs_f64());
                listed.map_err(|e| format!("(i) list: {}", chain(&e)))?;
                let start = Instant::now();
                remove_raw(&b.docker, &ids).await?;
                by_raw.push(start.elapsed().as_secs_f64());
            }
        }
    }
    let (r, x) = (by_reclaim.median(), by_raw.median());
    // Speed ratio: reclaim's rate over the raw removal's (1.0: as fast).
    let ratio = x / r;
    println!(
        "(i) removing {n} leaked containers ({} running), {} set{} each: rung.reclaim {} ({:.0}/s) vs raw parallel \
         removal, {PARALLEL} at once, {} ({:.0}/s): reclaim at {ratio:.2} × the raw rate \
         (samples: reclaim {:?} s, raw {:?} s; creating a set took {}, listing containers by label {})",
        n.div_ceil(10),
        b.mode.leak_rounds,
        if b.mode.leak_rounds == 1 { "" } else { "s in ABBA order" },
        secs(r),
        n as f64 / r,
        secs(x),
        n as f64 / x,
        by_reclaim.0.iter().map(|t| (t * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
        by_raw.0.iter().map(|t| (t * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
        secs(creating.median()),
        secs(listing.median())
    );
    rows.push(
        Row::info(format!("(i) reclaim {n} leaked containers"), secs(r), format!("raw {}", secs(x)), Some(ratio))
            .target("≥ 0.9 × raw rate", Some(ratio >= 0.9)),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Cleanup
// ---------------------------------------------------------------------------------------

/// Removes everything the bench's workers own, then counts what the engine still lists for
/// them (through the docker CLI, as a user would check). Never fails: problems are printed.
async fn cleanup(b: &Bench) -> usize {
    // Waits for attempts a Ctrl-C dropped: their removals run on the rung's tracked tasks;
    // the warm rung's close also drains its pool.
    b.rung.close().await;
    if let Some(r) = BACKGROUND.get() {
        r.close().await;
    }
    if let Some(w) = WARM.get() {
        w.close().await;
        let served = lock(&b.warm_served).clone();
        let hits = served.iter().filter(|h| **h).count();
        println!(
            "(e) warm pool: {hits} of {} attempts served warm (the rest found the pool empty and ran cold)",
            served.len()
        );
    }
    let workers = lock(&b.workers).clone();
    for w in &workers {
        match b.rung.reclaim(w).await {
            Ok(report) => {
                for f in &report.failed {
                    eprintln!("bench: cleanup: reclaim of {w} failed on {}: {}", f.id, f.error);
                }
            }
            Err(e) => eprintln!("bench: cleanup: reclaim of {w}: {}", chain(&e)),
        }
        sweep(&b.docker, w).await;
    }
    // Each worker's capture dir, which reclaim emptied (or created empty): `remove_dir`
    // refuses a dir that still holds something.
    if let Some(base) = lock(&b.capture_base).clone() {
        for w in &workers {
            let _ = std::fs::remove_dir(base.join(w));
        }
    }
    if b.worker_image_packed {
        // Not forced: an image a container (of someone else) started using meanwhile stays.
        let options = bollard::query_parameters::RemoveImageOptionsBuilder::new().noprune(false).build();
        if let Err(e) = b.docker.remove_image(&b.worker_image, Some(options), None).await {
            eprintln!("bench: cleanup: the worker image {} this run packed stays: {}", b.worker_image, chain(&e));
        }
    }
    let mut left = 0;
    for w in &workers {
        let filter = format!("label={WORKER}={w}");
        for args in [vec!["ps", "-a", "-q", "--filter", &filter], vec!["volume", "ls", "-q", "--filter", &filter]] {
            match tokio::process::Command::new("docker").args(&args).output().await {
                Ok(o) if o.status.success() => left += String::from_utf8_lossy(&o.stdout).lines().count(),
                Ok(o) => eprintln!(
                    "bench: cleanup: docker {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                Err(e) => eprintln!("bench: cleanup: cannot run docker: {e}"),
            }
        }
    }
    left
}

/// Force-removes whatever containers and volumes still carry `worker`'s label.
async fn sweep(docker: &Docker, worker: &str) {
    let filters = HashMap::from([("label".to_owned(), vec![format!("{WORKER}={worker}")])]);
    if let Ok(list) =
        docker.list_containers(Some(ListContainersOptionsBuilder::new().all(true).filters(&filters).build())).await
    {
        let ids: Vec<String> = list.into_iter().filter_map(|c| c.id).collect();
        if let Err(e) = remove_raw(docker, &ids).await {
            eprintln!("bench: cleanup: {e}");
        }
    }
    if let Ok(list) = docker.list_volumes(Some(ListVolumesOptionsBuilder::new().filters(&filters).build())).await {
        for v in list.volumes.unwrap_or_default() {
            if let Err(e) = docker.remove_volume(&v.name, None::<RemoveVolumeOptions>).await {
                eprintln!("bench: cleanup: volume {}: {}", v.name, chain(&e));
            }
        }
    }
}
