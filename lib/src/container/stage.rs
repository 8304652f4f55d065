//! Staging the inputs through the engine, the cold path's and the warm pool's alike: the
//! input volume and the never-started helper whose writable mount of it the archive API
//! uploads into (an attempt's own mount of it is read-only), and the upload itself, a tar
//! written by descriptor (`inputs`).

use super::cleanup::{Leftovers, creating};
use super::prepare::Plan;
use super::site::ContainerSite;
use super::spec;
use crate::contract::LaunchError;
use crate::engine::ByteStream;
use bollard::models::VolumeCreateRequest;
use std::sync::Arc;
use std::time::Duration;
use stevedore_init::wire::IN_DIR;

/// Bytes per second an upload is allowed to be as slow as before it times out.
const SLOWEST_UPLOAD: u64 = 8 << 20;

/// The input volume and the never-started helper that uploads into it (the attempt's own
/// mount of it is read-only, which the archive API refuses); returns the helper's name.
pub(crate) async fn prepare_staging(
    shared: &Arc<ContainerSite>,
    plan: &Plan,
    volume: &str,
    left: &mut Leftovers,
) -> Result<String, LaunchError> {
    let req = VolumeCreateRequest {
        name: Some(volume.to_owned()),
        driver: Some("local".into()),
        labels: Some(plan.input_labels.clone()),
        ..Default::default()
    };
    left.volume(volume.to_owned());
    let s = shared.clone();
    creating(shared, left, async move { s.engine.api.create_volume(req).await }).await?;
    let helper = format!("{}-stage", plan.decided.name);
    let body = spec::staging_helper(&plan.image_ref, volume, plan.stage_labels.clone());
    // The helper stays in `left` and goes with the attempt's cleanup: removing it here would
    // put an engine call in front of every attempt with inputs.
    left.container(helper.clone());
    let s = shared.clone();
    let h = helper.clone();
    creating(shared, left, async move { s.engine.api.create_container(&h, body).await }).await?;
    Ok(helper)
}

/// Where the inputs' tar goes: a container, the path in it, and whose the entries are.
pub(crate) struct UploadTo<'a> {
    pub container: &'a str,
    pub path: &'a str,
    pub owners: crate::inputs::Owners,
}

impl<'a> UploadTo<'a> {
    /// `/in` of a never-started helper whose mount of the input volume is writable, the
    /// entries the sandbox user's (the attempt's own mount of it is read-only, which the
    /// archive API refuses).
    pub fn helper(shared: &ContainerSite, helper: &'a str) -> Self {
        let (uid, gid) = shared.config.uid_gid();
        Self { container: helper, path: IN_DIR, owners: crate::inputs::Owners::User(uid, gid) }
    }
}

/// Streams the input dir, as a tar written by descriptor, to where `to` says.
pub(crate) async fn upload_inputs(
    shared: &Arc<ContainerSite>,
    to: UploadTo<'_>,
    dir: crate::inputs::InputDir,
    bytes: u64,
    progress: Option<crate::contract::ProgressSink>,
) -> Result<crate::inputs::StageReport, LaunchError> {
    let (producer, chunks) =
        crate::inputs::tar_stream(dir, to.owners, shared.config.max_input_bytes, bytes, progress.clone());
    let body: ByteStream = Box::pin(chunks);
    let timeout = shared.engine.timeout() + Duration::from_secs(bytes / SLOWEST_UPLOAD);
    let up = shared.engine.api.upload(to.container, to.path, body, timeout).await;
    let report = crate::inputs::finish(producer, bytes, None).await?;
    up.map_err(|e| LaunchError::Staging { what: "uploading the inputs".into(), source: Box::new(e) })?;
    if let Some(s) = &progress {
        crate::inputs::finished(s, bytes);
    }
    Ok(report)
}
