//! The isolation level is shown, not named (issue 45): a rung claims `vm` only when the init
//! saw a kernel other than the host's. A runtime registered with the local engine under a
//! VM-grade name that is runc underneath proves it: the attempt is `sandboxed`, with the
//! kernel the init saw and why in the evidence.
//!
//! The engine's `daemon.json` is changed here only by merging one uniquely named runtime in,
//! reloaded with SIGHUP (the engine's `reload` event is the signal it was taken; never a
//! restart: other tests share the engine), and restored, again with SIGHUP, on every way out
//! of the test (a guard's `Drop`, run on a panic too).

use crate::support;
use futures_util::StreamExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use stevedore::contract::{Level, Status};
use stevedore::{Executor, container::ContainerConfig};
use tokio_util::sync::CancellationToken;

const DAEMON_JSON: &str = "/etc/docker/daemon.json";

/// One change to the engine's configuration at a time in this process: each test holds it
/// from its merge to its restore.
static ENGINE_CONFIG: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The engine's configuration as it was: put back by [`Restore::restore`] at the test's end,
/// by `Drop` (blocking, bounded) on a panic.
struct Restore {
    path: PathBuf,
    before: Option<Vec<u8>>,
    dockerd: nix::unistd::Pid,
    name: String,
    done: bool,
}

impl Restore {
    /// The original configuration with its runtimes said explicitly: dockerd's reload keeps
    /// the runtimes it has when the file names none, so the added one goes only by a reload
    /// of a file that says which there are.
    fn explicit(&self) -> Vec<u8> {
        let mut conf: serde_json::Value =
            self.before.as_deref().map_or(serde_json::json!({}), |b| serde_json::from_slice(b).unwrap());
        let obj = conf.as_object_mut().unwrap();
        if !obj.contains_key("runtimes") {
            obj.insert("runtimes".into(), serde_json::json!({}));
        }
        serde_json::to_vec_pretty(&conf).unwrap()
    }

    fn put_back_bytes(&self) {
        let _ = match &self.before {
            Some(bytes) => write_atomically(&self.path, bytes),
            None => std::fs::remove_file(&self.path),
        };
    }

    /// The engine back to what it had (reload awaited), then the file's own bytes.
    async fn restore(mut self, docker: &bollard::Docker) {
        write_atomically(&self.path, &self.explicit()).expect("daemon.json written");
        reload(docker, self.dockerd).await;
        self.put_back_bytes();
        self.done = true;
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let _ = write_atomically(&self.path, &self.explicit());
        let _ = nix::sys::signal::kill(self.dockerd, nix::sys::signal::Signal::SIGHUP);
        // A panic's way out: no event loop to wait on here, so the engine is asked (bounded)
        // until the runtime is gone, then the file gets its own bytes back.
        for _ in 0..100 {
            let out = std::process::Command::new("docker").args(["info", "--format", "{{json .Runtimes}}"]).output();
            if out.is_ok_and(|o| o.status.success() && !String::from_utf8_lossy(&o.stdout).contains(&self.name)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.put_back_bytes();
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("stevedore-test-{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// The local dockerd's pid, where this test may change its configuration: the engine under
/// test is the local one, and this process may write its `daemon.json`.
fn local_dockerd() -> Result<nix::unistd::Pid, String> {
    if std::env::var_os("DOCKER_HOST").is_some() {
        return Err("the engine under test is not the local one (DOCKER_HOST)".into());
    }
    if !nix::unistd::geteuid().is_root() {
        return Err("changing the engine's daemon.json needs root".into());
    }
    let pid = std::fs::read_dir("/proc")
        .map_err(|e| e.to_string())?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "dockerd"));
    pid.map(nix::unistd::Pid::from_raw).ok_or_else(|| "no dockerd runs here".into())
}

/// The local dockerd and the runtime to register (the first of `runtime` that exists), or
/// `None` after the skip is said; under `CI=true` with the local engine, a failure.
fn engine_to_change(runtime: &[&'static str]) -> Option<(nix::unistd::Pid, &'static str)> {
    let found = runtime.iter().copied().find(|p| Path::new(p).exists());
    let why = match (local_dockerd(), found) {
        (Ok(pid), Some(r)) => return Some((pid, r)),
        (Err(why), _) => why,
        (Ok(_), None) => format!("none of {runtime:?} is installed"),
    };
    if support::in_ci() && std::env::var_os("DOCKER_HOST").is_none() {
        panic!("CI=true and the engine's runtimes cannot be changed: {why}");
    }
    eprintln!("SKIP: {why}");
    support::skip(why);
    None
}

/// SIGHUP to dockerd, and its `reload` event awaited: asked for from the moment before the
/// signal (`since`, the engine's clock is this machine's), so a reload that comes before the
/// stream is connected is still delivered, and an earlier one is not taken for it.
async fn reload(docker: &bollard::Docker, dockerd: nix::unistd::Pid) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let since = format!("{}.{:09}", now.as_secs(), now.subsec_nanos());
    nix::sys::signal::kill(dockerd, nix::sys::signal::Signal::SIGHUP).expect("SIGHUP to dockerd");
    let opts = bollard::query_parameters::EventsOptionsBuilder::default()
        .since(&since)
        .filters(&std::collections::HashMap::from([("type", vec!["daemon"])]))
        .build();
    let mut events = docker.events(Some(opts));
    let reloaded = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(ev) = events.next().await {
            if ev.is_ok_and(|e| e.action.as_deref() == Some("reload")) {
                return;
            }
        }
    })
    .await;
    assert!(reloaded.is_ok(), "the engine did not reload its configuration within 60 s");
}

/// Merges `name` (`runtime`, the engine's runtime entry) into the engine's runtimes and waits
/// for its reload.
async fn register(
    docker: &bollard::Docker,
    name: &str,
    runtime: serde_json::Value,
    dockerd: nix::unistd::Pid,
) -> Restore {
    let path = PathBuf::from(DAEMON_JSON);
    let before = std::fs::read(&path).ok();
    let mut conf: serde_json::Value = match &before {
        Some(b) => serde_json::from_slice(b).expect("the engine's daemon.json is JSON"),
        None => serde_json::json!({}),
    };
    conf.as_object_mut()
        .expect("an object")
        .entry("runtimes")
        .or_insert_with(|| serde_json::json!({}))
        .as_object_mut()
        .expect("runtimes is an object")
        .insert(name.to_owned(), runtime);
    let restore = Restore { path: path.clone(), before, dockerd, name: name.to_owned(), done: false };
    write_atomically(&path, &serde_json::to_vec_pretty(&conf).unwrap()).expect("daemon.json written");
    reload(docker, dockerd).await;
    restore
}

#[tokio::test]
async fn a_runtime_named_vm_grade_that_is_runc_is_sandboxed_with_the_kernel_it_saw() {
    let Some((docker, image)) = support::setup().await else { return };
    let Some((dockerd, runc)) = engine_to_change(&["/usr/sbin/runc", "/usr/bin/runc"]) else { return };
    let _one = ENGINE_CONFIG.lock().await;
    let name = format!("stevedore-kata-lie-{:08x}", rand::random::<u32>());
    let before = std::fs::read(DAEMON_JSON).ok();
    let restore = register(&docker, &name, serde_json::json!({ "path": runc }), dockerd).await;
    let cfg = ContainerConfig::default().runtime(name.clone());
    assert_eq!(cfg.level(), Level::Vm, "the name claims it");
    let rung = support::rung_with(cfg).await;
    assert_eq!(rung.level(), Level::Sandboxed, "a claim counts only once shown");
    let w = support::worker("levels");
    let t = tempfile::tempdir().unwrap();
    let o = rung
        .run(&support::sh(&image, &w, &t.path().join("o"), "true"), CancellationToken::new())
        .await
        .expect("the attempt runs");
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(o.evidence.level, Some(Level::Sandboxed), "{}", o.to_json());
    let host = std::fs::read_to_string("/proc/version").unwrap();
    assert_eq!(o.evidence.kernel.as_deref(), host.lines().next(), "the kernel the init saw is the host's");
    assert!(
        o.evidence.notes.iter().any(|n| n.contains("level vm not shown") && n.contains("host's own kernel")),
        "{:?}",
        o.evidence.notes
    );
    // The registry selects by the level shown: a policy that needs `vm` gets nothing here.
    assert_eq!(rung.probe_level(&image).await.unwrap(), Level::Sandboxed);
    let mut registry = stevedore::Registry::new();
    registry.register(std::sync::Arc::new(rung.clone())).unwrap();
    assert!(registry.select(&stevedore::Policy::at_least(Level::Vm)).is_err(), "a name alone selects nothing");
    rung.close().await;
    restore.restore(&docker).await;
    let runtimes = docker.info().await.unwrap().runtimes.unwrap_or_default();
    assert!(!runtimes.contains_key(&name), "the runtime is gone from the engine again");
    assert_eq!(std::fs::read(DAEMON_JSON).ok(), before, "daemon.json has its own bytes again");
}

/// gVisor registered with the local engine (`runsc`, ptrace platform, no network: without it
/// every start fails in the host's network namespace): the container rung's attempt runs,
/// shows level `vm` by the kernel its init saw, keeps its exit code and outputs.
#[tokio::test]
async fn gvisor_registered_with_the_engine_runs_the_container_rung_at_level_vm() {
    let Some((docker, image)) = support::setup().await else { return };
    let Some((dockerd, runsc)) = engine_to_change(&["/usr/bin/runsc", "/usr/sbin/runsc"]) else { return };
    let _one = ENGINE_CONFIG.lock().await;
    let name = format!("stevedore-runsc-{:08x}", rand::random::<u32>());
    let before = std::fs::read(DAEMON_JSON).ok();
    let entry = serde_json::json!({ "path": runsc, "runtimeArgs": ["--platform=ptrace", "--network=none"] });
    let restore = register(&docker, &name, entry, dockerd).await;
    let rung = support::rung_with(ContainerConfig::default().runtime(name.clone()).name("docker-gvisor")).await;
    // Shown by a probe before any attempt: the registry then selects it for `vm`.
    assert_eq!(rung.level(), Level::Sandboxed, "a claim counts only once shown");
    let probed = rung.probe_level(&image).await;
    let mut registry = stevedore::Registry::new();
    registry.register(std::sync::Arc::new(support::rung().await)).unwrap();
    registry.register(std::sync::Arc::new(rung.clone())).unwrap();
    let selected = registry.select(&stevedore::Policy::at_least(Level::Vm)).map(|r| r.name().to_owned());
    let w = support::worker("levels-gvisor");
    let t = tempfile::tempdir().unwrap();
    let script = "cat /proc/version; echo out > /out/o.txt; exit 4";
    let o = rung.run(&support::sh(&image, &w, &t.path().join("o"), script), CancellationToken::new()).await;
    rung.close().await;
    restore.restore(&docker).await;
    assert_eq!(std::fs::read(DAEMON_JSON).ok(), before, "daemon.json has its own bytes again");
    assert_eq!(probed.expect("the probe runs"), Level::Vm);
    assert_eq!(selected.as_deref(), Ok(rung.name()), "the shown vm rung is selected");
    let o = o.expect("the attempt runs");
    assert_eq!(o.exit_code, Some(4), "{}", o.to_json());
    assert_eq!(o.evidence.level, Some(Level::Vm), "{}", o.to_json());
    assert!(o.evidence.kernel.as_deref().is_some_and(|k| k.starts_with("Linux version 4.4.0")), "{}", o.to_json());
    assert_eq!(o.outputs.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["o.txt"]);
    // gVisor shows its init no cgroup: the local engine's container cgroup, read by the host.
    assert!(o.usage.peak_memory_bytes.is_some_and(|b| b > 0), "{}", o.to_json());
    assert!(
        o.evidence.notes.iter().any(|n| n.contains("read by the host from the sandbox's cgroup")),
        "{:?}",
        o.evidence.notes
    );
}

/// gVisor on the container rung, as the acceptance cases it allows: inputs read-only; a
/// deadline (a command that ignores SIGTERM, SIGKILLed after the grace) and a cancellation
/// stop it; an OOM that takes the whole sandbox is told by the engine's `State.OOMKilled`,
/// named as the witness; a reclaim by another life of the worker removes an attempt that
/// runs; nothing labelled is left.
#[tokio::test]
async fn gvisor_on_the_container_rung_stops_tells_an_oom_and_is_reclaimed() {
    let Some((docker, image)) = support::setup().await else { return };
    let Some((dockerd, runsc)) = engine_to_change(&["/usr/bin/runsc", "/usr/sbin/runsc"]) else { return };
    let _one = ENGINE_CONFIG.lock().await;
    let name = format!("stevedore-runsc-{:08x}", rand::random::<u32>());
    let entry = serde_json::json!({ "path": runsc, "runtimeArgs": ["--platform=ptrace", "--network=none"] });
    let restore = register(&docker, &name, entry, dockerd).await;
    let cfg = || ContainerConfig::default().runtime(name.clone());
    let rung = support::rung_with(cfg()).await;
    let w = support::worker("levels-gvisor-stop");
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    std::fs::write(input.join("data.txt"), b"forty-two\n").unwrap();
    let script = "cat /in/data.txt; if echo x > /in/data.txt 2>/dev/null; then echo WROTE; fi";
    let o = support::run(&rung, &support::sh(&image, &w, &t.path().join("o1"), script).input_dir(&input)).await;
    assert_eq!((o.status, support::stdout_of(&o).as_str()), (Status::Ok, "forty-two\n"), "{}", o.to_json());
    assert_eq!(std::fs::read(input.join("data.txt")).unwrap(), b"forty-two\n");

    support::a_deadline_and_a_cancellation_stop(&rung, &image, &w, t.path()).await;

    // The host's OOM killer takes the Sentry, the init with it: no record; the engine's flag
    // is the witness, and the Outcome names it.
    let req = support::sh(&image, &w, &t.path().join("o4"), "head -c 400m /dev/zero | tail > /dev/null")
        .limits(stevedore::ResourceLimits::new().with("memory", 64 << 20));
    let o = support::run(&rung, &req).await;
    assert_eq!(o.status, Status::OomKilled, "{}", o.to_json());
    assert_eq!(o.usage.sources.oom_kills, Some(stevedore::contract::Source::Engine), "{}", o.to_json());
    assert_eq!(o.evidence.level, Some(Level::Vm), "{}", o.to_json());

    // Another life of the same worker (a rung that never started this attempt) reclaims it
    // while its command runs.
    let mut req = support::sh(&image, &w, &t.path().join("o5"), "echo ready; sleep 300");
    let mut watch = support::watch([&mut req]);
    let running = {
        let rung = rung.clone();
        tokio::spawn(async move { rung.run(&req, CancellationToken::new()).await })
    };
    watch.until("ready").await;
    let later = support::rung_with(cfg()).await;
    let report = later.reclaim(&w).await.expect("reclaim runs");
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(!report.containers_removed.is_empty(), "{report:?}");
    let o = running.await.unwrap().expect("the attempt had started");
    assert_eq!(o.status, Status::Killed, "{}", o.to_json());
    later.close().await;
    rung.close().await;
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]), "nothing of the worker is left");
    restore.restore(&docker).await;
}
