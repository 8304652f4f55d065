//! Extracting an untrusted tar of outputs without ever writing outside the destination.
//!
//! Every path is resolved one component at a time from a descriptor of the destination,
//! with `O_NOFOLLOW`, so a symlink created by an earlier entry can never redirect a later
//! write; files are created with `O_EXCL`, so nothing already there is written through.

use super::name::escape_name;
use crate::contract::RefusedEntry;
use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, fchmod, mkdirat};
use nix::unistd::{UnlinkatFlags, linkat, mkfifoat, symlinkat, unlinkat};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use tar::EntryType;

/// At most this many skipped entries are kept, so a hostile archive cannot blow memory.
const MAX_SKIPPED: usize = 1000;
/// At most this many entries skipped for the cap are named.
const MAX_OVER_CAP_NAMED: usize = 100;

/// What extracting a tar of outputs did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtractReport {
    /// Entries written.
    pub entries: u64,
    /// Bytes of regular-file content written.
    pub bytes: u64,
    /// Entries not extracted (devices, unsafe paths, over the cap), with why.
    pub skipped: Vec<RefusedEntry>,
}

/// Extracts an untrusted tar stream into `dest`, after removing the leading `strip`
/// component (e.g. `out` for a Docker archive of `/out`).
///
/// Everything is created as the current process, modes masked to `0o777` (files always
/// readable and directories always usable by their owner, the caller). Symlinks and FIFOs
/// are recreated, never followed, so a later [`walk()`](super::walk()) names them; hard links
/// are recreated only between entries inside `dest`. Entries that are not extracted are in
/// `skipped` with why: `unsafe_path` (absolute, `..`, outside `strip`, or through a
/// symlink or file), `device`, `hardlink`, `duplicate`, `over_cap`, `unsupported`,
/// `unwritable: <error>`. Once writing a file would pass `max_bytes`, no further file is
/// written. A malformed stream is an error; what was extracted before it stays.
pub fn extract_tar(r: impl Read, strip: &str, dest: &Path, max_bytes: u64) -> io::Result<ExtractReport> {
    let root = openat(AT_FDCWD, dest, dir_flags(), Mode::empty())?;
    let strip: Vec<&[u8]> = components(strip.as_bytes()).collect();
    let mut x = Extractor { root, max_bytes, report: ExtractReport::default(), over_cap: false, over_cap_named: 0 };
    let mut archive = tar::Archive::new(r);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let raw = entry.path_bytes().into_owned();
        let rel = match relative(&raw, &strip) {
            Ok(rel) => rel,
            Err(()) => {
                x.skip(&raw, "unsafe_path");
                continue;
            }
        };
        // The stripped root itself (`out/`) is `dest`, which the caller owns.
        let Some((name, dirs)) = rel.split_last() else {
            continue;
        };
        let shown = rel.join(&b'/');
        match x.entry(&mut entry, dirs, name, &strip) {
            Ok(()) => x.report.entries += 1,
            Err(Fail::Skip(why)) => x.skip(&shown, why),
            Err(Fail::OverCap) => x.skip_over_cap(&shown),
            Err(Fail::NotAnEntry) => {}
            Err(Fail::Stream(e)) => return Err(e),
        }
    }
    Ok(x.report)
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Why one entry was not extracted.
enum Fail {
    Skip(String),
    OverCap,
    /// Archive metadata that is neither extracted nor worth naming.
    NotAnEntry,
    /// The archive itself could not be read: nothing after it can be trusted.
    Stream(io::Error),
}

impl Fail {
    fn skip(why: &str) -> Self {
        Fail::Skip(why.to_owned())
    }

    fn unwritable(e: impl Into<io::Error>) -> Self {
        Fail::Skip(format!("unwritable: {}", e.into()))
    }
}

fn components(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.split(|&b| b == b'/').filter(|c| !c.is_empty() && *c != b".")
}

/// The components of `raw` below `strip`, or `Err` when the path is not safe to create.
fn relative<'a>(raw: &'a [u8], strip: &[&[u8]]) -> Result<Vec<&'a [u8]>, ()> {
    if raw.first() == Some(&b'/') {
        return Err(());
    }
    let all: Vec<&[u8]> = components(raw).collect();
    if all.iter().any(|c| *c == b".." || c.contains(&0)) {
        return Err(());
    }
    if !all.starts_with(strip) {
        return Err(());
    }
    Ok(all[strip.len()..].to_vec())
}

struct Extractor {
    root: OwnedFd,
    max_bytes: u64,
    report: ExtractReport,
    over_cap: bool,
    over_cap_named: usize,
}

impl Extractor {
    fn skip(&mut self, name: &[u8], why: impl Into<String>) {
        if self.report.skipped.len() < MAX_SKIPPED {
            self.report.skipped.push(RefusedEntry { name: escape_name(name), why: why.into() });
        }
    }

    fn skip_over_cap(&mut self, name: &[u8]) {
        if self.over_cap_named < MAX_OVER_CAP_NAMED {
            self.skip(name, "over_cap");
        }
        self.over_cap_named += 1;
    }

    /// Opens the directory `dirs` below the root, one component at a time and never through
    /// a symlink; missing ones are created when `create`, since a tar may list a directory
    /// after its children or not at all.
    fn open_dir(&self, dirs: &[&[u8]], create: bool) -> Result<OwnedFd, Fail> {
        let mut cur = self.root.try_clone().map_err(Fail::unwritable)?;
        for c in dirs {
            let next = match openat(&cur, *c, dir_flags(), Mode::empty()) {
                Err(Errno::ENOENT) if create => {
                    match mkdirat(&cur, *c, Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(Fail::unwritable(e)),
                    }
                    openat(&cur, *c, dir_flags(), Mode::empty())
                }
                other => other,
            };
            cur = match next {
                Ok(fd) => fd,
                // A symlink (ELOOP) or a non-directory (ENOTDIR) in the way.
                Err(Errno::ELOOP | Errno::ENOTDIR) => return Err(Fail::skip("unsafe_path")),
                Err(e) => return Err(Fail::unwritable(e)),
            };
        }
        Ok(cur)
    }

    fn entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        dirs: &[&[u8]],
        name: &[u8],
        strip: &[&[u8]],
    ) -> Result<(), Fail> {
        let header_mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        match entry.header().entry_type() {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.file(entry, dirs, name, header_mode)
            }
            EntryType::Directory => {
                let parent = self.open_dir(dirs, true)?;
                match mkdirat(&parent, name, Mode::from_bits_truncate(0o700)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(Fail::unwritable(e)),
                }
                let dir = match openat(&parent, name, dir_flags(), Mode::empty()) {
                    Ok(fd) => fd,
                    Err(Errno::ELOOP | Errno::ENOTDIR) => return Err(Fail::skip("unsafe_path")),
                    Err(e) => return Err(Fail::unwritable(e)),
                };
                // The caller must be able to read and clean up what it gets back.
                fchmod(&dir, Mode::from_bits_truncate(header_mode | 0o700)).map_err(Fail::unwritable)
            }
            EntryType::Symlink => {
                let target = entry.link_name_bytes().ok_or_else(|| Fail::skip("unsupported"))?.into_owned();
                let parent = self.open_dir(dirs, true)?;
                symlinkat(target.as_slice(), &parent, name).map_err(exists_or_unwritable)
            }
            EntryType::Fifo => {
                let parent = self.open_dir(dirs, true)?;
                mkfifoat(&parent, name, Mode::from_bits_truncate(header_mode)).map_err(exists_or_unwritable)
            }
            EntryType::Link => {
                let target = entry.link_name_bytes().ok_or_else(|| Fail::skip("hardlink"))?.into_owned();
                let target = relative(&target, strip).map_err(|()| Fail::skip("hardlink"))?;
                let Some((target_name, target_dirs)) = target.split_last() else {
                    return Err(Fail::skip("hardlink"));
                };
                let from = self.open_dir(target_dirs, false).map_err(|_| Fail::skip("hardlink"))?;
                let parent = self.open_dir(dirs, true)?;
                // No AT_SYMLINK_FOLLOW: a link to a symlink links the symlink itself, and
                // the kernel refuses to hard-link a directory.
                match linkat(&from, *target_name, &parent, name, AtFlags::empty()) {
                    Ok(()) => Ok(()),
                    Err(Errno::EEXIST) => Err(Fail::skip("duplicate")),
                    Err(_) => Err(Fail::skip("hardlink")),
                }
            }
            EntryType::Char | EntryType::Block => Err(Fail::skip("device")),
            // Archive-wide metadata, not an entry.
            EntryType::XGlobalHeader => Err(Fail::NotAnEntry),
            _ => Err(Fail::skip("unsupported")),
        }
    }

    fn file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        dirs: &[&[u8]],
        name: &[u8],
        mode: u32,
    ) -> Result<(), Fail> {
        let room = self.max_bytes.saturating_sub(self.report.bytes);
        if self.over_cap || entry.size() > room {
            self.over_cap = true;
            return Err(Fail::OverCap);
        }
        let parent = self.open_dir(dirs, true)?;
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = openat(&parent, name, flags, Mode::from_bits_truncate(0o600)).map_err(exists_or_unwritable)?;
        let mut file = File::from(fd);
        match copy_within(entry, &mut file, room) {
            Ok(written) => {
                self.report.bytes += written;
                // The caller must be able to read (and hash) what it gets back.
                fchmod(file.as_fd(), Mode::from_bits_truncate(mode | 0o400)).map_err(Fail::unwritable)
            }
            Err(fail) => {
                drop(file);
                let _ = unlinkat(&parent, name, UnlinkatFlags::NoRemoveDir);
                if matches!(fail, Fail::OverCap) {
                    self.over_cap = true;
                }
                Err(fail)
            }
        }
    }
}

fn exists_or_unwritable(e: Errno) -> Fail {
    if e == Errno::EEXIST { Fail::skip("duplicate") } else { Fail::unwritable(e) }
}

/// Copies at most `room` bytes; more (a sparse file larger than its header said) is
/// `OverCap`. Read errors are the stream's, write errors the destination's.
fn copy_within(src: &mut impl Read, dst: &mut impl Write, room: u64) -> Result<u64, Fail> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut written = 0u64;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => return Ok(written),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Fail::Stream(e)),
        };
        written += n as u64;
        if written > room {
            return Err(Fail::OverCap);
        }
        dst.write_all(&buf[..n]).map_err(Fail::unwritable)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outputs::{Caps, walk};
    use nix::unistd::mkfifo;
    use std::ffi::OsStr;
    use std::fs;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt, symlink};

    /// Appends an entry with exactly these name bytes, which `tar::Builder` would refuse
    /// to write for hostile names.
    fn raw(b: &mut tar::Builder<Vec<u8>>, kind: EntryType, path: &[u8], link: &[u8], data: &[u8], mode: u32) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name[..path.len()].copy_from_slice(path);
        gnu.linkname[..link.len()].copy_from_slice(link);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
        raw(b, EntryType::Regular, path.as_bytes(), b"", data, 0o644);
    }

    fn extract(b: tar::Builder<Vec<u8>>, dest: &Path, max: u64) -> ExtractReport {
        let bytes = b.into_inner().unwrap();
        extract_tar(bytes.as_slice(), "out", dest, max).unwrap()
    }

    fn why<'a>(r: &'a ExtractReport, name: &str) -> Option<&'a str> {
        r.skipped.iter().find(|e| e.name == name).map(|e| e.why.as_str())
    }

    #[test]
    fn round_trip_matches_a_walk_of_the_source() {
        let src = tempfile::tempdir().unwrap();
        let out = src.path().join("out");
        fs::create_dir_all(out.join("sub/deeper")).unwrap();
        fs::write(out.join("a.txt"), b"alpha").unwrap();
        fs::write(out.join("sub/b"), vec![7u8; 100_000]).unwrap();
        fs::write(out.join("sub/deeper/with space\nand newline é"), b"c").unwrap();
        fs::write(out.join("empty"), b"").unwrap();
        fs::write(out.join(OsStr::from_bytes(b"bad\xff")), b"d").unwrap();
        // A name past the 100-byte header field travels in a GNU long-name header.
        let long = "l".repeat(150);
        fs::write(out.join(&long), b"long").unwrap();
        fs::set_permissions(out.join("a.txt"), fs::Permissions::from_mode(0o640)).unwrap();
        symlink("a.txt", out.join("link")).unwrap();
        mkfifo(&out.join("pipe"), Mode::from_bits_truncate(0o600)).unwrap();

        let mut b = tar::Builder::new(Vec::new());
        b.follow_symlinks(false);
        b.append_dir_all("out", &out).unwrap();
        let dest = tempfile::tempdir().unwrap();
        let r = extract(b, dest.path(), u64::MAX);
        assert!(r.skipped.is_empty(), "{:?}", r.skipped);
        assert_eq!(r.bytes, 5 + 100_000 + 1 + 1 + 4);

        let before = walk(&out, &Caps::default()).unwrap();
        let after = walk(dest.path(), &Caps::default()).unwrap();
        assert_eq!(after, before);
        assert_eq!(after.files.len(), 5);
        let refused: Vec<(&str, &str)> = after.refused.iter().map(|e| (e.name.as_str(), e.why.as_str())).collect();
        assert_eq!(refused, [("bad\\xff", "non_utf8_name"), ("link", "symlink"), ("pipe", "fifo")]);
        assert_eq!(fs::read_link(dest.path().join("link")).unwrap(), Path::new("a.txt"));
        assert!(fs::symlink_metadata(dest.path().join("pipe")).unwrap().file_type().is_fifo());
        let mode = fs::metadata(dest.path().join("a.txt")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o640);
    }

    #[test]
    fn unsafe_paths_are_skipped() {
        let top = tempfile::tempdir().unwrap();
        let dest = top.path().join("dest");
        fs::create_dir(&dest).unwrap();
        let abs = top.path().join("abs");
        let mut b = tar::Builder::new(Vec::new());
        file(&mut b, "out/../escape", b"x");
        file(&mut b, "../escape", b"x");
        file(&mut b, "out/sub/../../escape", b"x");
        raw(&mut b, EntryType::Regular, abs.as_os_str().as_bytes(), b"", b"x", 0o644);
        file(&mut b, "elsewhere/x", b"x");
        file(&mut b, "out/ok", b"ok");
        let r = extract(b, &dest, u64::MAX);
        assert_eq!(r.entries, 1);
        assert_eq!(r.skipped.len(), 5, "{:?}", r.skipped);
        assert!(r.skipped.iter().all(|e| e.why == "unsafe_path"));
        assert!(!top.path().join("escape").exists());
        assert!(!abs.exists());
        assert_eq!(fs::read(dest.join("ok")).unwrap(), b"ok");
        assert_eq!(fs::read_dir(&dest).unwrap().count(), 1);
    }

    #[test]
    fn writes_through_earlier_symlinks_stay_contained() {
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        fs::write(&victim, b"original").unwrap();
        let outside_mode = fs::metadata(outside.path()).unwrap().mode();
        let dest = tempfile::tempdir().unwrap();
        let target = outside.path().as_os_str().as_bytes();
        let mut b = tar::Builder::new(Vec::new());
        // `a -> <outside>` then `a/passwd`: must not create <outside>/passwd.
        raw(&mut b, EntryType::Symlink, b"out/a", target, b"", 0o777);
        file(&mut b, "out/a/passwd", b"pwned");
        raw(&mut b, EntryType::Directory, b"out/a/sub/", b"", b"", 0o755);
        // `v -> <outside>/victim` then a file `v`: must not write through to the victim.
        raw(&mut b, EntryType::Symlink, b"out/v", victim.as_os_str().as_bytes(), b"", 0o777);
        file(&mut b, "out/v", b"pwned");
        // A directory entry over the symlink must not chmod what it points at.
        raw(&mut b, EntryType::Directory, b"out/a/", b"", b"", 0o777);
        // Hard links may not reach outside, nor through the symlink.
        raw(&mut b, EntryType::Link, b"out/h1", victim.as_os_str().as_bytes(), b"", 0o644);
        raw(&mut b, EntryType::Link, b"out/h2", b"out/a/victim", b"", 0o644);
        raw(&mut b, EntryType::Link, b"out/h3", b"out/../victim", b"", 0o644);
        let r = extract(b, dest.path(), u64::MAX);

        assert_eq!(r.entries, 2, "{:?}", r.skipped);
        assert_eq!(why(&r, "a/passwd"), Some("unsafe_path"));
        assert_eq!(why(&r, "a/sub"), Some("unsafe_path"));
        assert_eq!(why(&r, "a"), Some("unsafe_path"));
        assert_eq!(why(&r, "v"), Some("duplicate"));
        for h in ["h1", "h2", "h3"] {
            assert_eq!(why(&r, h), Some("hardlink"), "{h}");
        }
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 1);
        assert_eq!(fs::read(&victim).unwrap(), b"original");
        assert_eq!(fs::metadata(outside.path()).unwrap().mode(), outside_mode);
        assert!(fs::symlink_metadata(dest.path().join("a")).unwrap().file_type().is_symlink());
    }

    #[test]
    fn parents_are_created_and_modes_masked() {
        let dest = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        raw(&mut b, EntryType::Regular, b"out/x/y/z", b"", b"z", 0o4755);
        raw(&mut b, EntryType::Directory, b"out/x/", b"", b"", 0o1750);
        raw(&mut b, EntryType::Regular, b"out/locked", b"", b"l", 0o000);
        raw(&mut b, EntryType::Link, b"out/x/again", b"out/x/y/z", b"", 0o644);
        raw(&mut b, EntryType::Char, b"out/null", b"", b"", 0o666);
        raw(&mut b, EntryType::Regular, b"out/n\xffb", b"", b"n", 0o644);
        let r = extract(b, dest.path(), u64::MAX);
        assert_eq!(r.entries, 5, "{:?}", r.skipped);
        assert_eq!(why(&r, "null"), Some("device"));
        let mode = |p: &str| fs::symlink_metadata(dest.path().join(p)).unwrap().mode() & 0o7777;
        assert_eq!(mode("x/y/z"), 0o755);
        assert_eq!(mode("x"), 0o750);
        assert_eq!(mode("locked"), 0o400);
        assert_eq!(fs::read(dest.path().join("x/again")).unwrap(), b"z");
        assert_eq!(fs::metadata(dest.path().join("x/again")).unwrap().nlink(), 2);
        assert_eq!(fs::read(dest.path().join(OsStr::from_bytes(b"n\xffb"))).unwrap(), b"n");
        assert!(!dest.path().join("null").exists());
    }

    #[test]
    fn pax_path_is_honoured() {
        let dest = tempfile::tempdir().unwrap();
        let name = format!("out/{}/p\u{e9}x", "d".repeat(120));
        let record = |k: &str, v: &str| {
            let body = format!(" {k}={v}\n");
            let mut len = body.len() + 1;
            while format!("{len}{body}").len() != len {
                len += 1;
            }
            format!("{len}{body}")
        };
        let mut b = tar::Builder::new(Vec::new());
        raw(&mut b, EntryType::XHeader, b"PaxHeader", b"", record("path", &name).as_bytes(), 0o644);
        file(&mut b, "out/truncated-name", b"pax");
        let r = extract(b, dest.path(), u64::MAX);
        assert_eq!(r.entries, 1, "{:?}", r.skipped);
        let got = dest.path().join(name.strip_prefix("out/").unwrap());
        assert_eq!(fs::read(got).unwrap(), b"pax");
    }

    #[test]
    fn byte_cap_stops_writing() {
        let dest = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        file(&mut b, "out/a", &[1; 10]);
        file(&mut b, "out/b", &[2; 10]);
        file(&mut b, "out/c", &[3; 5]);
        raw(&mut b, EntryType::Directory, b"out/d/", b"", b"", 0o755);
        let r = extract(b, dest.path(), 15);
        assert_eq!(r.bytes, 10);
        assert_eq!(r.entries, 2);
        assert_eq!(why(&r, "b"), Some("over_cap"));
        assert_eq!(why(&r, "c"), Some("over_cap"));
        assert!(!dest.path().join("b").exists());
        assert!(!dest.path().join("c").exists());
        assert!(dest.path().join("d").is_dir());
    }

    #[test]
    fn symlinked_or_missing_dest_is_an_error() {
        let t = tempfile::tempdir().unwrap();
        symlink(t.path(), t.path().join("link")).unwrap();
        let empty = tar::Builder::new(Vec::new()).into_inner().unwrap();
        assert!(extract_tar(empty.as_slice(), "out", &t.path().join("link"), 1).is_err());
        assert!(extract_tar(empty.as_slice(), "out", &t.path().join("missing"), 1).is_err());
        assert!(extract_tar(&b"garbage that is not a tar"[..], "out", t.path(), 1).is_err());
    }
}
