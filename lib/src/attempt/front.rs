//! The front half of an attempt, written once for every rung that runs the init: admission
//! (`Gate`: the tracker, the closed checks, validation, the network policy, the cancelled
//! check, the slot and, where the rung has one, its memory budget), then the rung's own
//! prepare and provision (`Launch`), then the shared back half (`attempt::run`). The rung's
//! `Executor` is this module's functions (`executor!`): a new rung implements `Site` and
//! `Launch`, and writes no admission of its own.
//!
//! Invariant: names no rung; one rule of admission for every rung (an attempt is refused
//! before it waits for anything when it is invalid, its network is not the rung's, or its
//! cancellation already came).

use super::site::{Provisioned, Site};
use crate::contract::{
    Checkpoint, HookSet, LaunchError, Level, Outcome, Phases, ReclaimError, ReclaimReport, RecoverError, Request,
};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// A rung's admission bounds: the attempts in flight, and the memory they may hold at once
/// where the rung has a budget.
#[derive(Debug)]
pub(crate) struct Gate {
    slots: Arc<Semaphore>,
    max_in_flight: usize,
    /// Wait for a slot (and budget), or refuse at once.
    wait: bool,
    budget: Option<Budget>,
}

/// A memory budget in MiB (the container rung's: 80 % of the engine host, shared with its warm
/// pool's parked containers).
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    pub permits: Arc<Semaphore>,
    pub mib: u32,
    /// What the budget is of, for the refusal.
    pub of: &'static str,
}

impl Gate {
    pub fn new(max_in_flight: usize, wait: bool, budget: Option<Budget>) -> Self {
        let max_in_flight = max_in_flight.clamp(1, Semaphore::MAX_PERMITS);
        Self { slots: Arc::new(Semaphore::new(max_in_flight)), max_in_flight, wait, budget }
    }

    /// No bound of its own (the process rung: its uid leases bound it, refusing at once).
    #[cfg(feature = "process")]
    pub fn unbounded() -> Self {
        Self::new(Semaphore::MAX_PERMITS, false, None)
    }

    /// A slot, and `mib` of the budget when the rung has one: waiting for them (until
    /// `cancel`), or refusing at once, as the rung is configured.
    async fn admit<S: Launch>(
        &self,
        site: &S,
        mib: u32,
        cancel: &CancellationToken,
    ) -> Result<(OwnedSemaphorePermit, Option<OwnedSemaphorePermit>), LaunchError> {
        let name = || site.rung().name.to_owned();
        let budget = self.budget.as_ref().map(|b| (b, mib));
        if let Some((b, mib)) = budget {
            if mib > b.mib {
                return Err(LaunchError::AdmissionRefused(format!(
                    "memory limit {mib} MiB exceeds the rung's budget of {} MiB ({})",
                    b.mib, b.of
                )));
            }
            site.make_room(mib);
        }
        let closed = |_| LaunchError::Closed(name());
        if self.wait {
            let take = async {
                let slot = self.slots.clone().acquire_owned().await.map_err(closed)?;
                let memory = match budget {
                    Some((b, mib)) => Some(b.permits.clone().acquire_many_owned(mib).await.map_err(closed)?),
                    None => None,
                };
                Ok((slot, memory))
            };
            return tokio::select! {
                taken = take => taken,
                _ = cancel.cancelled() => Err(LaunchError::CancelledBeforeStart),
            };
        }
        let full = || {
            let what = if budget.is_some() { " or memory budget used up" } else { "" };
            LaunchError::AdmissionRefused(format!("{} attempts in flight{what}", self.max_in_flight))
        };
        let slot = self.slots.clone().try_acquire_owned().map_err(|_| full())?;
        let memory = match budget {
            Some((b, mib)) => Some(b.permits.clone().try_acquire_many_owned(mib).map_err(|_| full())?),
            None => None,
        };
        Ok((slot, memory))
    }
}

/// What `Launch::prepare` decided.
#[derive(Debug)]
pub(crate) enum Prepared<P> {
    /// Everything is decided; nothing is made yet.
    Ready(P),
    /// The attempt is refused as its image is, with an Outcome (it never ran: `launch_failed`).
    /// Only the container rung sees an image's paths before it makes anything.
    #[cfg_attr(not(feature = "docker"), expect(dead_code))]
    Refused(Box<Outcome>),
}

/// A provisioned sandbox and when its inputs were staged (unix ms).
#[derive(Debug)]
pub(crate) struct Made<O> {
    pub prov: Provisioned<O>,
    pub staged_at: Option<u64>,
}

/// The front half of a rung that runs the init: what differs between rungs before the
/// shared attempt takes over (`Site` is the back half's).
pub(crate) trait Launch: Site + Send + Sync + Sized + 'static {
    /// The request's limits as the rung applies them.
    type Sizes: Send;
    /// What `prepare` decided.
    type Plan: Send + Sync;

    /// The rung's admission bounds.
    fn gate(&self) -> &Gate;
    /// Whether the rung's attempts have no network (`Executor::denies_network`).
    fn denies_network(&self) -> bool;
    /// What the rung applies to every attempt, by `Policy::require_enforced`'s names
    /// (`Executor::enforces`): its census, checked again per attempt against what it applied.
    fn enforces(&self) -> Vec<&'static str>;
    /// The request's limits, and the MiB of the rung's memory budget they take (ignored
    /// without a budget).
    fn sizes(&self, req: &Request) -> (Self::Sizes, u32);
    /// Frees budget held by what waits ahead of attempts (the warm pool's parked containers).
    fn make_room(&self, _mib: u32) {}
    /// Decides everything and makes nothing: a request this rung cannot run is refused here.
    fn prepare(
        &self,
        req: &Request,
        sizes: Self::Sizes,
    ) -> impl Future<Output = Result<Prepared<Self::Plan>, LaunchError>> + Send;
    /// Makes the sandbox. The teardown comes back whatever happened, holding everything made
    /// (each object recorded before the call that makes it): on `Err` it is removed.
    fn provision(
        &self,
        req: &Request,
        plan: &mut Self::Plan,
        cancel: &CancellationToken,
    ) -> impl Future<Output = (Self::Teardown, Result<Made<Self::Own>, LaunchError>)> + Send;
    /// What every rung decides, of the rung's own plan.
    fn decided(plan: &Self::Plan) -> &super::Decided;
    /// `Executor::reclaim`.
    fn reclaim(&self, worker: &str) -> impl Future<Output = Result<ReclaimReport, ReclaimError>> + Send;
    /// Before `close` waits for the attempts in flight (the warm pool stops filling).
    fn closing(&self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
    /// Once every attempt and task of the rung ended (its own objects removed).
    fn closed(&self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
    /// After a takeover ended, whatever came of it (`invalid`: the checkpoint was refused,
    /// and nothing may be touched).
    fn recovered(&self, _cp: &Checkpoint, _invalid: bool) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
}

/// `Executor::level` of a rung: its claim, but a `vm` claim only as an attempt showed it
/// (`contract::level_shown`: the kernel the init saw was not the host's); `sandboxed` until
/// one did ([`probe_level`] shows it at once).
pub(crate) fn level<S: Launch>(site: &S) -> Level {
    let rung = site.rung();
    match rung.level {
        Level::Vm => rung.base.shown().unwrap_or(Level::Sandboxed),
        claimed => claimed,
    }
}

/// `Executor::probe_level` of a rung: for a `vm` claim, one attempt in `image` whose command
/// is stevedore's init itself (the init reports the kernel it saw as it starts), whose shown
/// level is then the rung's.
pub(crate) async fn probe_level<S: Launch>(site: &S, image: &str) -> Result<Level, LaunchError> {
    if site.rung().level != Level::Vm {
        return Ok(level(site));
    }
    let scratch = std::env::temp_dir().join(format!("stevedore-probe-{:016x}", rand::random::<u64>()));
    // The init as every rung binds it in: any image will do.
    let init = format!("{}/{}", stevedore_init::wire::TOOLS_DIR, stevedore_init::wire::INIT_NAME);
    let argv = [init.as_str(), "report", "note", "level probe"];
    let mut req = Request::command(format!("probe-{:08x}", rand::random::<u32>()), argv, scratch.join("out"))
        .worker(format!("stevedore-probe-{:08x}", rand::random::<u32>()))
        .timeout(std::time::Duration::from_secs(120));
    req.policy.image = image.to_owned();
    let result = run(site, &req, CancellationToken::new()).await;
    let _ = std::fs::remove_dir_all(&scratch);
    // A probe leaves nothing: its captures go with it (their dir is the probe worker's own).
    let logs = result?.evidence.logs;
    for cap in [logs.stdout, logs.stderr] {
        if let Some(p) = cap.path {
            let _ = std::fs::remove_file(&p);
            if let Some(dir) = std::path::Path::new(&p).parent() {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
    Ok(level(site))
}

/// The Outcome of an attempt whose rung did not apply what the policy requires
/// (`Policy::require_enforced`): it never ran (`launch_failed`, `not_enforced`, permanent on
/// this rung), and the evidence has what was applied and why the rest was not.
fn not_enforced<S: Launch>(
    site: &S,
    req: &Request,
    started_ms: u64,
    enforcement: std::collections::BTreeMap<String, String>,
    skipped: std::collections::BTreeMap<String, String>,
    missing: &[(String, String)],
) -> Outcome {
    use crate::contract::{Evidence, Facts, Judgement, LaunchFailure, Source};
    let rung = site.rung();
    let said = missing.iter().map(|(k, why)| format!("{k} ({why})")).collect::<Vec<_>>().join("; ");
    let mut j = Judgement {
        facts: Facts { launch_failed: Some(LaunchFailure::NotEnforced), ..Facts::default() },
        error_text: format!("the policy requires what rung {} did not apply to this attempt: {said}", rung.name),
        permanent: true,
        evidence: Evidence {
            executor: rung.name.to_owned(),
            // Nothing ran, so nothing was shown (`contract::level_shown`).
            level: Some(crate::contract::level_shown(rung.level, None, None).0),
            incarnation: rung.base.incarnation.clone(),
            started_at_unix_ms: Some(started_ms),
            finished_at_unix_ms: Some(crate::contract::unix_ms_now()),
            enforcement,
            skipped,
            ..Evidence::default()
        },
        ..Judgement::default()
    };
    for figure in [&mut j.usage.sources.wall_time_ms, &mut j.usage.sources.cpu_time_ms] {
        *figure = Some(Source::unavailable("nothing ran"));
    }
    j.usage.sources.peak_memory_bytes = Some(Source::unavailable("nothing ran"));
    tracing::info!(missing = %said, "refused: the policy requires what the rung did not apply");
    crate::contract::judge(req, j)
}

/// `Executor::run` of a rung: admission, then the attempt.
///
/// # Cancellation safety
/// Dropping the future leaves nothing behind for long: everything made is in the
/// attempt's teardown, whose `Drop` hands the removals to the rung's tracked tasks.
pub(crate) async fn run<S: Launch>(site: &S, req: &Request, cancel: CancellationToken) -> Result<Outcome, LaunchError> {
    let rung = site.rung();
    // Held before the check: `close` either refuses this attempt or waits for it.
    let _token = rung.base.tracker.token();
    let closed = || LaunchError::Closed(rung.name.to_owned());
    if rung.base.tracker.is_closed() {
        return Err(closed());
    }
    // Refused before it waits for anything.
    req.validate()?;
    req.policy.admit_network(rung.name, site.denies_network())?;
    if cancel.is_cancelled() {
        return Err(LaunchError::CancelledBeforeStart);
    }
    let (sizes, mib) = site.sizes(req);
    let _permits = site.gate().admit(site, mib, &cancel).await?;
    if rung.base.tracker.is_closed() {
        return Err(closed());
    }
    attempt(site, req, sizes, cancel).instrument(super::span(req)).await
}

/// One admitted attempt: the rung's prepare and provision, then the shared attempt.
async fn attempt<S: Launch>(
    site: &S,
    req: &Request,
    sizes: S::Sizes,
    cancel: CancellationToken,
) -> Result<Outcome, LaunchError> {
    let mut plan = match site.prepare(req, sizes).await? {
        Prepared::Ready(p) => p,
        Prepared::Refused(o) => return Ok(*o),
    };
    let started_ms = S::decided(&plan).started_ms;
    let prepared_ms = super::since(started_ms);
    let (teardown, made) = site.provision(req, &mut plan, &cancel).await;
    let Made { prov, staged_at } = match made {
        Ok(m) => m,
        Err(e) => return Err(super::abandon(teardown, e).await),
    };
    // What the policy requires, against what the rung read back it applied: nothing has run.
    let missing = req.policy.not_enforced(&prov.enforcement, &prov.skipped);
    if !missing.is_empty() {
        let (enforcement, skipped) = (prov.enforcement.clone(), prov.skipped.clone());
        drop(prov);
        let removed = super::Teardown::remove(teardown).await;
        if !removed.errors.is_empty() {
            tracing::warn!(errors = ?removed.errors, "removing an attempt refused for what it lacked left some behind");
        }
        return Ok(not_enforced(site, req, started_ms, enforcement, skipped, &missing));
    }
    let phases = Phases {
        prepared_ms,
        inputs_staged_ms: staged_at.map(|t| t.saturating_sub(started_ms)),
        created_ms: super::since(started_ms),
        ..Phases::default()
    };
    let plan = super::Plan { decided: S::decided(&plan), phases };
    super::run(site, req, plan, prov, teardown, &cancel).await
}

/// `Executor::close` of a rung: new attempts refused, the ones in flight and the rung's tasks
/// waited for, then the rung's own release.
pub(crate) async fn close<S: Launch>(site: &S) {
    site.closing().await;
    let tracker = &site.rung().base.tracker;
    tracker.close();
    tracker.wait().await;
    site.closed().await;
}

/// `Executor::recover` of a rung.
pub(crate) async fn recover<S: Launch>(
    site: &S,
    cp: &Checkpoint,
    hooks: Option<HookSet>,
    cancel: CancellationToken,
) -> Result<Outcome, RecoverError> {
    let result = super::recover(site, cp, hooks, &cancel).await;
    site.recovered(cp, matches!(result, Err(RecoverError::Invalid(_)))).await;
    result
}

/// `Executor` for a rung's public type whose field `$site` is its `Launch`: every rung's face
/// is the functions above, written once.
macro_rules! executor {
    ($ty:ty, $site:ident) => {
        impl $crate::contract::Executor for $ty {
            fn name(&self) -> &str {
                $crate::attempt::Site::rung(&self.$site).name
            }

            fn level(&self) -> $crate::contract::Level {
                $crate::attempt::front::level(&self.$site)
            }

            fn probe_level<'a>(
                &'a self,
                image: &'a str,
            ) -> $crate::util::BoxFuture<'a, Result<$crate::contract::Level, $crate::contract::LaunchError>> {
                Box::pin($crate::attempt::front::probe_level(&self.$site, image))
            }

            fn denies_network(&self) -> bool {
                $crate::attempt::front::Launch::denies_network(&self.$site)
            }

            fn enforces(&self) -> Vec<&'static str> {
                $crate::attempt::front::Launch::enforces(&self.$site)
            }

            fn run<'a>(
                &'a self,
                request: &'a $crate::contract::Request,
                cancel: tokio_util::sync::CancellationToken,
            ) -> $crate::util::BoxFuture<'a, Result<$crate::contract::Outcome, $crate::contract::LaunchError>> {
                Box::pin($crate::attempt::front::run(&self.$site, request, cancel))
            }

            fn reclaim<'a>(
                &'a self,
                worker_id: &'a str,
            ) -> $crate::util::BoxFuture<'a, Result<$crate::contract::ReclaimReport, $crate::contract::ReclaimError>>
            {
                Box::pin($crate::attempt::front::Launch::reclaim(&self.$site, worker_id))
            }

            fn close(&self) -> $crate::util::BoxFuture<'_, ()> {
                Box::pin($crate::attempt::front::close(&self.$site))
            }

            fn recover<'a>(
                &'a self,
                checkpoint: &'a $crate::contract::Checkpoint,
                hooks: Option<$crate::contract::HookSet>,
                cancel: tokio_util::sync::CancellationToken,
            ) -> $crate::util::BoxFuture<'a, Result<$crate::contract::Outcome, $crate::contract::RecoverError>> {
                Box::pin($crate::attempt::front::recover(&self.$site, checkpoint, hooks, cancel))
            }
        }
    };
}
pub(crate) use executor;
