use super::*;
use crate::contract::{Executor, LaunchError, Level, Request, ResourceLimits, Status};
use crate::handlers::{HandlerError, Handlers, builtin};
use crate::outputs::Caps;
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
#[error("the widget is broken")]
struct WidgetError;

/// Gates for handlers a test steers: `started` is signalled when the handler runs,
/// `release` lets it finish.
#[derive(Default)]
struct Gates {
    started: Notify,
    release: Notify,
}

fn handlers(gates: &Arc<Gates>) -> Handlers {
    let (g1, g2, g3) = (gates.clone(), gates.clone(), gates.clone());
    builtin()
        .register("typed-error", |ctx| async move {
            tokio::fs::write(ctx.output("partial"), b"p").await?;
            Err(HandlerError::context("fixing the widget", WidgetError))
        })
        .register("wait-cancel", move |ctx| {
            let g = g1.clone();
            async move {
                g.started.notify_one();
                ctx.cancel.cancelled().await;
                Err(HandlerError::new("cancelled"))
            }
        })
        .register("stubborn", move |_| {
            let g = g2.clone();
            async move {
                g.started.notify_one();
                std::future::pending().await
            }
        })
        .register("gated", move |_| {
            let g = g3.clone();
            async move {
                g.started.notify_one();
                g.release.notified().await;
                Ok(())
            }
        })
}

fn exec() -> (InProcessExecutor, Arc<Gates>) {
    let gates = Arc::new(Gates::default());
    (InProcessExecutor::new(handlers(&gates), "boot-1"), gates)
}

fn req(dir: &Path, handler: &str) -> Request {
    Request::handler("job-1", handler, dir.join("out")).worker("w1")
}

fn sha(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

#[tokio::test]
async fn ok_lists_outputs_hashed() {
    let t = tempfile::tempdir().unwrap();
    let (e, _) = exec();
    let o = e.run(&req(t.path(), "write-outputs"), CancellationToken::new()).await.unwrap();
    assert_eq!((o.status, o.reason.map(|r| r.as_str()), o.handler_error.as_str()), (Status::Ok, None, ""));
    let names: Vec<_> = o.outputs.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["a.txt", "dir/b.json"]);
    assert_eq!((o.outputs[0].size, o.outputs[0].hash.as_str()), (6, sha(b"alpha\n").as_str()));
    assert_eq!(o.outputs[1].hash, sha(br#"{"b":1}"#));
    assert_eq!(o.usage.disk_written_bytes, Some(6 + 7));
    assert_eq!(o.usage.sources.disk_written_bytes.as_ref().unwrap().to_string(), "walked");
    assert_eq!(o.usage.sources.wall_time_ms.as_ref().unwrap().to_string(), "host_clock");
    assert!(o.usage.wall_time_ms.is_some());
    assert!(o.usage.cpu_time_ms.is_none() && o.usage.peak_memory_bytes.is_none());
    assert!(o.usage.sources.cpu_time_ms.as_ref().unwrap().to_string().starts_with("unavailable: in-process"));
    assert!(o.usage.sources.peak_memory_bytes.as_ref().unwrap().to_string().starts_with("unavailable: in-process"));
    assert_eq!((o.exit_code, o.signal, o.permanent), (None, None, false));
    let ev = &o.evidence;
    assert_eq!((ev.executor.as_str(), ev.level, ev.worker.as_str()), ("inprocess", Some(Level::None), "w1"));
    assert_eq!(ev.incarnation, "boot-1");
    assert!(ev.started_at_unix_ms.unwrap() <= ev.finished_at_unix_ms.unwrap());
    assert!(!ev.still_running);
}

#[tokio::test]
async fn echo_writes_the_payload() {
    let t = tempfile::tempdir().unwrap();
    let (e, _) = exec();
    let o = e.run(&req(t.path(), "echo").payload("hello"), CancellationToken::new()).await.unwrap();
    assert_eq!(o.status, Status::Ok);
    assert_eq!(std::fs::read(t.path().join("out/payload")).unwrap(), b"hello");
}

#[tokio::test]
async fn handler_error_keeps_cause() {
    let t = tempfile::tempdir().unwrap();
    let (e, _) = exec();
    let o = e.run(&req(t.path(), "typed-error"), CancellationToken::new()).await.unwrap();
    assert_eq!((o.status, o.reason.map(|r| r.as_str())), (Status::HandlerError, None));
    assert_eq!(o.handler_error, "fixing the widget: the widget is broken");
    assert!(!o.permanent);
    let cause = o.cause.as_ref().expect("cause kept");
    let he = cause.downcast_ref::<HandlerError>().expect("the handler's own error");
    assert!(std::error::Error::source(he).unwrap().downcast_ref::<WidgetError>().is_some());
    assert_eq!(o.outputs.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["partial"]);
    assert!(o.to_json().contains("handler_error"), "serialises without the cause");
}

#[tokio::test]
async fn fail_and_fail_permanent() {
    let t = tempfile::tempdir().unwrap();
    let (e, _) = exec();
    let o = e.run(&req(t.path(), "fail").payload("nope"), CancellationToken::new()).await.unwrap();
    assert_eq!((o.status, o.handler_error.as_str(), o.permanent), (Status::HandlerError, "nope", false));
    let t = tempfile::tempdir().unwrap();
    let o = e.run(&req(t.path(), "fail-permanent"), CancellationToken::new()).await.unwrap();
    assert_eq!((o.status, o.permanent), (Status::HandlerError, true));
    assert!(!o.handler_error.is_empty());
}

#[tokio::test]
async fn panic_is_killed_and_worker_survives() {
    let t = tempfile::tempdir().unwrap();
    let (e, _) = exec();
    let o = e.run(&req(t.path(), "panic").payload("kaboom"), CancellationToken::new()).await.unwrap();
    assert_eq!((o.status, o.reason.map(|r| r.as_str())), (Status::Killed, Some("panicked")));
    assert!(o.handler_error.contains("kaboom"), "{}", o.handler_error);
    assert!(o.outputs.is_empty());
    let t = tempfile::tempdir().unwrap();
    let o = e.run(&req(t.path(), "true"), CancellationToken::new()).await.unwrap();
    assert_eq!(o.status, Status::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_on_time_although_handler_blocks() {
    let t = tempfile::tempdir().unwrap();
    let (e, _) = exec();
    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    let o = e.run(&req(t.path(), "ignore-cancel").payload("1500").timeout(timeout), CancellationToken::new()).await;
    let took = start.elapsed();
    let o = o.unwrap();
    assert!(took < timeout + Duration::from_millis(500), "took {took:?}");
    assert_eq!((o.status, o.reason.map(|r| r.as_str())), (Status::Timeout, Some("deadline")));
    assert!(o.evidence.still_running);
    assert!(o.evidence.notes.iter().any(|n| n.contains("cannot be killed")), "{:?}", o.evidence.notes);
    // Outputs are listed for every attempt whose handler ran (a timed-out one too).
    assert!(o.outputs.is_empty() && o.usage.disk_written_bytes == Some(0));
}

#[tokio::test]
async fn timeout_of_cooperative_handler_is_seen_finished() {
    let t = tempfile::tempdir().unwrap();
    let (e, _) = exec();
    let o = e
        .run(&req(t.path(), "sleep").payload("60000").timeout(Duration::from_millis(50)), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!((o.status, o.reason.map(|r| r.as_str())), (Status::Timeout, Some("deadline")));
    assert!(!o.evidence.still_running, "a cooperative handler returns within the settle time");
    assert!(o.handler_error.is_empty());
}

#[tokio::test]
async fn deadline_already_passed_does_not_run() {
    let t = tempfile::tempdir().unwrap();
    let (e, _) = exec();
    let o = e.run(&req(t.path(), "echo").payload("x").deadline(Instant::now()), CancellationToken::new()).await;
    let o = o.unwrap();
    assert_eq!(o.status, Status::Timeout);
    assert!(!t.path().join("out/payload").exists());
}

#[tokio::test]
async fn cancellation_is_killed_cancelled() {
    let t = tempfile::tempdir().unwrap();
    let (e, gates) = exec();
    let cancel = CancellationToken::new();
    let r = req(t.path(), "wait-cancel");
    let run = e.run(&r, cancel.clone());
    let steer = async {
        gates.started.notified().await;
        cancel.cancel();
    };
    let (o, ()) = tokio::join!(run, steer);
    let o = o.unwrap();
    assert_eq!((o.status, o.reason.map(|r| r.as_str())), (Status::Killed, Some("cancelled")));
    assert!(!o.evidence.still_running);
    assert!(o.outputs.is_empty());
}

#[tokio::test]
async fn cancellation_of_stubborn_handler_returns() {
    let t = tempfile::tempdir().unwrap();
    let (e, gates) = exec();
    let cancel = CancellationToken::new();
    let r = req(t.path(), "stubborn");
    let steer = async {
        gates.started.notified().await;
        cancel.cancel();
    };
    let (o, ()) = tokio::join!(e.run(&r, cancel.clone()), steer);
    let o = o.unwrap();
    assert_eq!((o.status, o.reason.map(|r| r.as_str())), (Status::Killed, Some("cancelled")));
    assert!(o.evidence.still_running);
}

#[tokio::test]
async fn cancelled_before_start_is_a_launch_error() {
    let t = tempfile::tempdir().unwrap();
    let (e, _) = exec();
    let cancel = CancellationToken::new();
    cancel.cancel();
    let err = e.run(&req(t.path(), "true"), cancel).await.unwrap_err();
    assert!(matches!(err, LaunchError::CancelledBeforeStart), "{err:?}");
}

#[tokio::test]
async fn unknown_handler_is_launch_failed_permanent() {
    let t = tempfile::tempdir().unwrap();
    let (e, _) = exec();
    let o = e.run(&req(t.path(), "nope"), CancellationToken::new()).await.unwrap();
    assert_eq!((o.status, o.permanent), (Status::LaunchFailed, true));
    assert_eq!(o.reason.map(|r| r.as_str()), Some("unknown_handler"));
    assert!(o.handler_error.contains("unknown handler") && o.handler_error.contains("nope"));
    assert!(!o.status.counts_against_retries());
}

#[tokio::test]
async fn fingerprint_mismatch_names_both_values() {
    let t = tempfile::tempdir().unwrap();
    let (e, _) = exec();
    let theirs = "sha256:0000";
    // Known before anything runs, as on a worker image's label: a permanent launch error.
    let err = e.run(&req(t.path(), "true").fingerprint(theirs), CancellationToken::new()).await.unwrap_err();
    assert!(err.is_permanent());
    let ours = e.handlers().fingerprint();
    assert!(err.to_string().contains(theirs) && err.to_string().contains(&ours), "{err}");
    let o = e.run(&req(t.path(), "true").fingerprint(ours), CancellationToken::new()).await.unwrap();
    assert_eq!(o.status, Status::Ok);
}

#[tokio::test]
async fn invalid_request_is_permanent_err() {
    let t = tempfile::tempdir().unwrap();
    let (e, _) = exec();
    let err = e.run(&req(t.path(), "true").attempt(0), CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, LaunchError::InvalidRequest(_)) && err.is_permanent(), "{err:?}");
    let err = e
        .run(&Request::command("j", ["true"], t.path().join("out")).worker("w1"), CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(err, LaunchError::NotAllowed(_)) && err.is_permanent(), "{err:?}");
}

#[tokio::test]
async fn close_refuses_new_and_waits_for_in_flight() {
    let t = tempfile::tempdir().unwrap();
    let (e, gates) = exec();
    let r = req(t.path(), "gated");
    let steer = async {
        gates.started.notified().await;
        // One poll of close: it must mark the rung closed but not complete.
        assert!(tokio::time::timeout(Duration::ZERO, e.close()).await.is_err(), "close waits for the attempt");
        let t2 = tempfile::tempdir().unwrap();
        let err = e.run(&req(t2.path(), "true"), CancellationToken::new()).await.unwrap_err();
        assert!(matches!(err, LaunchError::Closed(ref n) if n == "inprocess"), "{err:?}");
        gates.release.notify_one();
    };
    let (o, ()) = tokio::join!(e.run(&r, CancellationToken::new()), steer);
    assert_eq!(o.unwrap().status, Status::Ok);
    e.close().await;
}

#[tokio::test]
async fn inputs_are_resolved_and_hashed() {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir(t.path().join("in")).unwrap();
    std::fs::write(t.path().join("in/data.bin"), b"input bytes").unwrap();
    let (e, _) = exec();
    let r = req(t.path(), "inputs").input_dir(t.path().join("in")).input("in", "data.bin");
    let o = e.run(&r, CancellationToken::new()).await.unwrap();
    assert_eq!(o.status, Status::Ok, "{}", o.handler_error);
    let text = std::fs::read_to_string(t.path().join("out/inputs.txt")).unwrap();
    assert_eq!(text, format!("in {}\n", sha(b"input bytes")));
    let t2 = tempfile::tempdir().unwrap();
    let r = Request::handler("j", "cat-input", t2.path().join("out"))
        .worker("w1")
        .input_dir(t.path().join("in"))
        .input("in", "data.bin");
    assert_eq!(e.run(&r, CancellationToken::new()).await.unwrap().status, Status::Ok);
    assert_eq!(std::fs::read(t2.path().join("out/copy")).unwrap(), b"input bytes");
}

#[tokio::test]
async fn output_cap_says_output_limit() {
    let t = tempfile::tempdir().unwrap();
    let e = InProcessExecutor::new(builtin(), "b").with_caps(Caps { max_files: 1, max_total_bytes: 1 << 20 });
    let o = e.run(&req(t.path(), "write-outputs"), CancellationToken::new()).await.unwrap();
    // The status stays true; the reason says the outputs were cut at the cap.
    assert_eq!((o.status, o.reason.map(|r| r.as_str())), (Status::Ok, Some("output_limit")));
    assert_eq!(o.outputs.len(), 1);
}

#[tokio::test]
async fn evidence_says_limits_are_not_enforced() {
    let t = tempfile::tempdir().unwrap();
    let (e, _) = exec();
    let r = req(t.path(), "true").limits(ResourceLimits::new().with("memory", 64 << 20));
    let o = e.run(&r, CancellationToken::new()).await.unwrap();
    assert!(o.evidence.skipped.contains_key("limit.memory"), "{:?}", o.evidence.skipped);
    assert!(o.evidence.enforcement.is_empty());
}

#[tokio::test]
async fn usable_as_trait_object_with_a_name() {
    let t = tempfile::tempdir().unwrap();
    let e: Arc<dyn Executor> = Arc::new(InProcessExecutor::new(builtin(), "b").with_name("local"));
    assert_eq!((e.name(), e.level()), ("local", Level::None));
    let o = e.run(&req(t.path(), "true"), CancellationToken::new()).await.unwrap();
    assert_eq!(o.evidence.executor, "local");
    let report = e.reclaim("w1").await.unwrap();
    assert_eq!(report.worker, "w1");
    assert!(report.containers_removed.is_empty() && report.paths_removed.is_empty());
    assert!(e.reclaim("bad worker!").await.is_err());
}

mod hooks {
    use super::*;
    use crate::contract::{AttemptRef, HookResult, Hooks, Reason, SandboxReport};
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder {
        events: Mutex<Vec<String>>,
        cancel_after_report: bool,
    }

    impl Hooks for Recorder {
        fn cancellation_requested<'a>(&'a self, _: &'a AttemptRef) -> HookResult<'a, bool> {
            Box::pin(async move {
                Ok(self.cancel_after_report && self.events.lock().unwrap().iter().any(|e| e.starts_with("report")))
            })
        }
        fn poll_every(&self) -> Duration {
            Duration::from_millis(20)
        }
        fn report<'a>(&'a self, _: &'a AttemptRef, r: &'a SandboxReport) -> HookResult<'a> {
            Box::pin(async move {
                self.events.lock().unwrap().push(format!("report {} {:?}", r.seq, r.report.percent));
                Ok(())
            })
        }
        fn outcome<'a>(&'a self, o: &'a crate::contract::Outcome) -> HookResult<'a> {
            Box::pin(async move {
                self.events.lock().unwrap().push(format!("outcome {}", o.status));
                Ok(())
            })
        }
    }

    fn rung() -> InProcessExecutor {
        let handlers = builtin()
            .register("two-reports", |ctx| async move {
                assert!(ctx.progress(10.0, Some("a")));
                assert!(ctx.progress(60.0, None));
                // A report names no attempt (the contract's has no such field): it is always
                // this one's. One that breaks a kind's rules is refused.
                let mut bad = crate::contract::Report::note("a note");
                bad.percent = Some(5.0);
                assert!(!ctx.report(bad), "a note with a percent is refused");
                Ok(())
            })
            .register("report-then-wait", |ctx| async move {
                ctx.note("waiting");
                ctx.cancel.cancelled().await;
                Err(HandlerError::new("cancelled"))
            });
        InProcessExecutor::new(handlers, "boot")
    }

    #[tokio::test]
    async fn in_process_reports_reach_the_hook_in_order_before_the_outcome() {
        let out = tempfile::tempdir().unwrap();
        let h = Arc::new(Recorder::default());
        let req = Request::handler("j", "two-reports", out.path()).hooks(h.clone());
        let o = rung().run(&req, CancellationToken::new()).await.unwrap();
        assert_eq!(o.status, Status::Ok);
        assert_eq!(*h.events.lock().unwrap(), ["report 1 Some(10.0)", "report 2 Some(60.0)", "outcome ok"]);
        let seen = o.evidence.reports.unwrap();
        assert_eq!((seen.received, seen.delivered, seen.refused), (2, 2, 1));
    }

    #[tokio::test]
    async fn the_cancellation_poll_cancels_an_in_process_handler() {
        let out = tempfile::tempdir().unwrap();
        let h = Arc::new(Recorder { cancel_after_report: true, ..Recorder::default() });
        let req = Request::handler("j", "report-then-wait", out.path()).hooks(h.clone());
        let o = rung().run(&req, CancellationToken::new()).await.unwrap();
        assert_eq!((o.status, o.reason), (Status::Killed, Some(Reason::Cancelled)));
        assert!(o.evidence.notes.iter().any(|n| n.contains("cancellation hook")));
    }
}
