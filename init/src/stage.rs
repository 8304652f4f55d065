//! Inputs over the link (the container rung; `docs/link.md`, "Inputs over the link"): before
//! the Start frame, a root PID 1 that holds only the capabilities to drop itself checks that it
//! is alone in the sandbox and that the staging mount is fit (root's, writable by no one
//! else, on the device of the read-only `/in`, empty), then writes the tar of the inputs the
//! host sends into it by descriptor, never through a symlink: root's entries without write
//! bits (files 0444, or 0555 where the owner may execute; directories 0555), so the command,
//! another uid without capabilities, can change nothing there through either mount. It
//! answers with what it wrote (counts and the input tree digest, `init::tree::listing_digest`)
//! or why it refused; the host compares the answer with what it sent.
//!
//! No file of the image is opened and nothing is executed meanwhile: the init takes nothing but
//! the host's frames, bounded by what the host said it sends.

use crate::link::Link;
use crate::tree::{self, listing_digest, listing_entry};
use crate::wire::{Kind, StageSpec, Staged};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::stat::{Mode, fchmod, fstat};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

/// The checks before a root init takes inputs, and the staging dir open.
pub(crate) fn check(spec: &StageSpec) -> Result<OwnedFd, String> {
    alone()?;
    fit(spec)
}

/// The staging mount opened, once it is known to be root's alone, empty, and the volume at
/// `in_dir`.
fn fit(spec: &StageSpec) -> Result<OwnedFd, String> {
    let dir = tree::open_root(Path::new(&spec.stage_dir), false)
        .map_err(|e| format!("the staging mount {}: {e}", spec.stage_dir))?;
    let mut st = fstat(dir.as_fd()).map_err(|e| format!("the staging mount {}: {e}", spec.stage_dir))?;
    if spec.tighten && st.st_uid == 0 && st.st_mode & 0o022 != 0 {
        // The owner may change the mode without a capability; from here on only root writes
        // in it, and the emptiness checked below is what stays.
        fchmod(dir.as_fd(), Mode::from_bits_truncate(st.st_mode & 0o7755)).map_err(|e| {
            format!("the staging mount {}: clearing its group and other write bits: {e}", spec.stage_dir)
        })?;
        st = fstat(dir.as_fd()).map_err(|e| format!("the staging mount {}: {e}", spec.stage_dir))?;
    }
    if st.st_uid != 0 || st.st_mode & 0o022 != 0 {
        return Err(format!(
            "the staging mount {} is owned by uid {} with mode {:o}: not root's alone (an engine that fills a volume \
             from the image gives it the image's owner)",
            spec.stage_dir,
            st.st_uid,
            st.st_mode & 0o7777
        ));
    }
    let in_dir = tree::open_root(Path::new(&spec.in_dir), false).map_err(|e| format!("{}: {e}", spec.in_dir))?;
    let in_st = fstat(in_dir.as_fd()).map_err(|e| format!("{}: {e}", spec.in_dir))?;
    if in_st.st_dev != st.st_dev || in_st.st_ino != st.st_ino {
        return Err(format!("the staging mount {} is not the volume at {}", spec.stage_dir, spec.in_dir));
    }
    let (children, _) = tree::children(&dir, 1, |_| true).map_err(|e| format!("{}: {e}", spec.stage_dir))?;
    if let Some(c) = children.first() {
        return Err(format!(
            "the staging mount {} is not empty (it holds {}): filled from the image, or written before the claim",
            spec.stage_dir,
            crate::wire::escape_name(&c.name)
        ));
    }
    Ok(dir)
}

/// This process is the only one in its pid namespace: nothing started in a parked sandbox
/// before its claim (an `exec` into it) is there to see or change what the init writes.
fn alone() -> Result<(), String> {
    let me = std::process::id();
    let dir = std::fs::read_dir("/proc").map_err(|e| format!("listing /proc: {e}"))?;
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if pid != me {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            return Err(format!(
                "another process runs in the sandbox before its claim: pid {pid} ({})",
                crate::wire::printable(comm.trim())
            ));
        }
    }
    Ok(())
}

/// A directory's path, as its components' names.
type DirPath = Vec<Vec<u8>>;

/// A directory's listing for its digest: (name, line) pairs (`tree::listing_entry`).
type Listing = Vec<(Vec<u8>, Vec<u8>)>;

/// Writes the inputs tar `input` into `root` (the checked staging dir), at most what `sent`
/// says; what was written.
pub(crate) fn write(root: &OwnedFd, input: impl Read, sent: &crate::wire::InputsSent) -> Result<Staged, String> {
    let mut archive = tar::Archive::new(input);
    let mut listings: BTreeMap<DirPath, Listing> = BTreeMap::from([(Vec::new(), Vec::new())]);
    let mut dirs: Vec<DirPath> = Vec::new();
    let mut got = Staged::default();
    let entries = archive.entries().map_err(|e| format!("reading the inputs: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("reading the inputs: {e}"))?;
        if got.entries >= sent.max_entries {
            return Err(format!("more than the {} entries the host allows", sent.max_entries));
        }
        let path = entry.path_bytes().into_owned();
        let comps = components(&path)?;
        let (name, parent) = comps.split_last().expect("components are never empty");
        let parent = parent.to_vec();
        if !listings.contains_key(&parent) {
            return Err(format!("input {} is not under a directory the tar listed", crate::wire::escape_name(&path)));
        }
        let at = open_path(root, &parent)?;
        let mode = entry.header().mode().unwrap_or(0);
        let line = match entry.header().entry_type() {
            tar::EntryType::Directory => {
                // Writable by its owner until it is filled; 0555 after.
                tree::make_new_dir(&at, name, 0o700).map_err(|e| refused(&path, e.why()))?;
                listings.insert(comps.clone(), Vec::new());
                dirs.push(comps.clone());
                None
            }
            tar::EntryType::Regular => {
                let size = entry.size();
                if got.bytes.saturating_add(size) > sent.max_bytes {
                    return Err(format!("more than the {} bytes the host allows", sent.max_bytes));
                }
                let mut file = tree::create_file(&at, name, 0o600).map_err(|e| refused(&path, e))?;
                let mut hasher = Sha256::new();
                let copied = io::copy(&mut (&mut entry).take(size), &mut Tee { file: &mut file, hasher: &mut hasher })
                    .map_err(|e| format!("writing input {}: {e}", crate::wire::escape_name(&path)))?;
                if copied != size {
                    return Err(format!("input {} ended short", crate::wire::escape_name(&path)));
                }
                fchmod(file.as_fd(), Mode::from_bits_truncate((mode & 0o555) | 0o444))
                    .map_err(|e| format!("input {}: {e}", crate::wire::escape_name(&path)))?;
                got.files += 1;
                got.bytes += size;
                let kind = if mode & 0o100 != 0 { b'x' } else { b'f' };
                Some(listing_entry(kind, &hasher.finalize(), name))
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| format!("symlink {} has no target", crate::wire::escape_name(&path)))?;
                nix::unistd::symlinkat(target.as_ref(), at.as_fd(), name.as_slice()).map_err(|e| refused(&path, e))?;
                Some(listing_entry(b'l', &Sha256::digest(&target), name))
            }
            other => {
                return Err(format!("input {} is of a kind not staged ({other:?})", crate::wire::escape_name(&path)));
            }
        };
        if let Some(line) = line {
            listings.get_mut(&parent).expect("checked above").push((name.clone(), line));
        }
        got.entries += 1;
    }
    // Deepest first: a directory's digest goes into its parent's listing, and a read-only
    // parent is set after its children.
    dirs.sort_by_key(|d| std::cmp::Reverse(d.len()));
    for d in dirs {
        let listing = listings.remove(&d).unwrap_or_default();
        let (name, parent) = d.split_last().expect("components are never empty");
        let line = listing_entry(b'd', &listing_digest(listing), name);
        listings.entry(parent.to_vec()).or_default().push((name.clone(), line));
        let fd = open_path(root, &d)?;
        fchmod(fd.as_fd(), Mode::from_bits_truncate(0o555)).map_err(|e| format!("input dir: {e}"))?;
    }
    let root_listing = listings.remove(&Vec::new()).unwrap_or_default();
    got.tree = Some(format!("sha256:{}", hex(&listing_digest(root_listing))));
    Ok(got)
}

fn refused(path: &[u8], e: impl std::fmt::Display) -> String {
    format!("input {}: {e}", crate::wire::escape_name(path))
}

/// A relative path's components: none empty, `.` or `..`, nothing absolute.
fn components(path: &[u8]) -> Result<DirPath, String> {
    let trimmed = path.strip_suffix(b"/").unwrap_or(path);
    let comps: DirPath = trimmed.split(|&b| b == b'/').map(<[u8]>::to_vec).collect();
    if trimmed.is_empty() || comps.iter().any(|c| c.is_empty() || c == b"." || c == b"..") {
        return Err(format!("input entry {} is not a plain relative path", crate::wire::escape_name(path)));
    }
    if comps.len() >= tree::MAX_DEPTH {
        return Err(format!("input entry {} is too deep", crate::wire::escape_name(path)));
    }
    Ok(comps)
}

/// The directory at `path` under `root`, each component opened without following a symlink.
fn open_path(root: &OwnedFd, path: &[Vec<u8>]) -> Result<OwnedFd, String> {
    let mut at = root.try_clone().map_err(|e| e.to_string())?;
    for c in path {
        at = tree::open_dir(&at, c).map_err(|r| format!("input dir {}: {}", crate::wire::escape_name(c), r.why()))?;
    }
    Ok(at)
}

/// Writes to the file and hashes what it writes.
struct Tee<'a> {
    file: &'a mut std::fs::File,
    hasher: &'a mut Sha256,
}

impl Write for Tee<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The inputs tar as the host sends it, [`Kind::Inputs`] frame by frame up to
/// [`Kind::InputsEnd`], read from the link (the heartbeats it meets are acknowledged); any
/// other frame, or the link's end, is an error.
pub(crate) struct InputFrames<'a> {
    pub link: &'a mut Link,
    pub chunk: Vec<u8>,
    pub at: usize,
    pub ended: bool,
}

impl Read for InputFrames<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.chunk.len() {
            if self.ended {
                return Ok(0);
            }
            match self.link.decoder.next_frame() {
                Ok(Some(f)) => match f.kind {
                    Kind::Inputs => (self.chunk, self.at) = (f.body, 0),
                    Kind::InputsEnd => self.ended = true,
                    Kind::Heartbeat => self.link.ack(crate::wire::heartbeat_count(&f.body)),
                    other => {
                        return Err(io::Error::other(format!("a {other:?} frame in the middle of the inputs")));
                    }
                },
                Ok(None) if !self.link.in_open => {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the host closed the link"));
                }
                Ok(None) => {
                    let mut fds = [PollFd::new(self.link.input(), PollFlags::POLLIN)];
                    match poll(&mut fds, PollTimeout::NONE) {
                        Ok(_) | Err(Errno::EINTR) => {}
                        Err(e) => return Err(io::Error::other(format!("poll: {e}"))),
                    }
                    self.link.read();
                }
                Err(e) => return Err(io::Error::other(format!("the link from the host is broken: {e}"))),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::InputsSent;

    fn tar_of(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h
    }

    #[test]
    fn the_inputs_are_written_read_only_and_digested_as_the_host_digests_them() {
        let t = tempfile::tempdir().unwrap();
        let root = tree::open_root(t.path(), false).unwrap();
        let tar = tar_of(|b| {
            b.append_data(&mut header(tar::EntryType::Directory, 0o555, 0), "d", io::empty()).unwrap();
            b.append_data(&mut header(tar::EntryType::Regular, 0o444, 3), "d/a.txt", &b"abc"[..]).unwrap();
            b.append_data(&mut header(tar::EntryType::Regular, 0o555, 2), "run.sh", &b"hi"[..]).unwrap();
            b.append_link(&mut header(tar::EntryType::Symlink, 0o777, 0), "link", "d/a.txt").unwrap();
        });
        let sent = InputsSent { max_entries: 4, max_bytes: 5 };
        let got = write(&root, tar.as_slice(), &sent).unwrap();
        assert_eq!((got.entries, got.files, got.bytes), (4, 2, 5));
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &str| std::fs::symlink_metadata(t.path().join(p)).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode("d"), mode("d/a.txt"), mode("run.sh")), (0o555, 0o444, 0o555));
        assert_eq!(std::fs::read_link(t.path().join("link")).unwrap(), Path::new("d/a.txt"));
        // The digest, by hand: the listings' lines in name order.
        let file = |k: u8, data: &[u8], name: &[u8]| listing_entry(k, &Sha256::digest(data), name);
        let d = listing_digest(vec![(b"a.txt".to_vec(), file(b'f', b"abc", b"a.txt"))]);
        let want = listing_digest(vec![
            (b"d".to_vec(), listing_entry(b'd', &d, b"d")),
            (b"link".to_vec(), file(b'l', b"d/a.txt", b"link")),
            (b"run.sh".to_vec(), file(b'x', b"hi", b"run.sh")),
        ]);
        assert_eq!(got.tree, Some(format!("sha256:{}", hex(&want))));
    }

    #[test]
    fn what_the_host_did_not_say_or_would_leave_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let root = tree::open_root(t.path(), false).unwrap();
        let one = tar_of(|b| {
            b.append_data(&mut header(tar::EntryType::Regular, 0o444, 3), "a", &b"abc"[..]).unwrap();
        });
        let short = InputsSent { max_entries: 1, max_bytes: 2 };
        assert!(write(&root, one.as_slice(), &short).unwrap_err().contains("bytes the host allows"));
        let few = InputsSent { max_entries: 0, max_bytes: 3 };
        assert!(write(&root, one.as_slice(), &few).unwrap_err().contains("entries the host allows"));
        for bad in ["../x", "/etc/x", "a/./b"] {
            let mut raw = tar_of(|b| {
                b.append_data(&mut header(tar::EntryType::Regular, 0o444, 1), "placeholder", &b"x"[..]).unwrap();
            });
            raw[..bad.len()].copy_from_slice(bad.as_bytes());
            raw[bad.len()..100].fill(0);
            let mut h = tar::Header::from_byte_slice(&raw[..512]).clone();
            h.set_cksum();
            raw[..512].copy_from_slice(h.as_bytes());
            let sent = InputsSent { max_entries: 1, max_bytes: 1 };
            assert!(write(&root, raw.as_slice(), &sent).is_err(), "{bad}");
        }
        // A symlink made first, then a file through it: never followed.
        let t2 = tempfile::tempdir().unwrap();
        let root2 = tree::open_root(t2.path(), false).unwrap();
        let through = tar_of(|b| {
            b.append_link(&mut header(tar::EntryType::Symlink, 0o777, 0), "d", t.path()).unwrap();
            b.append_data(&mut header(tar::EntryType::Regular, 0o444, 1), "d/x", &b"x"[..]).unwrap();
        });
        let sent = InputsSent { max_entries: 2, max_bytes: 1 };
        assert!(write(&root2, through.as_slice(), &sent).is_err());
        assert!(!t.path().join("x").exists(), "nothing written through the symlink");
    }

    #[test]
    fn a_staging_dir_must_be_root_s_empty_and_the_same_volume() {
        let spec = |stage: &Path, inp: &Path| StageSpec {
            stage_dir: stage.display().to_string(),
            in_dir: inp.display().to_string(),
            inputs: None,
            tighten: false,
        };
        let t = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        if !nix::unistd::geteuid().is_root() {
            // Not root's: refused as such.
            assert!(fit(&spec(t.path(), t.path())).unwrap_err().contains("not root's alone"));
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(fit(&spec(t.path(), t.path())).is_ok());
        let e = fit(&spec(t.path(), other.path())).unwrap_err();
        assert!(e.contains("is not the volume at"), "{e}");
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o775)).unwrap();
        assert!(fit(&spec(t.path(), t.path())).unwrap_err().contains("not root's alone"));
        // Told to tighten (a Kubernetes emptyDir, 0777): the bits cleared, then checked.
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let tight = StageSpec { tighten: true, ..spec(t.path(), t.path()) };
        assert!(fit(&tight).is_ok());
        assert_eq!(std::fs::metadata(t.path()).unwrap().permissions().mode() & 0o777, 0o755);
        std::fs::write(t.path().join("planted"), b"x").unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(fit(&tight).unwrap_err().contains("not empty (it holds planted)"));
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(fit(&spec(t.path(), t.path())).unwrap_err().contains("not empty (it holds planted)"));
        // A symlink as the staging mount is never followed.
        let link = other.path().join("link");
        std::os::unix::fs::symlink(t.path(), &link).unwrap();
        assert!(fit(&spec(&link, &link)).is_err());
    }
}
