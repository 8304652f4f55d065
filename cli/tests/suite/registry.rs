//! Pulls from a real registry (issue 28): Debian's `docker-registry` on 127.0.0.1 (the engine
//! takes plain HTTP on loopback), behind basic auth. `stevedore run` pulls what is missing,
//! with the credentials the docker CLI would use (`DOCKER_CONFIG`'s `auths`, a credential
//! helper), pulls again under `--pull always`, is refused without credentials, and never
//! shows the secret. Only against a local engine: a remote one cannot reach this loopback.

use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use support::{BIN, BUSYBOX_IMAGE, setup, worker};

/// A registry of this test's own, stopped (by its pid) when dropped.
struct Registry {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where a needed program is, or `None` after saying why the test is skipped (under
/// `CI=true` a missing one fails: `.ci/run` installs them).
fn program(name: &str, package: &str) -> Option<PathBuf> {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        let why = format!("{name} missing (apt-get install {package})");
        assert!(!support::in_ci(), "CI=true: {why}");
        support::skip(why);
    }
    found
}

impl Registry {
    /// Starts one on a free loopback port that lets `user` in with `password`.
    fn start(user: &str, password: &str) -> Option<Self> {
        let registry = program("docker-registry", "docker-registry")?;
        let htpasswd = program("htpasswd", "apache2-utils")?;
        let dir = tempfile::tempdir().unwrap();
        let line = Command::new(htpasswd).args(["-Bbn", user, password]).output().unwrap();
        assert!(line.status.success(), "htpasswd: {}", String::from_utf8_lossy(&line.stderr));
        std::fs::write(dir.path().join("htpasswd"), &line.stdout).unwrap();
        // A port nobody holds now; the registry takes it a moment later.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = format!("127.0.0.1:{port}");
        let config = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\nauth:\n  htpasswd:\n    realm: stevedore-test\n    path: {}\n",
            dir.path().join("data").display(),
            dir.path().join("htpasswd").display()
        );
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        let mut child = Command::new(registry)
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Ready once it says it listens (its log is on stderr); it keeps logging there.
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut said = Vec::new();
        loop {
            match lines.next() {
                Some(Ok(l)) if l.contains("listening on") => break,
                Some(Ok(l)) => said.push(l),
                _ => panic!("the registry ended before it listened: {}", said.join("\n")),
            }
        }
        std::thread::spawn(move || lines.for_each(drop));
        Some(Self { child, addr, _dir: dir })
    }
}

fn docker(config: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new("docker")
        .arg("--config")
        .arg(config)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn run_with_config(config: &Path, path: Option<&Path>, args: &[String]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("run").args(args).env("DOCKER_CONFIG", config);
    if let Some(p) = path {
        let mut all = vec![p.to_owned()];
        all.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
        cmd.env("PATH", std::env::join_paths(all).unwrap());
    }
    cmd.output().unwrap()
}

#[tokio::test]
async fn a_private_image_is_pulled_with_the_docker_clis_credentials_and_never_shown() {
    let Some(_) = setup().await else { return };
    if std::env::var("DOCKER_HOST").is_ok_and(|h| !h.starts_with("unix://")) {
        support::skip("a remote engine cannot reach this host's loopback registry");
        return;
    }
    let password = format!("pw-{:016x}", rand::random::<u64>());
    let Some(registry) = Registry::start("stevedore-test", &password) else { return };
    let t = tempfile::tempdir().unwrap();
    let (logged_in, anonymous) = (t.path().join("logged-in"), t.path().join("anonymous"));
    std::fs::create_dir_all(&anonymous).unwrap();
    let login =
        docker(&logged_in, &["login", &registry.addr, "-u", "stevedore-test", "--password-stdin"], password.as_bytes());
    assert!(login.status.success(), "docker login: {}", String::from_utf8_lossy(&login.stderr));
    let image = format!("{}/stevedore-test/pulled-{:016x}:v1", registry.addr, rand::random::<u64>());
    let tag = Command::new("docker").args(["tag", BUSYBOX_IMAGE, &image]).output().unwrap();
    assert!(tag.status.success());
    let push = docker(&logged_in, &["push", &image], b"");
    assert!(push.status.success(), "docker push: {}", String::from_utf8_lossy(&push.stderr));
    let untag = || {
        // Only the tag goes: the image is the test busybox's.
        let _ = Command::new("docker").args(["rmi", &image]).output();
    };
    untag();
    let w = worker("registry");
    let out = |n: &str| t.path().join(n).display().to_string();
    let args = |o: &str, pull: &'static str| -> Vec<String> {
        let mut a = vec!["--worker".into(), w.clone(), "--image".into(), image.clone(), "--output".into(), out(o)];
        if !pull.is_empty() {
            a.extend(["--pull".into(), pull.into()]);
        }
        a.extend(["--outcome".into(), "-".into(), "--".into(), "sh".into(), "-c".into(), "echo pulled >&2".into()]);
        a
    };
    let shown = |o: &Output| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));

    // Without credentials the registry refuses, and the run says it could not pull.
    let o = run_with_config(&anonymous, None, &args("anon", ""));
    assert_eq!(o.status.code(), Some(125), "{}", shown(&o));
    assert!(
        shown(&o).contains(&format!("pulling it failed with no credentials (none for {}", registry.addr)),
        "{}",
        shown(&o)
    );

    // With the login's `auths`: pulled, run, and the secret is nowhere in what it printed.
    for (what, pull) in [("missing", ""), ("always", "always")] {
        let o = run_with_config(&logged_in, None, &args(what, pull));
        assert_eq!(o.status.code(), Some(0), "{what}: {}", shown(&o));
        assert!(shown(&o).contains("pulled\n"), "{what}: {}", shown(&o));
        assert!(!shown(&o).contains(&password), "{what}: the secret was shown");
        if what == "missing" {
            // Now local: `never` runs it without asking the registry.
            let o = run_with_config(&anonymous, None, &args("never", "never"));
            assert_eq!(o.status.code(), Some(0), "never: {}", shown(&o));
        }
    }
    untag();

    // A credential helper (`credsStore`) gives them instead, as the docker CLI's would.
    let (helped, bin) = (t.path().join("helped"), t.path().join("bin"));
    std::fs::create_dir_all(&helped).unwrap();
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(helped.join("config.json"), r#"{"credsStore": "stevedore-test"}"#).unwrap();
    let helper = bin.join("docker-credential-stevedore-test");
    std::fs::write(
        &helper,
        format!(
            "#!/bin/sh\nread server\n[ \"$server\" = {} ] || exit 1\necho '{{\"Username\":\"stevedore-test\",\"Secret\":\"{password}\"}}'\n",
            registry.addr
        ),
    )
    .unwrap();
    std::fs::set_permissions(&helper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let o = run_with_config(&helped, Some(&bin), &args("helper", ""));
    assert_eq!(o.status.code(), Some(0), "helper: {}", shown(&o));
    assert!(!shown(&o).contains(&password), "helper: the secret was shown");
    untag();
    let (containers, volumes) = support::labelled(&support::engine().await.unwrap(), &w).await;
    assert!(containers.is_empty() && volumes.is_empty(), "left: {containers:?} {volumes:?}");
}
