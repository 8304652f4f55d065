//! A soak of the container rung: many attempts with mixed outcomes, 4 in flight; nothing may
//! be left in the engine and the process's memory must not grow.
//!
//! Short by default (40 attempts, for `cargo test` and `.ci/run`); `STEVEDORE_SOAK=full` runs
//! 300. Alone in its test binary, so that the RSS it reads is its own.

#[path = "../suite/support/mod.rs"]
mod support;

use futures_util::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stevedore::LiveOutput;
use stevedore::container::ContainerConfig;
use stevedore::contract::limits::key;
use stevedore::{Executor, Request, ResourceLimits, Status};
use tokio_util::sync::CancellationToken;

const IN_FLIGHT: usize = 4;
/// RSS is read once this many attempts have finished, and again at the end.
const WARM_UP: usize = 20;
const MAX_GROWTH_KIB: u64 = 20 * 1024;
/// Printed by the command of a "cancel" attempt; the live-output reader cancels it.
const CANCEL_ME: &str = "cancel-me:";

/// The process's resident set, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS in /proc/self/status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Ok,
    HandlerError,
    Timeout,
    Cancel,
    Oom,
    LaunchFailed,
}

const KINDS: [Kind; 6] = [Kind::Ok, Kind::HandlerError, Kind::Timeout, Kind::Cancel, Kind::Oom, Kind::LaunchFailed];

impl Kind {
    fn expected(self) -> (Status, Option<&'static str>) {
        match self {
            Kind::Ok => (Status::Ok, None),
            Kind::HandlerError => (Status::HandlerError, None),
            Kind::Timeout => (Status::Timeout, Some("deadline")),
            Kind::Cancel => (Status::Killed, Some("cancelled")),
            Kind::Oom => (Status::OomKilled, Some("oom")),
            Kind::LaunchFailed => (Status::LaunchFailed, Some("command_not_found")),
        }
    }

    /// The request, built when the attempt starts (a deadline runs from then).
    fn request(self, image: &str, worker: &str, job: &str, out: std::path::PathBuf) -> Request {
        let script = match self {
            Kind::Ok => "echo hello > /out/hello.txt".to_owned(),
            Kind::HandlerError => "echo failing >&2; exit 3".to_owned(),
            Kind::Timeout | Kind::Cancel => format!("echo {CANCEL_ME}$STEVEDORE_JOB_ID; sleep 30"),
            // One read into a 256 MiB buffer: a streaming hog (`head -c 256m /dev/zero | tail`)
            // makes cgroup v1 reclaim and refault file pages for up to ~100 s before the OOM
            // killer acts, which would make the soak measure the kernel, not stevedore.
            Kind::Oom => "dd if=/dev/zero of=/dev/null bs=256M count=1".to_owned(),
            Kind::LaunchFailed => String::new(),
        };
        let mut r = if self == Kind::LaunchFailed {
            Request::command(job, ["/no/such/program"], out)
        } else {
            Request::command(job, ["sh", "-c", script.as_str()], out)
        };
        r = r.worker(worker);
        r.policy.image = image.to_owned();
        r.policy = r.policy.clone().with_grace(Duration::from_secs(1));
        match self {
            Kind::Timeout => r.timeout(Duration::from_secs(2)),
            Kind::Oom => {
                r.limits = ResourceLimits::new().with(key::MEMORY, 64 << 20);
                r
            }
            _ => r,
        }
    }
}

#[tokio::test]
async fn soak_mixed_outcomes_leave_nothing_and_memory_stays_flat() {
    let Some((docker, image)) = support::setup().await else { return };
    let full = std::env::var("STEVEDORE_SOAK").is_ok_and(|v| v == "full");
    let attempts: usize = if full { 300 } else { 40 };
    let w = support::worker("soak");
    let t = tempfile::tempdir().unwrap();

    // Cancel attempts are cancelled once their command runs, which it says on stdout.
    let tokens: Arc<Mutex<HashMap<String, CancellationToken>>> = Arc::default();
    let (live, mut chunks) = LiveOutput::channel(1024);
    let canceller = {
        let tokens = tokens.clone();
        tokio::spawn(async move {
            while let Some(c) = chunks.recv().await {
                if c.stream != stevedore::Stream::Stdout {
                    continue;
                }
                for line in String::from_utf8_lossy(&c.bytes).lines() {
                    if let Some(job) = line.strip_prefix(CANCEL_ME)
                        && let Some(token) = tokens.lock().unwrap().get(job)
                    {
                        token.cancel();
                    }
                }
            }
        })
    };
    let cfg = ContainerConfig::default().max_in_flight(IN_FLIGHT, true).log_dir(t.path().join("logs"));
    let rung = support::rung_with(cfg).await;

    std::fs::create_dir(t.path().join("out")).unwrap();
    let started = Instant::now();
    let mut rss_after_warm_up = None;
    let mut finished = 0usize;
    let mut tally: BTreeMap<(Kind, String), usize> = BTreeMap::new();
    let mut wrong = Vec::new();
    let mut runs = futures_util::stream::iter(0..attempts)
        .map(|i| {
            let kind = KINDS[i % KINDS.len()];
            let job = format!("soak-{i}");
            let cancel = CancellationToken::new();
            if kind == Kind::Cancel {
                tokens.lock().unwrap().insert(job.clone(), cancel.clone());
            }
            let req = kind.request(&image, &w, &job, t.path().join("out").join(&job)).live_output(live.clone());
            let rung = &rung;
            async move {
                let t0 = Instant::now();
                let r = rung.run(&req, cancel).await;
                (kind, job, r, t0.elapsed())
            }
        })
        .buffer_unordered(IN_FLIGHT);
    let mut took: BTreeMap<Kind, Duration> = BTreeMap::new();
    while let Some((kind, job, result, wall)) = runs.next().await {
        *took.entry(kind).or_default() += wall;
        tokens.lock().unwrap().remove(&job);
        // The outputs are not the subject here; dropping them keeps the disk flat.
        let _ = std::fs::remove_dir_all(t.path().join("out").join(&job));
        let got = match &result {
            Ok(o) => (o.status, o.reason.map(|r| r.as_str().to_owned())),
            Err(e) => panic!("{job} ({kind:?}) did not launch: {e}"),
        };
        let want = kind.expected();
        if (got.0, got.1.as_deref()) != want {
            wrong.push(format!("{job} {kind:?}: {}", result.unwrap().to_json()));
        }
        *tally
            .entry((kind, format!("{}{}", got.0, got.1.map(|r| format!("/{r}")).unwrap_or_default())))
            .or_default() += 1;
        finished += 1;
        if finished == WARM_UP {
            rss_after_warm_up = Some(rss_kib());
        }
    }
    drop(runs);
    drop(live);
    rung.close().await;
    canceller.await.unwrap();
    let elapsed = started.elapsed();
    let rss_end = rss_kib();
    let rss_start = rss_after_warm_up.expect("more attempts than the warm-up");
    let (containers, volumes) = support::labelled(&docker, &w).await;
    eprintln!(
        "soak ({}): attempts {attempts}, {IN_FLIGHT} in flight, elapsed {elapsed:.1?}; leaks: {} containers, {} \
         volumes; RSS after {WARM_UP} attempts {} KiB, at the end {} KiB (growth {} KiB); outcomes {:?}; \
         wall time per kind {:?}",
        if full { "full" } else { "short" },
        containers.len(),
        volumes.len(),
        rss_start,
        rss_end,
        rss_end as i64 - rss_start as i64,
        tally,
        took
    );
    assert!(wrong.is_empty(), "unexpected outcomes:\n{}", wrong.join("\n"));
    assert_eq!((containers, volumes), (vec![], vec![]), "nothing labelled with the worker is left");
    assert!(rss_end <= rss_start + MAX_GROWTH_KIB, "RSS grew from {rss_start} KiB to {rss_end} KiB");
}
