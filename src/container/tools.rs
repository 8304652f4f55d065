//! stevedore's init in the engine: a volume of kind `tools` per init digest, filled through
//! the archive API (so it works on any engine, remote ones included), published atomically,
//! shared by every worker and attempt, mounted read-only at `/.stevedore/tools`.
//!
//! Publication: a worker fills a volume of its own (`stevedore-tools-<d>-<nonce>`), then
//! creates the pointer volume `stevedore-tools-<d>` labelled with its content volume's name.
//! Creating a volume that exists returns the existing one (Docker) or fails with a conflict
//! (Podman); either way every worker ends up reading the same pointer, so the first
//! complete fill wins and nobody ever mounts a half-filled volume. A fill abandoned by a
//! crash is never pointed to; `prune` removes it with other stale tools volumes.

use super::labels::{self, TOOLS_DIGEST};
use super::spec::volume_mount;
use crate::contract::LaunchError;
use crate::engine::{ByteStream, Engine, EngineError};
use crate::sandbox::init_binary;
use crate::wire::{INIT_NAME, TOOLS_DIR};
use bollard::models::{ContainerCreateBody, HostConfig, VolumeCreateRequest};
use bytes::Bytes;
use futures_util::StreamExt;

/// The label on the pointer volume naming the content volume.
pub const TOOLS_VOLUME: &str = "dev.stevedore.tools.volume";

/// The published tools volume for this process's init.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolsVolume {
    /// The content volume to mount.
    pub volume: String,
    /// The init's sha256.
    pub digest: String,
    /// This process filled it (so it needs no verification).
    pub filled_here: bool,
}

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

/// The pointer volume's name for `digest`.
pub fn pointer_name(digest: &str) -> String {
    format!("stevedore-tools-{}", short(digest))
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

/// A never-started helper container mounting `volume` at [`TOOLS_DIR`], for the archive API.
fn helper(image: &str, volume: &str, read_only: bool, digest: &str) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(image.to_owned()),
        entrypoint: Some(vec!["/.stevedore-helper-never-started".into()]),
        cmd: Some(vec![]),
        labels: Some(labels::tools(digest, "helper")),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            mounts: Some(vec![volume_mount(volume, TOOLS_DIR, read_only)]),
            log_config: Some(bollard::models::HostConfigLogConfig { typ: Some("none".into()), config: None }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn stream_of(bytes: Vec<u8>) -> ByteStream {
    Box::pin(futures_util::stream::once(async move { Ok(Bytes::from(bytes)) }))
}

/// Makes sure this process's init is in the engine and returns its volume. `image` is any
/// local image (the attempt's): it only backs never-started helper containers.
pub async fn ensure(engine: &Engine, image: &str) -> Result<ToolsVolume, LaunchError> {
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
    let pointer = pointer_name(&digest);
    let api = &engine.api;
    if let Some(p) = api.inspect_volume(&pointer).await?
        && let Some(target) = p.labels.get(TOOLS_VOLUME)
        && api.inspect_volume(target).await?.is_some()
    {
        return Ok(ToolsVolume { volume: target.clone(), digest, filled_here: false });
    }
    // Fill a volume of our own, then try to publish it.
    let nonce = format!("{:08x}", rand::random::<u32>());
    let content = format!("{pointer}-{nonce}");
    let mut content_labels = labels::tools(&digest, "content");
    content_labels.insert(TOOLS_VOLUME.into(), content.clone());
    api.create_volume(VolumeCreateRequest {
        name: Some(content.clone()),
        driver: Some("local".into()),
        labels: Some(content_labels),
        ..Default::default()
    })
    .await?;
    let filled = fill(engine, image, &content, &digest, bytes).await;
    if let Err(e) = filled {
        let _ = api.remove_volume(&content).await;
        return Err(e);
    }
    let mut pointer_labels = labels::tools(&digest, "pointer");
    pointer_labels.insert(TOOLS_VOLUME.into(), content.clone());
    let req = VolumeCreateRequest {
        name: Some(pointer.clone()),
        driver: Some("local".into()),
        labels: Some(pointer_labels),
        ..Default::default()
    };
    let published = match api.create_volume(req).await {
        Ok(v) => v.labels.get(TOOLS_VOLUME).cloned(),
        // Podman refuses to create a volume that exists: read who won.
        Err(e) if e.is_conflict() => {
            api.inspect_volume(&pointer).await?.and_then(|v| v.labels.get(TOOLS_VOLUME).cloned())
        }
        Err(e) => {
            let _ = api.remove_volume(&content).await;
            return Err(e.into());
        }
    };
    match published {
        Some(winner) if winner == content => Ok(ToolsVolume { volume: content, digest, filled_here: true }),
        Some(winner) => {
            let _ = api.remove_volume(&content).await;
            Ok(ToolsVolume { volume: winner, digest, filled_here: false })
        }
        None => {
            let _ = api.remove_volume(&content).await;
            Err(LaunchError::Staging {
                what: format!("publishing the init: pointer volume {pointer} names no content volume"),
                source: "unlabelled pointer".into(),
            })
        }
    }
}

async fn fill(engine: &Engine, image: &str, volume: &str, digest: &str, bytes: &[u8]) -> Result<(), LaunchError> {
    let api = &engine.api;
    let name = format!("{volume}-fill");
    api.create_container(&name, helper(image, volume, false, digest)).await?;
    let uploaded = api.upload(&name, TOOLS_DIR, stream_of(init_tar(bytes)), engine.timeout() * 2).await;
    let removed = api.remove_container(&name).await;
    uploaded?;
    removed?;
    Ok(())
}

/// Reads the init back from `tools` and checks its digest: a volume someone changed, or a
/// fill that went wrong, is refused (and unpublished, so the next attempt fills afresh).
pub async fn verify(engine: &Engine, image: &str, tools: &ToolsVolume) -> Result<(), LaunchError> {
    let api = &engine.api;
    let name = format!("{}-check-{:08x}", tools.volume, rand::random::<u32>());
    api.create_container(&name, helper(image, &tools.volume, true, &tools.digest)).await?;
    let path = format!("{TOOLS_DIR}/{INIT_NAME}");
    let mut stream = api.download(&name, &path);
    let mut tar_bytes = Vec::new();
    let read = async {
        while let Some(chunk) = stream.next().await {
            tar_bytes.extend_from_slice(&chunk?);
            if tar_bytes.len() > 64 << 20 {
                return Err(std::io::Error::other("more than 64 MiB"));
            }
        }
        Ok(())
    };
    let read = tokio::time::timeout(engine.timeout(), read).await;
    let _ = api.remove_container(&name).await;
    let problem = match read {
        Err(_) => Some("reading it back timed out".to_owned()),
        Ok(Err(e)) => Some(format!("reading it back failed: {e}")),
        Ok(Ok(())) => match digest_in_tar(&tar_bytes) {
            Some(d) if d == tools.digest => None,
            Some(d) => Some(format!("it holds an init of digest {d}")),
            None => Some("it holds no init".to_owned()),
        },
    };
    match problem {
        None => Ok(()),
        Some(why) => {
            let _ = api.remove_volume(&pointer_name(&tools.digest)).await;
            Err(LaunchError::Staging {
                what: format!("tools volume {} failed verification: {why}", tools.volume),
                source: why.into(),
            })
        }
    }
}

fn digest_in_tar(tar_bytes: &[u8]) -> Option<String> {
    use sha2::{Digest, Sha256};
    let mut archive = tar::Archive::new(tar_bytes);
    for entry in archive.entries().ok()? {
        let mut entry = entry.ok()?;
        if entry.header().entry_type() == tar::EntryType::Regular {
            let mut hasher = Sha256::new();
            std::io::copy(&mut entry, &mut hasher).ok()?;
            return Some(format!("{:x}", hasher.finalize()));
        }
    }
    None
}

/// What `prune` removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Pruned {
    /// Volumes removed.
    pub volumes_removed: Vec<String>,
    /// Volumes kept because a container uses them.
    pub in_use: Vec<String>,
}

/// Removes tools volumes that are stale (of another init than `keep_digest`, or abandoned
/// fills of any) and unused (the engine refuses to remove a volume a container mounts).
pub async fn prune(engine: &Engine, keep_digest: &str) -> Result<Pruned, EngineError> {
    let api = &engine.api;
    let all = api.list_volumes(labels::tools_filter()).await?;
    let pointed: Vec<String> = all
        .iter()
        .filter(|v| v.labels.get(labels::ROLE).map(String::as_str) == Some("pointer"))
        .filter_map(|v| v.labels.get(TOOLS_VOLUME).cloned())
        .collect();
    let mut out = Pruned::default();
    // Pointers first, so no worker picks up a content volume about to go.
    let mut order: Vec<_> = all.iter().collect();
    order.sort_by_key(|v| v.labels.get(labels::ROLE).map(String::as_str) != Some("pointer"));
    for v in order {
        let digest = v.labels.get(TOOLS_DIGEST).map(String::as_str).unwrap_or("");
        let current = digest == keep_digest;
        let role = v.labels.get(labels::ROLE).map(String::as_str).unwrap_or("");
        let stale = !current || (role == "content" && !pointed.contains(&v.name));
        if !stale {
            continue;
        }
        match api.remove_volume(&v.name).await {
            Ok(()) => out.volumes_removed.push(v.name.clone()),
            Err(e) if e.is_conflict() => out.in_use.push(v.name.clone()),
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
        assert_eq!(digest_in_tar(&tar).unwrap().len(), 64);
        assert_eq!(pointer_name(&"ab".repeat(32)), "stevedore-tools-abababababababab");
        assert_eq!(normal_arch("amd64"), normal_arch("x86_64"));
        assert_eq!(normal_arch("arm64"), "aarch64");
    }
}
