//! Usage and OOM as the kernel counted them (docs/outcome.md, "Usage sources" and "Reasons"), on the real engine.
//!
//! These tests measure CPU, memory and time, so they run one at a time (a lock) and compare
//! with what the kernel or the process itself counted, never with nominal durations. Each
//! prints the figures it compared (`cargo test --test usage -- --nocapture`).

use crate::support;

use stevedore::Executor as _;
use support::{run, stdout_of};

use std::path::Path;
use stevedore::container::ContainerConfig;
use stevedore::contract::limits::key;
use stevedore::{Request, ResourceLimits, Status};
use tokio::sync::{Mutex, MutexGuard};

const MIB: u64 = 1 << 20;

/// One measuring test at a time: two cores are easily disturbed.
async fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::const_new(());
    LOCK.lock().await
}

fn sh(image: &str, worker: &str, out: &Path, script: &str, limits: ResourceLimits) -> Request {
    support::sh(image, worker, out, script).limits(limits)
}

fn memory(mib: u64) -> ResourceLimits {
    ResourceLimits::new().with(key::MEMORY, mib * MIB)
}

/// `times` of the shell: "user system" of the shell, then of its children, as `0m1.23s`.
fn parse_times(text: &str) -> u64 {
    let ms = |s: &str| {
        let (m, rest) = s.split_once('m').unwrap();
        let secs: f64 = rest.trim_end_matches('s').parse().unwrap();
        m.parse::<u64>().unwrap() * 60_000 + (secs * 1000.0).round() as u64
    };
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("m") && l.ends_with('s')).collect();
    assert!(lines.len() >= 2, "no `times` output in {text:?}");
    lines[lines.len() - 2..].iter().flat_map(|l| l.split_whitespace()).map(ms).sum()
}

/// A fixed amount of pure CPU work (no syscalls in the loop: about 3 s of one core here),
/// then the shell's own CPU times. Throughput is work per wall second.
const BUSY: &str = "i=0; while [ $i -lt 1000000 ]; do i=$((i+1)); done; times";
/// The same work, shorter (about 1 s of one core here), then what the kernel counted of the
/// container's own throttling (`nr_throttled` of its cgroup's `cpu.stat`, v1 or v2).
const BUSY_THROTTLED: &str = "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; \
    for f in /sys/fs/cgroup/cpu.stat /sys/fs/cgroup/cpu/cpu.stat /sys/fs/cgroup/cpu,cpuacct/cpu.stat; do \
    [ -r $f ] && grep -m1 '^nr_throttled' $f && break; done";
/// Two busy loops at once, eight rounds (about 1.4 s of CPU, so about 3 s at half a core:
/// long enough that one period's burst hardly counts), and on until the kernel says it
/// throttled the cgroup (at most 400 rounds): a busy host can keep a container under its
/// quota for a while, so the work waits for the kernel's count instead of guessing how much
/// is enough. Then the count and the quota the kernel holds (`cpu.max`, or v1's
/// `cpu.cfs_quota_us` and `cpu.cfs_period_us`).
const BUSY_UNTIL_THROTTLED: &str = "for d in /sys/fs/cgroup /sys/fs/cgroup/cpu /sys/fs/cgroup/cpu,cpuacct; do \
    [ -r $d/cpu.stat ] && break; done; \
    busy() { i=0; while [ $i -lt 40000 ]; do i=$((i+1)); done; }; \
    n=0; while [ $n -lt 400 ] && { [ $n -lt 8 ] || ! grep -q '^nr_throttled [1-9]' $d/cpu.stat; }; do \
    busy & busy; wait; n=$((n+1)); done; \
    grep -m1 '^nr_throttled' $d/cpu.stat; \
    if [ -r $d/cpu.max ]; then echo \"quota $(cat $d/cpu.max)\"; \
    else echo \"quota $(cat $d/cpu.cfs_quota_us) $(cat $d/cpu.cfs_period_us)\"; fi";

/// `nr_throttled N` from the command's stdout.
fn throttled(o: &stevedore::Outcome) -> u64 {
    let out = stdout_of(o);
    let line = out.lines().find(|l| l.starts_with("nr_throttled")).unwrap_or_else(|| panic!("no cpu.stat: {out}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn oom_is_what_the_kernel_counted() {
    let Some((docker, image, rung)) = support::setup_with_rung().await else { return };
    let _serial = serial().await;
    let w = support::worker("oom");
    let t = tempfile::tempdir().unwrap();
    // One 256 MiB buffer, touched as dd reads into it. (A buffer that grows a page at a time,
    // like `head -c 256m /dev/zero | tail`, can make a cgroup v1 kernel reclaim for a minute
    // before it kills.)
    let hog = "dd if=/dev/zero of=/dev/null bs=256M count=1 2>/dev/null";

    let o = run(&rung, &sh(&image, &w, &t.path().join("a"), hog, memory(64))).await;
    eprintln!("64 MiB limit, 256 MiB allocation: {} oom_kills={:?}", o.status, o.evidence.oom_kills);
    assert_eq!(o.status, Status::OomKilled, "{}", o.to_json());
    assert_eq!(o.reason.map(|r| r.as_str()), Some("oom"));
    assert!(o.evidence.oom_kills >= Some(1));
    assert!(o.outputs.is_empty());

    let o =
        run(&rung, &sh(&image, &w, &t.path().join("b"), &format!("{hog}; echo survived; exit 1"), memory(64))).await;
    assert_eq!(o.status, Status::OomKilled, "a child OOM-killed, the shell then fails: {}", o.to_json());
    assert_eq!(o.exit_code, Some(1));

    let o = run(&rung, &sh(&image, &w, &t.path().join("c"), &format!("{hog}; exit 0"), memory(64))).await;
    assert_eq!(o.status, Status::Ok, "a child OOM-killed, the shell then succeeds: {}", o.to_json());
    assert!(o.evidence.oom_kills >= Some(1), "the kill is in the evidence: {}", o.to_json());
    eprintln!("child OOM then exit 0: {} oom_kills={:?}", o.status, o.evidence.oom_kills);

    // The same allocation with room to spare is no OOM.
    let o = run(&rung, &sh(&image, &w, &t.path().join("d"), hog, memory(512))).await;
    assert_eq!((o.status, o.evidence.oom_kills), (Status::Ok, Some(0)), "{}", o.to_json());

    // Exit 137 by itself and a SIGKILL from someone else are not OOM.
    let o = run(&rung, &sh(&image, &w, &t.path().join("e"), "exit 137", memory(64))).await;
    assert_eq!((o.status, o.exit_code, o.signal), (Status::HandlerError, Some(137), None), "{}", o.to_json());
    let o = run(&rung, &sh(&image, &w, &t.path().join("f"), "kill -9 $$", memory(64))).await;
    assert_eq!((o.status, o.exit_code, o.signal), (Status::Killed, None, Some(9)), "{}", o.to_json());
    assert_eq!(o.evidence.oom_kills, Some(0));
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

/// Memory that grows at a stated rate until the kernel kills: the timeline climbs with it,
/// ends at the cgroup's recorded peak (marked as the peak, at the limit) and marks the OOM
/// kill; it stays within its 16 KB whatever the length.
#[tokio::test]
async fn the_timeline_climbs_to_the_oom_kill_and_ends_at_the_kernels_peak() {
    let Some((docker, image, rung)) = support::setup_with_rung().await else { return };
    let _serial = serial().await;
    let w = support::worker("timeline");
    let t = tempfile::tempdir().unwrap();
    // `tail` holds the one endless line it reads: 2 MiB more every 100 ms (the first sample
    // period) against a 128 MiB limit, 1.6 % of the limit per period. Once `tail` is killed
    // the writer's `head` gets SIGPIPE, which ends the loop.
    let grow = "while head -c 2097152 /dev/zero; do sleep 0.1; done | tail";
    let limit = 128 * MIB;
    let o = run(&rung, &sh(&image, &w, &t.path().join("a"), grow, memory(128))).await;
    assert_eq!(o.status, Status::OomKilled, "{}", o.to_json());
    assert_eq!(o.usage.sources.timeline.as_ref().map(ToString::to_string).as_deref(), Some("sampled"));
    let line = o.usage.timeline.as_ref().expect("a timeline");
    let json = serde_json::to_vec(line).unwrap();
    let n = line.t_ms.len();
    eprintln!(
        "timeline: {n} samples, period {}..{} ms, {} bytes of JSON, oom at {:?} ms, peak {:?}, last samples {:?} MiB",
        line.first_period_ms,
        line.period_ms,
        json.len(),
        line.oom_kill_ms,
        line.peak,
        line.memory_bytes.iter().rev().take(4).map(|b| b / MIB).collect::<Vec<_>>()
    );
    assert!(json.len() <= 16 << 10, "{} bytes", json.len());
    assert_eq!(line.first_period_ms, 100);
    assert!(n >= 10, "at 10 Hz over seconds of growth: {n} samples");
    assert!(line.t_ms.windows(2).all(|w| w[0] <= w[1]), "{:?}", line.t_ms);
    assert_eq!((line.memory_bytes.len(), line.cpu_ms.len(), line.pids.len()), (n, n, n), "{:?}", line.missing);
    assert!(line.cpu_ms.windows(2).all(|w| w[0] <= w[1]), "{:?}", line.cpu_ms);
    assert_eq!(line.memory_limit_bytes, Some(limit));
    let peak = line.peak.clone().expect("the cgroup's peak ends the timeline");
    assert_eq!(Some(peak.memory_bytes), o.usage.peak_memory_bytes, "the peak is usage's");
    assert!(peak.memory_bytes.abs_diff(limit) <= limit / 20, "peak {} not within 5 % of {limit}", peak.memory_bytes);
    assert_eq!(peak.t_ms, line.t_ms[n - 1]);
    let oom = line.oom_kill_ms.expect("the OOM kill is marked");
    assert!(oom <= peak.t_ms);
    // The samples saw the climb: the highest is within the last few periods' growth of the limit.
    let highest = line.memory_bytes.iter().copied().max().unwrap();
    assert!(highest >= limit * 3 / 4, "highest sample {highest} of {limit}");
    assert!(line.memory_bytes[0] < limit / 4, "the first sample {} is before the growth", line.memory_bytes[0]);
    // Its page, as a browser draws it: the climb, the limit, the peak and the kill.
    let outcome = t.path().join("o.json");
    std::fs::write(&outcome, o.to_json()).unwrap();
    crate::page::shows_the_climb_the_peak_and_the_kill(t.path(), &outcome, None);
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn peak_memory_is_the_containers_high_water_mark() {
    let Some((docker, image, rung)) = support::setup_with_rung().await else { return };
    let _serial = serial().await;
    let w = support::worker("peak");
    let t = tempfile::tempdir().unwrap();

    let o = run(&rung, &sh(&image, &w, &t.path().join("a"), "head -c 200m /dev/zero | tail", memory(512))).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let peak = o.usage.peak_memory_bytes.expect("peak measured");
    eprintln!("one 200 MiB allocation: peak {:.1} MiB", peak as f64 / MIB as f64);
    assert!((200 * MIB..=264 * MIB).contains(&peak), "peak {peak} not within [200, 264] MiB");
    assert_eq!(o.usage.sources.peak_memory_bytes.as_ref().unwrap().to_string(), "cgroup", "{:?}", o.usage.sources);

    // Two processes hold 120 MiB each at the same moment: each signals that it holds its
    // allocation, then waits for the other before releasing it.
    let two = "hold() { { head -c 120m /dev/zero; touch /tmp/$1; until [ -e /tmp/a ] && [ -e /tmp/b ]; do sleep 0.05; done; } | tail; }; \
               hold a & hold b & wait";
    let o = run(&rung, &sh(&image, &w, &t.path().join("b"), two, memory(512))).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let peak = o.usage.peak_memory_bytes.expect("peak measured");
    eprintln!("two concurrent 120 MiB allocations: peak {:.1} MiB", peak as f64 / MIB as f64);
    assert!(peak >= 240 * MIB, "peak {peak} < 240 MiB: not the container's high-water mark");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn peak_memory_of_a_handler_in_the_worker_image() {
    let Some(docker) = support::engine().await else { return };
    let _serial = serial().await;
    let image = support::worker_image().await;
    let rung = support::rung_with(ContainerConfig::default().worker_image(image)).await;
    let w = support::worker("peak-handler");
    let t = tempfile::tempdir().unwrap();
    let r = Request::handler("job", "alloc", t.path().join("o"))
        .worker(w.as_str())
        .payload((200 * MIB).to_string())
        .limits(memory(512));
    let o = run(&rung, &r).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let peak = o.usage.peak_memory_bytes.expect("peak measured");
    eprintln!("alloc handler, 200 MiB: peak {:.1} MiB", peak as f64 / MIB as f64);
    assert!((200 * MIB..=264 * MIB).contains(&peak), "peak {peak} not within [200, 264] MiB");
    assert!(o.usage.cpu_time_ms.is_some() && o.usage.wall_time_ms.is_some());
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn cpu_time_is_what_the_kernel_counted_and_half_a_core_is_throttled() {
    let Some((docker, image, rung)) = support::setup_with_rung().await else { return };
    let _serial = serial().await;
    let w = support::worker("cpu");
    let t = tempfile::tempdir().unwrap();

    let o = run(&rung, &sh(&image, &w, &t.path().join("a"), BUSY, ResourceLimits::new())).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let own = parse_times(&stdout_of(&o));
    let cpu = o.usage.cpu_time_ms.expect("cpu measured");
    let wall = o.usage.wall_time_ms.expect("wall measured");
    eprintln!("busy loop: stevedore cpu {cpu} ms, the shell's own `times` {own} ms, wall {wall} ms");
    assert!(own >= 500, "the loop hardly ran: {own} ms");
    let ratio = cpu as f64 / own as f64;
    assert!((0.8..=1.2).contains(&ratio), "cpu {cpu} ms vs the process's own {own} ms");
    assert_eq!(o.usage.sources.cpu_time_ms.as_ref().unwrap().to_string(), "cgroup", "{:?}", o.usage.sources);

    // Half a core: what the kernel counted for the attempt's own cgroup, never a
    // throughput a neighbour on this machine can change. The limit holds (CPU per wall time
    // never above half a core, however busy the host), and it bit: the kernel throttled the
    // container, and did not throttle the same work without a limit.
    let full = run(&rung, &sh(&image, &w, &t.path().join("f"), BUSY_THROTTLED, ResourceLimits::new())).await;
    let half = ResourceLimits::new().with(key::CPU, 500);
    let o = run(&rung, &sh(&image, &w, &t.path().join("h"), BUSY_UNTIL_THROTTLED, half)).await;
    assert_eq!((full.status, o.status), (Status::Ok, Status::Ok), "{}", o.to_json());
    let (cpu, wall) = (o.usage.cpu_time_ms.unwrap(), o.usage.wall_time_ms.unwrap());
    let share = cpu as f64 / wall as f64;
    eprintln!("--cpus 0.5: cpu {cpu} ms / wall {wall} ms = {share:.2}; throttled {} periods", throttled(&o));
    let quota = stdout_of(&o).lines().find_map(|l| l.strip_prefix("quota ").map(str::to_owned));
    let quota: Vec<u64> = quota.as_deref().unwrap_or("").split_whitespace().filter_map(|n| n.parse().ok()).collect();
    assert!(matches!(quota[..], [q, p] if q * 2 == p), "the kernel does not hold half a core: {}", stdout_of(&o));
    assert!(share <= 0.6, "cpu/wall {share:.2} with half a core");
    assert!(throttled(&o) > 0, "the kernel never throttled the half core: {}", stdout_of(&o));
    assert_eq!(throttled(&full), 0, "no quota, no throttling: {}", stdout_of(&full));
    assert!(o.evidence.enforcement.contains_key("cpu"), "{:?}", o.evidence.enforcement);

    let o = run(&rung, &sh(&image, &w, &t.path().join("c"), "sleep 2", ResourceLimits::new())).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(o.usage.sources.cpu_time_ms.as_ref().unwrap().to_string(), "cgroup", "{:?}", o.usage.sources);
    let cpu = o.usage.cpu_time_ms.unwrap();
    eprintln!("sleep 2: cpu {cpu} ms, wall {:?} ms", o.usage.wall_time_ms);
    assert!(cpu < 300, "sleeping used {cpu} ms of CPU");
    assert!(o.usage.wall_time_ms.unwrap() >= 2000);
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn disk_written_is_what_was_left_in_out() {
    let Some((docker, image, rung)) = support::setup_with_rung().await else { return };
    let _serial = serial().await;
    let w = support::worker("disk");
    let t = tempfile::tempdir().unwrap();
    let script =
        "head -c 30m /dev/urandom > /out/a; head -c 1m /dev/zero > /tmp/scratch; mkdir /out/d; echo hi > /out/d/b";
    let o = run(&rung, &sh(&image, &w, &t.path().join("o"), script, ResourceLimits::new())).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let disk = o.usage.disk_written_bytes.expect("disk measured");
    let on_disk: u64 = o.outputs.iter().map(|f| f.size).sum();
    eprintln!("30 MiB + 3 bytes into /out: disk_written {disk} bytes, files {on_disk} bytes");
    assert!((30 * MIB..=34 * MIB).contains(&disk), "disk written {disk} not within [30, 34] MiB");
    assert_eq!(on_disk, 30 * MIB + 3);
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn gigabytes_of_output_are_capped_and_counted_with_flat_memory() {
    let Some((docker, image, rung)) = support::setup_with_rung().await else { return };
    let _serial = serial().await;
    let w = support::worker("logs");
    let t = tempfile::tempdir().unwrap();
    let rss = || {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let kib = |k: &str| -> u64 {
            let line = status.lines().find(|l| l.starts_with(k)).unwrap();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        (kib("VmRSS:") * 1024, kib("VmHWM:") * 1024)
    };
    // Reset the high-water mark so the peak below is this test's own.
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let (start, _) = rss();
    let total: u64 = 300_000_000;
    let r = sh(
        &image,
        &w,
        &t.path().join("o"),
        &format!("head -c {total} /dev/zero; head -c 1000 /dev/zero >&2"),
        ResourceLimits::new(),
    );
    let o = run(&rung, &r).await;
    let (_, peak) = rss();
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let out = &o.evidence.logs.stdout;
    assert_eq!((out.bytes, out.truncated), (total, true));
    let kept = std::fs::metadata(out.path.as_ref().unwrap()).unwrap().len();
    assert_eq!(kept, 4 * MIB, "the capture file holds exactly the cap");
    assert_eq!((o.evidence.logs.stderr.bytes, o.evidence.logs.stderr.truncated), (1000, false));
    eprintln!("300 MB of stdout: host RSS {start} → peak {peak} bytes (+{} KiB)", (peak - start.min(peak)) / 1024);
    assert!(peak < start + 32 * MIB, "host memory grew with the output: {start} → {peak}");
    assert_eq!(o.evidence.enforcement.get("log_driver").map(|s| s.starts_with("none")), Some(true));
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}
