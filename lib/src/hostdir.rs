//! Host directories stevedore owns (log captures): created or opened safely, used by
//! descriptor, never by a path another local user could have placed first.
//!
//! The base is `$XDG_RUNTIME_DIR/stevedore` when that is set, else
//! `$TMPDIR/stevedore-<uid>`. Every directory is opened with `O_NOFOLLOW` and must belong to
//! the current user with no group or other access (0700); every file is created with
//! `O_EXCL | O_NOFOLLOW`, mode 0600. A directory someone else made first is refused, named,
//! never written into or emptied.
//!
//! A descriptor protects what stevedore itself reads and writes, not what the engine binds by
//! path later: whoever owns a directory above the base can rename the base away and put their
//! own in its place between a check and the bind (root's `XDG_RUNTIME_DIR` kept by `su` or
//! `sudo -E` is another user's). So every directory from `/` down is checked too
//! ([`check_chain`], [`open_default_base`]): each this user's or root's, and writable by no
//! one else unless it is root's and sticky (as /tmp is).

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, fchmod, fstat, mkdirat};
use nix::unistd::{UnlinkatFlags, geteuid, unlinkat};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use stevedore_init::tree::dir_flags;

/// Why a host directory cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostDirError {
    /// the directory is not safe to use
    #[error("refusing {path}: {why}")]
    Untrusted {
        /// The directory.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// the name cannot be a path component
    #[error("{0:?} cannot be a file name (letters, digits, '.', '_', '-' only, not starting with '.')")]
    BadName(String),
    /// a system call failed
    #[error("cannot {op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Whether `name` is a safe single path component: 1-200 of `[A-Za-z0-9._-]`, not starting
/// with `.` (so never `.` or `..`).
pub fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The default base for this user.
pub fn default_base() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| Path::new(d).is_absolute()) {
        Some(d) => PathBuf::from(d).join("stevedore"),
        None => std::env::temp_dir().join(format!("stevedore-{}", geteuid().as_raw())),
    }
}

/// Checks every directory from `/` down to `path`, after resolving it (symlinks on the way
/// followed once, as the engine's bind would follow them): each must belong to this user or
/// root, and be writable by no one else unless it is root's and sticky (as /tmp is); then
/// only this user and root can change what lies below. Returns the resolved path: what to
/// bind, so that what is bound is what was checked. Walked by descriptor (`O_NOFOLLOW` at each
/// step: a component swapped for a symlink after the resolving is refused). Changes nothing.
pub fn check_chain(path: &Path) -> Result<PathBuf, HostDirError> {
    let real = std::fs::canonicalize(path).map_err(|source| HostDirError::Io {
        op: "resolve",
        path: path.to_owned(),
        source,
    })?;
    let me = geteuid().as_raw();
    // `O_PATH`: search permission is enough, as it is for the engine.
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut at = PathBuf::from("/");
    let open_err = |at: &Path, e: Errno| match e {
        Errno::ELOOP | Errno::ENOTDIR => HostDirError::Untrusted {
            path: at.to_owned(),
            why: "it changed after it was resolved (now a symlink, or not a directory)".into(),
        },
        e => HostDirError::Io { op: "open", path: at.to_owned(), source: e.into() },
    };
    let mut fd = nix::fcntl::open("/", flags, Mode::empty()).map_err(|e| open_err(&at, e))?;
    chain_link(&fd, &at, me)?;
    for part in real.components().skip(1) {
        at.push(part);
        fd = openat(&fd, part.as_os_str(), flags, Mode::empty()).map_err(|e| open_err(&at, e))?;
        chain_link(&fd, &at, me)?;
    }
    Ok(real)
}

/// One directory of [`check_chain`]'s.
fn chain_link(fd: &OwnedFd, path: &Path, me: u32) -> Result<(), HostDirError> {
    let st = fstat(fd).map_err(|e| HostDirError::Io { op: "inspect", path: path.to_owned(), source: e.into() })?;
    let untrusted = |why: String| Err(HostDirError::Untrusted { path: path.to_owned(), why });
    if st.st_uid != me && st.st_uid != 0 {
        return untrusted(format!(
            "owned by uid {}, not by this user (uid {me}) or root: that user can move what lies below it",
            st.st_uid
        ));
    }
    let sticky_roots = st.st_mode & nix::libc::S_ISVTX != 0 && st.st_uid == 0;
    if st.st_mode & 0o022 != 0 && !sticky_roots {
        return untrusted(format!(
            "others can write to it (mode {:o}) and it is not root's and sticky: they can move what lies below it",
            st.st_mode & 0o7777
        ));
    }
    Ok(())
}

/// The default base ([`default_base`]), opened (made when missing) once every directory above
/// it passed [`check_chain`]: a base under another user's directory is refused, naming that
/// directory and its owner, never used.
pub fn open_default_base() -> Result<PrivateDir, HostDirError> {
    let base = default_base();
    if let Some(parent) = base.parent() {
        check_chain(parent)?;
    }
    PrivateDir::open(&base)
}

/// A new private directory (0700, a fresh name) in the first of `$TMPDIR` and `/tmp` whose
/// chain is trusted ([`check_chain`]): where the captures go when the default base is not.
fn fresh_private_dir() -> Result<PrivateDir, HostDirError> {
    let mut last = None;
    for tmp in [std::env::temp_dir(), PathBuf::from("/tmp")] {
        match check_chain(&tmp) {
            Ok(real) => {
                let made = nix::unistd::mkdtemp(&real.join("stevedore-logs-XXXXXX")).map_err(|e| HostDirError::Io {
                    op: "create a private dir in",
                    path: real.clone(),
                    source: e.into(),
                })?;
                return PrivateDir::open(&made);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("two places were tried"))
}

/// Checks that `path`, the parent of a private directory, cannot be used by another user to
/// swap that directory: a directory (not a symlink) of this user or of root, which no one
/// else can write to unless it is sticky (as /tmp is). Changes nothing.
#[cfg(feature = "docker")]
pub fn check_parent(path: &Path) -> Result<(), HostDirError> {
    let st = nix::sys::stat::lstat(path).map_err(|e| HostDirError::Io {
        op: "inspect",
        path: path.to_owned(),
        source: e.into(),
    })?;
    let untrusted = |why: String| Err(HostDirError::Untrusted { path: path.to_owned(), why });
    if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFDIR {
        return untrusted("it is not a directory (a symlink?)".into());
    }
    let me = geteuid().as_raw();
    if st.st_uid != me && st.st_uid != 0 {
        return untrusted(format!("owned by uid {}, not by this user (uid {me}) or root", st.st_uid));
    }
    if st.st_mode & 0o022 != 0 && st.st_mode & nix::libc::S_ISVTX == 0 {
        return untrusted(format!("others can write to it (mode {:o}) and it is not sticky", st.st_mode & 0o7777));
    }
    Ok(())
}

/// A directory owned by this user, mode 0700, held open.
#[derive(Debug)]
pub struct PrivateDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl PrivateDir {
    /// Opens `path`, creating it (0700) when missing; its parents must exist. Its
    /// [`path`](Self::path) is then absolute (resolved once opened): what is recorded of it
    /// (the Outcome's captures) is read later from elsewhere, another directory or machine.
    pub fn open(path: &Path) -> Result<Self, HostDirError> {
        let io = |op, source: Errno| HostDirError::Io { op, path: path.to_owned(), source: source.into() };
        match nix::unistd::mkdir(path, Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(io("create", e)),
        }
        let fd = match nix::fcntl::open(path, dir_flags(), Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ELOOP) => {
                return Err(HostDirError::Untrusted { path: path.to_owned(), why: "it is a symlink".into() });
            }
            Err(Errno::ENOTDIR) => {
                return Err(HostDirError::Untrusted { path: path.to_owned(), why: "it is not a directory".into() });
            }
            Err(e) => return Err(io("open", e)),
        };
        let path =
            std::fs::canonicalize(path).or_else(|_| std::path::absolute(path)).unwrap_or_else(|_| path.to_owned());
        Self::checked(fd, path)
    }

    fn checked(fd: OwnedFd, path: PathBuf) -> Result<Self, HostDirError> {
        let st = fstat(&fd).map_err(|e| HostDirError::Io { op: "inspect", path: path.clone(), source: e.into() })?;
        let me = geteuid().as_raw();
        if st.st_uid != me {
            let why = format!("owned by uid {}, not by this user (uid {me})", st.st_uid);
            return Err(HostDirError::Untrusted { path, why });
        }
        if st.st_mode & 0o077 != 0 {
            // A shared directory (sticky, as /tmp is) is never ours to tighten, even as root:
            // doing so would lock every other user out of it.
            if st.st_mode & nix::libc::S_ISVTX != 0 {
                let why = format!(
                    "it is a shared directory (mode {:o}, sticky, as /tmp is): name a directory of its own inside it",
                    st.st_mode & 0o7777
                );
                return Err(HostDirError::Untrusted { path, why });
            }
            // Ours, so ours to tighten: a umask or an older version may have left it open.
            fchmod(fd.as_fd(), Mode::from_bits_truncate(0o700)).map_err(|e| HostDirError::Io {
                op: "tighten the mode of",
                path: path.clone(),
                source: e.into(),
            })?;
        }
        Ok(Self { fd, path })
    }

    /// Its path (for messages and evidence).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens (creating when missing) the subdirectory `name`.
    pub fn subdir(&self, name: &str) -> Result<PrivateDir, HostDirError> {
        if !safe_name(name) {
            return Err(HostDirError::BadName(name.to_owned()));
        }
        let path = self.path.join(name);
        match mkdirat(&self.fd, name, Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(HostDirError::Io { op: "create", path, source: e.into() }),
        }
        let fd = match openat(&self.fd, name, dir_flags(), Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                return Err(HostDirError::Untrusted { path, why: "it is not a directory (a symlink?)".into() });
            }
            Err(e) => return Err(HostDirError::Io { op: "open", path, source: e.into() }),
        };
        Self::checked(fd, path)
    }

    /// Puts `bytes` as the executable `file` (0755) in the subdirectory `name` (0755, made
    /// when missing) and returns that subdirectory's path: a directory a local engine
    /// bind-mounts read-only into containers, so its modes let any uid read. No other user
    /// reaches it (this directory is 0700); a file already there is kept only when it is
    /// this user's, a regular file, and holds exactly `bytes` (compared byte for byte: a
    /// digest of it would cost a second hash of the same bytes).
    #[cfg(feature = "docker")]
    pub fn readable_copy(&self, name: &str, file: &str, bytes: &[u8]) -> Result<PathBuf, HostDirError> {
        use std::io::{Read, Write};
        if !safe_name(name) || !safe_name(file) {
            return Err(HostDirError::BadName(format!("{name}/{file}")));
        }
        let path = self.path.join(name);
        let io = |op, path: &Path, e: std::io::Error| HostDirError::Io { op, path: path.to_owned(), source: e };
        match mkdirat(&self.fd, name, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(io("create", &path, e.into())),
        }
        let dir = match openat(&self.fd, name, dir_flags(), Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                return Err(HostDirError::Untrusted { path, why: "it is not a directory (a symlink?)".into() });
            }
            Err(e) => return Err(io("open", &path, e.into())),
        };
        let st = fstat(&dir).map_err(|e| io("inspect", &path, e.into()))?;
        if st.st_uid != geteuid().as_raw() {
            return Err(HostDirError::Untrusted { path, why: format!("owned by uid {}", st.st_uid) });
        }
        if st.st_mode & 0o7777 != 0o755 {
            fchmod(dir.as_fd(), Mode::from_bits_truncate(0o755)).map_err(|e| io("set the mode of", &path, e.into()))?;
        }
        let target = path.join(file);
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        if let Ok(fd) = openat(&dir, file, flags, Mode::empty()) {
            let kept = fstat(&fd).is_ok_and(|st| {
                st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFREG
                    && st.st_uid == geteuid().as_raw()
                    && st.st_mode & 0o7777 == 0o755
                    && u64::try_from(st.st_size).ok() == Some(bytes.len() as u64)
            });
            let mut held = Vec::with_capacity(bytes.len());
            if kept && File::from(fd).take(bytes.len() as u64 + 1).read_to_end(&mut held).is_ok() && held == bytes {
                return Ok(path);
            }
        }
        // Written whole under a new name, then renamed over: a container starting meanwhile
        // sees the old file or the new one.
        let tmp = format!("{file}.new-{:08x}", rand::random::<u32>());
        let created = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = openat(&dir, tmp.as_str(), created, Mode::from_bits_truncate(0o700))
            .map_err(|e| io("create", &target, e.into()))?;
        let mut f = File::from(fd);
        let written = f
            .write_all(bytes)
            .and_then(|()| fchmod(f.as_fd(), Mode::from_bits_truncate(0o755)).map_err(Into::into))
            .and_then(|()| nix::fcntl::renameat(&dir, tmp.as_str(), &dir, file).map_err(Into::into));
        if let Err(e) = written {
            let _ = unlinkat(&dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
            return Err(io("write", &target, e));
        }
        Ok(path)
    }

    /// Removes the [`Self::readable_copy`] directories other than `keep` whose `file` was
    /// last written before `unix_before` (seconds): a copy per version of stevedore would
    /// otherwise pile up. A process of that version about to bind one meets a missing
    /// source and falls back to what it does without one. Returns how many went.
    #[cfg(feature = "docker")]
    pub fn prune_readable_copies(&self, keep: &str, file: &str, unix_before: i64) -> usize {
        let Ok((all, _)) = stevedore_init::tree::children(&self.fd, usize::MAX, |_| true) else { return 0 };
        let mut removed = 0;
        for c in all.into_iter().filter(|c| c.kind == stevedore_init::tree::Kind::Dir) {
            let Ok(name) = String::from_utf8(c.name) else { continue };
            if name == keep || !safe_name(&name) {
                continue;
            }
            let Ok(dir) = openat(&self.fd, name.as_str(), dir_flags(), Mode::empty()) else { continue };
            let stale = nix::sys::stat::fstatat(&dir, file, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_or(true, |st| st.st_mtime < unix_before);
            if stale
                && matches!(unlinkat(&dir, file, UnlinkatFlags::NoRemoveDir), Ok(()) | Err(Errno::ENOENT))
                && unlinkat(&self.fd, name.as_str(), UnlinkatFlags::RemoveDir).is_ok()
            {
                removed += 1;
            }
        }
        removed
    }

    /// Creates the new file `name` (0600); an existing entry of that name is an error.
    pub fn create_file(&self, name: &str) -> Result<File, HostDirError> {
        if !safe_name(name) {
            return Err(HostDirError::BadName(name.to_owned()));
        }
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        openat(&self.fd, name, flags, Mode::from_bits_truncate(0o600)).map(File::from).map_err(|e| HostDirError::Io {
            op: "create",
            path: self.path.join(name),
            source: e.into(),
        })
    }

    /// Replaces the file `name` with `bytes` whole (written to a new file, then renamed over
    /// it): a reader sees the old content or the new, never half of either.
    #[cfg(feature = "docker")]
    pub fn replace_file(&self, name: &str, bytes: &[u8]) -> Result<(), HostDirError> {
        use std::io::Write;
        let tmp = format!("{name}.new-{:08x}", rand::random::<u32>());
        let io = |op, e: std::io::Error| HostDirError::Io { op, path: self.path.join(name), source: e };
        let mut f = self.create_file(&tmp)?;
        if let Err(e) = f.write_all(bytes) {
            let _ = self.remove_file(&tmp);
            return Err(io("write", e));
        }
        nix::fcntl::renameat(&self.fd, tmp.as_str(), &self.fd, name).map_err(|e| io("rename", e.into()))
    }

    /// Reads the file `name` (at most `cap` bytes), never through a symlink.
    #[cfg(feature = "docker")]
    pub fn read_file(&self, name: &str, cap: u64) -> Result<Vec<u8>, HostDirError> {
        use std::io::Read;
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        let io = |op, e: std::io::Error| HostDirError::Io { op, path: self.path.join(name), source: e };
        let fd = openat(&self.fd, name, flags, Mode::empty()).map_err(|e| io("open", e.into()))?;
        let mut out = Vec::new();
        File::from(fd).take(cap).read_to_end(&mut out).map_err(|e| io("read", e))?;
        Ok(out)
    }

    /// Opens the file `name` for writing, creating it (0600) when missing; never through a
    /// symlink (for lock files).
    pub fn open_file(&self, name: &str) -> Result<File, HostDirError> {
        if !safe_name(name) {
            return Err(HostDirError::BadName(name.to_owned()));
        }
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        openat(&self.fd, name, flags, Mode::from_bits_truncate(0o600)).map(File::from).map_err(|e| HostDirError::Io {
            op: "open",
            path: self.path.join(name),
            source: e.into(),
        })
    }

    /// Removes the file `name`; one already gone counts as removed.
    pub fn remove_file(&self, name: &str) -> Result<(), HostDirError> {
        if !safe_name(name) {
            return Err(HostDirError::BadName(name.to_owned()));
        }
        match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(HostDirError::Io { op: "remove", path: self.path.join(name), source: e.into() }),
        }
    }

    /// Removes the subdirectory `name` when it is empty; whether it did. A subdirectory
    /// that is not empty, or already gone, stays as it is.
    pub fn remove_subdir_if_empty(&self, name: &str) -> Result<bool, HostDirError> {
        if !safe_name(name) {
            return Err(HostDirError::BadName(name.to_owned()));
        }
        match unlinkat(&self.fd, name, UnlinkatFlags::RemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT | Errno::ENOTEMPTY | Errno::EEXIST) => Ok(false),
            Err(e) => Err(HostDirError::Io { op: "remove", path: self.path.join(name), source: e.into() }),
        }
    }

    /// The names of its regular files (only safe names; anything else is left alone).
    pub fn files(&self) -> Result<Vec<String>, HostDirError> {
        let (all, _) = stevedore_init::tree::children(&self.fd, usize::MAX, |_| true)
            .map_err(|source| HostDirError::Io { op: "list", path: self.path.clone(), source })?;
        let mut names: Vec<String> = all
            .into_iter()
            .filter(|c| c.kind == stevedore_init::tree::Kind::File)
            .filter_map(|c| String::from_utf8(c.name).ok())
            .filter(|n| safe_name(n))
            .collect();
        names.sort();
        Ok(names)
    }
}

/// The base of the captures (`<base>/logs`, or the configured dir), opened on first use and
/// kept open: each worker's captures are in a private subdir of it. Under a default base
/// another user could move ([`open_default_base`]), a fresh private dir instead, and a note
/// for the Outcome saying why ([`Captures::note`]).
#[derive(Debug)]
pub(crate) struct Captures {
    configured: Option<PathBuf>,
    opened: std::sync::Mutex<Option<std::sync::Arc<PrivateDir>>>,
    note: std::sync::Mutex<Option<String>>,
}

impl Captures {
    pub fn new(configured: Option<PathBuf>) -> Self {
        Self { configured, opened: std::sync::Mutex::new(None), note: std::sync::Mutex::new(None) }
    }

    /// Why the captures are not where they would be, once [`Captures::base`] chose elsewhere.
    pub fn note(&self) -> Option<String> {
        self.note.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The base, opened (made when missing) on first use.
    pub fn base(&self) -> Result<std::sync::Arc<PrivateDir>, HostDirError> {
        let mut slot = self.opened.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(d) = &*slot {
            return Ok(d.clone());
        }
        let dir = match &self.configured {
            Some(d) => PrivateDir::open(d)?,
            None => match open_default_base() {
                Ok(base) => base.subdir("logs")?,
                Err(HostDirError::Untrusted { path, why }) => {
                    let fresh = fresh_private_dir()?;
                    let note = format!(
                        "the captures are in {}, a new private dir: {} cannot be trusted ({why})",
                        fresh.path().display(),
                        path.display()
                    );
                    tracing::warn!("{note}");
                    *self.note.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(note);
                    fresh
                }
                Err(e) => return Err(e),
            },
        };
        let dir = std::sync::Arc::new(dir);
        *slot = Some(dir.clone());
        Ok(dir)
    }

    /// One worker's capture dir.
    pub fn of_worker(&self, worker: &str) -> Result<PrivateDir, HostDirError> {
        self.base()?.subdir(worker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

    /// The init's copy a local engine binds: 0755 inside this user's 0700 dir; a copy that is
    /// not exactly the init (changed, a symlink planted in its place, another mode) is
    /// replaced before use, never followed; a directory swapped for a symlink is refused.
    #[cfg(feature = "docker")]
    #[test]
    fn the_inits_readable_copy_is_replaced_unless_it_is_exactly_the_init() {
        let t = tempfile::tempdir().unwrap();
        let base = PrivateDir::open(&t.path().join("base")).unwrap();
        let bytes = b"\x7fELF the init";
        let dir = base.readable_copy("d1", "init", bytes).unwrap();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        assert_eq!((mode(&dir), mode(&dir.join("init"))), (0o755, 0o755));
        assert_eq!(mode(base.path()), 0o700, "no other user reaches it");
        let inode = std::fs::metadata(dir.join("init")).unwrap().ino();
        base.readable_copy("d1", "init", bytes).unwrap();
        assert_eq!(std::fs::metadata(dir.join("init")).unwrap().ino(), inode, "an exact copy is kept");

        std::fs::write(dir.join("init"), b"\x7fELF planted!!").unwrap();
        base.readable_copy("d1", "init", bytes).unwrap();
        assert_eq!(std::fs::read(dir.join("init")).unwrap(), bytes, "a changed copy is replaced");

        let elsewhere = t.path().join("elsewhere");
        std::fs::write(&elsewhere, bytes).unwrap();
        std::fs::remove_file(dir.join("init")).unwrap();
        symlink(&elsewhere, dir.join("init")).unwrap();
        base.readable_copy("d1", "init", bytes).unwrap();
        assert!(std::fs::symlink_metadata(dir.join("init")).unwrap().file_type().is_file(), "the symlink is replaced");
        assert_eq!(std::fs::read(&elsewhere).unwrap(), bytes, "and never written through");

        std::fs::set_permissions(dir.join("init"), std::fs::Permissions::from_mode(0o777)).unwrap();
        base.readable_copy("d1", "init", bytes).unwrap();
        assert_eq!(mode(&dir.join("init")), 0o755, "a copy others could write is replaced");

        // Another version's copy: kept while young, removed once stale; never this one.
        let old = base.readable_copy("d0", "init", bytes).unwrap();
        let now = i64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs());
        assert_eq!(base.prune_readable_copies("d1", "init", now.unwrap() - 3600), 0);
        assert_eq!(base.prune_readable_copies("d1", "init", now.unwrap() + 10), 1);
        assert!(!old.exists() && dir.join("init").exists(), "the stale copy went, ours stayed");

        std::fs::create_dir(t.path().join("other")).unwrap();
        symlink(t.path().join("other"), base.path().join("d2")).unwrap();
        let err = base.readable_copy("d2", "init", bytes).unwrap_err();
        assert!(matches!(err, HostDirError::Untrusted { .. }), "{err}");
        assert!(std::fs::read_dir(t.path().join("other")).unwrap().next().is_none(), "nothing written through it");
    }

    #[test]
    fn names() {
        for ok in ["w1", "cli-0123", "a.b_c-d"] {
            assert!(safe_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", "é", &"x".repeat(201)] {
            assert!(!safe_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn creates_private_dirs_and_files() {
        let t = tempfile::tempdir().unwrap();
        let base = PrivateDir::open(&t.path().join("base")).unwrap();
        assert_eq!(std::fs::metadata(base.path()).unwrap().mode() & 0o777, 0o700);
        let sub = base.subdir("w1").unwrap();
        let mut f = sub.create_file("x.stdout").unwrap();
        std::io::Write::write_all(&mut f, b"hi").unwrap();
        let meta = std::fs::metadata(sub.path().join("x.stdout")).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert!(sub.create_file("x.stdout").is_err(), "never written through an existing entry");
        assert_eq!(sub.files().unwrap(), ["x.stdout"]);
        sub.remove_file("x.stdout").unwrap();
        assert!(sub.files().unwrap().is_empty());
        assert!(matches!(sub.subdir(".."), Err(HostDirError::BadName(_))));
        assert!(matches!(sub.create_file("../x"), Err(HostDirError::BadName(_))));
    }

    #[test]
    fn a_symlink_planted_first_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        std::fs::write(victim.join("keep"), b"k").unwrap();
        symlink(&victim, t.path().join("base")).unwrap();
        let err = PrivateDir::open(&t.path().join("base")).unwrap_err();
        assert!(matches!(err, HostDirError::Untrusted { .. }), "{err}");
        let base = PrivateDir::open(&t.path().join("real")).unwrap();
        symlink(&victim, t.path().join("real/w1")).unwrap();
        assert!(matches!(base.subdir("w1"), Err(HostDirError::Untrusted { .. })));
        std::os::unix::fs::symlink(victim.join("keep"), t.path().join("real/f")).unwrap();
        assert!(base.files().unwrap().is_empty(), "a symlink is not listed as a file");
        assert_eq!(std::fs::read(victim.join("keep")).unwrap(), b"k");
    }

    #[test]
    fn a_shared_sticky_dir_is_refused_and_left_as_it_is() {
        // As /tmp is when stevedore runs as root: tightening it would lock everyone out.
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("shared");
        std::fs::create_dir(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let err = PrivateDir::open(&p).unwrap_err();
        assert!(err.to_string().contains("shared directory"), "{err}");
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o1777);
    }

    #[test]
    #[cfg(feature = "docker")]
    fn a_parent_is_checked_never_changed() {
        let t = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
        let shared = t.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        check_parent(&shared).unwrap();
        assert_eq!(mode(&shared), 0o1777);
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(check_parent(&open), Err(HostDirError::Untrusted { .. })));
        assert_eq!(mode(&open), 0o777);
        symlink(&shared, t.path().join("link")).unwrap();
        assert!(matches!(check_parent(&t.path().join("link")), Err(HostDirError::Untrusted { .. })));
        check_parent(t.path()).unwrap();
    }

    /// Issue 41, 2: a directory above the bound path that another user owns (root's
    /// `XDG_RUNTIME_DIR` kept by `su`) or can write lets them swap what the engine binds; it
    /// is refused, named with its owner, and so is one that changes hands after a first check.
    #[test]
    fn a_chain_another_user_could_move_is_refused_by_name() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("run/stevedore/tools");
        std::fs::create_dir_all(&dir).unwrap();
        let real = check_chain(&dir).unwrap();
        assert_eq!(real, std::fs::canonicalize(&dir).unwrap(), "the resolved path is what is bound");
        let open = t.path().join("run");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = check_chain(&dir).unwrap_err();
        assert!(matches!(&err, HostDirError::Untrusted { path, .. } if path.ends_with("run")), "{err}");
        assert!(err.to_string().contains("others can write"), "{err}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        if geteuid().is_root() {
            // The runtime dir changes hands after the first check: the next check refuses it.
            nix::unistd::chown(&open, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            let err = check_chain(&dir).unwrap_err();
            assert!(err.to_string().contains("owned by uid 65534"), "{err}");
            assert!(err.to_string().contains(&*open.display().to_string()), "{err}");
        }
        // /tmp itself (root's, sticky) stays usable.
        check_chain(Path::new("/tmp")).unwrap();
    }

    #[test]
    fn an_open_mode_of_our_own_is_tightened() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("base");
        std::fs::create_dir(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
        PrivateDir::open(&p).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o700);
    }
}
