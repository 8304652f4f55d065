//! Extracting the outputs tar into the caller's output dir, hashing each file as it is
//! written: every output byte is read once.
//!
//! The tar comes from stevedore's init, which sends only regular files and directories;
//! this side still treats it as untrusted. Every path is resolved one component at a time
//! from a descriptor of the destination with `O_NOFOLLOW`, files are created with `O_EXCL`
//! (nothing already there is written through), only regular files and directories are
//! created, modes lose group and other write, and everything belongs to the caller. Caps on
//! entries, files and bytes stop the reading: past them nothing more is consumed.

use super::content_type::{SNIFF_LEN, content_type};
use super::hash::{Job, Pool};
use super::{Caps, OutputFile, RefusedEntry};
use nix::errno::Errno;
use nix::sys::stat::{Mode, fchmod};
use nix::unistd::{UnlinkatFlags, unlinkat};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use stevedore_init::tree;
use stevedore_init::wire::escape_name;
use tar::EntryType;

/// At most this many refused entries are kept, so a hostile archive cannot blow memory.
pub(crate) const MAX_REFUSED: usize = 1000;

/// What extracting the outputs tar did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtractReport {
    /// The files written, hashed, sorted by name.
    pub files: Vec<OutputFile>,
    /// Bytes of file content written.
    pub bytes: u64,
    /// Entries not extracted, with why.
    pub refused: Vec<RefusedEntry>,
    /// A cap was reached: reading stopped there.
    pub limit_hit: bool,
}

/// Extracts an untrusted tar stream into `dest` (which must exist), hashing every file.
///
/// Only regular files and directories are created; anything else is refused and named
/// (`symlink`, `hardlink`, `fifo`, `device`, `unsafe_path`, `non_utf8_name`, `duplicate`,
/// `unwritable: ...`). Past `caps` (files, bytes) or `max_entries` entries, reading stops
/// and `limit_hit` is set. A malformed stream is an error; what was extracted before it
/// stays, and is listed in the error's report through [`extract_into`].
pub fn extract_tar(r: impl Read, dest: &Path, caps: &Caps) -> io::Result<ExtractReport> {
    let dest = tree::open_root(dest, false)?;
    let mut report = ExtractReport::default();
    extract_into(r, &dest, caps, &mut report)?;
    Ok(report)
}

/// [`extract_tar`] into a directory already open (resolved once, never by path again),
/// filling `report` as it goes so a caller keeps what was extracted before an error.
pub fn extract_into(r: impl Read, dest: &OwnedFd, caps: &Caps, report: &mut ExtractReport) -> io::Result<()> {
    extract_bounded(r, dest, caps, MAX_REFUSED, report)
}

/// [`extract_into`] keeping at most `max_refused` refused entries and reading at most
/// `2 * caps.max_files + max_refused` entries. The fuzz target lowers `max_refused` so that
/// the entry cap is within reach of a short input.
pub(crate) fn extract_bounded(
    r: impl Read,
    dest: &OwnedFd,
    caps: &Caps,
    max_refused: usize,
    report: &mut ExtractReport,
) -> io::Result<()> {
    let root = dest.try_clone()?;
    let pool = Pool::new(hashing_threads(), HASH_BUFFERS, HASH_BUFFER_LEN);
    let mut x = Extractor { root, caps: *caps, max_refused, report, entries: 0, pool, hashed: Vec::new() };
    let read = x.read(r);
    let Extractor { pool, hashed, report, .. } = x;
    // Every file listed was whole: its digest is there, however the stream ended.
    let mut digests = pool.finish()?;
    for (at, job) in hashed {
        report.files[at].hash = digests.remove(&job.number()).expect("a file listed was ended");
    }
    // Sorted however the stream ended: a stream cut mid-file still lists what came before.
    report.files.sort_by(|a, b| a.name.cmp(&b.name));
    read
}

/// Buffers between the extractor and the hashing threads: what the collection holds of the
/// outputs at once (2 MiB), in chunks large enough that a write or a hash update costs
/// little beside its bytes.
const HASH_BUFFERS: usize = 8;
const HASH_BUFFER_LEN: usize = 256 << 10;

/// One thread hashes a file as fast as the link brings it; a second hashes the next file
/// meanwhile when there are many. More would only take CPU from the engine's own copying.
fn hashing_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(2))
}

/// Why one entry was not extracted.
enum Fail {
    Skip(String),
    OverCap,
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

    /// A path component that is not a directory to go through (a symlink planted there, or
    /// a file) is unsafe; anything else, unwritable.
    fn of(r: tree::Refusal) -> Self {
        match r {
            tree::Refusal::Io(e) => Fail::unwritable(e),
            _ => Fail::skip("unsafe_path"),
        }
    }
}

/// The components of `raw`, or `Err` when the path is not safe to create.
fn relative(raw: &[u8]) -> Result<Vec<&[u8]>, ()> {
    if raw.first() == Some(&b'/') {
        return Err(());
    }
    let all: Vec<&[u8]> = raw.split(|&b| b == b'/').filter(|c| !c.is_empty() && *c != b".").collect();
    if all.iter().any(|c| *c == b".." || c.contains(&0)) {
        return Err(());
    }
    Ok(all)
}

struct Extractor<'a> {
    root: OwnedFd,
    caps: Caps,
    max_refused: usize,
    report: &'a mut ExtractReport,
    entries: usize,
    pool: Pool,
    /// The files listed (where in `report.files`) whose digests the pool is working out.
    hashed: Vec<(usize, Job)>,
}

impl Extractor<'_> {
    /// Reads entries until the end, a cap, or a stream error.
    fn read(&mut self, r: impl Read) -> io::Result<()> {
        let max_entries = self.caps.max_files.saturating_mul(2).saturating_add(self.max_refused);
        let mut archive = tar::Archive::new(r);
        for entry in archive.entries()? {
            let mut entry = entry?;
            self.entries += 1;
            if self.entries > max_entries {
                self.report.limit_hit = true;
                break;
            }
            let raw = entry.path_bytes().into_owned();
            let Ok(rel) = relative(&raw) else {
                self.refuse(&raw, "unsafe_path".into());
                continue;
            };
            let Some((name, dirs)) = rel.split_last() else { continue };
            let shown = rel.join(&b'/');
            if rel.iter().any(|c| std::str::from_utf8(c).is_err()) {
                self.refuse(&shown, "non_utf8_name".into());
                continue;
            }
            let kind = entry.header().entry_type();
            let result = match kind {
                EntryType::Regular | EntryType::Continuous => self.file(&mut entry, dirs, name, &shown),
                EntryType::Directory => self.dir(dirs, name).map(|()| None),
                EntryType::Symlink => Err(Fail::skip("symlink")),
                EntryType::Link => Err(Fail::skip("hardlink")),
                EntryType::Fifo => Err(Fail::skip("fifo")),
                EntryType::Char | EntryType::Block => Err(Fail::skip("device")),
                EntryType::XGlobalHeader | EntryType::XHeader | EntryType::GNULongName | EntryType::GNULongLink => {
                    continue;
                }
                _ => Err(Fail::skip("unsupported")),
            };
            match result {
                Ok(Some((file, job))) => {
                    self.hashed.push((self.report.files.len(), job));
                    self.report.files.push(file);
                }
                Ok(None) => {}
                Err(Fail::Skip(why)) => self.refuse(&shown, why),
                Err(Fail::OverCap) => {
                    self.refuse(&shown, "over_cap".into());
                    self.report.limit_hit = true;
                    break;
                }
                Err(Fail::Stream(e)) => {
                    // The file the stream ended in is named, not kept: it is not whole.
                    if matches!(kind, EntryType::Regular | EntryType::Continuous) {
                        let text = e.to_string();
                        let why = if text.starts_with("collection_deadline") {
                            "collection_deadline".into()
                        } else {
                            format!("cut: {text}")
                        };
                        self.refuse(&shown, why);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn refuse(&mut self, name: &[u8], why: String) {
        if self.report.refused.len() < self.max_refused {
            self.report.refused.push(RefusedEntry { name: escape_name(name), why });
        }
    }

    /// Opens the directory `dirs` below the root, one component at a time and never through
    /// a symlink, creating missing ones (a tar may list a directory after its children).
    fn open_dir(&self, dirs: &[&[u8]]) -> Result<OwnedFd, Fail> {
        let mut cur = self.root.try_clone().map_err(Fail::unwritable)?;
        for c in dirs {
            cur = tree::make_dir(&cur, c, 0o755).map_err(Fail::of)?;
        }
        Ok(cur)
    }

    fn dir(&mut self, dirs: &[&[u8]], name: &[u8]) -> Result<(), Fail> {
        let parent = self.open_dir(dirs)?;
        tree::make_dir(&parent, name, 0o755).map(drop).map_err(Fail::of)
    }

    fn file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        dirs: &[&[u8]],
        name: &[u8],
        shown: &[u8],
    ) -> Result<Option<(OutputFile, Job)>, Fail> {
        let room = self.caps.max_total_bytes.saturating_sub(self.report.bytes);
        if self.report.files.len() >= self.caps.max_files || entry.size() > room {
            return Err(Fail::OverCap);
        }
        let mode = entry.header().mode().unwrap_or(0o644);
        let mode = if mode & 0o100 != 0 { 0o755 } else { 0o644 };
        let job = self.pool.begin().map_err(Fail::unwritable)?;
        let parent = self.open_dir(dirs)?;
        let mut file = tree::create_file(&parent, name, 0o600)
            .map_err(|e| if e == Errno::EEXIST { Fail::skip("duplicate") } else { Fail::unwritable(e) })?;
        let copied = copy_hashing(entry, &mut file, room, &mut self.pool, job);
        let fail = |me: &Self, fail: Fail| {
            let _ = unlinkat(&parent, name, UnlinkatFlags::NoRemoveDir);
            let _ = me;
            Err(fail)
        };
        let (size, head) = match copied {
            // The stream ended inside the file: what came is not the file the entry named.
            Ok((size, ..)) if size < entry.size() => {
                let why = format!("the stream ended {size} bytes into a file of {}", entry.size());
                return fail(self, Fail::Stream(io::Error::new(io::ErrorKind::UnexpectedEof, why)));
            }
            Ok(h) => h,
            Err(f) => return fail(self, f),
        };
        if let Err(e) = fchmod(file.as_fd(), Mode::from_bits_truncate(mode)) {
            return fail(self, Fail::unwritable(e));
        }
        self.pool.end(job);
        self.report.bytes += size;
        let name = String::from_utf8(shown.to_vec()).expect("checked to be UTF-8 component by component");
        let content_type = content_type(&name, &head);
        // The digest comes from the pool once the stream is read.
        Ok(Some((OutputFile { name, size, hash: String::new(), content_type }, job)))
    }
}

/// Copies at most `room` bytes, handing each chunk written to the pool to hash as `job`
/// and keeping the first [`SNIFF_LEN`]; more is `OverCap`. Read errors are the stream's,
/// write errors the destination's.
fn copy_hashing(
    src: &mut impl Read,
    dst: &mut impl Write,
    room: u64,
    pool: &mut Pool,
    job: Job,
) -> Result<(u64, Vec<u8>), Fail> {
    let mut head = Vec::new();
    let mut written = 0u64;
    loop {
        let mut buf = pool.buffer();
        let n = match fill(src, &mut buf) {
            Ok(0) => {
                pool.give_back(buf);
                break;
            }
            Ok(n) => n,
            Err(e) => {
                pool.give_back(buf);
                return Err(Fail::Stream(e));
            }
        };
        written += n as u64;
        if written > room {
            pool.give_back(buf);
            return Err(Fail::OverCap);
        }
        if head.len() < SNIFF_LEN {
            let take = n.min(SNIFF_LEN - head.len());
            head.extend_from_slice(&buf[..take]);
        }
        if let Err(e) = dst.write_all(&buf[..n]) {
            pool.give_back(buf);
            return Err(Fail::unwritable(e));
        }
        pool.feed(job, buf, n);
    }
    Ok((written, head))
}

/// Reads into `buf` until it is full or `src` ends: the link brings a frame at a time, and
/// fewer, larger writes and hash updates cost less.
fn fill(src: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match src.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, symlink};

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

    fn extract(b: tar::Builder<Vec<u8>>, dest: &Path, caps: Caps) -> ExtractReport {
        let bytes = b.into_inner().unwrap();
        extract_tar(bytes.as_slice(), dest, &caps).unwrap()
    }

    fn why<'a>(r: &'a ExtractReport, name: &str) -> Option<&'a str> {
        r.refused.iter().find(|e| e.name == name).map(|e| e.why.as_str())
    }

    fn sha256sum(path: &Path) -> String {
        let out = std::process::Command::new("sha256sum").arg(path).output().expect("sha256sum runs");
        format!("sha256:{}", String::from_utf8(out.stdout).unwrap().split_whitespace().next().unwrap())
    }

    #[test]
    fn files_are_hashed_as_they_are_written() {
        let dest = tempfile::tempdir().unwrap();
        let big: Vec<u8> = (0..700_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut b = tar::Builder::new(Vec::new());
        raw(&mut b, EntryType::Directory, b"sub/", b"", b"", 0o777);
        file(&mut b, "sub/big.bin", &big);
        file(&mut b, "a.json", b"{}");
        file(&mut b, "empty", b"");
        let r = extract(b, dest.path(), Caps::default());
        assert!(r.refused.is_empty(), "{:?}", r.refused);
        let names: Vec<&str> = r.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a.json", "empty", "sub/big.bin"]);
        for f in &r.files {
            assert_eq!(f.hash, sha256sum(&dest.path().join(&f.name)), "{}", f.name);
            assert_eq!(f.size, fs::metadata(dest.path().join(&f.name)).unwrap().len());
        }
        assert_eq!(r.files[0].content_type, "application/json");
        assert_eq!(r.bytes, big.len() as u64 + 2);
        let mode = |p: &str| fs::metadata(dest.path().join(p)).unwrap().mode() & 0o7777;
        assert_eq!(mode("sub"), 0o755, "no group or other write, whatever the header says");
        assert_eq!(mode("a.json"), 0o644);
    }

    /// Many more files than buffers between the extractor and the hashing threads, of every
    /// size around a buffer's: each digest is the serial one, listed under its own name.
    #[test]
    fn many_files_hash_on_the_threads_as_they_would_serially() {
        use sha2::{Digest, Sha256};
        let dest = tempfile::tempdir().unwrap();
        let sizes =
            [0, 1, 511, 512, HASH_BUFFER_LEN - 1, HASH_BUFFER_LEN, HASH_BUFFER_LEN + 1, 3 * HASH_BUFFER_LEN + 5];
        let mut b = tar::Builder::new(Vec::new());
        let mut want = Vec::new();
        for i in 0..(HASH_BUFFERS * 10) {
            let len = sizes[i % sizes.len()];
            let data: Vec<u8> =
                (0..len).map(|j| (j as u32).wrapping_mul(2_654_435_761).wrapping_add(i as u32) as u8).collect();
            let name = format!("d{}/f{i:03}", i % 3);
            file(&mut b, &name, &data);
            want.push((name, len as u64, format!("sha256:{:x}", Sha256::digest(&data))));
        }
        want.sort();
        let r = extract(b, dest.path(), Caps::default());
        assert!(r.refused.is_empty(), "{:?}", r.refused);
        let got: Vec<(String, u64, String)> =
            r.files.iter().map(|f| (f.name.clone(), f.size, f.hash.clone())).collect();
        assert_eq!(got, want);
    }

    /// More files than buffers, then one past the byte cap: those before it are listed with
    /// their digests, and the pool is finished although the stream was not read to its end.
    #[test]
    fn files_before_the_byte_cap_keep_their_digests() {
        let dest = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        // Each file its own content, so a digest given to the wrong file shows.
        let content = |i: usize| [b'a' + (i % 26) as u8, b'0' + (i / 26) as u8];
        for i in 0..(HASH_BUFFERS * 3) {
            file(&mut b, &format!("a{i:02}"), &content(i));
        }
        file(&mut b, "b", b"over");
        let r = extract(b, dest.path(), Caps { max_files: 100, max_total_bytes: HASH_BUFFERS as u64 * 6 });
        assert_eq!(r.files.len(), HASH_BUFFERS * 3);
        for (i, f) in r.files.iter().enumerate() {
            use sha2::Digest;
            assert_eq!(f.name, format!("a{i:02}"));
            assert_eq!(f.hash, format!("sha256:{:x}", sha2::Sha256::digest(content(i))), "{}", f.name);
        }
        assert!(r.limit_hit);
    }

    #[test]
    fn only_files_and_dirs_are_created() {
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        fs::write(&victim, b"original").unwrap();
        let dest = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        raw(&mut b, EntryType::Symlink, b"a", outside.path().to_str().unwrap().as_bytes(), b"", 0o777);
        file(&mut b, "a/passwd", b"pwned");
        raw(&mut b, EntryType::Link, b"h", victim.to_str().unwrap().as_bytes(), b"", 0o644);
        raw(&mut b, EntryType::Fifo, b"f", b"", b"", 0o644);
        raw(&mut b, EntryType::Char, b"null", b"", b"", 0o666);
        file(&mut b, "../escape", b"x");
        raw(&mut b, EntryType::Regular, b"/abs", b"", b"x", 0o644);
        raw(&mut b, EntryType::Regular, b"n\xffb", b"", b"n", 0o644);
        file(&mut b, "ok", b"ok");
        file(&mut b, "ok", b"again");
        raw(&mut b, EntryType::Regular, b"suid", b"", b"s", 0o4777);
        let r = extract(b, dest.path(), Caps::default());
        for (n, w) in [
            ("a", "symlink"),
            ("h", "hardlink"),
            ("f", "fifo"),
            ("null", "device"),
            ("../escape", "unsafe_path"),
            ("/abs", "unsafe_path"),
            ("n\\xffb", "non_utf8_name"),
            ("ok", "duplicate"),
        ] {
            assert_eq!(why(&r, n), Some(w), "{n}: {:?}", r.refused);
        }
        // `a` was refused, so `a/passwd` became a plain dir and file inside dest.
        assert_eq!(fs::read(dest.path().join("a/passwd")).unwrap(), b"pwned");
        assert!(!outside.path().join("passwd").exists());
        assert_eq!(fs::read(&victim).unwrap(), b"original");
        assert_eq!(fs::read(dest.path().join("ok")).unwrap(), b"ok");
        let suid = fs::metadata(dest.path().join("suid")).unwrap().mode() & 0o7777;
        assert_eq!(suid, 0o755, "no setuid, no group or other write");
    }

    #[test]
    fn a_symlink_already_in_dest_is_never_followed() {
        let outside = tempfile::tempdir().unwrap();
        let dest = tempfile::tempdir().unwrap();
        symlink(outside.path(), dest.path().join("a")).unwrap();
        let mut b = tar::Builder::new(Vec::new());
        file(&mut b, "a/x", b"x");
        let r = extract(b, dest.path(), Caps::default());
        assert_eq!(why(&r, "a/x"), Some("unsafe_path"));
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn caps_stop_the_reading() {
        let dest = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        file(&mut b, "a", &[1; 10]);
        file(&mut b, "b", &[2; 10]);
        file(&mut b, "c", &[3; 5]);
        let bytes = b.into_inner().unwrap();
        let mut reader = crate::fuzzing::Counting { inner: bytes.as_slice(), taken: 0 };
        let r = extract_tar(&mut reader, dest.path(), &Caps { max_files: 10, max_total_bytes: 15 }).unwrap();
        assert_eq!((r.bytes, r.files.len(), r.limit_hit), (10, 1, true));
        assert_eq!(why(&r, "b"), Some("over_cap"));
        assert!(reader.taken < bytes.len(), "reading stopped at the cap");
        assert!(!dest.path().join("b").exists());

        let dest = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        for i in 0..1100 {
            raw(&mut b, EntryType::Directory, format!("d{i}/").as_bytes(), b"", b"", 0o755);
        }
        let r = extract(b, dest.path(), Caps { max_files: 5, max_total_bytes: 100 });
        assert!(r.limit_hit, "entries are capped too, files or not");
    }

    #[test]
    fn a_stream_that_ends_inside_a_file_lists_only_the_files_before_it() {
        let mut b = tar::Builder::new(Vec::new());
        file(&mut b, "z", b"first");
        file(&mut b, "a", b"whole");
        file(&mut b, "b", &[7; 1000]);
        let full = b.into_inner().unwrap();
        // Cut 300 bytes into b's content: a clean end of stream, not an error.
        let cut = &full[..4 * 512 + 512 + 300];
        let dest = tempfile::tempdir().unwrap();
        let fd = tree::open_root(dest.path(), false).unwrap();
        let mut r = ExtractReport::default();
        let err = extract_into(cut, &fd, &Caps::default(), &mut r).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
        assert!(err.to_string().contains("300 bytes into a file of 1000"), "{err}");
        // Sorted by name, as on a clean end.
        assert_eq!(r.files.iter().map(|f| (f.name.as_str(), f.size)).collect::<Vec<_>>(), [("a", 5), ("z", 5)]);
        assert!(!dest.path().join("b").exists(), "the short file is not left as if whole");
        assert_eq!(r.refused.len(), 1);
        assert_eq!(r.refused[0].name, "b");
        assert!(r.refused[0].why.starts_with("cut: the stream ended 300 bytes"), "{:?}", r.refused);
    }

    /// The host stops a collection that ran out of time: the file it was in is named as the
    /// deadline's, the whole ones stay.
    #[test]
    fn a_collection_stopped_at_its_deadline_names_the_file_it_cut() {
        let mut b = tar::Builder::new(Vec::new());
        file(&mut b, "a", b"whole");
        file(&mut b, "b", &[7; 100_000]);
        let full = b.into_inner().unwrap();
        let stopped = full[..2 * 512 + 512 + 4096].chain(io::Cursor::new(Vec::new())).chain(Stopped);
        let dest = tempfile::tempdir().unwrap();
        let fd = tree::open_root(dest.path(), false).unwrap();
        let mut r = ExtractReport::default();
        assert!(extract_into(stopped, &fd, &Caps::default(), &mut r).is_err());
        assert_eq!(r.files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["a"]);
        assert_eq!(r.refused, vec![RefusedEntry { name: "b".into(), why: "collection_deadline".into() }]);
    }

    /// A reader that fails the way the host stops one at the collection's deadline.
    struct Stopped;

    impl Read for Stopped {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::Error::other("collection_deadline: the collection's time ran out"))
        }
    }

    #[test]
    fn missing_dest_or_garbage_is_an_error() {
        let t = tempfile::tempdir().unwrap();
        symlink(t.path(), t.path().join("link")).unwrap();
        let empty = tar::Builder::new(Vec::new()).into_inner().unwrap();
        let caps = Caps::default();
        assert!(extract_tar(empty.as_slice(), &t.path().join("link"), &caps).is_err());
        assert!(extract_tar(empty.as_slice(), &t.path().join("missing"), &caps).is_err());
        assert!(
            extract_tar(
                &b"garbage that is not a tar at all, long enough to be read as a header block"[..],
                t.path(),
                &caps
            )
            .is_err()
        );
    }
}
