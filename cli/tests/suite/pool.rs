//! The warm pool: the same statuses, usage, inputs and leak checks as the cold path, through
//! parked containers; what cannot be served warm goes cold and says why; this process's
//! reclaim spares its live pool; `close` drains it.

use crate::support;

use std::time::Duration;
use stevedore::container::{ContainerConfig, PoolConfig};
use stevedore::{Executor, Reason, Status};
use support::{labelled, run, setup, sh, worker};

async fn pooled(w: &str, image: &str, size: usize) -> stevedore::ContainerExecutor {
    let mut cfg = ContainerConfig::default();
    cfg.pool = Some(PoolConfig::new(size, w).image(image));
    // /tmp's size is fixed at create and must fit every memory limit the pool serves.
    cfg.max_tmp_bytes = 16 << 20;
    cfg.background_cleanup = true;
    let rung = support::rung_with(cfg).await;
    assert!(rung.warm_up(Duration::from_secs(60)).await, "the pool fills");
    rung
}

#[tokio::test]
async fn statuses_and_usage_through_the_pool_are_the_cold_paths() {
    let Some((docker, image)) = setup().await else { return };
    let w = worker("pool-status");
    let rung = pooled(&w, &image, 2).await;
    assert_eq!(rung.parked(), 2);
    let t = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, stevedore::Request, Status, Option<Reason>)> = vec![
        ("ok", sh(&image, &w, &t.path().join("a"), "echo hi; echo r > /out/r"), Status::Ok, None),
        ("exit", sh(&image, &w, &t.path().join("b"), "exit 3"), Status::HandlerError, None),
        ("signal", sh(&image, &w, &t.path().join("c"), "kill -9 $$"), Status::Killed, Some(Reason::Signalled)),
        (
            "timeout",
            sh(&image, &w, &t.path().join("d"), "trap '' TERM; sleep 30")
                .timeout(Duration::from_secs(1))
                .grace(Duration::from_millis(500)),
            Status::Timeout,
            Some(Reason::Deadline),
        ),
        (
            "oom",
            // The memory limit is set at claim (docker update): 32 MiB, less than the pool's default.
            sh(&image, &w, &t.path().join("e"), "dd if=/dev/zero of=/dev/null bs=64M count=1").memory(32 << 20),
            Status::OomKilled,
            Some(Reason::Oom),
        ),
    ];
    for (what, req, status, reason) in cases {
        assert!(rung.warm_up(Duration::from_secs(60)).await, "{what}: the pool refills");
        let o = run(&rung, &req).await;
        assert_eq!(o.evidence.warm, Some(true), "{what}: {}", o.to_json());
        assert_eq!((o.status, o.reason), (status, reason), "{what}: {}", o.to_json());
        if what == "ok" {
            assert_eq!(o.outputs[0].name, "r");
            assert_eq!(support::stdout_of(&o), "hi\n");
            assert!(o.evidence.enforcement["memory"].contains("as claimed"));
        }
        if what == "oom" {
            assert!(o.usage.peak_memory_bytes.unwrap() <= (32 << 20) + (4 << 20), "{}", o.to_json());
        }
    }
    rung.close().await;
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]), "close drains the pool and leaves nothing");
}

#[tokio::test]
async fn inputs_reach_a_parked_container_read_only() {
    let Some((docker, image)) = setup().await else { return };
    let w = worker("pool-inputs");
    let rung = pooled(&w, &image, 1).await;
    let inputs = tempfile::tempdir().unwrap();
    std::fs::write(inputs.path().join("a.txt"), b"input").unwrap();
    let t = tempfile::tempdir().unwrap();
    let req =
        sh(&image, &w, &t.path().join("o"), "cat /in/a.txt; touch /in/b 2>/dev/null && echo wrote || echo read-only")
            .input_dir(inputs.path());
    let o = run(&rung, &req).await;
    assert_eq!((o.status, o.evidence.warm), (Status::Ok, Some(true)), "{}", o.to_json());
    assert_eq!(support::stdout_of(&o), "inputread-only\n");
    rung.close().await;
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn what_does_not_fit_goes_cold_and_says_why() {
    let Some((docker, image)) = setup().await else { return };
    let w = worker("pool-misfit");
    let rung = pooled(&w, &image, 1).await;
    let t = tempfile::tempdir().unwrap();
    let o = run(&rung, &sh(&image, &w, &t.path().join("o"), "true").disk(100 << 20)).await;
    assert_eq!((o.status, o.evidence.warm), (Status::Ok, Some(false)));
    assert!(o.evidence.skipped["warm_pool"].contains("disk"), "{:?}", o.evidence.skipped);
    assert_eq!(rung.parked(), 1, "the parked container stays for an attempt that fits");
    rung.close().await;
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn this_processs_reclaim_spares_its_live_pool() {
    let Some((docker, image)) = setup().await else { return };
    let w = worker("pool-reclaim");
    let rung = pooled(&w, &image, 2).await;
    let report = rung.reclaim(&w).await.unwrap();
    assert!(report.containers_removed.is_empty(), "{report:?}");
    assert!(report.kept_in_flight.len() >= 2, "{report:?}");
    assert_eq!(rung.parked(), 2);
    let t = tempfile::tempdir().unwrap();
    let o = run(&rung, &sh(&image, &w, &t.path().join("o"), "true")).await;
    assert_eq!(o.evidence.warm, Some(true));
    rung.close().await;
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn a_dropped_warm_attempt_leaves_nothing() {
    let Some((docker, image)) = setup().await else { return };
    let w = worker("pool-drop");
    let rung = pooled(&w, &image, 1).await;
    let t = tempfile::tempdir().unwrap();
    let req = sh(&image, &w, &t.path().join("o"), "sleep 300");
    let _ = tokio::time::timeout(Duration::from_secs(3), rung.run(&req, Default::default())).await;
    rung.close().await;
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]));
}

/// The objects of incarnation `incarnation`: its containers (any state) and volumes.
async fn of_incarnation(docker: &bollard::Docker, incarnation: &str) -> (Vec<String>, Vec<String>) {
    use bollard::query_parameters::ListContainersOptionsBuilder;
    let label = format!("{}={incarnation}", stevedore::container::labels::INCARNATION);
    let filters = std::collections::HashMap::from([("label", vec![label.as_str()])]);
    let containers = docker
        .list_containers(Some(ListContainersOptionsBuilder::default().all(true).filters(&filters).build()))
        .await
        .expect("list containers");
    let ids = containers.into_iter().filter_map(|c| c.id).collect();
    (ids, support::volumes_of_incarnation(docker, incarnation).await)
}

/// A caller that panics before `close()`, its runtime unwinding: the rung's Drop backstop
/// removes its tools volume and its parked container before the drop returns (it used to
/// spawn the removal on the runtime that was going away, so both stayed).
#[test]
fn a_rung_dropped_by_a_panic_leaves_no_tools_volume_and_no_parked_container() {
    let here = tokio::runtime::Runtime::new().unwrap();
    let Some((docker, image)) = here.block_on(setup()) else { return };
    for pool in [false, true] {
        let w = worker(if pool { "drop-pool" } else { "drop-cold" });
        let (docker_in, image_in) = (docker.clone(), image.clone());
        let made = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let rung = if pool {
                    pooled(&w, &image_in, 1).await
                } else {
                    let rung = support::rung().await;
                    let t = tempfile::tempdir().unwrap();
                    let o = run(&rung, &sh(&image_in, &w, &t.path().join("out"), "true")).await;
                    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
                    rung
                };
                let incarnation = rung.incarnation().to_owned();
                let (containers, volumes) = of_incarnation(&docker_in, &incarnation).await;
                assert!(!volumes.is_empty(), "the rung made its tools volume");
                assert_eq!(containers.len(), usize::from(pool), "a parked container iff pooled: {containers:?}");
                std::panic::panic_any(incarnation);
            })
        })
        .join();
        let incarnation = *made.expect_err("the caller panicked").downcast::<String>().expect("its incarnation");
        let left = here.block_on(of_incarnation(&docker, &incarnation));
        assert_eq!(left, (vec![], vec![]), "pool {pool}: left behind by incarnation {incarnation}");
    }
}
