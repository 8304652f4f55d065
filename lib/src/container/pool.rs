//! The warm pool (opt-in, `ContainerConfig::pool`): containers of kind `pool` created AND
//! started ahead of demand, each with its own empty input volume and a never-started staging
//! helper, stevedore's init parked waiting for its Start frame over the attach. An attempt
//! whose fixed settings match claims one: its limits are applied with `docker update`, its
//! inputs uploaded through the helper (the container's `/in` stays read-only), and it runs
//! exactly ONE attempt, then it is removed like any attempt's container. The pool refills in
//! the background (on the rung's tracked tasks) and is drained by `close`. Its objects are in
//! the in-flight set, so this process's own `reclaim` never eats its live pool.

use super::cleanup::Leftovers;
use super::labels::{AttemptLabels, Kind, Owner};
use super::launch::Ready;
use super::prepare::Plan;
use super::site::{ContainerSite, Parked, Pool, Template};
use super::sizes;
use super::spec;
use crate::contract::{InputsStaged, LaunchError, ResourceLimits};
use bollard::models::VolumeCreateRequest;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use stevedore_init::wire::IN_DIR;

/// How the rung keeps containers warm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Containers kept parked (bounded; 0 disables the pool).
    pub size: usize,
    /// The worker whose labels the parked containers carry (its `reclaim` removes what a
    /// crashed process left parked).
    pub worker: String,
    /// The image the parked containers run (default: the rung's worker image).
    pub image: Option<String>,
}

impl PoolConfig {
    /// A pool of `size` containers for `worker`.
    pub fn new(size: usize, worker: impl Into<String>) -> Self {
        Self { size, worker: worker.into(), image: None }
    }

    /// Parks containers of `image` instead of the worker image.
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.image = Some(image.into());
        self
    }
}

/// What the pool says to an attempt.
#[derive(Debug)]
pub(crate) enum Claim {
    /// The rung has no pool.
    None,
    /// A parked container is the attempt's.
    Hit(Box<Parked>),
    /// The pool could not serve it, and why.
    Miss(String),
}

impl Pool {
    pub(super) fn parked(&self) -> std::sync::MutexGuard<'_, VecDeque<Parked>> {
        self.parked.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn config(shared: &ContainerSite) -> Option<&PoolConfig> {
    shared.config.pool.as_ref().filter(|p| p.size > 0)
}

fn template_of(shared: &ContainerSite) -> Option<Template> {
    let pc = config(shared)?;
    let image = pc.image.clone().or_else(|| shared.config.worker_image.clone())?;
    Some(Template { image, applied: sizes::of(&ResourceLimits::new(), &shared.config) })
}

/// Why `plan` cannot run in a parked container, if it cannot: everything fixed at create
/// must match; what the engine can change (memory, CPU, pids) is applied at claim.
fn misfit(t: &Template, plan: &Plan, shared: &ContainerSite) -> Option<String> {
    let a = &plan.applied;
    let differs = |what: &str, want: u64, have: u64| {
        (want != have).then(|| format!("{what} {want} differs from the pool's {have} (fixed at create)"))
    };
    if plan.image_ref != t.image {
        return Some(format!("image {} is not the pool's {}", plan.image_ref, t.image));
    }
    if !shared.config.caches.is_empty() {
        return Some("named caches are mounted at create".into());
    }
    if a.gpus.is_some() {
        return Some("GPUs are requested at create".into());
    }
    differs("disk", a.disk, t.applied.disk)
        .or_else(|| differs("/tmp size", a.tmp, t.applied.tmp))
        .or_else(|| differs("nofile", a.nofile, t.applied.nofile))
}

/// Takes a parked container for `plan`, if the rung has a pool and one fits; starts a
/// refill either way.
pub(crate) fn claim(shared: &Arc<ContainerSite>, plan: &Plan) -> Claim {
    let Some(pool) = &shared.pool else { return Claim::None };
    let Some(t) = pool.template.get().cloned().or_else(|| template_of(shared)) else { return Claim::None };
    let claimed = match misfit(&t, plan, shared) {
        Some(why) => Claim::Miss(why),
        None => match pool.parked().pop_front() {
            Some(p) => Claim::Hit(Box::new(p)),
            None => Claim::Miss("the pool was empty (refilling)".into()),
        },
    };
    refill(shared);
    claimed
}

/// A claimed container made the attempt's: its limits, its inputs, its objects in the
/// attempt's leftovers.
pub(crate) async fn ready(
    shared: &Arc<ContainerSite>,
    plan: &mut Plan,
    left: &mut Leftovers,
    p: Parked,
) -> Result<Ready, LaunchError> {
    left.container(p.name.clone());
    left.container(p.helper.clone());
    left.volume(p.input_volume.clone());
    let a = &plan.applied;
    let t = &shared.pool.as_ref().and_then(|pool| pool.template.get()).expect("a claim means a template").applied;
    // The engine changes a running container's limits; the call is skipped when they are
    // the ones the container was made with.
    if (a.memory, a.cpu_millis, a.pids) != (t.memory, t.cpu_millis, t.pids) {
        let cpus = a.cpu_millis.map(|m| m.saturating_mul(1_000_000));
        shared.engine.api.update(&p.name, a.memory, cpus, a.pids).await?;
    }
    let mut enforcement = p.enforcement;
    enforcement.insert("memory".into(), format!("cgroup memory limit {} bytes, swap off (as claimed)", a.memory));
    enforcement.insert("pids".into(), format!("cgroup pids limit {} (as claimed)", a.pids));
    let mut skipped = p.skipped;
    match a.cpu_millis {
        Some(m) => {
            enforcement.insert("cpu".into(), format!("cfs quota of {m} millicores (as claimed)"));
            skipped.remove("cpu");
        }
        None => {
            enforcement.remove("cpu");
            skipped.insert("cpu".into(), "no cpu limit requested or configured".into());
        }
    }
    let mut inputs = None;
    let mut staged_at = None;
    if let Some((dir, staged)) = plan.inputs.take() {
        let report = super::launch::upload_inputs(shared, &p.helper, dir, staged.bytes, plan.progress.clone()).await?;
        inputs = Some(InputsStaged { skipped: report.skipped, sparse: report.sparse, ..staged });
        staged_at = Some(crate::contract::unix_ms_now());
        enforcement
            .insert("inputs_read_only".into(), format!("volume {} mounted read-only at {IN_DIR}", p.input_volume));
    }
    tracing::debug!(parked_for = ?p.parked_at.elapsed(), "claimed a parked container");
    Ok(Ready {
        container_id: p.container_id,
        attached: p.attached,
        running: true,
        enforcement,
        skipped,
        tools: p.tools,
        inputs,
        caches: Vec::new(),
        warm: Some(true),
        staged_at,
    })
}

/// Starts as many fills as the pool lacks.
pub(crate) fn refill(shared: &Arc<ContainerSite>) {
    let (Some(pool), Some(pc)) = (&shared.pool, config(shared)) else { return };
    loop {
        if pool.closed.load(Ordering::SeqCst) || shared.base.tracker.is_closed() {
            return;
        }
        let have = pool.parked().len() + pool.filling.load(Ordering::SeqCst);
        if have >= pc.size {
            return;
        }
        pool.filling.fetch_add(1, Ordering::SeqCst);
        let s = shared.clone();
        shared.base.tracker.spawn(async move {
            let made = fill_one(&s).await;
            let pool = s.pool.as_ref().expect("a pool");
            pool.filling.fetch_sub(1, Ordering::SeqCst);
            match made {
                Ok(p) if !pool.closed.load(Ordering::SeqCst) => pool.parked().push_back(p),
                Ok(p) => discard(&s, p).await,
                Err(e) => tracing::warn!(error = %crate::util::error_chain(&e), "filling the warm pool failed"),
            }
        });
    }
}

/// Makes one parked container; on failure removes what it made.
/// The settings every parked container is made with, fixed by the first fill.
async fn template(shared: &ContainerSite, pool: &Pool) -> Result<Template, LaunchError> {
    if let Some(t) = pool.template.get() {
        return Ok(t.clone());
    }
    let t = template_of(shared)
        .ok_or_else(|| LaunchError::NotAllowed("the warm pool needs an image (pool.image or worker_image)".into()))?;
    // The image must exist before anything is parked on it.
    super::prepare::resolve_image(shared, &t.image).await?;
    Ok(pool.template.get_or_init(|| async { t }).await.clone())
}

async fn fill_one(shared: &Arc<ContainerSite>) -> Result<Parked, LaunchError> {
    let pool = shared.pool.as_ref().expect("a pool");
    let t = template(shared, pool).await?;
    let pc = config(shared).expect("a pool");
    let cfg = &shared.config;
    let image = super::prepare::resolve_image(shared, &t.image).await?;
    let attempt_id: String = (0..6).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
    let name = format!("sd-{}-{attempt_id}", &pc.worker[..pc.worker.len().min(40)]);
    let owner = Owner { worker: &pc.worker, incarnation: &shared.base.incarnation, executor: &cfg.name };
    let l = AttemptLabels { owner, attempt_id: &attempt_id, job: None, app: None, org: None, extra: &cfg.labels };
    // Nothing is parked on an image that would move its mounts.
    let dests = super::mounts::destinations(true, &[], &spec::masked_volumes(&image.volumes, &[]));
    let probe = format!("{name}-probe");
    if let Some(r) = super::mounts::check(shared, &image.id, probe, l.for_kind(Kind::Pool, "probe"), &dests).await? {
        return Err(LaunchError::NotAllowed(r.explain(&t.image)));
    }
    let tools = super::launch::tools_volume(shared, &t.image).await?;
    shared.base.in_flight().insert(attempt_id.clone());
    let mut left = Leftovers::default();
    let made = async {
        let input_volume = format!("{name}-in");
        let helper = format!("{name}-stage");
        let api = &shared.engine.api;
        left.volume(input_volume.clone());
        api.create_volume(VolumeCreateRequest {
            name: Some(input_volume.clone()),
            driver: Some("local".into()),
            labels: Some(l.for_kind(Kind::Pool, "in")),
            ..Default::default()
        })
        .await?;
        left.container(helper.clone());
        api.create_container(&helper, spec::staging_helper(&t.image, &input_volume, l.for_kind(Kind::Pool, "stage")))
            .await?;
        let facts = shared.engine.facts();
        let spec::Spec { body, enforcement, skipped } = spec::build(&spec::SpecInput {
            config: cfg,
            image: &t.image,
            tools: &tools,
            labels: l.for_kind(Kind::Pool, "container"),
            input_volume: Some(&input_volume),
            applied: &t.applied,
            image_volumes: &image.volumes,
            engine_seccomp: facts.seccomp(),
            podman: facts.is_podman(),
            publish_ip: if shared.engine.endpoint().is_local() { "127.0.0.1" } else { "0.0.0.0" },
            caches: &[],
        });
        left.container(name.clone());
        let container_id = api.create_container(&name, body).await?;
        let attached = api.attach(&name).await?;
        api.start(&name).await?;
        Ok::<_, LaunchError>(Parked {
            attempt_id: attempt_id.clone(),
            name: name.clone(),
            container_id,
            attached,
            input_volume,
            helper,
            parked_at: Instant::now(),
            enforcement,
            skipped,
            tools,
        })
    }
    .await;
    if made.is_err() {
        shared.tools_suspect().await;
        remove(shared, &left.containers, &left.volumes).await;
        shared.base.in_flight().remove(&attempt_id);
    }
    made
}

async fn remove(shared: &ContainerSite, containers: &[String], volumes: &[String]) {
    for c in containers.iter().rev() {
        let _ = shared.engine.api.remove_container(c).await;
    }
    for v in volumes {
        let _ = shared.engine.api.remove_volume(v).await;
    }
}

async fn discard(shared: &ContainerSite, p: Parked) {
    drop(p.attached);
    remove(shared, &[p.helper.clone(), p.name.clone()], std::slice::from_ref(&p.input_volume)).await;
    shared.base.in_flight().remove(&p.attempt_id);
}

/// Stops refilling and removes every parked container (awaited by `close`).
pub(crate) async fn drain(shared: &ContainerSite) {
    let Some(pool) = &shared.pool else { return };
    pool.closed.store(true, Ordering::SeqCst);
    let parked: Vec<Parked> = pool.parked().drain(..).collect();
    for p in parked {
        discard(shared, p).await;
    }
}

/// How many containers are parked now (tests, benchmarks).
pub(crate) fn parked(shared: &ContainerSite) -> usize {
    shared.pool.as_ref().map_or(0, |p| p.parked().len())
}

/// Waits until the pool is full, or `within` passes; whether it is full.
pub(crate) async fn wait_full(shared: &Arc<ContainerSite>, within: Duration) -> bool {
    let Some(pc) = config(shared) else { return false };
    refill(shared);
    let until = Instant::now() + within;
    while parked(shared) < pc.size {
        if Instant::now() >= until {
            return false;
        }
        // The fills run on the rung's tasks; nothing to wait on but their result.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}
