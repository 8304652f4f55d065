//! Without root (issue 50): the `stevedore` command run as an ordinary user against that
//! user's rootless Podman, the user and its service made by `.ci/engines/rootless.sh up`
//! (whose env file `STEVEDORE_TEST_ROOTLESS` names; without it these tests are skipped, saying
//! so). Every command here runs as that user (its uid, gid and no other group, its own home
//! and runtime dir, nothing of root's environment); the test itself only reads what it made.

use crate::support;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The harness's user and engine.
struct Rootless {
    uid: u32,
    gid: u32,
    home: PathBuf,
    xdg: PathBuf,
    host: String,
    cgroup_version: String,
}

/// The harness's env file, or `None` after the skip is said.
fn rootless() -> Option<Rootless> {
    let Some(path) = std::env::var_os("STEVEDORE_TEST_ROOTLESS") else {
        let why = "no rootless Podman (STEVEDORE_TEST_ROOTLESS names the env file of .ci/engines/rootless.sh up)";
        eprintln!("SKIP: {why}");
        support::skip(why.to_owned());
        return None;
    };
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("STEVEDORE_TEST_ROOTLESS={}: {e}", Path::new(&path).display()));
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} missing from {}", Path::new(&path).display()))
            .to_owned()
    };
    Some(Rootless {
        uid: get("ROOTLESS_UID").parse().unwrap(),
        gid: get("ROOTLESS_GID").parse().unwrap(),
        home: get("ROOTLESS_HOME").into(),
        xdg: get("ROOTLESS_XDG_RUNTIME_DIR").into(),
        host: get("ROOTLESS_DOCKER_HOST"),
        cgroup_version: get("ROOTLESS_CGROUP_VERSION"),
    })
}

impl Rootless {
    /// `program` as the user: its ids (std drops every supplementary group), its home and
    /// runtime dir, its engine, nothing else of this process's environment.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        cmd.uid(self.uid)
            .gid(self.gid)
            .env_clear()
            .env("HOME", &self.home)
            .env("XDG_RUNTIME_DIR", &self.xdg)
            .env("XDG_CONFIG_HOME", self.home.join(".config"))
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("DOCKER_HOST", &self.host)
            .current_dir(&self.home)
            .stdin(Stdio::null());
        cmd
    }

    /// A fresh dir of the user's, in its home.
    fn dir(&self, tag: &str) -> PathBuf {
        let d = self.home.join(format!("t-{tag}-{:08x}", rand::random::<u32>()));
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(self.uid), Some(self.gid)).unwrap();
        d
    }

    /// The busybox test image in the user's own storage, built once per test process by the
    /// user's podman (no network: a rootless build's `RUN` has none here).
    fn image(&self) -> String {
        static BUILT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        BUILT
            .get_or_init(|| {
                let ctx = self.dir("image");
                std::fs::copy("/bin/busybox", ctx.join("busybox")).expect("/bin/busybox (busybox-static)");
                std::fs::write(
                    ctx.join("Dockerfile"),
                    "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\",\"--install\",\"-s\",\"/bin\"]\n",
                )
                .unwrap();
                for f in ["busybox", "Dockerfile"] {
                    std::os::unix::fs::chown(ctx.join(f), Some(self.uid), Some(self.gid)).unwrap();
                }
                let tag = "stevedore-test/rootless-busybox:1".to_owned();
                let built =
                    self.command("podman").args(["build", "--network", "none", "-q", "-t", &tag]).arg(&ctx).output();
                let built = built.expect("podman build");
                assert!(built.status.success(), "podman build: {}", String::from_utf8_lossy(&built.stderr));
                let _ = std::fs::remove_dir_all(&ctx);
                tag
            })
            .clone()
    }

    /// `stevedore ARGS` as the user, to its end.
    fn stevedore(&self, args: &[&str]) -> Output {
        self.command(support::BIN).args(args).output().unwrap()
    }

    /// The containers and volumes labelled with `worker` in the user's engine, as its own
    /// podman lists them (bollard's model has no word for Podman's `stopped` state).
    fn labelled(&self, worker: &str) -> (Vec<String>, Vec<String>) {
        let label = format!("label={}={worker}", stevedore::labels::WORKER);
        let list = |args: &[&str]| {
            let o = self.command("podman").args(args).args(["--filter", &label]).output().unwrap();
            assert!(o.status.success(), "podman {args:?}: {}", text(&o.stderr));
            text(&o.stdout).lines().map(str::to_owned).collect::<Vec<_>>()
        };
        (list(&["ps", "--all", "--quiet"]), list(&["volume", "ls", "--quiet"]))
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// As an ordinary user: a command's exit code and stdout kept, inputs read-only, outputs
/// hashed and landed in the caller's dir owned by the caller, the sandbox user a subordinate
/// id (not the caller, not root), and nothing labelled left.
#[tokio::test]
async fn as_an_ordinary_user_the_container_rung_runs_on_rootless_podman() {
    let Some(r) = rootless() else { return };
    let image = r.image();
    let w = support::worker("rootless");
    let t = r.dir("run");
    let input = t.join("in");
    std::fs::create_dir(&input).unwrap();
    std::fs::write(input.join("data.txt"), b"forty-two\n").unwrap();
    for p in [&input, &input.join("data.txt")] {
        std::os::unix::fs::chown(p, Some(r.uid), Some(r.gid)).unwrap();
    }
    let (out, outcome) = (t.join("out"), t.join("o.json"));
    let script = "cat /in/data.txt > /out/copy.txt; if echo x > /in/data.txt 2>/dev/null; then echo WROTE; fi; \
                  id -u; exit 3";
    let o = r.stevedore(&[
        "run",
        "--worker",
        &w,
        "--image",
        &image,
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--outcome",
        outcome.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "65532\n", "the sandbox user inside; nothing written to /in");
    let copy = out.join("copy.txt");
    assert_eq!(std::fs::read(&copy).unwrap(), b"forty-two\n");
    let meta = std::fs::metadata(&copy).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (r.uid, r.gid), "the output is the caller's");
    let o: serde_json::Value = serde_json::from_slice(&std::fs::read(&outcome).unwrap()).unwrap();
    assert_eq!((o["status"].as_str(), o["exit_code"].as_i64()), (Some("handler_error"), Some(3)), "{o}");
    use sha2::Digest;
    let hash = format!("sha256:{:x}", sha2::Sha256::digest(b"forty-two\n"));
    assert_eq!(o["outputs"][0]["hash"].as_str(), Some(hash.as_str()), "{o}");
    // Which uid the sandbox user is: 65532 inside, outside its subordinate id as Podman maps
    // them (inside 1.. to the range's start..).
    let subuid = std::fs::read_to_string("/etc/subuid").unwrap();
    let start: u64 = subuid
        .lines()
        .find_map(|l| l.strip_prefix("stevedore-rootless:").or_else(|| l.strip_prefix(&format!("{}:", r.uid))))
        .and_then(|rest| rest.split(':').next()?.parse().ok())
        .expect("the user's subordinate ids");
    let said = o["evidence"]["enforcement"]["non_root"].as_str().unwrap_or_default();
    assert!(said.contains(&format!("the subordinate id {} of uid {}", start + 65531, r.uid)), "{said}");
    assert_eq!(std::fs::read(input.join("data.txt")).unwrap(), b"forty-two\n");
    assert_eq!(r.labelled(&w), (vec![], vec![]), "nothing of the worker is left");
    let _ = std::fs::remove_dir_all(&t);
}

/// A rootless engine on cgroup v1 takes a memory or pids limit and ignores it: the rung says
/// so in `skipped` (never claims it enforced), the census leaves them out, and a policy that
/// demands memory ends the run `launch_failed`/`not_enforced` before the command runs. On a
/// delegated cgroup v2 the limits hold, and the demand runs.
#[tokio::test]
async fn limits_a_rootless_engine_cannot_apply_are_named_and_a_policy_that_demands_them_refuses() {
    let Some(r) = rootless() else { return };
    let image = r.image();
    let w = support::worker("rootless-limits");
    let t = r.dir("limits");
    let run = |name: &str, extra: &[&str]| {
        let (out, outcome) = (t.join(name), t.join(format!("{name}.json")));
        let mut args = vec!["run", "--worker", &w, "--image", &image, "--memory", "64m", "--pids", "64"];
        args.extend_from_slice(extra);
        let (out, outcome) = (out.to_str().unwrap().to_owned(), outcome.to_str().unwrap().to_owned());
        args.extend(["--output", &out, "--outcome", &outcome, "--", "sh", "-c", "echo RAN"]);
        let o = r.stevedore(&args);
        let json = std::fs::read(&outcome).map(|b| serde_json::from_slice::<serde_json::Value>(&b).unwrap());
        (o, json.unwrap_or_default())
    };
    let census = r.stevedore(&["census"]);
    assert_eq!(census.status.code(), Some(0), "{}", text(&census.stderr));
    let census: serde_json::Value = serde_json::from_slice(&census.stdout).unwrap();
    let features: Vec<&str> = census["features"].as_array().unwrap().iter().filter_map(|f| f.as_str()).collect();
    assert!(features.contains(&"rootless"), "{census}");
    let (o, json) = run("plain", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let demanded = run("demanded", &["--require-enforced", "memory"]);
    if r.cgroup_version == "1" {
        assert!(!features.contains(&"memory") && !features.contains(&"pids"), "{census}");
        for k in ["memory", "pids"] {
            let why = json["evidence"]["skipped"][k].as_str().unwrap_or_else(|| panic!("{k} not skipped: {json}"));
            assert!(why.contains("rootless"), "{why}");
            assert!(json["evidence"]["enforcement"][k].is_null(), "{k} claimed enforced: {json}");
        }
        let (o, json) = demanded;
        assert_eq!(o.status.code(), Some(126), "{}", text(&o.stderr));
        assert!(!text(&o.stdout).contains("RAN"), "the command never ran");
        assert_eq!((json["status"].as_str(), json["reason"].as_str()), (Some("launch_failed"), Some("not_enforced")));
    } else {
        assert!(json["evidence"]["enforcement"]["memory"].is_string(), "{json}");
        assert_eq!(demanded.0.status.code(), Some(0), "{}", text(&demanded.0.stderr));
    }
    assert_eq!(r.labelled(&w), (vec![], vec![]), "nothing of the worker is left");
    let _ = std::fs::remove_dir_all(&t);
}

/// A deadline stops a command that ignores SIGTERM (SIGKILL after the grace, 124); a worker
/// SIGKILLed mid-attempt leaves its container to the user's `stevedore reclaim`, which
/// removes it: nothing labelled is left.
#[tokio::test]
async fn as_an_ordinary_user_a_deadline_stops_and_reclaim_removes_what_a_crash_left() {
    let Some(r) = rootless() else { return };
    let image = r.image();
    let w = support::worker("rootless-stop");
    let t = r.dir("stop");
    let out = |n: &str| t.join(n).to_str().unwrap().to_owned();
    let o = r.stevedore(&[
        "run",
        "--worker",
        &w,
        "--image",
        &image,
        "--timeout",
        "2s",
        "--grace",
        "1s",
        "--output",
        &out("a"),
        "--",
        "sh",
        "-c",
        "trap '' TERM; while :; do sleep 1; done",
    ]);
    assert_eq!(o.status.code(), Some(124), "{}", text(&o.stderr));
    let mut child = r
        .command(support::BIN)
        .args(["run", "--worker", &w, "--image", &image, "--grace", "2s", "--output", &out("b")])
        .args(["--", "sh", "-c", "echo ready >&2; sleep 300"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    support::stderr_until(&mut child, "ready");
    support::kill9(child);
    assert_eq!(r.labelled(&w).0.len(), 1, "the crash left its container");
    let o = r.stevedore(&["reclaim", "--worker", &w]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["failed"], serde_json::json!([]), "{report}");
    assert_eq!(r.labelled(&w), (vec![], vec![]), "nothing of the worker is left");
    let _ = std::fs::remove_dir_all(&t);
}

/// A rootless engine on a delegated cgroup v2: the VM's rootless Podman (`.ci/engines/vm.sh`,
/// the user `rootless` whose systemd slice has cpu, memory and pids delegated), which
/// `DOCKER_HOST` names when `STEVEDORE_TEST_ROOTLESS_V2=1`. There the limits hold: the census
/// names memory and pids, a policy that demands them runs (the init read each back from its
/// cgroup before the command), the command sees them in its own cgroup, and a memory hog is
/// OOM-killed by the kernel's count. Podman 4.3 says `CpuCfsQuota` false on cgroup v2 and
/// applies the quota all the same: the CPU limit is claimed from what the init read back.
#[tokio::test]
async fn on_a_delegated_cgroup_v2_a_rootless_engines_limits_hold_and_are_read_back() {
    if std::env::var("STEVEDORE_TEST_ROOTLESS_V2").as_deref() != Ok("1") {
        let why = "no rootless engine on a delegated cgroup v2 (STEVEDORE_TEST_ROOTLESS_V2=1 says DOCKER_HOST is one: \
                   the VM's, VM_ROOTLESS_HOST of .ci/engines/vm.sh up)";
        eprintln!("SKIP: {why}");
        support::skip(why.to_owned());
        return;
    }
    let Some(docker) = support::engine().await else { return };
    let image = support::busybox_image(&docker).await;
    let w = support::worker("rootless-v2");
    let t = tempfile::tempdir().unwrap();
    let stevedore = |args: &[&str]| Command::new(support::BIN).args(args).stdin(Stdio::null()).output().unwrap();
    let census = stevedore(&["census"]);
    assert_eq!(census.status.code(), Some(0), "{}", text(&census.stderr));
    let census: serde_json::Value = serde_json::from_slice(&census.stdout).unwrap();
    let features: Vec<&str> = census["features"].as_array().unwrap().iter().filter_map(|f| f.as_str()).collect();
    for f in ["memory", "pids"] {
        assert!(features.contains(&f), "{f}: {census}");
    }
    let run = |name: &str, script: &str| {
        let outcome = t.path().join(format!("{name}.json"));
        let (out, json) = (t.path().join(name), outcome.to_str().unwrap().to_owned());
        let o = stevedore(&[
            "run",
            "--worker",
            &w,
            "--image",
            &image,
            "--memory",
            "64m",
            "--pids",
            "64",
            "--cpus",
            "0.5",
            "--require-enforced",
            "memory,pids",
            "--output",
            out.to_str().unwrap(),
            "--outcome",
            &json,
            "--",
            "sh",
            "-c",
            script,
        ]);
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&outcome).unwrap()).unwrap();
        (o, json)
    };
    let (o, json) = run("held", "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max /sys/fs/cgroup/cpu.max");
    assert_eq!(o.status.code(), Some(0), "{}\n{json}", text(&o.stderr));
    let lines: Vec<String> = text(&o.stdout).lines().map(str::to_owned).collect();
    let memory: u64 = lines[0].parse().unwrap_or_else(|_| panic!("memory.max: {lines:?}"));
    assert!((64 << 20..128 << 20).contains(&memory), "the attempt's 64 MiB and the init's reserve: {lines:?}");
    assert_eq!((lines[1].as_str(), lines[2].as_str()), ("64", "50000 100000"), "{lines:?}");
    for k in ["memory", "pids", "cpu"] {
        assert!(json["evidence"]["enforcement"][k].is_string(), "{k}: {json}");
        assert!(json["evidence"]["skipped"][k].is_null(), "{k}: {json}");
    }
    if !features.contains(&"cpu") {
        let said = json["evidence"]["enforcement"]["cpu"].as_str().unwrap();
        assert!(said.starts_with("read back: the sandbox's cgroup holds a limit of 500"), "{said}");
    }
    let (o, json) = run("hog", "dd if=/dev/zero of=/dev/null bs=256M count=1 2>/dev/null");
    assert_eq!(o.status.code(), Some(137), "{}\n{json}", text(&o.stderr));
    assert_eq!((json["status"].as_str(), json["reason"].as_str()), (Some("oom_killed"), Some("oom")), "{json}");
    assert_eq!(json["usage"]["sources"]["oom_kills"].as_str(), Some("cgroup"), "the kernel's own count: {json}");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]), "nothing of the worker is left");
}
