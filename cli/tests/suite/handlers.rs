//! Handlers by re-exec in a packed worker image (the `stevedore` binary, dynamically
//! linked, in a `FROM scratch` image): every handler outcome against the real engine.

use crate::support;

use support::run;

use std::path::Path;
use std::time::{Duration, Instant};
use stevedore::container::{ContainerConfig, ContainerExecutor};
use stevedore::{Executor, LaunchError, Request, Status};
use tokio_util::sync::CancellationToken;

/// The same binary, but its image claims a handler set it does not have.
const LIAR: &str = "stevedore-test/worker-liar:latest";
const LIAR_FINGERPRINT: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

async fn rung(image: &str) -> ContainerExecutor {
    support::rung_with(ContainerConfig::default().worker_image(image)).await
}

fn handler(worker: &str, out: &Path, name: &str, payload: &str) -> Request {
    Request::handler("job", name, out).worker(worker).payload(payload.as_bytes().to_vec())
}

#[tokio::test]
async fn outcomes_of_every_kind_of_handler() {
    let Some(docker) = support::engine().await else { return };
    let rung = rung(&support::worker_image().await).await;
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
    assert_eq!((o.status, o.reason.map(|r| r.as_str())), (Status::Killed, Some("panicked")), "{}", o.to_json());
    assert!(o.handler_error.contains("oh no"), "{}", o.handler_error);

    let o = run(&rung, &handler(&w, &t.path().join("unknown"), "no-such-handler", "")).await;
    assert_eq!((o.status, o.permanent), (Status::LaunchFailed, true), "{}", o.to_json());
    assert!(o.handler_error.contains("no-such-handler"), "{}", o.handler_error);

    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn fingerprint_mismatch_before_start_and_in_the_sandbox() {
    let Some(docker) = support::engine().await else { return };
    let w = support::worker("fingerprint");
    let t = tempfile::tempdir().unwrap();
    let actual = stevedore::handlers::builtin().fingerprint();

    // Seen on the image's label: a launch error, nothing created.
    let rung_ = rung(&support::worker_image().await).await;
    let err = rung_
        .run(&handler(&w, &t.path().join("a"), "true", "").fingerprint(LIAR_FINGERPRINT), CancellationToken::new())
        .await
        .expect_err("a mismatch on the label is a launch error");
    assert!(matches!(err, LaunchError::FingerprintMismatch { .. }), "{err:?}");
    assert!(err.is_permanent());
    let text = err.to_string();
    assert!(text.contains(LIAR_FINGERPRINT) && text.contains(&actual), "{text}");
    rung_.close().await;

    // The label lies: the sandbox checks the binary's own handler set.
    let liar = support::pack_worker(LIAR, LIAR_FINGERPRINT.to_owned()).await;
    let rung_ = rung(&liar).await;
    let o = run(&rung_, &handler(&w, &t.path().join("b"), "true", "").fingerprint(LIAR_FINGERPRINT)).await;
    assert_eq!((o.status, o.permanent), (Status::LaunchFailed, true), "{}", o.to_json());
    assert!(o.handler_error.contains(LIAR_FINGERPRINT) && o.handler_error.contains(&actual), "{}", o.handler_error);
    rung_.close().await;
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn a_handler_that_ignores_sigterm_is_killed_after_the_grace() {
    let Some(docker) = support::engine().await else { return };
    let rung = rung(&support::worker_image().await).await;
    let w = support::worker("ignore-term");
    let t = tempfile::tempdir().unwrap();
    let (deadline, grace) = (Duration::from_secs(2), Duration::from_secs(1));
    let mut r = handler(&w, &t.path().join("o"), "ignore-cancel", "60000").timeout(deadline);
    r.policy = r.policy.clone().with_grace(grace);
    let start = Instant::now();
    let o = run(&rung, &r).await;
    let took = start.elapsed();
    assert_eq!(
        (o.status, o.reason.map(|r| r.as_str()), o.signal),
        (Status::Timeout, Some("deadline"), Some(9)),
        "{}",
        o.to_json()
    );
    // deadline + grace + the kill margin and engine calls, far below the handler's 60 s.
    assert!(took < deadline + grace + Duration::from_secs(8), "took {took:?}");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn cancelling_a_handler_attempt_is_killed_cancelled() {
    use bollard::query_parameters::EventsOptionsBuilder;
    use futures_util::StreamExt;
    let Some(docker) = support::engine().await else { return };
    let rung = rung(&support::worker_image().await).await;
    let w = support::worker("cancel-handler");
    let t = tempfile::tempdir().unwrap();
    // Cancel when the engine says the attempt's container started.
    let mut filters = stevedore::container::labels::worker_filter(&w);
    filters.insert("event".into(), vec!["start".to_owned()]);
    let mut started = docker.events(Some(EventsOptionsBuilder::new().filters(&filters).build()));
    let token = CancellationToken::new();
    let r = handler(&w, &t.path().join("o"), "sleep", "60000");
    let run = rung.run(&r, token.clone());
    tokio::pin!(run);
    let o = loop {
        tokio::select! {
            o = &mut run => break o.expect("the attempt runs"),
            Some(event) = started.next(), if !token.is_cancelled() => {
                event.expect("engine events");
                token.cancel();
            }
        }
    };
    assert!(token.is_cancelled(), "the attempt ended before its container started: {}", o.to_json());
    assert_eq!((o.status, o.reason.map(|r| r.as_str())), (Status::Killed, Some("cancelled")), "{}", o.to_json());
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(data))
}
