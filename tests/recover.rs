//! Restart recovery through the command: `stevedore run --checkpoint F --host-loss-grace`
//! is killed with SIGKILL mid-attempt; `stevedore recover F` finishes the attempt and prints
//! its Outcome with its outputs, whether the command was still running when the worker came
//! back or had ended while it was away. What cannot be recovered is removed.

mod support;

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
    let mut child = Command::new(BIN)
        .args(["run", "--worker", w, "--image", image, "--host-loss-grace", "120s", "--checkpoint"])
        .arg(cp)
        .arg("--output")
        .arg(out)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("ready") => break,
            Some(_) => continue,
            None => panic!("stevedore run ended before the command was ready"),
        }
    }
    child
}

fn kill9(mut child: Child) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    child.wait().unwrap();
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
    assert_eq!(exec(&docker, &id, "touch /tmp/gate").await, 0);
    // Drained on a thread: more reports may come before the end.
    let drain = std::thread::spawn(move || lines.count());
    let got = recover.wait_with_output().unwrap();
    drain.join().unwrap();
    assert!(got.status.success());
    let o: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!(o["status"], "ok", "{o}");
    assert!(o["evidence"]["recovered"].as_str().unwrap().contains("while the command was running"), "{o}");
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
    let err = rung.recover(&forged, None, Default::default()).await.expect_err("a wrong key cannot take over");
    assert!(matches!(err, stevedore::contract::RecoverError::Takeover(_)), "{err:?}");
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
fn start_process_worker(w: &str, out: &Path, cp: &Path, script: &str) -> (Child, std::path::PathBuf) {
    let mut child = Command::new(BIN)
        .args(["run", "--rung", "process", "--worker", w, "--host-loss-grace", "120s", "--checkpoint"])
        .arg(cp)
        .arg("--output")
        .arg(out)
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
