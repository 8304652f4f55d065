//! The warm pool: the same statuses, usage, inputs and leak checks as the cold path, through
//! parked containers; what cannot be served warm goes cold and says why; this process's
//! reclaim spares its live pool; `close` drains it.

use crate::support;

use std::time::Duration;
use stevedore::container::{ContainerConfig, PoolConfig};
use stevedore::{Executor, Reason, Status};
use support::{labelled, run, setup, sh, worker};

async fn pooled(w: &str, image: &str, size: usize) -> stevedore::ContainerExecutor {
    pooled_with(w, image, size, ContainerConfig::default()).await
}

async fn pooled_with(w: &str, image: &str, size: usize, mut cfg: ContainerConfig) -> stevedore::ContainerExecutor {
    cfg.pool = Some(PoolConfig::new(size, w).image(image));
    // /tmp's size follows the memory limit up to this: one size class for the memory
    // limits below, which `update` applies at claim.
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
    std::fs::create_dir(inputs.path().join("d")).unwrap();
    std::fs::write(inputs.path().join("d/b.txt"), b"deep").unwrap();
    // The inputs come through a writable mount of the same volume (root's entries, no
    // write bits): the command tries every way through it and through /in.
    let script = "cat /in/a.txt; \
        for try in 'touch /in/b' 'touch /.stevedore/stage/b' 'echo x > /.stevedore/stage/a.txt' \
                   'chmod 666 /.stevedore/stage/a.txt' 'rm /.stevedore/stage/d/b.txt' \
                   'mv /.stevedore/stage/d /.stevedore/stage/e' 'touch /.stevedore/stage/d/c'; do \
          sh -c \"$try\" 2>/dev/null && echo \"wrote: $try\"; done; \
        cat /in/a.txt /in/d/b.txt; stat -c '%u %a' /in/a.txt /in/d";
    let req = sh(&image, &w, &t.path().join("o"), script).input_dir(inputs.path());
    let o = run(&rung, &req).await;
    assert_eq!((o.status, o.evidence.warm), (Status::Ok, Some(true)), "{}", o.to_json());
    assert_eq!(support::stdout_of(&o), "inputinputdeep0 444\n0 555\n", "{}", o.to_json());
    assert!(o.evidence.enforcement["inputs_read_only"].contains("read-only at /in"), "{:?}", o.evidence.enforcement);
    assert_eq!(std::fs::read(inputs.path().join("a.txt")).unwrap(), b"input", "the caller's inputs untouched");
    rung.close().await;
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]));
}

/// A job engine whose attempts ask for less memory and a smaller disk than the pool's
/// defaults: the first goes cold and says why, the pool then parks containers of that size
/// class, and the next attempts are served warm with both limits enforced as asked: writing
/// past the disk limit meets ENOSPC at it, and the memory limit is the cgroup's.
#[tokio::test]
async fn a_smaller_memory_and_disk_limit_is_served_warm_once_asked_for() {
    let Some((docker, image)) = setup().await else { return };
    let w = worker("pool-fit");
    let rung = pooled(&w, &image, 1).await;
    let t = tempfile::tempdir().unwrap();
    let (memory, disk) = (96u64 << 20, 8u64 << 20);
    // 12 MiB into an 8 MiB /out; the memory limit as the cgroup has it.
    let script = "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes; \
                  dd if=/dev/zero of=/out/big bs=1M count=12 2>/dev/null; echo dd=$?";
    let req = |n: &str| sh(&image, &w, &t.path().join(n), script).memory(memory).disk(disk);
    let first = run(&rung, &req("a")).await;
    assert_eq!(first.evidence.warm, Some(false), "{}", first.to_json());
    assert!(first.evidence.skipped["warm_pool"].contains("size class"), "{:?}", first.evidence.skipped);
    for n in ["b", "c"] {
        assert!(rung.warm_up(Duration::from_secs(60)).await, "the pool refills");
        let o = run(&rung, &req(n)).await;
        assert_eq!(o.evidence.warm, Some(true), "{n}: {}", o.to_json());
        assert_eq!(o.reason, Some(Reason::DiskLimit), "{n}: {}", o.to_json());
        // The cgroup holds the attempt's memory and the init's delivery reserve.
        let limit = memory + stevedore::LinkConfig::default().delivery_reserve;
        assert_eq!(support::stdout_of(&o), format!("{limit}\ndd=1\n"), "{n}: {}", o.to_json());
        let said = &o.evidence.enforcement["memory"];
        assert!(said.contains(&format!("{limit} bytes: the attempt's {memory}")), "{said}");
        assert!(o.evidence.enforcement["disk"].contains(&format!("{disk} bytes")), "{:?}", o.evidence.enforcement);
        let big = std::fs::metadata(t.path().join(n).join("big")).map(|m| m.len()).unwrap_or(0);
        assert!(big <= disk, "{n}: /out held {big} bytes past its {disk}");
    }
    let s = rung.pool_stats();
    assert_eq!((s.hits, s.misses), (2, 1), "{s:?}");
    assert!(s.evicted >= 1, "the default class made room for the one asked for: {s:?}");
    rung.close().await;
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]));
}

/// What no class serves (another image: here the pool's own by its id) goes cold, says
/// why, and makes the pool fill nothing: the parked container stays.
#[tokio::test]
async fn what_no_class_serves_goes_cold_and_says_why() {
    let Some((docker, image)) = setup().await else { return };
    let w = worker("pool-misfit");
    let rung = pooled(&w, &image, 1).await;
    let id = docker.inspect_image(&image).await.unwrap().id.unwrap();
    let t = tempfile::tempdir().unwrap();
    let o = run(&rung, &sh(&id, &w, &t.path().join("o"), "true")).await;
    assert_eq!((o.status, o.evidence.warm), (Status::Ok, Some(false)), "{}", o.to_json());
    assert!(o.evidence.skipped["warm_pool"].contains("is not the pool's"), "{:?}", o.evidence.skipped);
    assert_eq!((rung.parked(), rung.pool_stats().fills_started), (1, 1), "{:?}", rung.pool_stats());
    rung.close().await;
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]));
}

/// Refills are paced: ten attempts at once against a pool of 4 take the 4 parked containers
/// (the rest go cold: the pool was empty), each container taken is replaced by exactly one
/// fill, never more than `max_filling` of them at once, and every attempt ran in a
/// container of its own.
#[tokio::test]
async fn refills_follow_the_claims_one_for_one_and_never_in_a_burst() {
    let Some((docker, image)) = setup().await else { return };
    let w = worker("pool-pace");
    let mut cfg = ContainerConfig::default();
    cfg.pool = Some(PoolConfig::new(4, &w).image(&image).max_filling(2));
    cfg.max_tmp_bytes = 16 << 20;
    cfg.background_cleanup = true;
    let rung = support::rung_with(cfg).await;
    assert!(rung.warm_up(Duration::from_secs(60)).await, "the pool fills");
    let t = tempfile::tempdir().unwrap();
    let runs = (0..10).map(|i| {
        let req = sh(&image, &w, &t.path().join(format!("o{i}")), "true");
        let rung = rung.clone();
        async move { run(&rung, &req).await }
    });
    let outcomes = futures_util::future::join_all(runs).await;
    let mut ids: Vec<&str> = outcomes.iter().filter_map(|o| o.evidence.container_id.as_deref()).collect();
    assert!(outcomes.iter().all(|o| o.status == Status::Ok));
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 10, "every attempt in a container of its own");
    assert!(rung.warm_up(Duration::from_secs(60)).await, "the pool refills");
    let s = rung.pool_stats();
    assert_eq!((s.hits, s.misses), (4, 6), "{s:?}");
    assert_eq!(s.fills_started, 4 + s.hits, "one fill per container taken: {s:?}");
    assert!(s.most_filling <= 2, "never more than max_filling at once: {s:?}");
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
        // The backstop's volumes: the init from a tools volume, not the host directory.
        let mut cfg = ContainerConfig::default();
        cfg.init_from_host = false;
        let (docker_in, image_in) = (docker.clone(), image.clone());
        let made = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let rung = if pool {
                    pooled_with(&w, &image_in, 1, cfg).await
                } else {
                    let rung = support::rung_with(cfg).await;
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

/// The parked init's read-ahead hints (from its environment, never its arguments), of the
/// pool's one running container (an attempt's, removed in the background, has ended).
async fn parked_hints(docker: &bollard::Docker, w: &str) -> stevedore_init::warm::Warm {
    let mut running = Vec::new();
    for id in labelled(docker, w).await.0 {
        let Ok(c) = docker.inspect_container(&id, None).await else { continue };
        if c.state.and_then(|s| s.running) == Some(true) {
            running.push(c.config.unwrap_or_default());
        }
    }
    assert_eq!(running.len(), 1, "one parked container: {running:?}");
    let c = running.remove(0);
    let args = c.cmd.unwrap_or_default();
    assert!(!args.iter().any(|a| a.contains("true") || a.contains("busybox")), "not in /proc/1/cmdline: {args:?}");
    let env = c.env.unwrap_or_default();
    let hints = env.iter().find_map(|e| e.strip_prefix("STEVEDORE_WARM=")).expect("always set for PID 1");
    if hints.is_empty() { Default::default() } else { stevedore_init::warm::Warm::parse(hints).unwrap() }
}

/// What the pool's last attempts ran is read ahead by the next fills' inits
/// (`init/src/warm.rs`) as the sandbox's user, never as root; the record says what was read;
/// the claim still finds the init alone (the reader is gone).
#[tokio::test]
async fn a_fill_reads_ahead_what_the_last_attempts_ran_as_the_sandbox_user() {
    let Some((docker, image)) = setup().await else { return };
    let w = worker("pool-read-ahead");
    let rung = pooled(&w, &image, 1).await;
    let first = parked_hints(&docker, &w).await;
    assert!(first.is_empty(), "nothing was run yet: {first:?}");
    let t = tempfile::tempdir().unwrap();
    let req = |dir: &str, argv: &[&str]| {
        stevedore::Request::command("job", argv.iter().copied(), t.path().join(dir)).worker(&w).image(&image)
    };
    let ok =
        |o: &stevedore::Outcome| assert_eq!((o.status, o.evidence.warm), (Status::Ok, Some(true)), "{}", o.to_json());
    let o = run(&rung, &req("a", &["true"])).await;
    ok(&o);
    assert!(!o.evidence.notes.iter().any(|n| n.starts_with("read ahead")), "{:?}", o.evidence.notes);
    // Each claim's refill is made while its attempt runs: the one B's claim makes knows A's.
    assert!(rung.warm_up(Duration::from_secs(60)).await, "the pool refills");
    ok(&run(&rung, &req("b", &["sh", "-c", "true"])).await);
    assert!(rung.warm_up(Duration::from_secs(60)).await, "the pool refills");
    let hints = parked_hints(&docker, &w).await;
    // busybox's `true` is a link to /bin/busybox: the file, not the link, is read.
    assert_eq!(hints.names, ["true"], "{hints:?}");
    assert_eq!(hints.files, ["/bin/busybox"], "{hints:?}");
    assert_eq!(hints.as_user, Some((65532, 65532)), "{hints:?}");
    let o = run(&rung, &req("c", &["true"])).await;
    ok(&o);
    let note = o.evidence.notes.iter().find(|n| n.starts_with("read ahead")).expect("a read-ahead note");
    // As the sandbox's user, never root; whole, or cut by this claim (which never waits for
    // it: the container counts as parked once it started, and the claim may come at once).
    assert!(note.contains("as uid 65532"), "{note}");
    let bytes: u64 = note
        .split_once("read 1 file(s), ")
        .and_then(|(_, rest)| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let busybox = std::fs::metadata("/bin/busybox").map_or(1 << 20, |m| m.len().min(1 << 20));
    assert!(
        bytes >= busybox || note.contains("cut short by its bound or the claim"),
        "busybox read whole or cut: {note}"
    );
    assert!(rung.warm_up(Duration::from_secs(60)).await, "the pool refills");
    let mut hints = parked_hints(&docker, &w).await;
    // The fill starts as C's claim is made, and may read its hints after C's record came.
    hints.names.sort();
    assert_eq!(hints.names, ["sh", "true"], "{hints:?}");
    assert_eq!(hints.files, ["/bin/busybox"], "one file for both names: {hints:?}");
    rung.close().await;
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]), "close drains the pool and leaves nothing");
}
