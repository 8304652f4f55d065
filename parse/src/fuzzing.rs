//! Fuzz targets for the host's parsers of untrusted bytes, with their invariants.
//!
//! Each function takes arbitrary bytes, runs one parser on them and panics when one of its
//! invariants breaks. The cargo-fuzz crate in `fuzz/` calls them under libFuzzer, and
//! `parse/tests/fuzz_corpus.rs` replays the committed corpora through them on stable. The
//! init's parsers (frames, records, reports, cgroup files) have theirs in
//! `stevedore_init::fuzzing`. Not part of the API.

use crate::limits::{parse_cpus, parse_duration, parse_size};
use crate::outputs::{Caps, ExtractReport, MAX_REFUSED, extract_bounded};
use crate::profiles::ProfileError;
use nix::fcntl::{AT_FDCWD, OFlag, openat};
use nix::sys::stat::Mode;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A fresh private directory for one run, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("stevedore-fuzz-{}-{n}", std::process::id()));
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod scratch");
                    return Self(dir);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("creating a scratch dir {}: {e}", dir.display()),
            }
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `outputs::extract_into` on `data[2..]` as the outputs tar, with caps of at most
/// `data[0] % 8 + 1` files and `data[1] * 256` bytes, keeping at most `data[0] / 8 - 1`
/// refused entries (the parser's own 1000 when `data[0] < 8`), which puts the entry cap
/// (twice the files plus the refused) within reach of a short input.
///
/// Invariants: nothing is created outside the destination; only regular files (one link
/// each) and directories are created, none writable by group or other; the files listed
/// are exactly the regular files on disk, with their real sizes and hashes, sorted by name
/// however the stream ended; the caps hold; once over a cap (files, bytes or entries),
/// nothing more is read (bytes appended to the stream are neither read nor change what is
/// extracted).
pub fn extract(data: &[u8]) {
    let [sel, bytes, tar @ ..] = data else { return };
    let caps = Caps { max_files: usize::from(sel % 8) + 1, max_total_bytes: u64::from(*bytes) * 256 };
    let max_refused = match sel / 8 {
        0 => MAX_REFUSED,
        n => usize::from(n) - 1,
    };
    let (report, read) = extract_checked(tar, &caps, max_refused);
    if report.limit_hit {
        // The same stream with a valid entry after it: over the cap, it must never be read.
        let longer = [tar, &after_the_cap()].concat();
        let (again, read_again) = extract_checked(&longer, &caps, max_refused);
        assert_eq!(read_again, read, "reading went on past the cap");
        assert_eq!(again, report, "bytes after the cap changed what was extracted");
    }
}

/// A tar entry (a regular file, then the end of the archive) to append after a stream.
fn after_the_cap() -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_path("zz-after-the-cap").expect("a short name");
    h.set_size(3);
    h.set_mode(0o644);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, &b"new"[..]).expect("appending to a Vec");
    b.into_inner().expect("finishing a Vec")
}

/// A reader that counts what was taken from it.
pub(crate) struct Counting<'a> {
    pub inner: &'a [u8],
    pub taken: usize,
}

impl Read for Counting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.taken += n;
        Ok(n)
    }
}

/// Extracts `tar` into a fresh destination beside a canary and checks what is on disk
/// against the report; returns the report and how many bytes were read.
fn extract_checked(tar: &[u8], caps: &Caps, max_refused: usize) -> (ExtractReport, usize) {
    let scratch = Scratch::new();
    let dest = scratch.0.join("out");
    std::fs::create_dir(&dest).expect("creating the destination");
    std::fs::write(scratch.0.join("canary"), b"canary").expect("writing the canary");
    let fd = openat(AT_FDCWD, &dest, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .expect("opening the destination");

    let mut report = ExtractReport::default();
    let mut reader = Counting { inner: tar, taken: 0 };
    let result = extract_bounded(&mut reader, &fd, caps, max_refused, &mut report);

    // Nothing beside the destination changed.
    let mut beside: Vec<String> = std::fs::read_dir(&scratch.0)
        .expect("listing the scratch dir")
        .map(|e| e.expect("an entry").file_name().to_string_lossy().into_owned())
        .collect();
    beside.sort();
    assert_eq!(beside, ["canary", "out"], "extraction created something outside the destination");
    assert_eq!(std::fs::read(scratch.0.join("canary")).expect("the canary"), b"canary");
    let meta = std::fs::symlink_metadata(&dest).expect("the destination");
    assert!(meta.is_dir(), "the destination was replaced");

    // What is on disk is what is listed.
    let mut on_disk = BTreeMap::new();
    walk(&dest, "", &mut on_disk);
    let listed: BTreeMap<&str, _> = report.files.iter().map(|f| (f.name.as_str(), f)).collect();
    assert_eq!(listed.len(), report.files.len(), "a file listed twice");
    assert!(
        report.files.is_sorted_by(|a, b| a.name < b.name),
        "the files are not sorted by name (stream error: {:?})",
        result.as_ref().err()
    );
    assert_eq!(
        on_disk.keys().map(String::as_str).collect::<Vec<_>>(),
        listed.keys().copied().collect::<Vec<_>>(),
        "the files on disk are not the files listed (stream error: {:?})",
        result.as_ref().err()
    );
    let mut total = 0u64;
    for (name, (size, hash)) in &on_disk {
        let f = listed[name.as_str()];
        assert_eq!((f.size, &f.hash), (*size, hash), "{name} is listed with another size or hash");
        total += size;
    }
    assert_eq!(report.bytes, total, "the bytes reported are not the bytes written");
    assert!(report.files.len() <= caps.max_files, "{} files over a cap of {}", report.files.len(), caps.max_files);
    assert!(total <= caps.max_total_bytes, "{total} bytes over a cap of {}", caps.max_total_bytes);
    assert!(report.refused.len() <= max_refused, "{} refused entries kept over {max_refused}", report.refused.len());
    (report, reader.taken)
}

/// Every regular file below `dir` with its size and hash; panics on anything else than a
/// regular file or a directory, on a hard link and on group or other write.
fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, (u64, String)>) {
    for e in std::fs::read_dir(dir).expect("listing an extracted dir") {
        let e = e.expect("an entry");
        let name = format!("{prefix}{}", e.file_name().to_str().expect("an extracted name is UTF-8"));
        let meta = std::fs::symlink_metadata(e.path()).expect("an extracted entry");
        assert_eq!(meta.mode() & 0o022, 0, "{name} is writable by group or other: {:o}", meta.mode());
        if meta.is_dir() {
            walk(&e.path(), &format!("{name}/"), out);
        } else {
            assert!(meta.is_file(), "{name} is neither a file nor a directory: {:?}", meta.file_type());
            assert_eq!(meta.nlink(), 1, "{name} has {} links", meta.nlink());
            let content = std::fs::read(e.path()).expect("an extracted file");
            let hash = format!("sha256:{:x}", Sha256::digest(&content));
            out.insert(name, (content.len() as u64, hash));
        }
    }
}

/// The command line's sizes, CPU amounts and durations on `data` as (lossy) text.
///
/// Invariants: what parses says the same in its plainest form (`N` bytes, `Nm` millicores);
/// a whole number with a unit parses exactly (no float rounding), and so does a whole
/// number of milliseconds.
pub fn limits(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let s = text.as_ref();

    if let Ok(n) = parse_size(s) {
        assert_eq!(parse_size(&n.to_string()), Ok(n), "{s:?} is {n} bytes, but {n} is not");
    }
    if let Some((digits, mult)) = whole_with_unit(s, &[("", 1), ("k", 1 << 10), ("m", 1 << 20), ("g", 1 << 30)])
        && let Some(n) = digits.parse::<u64>().ok().and_then(|d| d.checked_mul(mult))
    {
        assert_eq!(parse_size(s), Ok(n), "{s:?}");
    }
    if let Ok(m) = parse_cpus(s) {
        assert_eq!(parse_cpus(&format!("{m}m")), Ok(m), "{s:?} is {m} millicores, but {m}m is not");
    }
    if let Ok(d) = parse_duration(s) {
        let ms = d.as_millis();
        if d == Duration::from_millis(ms as u64) {
            assert_eq!(parse_duration(&format!("{ms}ms")), Ok(d), "{s:?} is {ms} ms, but {ms}ms is not");
        }
    }
    if let Some((digits, mult)) = whole_with_unit(s, &[("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000)])
        && let Some(ms) = digits.parse::<u64>().ok().and_then(|d| d.checked_mul(mult))
    {
        assert_eq!(parse_duration(s), Ok(Duration::from_millis(ms)), "{s:?}");
    }
}

/// `s` as `<digits><unit>` for one of `units` (the longest that matches), with the unit's
/// multiplier.
fn whole_with_unit<'a>(s: &'a str, units: &[(&str, u64)]) -> Option<(&'a str, u64)> {
    let s = s.trim();
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(end);
    if digits.is_empty() {
        return None;
    }
    units.iter().find(|(u, _)| *u == unit).map(|&(_, m)| (digits, m))
}

/// `profiles::parse` on `data` as a profiles file, the profile named on its first line
/// (`# name`).
///
/// Invariants: the same text gives the same answer; an error names the file, or the
/// profile for a bad value; a profile that parses survives a round trip (rendered as TOML
/// in its plainest form, it parses back to the same profile).
pub fn profiles(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let name = text.lines().next().and_then(|l| l.strip_prefix("# ")).unwrap_or("dev");
    let path = Path::new("/fuzz/profiles.toml");
    let first = crate::profiles::parse(&text, path, name);
    let again = crate::profiles::parse(&text, path, name);
    assert_eq!(format!("{first:?}"), format!("{again:?}"), "the same profiles parse differently");
    match first {
        Ok(p) => {
            let rendered = p.to_toml(name);
            match crate::profiles::parse(&rendered, path, name) {
                Ok(back) => assert!(back == p, "{p:?} came back as {back:?} through\n{rendered}"),
                Err(e) => panic!("{p:?} rendered as\n{rendered}\ndoes not parse: {e}"),
            }
        }
        Err(e) => {
            let msg = e.to_string();
            let named = match &e {
                ProfileError::Value { profile, .. } => msg.contains(&format!("{profile:?}")),
                _ => msg.contains("/fuzz/profiles.toml"),
            };
            assert!(named, "an error that does not say where: {msg}");
        }
    }
}
