//! Shared helpers of the integration tests: the engine, cached test images, running a
//! throwaway container.

// Each test crate uses its own subset of these helpers.
#![allow(dead_code)]

use bollard::Docker;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptionsBuilder, ListVolumesOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder,
};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;
use tokio::sync::OnceCell;

pub mod guard;
pub use guard::{skip, time_limit};

/// The tag of the cached busybox test image.
pub const BUSYBOX_IMAGE: &str = "stevedore-test/busybox:latest";
/// The label every test image and container carries (never `dev.stevedore.managed`:
/// test images are not per-attempt objects).
pub const TEST_LABEL: &str = "dev.stevedore.test";
const BUSYBOX_SHA_LABEL: &str = "dev.stevedore.test.busybox_sha256";
const BUSYBOX: &str = "/bin/busybox";

pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// The engine under test, negotiated: the one `DOCKER_HOST` (and `DOCKER_TLS_VERIFY`,
/// `DOCKER_CERT_PATH`) name, else the local socket. `None` (after printing `SKIP: ...`)
/// when it is unreachable outside CI; under `CI=true` an unreachable engine fails the test.
/// The tests' own client, beside stevedore's ([`seam`]): what a test checks, it checks
/// without stevedore's help.
pub async fn engine() -> Option<Docker> {
    time_limit();
    let attempt = async {
        seam_of().await?;
        let host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into());
        let v = bollard::API_DEFAULT_VERSION;
        let tls = std::env::var("DOCKER_TLS_VERIFY").is_ok_and(|t| !t.is_empty() && t != "0");
        let docker = match host.split_once("://") {
            Some(("unix", path)) => Docker::connect_with_unix(path, 120, v),
            Some(("tcp", _)) if tls => {
                let dir = std::path::PathBuf::from(std::env::var("DOCKER_CERT_PATH").unwrap_or_default());
                let (key, cert, ca) = (dir.join("key.pem"), dir.join("cert.pem"), dir.join("ca.pem"));
                Docker::connect_with_ssl(&host.replacen("tcp://", "https://", 1), &key, &cert, &ca, 120, v)
            }
            Some(("tcp", _)) => Docker::connect_with_http(&host, 120, v),
            Some(("ssh", _)) => Docker::connect_with_ssh(&host, 120, v, None),
            _ => return Err(format!("DOCKER_HOST={host} is not one the tests can reach")),
        }
        .map_err(|e| e.to_string())?;
        docker.negotiate_version().await.map_err(|e| e.to_string())
    };
    match attempt.await {
        Ok(docker) => Some(docker),
        Err(why) if in_ci() => {
            panic!("CI=true and no Docker engine is reachable ({why}): tests that need it must fail")
        }
        Err(why) => {
            eprintln!("SKIP: no Docker engine ({why})");
            skip("no Docker engine");
            None
        }
    }
}

/// stevedore's own connection to the engine under test (for `stevedore::image`), made once.
/// Call it after [`engine`] said the engine is there.
pub async fn seam() -> &'static stevedore::engine::Engine {
    seam_of().await.expect("the engine was reachable a moment ago")
}

async fn seam_of() -> Result<&'static stevedore::engine::Engine, String> {
    static SEAM: OnceCell<stevedore::engine::Engine> = OnceCell::const_new();
    SEAM.get_or_try_init(|| async {
        let conn = stevedore::engine::Connection { allow_insecure_tcp: true, ..Default::default() };
        stevedore::engine::Engine::connect(&conn, Duration::from_secs(60)).await.map_err(|e| stevedore::error_chain(&e))
    })
    .await
}

/// Builds (once per test process, reused across processes while /bin/busybox is the
/// same) a `FROM scratch` image with Debian's static busybox installed in /bin.
pub async fn busybox_image(docker: &Docker) -> String {
    static BUILT: OnceCell<String> = OnceCell::const_new();
    BUILT
        .get_or_init(|| async {
            let sha = sha256_of(Path::new(BUSYBOX))
                .unwrap_or_else(|e| panic!("{BUSYBOX} is needed (apt-get install busybox-static): {e}"));
            if let Ok(image) = docker.inspect_image(BUSYBOX_IMAGE).await {
                let labels = image.config.and_then(|c| c.labels).unwrap_or_default();
                if labels.get(TEST_LABEL).is_some_and(|v| v == "true") && labels.get(BUSYBOX_SHA_LABEL) == Some(&sha) {
                    return BUSYBOX_IMAGE.to_owned();
                }
            }
            let dockerfile = format!(
                "FROM scratch\nCOPY busybox /bin/busybox\n\
                 RUN [\"/bin/busybox\",\"--install\",\"-s\",\"/bin\"]\n\
                 LABEL {TEST_LABEL}=true {BUSYBOX_SHA_LABEL}={sha}\n"
            );
            let busybox = std::fs::read(BUSYBOX).unwrap();
            let context = tar_of(&[("Dockerfile", 0o644, dockerfile.as_bytes()), ("busybox", 0o755, &busybox)]);
            stevedore::image::build_image_from_dir_tar(seam().await, BUSYBOX_IMAGE, context)
                .await
                .unwrap_or_else(|e| panic!("building {BUSYBOX_IMAGE}: {e:?}"));
            BUSYBOX_IMAGE.to_owned()
        })
        .await
        .clone()
}

/// A tar of in-memory files, owned by 0:0.
pub fn tar_of(files: &[(&str, u32, &[u8])]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, mode, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(*mode);
        header.set_uid(0);
        header.set_gid(0);
        tar.append_data(&mut header, path, *data).unwrap();
    }
    tar.into_inner().unwrap()
}

/// What a throwaway container did.
#[derive(Debug)]
pub struct Ran {
    /// Its exit code.
    pub code: i64,
    /// Its stdout and stderr, interleaved.
    pub output: String,
}

/// Runs `cmd` (after the image's entrypoint) in a fresh container as `user` (when given),
/// waits for it, and removes it whatever happened.
pub async fn run_container(docker: &Docker, image: &str, user: Option<&str>, cmd: &[&str]) -> Ran {
    let body = ContainerCreateBody {
        image: Some(image.to_owned()),
        user: user.map(str::to_owned),
        cmd: (!cmd.is_empty()).then(|| cmd.iter().map(|s| s.to_string()).collect()),
        labels: Some(HashMap::from([(TEST_LABEL.to_owned(), "true".to_owned())])),
        network_disabled: Some(true),
        ..Default::default()
    };
    finish_container(docker, image, body).await
}

/// Creates, starts and waits for a container, collects its logs and removes it.
async fn finish_container(docker: &Docker, image: &str, body: ContainerCreateBody) -> Ran {
    let created = docker
        .create_container(None::<CreateContainerOptions>, body)
        .await
        .unwrap_or_else(|e| panic!("create from {image}: {e}"));
    let id = created.id;
    let result = async {
        docker.start_container(&id, None).await.map_err(|e| format!("start: {e}"))?;
        let code = match docker.wait_container(&id, None).next().await {
            Some(Ok(r)) => r.status_code,
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => code,
            Some(Err(e)) => return Err(format!("wait: {e}")),
            None => return Err("wait: no answer".to_owned()),
        };
        let mut logs = docker.logs(&id, Some(LogsOptionsBuilder::new().stdout(true).stderr(true).build()));
        let mut output = String::new();
        while let Some(chunk) = logs.next().await {
            output.push_str(&chunk.map_err(|e| format!("logs: {e}"))?.to_string());
        }
        Ok(Ran { code, output })
    }
    .await;
    let removed = docker.remove_container(&id, Some(RemoveContainerOptionsBuilder::new().force(true).build())).await;
    let ran = result.unwrap_or_else(|e| panic!("container {id} from {image}: {e}"));
    removed.unwrap_or_else(|e| panic!("remove container {id}: {e}"));
    ran
}

/// Runs `sh -c script` in a fresh container of `image` in the engine host's own network
/// namespace, and returns what it printed (the engine's side of a published port).
pub async fn run_in_host_network(docker: &Docker, image: &str, script: &str) -> String {
    let body = ContainerCreateBody {
        image: Some(image.to_owned()),
        cmd: Some(vec!["sh".into(), "-c".into(), script.into()]),
        labels: Some(HashMap::from([(TEST_LABEL.to_owned(), "true".to_owned())])),
        host_config: Some(bollard::models::HostConfig { network_mode: Some("host".into()), ..Default::default() }),
        ..Default::default()
    };
    finish_container(docker, image, body).await.output
}

/// Removes an image by tag or id; a missing one is fine.
pub async fn remove_image(docker: &Docker, image: &str) {
    use bollard::query_parameters::RemoveImageOptionsBuilder;
    // Its untagged parents go with it: tests build their images with layers of their own
    // (a layer two builds shared could be pruned under the other's feet).
    match docker.remove_image(image, Some(RemoveImageOptionsBuilder::new().force(true).build()), None).await {
        Ok(_) => {}
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
        Err(e) => panic!("remove image {image}: {e}"),
    }
}

/// A worker ID unique to one test.
pub fn worker(tag: &str) -> String {
    // Every test names a worker: each is then under the time limit, whatever else it uses.
    time_limit();
    format!("t-{tag}-{:08x}", rand::random::<u32>())
}

/// The containers (ids) and volumes (names) in the engine labelled with `worker`.
pub async fn labelled(docker: &Docker, worker: &str) -> (Vec<String>, Vec<String>) {
    let filters = stevedore::container::labels::worker_filter(worker);
    let containers = docker
        .list_containers(Some(ListContainersOptionsBuilder::default().all(true).filters(&filters).build()))
        .await
        .expect("list containers");
    let volumes = docker
        .list_volumes(Some(ListVolumesOptionsBuilder::default().filters(&filters).build()))
        .await
        .expect("list volumes");
    // Checked again here: Podman ORs repeated label filters.
    let mine = |l: &HashMap<String, String>| stevedore::container::labels::reclaimable_by(l, worker);
    (
        containers.into_iter().filter(|c| c.labels.as_ref().is_some_and(mine)).filter_map(|c| c.id).collect(),
        volumes.volumes.unwrap_or_default().into_iter().filter(|v| mine(&v.labels)).map(|v| v.name).collect(),
    )
}

/// The volumes (names) labelled with the process incarnation `incarnation`: what is left of a
/// rung's tools volumes.
pub async fn volumes_of_incarnation(docker: &Docker, incarnation: &str) -> Vec<String> {
    let label = format!("{}={incarnation}", stevedore::container::labels::INCARNATION);
    let filters = HashMap::from([("label", vec![label.as_str()])]);
    let volumes = docker
        .list_volumes(Some(ListVolumesOptionsBuilder::default().filters(&filters).build()))
        .await
        .expect("list volumes");
    volumes.volumes.unwrap_or_default().into_iter().map(|v| v.name).collect()
}

/// The `stevedore` binary of this build: the command, and the worker binary of test images.
pub const BIN: &str = env!("CARGO_BIN_EXE_stevedore");

/// The sha256 of a file, as 64 lowercase hex digits.
pub fn sha256_of(path: &Path) -> std::io::Result<String> {
    let h = stevedore::hash_reader(std::fs::File::open(path)?, 0)?;
    Ok(h.hash.trim_start_matches("sha256:").to_owned())
}

/// The command's live output of one or more requests, watched.
pub struct Watch {
    rx: tokio::sync::mpsc::Receiver<stevedore::LiveChunk>,
    /// Everything seen on stdout so far.
    pub stdout: String,
}

/// Sends `reqs`' live output to a new [`Watch`].
pub fn watch<'a>(reqs: impl IntoIterator<Item = &'a mut stevedore::Request>) -> Watch {
    let (live, rx) = stevedore::LiveOutput::channel(4096);
    for r in reqs {
        r.live = Some(live.clone());
    }
    Watch { rx, stdout: String::new() }
}

impl Watch {
    /// Waits until stdout (since the last match) carries `word`.
    pub async fn until(&mut self, word: &str) {
        loop {
            if let Some(at) = self.stdout.find(word) {
                self.stdout.drain(..at + word.len());
                return;
            }
            let chunk = self.rx.recv().await.expect("the live output ended before the word");
            if chunk.stream == stevedore::Stream::Stdout {
                self.stdout.push_str(&String::from_utf8_lossy(&chunk.bytes));
            }
        }
    }

    /// Waits until stdout carries `word`, or fails the test with what `task` (the attempt
    /// that should say it) ended with, should it end first: a request keeps its own sender,
    /// so the output alone would never end.
    pub async fn until_or_end<T: std::fmt::Debug>(&mut self, word: &str, task: &mut tokio::task::JoinHandle<T>) {
        tokio::select! {
            () = self.until(word) => {}
            ended = task => panic!("the attempt ended before it said {word:?}: {ended:?} (stdout so far: {:?})", self.stdout),
        }
    }

    /// The next chunk of stdout, `None` once every sender is gone.
    pub async fn next_stdout(&mut self) -> Option<String> {
        loop {
            let chunk = self.rx.recv().await?;
            if chunk.stream == stevedore::Stream::Stdout {
                return Some(String::from_utf8_lossy(&chunk.bytes).into_owned());
            }
        }
    }
}

/// The engine and the busybox test image, or `None` (see [`engine`]).
pub async fn setup() -> Option<(Docker, String)> {
    let docker = engine().await?;
    let image = busybox_image(&docker).await;
    Some((docker, image))
}

/// Where the library's tests keep their attempts' captures: the build's own dir, so that the
/// suite leaves nothing in stevedore's dirs on the host (`cargo clean` removes them).
pub fn test_logs() -> std::path::PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("logs")
}

/// A container rung under a fresh incarnation (as if of its own process).
pub async fn rung_with(mut cfg: stevedore::container::ContainerConfig) -> stevedore::container::ContainerExecutor {
    cfg.log_dir.get_or_insert_with(test_logs);
    let cfg = cfg.incarnation(stevedore::contract::incarnation::mint());
    stevedore::container::ContainerExecutor::connect(cfg).await.expect("connect")
}

/// A container rung with the default configuration.
pub async fn rung() -> stevedore::container::ContainerExecutor {
    rung_with(Default::default()).await
}

/// A request to run `sh -c script` in `image` for `worker`, outputs into `out`.
pub fn sh(image: &str, worker: &str, out: &Path, script: &str) -> stevedore::Request {
    stevedore::Request::command("job", ["sh", "-c", script], out).worker(worker).image(image)
}

/// Runs `req` to its outcome (a launch error fails the test).
pub async fn run(rung: &stevedore::container::ContainerExecutor, req: &stevedore::Request) -> stevedore::Outcome {
    use stevedore::Executor;
    rung.run(req, tokio_util::sync::CancellationToken::new()).await.expect("the attempt runs")
}

/// On `rung`: a command that ignores SIGTERM past its deadline is SIGKILLed after the grace
/// (`timeout`, signal 9, what it wrote to `/out` kept), and a cancellation once it said
/// `ready` stops it (`killed`, `cancelled`). Dirs for the outputs under `dir`.
pub async fn a_deadline_and_a_cancellation_stop(rung: &dyn stevedore::Executor, image: &str, w: &str, dir: &Path) {
    use std::time::Duration;
    use stevedore::Status;
    let req = sh(image, w, &dir.join("deadline"), "trap '' TERM; echo partial > /out/p; while :; do sleep 1; done")
        .grace(Duration::from_secs(1))
        .timeout(Duration::from_secs(3));
    let o = rung.run(&req, tokio_util::sync::CancellationToken::new()).await.expect("the attempt runs");
    assert_eq!((o.status, o.signal), (Status::Timeout, Some(9)), "{}: {}", rung.name(), o.to_json());
    assert_eq!(o.outputs.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["p"]);
    let mut req = sh(image, w, &dir.join("cancel"), "echo ready; sleep 60").grace(Duration::from_secs(5));
    let mut watch = watch([&mut req]);
    let token = tokio_util::sync::CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        watch.until("ready").await;
        cancel.cancel();
    });
    let o = rung.run(&req, token).await.expect("the attempt runs");
    assert_eq!((o.status, o.reason.map(|r| r.as_str())), (Status::Killed, Some("cancelled")), "{}", o.to_json());
}

/// What the attempt's command wrote to stdout (the capture file).
pub fn stdout_of(o: &stevedore::Outcome) -> String {
    std::fs::read_to_string(o.evidence.logs.stdout.path.as_ref().expect("stdout captured")).unwrap()
}

/// Starts `stevedore run --worker w` of a command that says `ready` on stderr and then
/// sleeps; returns once it said so (its stderr keeps being drained).
pub fn start_sleeper(image: &str, w: &str, out: &Path) -> std::process::Child {
    let mut child = std::process::Command::new(BIN)
        .args(["run", "--outcome", "-", "--worker", w, "--image", image, "--grace", "2s", "--output"])
        .arg(out)
        .args(["--", "sh", "-c", "echo ready >&2; sleep 300"])
        // The init from a tools volume: what a crash leaves includes it, for reclaim to find.
        .env("STEVEDORE_INIT_FROM", "volume")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    stderr_until(&mut child, "ready");
    child
}

/// Waits until `child`'s stderr says a line with `word` in it (a process that ends first
/// fails the test); the rest of its stderr is drained on a thread, so the child never blocks
/// on a full pipe.
pub fn stderr_until(child: &mut std::process::Child, word: &str) {
    use std::io::{BufRead, BufReader};
    let mut lines = BufReader::new(child.stderr.take().expect("stderr piped")).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains(word) => break,
            Some(Ok(_)) => continue,
            other => panic!("the process ended before it said {word:?}: {other:?}"),
        }
    }
    std::thread::spawn(move || for _ in lines {});
}

/// SIGKILLs `child` (a worker that dies without a word) and reaps it.
pub fn kill9(mut child: std::process::Child) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    child.wait().unwrap();
}

/// This build's `stevedore` binary without its debug sections (a fifth of the size: a
/// remote or emulated engine takes it in seconds), made once per build.
pub fn stripped_bin() -> std::path::PathBuf {
    static PATH: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let bin = Path::new(BIN);
        let out = bin.with_file_name(format!("stevedore-stripped-{}", sha256_of(bin).unwrap()));
        if !out.exists() {
            let tmp = out.with_extension(format!("tmp-{}", std::process::id()));
            let status = std::process::Command::new("strip").arg("-o").arg(&tmp).arg(bin).status().expect("strip runs");
            assert!(status.success(), "strip failed");
            std::fs::rename(&tmp, &out).unwrap();
        }
        out
    })
    .clone()
}

/// Packs this build's `stevedore` binary (dynamic, stripped, `FROM scratch`) as `tag`,
/// labelled with `fingerprint` as its handler set; reused while the binary is the same.
pub async fn pack_worker(tag: &str, fingerprint: String) -> String {
    let mut spec = stevedore::image::PackSpec::new(stripped_bin(), tag);
    spec.fingerprint = Some(fingerprint);
    spec.labels.insert(TEST_LABEL.to_owned(), "true".to_owned());
    stevedore::image::ensure_image(seam().await, &spec).await.unwrap_or_else(|e| panic!("packing {tag}: {e}"));
    tag.to_owned()
}

/// The worker image of the tests: this build's binary with its real handler-set fingerprint.
pub async fn worker_image() -> String {
    static IMAGE: OnceCell<String> = OnceCell::const_new();
    IMAGE
        .get_or_init(|| pack_worker("stevedore-test/worker:latest", stevedore::handlers::builtin().fingerprint()))
        .await
        .clone()
}

/// The labels that make an object `worker`'s in stevedore's eyes (what `reclaim` looks for).
pub fn worker_labels(worker: &str) -> HashMap<String, String> {
    use stevedore::container::labels::{MANAGED, WORKER};
    HashMap::from([(MANAGED.to_owned(), "true".to_owned()), (WORKER.to_owned(), worker.to_owned())])
}

/// Creates (does not start) a container `name` from `image` with `labels`, running `cmd`
/// when started; returns its name. A leftover for reclaim to find, or to leave alone.
pub async fn create_named(
    docker: &Docker,
    image: &str,
    name: String,
    labels: HashMap<String, String>,
    cmd: &[&str],
) -> String {
    let body = ContainerCreateBody {
        image: Some(image.to_owned()),
        cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
        labels: Some(labels),
        network_disabled: Some(true),
        ..Default::default()
    };
    let options = bollard::query_parameters::CreateContainerOptionsBuilder::default().name(&name).build();
    docker.create_container(Some(options), body).await.unwrap_or_else(|e| panic!("create {name}: {e}"));
    name
}

/// [`setup`] plus a default [`rung`].
pub async fn setup_with_rung() -> Option<(Docker, String, stevedore::container::ContainerExecutor)> {
    let (docker, image) = setup().await?;
    Some((docker, image, rung().await))
}

/// Runs `sh -c script` in the container; its exit code.
pub async fn exec(docker: &Docker, id: &str, script: &str) -> i64 {
    let opts = bollard::exec::CreateExecOptions::<String> {
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        cmd: Some(vec!["sh".into(), "-c".into(), script.into()]),
        ..Default::default()
    };
    let created = docker.create_exec(id, opts).await.unwrap();
    let start = bollard::exec::StartExecOptions { detach: false, tty: false, output_capacity: None };
    if let bollard::exec::StartExecResults::Attached { mut output, .. } =
        docker.start_exec(&created.id, Some(start)).await.unwrap()
    {
        while output.next().await.is_some() {}
    }
    docker.inspect_exec(&created.id).await.unwrap().exit_code.unwrap_or(-1)
}

/// Whether `cond` holds within `within`, checked every 100 ms: a condition polled, never a
/// sleep standing in for one.
pub async fn eventually(within: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
