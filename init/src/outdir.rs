//! Sending the output dir back: a tar of its regular files and directories, in name order,
//! within the caps, written after every other process of the attempt is gone (so nothing
//! changes under the walk).
//!
//! Nothing is followed: every path is opened one component at a time from a descriptor,
//! with `O_NOFOLLOW`; a file is read through the descriptor `fstat` classified, never by
//! name again, and exactly its size at that moment is sent. Symlinks, FIFOs, sockets,
//! devices and names that are not UTF-8 are named in [`OutputEnd::refused`], not sent. A
//! file larger than the byte budget left is refused as `over_cap` and the walk goes on, so
//! one huge (or sparse) file cannot push the real outputs out; past the file-count cap every
//! further file is `over_cap`.

use crate::tree::{self, Kind};
use crate::wire::{OutputEnd, OutputSpec, Refused, escape_name};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Instant;

/// At most this many refused entries are named.
pub const MAX_REFUSED: usize = 1000;
pub use crate::tree::MAX_DEPTH;
/// Entries looked at in all, so a tree of millions of empty files ends in bounded time.
pub const MAX_VISITED: u64 = 2_000_000;

/// Where the walk hands what it sends: a tar on the link (`send`), or the host's own copy of
/// an output dir it holds (`lib/src/outputs/in_place.rs`).
pub trait Emit {
    /// A directory, its path relative to the output dir, `/`-separated, ending in `/`.
    fn dir(&mut self, path: &str) -> io::Result<()>;
    /// A regular file of exactly `size` bytes read through `file` (opened without following
    /// anything), its mode normalised (0755 or 0644). `Ok(Some(why))`: not sent, and named
    /// so; `Err`: nothing more can be sent.
    fn file(&mut self, path: &str, file: std::fs::File, size: u64, mode: u32, mtime: u64)
    -> io::Result<Option<String>>;
}

/// The tar on the link.
struct TarEmit<W: Write>(tar::Builder<W>);

impl<W: Write> Emit for TarEmit<W> {
    fn dir(&mut self, path: &str) -> io::Result<()> {
        let mut h = header(tar::EntryType::Directory, 0, 0o755, 0);
        self.0.append_data(&mut h, path, io::empty())
    }

    fn file(
        &mut self,
        path: &str,
        file: std::fs::File,
        size: u64,
        mode: u32,
        mtime: u64,
    ) -> io::Result<Option<String>> {
        let mut h = header(tar::EntryType::Regular, size, mode, mtime);
        // Exactly `size` bytes: the tar header promised them. Read from the file in the link's
        // chunks; `tar` copies through a `dyn Read`, so the writes still come 8 KiB at a time
        // and `OutputFrames` gathers them into whole frames.
        let mut content =
            io::BufReader::with_capacity(crate::wire::MAX_CHUNK, tree::Exactly::new(file.take(size), size));
        self.0.append_data(&mut h, path, &mut content).map(|()| None)
    }
}

/// Walks `spec.dir` and writes the tar of what fits the caps to `w`. Returns the end
/// record: what was sent, what was refused, and the totals of everything seen.
pub fn send(spec: &OutputSpec, w: impl Write) -> OutputEnd {
    let mut tar = TarEmit(tar::Builder::new(w));
    let mut end = walk(spec, &mut tar);
    if let Err(e) = tar.0.finish() {
        end.error.get_or_insert_with(|| format!("writing the tar: {e}"));
    }
    end
}

/// Walks `spec.dir` and hands what fits the caps to `emit`, in name order. Returns the end
/// record: what was sent, what was refused, and the totals of everything seen.
pub fn walk(spec: &OutputSpec, emit: &mut impl Emit) -> OutputEnd {
    let started = Instant::now();
    // The record's `out_fs` figures (total, and what is not available), so the host works
    // the same deadline out.
    let space = nix::sys::statvfs::statvfs(Path::new(&spec.dir)).ok();
    let fs_total = space.as_ref().map(|st| st.blocks().saturating_mul(st.fragment_size()));
    let used = space
        .as_ref()
        .map_or(0, |st| st.blocks().saturating_sub(st.blocks_available()).saturating_mul(st.fragment_size()));
    let budget = fs_total.map_or(spec.max_bytes, |t| spec.max_bytes.min(t));
    let deadline = spec.deadline(used.min(budget));
    let mut s = Sender {
        spec,
        budget,
        deadline: deadline.map(|d| started + d),
        rate: spec.collect_bytes_per_s,
        end: OutputEnd {
            budget_bytes: budget,
            deadline_ms: deadline.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            ..OutputEnd::default()
        },
        visited: 0,
    };
    match tree::open_root(Path::new(&spec.dir), false) {
        Ok(root) => s.dir(emit, root, b"", 0),
        Err(e) => s.end.error = Some(format!("cannot open {}: {e}", spec.dir)),
    }
    s.end.refused.sort_by(|a, b| a.name.cmp(&b.name));
    s.end
}

/// What `dir` holds, walked like the outputs (nothing followed, nothing read).
pub fn measure(dir: &str) -> crate::wire::OutScan {
    send(&OutputSpec::new(dir, 0, 0), io::sink()).seen
}

struct Sender<'a> {
    spec: &'a OutputSpec,
    /// Bytes that may be sent: the caps', or what the filesystem holds if less.
    budget: u64,
    deadline: Option<Instant>,
    /// The slowest rate the deadline allows for (bytes per second).
    rate: u64,
    end: OutputEnd,
    visited: u64,
}

impl Sender<'_> {
    fn refuse(&mut self, name: &[u8], why: impl Into<String>) {
        if self.end.refused.len() < MAX_REFUSED {
            self.end.refused.push(Refused { name: escape_name(name), why: why.into() });
        }
    }

    fn over_cap(&mut self, name: &[u8]) {
        self.end.over_cap = true;
        self.refuse(name, "over_cap");
    }

    /// The entries of `dir`, keeping only the first ones by order when there are more than
    /// the caps could ever use, so one huge directory cannot exhaust the init's memory.
    fn children(&mut self, dir: &OwnedFd) -> io::Result<(Vec<tree::Child>, bool)> {
        let keep = usize::try_from(self.spec.max_files).unwrap_or(usize::MAX).saturating_add(MAX_REFUSED + 1);
        let (visited, seen) = (&mut self.visited, &mut self.end.seen);
        tree::children(dir, keep, |c| {
            *visited += 1;
            if *visited > MAX_VISITED {
                seen.truncated = true;
                return false;
            }
            if let (Kind::File, Some(st)) = (c.kind, c.stat) {
                seen.files += 1;
                seen.apparent_bytes = seen.apparent_bytes.saturating_add(st.size);
                seen.written_bytes = seen.written_bytes.saturating_add(st.size.min(st.allocated));
            }
            true
        })
    }

    fn dir<E: Emit>(&mut self, tar: &mut E, dir: OwnedFd, prefix: &[u8], depth: usize) {
        let (children, truncated) = match self.children(&dir) {
            Ok(c) => c,
            Err(e) => {
                let name = if prefix.is_empty() { b".".as_slice() } else { &prefix[..prefix.len() - 1] };
                return self.refuse(name, format!("unreadable: {e}"));
            }
        };
        for child in children {
            let mut path = prefix.to_vec();
            path.extend_from_slice(&child.name);
            if std::str::from_utf8(&child.name).is_err() {
                self.refuse(&path, "non_utf8_name");
                continue;
            }
            match child.kind {
                Kind::File => self.file(tar, &dir, &child.name, &path),
                Kind::Dir => self.subdir(tar, &dir, &child.name, path, depth),
                other => self.refuse(&path, other.word()),
            }
            if self.end.error.is_some() {
                return;
            }
        }
        if truncated {
            self.end.seen.truncated = true;
            let name = if prefix.is_empty() { b".".as_slice() } else { &prefix[..prefix.len() - 1] };
            self.over_cap(name);
        }
    }

    fn subdir<E: Emit>(&mut self, tar: &mut E, parent: &OwnedFd, name: &[u8], mut path: Vec<u8>, depth: usize) {
        if depth + 1 >= MAX_DEPTH {
            self.end.seen.truncated = true;
            return self.refuse(&path, "too_deep");
        }
        let sub = match tree::open_dir(parent, name) {
            Ok(d) => d,
            Err(r) => return self.refuse(&path, r.why()),
        };
        path.push(b'/');
        let name_str = std::str::from_utf8(&path).expect("checked component by component");
        if let Err(e) = tar.dir(name_str) {
            self.end.error = Some(format!("writing the tar: {e}"));
            return;
        }
        self.dir(tar, sub, &path, depth + 1);
    }

    fn file<E: Emit>(&mut self, tar: &mut E, parent: &OwnedFd, name: &[u8], path: &[u8]) {
        let (file, st) = match tree::open_file(parent, name) {
            Ok(f) => f,
            Err(r) => return self.refuse(path, r.why()),
        };
        let size = u64::try_from(st.st_size).unwrap_or(0);
        let room = self.budget.saturating_sub(self.end.bytes);
        if self.end.files >= self.spec.max_files || size > room {
            return self.over_cap(path);
        }
        if let Some(by) = self.deadline {
            // What is left of the time must carry the whole file at the slowest rate allowed.
            let needs = std::time::Duration::from_millis(size.saturating_mul(1000) / self.rate.max(1));
            if Instant::now() + needs >= by {
                self.end.deadline_hit = true;
                return self.refuse(path, "collection_deadline");
            }
        }
        let mode = if st.st_mode & 0o100 != 0 { 0o755 } else { 0o644 };
        let mtime = u64::try_from(st.st_mtime).unwrap_or(0);
        let name_str = std::str::from_utf8(path).expect("checked component by component");
        match tar.file(name_str, file, size, mode, mtime) {
            Ok(None) => {
                self.end.files += 1;
                self.end.bytes += size;
            }
            Ok(Some(why)) => self.refuse(path, why),
            Err(e) => self.end.error = Some(format!("sending {}: {e}", escape_name(path))),
        }
    }
}

/// A header owned by root, with normalised modes: no group or other write ever.
fn header(kind: tar::EntryType, size: u64, mode: u32, mtime: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(mtime);
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::fs;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::symlink;

    fn spec(dir: &Path, max_files: u64, max_bytes: u64) -> OutputSpec {
        OutputSpec::new(dir.display().to_string(), max_files, max_bytes)
    }

    fn entries(tar: &[u8]) -> Vec<(String, u64, u32)> {
        let mut a = tar::Archive::new(tar);
        a.entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (e.path().unwrap().display().to_string(), h.size().unwrap(), h.mode().unwrap())
            })
            .collect()
    }

    #[test]
    fn sends_files_and_dirs_in_name_order_and_names_the_rest() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        fs::create_dir_all(d.join("b/c")).unwrap();
        fs::write(d.join("b/c/deep"), b"deep").unwrap();
        fs::write(d.join("a.txt"), b"alpha").unwrap();
        fs::write(d.join("b.txt"), b"b").unwrap();
        symlink("/etc/passwd", d.join("link")).unwrap();
        nix::unistd::mkfifo(&d.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        fs::write(d.join(OsStr::from_bytes(b"bad\xff")), b"x").unwrap();
        let mut tar = Vec::new();
        let end = send(&spec(d, 100, 1 << 20), &mut tar);
        assert_eq!(end.error, None);
        let got = entries(&tar);
        let names: Vec<&str> = got.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names, ["a.txt", "b.txt", "b/", "b/c/", "b/c/deep"], "full paths in byte order");
        assert!(got.iter().all(|(_, _, m)| m & 0o022 == 0), "no group/other write: {got:?}");
        let refused: Vec<(&str, &str)> = end.refused.iter().map(|r| (r.name.as_str(), r.why.as_str())).collect();
        assert_eq!(refused, [("bad\\xff", "non_utf8_name"), ("fifo", "fifo"), ("link", "symlink")]);
        assert_eq!((end.files, end.bytes, end.over_cap), (3, 10, false));
        assert_eq!((end.seen.files, end.seen.apparent_bytes), (4, 11));
    }

    #[test]
    fn a_huge_sparse_file_is_refused_without_being_read_and_the_rest_still_goes() {
        let t = tempfile::tempdir().unwrap();
        let f = fs::File::create(t.path().join("a-sparse")).unwrap();
        f.set_len(1 << 40).unwrap();
        fs::write(t.path().join("result.txt"), b"the real output").unwrap();
        let mut tar = Vec::new();
        let started = std::time::Instant::now();
        let end = send(&spec(t.path(), 100, 1 << 30), &mut tar);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert!(end.over_cap);
        assert_eq!(end.refused, vec![Refused { name: "a-sparse".into(), why: "over_cap".into() }]);
        assert_eq!(entries(&tar), vec![("result.txt".into(), 15, 0o644)]);
        assert_eq!(end.seen.apparent_bytes, (1 << 40) + 15);
        assert!(end.seen.written_bytes < 1 << 20, "a sparse file counts what it holds: {}", end.seen.written_bytes);
    }

    /// A file larger than the output filesystem can hold must be sparse: it is refused from
    /// its size, however high the caps, and the rest is sent.
    #[test]
    fn a_sparse_file_larger_than_the_filesystem_is_refused_whatever_the_caps() {
        let t = tempfile::tempdir().unwrap();
        let st = nix::sys::statvfs::statvfs(t.path()).unwrap();
        let fs_bytes = st.blocks() * st.fragment_size();
        fs::File::create(t.path().join("a-sparse")).unwrap().set_len(fs_bytes + (1 << 30)).unwrap();
        fs::write(t.path().join("b.txt"), b"kept").unwrap();
        let mut tar = Vec::new();
        let end = send(&spec(t.path(), 100, u64::MAX / 2), &mut tar);
        assert_eq!(end.budget_bytes, fs_bytes);
        assert_eq!(end.refused, vec![Refused { name: "a-sparse".into(), why: "over_cap".into() }]);
        assert_eq!(entries(&tar), vec![("b.txt".into(), 4, 0o644)]);
    }

    /// A transport slower than the collection allows for: 256 KiB/s, against the 1 MiB/s
    /// the deadline is worked out with.
    struct Slow(Vec<u8>);

    impl Write for Slow {
        fn write(&mut self, data: &[u8]) -> io::Result<usize> {
            let n = data.len().min(4096);
            std::thread::sleep(std::time::Duration::from_micros(n as u64 * 1_000_000 / (256 << 10)));
            self.0.extend_from_slice(&data[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Past the deadline no file is read; what was sent stays, the rest is named.
    #[test]
    fn the_deadline_refuses_what_cannot_go_in_time_and_keeps_what_went() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("a-small"), b"small").unwrap();
        fs::write(t.path().join("b-big"), vec![7u8; 256 << 10]).unwrap();
        fs::write(t.path().join("c-big"), vec![8u8; 256 << 10]).unwrap();
        fs::write(t.path().join("d-small"), b"also small").unwrap();
        // The budget (1 MiB) bounds what the deadline is worked out from: at most 1 s more.
        let s = OutputSpec { collect_min_ms: 1, collect_bytes_per_s: 1 << 20, ..spec(t.path(), 100, 1 << 20) };
        let mut slow = Slow(Vec::new());
        let end = send(&s, &mut slow);
        assert!(end.deadline_ms.is_some_and(|d| d <= 1001), "{:?}", end.deadline_ms);
        let names: Vec<String> = entries(&slow.0).into_iter().map(|e| e.0).collect();
        assert_eq!(names, ["a-small", "b-big"], "what went before the deadline is whole");
        let refused: Vec<(&str, &str)> = end.refused.iter().map(|r| (r.name.as_str(), r.why.as_str())).collect();
        assert_eq!(refused, [("c-big", "collection_deadline"), ("d-small", "collection_deadline")]);
        assert!(end.deadline_hit && !end.over_cap);
        let mut tar = Vec::new();
        let end = send(&OutputSpec { collect_min_ms: 60_000, ..s }, &mut tar);
        assert_eq!((end.files, end.deadline_hit), (4, false), "with time enough everything goes");
    }

    #[test]
    fn file_count_cap_keeps_the_first_by_name() {
        let t = tempfile::tempdir().unwrap();
        for i in 0..20 {
            fs::write(t.path().join(format!("f{i:02}")), b"x").unwrap();
        }
        let mut tar = Vec::new();
        let end = send(&spec(t.path(), 5, 1 << 20), &mut tar);
        let names: Vec<String> = entries(&tar).into_iter().map(|e| e.0).collect();
        assert_eq!(names, ["f00", "f01", "f02", "f03", "f04"]);
        assert!(end.over_cap);
        assert_eq!(end.seen.files, 20, "everything is counted, kept or not");
    }

    #[test]
    fn a_missing_dir_is_an_error_in_the_end_record() {
        let mut tar = Vec::new();
        let end = send(&spec(Path::new("/nonexistent/out"), 1, 1), &mut tar);
        assert!(end.error.unwrap().contains("cannot open"));
        assert!(!tar.is_empty(), "still a valid (empty) tar");
    }
}
