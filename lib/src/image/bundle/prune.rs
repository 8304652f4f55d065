//! Pruning the base: which bundles, leftovers and remembered digests go, and why
//! (`bundle`'s module doc says when).

use super::*;
use stevedore_init::tree;

/// What [`prune`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BundlesPruned {
    /// The dirs removed from the base (bundles, and a crash's leftovers), with why.
    pub removed: Vec<(String, &'static str)>,
    /// The bundles kept because a process holds them.
    pub in_use: Vec<String>,
    /// The bytes of the regular files removed.
    pub freed_bytes: u64,
    /// The remembered digests removed.
    pub digests_removed: usize,
    /// The bytes of the bundles left in the base (those in use included).
    pub bytes_kept: u64,
}

/// What a recorded executable path holds now, compared with a bundle's executable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ExeState {
    /// The same binary.
    Same,
    /// Another binary (a rebuild), or no regular file.
    Other,
    /// Nothing.
    Gone,
    /// Cannot tell (no permission, an I/O error): counts as the same.
    Unknown,
}

pub(super) fn exe_state(path: &Path, digest: &str, base: &Path) -> ExeState {
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
pub(super) fn verdict(manifest_ok: bool, idle: Duration, exes: &[ExeState]) -> Option<&'static str> {
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
pub(super) enum Entry {
    /// `bundle-<16 hex>`.
    Bundle,
    /// A temporary dir of a preparer, or a dir moved aside to be removed.
    Debris,
    /// The remembered digests, or anything else: not ours to judge.
    Other,
}

pub(super) fn classify(name: &str) -> Entry {
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
/// [`UNUSED_FOR`], and a crash's leftovers. [`ExeBundle::prepare`] does this each time.
pub fn prune(base: &Path) -> Result<BundlesPruned, BundleError> {
    let base_fd = open_base(base)?;
    Ok(prune_at(&base_fd, base))
}

/// [`prune`] under the size cap `cap` in bytes, whatever [`CAP_ENV`] says.
pub fn prune_to(base: &Path, cap: u64) -> Result<BundlesPruned, BundleError> {
    let base_fd = open_base(base)?;
    Ok(prune_capped(&base_fd, base, cap))
}

/// The environment variable that sets the bundles' size cap (`512m`, `2g`, bytes; `0`:
/// keep no bundle nobody holds).
pub const CAP_ENV: &str = "STEVEDORE_BUNDLE_CACHE_MAX";
/// The bundles' size cap unless [`CAP_ENV`] says otherwise: about five debug builds.
pub const DEFAULT_CAP_BYTES: u64 = 512 << 20;

/// The size cap in force: [`CAP_ENV`] when it parses, else [`DEFAULT_CAP_BYTES`] (a value
/// that does not parse is said once per prune, and the default holds).
pub fn cap_bytes() -> u64 {
    match std::env::var(CAP_ENV) {
        Ok(v) => stevedore_parse::limits::parse_size(v.trim()).unwrap_or_else(|e| {
            tracing::warn!(value = %v, error = %e, "{CAP_ENV} is not a size; the default cap holds");
            DEFAULT_CAP_BYTES
        }),
        Err(_) => DEFAULT_CAP_BYTES,
    }
}

/// A bundle the rules kept, nobody holding it: a candidate for the size cap.
struct Idle {
    name: OsString,
    last_use: SystemTime,
    bytes: u64,
}

pub(super) fn prune_at(base_fd: &OwnedFd, base: &Path) -> BundlesPruned {
    prune_capped(base_fd, base, cap_bytes())
}

/// [`prune_at`] under the size cap `cap`: when the bundles weigh more than `cap`, the least
/// recently used of those nobody holds go too, oldest first, until they fit (held ones
/// count, and stay).
pub(super) fn prune_capped(base_fd: &OwnedFd, base: &Path, cap: u64) -> BundlesPruned {
    let now = SystemTime::now();
    let mut out = BundlesPruned::default();
    let mut idle: Vec<Idle> = Vec::new();
    let mut held_bytes = 0u64;
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
            Err((fd, _)) => {
                if entry == Entry::Bundle {
                    held_bytes += bytes_of(&fd);
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
        let Some(why) = why else {
            let last_use = lstat_at(&lock, MARKER).map_or_else(|_| mtime_of(&st), |m| mtime_of(&m));
            idle.push(Idle { name: name.clone(), last_use, bytes: bytes_of(&lock) });
            continue;
        };
        match remove_locked(base_fd, &name, &lock, entry == Entry::Bundle) {
            Ok(freed) => {
                tracing::debug!(dir = %base.join(&name).display(), why, freed, "pruned a tools bundle");
                out.freed_bytes += freed;
                out.removed.push((text.to_owned(), why));
            }
            Err(e) => tracing::warn!(dir = %base.join(&name).display(), error = %e, "cannot prune a tools bundle"),
        }
    }
    evict_over_cap(base_fd, base, cap, held_bytes, idle, &mut out);
    prune_digests(base_fd, now, &mut out);
    out
}

/// Removes the least recently used of `idle` until the bundles fit under `cap`.
fn evict_over_cap(base_fd: &OwnedFd, base: &Path, cap: u64, held: u64, mut idle: Vec<Idle>, out: &mut BundlesPruned) {
    let mut total = held + idle.iter().map(|b| b.bytes).sum::<u64>();
    idle.sort_by_key(|b| b.last_use);
    for b in idle {
        if total <= cap {
            break;
        }
        // Looked at again under the lock: a preparer may have taken it since.
        let Ok(fd) = openat(base_fd, b.name.as_os_str(), dir_flags(), Mode::empty()) else { continue };
        let Ok(lock) = Flock::lock(fd, FlockArg::LockExclusiveNonblock) else { continue };
        match remove_locked(base_fd, &b.name, &lock, true) {
            Ok(freed) => {
                tracing::debug!(dir = %base.join(&b.name).display(), freed, cap, "pruned a tools bundle over the cap");
                total = total.saturating_sub(b.bytes);
                out.freed_bytes += freed;
                out.removed.push((b.name.to_string_lossy().into_owned(), "over the size cap"));
            }
            Err(e) => tracing::warn!(dir = %base.join(&b.name).display(), error = %e, "cannot prune a tools bundle"),
        }
    }
    out.bytes_kept = total;
}

/// The bytes of the regular files of the bundle open as `dir` (its top level and `lib/`).
pub(super) fn bytes_of(dir: &OwnedFd) -> u64 {
    let files = |fd: &OwnedFd| -> u64 {
        let Ok((all, _)) = tree::children(fd, usize::MAX, |_| true) else { return 0 };
        all.iter().filter(|c| c.kind == tree::Kind::File).filter_map(|c| c.stat.as_ref().map(|s| s.size)).sum()
    };
    let lib = openat(dir, LIB_DIR, dir_flags(), Mode::empty()).map_or(0, |l| files(&l));
    files(dir) + lib
}

/// Why the bundle `name`, open and exclusively locked as `dir`, goes (`None`: it stays).
pub(super) fn bundle_verdict(
    dir: &OwnedFd,
    name: &str,
    st: &FileStat,
    now: SystemTime,
    base: &Path,
) -> Option<&'static str> {
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
pub(super) fn prune_digests(base_fd: &OwnedFd, now: SystemTime, out: &mut BundlesPruned) {
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
