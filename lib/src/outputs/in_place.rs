//! Collecting an output dir the host holds itself (the oci rung's `/out`, a tmpfs it mounted in
//! the attempt's bundle), in place, once every process of the attempt but its init is gone:
//! no tar over the link. The walk is the init's own (`init/src/outdir.rs`: nothing followed,
//! the caps, the budget, the deadline, every refusal named); what it hands over is written as
//! the extractor writes (`stevedore_parse::outputs::extract_into`: only files and directories
//! made, by descriptor, `O_EXCL`, modes 0755 or 0644, the caller's), but each file is copied by
//! the kernel (`copy_file_range`) while a second thread hashes the same source: the source
//! does not change (nothing of the attempt runs), and the copy is checked to be whole.

use super::{Caps, ExtractReport};
use crate::contract::{OutputFile, RefusedEntry};
use nix::errno::Errno;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::mpsc::{SyncSender, sync_channel};
use stevedore_init::tree;
use stevedore_init::wire::{OutputEnd, OutputSpec, escape_name};
use stevedore_parse::outputs::{SNIFF_LEN, content_type};

/// Files the hashing thread may be behind the copying one (each holds its source open).
const HASH_QUEUE: usize = 16;
/// At most this many refused entries of the writing side are kept.
const MAX_REFUSED: usize = 1000;

/// What an in-place collection delivered: the files written into `dest` and hashed, the walk's
/// own end record (what it saw, refused, left out for the caps or the deadline), and why the
/// writing stopped early, if it did.
#[derive(Debug)]
pub(crate) struct Collected {
    pub report: ExtractReport,
    pub end: OutputEnd,
    pub error: Option<String>,
}

/// Walks `spec.dir` (a host path) and writes what fits `caps` into `dest`, hashing it.
pub(crate) fn collect(spec: &OutputSpec, dest: &OwnedFd, caps: &Caps) -> Collected {
    let root = match dest.try_clone() {
        Ok(r) => r,
        Err(e) => {
            let why = format!("the output dir: {e}");
            let end = OutputEnd { error: Some(why.clone()), ..OutputEnd::default() };
            return Collected { report: ExtractReport::default(), end, error: Some(why) };
        }
    };
    std::thread::scope(|s| {
        let (jobs, queue) = sync_channel::<(usize, std::fs::File, u64)>(HASH_QUEUE);
        let hasher = s.spawn(move || {
            queue
                .into_iter()
                .map(|(at, file, size)| (at, super::hash_reader(At { file, off: 0 }.take(size), SNIFF_LEN), size))
                .collect::<Vec<_>>()
        });
        let mut w =
            Writer { root, caps: *caps, report: ExtractReport::default(), jobs: Some(jobs), broken: Vec::new() };
        let mut end = stevedore_init::walk_outputs(spec, &mut w);
        let Writer { mut report, jobs, broken, .. } = w;
        drop(jobs);
        let mut error = None;
        match hasher.join() {
            Ok(hashed) => {
                for (at, got, size) in hashed {
                    let file = &mut report.files[at];
                    match got {
                        Ok(h) if h.size == size => {
                            file.hash = h.hash;
                            file.content_type = content_type(&file.name, &h.head);
                        }
                        Ok(h) => file.hash = format!("unhashed: {} bytes read of {size}", h.size),
                        Err(e) => file.hash = format!("unhashed: {e}"),
                    }
                }
            }
            Err(_) => error = Some("the hashing thread panicked".to_owned()),
        }
        for (at, why) in broken {
            report.files[at].hash = why;
        }
        // A file whose source could not be read whole is not delivered as if it were.
        let (kept, lost): (Vec<_>, Vec<_>) = report.files.drain(..).partition(|f| f.hash.starts_with("sha256:"));
        for f in lost {
            report.bytes -= f.size;
            let _ = unlink_beneath(dest, &f.name);
            report.refused.push(RefusedEntry { name: f.name, why: f.hash });
        }
        report.files = kept;
        report.files.sort_by(|a, b| a.name.cmp(&b.name));
        report.refused.sort_by(|a, b| a.name.cmp(&b.name));
        // What the writing refused stands beside what the walk did, once.
        end.refused.retain(|r| !report.refused.iter().any(|x| x.name == r.name));
        Collected { report, end, error }
    })
}

/// The writing side of the walk.
struct Writer {
    root: OwnedFd,
    caps: Caps,
    report: ExtractReport,
    jobs: Option<SyncSender<(usize, std::fs::File, u64)>>,
    /// Files listed (their hash job was sent) whose copy then failed: taken out at the end.
    broken: Vec<(usize, String)>,
}

impl Writer {
    fn refuse(&mut self, name: &str, why: String) -> Option<String> {
        if self.report.refused.len() < MAX_REFUSED {
            self.report.refused.push(RefusedEntry { name: escape_name(name.as_bytes()), why: why.clone() });
        }
        Some(why)
    }

    /// The directory `dirs` below the root, made where missing, one component at a time.
    fn open_dir(&self, dirs: &str) -> Result<OwnedFd, String> {
        let mut cur = self.root.try_clone().map_err(|e| format!("unwritable: {e}"))?;
        for c in dirs.split('/').filter(|c| !c.is_empty()) {
            cur = tree::make_dir(&cur, c.as_bytes(), 0o755).map_err(|r| format!("unwritable: {}", r.why()))?;
        }
        Ok(cur)
    }
}

impl stevedore_init::EmitOutputs for Writer {
    fn dir(&mut self, path: &str) -> io::Result<()> {
        if let Err(why) = self.open_dir(path) {
            self.refuse(path.trim_end_matches('/'), why);
        }
        Ok(())
    }

    fn file(&mut self, path: &str, file: std::fs::File, size: u64, mode: u32, _: u64) -> io::Result<Option<String>> {
        let room = self.caps.max_total_bytes.saturating_sub(self.report.bytes);
        if self.report.files.len() >= self.caps.max_files || size > room {
            self.report.limit_hit = true;
            return Ok(self.refuse(path, "over_cap".into()));
        }
        let (dirs, name) = path.rsplit_once('/').unwrap_or(("", path));
        let parent = match self.open_dir(dirs) {
            Ok(p) => p,
            Err(why) => return Ok(self.refuse(path, why)),
        };
        let dst = match tree::create_file(&parent, name.as_bytes(), 0o600) {
            Ok(f) => f,
            Err(Errno::EEXIST) => return Ok(self.refuse(path, "duplicate".into())),
            Err(e) => return Ok(self.refuse(path, format!("unwritable: {e}"))),
        };
        // Hashed from the source while the kernel copies it.
        let at = self.report.files.len();
        let hashing = file.try_clone().and_then(|f| {
            let jobs = self.jobs.as_ref().ok_or_else(|| io::Error::other("no hashing thread"))?;
            jobs.send((at, f, size)).map_err(|_| io::Error::other("the hashing thread ended"))
        });
        let copied = hashing.and_then(|()| copy(&file, &dst, size));
        let done = copied.and_then(|()| {
            nix::sys::stat::fchmod(dst.as_fd(), nix::sys::stat::Mode::from_bits_truncate(mode)).map_err(Into::into)
        });
        self.report.files.push(OutputFile {
            name: path.to_owned(),
            size,
            hash: String::new(),
            content_type: String::new(),
        });
        if let Err(e) = done {
            // Listed for its hash job's sake, then taken out as not delivered.
            self.broken.push((at, format!("unwritable: {e}")));
        }
        self.report.bytes += size;
        Ok(None)
    }
}

/// Reads a file from its own offset (`pread`): the hashing thread and the copy share the
/// source's open file, whose position neither may move under the other.
struct At {
    file: std::fs::File,
    off: u64,
}

impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = std::os::unix::fs::FileExt::read_at(&self.file, buf, self.off)?;
        self.off += n as u64;
        Ok(n)
    }
}

/// Exactly `size` bytes of `src` into `dst`, copied by the kernel: `copy_file_range` within a
/// filesystem, `sendfile` across two (tmpfs to the caller's disk: Linux 5.19 and later refuse
/// `copy_file_range` there), reads and writes where neither is allowed. Positional on the
/// source throughout. Fewer bytes is an error.
fn copy(src: &std::fs::File, dst: &std::fs::File, size: u64) -> io::Result<()> {
    let short = |left: u64| io::Error::new(io::ErrorKind::UnexpectedEof, format!("{left} bytes short"));
    let chunk = |left: u64| usize::try_from(left.min(1 << 30)).unwrap_or(1 << 30);
    let (mut off_in, mut off_out, mut left) = (0i64, 0i64, size);
    let mut by = 0;
    while left > 0 {
        let done = match by {
            0 => nix::fcntl::copy_file_range(src, Some(&mut off_in), dst, Some(&mut off_out), chunk(left)),
            // The destination is new and written from its start: its own position is the offset.
            1 => nix::sys::sendfile::sendfile64(dst, src, Some(&mut off_in), chunk(left)),
            _ => {
                let mut rest = At { file: src.try_clone()?, off: size - left }.take(left);
                let mut w = dst.try_clone()?;
                let copied = io::copy(&mut rest, &mut w)?;
                return if copied == left { Ok(()) } else { Err(short(left - copied)) };
            }
        };
        match done {
            Ok(0) => return Err(short(left)),
            Ok(n) => left -= n as u64,
            Err(Errno::EINTR) => {}
            Err(Errno::EXDEV | Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) if left == size => by += 1,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Removes the file `name` (relative, `/`-separated) below `root`, never through a symlink.
fn unlink_beneath(root: &OwnedFd, name: &str) -> io::Result<()> {
    let (dirs, file) = name.rsplit_once('/').unwrap_or(("", name));
    let mut cur = root.try_clone()?;
    for c in dirs.split('/').filter(|c| !c.is_empty()) {
        cur = tree::open_dir(&cur, c.as_bytes()).map_err(io::Error::from)?;
    }
    nix::unistd::unlinkat(&cur, file, nix::unistd::UnlinkatFlags::NoRemoveDir).map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn spec(dir: &std::path::Path, max_files: u64, max_bytes: u64) -> OutputSpec {
        OutputSpec::new(dir.display().to_string(), max_files, max_bytes)
    }

    #[test]
    fn files_are_delivered_hashed_and_nothing_is_followed() {
        let (src, dest, outside) =
            (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::create_dir(src.path().join("sub")).unwrap();
        std::fs::write(src.path().join("sub/a.txt"), b"hello").unwrap();
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(src.path().join("big.bin"), &big).unwrap();
        std::fs::write(outside.path().join("secret"), b"host").unwrap();
        symlink(outside.path().join("secret"), src.path().join("link")).unwrap();
        symlink(outside.path(), src.path().join("dirlink")).unwrap();
        let d = stevedore_init::tree::open_root(dest.path(), false).unwrap();
        let got = collect(&spec(src.path(), 100, 1 << 30), &d, &Caps { max_files: 100, max_total_bytes: 1 << 30 });
        assert_eq!(got.error, None);
        let names: Vec<&str> = got.report.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["big.bin", "sub/a.txt"]);
        use sha2::Digest;
        assert_eq!(got.report.files[0].hash, format!("sha256:{:x}", sha2::Sha256::digest(&big)));
        assert_eq!(std::fs::read(dest.path().join("sub/a.txt")).unwrap(), b"hello");
        let refused: Vec<(&str, &str)> = got.end.refused.iter().map(|r| (r.name.as_str(), r.why.as_str())).collect();
        assert_eq!(refused, [("dirlink", "symlink"), ("link", "symlink")]);
        assert!(!dest.path().join("link").exists() && !dest.path().join("dirlink").exists());
        assert_eq!((got.end.files, got.end.seen.files), (2, 2));
    }

    #[test]
    fn the_caps_stop_the_writing_and_the_walk_ends_too() {
        let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        for i in 0..50 {
            std::fs::write(src.path().join(format!("f{i:02}")), vec![b'x'; 100_000]).unwrap();
        }
        let d = stevedore_init::tree::open_root(dest.path(), false).unwrap();
        // The writer's cap below the walk's: the writer stops reading, the walk must still end.
        let got = collect(&spec(src.path(), 100, 1 << 30), &d, &Caps { max_files: 3, max_total_bytes: 1 << 30 });
        assert_eq!(got.report.files.len(), 3);
        assert!(got.report.limit_hit);
        let dest2 = tempfile::tempdir().unwrap();
        let d2 = stevedore_init::tree::open_root(dest2.path(), false).unwrap();
        let got = collect(&spec(src.path(), 5, 1 << 30), &d2, &Caps::default());
        assert_eq!(got.report.files.len(), 5);
        assert!(got.end.over_cap);
    }
}
