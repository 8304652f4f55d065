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
//! immutable once renamed into place, so concurrent workers share them safely.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The bundle's bookkeeping file; hidden so it cannot collide with an exe name in practice.
const MANIFEST: &str = ".bundle.json";
/// The library dir inside a bundle.
const LIB_DIR: &str = "lib";
/// Under the base: remembered digests of executables, by file identity.
const DIGESTS: &str = "digests";
const DIR_MODE: u32 = 0o755;
const EXEC_MODE: u32 = 0o755;
const DATA_MODE: u32 = 0o644;

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

/// A prepared tools bundle on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolsBundle {
    dir: PathBuf,
    manifest: Manifest,
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
    let read_err = |source| ToolsError::ReadExe { path: exe.to_owned(), source };
    let meta = fs::metadata(exe).map_err(read_err)?;
    let key = format!("{:x}-{:x}-{:x}-{:x}.{:x}", meta.dev(), meta.ino(), meta.len(), meta.mtime(), meta.mtime_nsec());
    ensure_base(base)?;
    let dir = base.join(DIGESTS);
    let memo = dir.join(&key);
    if let Ok(d) = fs::read_to_string(&memo)
        && d.len() == 64
        && d.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return Ok(d);
    }
    let digest = sha256_file(exe).map_err(read_err)?;
    // Remembering is an optimisation: a failure only costs the next start a re-read.
    let tmp = dir.join(format!(".{key}.{:08x}", rand::random::<u32>()));
    let remembered = fs::DirBuilder::new().mode(DIR_MODE).recursive(true).create(&dir).and_then(|()| {
        fs::write(&tmp, &digest)?;
        fs::rename(&tmp, &memo)
    });
    if remembered.is_err() {
        let _ = fs::remove_file(&tmp);
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
        if !parent.exists() {
            fs::create_dir_all(parent).map_err(io_err("create", parent))?;
        }
        crate::hostdir::PrivateDir::open(parent).map_err(|e| untrusted(parent, e))?;
    }
    crate::hostdir::PrivateDir::open(base).map_err(|e| untrusted(base, e))?;
    Ok(())
}

impl ToolsBundle {
    /// Prepares (or reuses) the bundle of `exe` under `base`.
    pub fn prepare(exe: &Path, base: &Path) -> Result<ToolsBundle, ToolsError> {
        let exe_name = exe
            .file_name()
            .ok_or(ToolsError::BadName { path: exe.to_owned(), why: "no file name" })?
            .to_str()
            .ok_or(ToolsError::BadName { path: exe.to_owned(), why: "not UTF-8" })?
            .to_owned();
        if exe_name == LIB_DIR || exe_name == MANIFEST {
            return Err(ToolsError::BadName { path: exe.to_owned(), why: "reserved inside a bundle" });
        }
        let digest = exe_digest(exe, base)?;
        let dir = base.join(format!("bundle-{}", &digest[..16]));
        if let Some(bundle) = Self::reuse(&dir, &digest)? {
            return Ok(bundle);
        }
        let linkage = run_ldd(exe)?;
        let tmp =
            base.join(format!(".tmp-bundle-{}-{}-{:08x}", &digest[..16], std::process::id(), rand::random::<u32>()));
        let result = Self::build(&tmp, exe, &exe_name, &digest, &linkage);
        let manifest = match result {
            Ok(m) => m,
            Err(e) => {
                let _ = fs::remove_dir_all(&tmp);
                return Err(e);
            }
        };
        match fs::rename(&tmp, &dir) {
            Ok(()) => Ok(ToolsBundle { dir, manifest }),
            Err(e) => {
                let _ = fs::remove_dir_all(&tmp);
                // Another process won the race (non-empty target): use its bundle.
                match Self::reuse(&dir, &digest)? {
                    Some(bundle) => Ok(bundle),
                    None => Err(io_err("rename into", &dir)(e)),
                }
            }
        }
    }

    /// Prepares (or reuses) the bundle of `exe` under [`default_base`].
    pub fn prepare_default(exe: &Path) -> Result<ToolsBundle, ToolsError> {
        Self::prepare(exe, &default_base())
    }

    /// Loads an existing bundle; a damaged one is moved aside so it gets rebuilt.
    fn reuse(dir: &Path, digest: &str) -> Result<Option<ToolsBundle>, ToolsError> {
        let raw = match fs::read(dir.join(MANIFEST)) {
            Ok(raw) => raw,
            Err(e) if e.kind() == io::ErrorKind::NotFound && !dir.exists() => return Ok(None),
            Err(_) => return Self::discard(dir),
        };
        let Ok(manifest) = serde_json::from_slice::<Manifest>(&raw) else {
            return Self::discard(dir);
        };
        let intact = manifest.exe_sha256 == digest
            && manifest
                .sizes
                .iter()
                .all(|(rel, size)| fs::metadata(dir.join(rel)).is_ok_and(|m| m.is_file() && m.len() == *size));
        if !intact {
            return Self::discard(dir);
        }
        Ok(Some(ToolsBundle { dir: dir.to_owned(), manifest }))
    }

    fn discard(dir: &Path) -> Result<Option<ToolsBundle>, ToolsError> {
        tracing::warn!(dir = %dir.display(), "discarding a damaged tools bundle");
        // Moved aside first so a concurrent preparer never sees a half-deleted bundle.
        let aside = dir.with_extension(format!("damaged-{:08x}", rand::random::<u32>()));
        fs::rename(dir, &aside).map_err(io_err("move aside", dir))?;
        let _ = fs::remove_dir_all(&aside);
        Ok(None)
    }

    fn build(tmp: &Path, exe: &Path, exe_name: &str, digest: &str, linkage: &Linkage) -> Result<Manifest, ToolsError> {
        fs::DirBuilder::new().mode(DIR_MODE).create(tmp).map_err(io_err("create", tmp))?;
        let mut sizes = BTreeMap::new();
        let mut copy = |from: &Path, rel: String, mode: u32| -> Result<(), ToolsError> {
            let to = tmp.join(&rel);
            // fs::copy follows a host symlink, so the bundle holds real files.
            let size = fs::copy(from, &to).map_err(io_err("copy", from))?;
            fs::set_permissions(&to, fs::Permissions::from_mode(mode)).map_err(io_err("set mode of", &to))?;
            sizes.insert(rel, size);
            Ok(())
        };
        copy(exe, exe_name.to_owned(), EXEC_MODE)?;
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
        let mut file = fs::File::create(&path).map_err(io_err("create", &path))?;
        file.write_all(&serde_json::to_vec(&manifest).expect("a manifest always serialises"))
            .map_err(io_err("write", &path))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(DATA_MODE)).map_err(io_err("set mode of", &path))?;
        Ok(manifest)
    }

    /// The host dir to bind-mount read-only at [`crate::protocol::TOOLS_DIR`].
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
                    let file = fs::File::open(&path).map_err(io_err("open", &path))?;
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
            .filter(|n| n != MANIFEST)
            .collect();
        assert_eq!(names, vec!["busybox".to_owned()]);
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
        let second = ToolsBundle::prepare(&exe, base.path()).unwrap();
        assert_eq!(first, second);
        assert_ne!(fs::metadata(&lib).unwrap().len(), 9);
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
        if nix::unistd::geteuid().is_root() {
            let theirs = t.path().join("theirs");
            fs::create_dir(&theirs).unwrap();
            nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(1000)), None).unwrap();
            let err = ToolsBundle::prepare(Path::new("/bin/sh"), &theirs);
            assert!(matches!(err, Err(ToolsError::Untrusted { .. })), "{err:?}");
        }
    }
}
