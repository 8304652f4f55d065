//! From a provisioned sandbox to a running attempt: the captures, the link's reader, the
//! start, the engine's checkpoint hook (the sandbox exists, its command does not run yet),
//! the Start frame, the heartbeats.

use super::site::{Layout, Ledger, Plan, Provisioned, Settings, Site};
use crate::contract::{
    CHECKPOINT_VERSION, Checkpoint, HOOK_TIMEOUT, HookError, LaunchError, LinkSecret, Request, StartedInfo, Target,
    Task,
};
use crate::link::reports::{self, ReportRoute};
use crate::link::session::{self, Heard, OutputsSink, ReaderSetup, Sender};
use crate::link::supervise::{Linked, Rejoin};
use crate::link::{CappedLog, LiveSink};
use crate::util::hex;
use std::sync::Arc;
use std::time::Instant;
use stevedore_init::wire::{self, HandlerRequest, KEY_LEN, Start};
use tokio::sync::mpsc;

/// An attempt whose command was told to start.
#[derive(Debug)]
pub(crate) struct Running<O> {
    pub ledger: Ledger<O>,
    pub link: Linked,
    /// The task handing reports to the engine's hook.
    pub reports: Option<tokio::task::JoinHandle<reports::Delivered>>,
    /// Removes the captures unless an Outcome took them.
    pub captures: Captures,
}

/// An attempt's capture files until its Outcome names them: removed when the attempt is
/// dropped before that (a second Ctrl-C, a caller's timeout), since nobody else learns
/// where they are.
#[derive(Debug)]
pub(crate) struct Captures {
    dir: Option<crate::hostdir::PrivateDir>,
    names: [String; 2],
    /// The captures' base and the worker's dir in it, removed once empty: a launch that
    /// failed leaves no dir behind (one per worker id, and the command mints one per run).
    worker: (std::sync::Arc<crate::hostdir::PrivateDir>, String),
}

impl Captures {
    /// The Outcome has them now.
    pub fn handed_over(mut self) {
        self.dir = None;
    }
}

impl Drop for Captures {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            for n in &self.names {
                if let Err(e) = dir.remove_file(n) {
                    tracing::warn!(error = %e, "removing the capture of an attempt that was dropped");
                }
            }
            let (base, worker) = &self.worker;
            // Only when empty: another attempt of the worker may be writing there.
            let _ = base.remove_subdir_if_empty(worker);
        }
    }
}

/// The attempt a link belongs to.
pub(crate) fn scope(req: &Request) -> wire::Scope {
    wire::Scope { job_id: req.job_id.clone(), attempt: req.attempt }
}

/// The link's reports to the engine's hook, when the request has hooks.
pub(crate) fn report_forwarding(
    req: &Request,
) -> (Option<mpsc::Sender<reports::Delivery>>, Option<tokio::task::JoinHandle<reports::Delivered>>) {
    match &req.hooks {
        Some(h) => {
            let (tx, task) = reports::forward(h.clone(), req.attempt_ref());
            (Some(tx), Some(task))
        }
        None => (None, None),
    }
}

/// Starts the attempt on its provisioned sandbox. On `Err` the caller removes what was made.
pub(crate) async fn begin<S: Site>(
    site: &S,
    req: &Request,
    plan: Plan<'_>,
    prov: Provisioned<S::Own>,
) -> Result<Running<S::Own>, LaunchError> {
    let rung = site.rung();
    let cfg = rung.settings;
    let Provisioned { transport: (inbound, sender), running, own, layout, enforcement, skipped, inputs } = prov;
    let key: [u8; KEY_LEN] = rand::random();
    let link_id = hex(&rand::random::<[u8; 16]>());
    let (report_tx, report_task) = report_forwarding(req);
    let started_tx = report_tx.clone();
    let count = Arc::new(Heard::default());
    let (rejoin, more) = rejoin(&cfg, key, &link_id);
    let in_place = site.outputs_in_place(&own);
    let (guard, captures, mut setup) = reader_setup(site, req, &plan, key, report_tx, count.clone(), more)?;
    setup.outputs.in_place =
        in_place.as_deref().map(|dir| cfg.link.collection.spec(dir.display().to_string(), cfg.link.output_caps));
    let stop = setup.stop.clone();
    let (events_tx, events) = mpsc::unbounded_channel();
    let reader = session::ReaderTask::spawn(&rung.base.tracker, session::read(inbound, setup, events_tx));
    let started = Instant::now();
    let ports = match site.start(&own, running).await {
        Ok(p) => p,
        Err(e) => {
            reader.abort();
            return Err(e);
        }
    };
    let action = super::action::of(site, req, &own, inputs.as_ref());
    let captured = Captured { captures, inputs, enforcement, skipped, ports };
    let mut ledger = ledger_of(req, &plan, &cfg, captured, own);
    ledger.action = Some(action);
    // The sandbox runs, its init waits for the start: the command has not started yet.
    if let Some(hooks) = &req.hooks {
        let cp = checkpoint(site, req, &ledger, &key, &link_id);
        if let Err(e) = checkpointed(hooks, &cp).await {
            reader.abort();
            return Err(LaunchError::Hook(e));
        }
    }
    // Sent, and the sender let go: the forwarding ends once the reader's route is gone too.
    if let Some(tx) = started_tx {
        let (container_id, pid) = match site.target(&ledger.own) {
            Target::Container { id, .. } | Target::Runtime { id, .. } => (Some(id), None),
            Target::Process { pid, .. } => (None, Some(pid)),
            Target::Pod { namespace, name, .. } => (Some(format!("{namespace}/{name}")), None),
        };
        let info = StartedInfo { container_id, pid, ports: ledger.ports.clone() };
        let _ = tx.try_send(reports::Delivery::Started(info));
    }
    // Watched before the size is read for the start: a resize in between is sent, not lost.
    let resizes = req.tty.as_ref().map(crate::contract::Terminal::watch);
    let mut start = start_frame(req, &plan, layout, &key, &link_id, &cfg);
    start.outputs.host_walks = in_place.is_some();
    // The payload goes from the request itself: a large one is never copied into a frame.
    let head = wire::start_head(&start, req.payload.len());
    if let Err(e) = sender.raw_parts(&[&head, &req.payload]).await {
        // The init then sees no start and exits; the attempt ends as "no record".
        tracing::warn!(error = %e, "could not send the start to the init");
    }
    let feed = req.stdin.as_ref().and_then(crate::contract::StdinFeed::take);
    let stdin = (feed.is_some() || resizes.is_some()).then(|| {
        let (sender, count) = (sender.clone(), count.clone());
        tokio::spawn(async move {
            let pump = async {
                if let Some(feed) = feed {
                    crate::link::stdin::pump(sender.clone(), count, feed).await;
                }
            };
            let resize = async {
                if let Some(rx) = resizes {
                    crate::link::stdin::resizes(sender.clone(), rx).await;
                }
            };
            tokio::join!(pump, resize);
        })
    });
    let heartbeat = heartbeats(&sender, &cfg, count);
    let link = Linked { started, sender, stop, events, reader, heartbeat, stdin, rejoin };
    Ok(Running { ledger, link, reports: report_task, captures: guard })
}

/// The reader's setup: the capped captures (their guard, their names), the outputs' sink, the
/// reports' route.
fn reader_setup<S: Site>(
    site: &S,
    req: &Request,
    plan: &Plan<'_>,
    key: [u8; KEY_LEN],
    reports: Option<mpsc::Sender<reports::Delivery>>,
    count: Arc<Heard>,
    more: Option<mpsc::Receiver<session::InboundStream>>,
) -> Result<(Captures, [String; 2], ReaderSetup), LaunchError> {
    let rung = site.rung();
    let cfg = rung.settings;
    let base = rung.base.captures.base().map_err(|e| LaunchError::staging("the capture dir", e))?;
    let logs = base.subdir(&req.worker_id).map_err(|e| LaunchError::staging("the capture dir", e))?;
    let captures = [format!("{}.stdout", plan.name), format!("{}.stderr", plan.name)];
    let capture = |n: &str| {
        CappedLog::create(&logs, n, cfg.link.log_cap_bytes)
            .map_err(|e| LaunchError::staging(format!("the capture {n}"), e))
    };
    let (stdout, stderr) = (capture(&captures[0]), capture(&captures[1]));
    let guard = Captures { dir: Some(logs), names: captures.clone(), worker: (base, req.worker_id.clone()) };
    let (stdout, stderr) = (stdout?, stderr?);
    let setup = ReaderSetup {
        key,
        stdout,
        stderr,
        live: LiveSink::new(req.live.clone()),
        outputs: OutputsSink {
            dest: plan.output_dir.try_clone().map_err(|e| LaunchError::staging("the output dir", e))?,
            caps: cfg.link.output_caps,
            // Set by the caller where the rung holds the output dir.
            in_place: None,
        },
        reports: ReportRoute::new(scope(req), reports),
        stop: Default::default(),
        count,
        more,
        taking_over: false,
        progress: req.progress.clone(),
    };
    Ok((guard, captures, setup))
}

/// The engine's checkpoint hook, within its time.
async fn checkpointed(hooks: &crate::contract::HookSet, cp: &Checkpoint) -> Result<(), HookError> {
    match tokio::time::timeout(HOOK_TIMEOUT, hooks.0.checkpoint(cp)).await {
        Ok(r) => r,
        Err(_) => Err(HookError::new(format!("no answer within {}s", HOOK_TIMEOUT.as_secs()))),
    }
}

/// The heartbeats the link's settings ask for: for the init's liveness check, and for its
/// count of what it may stop keeping when a host may come back.
pub(crate) fn heartbeats(sender: &Sender, cfg: &Settings, count: Arc<Heard>) -> Option<tokio::task::JoinHandle<()>> {
    let loss = &cfg.link.host_loss;
    (loss.heartbeat_timeout.is_some() || !loss.grace.is_zero()).then(|| sender.heartbeats(loss.heartbeat_every, count))
}

/// How a cut link is resumed, when the settings let the init wait for a host (a host-loss
/// grace): the supervisor's half and the reader's.
pub(crate) fn rejoin(
    cfg: &Settings,
    key: [u8; KEY_LEN],
    link_id: &str,
) -> (Option<Rejoin>, Option<mpsc::Receiver<session::InboundStream>>) {
    let within = cfg.link.host_loss.grace;
    if within.is_zero() {
        return (None, None);
    }
    let (more, rx) = mpsc::channel(1);
    (Some(Rejoin { key, link_id: link_id.to_owned(), more, within }), Some(rx))
}

/// What `begin` learnt of the attempt on its way to the ledger.
struct Captured {
    captures: [String; 2],
    inputs: Option<crate::contract::InputsStaged>,
    enforcement: std::collections::BTreeMap<String, String>,
    skipped: std::collections::BTreeMap<String, String>,
    ports: super::site::Ports,
}

/// The attempt's ledger: what it must keep, whatever happens to this process.
fn ledger_of<O>(req: &Request, plan: &Plan<'_>, cfg: &Settings, got: Captured, own: O) -> Ledger<O> {
    let Captured { captures, inputs, enforcement, skipped, ports } = got;
    let phases = crate::contract::Phases { started_ms: super::site::since(plan.started_ms), ..plan.phases.clone() };
    Ledger {
        attempt_id: plan.attempt_id.clone(),
        name: plan.name.clone(),
        started_ms: plan.started_ms,
        expects_handler: matches!(req.task, Task::Handler(_)),
        captures,
        max_files: cfg.link.output_caps.max_files as u64,
        max_total_bytes: cfg.link.output_caps.max_total_bytes,
        narrowed: plan.narrowed.clone(),
        env_overrides: plan.env_overrides.clone(),
        enforcement,
        skipped,
        inputs,
        ports,
        phases,
        action: None,
        own,
    }
}

/// The checkpoint of a launched attempt.
fn checkpoint<S: Site>(
    site: &S,
    req: &Request,
    ledger: &Ledger<S::Own>,
    key: &[u8; KEY_LEN],
    link_id: &str,
) -> Checkpoint {
    let rung = site.rung();
    let now_ms = crate::contract::unix_ms_now();
    Checkpoint {
        version: CHECKPOINT_VERSION,
        job_id: req.job_id.clone(),
        attempt: req.attempt,
        worker: req.worker_id.clone(),
        rung: rung.name.to_owned(),
        level: rung.level,
        incarnation: rung.base.incarnation.to_owned(),
        started_at_unix_ms: ledger.started_ms,
        // The command starts right after the checkpoint: its timeout counts from about now.
        deadline_at_unix_ms: req
            .deadline_from(Instant::now())
            .map(|d| now_ms.saturating_add(d.saturating_duration_since(Instant::now()).as_millis() as u64)),
        grace_ms: req.policy.grace().as_millis() as u64,
        output_dir: std::path::absolute(&req.output_dir).unwrap_or_else(|_| req.output_dir.clone()),
        target: site.target(&ledger.own),
        link: LinkSecret { id: link_id.to_owned(), key: hex(key) },
        state: serde_json::to_value(ledger).expect("a ledger always serialises"),
    }
}

/// The Start frame: what the rung decided, how it laid the sandbox out, the link's settings.
fn start_frame(
    req: &Request,
    plan: &Plan<'_>,
    layout: Layout,
    key: &[u8; KEY_LEN],
    link_id: &str,
    cfg: &Settings,
) -> Start {
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let handler = match &req.task {
        Task::Handler(h) => Some(HandlerRequest {
            handler: h.clone(),
            fingerprint: req.fingerprint.clone(),
            job_id: req.job_id.clone(),
            attempt: req.attempt,
            inputs: req.inputs.iter().map(|(k, v)| (k.clone(), format!("{}/{}", layout.in_dir, v.display()))).collect(),
            prior_outputs: req.prior_outputs.iter().map(crate::link::convert::prior_out).collect(),
            deadline_ms: req.deadline_from(Instant::now()).map(|d| ms(d.saturating_duration_since(Instant::now()))),
        }),
        Task::Command(_) => None,
    };
    let has_cgroup = layout.cgroup_dir.is_some() || layout.sampled_cgroup.is_some();
    let timeline = cfg.link.timeline_period.filter(|_| has_cgroup).map(|period| wire::TimelineSpec {
        period_ms: ms(period),
        max_samples: u32::try_from(crate::contract::TIMELINE_MAX_SAMPLES).unwrap_or(u32::MAX),
        cgroup: layout.sampled_cgroup,
        out_dir: Some(layout.out_dir.clone()),
        tmp_dir: layout.tmp_dir,
    });
    Start {
        protocol: wire::PROTOCOL,
        key: hex(key),
        argv: plan.argv.clone(),
        env: plan.env.clone(),
        cwd: plan.cwd.clone(),
        grace_ms: ms(req.policy.grace()),
        child_oom_score_adj: Some(500),
        handler,
        handshake_ms: ms(cfg.link.handshake_timeout),
        heartbeat_timeout_ms: cfg.link.host_loss.heartbeat_timeout.map_or(0, ms),
        host_loss_grace_ms: ms(cfg.link.host_loss.grace),
        outputs: cfg.link.collection.spec(layout.out_dir.clone(), cfg.link.output_caps),
        scope: scope(req),
        link_id: Some(link_id.to_owned()),
        takeover_uid: layout.takeover_uid,
        takeover_fd: layout.takeover_fd,
        rlimits: layout.rlimits,
        cgroup_dir: layout.cgroup_dir,
        measure: layout.measure,
        mounts: layout.mounts,
        timeline,
        image_env: layout.image_env,
        credentials: layout.credentials,
        // Only what the policy demands: a limit merely asked for and not held is said at the
        // end (`judgement::limits_read_back`), and the command runs.
        held: layout
            .held
            .into_iter()
            .filter(|h| req.policy.require_enforced.iter().any(|k| k == h.limit.name()))
            .collect(),
        stdin: req.stdin.is_some(),
        tty: req.tty.as_ref().map(|t| {
            let (rows, cols) = t.size();
            wire::TermSize { rows, cols }
        }),
    }
}
