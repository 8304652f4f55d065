//! The front of every rung that runs the init is one piece of code (`lib/src/attempt/front.rs`):
//! its rules are checked here on each rung (the kube rung's in `kube::`), through the rung's
//! public `Executor` only. Each refusal comes before anything is made (or, for what the
//! policy requires enforced, with everything made for it removed).

use crate::support;

use std::path::Path;
use std::sync::Arc;
use stevedore::contract::LaunchError;
use stevedore::process::{Delegation, ProcessConfig, ProcessExecutor};
use stevedore::{CancellationToken, Executor, Request};

/// The front's rules on `rung`: an invalid request, a network the rung cannot deny and a
/// cancellation that came first are refused before anything is made (`made` counts what the
/// rung made for the request's worker), and a closed rung takes no attempt.
/// `request` is a request this rung would run.
pub(crate) async fn one_rule_for_every_rung(
    rung: &dyn Executor,
    request: impl Fn(&Path) -> Request,
    made: impl AsyncFn() -> usize,
) {
    let t = tempfile::tempdir().unwrap();
    let out = |n: &str| t.path().join(n);
    let run = |req: Request, cancel: CancellationToken| async move { rung.run(&req, cancel).await };

    let invalid = request(&out("invalid")).attempt(0);
    let err = run(invalid, CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, LaunchError::InvalidRequest(_)), "{}: {err:?}", rung.name());
    assert!(err.is_permanent(), "an invalid request is permanent");

    let mut closed_net = request(&out("net"));
    closed_net.policy.no_network = true;
    match run(closed_net, CancellationToken::new()).await {
        Err(LaunchError::NotAllowed(why)) => {
            assert!(!rung.denies_network(), "{}: refused a network it denies: {why}", rung.name());
            assert!(why.contains("requires no network"), "{why}");
        }
        other => assert!(rung.denies_network(), "{}: ran without denying the network: {other:?}", rung.name()),
    }

    // What the policy requires enforced: a name no rung uses is an invalid request; what the
    // rung's census names runs; what it lacks is `launch_failed`/`not_enforced`, nothing run.
    let mut unknown = request(&out("unknown"));
    unknown.policy = unknown.policy.requiring(["quota"]);
    let err = run(unknown, CancellationToken::new()).await.unwrap_err();
    assert!(err.to_string().contains("\"quota\""), "{}: {err}", rung.name());
    let has = rung.enforces();
    let both: Vec<&str> = ["memory", "pids"].into_iter().filter(|k| has.contains(k)).collect();
    if !both.is_empty() {
        let mut req = request(&out("enforced"));
        req.policy = req.policy.requiring(both.clone());
        // A limit is enforced when one is asked (a rung may have no default of its own).
        req.limits = stevedore::ResourceLimits::new().with("memory", 256 << 20).with("pids", 256);
        let o = run(req, CancellationToken::new()).await.expect("it runs");
        assert_eq!(o.status, stevedore::Status::Ok, "{}: requiring {both:?}: {}", rung.name(), o.to_json());
    }
    if let Some(lacking) = stevedore::contract::ENFORCEABLE.iter().find(|k| !has.contains(k)) {
        let mut req = request(&out("not-enforced"));
        req.policy = req.policy.requiring([*lacking]);
        let o = run(req, CancellationToken::new()).await.expect("an Outcome");
        assert_eq!(
            (o.status, o.reason),
            (stevedore::Status::LaunchFailed, Some(stevedore::Reason::NotEnforced)),
            "{}: requiring {lacking}: {}",
            rung.name(),
            o.to_json()
        );
        assert!(o.handler_error.contains(lacking), "{}", o.handler_error);
    }

    let cancel = CancellationToken::new();
    cancel.cancel();
    let err = run(request(&out("cancelled")), cancel).await.unwrap_err();
    assert!(matches!(err, LaunchError::CancelledBeforeStart), "{}: {err:?}", rung.name());

    // `close` waits for the removals still running (of the attempts that ran).
    rung.close().await;
    assert_eq!(made().await, 0, "{}: nothing is left of the attempts", rung.name());
    let err = run(request(&out("after-close")), CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, LaunchError::Closed(_)), "{}: {err:?}", rung.name());
}

fn process_rung(cfg: ProcessConfig) -> ProcessExecutor {
    let cfg = cfg.cgroup(Delegation::None).worker_exe(support::BIN).log_dir(support::test_logs());
    let cfg = if nix::unistd::geteuid().is_root() { cfg } else { cfg.as_worker_uid() };
    ProcessExecutor::new(cfg).expect("the process rung sets up")
}

/// What the process rung left of `worker`'s attempts: their dirs under its attempts dir.
fn process_dirs(rung: &ProcessExecutor, worker: &str) -> usize {
    let prefix = &worker[..worker.len().min(40)];
    std::fs::read_dir(rung.attempts_dir())
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(prefix)).count())
        .unwrap_or(0)
}

#[tokio::test]
async fn the_front_is_one_rule_on_the_process_rung() {
    let w = support::worker("front-process");
    let rung = process_rung(ProcessConfig::default());
    let request = |out: &Path| Request::command("job", ["true"], out).worker(&w);
    let made = async || process_dirs(&rung, &w);
    one_rule_for_every_rung(&rung, request, made).await;
}

/// As root the process rung makes a cgroup per attempt: its census names memory, CPU and
/// pids, and an attempt that requires them runs.
#[tokio::test]
async fn the_front_is_one_rule_on_the_process_rung_with_cgroups() {
    if !nix::unistd::geteuid().is_root() {
        support::skip("the process rung makes cgroups only as root".to_owned());
        return;
    }
    let w = support::worker("front-process-cg");
    let cfg = ProcessConfig::default().worker_exe(support::BIN).log_dir(support::test_logs());
    let rung = ProcessExecutor::new(cfg.cgroup(Delegation::Auto)).expect("the process rung sets up");
    assert!(rung.enforces().contains(&"memory"), "{:?}", rung.enforces());
    let request = |out: &Path| Request::command("job", ["true"], out).worker(&w);
    let made = async || process_dirs(&rung, &w);
    one_rule_for_every_rung(&rung, request, made).await;
}

#[tokio::test]
async fn the_front_is_one_rule_on_the_container_rung() {
    let Some((docker, image)) = support::setup().await else { return };
    let w = support::worker("front-container");
    let rung = support::rung().await;
    let request = |out: &Path| support::sh(&image, &w, out, "true");
    let made = async || {
        let (c, v) = support::labelled(&docker, &w).await;
        c.len() + v.len()
    };
    one_rule_for_every_rung(&rung, request, made).await;
}

/// A too-large input dir is refused at prepare on every rung: on the process rung before a
/// uid is leased or a dir is made (it was refused only after both, issue 42).
#[tokio::test]
async fn a_process_rung_refuses_inputs_above_its_limit_before_it_makes_anything() {
    let w = support::worker("front-inputs");
    let mut cfg = ProcessConfig::default();
    cfg.max_input_bytes = 1024;
    let rung = Arc::new(process_rung(cfg));
    let inputs = tempfile::tempdir().unwrap();
    std::fs::write(inputs.path().join("big"), vec![1u8; 4096]).unwrap();
    let out = tempfile::tempdir().unwrap();
    let req = Request::command("job", ["true"], out.path()).worker(&w).input_dir(inputs.path());
    let err = rung.run(&req, CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, LaunchError::InputTooLarge { bytes: 4096, limit: 1024 }), "{err:?}");
    assert_eq!(process_dirs(&rung, &w), 0, "no attempt dir was made");
    rung.close().await;
}

/// `stevedore run --require-enforced`: what the rung did not apply ends the run before the
/// command runs, with docker's 126 and the reason said; an unknown name is a usage error.
#[test]
fn the_command_refuses_to_run_what_the_rung_would_not_enforce() {
    let t = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        std::process::Command::new(support::BIN)
            .args(["run", "--rung", "process", "--output"])
            .arg(t.path().join("o"))
            .args(extra)
            .args(["--", "sh", "-c", "echo RAN"])
            .output()
            .unwrap()
    };
    let o = run(&["--require-enforced", "network"]);
    assert_eq!(o.status.code(), Some(126), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("RAN"), "the command never ran");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not_enforced") && err.contains("network"), "{err}");
    let o = run(&["--require-enforced", "quota"]);
    assert_eq!(o.status.code(), Some(125), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("\"quota\""));
}
