//! Descriptor-safe trees, the one place every walk of a directory another party could have
//! written goes through: the init's output dir, the host's output and input dirs, the
//! host's bundle cache, the extraction of the outputs.
//!
//! Nothing is followed: a directory is opened from its parent's descriptor with
//! `O_NOFOLLOW | O_DIRECTORY`, an entry is classified by `fstatat(AT_SYMLINK_NOFOLLOW)`, a
//! file is opened with `O_NOFOLLOW | O_NONBLOCK` and judged by `fstat` of that descriptor
//! (never by its name again), a file is created with `O_EXCL | O_NOFOLLOW`. A listing keeps
//! at most a bound of entries, so one huge directory cannot exhaust memory.

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use sha2::{Digest, Sha256};
use std::collections::BinaryHeap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

/// Deeper directories are refused by every walk (each level holds one open descriptor).
pub const MAX_DEPTH: usize = 128;

/// How every directory is opened: read-only, never through a symlink, not inherited.
pub fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Opens the root of a walk. `follow`: the path is the caller's own (a symlink there is
/// followed, once); else a symlink as its last component is refused.
pub fn open_root(path: &Path, follow: bool) -> io::Result<OwnedFd> {
    let flags = if follow { OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC } else { dir_flags() };
    Ok(openat(AT_FDCWD, path, flags, Mode::empty())?)
}

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symlink (never followed).
    Symlink,
    /// A FIFO, a socket or a device: its word (`fifo`, `socket`, `device`).
    Other(&'static str),
    /// It could not be classified (it went, or cannot be read).
    Unknown,
}

impl Kind {
    /// The word a walk refuses it with, for what is neither a directory nor a file.
    pub fn word(self) -> &'static str {
        match self {
            Kind::Dir => "dir",
            Kind::File => "file",
            Kind::Symlink => "symlink",
            Kind::Other(w) => w,
            Kind::Unknown => "unreadable: unknown file type",
        }
    }
}

/// The kind `st` says.
pub fn kind_of(st: &FileStat) -> Kind {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => Kind::Dir,
        SFlag::S_IFREG => Kind::File,
        SFlag::S_IFLNK => Kind::Symlink,
        SFlag::S_IFIFO => Kind::Other("fifo"),
        SFlag::S_IFSOCK => Kind::Other("socket"),
        SFlag::S_IFCHR | SFlag::S_IFBLK => Kind::Other("device"),
        _ => Kind::Unknown,
    }
}

/// What `lstat` said of an entry when it was listed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stat {
    /// `st_mode`, type bits included.
    pub mode: u32,
    /// Apparent size.
    pub size: u64,
    /// Bytes allocated on disk (a sparse file has fewer than its size).
    pub allocated: u64,
    /// Seconds since the epoch.
    pub mtime: i64,
    /// Its owner.
    pub uid: u32,
    /// Its device and inode: which entry it is.
    pub dev: u64,
    /// See `dev`.
    pub ino: u64,
}

impl From<&FileStat> for Stat {
    fn from(st: &FileStat) -> Self {
        Stat {
            mode: st.st_mode,
            size: u64::try_from(st.st_size).unwrap_or(0),
            allocated: u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512),
            mtime: st.st_mtime,
            uid: st.st_uid,
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }
}

/// One entry of a directory, ordered so that a depth-first visit in this order yields full
/// paths in byte order: a directory sorts as its name plus `/`, as its descendants do.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Child {
    key: Vec<u8>,
    /// Its name in its directory.
    pub name: Vec<u8>,
    /// What it was when listed.
    pub kind: Kind,
    /// `None` when it could not be looked at.
    pub stat: Option<Stat>,
}

/// The entries of the directory open as `dir` (without `.` and `..`), in visiting order,
/// at most the first `keep` of them; whether more were dropped. `seen` is shown every entry
/// as it is read, and stops the listing by returning `false` (the entries kept so far are
/// returned, as dropped ones).
pub fn children(dir: &impl AsFd, keep: usize, mut seen: impl FnMut(&Child) -> bool) -> io::Result<(Vec<Child>, bool)> {
    let mut listing = Dir::openat(dir.as_fd(), ".", dir_flags(), Mode::empty())?;
    let mut heap = BinaryHeap::new();
    let mut truncated = false;
    for entry in listing.iter() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let st = fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).ok();
        let kind = st.as_ref().map_or(Kind::Unknown, kind_of);
        let mut key = name.to_vec();
        if kind == Kind::Dir {
            key.push(b'/');
        }
        let child = Child { key, name: name.to_vec(), kind, stat: st.as_ref().map(Stat::from) };
        if !seen(&child) {
            truncated = true;
            break;
        }
        heap.push(child);
        if heap.len() > keep {
            heap.pop();
            truncated = true;
        }
    }
    Ok((heap.into_sorted_vec(), truncated))
}

/// Why an entry could not be opened as what it was listed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It is (now) a symlink.
    Symlink,
    /// It is (now) of another kind.
    Not(Kind),
    /// The system said no.
    Io(Errno),
}

impl Refusal {
    /// How a walk names it: the kind's word, or `unreadable: <why>`.
    pub fn why(self) -> String {
        match self {
            Refusal::Symlink => "symlink".into(),
            Refusal::Not(Kind::Dir | Kind::Unknown) => "unreadable: not a regular file".into(),
            Refusal::Not(k) => k.word().into(),
            Refusal::Io(e) => format!("unreadable: {}", io::Error::from(e)),
        }
    }
}

impl From<Refusal> for io::Error {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Io(e) => e.into(),
            other => io::Error::other(other.why()),
        }
    }
}

/// Opens the directory `name` of `parent`, never through a symlink.
pub fn open_dir(parent: &impl AsFd, name: &[u8]) -> Result<OwnedFd, Refusal> {
    match openat(parent.as_fd(), name, dir_flags(), Mode::empty()) {
        Ok(fd) => Ok(fd),
        Err(Errno::ELOOP) => Err(Refusal::Symlink),
        // With `O_DIRECTORY` a symlink is "not a directory" too: what is it now?
        Err(Errno::ENOTDIR) => match fstatat(parent.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).map(|st| kind_of(&st))
        {
            Ok(Kind::Symlink) => Err(Refusal::Symlink),
            Ok(k) => Err(Refusal::Not(k)),
            Err(e) => Err(Refusal::Io(e)),
        },
        Err(e) => Err(Refusal::Io(e)),
    }
}

/// Opens the regular file `name` of `parent` for reading, never through a symlink, never
/// blocking (an entry swapped for a FIFO); what it is now is `fstat` of the descriptor.
pub fn open_file(parent: &impl AsFd, name: &[u8]) -> Result<(File, FileStat), Refusal> {
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let fd = match openat(parent.as_fd(), name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ELOOP) => return Err(Refusal::Symlink),
        Err(Errno::ENXIO) => return Err(Refusal::Not(Kind::Other("socket"))),
        Err(e) => return Err(Refusal::Io(e)),
    };
    let st = fstat(&fd).map_err(Refusal::Io)?;
    match kind_of(&st) {
        Kind::File => Ok((File::from(fd), st)),
        other => Err(Refusal::Not(other)),
    }
}

/// Opens the directory `name` of `parent`, making it (`mode`) when it is missing; never
/// through a symlink.
pub fn make_dir(parent: &impl AsFd, name: &[u8], mode: u32) -> Result<OwnedFd, Refusal> {
    match mkdirat(parent.as_fd(), name, Mode::from_bits_truncate(mode)) {
        Ok(()) | Err(Errno::EEXIST) => open_dir(parent, name),
        Err(e) => Err(Refusal::Io(e)),
    }
}

/// Makes the directory `name` of `parent` (`mode`) and opens it; one that exists, or a
/// symlink planted there, is refused.
pub fn make_new_dir(parent: &impl AsFd, name: &[u8], mode: u32) -> Result<OwnedFd, Refusal> {
    mkdirat(parent.as_fd(), name, Mode::from_bits_truncate(mode)).map_err(Refusal::Io)?;
    open_dir(parent, name)
}

/// Creates the file `name` of `parent` (`mode`), for writing; one that exists, or a symlink
/// planted there, is refused (`EEXIST`).
pub fn create_file(parent: &impl AsFd, name: &[u8], mode: u32) -> Result<File, Errno> {
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    openat(parent.as_fd(), name, flags, Mode::from_bits_truncate(mode)).map(File::from)
}

/// Empties the directory open as `dir`: a symlink (or any non-directory) is unlinked, never
/// followed; a subdirectory is opened with `O_NOFOLLOW`, must still be the entry listed and,
/// with `owner`, belong to that uid. At most `max_depth` levels. The bytes of the regular
/// files removed.
pub fn empty(dir: &impl AsFd, max_depth: usize, owner: Option<u32>) -> io::Result<u64> {
    let (entries, _) = children(dir, usize::MAX, |_| true)?;
    let mut freed = 0;
    for child in entries {
        let name = child.name.as_slice();
        match (child.kind, child.stat) {
            (_, None) => continue,
            (Kind::Dir, Some(st)) => {
                if max_depth == 0 {
                    return Err(io::Error::other("nested deeper than allowed"));
                }
                let sub = open_dir(dir, name)?;
                let now = Stat::from(&fstat(&sub)?);
                if (now.dev, now.ino) != (st.dev, st.ino) || owner.is_some_and(|u| u != now.uid) {
                    return Err(io::Error::new(io::ErrorKind::PermissionDenied, "a dir not ours (or replaced) inside"));
                }
                freed += empty(&sub, max_depth - 1, owner)?;
                unlinkat(dir.as_fd(), name, UnlinkatFlags::RemoveDir)?;
            }
            (kind, Some(st)) => match unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) if kind == Kind::File => freed += st.size,
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(e.into()),
            },
        }
    }
    Ok(freed)
}

/// A file's content as a tar entry: exactly the size its header promised. A file that
/// shrank meanwhile is padded with zeros (and `short` says so); one that grew is cut.
#[derive(Debug)]
pub struct Exactly<R> {
    inner: R,
    left: u64,
    /// The file ended before its size: what was sent is not the file.
    pub short: bool,
}

impl<R: io::Read> Exactly<R> {
    /// `size` bytes of `inner`.
    pub fn new(inner: R, size: u64) -> Self {
        Self { inner, left: size, short: false }
    }
}

impl<R: io::Read> io::Read for Exactly<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf.len().min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = loop {
            match self.inner.read(&mut buf[..want]) {
                Ok(0) => {
                    self.short = true;
                    buf[..want].fill(0);
                    break want;
                }
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        };
        self.left -= n as u64;
        Ok(n)
    }
}

/// The input tree digest (`docs/outcome.md`, "Input tree digest"), written once for the host
/// that stages the inputs and the init that writes them: one entry of a directory's listing: `<type> <hex> <name>\0`, the type
/// `f` (a regular file), `x` (one its owner may execute), `d` (a directory) or `l` (a
/// symlink, digested by its target's bytes: never followed).
pub fn listing_entry(kind: u8, digest: &[u8], name: &[u8]) -> Vec<u8> {
    let mut line = Vec::with_capacity(68 + name.len());
    line.extend_from_slice(&[kind, b' ']);
    line.extend_from_slice(hex(digest).as_bytes());
    line.push(b' ');
    line.extend_from_slice(name);
    line.push(0);
    line
}

/// A directory's digest: SHA-256 of its entries' lines in the byte order of their names.
pub fn listing_digest(mut entries: Vec<(Vec<u8>, Vec<u8>)>) -> [u8; 32] {
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let mut h = Sha256::new();
    for (_, line) in &entries {
        h.update(line);
    }
    h.finalize().into()
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_listing_is_in_path_order_and_bounded() {
        let t = tempfile::tempdir().unwrap();
        for n in ["b", "a.txt", "a"] {
            std::fs::write(t.path().join(n), n).unwrap();
        }
        std::fs::remove_file(t.path().join("a")).unwrap();
        std::fs::create_dir(t.path().join("a")).unwrap();
        symlink("/etc/passwd", t.path().join("l")).unwrap();
        let root = open_root(t.path(), false).unwrap();
        let (all, cut) = children(&root, usize::MAX, |_| true).unwrap();
        let names: Vec<_> = all.iter().map(|c| (String::from_utf8_lossy(&c.name).into_owned(), c.kind)).collect();
        // `a/` sorts after `a.txt`, as the paths under it do.
        assert_eq!(
            names,
            [
                ("a.txt".into(), Kind::File),
                ("a".into(), Kind::Dir),
                ("b".into(), Kind::File),
                ("l".into(), Kind::Symlink)
            ]
        );
        assert!(!cut);
        let (first, cut) = children(&root, 2, |_| true).unwrap();
        assert_eq!((first.len(), cut), (2, true));
        assert_eq!(first[0].name, b"a.txt");
    }

    #[test]
    fn nothing_is_followed() {
        let t = tempfile::tempdir().unwrap();
        symlink("/etc", t.path().join("d")).unwrap();
        symlink("/etc/passwd", t.path().join("f")).unwrap();
        let root = open_root(t.path(), false).unwrap();
        assert_eq!(open_dir(&root, b"d").unwrap_err(), Refusal::Symlink);
        assert_eq!(open_file(&root, b"f").unwrap_err(), Refusal::Symlink);
        assert_eq!(create_file(&root, b"f", 0o600).unwrap_err(), Errno::EEXIST);
        assert!(open_root(&t.path().join("d"), false).is_err(), "a symlinked root is refused");
        assert!(open_root(&t.path().join("d"), true).is_ok(), "unless it is the caller's own path");
    }

    #[test]
    fn emptying_unlinks_symlinks_and_never_leaves_the_tree() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "k").unwrap();
        let inside = t.path().join("inside");
        std::fs::create_dir_all(inside.join("sub/deeper")).unwrap();
        std::fs::write(inside.join("sub/deeper/f"), "12345").unwrap();
        symlink(&outside, inside.join("link")).unwrap();
        let root = open_root(&inside, false).unwrap();
        assert_eq!(empty(&root, 8, None).unwrap(), 5);
        assert_eq!(std::fs::read_dir(&inside).unwrap().count(), 0);
        assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "k");
        std::fs::create_dir_all(inside.join("a/b")).unwrap();
        assert!(empty(&root, 1, None).is_err(), "deeper than allowed");
    }

    #[test]
    fn exactly_the_promised_size_is_read() {
        use std::io::Read;
        let mut out = Vec::new();
        let mut short = Exactly::new(&b"abc"[..], 5);
        short.read_to_end(&mut out).unwrap();
        assert_eq!((out.as_slice(), short.short), (&b"abc\0\0"[..], true));
        out.clear();
        let mut long = Exactly::new(&b"abcdef"[..], 2);
        long.read_to_end(&mut out).unwrap();
        assert_eq!((out.as_slice(), long.short), (&b"ab"[..], false));
    }
}
