//! The engine's hooks on the container rung: checkpoint → reports → outcome, in that order;
//! failures before the start stop the attempt and leak nothing; failures after collection
//! never lose the outcome; a slow hook never stalls the drain; the cancellation poll stops
//! the attempt. Reports come from the command through the init's report client.

use crate::support;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stevedore::contract::{
    AttemptRef, Checkpoint, HookError, HookResult, Hooks, LaunchError, Reason, SandboxReport, Status,
};
use stevedore::{Executor, Outcome};
use support::*;
use tokio_util::sync::CancellationToken;

/// Records every call, in order; fails where told to.
#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<String>>,
    fail_checkpoint: bool,
    fail_outcome: bool,
    /// Each report call takes this long.
    slow_report: Option<Duration>,
    /// The cancellation poll answers true once a report arrived.
    cancel_on_report: bool,
    checkpoints: Mutex<Vec<Checkpoint>>,
}

impl Recorder {
    fn events(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }
    fn push(&self, e: String) {
        self.events.lock().unwrap().push(e);
    }
}

impl Hooks for Recorder {
    fn checkpoint<'a>(&'a self, c: &'a Checkpoint) -> HookResult<'a> {
        Box::pin(async move {
            self.push(format!("checkpoint {}", c.rung));
            self.checkpoints.lock().unwrap().push(c.clone());
            if self.fail_checkpoint { Err(HookError::new("the store is down")) } else { Ok(()) }
        })
    }

    fn cancellation_requested<'a>(&'a self, _: &'a AttemptRef) -> HookResult<'a, bool> {
        Box::pin(async move { Ok(self.cancel_on_report && self.events().iter().any(|e| e.starts_with("report"))) })
    }

    fn poll_every(&self) -> Duration {
        Duration::from_millis(100)
    }

    fn started<'a>(&'a self, _: &'a AttemptRef, info: &'a stevedore::contract::StartedInfo) -> HookResult<'a> {
        Box::pin(async move {
            self.push(format!("started {}", info.container_id.is_some()));
            Ok(())
        })
    }

    fn report<'a>(&'a self, a: &'a AttemptRef, r: &'a SandboxReport) -> HookResult<'a> {
        Box::pin(async move {
            if let Some(d) = self.slow_report {
                tokio::time::sleep(d).await;
            }
            self.push(format!("report {} {} {:?} {:?}", a.job_id, r.seq, r.report.percent, r.report.text));
            Ok(())
        })
    }

    fn outcome<'a>(&'a self, o: &'a Outcome) -> HookResult<'a> {
        Box::pin(async move {
            self.push(format!("outcome {}", o.status));
            if self.fail_outcome { Err(HookError::new("the database refused it")) } else { Ok(()) }
        })
    }
}

fn req(image: &str, w: &str, out: &Path, script: &str, hooks: Arc<Recorder>) -> stevedore::Request {
    sh(image, w, out, script).hooks(hooks)
}

#[tokio::test]
async fn checkpoint_then_reports_in_order_then_outcome() {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung().await;
    let w = worker("hooks-order");
    let out = tempfile::tempdir().unwrap();
    let hooks = Arc::new(Recorder::default());
    let script =
        r#"for p in 10 50 90; do "$STEVEDORE_INIT" report progress $p step; done; echo kept > /out/r; echo done"#;
    let o = run(&rung, &req(&image, &w, out.path(), script, hooks.clone())).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(
        hooks.events(),
        [
            "checkpoint docker",
            "started true",
            "report job 1 Some(10.0) Some(\"step\")",
            "report job 2 Some(50.0) Some(\"step\")",
            "report job 3 Some(90.0) Some(\"step\")",
            "outcome ok",
        ]
    );
    let seen = o.evidence.reports.as_ref().expect("reports counted");
    assert_eq!((seen.received, seen.delivered, seen.last_progress), (3, 3, Some(90.0)));
    assert_eq!(stdout_of(&o), "done\n", "reports are not in the captured output");
    let cp = hooks.checkpoints.lock().unwrap()[0].clone();
    assert_eq!((cp.job_id.as_str(), cp.attempt, cp.worker.as_str()), ("job", 1, w.as_str()));
    assert_eq!(
        o.evidence.container_id.as_deref(),
        match &cp.target {
            stevedore::contract::Target::Container { id, .. } => Some(id.as_str()),
            _ => None,
        }
    );
    assert!(!format!("{cp:?}").contains(&cp.link.key), "the key never shows in Debug");
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn a_failing_checkpoint_stops_the_attempt_before_its_command_and_leaks_nothing() {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung().await;
    let w = worker("hooks-cp");
    let out = tempfile::tempdir().unwrap();
    let hooks = Arc::new(Recorder { fail_checkpoint: true, ..Recorder::default() });
    let inputs = tempfile::tempdir().unwrap();
    std::fs::write(inputs.path().join("a"), b"x").unwrap();
    let r = req(&image, &w, out.path(), "echo ran > /out/ran", hooks.clone()).input_dir(inputs.path());
    let err = rung.run(&r, CancellationToken::new()).await.expect_err("the attempt must not run");
    assert!(matches!(err, LaunchError::Hook(_)), "{err:?}");
    assert!(stevedore::error_chain(&err).contains("the store is down"));
    assert_eq!(hooks.events(), ["checkpoint docker"], "no outcome for an attempt that never ran");
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0, "the command never ran");
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]), "container and input volume removed");
    rung.close().await;
}

#[tokio::test]
async fn a_failing_outcome_hook_keeps_the_outcome_and_its_outputs() {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung().await;
    let w = worker("hooks-out");
    let out = tempfile::tempdir().unwrap();
    let hooks = Arc::new(Recorder { fail_outcome: true, ..Recorder::default() });
    let o = run(&rung, &req(&image, &w, out.path(), "echo kept > /out/r; exit 3", hooks.clone())).await;
    assert_eq!((o.status, o.exit_code), (Status::HandlerError, Some(3)));
    assert_eq!(o.outputs.len(), 1);
    assert_eq!(std::fs::read_to_string(out.path().join("r")).unwrap(), "kept\n");
    assert_eq!(o.evidence.hook_failures, ["outcome: the database refused it"]);
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn a_slow_report_hook_never_stalls_the_drain() {
    let Some((_docker, image)) = setup().await else { return };
    let rung = rung().await;
    let w = worker("hooks-slow");
    let out = tempfile::tempdir().unwrap();
    let hooks = Arc::new(Recorder { slow_report: Some(Duration::from_millis(500)), ..Recorder::default() });
    // 8 MiB of output after three reports: the reader must drain it all while the hook
    // is still busy with the first report.
    let script = r#"for p in 1 2 3; do "$STEVEDORE_INIT" report progress $p; done; head -c 8388608 /dev/zero"#;
    let o = run(&rung, &req(&image, &w, out.path(), script, hooks.clone())).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(o.evidence.logs.stdout.bytes, 8 << 20);
    let seen = o.evidence.reports.as_ref().unwrap();
    assert_eq!((seen.received, seen.delivered, seen.dropped_slow_hook), (3, 3, 0));
    let events = hooks.events();
    assert_eq!(events.last().map(String::as_str), Some("outcome ok"), "the outcome comes after every report");
    rung.close().await;
}

#[tokio::test]
async fn the_cancellation_poll_stops_the_attempt() {
    let Some((_docker, image)) = setup().await else { return };
    let rung = rung().await;
    let w = worker("hooks-cancel");
    let out = tempfile::tempdir().unwrap();
    let hooks = Arc::new(Recorder { cancel_on_report: true, ..Recorder::default() });
    let script = r#""$STEVEDORE_INIT" report note started; exec sleep 300"#;
    let r = req(&image, &w, out.path(), script, hooks.clone()).grace(Duration::from_secs(1));
    let o = run(&rung, &r).await;
    assert_eq!((o.status, o.reason), (Status::Killed, Some(Reason::Cancelled)), "{}", o.to_json());
    assert!(o.evidence.notes.iter().any(|n| n.contains("cancellation hook")), "{:?}", o.evidence.notes);
    rung.close().await;
}

#[tokio::test]
async fn a_handler_in_a_container_reports_through_its_context() {
    let Some(_) = setup().await else { return };
    let image = worker_image().await;
    let rung = rung().await;
    let w = worker("hooks-handler");
    let out = tempfile::tempdir().unwrap();
    let hooks = Arc::new(Recorder::default());
    let r = stevedore::Request::handler("job", "progress", out.path())
        .worker(&w)
        .image(&image)
        .payload("step")
        .hooks(hooks.clone());
    let o = run(&rung, &r).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(std::fs::read_to_string(out.path().join("reported")).unwrap(), "true true true");
    let reports: Vec<String> = hooks.events().into_iter().filter(|e| e.starts_with("report")).collect();
    assert_eq!(
        reports,
        [
            "report job 1 Some(25.0) Some(\"step\")",
            "report job 2 Some(50.0) Some(\"step\")",
            "report job 3 Some(75.0) Some(\"step\")"
        ]
    );
    rung.close().await;
}
