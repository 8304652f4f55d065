//! Handlers by re-exec in a packed worker image (the `stevedore` binary, dynamically
//! linked, in a `FROM scratch` image): every handler outcome against the real engine.

mod support;

use bollard::Docker;
use std::path::Path;
use std::time::{Duration, Instant};
use stevedore::container::{ContainerConfig, ContainerExecutor};
use stevedore::image::{PackSpec, ensure_image};
use stevedore::{Executor, LaunchError, Outcome, Request, Status};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

const BIN: &str = env!("CARGO_BIN_EXE_stevedore");
/// The worker image: the stevedore binary with its real handler-set fingerprint.
const WORKER: &str = "stevedore-test/worker:latest";
/// The same binary, but its image claims a handler set it does not have.
const LIAR: &str = "stevedore-test/worker-liar:latest";
const LIAR_FINGERPRINT: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

async fn pack(docker: &Docker, tag: &str, fingerprint: String) -> String {
    let mut spec = PackSpec::new(BIN, tag);
    spec.fingerprint = Some(fingerprint);
    spec.labels.insert(support::TEST_LABEL.to_owned(), "true".to_owned());
    ensure_image(docker, &spec).await.unwrap_or_else(|e| panic!("packing {tag}: {e}"));
    tag.to_owned()
}

async fn worker_image(docker: &Docker) -> String {
    static IMAGE: OnceCell<String> = OnceCell::const_new();
    IMAGE.get_or_init(|| pack(docker, WORKER, stevedore::handlers::builtin().fingerprint())).await.clone()
}

async fn rung(image: &str) -> ContainerExecutor {
    let cfg =
        ContainerConfig { init_exe: Some(BIN.into()), worker_image: Some(image.to_owned()), ..Default::default() };
    ContainerExecutor::connect(cfg, stevedore::contract::incarnation::mint()).await.expect("connect")
}

fn handler(worker: &str, out: &Path, name: &str, payload: &str) -> Request {
    Request::handler("job", name, out).worker(worker).payload(payload.as_bytes().to_vec())
}

async fn run(rung: &ContainerExecutor, req: &Request) -> Outcome {
    rung.run(req, CancellationToken::new()).await.expect("the attempt runs")
}

#[tokio::test]
async fn outcomes_of_every_kind_of_handler() {
    let Some(docker) = support::engine().await else { return };
    let rung = rung(&worker_image(&docker).await).await;
    let w = support::worker("handlers");
    let t = tempfile::tempdir().unwrap();
    let fp = stevedore::handlers::builtin().fingerprint();

    let o = run(&rung, &handler(&w, &t.path().join("ok"), "write-outputs", "").fingerprint(&fp)).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let names: Vec<_> = o.outputs.iter().map(|f| (f.name.as_str(), f.size)).collect();
    assert_eq!(names, [("a.txt", 6), ("dir/b.json", 7)]);
    // sha256 of "alpha\n".
    assert_eq!(o.outputs[0].hash, format!("sha256:{}", sha256_hex(b"alpha\n")));
    assert_eq!(std::fs::read(t.path().join("ok/dir/b.json")).unwrap(), br#"{"b":1}"#);

    let o = run(&rung, &handler(&w, &t.path().join("err"), "fail", "the disk is on fire")).await;
    assert_eq!((o.status, o.permanent), (Status::HandlerError, false), "{}", o.to_json());
    assert_eq!(o.handler_error, "the disk is on fire");

    let o = run(&rung, &handler(&w, &t.path().join("perm"), "fail-permanent", "bad payload")).await;
    assert_eq!((o.status, o.permanent), (Status::HandlerError, true), "{}", o.to_json());
    assert_eq!(o.handler_error, "bad payload");

    let o = run(&rung, &handler(&w, &t.path().join("panic"), "panic", "oh no")).await;
    assert_eq!((o.status, o.reason.as_deref()), (Status::Killed, Some("panicked")), "{}", o.to_json());
    assert!(o.handler_error.contains("oh no"), "{}", o.handler_error);

    let o = run(&rung, &handler(&w, &t.path().join("unknown"), "no-such-handler", "")).await;
    assert_eq!((o.status, o.permanent), (Status::LaunchFailed, true), "{}", o.to_json());
    assert!(o.handler_error.contains("no-such-handler"), "{}", o.handler_error);

    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn fingerprint_mismatch_before_start_and_in_the_sandbox() {
    let Some(docker) = support::engine().await else { return };
    let w = support::worker("fingerprint");
    let t = tempfile::tempdir().unwrap();
    let actual = stevedore::handlers::builtin().fingerprint();

    // Seen on the image's label: a launch error, nothing created.
    let rung_ = rung(&worker_image(&docker).await).await;
    let err = rung_
        .run(&handler(&w, &t.path().join("a"), "true", "").fingerprint(LIAR_FINGERPRINT), CancellationToken::new())
        .await
        .expect_err("a mismatch on the label is a launch error");
    assert!(matches!(err, LaunchError::FingerprintMismatch { .. }), "{err:?}");
    assert!(err.is_permanent());
    let text = err.to_string();
    assert!(text.contains(LIAR_FINGERPRINT) && text.contains(&actual), "{text}");

    // The label lies: the sandbox checks the binary's own handler set.
    let liar = pack(&docker, LIAR, LIAR_FINGERPRINT.to_owned()).await;
    let rung_ = rung(&liar).await;
    let o = run(&rung_, &handler(&w, &t.path().join("b"), "true", "").fingerprint(LIAR_FINGERPRINT)).await;
    assert_eq!((o.status, o.permanent), (Status::LaunchFailed, true), "{}", o.to_json());
    assert!(o.handler_error.contains(LIAR_FINGERPRINT) && o.handler_error.contains(&actual), "{}", o.handler_error);
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn a_handler_that_ignores_sigterm_is_killed_after_the_grace() {
    let Some(docker) = support::engine().await else { return };
    let rung = rung(&worker_image(&docker).await).await;
    let w = support::worker("ignore-term");
    let t = tempfile::tempdir().unwrap();
    let (deadline, grace) = (Duration::from_secs(2), Duration::from_secs(1));
    let mut r = handler(&w, &t.path().join("o"), "ignore-cancel", "60000").timeout(deadline);
    r.policy = r.policy.clone().with_grace(grace);
    let start = Instant::now();
    let o = run(&rung, &r).await;
    let took = start.elapsed();
    assert_eq!(
        (o.status, o.reason.as_deref(), o.signal),
        (Status::Timeout, Some("deadline"), Some(9)),
        "{}",
        o.to_json()
    );
    // deadline + grace + the kill margin and engine calls, far below the handler's 60 s.
    assert!(took < deadline + grace + Duration::from_secs(8), "took {took:?}");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn a_cooperative_handler_is_cancelled() {
    let Some(docker) = support::engine().await else { return };
    let rung = rung(&worker_image(&docker).await).await;
    let w = support::worker("cancel-handler");
    let t = tempfile::tempdir().unwrap();
    let token = CancellationToken::new();
    let r = handler(&w, &t.path().join("o"), "sleep", "60000");
    let run = rung.run(&r, token.clone());
    tokio::pin!(run);
    // Cancel once the container exists: the handler then sees SIGTERM through its context.
    let o = loop {
        tokio::select! {
            o = &mut run => break o.expect("the attempt runs"),
            () = tokio::time::sleep(Duration::from_millis(100)), if !token.is_cancelled() => {
                if !support::labelled(&docker, &w).await.0.is_empty() {
                    token.cancel();
                }
            }
        }
    };
    assert_eq!((o.status, o.reason.as_deref()), (Status::Killed, Some("cancelled")), "{}", o.to_json());
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(data))
}
