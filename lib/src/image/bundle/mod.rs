//! The executable bundle: a host executable (the worker binary), plus its loader and
//! libraries when it is dynamic, laid out so that it runs in any image (even `FROM
//! scratch`) from the dir it is packed under (`pack::APP_DIR`).
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
//! is pruned on every [`ExeBundle::prepare`] (and by [`prune`]). Each bundle records the
//! absolute paths of the executables it was prepared from (`.exes/`, one file per path)
//! and its last use (the mtime of `.used`, touched on every prepare). A [`ExeBundle`]
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
//! minutes old, remembered digests once unused for [`UNUSED_FOR`]. Then the size cap: while
//! the bundles weigh more than [`cap_bytes`] ([`DEFAULT_CAP_BYTES`], or [`CAP_ENV`]), the
//! least recently used of those nobody holds go, oldest first (held ones count and stay). Removal holds the dir's
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

use super::tarball::{append_dir, root_header};

mod digest;
mod ldd;
mod place;
mod prune;

use digest::*;
pub use digest::{exe_digest, sha256_file};
pub use ldd::host_linkage;
use ldd::*;
use place::*;
pub use place::{DIR_ENV, default_base};
use prune::*;
pub use prune::{BundlesPruned, CAP_ENV, DEFAULT_CAP_BYTES, cap_bytes, prune, prune_to};

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
pub enum BundleError {
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
pub struct ExeBundle {
    dir: PathBuf,
    manifest: Manifest,
    hold: Arc<Hold>,
    added: Option<BundleAdded>,
}

/// A bundle [`ExeBundle::prepare`] made, the cache not having it: the cache grew.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BundleAdded {
    /// The new bundle's dir.
    pub dir: PathBuf,
    /// The bytes of its files.
    pub bytes: u64,
    /// The bytes of every bundle in its base now, this one included, after the pruning
    /// that follows each prepare.
    pub cache_bytes: u64,
    /// The size cap the base is pruned to ([`cap_bytes`]).
    pub cap_bytes: u64,
}

impl PartialEq for ExeBundle {
    fn eq(&self, other: &Self) -> bool {
        self.dir == other.dir && self.manifest == other.manifest
    }
}

impl Eq for ExeBundle {}

/// A bundle dir, open and locked (shared while in use; exclusive while built or removed).
#[derive(Debug)]
struct Hold(Flock<OwnedFd>);

/// What a look at a bundle's place found.
enum Found {
    Bundle(ExeBundle),
    Absent,
    /// It changed under us (moved aside, replaced, discarded): look again.
    Again,
}

impl ExeBundle {
    /// Prepares (or reuses) the bundle of `exe` under `base`, records `exe`'s absolute
    /// path and the use in it, then prunes `base` (see the module's doc). The bundle stays
    /// in place for as long as the returned value (or a clone) lives.
    pub fn prepare(exe: &Path, base: &Path) -> Result<ExeBundle, BundleError> {
        let exe_name = exe
            .file_name()
            .ok_or(BundleError::BadName { path: exe.to_owned(), why: "no file name" })?
            .to_str()
            .ok_or(BundleError::BadName { path: exe.to_owned(), why: "not UTF-8" })?
            .to_owned();
        if [LIB_DIR, MANIFEST, MARKER, EXES].contains(&exe_name.as_str()) {
            return Err(BundleError::BadName { path: exe.to_owned(), why: "reserved inside a bundle" });
        }
        let read_err = |source| BundleError::ReadExe { path: exe.to_owned(), source };
        let exe_path = std::path::absolute(exe).map_err(read_err)?;
        // One descriptor for the digest and the copy: a rebuild meanwhile cannot mix them.
        let file = open_exe(exe).map_err(read_err)?;
        let digest = digest_of(&file, exe, base)?;
        let base_fd = open_base(base)?;
        let name = format!("bundle-{}", &digest[..16]);
        let mut bundle = None;
        let mut built = false;
        for _ in 0..MAX_TRIES {
            match Self::reuse(&base_fd, base, &name, &digest)? {
                Found::Bundle(b) => bundle = Some(b),
                Found::Again => continue,
                Found::Absent => {
                    bundle = Self::build_in_place(&base_fd, base, &name, &file, exe, &exe_name, &digest)?;
                    built = bundle.is_some();
                }
            }
            if bundle.is_some() {
                break;
            }
        }
        let mut bundle =
            bundle.ok_or_else(|| io_err("settle", &base.join(&name))(io::Error::other("it kept changing")))?;
        // Bookkeeping failures only make the bundle go by its age.
        if let Err(e) = touch(&bundle.hold.0).and_then(|()| record_exe(&bundle.hold.0, &exe_path)) {
            tracing::debug!(dir = %bundle.dir.display(), error = %e, "cannot record the use of a tools bundle");
        }
        let cap = cap_bytes();
        let pruned = prune_capped(&base_fd, base, cap);
        if !pruned.removed.is_empty() {
            tracing::info!(removed = ?pruned.removed, freed_bytes = pruned.freed_bytes, "pruned tools bundles");
        }
        if built {
            bundle.added = Some(BundleAdded {
                dir: bundle.dir.clone(),
                bytes: bytes_of(&bundle.hold.0),
                cache_bytes: pruned.bytes_kept,
                cap_bytes: cap,
            });
        }
        Ok(bundle)
    }

    /// Prepares (or reuses) the bundle of `exe` under [`default_base`].
    pub fn prepare_default(exe: &Path) -> Result<ExeBundle, BundleError> {
        Self::prepare(exe, &default_base())
    }

    /// Takes (shared) the bundle `name` of `base`, when it is there and intact; a damaged
    /// one is moved aside (removed now if nobody holds it, else by a later prune).
    fn reuse(base_fd: &OwnedFd, base: &Path, name: &str, digest: &str) -> Result<Found, BundleError> {
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
            return Err(BundleError::Untrusted { path: dir, why: "a bundle not owned by this user" });
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
        Ok(Found::Bundle(ExeBundle { dir, manifest, hold: Arc::new(Hold(lock)), added: None }))
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
    ) -> Result<Option<ExeBundle>, BundleError> {
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
                Ok(Some(ExeBundle { dir, manifest, hold: Arc::new(Hold(lock)), added: None }))
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
    ) -> Result<Manifest, BundleError> {
        let mut sizes = BTreeMap::new();
        // The executable from the descriptor its digest was read from, unchanged since.
        let read_err = |source| BundleError::ReadExe { path: exe.to_owned(), source };
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
        let mut copy = |from: &Path, rel: String, mode: u32| -> Result<(), BundleError> {
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
                    .ok_or_else(|| BundleError::Ldd {
                        path: exe.to_owned(),
                        message: format!("unusable loader path {}", loader.display()),
                    })?
                    .to_owned();
                copy(loader, format!("{LIB_DIR}/{loader_name}"), EXEC_MODE)?;
                for (name, path) in libs {
                    if name.contains('/') {
                        return Err(BundleError::Ldd {
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

    /// Whether this prepare made the bundle (the cache grew by it), and what the cache
    /// holds now; `None` for a bundle that was there.
    pub fn added(&self) -> Option<&BundleAdded> {
        self.added.as_ref()
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
    pub fn append_to_tar<W: Write>(&self, tar: &mut tar::Builder<W>, prefix: &str) -> Result<(), BundleError> {
        let prefix = prefix.trim_matches('/');
        let at = |rel: &str| {
            if prefix.is_empty() { rel.to_owned() } else { format!("{prefix}/{rel}") }
        };
        let tar_err = |source| BundleError::Io { op: "write tar of", path: self.dir.clone(), source };
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
    pub fn to_tar(&self) -> Result<Vec<u8>, BundleError> {
        let mut tar = tar::Builder::new(Vec::new());
        self.append_to_tar(&mut tar, "")?;
        tar.into_inner().map_err(|source| BundleError::Io { op: "finish tar of", path: self.dir.clone(), source })
    }
}

#[cfg(test)]
mod tests;
