//! The `stevedore` command with profiles, published ports, the top-level Dockerfile and a
//! smoke on an engine that has never seen this binary, against the real engine.

use crate::support;

use support::BIN;

use bollard::query_parameters::ListContainersOptionsBuilder;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn outcome(out: &Output) -> serde_json::Value {
    let s = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(s.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {s}\nstderr: {}", String::from_utf8_lossy(&out.stderr)))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `stevedore --config FILE --profile NAME ARGS...`.
fn with_profile(file: &Path, profile: &str) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--config").arg(file).args(["--profile", profile]);
    c
}

#[test]
fn an_unknown_key_names_the_key_and_its_line() {
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("profiles.toml");
    std::fs::write(&file, "[profiles.dev]\nnetwork = \"none\"\n\nmemroy = \"1g\"\n").unwrap();
    let out = with_profile(&file, "dev").arg("census").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("memroy") && err.contains("line 4"), "{err}");
}

#[test]
fn a_request_cannot_turn_on_a_network_its_profile_forbids() {
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("profiles.toml");
    std::fs::write(&file, "[profiles.locked]\nnetwork = \"none\"\n").unwrap();
    let out = with_profile(&file, "locked")
        .args(["run", "--outcome", "-", "-q", "--image", support::BUSYBOX_IMAGE, "--network", "bridge", "--output"])
        .arg(t.path().join("out"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(r#"profile "locked" forbids network mode "bridge""#), "{err}");
    assert!(!t.path().join("out").exists(), "refused before anything was made");
}

#[tokio::test]
async fn profile_env_layers_secrets_and_ceilings() {
    let Some(docker) = support::engine().await else { return };
    let busybox = support::busybox_image(&docker).await;
    // An image with ENV, so that every layer has something to override.
    let image = format!("stevedore-test/seven-env-{:08x}:1", rand::random::<u32>());
    let dockerfile = format!("FROM {busybox}\nENV A=image B=image C=image\nLABEL {}=true\n", support::TEST_LABEL);
    let context = support::tar_of(&[("Dockerfile", 0o644, dockerfile.as_bytes())]);
    stevedore::image::build_image_from_dir_tar(support::seam().await, &image, context).await.unwrap();

    let t = tempfile::tempdir().unwrap();
    let secret = format!("s3cr3t-{:016x}", rand::random::<u64>());
    std::fs::write(t.path().join("token"), format!("{secret}\n")).unwrap();
    // The command compares against its input, so the secret is in no argv either.
    std::fs::create_dir(t.path().join("in")).unwrap();
    std::fs::write(t.path().join("in/expected"), &secret).unwrap();
    let file = t.path().join("profiles.toml");
    std::fs::write(
        &file,
        format!(
            "[profiles.dev]\nenv = {{ B = \"profile\", C = \"profile\" }}\nenv_files = {{ SECRET = {:?} }}\n\
             ceilings = {{ memory = \"64m\", pids = 100 }}\n",
            t.path().join("token").display().to_string()
        ),
    )
    .unwrap();
    let w = support::worker("profile-env");
    let out = with_profile(&file, "dev")
        .args(["run", "--outcome", "-", "--worker", &w, "--image", &image, "--memory", "256m", "--pids", "50"])
        .args(["-e", "C=request", "-e", "STEVEDORE_ATTEMPT=99", "--input"])
        .arg(t.path().join("in"))
        .arg("--logs")
        .arg(t.path().join("logs"))
        .arg("--output")
        .arg(t.path().join("out"))
        .args([
            "--",
            "sh",
            "-c",
            r#"echo "$A $B $C $STEVEDORE_ATTEMPT" > /out/env; echo to-stdout; echo to-stderr >&2; [ "$SECRET" = "$(cat /in/expected)" ]"#,
        ])
        .output()
        .unwrap();
    support::remove_image(&docker, &image).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let v = outcome(&out);
    assert_eq!(v["status"], "ok", "the command saw the secret: {v}");
    assert_eq!(std::fs::read_to_string(t.path().join("out/env")).unwrap(), "image profile request 1\n");

    let overrides: std::collections::BTreeMap<String, (String, Vec<String>)> = v["evidence"]["env_overrides"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let overrode = o["overrode"].as_array().unwrap().iter().map(|l| l.as_str().unwrap().to_owned()).collect();
            (o["key"].as_str().unwrap().to_owned(), (o["origin"].as_str().unwrap().to_owned(), overrode))
        })
        .collect();
    assert_eq!(overrides["B"], ("profile".to_owned(), vec!["image".to_owned()]), "{v}");
    assert_eq!(overrides["C"], ("request".to_owned(), vec!["image".to_owned(), "profile".to_owned()]), "{v}");
    assert_eq!(overrides["STEVEDORE_ATTEMPT"], ("protocol".to_owned(), vec!["request".to_owned()]), "{v}");
    assert!(!overrides.contains_key("A"), "only overridden keys are recorded: {v}");

    // Only what was asked above a ceiling is narrowed, and the evidence says from what to what.
    let narrowed = v["evidence"]["limits_narrowed"].as_array().unwrap();
    assert_eq!(narrowed.len(), 1, "{v}");
    assert_eq!(narrowed[0]["key"], "memory");
    assert_eq!(narrowed[0]["from"], 256u64 << 20);
    assert_eq!(narrowed[0]["to"], 64u64 << 20);

    // The secret is nowhere in the evidence, the log files or stevedore's own output.
    let mut logs = String::new();
    for s in ["stdout", "stderr"] {
        let path = v["evidence"]["logs"][s]["path"].as_str().unwrap();
        logs.push_str(&std::fs::read_to_string(path).unwrap());
    }
    assert!(logs.contains("to-stdout") && logs.contains("to-stderr"), "the logs were read: {logs}");
    for (what, text) in [("outcome", String::from_utf8_lossy(&out.stdout).into_owned()), ("stderr", stderr(&out))] {
        assert!(!text.contains(&secret), "the secret appears in the {what}: {text}");
    }
    assert!(!logs.contains(&secret), "the secret appears in the logs");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn an_explicit_host_port_that_is_taken_fails_naming_port_and_profile() {
    let Some(docker) = support::engine().await else { return };
    let image = support::busybox_image(&docker).await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("profiles.toml");
    std::fs::write(&file, format!("[profiles.web]\nnetwork = \"bridge\"\nports = {{ \"8080\" = {port} }}\n")).unwrap();
    let w = support::worker("port-taken");
    // A runtime dir of its own: what the failed launch leaves in stevedore's private dir is
    // in sight.
    let runtime = tempfile::tempdir().unwrap();
    let out = with_profile(&file, "web")
        .args(["run", "--outcome", "-", "-q", "--worker", &w, "--image", &image, "--output"])
        .arg(t.path().join("out"))
        .args(["--", "true"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "a launch error, never a fallback: {}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&format!("host port {port} (container port 8080) of profile \"web\" is taken")), "{err}");
    assert!(out.stdout.is_empty(), "no outcome for an attempt that never ran");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    let logs = runtime.path().join("stevedore/logs");
    let left: Vec<_> = std::fs::read_dir(&logs).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "neither the captures nor the worker's dir stay: {left:?}");
    drop(taken);
}

#[tokio::test]
async fn an_ephemeral_port_is_published_on_localhost_and_reported() {
    let Some(docker) = support::engine().await else { return };
    let image = support::busybox_image(&docker).await;
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("profiles.toml");
    std::fs::write(&file, "[profiles.web]\nnetwork = \"bridge\"\nports = { \"8080\" = 0 }\n").unwrap();
    let w = support::worker("port-ephemeral");
    // `ready` only once the server listens, so the test's connection cannot race it.
    let script = r#"echo hello | nc -l -p 8080 & until netstat -ltn | grep -q ':8080 '; do usleep 10000; done; echo ready >&2; wait"#;
    let mut child = with_profile(&file, "web")
        .args(["run", "--outcome", "-", "--worker", &w, "--image", &image, "--timeout", "60s", "--output"])
        .arg(t.path().join("out"))
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "stevedore ended before the server was ready: {seen}");
        seen.push_str(&line);
        if line.trim() == "ready" {
            break;
        }
    }
    let filters = stevedore::container::labels::worker_filter(&w);
    let containers =
        docker.list_containers(Some(ListContainersOptionsBuilder::default().filters(&filters).build())).await.unwrap();
    assert_eq!(containers.len(), 1, "{containers:?}");
    let published = containers[0].ports.clone().unwrap_or_default();
    let binding = published.iter().find(|p| p.private_port == 8080 && p.public_port.is_some()).expect("8080 published");
    assert_eq!(binding.ip.as_deref(), Some("127.0.0.1"), "published on localhost only: {published:?}");
    let host_port = binding.public_port.unwrap();

    let mut conn = std::net::TcpStream::connect(("127.0.0.1", host_port)).unwrap();
    let mut got = String::new();
    BufReader::new(&mut conn).read_line(&mut got).unwrap();
    assert_eq!(got, "hello\n");
    drop(conn);

    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{seen}{rest}");
    let v = outcome(&out);
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["evidence"]["ports"]["8080/tcp"], format!("127.0.0.1:{host_port}"), "{v}");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn smoke_images_itself_on_an_engine_without_its_image() {
    let Some(docker) = support::engine().await else { return };
    // One more byte gives a binary whose worker image this engine cannot have yet, without
    // touching images that other tests use meanwhile.
    let t = tempfile::tempdir().unwrap();
    let exe = t.path().join("stevedore");
    let mut bytes = std::fs::read(BIN).unwrap();
    bytes.push(0);
    std::fs::write(&exe, &bytes).unwrap();
    std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let digest = support::sha256_of(&exe).unwrap();
    let tag = format!("stevedore-worker:{}", &digest[..16]);
    assert!(docker.inspect_image(&tag).await.is_err(), "{tag} must not exist yet");

    // Its tools bundle and logs go to the temp dir, which is removed with them.
    let out = Command::new(&exe).arg("smoke").env("TMPDIR", t.path()).output().unwrap();
    let had_image = docker.inspect_image(&tag).await.is_ok();
    support::remove_image(&docker, &tag).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert_eq!(text.lines().last(), Some("drain: ok"), "{text}");
    assert!(had_image, "smoke packed {tag}");
}

#[tokio::test]
async fn the_top_level_dockerfile_builds_a_worker_image() {
    let Some(docker) = support::engine().await else { return };
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    // The documented steps, in a context of its own: the Dockerfile, .dockerignore and the
    // rootfs where the Dockerfile expects it.
    let t = tempfile::tempdir().unwrap();
    for f in ["Dockerfile", ".dockerignore"] {
        std::fs::copy(root.join(f), t.path().join(f)).unwrap();
    }
    let rootfs = t.path().join("target/worker-rootfs");
    let out = Command::new(BIN).args(["image", "rootfs", "--exe", BIN, "--dir"]).arg(&rootfs).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let args = std::fs::read_to_string(t.path().join("target/worker-rootfs.args")).unwrap();
    let fingerprint = stevedore::handlers::builtin().fingerprint();
    assert_eq!(args.trim(), format!("--build-arg FINGERPRINT={fingerprint}"));
    std::fs::write(t.path().join("target/unrelated"), b"kept out of the context by .dockerignore").unwrap();

    let tag = format!("stevedore-test/seven-dockerfile-{:08x}:1", rand::random::<u32>());
    let built = Command::new("docker")
        .env("DOCKER_BUILDKIT", "0")
        .args(["build", "-q", "-t", &tag])
        .args(args.split_whitespace())
        .arg(t.path())
        .output()
        .expect("the docker CLI");
    let result = async {
        assert!(built.status.success(), "docker build: {}", stderr(&built));
        let config = docker.inspect_image(&tag).await.unwrap().config.unwrap();
        let labels = config.labels.unwrap_or_default();
        assert_eq!(labels["dev.stevedore.fingerprint"], fingerprint);
        assert_eq!(config.user.as_deref(), Some("65532:65532"));
        let ran = support::run_container(&docker, &tag, None, &["--version"]).await;
        assert_eq!(ran.code, 0, "{}", ran.output);
        assert!(ran.output.starts_with("stevedore "), "{}", ran.output);
        // And stevedore runs its handlers from it.
        let w = support::worker("dockerfile");
        let out = Command::new(BIN)
            .args([
                "run",
                "--outcome",
                "-",
                "-q",
                "--worker",
                &w,
                "--image",
                &tag,
                "--handler",
                "echo",
                "--payload",
                "hi",
            ])
            .args(["--fingerprint", &fingerprint, "--output"])
            .arg(t.path().join("out"))
            .output()
            .unwrap();
        assert_eq!(outcome(&out)["status"], "ok", "{}", stderr(&out));
        assert_eq!(std::fs::read(t.path().join("out/payload")).unwrap(), b"hi");
    };
    let r = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(result)).await;
    support::remove_image(&docker, &tag).await;
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
}
