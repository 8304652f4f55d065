//! stevedore's init in the engine: a volume of kind `tools` of this rung's own, filled
//! through the archive API (so it works on any engine, remote ones included), mounted
//! read-only at `/.stevedore/tools` by its attempts and parked containers, and removed by
//! `close()`.
//!
//! One per rung, not one shared by every worker: a shared one outlives every process that
//! used it, and removing it safely would need to know that no other process is about to
//! mount it (an engine creates a missing named volume, empty, on mount). A rung fills its
//! own in four engine calls, about what checking a shared one cost. What a crash leaves is
//! labelled with its incarnation: `reclaim` removes the tools volumes (and fill helpers) of
//! the incarnations whose attempts it reclaims, and `prune` those of other incarnations that
//! no container uses and that are older than [`STALE_AFTER`]. `prune` cannot tell an idle
//! live rung from a crashed one, so a rung checks [`is_ours`] before it trusts its volume
//! again, and its mounts (`spec::tools_mount`) make a taken volume come back empty, never
//! filled from the image.

use super::labels;
use super::site::{ContainerSite, Slot, ToolsVolume};
use super::spec;
use crate::contract::LaunchError;
use crate::engine::{ByteStream, Engine, EngineError};
use crate::sandbox::init_binary;
use bollard::models::{ContainerCreateBody, VolumeCreateRequest};
use bytes::Bytes;
use std::sync::Arc;
use stevedore_init::wire::{INIT_NAME, TOOLS_DIR};

/// The label with the tools volume's creation time (unix seconds): `prune`'s age.
pub const TOOLS_CREATED: &str = "dev.stevedore.tools.created";

/// A tools volume of another incarnation older than this, that no container uses, is taken
/// for a crash's leftover by `prune`.
pub const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);

/// One name per CPU architecture: engines say `uname -m` (`x86_64`) or Go's `GOARCH` (`amd64`).
fn normal_arch(arch: &str) -> &str {
    match arch {
        "amd64" | "x86-64" => "x86_64",
        "arm64" => "aarch64",
        other => other,
    }
}

fn short(digest: &str) -> &str {
    &digest[..16.min(digest.len())]
}

/// The init as a tar: `stevedore-init`, root-owned, 0755.
fn init_tar(bytes: &[u8]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(bytes.len() as u64);
    h.set_mode(0o755);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    tar.append_data(&mut h, INIT_NAME, bytes).expect("writing to memory");
    tar.into_inner().expect("writing to memory")
}

/// A never-started helper container mounting `volume` at [`TOOLS_DIR`], for the archive API;
/// labelled with `incarnation` like the volume, so what a failed removal leaves goes with it.
fn helper(image: &str, volume: &str, digest: &str, incarnation: &str) -> ContainerCreateBody {
    let mut l = labels::tools(digest, "helper");
    l.insert(labels::INCARNATION.into(), incarnation.to_owned());
    spec::never_started(image, "helper", l, Some(spec::volume_mount(volume, TOOLS_DIR, false)))
}

fn stream_of(bytes: Vec<u8>) -> ByteStream {
    Box::pin(futures_util::stream::once(async move { Ok(Bytes::from(bytes)) }))
}

/// Puts this process's init into a new volume of its own, labelled with `incarnation`.
/// `image` is any local image (the attempt's): it only backs a never-started helper.
pub async fn create(engine: &Engine, image: &str, incarnation: &str) -> Result<ToolsVolume, LaunchError> {
    let Some(bytes) = init_binary::bytes() else {
        return Err(LaunchError::InitUnavailable {
            client: format!("{} (no init embedded)", init_binary::TARGET),
            engine: format!("{}/{}", engine.facts().os_type, engine.facts().architecture),
        });
    };
    let facts = engine.facts();
    if (!facts.os_type.is_empty() && facts.os_type != "linux")
        || (!facts.architecture.is_empty() && normal_arch(&facts.architecture) != normal_arch(init_binary::arch()))
    {
        return Err(LaunchError::InitUnavailable {
            client: init_binary::TARGET.to_owned(),
            engine: format!("{}/{}", facts.os_type, facts.architecture),
        });
    }
    let digest = init_binary::sha256().to_owned();
    let volume = format!("stevedore-tools-{}-{:08x}", short(&digest), rand::random::<u32>());
    let mut l = labels::tools(&digest, "init");
    l.insert(labels::INCARNATION.into(), incarnation.to_owned());
    l.insert(TOOLS_CREATED.into(), (crate::contract::unix_ms_now() / 1000).to_string());
    let api = &engine.api;
    api.create_volume(VolumeCreateRequest {
        name: Some(volume.clone()),
        driver: Some("local".into()),
        labels: Some(l),
        ..Default::default()
    })
    .await?;
    if let Err(e) = fill(engine, image, &volume, &digest, incarnation, bytes).await {
        let _ = api.remove_volume(&volume).await;
        return Err(e);
    }
    Ok(ToolsVolume { volume, digest, bind: None })
}

/// The init in a host directory for an engine on this machine's unix socket to bind-mount
/// read-only (`ToolsVolume::bind`): no engine call, where a volume of the rung's own costs a
/// helper, an upload through the engine's untar and a removal (60-70 ms per process here).
/// `Err(None)` where the engine may not see this machine's files as they are: reached over
/// anything but a unix socket, on a host of another name (a socket mounted into a CI job's
/// container: the same path on the engine's host could be another user's), labelling files
/// (SELinux would keep the container from reading them), or an init for another system. The directory is this user's
/// (`hostdir::PrivateDir::readable_copy`), and so is every directory above it
/// (`hostdir::check_chain`: the engine binds by path, later, so whoever could move one of
/// them could have their own binary run as PID 1); `Err(Some(why))` when it is not. An engine
/// that still cannot bind it (its daemon in a VM behind a local socket) refuses the create,
/// and the rung then uses volumes.
pub fn host_copy(engine: &Engine) -> Result<ToolsVolume, Option<String>> {
    let facts = engine.facts();
    let bytes = init_binary::bytes().ok_or(None)?;
    let same_system = facts.os_type == "linux" && normal_arch(&facts.architecture) == normal_arch(init_binary::arch());
    let selinux = facts.security_options.iter().any(|o| o.contains("selinux"));
    let here = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let same_host = !facts.host_name.is_empty() && facts.host_name == here.trim();
    if engine.endpoint().transport != crate::engine::endpoint::Transport::Unix || selinux || !same_system || !same_host
    {
        return Err(None);
    }
    let digest = init_binary::sha256();
    let copied = crate::hostdir::open_default_base()
        .and_then(|base| base.subdir("tools"))
        .and_then(|tools| {
            let dir = tools.readable_copy(short(digest), INIT_NAME, bytes)?;
            // Other versions' copies written longer ago than a tools volume is kept.
            let stale = crate::contract::unix_ms_now() / 1000 - STALE_AFTER.as_secs();
            tools.prune_readable_copies(short(digest), INIT_NAME, i64::try_from(stale).unwrap_or(0));
            Ok(dir)
        })
        .and_then(|dir| checked_bind(&dir));
    match copied {
        Ok(dir) => {
            Ok(ToolsVolume { volume: String::new(), digest: digest.to_owned(), bind: Some(dir.display().to_string()) })
        }
        Err(e) => {
            let why = crate::util::error_chain(&e);
            tracing::warn!(error = %why, "the init cannot be bound from a host directory: a tools volume instead");
            Err(Some(why))
        }
    }
}

/// `dir` resolved, once every directory from `/` down to it is this user's or root's and
/// writable by no one else (`hostdir::check_chain`), and the init in it a regular file of this
/// user's that no one else can write: what a bind of it will mount. Checked again before
/// each container that binds it (a rung lives long; one check at its start would not hold).
pub(crate) fn checked_bind(dir: &std::path::Path) -> Result<std::path::PathBuf, crate::hostdir::HostDirError> {
    use crate::hostdir::HostDirError;
    let real = crate::hostdir::check_chain(dir)?;
    let init = real.join(INIT_NAME);
    let st = nix::sys::stat::lstat(&init).map_err(|e| HostDirError::Io {
        op: "inspect",
        path: init.clone(),
        source: e.into(),
    })?;
    let me = nix::unistd::geteuid().as_raw();
    if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFREG || st.st_uid != me || st.st_mode & 0o022 != 0 {
        return Err(HostDirError::Untrusted {
            path: init,
            why: format!("not a regular file of this user's that only they can write (mode {:o})", st.st_mode),
        });
    }
    Ok(real)
}

/// Whether the engine refused to create a container because it cannot bind `tools`' host
/// directory (its daemon does not see this machine's files).
pub fn bind_refused(tools: &ToolsVolume, err: &LaunchError) -> bool {
    let Some(dir) = &tools.bind else { return false };
    let said = crate::util::error_chain(err);
    said.contains("bind source path does not exist") || (said.contains(dir.as_str()) && said.contains("no such file"))
}

/// Whether `volume` is still the one [`create`] made for `incarnation` (a rung checks before it
/// mounts it again after a while or after a failed launch: another process's `prune` may have
/// taken it, and a mount then made an empty one of that name, which lacks [`TOOLS_CREATED`]).
pub async fn is_ours(engine: &Engine, volume: &str, incarnation: &str) -> Result<bool, EngineError> {
    Ok(engine.api.inspect_volume(volume).await?.is_some_and(|v| {
        v.labels.get(labels::INCARNATION).map(String::as_str) == Some(incarnation)
            && v.labels.contains_key(TOOLS_CREATED)
    }))
}

/// Removes the tools objects labelled with an incarnation that `which` picks: fill helpers a
/// failed removal left, then volumes; a volume a container still mounts is left (the engine
/// refuses). Returns the volumes removed.
async fn remove_where(engine: &Engine, which: impl Fn(&str) -> bool) -> Result<Vec<String>, EngineError> {
    let api = &engine.api;
    let picked = |l: &std::collections::HashMap<String, String>| l.get(labels::INCARNATION).is_some_and(|i| which(i));
    for c in api.list_containers(labels::tools_filter()).await? {
        if picked(&c.labels) {
            api.remove_container(&c.id).await?;
        }
    }
    let mut removed = Vec::new();
    for v in api.list_volumes(labels::tools_filter()).await? {
        if picked(&v.labels) {
            match api.remove_volume(&v.name).await {
                Ok(()) => removed.push(v.name),
                Err(e) if e.is_conflict() || e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(removed)
}

/// Removes the tools objects of `incarnations` (never `own`'s): what crashed processes left.
pub async fn remove_of(engine: &Engine, incarnations: &[&str], own: &str) -> Result<Vec<String>, EngineError> {
    remove_where(engine, |i| i != own && incarnations.contains(&i)).await
}

/// Removes the volumes named `made` (a rung's, at `close`: the one it made and any a mount
/// made again under that name) and the fill helpers a failed removal left beside them.
/// Returns the first error; the rest are still tried.
pub async fn remove_made(engine: &Engine, made: &[String]) -> Result<(), EngineError> {
    let api = &engine.api;
    let mut first = None;
    for name in made {
        let helper = api.remove_container(&fill_helper(name)).await.map(|_| ());
        let volume = match api.remove_volume(name).await {
            Err(e) if e.is_not_found() => Ok(()),
            other => other,
        };
        if let Err(e) = helper.and(volume) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// The name of the helper container that fills `volume`.
fn fill_helper(volume: &str) -> String {
    format!("{volume}-fill")
}

async fn fill(
    engine: &Engine,
    image: &str,
    volume: &str,
    digest: &str,
    incarnation: &str,
    bytes: &[u8],
) -> Result<(), LaunchError> {
    let api = &engine.api;
    let name = fill_helper(volume);
    api.create_container(&name, helper(image, volume, digest, incarnation)).await?;
    let uploaded = api.upload(&name, TOOLS_DIR, stream_of(init_tar(bytes)), engine.timeout() * 2).await;
    let removed = api.remove_container(&name).await;
    uploaded?;
    removed?;
    Ok(())
}

// The rung's trust in its init: the host directory, else its own tools volume.

/// After this long, the rung checks that its tools volume is still its own before it mounts
/// it again (another process's `reclaim --tools` may have taken it for a crash's leftover);
/// after a failed launch it checks at once. An engine that ignores `NoCopy` would fill a
/// volume made again on mount from the image, whose files would then run as PID 1: there
/// the rung checks before every mount, which leaves only the moment between the check and
/// the create.
const TOOLS_RECHECK_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// This rung's init in the engine: its own tools volume, made on first use and made anew
/// when it is no longer its own.
pub(crate) async fn tools_volume(shared: &Arc<ContainerSite>, image: &str) -> Result<ToolsVolume, LaunchError> {
    if let Some(t) = host_tools(shared).await {
        return Ok(t);
    }
    if let Some(t) = trusted(&*shared.tools.lock().await, &shared.engine) {
        return Ok(t);
    }
    // On the rung's tracked tasks, so an attempt dropped meanwhile (a caller's timeout)
    // leaves the volume made and recorded for `close`, never half made and unknown.
    let s = shared.clone();
    let image = image.to_owned();
    shared
        .base
        .tracker
        .spawn(async move {
            let mut slot = s.tools.lock().await;
            // Another attempt may have checked or made it while this one waited for the lock.
            if let Some(t) = trusted(&slot, &s.engine) {
                return Ok(t);
            }
            let now = std::time::Instant::now();
            if let Some((t, checked)) = &mut slot.current {
                if is_ours(&s.engine, &t.volume, &s.base.incarnation).await? {
                    *checked = Some(now);
                    return Ok(t.clone());
                }
                // Gone, or made again empty by a mount: its name stays in `made` for `close`.
                tracing::warn!(volume = %t.volume, "the rung's tools volume was taken; making a new one");
                let _ = s.engine.api.remove_volume(&t.volume).await;
                slot.current = None;
            }
            let t = create(&s.engine, &image, &s.base.incarnation).await?;
            slot.made.push(t.volume.clone());
            slot.current = Some((t.clone(), Some(now)));
            Ok::<_, LaunchError>(t)
        })
        .await
        .map_err(|e| LaunchError::Staging { what: "the init's tools volume".into(), source: Box::new(e) })?
}

/// The init from a host directory, when the engine can bind one (`tools::host_copy`);
/// looked at once per rung.
async fn host_tools(shared: &ContainerSite) -> Option<ToolsVolume> {
    use super::site::HostTools;
    let state = |s: &ContainerSite| match &*s.host_tools.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
        HostTools::Untried => None,
        HostTools::Ready(t) => Some(Some(t.clone())),
        HostTools::Unusable(_) => Some(None),
    };
    if !shared.config.init_from_host {
        return None;
    }
    match state(shared) {
        // Checked again before every container that binds it: a directory on the way may
        // have changed hands since (a few `openat`s and `fstat`s).
        Some(Some(t)) => {
            let bind = t.bind.as_deref().unwrap_or_default();
            return match checked_bind(std::path::Path::new(bind)) {
                Ok(real) if real.as_os_str() == bind => Some(t),
                checked => {
                    let why = checked.map_or_else(
                        |e| crate::util::error_chain(&e),
                        |real| format!("{bind} now resolves to {}", real.display()),
                    );
                    tracing::warn!(error = %why, "the init's host directory changed: a tools volume instead");
                    *shared.host_tools.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                        HostTools::Unusable(Some(why));
                    None
                }
            };
        }
        Some(None) => return None,
        None => {}
    }
    let engine = shared.engine.clone();
    let found = tokio::task::spawn_blocking(move || host_copy(&engine)).await.unwrap_or(Err(None));
    let mut slot = shared.host_tools.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if matches!(*slot, HostTools::Untried) {
        *slot = found.map_or_else(HostTools::Unusable, HostTools::Ready);
    }
    match &*slot {
        HostTools::Ready(t) => Some(t.clone()),
        _ => None,
    }
}

/// Why the init does not come from its host directory, when that was for want of trust in
/// it (the evidence names it beside the volume used instead).
pub(crate) fn host_tools_refusal(shared: &ContainerSite) -> Option<String> {
    match &*shared.host_tools.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
        super::site::HostTools::Unusable(why) => why.clone(),
        _ => None,
    }
}

/// After the engine refused `tools`' host directory: volumes from now on. Whether it was that.
pub(crate) fn host_tools_refused(shared: &ContainerSite, tools: &ToolsVolume, err: &LaunchError) -> bool {
    if !bind_refused(tools, err) {
        return false;
    }
    tracing::info!("the engine cannot bind the init's host directory (not on this machine's filesystem): volumes");
    *shared.host_tools.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
        super::site::HostTools::Unusable(None);
    true
}

/// The rung's tools volume when it was known to be its own less than [`TOOLS_RECHECK_AFTER`]
/// ago and the engine honours `NoCopy`: mounted without a check.
fn trusted(slot: &Slot, engine: &crate::engine::Engine) -> Option<ToolsVolume> {
    let (t, checked) = slot.current.as_ref()?;
    let fresh = checked.is_some_and(|c| c.elapsed() < TOOLS_RECHECK_AFTER);
    (fresh && engine.facts().honours_nocopy()).then(|| t.clone())
}

/// What `prune` removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ToolsPruned {
    /// Volumes removed.
    pub volumes_removed: Vec<String>,
    /// Volumes kept because a container uses them.
    pub in_use: Vec<String>,
}

/// Removes the tools volumes of other incarnations than `own` that are older than
/// [`STALE_AFTER`] (or carry no age) and that no container uses (the engine refuses to
/// remove a mounted volume).
pub async fn prune(engine: &Engine, own: &str) -> Result<ToolsPruned, EngineError> {
    let api = &engine.api;
    let now_s = crate::contract::unix_ms_now() / 1000;
    let mut out = ToolsPruned::default();
    for v in api.list_volumes(labels::tools_filter()).await? {
        if v.labels.get(labels::INCARNATION).map(String::as_str) == Some(own) {
            continue;
        }
        let created = v.labels.get(TOOLS_CREATED).and_then(|c| c.parse::<u64>().ok()).unwrap_or(0);
        if now_s.saturating_sub(created) < STALE_AFTER.as_secs() {
            continue;
        }
        match api.remove_volume(&v.name).await {
            Ok(()) => out.volumes_removed.push(v.name.clone()),
            Err(e) if e.is_conflict() => out.in_use.push(v.name.clone()),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_init_tar_holds_one_root_owned_executable() {
        let tar = init_tar(b"\x7fELF...");
        let mut a = tar::Archive::new(tar.as_slice());
        let entries: Vec<_> = a
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.path().unwrap().display().to_string(), e.header().mode().unwrap(), e.header().uid().unwrap())
            })
            .collect();
        assert_eq!(entries, [(INIT_NAME.to_owned(), 0o755, 0)]);
        assert_eq!(normal_arch("amd64"), normal_arch("x86_64"));
        assert_eq!(normal_arch("arm64"), "aarch64");
    }
}
