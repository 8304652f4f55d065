//! The init bundle: stevedore's own binary, plus its loader and libraries when it is
//! dynamic, laid out so that it runs in any image (even `FROM scratch`) from a read-only
//! mount at [`crate::protocol::TOOLS_DIR`].
//!
//! Layout of a bundle dir (and of its tar):
//!
//! ```text
//! <exe name>                 the executable, 0755
//! lib/<loader>               dynamic only: the loader, 0755
//! lib/<soname>               dynamic only: each library ldd lists, 0644
//! ```
//!
//! Host bundles are content-addressed (`bundle-<first 16 hex of the exe's sha256>`) and
//! immutable once renamed into place (only their hidden bookkeeping changes), so
//! concurrent workers share them safely.
//!
//! # Pruning
//!
//! A bundle of a debug build weighs ~100 MB, and every rebuild makes a new one, so the base
//! is pruned on every [`ToolsBundle::prepare`] (and by [`prune`]). Each bundle records the
//! absolute paths of the executables it was prepared from (`.exes/`, one file per path)
//! and its last use (the mtime of `.used`, touched on every prepare). A [`ToolsBundle`]
//! holds a shared `flock` on its dir for as long as it lives: a bundle in use is never
//! removed. A bundle nobody holds is removed when
//!
//! - every executable path it records is gone or holds another binary now (a rebuild
//!   superseded it; a path that cannot be checked counts as still holding it), or
//! - it was not used for [`UNUSED_FOR`] (a week), or
//! - it records no executable (made by an older stevedore, which kept no record and no
//!   marker: its age counts from its dir's mtime) and was not used for a day, or
//! - its manifest is unreadable.
//!
//! Temporary
//! and moved-aside dirs (a crash's leftovers) go once nobody holds them and they are 10
//! minutes old, remembered digests once unused for [`UNUSED_FOR`]. Removal holds the dir's
//! exclusive lock, moves it aside, and empties it through descriptors: every dir is
//! opened with `O_NOFOLLOW` and must be this user's; a symlink is unlinked, never followed.

use nix::errno::Errno;
use nix::fcntl::{AtFlags, Flock, FlockArg, OFlag, openat, renameat};
use nix::sys::stat::{FileStat, Mode, UtimensatFlags, fstat, fstatat, mkdirat, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{UnlinkatFlags, geteuid, unlinkat};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{self, Read, Seek, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The bundle's bookkeeping file; hidden so it cannot collide with an exe name in practice.
const MANIFEST: &str = ".bundle.json";
/// Inside a bundle: its mtime is the bundle's last use.
const MARKER: &str = ".used";
/// Inside a bundle: one file per executable path the bundle was prepared from.
const EXES: &str = ".exes";
/// The library dir inside a bundle.
const LIB_DIR: &str = "lib";
/// Under the base: remembered digests of executables, by file identity.
const DIGESTS: &str = "digests";
const DIR_MODE: u32 = 0o755;
const EXEC_MODE: u32 = 0o755;
const DATA_MODE: u32 = 0o644;
/// A bundle (or a remembered digest) unused for this long is pruned.
pub const UNUSED_FOR: Duration = Duration::from_secs(7 * 24 * 3600);
/// A bundle that records no executable (nothing tells whether its binary is still in use)
/// goes once unused for this long.
const UNRECORDED_UNUSED_FOR: Duration = Duration::from_secs(24 * 3600);
/// A temporary or moved-aside dir nobody holds is a crash's leftover once this old.
const DEBRIS_AGE: Duration = Duration::from_secs(600);
/// How deep removal descends (a bundle is two levels deep).
const MAX_DEPTH: usize = 8;
/// How often a prepare looks again when the bundle changed under it.
const MAX_TRIES: usize = 8;

/// Why a tools bundle could not be prepared or serialised.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolsError {
    /// the executable cannot be read
    #[error("cannot read executable {path}")]
    ReadExe {
        /// The executable.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// the executable's file name cannot be used inside a bundle
    #[error("unusable executable name {path}: {why}")]
    BadName {
        /// The executable.
        path: PathBuf,
        /// Why.
        why: &'static str,
    },
    /// ldd could not be run
    #[error("cannot run ldd on {path}")]
    LddSpawn {
        /// The executable.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// ldd rejected the executable or printed something unexpected
    #[error("ldd failed on {path}: {message}")]
    Ldd {
        /// The executable.
        path: PathBuf,
        /// What ldd said, or what was wrong with it.
        message: String,
    },
    /// a library the executable needs cannot be found on the host
    #[error("library {name} needed by {path} is not found on the host")]
    MissingLibrary {
        /// The executable.
        path: PathBuf,
        /// The library's soname.
        name: String,
    },
    /// the bundle base dir may be tampered with by someone else
    #[error("refusing tools dir {path}: {why}")]
    Untrusted {
        /// The dir.
        path: PathBuf,
        /// Why.
        why: &'static str,
    },
    /// writing or reading the bundle failed
    #[error("cannot {op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// What a bundle holds; stored in the bundle so that reuse needs neither ldd nor a rehash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    exe: String,
    exe_sha256: String,
    loader: Option<String>,
    libs: Vec<String>,
    /// Relative path → size, to detect a bundle truncated by a crash before writeback.
    sizes: BTreeMap<String, u64>,
}

/// A prepared tools bundle on the host. While it lives, it holds a shared lock on its dir,
/// so that no [`prune`] removes the bundle under it; its files are read through that dir.
#[derive(Debug, Clone)]
pub struct ToolsBundle {
    dir: PathBuf,
    manifest: Manifest,
    hold: Arc<Hold>,
}

impl PartialEq for ToolsBundle {
    fn eq(&self, other: &Self) -> bool {
        self.dir == other.dir && self.manifest == other.manifest
    }
}

impl Eq for ToolsBundle {}

/// A bundle dir, open and locked (shared while in use; exclusive while built or removed).
#[derive(Debug)]
struct Hold(Flock<OwnedFd>);

/// What [`prune`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pruned {
    /// The dirs removed from the base (bundles, and a crash's leftovers), with why.
    pub removed: Vec<(String, &'static str)>,
    /// The bundles kept because a process holds them.
    pub in_use: Vec<String>,
    /// The bytes of the regular files removed.
    pub freed_bytes: u64,
    /// The remembered digests removed.
    pub digests_removed: usize,
}

/// The default base dir for host bundles: `bundles` in stevedore's private host dir.
pub fn default_base() -> PathBuf {
    crate::hostdir::default_base().join("bundles")
}

/// The sha256 of a file, as 64 lowercase hex digits.
pub fn sha256_file(path: &Path) -> io::Result<String> {
    let hashed = crate::outputs::hash_reader(fs::File::open(path)?, 0)?;
    Ok(hashed.hash.trim_start_matches("sha256:").to_owned())
}

/// The sha256 of `exe` (64 lowercase hex digits), remembered under `base` by the file's
/// identity (device, inode, size, modification time) so that a process start does not
/// re-read a large binary that has not changed; any write or replacement changes the
/// identity. `base` is checked like the bundles it sits beside.
pub fn exe_digest(exe: &Path, base: &Path) -> Result<String, ToolsError> {
    let file = open_exe(exe).map_err(|source| ToolsError::ReadExe { path: exe.to_owned(), source })?;
    digest_of(&file, exe, base)
}

/// Opens an executable for reading: a regular file (through symlinks: the path is what the
/// caller names), never blocking on a FIFO planted in its place.
fn open_exe(exe: &Path) -> io::Result<fs::File> {
    let file =
        fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC).open(exe)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok(file)
}

/// The identity a digest is remembered by.
fn identity(meta: &fs::Metadata) -> String {
    format!("{:x}-{:x}-{:x}-{:x}.{:x}", meta.dev(), meta.ino(), meta.len(), meta.mtime(), meta.mtime_nsec())
}

fn is_digest(d: &str) -> bool {
    d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// [`exe_digest`] of an open executable (read from its start).
fn digest_of(file: &fs::File, exe: &Path, base: &Path) -> Result<String, ToolsError> {
    let read_err = |source| ToolsError::ReadExe { path: exe.to_owned(), source };
    let key = identity(&file.metadata().map_err(read_err)?);
    ensure_base(base)?;
    let dir = base.join(DIGESTS);
    let memo = dir.join(&key);
    if let Ok(d) = fs::read_to_string(&memo)
        && is_digest(&d)
    {
        // Its mtime is its last use (remembered digests unused for long are pruned).
        let now = TimeSpec::UTIME_NOW;
        let _ = utimensat(nix::fcntl::AT_FDCWD, &memo, &now, &now, UtimensatFlags::NoFollowSymlink);
        return Ok(d);
    }
    let mut reader = file;
    reader.rewind().map_err(read_err)?;
    let hashed = crate::outputs::hash_reader(reader, 0).map_err(read_err)?;
    let digest = hashed.hash.trim_start_matches("sha256:").to_owned();
    // Remembered only when the file did not change while it was read.
    if file.metadata().is_ok_and(|m| identity(&m) == key) {
        // Remembering is an optimisation: a failure only costs the next start a re-read.
        let tmp = dir.join(format!(".{key}.{:08x}", rand::random::<u32>()));
        let remembered = fs::DirBuilder::new().mode(0o700).recursive(true).create(&dir).and_then(|()| {
            fs::write(&tmp, &digest)?;
            fs::rename(&tmp, &memo)
        });
        if remembered.is_err() {
            let _ = fs::remove_file(&tmp);
        }
    }
    Ok(digest)
}

/// What `ldd` says about an executable.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Linkage {
    Static,
    Dynamic {
        /// Where the loader is on the host.
        loader: PathBuf,
        /// soname → resolved host path.
        libs: BTreeMap<String, PathBuf>,
    },
}

/// Where a dynamic executable's loader and libraries are on the host, as `ldd` resolves
/// them: `None` for a static executable, else (loader path, library paths).
pub fn host_linkage(exe: &Path) -> Result<Option<(PathBuf, Vec<PathBuf>)>, ToolsError> {
    Ok(match run_ldd(exe)? {
        Linkage::Static => None,
        Linkage::Dynamic { loader, libs } => Some((loader, libs.into_values().collect())),
    })
}

fn run_ldd(exe: &Path) -> Result<Linkage, ToolsError> {
    let out = Command::new("ldd")
        .arg(exe)
        // ldd prints in the C locale's words, which the parser depends on.
        .env("LC_ALL", "C")
        .output()
        .map_err(|source| ToolsError::LddSpawn { path: exe.to_owned(), source })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    parse_ldd(exe, out.status.success(), &stdout, &stderr)
}

fn parse_ldd(exe: &Path, success: bool, stdout: &str, stderr: &str) -> Result<Linkage, ToolsError> {
    let all = format!("{stdout}\n{stderr}");
    if all.contains("not a dynamic executable") || all.contains("statically linked") {
        return Ok(Linkage::Static);
    }
    let fail = |message: String| ToolsError::Ldd { path: exe.to_owned(), message };
    if !success {
        return Err(fail(stderr.trim().to_owned()));
    }
    let mut loader = None;
    let mut libs = BTreeMap::new();
    for line in stdout.lines().map(str::trim).filter(|l| !l.is_empty()) {
        // Strip the load address: "name => path (0x...)" or "path (0x...)".
        let line = match line.rfind(" (0x") {
            Some(i) => &line[..i],
            None => line,
        };
        if let Some((name, path)) = line.split_once("=>") {
            let (name, path) = (name.trim(), path.trim());
            if path == "not found" || path.is_empty() {
                return Err(ToolsError::MissingLibrary { path: exe.to_owned(), name: name.to_owned() });
            }
            if !path.starts_with('/') {
                return Err(fail(format!("unexpected line {line:?}")));
            }
            libs.insert(name.to_owned(), PathBuf::from(path));
        } else if line.starts_with('/') {
            loader = Some(PathBuf::from(line));
        } else if line.starts_with("linux-vdso") || line.starts_with("linux-gate") {
            // The vDSO is provided by the kernel, not a file.
        } else {
            return Err(fail(format!("unexpected line {line:?}")));
        }
    }
    let loader = loader.ok_or_else(|| fail("no loader listed".to_owned()))?;
    // Some libraries list the loader by soname too; it is stored once, as the loader.
    if let Some(name) = loader.file_name().and_then(|n| n.to_str()) {
        libs.remove(name);
    }
    Ok(Linkage::Dynamic { loader, libs })
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ToolsError + use<> {
    let path = path.to_owned();
    move |source| ToolsError::Io { op, path, source }
}

/// Creates `base` (and its parent) as private dirs of this user, or refuses them.
fn ensure_base(base: &Path) -> Result<(), ToolsError> {
    let untrusted = |path: &Path, e: crate::hostdir::HostDirError| ToolsError::Untrusted {
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
fn open_base(base: &Path) -> Result<OwnedFd, ToolsError> {
    ensure_base(base)?;
    let fd = nix::fcntl::open(base, dir_flags(), Mode::empty()).map_err(|e| io_err("open", base)(e.into()))?;
    let st = fstat(&fd).map_err(|e| io_err("inspect", base)(e.into()))?;
    if st.st_uid != geteuid().as_raw() || st.st_mode & 0o077 != 0 {
        return Err(ToolsError::Untrusted { path: base.to_owned(), why: "not a private directory of this user" });
    }
    Ok(fd)
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Opens the file `name` under `dir` for reading, never through a symlink, never blocking.
fn open_at(dir: &OwnedFd, name: &str) -> nix::Result<fs::File> {
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    openat(dir, name, flags, Mode::empty()).map(fs::File::from)
}

/// `name` under `dir`, not following a final symlink.
fn lstat_at<P: ?Sized + nix::NixPath>(dir: &OwnedFd, name: &P) -> nix::Result<FileStat> {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
}

fn kind_is(st: &FileStat, kind: nix::libc::mode_t) -> bool {
    st.st_mode & nix::libc::S_IFMT == kind
}

fn mtime_of(st: &FileStat) -> SystemTime {
    let secs = u64::try_from(st.st_mtime).unwrap_or(0);
    let nanos = u32::try_from(st.st_mtime_nsec).unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::new(secs, nanos.min(999_999_999))
}

/// Whether `name` under `base` is (still) the dir open as `fd`.
fn same_entry(base: &OwnedFd, name: &OsStr, fd: &OwnedFd) -> bool {
    match (lstat_at(base, name), fstat(fd)) {
        (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    }
}

/// The names in the dir open as `fd` (without `.` and `..`).
fn names_in(fd: &OwnedFd) -> nix::Result<Vec<OsString>> {
    let mut dir =
        nix::dir::Dir::openat(fd, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?;
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name != "." && name != ".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// Empties the dir open as `fd` through descriptors: a symlink (or any non-dir) is
/// unlinked, never followed; a subdir is opened with `O_NOFOLLOW` and must be this user's.
/// Returns the bytes of the regular files removed.
fn empty_dir(fd: &OwnedFd, depth: usize) -> io::Result<u64> {
    let mut freed = 0;
    for name in names_in(fd)? {
        let st = match lstat_at(fd, name.as_os_str()) {
            Ok(st) => st,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        if kind_is(&st, nix::libc::S_IFDIR) {
            if depth >= MAX_DEPTH {
                return Err(io::Error::other("nested deeper than a bundle can be"));
            }
            let sub = openat(fd, name.as_os_str(), dir_flags(), Mode::empty())?;
            let sst = fstat(&sub)?;
            if sst.st_uid != geteuid().as_raw() || (sst.st_dev, sst.st_ino) != (st.st_dev, st.st_ino) {
                return Err(io::Error::new(io::ErrorKind::PermissionDenied, "a dir not ours (or replaced) inside"));
            }
            freed += empty_dir(&sub, depth + 1)?;
            unlinkat(fd, name.as_os_str(), UnlinkatFlags::RemoveDir)?;
        } else {
            match unlinkat(fd, name.as_os_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) if kind_is(&st, nix::libc::S_IFREG) => freed += u64::try_from(st.st_size).unwrap_or(0),
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(freed)
}

/// Removes the dir `name` of `base`, open and exclusively locked as `dir`: moved aside
/// first when `aside` (so a preparer never sees a half-removed bundle), emptied through
/// descriptors, then unlinked. Returns the bytes freed.
fn remove_locked(base: &OwnedFd, name: &OsStr, dir: &OwnedFd, aside: bool) -> io::Result<u64> {
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
    let freed = empty_dir(dir, 0)?;
    if !same_entry(base, &name, dir) {
        return Err(io::Error::other("moved meanwhile"));
    }
    unlinkat(base, name.as_os_str(), UnlinkatFlags::RemoveDir)?;
    Ok(freed)
}

/// The manifest of the bundle dir open as `dir`, when readable.
fn read_manifest(dir: &OwnedFd) -> Option<Manifest> {
    let mut raw = Vec::new();
    open_at(dir, MANIFEST).ok()?.take(1 << 20).read_to_end(&mut raw).ok()?;
    serde_json::from_slice(&raw).ok()
}

/// Touches the bundle's last-use marker (creating it in a bundle made before markers).
fn touch(dir: &OwnedFd) -> io::Result<()> {
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
fn record_name(exe: &Path) -> String {
    use sha2::Digest;
    let hex = format!("{:x}", sha2::Sha256::digest(exe.as_os_str().as_bytes()));
    hex[..16].to_owned()
}

/// Records `exe` (absolute) as a path the bundle was prepared from, once.
fn record_exe(dir: &OwnedFd, exe: &Path) -> io::Result<()> {
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
fn read_records(dir: &OwnedFd) -> Vec<PathBuf> {
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

/// What a recorded executable path holds now, compared with a bundle's executable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExeState {
    /// The same binary.
    Same,
    /// Another binary (a rebuild), or no regular file.
    Other,
    /// Nothing.
    Gone,
    /// Cannot tell (no permission, an I/O error): counts as the same.
    Unknown,
}

fn exe_state(path: &Path, digest: &str, base: &Path) -> ExeState {
    match open_exe(path) {
        Ok(file) => match digest_of(&file, path, base) {
            Ok(d) if d == digest => ExeState::Same,
            Ok(_) => ExeState::Other,
            Err(_) => ExeState::Unknown,
        },
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => ExeState::Other,
        Err(e) if matches!(e.raw_os_error(), Some(nix::libc::ENOENT | nix::libc::ENOTDIR)) => ExeState::Gone,
        Err(_) => ExeState::Unknown,
    }
}

/// The pruning rule for a bundle nobody holds: `None` keeps it, else why it goes.
/// `exes` are the states of the paths it records (none for a bundle of an older stevedore).
fn verdict(manifest_ok: bool, idle: Duration, exes: &[ExeState]) -> Option<&'static str> {
    if !manifest_ok {
        return Some("damaged");
    }
    if idle > UNUSED_FOR || (exes.is_empty() && idle > UNRECORDED_UNUSED_FOR) {
        return Some("unused");
    }
    if !exes.is_empty() && exes.iter().all(|s| matches!(s, ExeState::Gone | ExeState::Other)) {
        return Some("superseded");
    }
    None
}

/// What an entry of the base is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    /// `bundle-<16 hex>`.
    Bundle,
    /// A temporary dir of a preparer, or a dir moved aside to be removed.
    Debris,
    /// The remembered digests, or anything else: not ours to judge.
    Other,
}

fn classify(name: &str) -> Entry {
    match name.strip_prefix("bundle-") {
        Some(hex) if hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) => {
            Entry::Bundle
        }
        // Older versions moved a damaged bundle aside as `bundle-<hex>.damaged-<rand>`.
        Some(rest) if rest.contains(".damaged-") => Entry::Debris,
        _ if name.starts_with(".tmp-bundle-") || name.starts_with(".trash-") => Entry::Debris,
        _ => Entry::Other,
    }
}

/// Prunes the bundle base `base` (see the module's doc): removes the bundles nobody holds
/// whose executables were all rebuilt or removed, or that were not used for
/// [`UNUSED_FOR`], and a crash's leftovers. [`ToolsBundle::prepare`] does this each time.
pub fn prune(base: &Path) -> Result<Pruned, ToolsError> {
    let base_fd = open_base(base)?;
    Ok(prune_at(&base_fd, base))
}

fn prune_at(base_fd: &OwnedFd, base: &Path) -> Pruned {
    let now = SystemTime::now();
    let mut out = Pruned::default();
    let names = match names_in(base_fd) {
        Ok(names) => names,
        Err(e) => {
            tracing::warn!(base = %base.display(), error = %e, "cannot list the tools bundles to prune them");
            return out;
        }
    };
    for name in names {
        let Some(text) = name.to_str() else { continue };
        let entry = classify(text);
        if entry == Entry::Other {
            continue;
        }
        // Only a real dir of ours (a symlink fails O_NOFOLLOW), held by nobody.
        let Ok(fd) = openat(base_fd, name.as_os_str(), dir_flags(), Mode::empty()) else { continue };
        let Ok(st) = fstat(&fd) else { continue };
        let old_enough = now.duration_since(mtime_of(&st)).unwrap_or_default() >= DEBRIS_AGE;
        // A fresh temporary dir is a preparer's at work: not even locked, so it never waits.
        if st.st_uid != geteuid().as_raw() || (entry == Entry::Debris && !old_enough) {
            continue;
        }
        let lock = match Flock::lock(fd, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err(_) => {
                if entry == Entry::Bundle {
                    out.in_use.push(text.to_owned());
                }
                continue;
            }
        };
        if !same_entry(base_fd, &name, &lock) {
            continue;
        }
        let why = match entry {
            Entry::Debris => Some("leftover"),
            _ => bundle_verdict(&lock, text, &st, now, base),
        };
        let Some(why) = why else { continue };
        match remove_locked(base_fd, &name, &lock, entry == Entry::Bundle) {
            Ok(freed) => {
                tracing::debug!(dir = %base.join(&name).display(), why, freed, "pruned a tools bundle");
                out.freed_bytes += freed;
                out.removed.push((text.to_owned(), why));
            }
            Err(e) => tracing::warn!(dir = %base.join(&name).display(), error = %e, "cannot prune a tools bundle"),
        }
    }
    prune_digests(base_fd, now, &mut out);
    out
}

/// Why the bundle `name`, open and exclusively locked as `dir`, goes (`None`: it stays).
fn bundle_verdict(dir: &OwnedFd, name: &str, st: &FileStat, now: SystemTime, base: &Path) -> Option<&'static str> {
    let manifest = read_manifest(dir).filter(|m| is_digest(&m.exe_sha256) && name[7..] == m.exe_sha256[..16]);
    let last_use = lstat_at(dir, MARKER).map_or_else(|_| mtime_of(st), |m| mtime_of(&m));
    let idle = now.duration_since(last_use).unwrap_or_default();
    let exes = match &manifest {
        Some(m) if idle <= UNUSED_FOR => read_records(dir).iter().map(|p| exe_state(p, &m.exe_sha256, base)).collect(),
        _ => Vec::new(),
    };
    verdict(manifest.is_some(), idle, &exes)
}

/// Removes the remembered digests unused for [`UNUSED_FOR`] (and stray temporary files).
fn prune_digests(base_fd: &OwnedFd, now: SystemTime, out: &mut Pruned) {
    let Ok(dir) = openat(base_fd, DIGESTS, dir_flags(), Mode::empty()) else { return };
    if fstat(&dir).map_or(true, |st| st.st_uid != geteuid().as_raw()) {
        return;
    }
    for name in names_in(&dir).unwrap_or_default() {
        let Ok(st) = lstat_at(&dir, name.as_os_str()) else { continue };
        let limit = if name.as_bytes().starts_with(b".") { DEBRIS_AGE } else { UNUSED_FOR };
        if kind_is(&st, nix::libc::S_IFREG)
            && now.duration_since(mtime_of(&st)).unwrap_or_default() > limit
            && unlinkat(&dir, name.as_os_str(), UnlinkatFlags::NoRemoveDir).is_ok()
        {
            out.digests_removed += 1;
        }
    }
}

/// What a look at a bundle's place found.
enum Found {
    Bundle(ToolsBundle),
    Absent,
    /// It changed under us (moved aside, replaced, discarded): look again.
    Again,
}

impl ToolsBundle {
    /// Prepares (or reuses) the bundle of `exe` under `base`, records `exe`'s absolute
    /// path and the use in it, then prunes `base` (see the module's doc). The bundle stays
    /// in place for as long as the returned value (or a clone) lives.
    pub fn prepare(exe: &Path, base: &Path) -> Result<ToolsBundle, ToolsError> {
        let exe_name = exe
            .file_name()
            .ok_or(ToolsError::BadName { path: exe.to_owned(), why: "no file name" })?
            .to_str()
            .ok_or(ToolsError::BadName { path: exe.to_owned(), why: "not UTF-8" })?
            .to_owned();
        if [LIB_DIR, MANIFEST, MARKER, EXES].contains(&exe_name.as_str()) {
            return Err(ToolsError::BadName { path: exe.to_owned(), why: "reserved inside a bundle" });
        }
        let read_err = |source| ToolsError::ReadExe { path: exe.to_owned(), source };
        let exe_path = std::path::absolute(exe).map_err(read_err)?;
        // One descriptor for the digest and the copy: a rebuild meanwhile cannot mix them.
        let file = open_exe(exe).map_err(read_err)?;
        let digest = digest_of(&file, exe, base)?;
        let base_fd = open_base(base)?;
        let name = format!("bundle-{}", &digest[..16]);
        let mut bundle = None;
        for _ in 0..MAX_TRIES {
            match Self::reuse(&base_fd, base, &name, &digest)? {
                Found::Bundle(b) => bundle = Some(b),
                Found::Again => continue,
                Found::Absent => bundle = Self::build_in_place(&base_fd, base, &name, &file, exe, &exe_name, &digest)?,
            }
            if bundle.is_some() {
                break;
            }
        }
        let bundle = bundle.ok_or_else(|| io_err("settle", &base.join(&name))(io::Error::other("it kept changing")))?;
        // Bookkeeping failures only make the bundle go by its age.
        if let Err(e) = touch(&bundle.hold.0).and_then(|()| record_exe(&bundle.hold.0, &exe_path)) {
            tracing::debug!(dir = %bundle.dir.display(), error = %e, "cannot record the use of a tools bundle");
        }
        let pruned = prune_at(&base_fd, base);
        if !pruned.removed.is_empty() {
            tracing::info!(removed = ?pruned.removed, freed_bytes = pruned.freed_bytes, "pruned tools bundles");
        }
        Ok(bundle)
    }

    /// Prepares (or reuses) the bundle of `exe` under [`default_base`].
    pub fn prepare_default(exe: &Path) -> Result<ToolsBundle, ToolsError> {
        Self::prepare(exe, &default_base())
    }

    /// Takes (shared) the bundle `name` of `base`, when it is there and intact; a damaged
    /// one is moved aside (removed now if nobody holds it, else by a later prune).
    fn reuse(base_fd: &OwnedFd, base: &Path, name: &str, digest: &str) -> Result<Found, ToolsError> {
        let dir = base.join(name);
        let fd = match openat(base_fd, name, dir_flags(), Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(Found::Absent),
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                // Not a dir (a symlink, a file) in our private base: unlinked, not followed.
                tracing::warn!(dir = %dir.display(), "removing a non-directory in place of a tools bundle");
                match unlinkat(base_fd, name, UnlinkatFlags::NoRemoveDir) {
                    Ok(()) | Err(Errno::ENOENT) => return Ok(Found::Again),
                    Err(e) => return Err(io_err("remove", &dir)(e.into())),
                }
            }
            Err(e) => return Err(io_err("open", &dir)(e.into())),
        };
        // Blocks only while a pruner or a discarder holds it, which never waits on anything.
        let lock = Flock::lock(fd, FlockArg::LockShared).map_err(|(_, e)| io_err("lock", &dir)(e.into()))?;
        if !same_entry(base_fd, OsStr::new(name), &lock) {
            return Ok(Found::Again);
        }
        let st = fstat(&*lock).map_err(|e| io_err("inspect", &dir)(e.into()))?;
        if st.st_uid != geteuid().as_raw() {
            return Err(ToolsError::Untrusted { path: dir, why: "a bundle not owned by this user" });
        }
        let manifest = read_manifest(&lock).filter(|m| {
            m.exe_sha256 == digest
                && m.sizes.iter().all(|(rel, size)| {
                    lstat_at(&lock, rel.as_str())
                        .is_ok_and(|st| kind_is(&st, nix::libc::S_IFREG) && u64::try_from(st.st_size) == Ok(*size))
                })
        });
        let Some(manifest) = manifest else {
            tracing::warn!(dir = %dir.display(), "discarding a damaged tools bundle");
            // Moved aside even if others hold it: their reads are wrong anyway, and their
            // path then names the rebuilt bundle.
            let trash = format!(".trash-{name}-{:08x}", rand::random::<u32>());
            match renameat(base_fd, name, base_fd, trash.as_str()) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(io_err("move aside", &dir)(e.into())),
            }
            if lock.relock(FlockArg::LockExclusiveNonblock).is_ok() {
                let _ = remove_locked(base_fd, OsStr::new(&trash), &lock, false);
            }
            return Ok(Found::Again);
        };
        Ok(Found::Bundle(ToolsBundle { dir, manifest, hold: Arc::new(Hold(lock)) }))
    }

    /// Builds the bundle in a temporary dir (held exclusively, so no pruner takes it for
    /// a crash's leftover) and renames it into place; `None` when another process placed
    /// it first.
    fn build_in_place(
        base_fd: &OwnedFd,
        base: &Path,
        name: &str,
        file: &fs::File,
        exe: &Path,
        exe_name: &str,
        digest: &str,
    ) -> Result<Option<ToolsBundle>, ToolsError> {
        let linkage = run_ldd(exe)?;
        let tmp_name = format!(".tmp-bundle-{}-{}-{:08x}", &digest[..16], std::process::id(), rand::random::<u32>());
        let tmp = base.join(&tmp_name);
        mkdirat(base_fd, tmp_name.as_str(), Mode::from_bits_truncate(DIR_MODE))
            .map_err(|e| io_err("create", &tmp)(e.into()))?;
        let fd = openat(base_fd, tmp_name.as_str(), dir_flags(), Mode::empty())
            .map_err(|e| io_err("open", &tmp)(e.into()))?;
        // Blocks only while a pruner looks at it (it never waits on anything).
        let lock = Flock::lock(fd, FlockArg::LockExclusive).map_err(|(_, e)| io_err("lock", &tmp)(e.into()))?;
        let drop_tmp = |lock: &Flock<OwnedFd>| {
            let _ = remove_locked(base_fd, OsStr::new(&tmp_name), lock, false);
        };
        let manifest = match Self::build(&tmp, file, exe, exe_name, digest, &linkage) {
            Ok(m) => m,
            Err(e) => {
                drop_tmp(&lock);
                return Err(e);
            }
        };
        let dir = base.join(name);
        match renameat(base_fd, tmp_name.as_str(), base_fd, name) {
            Ok(()) => {
                // Shared from now on, like any user's. The conversion is not atomic, which
                // is harmless: a bundle just built and used is never prunable.
                let _ = lock.relock(FlockArg::LockShared);
                Ok(Some(ToolsBundle { dir, manifest, hold: Arc::new(Hold(lock)) }))
            }
            // Another process won the race (a non-empty target): use its bundle.
            Err(Errno::ENOTEMPTY | Errno::EEXIST) => {
                drop_tmp(&lock);
                Ok(None)
            }
            Err(e) => {
                drop_tmp(&lock);
                Err(io_err("rename into", &dir)(e.into()))
            }
        }
    }

    fn build(
        tmp: &Path,
        file: &fs::File,
        exe: &Path,
        exe_name: &str,
        digest: &str,
        linkage: &Linkage,
    ) -> Result<Manifest, ToolsError> {
        let mut sizes = BTreeMap::new();
        // The executable from the descriptor its digest was read from, unchanged since.
        let read_err = |source| ToolsError::ReadExe { path: exe.to_owned(), source };
        let before = identity(&file.metadata().map_err(read_err)?);
        let to = tmp.join(exe_name);
        let size = (|| {
            let mut from = file;
            from.rewind()?;
            let mut out = fs::OpenOptions::new().write(true).create_new(true).open(&to)?;
            io::copy(&mut from, &mut out)
        })()
        .map_err(io_err("copy", exe))?;
        if identity(&file.metadata().map_err(read_err)?) != before {
            return Err(read_err(io::Error::other("it changed while it was bundled")));
        }
        fs::set_permissions(&to, fs::Permissions::from_mode(EXEC_MODE)).map_err(io_err("set mode of", &to))?;
        sizes.insert(exe_name.to_owned(), size);
        let mut copy = |from: &Path, rel: String, mode: u32| -> Result<(), ToolsError> {
            let to = tmp.join(&rel);
            // fs::copy follows a host symlink, so the bundle holds real files.
            let size = fs::copy(from, &to).map_err(io_err("copy", from))?;
            fs::set_permissions(&to, fs::Permissions::from_mode(mode)).map_err(io_err("set mode of", &to))?;
            sizes.insert(rel, size);
            Ok(())
        };
        let (loader, libs) = match linkage {
            Linkage::Static => (None, Vec::new()),
            Linkage::Dynamic { loader, libs } => {
                let lib = tmp.join(LIB_DIR);
                fs::DirBuilder::new().mode(DIR_MODE).create(&lib).map_err(io_err("create", &lib))?;
                let loader_name = loader
                    .file_name()
                    .and_then(|n| n.to_str())
                    .ok_or_else(|| ToolsError::Ldd {
                        path: exe.to_owned(),
                        message: format!("unusable loader path {}", loader.display()),
                    })?
                    .to_owned();
                copy(loader, format!("{LIB_DIR}/{loader_name}"), EXEC_MODE)?;
                for (name, path) in libs {
                    if name.contains('/') {
                        return Err(ToolsError::Ldd {
                            path: exe.to_owned(),
                            message: format!("unusable soname {name:?}"),
                        });
                    }
                    copy(path, format!("{LIB_DIR}/{name}"), DATA_MODE)?;
                }
                (Some(loader_name), libs.keys().cloned().collect())
            }
        };
        // DirBuilder's mode is narrowed by the umask; a non-root container user must read in.
        for d in [tmp.to_owned(), tmp.join(LIB_DIR)] {
            if d.exists() {
                fs::set_permissions(&d, fs::Permissions::from_mode(DIR_MODE)).map_err(io_err("set mode of", &d))?;
            }
        }
        let manifest = Manifest { exe: exe_name.to_owned(), exe_sha256: digest.to_owned(), loader, libs, sizes };
        let path = tmp.join(MANIFEST);
        let mut out = fs::File::create(&path).map_err(io_err("create", &path))?;
        out.write_all(&serde_json::to_vec(&manifest).expect("a manifest always serialises"))
            .map_err(io_err("write", &path))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(DATA_MODE)).map_err(io_err("set mode of", &path))?;
        let marker = tmp.join(MARKER);
        fs::File::create(&marker).map_err(io_err("create", &marker))?;
        Ok(manifest)
    }

    /// The bundle's dir on the host (it stays in place while this value lives).
    pub fn host_dir(&self) -> &Path {
        &self.dir
    }

    /// The executable's file name inside the bundle.
    pub fn exe_name(&self) -> &str {
        &self.manifest.exe
    }

    /// The executable's sha256 (64 lowercase hex digits).
    pub fn exe_sha256(&self) -> &str {
        &self.manifest.exe_sha256
    }

    /// True when the executable needs the bundled loader.
    pub fn is_dynamic(&self) -> bool {
        self.manifest.loader.is_some()
    }

    /// The sonames of the bundled libraries (without the loader).
    pub fn libs(&self) -> &[String] {
        &self.manifest.libs
    }

    /// The bundled loader's file name, when dynamic.
    pub fn loader(&self) -> Option<&str> {
        self.manifest.loader.as_deref()
    }

    /// The argv prefix that execs the executable from a bundle mounted at `mount`.
    pub fn argv(&self, mount: &str) -> Vec<String> {
        let mount = mount.trim_end_matches('/');
        let exe = format!("{mount}/{}", self.manifest.exe);
        match &self.manifest.loader {
            None => vec![exe],
            Some(loader) => vec![
                format!("{mount}/{LIB_DIR}/{loader}"),
                "--library-path".to_owned(),
                format!("{mount}/{LIB_DIR}"),
                exe,
            ],
        }
    }

    /// The bundle's files (relative path, mode), dirs before their contents.
    fn entries(&self) -> Vec<(String, Option<u32>)> {
        let mut entries = vec![(self.manifest.exe.clone(), Some(EXEC_MODE))];
        if let Some(loader) = &self.manifest.loader {
            entries.push((LIB_DIR.to_owned(), None));
            entries.push((format!("{LIB_DIR}/{loader}"), Some(EXEC_MODE)));
            for lib in &self.manifest.libs {
                entries.push((format!("{LIB_DIR}/{lib}"), Some(DATA_MODE)));
            }
        }
        entries
    }

    /// Appends the bundle under `prefix` (e.g. `"app"`, or `""` for the root) to a tar,
    /// owned by 0:0 with the bundle's modes, so the result does not depend on the host.
    pub fn append_to_tar<W: Write>(&self, tar: &mut tar::Builder<W>, prefix: &str) -> Result<(), ToolsError> {
        let prefix = prefix.trim_matches('/');
        let at = |rel: &str| {
            if prefix.is_empty() { rel.to_owned() } else { format!("{prefix}/{rel}") }
        };
        let tar_err = |source| ToolsError::Io { op: "write tar of", path: self.dir.clone(), source };
        if !prefix.is_empty() {
            append_dir(tar, &format!("{prefix}/")).map_err(tar_err)?;
        }
        for (rel, mode) in self.entries() {
            match mode {
                None => append_dir(tar, &format!("{}/", at(&rel))).map_err(tar_err)?,
                Some(mode) => {
                    let path = self.dir.join(&rel);
                    // Through the held dir: the bundle this value took, whatever its path names now.
                    let file = open_at(&self.hold.0, &rel).map_err(|e| io_err("open", &path)(e.into()))?;
                    let len = file.metadata().map_err(io_err("inspect", &path))?.len();
                    let mut header = root_header(tar::EntryType::Regular, len, mode);
                    tar.append_data(&mut header, at(&rel), file).map_err(tar_err)?;
                }
            }
        }
        Ok(())
    }

    /// The bundle as an in-memory tar (paths relative to the mount point), for engines
    /// that share no filesystem with stevedore: upload it through the archive API.
    pub fn to_tar(&self) -> Result<Vec<u8>, ToolsError> {
        let mut tar = tar::Builder::new(Vec::new());
        self.append_to_tar(&mut tar, "")?;
        tar.into_inner().map_err(|source| ToolsError::Io { op: "finish tar of", path: self.dir.clone(), source })
    }
}

/// A header owned by root with a zero mtime, so that the same files make the same tar.
fn root_header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header
}

/// Appends a 0755 root-owned dir entry (`path` ends with `/`).
pub(crate) fn append_dir<W: Write>(tar: &mut tar::Builder<W>, path: &str) -> io::Result<()> {
    tar.append_data(&mut root_header(tar::EntryType::Directory, 0, DIR_MODE), path, io::empty())
}

/// Appends a root-owned regular file held in memory.
pub(crate) fn append_bytes<W: Write>(tar: &mut tar::Builder<W>, path: &str, mode: u32, data: &[u8]) -> io::Result<()> {
    tar.append_data(&mut root_header(tar::EntryType::Regular, data.len() as u64, mode), path, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_remembered_by_file_identity() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("base");
        let exe = t.path().join("prog");
        fs::write(&exe, b"version one").unwrap();
        let first = exe_digest(&exe, &base).unwrap();
        assert_eq!(first, sha256_file(&exe).unwrap());
        assert_eq!(fs::read_dir(base.join(DIGESTS)).unwrap().count(), 1, "remembered");
        assert_eq!(exe_digest(&exe, &base).unwrap(), first);
        // A replaced file has another identity, so its digest is computed afresh.
        let new = t.path().join("prog.new");
        fs::write(&new, b"version two!").unwrap();
        fs::rename(&new, &exe).unwrap();
        let second = exe_digest(&exe, &base).unwrap();
        assert_eq!(second, sha256_file(&exe).unwrap());
        assert_ne!(first, second);
    }

    fn tar_entries(bytes: &[u8]) -> Vec<(String, u32, u64, u64)> {
        let mut archive = tar::Archive::new(bytes);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                    h.gid().unwrap(),
                )
            })
            .collect()
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn dynamic_bundle_holds_loader_and_libs() {
        let base = tempfile::tempdir().unwrap();
        let base = base.path().join("tools");
        let exe = std::env::current_exe().unwrap();
        let bundle = ToolsBundle::prepare(&exe, &base).unwrap();
        assert!(bundle.is_dynamic());
        let loader = bundle.loader().unwrap();
        assert!(loader.starts_with("ld-linux"), "{loader}");
        assert!(bundle.libs().iter().any(|l| l.starts_with("libc.so")));
        let dir = bundle.host_dir();
        assert!(dir.file_name().unwrap().to_str().unwrap().starts_with("bundle-"));
        assert_eq!(mode(&base), 0o700, "a private dir of this user");
        assert_eq!(mode(dir), 0o755);
        assert_eq!(mode(&dir.join("lib")), 0o755);
        assert_eq!(mode(&dir.join(bundle.exe_name())), 0o755);
        assert_eq!(mode(&dir.join("lib").join(loader)), 0o755);
        for lib in bundle.libs() {
            let p = dir.join("lib").join(lib);
            assert!(!fs::symlink_metadata(&p).unwrap().is_symlink(), "{lib}");
            assert_eq!(mode(&p), 0o644, "{lib}");
        }
        // Exactly what ldd listed, nothing else.
        let mut on_disk: Vec<String> =
            fs::read_dir(dir.join("lib")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        on_disk.sort();
        let mut expected: Vec<String> = bundle.libs().to_vec();
        expected.push(loader.to_owned());
        expected.sort();
        assert_eq!(on_disk, expected);

        let name = bundle.exe_name();
        assert_eq!(
            bundle.argv("/.stevedore/tools/"),
            vec![
                format!("/.stevedore/tools/lib/{loader}"),
                "--library-path".to_owned(),
                "/.stevedore/tools/lib".to_owned(),
                format!("/.stevedore/tools/{name}"),
            ]
        );

        let entries = tar_entries(&bundle.to_tar().unwrap());
        assert!(entries.iter().all(|(_, _, uid, gid)| *uid == 0 && *gid == 0));
        assert!(entries.contains(&(name.to_owned(), 0o755, 0, 0)));
        assert!(entries.contains(&(format!("lib/{loader}"), 0o755, 0, 0)));
        assert!(entries.contains(&("lib/".to_owned(), 0o755, 0, 0)));
        assert_eq!(entries.len(), 2 + 1 + bundle.libs().len());
    }

    #[test]
    fn static_bundle_holds_only_the_exe_and_is_reused() {
        let busybox = Path::new("/bin/busybox");
        if !busybox.exists() {
            eprintln!("SKIP: /bin/busybox missing (install busybox-static)");
            return;
        }
        let base = tempfile::tempdir().unwrap();
        let first = ToolsBundle::prepare(busybox, base.path()).unwrap();
        assert!(!first.is_dynamic());
        let names: Vec<_> = fs::read_dir(first.host_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.starts_with('.'))
            .collect();
        assert_eq!(names, vec!["busybox".to_owned()], "and only hidden bookkeeping besides");
        assert_eq!(first.argv("/t"), vec!["/t/busybox".to_owned()]);
        let entries = tar_entries(&first.to_tar().unwrap());
        assert_eq!(entries, vec![("busybox".to_owned(), 0o755, 0, 0)]);

        let marker = first.host_dir().join("busybox");
        let before = fs::metadata(&marker).unwrap().ino();
        let second = ToolsBundle::prepare(busybox, base.path()).unwrap();
        assert_eq!(first, second);
        assert_eq!(fs::metadata(&marker).unwrap().ino(), before, "rebuilt, not reused");
        // No temp dirs left behind.
        let left: Vec<_> =
            fs::read_dir(base.path()).unwrap().map(|e| e.unwrap().file_name()).filter(|n| n != DIGESTS).collect();
        assert_eq!(left.len(), 1, "only the bundle, no temporary dir: {left:?}");
    }

    #[test]
    fn damaged_bundle_is_rebuilt() {
        let base = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        let first = ToolsBundle::prepare(&exe, base.path()).unwrap();
        let lib = first.host_dir().join("lib").join(&first.libs()[0]);
        fs::write(&lib, b"truncated").unwrap();
        // `first` still holds the damaged one: it is moved aside all the same.
        let second = ToolsBundle::prepare(&exe, base.path()).unwrap();
        assert_eq!(first, second);
        assert_ne!(fs::metadata(&lib).unwrap().len(), 9);
        let aside = |base: &Path| {
            fs::read_dir(base)
                .unwrap()
                .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with(".trash-"))
                .count()
        };
        assert_eq!(aside(base.path()), 1, "kept aside while held");
        drop(first);
        // Its holder gone, the next prune takes what was moved aside (once 10 minutes old).
        let trash = fs::read_dir(base.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(".trash-"))
            .unwrap();
        set_mtime(&trash, SystemTime::now() - DEBRIS_AGE - Duration::from_secs(1));
        let pruned = prune(base.path()).unwrap();
        assert_eq!(pruned.removed.len(), 1, "{pruned:?}");
        assert_eq!(aside(base.path()), 0);
        assert!(second.to_tar().is_ok());
    }

    fn set_mtime(path: &Path, when: SystemTime) {
        let since = when.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        let t = TimeSpec::new(since.as_secs() as _, since.subsec_nanos() as _);
        utimensat(nix::fcntl::AT_FDCWD, path, &t, &t, UtimensatFlags::NoFollowSymlink).unwrap();
    }

    fn bundles_in(base: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(base)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n != DIGESTS)
            .collect();
        names.sort();
        names
    }

    /// A copy of /bin/busybox (static: no ldd libraries to copy) with `tail` appended.
    fn busybox_variant(path: &Path, tail: &[u8]) -> Option<String> {
        let mut bytes = fs::read("/bin/busybox").ok()?;
        bytes.extend_from_slice(tail);
        let tmp = path.with_extension("new");
        fs::write(&tmp, bytes).unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
        fs::rename(&tmp, path).unwrap();
        Some(sha256_file(path).unwrap())
    }

    #[test]
    fn the_pruning_rule() {
        use ExeState::*;
        let fresh = Duration::from_secs(60);
        let old = UNUSED_FOR + Duration::from_secs(1);
        assert_eq!(verdict(true, fresh, &[Same]), None);
        assert_eq!(verdict(true, fresh, &[Other]), Some("superseded"));
        assert_eq!(verdict(true, fresh, &[Gone]), Some("superseded"));
        assert_eq!(verdict(true, fresh, &[Gone, Other]), Some("superseded"));
        assert_eq!(verdict(true, fresh, &[Gone, Same]), None, "one path still holds it");
        assert_eq!(verdict(true, fresh, &[Other, Unknown]), None, "what cannot be checked keeps it");
        assert_eq!(verdict(true, fresh, &[]), None, "no record: only its age counts");
        let day = UNRECORDED_UNUSED_FOR + Duration::from_secs(1);
        assert_eq!(verdict(true, day, &[]), Some("unused"), "no record: a day");
        assert_eq!(verdict(true, day, &[Same]), None, "in use: a week");
        assert_eq!(verdict(true, day, &[Unknown]), None);
        assert_eq!(verdict(true, old, &[]), Some("unused"));
        assert_eq!(verdict(true, old, &[Same]), Some("unused"));
        assert_eq!(verdict(false, fresh, &[Same]), Some("damaged"));
    }

    #[test]
    fn entries_of_the_base_are_told_apart() {
        assert_eq!(classify("bundle-0123456789abcdef"), Entry::Bundle);
        for other in ["bundle-0123456789ABCDEF", "bundle-0123", "digests", "bundle-", "notes", ".hidden", "locks"] {
            assert_eq!(classify(other), Entry::Other, "{other}");
        }
        for debris in
            [".tmp-bundle-0123456789abcdef-12-0a0b0c0d", ".trash-bundle-x-1", "bundle-0123456789abcdef.damaged-1"]
        {
            assert_eq!(classify(debris), Entry::Debris, "{debris}");
        }
    }

    #[test]
    fn a_bundle_unused_for_a_week_is_pruned_and_a_recent_one_kept() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("base");
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        let (Some(_), Some(_)) = (busybox_variant(&a, b"a"), busybox_variant(&b, b"b")) else {
            eprintln!("SKIP: /bin/busybox missing (install busybox-static)");
            return;
        };
        let first = ToolsBundle::prepare(&a, &base).unwrap();
        let dir = first.host_dir().to_owned();
        drop(first);
        // Its exe is still there, unchanged: only its age can make it go.
        set_mtime(&dir.join(MARKER), SystemTime::now() - UNUSED_FOR + Duration::from_secs(3600));
        let kept = ToolsBundle::prepare(&b, &base).unwrap();
        assert!(dir.exists(), "six days and 23 hours idle: kept");
        set_mtime(&dir.join(MARKER), SystemTime::now() - UNUSED_FOR - Duration::from_secs(1));
        // A bundle with an unreadable manifest goes at once.
        let damaged = base.join("bundle-00000000000000aa");
        fs::create_dir(&damaged).unwrap();
        fs::write(damaged.join(MANIFEST), b"{}").unwrap();
        let mut pruned = prune(&base).unwrap();
        assert!(!dir.exists(), "{pruned:?}");
        pruned.removed.sort();
        assert_eq!(
            pruned.removed,
            [
                ("bundle-00000000000000aa".to_owned(), "damaged"),
                (dir.file_name().unwrap().to_str().unwrap().to_owned(), "unused"),
            ]
        );
        assert_eq!(bundles_in(&base), [kept.host_dir().file_name().unwrap().to_str().unwrap()]);
    }

    #[test]
    fn a_bundle_of_an_older_stevedore_goes_after_a_day() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("base");
        let exe = t.path().join("prog");
        let Some(_) = busybox_variant(&exe, b"old") else {
            eprintln!("SKIP: /bin/busybox missing (install busybox-static)");
            return;
        };
        // What an older stevedore left: no record, no marker.
        let dir = ToolsBundle::prepare(&exe, &base).unwrap().host_dir().to_owned();
        fs::remove_dir_all(dir.join(EXES)).unwrap();
        fs::remove_file(dir.join(MARKER)).unwrap();
        set_mtime(&dir, SystemTime::now() - UNRECORDED_UNUSED_FOR + Duration::from_secs(60));
        assert!(prune(&base).unwrap().removed.is_empty(), "less than a day old");
        set_mtime(&dir, SystemTime::now() - UNRECORDED_UNUSED_FOR - Duration::from_secs(1));
        let pruned = prune(&base).unwrap();
        assert_eq!(pruned.removed, [(dir.file_name().unwrap().to_str().unwrap().to_owned(), "unused")]);
        // Reused meanwhile, it would have been adopted instead: recorded and marked.
        let adopted = ToolsBundle::prepare(&exe, &base).unwrap();
        fs::remove_dir_all(adopted.host_dir().join(EXES)).unwrap();
        fs::remove_file(adopted.host_dir().join(MARKER)).unwrap();
        drop(adopted);
        let again = ToolsBundle::prepare(&exe, &base).unwrap();
        assert!(again.host_dir().join(MARKER).exists());
        assert_eq!(fs::read_dir(again.host_dir().join(EXES)).unwrap().count(), 1);
    }

    #[test]
    fn remembered_digests_unused_for_a_week_are_pruned() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("base");
        let exe = t.path().join("prog");
        fs::write(&exe, b"one").unwrap();
        exe_digest(&exe, &base).unwrap();
        let first = base.join(DIGESTS).join(identity(&fs::metadata(&exe).unwrap()));
        fs::write(&exe, b"two!").unwrap();
        exe_digest(&exe, &base).unwrap();
        let second = base.join(DIGESTS).join(identity(&fs::metadata(&exe).unwrap()));
        assert!(first.exists() && second.exists());
        set_mtime(&first, SystemTime::now() - UNUSED_FOR - Duration::from_secs(1));
        let pruned = prune(&base).unwrap();
        assert_eq!(pruned.digests_removed, 1);
        assert!(!first.exists() && second.exists());
        // A hit touches the memo, so one in use does not age out.
        set_mtime(&second, SystemTime::now() - UNUSED_FOR + Duration::from_secs(60));
        exe_digest(&exe, &base).unwrap();
        let age = SystemTime::now().duration_since(fs::metadata(&second).unwrap().modified().unwrap()).unwrap();
        assert!(age < Duration::from_secs(60), "{age:?}");
    }

    #[test]
    fn leftovers_go_once_old_and_unheld_and_nothing_is_followed() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("base");
        fs::create_dir(&base).unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o700)).unwrap();
        let victim = t.path().join("victim");
        fs::create_dir(&victim).unwrap();
        fs::write(victim.join("keep"), b"k").unwrap();
        let old = SystemTime::now() - DEBRIS_AGE - Duration::from_secs(1);
        // A crash's temporary dir, with symlinks out of the base inside it.
        let crashed = base.join(".tmp-bundle-0123456789abcdef-1-00000001");
        fs::create_dir_all(crashed.join("lib")).unwrap();
        std::os::unix::fs::symlink(&victim, crashed.join("lib/dir")).unwrap();
        std::os::unix::fs::symlink(victim.join("keep"), crashed.join("file")).unwrap();
        fs::write(crashed.join("lib/x"), b"12345").unwrap();
        set_mtime(&crashed, old);
        // A preparer at work: old, but held.
        let busy = base.join(".tmp-bundle-0123456789abcdef-2-00000002");
        fs::create_dir(&busy).unwrap();
        set_mtime(&busy, old);
        let held = Flock::lock(fs::File::open(&busy).unwrap(), FlockArg::LockExclusive).unwrap();
        // Too recent to judge.
        let recent = base.join(".trash-bundle-0123456789abcdef-00000003");
        fs::create_dir(&recent).unwrap();
        // A symlink where a bundle would be, and one where a leftover would be: left alone.
        std::os::unix::fs::symlink(&victim, base.join("bundle-0123456789abcdef")).unwrap();
        std::os::unix::fs::symlink(&victim, base.join(".trash-x")).unwrap();
        let pruned = prune(&base).unwrap();
        assert_eq!(pruned.removed, [(".tmp-bundle-0123456789abcdef-1-00000001".to_owned(), "leftover")]);
        assert_eq!(pruned.freed_bytes, 5);
        assert!(!crashed.exists());
        assert!(busy.exists() && recent.exists());
        assert_eq!(fs::read(victim.join("keep")).unwrap(), b"k");
        assert!(base.join("bundle-0123456789abcdef").is_symlink());
        drop(held);
        assert_eq!(prune(&base).unwrap().removed.len(), 1, "no longer held");
        assert!(!busy.exists());
    }

    #[test]
    fn a_dir_of_another_user_inside_is_not_emptied() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP: needs root to chown");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("base");
        fs::create_dir(&base).unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o700)).unwrap();
        let crashed = base.join(".trash-bundle-0123456789abcdef-00000001");
        fs::create_dir_all(crashed.join("theirs")).unwrap();
        fs::write(crashed.join("theirs/f"), b"f").unwrap();
        nix::unistd::chown(&crashed.join("theirs"), Some(nix::unistd::Uid::from_raw(1000)), None).unwrap();
        set_mtime(&crashed, SystemTime::now() - DEBRIS_AGE - Duration::from_secs(1));
        let pruned = prune(&base).unwrap();
        assert!(pruned.removed.is_empty(), "{pruned:?}");
        assert!(crashed.join("theirs/f").exists());
    }

    #[test]
    fn parses_ldd_output() {
        let exe = Path::new("/x");
        let out = "\tlinux-vdso.so.1 (0x00007ffc)\n\
                   \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f60)\n\
                   \tld-linux-x86-64.so.2 => /lib64/ld-linux-x86-64.so.2 (0x00007f61)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f60c72d8000)\n";
        let Linkage::Dynamic { loader, libs } = parse_ldd(exe, true, out, "").unwrap() else { panic!("static") };
        assert_eq!(loader, PathBuf::from("/lib64/ld-linux-x86-64.so.2"));
        assert_eq!(libs.keys().collect::<Vec<_>>(), vec!["libgcc_s.so.1"]);
        assert_eq!(parse_ldd(exe, false, "", "\tnot a dynamic executable\n").unwrap(), Linkage::Static);
        assert_eq!(parse_ldd(exe, true, "\tstatically linked\n", "").unwrap(), Linkage::Static);
        assert!(matches!(
            parse_ldd(exe, true, "\tlibfoo.so.1 => not found\n", ""),
            Err(ToolsError::MissingLibrary { .. })
        ));
    }

    #[test]
    fn a_base_of_another_user_is_refused_and_an_open_one_of_ours_is_tightened() {
        let t = tempfile::tempdir().unwrap();
        let ours = t.path().join("ours");
        fs::create_dir(&ours).unwrap();
        fs::set_permissions(&ours, fs::Permissions::from_mode(0o777)).unwrap();
        ToolsBundle::prepare(Path::new("/bin/sh"), &ours).unwrap();
        assert_eq!(mode(&ours), 0o700);
        // A base in a shared dir (as a temp dir in /tmp is): the shared dir is left as it was.
        let shared = t.path().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
        ToolsBundle::prepare(Path::new("/bin/sh"), &shared.join("bundles")).unwrap();
        assert_eq!(fs::metadata(&shared).unwrap().mode() & 0o7777, 0o1777);
        if nix::unistd::geteuid().is_root() {
            let theirs = t.path().join("theirs");
            fs::create_dir(&theirs).unwrap();
            nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(1000)), None).unwrap();
            let err = ToolsBundle::prepare(Path::new("/bin/sh"), &theirs);
            assert!(matches!(err, Err(ToolsError::Untrusted { .. })), "{err:?}");
        }
    }
}
