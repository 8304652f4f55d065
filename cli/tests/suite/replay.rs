//! `stevedore replay` (the action digest): a deterministic attempt replays with identical
//! outputs, one that writes the time does not; a tampered Outcome, changed inputs and a
//! missing secret are refused, and `--inputs` runs on a new set, saying so. Each test runs the
//! real command against the real engine and leaves nothing labelled behind.

use crate::support;

use std::path::Path;
use std::process::{Command, Output};
use support::{BIN, BUSYBOX_IMAGE, labelled, setup, worker};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `stevedore run` of `script` on `input`, its Outcome in `<t>/outcome.json`.
fn attempt(t: &Path, w: &str, input: &Path, script: &str, env: &[&str]) -> String {
    let outcome = t.join("outcome.json").display().to_string();
    let mut c = Command::new(BIN);
    c.args(["run", "-q", "--worker", w, "--image", BUSYBOX_IMAGE, "--outcome", &outcome]);
    c.args(["--input", &input.display().to_string(), "--output", &t.join("out0").display().to_string()]);
    for e in env {
        c.args(["--env", e]);
    }
    let o = c.args(["--", "sh", "-c", script]).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    outcome
}

fn replay(w: &str, outcome: &str, out: &Path, extra: &[&str]) -> Output {
    Command::new(BIN)
        .args(["replay", "--worker", w, "--output", &out.display().to_string()])
        .args(extra)
        .arg(outcome)
        .output()
        .unwrap()
}

fn inputs(t: &Path) -> std::path::PathBuf {
    let d = t.join("in");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("x"), b"hello\n").unwrap();
    d
}

#[tokio::test]
async fn a_deterministic_attempt_replays_identically_and_the_time_does_not() {
    let Some((docker, _)) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let w = worker("replay-same");
    let input = inputs(t.path());
    let outcome = attempt(t.path(), &w, &input, "cat /in/x > /out/y", &[]);
    let r = t.path().join("r");
    let o = replay(&w, &outcome, &r, &["-n", "3"]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    // Against the attempt first, then between the runs.
    let against = out.find("against the attempt: all 3 runs' outputs equal the attempt's (1 file, by digest)\n");
    let between = out.find("between the runs: identical in all 3 runs\n");
    assert!(against.is_some() && between.is_some() && against < between, "{out}");
    assert_eq!(out.matches("the same action").count(), 3, "the runs' own digests are the attempt's: {out}");
    assert!(out.contains("phases (mean ± stddev over 3 runs): prepare "), "{out}");
    let phases = out.lines().find(|l| l.starts_with("phases")).unwrap_or_default();
    assert!(phases.contains(", command ran ") && !phases.contains("_ms"), "phases in words: {out}");
    let runs: Vec<String> = (1..=3).map(|i| r.join(format!("run-{i}")).display().to_string()).collect();
    assert!(
        out.contains(&format!("remove them with: rm -rf -- {}\n", runs.join(" "))),
        "a dir given: only the runs': {out}"
    );
    for i in 1..=3 {
        assert_eq!(std::fs::read(r.join(format!("run-{i}/y"))).unwrap(), b"hello\n");
    }
    // No --output: a new dir under $TMPDIR, kept, and the command that removes it works.
    let tmp = t.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let o = Command::new(BIN).args(["replay", "--worker", &w, &outcome]).env("TMPDIR", &tmp).output().unwrap();
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    assert!(out.contains("against the attempt: the run's outputs equal the attempt's (1 file, by digest)\n"), "{out}");
    assert!(out.contains("between the runs: one run, nothing to compare"), "{out}");
    assert!(out.contains("phases: prepare ") && out.contains(" ms, total "), "{out}");
    let rm = out.lines().find_map(|l| l.split_once("remove them with: ").map(|(_, c)| c.to_owned())).expect(&out);
    let dir = rm.strip_prefix("rm -rf -- ").expect(&rm);
    assert!(Path::new(dir).starts_with(&tmp) && Path::new(dir).join("run-1/y").is_file(), "{out}");
    assert!(Command::new("sh").args(["-c", &rm]).status().unwrap().success());
    // stevedore's private dir (`stevedore-UID`, its runtime files) is no output of the runs.
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("stevedore-replay-")))
        .collect();
    assert!(left.is_empty() && !Path::new(dir).exists(), "the command said removes what the replay made: {left:?}");

    let t2 = tempfile::tempdir().unwrap();
    // The time and a fresh uuid: every run's `t` differs (busybox's `date` has no %N, and two
    // runs in one second would otherwise agree).
    let input = inputs(t2.path());
    let outcome = attempt(
        t2.path(),
        &w,
        &input,
        "{ date +%s; cat /proc/sys/kernel/random/uuid; } > /out/t; cat /in/x > /out/y",
        &[],
    );
    let r = t2.path().join("r");
    let out0 = t2.path().join("out0");
    let o = replay(&w, &outcome, &r, &["-n", "3", "--attempt-output", &out0.display().to_string()]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "outputs that differ exit 1: {out}{}", text(&o.stderr));
    // The offsets the kept copies really differ at, as `cmp` would find them.
    let at = |a: &Path, b: &Path| {
        let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        x.iter().zip(&y).position(|(p, q)| p != q).unwrap_or(x.len().min(y.len()))
    };
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    let (then, run1, run2) = (out0.join("t"), r.join("run-1/t"), r.join("run-2/t"));
    let against = format!(
        "against the attempt: run 1's outputs differ from the attempt's: t\n  t: the attempt's {} bytes, run 1's {} \
         bytes, first differing byte at offset {}: cmp -- {} {}\n",
        size(&then),
        size(&run1),
        at(&then, &run1),
        then.display(),
        run1.display()
    );
    assert!(out.contains(&against), "{against:?} not in {out}");
    let between = format!(
        "between the runs: outputs differ: t\n  t: run 1's {} bytes, run 2's {} bytes, first differing byte at offset \
         {}: cmp -- {} {}\n",
        size(&run1),
        size(&run2),
        at(&run1, &run2),
        run1.display(),
        run2.display()
    );
    assert!(out.contains(&between), "only t differs: {between:?} not in {out}");
    assert!(out.find(&against) < out.find(&between), "the attempt first: {out}");
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]), "nothing labelled is left");
}

#[tokio::test]
async fn a_tampered_outcome_changed_inputs_and_missing_secrets_are_refused() {
    let Some((docker, _)) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let w = worker("replay-refused");
    let input = inputs(t.path());
    let outcome = attempt(t.path(), &w, &input, "cat /in/x > /out/y", &["TOKEN=s3cret"]);
    let json = std::fs::read_to_string(&outcome).unwrap();
    assert!(!json.contains("s3cret"), "no value in the Outcome");
    let refused = |file: &str, extra: &[&str], says: &str| {
        let o = replay(&w, file, &t.path().join(format!("r{}", rand::random::<u32>())), extra);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{err}");
        assert!(err.contains(says), "{says:?} not in {err}");
    };
    // The secret's key is named; given again, it runs.
    refused(&outcome, &[], "give TOKEN again");
    // A digest edited, an argv edited, bad JSON, another schema.
    let edit = |from: &str, to: &str| {
        let p = t.path().join(format!("edited-{}.json", rand::random::<u32>()));
        assert!(json.contains(from), "{from}");
        std::fs::write(&p, json.replacen(from, to, 1)).unwrap();
        p.display().to_string()
    };
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let digest = v["evidence"]["action"]["digest"].as_str().unwrap().to_owned();
    let forged = format!("sha256:{}", "0".repeat(64));
    refused(&edit(&digest, &forged), &["-e", "TOKEN=s3cret"], "is not that of its fields");
    refused(&edit("cat /in/x > /out/y", "cat /in/x > /out/z"), &["-e", "TOKEN=s3cret"], "the file was changed");
    refused(&edit("{", "["), &[], "not an outcome's JSON");
    refused(&edit("stevedore-action/1", "stevedore-action/9"), &[], "stevedore-action/9");
    // Inputs that changed are refused: of another size, unread; of the same size, by their
    // tree digest. --inputs runs on a new set and says so.
    std::fs::write(input.join("x"), b"changed\n").unwrap();
    refused(&outcome, &["-e", "TOKEN=s3cret"], "is not the attempt's (1 files, 6 bytes; it holds more)");
    std::fs::write(input.join("x"), b"HELLO\n").unwrap();
    refused(&outcome, &["-e", "TOKEN=s3cret"], "changed: their tree digest is");
    let o =
        replay(&w, &outcome, &t.path().join("new"), &["-e", "TOKEN=s3cret", "--inputs", &input.display().to_string()]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    assert!(out.contains("inputs replaced: digest sha256:"), "{out}");
    assert!(out.contains("against the attempt: run 1's outputs differ from the attempt's: y\n"), "{out}");
    assert!(out.contains("(the inputs were replaced: outputs other than the attempt's are expected)"), "{out}");
    assert_eq!(std::fs::read(t.path().join("new/run-1/y")).unwrap(), b"HELLO\n");
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]), "nothing labelled is left");
}

/// With an action key the values enter the digest as HMACs and are checked on replay; the
/// key never appears.
#[tokio::test]
async fn with_an_action_key_the_values_are_checked() {
    let Some((docker, _)) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let w = worker("replay-key");
    let key = t.path().join("key");
    std::fs::write(&key, "a key of mine, 16+ bytes\n").unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let input = inputs(t.path());
    let outcome = t.path().join("outcome.json").display().to_string();
    let k = key.display().to_string();
    let o = Command::new(BIN)
        .args(["run", "-q", "--worker", &w, "--image", BUSYBOX_IMAGE, "--outcome", &outcome, "--action-key-file", &k])
        .args(["--input", &input.display().to_string(), "--output", &t.path().join("o").display().to_string()])
        .args(["-e", "TOKEN=s3cret", "--", "sh", "-c", "echo $TOKEN > /out/t"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let json = std::fs::read_to_string(&outcome).unwrap();
    assert!(json.contains("\"TOKEN\":\"hmac-sha256:") && !json.contains("s3cret") && !json.contains("a key of mine"));
    let o = replay(&w, &outcome, &t.path().join("r1"), &["--action-key-file", &k, "-e", "TOKEN=other"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("values given for TOKEN are not the attempt's"), "{}", text(&o.stderr));
    let o = replay(&w, &outcome, &t.path().join("r2"), &["--action-key-file", &k, "-e", "TOKEN=s3cret"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", text(&o.stdout), text(&o.stderr));
    assert!(text(&o.stdout).contains("the same action"), "{}", text(&o.stdout));
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]), "nothing labelled is left");
}

/// The digest proves that the fields agree, not who wrote the file: an Outcome forged to ask
/// for the host's network, its digest made again, is refused unless the user trusts it; what
/// would run is said first.
#[tokio::test]
async fn a_forged_outcome_widening_the_sandbox_needs_trust() {
    let Some((docker, _)) = setup().await else { return };
    let t = tempfile::tempdir().unwrap();
    let w = worker("replay-forged");
    let input = inputs(t.path());
    let outcome = attempt(t.path(), &w, &input, "cat /in/x > /out/y", &[]);
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&outcome).unwrap()).unwrap();
    let mut action: stevedore::contract::Action = serde_json::from_value(v["evidence"]["action"].clone()).unwrap();
    action.network = "host".into();
    action.digest = action.compute_digest();
    v["evidence"]["action"] = serde_json::to_value(&action).unwrap();
    let forged = t.path().join("forged.json");
    std::fs::write(&forged, v.to_string()).unwrap();
    let o = replay(&w, &forged.display().to_string(), &t.path().join("r1"), &[]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}{}", text(&o.stdout));
    assert!(err.contains("network host") && err.contains("--trust"), "{err}");
    // The genuine one says what will run before it runs.
    let o = replay(&w, &outcome, &t.path().join("r2"), &[]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    assert!(out.contains("command [\"sh\", \"-c\", \"cat /in/x > /out/y\"], image sha256:"), "{out}");
    assert!(out.contains("network none"), "{out}");
    assert_eq!(labelled(&docker, &w).await, (vec![], vec![]), "nothing labelled is left");
}
