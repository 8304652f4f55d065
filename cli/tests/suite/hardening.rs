//! Hardening defaults and limits of the container rung (the enforcement items of docs/outcome.md), each checked from
//! inside a real container, and the log and disk caps.

use crate::support;

use stevedore::Executor as _;
use support::{BIN, run, sh, stdout_of};

use bollard::query_parameters::ListVolumesOptions;
use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use stevedore::contract::limits::key;
use stevedore::{Outcome, ResourceLimits, Status};

const MIB: u64 = 1 << 20;

/// `KEY=value` lines the script printed.
fn facts(o: &Outcome) -> std::collections::BTreeMap<String, String> {
    stdout_of(o).lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

#[tokio::test]
async fn the_sandbox_is_read_only_offline_unprivileged_and_limited() {
    let Some((docker, image, rung)) = support::setup_with_rung().await else { return };
    let w = support::worker("hardening");
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    std::fs::create_dir(&input).unwrap();
    std::fs::write(input.join("f"), "x").unwrap();
    let script = r#"
        touch /x 2>/dev/null; echo rootfs=$?
        touch /in/new 2>/dev/null; echo in_create=$?
        echo y 2>/dev/null > /in/f; echo in_write=$?
        touch /tmp/ok; echo tmp=$?
        echo uid=$(id -u) gid=$(id -g)
        echo ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ,)
        wget -q -T 2 -O /dev/null http://192.0.2.1/ 2>/dev/null; echo wget=$?
        grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status | tr -d '\t' | sed 's/:/=/'
        echo nofile=$(ulimit -n)
        m=/sys/fs/cgroup/memory
        if [ -e $m/memory.limit_in_bytes ]; then
            echo memory=$(cat $m/memory.limit_in_bytes) memsw=$(cat $m/memory.memsw.limit_in_bytes 2>/dev/null)
            echo pids=$(cat /sys/fs/cgroup/pids/pids.max)
        else
            echo memory=$(cat /sys/fs/cgroup/memory.max) memsw=$(cat /sys/fs/cgroup/memory.swap.max)
            echo pids=$(cat /sys/fs/cgroup/pids.max)
        fi
        echo tmpsize=$(df -k /tmp | tail -n 1 | awk '{print $2}')
    "#;
    let limits = ResourceLimits::new().with(key::MEMORY, 96 * MIB).with(key::PIDS, 77);
    let r = sh(&image, &w, &t.path().join("o"), script).input_dir(&input).limits(limits);
    let o = run(&rung, &r).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let f = facts(&o);
    let lines = stdout_of(&o);
    let get = |k: &str| f.get(k).map(String::as_str).unwrap_or_else(|| panic!("{k} missing in {lines}"));
    assert_ne!(get("rootfs"), "0", "the root filesystem is read-only");
    assert_ne!(get("in_create"), "0", "/in is read-only");
    assert_ne!(get("in_write"), "0", "/in is read-only");
    assert_eq!(get("tmp"), "0", "/tmp is writable");
    assert_eq!(get("uid"), "65532 gid=65532", "non-root");
    assert_eq!(get("ifaces"), "lo,", "no network but loopback");
    assert_ne!(get("wget"), "0", "nothing is reachable");
    for cap in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(get(cap), "0000000000000000", "{cap}: all capabilities dropped");
    }
    assert_eq!(get("NoNewPrivs"), "1");
    // Mode 2 is a seccomp filter; the evidence says the engine's profile applies only when it does.
    assert_eq!(get("Seccomp") == "2", o.evidence.enforcement.contains_key("seccomp"), "{:?}", o.evidence);
    assert_eq!(get("nofile"), "4096");
    // The cgroup holds the attempt's 96 MiB and the init's delivery reserve.
    let limit = 96 * MIB + stevedore::LinkConfig::default().delivery_reserve;
    assert!(get("memory").starts_with(&format!("{limit} ")), "memory limit applied: {}", get("memory"));
    assert!(lines.contains(&format!("memsw={limit}")) || lines.contains("memsw=0"), "swap off: {lines}");
    assert_eq!(get("pids"), "77");
    let tmp_kib: u64 = get("tmpsize").parse().unwrap();
    assert!(tmp_kib * 1024 <= 96 * MIB, "/tmp ({tmp_kib} KiB) is no larger than the memory limit");
    let items = ["read_only_rootfs", "network", "capabilities", "no_new_privileges", "non_root", "pids", "memory"];
    for item in items.into_iter().chain(["tmp", "nofile", "init", "log_driver", "host_mounts", "disk"]) {
        assert!(o.evidence.enforcement.contains_key(item), "{item} not in the evidence: {:?}", o.evidence.enforcement);
    }
    assert_eq!(std::fs::read_to_string(input.join("f")).unwrap(), "x");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn a_fork_bomb_is_contained_by_the_pids_limit() {
    let Some((docker, image, rung)) = support::setup_with_rung().await else { return };
    let w = support::worker("forkbomb");
    let t = tempfile::tempdir().unwrap();
    // Every bomb process forks copies of itself for as long as it can; the main shell uses
    // builtins only (it could not fork either) and reads the kernel's count of refused forks.
    let script = r#"
        b() { while [ ! -e /tmp/stop ]; do b & done; }
        b 2>/dev/null &
        read up _ < /proc/uptime; end=$(( ${up%.*} + 3 ))
        while read up _ < /proc/uptime; [ ${up%.*} -lt $end ]; do :; done
        : > /tmp/stop
        p=/sys/fs/cgroup/pids; [ -e $p/pids.events ] || p=/sys/fs/cgroup
        read ev < $p/pids.events; echo "events=$ev"
        exit 0
    "#;
    let r = sh(&image, &w, &t.path().join("o"), script)
        .limits(ResourceLimits::new().with(key::PIDS, 64).with(key::CPU, 1000))
        .timeout(std::time::Duration::from_secs(60));
    let o = run(&rung, &r).await;
    assert_eq!(o.status, Status::Ok, "the shell survived and reported: {}", o.to_json());
    let events = facts(&o)["events"].clone();
    eprintln!("fork bomb under pids=64: pids.events {events:?}, stragglers killed: {}", o.evidence.stragglers_killed);
    let refused: u64 = events.strip_prefix("max ").and_then(|n| n.parse().ok()).expect("pids.events: max N");
    assert!(refused > 0, "the bomb never reached the limit: {events}");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn environment_layers_and_the_hosts_environment() {
    let Some((docker, image)) = support::setup().await else { return };
    let w = support::worker("env");
    let t = tempfile::tempdir().unwrap();
    // Through the command, so the host variable is in the real process environment of stevedore.
    let out = Command::new(BIN)
        .env("STEVEDORE_TEST_HOST_ONLY", "leaked")
        .args(["run", "--outcome", "-", "--quiet", "--worker", &w, "--image", &image, "--output"])
        .arg(t.path().join("o"))
        .args(["-e", "FROM_REQUEST=yes", "-e", "STEVEDORE_ATTEMPT=99", "--attempt", "3"])
        .args(["--", "sh", "-c", "env > /out/env"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "ok", "{v}");
    let env = std::fs::read_to_string(t.path().join("o/env")).unwrap();
    assert!(!env.contains("STEVEDORE_TEST_HOST_ONLY"), "the host's environment leaked in: {env}");
    assert!(env.lines().any(|l| l == "FROM_REQUEST=yes"), "{env}");
    assert!(env.lines().any(|l| l == "STEVEDORE_ATTEMPT=3"), "protocol variables cannot be overridden: {env}");
    assert!(!env.contains("=99"), "{env}");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn the_disk_limit_stops_writes_at_the_limit() {
    let Some((docker, image, rung)) = support::setup_with_rung().await else { return };
    let w = support::worker("disk");
    let t = tempfile::tempdir().unwrap();
    let before = free_bytes(t.path());
    let r = sh(&image, &w, &t.path().join("o"), "head -c 300m /dev/zero > /out/big")
        .limits(ResourceLimits::new().with(key::DISK, 50 * MIB));
    let o = run(&rung, &r).await;
    assert_eq!((o.status, o.reason.map(|r| r.as_str())), (Status::HandlerError, Some("disk_limit")), "{}", o.to_json());
    let size = std::fs::metadata(t.path().join("o/big")).unwrap().len();
    eprintln!("300 MiB written with a 50 MiB limit: {size} bytes kept");
    assert!(size <= 50 * MIB + 16 * MIB, "{size} bytes kept past the limit");
    assert!(size >= 34 * MIB, "stopped far before the limit: {size}");
    assert_eq!(o.usage.disk_written_bytes, Some(size));
    assert!(free_bytes(t.path()) + 100 * MIB > before, "the host disk lost more than the outputs");

    // A command that handles ENOSPC and exits 0 succeeds, and the outcome says its outputs hit the limit.
    let r = sh(&image, &w, &t.path().join("p"), "head -c 300m /dev/zero > /out/big; exit 0")
        .limits(ResourceLimits::new().with(key::DISK, 50 * MIB));
    let o = run(&rung, &r).await;
    assert_eq!((o.status, o.reason.map(|r| r.as_str())), (Status::Ok, Some("disk_limit")), "{}", o.to_json());
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

fn free_bytes(path: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(path).unwrap();
    s.blocks_available() * s.fragment_size()
}

#[tokio::test]
async fn an_images_volumes_leave_nothing_behind() {
    let Some((docker, base, rung)) = support::setup_with_rung().await else { return };
    let tag = format!("stevedore-test/with-volume:{:08x}", rand::random::<u32>());
    let dockerfile = format!("FROM {base}\nVOLUME /data\nVOLUME /cache\nLABEL {}=true\n", support::TEST_LABEL);
    let context = support::tar_of(&[("Dockerfile", 0o644, dockerfile.as_bytes())]);
    stevedore::image::build_image_from_dir_tar(support::seam().await, &tag, context).await.expect("build");
    let volumes = || async {
        let list = docker.list_volumes(None::<ListVolumesOptions>).await.unwrap();
        list.volumes.unwrap_or_default().into_iter().map(|v| (v.name, v.labels)).collect::<Vec<_>>()
    };
    let before: HashSet<String> = volumes().await.into_iter().map(|(n, _)| n).collect();
    let w = support::worker("volume");
    let t = tempfile::tempdir().unwrap();
    let r = sh(&tag, &w, &t.path().join("o"), "echo x > /data/f 2>/dev/null; echo data=$?; echo ok > /out/ok");
    let o = run(&rung, &r).await;
    let after = volumes().await;
    support::remove_image(&docker, &tag).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_ne!(facts(&o)["data"], "0", "a declared VOLUME is not writable");
    // Volumes made meanwhile by other tests' rungs carry stevedore's labels; an anonymous one
    // would carry none.
    let unlabelled: Vec<_> = after
        .iter()
        .filter(|(n, labels)| !before.contains(n) && !labels.contains_key("dev.stevedore.managed"))
        .collect();
    assert!(unlabelled.is_empty(), "unlabelled volumes appeared: {unlabelled:?}");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}
