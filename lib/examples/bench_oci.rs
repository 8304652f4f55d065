//! The oci rung's bench: what issue 44 targets, measured in one run on this machine, each
//! figure printed with its target and whether it is met.
//!
//! `sudo cargo run --release --example bench_oci --features oci` (root, `runc`, a local
//! engine to export the busybox test image from); `-- --short` for CI's smoke of it (fewer
//! rounds, 64 MiB of outputs; a debug build's figures are not the targets' release ones).
//!
//! - **(b)** `docker run --rm --network none IMAGE true`, a process, and **(r)** `runc run`
//!   of a bare bundle of the same root filesystem (`runc spec`, the command `true`): the
//!   yardsticks, measured in the same rounds as
//! - **(c)** one cold attempt of `true` on the rung (the library, through its `Executor`),
//!   and **(j)** the command `stevedore run --rung oci --image IMAGE -- true`, a process.
//!   Each round runs the four in a rotating order; medians and p90 of the rounds.
//! - **(f)** attempts per second at 4 in flight against **(a)** the raw Docker API's
//!   (create, start, wait, remove, with the same hardening flags; bollard, no stevedore).
//! - **(g)** collection of 1 GiB in 1 file and in 1,000 files, hashing included: bytes over
//!   the Outcome's `evidence.collection.elapsed_ms` (the command's record to the outputs
//!   extracted and hashed).
//! - **(v)** where gVisor's `runsc` is installed: a cold attempt of `true` on the rung under
//!   `runsc` (ptrace, no network) against **(bv)** `docker run --rm --runtime R` of the same
//!   image, `R` the same `runsc` registered with the engine for the bench only
//!   (`common/gvisor.rs`); alternating pairs, medians.

mod common;
#[path = "common/gvisor.rs"]
mod gvisor;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{RemoveContainerOptionsBuilder, WaitContainerOptions};
use futures_util::StreamExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Instant;
use stevedore::oci::{OciConfig, OciExecutor};
use stevedore::{CancellationToken, Executor, Request, ResourceLimits, Status};

type Res<T> = Result<T, String>;

/// How much to do.
struct Mode {
    rounds: usize,
    batch: usize,
    collect: &'static [(usize, u64)],
    /// Pairs of (v) and (bv).
    gvisor_pairs: usize,
}

const FULL: Mode = Mode { rounds: 20, batch: 40, collect: &[(1, 1 << 30), (1000, 1 << 30)], gvisor_pairs: 10 };
const SHORT: Mode = Mode { rounds: 4, batch: 8, collect: &[(1, 64 << 20), (100, 64 << 20)], gvisor_pairs: 2 };

/// Samples in seconds (or MB/s).
#[derive(Default)]
struct Samples(Vec<f64>);

impl Samples {
    /// The nearest-rank percentile `q` (0..1]; the median is `at(0.5)`.
    fn at(&self, q: f64) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => f64::NAN,
            n => v[((q * n as f64).ceil() as usize).clamp(1, n) - 1],
        }
    }
    fn ms(&self) -> String {
        format!("p50 {:.1} ms, p90 {:.1} ms (n={})", self.at(0.5) * 1e3, self.at(0.9) * 1e3, self.0.len())
    }
}

/// `figure: value; target … met|NOT met`.
fn target(what: &str, value: String, target: &str, met: bool) {
    println!("{what}: {value}; target {target}: {}", if met { "met" } else { "NOT met" });
}

fn main() -> ExitCode {
    let short = std::env::args().any(|a| a == "--short") || std::env::var("STEVEDORE_BENCH").as_deref() == Ok("short");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    match rt.block_on(run(if short { &SHORT } else { &FULL })) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_oci: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(mode: &Mode) -> Res<()> {
    let docker = common::raw_docker().await?;
    let dir = tempfile::Builder::new().prefix("stevedore-bench-oci-").tempdir().map_err(|e| e.to_string())?;
    let rung = OciExecutor::new(OciConfig::default().log_dir(dir.path().join("logs")))
        .await
        .map_err(|e| format!("the oci rung: {}", stevedore::error_chain(&e)))?;
    common::build_busybox(&docker, rung.engine()).await?;
    let image = common::BUSYBOX_IMAGE;
    let worker = format!("bench-oci-{:08x}", std::process::id());
    let (runtime, version) = rung.runtime();
    println!("bench_oci: {} ({version}); {}", runtime.display(), load());
    let runtime = runtime.to_owned();
    let bare = bare_bundle(&docker, dir.path(), image).await?;
    let bin = stevedore_bin()?;
    let b = Bench { rung, docker, dir: dir.path().to_owned(), worker, image, runtime, bare, bin };
    let result = measure(&b, mode).await;
    b.rung.close().await;
    result?;
    match gvisor::find_runsc() {
        Some(runsc) => under_gvisor(&b, &runsc, mode).await?,
        None => println!("(v) gVisor: no runsc installed; not measured"),
    }
    // The images' exports are the only engine objects the rung makes: none may be left.
    match common::leftovers(&b.docker, &b.worker).await? {
        left if left.is_empty() => Ok(()),
        left => Err(format!("left in the engine: {left:?}")),
    }
}

struct Bench {
    rung: OciExecutor,
    docker: Docker,
    dir: PathBuf,
    worker: String,
    image: &'static str,
    runtime: PathBuf,
    bare: PathBuf,
    bin: PathBuf,
}

async fn measure(b: &Bench, mode: &Mode) -> Res<()> {
    // Warm-up of each (the image cache filled; not counted).
    b.docker_run().await?;
    b.runc_run(0).await?;
    b.attempt().await?;
    b.command().await?;
    let (mut dr, mut rr, mut c, mut j) =
        (Samples::default(), Samples::default(), Samples::default(), Samples::default());
    for i in 0..mode.rounds {
        for k in 0..4 {
            match (i + k) % 4 {
                0 => dr.0.push(b.docker_run().await?),
                1 => rr.0.push(b.runc_run(i + 1).await?),
                2 => c.0.push(b.attempt().await?),
                _ => j.0.push(b.command().await?),
            }
        }
    }
    println!("(b) docker run --rm: {}", dr.ms());
    println!("(r) runc run, a bare bundle: {}", rr.ms());
    println!("(c) cold attempt of true: {}", c.ms());
    println!("(j) stevedore run --rung oci … true: {}", j.ms());
    let (bm, rm, cm) = (dr.at(0.5), rr.at(0.5), c.at(0.5));
    target("(c) p50 / (b)", format!("{:.2} ×", cm / bm), "≤ 0.3 ×", cm <= 0.3 * bm);
    target("(c) p50 / (r)", format!("{:.2} ×", cm / rm), "≤ 1.5 ×", cm <= 1.5 * rm);
    target("(c) p90 / (b)", format!("{:.2} ×", c.at(0.9) / bm), "≤ 0.5 ×", c.at(0.9) <= 0.5 * bm);
    target("(j) p50 / (b)", format!("{:.2} ×", j.at(0.5) / bm), "≤ 0.4 ×", j.at(0.5) <= 0.4 * bm);

    let ours = batch(mode.batch, || b.attempt()).await?;
    let raw = batch(mode.batch, || b.raw_api()).await?;
    println!("(f) 4 in flight: {ours:.1} attempts/s; (a) the raw Docker API: {raw:.1}/s");
    target("(f) / (a)", format!("{:.2} ×", ours / raw), "≥ 2.5 ×", ours >= 2.5 * raw);

    for &(files, bytes) in mode.collect {
        let rate = b.collection(files, bytes).await?;
        let what = format!("(g) collection of {} MiB in {files} file(s), hashed", bytes >> 20);
        target(&what, format!("{rate:.0} MB/s"), "≥ 1000 MB/s", rate >= 1000.0);
    }
    let ours = |e: &std::fs::DirEntry| e.file_name().to_string_lossy().starts_with(&format!("{}-", b.worker));
    let left = std::fs::read_dir(b.rung.bundles_dir()).map(|d| d.flatten().filter(ours).count()).unwrap_or(0);
    match left {
        0 => Ok(()),
        n => Err(format!("{n} bundles left behind")),
    }
}

/// (v) against (bv): the rung under `runsc` and `docker run --runtime` of the same runsc.
async fn under_gvisor(b: &Bench, runsc: &Path, mode: &Mode) -> Res<()> {
    let cfg = OciConfig::default()
        .log_dir(b.dir.join("logs"))
        .runtime(runsc)
        .runtime_args(["--platform=ptrace", "--network=none"]);
    let rung =
        OciExecutor::new(cfg).await.map_err(|e| format!("the oci rung under runsc: {}", stevedore::error_chain(&e)))?;
    let registered = tokio::task::block_in_place(|| gvisor::Registered::runsc(runsc))?;
    let docker_run = || {
        let mut cmd = tokio::process::Command::new("docker");
        cmd.args(["run", "--rm", "--network", "none", "--runtime", &registered.name, b.image, "true"]);
        cmd
    };
    let measured = async {
        // Warm-up of each (the image cache filled; not counted).
        Bench::timed("(bv) docker run --runtime", &mut docker_run()).await?;
        b.attempt_on(&rung).await?;
        let (mut dv, mut v) = (Samples::default(), Samples::default());
        for i in 0..mode.gvisor_pairs {
            if i % 2 == 0 {
                dv.0.push(Bench::timed("(bv) docker run --runtime", &mut docker_run()).await?);
                v.0.push(b.attempt_on(&rung).await?);
            } else {
                v.0.push(b.attempt_on(&rung).await?);
                dv.0.push(Bench::timed("(bv) docker run --runtime", &mut docker_run()).await?);
            }
        }
        Ok::<_, String>((dv, v))
    }
    .await;
    rung.close().await;
    tokio::task::block_in_place(|| drop(registered));
    let (dv, v) = measured?;
    println!("(bv) docker run --rm --runtime runsc: {}", dv.ms());
    println!("(v) cold attempt of true under runsc: {}", v.ms());
    let (dm, vm) = (dv.at(0.5), v.at(0.5));
    target("(v) p50 / (bv)", format!("{:.2} ×", vm / dm), "≤ 1.0 ×", vm <= dm);
    Ok(())
}

/// `n` runs of `one`, 4 at a time: runs per second.
async fn batch<F, Fut>(n: usize, one: F) -> Res<f64>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Res<f64>>,
{
    let start = Instant::now();
    let mut runs = futures_util::stream::iter((0..n).map(|_| one())).buffer_unordered(4);
    while let Some(r) = runs.next().await {
        r?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

impl Bench {
    fn out(&self) -> PathBuf {
        self.dir.join(format!("out-{:016x}", rand::random::<u64>()))
    }

    /// One cold attempt of `true`, timed from the call to its Outcome.
    async fn attempt(&self) -> Res<f64> {
        self.attempt_on(&self.rung).await
    }

    /// One cold attempt of `true` on `rung`.
    async fn attempt_on(&self, rung: &OciExecutor) -> Res<f64> {
        let req = Request::command("bench", ["true"], self.out()).worker(&self.worker).image(self.image);
        let start = Instant::now();
        let o = rung.run(&req, CancellationToken::new()).await.map_err(|e| stevedore::error_chain(&e))?;
        let took = start.elapsed().as_secs_f64();
        match o.status {
            Status::Ok => Ok(took),
            s => Err(format!("(c) an attempt ended {s}: {}", o.to_json())),
        }
    }

    async fn timed(what: &str, cmd: &mut tokio::process::Command) -> Res<f64> {
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).kill_on_drop(true);
        let start = Instant::now();
        let out = cmd.output().await.map_err(|e| format!("{what}: {e}"))?;
        let took = start.elapsed().as_secs_f64();
        match out.status.success() {
            true => Ok(took),
            false => Err(format!("{what}: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim())),
        }
    }

    async fn docker_run(&self) -> Res<f64> {
        let mut cmd = tokio::process::Command::new("docker");
        cmd.args(["run", "--rm", "--network", "none", self.image, "true"]);
        Self::timed("(b) docker run --rm", &mut cmd).await
    }

    async fn runc_run(&self, i: usize) -> Res<f64> {
        let mut cmd = tokio::process::Command::new(&self.runtime);
        let id = format!("{}-bare-{i}", self.worker);
        cmd.arg("--root").arg(self.dir.join("bare-state")).args(["run", "--bundle"]).arg(&self.bare).arg(&id);
        Self::timed("(r) runc run", &mut cmd).await
    }

    async fn command(&self) -> Res<f64> {
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.args(["run", "-q", "--rung", "oci", "--worker", &self.worker, "--image", self.image, "--logs"])
            .arg(self.dir.join("logs"))
            .arg("--output")
            .arg(self.out())
            .args(["--", "true"]);
        Self::timed("(j) stevedore run --rung oci", &mut cmd).await
    }

    /// (a): create, start, wait and remove through the API, with stevedore's hardening flags.
    async fn raw_api(&self) -> Res<f64> {
        let start = Instant::now();
        let body = ContainerCreateBody {
            image: Some(self.image.to_owned()),
            cmd: Some(vec!["true".into()]),
            user: Some("65532:65532".into()),
            host_config: Some(HostConfig {
                network_mode: Some("none".into()),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                readonly_rootfs: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = |e: bollard::errors::Error| format!("(a) the raw API: {e}");
        let id = self.docker.create_container(None, body).await.map_err(e)?.id;
        let ran = async {
            self.docker.start_container(&id, None).await?;
            let mut wait = self.docker.wait_container(&id, None::<WaitContainerOptions>);
            while wait.next().await.transpose()?.is_some() {}
            Ok::<_, bollard::errors::Error>(())
        }
        .await;
        let rm = RemoveContainerOptionsBuilder::default().force(true).build();
        self.docker.remove_container(&id, Some(rm)).await.map_err(e)?;
        ran.map_err(e)?;
        Ok(start.elapsed().as_secs_f64())
    }

    /// One attempt writing `bytes` of zeros into `files` files under `/out`: MB/s of its
    /// collection (the record to the outputs extracted and hashed).
    async fn collection(&self, files: usize, bytes: u64) -> Res<f64> {
        let each = bytes / files as u64;
        let script = format!(
            "i=0; while [ $i -lt {files} ]; do head -c {each} /dev/zero > /out/f$i || exit 1; i=$((i+1)); done"
        );
        // `/out` is a tmpfs: its pages count as the attempt's memory.
        let limits = ResourceLimits::new().with("memory", 2 * bytes + (256 << 20)).with("disk", bytes + (64 << 20));
        let out = self.out();
        let req = Request::command("bench", ["sh", "-c", &script], &out)
            .worker(&self.worker)
            .image(self.image)
            .limits(limits);
        let o = self.rung.run(&req, CancellationToken::new()).await.map_err(|e| stevedore::error_chain(&e))?;
        let got: u64 = o.outputs.iter().map(|f| f.size).sum();
        if o.status != Status::Ok || o.outputs.len() != files || got != each * files as u64 {
            return Err(format!("(g) {files} file(s): {} outputs, {got} bytes: {}", o.outputs.len(), o.to_json()));
        }
        let secs = o.evidence.collection.as_ref().map(|c| c.elapsed_ms as f64 / 1e3).ok_or("(g) no collection")?;
        let _ = std::fs::remove_dir_all(&out);
        Ok(got as f64 / 1e6 / secs.max(1e-3))
    }
}

/// A bare bundle of the image's root filesystem: `runc spec`'s, running `true`, no terminal.
async fn bare_bundle(docker: &Docker, dir: &Path, image: &str) -> Res<PathBuf> {
    let bundle = dir.join("bare");
    let rootfs = bundle.join("rootfs");
    std::fs::create_dir_all(&rootfs).map_err(|e| e.to_string())?;
    let body =
        ContainerCreateBody { image: Some(image.to_owned()), cmd: Some(vec!["true".into()]), ..Default::default() };
    let id = docker.create_container(None, body).await.map_err(|e| format!("export: {e}"))?.id;
    let mut export = docker.export_container(&id);
    let mut tar = Vec::new();
    while let Some(chunk) = export.next().await {
        tar.extend_from_slice(&chunk.map_err(|e| format!("export: {e}"))?);
    }
    let rm = RemoveContainerOptionsBuilder::default().force(true).build();
    docker.remove_container(&id, Some(rm)).await.map_err(|e| format!("export: {e}"))?;
    tar::Archive::new(&tar[..]).unpack(&rootfs).map_err(|e| format!("unpacking the bare rootfs: {e}"))?;
    let spec = std::process::Command::new("runc")
        .args(["spec", "--bundle"])
        .arg(&bundle)
        .status()
        .map_err(|e| format!("runc spec: {e}"))?;
    if !spec.success() {
        return Err(format!("runc spec: {spec}"));
    }
    let path = bundle.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    config["process"]["terminal"] = false.into();
    config["process"]["args"] = serde_json::json!(["true"]);
    std::fs::write(&path, serde_json::to_vec(&config).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    Ok(bundle)
}

/// The `stevedore` binary beside this example's build (`cargo build` makes it).
fn stevedore_bin() -> Res<PathBuf> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let bin = exe.parent().and_then(Path::parent).map(|d| d.join("stevedore")).ok_or("no build dir")?;
    match bin.is_file() {
        true => Ok(bin),
        false => Err(format!("{} is missing: `cargo build` (of the same profile) first", bin.display())),
    }
}

fn load() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!("load {}", l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}
