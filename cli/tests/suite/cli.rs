//! The `stevedore` command against the real engine.

use crate::support;

use support::{BIN, start_sleeper};

use bollard::models::VolumeCreateRequest;
use bollard::query_parameters::{RemoveContainerOptionsBuilder, WaitContainerOptionsBuilder};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::Duration;

fn json(out: &[u8]) -> serde_json::Value {
    let s = String::from_utf8_lossy(out);
    serde_json::from_str(s.lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

#[tokio::test]
async fn census_is_one_json_line() {
    let Some(_) = support::engine().await else { return };
    let out = Command::new(BIN).arg("census").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    for k in ["engine_version", "api_version", "cgroup_version", "runtimes", "level", "features", "skew", "incarnation"]
    {
        assert!(v.get(k).is_some(), "missing {k}: {text}");
    }
    assert_eq!(v["level"], "sandboxed");
    assert!(v["features"].as_array().unwrap().iter().any(|f| f == "memory"));
}

#[tokio::test]
async fn smoke_drains_and_incarnations_differ() {
    let Some(_) = support::engine().await else { return };
    let mut incarnations = Vec::new();
    // Its own private dir, to see that a check leaves nothing there (no capture).
    let runtime = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        let out = Command::new(BIN).arg("smoke").env("XDG_RUNTIME_DIR", runtime.path()).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(text.lines().last(), Some("drain: ok"), "{text}");
        let census: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        incarnations.push(census["incarnation"].as_str().unwrap().to_owned());
    }
    assert_ne!(incarnations[0], incarnations[1]);
    let mut left = Vec::new();
    let mut dirs = vec![runtime.path().join("stevedore/logs")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().unwrap().is_dir() { dirs.push(e.path()) } else { left.push(e.path()) }
        }
    }
    assert!(left.is_empty(), "smoke left captures: {left:?}");
}

#[test]
fn smoke_without_engine_fails_with_the_reason() {
    let out = Command::new(BIN).arg("smoke").env("DOCKER_HOST", "unix:///nonexistent/docker.sock").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    let last = text.lines().last().unwrap();
    assert!(last.starts_with("drain: failed") && last.contains("/nonexistent/docker.sock"), "{last}");
}

#[tokio::test]
async fn run_a_builtin_handler() {
    let Some(docker) = support::engine().await else { return };
    let w = support::worker("cli-handler");
    let t = tempfile::tempdir().unwrap();
    let run = |out: &str, args: &[&str]| {
        Command::new(BIN)
            .args(["run", "--outcome", "-", "--quiet", "--worker", &w, "--output"])
            .arg(t.path().join(out))
            .args(args)
            .output()
            .unwrap()
    };
    let out = run("o", &["--handler", "echo", "--payload", "hello"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json(&out.stdout);
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["outputs"][0]["name"], "payload");
    assert_eq!(std::fs::read(t.path().join("o/payload")).unwrap(), b"hello");
    let v = json(&run("p", &["--handler", "no-such-handler"]).stdout);
    assert_eq!(v["status"], "launch_failed", "{v}");
    assert_eq!(v["permanent"], true);
    let out = run("q", &["--handler", "true", "--fingerprint", "sha256:0000"]);
    assert_eq!(out.status.code(), Some(125), "a mismatch visible on the image is a launch error");
    let err = String::from_utf8_lossy(&out.stderr);
    let actual = stevedore::handlers::builtin().fingerprint();
    assert!(err.contains("sha256:0000") && err.contains(&actual), "both fingerprints named: {err}");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn eight_runs_at_once() {
    let Some((docker, image)) = support::setup().await else { return };
    let w = support::worker("eight");
    let t = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..8)
        .map(|i| {
            Command::new(BIN)
                .args([
                    "run",
                    "--outcome",
                    "-",
                    "--quiet",
                    "--worker",
                    &w,
                    "--image",
                    &image,
                    "--job",
                    &format!("job-{i}"),
                    "--output",
                ])
                .arg(t.path().join(format!("o{i}")))
                .args(["--", "sh", "-c", "echo $STEVEDORE_JOB_ID > /out/id"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (i, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(json(&out.stdout)["status"], "ok");
        assert_eq!(std::fs::read_to_string(t.path().join(format!("o{i}/id"))).unwrap(), format!("job-{i}\n"));
    }
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn sigterm_cancels_cleans_up_and_exits_143() {
    let Some((docker, image)) = support::setup().await else { return };
    let w = support::worker("sigterm");
    let t = tempfile::tempdir().unwrap();
    let child = start_sleeper(&image, &w, &t.path().join("o"));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143));
    let v = json(&out.stdout);
    assert_eq!(v["status"], "killed");
    assert_eq!(v["reason"], "cancelled");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn sigint_cancels_cleans_up_and_exits_130() {
    let Some((docker, image)) = support::setup().await else { return };
    let w = support::worker("sigint");
    let t = tempfile::tempdir().unwrap();
    let child = start_sleeper(&image, &w, &t.path().join("o"));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    let v = json(&out.stdout);
    assert_eq!(v["status"], "killed");
    assert_eq!(v["reason"], "cancelled");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

#[test]
fn usage_errors_exit_125_and_help_exits_0() {
    let out = Command::new(BIN).args(["census", "--no-such-flag"]).output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
    let out = Command::new(BIN).args(["run", "--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage"));
}

#[tokio::test]
async fn dead_man_switch_and_reclaim_after_a_crash() {
    let Some((docker, image)) = support::setup().await else { return };
    let w = support::worker("crash");
    let w2 = support::worker("other");
    let t = tempfile::tempdir().unwrap();
    let mut child = start_sleeper(&image, &w, &t.path().join("o"));
    let (ids, _) = support::labelled(&docker, &w).await;
    assert_eq!(ids.len(), 1, "the attempt's container is running");
    // The killed process's own init volume, found by its incarnation.
    let incarnation = docker.inspect_container(&ids[0], None).await.unwrap().config.unwrap().labels.unwrap()
        ["dev.stevedore.incarnation"]
        .clone();
    let tools_of = |inc: String| {
        let docker = docker.clone();
        async move {
            let filters = HashMap::from([(
                "label".to_owned(),
                vec!["dev.stevedore.kind=tools".to_owned(), format!("dev.stevedore.incarnation={inc}")],
            )]);
            let opts = bollard::query_parameters::ListVolumesOptionsBuilder::default().filters(&filters).build();
            docker.list_volumes(Some(opts)).await.unwrap().volumes.unwrap_or_default().len()
        }
    };
    assert_eq!(tools_of(incarnation.clone()).await, 1, "the run's init volume");
    child.kill().unwrap();
    child.wait().unwrap();
    // The init sees its stdin close and stops the command: the container exits by itself.
    let mut wait =
        docker.wait_container(&ids[0], Some(WaitContainerOptionsBuilder::default().condition("not-running").build()));
    let waited = tokio::time::timeout(Duration::from_secs(15), wait.next()).await;
    let running = docker.inspect_container(&ids[0], None).await.unwrap().state.and_then(|s| s.running);
    assert!(waited.is_ok() && running == Some(false), "the container kept running without its stevedore");

    // More leftovers of W, and objects that must survive.
    let mk = |name: String, labels| support::create_named(&docker, &image, name, labels, &["true"]);
    let never_started = mk(format!("{w}-created"), support::worker_labels(&w)).await;
    let other = mk(format!("{w2}-keep"), support::worker_labels(&w2)).await;
    let unlabelled =
        mk(format!("{w}-unlabelled"), HashMap::from([(support::TEST_LABEL.to_owned(), "true".to_owned())])).await;
    docker
        .create_volume(VolumeCreateRequest {
            name: Some(format!("{w}-vol")),
            labels: Some(support::worker_labels(&w)),
            ..Default::default()
        })
        .await
        .unwrap();

    let out = Command::new(BIN).args(["reclaim", "--worker", &w]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json(&out.stdout);
    assert_eq!(v["containers_removed"], 2, "{v}");
    assert!(v["stale_images"].is_array(), "stale worker images are listed: {v}");
    assert!(v["volumes_removed"].as_u64().unwrap() >= 1, "{v}");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    assert_eq!(tools_of(incarnation).await, 0, "the crashed process's init volume was reclaimed with its attempt");
    assert!(docker.inspect_container(&never_started, None).await.is_err(), "the never-started leftover was reclaimed");
    for keep in [&other, &unlabelled] {
        assert!(docker.inspect_container(keep, None).await.is_ok(), "{keep} must survive");
        docker
            .remove_container(keep, Some(RemoveContainerOptionsBuilder::default().force(true).build()))
            .await
            .unwrap();
    }
}
