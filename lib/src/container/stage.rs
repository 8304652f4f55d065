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
use stevedore_init::wire::{IN_DIR, STAGE_DIR};

/// Bytes per second an upload is allowed to be as slow as before it times out.
pub(crate) const SLOWEST_UPLOAD: u64 = 8 << 20;

/// The input volume and the never-started helper that uploads into it (the attempt's own
/// mount of it is read-only, which the archive API refuses); returns the helper's name.
pub(crate) async fn prepare_staging(
    shared: &Arc<ContainerSite>,
    plan: &Plan,
    volume: &str,
    left: &mut Leftovers,
) -> Result<String, LaunchError> {
    create_input_volume(shared, volume, plan.input_labels.clone(), left).await?;
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

/// The input volume, labelled as the attempt's.
pub(crate) async fn create_input_volume(
    shared: &Arc<ContainerSite>,
    volume: &str,
    labels: std::collections::HashMap<String, String>,
    left: &mut Leftovers,
) -> Result<(), LaunchError> {
    let req = VolumeCreateRequest {
        name: Some(volume.to_owned()),
        driver: Some("local".into()),
        labels: Some(labels),
        ..Default::default()
    };
    left.volume(volume.to_owned());
    let s = shared.clone();
    creating(shared, left, async move { s.engine.api.create_volume(req).await }).await.map(drop)
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

/// Why inputs of `bytes` cannot travel over the link to a root init on this rung, or `None`
/// when they can (`docs/outcome.md`, "Inputs over the link"): a numeric sandbox user that is
/// not root (a name would be looked up in the image's files, which a root init never reads;
/// root would own the entries it reads), an engine that honours `NoCopy` (Podman 4 ignores it:
/// the volume's root would take the owner of the image's own `/in`), the init's privileges
/// dropped by the engine too (capabilities and no-new-privileges), and inputs within
/// `link_inputs_max_bytes`.
pub(crate) fn not_over_link(shared: &ContainerSite, bytes: Option<u64>) -> Option<String> {
    let cfg = &shared.config;
    if cfg.link_inputs_max_bytes == 0 {
        return Some("link_inputs_max_bytes is 0 by configuration".into());
    }
    let Some((uid, gid)) = cfg.numeric_user() else {
        return Some(format!(
            "the user {:?} is not a numeric uid:gid (a name would be looked up in the image's files)",
            cfg.user
        ));
    };
    if uid == 0 || gid == 0 {
        return Some(format!("the sandbox user {} is root's (it would own what it reads)", cfg.user));
    }
    if !shared.engine.facts().honours_nocopy() {
        return Some(
            "the engine ignores a mount's NoCopy (Podman): the input volume's root would take the image's owner".into(),
        );
    }
    if !(cfg.hardening.drop_all_capabilities && cfg.hardening.no_new_privileges) {
        return Some("capabilities or no-new-privileges relaxed by configuration".into());
    }
    match bytes {
        Some(b) if b > cfg.link_inputs_max_bytes => {
            Some(format!("{b} bytes of inputs, above link_inputs_max_bytes ({})", cfg.link_inputs_max_bytes))
        }
        _ => None,
    }
}

/// Who a root init drops to before the command: the configured numeric user and groups.
pub(crate) fn credentials(shared: &ContainerSite) -> Option<stevedore_init::wire::Credentials> {
    let (uid, gid) = shared.config.numeric_user()?;
    Some(stevedore_init::wire::Credentials { uid, gid, groups: shared.config.groups.clone() })
}

/// The evidence of inputs the root init wrote over the link.
pub(crate) fn over_link_evidence(volume: &str) -> String {
    format!(
        "volume {volume} mounted read-only at {IN_DIR}; written over the link by the init as uid 0 into the same \
         volume at {STAGE_DIR} (root's entries, files 0444, dirs 0555, each by descriptor), after it checked it was \
         alone and the mount root's, empty and on {IN_DIR}'s device; then it dropped to the sandbox user \
         (init_privileges)"
    )
}

/// The evidence of inputs uploaded through the engine, and why not over the link.
pub(crate) fn through_engine_evidence(volume: &str, why: &str) -> String {
    format!(
        "volume {volume} mounted read-only at {IN_DIR}; uploaded through the engine's archive API into a \
         never-started helper's writable mount (not over the link: {why})"
    )
}
