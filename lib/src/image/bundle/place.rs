//! The bundle base on the host and the descriptor-level helpers the bundles are made,
//! read, recorded and removed with: every dir this user's, nothing followed
//! (`stevedore_init::tree`).

use super::*;
use stevedore_init::tree;

/// The environment variable that moves the bundle cache: an absolute path, made a private
/// dir of this user when missing. The default, stevedore's private dir, is often a tmpfs
/// (`$XDG_RUNTIME_DIR`), and a debug build's bundle weighs a few hundred MB: a build tree,
/// or a disk, may suit it better (the repository's tests keep theirs under `target/`).
pub const DIR_ENV: &str = "STEVEDORE_BUNDLE_DIR";

/// The default base dir for host bundles: [`DIR_ENV`] when it is an absolute path, else
/// `bundles` in stevedore's private host dir.
pub fn default_base() -> PathBuf {
    base_from(std::env::var_os(DIR_ENV))
}

/// [`default_base`] given [`DIR_ENV`]'s value (a relative one is said and ignored: it would
/// name another dir from each working directory).
pub(super) fn base_from(configured: Option<std::ffi::OsString>) -> PathBuf {
    match configured.filter(|d| !d.is_empty()) {
        Some(d) if Path::new(&d).is_absolute() => PathBuf::from(d),
        Some(d) => {
            tracing::warn!(value = %Path::new(&d).display(), "{DIR_ENV} is not an absolute path; the default holds");
            crate::hostdir::default_base().join("bundles")
        }
        None => crate::hostdir::default_base().join("bundles"),
    }
}

pub(super) fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> BundleError + use<> {
    let path = path.to_owned();
    move |source| BundleError::Io { op, path, source }
}

/// Creates `base` (and its parent) as private dirs of this user, or refuses them.
pub(super) fn ensure_base(base: &Path) -> Result<(), BundleError> {
    let untrusted = |path: &Path, e: crate::hostdir::HostDirError| BundleError::Untrusted {
        path: path.to_owned(),
        why: match e {
            crate::hostdir::HostDirError::Untrusted { .. } => "not a private directory of this user",
            _ => "cannot be created or opened",
        },
    };
    if let Some(parent) = base.parent().filter(|p| !p.as_os_str().is_empty()) {
        if parent.exists() {
            // Not ours to change (it may be /tmp): only checked.
            crate::hostdir::check_parent(parent).map_err(|e| untrusted(parent, e))?;
        } else {
            fs::create_dir_all(parent).map_err(io_err("create", parent))?;
            crate::hostdir::PrivateDir::open(parent).map_err(|e| untrusted(parent, e))?;
        }
    }
    crate::hostdir::PrivateDir::open(base).map_err(|e| untrusted(base, e))?;
    Ok(())
}

/// Opens `base` (created private when missing), refusing anything but a private dir of ours.
pub(super) fn open_base(base: &Path) -> Result<OwnedFd, BundleError> {
    ensure_base(base)?;
    let fd = nix::fcntl::open(base, dir_flags(), Mode::empty()).map_err(|e| io_err("open", base)(e.into()))?;
    let st = fstat(&fd).map_err(|e| io_err("inspect", base)(e.into()))?;
    if st.st_uid != geteuid().as_raw() || st.st_mode & 0o077 != 0 {
        return Err(BundleError::Untrusted { path: base.to_owned(), why: "not a private directory of this user" });
    }
    Ok(fd)
}

pub(super) use stevedore_init::tree::dir_flags;

/// Opens the regular file `name` under `dir` for reading, never through a symlink, never
/// blocking.
pub(super) fn open_at(dir: &OwnedFd, name: &str) -> Result<fs::File, tree::Refusal> {
    tree::open_file(dir, name.as_bytes()).map(|(f, _)| f)
}

/// `name` under `dir`, not following a final symlink.
pub(super) fn lstat_at<P: ?Sized + nix::NixPath>(dir: &OwnedFd, name: &P) -> nix::Result<FileStat> {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
}

pub(super) fn kind_is(st: &FileStat, kind: nix::libc::mode_t) -> bool {
    st.st_mode & nix::libc::S_IFMT == kind
}

pub(super) fn mtime_of(st: &FileStat) -> SystemTime {
    let secs = u64::try_from(st.st_mtime).unwrap_or(0);
    let nanos = u32::try_from(st.st_mtime_nsec).unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::new(secs, nanos.min(999_999_999))
}

/// Whether `name` under `base` is (still) the dir open as `fd`.
pub(super) fn same_entry(base: &OwnedFd, name: &OsStr, fd: &OwnedFd) -> bool {
    match (lstat_at(base, name), fstat(fd)) {
        (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    }
}

/// The names in the dir open as `fd` (without `.` and `..`).
pub(super) fn names_in(fd: &OwnedFd) -> io::Result<Vec<OsString>> {
    let (all, _) = tree::children(fd, usize::MAX, |_| true)?;
    Ok(all.into_iter().map(|c| OsString::from_vec(c.name)).collect())
}

/// Empties the dir open as `fd` through descriptors (`tree::empty`): a symlink is
/// unlinked, never followed; every subdir must be this user's.
pub(super) fn empty_dir(fd: &OwnedFd) -> io::Result<u64> {
    tree::empty(fd, MAX_DEPTH, Some(geteuid().as_raw()))
}

/// Removes the dir `name` of `base`, open and exclusively locked as `dir`: moved aside
/// first when `aside` (so a preparer never sees a half-removed bundle), emptied through
/// descriptors, then unlinked. Returns the bytes freed.
pub(super) fn remove_locked(base: &OwnedFd, name: &OsStr, dir: &OwnedFd, aside: bool) -> io::Result<u64> {
    if !same_entry(base, name, dir) {
        return Err(io::Error::other("replaced meanwhile"));
    }
    let name = if aside {
        let trash = OsString::from(format!(".trash-{}-{:08x}", name.to_string_lossy(), rand::random::<u32>()));
        renameat(base, name, base, trash.as_os_str())?;
        trash
    } else {
        name.to_owned()
    };
    let freed = empty_dir(dir)?;
    if !same_entry(base, &name, dir) {
        return Err(io::Error::other("moved meanwhile"));
    }
    unlinkat(base, name.as_os_str(), UnlinkatFlags::RemoveDir)?;
    Ok(freed)
}

/// The manifest of the bundle dir open as `dir`, when readable.
pub(super) fn read_manifest(dir: &OwnedFd) -> Option<Manifest> {
    let mut raw = Vec::new();
    open_at(dir, MANIFEST).ok()?.take(1 << 20).read_to_end(&mut raw).ok()?;
    serde_json::from_slice(&raw).ok()
}

/// Touches the bundle's last-use marker (creating it in a bundle made before markers).
pub(super) fn touch(dir: &OwnedFd) -> io::Result<()> {
    let now = TimeSpec::UTIME_NOW;
    match utimensat(dir, MARKER, &now, &now, UtimensatFlags::NoFollowSymlink) {
        Ok(()) => Ok(()),
        Err(Errno::ENOENT) => {
            let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            match openat(dir, MARKER, flags, Mode::from_bits_truncate(0o600)) {
                Ok(_) | Err(Errno::EEXIST) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// The record's file name of an executable path.
pub(super) fn record_name(exe: &Path) -> String {
    use sha2::Digest;
    let hex = format!("{:x}", sha2::Sha256::digest(exe.as_os_str().as_bytes()));
    hex[..16].to_owned()
}

/// Records `exe` (absolute) as a path the bundle was prepared from, once.
pub(super) fn record_exe(dir: &OwnedFd, exe: &Path) -> io::Result<()> {
    match mkdirat(dir, EXES, Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let exes = openat(dir, EXES, dir_flags(), Mode::empty())?;
    let name = record_name(exe);
    if lstat_at(&exes, name.as_str()).is_ok() {
        return Ok(());
    }
    let tmp = format!(".{name}.{:08x}", rand::random::<u32>());
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let file = openat(&exes, tmp.as_str(), flags, Mode::from_bits_truncate(0o600)).map(fs::File::from)?;
    let written = (&file)
        .write_all(exe.as_os_str().as_bytes())
        .and_then(|()| renameat(&exes, tmp.as_str(), &exes, name.as_str()).map_err(io::Error::from));
    if written.is_err() {
        let _ = unlinkat(&exes, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
    }
    written
}

/// The executable paths recorded in the bundle dir open as `dir`.
pub(super) fn read_records(dir: &OwnedFd) -> Vec<PathBuf> {
    let Ok(exes) = openat(dir, EXES, dir_flags(), Mode::empty()) else { return Vec::new() };
    let mut paths = Vec::new();
    for name in names_in(&exes).unwrap_or_default() {
        let Some(name) = name.to_str().filter(|n| !n.starts_with('.')) else { continue };
        let mut raw = Vec::new();
        if open_at(&exes, name).is_ok_and(|f| f.take(4096).read_to_end(&mut raw).is_ok()) {
            let path = PathBuf::from(OsString::from_vec(raw));
            if path.is_absolute() {
                paths.push(path);
            }
        }
    }
    paths.sort();
    paths
}
