//! The warm pool (opt-in, `ContainerConfig::pool`): containers of kind `pool` created AND
//! started ahead of demand, each with its own empty input volume, stevedore's init parked
//! waiting for its Start frame over the attach. An attempt of the pool's image claims one of
//! its size class: its memory, CPU and pids are applied with `docker update`, its inputs
//! staged through the archive API, and it runs exactly ONE attempt, then it is removed like
//! any attempt's container. Its objects are in the in-flight set, so this process's own
//! `reclaim` never eats its live pool; `close` drains it.
//!
//! Invariants:
//! - A size class is what the engine fixes at create (`/out`'s and `/tmp`'s tmpfs sizes,
//!   nofile): an attempt runs only in a container of its own class, so its disk and `/tmp`
//!   limits are enforced exactly as on the cold path.
//! - Every container taken is replaced by one fill of its class, started once its attempt
//!   is ready (its inputs staged: the fill's engine calls never meet the attempt's upload);
//!   a miss asks for one where the pool has room or lacks the class. The pool follows what
//!   the attempts ask for and turns over once per warm attempt. It holds at most `size`
//!   containers; a fill for a class it lacks evicts the longest-parked of another class.
//! - At most `max_filling` fills run at once, each started when one ends: a burst of claims
//!   never becomes a burst of creates in front of the attempts that caused it.
//! - A parked container holds its memory limit of the rung's budget while the budget is
//!   free; an attempt the budget cannot admit takes it back (`yield_budget`), and a fill
//!   waits for budget rather than taking an attempt's.
//! - Where the inputs may travel over the link (`stage::not_over_link`), a parked container's
//!   init runs as uid 0 holding only `SETUID`, `SETGID` and `SETPCAP`, and takes nothing but
//!   the host's frames while it waits. A claim always begins with a `Stage` frame: the init
//!   checks it is alone in the sandbox (a process started in it before the claim, by an
//!   `exec` or anything else, has the container discarded and the attempt served cold) and
//!   that its staging mount (`wire::STAGE_DIR`, the input volume writable) is root's, empty
//!   and on `/in`'s device, then writes the inputs it is sent and drops to the sandbox user
//!   before the command. Inputs above `link_inputs_max_bytes` go through the archive API into
//!   the staging mount after the checks, root's entries without write bits. Elsewhere (root
//!   in the sandbox, an engine that ignores `NoCopy`) a never-started helper stages them, as
//!   on the cold path.

use super::cleanup::Leftovers;
use super::labels::{AttemptLabels, Kind, Owner};
use super::prepare::Plan;
use super::site::{ContainerSite, Parked, Pool};
use super::site::{PoolStats, Ready};
use super::sizes::{self, Sizes};
use super::spec;
use super::stage::UploadTo;
use crate::contract::{InputsStaged, LaunchError, ResourceLimits};
use crate::link::stage::NotStaged;
use bollard::models::VolumeCreateRequest;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use stevedore_init::wire::{IN_DIR, STAGE_DIR};

/// How the rung keeps containers warm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Containers kept parked at most, across size classes (0 disables the pool).
    pub size: usize,
    /// The worker whose labels the parked containers carry (its `reclaim` removes what a
    /// crashed process left parked).
    pub worker: String,
    /// The image the parked containers run (default: the rung's worker image).
    pub image: Option<String>,
    /// Fills under way at most at once (default 2): the engine makes them beside the
    /// attempts, and more at once only slows both.
    pub max_filling: usize,
    /// Whether a parked container's init reads ahead the programs the pool's last attempts
    /// ran (default on, `init/src/warm.rs`): on an engine whose image root is served by a
    /// FUSE daemon (fuse-overlayfs) it takes their lookups and first reads off the claim.
    /// A later attempt can tell by timing which of the image's programs recent ones ran: off
    /// where attempts of one pool must not learn even that of each other.
    pub read_ahead: bool,
}

impl PoolConfig {
    /// A pool of `size` containers for `worker`.
    pub fn new(size: usize, worker: impl Into<String>) -> Self {
        Self { size, worker: worker.into(), image: None, max_filling: 2, read_ahead: true }
    }

    /// Parks containers of `image` instead of the worker image.
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.image = Some(image.into());
        self
    }

    /// Whether parked inits read ahead what the last attempts ran (see [`PoolConfig::read_ahead`]).
    pub fn read_ahead(mut self, on: bool) -> Self {
        self.read_ahead = on;
        self
    }

    /// At most `n` fills at once (at least 1).
    pub fn max_filling(mut self, n: usize) -> Self {
        self.max_filling = n.max(1);
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

/// What the engine fixes at create: an attempt runs only in a container of its own class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Class {
    disk: u64,
    tmp: u64,
    nofile: u64,
}

impl Class {
    fn of(s: &Sizes) -> Self {
        Self { disk: s.disk, tmp: s.tmp, nofile: s.nofile }
    }

    fn describe(&self) -> String {
        format!("/out {} bytes, /tmp {} bytes, nofile {}", self.disk, self.tmp, self.nofile)
    }
}

impl Pool {
    pub(super) fn parked(&self) -> std::sync::MutexGuard<'_, VecDeque<Parked>> {
        self.parked.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn wanted(&self) -> std::sync::MutexGuard<'_, VecDeque<Sizes>> {
        self.wanted.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, PoolStats> {
        self.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, super::site::Objects>> {
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn config(shared: &ContainerSite) -> Option<&PoolConfig> {
    shared.config.pool.as_ref().filter(|p| p.size > 0)
}

/// The image the pool parks, as configured.
fn image_of(shared: &ContainerSite) -> Option<String> {
    config(shared)?.image.clone().or_else(|| shared.config.worker_image.clone())
}

/// Whether parked containers take their inputs over the link (`stage::not_over_link`).
fn stages_directly(shared: &ContainerSite) -> bool {
    super::stage::not_over_link(shared, None).is_none()
}

/// Why `plan` cannot run in any parked container, if it cannot: what no class changes.
fn misfit(image: &str, plan: &Plan, shared: &ContainerSite) -> Option<String> {
    if plan.image_ref != image {
        return Some(format!("image {} is not the pool's {image}", plan.image_ref));
    }
    if !shared.config.caches.is_empty() {
        return Some("named caches are mounted at create".into());
    }
    if plan.applied.gpus.is_some() {
        return Some("GPUs are requested at create".into());
    }
    None
}

/// The pool's first fills: `size` of the class of a request that sets no limit.
pub(crate) fn start(shared: &Arc<ContainerSite>) {
    let (Some(pool), Some(pc)) = (&shared.pool, config(shared)) else { return };
    let default = sizes::of(&ResourceLimits::new(), &shared.config);
    pool.wanted().extend(std::iter::repeat_n(default, pc.size));
    refill(shared);
}

/// Takes a parked container of `plan`'s class, if the rung has a pool and one is parked;
/// either way asks for one fill of that class.
pub(crate) fn claim(shared: &Arc<ContainerSite>, plan: &Plan) -> Claim {
    let (Some(pool), Some(pc)) = (&shared.pool, config(shared)) else { return Claim::None };
    let Some(image) = image_of(shared) else { return Claim::None };
    if let Some(why) = misfit(&image, plan, shared) {
        pool.stats().misses += 1;
        return Claim::Miss(why);
    }
    let class = Class::of(&plan.applied);
    let mut wanted = pool.wanted();
    let mut parked = pool.parked();
    let hit = parked.iter().position(|p| Class::of(&p.sizes) == class).and_then(|i| parked.remove(i));
    let empty = parked.is_empty();
    // A container taken is replaced by one of its class; a miss asks for one only where the
    // pool has room, or lacks the class altogether (its fill then evicts another class).
    let room = parked.len() + pool.filling.load(Ordering::SeqCst) + wanted.len() < pc.size;
    let lacked = !parked.iter().any(|p| Class::of(&p.sizes) == class) && !wanted.iter().any(|s| Class::of(s) == class);
    if hit.is_some() || room || lacked {
        wanted.push_back(plan.applied.clone());
        while wanted.len() > pc.size {
            wanted.pop_front();
        }
    }
    drop((parked, wanted));
    // A hit's refill waits until its attempt is ready (`ready`): the fill's creates and
    // start would otherwise meet the attempt's own input upload in the engine.
    if hit.is_none() {
        refill(shared);
    }
    let mut stats = pool.stats();
    match hit {
        Some(p) => {
            stats.hits += 1;
            Claim::Hit(Box::new(p))
        }
        None => {
            stats.misses += 1;
            Claim::Miss(if empty {
                "the pool was empty (refilling)".into()
            } else {
                format!("no parked container of its size class ({}): one is being made", class.describe())
            })
        }
    }
}

/// A claimed container made the attempt's: its limits, its inputs, its objects in the
/// attempt's leftovers. `Ok(Err(why))`: its init refused the claim (the sandbox was not what
/// it must be); the caller removes it with the attempt's leftovers and runs the attempt cold.
pub(crate) async fn ready(
    shared: &Arc<ContainerSite>,
    plan: &mut Plan,
    left: &mut Leftovers,
    p: Parked,
) -> Result<Result<Ready, String>, LaunchError> {
    let made = made_ready(shared, plan, left, p).await;
    // The claim's refill, now that the attempt asks nothing more of the engine.
    refill(shared);
    made
}

async fn made_ready(
    shared: &Arc<ContainerSite>,
    plan: &mut Plan,
    left: &mut Leftovers,
    mut p: Parked,
) -> Result<Result<Ready, String>, LaunchError> {
    left.container(p.name.clone());
    if let Some(h) = &p.helper {
        left.container(h.clone());
    }
    left.volume(p.input_volume.clone());
    // The attempt holds its own share of the budget (admission).
    drop(p.budget.take());
    let mut transport = super::launch::transport(p.attached);
    let (mut enforcement, mut skipped) = (p.enforcement, p.skipped);
    let mut credentials = None;
    let mut inputs = None;
    if p.helper.is_none() {
        // The init checks its sandbox before anything else of the attempt happens in it.
        let cfg = &shared.config;
        let small = plan.inputs.as_ref().filter(|(_, s)| s.bytes <= cfg.link_inputs_max_bytes);
        let bytes = small.map_or(0, |(_, s)| s.bytes);
        let within = shared.engine.timeout() + Duration::from_secs(bytes / super::stage::SLOWEST_UPLOAD);
        let limit = cfg.link_inputs_max_bytes.min(cfg.max_input_bytes);
        let sent = small.map(|(d, s)| (d, s));
        match crate::link::stage::over_link(
            &mut transport,
            crate::link::stage::Staging { stage_dir: STAGE_DIR, in_dir: IN_DIR, tighten: false },
            sent,
            limit,
            within,
            plan.progress.clone(),
        )
        .await
        {
            Ok(Some(staged)) => {
                plan.inputs = None;
                inputs = Some(staged);
                enforcement.insert("inputs_staging".into(), super::stage::over_link_evidence(&p.input_volume));
            }
            Ok(None) => {}
            Err(NotStaged::Failed(e)) => return Err(e),
            Err(NotStaged::Refused(why)) => return Ok(Err(why)),
        }
        credentials = super::stage::credentials(shared);
    }
    let a = &plan.applied;
    let t = &p.sizes;
    // The engine changes a running container's limits; the call is skipped when they are
    // the ones the container was made with.
    let reserve = shared.config.link.delivery_reserve;
    if (a.memory, a.cpu_millis, a.pids) != (t.memory, t.cpu_millis, t.pids) {
        let cpus = a.cpu_millis.map(|m| m.saturating_mul(1_000_000));
        shared.engine.api.update(&p.name, a.memory.saturating_add(reserve), cpus, a.pids).await?;
    }
    spec::cgroup_limits_evidence(a, reserve, true, &mut enforcement, &mut skipped);
    let mut staged_at = inputs.as_ref().map(|_| crate::contract::unix_ms_now());
    if let Some((dir, staged)) = plan.inputs.take() {
        let (to, how) = match &p.helper {
            Some(h) => (
                UploadTo::helper(shared, h),
                super::stage::through_engine_evidence(
                    &p.input_volume,
                    &super::stage::not_over_link(shared, None).unwrap_or_default(),
                ),
            ),
            None => (
                UploadTo { container: &p.name, path: STAGE_DIR, owners: crate::inputs::Owners::RootReadOnly },
                format!(
                    "volume {} mounted read-only at {IN_DIR}; uploaded through the engine's archive API at \
                     {STAGE_DIR} once the init found the mount root's and empty: root's entries without write \
                     bits, beyond the reach of the sandbox user (not over the link: {} bytes, above \
                     link_inputs_max_bytes)",
                    p.input_volume, staged.bytes
                ),
            ),
        };
        let report = super::stage::upload_inputs(shared, to, dir, staged.bytes, plan.progress.clone()).await?;
        inputs =
            Some(InputsStaged { skipped: report.skipped, sparse: report.sparse, tree: Some(report.tree), ..staged });
        staged_at = Some(crate::contract::unix_ms_now());
        enforcement.insert("inputs_staging".into(), how);
    }
    tracing::debug!(parked_for = ?p.parked_at.elapsed(), "claimed a parked container");
    Ok(Ok(Ready {
        container_id: p.container_id,
        transport,
        running: true,
        enforcement,
        skipped,
        tools: p.tools,
        inputs,
        caches: Vec::new(),
        warm: Some(true),
        staged_at,
        credentials,
    }))
}

/// Starts the fills asked for, as many as `max_filling` allows; each fill that ends starts
/// the next.
pub(crate) fn refill(shared: &Arc<ContainerSite>) {
    let (Some(pool), Some(pc)) = (&shared.pool, config(shared)) else { return };
    loop {
        if pool.closed.load(Ordering::SeqCst) || shared.base.tracker.is_closed() {
            return;
        }
        // One decision at a time: the fill asked for longest ago, if there is room and budget.
        let mut wanted = pool.wanted();
        let filling = pool.filling.load(Ordering::SeqCst);
        if filling >= pc.max_filling {
            return;
        }
        let Some(sizes) = wanted.front().cloned() else { return };
        let class = Class::of(&sizes);
        let mut parked = pool.parked();
        // Full: room for this class is made by the longest-parked of another.
        let evict = match parked.len() + filling < pc.size {
            true => None,
            false => match parked.iter().position(|p| Class::of(&p.sizes) != class) {
                Some(i) => Some(i),
                None => {
                    // Full of this class already.
                    wanted.pop_front();
                    continue;
                }
            },
        };
        let mib = u32::try_from(sizes.memory.saturating_add(shared.config.link.delivery_reserve).div_ceil(1 << 20))
            .unwrap_or(u32::MAX);
        // Budget the attempts leave free, or no fill now: the ask stays, for the next end.
        let Ok(budget) = shared.budget.clone().try_acquire_many_owned(mib) else {
            tracing::debug!(mib, "no memory budget free for a parked container: the pool waits");
            return;
        };
        wanted.pop_front();
        if let Some(p) = evict.and_then(|i| parked.remove(i)) {
            pool.stats().evicted += 1;
            let s = shared.clone();
            shared.base.tracker.spawn(async move { discard(&s, p).await });
        }
        drop(parked);
        let now = pool.filling.fetch_add(1, Ordering::SeqCst) + 1;
        drop(wanted);
        {
            let mut stats = pool.stats();
            stats.fills_started += 1;
            stats.most_filling = stats.most_filling.max(now);
        }
        let s = shared.clone();
        shared.base.tracker.spawn(async move {
            let made = fill_one(&s, sizes).await;
            let pool = s.pool.as_ref().expect("a pool");
            match made {
                Ok(mut p) if !pool.closed.load(Ordering::SeqCst) => {
                    p.budget = Some(budget);
                    // Parked: the backstop finds it there now.
                    let mut parked = pool.parked();
                    pool.pending().remove(&p.attempt_id);
                    parked.push_back(p);
                }
                Ok(p) => discard(&s, p).await,
                Err(e) => {
                    pool.stats().fills_failed += 1;
                    tracing::warn!(error = %crate::util::error_chain(&e), "filling the warm pool failed");
                }
            }
            pool.filling.fetch_sub(1, Ordering::SeqCst);
            refill(&s);
        });
    }
}

/// Takes back budget parked containers hold, longest-parked first, until `mib` of it is
/// free or none holds any: an attempt comes before a container waiting for one.
pub(crate) fn yield_budget(shared: &ContainerSite, mib: u32) {
    let Some(pool) = &shared.pool else { return };
    let mut parked = pool.parked();
    for p in parked.iter_mut() {
        if shared.budget.available_permits() >= mib as usize {
            return;
        }
        drop(p.budget.take());
    }
}

/// The image the pool parks, checked to exist once.
async fn pool_image(shared: &ContainerSite, pool: &Pool) -> Result<String, LaunchError> {
    let image = image_of(shared)
        .ok_or_else(|| LaunchError::NotAllowed("the warm pool needs an image (pool.image or worker_image)".into()))?;
    pool.image
        .get_or_try_init(|| async {
            super::prepare::resolve_image(shared, &image).await?;
            Ok::<_, LaunchError>(image.clone())
        })
        .await
        .cloned()
}

/// Makes one parked container of `sizes`; on failure removes what it made.
async fn fill_one(shared: &Arc<ContainerSite>, sizes: Sizes) -> Result<Parked, LaunchError> {
    let pool = shared.pool.as_ref().expect("a pool");
    let image_ref = pool_image(shared, pool).await?;
    let pc = config(shared).expect("a pool");
    let cfg = &shared.config;
    let image = super::prepare::resolve_image(shared, &image_ref).await?;
    let attempt_id = crate::util::random_hex(6);
    let name = format!("sd-{}-{attempt_id}", &pc.worker[..pc.worker.len().min(40)]);
    let owner = Owner { worker: &pc.worker, incarnation: &shared.base.incarnation, executor: &cfg.name };
    let l = AttemptLabels { owner, attempt_id: &attempt_id, job: None, app: None, org: None, extra: &cfg.labels };
    let stage = stages_directly(shared);
    // Nothing is parked on an image that would move its mounts.
    if let Some((volume, mount)) = spec::nested_volume(&image.volumes, &[]) {
        return Err(LaunchError::ImageVolume { image: image_ref, volume, mount });
    }
    let mut dests = super::mounts::destinations(true, &[], &spec::masked_volumes(&image.volumes, &[]));
    if stage {
        dests.push(STAGE_DIR.to_owned());
    }
    let probe = format!("{name}-probe");
    let image_id = if image.id.is_empty() { image_ref.clone() } else { image.id.clone() };
    if let Some(r) = super::mounts::check(shared, &image_id, probe, l.for_kind(Kind::Pool, "probe"), &dests).await? {
        return Err(LaunchError::NotAllowed(r.explain(&image_ref)));
    }
    let tools = super::tools::tools_volume(shared, &image_ref).await?;
    shared.base.in_flight().insert(attempt_id.clone());
    let mut left = Leftovers::default();
    let input_volume = format!("{name}-in");
    let helper = (!stage).then(|| format!("{name}-stage"));
    let containers = helper.iter().cloned().chain([name.clone()]).collect();
    pool.pending().insert(attempt_id.clone(), (containers, vec![input_volume.clone()]));
    let made = async {
        let api = &shared.engine.api;
        left.volume(input_volume.clone());
        api.create_volume(VolumeCreateRequest {
            name: Some(input_volume.clone()),
            driver: Some("local".into()),
            labels: Some(l.for_kind(Kind::Pool, "in")),
            ..Default::default()
        })
        .await?;
        if let Some(helper) = &helper {
            left.container(helper.clone());
            let body = spec::staging_helper(&image_ref, &input_volume, l.for_kind(Kind::Pool, "stage"));
            api.create_container(helper, body).await?;
        }
        let facts = shared.engine.facts();
        let spec::Spec { body, enforcement, skipped } = spec::build(&spec::SpecInput {
            config: cfg,
            image: &image_ref,
            tools: &tools,
            labels: l.for_kind(Kind::Pool, "container"),
            input_volume: Some(&input_volume),
            stage,
            applied: &sizes,
            image_volumes: &image.volumes,
            engine_seccomp: facts.seccomp(),
            podman: facts.is_podman(),
            publish_ip: if shared.engine.endpoint().is_local() { "127.0.0.1" } else { "0.0.0.0" },
            caches: &[],
            warm: warm_env(shared, pool, stage).as_deref(),
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
            input_volume: input_volume.clone(),
            helper: helper.clone(),
            sizes: sizes.clone(),
            budget: None,
            parked_at: Instant::now(),
            enforcement,
            skipped,
            tools: tools.clone(),
        })
    }
    .await;
    if let Err(e) = &made {
        super::tools::host_tools_refused(shared, &tools, e);
        shared.tools_suspect().await;
        remove(shared, &left.containers, &left.volumes).await;
        shared.base.in_flight().remove(&attempt_id);
        pool.pending().remove(&attempt_id);
    }
    made
}

/// The most recent distinct programs of each kind a parked init warms (`Hints`).
const HINTS_KEPT: usize = 4;

/// Where an attempt's own mounts are: nothing there is a file a fresh container's image holds
/// (a cache's or a masked volume's path only misses in the next container, harmlessly).
const NOT_THE_IMAGE: [&str; 7] = ["/in", "/out", "/tmp", "/dev", "/proc", "/sys", "/.stevedore"];

/// Keeps what an attempt of the pool's image ran (its init's record: the program's name as
/// given and the file it resolved to) for the next fills. A file under one of the attempt's
/// mounts is not the image's, so it is left out.
pub(crate) fn learn(shared: &ContainerSite, image_ref: &str, name: Option<&str>, file: Option<&str>) {
    let Some(pool) = &shared.pool else { return };
    if image_of(shared).as_deref() != Some(image_ref) {
        return;
    }
    let mut h = pool.hints.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let keep = |list: &mut VecDeque<String>, v: &str| {
        list.retain(|x| x != v);
        list.push_front(v.to_owned());
        list.truncate(HINTS_KEPT);
    };
    if let Some(n) = name.filter(|n| stevedore_init::warm::valid_name(n)) {
        keep(&mut h.names, n);
    }
    if let Some(f) = file.filter(|f| of_the_image(f)) {
        keep(&mut h.files, f);
    }
}

/// Whether `f` can be a file of the image: absolute, and under none of an attempt's mounts.
fn of_the_image(f: &str) -> bool {
    stevedore_init::warm::valid_file(f)
        && !NOT_THE_IMAGE.iter().any(|m| f.strip_prefix(m).is_some_and(|r| r.is_empty() || r.starts_with('/')))
}

/// The init's read-ahead hints for a fill, as its environment carries them
/// ([`stevedore_init::wire::env::WARM`]: an argument would show them to later attempts in
/// `/proc/1/cmdline`), and for a root init the user it reads as (the sandbox's, numeric where
/// the inputs travel over the link: `stage::not_over_link`).
fn warm_env(shared: &ContainerSite, pool: &Pool, stage: bool) -> Option<String> {
    if !config(shared).is_some_and(|c| c.read_ahead) {
        return None;
    }
    let h = pool.hints.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut w = stevedore_init::warm::Warm {
        names: h.names.iter().cloned().collect(),
        files: h.files.iter().cloned().collect(),
        as_user: None,
    };
    if w.is_empty() {
        return None;
    }
    if stage {
        // A root init reads nothing of the image for itself.
        w.as_user = Some(shared.config.numeric_user().filter(|&(u, g)| u != 0 && g != 0)?);
    }
    Some(w.to_env())
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
    let containers: Vec<String> = p.helper.iter().cloned().chain([p.name.clone()]).collect();
    let pool = shared.pool.as_ref().expect("a pool");
    pool.pending().insert(p.attempt_id.clone(), (containers.clone(), vec![p.input_volume.clone()]));
    remove(shared, &containers, std::slice::from_ref(&p.input_volume)).await;
    shared.base.in_flight().remove(&p.attempt_id);
    pool.pending().remove(&p.attempt_id);
}

/// Stops refilling and removes every parked container (awaited by `close`).
pub(crate) async fn drain(shared: &ContainerSite) {
    let Some(pool) = &shared.pool else { return };
    pool.closed.store(true, Ordering::SeqCst);
    pool.wanted().clear();
    let parked: Vec<Parked> = pool.parked().drain(..).collect();
    for p in parked {
        discard(shared, p).await;
    }
}

/// How many containers are parked now (tests, benchmarks).
pub(crate) fn parked(shared: &ContainerSite) -> usize {
    shared.pool.as_ref().map_or(0, |p| p.parked().len())
}

/// What the pool did so far.
pub(crate) fn stats(shared: &ContainerSite) -> PoolStats {
    let Some(pool) = &shared.pool else { return PoolStats::default() };
    let mut s = pool.stats().clone();
    s.parked = pool.parked().len();
    s.filling = pool.filling.load(Ordering::SeqCst);
    s
}

/// Waits until the pool holds `size` parked containers, or `within` passes; whether it does.
pub(crate) async fn wait_full(shared: &Arc<ContainerSite>, within: Duration) -> bool {
    let (Some(pool), Some(pc)) = (&shared.pool, config(shared)) else { return false };
    // What failed fills lost is asked for again, of the class of a request without limits.
    let short = {
        let wanted = pool.wanted();
        pc.size.saturating_sub(pool.parked().len() + pool.filling.load(Ordering::SeqCst) + wanted.len())
    };
    if short > 0 {
        pool.wanted().extend(std::iter::repeat_n(sizes::of(&ResourceLimits::new(), &shared.config), short));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_of_the_image_are_read_ahead() {
        for f in ["/bin/busybox", "/usr/bin/python3", "/tmpfoo/x", "/output/bin", "/inbox"] {
            assert!(of_the_image(f), "{f}");
        }
        for f in [
            "/tmp/x",
            "/out/bin/tool",
            "/in/run.sh",
            "/proc/self/exe",
            "/dev/zero",
            "/sys/x",
            "/.stevedore/tools/stevedore-init",
            "/in",
            "bin/x",
            "/a/../tmp/x",
        ] {
            assert!(!of_the_image(f), "{f}");
        }
    }
}
