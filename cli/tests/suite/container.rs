//! The container rung against the real engine: plain commands end to end.

use crate::support;

use support::{run, rung, rung_with, setup, sh as cmd};

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};
use stevedore::container::ContainerConfig;
use stevedore::{Executor, Request, ResourceLimits, Status};
use tokio_util::sync::CancellationToken;

/// (uid, gid, mode) of each path.
fn owner_and_mode(paths: &[&Path]) -> Vec<(u32, u32, u32)> {
    paths
        .iter()
        .map(|p| {
            let m = std::fs::metadata(p).unwrap();
            (m.uid(), m.gid(), m.mode())
        })
        .collect()
}

fn sha256sum(path: &Path) -> String {
    // Through stdin: sha256sum escapes odd file names in its output.
    let out = std::process::Command::new("sha256sum").stdin(std::fs::File::open(path).unwrap()).output().unwrap();
    format!("sha256:{}", String::from_utf8(out.stdout).unwrap().split_whitespace().next().unwrap())
}

#[tokio::test]
async fn ok_with_outputs_hashed_and_owned_by_the_caller() {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung().await;
    let w = support::worker("ok");
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let script = "printf 'hello\\n' > /out/a.txt; mkdir -p /out/sub; head -c 100000 /dev/urandom > /out/sub/rand.bin; \
                  printf '{}' > '/out/with space.json'; printf x > \"/out/$(printf 'new\\nline')\"; printf u > /out/ünï; echo done";
    let o = run(&rung, &cmd(&image, &w, &out, script)).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(o.exit_code, Some(0));
    assert_eq!(o.signal, None);
    let names: Vec<&str> = o.outputs.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["a.txt", "new\nline", "sub/rand.bin", "with space.json", "ünï"]);
    let me = nix::unistd::geteuid().as_raw();
    for f in &o.outputs {
        let p = out.join(&f.name);
        assert_eq!(f.hash, sha256sum(&p), "{}", f.name);
        assert_eq!(f.size, std::fs::metadata(&p).unwrap().len());
        assert_eq!(std::fs::metadata(&p).unwrap().uid(), me, "outputs belong to the caller");
    }
    assert_eq!(o.outputs[0].content_type, "text/plain");
    assert_eq!(o.outputs[3].content_type, "application/json");
    assert_eq!(o.evidence.logs.stdout.bytes, 5);
    assert!(!o.evidence.logs.stdout.truncated);
    assert_eq!(support::stdout_of(&o), "done\n");
    assert_eq!(o.evidence.worker, w);
    assert!(o.evidence.container_id.is_some());
    assert_eq!(o.usage.disk_written_bytes, Some(6 + 100_000 + 2 + 1 + 1));
    assert_eq!(o.usage.disk_written_bytes, Some(o.outputs.iter().map(|f| f.size).sum()));
    assert!(o.usage.wall_time_ms.is_some());
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]), "nothing left in the engine");
    rung.close().await;
}

#[tokio::test]
async fn exit_codes_and_signals() {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung().await;
    let w = support::worker("exit");
    let t = tempfile::tempdir().unwrap();
    let o = run(&rung, &cmd(&image, &w, &t.path().join("a"), "echo oops >&2; exit 3")).await;
    assert_eq!((o.status, o.exit_code, o.signal), (Status::HandlerError, Some(3), None), "{}", o.to_json());
    assert_eq!(o.evidence.logs.stderr.bytes, 5, "the init's sentinel is not part of the log");
    let o = run(&rung, &cmd(&image, &w, &t.path().join("b"), "exit 137")).await;
    assert_eq!(
        (o.status, o.exit_code, o.signal),
        (Status::HandlerError, Some(137), None),
        "137 by itself is not a kill"
    );
    let o = run(&rung, &cmd(&image, &w, &t.path().join("c"), "kill -9 $$")).await;
    assert_eq!((o.status, o.exit_code, o.signal), (Status::Killed, None, Some(9)), "{}", o.to_json());
    assert_eq!(o.evidence.oom_kills, Some(0));
    let o = run(&rung, &cmd(&image, &w, &t.path().join("d"), "sleep 60 & echo started")).await;
    assert_eq!(o.status, Status::Ok);
    assert!(o.evidence.stragglers_killed, "the background sleep was killed");
    let mut r = Request::command("job", ["/no/such/program"], t.path().join("e")).worker(w.as_str());
    r.policy.image = image.clone();
    let o = run(&rung, &r).await;
    assert_eq!(o.status, Status::LaunchFailed, "{}", o.to_json());
    assert!(o.handler_error.contains("/no/such/program"), "{}", o.handler_error);
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn deadline_with_a_term_ignoring_command() {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung().await;
    let w = support::worker("deadline");
    let t = tempfile::tempdir().unwrap();
    let grace = Duration::from_secs(1);
    let deadline = Duration::from_secs(2);
    let mut r = cmd(&image, &w, &t.path().join("o"), "trap '' TERM; echo partial > /out/p; while :; do sleep 1; done");
    r.policy = r.policy.clone().with_grace(grace);
    let start = Instant::now();
    let r = r.timeout(deadline);
    let o = run(&rung, &r).await;
    let took = start.elapsed();
    assert_eq!(o.status, Status::Timeout, "{}", o.to_json());
    assert_eq!(o.reason.map(|r| r.as_str()), Some("deadline"));
    // A timed-out attempt's outputs are collected and listed (a CI job wants its junit.xml).
    assert_eq!(o.outputs.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["p"]);
    assert!(t.path().join("o/p").exists());
    assert!(took < deadline + grace + Duration::from_secs(2) + Duration::from_secs(3), "took {took:?}");
    assert_eq!(o.signal, Some(9), "SIGKILLed after the grace");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn cancellation() {
    let Some((docker, image)) = setup().await else { return };
    let w = support::worker("cancel");
    let t = tempfile::tempdir().unwrap();
    let mut r = cmd(&image, &w, &t.path().join("o"), "echo ready; sleep 60").grace(Duration::from_secs(5));
    let mut watch = support::watch([&mut r]);
    let token = CancellationToken::new();
    let rung = rung_with(ContainerConfig::default()).await;
    let t2 = token.clone();
    tokio::spawn(async move {
        watch.until("ready").await;
        t2.cancel();
    });
    let o = rung.run(&r, token).await.unwrap();
    assert_eq!(o.status, Status::Killed, "{}", o.to_json());
    assert_eq!(o.reason.map(|r| r.as_str()), Some("cancelled"));
    assert_eq!(o.signal, Some(15), "sleep died of the forwarded SIGTERM");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn inputs_from_a_private_root_dir_stay_untouched() {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung().await;
    let w = support::worker("inputs");
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in");
    std::fs::create_dir(&input).unwrap();
    std::fs::set_permissions(&input, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::create_dir(input.join("d")).unwrap();
    std::fs::write(input.join("d/data.txt"), b"payload-123").unwrap();
    std::fs::set_permissions(input.join("d/data.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let before = owner_and_mode(&[&input, &input.join("d/data.txt")]);
    let r = cmd(
        &image,
        &w,
        &t.path().join("o"),
        "cat /in/d/data.txt > /out/copy; touch /in/x 2>/dev/null && echo WROTE; id -u",
    )
    .input_dir(&input)
    .input("data", "d/data.txt");
    let o = run(&rung, &r).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert_eq!(std::fs::read(t.path().join("o/copy")).unwrap(), b"payload-123");
    let stdout = support::stdout_of(&o);
    assert!(!stdout.contains("WROTE"), "/in is read-only");
    assert_eq!(stdout.trim(), "65532", "runs as the non-root sandbox user");
    let after = owner_and_mode(&[&input, &input.join("d/data.txt")]);
    assert_eq!(before, after, "inputs untouched");
    assert_eq!(std::fs::read(input.join("d/data.txt")).unwrap(), b"payload-123");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn hostile_outputs_are_refused_and_named() {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung().await;
    let w = support::worker("hostile");
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o");
    let script = "echo ok > /out/real; ln -s /etc/passwd /out/link; mkfifo /out/fifo; mkdir /out/d; echo s > /out/d/secret; \
                  ln -s /out/d /out/dirlink; printf z > \"/out/$(printf 'bad\\377name')\"";
    let o = run(&rung, &cmd(&image, &w, &out, script)).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    let names: Vec<&str> = o.outputs.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["d/secret", "real"], "only regular files, no symlinked dir followed");
    let refused: Vec<(String, String)> =
        o.evidence.refused_outputs.iter().map(|r| (r.name.clone(), r.why.clone())).collect();
    for (name, why) in [("link", "symlink"), ("fifo", "fifo"), ("dirlink", "symlink")] {
        assert!(refused.iter().any(|(n, w)| n == name && w == why), "{name} not refused as {why}: {refused:?}");
    }
    assert!(refused.iter().any(|(n, w)| n.contains("\\xff") && w == "non_utf8_name"), "{refused:?}");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn bad_requests_create_nothing() {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung().await;
    let w = support::worker("bad");
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir(t.path().join("full")).unwrap();
    std::fs::write(t.path().join("full/x"), b"").unwrap();
    let cases = vec![
        cmd(&image, &w, &t.path().join("o"), "true").input_dir(t.path().join("missing")),
        cmd(&image, &w, &t.path().join("o"), "true").input_dir(t.path()).input("x", "/etc/passwd"),
        cmd(&image, &w, &t.path().join("o"), "true").input_dir(t.path()).input("x", "../x"),
        cmd(&image, &w, &t.path().join("o"), "true").input_dir(t.path()).input("x", "nope"),
        cmd(&image, &w, &t.path().join("full"), "true"),
        cmd(&image, &w, &t.path().join("o"), "true").limits(ResourceLimits::new().with("memory", 1)),
    ];
    for r in cases {
        let err = rung.run(&r, CancellationToken::new()).await.expect_err("rejected");
        assert!(err.is_permanent(), "{err}");
    }
    let r = cmd("stevedore-test/no-such-image:1", &w, &t.path().join("o"), "true");
    let err = rung.run(&r, CancellationToken::new()).await.expect_err("unknown image");
    assert!(matches!(err, stevedore::LaunchError::ImageUnavailable { .. }), "{err}");
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]), "nothing created for rejected requests");
    assert!(!t.path().join("o").exists());
    rung.close().await;
}

#[tokio::test]
async fn api_version_is_negotiated() {
    let Some(_) = setup().await else { return };
    let rung = rung().await;
    let f = rung.engine().facts();
    let parse = |v: &str| -> (u32, u32) {
        let (a, b) = v.split_once('.').unwrap();
        (a.parse().unwrap(), b.parse().unwrap())
    };
    assert!(parse(&f.api_version) <= parse(&f.max_api_version), "{f:?}");
    assert!(parse(&f.api_version) <= parse(bollard::API_DEFAULT_VERSION.to_string().as_str()));
    assert!(parse(&f.api_version) >= parse(&f.min_api_version));
    let client = bollard::API_DEFAULT_VERSION.to_string();
    let expected = parse(&f.max_api_version).min(parse(&client));
    assert_eq!(parse(&f.api_version), expected, "the newest version both sides speak ({f:?}, client {client})");
    assert!(!f.engine_version.is_empty());
    rung.close().await;
}

#[tokio::test]
async fn an_empty_out_an_empty_dir_and_an_empty_file() {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung().await;
    let w = support::worker("empty-out");
    let t = tempfile::tempdir().unwrap();
    // Nothing at all: no archive is fetched, and the outcome is the same as with one.
    let o = run(&rung, &cmd(&image, &w, &t.path().join("a"), "true")).await;
    assert_eq!((o.status, o.outputs.len(), o.usage.disk_written_bytes), (Status::Ok, 0, Some(0)), "{}", o.to_json());
    assert!(t.path().join("a").is_dir() && std::fs::read_dir(t.path().join("a")).unwrap().next().is_none());
    // An empty directory alone is not "nothing".
    let o = run(&rung, &cmd(&image, &w, &t.path().join("b"), "mkdir -p /out/d/e")).await;
    assert_eq!(o.status, Status::Ok, "{}", o.to_json());
    assert!(t.path().join("b/d/e").is_dir());
    let o = run(&rung, &cmd(&image, &w, &t.path().join("c"), ": > /out/empty")).await;
    assert_eq!(o.outputs.len(), 1, "{}", o.to_json());
    assert_eq!((o.outputs[0].name.as_str(), o.outputs[0].size), ("empty", 0));
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

#[tokio::test]
async fn a_command_cannot_forge_its_record() {
    let Some((docker, image)) = setup().await else { return };
    let rung = rung().await;
    let w = support::worker("forge");
    let t = tempfile::tempdir().unwrap();
    // A fake Record frame on its own stdout (and stderr), and a fake result file where the
    // control area used to be: the init owns the link, so these are only the command's
    // output; the status stays what the command did.
    let script = "printf '\\023\\000\\000\\000\\002{}' ; printf '\\023\\000\\000\\000\\002{}' >&2; \
                  mkdir -p /tmp/.stevedore/control && echo '{\"wait\":{\"code\":0}}' > /tmp/.stevedore/control/result.json; \
                  echo ok > /out/ok; exit 4";
    let o = run(&rung, &cmd(&image, &w, &t.path().join("o"), script)).await;
    assert_eq!((o.status, o.exit_code), (Status::HandlerError, Some(4)), "{}", o.to_json());
    assert_eq!(o.usage.sources.cpu_time_ms.as_ref().unwrap().to_string(), "cgroup", "{}", o.to_json());
    assert_eq!(o.evidence.logs.stdout.bytes, 7, "the fake frame is stdout, nothing more");
    assert_eq!(o.outputs.len(), 1);
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
    rung.close().await;
}

/// A terminal fed from a finite stdin (the library: `tty` and a `StdinFeed`): what was fed
/// is typed into it, and its end is the terminal's (^D, twice after a partial line), so a
/// command that reads to the end ends; one terminal carries stdout and stderr alike.
#[tokio::test]
async fn a_terminal_fed_a_finite_stdin_reaches_its_end() {
    let Some((docker, image)) = support::setup().await else { return };
    let rung = support::rung().await;
    let w = support::worker("tty-feed");
    let t = tempfile::tempdir().unwrap();
    let (tx, feed) = stevedore::StdinFeed::channel(4);
    let (_resize, terminal) = stevedore::Terminal::new(30, 100);
    let req = support::sh(&image, &w, &t.path().join("out"), "stty size; tty >&2; cat; echo; echo done")
        .stdin(feed)
        .tty(terminal);
    tx.send(bytes::Bytes::from_static(b"one\ntwo")).await.unwrap();
    drop(tx);
    let o = support::run(&rung, &req).await;
    assert_eq!(o.status, stevedore::Status::Ok, "{}", o.to_json());
    let out = support::stdout_of(&o);
    // The terminal echoes what is typed as soon as it is typed, before the command reads it:
    // whether before or after `tty` spoke depends on who ran first, so only the echo's
    // presence is asserted, beside the terminal's size, its name and what cat read.
    assert!(out.contains("30 100\r\n"), "{out:?}");
    assert!(out.contains("/dev/pts/0\r\n"), "{out:?}");
    assert_eq!(out.matches("one\r\ntwo").count(), 2, "the echo and cat's copy: {out:?}");
    assert!(out.ends_with("one\r\ntwo\r\ndone\r\n"), "cat read both lines, then its end: {out:?}");
    rung.close().await;
    assert_eq!(support::labelled(&docker, &w).await, (vec![], vec![]));
}
