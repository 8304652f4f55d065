//! Fuzz targets for the parsers of untrusted bytes, with their invariants.
//!
//! Each function takes arbitrary bytes, runs one parser on them and panics when one of
//! its invariants breaks. The cargo-fuzz crate in `fuzz/` calls them under libFuzzer, and
//! `init/tests/fuzz_corpus.rs` replays the committed corpora through them on stable, so every
//! crash once found stays a regression test. Not part of the init's API.

use crate::cgroup;
use crate::report::{self, Report, ReportKind};
use crate::wire::{
    self, Decoder, Frame, FrameError, HEADER_LEN, HandlerHello, HandlerRecord, InitRecord, KEY_LEN, Kind,
    MAX_RECORD_BYTES, MAX_REPORT_BYTES, OutputEnd, Scope, Started,
};
use serde::{Serialize, de::DeserializeOwned};
use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

/// A fuzz target: its name (the corpus dir's) and its function.
pub type Target = (&'static str, fn(&[u8]));

/// Runs every file of `fuzz_dir/corpus/<name>/` and `fuzz_dir/artifacts/<name>/` through
/// its target; returns one line per input that broke an invariant. A target without a
/// corpus is one such line too.
pub fn replay(fuzz_dir: &Path, targets: &[Target]) -> Vec<String> {
    let mut failed = Vec::new();
    for &(name, target) in targets {
        let corpus = files(&fuzz_dir.join("corpus").join(name));
        if corpus.is_empty() {
            failed.push(format!("{name}: no corpus in {}", fuzz_dir.join("corpus").join(name).display()));
        }
        for file in corpus.iter().chain(&files(&fuzz_dir.join("artifacts").join(name))) {
            let data = match std::fs::read(file) {
                Ok(data) => data,
                // A fuzzer running beside the tests replaces corpus files as it reduces them.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => panic!("{}: {e}", file.display()),
            };
            if let Some(why) = breaks(target, &data) {
                failed.push(format!("{name}: {}: {why}", file.display()));
            }
        }
    }
    failed
}

/// One line per target of `targets` that `fuzz_dir` does not fuzz: a `[[bin]]` named for it
/// in `Cargo.toml` whose `path` is `fuzz_targets/<name>.rs`, a file calling
/// `<module>::<name>(` (`module` is the path of the `fuzzing` module, e.g.
/// `stevedore_init::fuzzing`). So what the fuzzer runs and what `cargo test` replays cannot
/// drift apart.
pub fn unfuzzed(fuzz_dir: &Path, module: &str, targets: &[Target]) -> Vec<String> {
    let manifest = std::fs::read_to_string(fuzz_dir.join("Cargo.toml")).unwrap_or_default();
    let bins = bins(&manifest);
    let mut missing = Vec::new();
    for (name, _) in targets {
        let path = format!("fuzz_targets/{name}.rs");
        match bins.iter().find(|(n, _)| n == name) {
            None => missing.push(format!("{name}: no [[bin]] in {}", fuzz_dir.join("Cargo.toml").display())),
            Some((_, p)) if *p != path => missing.push(format!("{name}: its [[bin]] runs {p:?}, not {path:?}")),
            Some(_) => {}
        }
        let source = fuzz_dir.join("fuzz_targets").join(format!("{name}.rs"));
        let calls = std::fs::read_to_string(&source).is_ok_and(|text| text.contains(&format!("{module}::{name}(")));
        if !calls {
            missing.push(format!("{name}: {} does not call {module}::{name}", source.display()));
        }
    }
    missing
}

/// The `(name, path)` of every `[[bin]]` table of a cargo-fuzz manifest, as cargo-fuzz
/// writes them (one `key = "value"` a line).
fn bins(manifest: &str) -> Vec<(String, String)> {
    let value = |table: &str, key: &str| {
        table.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().trim_matches('"').to_owned())
        })
    };
    manifest
        .split("[[bin]]")
        .skip(1)
        // A table ends where the next one starts.
        .map(|t| t.split("\n[").next().unwrap_or(t))
        .filter_map(|t| Some((value(t, "name")?, value(t, "path").unwrap_or_default())))
        .collect()
}

/// A seed: its target, its name (the file is `seed_<name>`), its bytes.
pub type Seed = (&'static str, &'static str, Vec<u8>);

/// Writes `seeds` into `fuzz_dir/corpus/<target>/seed_<name>`.
pub fn write_seeds(fuzz_dir: &Path, seeds: &[Seed]) -> std::io::Result<()> {
    for (target, name, data) in seeds {
        let dir = fuzz_dir.join("corpus").join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("seed_{name}")), data)?;
    }
    Ok(())
}

/// One line per seed that breaks its target's invariants (or names no target).
pub fn check_seeds(targets: &[Target], seeds: &[Seed]) -> Vec<String> {
    seeds
        .iter()
        .filter_map(|(target, name, data)| match targets.iter().find(|t| t.0 == *target) {
            None => Some(format!("seed {target}/{name}: no such target")),
            Some(&(_, f)) => breaks(f, data).map(|why| format!("seed {target}/{name}: {why}")),
        })
        .collect()
}

/// The panic message when `target` breaks an invariant on `data`.
fn breaks(target: fn(&[u8]), data: &[u8]) -> Option<String> {
    let panic = catch_unwind(AssertUnwindSafe(|| target(data))).err()?;
    let why = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)");
    Some(why.to_owned())
}

/// The files of `dir`, sorted; none when it does not exist.
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_file()).collect();
    files.sort();
    files
}

/// The key the `record` and `takeover` targets seal and answer with.
pub const FUZZ_KEY: [u8; KEY_LEN] = [0xab; KEY_LEN];

/// The scope the `report` target checks reports against.
pub fn fuzz_scope() -> Scope {
    Scope { job_id: "job".into(), attempt: 2 }
}

/// `wire::Decoder`, accepting every kind, fed `data[1..]` in pieces of `data[0] + 1` bytes.
pub fn frames(data: &[u8]) {
    let Some((&sel, stream)) = data.split_first() else { return };
    let piece = usize::from(sel) + 1;

    // The same stream decoded in one piece: the split must not change what comes out.
    let whole = decode_all(&mut Decoder::new(|_| true), &[stream]);
    let pieces: Vec<&[u8]> = stream.chunks(piece).collect();
    let mut d = Decoder::new(|_| true);
    let split = decode_all(&mut d, &pieces);
    assert_eq!(whole, split, "splitting the stream into {piece}-byte pieces changed the frames");

    let (frames, err) = split;
    let mut at = 0;
    for f in &frames {
        assert!(f.body.len() <= f.kind.max_body(), "{:?} body of {} bytes is over its cap", f.kind, f.body.len());
        let bytes = wire::encode(f.kind, &f.body);
        assert_eq!(&stream[at..at + bytes.len()], &bytes[..], "a frame does not re-encode to its bytes");
        at += bytes.len();
    }
    match err {
        Some(e) => {
            // The error is about the frame right after the last good one.
            let kind = stream[at];
            match &e {
                FrameError::UnknownKind(b) => assert!(*b == kind && Kind::from_byte(kind).is_none()),
                FrameError::TooLarge { kind: k, len } => {
                    assert_eq!(*k as u8, kind);
                    assert!(*len > k.max_body());
                }
                FrameError::Unexpected(k) => panic!("{k:?} refused by a decoder that accepts every kind"),
            }
            // Nothing after an error is trusted, and nothing is kept.
            assert_eq!(d.pending(), 0, "a failed decoder still holds bytes");
            d.feed(&wire::encode(Kind::Heartbeat, b""));
            assert_eq!(d.next_frame(), Err(e.clone()), "a decoder answered after an error");
            assert_eq!(d.next_frame(), Err(e), "a decoder answered after an error");
            assert_eq!(d.pending(), 0);
        }
        None => {
            // What is left is one incomplete frame.
            let rest = &stream[at..];
            assert_eq!(d.pending(), rest.len(), "pending() is not what is left");
            if rest.len() >= HEADER_LEN {
                let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
                assert!(rest.len() < HEADER_LEN + len, "a complete frame was left undecoded");
            }
        }
    }
}

/// Feeds `pieces`, takes every frame after each; stops at the first error.
fn decode_all(d: &mut Decoder, pieces: &[&[u8]]) -> (Vec<Frame>, Option<FrameError>) {
    let mut frames = Vec::new();
    let (mut fed, mut taken) = (0usize, 0usize);
    for p in pieces {
        d.feed(p);
        fed += p.len();
        loop {
            assert!(
                d.pending() <= fed - taken,
                "pending() {} is over the {} bytes not yet taken",
                d.pending(),
                fed - taken
            );
            match d.next_frame() {
                Ok(Some(f)) => {
                    taken += HEADER_LEN + f.body.len();
                    assert!(taken <= fed, "a frame of bytes never fed");
                    frames.push(f);
                }
                Ok(None) => break,
                Err(e) => {
                    for _ in 0..2 {
                        assert_eq!(d.next_frame(), Err(e.clone()), "a decoder answered after an error");
                    }
                    return (frames, Some(e));
                }
            }
        }
    }
    (frames, None)
}

/// `wire::decode_start` on a Start frame's body.
pub fn start(data: &[u8]) {
    let owned = wire::decode_start_owned(data.to_vec());
    let Ok((start, payload)) = wire::decode_start(data) else {
        assert!(owned.is_err(), "decode_start_owned took what decode_start refused");
        return;
    };
    assert_eq!(owned.as_ref().ok(), Some(&(start.clone(), payload.clone())), "the owned decode differs");
    assert_eq!(start.protocol, wire::PROTOCOL);
    assert!(payload.len() <= wire::MAX_PAYLOAD_BYTES);
    let frame = wire::encode_start(&start, &payload);
    assert_eq!(frame[0], Kind::Start as u8);
    let again = wire::decode_start(&frame[HEADER_LEN..]).expect("a re-encoded start decodes");
    assert_eq!(again, (start, payload), "a start does not survive encode_start/decode_start");
}

/// `wire::open_sealed` with [`FUZZ_KEY`], then every claim type on the JSON (sealed or not).
pub fn record(data: &[u8]) {
    // Sealing round-trips, and a changed body no longer opens.
    let sealed = wire::seal(&FUZZ_KEY, data);
    assert_eq!(wire::open_sealed(&FUZZ_KEY, &sealed).ok(), Some(data), "seal/open_sealed does not round-trip");
    let mut tampered = sealed.clone();
    let i = usize::from(data.first().copied().unwrap_or(0)) % tampered.len();
    tampered[i] ^= 0x01;
    assert!(wire::open_sealed(&FUZZ_KEY, &tampered).is_err(), "a tampered record opened");

    let json = match wire::open_sealed(&FUZZ_KEY, data) {
        Ok(json) => {
            assert_eq!(wire::seal(&FUZZ_KEY, json), data, "opened a body that is not the seal of its JSON");
            json
        }
        // Still parse the bytes as a claim: a MAC that verifies is all the fuzzer cannot make.
        Err(_) => data,
    };
    claim::<InitRecord>(json, MAX_RECORD_BYTES);
    // The handler's two claims go into the init's own record, whose frame has room for one
    // whole HandlerRecord more: they may grow only by the optional fields they left out.
    if let Some(again) = claim::<HandlerRecord>(json, MAX_RECORD_BYTES) {
        assert!(
            again.len() <= json.len() + 64,
            "a {}-byte handler record grows to {} in the init's",
            json.len(),
            again.len()
        );
    }
    if let Some(again) = claim::<HandlerHello>(json, Kind::HandlerHello.max_body()) {
        assert!(
            again.len() <= json.len() + 64,
            "a {}-byte hello grows to {} in the init's record",
            json.len(),
            again.len()
        );
    }
    claim::<Started>(json, Kind::Started.max_body());
    claim::<OutputEnd>(json, Kind::OutputEnd.max_body());
}

/// `parse_claim` never panics; what it accepts serialises and parses back to itself.
/// Returns the accepted claim re-serialised.
fn claim<T: DeserializeOwned + Serialize + PartialEq + Debug>(json: &[u8], max: usize) -> Option<Vec<u8>> {
    let v = wire::parse_claim::<T>(json, max).ok()?;
    let again = serde_json::to_vec(&v).expect("a claim always serialises");
    let back: T = serde_json::from_slice(&again).expect("a re-serialised claim parses");
    assert_eq!(back, v, "a claim does not survive serialise/parse");
    Some(again)
}

/// A report as the init receives it (JSON, then `check`), and the report client's
/// arguments (`data` as words).
pub fn report(data: &[u8]) {
    let scope = fuzz_scope();
    if let Ok(r) = serde_json::from_slice::<Report>(data) {
        let claimed = wire::parse_claim::<Report>(data, MAX_REPORT_BYTES).ok();
        if let Ok(checked) = r.clone().check(&scope) {
            assert_eq!((&checked.job_id, checked.attempt), (&None, None), "scope fields kept");
            if checked.kind == ReportKind::Progress {
                let p = checked.percent.expect("progress has a percent");
                assert!((0.0..=100.0).contains(&p), "progress {p}");
            }
            let json = serde_json::to_vec(&checked).expect("a report always serialises");
            if claimed.is_some() {
                // What the init accepts, it can forward: the Forwarded wrapper fits a frame.
                assert!(
                    json.len() <= MAX_REPORT_BYTES,
                    "an accepted {}-byte report re-serialises to {} bytes",
                    data.len(),
                    json.len()
                );
                let fwd = report::Forwarded { seq: u64::MAX, at_ms: u64::MAX, report: checked.clone() };
                let body = serde_json::to_vec(&fwd).expect("a report always serialises");
                assert!(body.len() <= Kind::Report.max_body(), "a forwarded report of {} bytes", body.len());
            }
            let back: Report = serde_json::from_slice(&json).expect("a re-serialised report parses");
            assert_eq!(back.clone().check(&scope).as_ref(), Ok(&checked), "a report checks differently");
        }
    }

    let text = String::from_utf8_lossy(data);
    let args: Vec<String> = text.split([' ', '\n']).map(str::to_owned).collect();
    if let Ok(r) = report::parse_args(&args) {
        let _ = r.check(&scope);
    }
}

/// The cgroup file parsers on `data` as (lossy) text.
pub fn cgroup(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let s = text.as_ref();

    let single = cgroup::parse_single(s);
    if let Ok(n) = single {
        assert_says(s.trim(), n);
    }
    match cgroup::parse_v2_limit(s) {
        Ok(None) => assert_eq!(s.trim(), "max"),
        Ok(Some(n)) => assert_eq!(single, Ok(n)),
        Err(_) => assert!(single.is_err() && s.trim() != "max"),
    }
    match cgroup::parse_v1_limit(s) {
        Ok(None) => assert!(single.as_ref().is_ok_and(|&n| n >= 1 << 62), "{single:?} taken as no limit"),
        Ok(Some(n)) => {
            assert!(n < 1 << 62, "v1 limit {n} is over 2^62");
            assert_eq!(single, Ok(n));
        }
        Err(_) => assert!(single.is_err()),
    }
    // A CPU quota read back is never under what the quota allows, nor taken from a "max".
    match cgroup::parse_v2_cpu_max(s) {
        Ok(None) => assert_eq!(s.split_whitespace().next(), Some("max")),
        Ok(Some(millis)) => {
            let mut w = s.split_whitespace();
            let quota: u64 = w.next().and_then(|q| q.parse().ok()).expect("a quota was parsed");
            let period: u64 = w.next().map_or(Some(100_000), |p| p.parse().ok()).expect("a period was parsed");
            assert!(u128::from(millis) * u128::from(period) >= u128::from(quota) * 1000 || millis == u64::MAX);
        }
        Err(_) => {}
    }
    for key in ["oom_kill", "usage_usec"] {
        let got = cgroup::parse_keyed(s, key);
        // The first line whose first word is the key says the value.
        let line = s.lines().find(|l| l.split_whitespace().next() == Some(key));
        match (got, line) {
            (Ok(n), Some(line)) => {
                let value = line.split_whitespace().nth(1).expect("a value was parsed");
                assert_says(value, n);
            }
            (Ok(n), None) => panic!("{key} {n} found in a text without a {key} line"),
            (Err(e), Some(line)) => {
                let value = line.split_whitespace().nth(1).unwrap_or("");
                assert!(value.parse::<u64>().is_err(), "{e} for the line {line:?}");
            }
            (Err(_), None) => {}
        }
    }
}

/// `text` is the decimal form of `n` (a leading `+` and leading zeros, which `u64`'s
/// parser takes, allowed).
fn assert_says(text: &str, n: u64) {
    let digits = text.strip_prefix('+').unwrap_or(text);
    assert!(!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()), "{text:?} parsed as {n}");
    let digits = digits.trim_start_matches('0');
    let digits = if digits.is_empty() { "0" } else { digits };
    assert_eq!(digits, n.to_string(), "{text:?} parsed as {n}");
}

/// `wire::takeover_open` on `data` as `[link id byte][nonce byte][resume byte][body]`
/// (the first three pick the link, the nonce and the resume point of the right proof), and
/// `wire::parse_key` on `data` as text.
pub fn takeover(data: &[u8]) {
    let (head, body) = data.split_at(data.len().min(3));
    let pick = |i: usize| head.get(i).copied().unwrap_or(0);
    let link_id: String = std::iter::repeat_n(char::from(b'a' + pick(0) % 6), 32).collect();
    let nonce = [pick(1); wire::NONCE_LEN];
    let resume = u64::from(pick(2)) << 24;
    let right = wire::takeover_proof(&FUZZ_KEY, &link_id, &nonce, resume);
    assert_eq!(wire::takeover_open(&FUZZ_KEY, &link_id, &right), Some((nonce, resume)), "the right proof is refused");
    // What opens is exactly a proof made with the key: its own nonce and resume point.
    match wire::takeover_open(&FUZZ_KEY, &link_id, body) {
        Some((n, r)) => assert_eq!(body, wire::takeover_proof(&FUZZ_KEY, &link_id, &n, r), "opened a forgery"),
        None => assert_ne!(body, right.as_slice(), "the right proof is refused"),
    }
    let mut other = FUZZ_KEY;
    other[0] ^= 1;
    assert_eq!(wire::takeover_open(&other, &link_id, &right), None, "another key's proof is accepted");
    let other_link: String = std::iter::repeat_n(char::from(b'a' + (pick(0) % 6 + 1) % 6), 32).collect();
    assert_eq!(wire::takeover_open(&FUZZ_KEY, &other_link, &right), None, "another link's proof is accepted");

    let text = String::from_utf8_lossy(data);
    if let Some(key) = wire::parse_key(&text) {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, text.to_ascii_lowercase(), "parse_key took {text:?}");
    }
    if wire::valid_link_id(&text) {
        assert!(text.len() == 32 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bin_is_its_name_and_path() {
        let manifest = "[package]\nname = \"fuzz\"\n\n[[bin]]\nname = \"extract\"\npath = \"fuzz_targets/limits.rs\"\n\
                        test = false\n\n[[bin]]\nname = \"limits\"\npath = \"fuzz_targets/limits.rs\"\n\n\
                        [profile.release]\ndebug = 1\n";
        assert_eq!(
            bins(manifest),
            [
                ("extract".to_owned(), "fuzz_targets/limits.rs".to_owned()),
                ("limits".to_owned(), "fuzz_targets/limits.rs".to_owned())
            ]
        );
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::create_dir_all(dir.join("fuzz_targets")).unwrap();
        std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
        for name in ["extract", "limits"] {
            std::fs::write(dir.join(format!("fuzz_targets/{name}.rs")), format!("m::{name}(data)")).unwrap();
        }
        let targets: [Target; 2] = [("extract", |_| {}), ("limits", |_| {})];
        let missing = unfuzzed(dir, "m", &targets);
        assert_eq!(missing, ["extract: its [[bin]] runs \"fuzz_targets/limits.rs\", not \"fuzz_targets/extract.rs\""]);
    }
}
