//! The rung's image cache: `<dir>/<id hex>/` holds `rootfs` (unpacked by `image`), `bytes`
//! (what it holds) and `lock`, bounded by size and pruned oldest-used first.
//!
//! Every attempt holds a shared `flock` on its image's `lock` from before its runtime runs
//! until its teardown ended (a [`Held`]); the prune takes the exclusive lock without waiting,
//! so an image in use by any process (another worker sharing the base dir included) is never
//! removed, and renames the entry aside before removing it, so nobody finds half of one.
//! A use stamps the `lock` file's mtime: the prune's order. Two processes that unpack one
//! image at once both finish; the second rename finds the first's entry and uses it.

use super::image::{ImageError, io_err, remove_tree};
use crate::engine::Engine;
use nix::fcntl::{Flock, FlockArg};
use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Leftovers of an unpack older than this are a crashed process's.
const STALE_UNPACK: Duration = Duration::from_secs(3600);

/// An image's root filesystem, held against the prune for as long as this lives.
#[derive(Debug)]
pub(crate) struct Held {
    _lock: Flock<fs::File>,
}

/// What a prune removed and what it had to keep.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pruned {
    /// The image ids removed.
    pub removed: Vec<String>,
    /// The bytes they held.
    pub bytes_freed: u64,
    /// Image ids over the bound that an attempt holds (kept).
    pub in_use: Vec<String>,
    /// What the cache holds after the prune, in bytes.
    pub bytes: u64,
}

/// The rung's image cache.
#[derive(Debug)]
pub(crate) struct Cache {
    dir: PathBuf,
    /// The most the cache keeps (an image in use is kept regardless).
    pub max_bytes: u64,
    /// One lock per image id: a second attempt of an image being unpacked waits for it.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Cache {
    pub fn new(dir: PathBuf, max_bytes: u64) -> Self {
        Self { dir, max_bytes, locks: Mutex::default() }
    }

    /// The root filesystem of the image `id` (`sha256:…`), unpacked from the engine's export
    /// unless it is there already, and held until the [`Held`] is dropped.
    pub async fn rootfs(
        &self,
        engine: &Engine,
        id: &str,
        labels: HashMap<String, String>,
    ) -> Result<(PathBuf, Held), ImageError> {
        let hexid = hex_of(id).ok_or_else(|| ImageError::Unsafe { entry: id.to_owned(), why: "is not an image id" })?;
        let at = self.dir.join(hexid);
        let lock = self
            .locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(hexid.to_owned())
            .or_default()
            .clone();
        let _unpacking = lock.lock().await;
        // Twice at most: a prune of another process may take the entry between the look and the hold.
        for _ in 0..2 {
            if let Some(held) = hold(&at)? {
                return Ok((at.join("rootfs"), held));
            }
            let tmp = self.dir.join(format!(".tmp-{hexid}-{}", crate::util::random_hex(4)));
            fs::DirBuilder::new().mode(0o700).create(&tmp).map_err(io_err("create", &tmp))?;
            let made = super::image::unpack_export(engine, id, &tmp.join("rootfs"), labels.clone()).await;
            let placed = made.and_then(|unpacked| {
                tracing::debug!(image = id, ?unpacked, "image unpacked");
                fs::write(tmp.join("bytes"), unpacked.bytes.to_string()).map_err(io_err("write", &tmp))?;
                fs::write(tmp.join("lock"), b"").map_err(io_err("write", &tmp))?;
                match fs::rename(&tmp, &at) {
                    Ok(()) => Ok(()),
                    // Another process placed it first: its entry is as good.
                    Err(e) if at.join("lock").is_file() => {
                        tracing::debug!(image = id, error = %e, "placed by another process");
                        remove_tree(&tmp);
                        Ok(())
                    }
                    Err(e) => Err(io_err("rename", &at)(e)),
                }
            });
            if let Err(e) = placed {
                remove_tree(&tmp);
                return Err(e);
            }
            if let Some(held) = hold(&at)? {
                let (dir, max) = (self.dir.clone(), self.max_bytes);
                let keep = hexid.to_owned();
                let pruned = tokio::task::spawn_blocking(move || prune(&dir, max, Some(&keep))).await;
                if let Ok(Ok(p)) = pruned
                    && !p.removed.is_empty()
                {
                    tracing::info!(removed = ?p.removed, freed = p.bytes_freed, "image cache pruned to its bound");
                }
                return Ok((at.join("rootfs"), held));
            }
        }
        Err(ImageError::Io {
            op: "hold",
            path: at,
            source: io::Error::other("removed twice by another process's prune while being used"),
        })
    }

    /// A hold on the image `id` when it is in the cache (a recovered attempt's image).
    pub fn held(&self, id: &str) -> Option<Held> {
        hold(&self.dir.join(hex_of(id)?)).ok().flatten()
    }

    /// Prunes the cache down to `max_bytes` (oldest-used first; held images kept).
    pub async fn prune(&self, max_bytes: u64) -> Result<Pruned, ImageError> {
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || prune(&dir, max_bytes, None)).await.map_err(|e| ImageError::Io {
            op: "prune",
            path: PathBuf::new(),
            source: io::Error::other(e.to_string()),
        })?
    }
}

/// The hex of an image id (`sha256:<hex>` or `<hex>`): an entry's name; `None` for anything else.
fn hex_of(id: &str) -> Option<&str> {
    let hexid = id.strip_prefix("sha256:").unwrap_or(id);
    (!hexid.is_empty() && hexid.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hexid)
}

/// A shared hold on the entry at `at` with its use stamped, or `None` when there is no
/// complete entry there (or a prune is taking it away this instant).
fn hold(at: &Path) -> Result<Option<Held>, ImageError> {
    adopt(at)?;
    let file = match fs::OpenOptions::new().read(true).write(true).open(at.join("lock")) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("open", at)(e)),
    };
    let Some(file) = locked(file, false).map_err(io_err("lock", at))? else { return Ok(None) };
    // Held: a prune can no longer take it; it may have taken it just before.
    if !at.join("rootfs").is_dir() {
        return Ok(None);
    }
    let _ = file.set_modified(SystemTime::now());
    Ok(Some(Held { _lock: file }))
}

/// An entry an earlier stevedore placed (a `rootfs` alone) gets its `bytes` and `lock`.
fn adopt(at: &Path) -> Result<(), ImageError> {
    let rootfs = at.join("rootfs");
    if at.join("lock").exists() || !fs::symlink_metadata(&rootfs).is_ok_and(|m| m.is_dir()) {
        return Ok(());
    }
    // Made before the mount points had their modes: given them now.
    super::image::mount_point_modes(&rootfs)?;
    fs::write(at.join("bytes"), tree_bytes(&rootfs).to_string()).map_err(io_err("write", at))?;
    // `create`, not `create_new`: another process may adopt it at the same time.
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(at.join("lock"))
        .map_err(io_err("create", at))?;
    Ok(())
}

/// The bytes of the regular files under `dir`, nothing followed.
fn tree_bytes(dir: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(dir) else { return 0 };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// `file` locked, shared or exclusive, never waiting (this runs on the attempt's path): `None`
/// when another holds it the other way (a prune taking the entry, or attempts holding it).
/// The lock goes with the returned value.
fn locked(file: fs::File, exclusive: bool) -> io::Result<Option<Flock<fs::File>>> {
    let arg = if exclusive { FlockArg::LockExclusiveNonblock } else { FlockArg::LockSharedNonblock };
    match Flock::lock(file, arg) {
        Ok(l) => Ok(Some(l)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(e.into()),
    }
}

/// One entry of the cache.
struct Entry {
    hexid: String,
    at: PathBuf,
    bytes: u64,
    used: SystemTime,
}

fn entries(dir: &Path) -> io::Result<(Vec<Entry>, Vec<PathBuf>)> {
    let (mut found, mut stale) = (Vec::new(), Vec::new());
    for e in fs::read_dir(dir)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let at = e.path();
        if name.starts_with(".old-") {
            stale.push(at);
            continue;
        }
        if name.starts_with(".tmp-") {
            let old =
                e.metadata().and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().unwrap_or_default() > STALE_UNPACK);
            if old {
                stale.push(at);
            }
            continue;
        }
        if !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let bytes = fs::read_to_string(at.join("bytes")).ok().and_then(|b| b.trim().parse().ok()).unwrap_or(0);
        let used = fs::metadata(at.join("lock")).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
        found.push(Entry { hexid: name, at, bytes, used });
    }
    found.sort_by_key(|e| e.used);
    Ok((found, stale))
}

/// Removes the oldest-used entries not held until the cache holds at most `max` bytes
/// (never `keep`), and what crashed unpacks and prunes left.
fn prune(dir: &Path, max: u64, keep: Option<&str>) -> Result<Pruned, ImageError> {
    let (found, stale) = entries(dir).map_err(io_err("list", dir))?;
    for s in stale {
        remove_tree(&s);
    }
    let mut total: u64 = found.iter().map(|e| e.bytes).sum();
    let mut report = Pruned::default();
    for e in found {
        if total <= max {
            break;
        }
        if Some(e.hexid.as_str()) == keep {
            continue;
        }
        let Ok(file) = fs::OpenOptions::new().read(true).write(true).open(e.at.join("lock")) else { continue };
        let Some(file) = locked(file, true).map_err(io_err("lock", &e.at))? else {
            report.in_use.push(format!("sha256:{}", e.hexid));
            continue;
        };
        let aside = dir.join(format!(".old-{}-{}", e.hexid, crate::util::random_hex(4)));
        fs::rename(&e.at, &aside).map_err(io_err("rename", &e.at))?;
        drop(file);
        remove_tree(&aside);
        total -= e.bytes;
        report.bytes_freed += e.bytes;
        report.removed.push(format!("sha256:{}", e.hexid));
    }
    report.bytes = total;
    Ok(report)
}

/// The default bound: 8 GiB, or a quarter of the filesystem that holds `dir` when smaller
/// (`/run` is a tmpfs on many hosts: memory).
pub(crate) fn default_max_bytes(dir: &Path) -> u64 {
    let quarter =
        nix::sys::statvfs::statvfs(dir).map(|s| s.blocks().saturating_mul(s.fragment_size()) / 4).unwrap_or(u64::MAX);
    quarter.min(8 << 30)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(dir: &Path, hexid: &str, bytes: u64, age_s: u64) {
        let at = dir.join(hexid);
        fs::create_dir_all(at.join("rootfs/bin")).unwrap();
        fs::write(at.join("bytes"), bytes.to_string()).unwrap();
        let lock = fs::File::create(at.join("lock")).unwrap();
        lock.set_modified(SystemTime::now() - Duration::from_secs(age_s)).unwrap();
    }

    #[test]
    fn the_oldest_used_go_first_and_a_held_image_is_kept() {
        let t = tempfile::tempdir().unwrap();
        entry(t.path(), "aa", 100, 300);
        entry(t.path(), "bb", 100, 200);
        entry(t.path(), "cc", 100, 100);
        let held = hold(&t.path().join("aa")).unwrap().expect("a complete entry");
        // Holding stamps the use: `aa` is now the newest, `bb` the oldest.
        let p = prune(t.path(), 150, None).unwrap();
        assert_eq!(p.removed, ["sha256:bb", "sha256:cc"]);
        assert_eq!((p.bytes_freed, p.bytes), (200, 100));
        let p = prune(t.path(), 0, None).unwrap();
        assert_eq!(p.in_use, ["sha256:aa"], "held: kept");
        assert!(t.path().join("aa/rootfs").is_dir());
        drop(held);
        let p = prune(t.path(), 0, None).unwrap();
        assert_eq!(p.removed, ["sha256:aa"]);
        assert_eq!(fs::read_dir(t.path()).unwrap().count(), 0, "nothing left aside");
    }

    #[test]
    fn an_entry_of_an_earlier_stevedore_is_adopted_with_its_size() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir_all(t.path().join("aa/rootfs/bin")).unwrap();
        fs::write(t.path().join("aa/rootfs/bin/x"), [0u8; 100]).unwrap();
        assert!(hold(&t.path().join("aa")).unwrap().is_some());
        assert_eq!(fs::read_to_string(t.path().join("aa/bytes")).unwrap(), "100");
    }

    #[test]
    fn the_image_just_placed_is_kept_and_a_removed_entry_is_not_held() {
        let t = tempfile::tempdir().unwrap();
        entry(t.path(), "aa", 100, 10);
        entry(t.path(), "bb", 100, 20);
        let p = prune(t.path(), 0, Some("bb")).unwrap();
        assert_eq!(p.removed, ["sha256:aa"]);
        assert!(hold(&t.path().join("aa")).unwrap().is_none());
        assert!(hold(&t.path().join("bb")).unwrap().is_some());
    }
}
