//! Stale worker images: listing and removing the images stevedore packed that nothing uses.
//!
//! Every build of a worker packs a new image (its tag carries the binary's digest), so old
//! ones pile up. They are never removed behind the caller's back: [`stale_images`] lists
//! them and [`remove_images`] removes what the caller chose.

use super::pack::{LABEL_EXE_SHA256, LABEL_PACKED, PackError};
use crate::engine::Engine;
use serde::Serialize;
use std::collections::HashMap;

/// A packed image that no container uses and that the caller does not keep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StaleImage {
    /// The image id (`sha256:...`).
    pub id: String,
    /// Its tags (empty for an untagged one).
    pub tags: Vec<String>,
    /// The digest of the executable it holds.
    pub exe_sha256: Option<String>,
    /// Its size in bytes.
    pub size_bytes: i64,
}

/// What [`remove_images`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ImageRemoval {
    /// Ids removed.
    pub removed: Vec<String>,
    /// Ids that could not be removed, with why.
    pub failed: Vec<(String, String)>,
}

/// Lists the images stevedore packed (`dev.stevedore.packed=true`, plus every `labels`
/// filter given as `key=value`) that no container, running or not, was created from, except
/// those with a tag in `keep`.
pub async fn stale_images(engine: &Engine, keep: &[String], labels: &[String]) -> Result<Vec<StaleImage>, PackError> {
    let mut label_filters = vec![format!("{LABEL_PACKED}=true")];
    label_filters.extend(labels.iter().cloned());
    let images = engine.api.list_images(HashMap::from([("label".to_owned(), label_filters)])).await?;
    let in_use = engine.api.images_in_use().await?;
    Ok(images
        .into_iter()
        .filter(|i| !in_use.contains(&i.id))
        .filter(|i| !i.tags.iter().any(|t| keep.contains(t)))
        .map(|i| StaleImage {
            exe_sha256: i.labels.get(LABEL_EXE_SHA256).cloned(),
            size_bytes: i.size_bytes,
            tags: i.tags,
            id: i.id,
        })
        .collect())
}

/// Removes the given images (each tag, then the image); one failure does not stop the rest.
/// Never forced: an image a container started using meanwhile stays.
pub async fn remove_images(engine: &Engine, images: &[StaleImage]) -> ImageRemoval {
    let mut out = ImageRemoval::default();
    for image in images {
        // By tag when tagged: removing by id refuses an image with several tags.
        let names = if image.tags.is_empty() { vec![image.id.clone()] } else { image.tags.clone() };
        let mut failed = None;
        for name in &names {
            match engine.api.remove_image(name).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => failed = Some(crate::util::error_chain(&e)),
            }
        }
        match failed {
            None => out.removed.push(image.id.clone()),
            Some(why) => out.failed.push((image.id.clone(), why)),
        }
    }
    out
}
