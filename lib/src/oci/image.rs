//! Each image's root filesystem, unpacked once per image id into the rung's private cache,
//! which attempts share read-only.
//!
//! Source: the local engine's export of a never-started container of the image (`docker
//! export`): one flattened tar, the layers already applied by the engine, so there are no
//! whiteouts or opaque dirs to interpret here, and the engine's own layer store is the one
//! truth of what the image holds. Chosen for the first slice because it needs nothing but the
//! engine the other rungs use already; `docker save`'s layers (or an OCI image layout, for a
//! worker without dockerd) would need the whiteout rules applied here, and come later.
//!
//! The tar is untrusted all the same: every entry is resolved beneath the new root, no `..`,
//! never through a symlink (each parent is checked to be a real directory of the tree being
//! made, which nobody else can reach: the cache is 0700); hard links only to regular files
//! already unpacked in the set; device nodes, FIFOs and sockets skipped and counted (images
//! built as root carry `/dev/null`); setuid, setgid and sticky bits on files never
//! reproduced (and the rootfs is mounted `nosuid` besides: see `spec`). The mount points the
//! sandbox needs are made as plain directories here, so the runtime never writes into the
//! shared root; an image where one of them is not a plain directory is refused. Where the
//! trees live, how long, and who may remove one: `cache`.

use crate::engine::Engine;
use futures_util::StreamExt;
use std::collections::HashMap;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use stevedore_init::wire::{IN_DIR, OUT_DIR, TMP_DIR, TOOLS_DIR};

/// Where the runtime mounts something in every attempt: each must be a plain directory of
/// the image (or absent, and made here).
pub(crate) const MOUNT_POINTS: &[&str] = &["/proc", "/dev", "/sys", IN_DIR, OUT_DIR, TMP_DIR, "/.stevedore", TOOLS_DIR];

/// Why an image's root filesystem cannot be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// a mount point of the sandbox is not a plain directory in the image
    #[error("{path} is not a plain directory in the image ({what}): the sandbox mounts there")]
    MountPoint {
        /// The path in the image.
        path: String,
        /// What it is.
        what: String,
    },
    /// an entry of the tar would land outside the root or through a symlink
    #[error("entry {entry:?} {why}")]
    Unsafe {
        /// The entry's path, as the tar gives it.
        entry: String,
        /// Why it is refused.
        why: &'static str,
    },
    /// the engine could not export the image's filesystem
    #[error("exporting the image's filesystem")]
    Export(#[source] crate::engine::EngineError),
    /// reading the tar or writing the tree failed
    #[error("{op} {path}")]
    Io {
        /// What was done.
        op: &'static str,
        /// Where.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

pub(crate) fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ImageError + use<> {
    let path = path.to_owned();
    move |source| ImageError::Io { op, path, source }
}

/// What an unpack wrote and skipped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unpacked {
    /// Bytes of the regular files written.
    pub bytes: u64,
    /// Character and block devices skipped.
    pub devices: u64,
    /// FIFOs and other entries that are not files, dirs or links, skipped.
    pub other: u64,
}

/// A never-started container of the image, exported into `root` and removed.
pub(crate) async fn unpack_export(
    engine: &Engine,
    id: &str,
    root: &Path,
    labels: HashMap<String, String>,
) -> Result<Unpacked, ImageError> {
    let name = format!("sd-oci-export-{}", crate::util::random_hex(6));
    let body = bollard::models::ContainerCreateBody {
        image: Some(id.to_owned()),
        entrypoint: Some(vec!["/.stevedore-export-never-started".into()]),
        network_disabled: Some(true),
        labels: Some(labels),
        host_config: Some(bollard::models::HostConfig {
            network_mode: Some("none".into()),
            log_config: Some(bollard::models::HostConfigLogConfig { typ: Some("none".into()), config: None }),
            ..Default::default()
        }),
        ..Default::default()
    };
    engine.api.create_container(&name, body).await.map_err(ImageError::Export)?;
    let stream = engine.api.export(&name);
    let unpacked = unpack_stream(stream, root.to_owned()).await;
    if let Err(e) = engine.api.remove_container(&name).await {
        tracing::warn!(container = name, error = %e, "removing the export's container");
    }
    unpacked
}

/// Unpacks a byte stream (a tar) into `root` on a thread of its own, then makes the mount
/// points; the stream's error, if it breaks, is the reader's.
async fn unpack_stream(mut stream: crate::engine::ByteStream, root: PathBuf) -> Result<Unpacked, ImageError> {
    let (tx, reader) = crate::pipe::reader(8);
    let unpack = tokio::task::spawn_blocking(move || {
        let skipped = unpack(reader, &root)?;
        mount_points(&root)?;
        Ok::<_, ImageError>(skipped)
    });
    while let Some(chunk) = stream.next().await {
        if tx.send(chunk).await.is_err() {
            break;
        }
    }
    drop(tx);
    unpack.await.map_err(|e| ImageError::Io {
        op: "unpack",
        path: PathBuf::new(),
        source: io::Error::other(e.to_string()),
    })?
}

/// The normal components of an entry's path; `None` when it climbs (`..`) or is the root.
fn relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// Checks that every parent of `rel` under `root` is a real directory (never a symlink):
/// nothing is written through a link the tar made.
fn parents_are_dirs(root: &Path, rel: &Path) -> bool {
    let mut at = root.to_path_buf();
    let Some(parent) = rel.parent() else { return true };
    for c in parent.components() {
        at.push(c);
        match fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_dir() => {}
            _ => return false,
        }
    }
    true
}

/// Unpacks the tar `from` into `root` (which must not exist): see the module's rules.
pub(crate) fn unpack(from: impl Read, root: &Path) -> Result<Unpacked, ImageError> {
    use tar::EntryType;
    fs::DirBuilder::new().mode(0o755).create(root).map_err(io_err("create", root))?;
    let mut archive = tar::Archive::new(from);
    let mut skipped = Unpacked::default();
    let mut dirs: Vec<(PathBuf, u32)> = Vec::new();
    for entry in archive.entries().map_err(io_err("read", root))? {
        let mut entry = entry.map_err(io_err("read", root))?;
        let raw = entry.path().map_err(io_err("read", root))?.into_owned();
        let refuse = |why| ImageError::Unsafe { entry: raw.display().to_string(), why };
        let kind = entry.header().entry_type();
        match kind {
            EntryType::Char | EntryType::Block => {
                skipped.devices += 1;
                continue;
            }
            EntryType::Directory
            | EntryType::Regular
            | EntryType::Continuous
            | EntryType::Symlink
            | EntryType::Link => {}
            _ => {
                skipped.other += 1;
                continue;
            }
        }
        let Some(rel) = relative(&raw) else {
            if kind == EntryType::Directory && !raw.components().any(|c| c == Component::ParentDir) {
                continue;
            }
            return Err(refuse("climbs out of the root"));
        };
        if !parents_are_dirs(root, &rel) {
            return Err(refuse("lies beneath a symlink or a file"));
        }
        let path = root.join(&rel);
        let mode = entry.header().mode().map_err(io_err("read", &path))?;
        let (uid, gid) = (entry.header().uid().unwrap_or(0), entry.header().gid().unwrap_or(0));
        let owner =
            |p: &Path| std::os::unix::fs::lchown(p, Some(uid as u32), Some(gid as u32)).map_err(io_err("chown", p));
        match kind {
            EntryType::Directory => {
                match fs::symlink_metadata(&path) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => return Err(refuse("is a directory over something else")),
                    Err(_) => fs::DirBuilder::new().mode(0o700).create(&path).map_err(io_err("create", &path))?,
                }
                owner(&path)?;
                // Set last: a read-only dir still takes its entries first.
                dirs.push((path, mode & 0o1777));
            }
            EntryType::Regular | EntryType::Continuous => {
                replace(&path)?;
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(nix::libc::O_NOFOLLOW)
                    .open(&path)
                    .map_err(io_err("create", &path))?;
                skipped.bytes += io::copy(&mut entry, &mut f).map_err(io_err("write", &path))?;
                owner(&path)?;
                // No setuid, setgid or sticky bit is reproduced (chown cleared none yet: set after it).
                f.set_permissions(fs::Permissions::from_mode(mode & 0o777)).map_err(io_err("chmod", &path))?;
            }
            EntryType::Symlink => {
                let target =
                    entry.link_name().map_err(io_err("read", &path))?.ok_or_else(|| refuse("has no target"))?;
                replace(&path)?;
                // A link's target is the image's business: the runtime resolves paths within the root.
                std::os::unix::fs::symlink(&target, &path).map_err(io_err("symlink", &path))?;
                owner(&path)?;
            }
            EntryType::Link => {
                let target =
                    entry.link_name().map_err(io_err("read", &path))?.ok_or_else(|| refuse("has no target"))?;
                let Some(trel) = relative(&target) else { return Err(refuse("links to outside the root")) };
                let tpath = root.join(&trel);
                if !parents_are_dirs(root, &trel) || !fs::symlink_metadata(&tpath).is_ok_and(|m| m.is_file()) {
                    return Err(refuse("links to what is not a regular file of the set"));
                }
                replace(&path)?;
                fs::hard_link(&tpath, &path).map_err(io_err("link", &path))?;
            }
            _ => {}
        }
    }
    for (dir, mode) in dirs.into_iter().rev() {
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", &dir))?;
    }
    Ok(skipped)
}

/// A later entry of a flattened tar replaces an earlier one of the same path (never a dir).
fn replace(path: &Path) -> Result<(), ImageError> {
    match fs::symlink_metadata(path) {
        Err(_) => Ok(()),
        Ok(m) if m.is_dir() => {
            Err(ImageError::Unsafe { entry: path.display().to_string(), why: "would replace a directory" })
        }
        Ok(_) => fs::remove_file(path).map_err(io_err("remove", path)),
    }
}

/// The modes the sandbox's tmpfs mount points must have: runc gives a tmpfs it mounts over an
/// existing directory that directory's mode (its `mode=` option is overridden), so `/tmp`
/// must be 1777 (the command writes there: its `HOME`) and `/out` 0700 whatever the image says.
const MOUNT_MODES: &[(&str, u32)] = &[(TMP_DIR, 0o1777), (OUT_DIR, 0o700)];

/// Gives the tmpfs mount points their modes ([`MOUNT_MODES`]); the tree is the cache's own.
pub(crate) fn mount_point_modes(root: &Path) -> Result<(), ImageError> {
    for (p, mode) in MOUNT_MODES {
        let at = root.join(p.trim_start_matches('/'));
        if fs::symlink_metadata(&at).is_ok_and(|m| m.is_dir()) {
            fs::set_permissions(&at, fs::Permissions::from_mode(*mode)).map_err(io_err("chmod", &at))?;
        }
    }
    Ok(())
}

/// Makes each of [`MOUNT_POINTS`] a plain directory, refusing an image where one is
/// something else (a symlink could move a mount anywhere in the root); then their modes.
pub(crate) fn mount_points(root: &Path) -> Result<(), ImageError> {
    for p in MOUNT_POINTS {
        let rel = Path::new(p.trim_start_matches('/'));
        let mut at = root.to_path_buf();
        for c in rel.components() {
            at.push(c);
            match fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_dir() => {}
                Ok(m) => {
                    let what = if m.file_type().is_symlink() {
                        format!(
                            "a symlink to {}",
                            fs::read_link(&at).map(|t| t.display().to_string()).unwrap_or_default()
                        )
                    } else {
                        "not a directory".to_owned()
                    };
                    let path = format!("/{}", at.strip_prefix(root).unwrap_or(&at).display());
                    return Err(ImageError::MountPoint { path, what });
                }
                Err(_) => {
                    fs::DirBuilder::new().mode(0o755).create(&at).map_err(io_err("create", &at))?;
                    fs::set_permissions(&at, fs::Permissions::from_mode(0o755)).map_err(io_err("chmod", &at))?;
                }
            }
        }
    }
    mount_point_modes(root)
}

/// Removes a tree the rung made (best effort: a failed unpack's).
pub(crate) fn remove_tree(dir: &Path) {
    if let Err(e) = fs::remove_dir_all(dir)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), error = %e, "removing a partly unpacked image");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn header(kind: tar::EntryType, mode: u32) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_size(0);
        h
    }

    fn tar_with(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]) {
        let mut h = header(tar::EntryType::Regular, mode);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, data).unwrap();
    }

    fn link(b: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, target: &str) {
        let mut h = header(kind, 0o777);
        b.append_link(&mut h, path, target).unwrap();
    }

    /// Raw names the tar crate's builder refuses (`..`), written into the header itself.
    fn raw(b: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str) {
        let mut h = header(kind, 0o644);
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_cksum();
        b.append(&h, io::empty()).unwrap();
    }

    #[test]
    fn a_plain_image_unpacks_with_its_mount_points_and_without_setuid_or_devices() {
        let t = tempfile::tempdir().unwrap();
        let tar = tar_with(|b| {
            b.append_dir("bin", t.path()).unwrap();
            file(b, "bin/su", 0o4755, b"#!");
            link(b, tar::EntryType::Link, "bin/su2", "bin/su");
            link(b, tar::EntryType::Symlink, "bin/sh", "/bin/su");
            let mut dev = header(tar::EntryType::Char, 0o666);
            b.append_data(&mut dev, "dev/null", io::empty()).unwrap();
        });
        let root = t.path().join("root");
        let skipped = unpack(&tar[..], &root).unwrap();
        mount_points(&root).unwrap();
        assert_eq!(skipped.devices, 1);
        assert_eq!(fs::metadata(root.join("bin/su")).unwrap().mode() & 0o7777, 0o755, "setuid never reproduced");
        assert_eq!(fs::metadata(root.join("bin/su2")).unwrap().ino(), fs::metadata(root.join("bin/su")).unwrap().ino());
        assert_eq!(fs::read_link(root.join("bin/sh")).unwrap(), Path::new("/bin/su"));
        assert!(!root.join("dev/null").exists());
        for p in MOUNT_POINTS {
            assert!(fs::symlink_metadata(root.join(&p[1..])).unwrap().is_dir(), "{p}");
        }
        // runc gives its tmpfs the mount point's mode: the command's /tmp must be writable.
        assert_eq!(fs::metadata(root.join("tmp")).unwrap().mode() & 0o7777, 0o1777);
        assert_eq!(fs::metadata(root.join("out")).unwrap().mode() & 0o7777, 0o700);
    }

    #[test]
    fn entries_that_climb_or_go_through_a_symlink_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        fs::create_dir(&outside).unwrap();
        let cases: Vec<Vec<u8>> = vec![
            tar_with(|b| raw(b, tar::EntryType::Regular, "../escape")),
            tar_with(|b| raw(b, tar::EntryType::Regular, "a/../../escape")),
            tar_with(|b| {
                link(b, tar::EntryType::Symlink, "up", outside.to_str().unwrap());
                file(b, "up/escape", 0o644, b"x");
            }),
            tar_with(|b| {
                link(b, tar::EntryType::Symlink, "up", "..");
                file(b, "up/escape", 0o644, b"x");
            }),
            tar_with(|b| link(b, tar::EntryType::Link, "hard", "/etc/passwd")),
            tar_with(|b| {
                link(b, tar::EntryType::Symlink, "s", "/etc/passwd");
                link(b, tar::EntryType::Link, "hard", "s");
            }),
        ];
        for (n, tar) in cases.iter().enumerate() {
            let root = t.path().join(format!("root{n}"));
            let r = unpack(&tar[..], &root);
            assert!(matches!(r, Err(ImageError::Unsafe { .. })), "case {n}: {r:?}");
        }
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0, "nothing written outside");
        assert!(!t.path().join("escape").exists());
    }

    #[test]
    fn a_mount_point_that_is_a_symlink_or_a_file_is_refused() {
        let t = tempfile::tempdir().unwrap();
        for (n, tar) in [
            tar_with(|b| link(b, tar::EntryType::Symlink, "out", "/etc")),
            tar_with(|b| file(b, "tmp", 0o644, b"")),
            tar_with(|b| link(b, tar::EntryType::Symlink, ".stevedore", "/")),
        ]
        .iter()
        .enumerate()
        {
            let root = t.path().join(format!("r{n}"));
            unpack(&tar[..], &root).unwrap();
            let r = mount_points(&root);
            assert!(matches!(r, Err(ImageError::MountPoint { .. })), "case {n}: {r:?}");
        }
    }
}
