//! Staging the caller's input dir as a tar owned by the sandbox user. The caller's files are
//! only read (owner, mode and content stay as they are), and only through descriptors: the
//! dir is resolved once, then every entry is opened relative to its parent with
//! `O_NOFOLLOW`, so a subdirectory swapped for a symlink mid-staging is refused, never
//! followed. A file's content is copied for exactly the size its header announced; one that
//! changed size meanwhile fails the staging, named, so nothing the header did not promise
//! becomes an entry. The apparent size of everything is counted before the upload and
//! checked against the limit as it is written.
//!
//! The same walk digests what it stages (`docs/outcome.md`, "Input tree digest"): each file's
//! content is hashed from the very reads that copy it into the tar, so the action digest costs
//! no second read of the inputs, and only what is staged counts (skipped entries do not).

use nix::sys::stat::fstat;
use sha2::{Digest, Sha256};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use stevedore_init::tree::{self, Kind, Refusal, Stat};

use stevedore_init::tree::MAX_DEPTH;
use stevedore_init::tree::{listing_digest, listing_entry};
/// At most this many skipped entries are named.
const MAX_SKIPPED: usize = 1000;

/// What staging did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageReport {
    /// Entries written.
    pub entries: u64,
    /// Regular files written.
    pub files: u64,
    /// Bytes of file content.
    pub bytes: u64,
    /// Entries skipped (FIFOs, sockets, devices), by relative path.
    pub skipped: Vec<String>,
    /// Files with holes (their blocks hold less than their size): staged in full.
    pub sparse: Vec<crate::contract::SparseInput>,
    /// The digest of the tree staged, `sha256:<hex>`.
    pub tree: String,
}

/// Why the input dir could not be staged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    /// an entry could not be read
    #[error("cannot read input {path}")]
    Io {
        /// The entry, relative to the input dir.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// an entry changed under the staging
    #[error("input {path} changed while it was staged ({why})")]
    Changed {
        /// The entry.
        path: PathBuf,
        /// What changed.
        why: String,
    },
    /// the inputs are larger than the limit
    #[error("the inputs hold more than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// writing the tar failed (the upload stopped reading)
    #[error("writing the input tar")]
    Write(#[source] io::Error),
}

/// The input dir, opened once.
#[derive(Debug)]
pub struct InputDir {
    root: OwnedFd,
}

impl InputDir {
    /// Opens `path` (the caller's own path, so a symlink there is followed, once).
    pub fn open(path: &Path) -> Result<Self, StageError> {
        let root = tree::open_root(path, true).map_err(|source| StageError::Io { path: path.to_owned(), source })?;
        Ok(Self { root })
    }

    /// The same directory again (its descriptor duplicated; each walk opens `.` afresh, so
    /// the two never share a listing's position): the inputs offered over the link stay at
    /// hand for another path if the sandbox refuses them.
    #[cfg(any(feature = "docker", feature = "kube"))]
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self { root: self.root.try_clone()? })
    }

    /// The apparent size and count of its regular files (symlinks not followed).
    pub fn measure(&self) -> Result<(u64, u64), StageError> {
        let mut totals = (0u64, 0u64);
        walk_sizes(&self.root, Path::new(""), 0, (u64::MAX, u64::MAX), &mut totals)?;
        Ok(totals)
    }

    /// As [`Self::measure`], from the entries' sizes alone (nothing read), stopping as soon as
    /// the bytes pass `max_bytes` or the files `max_files`: `None` then. What `replay` does
    /// before it hashes a dir an Outcome named (a terabyte there, or `/etc`, is refused from
    /// its first entries over the attempt's own size).
    pub fn measure_within(&self, max_bytes: u64, max_files: u64) -> Result<Option<(u64, u64)>, StageError> {
        let mut totals = (0u64, 0u64);
        walk_sizes(&self.root, Path::new(""), 0, (max_bytes, max_files), &mut totals)?;
        Ok((totals.0 <= max_bytes && totals.1 <= max_files).then_some(totals))
    }

    /// Writes the dir as a tar whose entries belong to whom `owners` says, symlinks kept as
    /// symlinks. `hook` is called with each entry's relative path between its
    /// classification and its opening (tests inject races there).
    pub fn write_tar(
        &self,
        owners: Owners,
        limit: u64,
        out: impl Write,
        hook: &dyn Fn(&Path),
    ) -> Result<StageReport, StageError> {
        let mut b = tar::Builder::new(out);
        let mut s = Stager { owners, limit, report: StageReport::default(), hook };
        let root = s.dir(&mut b, &self.root, Path::new(""), 0)?;
        b.into_inner().and_then(|mut w| w.flush()).map_err(StageError::Write)?;
        s.report.tree = format!("sha256:{}", crate::util::hex(&root));
        Ok(s.report)
    }
}

/// The tree digest of the input dir at `path` (`docs/outcome.md`, "Input tree digest"):
/// the staging walk itself, writing nowhere, so it is the digest an attempt staging these
/// inputs records (`replay` checks inputs with it).
pub fn tree_digest(path: &Path) -> Result<StageReport, StageError> {
    InputDir::open(path)?.write_tar(Owners::User(0, 0), u64::MAX, io::sink(), &|_| {})
}

/// Hashes what passes through it.
struct Hashing<'a, R> {
    inner: R,
    hasher: &'a mut Sha256,
}

impl<R: Read> Read for Hashing<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// The entries of `dir`, in path order.
fn entries(dir: &OwnedFd, rel: &Path) -> Result<Vec<tree::Child>, StageError> {
    let (all, _) =
        tree::children(dir, usize::MAX, |_| true).map_err(|source| StageError::Io { path: rel.to_owned(), source })?;
    Ok(all)
}

fn rel_of(rel: &Path, name: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    rel.join(std::ffi::OsStr::from_bytes(name))
}

/// Adds up `dir`'s regular files into `totals` (bytes, files); stops once either passes `cap`.
fn walk_sizes(
    dir: &OwnedFd,
    rel: &Path,
    depth: usize,
    cap: (u64, u64),
    totals: &mut (u64, u64),
) -> Result<(), StageError> {
    for child in entries(dir, rel)? {
        if totals.0 > cap.0 || totals.1 > cap.1 {
            return Ok(());
        }
        let path = rel_of(rel, &child.name);
        match (child.kind, child.stat) {
            (Kind::File, Some(st)) => {
                totals.0 = totals.0.saturating_add(st.size);
                totals.1 += 1;
            }
            (Kind::Dir, _) if depth < MAX_DEPTH => match tree::open_dir(dir, &child.name) {
                Ok(sub) => walk_sizes(&sub, &path, depth + 1, cap, totals)?,
                // Swapped meanwhile: the staging pass names it.
                Err(Refusal::Symlink | Refusal::Not(_)) => {}
                Err(Refusal::Io(e)) => return Err(StageError::Io { path, source: e.into() }),
            },
            _ => {}
        }
    }
    Ok(())
}

/// Whose the staged entries are, and so their modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owners {
    /// This uid:gid's, modes kept plus owner read (and owner search on directories): for a
    /// mount the engine makes read-only.
    User(u32, u32),
    /// Root's, every write bit cleared, readable (and directories searchable) by everyone:
    /// read-only to a sandbox user without capabilities even where the mount itself is
    /// writable (inputs over the link, `link::stage`, on the container and kube rungs).
    #[cfg_attr(
        all(not(feature = "docker"), not(feature = "kube"), not(test)),
        expect(dead_code, reason = "only the rungs with a root init stage so")
    )]
    RootReadOnly,
}

impl Owners {
    fn ids(self) -> (u32, u32) {
        match self {
            Owners::User(uid, gid) => (uid, gid),
            Owners::RootReadOnly => (0, 0),
        }
    }

    /// The mode of an entry whose own permission bits are `perm`.
    fn mode(self, perm: u32, dir: bool) -> u32 {
        match (self, dir) {
            (Owners::User(..), true) => perm | 0o700,
            (Owners::User(..), false) => perm | 0o400,
            (Owners::RootReadOnly, true) => (perm & 0o555) | 0o555,
            (Owners::RootReadOnly, false) => (perm & 0o555) | 0o444,
        }
    }
}

struct Stager<'a> {
    owners: Owners,
    limit: u64,
    report: StageReport,
    hook: &'a dyn Fn(&Path),
}

impl Stager<'_> {
    fn header(&self, st: &Stat, kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        let (uid, gid) = self.owners.ids();
        h.set_uid(uid.into());
        h.set_gid(gid.into());
        h.set_mtime(u64::try_from(st.mtime).unwrap_or(0));
        h
    }

    fn skip(&mut self, path: &Path) {
        if self.report.skipped.len() < MAX_SKIPPED {
            self.report.skipped.push(path.display().to_string());
        }
    }

    fn dir<W: Write>(
        &mut self,
        b: &mut tar::Builder<W>,
        dir: &OwnedFd,
        rel: &Path,
        depth: usize,
    ) -> Result<[u8; 32], StageError> {
        let mut listing = Vec::new();
        for child in entries(dir, rel)? {
            let path = rel_of(rel, &child.name);
            // Gone since it was listed: nothing to stage.
            let Some(st) = child.stat else { continue };
            // Between looking and opening: where a swap would have to land.
            (self.hook)(&path);
            let perm = st.mode & 0o777;
            match child.kind {
                Kind::Dir => {
                    if depth + 1 >= MAX_DEPTH {
                        self.skip(&path);
                        continue;
                    }
                    let sub = match tree::open_dir(dir, &child.name) {
                        Ok(fd) => fd,
                        Err(Refusal::Io(e)) => return Err(StageError::Io { path, source: e.into() }),
                        Err(_) => {
                            return Err(StageError::Changed {
                                path,
                                why: "a directory became a symlink or a file".into(),
                            });
                        }
                    };
                    let mut h = self.header(&st, tar::EntryType::Directory, self.owners.mode(perm, true), 0);
                    b.append_data(&mut h, &path, io::empty()).map_err(StageError::Write)?;
                    self.report.entries += 1;
                    let digest = self.dir(b, &sub, &path, depth + 1)?;
                    listing.push((child.name.clone(), listing_entry(b'd', &digest, &child.name)));
                }
                Kind::File => {
                    let digest = self.file(b, dir, &child.name, &path, perm)?;
                    let kind = if perm & 0o100 != 0 { b'x' } else { b'f' };
                    listing.push((child.name.clone(), listing_entry(kind, &digest, &child.name)));
                }
                Kind::Symlink => {
                    let target = nix::fcntl::readlinkat(dir, child.name.as_slice())
                        .map_err(|e| StageError::Io { path: path.clone(), source: e.into() })?;
                    let mut h = self.header(&st, tar::EntryType::Symlink, 0o777, 0);
                    b.append_link(&mut h, &path, &target).map_err(StageError::Write)?;
                    self.report.entries += 1;
                    use std::os::unix::ffi::OsStrExt;
                    let digest: [u8; 32] = Sha256::digest(target.as_bytes()).into();
                    listing.push((child.name.clone(), listing_entry(b'l', &digest, &child.name)));
                }
                _ => self.skip(&path),
            }
        }
        Ok(listing_digest(listing))
    }

    fn file<W: Write>(
        &mut self,
        b: &mut tar::Builder<W>,
        dir: &OwnedFd,
        name: &[u8],
        path: &Path,
        perm: u32,
    ) -> Result<[u8; 32], StageError> {
        let changed = |why: &str| StageError::Changed { path: path.to_owned(), why: why.into() };
        let (mut file, st) = match tree::open_file(dir, name) {
            Ok(f) => f,
            Err(Refusal::Symlink) => return Err(changed("a file became a symlink")),
            Err(Refusal::Not(_)) => return Err(changed("it is no longer a regular file")),
            Err(Refusal::Io(e)) => return Err(StageError::Io { path: path.to_owned(), source: e.into() }),
        };
        let st = Stat::from(&st);
        let size = st.size;
        if self.report.bytes.saturating_add(size) > self.limit {
            return Err(StageError::TooLarge { limit: self.limit });
        }
        let mut h = self.header(&st, tar::EntryType::Regular, self.owners.mode(perm, false), size);
        let mut hasher = Sha256::new();
        let mut content = tree::Exactly::new(Hashing { inner: (&mut file).take(size), hasher: &mut hasher }, size);
        b.append_data(&mut h, path, &mut content).map_err(StageError::Write)?;
        let short = content.short;
        // One more byte, or a size that changed, means the file is not what the header said.
        let mut one = [0u8; 1];
        let grew = matches!(file.read(&mut one), Ok(n) if n > 0);
        let now = fstat(file.as_fd()).map(|s| u64::try_from(s.st_size).unwrap_or(0)).unwrap_or(size);
        if short || grew || now != size {
            return Err(StageError::Changed {
                path: path.to_owned(),
                why: format!("its size went from {size} to {now} bytes"),
            });
        }
        self.report.entries += 1;
        self.report.files += 1;
        self.report.bytes += size;
        let allocated = st.allocated;
        if allocated < size && self.report.sparse.len() < MAX_SKIPPED {
            self.report.sparse.push(crate::contract::SparseInput {
                name: path.display().to_string(),
                apparent_bytes: size,
                allocated_bytes: allocated,
            });
        }
        Ok(hasher.finalize().into())
    }
}

/// The input dir as a stream of tar bytes, written on a blocking thread by descriptor, its
/// progress reported as it goes; `producer` ends with what was staged ([`finish`]).
#[cfg(any(feature = "docker", feature = "kube"))]
pub(crate) fn tar_stream(
    dir: InputDir,
    owners: Owners,
    limit: u64,
    bytes: u64,
    progress: Option<crate::contract::ProgressSink>,
) -> (
    tokio::task::JoinHandle<Result<StageReport, StageError>>,
    impl futures_util::Stream<Item = io::Result<bytes::Bytes>> + Send + 'static,
) {
    let (writer, chunks) = crate::pipe::writer(8);
    // The tar's bytes: the files' plus their headers, so the total is the files' at least.
    let writer = crate::contract::Counting {
        inner: writer,
        sink: progress,
        phase: crate::contract::Phase::Inputs,
        total: Some(bytes),
        done: 0,
    };
    let producer = tokio::task::spawn_blocking(move || dir.write_tar(owners, limit, writer, &|_| {}));
    (producer, chunks)
}

/// What [`tar_stream`]'s producer staged, or the launch error it is; the progress said finished.
#[cfg(any(feature = "docker", feature = "kube"))]
pub(crate) async fn finish(
    producer: tokio::task::JoinHandle<Result<StageReport, StageError>>,
    bytes: u64,
    progress: Option<&crate::contract::ProgressSink>,
) -> Result<StageReport, crate::contract::LaunchError> {
    use crate::contract::LaunchError;
    let report = producer.await.map_err(|e| LaunchError::staging("the input tar", e))?.map_err(|e| match e {
        StageError::TooLarge { limit } => LaunchError::InputTooLarge { bytes: limit + 1, limit },
        e => LaunchError::staging("reading the input dir", e),
    })?;
    if let Some(s) = progress {
        finished(s, bytes);
    }
    Ok(report)
}

/// Says the inputs' `bytes` are all staged.
#[cfg(any(feature = "docker", feature = "kube"))]
pub(crate) fn finished(progress: &crate::contract::ProgressSink, bytes: u64) {
    let phase = crate::contract::Phase::Inputs;
    progress.report(crate::contract::Progress { phase, done: bytes, total: Some(bytes), finished: true });
}

/// The request's input dir opened and measured, refused when larger than `limit`; `None`
/// without one. Every rung does this at prepare: a request refused here made nothing.
pub(crate) fn opened(
    dir: Option<&Path>,
    limit: u64,
) -> Result<Option<(InputDir, crate::contract::InputsStaged)>, crate::contract::LaunchError> {
    use crate::contract::LaunchError;
    let Some(dir) = dir else { return Ok(None) };
    let staging = |e| LaunchError::staging(format!("input dir {}", dir.display()), e);
    let input = InputDir::open(dir).map_err(staging)?;
    let (bytes, files) = input.measure().map_err(staging)?;
    if bytes > limit {
        return Err(LaunchError::InputTooLarge { bytes, limit });
    }
    Ok(Some((input, crate::contract::InputsStaged { files, bytes, limit_bytes: limit, ..Default::default() })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::Mode;
    use std::fs::{self, File};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn tar_entries(bytes: &[u8]) -> Vec<(String, tar::EntryType, u32, u64, Vec<u8>)> {
        let mut ar = tar::Archive::new(bytes);
        ar.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let h = e.header().clone();
                let mut data = Vec::new();
                e.read_to_end(&mut data).unwrap();
                (e.path().unwrap().display().to_string(), h.entry_type(), h.mode().unwrap(), h.uid().unwrap(), data)
            })
            .collect()
    }

    #[test]
    fn tar_gives_ownership_to_the_sandbox_user_and_keeps_the_source() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        fs::create_dir(d.join("sub")).unwrap();
        fs::write(d.join("sub/a.txt"), b"hello").unwrap();
        fs::set_permissions(d.join("sub/a.txt"), fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink("sub/a.txt", d.join("link")).unwrap();
        nix::unistd::mkfifo(&d.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let before = fs::metadata(d.join("sub/a.txt")).unwrap();
        let input = InputDir::open(d).unwrap();
        assert_eq!(input.measure().unwrap(), (5, 1));
        let mut buf = Vec::new();
        let r = input.write_tar(Owners::User(65532, 65533), 1 << 20, &mut buf, &|_| {}).unwrap();
        assert_eq!(r.skipped, vec!["fifo".to_owned()]);
        assert_eq!((r.bytes, r.files), (5, 1));
        let got = tar_entries(&buf);
        assert!(got.iter().all(|e| e.3 == 65532));
        assert!(got.contains(&("sub/a.txt".into(), tar::EntryType::Regular, 0o600, 65532, b"hello".to_vec())));
        assert!(got.iter().any(|e| e.0 == "link" && e.1 == tar::EntryType::Symlink));
        let after = fs::metadata(d.join("sub/a.txt")).unwrap();
        assert_eq!((before.uid(), before.mode()), (after.uid(), after.mode()), "source untouched");
    }

    /// The warm pool's staging: root's entries, no write bit anywhere, readable (and
    /// directories searchable) by the sandbox user whatever the source's modes.
    #[test]
    fn root_read_only_entries_have_no_write_bit_and_are_readable_by_all() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        fs::create_dir(d.join("sub")).unwrap();
        fs::write(d.join("sub/secret"), b"s").unwrap();
        fs::set_permissions(d.join("sub/secret"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(d.join("run.sh"), b"#!/bin/sh\n").unwrap();
        fs::set_permissions(d.join("run.sh"), fs::Permissions::from_mode(0o777)).unwrap();
        fs::set_permissions(d.join("sub"), fs::Permissions::from_mode(0o700)).unwrap();
        let mut buf = Vec::new();
        InputDir::open(d).unwrap().write_tar(Owners::RootReadOnly, 1 << 20, &mut buf, &|_| {}).unwrap();
        let modes: Vec<(String, u32, u64)> = tar_entries(&buf).into_iter().map(|e| (e.0, e.2, e.3)).collect();
        assert_eq!(
            modes,
            [("run.sh".to_owned(), 0o555, 0), ("sub".to_owned(), 0o555, 0), ("sub/secret".to_owned(), 0o444, 0)]
        );
    }

    #[test]
    fn a_subdir_swapped_for_a_symlink_mid_staging_is_refused_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let secret = t.path().join("secret");
        fs::create_dir(&secret).unwrap();
        fs::write(secret.join("key"), b"TOP SECRET").unwrap();
        let d = t.path().join("in");
        fs::create_dir_all(d.join("sub")).unwrap();
        fs::write(d.join("a"), b"a").unwrap();
        fs::write(d.join("sub/x"), b"x").unwrap();
        let input = InputDir::open(&d).unwrap();
        let swap = |p: &Path| {
            if p == Path::new("sub") {
                fs::remove_dir_all(d.join("sub")).unwrap();
                std::os::unix::fs::symlink(&secret, d.join("sub")).unwrap();
            }
        };
        let mut buf = Vec::new();
        let err = input.write_tar(Owners::User(1, 1), 1 << 20, &mut buf, &swap).unwrap_err();
        assert!(matches!(err, StageError::Changed { ref path, .. } if path == Path::new("sub")), "{err}");
        assert!(!buf.windows(10).any(|w| w == b"TOP SECRET"), "the secret never reaches the tar");
    }

    #[test]
    fn a_file_growing_mid_staging_injects_nothing() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        fs::write(d.join("grows"), b"0123456789").unwrap();
        let input = InputDir::open(d).unwrap();
        // A second tar appended to the file would become entries if the copy read to EOF.
        let mut evil = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(4);
        h.set_mode(0o4755);
        h.set_uid(0);
        h.set_cksum();
        evil.append_data(&mut h, "setuid-root", &b"evil"[..]).unwrap();
        let evil = evil.into_inner().unwrap();
        let grow = |p: &Path| {
            if p == Path::new("grows") {
                let mut f = fs::OpenOptions::new().append(true).open(d.join("grows")).unwrap();
                f.write_all(&evil).unwrap();
            }
        };
        // The hook runs before the open: the header then says the grown size, and the file
        // grows again while it is copied.
        let mut buf = Vec::new();
        let first = input.write_tar(Owners::User(1, 1), 1 << 20, &mut buf, &grow);
        // Either way, no entry but the file itself is ever produced.
        let names: Vec<String> = match first {
            Ok(_) => tar_entries(&buf).into_iter().map(|e| e.0).collect(),
            Err(_) => Vec::new(),
        };
        assert!(!names.iter().any(|n| n.contains("setuid")), "{names:?}");
        // And a file that changes while it is copied is refused, named.
        fs::write(d.join("grows"), b"0123456789").unwrap();
        let file = fs::OpenOptions::new().append(true).open(d.join("grows")).unwrap();
        let during = move |_: &Path| {};
        let mut out = GrowingSink { file, evil: evil.clone(), done: false, inner: Vec::new() };
        let err = input.write_tar(Owners::User(1, 1), 1 << 20, &mut out, &during).unwrap_err();
        assert!(matches!(err, StageError::Changed { ref path, .. } if path == Path::new("grows")), "{err}");
    }

    /// Appends to the input file the moment the tar writer emits its first bytes (the header
    /// of the file), so the file grows between its fstat and the end of its copy.
    struct GrowingSink {
        file: File,
        evil: Vec<u8>,
        done: bool,
        inner: Vec<u8>,
    }

    impl Write for GrowingSink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if !self.done {
                self.done = true;
                self.file.write_all(&self.evil)?;
            }
            self.inner.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn tree_of(d: &Path) -> String {
        tree_digest(d).unwrap().tree
    }

    /// A known tree has a known digest, written here (`docs/outcome.md` shows how to get it
    /// by hand); the executable bit, a rename, a content and a symlink's target each change
    /// it; modes but the owner's x, owners and times do not; a FIFO (not staged) does not.
    #[test]
    fn the_tree_digest_is_the_documented_format() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        fs::create_dir(d.join("sub")).unwrap();
        fs::write(d.join("sub/a.txt"), b"hello").unwrap();
        fs::write(d.join("run.sh"), b"#!/bin/sh\n").unwrap();
        fs::set_permissions(d.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(d.join("sub/a.txt"), fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink("sub/a.txt", d.join("link")).unwrap();
        // By hand: sub's listing, then the root's, entries in the byte order of their names.
        let sha = |b: &[u8]| crate::util::hex(&Sha256::digest(b));
        let sub = sha(format!("f {} a.txt\0", sha(b"hello")).as_bytes());
        let root = format!("l {} link\0x {} run.sh\0d {sub} sub\0", sha(b"sub/a.txt"), sha(b"#!/bin/sh\n"));
        let known = format!("sha256:{}", sha(root.as_bytes()));
        assert_eq!(tree_of(d), known);
        assert_eq!(
            known, "sha256:b30c1c25b8c0660aa8fa0ce52a0a3c7451cbbfa20c52738dd2473d837b07b5b5",
            "the format moved"
        );
        let report = tree_digest(d).unwrap();
        assert_eq!((report.files, report.bytes), (2, 15));
        // Not digested: group and other bits, times, skipped entries.
        fs::set_permissions(d.join("sub/a.txt"), fs::Permissions::from_mode(0o600)).unwrap();
        nix::unistd::mkfifo(&d.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(tree_of(d), known);
        // Digested: the owner's x bit, a name, a content, a symlink's target.
        fs::set_permissions(d.join("run.sh"), fs::Permissions::from_mode(0o644)).unwrap();
        let no_x = tree_of(d);
        assert_ne!(no_x, known, "the x bit");
        fs::rename(d.join("run.sh"), d.join("run2.sh")).unwrap();
        let renamed = tree_of(d);
        assert_ne!(renamed, no_x, "a rename");
        fs::write(d.join("sub/a.txt"), b"hellp").unwrap();
        let content = tree_of(d);
        assert_ne!(content, renamed, "a content");
        fs::remove_file(d.join("link")).unwrap();
        std::os::unix::fs::symlink("sub", d.join("link")).unwrap();
        assert_ne!(tree_of(d), content, "a symlink's target");
        // An empty dir: the digest of no entries.
        let e = tempfile::tempdir().unwrap();
        assert_eq!(tree_of(e.path()), format!("sha256:{}", sha(b"")));
    }

    /// What a rung's staging records is what `tree_digest` computes.
    #[test]
    fn staging_records_the_tree_digest() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("x"), b"data").unwrap();
        let mut buf = Vec::new();
        let r = InputDir::open(t.path()).unwrap().write_tar(Owners::RootReadOnly, 1 << 20, &mut buf, &|_| {}).unwrap();
        assert_eq!(r.tree, tree_of(t.path()));
    }

    #[test]
    fn the_size_limit_stops_staging() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("a"), vec![0u8; 100]).unwrap();
        let sparse = File::create(t.path().join("b-sparse")).unwrap();
        sparse.set_len(1 << 40).unwrap();
        let input = InputDir::open(t.path()).unwrap();
        assert_eq!(input.measure().unwrap(), ((1 << 40) + 100, 2), "apparent size, sparse or not");
        let err = input.write_tar(Owners::User(1, 1), 1000, io::sink(), &|_| {}).unwrap_err();
        assert!(matches!(err, StageError::TooLarge { limit: 1000 }));
    }
}
