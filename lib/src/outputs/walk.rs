//! Listing an output dir without following any symlink.

use super::Caps;
use super::hash::hash_reader;
use crate::contract::{OutputFile, RefusedEntry};
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::Path;
use stevedore_init::tree::{self, Kind};
use stevedore_init::wire::escape_name;
use stevedore_parse::outputs::{SNIFF_LEN, content_type};

/// At most this many refused entries are kept, so a hostile tree cannot blow memory.
const MAX_REFUSED: usize = 1000;
/// At most this many entries skipped for the caps are named.
const MAX_OVER_CAP_NAMED: usize = 100;
use stevedore_init::tree::MAX_DEPTH;

/// What a walk of an output dir found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalkReport {
    /// Regular files, sorted by name, hashed.
    pub files: Vec<OutputFile>,
    /// Entries not followed or hashed, with why.
    pub refused: Vec<RefusedEntry>,
    /// Sum of the listed files' sizes.
    pub total_bytes: u64,
    /// The caps were reached: the list is incomplete.
    pub limit_hit: bool,
}

/// Walks `dir`, never following a symlink at any component, and hashes every regular file.
///
/// Files are visited in name order, so when a cap is reached the listed files are exactly
/// the first ones by name; the rest are named (up to a bound) as `over_cap`. Only a failure
/// to open or read `dir` itself is an error; trouble below it becomes a refused entry.
pub fn walk(dir: &Path, caps: &Caps) -> io::Result<WalkReport> {
    let root = tree::open_root(dir, false)?;
    let mut w = Walker { caps, report: WalkReport::default(), over_cap_named: 0 };
    w.dir(root, b"", 0)?;
    let mut report = w.report;
    report.files.sort_by(|a, b| a.name.cmp(&b.name));
    report.refused.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(report)
}

/// The regular files under `dir` (relative, `/`-separated, escaped as refused names are),
/// in name order, at most `max` of them, nothing followed or read: what a host that still
/// reaches `/out` names when its outputs did not all arrive.
#[cfg(feature = "process")]
pub fn list(dir: &Path, max: usize) -> io::Result<Vec<String>> {
    fn visit(dir: &OwnedFd, prefix: &[u8], depth: usize, max: usize, out: &mut Vec<String>) -> io::Result<()> {
        let (children, _) = tree::children(dir, max.saturating_add(1), |_| true)?;
        for child in children {
            if out.len() >= max {
                return Ok(());
            }
            let mut path = prefix.to_vec();
            path.extend_from_slice(&child.name);
            match child.kind {
                Kind::File => out.push(escape_name(&path)),
                Kind::Dir if depth + 1 < MAX_DEPTH => {
                    if let Ok(sub) = tree::open_dir(dir, &child.name) {
                        path.push(b'/');
                        // An unreadable subdir names nothing: the walk goes on.
                        let _ = visit(&sub, &path, depth + 1, max, out);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
    let root = tree::open_root(dir, false)?;
    let mut out = Vec::new();
    visit(&root, b"", 0, max, &mut out)?;
    Ok(out)
}

struct Walker<'a> {
    caps: &'a Caps,
    report: WalkReport,
    over_cap_named: usize,
}

impl Walker<'_> {
    /// Past the caps, with enough skipped entries named: nothing more is worth visiting.
    fn done(&self) -> bool {
        self.report.limit_hit && self.over_cap_named >= MAX_OVER_CAP_NAMED
    }

    fn refuse(&mut self, name: &[u8], why: impl Into<String>) {
        if self.report.refused.len() < MAX_REFUSED {
            self.report.refused.push(RefusedEntry { name: escape_name(name), why: why.into() });
        }
    }

    fn over_cap(&mut self, name: &[u8]) {
        self.report.limit_hit = true;
        if self.over_cap_named < MAX_OVER_CAP_NAMED {
            self.refuse(name, "over_cap");
        }
        self.over_cap_named += 1;
    }

    /// Reads the entries of `dir`, keeping only the first ones by order when there are more
    /// than the caps could ever use, so one huge directory cannot exhaust memory.
    fn children(&self, dir: &OwnedFd) -> io::Result<(Vec<tree::Child>, bool)> {
        let keep = self.caps.max_files.saturating_add(MAX_REFUSED).saturating_add(1);
        tree::children(dir, keep, |_| true)
    }

    fn dir(&mut self, dir: OwnedFd, prefix: &[u8], depth: usize) -> io::Result<()> {
        let (children, truncated) = self.children(&dir)?;
        for child in children {
            if self.done() {
                return Ok(());
            }
            let mut path = prefix.to_vec();
            path.extend_from_slice(&child.name);
            if std::str::from_utf8(&child.name).is_err() {
                self.refuse(&path, "non_utf8_name");
                continue;
            }
            match child.kind {
                Kind::File => self.file(&dir, &child.name, &path),
                Kind::Dir => self.subdir(&dir, &child.name, path, depth),
                other => self.refuse(&path, other.word()),
            }
        }
        // The dropped entries sort after every kept one, so the caps count from here on.
        if truncated {
            let name = if prefix.is_empty() { b".".as_slice() } else { &prefix[..prefix.len() - 1] };
            self.over_cap(name);
        }
        Ok(())
    }

    fn subdir(&mut self, parent: &OwnedFd, name: &[u8], mut path: Vec<u8>, depth: usize) {
        if depth + 1 >= MAX_DEPTH {
            self.refuse(&path, "too_deep");
            return;
        }
        let sub = match tree::open_dir(parent, name) {
            Ok(d) => d,
            // Replaced since it was listed.
            Err(r) => return self.refuse(&path, r.why()),
        };
        path.push(b'/');
        if let Err(e) = self.dir(sub, &path, depth + 1) {
            path.pop();
            self.refuse(&path, format!("unreadable: {e}"));
        }
    }

    fn file(&mut self, parent: &OwnedFd, name: &[u8], path: &[u8]) {
        if self.report.limit_hit {
            return self.over_cap(path);
        }
        // The descriptor, not the name, decides: the entry may have changed since listing.
        let (file, st) = match tree::open_file(parent, name) {
            Ok(f) => f,
            Err(r) => return self.refuse(path, r.why()),
        };
        let room = self.caps.max_total_bytes.saturating_sub(self.report.total_bytes);
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if self.report.files.len() >= self.caps.max_files || size > room {
            return self.over_cap(path);
        }
        // Reading one byte past the room tells a file that grew since fstat from one that fits.
        let hashed = match hash_reader(file.take(room.saturating_add(1)), SNIFF_LEN) {
            Ok(h) => h,
            Err(e) => return self.refuse(path, format!("unreadable: {e}")),
        };
        if hashed.size > room {
            return self.over_cap(path);
        }
        let name = String::from_utf8(path.to_vec()).expect("checked to be UTF-8 component by component");
        let content_type = content_type(&name, &hashed.head);
        self.report.total_bytes += hashed.size;
        self.report.files.push(OutputFile { name, size: hashed.size, hash: hashed.hash, content_type });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    use nix::unistd::mkfifo;
    use std::ffi::OsStr;
    use std::fs;
    use std::fs::File;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::symlink;
    use std::os::unix::net::UnixListener;
    use std::path::PathBuf;
    use std::process::{Command, Stdio};

    /// The digest by an independent implementation.
    fn sha256sum(path: &Path) -> String {
        let out =
            Command::new("sha256sum").stdin(Stdio::from(File::open(path).unwrap())).output().expect("sha256sum runs");
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        format!("sha256:{}", text.split_whitespace().next().unwrap())
    }

    fn write(root: &Path, name: &str, data: &[u8]) -> PathBuf {
        let p = root.join(name);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, data).unwrap();
        p
    }

    fn names(r: &WalkReport) -> Vec<&str> {
        r.files.iter().map(|f| f.name.as_str()).collect()
    }

    fn refused(r: &WalkReport, name: &str) -> Option<String> {
        r.refused.iter().find(|e| e.name == name).map(|e| e.why.clone())
    }

    #[test]
    #[cfg(feature = "process")]
    fn a_listing_names_regular_files_only_in_order_and_bounded() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), "b.txt", b"b");
        write(t.path(), "a/z.txt", b"z");
        write(t.path(), "a/y.txt", b"y");
        symlink("/etc/passwd", t.path().join("link")).unwrap();
        mkfifo(&t.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(list(t.path(), 10).unwrap(), ["a/y.txt", "a/z.txt", "b.txt"]);
        assert_eq!(list(t.path(), 2).unwrap(), ["a/y.txt", "a/z.txt"]);
        // A symlinked root is not followed.
        symlink(t.path().join("a"), t.path().join("to-a")).unwrap();
        assert!(list(&t.path().join("to-a"), 10).is_err());
    }

    #[test]
    fn hashes_sizes_and_names_are_exact() {
        let t = tempfile::tempdir().unwrap();
        let big: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("plain.txt", b"hello\n".to_vec()),
            ("with space.txt", b"s".to_vec()),
            ("new\nline", b"n".to_vec()),
            ("ünï/ファイル.dat", b"u".to_vec()),
            ("a/b/c/deep.bin", big),
            ("empty", Vec::new()),
        ];
        let mut paths = Vec::new();
        for (name, data) in &cases {
            paths.push((*name, write(t.path(), name, data), data.len() as u64));
        }
        let r = walk(t.path(), &Caps::default()).unwrap();
        assert!(r.refused.is_empty(), "{:?}", r.refused);
        assert!(!r.limit_hit);
        let mut expected: Vec<&str> = cases.iter().map(|(n, _)| *n).collect();
        expected.sort();
        assert_eq!(names(&r), expected);
        for (name, path, size) in paths {
            let f = r.files.iter().find(|f| f.name == name).unwrap();
            assert_eq!(f.size, size, "{name}");
            assert_eq!(f.hash, sha256sum(&path), "{name}");
            assert_eq!(f.hash.len(), "sha256:".len() + 64);
        }
        assert_eq!(r.total_bytes, cases.iter().map(|(_, d)| d.len() as u64).sum::<u64>());
        let empty = r.files.iter().find(|f| f.name == "empty").unwrap();
        assert_eq!(empty.hash, "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }

    #[test]
    fn visit_order_is_name_order_so_caps_keep_a_sorted_prefix() {
        let t = tempfile::tempdir().unwrap();
        // ' ' sorts before '/', so "a b" precedes "a/b" although the directory "a" precedes
        // the file "a b" by name.
        write(t.path(), "a/b", b"1");
        write(t.path(), "a b", b"2");
        write(t.path(), "a-c", b"3");
        let all = walk(t.path(), &Caps::default()).unwrap();
        assert_eq!(names(&all), ["a b", "a-c", "a/b"]);
        let one = walk(t.path(), &Caps { max_files: 1, ..Caps::default() }).unwrap();
        assert_eq!(names(&one), ["a b"]);
        assert!(one.limit_hit);
        assert_eq!(refused(&one, "a-c").as_deref(), Some("over_cap"));
        assert_eq!(refused(&one, "a/b").as_deref(), Some("over_cap"));
    }

    #[test]
    fn symlinks_are_named_never_followed() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        write(outside.path(), "secret", b"s");
        write(t.path(), "real/file", b"f");
        symlink("real/file", t.path().join("to_file")).unwrap();
        symlink("real", t.path().join("to_dir")).unwrap();
        symlink(outside.path(), t.path().join("to_outside")).unwrap();
        symlink("nowhere", t.path().join("dangling")).unwrap();
        let r = walk(t.path(), &Caps::default()).unwrap();
        assert_eq!(names(&r), ["real/file"]);
        for l in ["to_file", "to_dir", "to_outside", "dangling"] {
            assert_eq!(refused(&r, l).as_deref(), Some("symlink"), "{l}");
        }
        assert_eq!(r.refused.len(), 4);
    }

    #[test]
    fn fifos_sockets_and_devices_are_refused() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), "f.txt", b"x");
        mkfifo(&t.path().join("pipe"), Mode::from_bits_truncate(0o644)).unwrap();
        let _listener = UnixListener::bind(t.path().join("sock")).unwrap();
        // Only root may make a device node; elsewhere that case is just not exercised.
        let dev = mknod(&t.path().join("null"), SFlag::S_IFCHR, Mode::from_bits_truncate(0o600), makedev(1, 3)).is_ok();
        let r = walk(t.path(), &Caps::default()).unwrap();
        assert_eq!(names(&r), ["f.txt"]);
        assert_eq!(refused(&r, "pipe").as_deref(), Some("fifo"));
        assert_eq!(refused(&r, "sock").as_deref(), Some("socket"));
        if dev {
            assert_eq!(refused(&r, "null").as_deref(), Some("device"));
        }
    }

    #[test]
    fn non_utf8_names_are_refused_and_escaped() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join(OsStr::from_bytes(b"bad\xffname")), b"x").unwrap();
        let bad_dir = t.path().join(OsStr::from_bytes(b"dir\xfe"));
        fs::create_dir(&bad_dir).unwrap();
        fs::write(bad_dir.join("inner"), b"y").unwrap();
        write(t.path(), "sub/ok", b"z");
        fs::write(t.path().join("sub").join(OsStr::from_bytes(b"\xc3(")), b"w").unwrap();
        let r = walk(t.path(), &Caps::default()).unwrap();
        assert_eq!(names(&r), ["sub/ok"]);
        assert_eq!(refused(&r, "bad\\xffname").as_deref(), Some("non_utf8_name"));
        assert_eq!(refused(&r, "dir\\xfe").as_deref(), Some("non_utf8_name"));
        assert_eq!(refused(&r, "sub/\\xc3(").as_deref(), Some("non_utf8_name"));
        assert_eq!(r.refused.len(), 3, "{:?}", r.refused);
    }

    #[test]
    fn file_and_byte_caps() {
        let t = tempfile::tempdir().unwrap();
        for n in ["a", "b", "c"] {
            write(t.path(), n, &[0u8; 10]);
        }
        let exact = walk(t.path(), &Caps { max_files: 3, max_total_bytes: 30 }).unwrap();
        assert!(!exact.limit_hit);
        assert_eq!(exact.total_bytes, 30);

        let files = walk(t.path(), &Caps { max_files: 2, max_total_bytes: 1 << 20 }).unwrap();
        assert!(files.limit_hit);
        assert_eq!(names(&files), ["a", "b"]);
        assert_eq!(files.total_bytes, 20);
        assert_eq!(refused(&files, "c").as_deref(), Some("over_cap"));

        write(t.path(), "d", b"");
        let bytes = walk(t.path(), &Caps { max_files: 100, max_total_bytes: 25 }).unwrap();
        assert!(bytes.limit_hit);
        assert_eq!(names(&bytes), ["a", "b"]);
        assert_eq!(bytes.total_bytes, 20);
        // Listing stops at the cap: the empty "d" would fit but is not listed after it.
        assert_eq!(refused(&bytes, "c").as_deref(), Some("over_cap"));
        assert_eq!(refused(&bytes, "d").as_deref(), Some("over_cap"));
    }

    #[test]
    fn over_cap_naming_is_bounded() {
        let t = tempfile::tempdir().unwrap();
        for i in 0..(MAX_OVER_CAP_NAMED + 50) {
            write(t.path(), &format!("f{i:04}"), b"");
        }
        let r = walk(t.path(), &Caps { max_files: 1, ..Caps::default() }).unwrap();
        assert_eq!(r.files.len(), 1);
        assert_eq!(r.refused.len(), MAX_OVER_CAP_NAMED);
    }

    #[test]
    fn content_types() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), "r.json", b"{\"a\":1}");
        write(t.path(), "picture", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x02\0\0\0");
        write(t.path(), "blob", &[1, 2, 3, 4]);
        let r = walk(t.path(), &Caps::default()).unwrap();
        let ct = |n: &str| r.files.iter().find(|f| f.name == n).unwrap().content_type.clone();
        assert_eq!(ct("r.json"), "application/json");
        assert_eq!(ct("picture"), "image/png");
        assert_eq!(ct("blob"), "application/octet-stream");
    }

    #[test]
    fn root_must_be_a_real_directory() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real");
        write(&real, "x", b"x");
        symlink(&real, t.path().join("link")).unwrap();
        assert!(walk(&t.path().join("link"), &Caps::default()).is_err());
        assert!(walk(&real.join("x"), &Caps::default()).is_err());
        assert!(walk(&t.path().join("missing"), &Caps::default()).is_err());
        assert_eq!(names(&walk(&real, &Caps::default()).unwrap()), ["x"]);
    }

    #[test]
    fn too_deep_is_refused_not_an_error() {
        let t = tempfile::tempdir().unwrap();
        let mut rel = String::new();
        for _ in 0..MAX_DEPTH + 2 {
            rel.push_str("d/");
        }
        write(t.path(), &format!("{rel}leaf"), b"x");
        write(t.path(), "top", b"y");
        let r = walk(t.path(), &Caps::default()).unwrap();
        assert_eq!(names(&r), ["top"]);
        assert_eq!(r.refused.len(), 1);
        assert_eq!(r.refused[0].why, "too_deep");
    }
}
