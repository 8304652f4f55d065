//! Nothing leaks and nothing overloads, against the real engine: dropped futures, panics in
//! stevedore's host code, admission, reclaim at scale, engine faults, signals to the command.

use crate::support;

use support::{rung_with, setup, sh as cmd, start_sleeper};

use bollard::models::VolumeCreateRequest;
use bollard::query_parameters::RemoveContainerOptionsBuilder;
use futures_util::StreamExt;
use std::time::{Duration, Instant};
use stevedore::container::{ContainerConfig, ContainerExecutor};
use stevedore::{Executor, LaunchError, LiveOutput, Request, ResourceLimits, Status};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// Tests that time something run one at a time within this file.
static MEASURING: Mutex<()> = Mutex::const_new(());

const NOTHING: (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());

#[tokio::test]
async fn dropped_run_futures_leave_nothing_once_close_returns() {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung_with(ContainerConfig::default()).await;
    let w = support::worker("drop");
    let t = tempfile::tempdir().unwrap();

    // Dropped once the command runs.
    let mut req = cmd(&image, &w, &t.path().join("a"), "echo ready; sleep 60");
    let mut watch = support::watch([&mut req]);
    tokio::select! {
        r = rung.run(&req, CancellationToken::new()) => panic!("the attempt ended by itself: {r:?}"),
        _ = watch.until("ready") => {}
    }
    let (containers, _) = support::labelled(&docker, &w).await;
    assert!(!containers.is_empty(), "the dropped attempt's container is still there until its cleanup runs");

    // Dropped at points spread over staging, creation and start (an input dir adds a volume
    // and a staging container); where exactly does not matter, each one must be cleaned up.
    let input = t.path().join("in");
    std::fs::create_dir(&input).unwrap();
    std::fs::write(input.join("f"), b"x").unwrap();
    for (i, ms) in [0u64, 5, 10, 20, 40, 80, 120, 160, 250, 400, 600, 900].into_iter().enumerate() {
        let mut req = cmd(&image, &w, &t.path().join(format!("b{i}")), "sleep 60");
        req.input_dir = Some(input.clone());
        let ran = tokio::time::timeout(Duration::from_millis(ms), rung.run(&req, CancellationToken::new())).await;
        assert!(ran.is_err(), "the attempt ended by itself: {ran:?}");
    }
    let closing = Instant::now();
    rung.close().await;
    eprintln!("close waited {:?} for the dropped attempts' cleanup", closing.elapsed());
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

#[tokio::test]
async fn a_live_reader_that_never_reads_stalls_nothing() {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung_with(ContainerConfig::default()).await;
    let w = support::worker("slowlive");
    let t = tempfile::tempdir().unwrap();
    // One chunk of room, never read: the container must not block on it, and the capture
    // must still be whole. Past 128 KiB the output is more than two of the init's chunks
    // however it is read, so something must be dropped.
    let (live, _never_read) = LiveOutput::channel(1);
    let script = "i=0; while [ $i -lt 20000 ]; do echo line-$i; i=$((i+1)); done; echo kept > /out/x";
    let req = cmd(&image, &w, &t.path().join("o"), script).live_output(live);
    let o = tokio::time::timeout(Duration::from_secs(60), rung.run(&req, CancellationToken::new()))
        .await
        .expect("a stalled live reader does not stall the attempt")
        .expect("the attempt runs");
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let expected: u64 = (0..20000).map(|i| format!("line-{i}\n").len() as u64).sum();
    assert_eq!(o.evidence.logs.stdout.bytes, expected, "the capture is complete");
    assert!(o.evidence.live_dropped_bytes > 0, "what the reader missed is counted: {}", o.to_json());
    assert_eq!(o.outputs.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["x"]);
    rung.close().await;
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

#[tokio::test]
async fn admission_holds_the_bound_with_16_attempts_at_once() {
    let Some((docker, image)) = setup().await else { return };
    // The bound is observed while the engine is polled: not beside the timed reclaim test.
    let _one_at_a_time = MEASURING.lock().await;
    const BOUND: usize = 4;
    let rung = rung_with(ContainerConfig::default().max_in_flight(BOUND, true)).await;
    let w = support::worker("admit");
    let t = tempfile::tempdir().unwrap();
    let mut reqs: Vec<Request> =
        (0..16).map(|i| cmd(&image, &w, &t.path().join(format!("o{i}")), "echo S; sleep 1; echo E")).collect();
    // Containers started minus finished, as the commands themselves report it.
    let mut watch = support::watch(reqs.iter_mut());
    let counter = tokio::spawn(async move {
        let (mut running, mut most) = (0i64, 0i64);
        while let Some(text) = watch.next_stdout().await {
            running += text.matches('S').count() as i64;
            most = most.max(running);
            running -= text.matches('E').count() as i64;
        }
        most
    });

    // The engine's view: the worker's containers that exist at once, polled while they run.
    let stop = CancellationToken::new();
    let poller = {
        let (docker, w, stop) = (docker.clone(), w.clone(), stop.clone());
        tokio::spawn(async move {
            let mut most = 0;
            let mut polls = 0;
            while !stop.is_cancelled() {
                most = most.max(support::labelled(&docker, &w).await.0.len());
                polls += 1;
            }
            (most, polls)
        })
    };
    let started = Instant::now();
    let outcomes = futures_util::future::join_all(reqs.iter().map(|r| rung.run(r, CancellationToken::new()))).await;
    let elapsed = started.elapsed();
    drop(reqs);
    stop.cancel();
    let (most_containers, polls) = poller.await.unwrap();
    for o in &outcomes {
        let o = o.as_ref().expect("admitted, never refused");
        assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    }
    let most_running = counter.await.unwrap();
    eprintln!(
        "admission: 16 attempts in {elapsed:?}; most running at once (commands' view) {most_running}, \
         most containers at once (engine's view, {polls} polls) {most_containers}"
    );
    assert!(most_running as usize <= BOUND, "{most_running} commands ran at once");
    assert!(most_containers <= BOUND, "{most_containers} containers existed at once");
    assert!(most_running >= 2, "attempts ran side by side ({most_running})");
    rung.close().await;
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

#[tokio::test]
async fn admission_refuses_when_told_not_to_wait_and_beyond_the_memory_budget() {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung_with(ContainerConfig::default().max_in_flight(2, false)).await;
    let w = support::worker("refuse");
    let t = tempfile::tempdir().unwrap();
    let cancel = CancellationToken::new();
    let mut a = cmd(&image, &w, &t.path().join("a"), "echo S; sleep 60");
    let mut b = cmd(&image, &w, &t.path().join("b"), "echo S; sleep 60");
    let mut watch = support::watch([&mut a, &mut b]);
    let third = cmd(&image, &w, &t.path().join("c"), "true");
    let (ra, rb, refused) = tokio::join!(rung.run(&a, cancel.clone()), rung.run(&b, cancel.clone()), async {
        watch.until("S").await;
        watch.until("S").await;
        let refused = rung.run(&third, CancellationToken::new()).await;
        cancel.cancel();
        refused
    });
    match refused {
        Err(LaunchError::AdmissionRefused(msg)) => {
            assert!(msg.contains("2 attempts in flight"), "{msg}");
            let text = LaunchError::AdmissionRefused(msg).to_string();
            assert!(text.starts_with("admission refused: "), "{text}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(!t.path().join("c").exists(), "a refused attempt touches nothing");
    for o in [ra, rb] {
        let o = o.expect("admitted");
        assert_eq!((o.status, o.reason.map(|r| r.as_str())), (Status::Killed, Some("cancelled")), "{}", o.to_json());
    }

    // One request alone beyond 80 % of the host, whether the rung waits or not.
    let host = rung.engine().facts().mem_total_bytes;
    for wait in [false, true] {
        let rung = rung_with(ContainerConfig::default().max_in_flight(8, wait)).await;
        let mut big = cmd(&image, &w, &t.path().join("big"), "true");
        big.limits = ResourceLimits::new().with(stevedore::contract::limits::key::MEMORY, host);
        match rung.run(&big, CancellationToken::new()).await {
            Err(LaunchError::AdmissionRefused(msg)) => {
                assert!(msg.contains("exceeds the rung's budget") && msg.contains("MiB"), "{msg}")
            }
            other => panic!("expected a memory refusal, got {other:?}"),
        }
        rung.close().await;
    }
    rung.close().await;
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

#[tokio::test]
async fn reclaim_removes_100_leaked_containers() {
    let Some((docker, image)) = setup().await else { return };
    let _one_at_a_time = MEASURING.lock().await;
    let rung = support::rung().await;
    let w = support::worker("reclaim100");
    // 80 created and never started, 15 started and exited, 5 running; 20 volumes.
    let made: Vec<String> = futures_util::stream::iter(0..100)
        .map(|i| {
            let (docker, image, w) = (docker.clone(), image.clone(), w.clone());
            async move {
                let cmd: &[&str] = if i >= 95 { &["sleep", "300"] } else { &["true"] };
                let name =
                    support::create_named(&docker, &image, format!("{w}-{i}"), support::worker_labels(&w), cmd).await;
                if i >= 80 {
                    docker.start_container(&name, None).await.unwrap();
                }
                name
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    for i in 0..20 {
        let labels = Some(support::worker_labels(&w));
        let volume = VolumeCreateRequest { name: Some(format!("{w}-v{i}")), labels, ..Default::default() };
        docker.create_volume(volume).await.unwrap();
    }
    assert_eq!(support::labelled(&docker, &w).await.0.len(), made.len());

    let started = Instant::now();
    let report = rung.reclaim(&w).await.expect("the sweep runs");
    let elapsed = started.elapsed();
    eprintln!(
        "reclaim: {} containers and {} volumes removed in {elapsed:?} ({} failed)",
        report.containers_removed.len(),
        report.volumes_removed.len(),
        report.failed.len()
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!((report.containers_removed.len(), report.volumes_removed.len()), (100, 20));
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
    rung.close().await;
}

#[tokio::test]
async fn an_unreachable_engine_is_a_launch_error_naming_the_endpoint() {
    let cfg = ContainerConfig::default().endpoint("unix:///nonexistent.sock");
    let err = ContainerExecutor::connect(cfg).await.expect_err("nothing listens there");
    assert!(matches!(err, LaunchError::EngineUnreachable { .. }), "{err:?}");
    assert!(err.to_string().contains("unix:///nonexistent.sock"), "{err}");
}

#[tokio::test]
async fn a_container_removed_from_outside_is_killed_removed_externally() {
    removed_from_outside(ContainerConfig::default()).await;
}

/// With a host-loss grace the end of the attach could be a cut link to resume; the init is
/// gone with its container, so nothing is waited for.
#[tokio::test]
async fn a_container_removed_from_outside_under_a_host_loss_grace_ends_as_soon() {
    let mut cfg = ContainerConfig::default();
    cfg.link.host_loss.grace = Duration::from_secs(600);
    removed_from_outside(cfg).await;
}

async fn removed_from_outside(cfg: ContainerConfig) {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung_with(cfg).await;
    let w = support::worker("rmf");
    let t = tempfile::tempdir().unwrap();
    let mut req = cmd(&image, &w, &t.path().join("o"), "echo ready; sleep 300");
    let mut watch = support::watch([&mut req]);
    let remove = async {
        watch.until("ready").await;
        let (ids, _) = support::labelled(&docker, &w).await;
        assert_eq!(ids.len(), 1);
        let opts = RemoveContainerOptionsBuilder::default().force(true).build();
        docker.remove_container(&ids[0], Some(opts)).await.unwrap();
    };
    let attempt = async { tokio::join!(rung.run(&req, CancellationToken::new()), remove).0 };
    let o = tokio::time::timeout(Duration::from_secs(60), attempt)
        .await
        .expect("the attempt ends soon after its container is gone")
        .expect("it had started: an outcome, not a launch error");
    assert_eq!(
        (o.status, o.reason.map(|r| r.as_str())),
        (Status::Killed, Some("removed_externally")),
        "{}",
        o.to_json()
    );
    rung.close().await;
    assert_eq!(support::labelled(&docker, &w).await, NOTHING);
}

/// The leak seen before: the container removed from outside while two SIGTERMs reach the
/// command; stevedore's own removal found the outside one in progress and its volumes in use.
#[tokio::test]
async fn outside_removal_and_a_double_sigterm_leave_nothing() {
    let Some((docker, image)) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    // The two removals race differently each time; several rounds cover more of the orders.
    for round in 0..3 {
        let w = support::worker("rm2term");
        let child = start_sleeper(&image, &w, &t.path().join(format!("o{round}")));
        let (ids, volumes) = support::labelled(&docker, &w).await;
        assert_eq!((ids.len(), volumes.len()), (1, 0), "one container, and no volume without inputs");
        let removal = {
            let docker = docker.clone();
            let id = ids[0].clone();
            tokio::spawn(async move {
                let opts = RemoveContainerOptionsBuilder::default().force(true).build();
                docker.remove_container(&id, Some(opts)).await
            })
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await.unwrap().unwrap();
        assert_eq!(out.status.code(), Some(143), "{}", String::from_utf8_lossy(&out.stderr));
        let _ = removal.await.unwrap();
        assert_eq!(support::labelled(&docker, &w).await, NOTHING, "round {round}");
    }
}
