//! The container rung's attempt against the in-memory engine: cleanup on every path, the
//! record's checks, the host-only verdicts and engine failures, without a daemon.

use super::{ContainerConfig, ContainerExecutor};
use crate::contract::{Executor, LaunchError, Reason, Request, Source, Status};
use crate::engine::fake::{FakeApi, InitSide, Script, await_ack, read_start, send};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use stevedore_init::wire::{
    self, CgroupCounters, ChildrenRusage, FsSpace, HandlerChannel, InitRecord, Kind, OutScan, OutputEnd, StoppedBy,
    WaitStatus,
};
use tokio_util::sync::CancellationToken;

const IMAGE: &str = "fake/busybox:1";

fn record(wait: WaitStatus) -> InitRecord {
    InitRecord {
        wait,
        stopped_by: None,
        stragglers_killed: 0,
        wall_time_ms: 5,
        cgroup: CgroupCounters {
            version: Some(2),
            memory_peak_bytes: Some(3 << 20),
            memory_limit_bytes: Some(1 << 30),
            oom_kills: Some(0),
            cpu_usage_ns: Some(1_000_000),
            missing: Default::default(),
            pids_limit: None,
            cpu_limit_millis: None,
        },
        rusage: ChildrenRusage::default(),
        out_fs: Some(FsSpace { total_bytes: 512 << 20, free_bytes: 500 << 20 }),
        oom_guard: None,
        handler: None,
        stdout_bytes: 6,
        stderr_bytes: 0,
        host_lost: false,
        takeovers: 0,
        reports: Default::default(),
        measured: Vec::new(),
        timeline: None,
        reserve_bytes: 0,
        credentials: None,
        kernel: None,
        program: None,
        program_name: None,
        read_ahead: None,
    }
}

fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}

/// How the scripted init behaves.
#[derive(Clone)]
struct Behaviour {
    record: Option<InitRecord>,
    /// Seal the record with a key that is not the attempt's.
    forge: bool,
    files: Vec<(String, Vec<u8>)>,
    /// Exit code the engine reports afterwards (for host-only verdicts).
    exit: Option<(i64, bool)>,
    /// Remove the container behind stevedore's back before ending.
    vanish: bool,
    /// Send only this many bytes of the outputs tar, then say nothing more (a transport that
    /// stalls).
    stall_after: Option<usize>,
    /// The engine goes away before the record is sent (the engine's shutdown signals the
    /// command).
    lose_engine: bool,
}

fn init(b: Behaviour) -> Script {
    Arc::new(move |side: InitSide| {
        let b = b.clone();
        Box::pin(async move {
            let InitSide { mut stdin, out, name, engine } = side;
            let (start, _payload) = read_start(&mut stdin).await;
            send(&out, Kind::Stdout, b"hello\n");
            if let Some((code, oom)) = b.exit {
                engine.set_exit(&name, code, oom);
            }
            if b.vanish {
                engine.remove_externally(&name);
            }
            if b.lose_engine {
                engine.lose();
            }
            let Some(rec) = b.record else {
                // The init died: its streams end with no record.
                return;
            };
            let key = wire::parse_key(&start.key).unwrap();
            let key = if b.forge { [7u8; wire::KEY_LEN] } else { key };
            send(&out, Kind::Record, &wire::seal(&key, &serde_json::to_vec(&rec).unwrap()));
            let files: Vec<(&str, &[u8])> = b.files.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
            let tar = tar_of(&files);
            let sent = b.stall_after.map_or(tar.len(), |n| n.min(tar.len()));
            for chunk in tar[..sent].chunks(wire::MAX_CHUNK) {
                send(&out, Kind::Output, chunk);
            }
            if sent < tar.len() {
                await_ack(&mut stdin).await;
                return;
            }
            let end = OutputEnd {
                files: files.len() as u64,
                bytes: files.iter().map(|f| f.1.len() as u64).sum(),
                seen: OutScan { files: files.len() as u64, ..OutScan::default() },
                ..OutputEnd::default()
            };
            send(&out, Kind::OutputEnd, &serde_json::to_vec(&end).unwrap());
            await_ack(&mut stdin).await;
        })
    })
}

fn honest(rec: InitRecord) -> Behaviour {
    Behaviour {
        record: Some(rec),
        forge: false,
        files: vec![("result.txt".into(), b"42\n".to_vec())],
        exit: None,
        vanish: false,
        stall_after: None,
        lose_engine: false,
    }
}

struct Setup {
    fake: Arc<FakeApi>,
    rung: ContainerExecutor,
    dir: tempfile::TempDir,
}

fn setup(b: Behaviour) -> Setup {
    let fake = FakeApi::new(IMAGE);
    fake.script(init(b));
    let dir = tempfile::tempdir().unwrap();
    let cfg = ContainerConfig::default().init_from_host(false).log_dir(dir.path().join("logs"));
    let rung = ContainerExecutor::on(fake.engine(), cfg);
    Setup { fake, rung, dir }
}

fn request(s: &Setup) -> Request {
    Request::command("job-1", ["true"], s.dir.path().join("out")).worker("w1").image(IMAGE)
}

async fn run(s: &Setup, req: &Request) -> Result<crate::Outcome, LaunchError> {
    let r = s.rung.run(req, CancellationToken::new()).await;
    s.rung.close().await;
    assert!(s.fake.objects().is_empty(), "left behind: {:?}", s.fake.objects());
    r
}

#[tokio::test]
async fn a_clean_attempt_creates_one_container_and_removes_it() {
    let s = setup(honest(record(WaitStatus::Code(0))));
    let o = run(&s, &request(&s)).await.unwrap();
    assert_eq!((o.status, o.exit_code), (Status::Ok, Some(0)));
    assert_eq!(o.outputs.len(), 1);
    assert_eq!(std::fs::read(s.dir.path().join("out/result.txt")).unwrap(), b"42\n");
    assert_eq!(o.usage.sources.cpu_time_ms, Some(Source::Cgroup));
    assert_eq!(o.evidence.logs.stdout.bytes, 6);
    let calls = s.fake.calls();
    assert!(!calls.iter().any(|c| c.starts_with("inspect container")), "no inspect with a record: {calls:?}");
    assert!(!calls.iter().any(|c| c.starts_with("kill")), "no kill after the record: {calls:?}");
    let created: Vec<&String> = calls.iter().filter(|c| c.starts_with("create container sd-")).collect();
    assert_eq!(created.len(), 2, "the attempt's container, and the probe of its mounts: {created:?}");
    assert_eq!(created.iter().filter(|c| c.ends_with("-probe")).count(), 1);
}

/// An image's paths are looked at once: the second attempt of the same image makes no probe.
#[tokio::test]
async fn the_mounts_of_an_image_are_probed_once() {
    let s = setup(honest(record(WaitStatus::Code(0))));
    for out in ["o1", "o2"] {
        let req = Request::command("job-1", ["true"], s.dir.path().join(out)).worker("w1").image(IMAGE);
        assert_eq!(s.rung.run(&req, CancellationToken::new()).await.unwrap().status, Status::Ok);
    }
    s.rung.close().await;
    assert!(s.fake.objects().is_empty(), "left behind: {:?}", s.fake.objects());
    let probes = s.fake.calls().iter().filter(|c| c.starts_with("create container") && c.ends_with("-probe")).count();
    assert_eq!(probes, 1);
}

#[tokio::test]
async fn engine_failures_before_the_start_leave_nothing() {
    for op in ["create container", "attach container", "start container"] {
        let s = setup(honest(record(WaitStatus::Code(0))));
        // The tools publication creates one helper container first.
        let after = if op == "create container" { 1 } else { 0 };
        s.fake.fail(op, after, 500);
        let err = run(&s, &request(&s)).await.unwrap_err();
        assert!(matches!(err, LaunchError::Engine(_)), "{op}: {err}");
    }
}

/// The engine's shutdown sends the command SIGTERM: the Outcome says the engine went away
/// (`engine_lost`, its error in `handler_error`), never a signal from nobody; an exit code
/// the command gave before is its own answer; without a loss a signal stays `signalled`.
#[tokio::test]
async fn an_engine_that_went_away_is_named_as_the_end() {
    let s = setup(Behaviour { lose_engine: true, ..honest(record(WaitStatus::Signal(15))) });
    let o = run(&s, &request(&s)).await.unwrap();
    assert_eq!((o.status, o.reason, o.signal), (Status::Killed, Some(Reason::EngineLost), Some(15)));
    assert!(o.handler_error.contains("the engine"), "{}", o.handler_error);
    assert_eq!(o.outputs.len(), 1, "what the init sent is kept");
    assert!(!o.permanent);

    let s = setup(Behaviour { lose_engine: true, ..honest(record(WaitStatus::Code(0))) });
    let o = run(&s, &request(&s)).await.unwrap();
    assert_eq!((o.status, o.reason), (Status::Ok, None), "{}", o.handler_error);

    let s = setup(Behaviour {
        record: None,
        exit: Some((137, false)),
        lose_engine: true,
        ..honest(record(WaitStatus::Code(0)))
    });
    let o = run(&s, &request(&s)).await.unwrap();
    assert_eq!((o.status, o.reason), (Status::Killed, Some(Reason::EngineLost)), "{}", o.handler_error);

    let s = setup(honest(record(WaitStatus::Signal(15))));
    let o = run(&s, &request(&s)).await.unwrap();
    assert_eq!((o.status, o.reason), (Status::Killed, Some(Reason::Signalled)), "{}", o.handler_error);
}

/// The engine drops the attempt's first call (a restart under way): nothing exists yet, so
/// the attempt waits until the engine answers a ping and goes on, instead of failing at once.
#[tokio::test]
async fn an_attempt_that_starts_while_the_engine_is_away_waits_for_it() {
    let s = setup(honest(record(WaitStatus::Code(0))));
    s.fake.fail_times("inspect image", 0, 1, 503);
    let o = run(&s, &request(&s)).await.unwrap();
    assert_eq!(o.status, Status::Ok);
    let calls = s.fake.calls();
    let first_ping = calls.iter().position(|c| c.starts_with("ping")).expect("the engine was asked");
    assert!(calls[first_ping + 1..].iter().any(|c| c.starts_with("inspect image")), "then asked again: {calls:?}");
}

#[tokio::test]
async fn a_forged_record_is_refused_and_never_ok() {
    let s = setup(Behaviour { forge: true, ..honest(record(WaitStatus::Code(0))) });
    let o = run(&s, &request(&s)).await.unwrap();
    assert_eq!((o.status, o.reason), (Status::Killed, Some(Reason::RecordInvalid)));
    assert!(o.evidence.refused_claims.iter().any(|c| c.contains("MAC")), "{:?}", o.evidence.refused_claims);
    assert_eq!(o.usage.cpu_time_ms, None);
}

#[tokio::test]
async fn without_a_record_the_engine_is_the_only_witness() {
    let s = setup(Behaviour { record: None, exit: Some((137, false)), ..honest(record(WaitStatus::Code(0))) });
    let o = run(&s, &request(&s)).await.unwrap();
    assert_eq!((o.status, o.signal, o.reason), (Status::Killed, Some(9), Some(Reason::Signalled)));

    let s = setup(Behaviour { record: None, exit: Some((137, true)), ..honest(record(WaitStatus::Code(0))) });
    let o = run(&s, &request(&s)).await.unwrap();
    assert_eq!(o.status, Status::OomKilled);
    assert_eq!(o.usage.sources.oom_kills, Some(Source::Engine));

    let s = setup(Behaviour { record: None, exit: Some((0, false)), ..honest(record(WaitStatus::Code(0))) });
    let o = run(&s, &request(&s)).await.unwrap();
    assert_eq!(
        (o.status, o.reason),
        (Status::Killed, Some(Reason::InitLost)),
        "an init that left no record is never ok"
    );
}

#[tokio::test]
async fn a_container_removed_by_someone_else() {
    let s = setup(Behaviour { record: None, vanish: true, ..honest(record(WaitStatus::Code(0))) });
    let o = run(&s, &request(&s)).await.unwrap();
    assert_eq!((o.status, o.reason), (Status::Killed, Some(Reason::RemovedExternally)));
}

#[tokio::test]
async fn impossible_usage_claims_are_refused() {
    let mut rec = record(WaitStatus::Code(0));
    rec.cgroup.cpu_usage_ns = Some(3_600_000_000_000);
    rec.cgroup.memory_peak_bytes = Some(1 << 50);
    let s = setup(honest(rec));
    let o = run(&s, &request(&s)).await.unwrap();
    assert_eq!(o.usage.peak_memory_bytes, None);
    assert_ne!(o.usage.cpu_time_ms, Some(3_600_000));
    assert_eq!(o.evidence.refused_claims.len(), 2, "{:?}", o.evidence.refused_claims);
}

#[tokio::test]
async fn a_full_disk_says_disk_limit() {
    let mut rec = record(WaitStatus::Code(1));
    rec.out_fs = Some(FsSpace { total_bytes: 64 << 20, free_bytes: 0 });
    let s = setup(honest(rec));
    let req = request(&s).disk(64 << 20);
    let o = run(&s, &req).await.unwrap();
    assert_eq!((o.status, o.reason), (Status::HandlerError, Some(Reason::DiskLimit)));
}

#[tokio::test]
async fn a_deadline_stops_the_command_through_the_link() {
    let mut rec = record(WaitStatus::Signal(15));
    rec.stopped_by = Some(StoppedBy::Term);
    // The scripted init records a stop; the host must have asked for it first.
    let fake = FakeApi::new(IMAGE);
    let r2 = rec.clone();
    fake.script(Arc::new(move |side: InitSide| {
        let rec = r2.clone();
        Box::pin(async move {
            let InitSide { mut stdin, out, .. } = side;
            let (start, _) = read_start(&mut stdin).await;
            // Wait for the Stop frame.
            let mut d = wire::Decoder::new(|_| true);
            let mut buf = vec![0u8; 4096];
            loop {
                use tokio::io::AsyncReadExt;
                if let Ok(Some(f)) = d.next_frame()
                    && f.kind == Kind::Stop
                {
                    break;
                }
                let n = stdin.read(&mut buf).await.unwrap();
                assert!(n > 0);
                d.feed(&buf[..n]);
            }
            let key = wire::parse_key(&start.key).unwrap();
            send(&out, Kind::Record, &wire::seal(&key, &serde_json::to_vec(&rec).unwrap()));
            send(&out, Kind::Output, &tar_of(&[]));
            send(&out, Kind::OutputEnd, &serde_json::to_vec(&OutputEnd::default()).unwrap());
            await_ack(&mut stdin).await;
        })
    }));
    let dir = tempfile::tempdir().unwrap();
    let rung = ContainerExecutor::on(
        fake.engine(),
        ContainerConfig::default().init_from_host(false).log_dir(dir.path().join("logs")),
    );
    let req = Request::command("j", ["sleep", "9"], dir.path().join("out"))
        .worker("w1")
        .image(IMAGE)
        .timeout(Duration::from_millis(50));
    let o = rung.run(&req, CancellationToken::new()).await.unwrap();
    rung.close().await;
    assert_eq!((o.status, o.reason, o.signal), (Status::Timeout, Some(Reason::Deadline), Some(15)));
    assert!(fake.objects().is_empty());
}

#[tokio::test]
async fn a_dropped_attempt_is_cleaned_up_by_the_backstop() {
    let fake = FakeApi::new(IMAGE);
    // An init that never answers: the attempt hangs until dropped.
    fake.script(Arc::new(|side: InitSide| {
        Box::pin(async move {
            let InitSide { mut stdin, out, .. } = side;
            let _ = read_start(&mut stdin).await;
            let _keep = out;
            await_ack(&mut stdin).await;
        })
    }));
    let dir = tempfile::tempdir().unwrap();
    let rung = ContainerExecutor::on(
        fake.engine(),
        ContainerConfig::default().init_from_host(false).log_dir(dir.path().join("logs")),
    );
    let req = Request::command("j", ["true"], dir.path().join("out")).worker("w1").image(IMAGE);
    let r = tokio::time::timeout(Duration::from_millis(300), rung.run(&req, CancellationToken::new())).await;
    assert!(r.is_err(), "the attempt was still running");
    rung.close().await;
    assert!(fake.objects().is_empty(), "left behind: {:?}", fake.objects());
}

#[tokio::test]
async fn a_handler_runner_that_never_says_hello_is_a_launch_error_naming_main_hook() {
    let mut rec = record(WaitStatus::Code(1));
    rec.handler = Some(HandlerChannel::default());
    let fake = FakeApi::new(IMAGE);
    fake.script(init(honest(rec)));
    let dir = tempfile::tempdir().unwrap();
    let rung = ContainerExecutor::on(
        fake.engine(),
        ContainerConfig::default().init_from_host(false).log_dir(dir.path().join("logs")),
    );
    // A worker image: the entry label tells how to exec the worker binary.
    let mut req = Request::handler("j", "echo", dir.path().join("out")).worker("w1").image(IMAGE);
    req.fingerprint = None;
    let err = {
        let api = fake.clone();
        api.label_image(IMAGE, crate::container::labels::ENTRY, "[\"/app/worker\"]");
        rung.run(&req, CancellationToken::new()).await.unwrap_err()
    };
    rung.close().await;
    assert!(matches!(err, LaunchError::HandlerProtocol { .. }), "{err}");
    assert!(err.to_string().contains("main_hook"));
    assert!(fake.objects().is_empty());
}

#[tokio::test]
async fn an_invalid_request_waits_for_nothing_and_creates_nothing() {
    let s = setup(honest(record(WaitStatus::Code(0))));
    let req = request(&s).worker("..");
    let err = run(&s, &req).await.unwrap_err();
    assert!(matches!(err, LaunchError::InvalidRequest(_)));
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
}

#[tokio::test]
async fn each_rung_fills_its_own_init_volume_and_close_removes_it() {
    let fake = FakeApi::new(IMAGE);
    fake.script(init(honest(record(WaitStatus::Code(0)))));
    let dir = tempfile::tempdir().unwrap();
    // Two processes' rungs on one engine: neither ever mounts the other's volume.
    let rungs: Vec<ContainerExecutor> = (0..2)
        .map(|i| {
            let cfg = ContainerConfig::default()
                .init_from_host(false)
                .log_dir(dir.path().join("logs"))
                .incarnation(format!("p{i}"));
            ContainerExecutor::on(fake.engine(), cfg)
        })
        .collect();
    let req = |i: usize, n: usize| {
        Request::command("j", ["true"], dir.path().join(format!("o{i}-{n}"))).worker("w1").image(IMAGE)
    };
    let (r0, r1) = (req(0, 0), req(1, 0));
    let (a, b) = tokio::join!(rungs[0].run(&r0, CancellationToken::new()), rungs[1].run(&r1, CancellationToken::new()));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_ne!(a.evidence.init, b.evidence.init, "one volume per rung");
    // A second attempt reuses its rung's volume: no new fill.
    let again = rungs[0].run(&req(0, 1), CancellationToken::new()).await.unwrap();
    assert_eq!(again.evidence.init, a.evidence.init);
    let fills = fake.calls().iter().filter(|c| c.starts_with("create volume stevedore-tools-")).count();
    assert_eq!(fills, 2);
    rungs[0].close().await;
    let left = fake.volume_names();
    assert_eq!(left.iter().filter(|n| n.starts_with("stevedore-tools-")).count(), 1, "{left:?}");
    rungs[1].close().await;
    assert!(fake.objects().is_empty(), "left behind: {:?}", fake.objects());
}

#[tokio::test]
async fn a_tools_volume_another_process_took_is_made_anew_and_close_leaves_nothing() {
    use crate::engine::EngineApi;
    let Setup { fake, rung, dir } = setup(honest(record(WaitStatus::Code(0))));
    let req = |n: usize| Request::command("j", ["true"], dir.path().join(format!("o{n}"))).worker("w1").image(IMAGE);
    let first = rung.run(&req(0), CancellationToken::new()).await.unwrap();
    assert_eq!(first.status, Status::Ok);
    let taken = fake.volume_names();
    assert_eq!(taken.len(), 1, "{taken:?}");
    // Another process's `reclaim --tools` takes it between two attempts, well within the
    // minute the rung trusts it unchecked.
    fake.remove_volume(&taken[0]).await.unwrap();

    // The next container makes the name again, empty: never filled from the image, labelled
    // as this incarnation's. Its start fails; it never ran, so this is a launch error.
    let err = rung.run(&req(1), CancellationToken::new()).await.unwrap_err();
    assert!(err.to_string().contains("no such file"), "{err}");
    let remade = fake.volume_names();
    assert_eq!(remade, taken, "made again by the mount");
    // The failure sends the rung to check: the attempt after it makes a new volume.
    let third = rung.run(&req(2), CancellationToken::new()).await.unwrap();
    assert_eq!(third.status, Status::Ok);
    assert_ne!(third.evidence.init, first.evidence.init, "a new tools volume");
    assert!(!fake.volume_names().contains(&taken[0]), "the empty one is removed once nothing mounts it");
    rung.close().await;
    assert!(fake.objects().is_empty(), "left behind: {:?}", fake.objects());
}

#[tokio::test]
async fn a_first_attempt_dropped_while_its_init_volume_is_made_leaves_it_to_close() {
    let s = setup(honest(record(WaitStatus::Code(0))));
    let (fake, rung, req) = (&s.fake, &s.rung, request(&s));
    // The caller gives up while the init is being uploaded into the new volume (the first
    // attempt of a rung): the volume is made on a tracked task, which runs on.
    fake.hold_uploads();
    let mut attempt = Box::pin(rung.run(&req, CancellationToken::new()));
    for _ in 0..10 {
        assert!(futures_util::poll!(attempt.as_mut()).is_pending());
        tokio::task::yield_now().await;
    }
    assert!(fake.calls().iter().any(|c| c.starts_with("upload archive stevedore-tools-")), "{:?}", fake.calls());
    drop(attempt);
    fake.release_uploads();
    rung.close().await;
    assert!(fake.objects().is_empty(), "left behind: {:?}", fake.objects());
}

#[tokio::test]
async fn a_rung_dropped_without_close_still_removes_its_init_volume() {
    let fake = FakeApi::new(IMAGE);
    fake.script(init(honest(record(WaitStatus::Code(0)))));
    let dir = tempfile::tempdir().unwrap();
    let rung = ContainerExecutor::on(
        fake.engine(),
        ContainerConfig::default().init_from_host(false).log_dir(dir.path().join("logs")),
    );
    let req = Request::command("j", ["true"], dir.path().join("o")).worker("w1").image(IMAGE);
    rung.run(&req, CancellationToken::new()).await.unwrap();
    assert_eq!(fake.volume_names().len(), 1, "the rung's init volume");
    drop(rung);
    // The backstop's removal is spawned; the fake answers it in one poll.
    tokio::task::yield_now().await;
    assert!(fake.objects().is_empty(), "left behind: {:?}", fake.objects());
}

#[tokio::test]
async fn a_crashed_rungs_tools_go_with_its_reclaim_and_old_unused_ones_with_prune() {
    use crate::container::labels;
    use crate::container::tools::{self, TOOLS_CREATED};
    use crate::engine::EngineApi;
    let fake = FakeApi::new(IMAGE);
    let engine = fake.engine();
    let digest = crate::sandbox::init_binary::sha256();
    let now_s = crate::contract::unix_ms_now() / 1000;
    let mk = |name: &str, inc: &str, age_s: u64| {
        let mut l = labels::tools(digest, "init");
        l.insert(labels::INCARNATION.into(), inc.into());
        l.insert(TOOLS_CREATED.into(), (now_s - age_s).to_string());
        bollard::models::VolumeCreateRequest { name: Some(name.into()), labels: Some(l), ..Default::default() }
    };
    for req in [
        mk("stevedore-tools-crashed", "dead", 5),
        mk("stevedore-tools-old", "gone-long-ago", 2 * 3600),
        mk("stevedore-tools-old-used", "gone-long-ago-2", 2 * 3600),
        mk("stevedore-tools-young", "alive-elsewhere", 5),
        mk("stevedore-tools-mine", "me", 2 * 3600),
    ] {
        fake.create_volume(req).await.unwrap();
    }
    // A container of the crashed process, and one that still mounts an old volume.
    let body = |labels: HashMap<String, String>, volume: &str| bollard::models::ContainerCreateBody {
        image: Some(IMAGE.into()),
        labels: Some(labels),
        host_config: Some(bollard::models::HostConfig {
            mounts: Some(vec![crate::container::spec::volume_mount(volume, stevedore_init::wire::TOOLS_DIR, true)]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let crashed = HashMap::from([
        (labels::MANAGED.to_owned(), "true".to_owned()),
        (labels::KIND.to_owned(), "attempt".to_owned()),
        (labels::WORKER.to_owned(), "w9".to_owned()),
        (labels::INCARNATION.to_owned(), "dead".to_owned()),
        (labels::ATTEMPT_ID.to_owned(), "a1".to_owned()),
    ]);
    fake.create_container("sd-crashed", body(crashed, "stevedore-tools-crashed")).await.unwrap();
    fake.create_container("user-thing", body(HashMap::new(), "stevedore-tools-old-used")).await.unwrap();

    let rung = ContainerExecutor::on(
        engine.clone(),
        ContainerConfig::default()
            .init_from_host(false)
            .log_dir(tempfile::tempdir().unwrap().path().join("l"))
            .incarnation("me"),
    );
    let report = rung.reclaim("w9").await.unwrap();
    assert!(report.volumes_removed.contains(&"stevedore-tools-crashed".to_owned()), "{report:?}");
    let pruned = tools::prune(&engine, "me").await.unwrap();
    assert_eq!(pruned.volumes_removed, ["stevedore-tools-old"]);
    assert_eq!(pruned.in_use, ["stevedore-tools-old-used"]);
    let mut left = fake.volume_names();
    left.sort();
    assert_eq!(left, ["stevedore-tools-mine", "stevedore-tools-old-used", "stevedore-tools-young"]);
}

/// A collection that stalls is stopped at its deadline (here the least there is: the host's
/// margin of 5 s past a 1 ms one): the files that came whole are kept and hashed, the one it
/// stopped in is named, and the Outcome says the deadline cut it.
#[tokio::test]
async fn a_stalled_collection_keeps_what_came_whole_at_its_deadline() {
    let mut b = honest(record(WaitStatus::Code(0)));
    b.files = vec![("a-first.txt".into(), b"whole".to_vec()), ("b-second.bin".into(), vec![7; 100_000])];
    // The first file's header and data (512 + 512), the second's header and a little of it.
    b.stall_after = Some(1024 + 512 + 4096);
    let fake = FakeApi::new(IMAGE);
    fake.script(init(b));
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ContainerConfig::default().init_from_host(false).log_dir(dir.path().join("logs"));
    cfg.link.collection = crate::link::Collection { min: Duration::from_millis(1), bytes_per_s: u64::MAX };
    let rung = ContainerExecutor::on(fake.engine(), cfg);
    let req = Request::command("job-1", ["true"], dir.path().join("out")).worker("w1").image(IMAGE);
    let o = rung.run(&req, CancellationToken::new()).await.unwrap();
    rung.close().await;
    assert!(fake.objects().is_empty(), "left behind: {:?}", fake.objects());
    assert_eq!((o.status, o.reason), (Status::Ok, Some(Reason::OutputLimit)), "{}", o.to_json());
    assert_eq!(o.outputs.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["a-first.txt"]);
    assert_eq!(std::fs::read(dir.path().join("out/a-first.txt")).unwrap(), b"whole");
    assert!(!dir.path().join("out/b-second.bin").exists());
    let refused: Vec<(&str, &str)> =
        o.evidence.refused_outputs.iter().map(|r| (r.name.as_str(), r.why.as_str())).collect();
    assert_eq!(refused, [("b-second.bin", "collection_deadline")]);
    let c = o.evidence.collection.clone().unwrap();
    assert!(c.cut && c.deadline_ms <= 2, "{c:?}");
}

#[tokio::test]
async fn a_start_answered_after_its_timeout_is_supervised_not_abandoned() {
    // The engine started the container but said so too late: the rung asks it, finds the
    // container running, and the attempt goes on to its true end.
    let s = setup(honest(record(WaitStatus::Code(0))));
    s.fake.answer_late("start container");
    let o = run(&s, &request(&s)).await.expect("the attempt ran");
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert!(s.fake.calls().iter().any(|c| c.starts_with("inspect container")), "{:?}", s.fake.calls());
}

#[tokio::test]
async fn a_removal_the_engine_fails_for_a_while_is_tried_again_until_it_goes() {
    // The attempt's container's removal fails twice with the engine's own error (500; the
    // tools filler and the image probe go first): the Outcome says the removal goes on in
    // the background, and once `close` returns nothing is left (`run` checks).
    let s = setup(honest(record(WaitStatus::Code(0))));
    s.fake.fail_times("remove container", 2, 2, 500);
    let o = run(&s, &request(&s)).await.expect("the attempt ran");
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert!(o.evidence.notes.iter().any(|n| n.contains("in the background")), "{:?}", o.evidence.notes);
    let removals = s.fake.calls().iter().filter(|c| c.starts_with("remove container")).count();
    assert!(removals >= 3, "tried again: {:?}", s.fake.calls());
}

#[tokio::test]
async fn the_phases_are_timed_in_order() {
    let s = setup(honest(record(WaitStatus::Code(0))));
    let o = run(&s, &request(&s)).await.expect("the attempt ran");
    let p = &o.evidence.phases;
    let order = [p.prepared_ms, p.created_ms, p.started_ms, p.command_ended_ms, p.outputs_collected_ms, p.concluded_ms];
    assert!(order.iter().all(Option::is_some), "every phase of a cold attempt without inputs: {p:?}");
    assert!(order.windows(2).all(|w| w[0] <= w[1]), "in order: {p:?}");
    assert_eq!(p.inputs_staged_ms, None, "no inputs, no staging");
}

#[tokio::test]
async fn what_a_crash_left_is_reclaimed_by_its_record_even_when_the_engine_cannot_list() {
    // An attempt whose process "dies" mid-command (its future forgotten: no teardown, no
    // backstop); another process of the same worker reclaims while the engine fails every
    // listing. The state dir's record names the objects, and they go.
    let fake = FakeApi::new(IMAGE);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let tx = Arc::new(std::sync::Mutex::new(Some(tx)));
    fake.script(Arc::new(move |side: InitSide| {
        let tx = tx.clone();
        Box::pin(async move {
            // The link stays open (its output sender held): the command "runs".
            let InitSide { mut stdin, out, .. } = side;
            let _ = read_start(&mut stdin).await;
            if let Some(tx) = tx.lock().unwrap().take() {
                let _ = tx.send(());
            }
            std::future::pending::<()>().await;
            drop(out);
        })
    }));
    let dir = tempfile::tempdir().unwrap();
    let worker = format!("w-journal-{:08x}", rand::random::<u32>());
    // The inputs through the engine (a helper): the fake's init speaks no `Stage`.
    let cfg =
        || ContainerConfig::default().init_from_host(false).log_dir(dir.path().join("logs")).link_inputs_max_bytes(0);
    let dead = ContainerExecutor::on(fake.engine(), cfg().incarnation("dead-process"));
    let mut req = Request::command("job-1", ["true"], dir.path().join("out")).worker(&worker).image(IMAGE);
    req.input_dir = Some(dir.path().to_owned());
    let mut attempt = Box::pin(dead.run(&req, CancellationToken::new()));
    tokio::select! {
        r = &mut attempt => panic!("the attempt ended: {r:?}"),
        _ = rx => {}
    }
    std::mem::forget(attempt);
    let ours = |objects: Vec<String>| -> Vec<String> {
        objects.into_iter().filter(|o| o.starts_with(&format!("sd-{worker}"))).collect()
    };
    let left = ours(fake.objects());
    assert_eq!(left.len(), 3, "the container, its staging helper, its input volume: {left:?}");
    fake.fail_times("list containers", 0, 10, 500);
    fake.fail_times("list volumes", 0, 10, 500);
    let restarted = ContainerExecutor::on(fake.engine(), cfg().incarnation("restarted"));
    let report = restarted.reclaim(&worker).await;
    assert!(report.is_err(), "the engine lists nothing: {report:?}");
    assert!(ours(fake.objects()).is_empty(), "left behind: {:?}", fake.objects());
    assert!(super::journal::recorded(&worker).unwrap().is_empty(), "the record is forgotten once all is gone");
    restarted.close().await;
}
