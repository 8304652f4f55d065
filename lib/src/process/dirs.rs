//! The process rung's places on the host: its base dir (owned by the worker, never writable
//! by anyone else), the init and the worker binary copied in by digest, and each attempt's
//! dir with `in/` (a private, read-only copy of the inputs), `out/` and `tmp/` (the
//! command's). Nothing is followed through a symlink another local user could have put first.

use crate::util::hex;
use nix::sys::stat::{Mode, fchmod, fstat};
use nix::unistd::{Gid, Uid, chown};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why a place on the host could not be made or trusted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirError {
    /// a path is not what stevedore made
    #[error("{path} cannot be trusted: {why}")]
    Untrusted {
        /// The path.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// a filesystem call failed
    #[error("{op} {path}")]
    Io {
        /// The call.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> DirError + use<> {
    let path = path.to_owned();
    move |source| DirError::Io { op, path, source }
}

/// Makes `path` a directory owned by this process's user with exactly `mode`, creating it
/// (and its parents, which must exist or be creatable) when missing. An existing one must
/// already be ours, a real directory, and not writable by group or others.
pub fn ensure_dir(path: &Path, mode: u32) -> Result<(), DirError> {
    if let Some(parent) = path.parent()
        && !parent.as_os_str().is_empty()
    {
        fs::create_dir_all(parent).map_err(io_err("create", parent))?;
    }
    match fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err("create", path)(e)),
    }
    let md = fs::symlink_metadata(path).map_err(io_err("inspect", path))?;
    let untrusted = |why: String| DirError::Untrusted { path: path.to_owned(), why };
    if !md.file_type().is_dir() {
        return Err(untrusted("it is not a directory (a symlink?)".into()));
    }
    if md.uid() != nix::unistd::geteuid().as_raw() {
        return Err(untrusted(format!("it belongs to uid {}, not to this user", md.uid())));
    }
    if md.mode() & 0o022 != 0 {
        return Err(untrusted(format!("it is writable by others (mode {:o})", md.mode() & 0o777)));
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", path))
}

/// Copies `bytes` into `dir` as `name-<digest16>` (0755), unless a file of that name with
/// that digest is there already; returns its path.
pub fn install(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf, DirError> {
    let digest = hex(&Sha256::digest(bytes));
    let path = dir.join(format!("{name}-{}", &digest[..16]));
    if let Ok(existing) = read_nofollow(&path)
        && hex(&Sha256::digest(&existing)) == digest
    {
        return Ok(path);
    }
    let tmp = dir.join(format!(".{name}-{:016x}", rand::random::<u64>()));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(io_err("create", &tmp))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(io_err("write", &tmp))?;
    fs::rename(&tmp, &path).map_err(io_err("rename", &path))?;
    Ok(path)
}

fn read_nofollow(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut f = fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_NOFOLLOW).open(path)?;
    let st = fstat(&f)?;
    if st.st_uid != nix::unistd::geteuid().as_raw() || st.st_mode & 0o022 != 0 {
        return Err(io::Error::other("not ours"));
    }
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok(v)
}

/// One attempt's dir and its parts.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AttemptDir {
    /// The attempt's dir.
    pub root: PathBuf,
    /// The inputs, read-only.
    pub input: PathBuf,
    /// The outputs, the command's.
    pub output: PathBuf,
    /// Scratch space and `HOME`, the command's.
    pub tmp: PathBuf,
}

impl AttemptDir {
    /// Makes `<attempts>/<name>` with `in/`, `out/`, `tmp/`; `out/` and `tmp/` belong to
    /// `run_as` (when given), the rest to the worker. The attempt's dir is reachable only by
    /// the worker and `run_as`'s group.
    pub fn create(attempts: &Path, name: &str, run_as: Option<(u32, u32)>) -> Result<Self, DirError> {
        let root = attempts.join(name);
        fs::DirBuilder::new().mode(0o700).create(&root).map_err(io_err("create", &root))?;
        let d = Self { input: root.join("in"), output: root.join("out"), tmp: root.join("tmp"), root };
        for p in [&d.input, &d.output, &d.tmp, &d.ctl()] {
            fs::DirBuilder::new().mode(0o700).create(p).map_err(io_err("create", p))?;
        }
        if let Some((uid, gid)) = run_as {
            for p in [&d.output, &d.tmp] {
                chown(p, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
                    .map_err(|e| io_err("chown", p)(e.into()))?;
            }
            chown(&d.root, None, Some(Gid::from_raw(gid))).map_err(|e| io_err("chown", &d.root)(e.into()))?;
            fs::set_permissions(&d.root, fs::Permissions::from_mode(0o710)).map_err(io_err("chmod", &d.root))?;
        }
        Ok(d)
    }

    /// The worker's own dir of the attempt (0700): its takeover socket, which nothing else
    /// can reach, the command's uid included.
    pub fn ctl(&self) -> PathBuf {
        self.root.join("ctl")
    }

    /// Binds the attempt's takeover socket in [`AttemptDir::ctl`], for the init to inherit.
    pub fn takeover_listener(&self) -> Result<std::os::fd::OwnedFd, DirError> {
        let ctl = self.ctl();
        let l = through_dir(&ctl, |p| std::os::unix::net::UnixListener::bind(p)).map_err(io_err("bind", &ctl))?;
        Ok(l.into())
    }

    /// Connects to the attempt's takeover socket (what `recover` does; only this uid can).
    pub fn connect_takeover(&self) -> Result<std::os::unix::net::UnixStream, DirError> {
        let ctl = self.ctl();
        through_dir(&ctl, |p| std::os::unix::net::UnixStream::connect(p)).map_err(io_err("connect", &ctl))
    }

    /// Makes the copied inputs read-only: directories 0555, files 0444 (plus the owner's
    /// execute bits). Returns whether the command cannot undo it (it is not their owner).
    pub fn seal_inputs(&self, run_as: Option<(u32, u32)>) -> Result<bool, DirError> {
        seal(&self.input)?;
        Ok(run_as.is_some_and(|(uid, _)| uid != nix::unistd::geteuid().as_raw()))
    }

    /// Removes the attempt's dir and everything in it (the command may have made its
    /// dirs unwritable: they are opened up first).
    pub fn remove(&self) -> Result<(), DirError> {
        open_up(&self.root);
        match fs::remove_dir_all(&self.root) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("remove", &self.root)(e)),
        }
    }
}

/// Runs `f` on `dir`'s socket path `t.sock`, reached through a descriptor of `dir` (opened
/// without following a symlink), so neither a long base dir nor a swapped path matters.
fn through_dir<T>(dir: &Path, f: impl FnOnce(&Path) -> io::Result<T>) -> io::Result<T> {
    use nix::fcntl::{OFlag, open};
    use std::os::fd::AsRawFd;
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = open(dir, flags, Mode::empty())?;
    f(&PathBuf::from(format!("/proc/self/fd/{}/t.sock", fd.as_raw_fd())))
}

fn seal(dir: &Path) -> Result<(), DirError> {
    for entry in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let entry = entry.map_err(io_err("list", dir))?;
        let path = entry.path();
        let ft = entry.file_type().map_err(io_err("inspect", &path))?;
        if ft.is_dir() {
            seal(&path)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o555)).map_err(io_err("chmod", &path))?;
        } else if ft.is_file() {
            let f = fs::OpenOptions::new()
                .read(true)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&path)
                .map_err(io_err("open", &path))?;
            let mode = fstat(&f).map_err(|e| io_err("inspect", &path)(e.into()))?.st_mode;
            fchmod(&f, Mode::from_bits_truncate(0o444 | (mode & 0o111)))
                .map_err(|e| io_err("chmod", &path)(e.into()))?;
        }
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o555)).map_err(io_err("chmod", dir))
}

/// Gives the owner write and search on every directory below `dir`, so it can be removed.
///
/// The command may still be swapping its dirs for symlinks: each one is pinned first
/// (`O_PATH | O_NOFOLLOW | O_DIRECTORY`, which a symlink fails) and changed through that
/// descriptor, so a chmod never lands on what a symlink points to (as root, that could be
/// any directory of the host). `/proc/self/fd` because `fchmod` refuses an `O_PATH`
/// descriptor, and a dir the command made 000 cannot be opened for reading by its owner.
fn open_up(dir: &Path) {
    use nix::fcntl::{OFlag, open};
    use std::os::fd::AsRawFd;
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let Ok(pinned) = open(dir, flags, Mode::empty()) else { return };
    let through = format!("/proc/self/fd/{}", pinned.as_raw_fd());
    let _ = fs::set_permissions(&through, fs::Permissions::from_mode(0o700));
    // Listed and descended through the pinned dir too, never through `dir` again.
    if let Ok(rd) = fs::read_dir(&through) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                open_up(&Path::new(&through).join(e.file_name()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removal_opens_up_locked_dirs_and_never_follows_a_symlink() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        fs::create_dir(&victim).unwrap();
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o751)).unwrap();
        let d = AttemptDir::create(t.path(), "a1", None).unwrap();
        fs::create_dir_all(d.output.join("x/y")).unwrap();
        fs::write(d.output.join("x/y/f"), b"f").unwrap();
        std::os::unix::fs::symlink(&victim, d.output.join("x/link")).unwrap();
        std::os::unix::fs::symlink(&victim, d.tmp.join("link")).unwrap();
        for locked in [d.output.join("x/y"), d.output.join("x"), d.output.clone()] {
            fs::set_permissions(&locked, fs::Permissions::from_mode(0o000)).unwrap();
        }
        d.remove().unwrap();
        assert!(!d.root.exists());
        assert_eq!(fs::metadata(&victim).unwrap().mode() & 0o7777, 0o751, "a symlink's target was changed");
    }

    #[test]
    fn a_base_dir_writable_by_others_or_not_a_dir_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let good = t.path().join("base");
        ensure_dir(&good, 0o711).unwrap();
        assert_eq!(fs::metadata(&good).unwrap().mode() & 0o777, 0o711);
        ensure_dir(&good, 0o700).unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert!(matches!(ensure_dir(&link, 0o700), Err(DirError::Untrusted { .. })));
        let open = t.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(ensure_dir(&open, 0o700), Err(DirError::Untrusted { .. })));
    }

    #[test]
    fn installed_binaries_are_found_again_by_digest() {
        let t = tempfile::tempdir().unwrap();
        let a = install(t.path(), "init", b"one").unwrap();
        assert_eq!(install(t.path(), "init", b"one").unwrap(), a);
        let b = install(t.path(), "init", b"two").unwrap();
        assert_ne!(a, b);
        assert_eq!(fs::metadata(&a).unwrap().mode() & 0o777, 0o755);
    }

    #[test]
    fn sealed_inputs_are_read_only_and_removable() {
        let t = tempfile::tempdir().unwrap();
        let d = AttemptDir::create(t.path(), "a", None).unwrap();
        fs::create_dir(d.input.join("sub")).unwrap();
        fs::write(d.input.join("sub/f"), b"x").unwrap();
        d.seal_inputs(None).unwrap();
        assert_eq!(fs::metadata(d.input.join("sub/f")).unwrap().mode() & 0o777, 0o444);
        assert_eq!(fs::metadata(d.input.join("sub")).unwrap().mode() & 0o777, 0o555);
        d.remove().unwrap();
        assert!(!d.root.exists());
    }
}
