//! Restart recovery through the command: `stevedore run --checkpoint F --host-loss-grace`
//! is killed with SIGKILL mid-attempt; `stevedore recover F` finishes the attempt and prints
//! its Outcome with its outputs, whether the command was still running when the worker came
//! back or had ended while it was away. What cannot be recovered is removed.

use crate::support;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stevedore::contract::{Checkpoint, Target};
use support::*;

/// `stevedore run` of `script` with a checkpoint and a host-loss grace, returned once the
/// command said `ready` on stderr (which the checkpoint precedes).
fn start_worker(image: &str, w: &str, out: &Path, cp: &Path, script: &str) -> Child {
    start_worker_on(&[], image, w, out, cp, script)
}

/// [`start_worker`] with `rung` (`["--rung", "oci"]`) before the rest.
pub(crate) fn start_worker_on(rung: &[&str], image: &str, w: &str, out: &Path, cp: &Path, script: &str) -> Child {
    let mut child = Command::new(BIN)
        .arg("run")
        .args(rung)
        .args(["--worker", w, "--image", image, "--host-loss-grace", "120s", "--checkpoint"])
        .arg(cp)
        .arg("--output")
        .arg(out)
        .arg("--logs")
        .arg(out.with_file_name("logs"))
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    stderr_until(&mut child, "ready");
    child
}

fn container_of(cp: &Path) -> String {
    let c = Checkpoint::from_json(&std::fs::read(cp).unwrap()).unwrap();
    match c.target {
        Target::Container { id, .. } => id,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_worker_killed_mid_attempt_is_recovered_while_the_command_runs() {
    let Some((docker, image)) = setup().await else { return };
    let w = worker("recover-run");
    let dir = tempfile::tempdir().unwrap();
    let (out, cp) = (dir.path().join("out"), dir.path().join("cp.json"));
    // A heartbeat report while waiting: once one reaches the recovering process, the
    // takeover happened and the gate may open.
    let script = r#"echo ready >&2; while [ ! -e /tmp/gate ]; do "$STEVEDORE_INIT" report heartbeat; sleep 0.2; done;
                    echo result > /out/r; echo finished"#;
    kill9(start_worker(&image, &w, &out, &cp, script));
    let id = container_of(&cp);
    assert_eq!(std::fs::metadata(&cp).unwrap().permissions().mode() & 0o777, 0o600, "the checkpoint is a secret");
    // With the run's --logs: the captures go on where they were, and are kept.
    let mut recover = Command::new(BIN)
        .arg("recover")
        .arg(&cp)
        .arg("--logs")
        .arg(out.with_file_name("logs"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(recover.stderr.take().unwrap()).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("report heartbeat") => break,
            Some(_) => continue,
            None => panic!("stevedore recover ended before the takeover"),
        }
    }
    assert_eq!(exec(&docker, &id, "touch /tmp/gate").await, 0);
    // Drained on a thread: more reports may come before the end.
    let drain = std::thread::spawn(move || lines.count());
    let got = recover.wait_with_output().unwrap();
    drain.join().unwrap();
    assert!(got.status.success());
    let o: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!(o["status"], "ok", "{o}");
    assert!(o["evidence"]["recovered"].as_str().unwrap().contains("while the command was running"), "{o}");
    assert!(o["evidence"].get("hook_failures").is_none(), "nothing was left waiting for its time out: {o}");
    assert_eq!(o["outputs"][0]["name"], "r");
    assert_eq!(std::fs::read_to_string(out.join("r")).unwrap(), "result\n");
    let stdout = std::fs::read_to_string(o["evidence"]["logs"]["stdout"]["path"].as_str().unwrap()).unwrap();
    assert!(stdout.contains("finished"), "the capture continues: {stdout:?}");
    assert!(!cp.exists(), "the checkpoint (a secret) is removed once the attempt is over");
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn an_attempt_that_ended_while_the_worker_was_away_is_collected() {
    let Some((docker, image)) = setup().await else { return };
    let w = worker("recover-ended");
    let dir = tempfile::tempdir().unwrap();
    let (out, cp) = (dir.path().join("out"), dir.path().join("cp.json"));
    let script = r#"echo ready >&2; echo $$ > /tmp/pid; while [ ! -e /tmp/gate ]; do sleep 0.05; done;
                    echo made > /out/m; exit 7"#;
    kill9(start_worker(&image, &w, &out, &cp, script));
    let id = container_of(&cp);
    assert_eq!(exec(&docker, &id, "touch /tmp/gate").await, 0);
    // Gone once reaped by the init: `kill -0` then fails.
    let t = Instant::now();
    while exec(&docker, &id, "! kill -0 $(cat /tmp/pid) 2>/dev/null").await != 0 {
        assert!(t.elapsed() < Duration::from_secs(60), "the command never ended");
    }
    // Recovered with background cleanup on: the dead process's tools volume still goes,
    // after the container that mounts it.
    let config = dir.path().join("profiles.toml");
    std::fs::write(&config, "[profiles.bg]\nbackground_cleanup = true\n").unwrap();
    let dead = Checkpoint::from_json(&std::fs::read(&cp).unwrap()).unwrap().incarnation;
    let got =
        Command::new(BIN).arg("--config").arg(&config).args(["--profile", "bg", "recover"]).arg(&cp).output().unwrap();
    // It exits as `run` would have: the command's own status.
    assert_eq!(got.status.code(), Some(7), "{}", String::from_utf8_lossy(&got.stderr));
    let o: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!((o["status"].as_str(), o["exit_code"].as_i64()), (Some("handler_error"), Some(7)), "{o}");
    assert!(o["evidence"]["recovered"].as_str().unwrap().contains("after the command had ended"), "{o}");
    assert_eq!(std::fs::read_to_string(out.join("m")).unwrap(), "made\n");
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]));
    let left = volumes_of_incarnation(&docker, &dead).await;
    assert!(left.is_empty(), "the dead process's tools: {left:?}");
}

#[tokio::test]
async fn what_cannot_be_recovered_is_removed() {
    let Some((docker, image)) = setup().await else { return };
    use stevedore::Executor;
    let w = worker("recover-gone");
    let dir = tempfile::tempdir().unwrap();
    let (out, cp) = (dir.path().join("out"), dir.path().join("cp.json"));
    kill9(start_worker(&image, &w, &out, &cp, "echo ready >&2; exec sleep 300"));
    let checkpoint = Checkpoint::from_json(&std::fs::read(&cp).unwrap()).unwrap();
    // A forged key: the init refuses the takeover, and the attempt is removed.
    let mut forged = checkpoint.clone();
    forged.link.key = "00".repeat(32);
    let rung = rung().await;
    // The attempt still ends with an Outcome, which says why it could not be taken over.
    let o = rung.recover(&forged, None, Default::default()).await.expect("an outcome, not a silent loss");
    assert_eq!((o.status, o.reason), (stevedore::Status::Killed, Some(stevedore::Reason::InitLost)), "{}", o.to_json());
    let why = o.evidence.recovered.clone().unwrap();
    assert!(why.contains("the takeover failed") && why.contains("not of this attempt's key"), "{why}");
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]), "the unrecoverable attempt was removed");
    let err = rung.recover(&checkpoint, None, Default::default()).await.expect_err("nothing left");
    assert!(matches!(err, stevedore::contract::RecoverError::Gone(_)), "{err:?}");
    // A checkpoint pointing at another worker's container is refused without touching it.
    let other = worker("recover-other");
    let victim = create_named(&docker, &image, format!("{other}-victim"), worker_labels(&other), &["true"]).await;
    let mut pointed = checkpoint;
    pointed.target = Target::Container { id: victim.clone(), name: "x".into() };
    let err = rung.recover(&pointed, None, Default::default()).await.expect_err("not this attempt's");
    assert!(matches!(err, stevedore::contract::RecoverError::Invalid(_)), "{err:?}");
    assert!(docker.inspect_container(&victim, None).await.is_ok(), "someone else's container is left alone");
    let _ = docker
        .remove_container(
            &victim,
            Some(bollard::query_parameters::RemoveContainerOptionsBuilder::default().force(true).build()),
        )
        .await;
    rung.close().await;
}

/// `stevedore run --rung process` of `script` with a checkpoint and a host-loss grace,
/// returned once the command said `ready <its TMPDIR>` on stderr: the attempt's own scratch
/// dir, which the command's uid (`nobody`) can use and this test (root) can reach.
pub(crate) fn start_process_worker(w: &str, out: &Path, cp: &Path, script: &str) -> (Child, std::path::PathBuf) {
    let mut child = Command::new(BIN)
        .args(["run", "--rung", "process", "--worker", w, "--host-loss-grace", "120s", "--checkpoint"])
        .arg(cp)
        .arg("--output")
        .arg(out)
        .arg("--logs")
        .arg(out.with_file_name("logs"))
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("ready ") => return (child, l["ready ".len()..].into()),
            Some(_) => continue,
            None => panic!("stevedore run ended before the command was ready"),
        }
    }
}

#[test]
fn the_process_rung_recovers_a_running_command_after_kill_9() {
    let w = worker("recover-proc-run");
    let dir = tempfile::tempdir().unwrap();
    let (out, cp) = (dir.path().join("out"), dir.path().join("cp.json"));
    let script = r#"echo "ready $TMPDIR" >&2; while [ ! -e "$TMPDIR/open" ]; do "$STEVEDORE_INIT" report heartbeat; sleep 0.2; done;
                    echo result > "$STEVEDORE_OUT/r"; echo finished"#;
    let (worker_process, scratch) = start_process_worker(&w, &out, &cp, script);
    kill9(worker_process);
    let mut recover =
        Command::new(BIN).arg("recover").arg(&cp).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(recover.stderr.take().unwrap()).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("report heartbeat") => break,
            Some(_) => continue,
            None => panic!("stevedore recover ended before the takeover"),
        }
    }
    std::fs::write(scratch.join("open"), b"").unwrap();
    // Drained on a thread: more reports may come before the end.
    let drain = std::thread::spawn(move || lines.count());
    let got = recover.wait_with_output().unwrap();
    drain.join().unwrap();
    assert!(got.status.success());
    let o: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!((o["status"].as_str(), o["evidence"]["level"].as_str()), (Some("ok"), Some("process")), "{o}");
    assert!(o["evidence"]["recovered"].as_str().unwrap().contains("while the command was running"), "{o}");
    assert_eq!(std::fs::read_to_string(out.join("r")).unwrap(), "result\n");
    assert!(!scratch.exists(), "the attempt's dir is removed");
}

#[test]
fn the_process_rung_collects_an_attempt_that_ended_while_the_worker_was_away() {
    let w = worker("recover-proc-ended");
    let dir = tempfile::tempdir().unwrap();
    let (out, cp) = (dir.path().join("out"), dir.path().join("cp.json"));
    let script = r#"echo $$ > "$TMPDIR/pid"; echo "ready $TMPDIR" >&2; while [ ! -e "$TMPDIR/open" ]; do sleep 0.05; done;
                    echo made > "$STEVEDORE_OUT/m"; exit 7"#;
    let (worker_process, scratch) = start_process_worker(&w, &out, &cp, script);
    kill9(worker_process);
    std::fs::write(scratch.join("open"), b"").unwrap();
    let pid: i32 = std::fs::read_to_string(scratch.join("pid")).unwrap().trim().parse().unwrap();
    let t = Instant::now();
    // Gone from /proc once the init reaped it.
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(t.elapsed() < Duration::from_secs(60), "the command never ended");
        std::thread::yield_now();
    }
    let got = Command::new(BIN).arg("recover").arg(&cp).output().unwrap();
    // It exits as `run` would have: the command's own status.
    assert_eq!(got.status.code(), Some(7), "{}", String::from_utf8_lossy(&got.stderr));
    let o: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!((o["status"].as_str(), o["exit_code"].as_i64()), (Some("handler_error"), Some(7)), "{o}");
    assert!(o["evidence"]["recovered"].as_str().unwrap().contains("after the command had ended"), "{o}");
    assert_eq!(std::fs::read_to_string(out.join("m")).unwrap(), "made\n");
}

/// A static program that fills the init's takeover socket with connections that never say
/// anything, as fast as it can, holding 200 of them at a time.
const FLOOD_C: &str = r#"
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
int main(void) {
    char id[64] = {0}, line[512];
    FILE *f = fopen("/proc/net/unix", "r");
    if (!f) return 2;
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, "@stevedore-takeover-");
        if (p) { sscanf(p + 20, "%32s", id); break; }
    }
    fclose(f);
    if (!id[0]) return 3;
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    int n = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "stevedore-takeover-%s", id);
    socklen_t len = offsetof(struct sockaddr_un, sun_path) + 1 + n;
    int held[200] = {0};
    unsigned long i = 0;
    fprintf(stderr, "flooding %s\n", id);
    for (;;) {
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        if (s < 0) continue;
        if (connect(s, (struct sockaddr *)&a, len) != 0) { close(s); continue; }
        if (held[i % 200]) close(held[i % 200]);
        held[i % 200] = s;
        i++;
    }
}
"#;

/// Busybox with the flooder at /flood.
async fn flood_image(docker: &bollard::Docker) -> String {
    let busybox = busybox_image(docker).await;
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("flood.c"), FLOOD_C).unwrap();
    let bin = t.path().join("flood");
    let gcc =
        Command::new("gcc").args(["-static", "-O2", "-o"]).arg(&bin).arg(t.path().join("flood.c")).output().unwrap();
    assert!(gcc.status.success(), "{}", String::from_utf8_lossy(&gcc.stderr));
    let dockerfile = format!("FROM {busybox}\nCOPY flood /flood\nLABEL {TEST_LABEL}=true\n");
    let ctx = tar_of(&[("Dockerfile", 0o644, dockerfile.as_bytes()), ("flood", 0o755, &std::fs::read(&bin).unwrap())]);
    let tag = format!("stevedore-test/flood:{:08x}", rand::random::<u32>());
    stevedore::image::build_image_from_dir_tar(support::seam().await, &tag, ctx).await.unwrap();
    tag
}

/// The command floods the takeover socket while the worker is dead and while a restarted
/// one takes the attempt over; the takeover still succeeds and the attempt ends with its
/// outputs. `profile`: none (the relay runs as root, a uid the command lacks, and the init
/// takes no other), or one that runs the command as root too (no uid tells them apart: the
/// host's proof arriving with its connection is all there is, as on Kubernetes).
async fn recovered_despite_a_flood(as_root: bool) {
    let Some((docker, _)) = setup().await else { return };
    let image = flood_image(&docker).await;
    let w = worker(if as_root { "recover-flood-root" } else { "recover-flood" });
    let dir = tempfile::tempdir().unwrap();
    let (out, cp) = (dir.path().join("out"), dir.path().join("cp.json"));
    let config = dir.path().join("profiles.toml");
    std::fs::write(&config, "[profiles.root]\nallow_root = true\n").unwrap();
    let mut run = Command::new(BIN);
    if as_root {
        run.arg("--config").arg(&config).args(["--profile", "root"]);
    }
    let script = r#"/flood & sleep 1; echo ready >&2;
                    while [ ! -e /tmp/gate ]; do "$STEVEDORE_INIT" report heartbeat; sleep 0.2; done;
                    echo result > /out/r"#;
    let mut child = run
        .args(["run", "--worker", &w, "--image", &image, "--host-loss-grace", "120s", "--checkpoint"])
        .arg(&cp)
        .arg("--output")
        .arg(&out)
        .arg("--logs")
        .arg(out.with_file_name("logs"))
        .args(if as_root { vec!["--user", "0:0"] } else { vec![] })
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    while !lines.next().expect("ready").unwrap().contains("ready") {}
    kill9(child);
    let id = container_of(&cp);
    let mut recover = Command::new(BIN);
    if as_root {
        recover.arg("--config").arg(&config).args(["--profile", "root"]);
    }
    let mut recover = recover.arg("recover").arg(&cp).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(recover.stderr.take().unwrap()).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("report heartbeat") => break,
            Some(_) => continue,
            None => panic!("stevedore recover ended before the takeover"),
        }
    }
    assert_eq!(exec(&docker, &id, "touch /tmp/gate").await, 0);
    let drain = std::thread::spawn(move || lines.count());
    let got = recover.wait_with_output().unwrap();
    drain.join().unwrap();
    support::remove_image(&docker, &image).await;
    let o: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    assert!(got.status.success(), "{o}");
    assert_eq!(o["status"], "ok", "{o}");
    assert!(o["evidence"]["recovered"].as_str().unwrap().contains("while the command was running"), "{o}");
    assert!(o["evidence"].get("hook_failures").is_none(), "{o}");
    assert_eq!(std::fs::read_to_string(out.join("r")).unwrap(), "result\n");
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn a_flood_from_inside_cannot_keep_the_restarted_worker_out() {
    recovered_despite_a_flood(false).await;
}

#[tokio::test]
async fn a_flood_cannot_keep_the_worker_out_even_when_the_command_runs_as_root() {
    recovered_despite_a_flood(true).await;
}
