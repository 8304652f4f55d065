//! `stevedore run` for people (issue 14): the streams as `docker run`, the exit status as
//! shells expect, the outcome file, the flags people reach for, named caches, nothing left on
//! the host, and messages a person can act on. Each test runs the real command against the
//! real engine.

use crate::support;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use support::{BIN, BUSYBOX_IMAGE, setup, worker};
use tokio::sync::Mutex;

/// The tests that count images or host paths, and those that may pack an image (`--handler`,
/// the worker image), run alone among this file's tests: a count must see only its own runs.
static ALONE: Mutex<()> = Mutex::const_new(());

fn run(args: &[&str]) -> Output {
    Command::new(BIN).arg("run").args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn out_dir(t: &tempfile::TempDir, name: &str) -> String {
    t.path().join(name).display().to_string()
}

#[tokio::test]
async fn the_streams_go_where_docker_run_sends_them() {
    let Some(_) = setup().await else { return };
    let _g = ALONE.lock().await;
    let t = tempfile::tempdir().unwrap();
    let w = worker("cli-streams");
    // docker's word order: the image, then the command.
    let o = run(&["--worker", &w, "--output", &out_dir(&t, "o"), BUSYBOX_IMAGE, "sh", "-c", "echo out; echo err >&2"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(text(&o.stdout), "out\n", "the container's stdout is stevedore's, without a `--`");
    let err = text(&o.stderr);
    assert!(err.starts_with("err\n"), "{err}");
    let last = err.lines().last().unwrap();
    assert!(last.starts_with("stevedore: ok in "), "one human line at the end: {last}");

    // --outcome -: the JSON on stdout, the container's stdout on stderr.
    let o = run(&[
        "--worker",
        &w,
        "--image",
        BUSYBOX_IMAGE,
        "--output",
        &out_dir(&t, "p"),
        "--outcome",
        "-",
        "--",
        "echo",
        "x",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("only the Outcome on stdout");
    assert_eq!(v["status"], "ok");
    assert!(text(&o.stderr).starts_with("x\n"));

    // --quiet: neither the streams nor the line.
    let o = run(&[
        "-q",
        "--worker",
        &w,
        "--image",
        BUSYBOX_IMAGE,
        "--output",
        &out_dir(&t, "q"),
        "--",
        "sh",
        "-c",
        "echo a; echo b >&2",
    ]);
    assert_eq!((text(&o.stdout).as_str(), text(&o.stderr).as_str()), ("", ""));
    assert_eq!(support::labelled(&support::engine().await.unwrap(), &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn a_closed_stdout_ends_nothing_early_and_leaks_nothing() {
    let Some((docker, _)) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let w = worker("cli-pipe");
    let out = out_dir(&t, "o");
    let mut child = Command::new(BIN)
        .args(["run", "--worker", &w, "--image", BUSYBOX_IMAGE, "--output", &out, "--", "sh", "-c"])
        .arg("seq 1 300000; echo finished > /out/done")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // `| head -1`: one line, then the pipe closes.
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert_eq!(first, "1\n");
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(std::fs::read_to_string(Path::new(&out).join("done")).unwrap(), "finished\n", "the attempt finished");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn the_outcome_file_is_written_when_the_attempt_ran_and_never_left_stale() {
    let Some(_) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let w = worker("cli-outcome");
    let file = t.path().join("outcome.json");
    let f = file.display().to_string();
    let o = run(&[
        "--worker",
        &w,
        "--image",
        BUSYBOX_IMAGE,
        "--output",
        &out_dir(&t, "a"),
        "--outcome",
        &f,
        "--",
        "sh",
        "-c",
        "echo r > /out/r; exit 4",
    ]);
    assert_eq!(o.status.code(), Some(4));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!((v["status"].as_str(), v["exit_code"].as_i64()), (Some("handler_error"), Some(4)));
    assert_eq!(v["outputs"][0]["name"], "r");
    // A refusal (the output dir is not empty now): exit 125 and no outcome file at all.
    let o =
        run(&["--worker", &w, "--image", BUSYBOX_IMAGE, "--output", &out_dir(&t, "a"), "--outcome", &f, "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(!file.exists(), "a stale outcome is never left: {}", text(&o.stderr));
}

#[tokio::test]
async fn the_exit_status_follows_the_table() {
    let Some(_) = setup().await else { return };
    let _g = ALONE.lock().await;
    let t = tempfile::tempdir().unwrap();
    let w = worker("cli-exit");
    let mut n = 0;
    let mut code = |extra: &[&str], script: &str| {
        n += 1;
        let out = out_dir(&t, &format!("o{n}"));
        let mut args = vec!["-q", "--worker", &w, "--image", BUSYBOX_IMAGE, "--output", &out];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        run(&args).status.code()
    };
    assert_eq!(code(&[], "exit 0"), Some(0));
    assert_eq!(code(&[], "exit 3"), Some(3), "handler_error: the command's code");
    assert_eq!(code(&[], "kill -9 $$"), Some(137), "killed by signal 9: 128+9");
    assert_eq!(code(&[], "kill -15 $$"), Some(143), "killed by signal 15: 128+15");
    assert_eq!(code(&["--timeout", "1s", "--grace", "1s"], "sleep 30"), Some(124), "timeout");
    let oom = "x=$(head -c 100000000 /dev/zero | tr '\\0' a)";
    assert_eq!(code(&["--memory", "32m"], oom), Some(137), "oom_killed");
    assert_eq!(code(&["--exit-zero"], "exit 3"), Some(0), "--exit-zero: 0 whenever it ran");
    assert_eq!(code(&["--exit-status"], "exit 3"), Some(3), "--exit-status is accepted and changes nothing");
    let out = out_dir(&t, "nf");
    assert_eq!(
        run(&["-q", "--worker", &w, "--image", BUSYBOX_IMAGE, "--output", &out, "--", "/no/such"]).status.code(),
        Some(127)
    );
    let out = out_dir(&t, "ne");
    assert_eq!(
        run(&["-q", "--worker", &w, "--image", BUSYBOX_IMAGE, "--output", &out, "--", "/bin"]).status.code(),
        Some(126),
        "not executable"
    );
    let out = out_dir(&t, "ref");
    assert_eq!(run(&["-q", "--image", "no-such-image-here", "--output", &out, "--", "true"]).status.code(), Some(125));
    let out = out_dir(&t, "panic");
    let o = run(&["-q", "--worker", &w, "--handler", "panic", "--output", &out]);
    assert_eq!(o.status.code(), Some(101), "panicked: {}", text(&o.stderr));
    assert_eq!(support::labelled(&support::engine().await.unwrap(), &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn the_flags_people_reach_for() {
    let Some(_) = setup().await else { return };
    let _g = ALONE.lock().await;
    let t = tempfile::tempdir().unwrap();
    let w = worker("cli-flags");
    let env_file = t.path().join("env");
    std::fs::write(&env_file, "# a comment\nFROM_FILE=yes\n").unwrap();
    let out = out_dir(&t, "a");
    let o = Command::new(BIN)
        .args(["run", "--worker", &w, "--image", BUSYBOX_IMAGE, "--output", &out, "-e", "HOST_VAR", "--env-file"])
        .arg(&env_file)
        .args([
            "-w",
            "/tmp",
            "-u",
            "1234:1234",
            "--",
            "sh",
            "-c",
            "echo $HOST_VAR $FROM_FILE $HOME $(pwd) $(id -u) $(id -g)",
        ])
        .env("HOST_VAR", "from-host")
        .output()
        .unwrap();
    assert_eq!(text(&o.stdout), "from-host yes /tmp /tmp 1234 1234\n", "{}", text(&o.stderr));
    let out = out_dir(&t, "b");
    let o = run(&["--worker", &w, "--image", BUSYBOX_IMAGE, "--output", &out, "--entrypoint", "echo", "--", "hello"]);
    assert_eq!(text(&o.stdout), "hello\n");
    // An image whose ENTRYPOINT needs no argv: stevedore's own worker image runs it alone
    // (stevedore without arguments prints its usage and exits 125, a usage error).
    let image = support::worker_image().await;
    let out = out_dir(&t, "c");
    let o = run(&["--worker", &w, "--image", &image, "--output", &out]);
    assert_eq!(o.status.code(), Some(125), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("Usage"), "{}", text(&o.stderr));
    // Root only where a profile allows it.
    let out = out_dir(&t, "d");
    let o = run(&["--worker", &w, "--image", BUSYBOX_IMAGE, "--output", &out, "-u", "0", "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("allow_root = true"), "{}", text(&o.stderr));
    // A missing output dir is created, parents included.
    let deep = t.path().join("x/y/z");
    let o = run(&[
        "--worker",
        &w,
        "--image",
        BUSYBOX_IMAGE,
        "--output",
        &deep.display().to_string(),
        "--",
        "sh",
        "-c",
        "echo 1 > /out/f",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(deep.join("f").is_file());
}

#[tokio::test]
async fn a_published_port_is_refused_without_a_network_and_announced_with_one() {
    let Some(_) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let w = worker("cli-publish");
    let o = run(&["--worker", &w, "--image", BUSYBOX_IMAGE, "--output", &out_dir(&t, "a"), "-p", "8080", "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    let err = text(&o.stderr);
    assert!(err.contains("need a network") && err.contains("--network bridge"), "{err}");
    let mut child = Command::new(BIN)
        .args(["run", "--worker", &w, "--image", BUSYBOX_IMAGE, "--network", "bridge", "-p", "8080", "--output"])
        .arg(t.path().join("b"))
        .args(["--", "sh", "-c", "echo up"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let announced = lines.next().unwrap().unwrap();
    assert!(announced.starts_with("stevedore: port 8080/tcp published at 127.0.0.1:"), "{announced}");
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[tokio::test]
async fn a_named_cache_outlives_attempts_and_only_its_command_removes_it() {
    let Some((docker, _)) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let w = worker("cli-cache");
    let name = format!("c{:08x}", rand::random::<u32>());
    let cache = format!("{name}:/cache/deps");
    let o = run(&[
        "--worker",
        &w,
        "--image",
        BUSYBOX_IMAGE,
        "--output",
        &out_dir(&t, "a"),
        "--cache",
        &cache,
        "--",
        "sh",
        "-c",
        "echo kept > /cache/deps/k",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let f = t.path().join("o.json").display().to_string();
    let o = run(&[
        "--worker",
        &w,
        "--image",
        BUSYBOX_IMAGE,
        "--output",
        &out_dir(&t, "b"),
        "--cache",
        &cache,
        "--outcome",
        &f,
        "--",
        "cat",
        "/cache/deps/k",
    ]);
    assert_eq!(text(&o.stdout), "kept\n", "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
    assert_eq!(v["evidence"]["caches"][&name]["bytes"], 5, "its size is in the evidence: {v}");
    let volume = v["evidence"]["caches"][&name]["volume"].as_str().unwrap().to_owned();
    let ls = Command::new(BIN).args(["cache", "ls"]).output().unwrap();
    assert!(text(&ls.stdout).contains(&volume));
    // A worker's reclaim never removes a cache.
    let r = Command::new(BIN).args(["reclaim", "--worker", &w]).output().unwrap();
    assert!(r.status.success());
    assert!(docker.inspect_volume(&volume).await.is_ok(), "the cache survives reclaim");
    // Bad names and paths are refused before anything is made.
    for bad in ["../x:/c", "ok:/out/x", "ok:relative", "UPPER:/c"] {
        let o = run(&[
            "--worker",
            &w,
            "--image",
            BUSYBOX_IMAGE,
            "--output",
            &out_dir(&t, "c"),
            "--cache",
            bad,
            "--",
            "true",
        ]);
        assert_eq!(o.status.code(), Some(125), "{bad}: {}", text(&o.stderr));
    }
    let rm = Command::new(BIN).args(["cache", "rm", &name]).output().unwrap();
    assert!(rm.status.success(), "{}", text(&rm.stderr));
    assert!(docker.inspect_volume(&volume).await.is_err(), "removed");
}

#[tokio::test]
async fn the_outputs_of_timed_out_oom_killed_and_killed_attempts_are_listed() {
    let Some(_) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let w = worker("cli-stopped-out");
    let cases: [(&str, &[&str], &str, i32); 3] = [
        ("timeout", &["--timeout", "1s", "--grace", "1s"], "sleep 30", 124),
        ("oom_killed", &["--memory", "32m"], "x=$(head -c 100000000 /dev/zero | tr '\\0' a)", 137),
        ("killed", &[], "kill -9 $$", 137),
    ];
    for (i, (status, flags, then, exit)) in cases.into_iter().enumerate() {
        let out = out_dir(&t, &format!("o{i}"));
        let script = format!("echo partial > /out/junit.xml; {then}");
        let mut args = vec!["-q", "--worker", &w, "--image", BUSYBOX_IMAGE, "--output", &out, "--outcome", "-"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "sh", "-c", &script]);
        let o = run(&args);
        assert_eq!(o.status.code(), Some(exit), "{status}: {}", text(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!((v["status"].as_str(), v["outputs"][0]["name"].as_str()), (Some(status), Some("junit.xml")), "{v}");
        assert_eq!(std::fs::read_to_string(Path::new(&out).join("junit.xml")).unwrap(), "partial\n");
    }
}

#[tokio::test]
async fn a_run_leaves_no_volume_behind_not_even_its_init() {
    let Some((docker, _)) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let w = worker("cli-no-volume");
    let o = run(&[
        "-q",
        "--worker",
        &w,
        "--image",
        BUSYBOX_IMAGE,
        "--output",
        &out_dir(&t, "a"),
        "--outcome",
        "-",
        "--",
        "true",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // "host dir <path> (init sha256:<digest>)" on a local engine, else "volume <name> (...)".
    let init = v["evidence"]["init"].as_str().unwrap().to_owned();
    if let Some(volume) = init.strip_prefix("volume ").and_then(|r| r.split(' ').next()) {
        let err = docker.inspect_volume(volume).await.expect_err("the init's volume outlived the run");
        assert!(matches!(err, bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }), "{err}");
    } else {
        assert!(init.starts_with("host dir /"), "{init}");
    }
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

#[tokio::test]
async fn twenty_runs_leave_no_host_path_and_no_image() {
    let Some((docker, _)) = setup().await else { return };
    let _g = ALONE.lock().await;
    let t = tempfile::tempdir().unwrap();
    let runtime = tempfile::tempdir().unwrap();
    let images = |list: Vec<bollard::models::ImageSummary>| {
        list.into_iter().map(|i| i.id).collect::<std::collections::BTreeSet<_>>()
    };
    let before = images(docker.list_images(None::<bollard::query_parameters::ListImagesOptions>).await.unwrap());
    for i in 0..20 {
        let out = out_dir(&t, &format!("o{i}"));
        let o = Command::new(BIN)
            .args(["run", "-q", "--image", BUSYBOX_IMAGE, "--output", &out, "--", "sh", "-c", "echo hi; echo x >&2"])
            .env("XDG_RUNTIME_DIR", runtime.path())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    }
    let after = images(docker.list_images(None::<bollard::query_parameters::ListImagesOptions>).await.unwrap());
    assert_eq!(after.difference(&before).count(), 0, "no new image");
    let mut files = Vec::new();
    let mut dirs = 0;
    let mut stack = vec![runtime.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                dirs += 1;
                stack.push(e.path());
            } else {
                files.push(e.path());
            }
        }
    }
    // What every run shares and never grows: the init's copy for the engine to bind, and
    // what is known of the image's mount paths.
    let base = runtime.path().join("stevedore");
    let kept = |f: &std::path::PathBuf| f.starts_with(base.join("tools")) || f.starts_with(base.join("images"));
    assert!(files.iter().all(kept) && files.len() <= 2, "files left on the host: {files:?}");
    assert!(dirs <= 6, "dirs do not grow with the runs: {dirs}");
}

/// `-i`: the command's stdin is this process's, in order and whole (5 MiB, more than the
/// init's window, so back-pressure is crossed many times), with EOF at its end; without `-i`
/// it is `/dev/null`; `-t` is refused with why, before anything is created.
#[tokio::test]
async fn stdin_with_i_is_the_commands_and_t_without_a_terminal_is_a_terminal_inside() {
    use std::io::Write;
    let Some((docker, _)) = setup().await else { return };
    let w = worker("stdin-i");
    let t = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..5u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let run_with = |args: &[&str], input: &[u8], out: &str| {
        let mut child = Command::new(BIN)
            .args(["run", "--worker", &w, "--image", BUSYBOX_IMAGE, "--output", &out_dir(&t, out)])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let input = input.to_vec();
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let o = child.wait_with_output().unwrap();
        writer.join().unwrap();
        o
    };
    let o = run_with(&["-i", "--", "sh", "-c", "wc -c; echo eof"], &data, "a");
    assert_eq!((o.status.code(), text(&o.stdout)), (Some(0), format!("{}\neof\n", data.len())), "{}", text(&o.stderr));
    let o = run_with(&["-i", "--", "cat"], &data, "b");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(o.stdout == data, "{} bytes back, not the {} sent, or not in order", o.stdout.len(), data.len());
    let o = run_with(&["--", "sh", "-c", "wc -c"], b"not read", "c");
    assert_eq!(text(&o.stdout), "0\n", "without -i: /dev/null");
    // -it needs a terminal to read keys from, as docker says; -t alone gives the command one.
    let o = run_with(&["-it", "--", "sh"], b"", "d");
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("-it: the input is not a terminal"), "{}", text(&o.stderr));
    let o = run_with(&["-t", "--", "sh", "-c", "tty; echo out; echo err >&2; exit 4"], b"", "e");
    assert_eq!(o.status.code(), Some(4), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "/dev/pts/0\r\nout\r\nerr\r\n", "one terminal for both streams, its newlines");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

/// An image typo is named before any registry is asked (nothing leaves this machine);
/// `--pull never` refuses a missing image without a pull.
#[tokio::test]
async fn an_image_typo_is_named_before_anything_is_pulled() {
    let Some((docker, _)) = setup().await else { return };
    let w = worker("typo");
    let t = tempfile::tempdir().unwrap();
    let typo = BUSYBOX_IMAGE.replace("busybox", "busybx");
    let o = run(&["--worker", &w, "--image", &typo, "--output", &out_dir(&t, "a"), "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    let said = text(&o.stderr);
    assert!(said.contains(&format!("did you mean {BUSYBOX_IMAGE}")) && said.contains("nothing was pulled"), "{said}");
    let o = run(&["--worker", &w, "--pull", "never", "--image", "stevedore-test/nothing-like-it:0", "--output"]
        .into_iter()
        .chain([out_dir(&t, "b").as_str(), "--", "true"])
        .collect::<Vec<_>>());
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("the pull policy is never"), "{}", text(&o.stderr));
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

/// Files under `dir`, however deep.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                files.push(e.path());
            }
        }
    }
    files
}

/// Ctrl-C twice: the first stops the attempt within its grace and says so; the second
/// (the command ignores SIGTERM, so the grace is still running) kills and removes it at
/// once and says that too. Nothing is left: no container, and no capture file in
/// stevedore's private dir, which only this run knew of.
#[tokio::test]
async fn a_second_ctrl_c_says_what_it_did_and_leaves_nothing() {
    let Some((docker, _)) = setup().await else { return };
    let w = worker("ctrl-c-twice");
    let t = tempfile::tempdir().unwrap();
    let runtime = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(["run", "--worker", &w, "--image", BUSYBOX_IMAGE, "--grace", "120s", "--output", &out_dir(&t, "o")])
        .args(["--", "sh", "-c", "trap '' TERM; echo ready >&2; while :; do sleep 1; done"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines().map_while(Result::ok);
    let mut said = Vec::new();
    let mut until = |what: &str| {
        for l in lines.by_ref() {
            let found = l.contains(what);
            said.push(l);
            if found {
                return;
            }
        }
        panic!("stevedore never said {what:?}: {said:?}");
    };
    until("ready");
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    until("another signal kills and removes it at once");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    until("SIGINT again: killing and removing the attempt now");
    said.extend(lines);
    assert_eq!(child.wait().unwrap().code(), Some(130), "{said:?}");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]), "{said:?}");
    let left: Vec<_> = files_under(runtime.path())
        .into_iter()
        .filter(|f| f.extension().is_some_and(|e| e == "stdout" || e == "stderr"))
        .collect();
    assert!(left.is_empty(), "captures left on the host: {left:?}");
}

#[tokio::test]
async fn bad_input_gets_a_message_a_person_can_act_on() {
    let Some(_) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let msg = |args: &[&str]| {
        let o = run(args);
        assert_eq!(o.status.code(), Some(125), "{args:?}");
        text(&o.stderr)
    };
    let out = out_dir(&t, "a");
    assert!(msg(&["--image", "busyboxx-typo", "--output", &out, "--", "true"]).contains("not found locally"));
    assert!(
        msg(&["--image", BUSYBOX_IMAGE, "--output", &out, "--memory", "64", "--", "true"])
            .contains("did you mean 64m?")
    );
    let o = Command::new(BIN)
        .args(["--profile", "dev", "run", "--image", BUSYBOX_IMAGE, "--output", &out, "--", "true"])
        .env("XDG_CONFIG_HOME", t.path())
        .env_remove("STEVEDORE_CONFIG")
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert!(err.contains("No such file") && err.contains("--config"), "{err}");
    assert!(msg(&["--image", BUSYBOX_IMAGE, "--output", &out, "-u", "nobody", "--", "true"]).contains("numeric"));
    // Each path says what it is and what the flag takes (issue 49).
    let file = t.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let file = file.display().to_string();
    let said = msg(&["--image", BUSYBOX_IMAGE, "--output", &file, "--", "true"]);
    assert!(said.contains("is a file, not a directory: give a new or empty directory"), "{said}");
    let said = msg(&["--image", BUSYBOX_IMAGE, "--input", &file, "--output", &out, "--", "true"]);
    assert!(said.contains("is a file, not a directory"), "{said}");
    let said = msg(&["--image", BUSYBOX_IMAGE, "--input", &out_dir(&t, "none"), "--output", &out, "--", "true"]);
    assert!(said.contains("does not exist: give the directory"), "{said}");
    let full = out_dir(&t, "full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(Path::new(&full).join("x"), "x").unwrap();
    let said = msg(&["--image", BUSYBOX_IMAGE, "--output", &full, "--", "true"]);
    assert!(said.contains("is not empty: give a new or empty directory"), "{said}");
    // A profile with a warm pool serves a long-lived process: the command says so, and
    // makes nothing.
    let config = t.path().join("pool.toml");
    std::fs::write(&config, "[profiles.warm]\nimage = \"busybox\"\npool = { size = 2, worker = \"w-pool-cli\" }\n")
        .unwrap();
    let o = Command::new(BIN)
        .args(["--config", &config.display().to_string(), "--profile", "warm", "run", "--output", &out, "--", "true"])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(err.contains("warm pool") && err.contains("profile without `pool`"), "{err}");
}

/// docker's habits: a word starting with `-` before the command is a flag, so a typo is an
/// error naming the nearest flag (never the command, nor a missing `--output`); `--rm` is
/// accepted (every attempt is removed); `--name` is refused with why; after the command's
/// first word, words are the command's, dashes and all; a failure is said in the user's words.
#[tokio::test]
async fn docker_habits_flags_are_flags_and_a_failure_is_said_plainly() {
    let Some(_) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    for (args, says) in [
        (
            vec!["--image", BUSYBOX_IMAGE, "--memroy", "1g", "--output", "OUT", "true"],
            "similar argument exists: '--memory'",
        ),
        (
            vec!["--image", BUSYBOX_IMAGE, "--output", "OUT", "--memroy", "1g", "true"],
            "similar argument exists: '--memory'",
        ),
        (vec!["--name", "web", "--image", BUSYBOX_IMAGE, "--output", "OUT", "true"], "name the attempt with --job"),
    ] {
        let out = out_dir(&t, &format!("{:08x}", rand::random::<u32>()));
        let args: Vec<&str> = args.iter().map(|a| if *a == "OUT" { out.as_str() } else { a }).collect();
        let o = run(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("applet not found"), "a flag ran as the command: {err}");
    }
    let out = out_dir(&t, "rm");
    let o = run(&["--rm", "--output", &out, BUSYBOX_IMAGE, "sh", "-c", "echo $0 $1", "-x", "--y"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "-x --y\n");
    // A command that fails is announced in the user's words; the Outcome keeps its status.
    let out = out_dir(&t, "fails");
    let o = run(&["--image", BUSYBOX_IMAGE, "--output", &out, "--outcome", "-", "--", "sh", "-c", "exit 3"]);
    assert_eq!(o.status.code(), Some(3));
    assert!(text(&o.stderr).contains("stevedore: failed (exit 3) after"), "{}", text(&o.stderr));
    let outcome: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(outcome["status"], "handler_error");
}

#[tokio::test]
async fn a_fifo_or_socket_in_the_inputs_is_named_on_the_line_and_in_the_evidence() {
    let Some(_) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    std::fs::create_dir_all(input.join("sub")).unwrap();
    std::fs::write(input.join("kept"), b"k").unwrap();
    nix::unistd::mkfifo(&input.join("pipe"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(input.join("sub/sock")).unwrap();
    let out = out_dir(&t, "out");
    let o = run(&[
        "--image",
        BUSYBOX_IMAGE,
        "--input",
        &input.display().to_string(),
        "--output",
        &out,
        "--outcome",
        "-",
        "--",
        "sh",
        "-c",
        "ls -R /in > /out/ls",
    ]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let listed = std::fs::read_to_string(Path::new(&out).join("ls")).unwrap();
    assert_eq!(listed, "/in:\nkept\nsub\n\n/in/sub:\n", "what /in holds");
    let line = err.lines().find(|l| l.starts_with("stevedore: ok")).expect("the human line");
    assert!(line.contains("2 inputs are not in /in (a FIFO, socket or device: \"pipe\", \"sub/sock\")"), "{line}");
    let outcome: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(outcome["evidence"]["inputs"]["skipped"], serde_json::json!(["pipe", "sub/sock"]), "{outcome}");
}

/// A tmux server of the test's own (its own socket, no user config), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new(tag: &str) -> Option<Self> {
        let Ok(o) = Command::new("tmux").arg("-V").output() else {
            assert!(!support::in_ci(), "CI=true: tmux missing (apt-get install tmux)");
            support::skip("tmux missing (apt-get install tmux)");
            return None;
        };
        assert!(o.status.success());
        Some(Self { socket: format!("stevedore-test-{tag}-{:08x}", rand::random::<u32>()) })
    }

    fn cmd(&self, args: &[&str]) -> Output {
        let o = Command::new("tmux").args(["-L", &self.socket, "-f", "/dev/null"]).args(args).output().unwrap();
        assert!(o.status.success(), "tmux {args:?}: {}", text(&o.stderr));
        o
    }

    /// Runs `shell` in a new detached session of `cols` × `rows`, its terminal's output read
    /// as lines from what returns (through `pipe-pane` into a FIFO, set before it starts).
    fn session(&self, dir: &Path, cols: u16, rows: u16, shell: &str) -> std::sync::mpsc::Receiver<String> {
        let fifo = dir.join(format!("pane-{:08x}", rand::random::<u32>()));
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let go = format!("go-{}", self.socket);
        let script = format!("tmux -L {} wait-for {go}; {shell}; sleep 600", self.socket);
        let (c, r) = (cols.to_string(), rows.to_string());
        self.cmd(&["new-session", "-d", "-s", "t", "-x", &c, "-y", &r, &script]);
        self.cmd(&["set-option", "-g", "window-size", "manual"]);
        self.cmd(&["pipe-pane", "-t", "t", "-O", &format!("cat >> {}", fifo.display())]);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let lines = BufReader::new(std::fs::File::open(&fifo).unwrap()).split(b'\n');
            for l in lines.map_while(Result::ok) {
                let _ = tx.send(String::from_utf8_lossy(&l).trim_end_matches('\r').to_owned());
            }
        });
        self.cmd(&["wait-for", "-S", &go]);
        rx
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["-L", &self.socket, "kill-server"]).output();
    }
}

/// The lines from `lines` up to the first that contains `word`, that one last.
fn until(lines: &std::sync::mpsc::Receiver<String>, word: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(std::time::Duration::from_secs(120)) {
            Ok(l) if l.contains(word) => {
                seen.push(l);
                return seen;
            }
            Ok(l) => seen.push(l),
            Err(e) => panic!("no line with {word:?} ({e}); saw {seen:?}"),
        }
    }
}

/// `-it` as people use it, through a real terminal (tmux): the command's terminal has this
/// one's size and follows its resize, keys reach it, ^C is its SIGINT, its exit status is the
/// run's, and this terminal is given back as it was.
#[tokio::test]
async fn it_gives_the_command_this_terminal_its_size_its_keys_and_its_ctrl_c() {
    let Some((docker, _)) = setup().await else { return };
    let Some(tmux) = Tmux::new("it") else { return };
    let w = worker("tty-it");
    let t = tempfile::tempdir().unwrap();
    let run = |out: &str, script: &str| {
        format!(
            "{BIN} run -it --worker {w} --image {BUSYBOX_IMAGE} --output {} -- sh -c '{script}'; echo status=$?; stty -a | grep -o -- '-\\?icanon'",
            out_dir(&t, out)
        )
    };
    let lines = tmux.session(t.path(), 100, 30, &run("a", "stty size; read a; stty size; echo got:$a; exit 3"));
    until(&lines, "30 100");
    tmux.cmd(&["resize-window", "-t", "t", "-x", "120", "-y", "40"]);
    tmux.cmd(&["send-keys", "-t", "t", "hello", "Enter"]);
    let seen = until(&lines, "got:hello");
    assert!(seen.iter().any(|l| l == "40 120"), "the resize reached it: {seen:?}");
    let seen = until(&lines, "status=3");
    assert!(seen.iter().any(|l| l.contains("stevedore: failed (exit 3)")), "{seen:?}");
    let after = until(&lines, "icanon");
    assert_eq!(after, ["icanon"], "the terminal is canonical again (not raw), said at once");
    drop(tmux);

    let tmux = Tmux::new("it-c").unwrap();
    let lines = tmux.session(
        t.path(),
        80,
        24,
        &run("b", "trap \"echo caught-int; exit 5\" INT; echo ready; while :; do sleep 1; done"),
    );
    until(&lines, "ready");
    tmux.cmd(&["send-keys", "-t", "t", "C-c"]);
    until(&lines, "caught-int");
    until(&lines, "status=5");
    drop(tmux);
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

/// Progress of a long transfer on a terminal (here shown at once, `STEVEDORE_PROGRESS_AFTER`):
/// the inputs' bar names what moved and its rate, and is gone by the summary line; with
/// stderr not a terminal, or `--quiet`, nothing of it is printed.
#[tokio::test]
async fn progress_is_shown_on_a_terminal_only() {
    let Some((docker, _)) = setup().await else { return };
    let Some(tmux) = Tmux::new("progress") else { return };
    let w = worker("progress");
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let block: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
    let mut f = std::fs::File::create(input.join("big")).unwrap();
    for _ in 0..64 {
        std::io::Write::write_all(&mut f, &block).unwrap();
    }
    drop(f);
    let args = |out: &str| {
        format!(
            "--worker {w} --image {BUSYBOX_IMAGE} --input {} --output {} -- sh -c 'wc -c < ${{STEVEDORE_IN:-/in}}/big; head -c 8000000 ${{STEVEDORE_IN:-/in}}/big > ${{STEVEDORE_OUT:-/out}}/copy'",
            input.display(),
            out_dir(&t, out)
        )
    };
    let lines = tmux.session(
        t.path(),
        120,
        30,
        &format!("STEVEDORE_PROGRESS_AFTER=0s {BIN} run {}; echo status=$?", args("tty")),
    );
    let seen = until(&lines, "status=0");
    let all = seen.join("\n");
    assert!(all.contains("inputs [") && all.contains("/64.00 MiB"), "the inputs' bar: {all:?}");
    assert!(all.contains("outputs ") && all.contains("MiB"), "the outputs' count: {all:?}");
    let summary = seen.iter().find(|l| l.contains("stevedore: ok")).expect("the summary line");
    assert!(summary.ends_with(&format!("1 output in {})", out_dir(&t, "tty"))), "a line of its own: {summary:?}");
    drop(tmux);
    // The process rung copies the inputs itself, and says so the same way.
    let tmux = Tmux::new("progress-p").unwrap();
    let lines = tmux.session(
        t.path(),
        120,
        30,
        &format!("STEVEDORE_PROGRESS_AFTER=0s {BIN} run --rung process {}; echo status=$?", args("proc")),
    );
    let seen = until(&lines, "status=").join("\n");
    assert!(seen.contains("status=0") && seen.contains("inputs [") && seen.contains("/64.00 MiB"), "{seen:?}");
    drop(tmux);
    let tmux = Tmux::new("progress-q").unwrap();
    let lines = tmux.session(
        t.path(),
        120,
        30,
        &format!("STEVEDORE_PROGRESS_AFTER=0s {BIN} run --quiet {}; echo status=$?", args("quiet")),
    );
    let seen = until(&lines, "status=0").join("\n");
    assert!(!seen.contains("inputs") && !seen.contains("stevedore:"), "--quiet on a terminal: {seen:?}");
    drop(tmux);
    // Not a terminal: not a byte of progress.
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!("STEVEDORE_PROGRESS_AFTER=0s {BIN} run {}", args("pipe")))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(!text(&o.stderr).contains("inputs") && !text(&o.stderr).contains('\r'), "{:?}", text(&o.stderr));
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}

/// `-w DIR` the image lacks (issue 49): made as docker makes it, on the read-only root too;
/// where it cannot be (a file of the image), the message names the directory and the exit is
/// never 127's "command not found".
#[tokio::test]
async fn a_working_dir_the_image_lacks_is_made_as_docker_does() {
    let Some(_) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let w = worker("cli-workdir");
    let o = run(&[
        "--worker",
        &w,
        "--image",
        BUSYBOX_IMAGE,
        "-w",
        "/made/here",
        "--output",
        &out_dir(&t, "made"),
        "--",
        "sh",
        "-c",
        "pwd; touch /x 2>/dev/null || echo read-only",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "/made/here\nread-only\n");
    let o = run(&[
        "--worker",
        &w,
        "--image",
        BUSYBOX_IMAGE,
        "-w",
        "/bin/sh",
        "--output",
        &out_dir(&t, "file"),
        "--",
        "pwd",
    ]);
    let err = text(&o.stderr);
    assert_ne!(o.status.code(), Some(127), "{err}");
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("/bin/sh") && !err.contains("command_not_found"), "{err}");
}
