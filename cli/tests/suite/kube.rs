//! The kube rung against a real Kubernetes 1.20 (`.ci/engines/kube.sh up`, its env file in
//! `STEVEDORE_TEST_KUBE`; without it these tests are skipped, saying so). The rung runs with
//! the least Role it needs (`KUBE_RUNG_CONFIG`); what a test checks of the cluster it checks
//! with kubectl as the cluster's admin, never with stevedore's help. Every test ends with
//! none of its worker's Pods left.

use crate::support::{self, BIN, test_logs, worker};
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use stevedore::contract::{Executor, Reason, Status};
use stevedore::kube::{ImagePull, KubeConfig, KubeExecutor};
use stevedore::{CancellationToken, Outcome, Request};
use tokio::sync::OnceCell;

/// The cluster the harness started: its env file's values.
struct Cluster {
    vars: BTreeMap<String, String>,
    /// stevedore's init image of this build, on the node.
    init_image: String,
}

impl Cluster {
    fn var(&self, k: &str) -> &str {
        self.vars.get(k).unwrap_or_else(|| panic!("{k} missing from the harness's env file"))
    }

    fn busybox(&self) -> String {
        self.var("KUBE_BUSYBOX_IMAGE").to_owned()
    }

    /// kubectl as the cluster's admin.
    fn kubectl(&self, args: &[&str]) -> std::process::Output {
        Command::new(self.var("KUBE_KUBECTL"))
            .arg("--kubeconfig")
            .arg(self.var("KUBE_ADMIN_CONFIG"))
            .args(args)
            .output()
            .expect("kubectl runs")
    }

    /// The names of stevedore's Pods of `worker` (any state, deleting or not), by its label
    /// or, for an ID that had to be fitted to Kubernetes' rules, its annotation.
    fn pods_of(&self, worker: &str) -> Vec<String> {
        let out = self.kubectl(&["get", "pods", "-l", "dev.stevedore.managed=true", "-o", "json"]);
        assert!(out.status.success(), "kubectl get pods: {}", String::from_utf8_lossy(&out.stderr));
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let key = "dev.stevedore.worker";
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["metadata"]["labels"][key] == worker || p["metadata"]["annotations"][key] == worker)
            .map(|p| format!("pod/{}", p["metadata"]["name"].as_str().unwrap()))
            .collect()
    }

    /// Whether a Pod of that name exists.
    fn pod_exists(&self, name: &str) -> bool {
        self.kubectl(&["get", "pod", name, "-o", "name"]).status.success()
    }
}

/// The cluster, with this build's init image imported, made once per test process; `None`
/// (a skip, said) when no cluster was given.
async fn cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceCell<Option<Cluster>> = OnceCell::const_new();
    CLUSTER
        .get_or_init(|| async {
            let Some(path) = std::env::var_os("STEVEDORE_TEST_KUBE") else {
                eprintln!(
                    "SKIP: no Kubernetes cluster (STEVEDORE_TEST_KUBE names the env file of .ci/engines/kube.sh up)"
                );
                return None;
            };
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("STEVEDORE_TEST_KUBE={}: {e}", Path::new(&path).display()));
            let vars = text
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .collect();
            // The init image of this very build, packed by the local engine and put on the node.
            support::engine().await.expect("the local engine packs the init image");
            let tag = stevedore::kube::default_init_image();
            stevedore::image::pack_init_image(support::seam().await, &tag).await.expect("pack the init image");
            let c = Cluster { vars, init_image: tag };
            let import = Command::new(c.var("KUBE_IMPORT")).arg(&c.init_image).status().expect("kube-import runs");
            assert!(import.success(), "importing {} into the node failed", c.init_image);
            Some(c)
        })
        .await
        .as_ref()
}

/// The skip says itself; under CI a test that needs the cluster it was promised fails.
async fn setup() -> Option<&'static Cluster> {
    let c = cluster().await;
    if c.is_none() {
        support::skip("no Kubernetes cluster");
    }
    c
}

/// The rung's configuration as the least Role's user (`KUBE_RUNG_CONFIG`), its captures in
/// the build dir, nothing pulled, a fresh incarnation.
fn config(c: &Cluster) -> KubeConfig {
    let mut cfg = KubeConfig::default().kubeconfig(c.var("KUBE_RUNG_CONFIG")).image_pull(ImagePull::Never);
    cfg.log_dir = Some(test_logs());
    cfg.incarnation = Some(stevedore::contract::incarnation::mint());
    cfg.launch_timeout = Duration::from_secs(60);
    cfg
}

async fn rung(c: &Cluster) -> KubeExecutor {
    KubeExecutor::connect(config(c)).await.expect("connect to the cluster")
}

fn sh(c: &Cluster, w: &str, out: &Path, script: &str) -> Request {
    Request::command("job", ["sh", "-c", script], out).worker(w).image(c.busybox())
}

async fn run(rung: &KubeExecutor, req: &Request) -> Outcome {
    rung.run(req, CancellationToken::new()).await.expect("the attempt runs")
}

fn stdout_of(o: &Outcome) -> String {
    std::fs::read_to_string(o.evidence.logs.stdout.path.as_ref().expect("stdout captured")).unwrap()
}

/// Nothing of `w` is left in the cluster.
fn none_left(c: &Cluster, w: &str) {
    assert_eq!(c.pods_of(w), Vec::<String>::new(), "Pods of {w} left behind");
}

#[tokio::test]
async fn an_attempt_runs_with_its_inputs_read_only_and_its_outputs_hashed_and_owned_by_the_caller() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-ok");
    let rung = rung(c).await;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir_all(input.join("sub")).unwrap();
    std::fs::write(input.join("a.txt"), b"alpha\n").unwrap();
    std::fs::write(input.join("sub/b.bin"), vec![7u8; 300_000]).unwrap();
    std::fs::set_permissions(input.join("a.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let before = std::fs::metadata(input.join("a.txt")).unwrap();
    let out = dir.path().join("out");
    let script = "cat /in/a.txt > /out/copy.txt; wc -c < /in/sub/b.bin > /out/size.txt; \
                  if touch /in/new 2>/dev/null; then echo writable; else echo read-only; fi; \
                  mkdir -p /out/deep/er && printf x > /out/deep/er/x";
    let mut req = sh(c, &w, &out, script);
    req.input_dir = Some(input.clone());
    let o = run(&rung, &req).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(o.exit_code, Some(0));
    assert_eq!(stdout_of(&o), "read-only\n", "/in is read-only to the command");
    assert_eq!(std::fs::read(out.join("copy.txt")).unwrap(), b"alpha\n");
    assert_eq!(std::fs::read_to_string(out.join("size.txt")).unwrap().trim(), "300000");
    let mut names: Vec<&str> = o.outputs.iter().map(|f| f.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["copy.txt", "deep/er/x", "size.txt"]);
    for f in &o.outputs {
        let path = out.join(&f.name);
        assert_eq!(f.hash, stevedore::hash_reader(std::fs::File::open(&path).unwrap(), 0).unwrap().hash);
        assert_eq!(std::fs::metadata(&path).unwrap().uid(), nix::unistd::getuid().as_raw(), "owned by the caller");
    }
    let after = std::fs::metadata(input.join("a.txt")).unwrap();
    assert_eq!((before.uid(), before.mode()), (after.uid(), after.mode()), "the inputs untouched");
    let ev = &o.evidence;
    assert_eq!(ev.executor, "kube");
    assert!(ev.pod.as_deref().is_some_and(|p| p.starts_with("default/sd-")), "{:?}", ev.pod);
    // Known once the kubelet reported it; an attempt over before its relist says so.
    match ev.container_id.as_deref() {
        Some(id) => assert!(id.starts_with("containerd://"), "{id}"),
        None => assert!(ev.notes.iter().any(|n| n.contains("had not reported the attempt's container id")), "{ev:?}"),
    }
    assert_eq!(ev.inputs.as_ref().map(|i| i.files), Some(2));
    assert!(ev.enforcement.contains_key("inputs_read_only"));
    assert!(o.usage.cpu_time_ms.is_some() && o.usage.peak_memory_bytes.is_some(), "usage from the init's cgroup");
    rung.close().await;
    none_left(c, &w);
}

#[tokio::test]
async fn the_pod_is_hardened_and_the_network_is_said_to_be_not_enforced() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-hard");
    let rung = rung(c).await;
    let dir = tempfile::tempdir().unwrap();
    let script = "id -u; id -g; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; \
                  if touch /rootfs-write 2>/dev/null; then echo rootfs-writable; else echo rootfs-read-only; fi; \
                  if [ -e /var/run/secrets/kubernetes.io/serviceaccount ]; then echo token; else echo no-token; fi; \
                  cat /proc/1/cmdline | tr '\\0' ' '; echo; echo \"$HOME\"";
    let o = run(&rung, &sh(c, &w, &dir.path().join("out"), script)).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let lines: Vec<String> =
        stdout_of(&o).lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    assert_eq!(lines[0], "65532", "non-root");
    assert_eq!(lines[1], "65532");
    assert_eq!(lines[2], "CapEff: 0000000000000000", "no capability");
    assert_eq!(lines[3], "NoNewPrivs: 1");
    assert_eq!(lines[4], "Seccomp: 2", "the runtime's default seccomp profile");
    assert_eq!(lines[5], "rootfs-read-only");
    assert_eq!(lines[6], "no-token", "no service-account token mounted");
    assert!(
        lines[7].starts_with("/.stevedore/tools/stevedore-init --start-within-ms "),
        "PID 1 is stevedore's init: {}",
        lines[7]
    );
    assert_eq!(lines[8], "/tmp");
    let ev = &o.evidence;
    assert!(ev.skipped["network"].contains("not enforced"), "{:?}", ev.skipped);
    assert!(!ev.enforcement.contains_key("network"));
    // A policy that requires no network never selects the rung, nor runs on it when asked.
    let mut registry = stevedore::Registry::new();
    registry.register(std::sync::Arc::new(rung.clone())).unwrap();
    let closed = stevedore::Policy { no_network: true, ..stevedore::Policy::at_least(stevedore::Level::Sandboxed) };
    assert!(registry.select(&closed).is_err(), "selected without a network");
    let mut req = sh(c, &w, &dir.path().join("o2"), "true");
    req.policy.no_network = true;
    let err = rung.run(&req, CancellationToken::new()).await.expect_err("refused").to_string();
    assert!(err.contains("requires no network"), "{err}");
    rung.close().await;
    none_left(c, &w);
}

#[tokio::test]
async fn the_images_env_and_workdir_reach_the_command_under_every_other_layer() {
    let Some(c) = setup().await else { return };
    let docker = support::engine().await.expect("the local engine builds the image");
    let base = support::busybox_image(&docker).await;
    let tag = "stevedore-test/kube-env:latest";
    let dockerfile = format!(
        "FROM {base}\nENV IMAGE_VAR=image LD_LIBRARY_PATH=/opt/lib MALLOC_ARENA_MAX=2 SHARED=image\nWORKDIR /work\n\
         LABEL {}=true\n",
        support::TEST_LABEL
    );
    let context = support::tar_of(&[("Dockerfile", 0o644, dockerfile.as_bytes())]);
    stevedore::image::build_image_from_dir_tar(support::seam().await, tag, context).await.expect("build");
    assert!(Command::new(c.var("KUBE_IMPORT")).arg(tag).status().unwrap().success());
    let w = worker("kube-env");
    let rung = rung(c).await;
    let dir = tempfile::tempdir().unwrap();
    let script = "echo $IMAGE_VAR $LD_LIBRARY_PATH ${MALLOC_ARENA_MAX:-unset} $SHARED $HOME $(pwd)";
    let mut req = Request::command("job", ["sh", "-c", script], dir.path().join("o1")).worker(&w).image(tag);
    req.env.insert("SHARED".into(), "request".into());
    let o = run(&rung, &req).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(stdout_of(&o), "image /opt/lib unset request /tmp /work\n", "the image's layer is the lowest");
    assert!(o.evidence.notes.iter().any(|n| n.contains("MALLOC_ARENA_MAX")), "what does not reach it is said");
    let mut req = Request::command("job", ["pwd"], dir.path().join("o2")).worker(&w).image(tag);
    req.workdir = Some("/tmp".into());
    assert_eq!(stdout_of(&run(&rung, &req).await), "/tmp\n", "-w wins over the image's WORKDIR");
    rung.close().await;
    none_left(c, &w);
}

#[tokio::test]
async fn an_exit_code_a_signal_and_a_pod_deleted_from_outside_are_told_apart() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-exit");
    let rung = rung(c).await;
    let dir = tempfile::tempdir().unwrap();
    let code = run(&rung, &sh(c, &w, &dir.path().join("o1"), "echo out; echo err >&2; exit 7")).await;
    assert_eq!((code.status, code.exit_code, code.signal), (Status::HandlerError, Some(7), None));
    assert_eq!(stdout_of(&code), "out\n");
    let killed = run(&rung, &sh(c, &w, &dir.path().join("o2"), "kill -9 $$")).await;
    assert_eq!(
        (killed.status, killed.exit_code, killed.signal),
        (Status::Killed, None, Some(9)),
        "{}",
        killed.to_json()
    );
    // A Pod deleted from outside while its command runs.
    let mut req = sh(c, &w, &dir.path().join("o3"), "echo ready; sleep 300");
    let mut watch = support::watch([&mut req]);
    let attempt = {
        let rung = rung.clone();
        tokio::spawn(async move { rung.run(&req, CancellationToken::new()).await })
    };
    watch.until("ready").await;
    let pods = c.pods_of(&w);
    assert_eq!(pods.len(), 1, "{pods:?}");
    let deleted = c.kubectl(&["delete", &pods[0], "--wait=false"]);
    assert!(deleted.status.success(), "{}", String::from_utf8_lossy(&deleted.stderr));
    let o = attempt.await.unwrap().expect("it ran");
    assert_eq!(o.status, Status::Killed, "{}", o.to_json());
    assert_eq!(o.reason, Some(Reason::RemovedExternally), "{}", o.to_json());
    rung.close().await;
    none_left(c, &w);
}

#[tokio::test]
async fn an_attempt_dropped_midway_leaves_no_pod_even_for_a_worker_id_kubernetes_cannot_label() {
    let Some(c) = setup().await else { return };
    // 70 characters ending in `_`: not a label value, so it is fitted (and annotated whole).
    let w = format!("{}_", worker("kube-drop").repeat(4).chars().take(69).collect::<String>());
    let rung = rung(c).await;
    let dir = tempfile::tempdir().unwrap();
    let mut req = sh(c, &w, &dir.path().join("out"), "echo ready; sleep 300");
    let mut watch = support::watch([&mut req]);
    let attempt = {
        let rung = rung.clone();
        tokio::spawn(async move { rung.run(&req, CancellationToken::new()).await })
    };
    watch.until("ready").await;
    assert_eq!(c.pods_of(&w).len(), 1, "found by its annotation");
    // This process's own attempt in flight is spared by its reclaim.
    let report = rung.reclaim(&w).await.expect("reclaim runs");
    assert_eq!((report.kept_in_flight.len(), report.pods_removed.len()), (1, 0), "{report:?}");
    assert_eq!(c.pods_of(&w).len(), 1);
    // The caller gives up on it: no outcome, and the rung removes what it made.
    attempt.abort();
    assert!(attempt.await.unwrap_err().is_cancelled());
    rung.close().await;
    none_left(c, &w);
}

#[tokio::test]
async fn a_term_ignoring_command_times_out_and_a_cancelled_one_is_killed() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-stop");
    let rung = rung(c).await;
    let dir = tempfile::tempdir().unwrap();
    let mut req =
        sh(c, &w, &dir.path().join("o1"), "trap '' TERM; echo started; sleep 300").timeout(Duration::from_secs(3));
    req.policy = req.policy.clone().with_grace(Duration::from_secs(1));
    let started = std::time::Instant::now();
    let o = run(&rung, &req).await;
    assert_eq!((o.status, o.reason), (Status::Timeout, Some(Reason::Deadline)), "{}", o.to_json());
    assert!(o.evidence.stragglers_killed || o.signal == Some(9), "SIGKILLed after the grace: {}", o.to_json());
    // Deadline + grace + a launch and a removal: far from the command's 300 s.
    assert!(started.elapsed() < Duration::from_secs(90), "{:?}", started.elapsed());
    let mut req = sh(c, &w, &dir.path().join("o2"), "echo started; sleep 300");
    let mut watch = support::watch([&mut req]);
    let cancel = CancellationToken::new();
    let attempt = {
        let (rung, cancel) = (rung.clone(), cancel.clone());
        tokio::spawn(async move { rung.run(&req, cancel).await })
    };
    watch.until("started").await;
    cancel.cancel();
    let o = attempt.await.unwrap().expect("it ran");
    assert_eq!((o.status, o.reason), (Status::Killed, Some(Reason::Cancelled)), "{}", o.to_json());
    assert_eq!(o.signal, Some(15), "SIGTERM ended it within the grace");
    rung.close().await;
    none_left(c, &w);
}

#[tokio::test]
async fn a_memory_hog_is_oom_killed_by_the_kernels_count() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-oom");
    let rung = rung(c).await;
    let dir = tempfile::tempdir().unwrap();
    // `tail` keeps everything of a stream with no newline: it grows until the limit.
    let req = sh(c, &w, &dir.path().join("out"), "head -c 200000000 /dev/zero | tail > /dev/null")
        .memory(48 << 20)
        .timeout(Duration::from_secs(60));
    let o = run(&rung, &req).await;
    assert_eq!(o.status, Status::OomKilled, "{}", o.to_json());
    let kills = o.evidence.oom_kills.expect("the init read its cgroup's count");
    assert!(kills >= 1, "{}", o.to_json());
    let json: serde_json::Value = serde_json::from_str(&o.to_json()).unwrap();
    assert_eq!(json["usage"]["sources"]["peak_memory_bytes"], "cgroup", "{json}");
    let peak = o.usage.peak_memory_bytes.expect("peak from the cgroup");
    assert!(peak > 40 << 20 && peak <= 48 << 20, "the peak is the limit's: {peak}");
    // The Pod's container's cgroup, sampled by the init: the climb, the peak, the kill, and
    // the memory-backed /out and /tmp.
    let line = o.usage.timeline.as_ref().unwrap_or_else(|| panic!("a timeline: {json}"));
    let n = line.t_ms.len();
    assert!(n >= 2 && line.memory_bytes.len() == n && line.pids.len() == n, "{line:?}");
    assert_eq!(line.peak.as_ref().map(|p| p.memory_bytes), Some(peak));
    assert!(line.oom_kill_ms.is_some(), "{line:?}");
    assert_eq!((line.out_bytes.len(), line.tmp_bytes.len()), (n, n), "{:?}", line.missing);
    rung.close().await;
    none_left(c, &w);
}

#[tokio::test]
async fn out_past_its_size_is_enospc_and_disk_limit() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-disk");
    let rung = rung(c).await;
    let dir = tempfile::tempdir().unwrap();
    let req =
        sh(c, &w, &dir.path().join("out"), "dd if=/dev/zero of=/out/big bs=1M count=32 2>&1; echo dd=$?").disk(8 << 20);
    let o = run(&rung, &req).await;
    let said = stdout_of(&o);
    assert!(said.contains("No space left on device"), "{said}");
    assert!(said.contains("dd=1"), "{said}");
    assert_eq!(o.reason, Some(Reason::DiskLimit), "{}", o.to_json());
    let big = o.outputs.iter().find(|f| f.name == "big").expect("what was written is collected");
    assert!(big.size <= 8 << 20 && big.size >= 6 << 20, "{}", big.size);
    rung.close().await;
    none_left(c, &w);
}

#[tokio::test]
async fn reclaim_removes_the_workers_pods_and_spares_another_workers_and_an_unlabelled_one() {
    let Some(c) = setup().await else { return };
    let (w, other) = (worker("kube-reclaim"), worker("kube-spared"));
    // What a crashed worker left: a Pod of its own made as the rung makes them, by a run
    // killed with SIGKILL; another worker's; and one that only looks like a neighbour.
    let dir = tempfile::tempdir().unwrap();
    let mut leftovers = Vec::new();
    for (who, n) in [(&w, 1), (&other, 2)] {
        leftovers.push(start_cli(c, who, &dir.path().join(format!("o{n}")), None, "echo ready >&2; sleep 300"));
    }
    for child in leftovers {
        support::kill9(child);
    }
    let unlabelled = format!("unlabelled-{}", &w[w.len() - 8..]);
    let made = c.kubectl(&[
        "run",
        &unlabelled,
        "--image",
        &c.busybox(),
        "--image-pull-policy=Never",
        "--restart=Never",
        "--labels",
        &format!("app=stevedore-test,owner={w}"),
        "--",
        "sleep",
        "300",
    ]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    assert_eq!(c.pods_of(&w).len(), 1);
    let rung = rung(c).await;
    let report = rung.reclaim(&w).await.expect("reclaim runs");
    assert_eq!(report.pods_removed.len(), 1, "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    none_left(c, &w);
    assert_eq!(c.pods_of(&other).len(), 1, "another worker's Pod is spared");
    assert!(c.pod_exists(&unlabelled), "an unlabelled Pod is spared");
    // The command says the same, and cleans up after the other worker too.
    let out = Command::new(BIN)
        .args(["reclaim", "--rung", "kube", "--kubeconfig", c.var("KUBE_RUNG_CONFIG"), "--worker", &other])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(said["pods_removed"], 1, "{said}");
    none_left(c, &other);
    let _ = c.kubectl(&["delete", "pod", &unlabelled, "--grace-period=0", "--force"]);
    rung.close().await;
}

/// `stevedore run --rung kube` of `script`, as a worker process: returns once the command
/// said `ready` on stderr.
fn start_cli(c: &Cluster, w: &str, out: &Path, cp: Option<&Path>, script: &str) -> std::process::Child {
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--rung", "kube", "--kubeconfig", c.var("KUBE_RUNG_CONFIG"), "--pull", "never"])
        .args(["--worker", w, "--image", &c.busybox(), "--output"])
        .arg(out)
        .arg("--logs")
        .arg(out.with_extension("logs"));
    if let Some(cp) = cp {
        cmd.args(["--host-loss-grace", "120s", "--checkpoint"]).arg(cp);
    }
    let mut child = cmd.args(["--", "sh", "-c", script]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    support::stderr_until(&mut child, "ready");
    child
}

#[tokio::test]
async fn a_restarted_worker_recovers_its_attempt_through_exec() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-recover");
    let dir = tempfile::tempdir().unwrap();
    let (out, cp) = (dir.path().join("out"), dir.path().join("cp.json"));
    // The command waits for a gate the test opens only once a report of it reached the
    // recovering process: the takeover happened while it ran.
    let script = r#"echo ready >&2; while [ ! -e /tmp/gate ]; do "$STEVEDORE_INIT" report heartbeat; sleep 0.2; done;
                    echo result > /out/r; echo finished"#;
    support::kill9(start_cli(c, &w, &out, Some(&cp), script));
    let checkpoint = stevedore::contract::Checkpoint::from_json(&std::fs::read(&cp).unwrap()).unwrap();
    let stevedore::contract::Target::Pod { name, .. } = &checkpoint.target else { panic!("{:?}", checkpoint.target) };
    assert_eq!(c.pods_of(&w), vec![format!("pod/{name}")], "the attempt runs on without its worker");
    let mut recover = Command::new(BIN)
        .args(["recover", "--kubeconfig", c.var("KUBE_RUNG_CONFIG"), "--logs"])
        .arg(out.with_extension("logs"))
        .arg(&cp)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A report of the command reached the recovering process.
    support::stderr_until(&mut recover, "heartbeat");
    let gate = c.kubectl(&["exec", name, "-c", "attempt", "--", "touch", "/tmp/gate"]);
    assert!(gate.status.success(), "{}", String::from_utf8_lossy(&gate.stderr));
    let got = recover.wait_with_output().unwrap();
    let o: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap_or_else(|_| panic!("no outcome: {got:?}"));
    assert_eq!(o["status"], "ok", "{o}");
    assert!(o["evidence"]["recovered"].as_str().is_some(), "{o}");
    assert_eq!(std::fs::read_to_string(out.join("r")).unwrap(), "result\n");
    none_left(c, &w);
}

#[tokio::test]
async fn a_launch_that_cannot_run_is_a_clear_error_and_leaves_no_pod() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-bad");
    let dir = tempfile::tempdir().unwrap();
    // An image the node cannot pull: a registry on the node's loopback that does not answer.
    let mut cfg = config(c);
    cfg.image_pull = ImagePull::IfNotPresent;
    let pulling = KubeExecutor::connect(cfg).await.unwrap();
    let req = Request::command("job", ["true"], dir.path().join("o1")).worker(&w).image("127.0.0.1:9/nothing:1");
    let err = pulling.run(&req, CancellationToken::new()).await.expect_err("no image").to_string();
    assert!(err.contains("127.0.0.1:9/nothing:1") && err.contains("ErrImagePull"), "{err}");
    none_left(c, &w);
    pulling.close().await;
    // stevedore's init image missing from the node: named, with how to make and push it.
    let mut cfg = config(c);
    cfg.init_image = Some("stevedore-init:not-on-the-node".into());
    let no_init = KubeExecutor::connect(cfg).await.unwrap();
    let req = sh(c, &w, &dir.path().join("o1a"), "true");
    let err = stevedore::error_chain(&no_init.run(&req, CancellationToken::new()).await.expect_err("no init image"));
    assert!(err.contains("stevedore-init:not-on-the-node") && err.contains("stevedore image init"), "{err}");
    none_left(c, &w);
    no_init.close().await;
    // A Pod that does not run within the launch's time: what it waited for, named.
    let mut cfg = config(c);
    cfg.launch_timeout = Duration::from_millis(1);
    let hasty = KubeExecutor::connect(cfg).await.unwrap();
    let req = sh(c, &w, &dir.path().join("o1b"), "true");
    let err = stevedore::error_chain(&hasty.run(&req, CancellationToken::new()).await.expect_err("not in 1 ms"));
    assert!(err.contains("the Pod did not start within 1ms"), "{err}");
    none_left(c, &w);
    hasty.close().await;
    // Larger than any node: the scheduler's reason.
    let rung = rung(c).await;
    let req = sh(c, &w, &dir.path().join("o2"), "true").memory(1 << 50);
    let err = stevedore::error_chain(&rung.run(&req, CancellationToken::new()).await.expect_err("unschedulable"));
    assert!(err.contains("no node can take the Pod") && err.contains("Insufficient memory"), "{err}");
    assert!(err.contains(&format!("the biggest, {}, can allocate memory", c.var("KUBE_NODE"))), "{err}");
    none_left(c, &w);
    rung.close().await;
    // A namespace that does not exist (asked as the admin, who may create Pods anywhere).
    let admin = KubeConfig::default().kubeconfig(c.var("KUBE_ADMIN_CONFIG")).namespace("stevedore-no-such-ns");
    let rung = KubeExecutor::connect(admin).await.unwrap();
    let err = stevedore::error_chain(
        &rung.run(&sh(c, &w, &dir.path().join("o3"), "true"), CancellationToken::new()).await.expect_err("no ns"),
    );
    assert!(err.contains("namespace \"stevedore-no-such-ns\" does not exist"), "{err}");
    // Credentials without pods/exec: refused before a Pod exists, naming what is missing.
    let noexec = KubeConfig::default().kubeconfig(c.var("KUBE_NOEXEC_CONFIG"));
    let rung = KubeExecutor::connect(noexec).await.unwrap();
    let err = stevedore::error_chain(
        &rung.run(&sh(c, &w, &dir.path().join("o4"), "true"), CancellationToken::new()).await.expect_err("403"),
    );
    assert!(err.contains("may not get, create pods/exec"), "{err}");
    none_left(c, &w);
}

#[tokio::test]
async fn an_unknown_token_or_an_unreachable_server_is_said_as_such() {
    let Some(c) = setup().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(c.var("KUBE_RUNG_CONFIG")).unwrap();
    let bad_token = dir.path().join("bad-token");
    let token = c.var("KUBE_RUNG_TOKEN");
    std::fs::write(&bad_token, good.replace(token, &"0".repeat(token.len()))).unwrap();
    let err = stevedore::error_chain(
        &KubeExecutor::connect(KubeConfig::default().kubeconfig(&bad_token)).await.expect_err("401"),
    );
    assert!(err.contains("401 Unauthorized"), "{err}");
    assert!(!err.contains(token), "the token is never said");
    // A server that does not listen: a port this test holds bound, never listening on it.
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn, bind, getsockname, socket};
    let held = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).unwrap();
    bind(std::os::fd::AsRawFd::as_raw_fd(&held), &SockaddrIn::new(127, 0, 0, 1, 0)).unwrap();
    let port = getsockname::<SockaddrIn>(std::os::fd::AsRawFd::as_raw_fd(&held)).unwrap().port();
    let unreachable = dir.path().join("unreachable");
    std::fs::write(&unreachable, good.replace(c.var("KUBE_SERVER"), &format!("https://127.0.0.1:{port}"))).unwrap();
    let err = KubeExecutor::connect(KubeConfig::default().kubeconfig(&unreachable)).await.expect_err("unreachable");
    assert!(matches!(err, stevedore::LaunchError::ClusterUnreachable { .. }), "{err:?}");
    // Through the command: exit 125, the reason on stderr.
    let out = Command::new(BIN)
        .args(["run", "--rung", "kube", "--kubeconfig"])
        .arg(&unreachable)
        .args(["--image", "x", "--output"])
        .arg(dir.path().join("o"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cluster unreachable at https://127.0.0.1"), "{out:?}");
}

#[tokio::test]
async fn the_command_runs_an_attempt_on_the_cluster_with_dockers_flags_streams_and_exit_table() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-cli");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    std::fs::write(input.join("n"), b"41").unwrap();
    let out = Command::new(BIN)
        .args(["run", "--rung", "kube", "--kubeconfig", c.var("KUBE_RUNG_CONFIG"), "--pull", "never", "--worker", &w])
        .args(["--image", &c.busybox(), "-e", "GREETING=hi", "-w", "/tmp", "--memory", "64m", "--cpus", "0.5"])
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(dir.path().join("out"))
        .arg("--outcome")
        .arg(dir.path().join("o.json"))
        .args(["--", "sh", "-c", "echo $GREETING $(pwd) $(( $(cat /in/n) + 1 )); echo oops >&2; exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi /tmp 42\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("oops") && err.contains("stevedore: failed (exit 3)"), "{err}");
    let o: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("o.json")).unwrap()).unwrap();
    assert_eq!(o["evidence"]["executor"], "kube");
    assert_eq!(o["evidence"]["enforcement"]["cpu"], "Pod cpu limit of 500 millicores (cfs quota)");
    // What does not map to a Pod is refused, named, before anything exists.
    for (flag, value) in [("--cache", "deps:/cache"), ("-p", "8080"), ("--network", "bridge"), ("--network", "none")] {
        let refused = Command::new(BIN)
            .args(["run", "--rung", "kube", "--kubeconfig", c.var("KUBE_RUNG_CONFIG"), "--worker", &w])
            .args(["--image", &c.busybox(), flag, value, "--output"])
            .arg(dir.path().join("refused"))
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(refused.status.code(), Some(125));
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(said.contains(flag) && said.contains("kube rung"), "{said}");
    }
    none_left(c, &w);
    // A profile that names the rung: no --rung, the cluster from its `kube` table.
    let profiles = dir.path().join("profiles.toml");
    std::fs::write(
        &profiles,
        format!(
            "[profiles.cluster]\nrung = \"kube\"\npull = \"never\"\nenv = {{ FROM = \"profile\" }}\n\
             kube = {{ kubeconfig = {:?}, namespace = \"default\" }}\n",
            c.var("KUBE_RUNG_CONFIG")
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&profiles)
        .args(["--profile", "cluster", "run", "--worker", &w, "--image", &c.busybox(), "--output"])
        .arg(dir.path().join("out-profile"))
        .args(["--outcome", "-", "--", "sh", "-c", "echo $FROM >&2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let o: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(o["evidence"]["executor"], "kube", "{o}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("profile"), "{out:?}");
    none_left(c, &w);
    // census and smoke on the cluster.
    let census = Command::new(BIN)
        .args(["census", "--rung", "kube", "--kubeconfig", c.var("KUBE_ADMIN_CONFIG")])
        .output()
        .unwrap();
    assert!(census.status.success(), "{census:?}");
    let line: serde_json::Value = serde_json::from_slice(&census.stdout).unwrap();
    assert_eq!(line["engine_version"], "v1.20.2");
    assert_eq!(line["nodes"][0]["name"], c.var("KUBE_NODE"));
    assert!(line["nodes"][0]["allocatable"]["memory"].is_string(), "{line}");
    assert_eq!(line["access"], "ok");
    let smoke = Command::new(BIN)
        .args(["smoke", "--rung", "kube", "--kubeconfig", c.var("KUBE_RUNG_CONFIG")])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&smoke.stdout);
    assert!(
        smoke.status.success() && said.trim_end().ends_with("drain: ok"),
        "{said} {}",
        String::from_utf8_lossy(&smoke.stderr)
    );
}

/// A command that fills its memory through `/out` until the kernel kills it: what it wrote
/// reaches the caller (the init's delivery reserve is in the Pod's limit, and the Pod's own
/// limit is above its container's), never an `ok` with the file missing.
#[tokio::test]
async fn outputs_written_until_the_oom_kill_are_delivered() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-deliver");
    let rung = rung(c).await;
    let dir = tempfile::tempdir().unwrap();
    let runs = crate::engines::delivery_runs();
    for i in 0..runs {
        let out = dir.path().join(format!("o{i}"));
        let o = run(&rung, &sh(c, &w, &out, crate::engines::FILL_OUT).memory(64 << 20).disk(200 << 20)).await;
        assert_eq!((o.status, o.exit_code), (Status::Ok, Some(0)), "{}", o.to_json());
        assert!(o.evidence.oom_kills >= Some(1), "the kernel killed the filler: {}", o.to_json());
        let big = o.outputs.iter().find(|f| f.name == "big").unwrap_or_else(|| panic!("delivered: {}", o.to_json()));
        assert_eq!(std::fs::metadata(out.join("big")).unwrap().len(), big.size);
        assert!(big.size > 32 << 20, "{}", big.size);
        assert_eq!(o.evidence.outputs_lost, None);
    }
    eprintln!("with the delivery reserve: {runs} of {runs} attempts delivered the file");
    rung.close().await;
    none_left(c, &w);
}

/// `/tmp` filled past the memory limit: an OOM kill, told as `oom_killed` whoever has the
/// kernel's word. In a Burstable Pod (no CPU limit) the kubelet gives the container's
/// processes an OOM score adjustment of about 998, the command gets 1000 and the kernel picks
/// by resident size: a command smaller than the init (this `dd`) leaves the init to be
/// killed, and the rung then waits for the kubelet's `OOMKilled` (issue 40: it read the Pod
/// before the kubelet had said so, and told `killed`/`init_lost`).
#[tokio::test]
async fn a_tmp_filled_past_the_limit_is_oom_killed_by_the_kubelets_word_when_the_init_is_gone() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-tmp-oom");
    let rung = rung(c).await;
    let dir = tempfile::tempdir().unwrap();
    let req = sh(c, &w, &dir.path().join("o"), "dd if=/dev/zero of=/tmp/big bs=64k count=1600").memory(64 << 20);
    let o = run(&rung, &req).await;
    assert_eq!(o.status, Status::OomKilled, "{}", o.to_json());
    let json: serde_json::Value = serde_json::from_str(&o.to_json()).unwrap();
    let source = json["usage"]["sources"]["oom_kills"].as_str().unwrap_or_default().to_owned();
    eprintln!("the /tmp OOM: {} {:?}, oom_kills by {source}", o.status, o.reason);
    if o.usage.wall_time_ms.is_some() && json["usage"]["sources"]["wall_time_ms"] == "init_clock" {
        // The init lived to send its record: the kernel's count, as it read it.
        assert_eq!(source, "cgroup", "{json}");
    } else {
        assert_eq!(source, "kubelet", "{json}");
        assert_eq!(o.evidence.engine_oom_killed, Some(true), "{json}");
        assert!(o.evidence.outputs_lost.as_ref().is_some_and(|l| l.unknown), "{json}");
    }
    rung.close().await;
    none_left(c, &w);
}

/// A timeout counts from the command's start on this rung as on every other.
#[tokio::test]
async fn a_timeout_is_counted_from_the_commands_start() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-timeout");
    let rung = rung(c).await;
    let dir = tempfile::tempdir().unwrap();
    let timeout = Duration::from_millis(500);
    let o = run(&rung, &sh(c, &w, &dir.path().join("o"), "exec sleep 30").timeout(timeout)).await;
    assert_eq!((o.status, o.reason, o.signal), (Status::Timeout, Some(Reason::Deadline), Some(15)), "{}", o.to_json());
    let ran = Duration::from_millis(o.usage.wall_time_ms.expect("the init's clock"));
    assert!(ran >= timeout && ran < timeout + Duration::from_secs(3), "the command ran {ran:?}: {}", o.to_json());
    rung.close().await;
    none_left(c, &w);
}

/// The front's rules (`front::one_rule_for_every_rung`) hold on this rung too: it is the same
/// code as the others'.
#[tokio::test]
async fn the_front_is_one_rule_on_the_kube_rung() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-front");
    let rung = rung(c).await;
    let request = |out: &Path| sh(c, &w, out, "true");
    let made = async || c.pods_of(&w).len();
    crate::front::one_rule_for_every_rung(&rung, request, made).await;
}

/// Inputs for the root-init tests: a file and a file in a directory.
fn inputs_in(dir: &Path) -> std::path::PathBuf {
    let input = dir.join("in");
    std::fs::create_dir_all(input.join("sub")).unwrap();
    std::fs::write(input.join("a.txt"), b"alpha\n").unwrap();
    std::fs::write(input.join("sub/b.txt"), b"beta\n").unwrap();
    input
}

/// What the command tries on what the root init wrote, each said as `NAME ok|denied`.
const HOSTILE: &str = "for d in /in /.stevedore/stage; do \
      try() { if \"$@\" 2>/dev/null; then echo \"$d $1 ok\"; else echo \"$d $1 denied\"; fi; }; \
      try sh -c \"echo x > $d/a.txt\"; try chmod 0777 $d/a.txt; try mv $d/a.txt $d/moved; \
      try rm -f $d/sub/b.txt; try ln $d/a.txt $d/hard; try mkdir $d/new; try ln -s /etc $d/sym; \
      try chmod 0777 $d; try touch $d/sub/new; \
    done; \
    stat -c '%u %a' /in/a.txt /in/sub /in; cat /in/a.txt; \
    if cat /proc/1/environ >/dev/null 2>&1; then echo pid1-readable; else echo pid1-closed; fi; \
    grep -E '^(Uid|CapInh|CapPrm|CapEff|CapBnd|CapAmb):' /proc/self/status";

#[tokio::test]
async fn inputs_go_over_the_link_to_a_root_init_that_drops_before_the_command() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-root-init");
    let rung = rung(c).await;
    assert!(rung.census().await.inputs.starts_with("over the link to a root init"), "the namespace admits it");
    let dir = tempfile::tempdir().unwrap();
    let mut req = sh(c, &w, &dir.path().join("out"), HOSTILE);
    req.input_dir = Some(inputs_in(dir.path()));
    let o = run(&rung, &req).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let said = stdout_of(&o);
    for d in ["/in", "/.stevedore/stage"] {
        for what in ["sh", "chmod", "mv", "rm", "ln", "mkdir", "touch"] {
            assert!(!said.lines().any(|l| l.starts_with(&format!("{d} {what} ok"))), "{d} {what} got through:\n{said}");
        }
    }
    let lines: Vec<String> = said.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    let at = lines.iter().position(|l| l == "0 444").unwrap_or_else(|| panic!("a root's 0444 file:\n{said}"));
    assert_eq!(lines[at + 1], "0 555", "a root's 0555 dir");
    assert_eq!(lines[at + 2], "0 755", "the emptyDir's 0777 cleared of group and other write");
    assert_eq!(lines[at + 3], "alpha");
    assert_eq!(lines[at + 4], "pid1-closed", "PID 1 is root's and not dumpable");
    assert_eq!(lines[at + 5], "Uid: 65532 65532 65532 65532");
    for cap in &lines[at + 6..at + 11] {
        assert!(cap.ends_with(" 0000000000000000"), "the command holds no capability: {cap}");
    }
    let ev = &o.evidence;
    assert!(ev.enforcement["inputs_staging"].contains("written over the link by the init as uid 0"), "{ev:?}");
    assert!(ev.enforcement["user"].contains("read back from the created Pod: runAsUser 0"), "{:?}", ev.enforcement);
    assert!(ev.enforcement["capabilities"].contains("add SETUID, SETGID, SETPCAP"), "{:?}", ev.enforcement);
    let seen = ev.init_privileges.as_ref().expect("the init's credentials after the drop");
    assert_eq!(seen.uid.split_whitespace().collect::<Vec<_>>(), ["65532"; 4]);
    for cap in [&seen.cap_inh, &seen.cap_prm, &seen.cap_eff, &seen.cap_bnd, &seen.cap_amb] {
        assert_eq!(cap, "0000000000000000");
    }
    assert_eq!((seen.no_new_privs.as_str(), seen.dumpable), ("1", false));
    assert_eq!(ev.inputs.as_ref().map(|i| (i.files, i.tree.is_some())), Some((2, true)));
    rung.close().await;
    none_left(c, &w);
}

#[tokio::test]
async fn a_namespace_that_refuses_a_root_init_keeps_the_init_containers_way_and_says_why() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-restricted");
    let ns = c.var("KUBE_RESTRICTED_NAMESPACE");
    let rung = KubeExecutor::connect(config(c).namespace(ns)).await.expect("connect");
    let census = rung.census().await;
    assert!(census.inputs.starts_with("through the init container"), "{}", census.inputs);
    assert!(census.inputs.contains("PodSecurityPolicy"), "the namespace's own word: {}", census.inputs);
    let dir = tempfile::tempdir().unwrap();
    let script =
        "cat /in/a.txt /in/sub/b.txt; if touch /in/new 2>/dev/null; then echo writable; else echo read-only; fi";
    let mut req = sh(c, &w, &dir.path().join("out"), script);
    req.input_dir = Some(inputs_in(dir.path()));
    let o = run(&rung, &req).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(stdout_of(&o), "alpha\nbeta\nread-only\n");
    let ev = &o.evidence;
    let staging = &ev.enforcement["inputs_staging"];
    assert!(staging.contains("unpacked by stevedore's init container") && staging.contains("PodSecurityPolicy"));
    assert!(ev.init_privileges.is_none(), "no root init ran");
    assert!(ev.enforcement["user"].contains("read back from the created Pod: runAsUser 65532"), "{ev:?}");
    rung.close().await;
    let left = c.kubectl(&["get", "pods", "-n", ns, "-l", "dev.stevedore.managed=true", "-o", "name"]);
    assert_eq!(String::from_utf8_lossy(&left.stdout).trim(), "", "Pods left in {ns}");
    none_left(c, &w);
}

/// Deletes the admin's Pod `name` at once, however the test ends.
struct AdminPod<'a>(&'a Cluster, String);

impl Drop for AdminPod<'_> {
    fn drop(&mut self) {
        self.0.kubectl(&["delete", "pod", &self.1, "--grace-period=0", "--force", "--ignore-not-found"]);
    }
}

#[tokio::test]
async fn a_pod_that_fits_once_the_node_has_room_is_waited_for_and_runs() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-room");
    let node = c.kubectl(&["get", "node", c.var("KUBE_NODE"), "-o", "jsonpath={.status.allocatable.memory}"]);
    let allocatable = String::from_utf8(node.stdout).unwrap();
    let kib: u64 =
        allocatable.strip_suffix("Ki").and_then(|k| k.parse().ok()).unwrap_or_else(|| panic!("{allocatable}"));
    // Half the node and a GiB taken, and an attempt of half the node: it does not fit beside
    // the blocker, whatever the other tests run meanwhile, and fits once the blocker is gone.
    let half = (kib / 2) << 10;
    let blocker = format!("stevedore-blocker-{}", std::process::id());
    let guard = AdminPod(c, blocker.clone());
    let body = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": blocker},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
          "containers": [{"name": "b", "image": c.var("KUBE_PAUSE_IMAGE"), "imagePullPolicy": "Never",
            "resources": {"requests": {"memory": (half + (1 << 30)).to_string()}}}]}});
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), body.to_string()).unwrap();
    let made = c.kubectl(&["create", "-f", file.path().to_str().unwrap()]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let placed = || {
        let out = c.kubectl(&["get", "pod", &blocker, "-o", "jsonpath={.spec.nodeName}"]);
        !out.stdout.is_empty()
    };
    assert!(support::eventually(Duration::from_secs(60), placed).await, "the blocker was never placed");
    let rung = rung(c).await;
    let dir = tempfile::tempdir().unwrap();
    let req = sh(c, &w, &dir.path().join("out"), "echo ran").memory(half);
    let attempt = tokio::spawn({
        let rung = rung.clone();
        async move { rung.run(&req, CancellationToken::new()).await }
    });
    // The attempt's Pod is seen waiting for room (the scheduler's word), then the room is made.
    let unschedulable =
        || {
            let out = c.kubectl(&["get", "pods", "-l", &format!("dev.stevedore.worker={w}"), "-o", "json"]);
            let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            list["items"].as_array().into_iter().flatten().any(|p| {
                p["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["reason"] == "Unschedulable")
            })
        };
    let seen = support::eventually(Duration::from_secs(60), unschedulable).await;
    assert!(seen, "the attempt's Pod was never seen waiting for room");
    assert!(!attempt.is_finished(), "the attempt waits for room instead of failing");
    drop(guard);
    let o = attempt.await.unwrap().expect("the attempt runs once there is room");
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(stdout_of(&o), "ran\n");
    assert!(
        o.evidence.notes.iter().any(|n| n.contains("waited") && n.contains("for room on a node")),
        "{:?}",
        o.evidence.notes
    );
    rung.close().await;
    none_left(c, &w);
}

#[tokio::test]
async fn a_pod_whose_init_sent_its_last_frame_is_deleted_at_once_with_grace_0() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-grace0");
    let rung = rung(c).await;
    // The Pod's every change as the API server tells it, from before the Pod exists.
    let mut watcher = Command::new(c.var("KUBE_KUBECTL"))
        .args(["--kubeconfig", c.var("KUBE_ADMIN_CONFIG"), "get", "pods", "--watch", "--output-watch-events"])
        .args(["-o", "json", "-l", &format!("dev.stevedore.worker={w}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl watches");
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::<serde_json::Value>::new()));
    let reader = std::thread::spawn({
        let events = events.clone();
        let out = watcher.stdout.take().unwrap();
        move || {
            for e in serde_json::Deserializer::from_reader(out).into_iter::<serde_json::Value>() {
                let Ok(e) = e else { break };
                let deleted = e["type"] == "DELETED";
                events.lock().unwrap().push(e);
                if deleted {
                    break;
                }
            }
        }
    });
    // The watch is established once it has listed (an empty list says nothing: so the
    // attempt's Pod's ADDED event is what is waited for below).
    let dir = tempfile::tempdir().unwrap();
    let o = run(&rung, &sh(c, &w, &dir.path().join("out"), "true")).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    none_left(c, &w);
    let done = support::eventually(Duration::from_secs(30), || reader.is_finished()).await;
    let _ = watcher.kill();
    let _ = watcher.wait();
    assert!(done, "no DELETED event seen");
    rung.close().await;
    let events = std::mem::take(&mut *events.lock().unwrap());
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap_or("")).collect();
    assert_eq!(kinds.first(), Some(&"ADDED"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"DELETED"), "{kinds:?}");
    // Every deletion the API server recorded was of grace 0 (a graceful one carries its
    // seconds, and the Pod then stays until the kubelet reports its containers stopped).
    let deleting: Vec<&serde_json::Value> =
        events.iter().map(|e| &e["object"]["metadata"]).filter(|m| !m["deletionTimestamp"].is_null()).collect();
    assert!(!deleting.is_empty(), "{kinds:?}");
    for m in deleting {
        assert_eq!(m["deletionGracePeriodSeconds"], 0, "{kinds:?}: {m}");
    }
}

#[tokio::test]
async fn three_rounds_of_eight_in_parallel_all_conclude_and_leave_nothing() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-eight");
    let rung = rung(c).await;
    let dir = tempfile::tempdir().unwrap();
    for round in 0..3 {
        let attempts = (0..8).map(|i| {
            let req = sh(c, &w, &dir.path().join(format!("o{round}-{i}")), &format!("echo {round}-{i}"));
            let rung = rung.clone();
            tokio::spawn(async move { rung.run(&req, CancellationToken::new()).await })
        });
        for (i, a) in attempts.collect::<Vec<_>>().into_iter().enumerate() {
            let o = a.await.unwrap().expect("the attempt runs");
            assert_eq!(o.status, Status::Ok, "round {round}, attempt {i}: {}", o.to_json());
            assert_eq!(stdout_of(&o), format!("{round}-{i}\n"));
        }
        none_left(c, &w);
    }
    rung.close().await;
}

/// A namespace of the test's own, where the rung's user has the Role the README gives and a
/// ResourceQuota admits no Pod; removed with everything in it however the test ends.
struct QuotaNamespace<'a>(&'a Cluster, String);

impl Drop for QuotaNamespace<'_> {
    fn drop(&mut self) {
        self.0.kubectl(&["delete", "namespace", &self.1, "--wait=false", "--ignore-not-found"]);
    }
}

#[tokio::test]
async fn a_quota_refusal_is_said_as_such_and_leaves_no_pod() {
    let Some(c) = setup().await else { return };
    let w = worker("kube-quota");
    let ns = format!("stevedore-quota-{}", std::process::id());
    let guard = QuotaNamespace(c, ns.clone());
    let objects = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "none", "namespace": ns},
         "spec": {"hard": {"pods": "0"}}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "rung", "namespace": ns},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]},
                   {"apiGroups": [""], "resources": ["pods/attach", "pods/exec"], "verbs": ["get", "create"]},
                   {"apiGroups": ["policy"], "resources": ["podsecuritypolicies"], "verbs": ["use"],
                    "resourceNames": ["stevedore-ci-any"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "rung", "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "rung"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "stevedore-rung"}]}]});
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), objects.to_string()).unwrap();
    let made = c.kubectl(&["create", "-f", file.path().to_str().unwrap()]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let rung = KubeExecutor::connect(config(c).namespace(&ns)).await.expect("connect");
    let dir = tempfile::tempdir().unwrap();
    let err = stevedore::error_chain(
        &rung.run(&sh(c, &w, &dir.path().join("out"), "true"), CancellationToken::new()).await.expect_err("quota"),
    );
    assert!(err.contains("the namespace's ResourceQuota refuses the Pod") && err.contains("exceeded quota"), "{err}");
    rung.close().await;
    let left = c.kubectl(&["get", "pods", "-n", &ns, "-o", "name"]);
    assert_eq!(String::from_utf8_lossy(&left.stdout).trim(), "");
    drop(guard);
}
