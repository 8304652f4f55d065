//! Phase 1 of an attempt: everything decided before the engine creates anything: the
//! output dir (opened once), the image and its facts, the argv, the environment layers, the
//! inputs measured against their limit, the names and labels.

use super::config::PullPolicy;
use super::labels::{AttemptLabels, Owner};
use super::site::ContainerSite;
use super::sizes::Sizes;
use crate::attempt::Decided;
use crate::contract::{InputsStaged, LaunchError, Request};
use crate::engine::ImageFacts;
use crate::envlayer;
use crate::inputs::InputDir;
use std::collections::HashMap;
use stevedore_init::wire::{IN_DIR, INIT_NAME, OUT_DIR, STAGE_DIR, TMP_DIR, TOOLS_DIR, env as wire_env};

/// What the attempt will do, decided.
#[derive(Debug)]
pub(crate) struct Plan {
    /// What every rung decides (the container's name: `sd-<worker>-<attempt id>`).
    pub decided: Decided,
    pub image_ref: String,
    pub image: ImageFacts,
    pub applied: Sizes,
    pub inputs: Option<(InputDir, InputsStaged)>,
    pub labels: HashMap<String, String>,
    pub input_labels: HashMap<String, String>,
    pub stage_labels: HashMap<String, String>,
    pub probe_labels: HashMap<String, String>,
    /// Where the attempt mounts something (`mounts`).
    pub mounts: Vec<String>,
    /// Where the inputs' upload reports its progress.
    pub progress: Option<crate::contract::ProgressSink>,
    /// Why the inputs do not travel over the link (`stage::not_over_link`); `None`: they do.
    pub not_over_link: Option<String>,
}

pub(crate) async fn prepare(shared: &ContainerSite, req: &Request, applied: Sizes) -> Result<Plan, LaunchError> {
    let cfg = &shared.config;
    let started_ms = crate::contract::unix_ms_now();
    let image_ref = match (&req.policy.image, &cfg.worker_image) {
        (i, _) if !i.is_empty() => i.clone(),
        (_, Some(w)) => w.clone(),
        (_, None) => return Err(LaunchError::NotAllowed("no image given and no worker image configured".into())),
    };
    let image = resolve_image(shared, &image_ref).await?;
    let caches: Vec<&str> = cfg.caches.iter().map(|c| c.path.as_str()).collect();
    if let Some((volume, mount)) = super::spec::nested_volume(&image.volumes, &caches) {
        return Err(LaunchError::ImageVolume { image: image_ref, volume, mount });
    }
    let argv = image.argv(req, &image_ref)?;
    let inputs = crate::inputs::opened(req.input_dir.as_deref(), cfg.max_input_bytes)?;
    let output_dir = req.open_output_dir()?;
    let mut mounts =
        super::mounts::destinations(inputs.is_some(), &caches, &super::spec::masked_volumes(&image.volumes, &caches));
    let not_over_link = super::stage::not_over_link(shared, inputs.as_ref().map(|(_, s)| s.bytes));
    if inputs.is_some() && not_over_link.is_none() {
        mounts.push(STAGE_DIR.to_owned());
    }
    let env = layer_env(req, &image, cfg);
    let worker = &req.worker_id[..req.worker_id.len().min(40)];
    let mut decided = Decided::new(started_ms, output_dir, argv, |id| format!("sd-{worker}-{id}"));
    decided.env = env.env;
    decided.env_overrides = env.overrides;
    decided.cwd = req
        .workdir
        .clone()
        .or_else(|| image.working_dir.clone().filter(|w| !w.is_empty()))
        .unwrap_or_else(|| "/".into());
    decided.narrowed.clone_from(&applied.narrowed);
    let owner = Owner { worker: &req.worker_id, incarnation: &shared.base.incarnation, executor: &cfg.name };
    let l = AttemptLabels::of_request(owner, req, &decided.attempt_id, &cfg.labels);
    Ok(Plan {
        labels: l.for_role("container"),
        input_labels: l.for_role("in"),
        stage_labels: l.for_role("stage"),
        probe_labels: l.for_role("probe"),
        mounts,
        decided,
        image_ref,
        image,
        applied,
        inputs,
        progress: req.progress.clone(),
        not_over_link,
    })
}

/// Environment: image `ENV` < rung/profile < request < stevedore's protocol variables.
fn layer_env(req: &Request, image: &ImageFacts, cfg: &super::ContainerConfig) -> envlayer::Layered {
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
    // The root filesystem is read-only: HOME goes where the command can write, unless a
    // profile or the request says otherwise.
    envlayer::layer(&[
        ("image", image_env),
        ("rung", vec![("HOME".into(), TMP_DIR.into())]),
        ("profile", cfg.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        ("request", req.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        ("protocol", protocol_env),
    ])
}

/// An image that is not local but close to one that is (a typo, another tag): named before
/// anything is pulled, so a typo never reaches a registry. `None`: nothing is close (or the
/// engine cannot list its images), and the policy decides.
async fn did_you_mean(shared: &ContainerSite, image: &str, policy: PullPolicy) -> Option<String> {
    let local = shared.engine.api.list_images(Default::default()).await.ok()?;
    let close =
        stevedore_parse::images::close_names(image, local.iter().flat_map(|i| i.tags.iter().map(String::as_str)));
    let first = close.first()?;
    let pull = match policy {
        PullPolicy::Never => "",
        _ => "; nothing was pulled (`--pull always`, or the profile key `pull = \"always\"`, pulls it anyway)",
    };
    Some(format!(
        "not found locally; did you mean {first}{}?{pull}",
        if close.len() > 1 { format!(" (or {})", close[1..].join(", ")) } else { String::new() }
    ))
}

pub(crate) async fn resolve_image(shared: &ContainerSite, image: &str) -> Result<ImageFacts, LaunchError> {
    let api = &shared.engine.api;
    let policy = shared.config.pull;
    let unavailable = |why: String, permanent: bool, source: Option<crate::engine::EngineError>| {
        LaunchError::ImageUnavailable { image: image.to_owned(), why, permanent, source: source.map(Into::into) }
    };
    // Credentials only when a pull is tried: a helper may ask a keychain. As the docker CLI
    // does, credentials that cannot be had mean an anonymous pull (a public image still
    // comes); why is said if the registry then refuses.
    let helper_failed = std::sync::Mutex::new(None::<String>);
    let auth = || async {
        let path = std::env::var_os("PATH");
        let found =
            crate::engine::credentials::for_image(image, shared.config.docker_config.as_deref(), path.as_deref()).await;
        Ok::<_, LaunchError>(found.unwrap_or_else(|e| {
            tracing::warn!(image, error = %e, "no registry credentials: pulling anonymously");
            *helper_failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e.to_string());
            None
        }))
    };
    let pulled = |auth: Option<crate::engine::credentials::RegistryAuth>| async move {
        let from = auth.as_ref().map(|a| a.from.clone());
        let r = api.pull(image, auth.as_ref()).await;
        if let Some(from) = from {
            tracing::debug!(image, credentials = %from, "pulled with credentials");
        }
        r
    };
    if policy == PullPolicy::Always {
        pulled(auth().await?)
            .await
            .map_err(|e| unavailable("the pull (policy always) failed".into(), false, Some(e)))?;
    }
    // The engine is away (restarting, or its connection cut): nothing of the attempt exists
    // yet, so it waits for the engine (as long as a read may take) rather than failing at
    // once; an attempt that failed fast here would only be requeued into the same outage.
    // The first calls after an outage may still meet connections it broke: asked again.
    let until = tokio::time::Instant::now() + shared.engine.timeout();
    let first = loop {
        match api.inspect_image(image).await {
            Err(e)
                if e.is_transient()
                    && !e.is_timeout()
                    && shared
                        .engine
                        .answers_again(until.saturating_duration_since(tokio::time::Instant::now()))
                        .await =>
            {
                tracing::debug!(error = %e, "the engine is back: the image is asked again");
            }
            other => break other,
        }
    };
    if let Err(e) = &first
        && e.is_not_found()
        && let Some(why) = did_you_mean(shared, image, policy).await
    {
        return Err(unavailable(why, true, None));
    }
    match first {
        Ok(facts) => Ok(facts),
        Err(e) if e.is_not_found() && policy == PullPolicy::Never => Err(unavailable(
            "not found locally (`docker images` lists what this engine has), and the pull policy is never".into(),
            true,
            Some(e),
        )),
        Err(e) if e.is_not_found() => {
            let creds = auth().await?;
            let anonymous = creds.is_none();
            if let Err(pull) = pulled(creds).await {
                let mut why =
                    "not found locally (`docker images` lists what this engine has), and pulling it failed".to_owned();
                let said = crate::util::error_chain(&pull).to_ascii_lowercase();
                if anonymous && ["auth", "denied", "unauthorized"].iter().any(|w| said.contains(w)) {
                    let registry = crate::engine::credentials::registry_of(image);
                    let failed = helper_failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
                    why = match failed {
                        Some(e) => format!("{why} with no credentials ({e})"),
                        None => format!(
                            "{why} with no credentials (none for {registry} in the docker config: `docker login {registry}`)"
                        ),
                    };
                }
                return Err(unavailable(why, false, Some(pull)));
            }
            api.inspect_image(image).await.map_err(|e| unavailable("pulled, then not found".into(), false, Some(e)))
        }
        Err(e) => Err(LaunchError::Engine(e)),
    }
}
