//! Phase 1 of an oci attempt: what is decided before anything is made for it: the output dir
//! (opened once), the image (by id, from the local engine; nothing is pulled) and its root
//! filesystem in the cache (an image whose mount points are not plain directories is
//! refused here), the argv, the environment layers, the inputs measured, the names.

use super::site::OciSite;
use super::spec::Sizes;
use crate::attempt::Decided;
use crate::contract::{InputsStaged, LaunchError, Request, Task};
use crate::engine::ImageFacts;
use crate::envlayer;
use crate::inputs::InputDir;
use std::collections::HashMap;
use std::path::PathBuf;
use stevedore_init::wire::{IN_DIR, INIT_NAME, OUT_DIR, TMP_DIR, TOOLS_DIR, env as wire_env};

/// What the attempt will do, decided.
#[derive(Debug)]
pub(crate) struct Plan {
    /// What every rung decides (the name names the runtime's container, its bundle and cgroup).
    pub decided: Decided,
    pub image_ref: String,
    pub image: ImageFacts,
    /// The image's root filesystem in the cache, held against its prune until the teardown.
    pub rootfs: PathBuf,
    pub held: Option<super::cache::Held>,
    pub sizes: Sizes,
    pub inputs: Option<(InputDir, InputsStaged)>,
}

pub(crate) async fn prepare(site: &OciSite, req: &Request, sizes: Sizes) -> Result<Plan, LaunchError> {
    let cfg = &site.config;
    let started_ms = crate::contract::unix_ms_now();
    // A handler runs in the worker's own image; a command in the request's or the rung's.
    let configured = match req.task {
        Task::Handler(_) => cfg.worker_image.as_ref().or(cfg.image.as_ref()),
        Task::Command(_) => cfg.image.as_ref().or(cfg.worker_image.as_ref()),
    };
    let image_ref = match (&req.policy.image, configured) {
        (i, _) if !i.is_empty() => i.clone(),
        (_, Some(i)) => i.clone(),
        (_, None) => return Err(LaunchError::NotAllowed("no image given and no image configured".into())),
    };
    let unavailable = |why: String, permanent: bool, source: Option<crate::util::Cause>| {
        LaunchError::ImageUnavailable { image: image_ref.clone(), why, permanent, source }
    };
    let image = match site.engine.api.inspect_image(&image_ref).await {
        Ok(i) => i,
        Err(e) if e.is_not_found() => {
            return Err(unavailable("not in the local engine (the oci rung pulls nothing)".into(), true, None));
        }
        Err(e) => return Err(unavailable("inspecting it failed".into(), false, Some(e.into()))),
    };
    let argv = image.argv(req, &image_ref)?;
    let inputs = crate::inputs::opened(req.input_dir.as_deref(), cfg.max_input_bytes)?;
    let output_dir = req.open_output_dir()?;
    let labels = HashMap::from([
        ("dev.stevedore.managed".to_owned(), "true".to_owned()),
        ("dev.stevedore.worker".to_owned(), req.worker_id.clone()),
        ("dev.stevedore.incarnation".to_owned(), site.base.incarnation.clone()),
        ("dev.stevedore.executor".to_owned(), cfg.name.clone()),
        ("dev.stevedore.kind".to_owned(), "attempt".to_owned()),
    ]);
    let (rootfs, held) = site.images.rootfs(&site.engine, &image.id, labels).await.map_err(|e| match e {
        e @ super::image::ImageError::MountPoint { .. } => unavailable(e.to_string(), true, None),
        e @ super::image::ImageError::Unsafe { .. } => {
            unavailable("its filesystem was refused".into(), true, Some(e.into()))
        }
        e => unavailable("its filesystem could not be unpacked".into(), false, Some(e.into())),
    })?;
    let env = layer_env(req, &image);
    let mut decided = Decided::new(started_ms, output_dir, argv, |id| super::reclaim::attempt_name(&req.worker_id, id));
    decided.env = env.env;
    decided.env_overrides = env.overrides;
    decided.cwd = req
        .workdir
        .clone()
        .or_else(|| image.working_dir.clone().filter(|w| !w.is_empty()))
        .unwrap_or_else(|| "/".into());
    decided.narrowed.clone_from(&sizes.narrowed);
    Ok(Plan { decided, image_ref, image, rootfs, held: Some(held), sizes, inputs })
}

/// Environment: image `ENV` < rung < request < stevedore's protocol variables.
fn layer_env(req: &Request, image: &ImageFacts) -> envlayer::Layered {
    let protocol_env = vec![
        (wire_env::JOB_ID.to_owned(), req.job_id.clone()),
        (wire_env::ATTEMPT.to_owned(), req.attempt.to_string()),
        (wire_env::IN.to_owned(), IN_DIR.to_owned()),
        (wire_env::OUT.to_owned(), OUT_DIR.to_owned()),
        (wire_env::INIT.to_owned(), format!("{TOOLS_DIR}/{INIT_NAME}")),
    ];
    let mut image_env = envlayer::parse_pairs(&image.env);
    if !image_env.iter().any(|(k, _)| k == "PATH") {
        image_env.insert(0, ("PATH".into(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()));
    }
    // The root filesystem is read-only: HOME goes where the command can write.
    envlayer::layer(&[
        ("image", image_env),
        ("rung", vec![("HOME".into(), TMP_DIR.into())]),
        ("request", req.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        ("protocol", protocol_env),
    ])
}
