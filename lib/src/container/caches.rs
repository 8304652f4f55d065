//! Named caches: volumes of kind `cache` that outlive attempts. Found by name and checked by
//! their labels (a cache never names a volume that is not that cache in that scope), made on
//! first use and handed to the sandbox user (through the archive API: an engine makes a new
//! volume's root root-owned).

use super::labels;
use super::site::ContainerSite;
use crate::contract::{LaunchError, Request};
use bollard::models::VolumeCreateRequest;

/// The caches an attempt mounts: (name, volume, path).
pub(crate) async fn ensure(
    shared: &ContainerSite,
    req: &Request,
    image: &str,
    tools: &super::site::ToolsVolume,
) -> Result<Vec<(String, String, String)>, LaunchError> {
    let cfg = &shared.config;
    if cfg.caches.is_empty() {
        return Ok(Vec::new());
    }
    if !cfg.allow_caches {
        return Err(LaunchError::NotAllowed(format!(
            "profile {:?} forbids caches (allow_caches = false)",
            cfg.profile.as_deref().unwrap_or("default")
        )));
    }
    let (app, org) = (req.app_id.as_deref(), req.org_id.as_deref());
    let mut out = Vec::new();
    for c in &cfg.caches {
        c.check().map_err(LaunchError::NotAllowed)?;
        let volume = labels::cache_volume(&c.name, app, org);
        match shared.engine.api.inspect_volume(&volume).await? {
            Some(v) if labels::is_cache(&v.labels, &c.name, app, org) => {}
            Some(_) => {
                return Err(LaunchError::NotAllowed(format!(
                    "volume {volume} exists but is not cache {:?} of this scope; it is left alone",
                    c.name
                )));
            }
            None => create(shared, &volume, &c.name, app, org, image, tools).await?,
        }
        out.push((c.name.clone(), volume, c.path.clone()));
    }
    Ok(out)
}

async fn create(
    shared: &ContainerSite,
    volume: &str,
    name: &str,
    app: Option<&str>,
    org: Option<&str>,
    image: &str,
    tools: &super::site::ToolsVolume,
) -> Result<(), LaunchError> {
    let api = &shared.engine.api;
    let req = VolumeCreateRequest {
        name: Some(volume.to_owned()),
        driver: Some("local".into()),
        labels: Some(labels::cache(name, app, org)),
        ..Default::default()
    };
    api.create_volume(req).await?;
    let handed = hand_over(shared, volume, name, app, org, image, tools).await;
    if handed.is_err() {
        let _ = api.remove_volume(volume).await;
    }
    handed
}

/// Runs stevedore's init, as root, in a throwaway container with the new volume, to give
/// the volume's root to the sandbox user.
async fn hand_over(
    shared: &ContainerSite,
    volume: &str,
    name: &str,
    app: Option<&str>,
    org: Option<&str>,
    image: &str,
    tools: &super::site::ToolsVolume,
) -> Result<(), LaunchError> {
    let api = &shared.engine.api;
    let (uid, gid) = shared.config.uid_gid();
    let helper = format!("{volume}-own-{:08x}", rand::random::<u32>());
    let body = super::spec::cache_owner(
        image,
        tools,
        &shared.base.incarnation,
        volume,
        (uid, gid),
        labels::cache(name, app, org),
    );
    api.create_container(&helper, body).await?;
    let ran = async {
        api.start(&helper).await?;
        api.wait_exit(&helper).await
    }
    .await;
    let _ = api.remove_container(&helper).await;
    match ran {
        Ok(0) => Ok(()),
        Ok(code) => Err(LaunchError::Staging {
            what: format!("the ownership of cache volume {volume}"),
            source: format!("stevedore-init chown-dir exited {code}").into(),
        }),
        Err(e) => Err(LaunchError::Engine(e)),
    }
}

/// A named cache as the engine holds it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CacheInfo {
    /// Its name.
    pub name: Option<String>,
    /// Its app scope.
    pub app: Option<String>,
    /// Its org scope.
    pub org: Option<String>,
    /// The volume holding it.
    pub volume: String,
}

/// Why a cache could not be listed or removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// no such cache in that scope
    #[error("no cache {name:?} in that scope ({volume})")]
    Missing {
        /// The name.
        name: String,
        /// The volume it would be.
        volume: String,
    },
    /// the volume is not that cache
    #[error("volume {volume} is not cache {name:?} of that scope; left alone")]
    NotTheCache {
        /// The name.
        name: String,
        /// The volume.
        volume: String,
    },
    /// the engine refused
    #[error("the engine refused ({volume})")]
    Engine {
        /// The volume.
        volume: String,
        /// The cause.
        #[source]
        source: crate::engine::EngineError,
    },
}

/// Every named cache in the engine.
pub async fn list(engine: &crate::engine::Engine) -> Result<Vec<CacheInfo>, crate::engine::EngineError> {
    let volumes = engine.api.list_volumes(labels::cache_filter()).await?;
    Ok(volumes
        .into_iter()
        // Checked again: Podman ORs repeated label filters.
        .filter(|v| v.labels.get(labels::KIND).map(String::as_str) == Some("cache"))
        .map(|v| CacheInfo {
            name: v.labels.get(labels::CACHE).cloned(),
            app: v.labels.get(labels::APP).cloned(),
            org: v.labels.get(labels::ORG).cloned(),
            volume: v.name,
        })
        .collect())
}

/// Removes cache `name` of the scope (`app`, `org`); its volume's name.
pub async fn remove(
    engine: &crate::engine::Engine,
    name: &str,
    app: Option<&str>,
    org: Option<&str>,
) -> Result<String, CacheError> {
    let volume = labels::cache_volume(name, app, org);
    let engine_err = |source| CacheError::Engine { volume: volume.clone(), source };
    match engine.api.inspect_volume(&volume).await.map_err(engine_err)? {
        Some(v) if labels::is_cache(&v.labels, name, app, org) => {}
        Some(_) => return Err(CacheError::NotTheCache { name: name.to_owned(), volume }),
        None => return Err(CacheError::Missing { name: name.to_owned(), volume }),
    }
    engine.api.remove_volume(&volume).await.map_err(engine_err)?;
    Ok(volume)
}
