//! The oci rung on this machine: each attempt a bundle run by the real runc (no daemon in
//! its path), the busybox image's filesystem exported from the local engine once, the real
//! init as PID 1. Statuses, inputs and outputs, OOM, timeout and grace, hardening probes, and
//! after every attempt nothing left: no runtime container, bundle, mount or cgroup.

use crate::support;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use stevedore::contract::{Level, Status};
use stevedore::oci::{OciConfig, OciExecutor};
use stevedore::{Executor, Request, ResourceLimits};
use tokio_util::sync::CancellationToken;

/// The rung and the image, or `None` (skipped, failing under `CI=true`) without runc, root
/// or an engine.
async fn setup() -> Option<(OciExecutor, String)> {
    let (_docker, image) = support::setup().await?;
    let why = if !nix::unistd::geteuid().is_root() { Some("the oci rung needs root".to_owned()) } else { None };
    let rung = match why {
        Some(w) => Err(w),
        None => {
            let cfg = OciConfig::default()
                .log_dir(support::test_logs())
                .incarnation(stevedore::contract::incarnation::mint());
            OciExecutor::new(cfg).await.map_err(|e| stevedore::error_chain(&e))
        }
    };
    match rung {
        Ok(r) => Some((r, image)),
        Err(why) if support::in_ci() => panic!("CI=true and the oci rung cannot run: {why}"),
        Err(why) => {
            eprintln!("SKIP: no oci rung ({why})");
            support::skip(format!("no oci rung: {why}"));
            None
        }
    }
}

/// A rung whose places (the image cache included) are under `dir`/oci.
async fn private_rung(dir: &Path) -> OciExecutor {
    let cfg = OciConfig::default()
        .base_dir(dir.join("oci"))
        .log_dir(support::test_logs())
        .incarnation(stevedore::contract::incarnation::mint());
    OciExecutor::new(cfg).await.expect("the oci rung sets up")
}

fn sh(image: &str, w: &str, out: &Path, script: &str) -> Request {
    Request::command("job", ["sh", "-c", script], out).worker(w).image(image)
}

async fn run(r: &OciExecutor, req: &Request) -> stevedore::Outcome {
    r.run(req, CancellationToken::new()).await.expect("the attempt runs")
}

fn stdout_of(o: &stevedore::Outcome) -> String {
    std::fs::read_to_string(o.evidence.logs.stdout.path.as_ref().unwrap()).unwrap()
}

/// What every name of `w`'s attempts starts with: its first 40 characters and 12 hex of the
/// whole id's SHA-256 (ids that share 40 characters are told apart).
fn names_of(w: &str) -> String {
    use sha2::Digest;
    let hash: String = sha2::Sha256::digest(w.as_bytes())[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{hash}-", &w[..w.len().min(40)])
}

/// Nothing of `w`'s attempts is left: no runtime container in the state dir, no bundle, no
/// mount naming them, no cgroup under the rung's parent.
fn nothing_left(r: &OciExecutor, w: &str) {
    let w = names_of(w);
    let w = w.as_str();
    let named = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(w))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(named(r.state_dir()), Vec::<String>::new(), "runtime containers left");
    assert_eq!(named(r.bundles_dir()), Vec::<String>::new(), "bundles left");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(w)).collect();
    assert!(left.is_empty(), "mounts left: {left:?}");
    let mut cgroups = named(Path::new("/sys/fs/cgroup/stevedore-oci"));
    for h in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        cgroups.extend(named(&h.path().join("stevedore-oci")));
    }
    assert_eq!(cgroups, Vec::<String>::new(), "cgroups left");
}

#[tokio::test]
async fn oci_a_command_s_exit_code_and_stdout_and_nothing_left() {
    let Some((rung, image)) = setup().await else { return };
    let w = support::worker("oci-plain");
    let t = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let o = run(&rung, &sh(&image, &w, &t.path().join("a"), "echo hello; echo err >&2")).await;
    eprintln!("a cold attempt (the image's first unpack included when it is new): {:?}", started.elapsed());
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(o.exit_code, Some(0));
    assert_eq!(stdout_of(&o), "hello\n");
    assert_eq!(o.evidence.level, Some(stevedore::Level::Sandboxed));
    assert!(o.evidence.runtime.as_deref().is_some_and(|r| r.contains("runc")), "{:?}", o.evidence.runtime);
    assert!(o.evidence.enforcement.contains_key("seccomp") && !o.evidence.skipped.contains_key("seccomp"));
    nothing_left(&rung, &w);

    // `/tmp` and `HOME` are the command's to write, `/out` its own alone (a scratch image has
    // neither dir: the rung makes them, with these modes).
    let o = run(&rung, &sh(&image, &w, &t.path().join("w"), "touch /tmp/x $HOME/y && stat -c '%a %u' /tmp /out")).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(stdout_of(&o), "1777 0\n700 65532\n");

    let o = run(&rung, &sh(&image, &w, &t.path().join("b"), "echo oops >&2; exit 3")).await;
    assert_eq!(o.status, Status::HandlerError, "{}", o.to_json());
    assert_eq!((o.exit_code, o.signal), (Some(3), None));
    assert!(o.status.counts_against_retries());
    nothing_left(&rung, &w);
    rung.close().await;
}

#[tokio::test]
async fn oci_inputs_are_read_only_and_outputs_hashed_and_the_caller_s() {
    let Some((rung, image)) = setup().await else { return };
    let w = support::worker("oci-io");
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    std::fs::create_dir_all(input.join("sub")).unwrap();
    std::fs::write(input.join("sub/data.txt"), b"forty-two\n").unwrap();
    let before = std::fs::metadata(input.join("sub/data.txt")).unwrap();
    let script = "cat /in/sub/data.txt > /out/copy.txt; \
                  if echo x > /in/sub/data.txt 2>/dev/null; then echo WROTE; fi; \
                  if touch /in/new 2>/dev/null; then echo MADE; fi; mkdir /out/d; echo y > /out/d/y";
    let req = sh(&image, &w, &t.path().join("o"), script).input_dir(&input);
    let o = run(&rung, &req).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(stdout_of(&o), "", "the inputs were not writable");
    let mut names: Vec<&str> = o.outputs.iter().map(|f| f.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["copy.txt", "d/y"], "{}", o.to_json());
    let copy = o.outputs.iter().find(|f| f.name == "copy.txt").unwrap();
    use sha2::Digest;
    assert_eq!(copy.hash, format!("sha256:{:x}", sha2::Sha256::digest(b"forty-two\n")));
    let md = std::fs::metadata(t.path().join("o/copy.txt")).unwrap();
    assert_eq!((md.uid(), md.gid()), (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw()));
    let after = std::fs::metadata(input.join("sub/data.txt")).unwrap();
    assert_eq!((after.uid(), after.mode(), after.len()), (before.uid(), before.mode(), before.len()));
    nothing_left(&rung, &w);
    rung.close().await;
}

/// `/out` is the host's tmpfs, walked by the host itself: what the command leaves there is
/// untrusted and the walk is on the host's side of the mount, so a symlink to a host path
/// (or to the host's root) must be named and never followed, a FIFO never opened, a setuid
/// bit never reproduced, and a straggler still writing is gone before the walk.
#[tokio::test]
async fn oci_outputs_are_walked_in_place_and_nothing_the_command_made_is_followed() {
    let Some((rung, image)) = setup().await else { return };
    let w = support::worker("oci-walk");
    let t = tempfile::tempdir().unwrap();
    let host_secret = t.path().join("secret");
    std::fs::write(&host_secret, b"host only").unwrap();
    let script = format!(
        "echo data > /out/a; ln -s {secret} /out/to-host; ln -s / /out/root; mkfifo /out/fifo; \
         mkdir -p /out/d/e; echo deep > /out/d/e/f; ln /out/a /out/hard; \
         echo s > /out/suid; chmod 4755 /out/suid; \
         echo first > /out/grow; (while true; do echo x >> /out/grow; done) & \
         cp /bin/busybox /out/busybox; if /out/busybox true 2>/dev/null; then echo EXECUTED; fi; rm /out/busybox",
        secret = host_secret.display()
    );
    let o = run(&rung, &sh(&image, &w, &t.path().join("o"), &script)).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert!(o.evidence.enforcement["disk"].contains("walked in place"), "{:?}", o.evidence.enforcement);
    let mut names: Vec<&str> = o.outputs.iter().map(|f| f.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["a", "d/e/f", "grow", "hard", "suid"]);
    let refused: Vec<(&str, &str)> =
        o.evidence.refused_outputs.iter().map(|r| (r.name.as_str(), r.why.as_str())).collect();
    assert_eq!(refused, [("fifo", "fifo"), ("root", "symlink"), ("to-host", "symlink")]);
    // The straggler was killed before the walk: what was delivered is what was hashed.
    let grow = o.outputs.iter().find(|f| f.name == "grow").unwrap();
    let delivered = std::fs::read(t.path().join("o/grow")).unwrap();
    use sha2::Digest;
    assert_eq!(grow.hash, format!("sha256:{:x}", sha2::Sha256::digest(&delivered)));
    assert_eq!(grow.size, delivered.len() as u64);
    let out = t.path().join("o");
    assert!(
        std::fs::symlink_metadata(out.join("to-host")).is_err() && std::fs::symlink_metadata(out.join("root")).is_err()
    );
    let mode = std::fs::metadata(out.join("suid")).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o755, "no setuid bit delivered");
    assert_eq!(std::fs::read(&host_secret).unwrap(), b"host only");
    assert!(!stdout_of(&o).contains("EXECUTED"), "/out is noexec");
    nothing_left(&rung, &w);
    rung.close().await;
}

#[tokio::test]
async fn oci_a_memory_hog_is_oom_killed() {
    let Some((rung, image)) = setup().await else { return };
    let w = support::worker("oci-oom");
    let t = tempfile::tempdir().unwrap();
    let hog = "dd if=/dev/zero of=/dev/null bs=256M count=1 2>/dev/null";
    let req = sh(&image, &w, &t.path().join("o"), hog).limits(ResourceLimits::new().with("memory", 64 << 20));
    let o = run(&rung, &req).await;
    assert_eq!(o.status, Status::OomKilled, "{}", o.to_json());
    assert!(o.evidence.oom_kills >= Some(1), "{}", o.to_json());
    nothing_left(&rung, &w);
    rung.close().await;
}

#[tokio::test]
async fn oci_a_timeout_with_grace_kills_a_term_ignoring_command() {
    let Some((rung, image)) = setup().await else { return };
    let w = support::worker("oci-deadline");
    let t = tempfile::tempdir().unwrap();
    let (grace, deadline) = (Duration::from_secs(1), Duration::from_secs(2));
    let mut req = sh(&image, &w, &t.path().join("o"), "trap '' TERM; echo partial > /out/p; while :; do sleep 1; done");
    req.policy = req.policy.clone().with_grace(grace);
    let req = req.timeout(deadline);
    let start = Instant::now();
    let o = run(&rung, &req).await;
    let took = start.elapsed();
    assert_eq!(o.status, Status::Timeout, "{}", o.to_json());
    assert_eq!(o.reason.map(|r| r.as_str()), Some("deadline"));
    assert_eq!(o.signal, Some(9), "SIGKILLed after the grace");
    assert_eq!(o.outputs.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["p"], "a timed-out attempt's outputs");
    assert!(took < deadline + grace + Duration::from_secs(5), "took {took:?}");
    nothing_left(&rung, &w);
    rung.close().await;
}

#[tokio::test]
async fn oci_cancellation_stops_the_attempt_and_removes_it() {
    let Some((rung, image)) = setup().await else { return };
    let w = support::worker("oci-cancel");
    let t = tempfile::tempdir().unwrap();
    let mut req = sh(&image, &w, &t.path().join("o"), "echo ready; sleep 60").grace(Duration::from_secs(5));
    let mut watch = support::watch([&mut req]);
    let token = CancellationToken::new();
    let t2 = token.clone();
    tokio::spawn(async move {
        watch.until("ready").await;
        t2.cancel();
    });
    let o = rung.run(&req, token).await.unwrap();
    assert_eq!(o.status, Status::Killed, "{}", o.to_json());
    assert_eq!(o.reason.map(|r| r.as_str()), Some("cancelled"));
    nothing_left(&rung, &w);
    rung.close().await;
}

#[tokio::test]
async fn oci_hardening_probes() {
    let Some((rung, image)) = setup().await else { return };
    let w = support::worker("oci-hard");
    let t = tempfile::tempdir().unwrap();
    let probe = "id -u; id -g; grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status; \
                 if touch /probe 2>/dev/null; then echo root-writable; else echo root-read-only; fi; \
                 ls /sys/class/net; \
                 if echo 1 > /sys/kernel/mm/ksm/run 2>/dev/null; then echo sys-writable; else echo sys-read-only; fi; \
                 cat /proc/kcore 2>/dev/null | head -c 1 | wc -c; ls /dev | tr '\\n' ' '; echo; \
                 if [ -e /dev/sda ] || [ -e /dev/mem ]; then echo host-devices; fi; echo $HOME; hostname; \
                 grep '^Seccomp:' /proc/self/status; \
                 if unshare -U true 2>/dev/null; then echo userns-made; else echo userns-refused; fi; \
                 if unshare -n true 2>/dev/null; then echo netns-made; else echo netns-refused; fi";
    let o = run(&rung, &sh(&image, &w, &t.path().join("o"), probe)).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let out = stdout_of(&o);
    eprintln!("{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[..2], ["65532", "65532"], "non-root: {out}");
    for set in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
        let line = lines.iter().find(|l| l.starts_with(set)).unwrap_or_else(|| panic!("{set}: {out}"));
        assert!(line.ends_with("0000000000000000"), "{line}");
    }
    assert!(lines.iter().any(|l| l.starts_with("NoNewPrivs:") && l.ends_with('1')), "{out}");
    assert!(lines.contains(&"root-read-only"), "{out}");
    assert!(lines.contains(&"lo"), "{out}");
    let net: Vec<&&str> = lines.iter().filter(|l| ["eth0", "docker0", "ens3", "ens4", "enp0s3"].contains(l)).collect();
    assert!(net.is_empty(), "only lo: {out}");
    assert!(lines.contains(&"sys-read-only"), "{out}");
    assert!(lines.contains(&"0"), "/proc/kcore masked: {out}");
    assert!(!lines.contains(&"host-devices"), "{out}");
    assert!(lines.contains(&"/tmp"), "HOME: {out}");
    // Docker's default profile: a filter (mode 2), and no new user namespace without
    // CAP_SYS_ADMIN (the kernel alone would let an unprivileged process make one).
    assert!(lines.iter().any(|l| l.starts_with("Seccomp:") && l.ends_with('2')), "{out}");
    assert!(lines.contains(&"userns-refused") && lines.contains(&"netns-refused"), "{out}");
    // The level as shown: the kernel the init saw is this machine's.
    let host = std::fs::read_to_string("/proc/version").unwrap();
    assert_eq!(o.evidence.kernel.as_deref(), host.lines().next());
    assert_eq!(o.evidence.level, Some(stevedore::contract::Level::Sandboxed));
    let seccomp = &o.evidence.enforcement["seccomp"];
    assert!(
        seccomp.contains("Docker's default seccomp profile") && seccomp.contains("installed by the init"),
        "{seccomp}"
    );
    // The filter is the init's from its first step: its own status says so too.
    let o = run(&rung, &sh(&image, &w, &t.path().join("o2"), "grep '^Seccomp:' /proc/1/status")).await;
    assert_eq!(stdout_of(&o).trim(), "Seccomp:\t2", "{}", o.to_json());
    nothing_left(&rung, &w);
    rung.close().await;

    // The runtime's own compile, configured: the same refusals.
    let t2 = tempfile::tempdir().unwrap();
    let cfg = OciConfig::default()
        .base_dir(t2.path().join("oci"))
        .log_dir(support::test_logs())
        .incarnation(stevedore::contract::incarnation::mint())
        .seccomp_by_runtime(true);
    let rung = OciExecutor::new(cfg).await.expect("the oci rung sets up");
    let o = run(&rung, &sh(&image, &w, &t.path().join("o3"), probe)).await;
    let out = stdout_of(&o);
    assert!(out.lines().any(|l| l.starts_with("Seccomp:") && l.ends_with('2')), "{out}");
    assert!(out.contains("userns-refused") && out.contains("netns-refused"), "{out}");
    assert!(o.evidence.enforcement["seccomp"].contains("compiled by the runtime"), "{:?}", o.evidence.enforcement);
    nothing_left(&rung, &w);
    rung.close().await;
}

#[tokio::test]
async fn oci_two_attempts_of_a_new_image_unpack_it_once_side_by_side() {
    let Some((_, image)) = setup().await else { return };
    // A base of its own: the image is new to this cache, and both attempts want it at once.
    let base = tempfile::tempdir().unwrap();
    let rung = private_rung(base.path()).await;
    let w = support::worker("oci-two");
    let t = tempfile::tempdir().unwrap();
    let a = sh(&image, &w, &t.path().join("a"), "echo a");
    let b = sh(&image, &w, &t.path().join("b"), "echo b");
    let (oa, ob) = tokio::join!(run(&rung, &a), run(&rung, &b));
    assert_eq!((oa.status, ob.status), (Status::Ok, Status::Ok), "{} {}", oa.to_json(), ob.to_json());
    assert_eq!((stdout_of(&oa), stdout_of(&ob)), ("a\n".to_owned(), "b\n".to_owned()));
    let images: Vec<String> = std::fs::read_dir(base.path().join("oci/images"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let id = oa.evidence.image_id.clone().unwrap();
    assert_eq!(images, [id.trim_start_matches("sha256:")], "one unpack, nothing half-made left");
    let mode = std::fs::metadata(base.path().join("oci/images")).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o700, "the cache is private");
    nothing_left(&rung, &w);
    rung.close().await;
}

#[tokio::test]
async fn oci_the_command_runs_on_the_oci_rung_with_the_exit_table() {
    let Some((rung, image)) = setup().await else { return };
    let w = support::worker("oci-cli");
    let t = tempfile::tempdir().unwrap();
    let stevedore = |out: &str, extra: &[&str], argv: &[&str]| {
        std::process::Command::new(support::BIN)
            .args(["run", "--rung", "oci", "--worker", &w, "--image", &image, "--logs"])
            .arg(support::test_logs())
            .arg("--output")
            .arg(t.path().join(out))
            .args(extra)
            .arg("--")
            .args(argv)
            .output()
            .unwrap()
    };
    let o = stevedore("a", &[], &["sh", "-c", "echo hi; id -u"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hi\n65532\n");
    let o = stevedore("b", &[], &["sh", "-c", "exit 3"]);
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stderr).contains("stevedore: failed (exit 3)"));
    let o = stevedore("c", &["-p", "80"], &["true"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not available on the oci rung"));
    // A handler without an image runs in stevedore's own worker image, packed by the command.
    let o = std::process::Command::new(support::BIN)
        .args(["run", "--rung", "oci", "--worker", &w, "--handler", "write-outputs", "--logs"])
        .arg(support::test_logs())
        .arg("--output")
        .arg(t.path().join("d"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read(t.path().join("d/a.txt")).unwrap(), b"alpha\n");
    nothing_left(&rung, &w);
    rung.close().await;
}

/// `stevedore run --rung oci` of a command that says `ready` and sleeps, for `w`.
fn oci_sleeper(image: &str, w: &str, out: &Path) -> std::process::Child {
    oci_sleeper_with(image, w, out, &[])
}

/// As [`oci_sleeper`], with more of the command's options (`extra`).
fn oci_sleeper_with(image: &str, w: &str, out: &Path, extra: &[&str]) -> std::process::Child {
    let mut child = std::process::Command::new(support::BIN)
        .args(["run", "--rung", "oci", "--worker", w, "--image", image, "--grace", "2s", "--logs"])
        // Where the test's rung keeps its captures: its reclaim finds these.
        .arg(support::test_logs())
        .args(extra)
        .arg("--output")
        .arg(out)
        .args(["--", "sh", "-c", "echo ready >&2; sleep 300"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    support::stderr_until(&mut child, "ready");
    child
}

fn bundles_of(r: &OciExecutor, w: &str) -> Vec<String> {
    std::fs::read_dir(r.bundles_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&names_of(w)))
        .collect()
}

#[tokio::test]
async fn oci_a_worker_killed_mid_attempts_leaves_nothing_after_reclaim_and_spares_a_near_namesake() {
    let Some((rung, image)) = setup().await else { return };
    // Two workers whose ids share their first 40 characters and more.
    let stem = support::worker("oci-crash");
    let a = format!("{stem}-{}-a", "x".repeat(40));
    let b = format!("{stem}-{}-b", "x".repeat(40));
    let t = tempfile::tempdir().unwrap();
    let sleepers: Vec<_> = (0..8).map(|i| oci_sleeper(&image, &a, &t.path().join(format!("a{i}")))).collect();
    let other = oci_sleeper(&image, &b, &t.path().join("b"));
    for s in sleepers {
        support::kill9(s);
    }
    assert_eq!(bundles_of(&rung, &a).len(), 8, "the crash left its bundles");
    // One `reclaim`, by the command, as an operator would after the crash.
    let o =
        std::process::Command::new(support::BIN).args(["reclaim", "--rung", "oci", "--worker", &a]).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON line");
    assert_eq!(report["failed"], serde_json::json!([]), "{report}");
    assert_eq!(report["containers_removed"], 8, "{report}");
    let bundles = report["paths"].as_array().unwrap().iter().filter(|p| p.as_str().unwrap().contains("/bundles/"));
    assert_eq!(bundles.count(), 8, "{report}");
    nothing_left(&rung, &a);
    assert_eq!(bundles_of(&rung, &b).len(), 1, "the other worker's attempt is untouched");
    let state: Vec<String> = std::fs::read_dir(rung.state_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&names_of(&b)))
        .collect();
    assert_eq!(state.len(), 1, "its runtime container runs on: {state:?}");
    support::kill9(other);
    let report = rung.reclaim(&b).await.expect("reclaim runs");
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    nothing_left(&rung, &b);
    rung.close().await;
}

/// Builds `stevedore-test/oci-<what>:<unique>` from busybox with `run` as its one `RUN`.
async fn image_with(docker: &bollard::Docker, what: &str, run: &str) -> String {
    let busybox = support::busybox_image(docker).await;
    let dockerfile = format!("FROM {busybox}\nRUN {run}\nLABEL {}=true\n", support::TEST_LABEL);
    let context = support::tar_of(&[("Dockerfile", 0o644, dockerfile.as_bytes())]);
    let tag = format!("stevedore-test/oci-{what}:{:08x}", rand::random::<u32>());
    stevedore::image::build_image_from_dir_tar(support::seam().await, &tag, context).await.expect("building the image");
    tag
}

#[tokio::test]
async fn oci_an_image_whose_mount_point_is_a_symlink_is_refused_and_setuid_is_never_reproduced() {
    let Some(_) = setup().await else { return };
    let docker = support::engine().await.unwrap();
    // A cache of its own: these images' roots go with the test.
    let base = tempfile::tempdir().unwrap();
    let rung = private_rung(base.path()).await;
    let w = support::worker("oci-image");
    let t = tempfile::tempdir().unwrap();
    let moved = image_with(&docker, "moved-out", "ln -s /etc /out").await;
    let err = rung.run(&sh(&moved, &w, &t.path().join("a"), "true"), CancellationToken::new()).await.unwrap_err();
    let text = stevedore::error_chain(&err);
    assert!(matches!(err, stevedore::LaunchError::ImageUnavailable { permanent: true, .. }), "{text}");
    assert!(text.contains("/out") && text.contains("symlink"), "{text}");
    let half_made: Vec<_> = std::fs::read_dir(rung.bundles_dir().parent().unwrap().join("images"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
        .collect();
    assert!(half_made.is_empty(), "a refused unpack leaves nothing: {half_made:?}");

    let suid = image_with(&docker, "suid", "cp /bin/busybox /bin/suid && chmod 6755 /bin/suid").await;
    let o = run(&rung, &sh(&suid, &w, &t.path().join("b"), "stat -c %a /bin/suid")).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(stdout_of(&o), "755\n", "no setuid or setgid bit in the unpacked root");
    nothing_left(&rung, &w);
    rung.close().await;
    support::remove_image(&docker, &moved).await;
    support::remove_image(&docker, &suid).await;
}

#[tokio::test]
async fn oci_a_container_killed_from_outside_is_killed_by_that_signal_and_removed() {
    let Some((rung, image)) = setup().await else { return };
    let w = support::worker("oci-outside");
    let t = tempfile::tempdir().unwrap();
    let mut req = sh(&image, &w, &t.path().join("o"), "echo ready; sleep 60");
    let mut watch = support::watch([&mut req]);
    let (state, runtime) = (rung.state_dir().to_owned(), rung.runtime().0.to_owned());
    let prefix = names_of(&w);
    let killer = tokio::spawn(async move {
        watch.until("ready").await;
        let id = std::fs::read_dir(&state)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with(&prefix))
            .expect("the runtime's container");
        let killed =
            std::process::Command::new(&runtime).arg("--root").arg(&state).args(["kill", &id, "KILL"]).status();
        assert!(killed.unwrap().success());
    });
    let o = run(&rung, &req).await;
    killer.await.unwrap();
    assert_eq!(o.status, Status::Killed, "{}", o.to_json());
    assert_eq!(o.signal, Some(9), "the runtime's word on how PID 1 ended: {}", o.to_json());
    nothing_left(&rung, &w);
    rung.close().await;
}

#[tokio::test]
async fn oci_the_census_names_the_runtime_its_cgroups_and_what_it_cannot_do() {
    let Some((rung, _)) = setup().await else { return };
    let out = std::process::Command::new(support::BIN).args(["census", "--rung", "oci"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(c["runtime"], rung.runtime().0.display().to_string());
    assert!(c["runtime_version"].as_str().unwrap().contains(rung.runtime().1), "{c}");
    assert_eq!((c["cgroup_driver"].as_str(), c["level"].as_str()), (Some("cgroupfs"), Some("sandboxed")));
    assert!(["1", "2"].contains(&c["cgroup_version"].as_str().unwrap()), "{c}");
    let features: Vec<&str> = c["features"].as_array().unwrap().iter().filter_map(|f| f.as_str()).collect();
    assert!(features.contains(&"seccomp") && features.contains(&"network"), "{c}");
    assert!(c["seccomp"].as_str().unwrap().starts_with("init: compiled once"), "{c}");
    assert_eq!(c["level_claimed"], "sandboxed", "{c}");
    // crun is tried as a runtime: not installed, usable, or why not on this host.
    let crun = c["crun"].as_str().unwrap();
    assert!(crun == "not installed" || crun.contains("can be the runtime") || crun.contains("refuses"), "{c}");
    // AppArmor is either applied or said why not, by what this host's kernel has.
    let host_has = std::fs::read_to_string("/sys/module/apparmor/parameters/enabled").is_ok_and(|e| e.trim() == "Y");
    match (features.contains(&"apparmor"), c["cannot"]["apparmor"].as_str()) {
        (true, None) => assert!(host_has, "{c}"),
        (false, Some(why)) if !host_has => assert!(why.contains("no AppArmor"), "{c}"),
        (false, Some(why)) => assert!(why.contains("not loaded"), "{c}"),
        _ => panic!("apparmor neither applied nor refused with a reason: {c}"),
    }
    rung.close().await;
}

/// Handlers by re-exec in the packed worker image (the same image the container rung's
/// handler cases run), on the oci rung: an `ok` with outputs, a handler's error, a panic,
/// an unknown handler, a fingerprint the image's label refuses before anything is made.
#[tokio::test]
async fn oci_handlers_run_by_re_exec_in_the_worker_image() {
    let Some((plain, _)) = setup().await else { return };
    plain.close().await;
    let worker_image = support::worker_image().await;
    let cfg = OciConfig::default()
        .worker_image(&worker_image)
        .log_dir(support::test_logs())
        .incarnation(stevedore::contract::incarnation::mint());
    let rung = OciExecutor::new(cfg).await.expect("the oci rung sets up");
    let w = support::worker("oci-handlers");
    let t = tempfile::tempdir().unwrap();
    let fp = stevedore::handlers::builtin().fingerprint();
    let handler = |out: &str, name: &str, payload: &str| {
        Request::handler("job", name, t.path().join(out)).worker(&w).payload(payload.as_bytes().to_vec())
    };

    let o = run(&rung, &handler("ok", "write-outputs", "").fingerprint(&fp)).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let names: Vec<_> = o.outputs.iter().map(|f| (f.name.as_str(), f.size)).collect();
    assert_eq!(names, [("a.txt", 6), ("dir/b.json", 7)]);
    assert_eq!(std::fs::read(t.path().join("ok/dir/b.json")).unwrap(), br#"{"b":1}"#);
    assert_eq!(o.evidence.enforcement.get("non_root").map(String::as_str), Some("user 65532:65532"));

    let o = run(&rung, &handler("err", "fail-permanent", "bad payload")).await;
    assert_eq!((o.status, o.permanent), (Status::HandlerError, true), "{}", o.to_json());
    assert_eq!(o.handler_error, "bad payload");

    let o = run(&rung, &handler("panic", "panic", "oh no")).await;
    assert_eq!((o.status, o.reason.map(|r| r.as_str())), (Status::Killed, Some("panicked")), "{}", o.to_json());

    let o = run(&rung, &handler("unknown", "no-such-handler", "")).await;
    assert_eq!((o.status, o.permanent), (Status::LaunchFailed, true), "{}", o.to_json());
    assert!(o.handler_error.contains("no-such-handler"), "{}", o.handler_error);

    let wrong = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
    match rung.run(&handler("fp", "write-outputs", "").fingerprint(wrong), CancellationToken::new()).await {
        Err(stevedore::LaunchError::FingerprintMismatch { expected, .. }) => assert_eq!(expected, wrong),
        other => panic!("a fingerprint the image's label refuses: {other:?}"),
    }
    nothing_left(&rung, &w);
    rung.close().await;
}

/// `stevedore smoke --rung oci`: the census, then the `true` handler in stevedore's own
/// worker image (packed by the command), run by runc; nothing left.
#[tokio::test]
async fn oci_smoke_runs_a_handler_in_stevedore_s_own_image() {
    let Some((rung, _)) = setup().await else { return };
    let o = std::process::Command::new(support::BIN).args(["smoke", "--rung", "oci"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    let census: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).expect("the census line");
    assert_eq!(census["level"], "sandboxed", "{census}");
    assert!(stdout.contains("attempt: ok"), "{stdout}");
    assert!(stdout.trim_end().ends_with("drain: ok"), "{stdout}");
    let left: Vec<String> = std::fs::read_dir(rung.bundles_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("cli-"))
        .collect();
    assert_eq!(left, Vec::<String>::new(), "the smoke's bundle is left");
    rung.close().await;
}

/// The image cache is bounded: over its bound the oldest-used image goes, but never one an
/// attempt holds (here, one still running); `reclaim --rung oci --images` empties it of what
/// no attempt holds.
#[tokio::test]
async fn oci_the_image_cache_is_bounded_and_never_prunes_an_image_in_use() {
    let Some((_, busybox)) = setup().await else { return };
    let docker = support::engine().await.unwrap();
    let base = tempfile::tempdir().unwrap();
    // A bound below one image: each new image prunes all the others it may.
    let cfg = OciConfig::default()
        .base_dir(base.path().join("oci"))
        .image_cache_max_bytes(1)
        .log_dir(support::test_logs())
        .incarnation(stevedore::contract::incarnation::mint());
    let rung = OciExecutor::new(cfg).await.expect("the oci rung sets up");
    let images = base.path().join("oci/images");
    let cached = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&images)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        v.sort();
        v
    };
    let id_of = |image: &str| {
        let docker = docker.clone();
        let image = image.to_owned();
        async move {
            let id = docker.inspect_image(&image).await.unwrap().id.unwrap();
            id.trim_start_matches("sha256:").to_owned()
        }
    };
    let other = image_with(&docker, "cache", "echo other > /other").await;
    let (bb, ot) = (id_of(&busybox).await, id_of(&other).await);
    let w = support::worker("oci-cache");
    let t = tempfile::tempdir().unwrap();

    // busybox runs on while the other image is unpacked: it is held, so kept.
    let mut req = sh(&busybox, &w, &t.path().join("a"), "echo ready; sleep 300");
    let mut watch = support::watch([&mut req]);
    let cancel = CancellationToken::new();
    let running = tokio::spawn({
        let (rung, cancel) = (rung.clone(), cancel.clone());
        async move { rung.run(&req, cancel).await }
    });
    watch.until("ready").await;
    let o = run(&rung, &sh(&other, &w, &t.path().join("b"), "cat /other")).await;
    assert_eq!(stdout_of(&o), "other\n");
    assert_eq!(cached(), sorted(&[&bb, &ot]), "the image in use is kept over the bound");
    cancel.cancel();
    let o = running.await.unwrap().expect("the attempt runs");
    assert_eq!(o.reason.map(|r| r.as_str()), Some("cancelled"), "{}", o.to_json());

    // Now nothing holds busybox: the next new unpack prunes it.
    support::remove_image(&docker, &other).await;
    let third = image_with(&docker, "cache3", "echo third > /third").await;
    let th = id_of(&third).await;
    run(&rung, &sh(&third, &w, &t.path().join("c"), "true")).await;
    assert_eq!(cached(), std::slice::from_ref(&th), "the oldest-used images went");
    let pruned = rung.prune_images(Some(0)).await.unwrap();
    assert_eq!(pruned.removed, [format!("sha256:{th}")]);
    assert_eq!(cached(), Vec::<String>::new());
    assert_eq!(std::fs::read_dir(&images).unwrap().count(), 0, "nothing left aside");
    nothing_left(&rung, &w);
    rung.close().await;
    support::remove_image(&docker, &third).await;
}

fn sorted(v: &[&String]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|s| (*s).clone()).collect();
    v.sort();
    v
}

/// `sh -c script` inside the checkpoint's runtime container, as the sandbox user: its status.
fn in_container(rung: &OciExecutor, cp: &Path, script: &str) -> i32 {
    let c = stevedore::contract::Checkpoint::from_json(&std::fs::read(cp).unwrap()).unwrap();
    let stevedore::contract::Target::Runtime { id, root } = c.target else { panic!("{:?}", c.target) };
    assert_eq!(Path::new(&root), rung.state_dir());
    let st = std::process::Command::new(rung.runtime().0)
        .arg("--root")
        .arg(&root)
        .args(["exec", "--user", "65532:65532", "--env", "PATH=/bin", &id, "/bin/sh", "-c", script])
        .status()
        .unwrap();
    st.code().unwrap_or(-1)
}

/// A worker SIGKILLed mid-attempt: a checkpoint that points the rung elsewhere is refused
/// and touches nothing; `stevedore recover` takes the init over through its socket in the
/// bundle while the command runs, and the attempt ends `ok` with its outputs and captures.
#[tokio::test]
async fn oci_a_worker_killed_mid_attempt_is_recovered_while_the_command_runs() {
    let Some((rung, image)) = setup().await else { return };
    let w = support::worker("oci-recover-run");
    let dir = tempfile::tempdir().unwrap();
    let (out, cp) = (dir.path().join("out"), dir.path().join("cp.json"));
    let script = r#"echo ready >&2; while [ ! -e /tmp/gate ]; do "$STEVEDORE_INIT" report heartbeat; sleep 0.2; done;
                    echo result > /out/r; echo finished"#;
    support::kill9(crate::recover::start_worker_on(&["--rung", "oci"], &image, &w, &out, &cp, script));

    // The checkpoint is input: one naming another state dir is refused, and nothing is touched.
    let mut forged: serde_json::Value = serde_json::from_slice(&std::fs::read(&cp).unwrap()).unwrap();
    forged["target"]["runtime"]["root"] = "/run/runc".into();
    let forged_at = dir.path().join("forged.json");
    std::fs::write(&forged_at, serde_json::to_vec(&forged).unwrap()).unwrap();
    let o = std::process::Command::new(support::BIN).arg("recover").arg(&forged_at).output().unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("another state dir"), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(in_container(&rung, &cp, "true"), 0, "the attempt runs on");

    let mut recover = std::process::Command::new(support::BIN)
        .arg("recover")
        .arg(&cp)
        .arg("--logs")
        .arg(out.with_file_name("logs"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A report of the command reached the recovering process: the takeover happened.
    support::stderr_until(&mut recover, "report heartbeat");
    assert_eq!(in_container(&rung, &cp, "touch /tmp/gate"), 0);
    let got = recover.wait_with_output().unwrap();
    assert!(got.status.success());
    let o: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!((o["status"].as_str(), o["evidence"]["level"].as_str()), (Some("ok"), Some("sandboxed")), "{o}");
    assert!(o["evidence"]["recovered"].as_str().unwrap().contains("while the command was running"), "{o}");
    assert_eq!(std::fs::read_to_string(out.join("r")).unwrap(), "result\n");
    let stdout = std::fs::read_to_string(o["evidence"]["logs"]["stdout"]["path"].as_str().unwrap()).unwrap();
    assert!(stdout.contains("finished"), "the capture continues: {stdout:?}");
    assert!(!cp.exists(), "the checkpoint (a secret) is removed once the attempt is over");
    nothing_left(&rung, &w);
    rung.close().await;
}

/// The command ended while no worker was there: the init waited, and `recover` collects
/// its record and outputs; the command's own exit status is the command's.
#[tokio::test]
async fn oci_an_attempt_that_ended_while_the_worker_was_away_is_collected() {
    let Some((rung, image)) = setup().await else { return };
    let w = support::worker("oci-recover-ended");
    let dir = tempfile::tempdir().unwrap();
    let (out, cp) = (dir.path().join("out"), dir.path().join("cp.json"));
    let script = r#"echo ready >&2; echo $$ > /tmp/pid; while [ ! -e /tmp/gate ]; do sleep 0.05; done;
                    echo made > /out/m; exit 7"#;
    support::kill9(crate::recover::start_worker_on(&["--rung", "oci"], &image, &w, &out, &cp, script));
    assert_eq!(in_container(&rung, &cp, "touch /tmp/gate"), 0);
    let t = Instant::now();
    // Gone once reaped by the init: `kill -0` then fails.
    while in_container(&rung, &cp, "! kill -0 $(cat /tmp/pid) 2>/dev/null") != 0 {
        assert!(t.elapsed() < Duration::from_secs(60), "the command never ended");
    }
    let got = std::process::Command::new(support::BIN).arg("recover").arg(&cp).output().unwrap();
    assert_eq!(got.status.code(), Some(7), "{}", String::from_utf8_lossy(&got.stderr));
    let o: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!((o["status"].as_str(), o["exit_code"].as_i64()), (Some("handler_error"), Some(7)), "{o}");
    assert!(o["evidence"]["recovered"].as_str().unwrap().contains("after the command had ended"), "{o}");
    assert_eq!(std::fs::read_to_string(out.join("m")).unwrap(), "made\n");
    nothing_left(&rung, &w);
    rung.close().await;
}

/// gVisor's `runsc` as the oci rung's runtime (ptrace platform, no network; it takes no
/// `--preserve-fds`, so no recovery), or `None` (skipped; failing under `CI=true`, where
/// `.ci/run` installs it).
async fn gvisor_rung(dir: &Path) -> Option<OciExecutor> {
    gvisor_rung_at(Some(dir.join("oci"))).await
}

/// As [`gvisor_rung`], in `base` (`None`: the rung's default, the command's).
async fn gvisor_rung_at(base: Option<PathBuf>) -> Option<OciExecutor> {
    setup().await?;
    let mut cfg = OciConfig::default();
    if let Some(base) = base {
        cfg = cfg.base_dir(base);
    }
    let cfg = cfg
        .log_dir(support::test_logs())
        .incarnation(stevedore::contract::incarnation::mint())
        .runtime("runsc")
        .runtime_args(["--platform=ptrace", "--network=none"]);
    match OciExecutor::new(cfg).await {
        Ok(r) => Some(r),
        Err(e) if support::in_ci() => panic!("CI=true and runsc cannot run: {}", stevedore::error_chain(&e)),
        Err(e) => {
            let why = format!("no runsc: {}", stevedore::error_chain(&e));
            eprintln!("SKIP: {why}");
            support::skip(why);
            None
        }
    }
}

/// Under gVisor the level is shown (the init saw gVisor's kernel, not the host's), usage comes
/// from the host's read of the sandbox's cgroup (gVisor shows the init none), inputs are
/// read-only, outputs hashed, an exit code kept, and nothing is left.
#[tokio::test]
async fn oci_under_gvisor_the_level_is_shown_and_usage_is_the_host_s_read() {
    let t = tempfile::tempdir().unwrap();
    let Some(rung) = gvisor_rung(t.path()).await else { return };
    let (_, image) = support::setup().await.unwrap();
    assert_eq!((rung.level(), rung.census().level_claimed), (Level::Sandboxed, Level::Vm), "not shown yet");
    let w = support::worker("oci-gvisor");
    let input = t.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    std::fs::write(input.join("data.txt"), b"forty-two\n").unwrap();
    let script = "cat /proc/version; cat /in/data.txt > /out/copy.txt; \
                  if echo x > /in/data.txt 2>/dev/null; then echo WROTE; fi; \
                  if unshare -U true 2>/dev/null; then echo USERNS; fi; exit 3";
    let o = run(&rung, &sh(&image, &w, &t.path().join("o"), script).input_dir(&input)).await;
    assert_eq!((o.status, o.exit_code), (Status::HandlerError, Some(3)), "{}", o.to_json());
    let out = stdout_of(&o);
    assert!(out.starts_with("Linux version 4.4.0"), "gVisor's kernel: {out}");
    assert!(!out.contains("WROTE") && !out.contains("USERNS"), "{out}");
    assert_eq!(o.evidence.level, Some(stevedore::contract::Level::Vm), "{}", o.to_json());
    assert!(o.evidence.notes.iter().any(|n| n.starts_with("level vm shown")), "{:?}", o.evidence.notes);
    assert_eq!((rung.level(), rung.census().level), (Level::Vm, Level::Vm), "shown by the attempt");
    let copy = o.outputs.iter().find(|f| f.name == "copy.txt").expect("the output");
    use sha2::Digest;
    assert_eq!(copy.hash, format!("sha256:{:x}", sha2::Sha256::digest(b"forty-two\n")));
    assert!(o.usage.peak_memory_bytes.is_some_and(|b| b > 0), "{}", o.to_json());
    assert!(o.evidence.notes.iter().any(|n| n.contains("read by the host from the sandbox's cgroup")));
    assert_eq!(o.evidence.oom_kills, Some(0), "no OOM: {}", o.to_json());
    assert!(rung.census().cannot.contains_key("recovery"), "runsc takes no --preserve-fds");
    nothing_left(&rung, &w);
    rung.close().await;
}

/// Under gVisor a deadline (a command that ignores SIGTERM, then SIGKILL after the grace) and
/// a cancellation stop the attempt as under runc; a sandbox OOM-killed whole still shows its
/// level; nothing is left.
#[tokio::test]
async fn oci_under_gvisor_a_timeout_a_cancellation_and_an_oom_end_the_attempt() {
    let t = tempfile::tempdir().unwrap();
    let Some(rung) = gvisor_rung(t.path()).await else { return };
    let (_, image) = support::setup().await.unwrap();
    let w = support::worker("oci-gvisor-stop");
    support::a_deadline_and_a_cancellation_stop(&rung, &image, &w, t.path()).await;
    // Past the memory limit the host's OOM killer takes the whole sandbox, the init with it:
    // no record, and runsc removes its cgroup with the sandbox. The rung's held cgroup above
    // it (`oci/held.rs`) saw the OOM and kept the peak; the level is shown by what the init
    // said as the command started.
    let req = sh(&image, &w, &t.path().join("o3"), "head -c 400m /dev/zero | tail > /dev/null")
        .limits(stevedore::ResourceLimits::new().with("memory", 64 << 20));
    let o = run(&rung, &req).await;
    assert_eq!((o.status, o.reason.map(|r| r.as_str())), (Status::OomKilled, Some("oom")), "{}", o.to_json());
    assert_eq!(o.usage.sources.oom_kills, Some(stevedore::contract::Source::Cgroup), "{}", o.to_json());
    assert!(o.evidence.notes.iter().any(|n| n.contains("oom_kills from the host's read")), "{:?}", o.evidence.notes);
    let peak = o.usage.peak_memory_bytes.expect("the held cgroup's peak");
    assert!(peak >= 64 << 20, "the peak reached the limit: {peak}");
    assert_eq!(o.evidence.level, Some(stevedore::contract::Level::Vm), "{}", o.to_json());
    assert!(o.evidence.kernel.as_deref().is_some_and(|k| k.starts_with("Linux version 4.4.0")), "{}", o.to_json());
    nothing_left(&rung, &w);
    rung.close().await;
}

/// A worker killed while its attempt runs under gVisor: the sandbox runs on, unsupervised,
/// until `reclaim`. A reclaim by runc leaves it (removing its bundle under it would leave it
/// running) and says which runtime to reclaim it with; the reclaim by runsc removes the
/// sandbox, its held cgroup, the bundle and the outputs' tmpfs.
#[tokio::test]
async fn oci_under_gvisor_a_worker_killed_mid_attempt_leaves_nothing_after_reclaim() {
    let Some(rung) = gvisor_rung_at(None).await else { return };
    let (_, image) = support::setup().await.unwrap();
    let w = support::worker("oci-gvisor-crash");
    let t = tempfile::tempdir().unwrap();
    let runsc = ["--oci-runtime", "runsc", "--oci-runtime-arg=--platform=ptrace", "--oci-runtime-arg=--network=none"];
    // The census shows the level its name claims before it says it.
    let out = std::process::Command::new(support::BIN).args(["census", "--rung", "oci"]).args(runsc).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((c["level"].as_str(), c["level_claimed"].as_str()), (Some("vm"), Some("vm")), "{c}");
    assert!(c["state_dir"].as_str().unwrap().ends_with("/state-runsc"), "{c}");
    let child = oci_sleeper_with(&image, &w, &t.path().join("o"), &runsc);
    support::kill9(child);
    assert_eq!(bundles_of(&rung, &w).len(), 1, "the crash left its bundle");
    let reclaim = |extra: &[&str]| {
        let o = std::process::Command::new(support::BIN)
            .args(["reclaim", "--rung", "oci", "--worker", &w])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("one JSON line")
    };
    let report = reclaim(&[]);
    assert!(report["failed"].to_string().contains("reclaim it with --oci-runtime"), "{report}");
    assert_eq!(bundles_of(&rung, &w).len(), 1, "runc's reclaim left runsc's bundle");
    let report = reclaim(&runsc);
    assert_eq!(report["failed"], serde_json::json!([]), "{report}");
    assert_eq!(report["containers_removed"], 1, "{report}");
    nothing_left(&rung, &w);
    rung.close().await;
}
