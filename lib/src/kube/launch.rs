//! Phase 2 of an attempt: the Pod created (recorded in the teardown before the call that
//! makes it), the attempt's container followed until it runs, and attached; the inputs sent
//! over the link to its root init, where `admission` finds that fit, else written into the
//! init container's stdin and checked against what it unpacked. Every way this fails is a
//! launch error saying what the Pod was waiting for; the teardown removes it.

use super::admission;
use super::capacity::{self, Need};
use super::cleanup::Cleanup;
use super::error::ClusterError;
use super::prepare::Plan;
use super::site::KubeSite;
use super::spec::{self, MAIN, PREPARE};
use super::state::{self, Launch};
use super::watch::{self, Look};
use crate::contract::{InputsStaged, LaunchError, Request};
use crate::link::session::{Inbound, Sender, Transport};
use crate::link::stage::{NotStaged, Staging};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{AttachParams, AttachedProcess, PostParams};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stevedore_init::wire::{Credentials, IN_DIR, STAGE_DIR};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// Beyond the host's own deadline and grace, when the Pod's `activeDeadlineSeconds` ends it
/// (a backstop for a host that is gone for good).
const DEADLINE_BACKSTOP: Duration = Duration::from_secs(60);
/// Bytes per second an upload of inputs is allowed to be as slow as before it times out.
const SLOWEST_UPLOAD: u64 = 4 << 20;
/// What is kept of the init container's words.
const PREPARE_WORDS: usize = 16 << 10;
/// The longest pause between attaches tried before the API says the attempt's container runs.
const EAGER_ATTACH_PAUSE: Duration = Duration::from_millis(200);

/// A Pod whose attempt's container runs its init, attached.
pub(crate) struct Ready {
    pub attached: Transport,
    /// The Pod's UID.
    pub uid: String,
    pub enforcement: BTreeMap<String, String>,
    pub skipped: BTreeMap<String, String>,
    pub inputs: Option<InputsStaged>,
    pub staged_at: Option<u64>,
    /// Who the root init drops to (the inputs went over the link), else `None`.
    pub credentials: Option<Credentials>,
    /// How long the Pod waited for room on a node, and why, if it did.
    pub waited: Option<String>,
}

/// The Pod, made and followed until its attempt's container runs, then attached. With inputs,
/// over the link where `admission` finds it fit; when the namespace refuses that Pod or the
/// init refuses its sandbox, the init container's way, and the evidence says why.
pub(crate) async fn provision(
    site: &Arc<KubeSite>,
    req: &Request,
    plan: &mut Plan,
    cleanup: &mut Cleanup,
    cancel: &CancellationToken,
) -> Result<Ready, LaunchError> {
    super::access::ensure(site).await?;
    let started = Instant::now();
    let mut not_over_link = match &plan.inputs {
        None => None,
        Some((_, s)) => match admission::not_over_link(&site.config, s.bytes) {
            Some(why) => Some(why),
            None => admission::root_init(site).await.err(),
        },
    };
    if plan.inputs.is_some() && not_over_link.is_none() {
        match over_link(site, req, plan, cleanup, cancel, started).await? {
            Ok(ready) => return Ok(ready),
            Err(why) => not_over_link = Some(why),
        }
    }
    through_init_container(site, req, plan, cleanup, cancel, started, not_over_link).await
}

/// What every Pod of the attempt is made from; `root_init`: the inputs go over the link.
fn pod_of(site: &KubeSite, req: &Request, plan: &Plan, started: Instant, root_init: bool) -> spec::Spec {
    let grace = req.policy.grace();
    let deadline = req.deadline_from(started).map(|d| d.saturating_duration_since(started));
    // The inputs' upload has a bound of its own, beside the launch's.
    let upload = plan.inputs.as_ref().map_or(Duration::ZERO, |(_, s)| upload_bound(site, s.bytes, s.files));
    spec::pod(&spec::PodInput {
        config: &site.config,
        name: &plan.decided.name,
        image: &plan.image,
        init_image: &site.init_image,
        labels: plan.labels.clone(),
        annotations: plan.annotations.clone(),
        sizes: &plan.sizes,
        inputs: plan.inputs.as_ref().map(|(_, s)| s.bytes),
        root_init,
        workdir: (!plan.decided.cwd.is_empty()).then_some(plan.decided.cwd.as_str()),
        grace_secs: i64::try_from(grace.as_secs().max(1)).unwrap_or(i64::MAX),
        host_within_ms: u64::try_from((site.config.launch_timeout + upload + DEADLINE_BACKSTOP).as_millis())
            .unwrap_or(u64::MAX),
        active_deadline_secs: deadline.map(|d| {
            let launch = site.config.launch_timeout + upload;
            // The API takes 1 to 2^31-1 seconds.
            i64::try_from((d + grace + launch + DEADLINE_BACKSTOP).as_secs())
                .unwrap_or(i64::MAX)
                .clamp(1, i64::from(i32::MAX))
        }),
    })
}

/// Creates `pod` (recorded in the teardown first); its UID and the Pod as the API made it.
async fn create(site: &Arc<KubeSite>, cleanup: &mut Cleanup, name: &str, pod: Pod) -> Result<Pod, ClusterError> {
    cleanup.pod(name.to_owned());
    let s = site.clone();
    let quota = |e: ClusterError| match &e {
        ClusterError::Api { code: Some(403), message, .. } if message.contains("exceeded quota") => {
            ClusterError::Quota { message: message.clone() }
        }
        _ => e,
    };
    cleanup
        .creating(
            async move { s.call("creating the attempt's Pod", s.pods.create(&PostParams::default(), &pod)).await },
        )
        .await
        .map_err(quota)
}

/// The inputs over the link: the Pod with the init as root and the input `emptyDir` also
/// writable at `STAGE_DIR`, attached once its container runs, and the inputs sent to the init,
/// which checks its sandbox, writes them and waits for the Start frame. `Ok(Err(why))`: the
/// namespace refused such a Pod or the init its sandbox, before anything was written; no Pod
/// of it is left, for the other way.
async fn over_link(
    site: &Arc<KubeSite>,
    req: &Request,
    plan: &mut Plan,
    cleanup: &mut Cleanup,
    cancel: &CancellationToken,
    started: Instant,
) -> Result<Result<Ready, String>, LaunchError> {
    if !plan.mounts.iter().any(|m| m == STAGE_DIR) {
        plan.mounts.push(STAGE_DIR.to_owned());
    }
    let spec::Spec { pod, mut enforcement, skipped } = pod_of(site, req, plan, started, true);
    if cancel.is_cancelled() {
        return Err(LaunchError::CancelledBeforeStart);
    }
    let name = plan.decided.name.clone();
    let created = match create(site, cleanup, &name, pod).await {
        Ok(p) => p,
        Err(e) if admission::is_admission_refusal(&e) => {
            let why = format!("the namespace refused the Pod of a root init: {}", crate::util::error_chain(&e));
            admission::refused(site, why.clone()).await;
            return Ok(Err(why));
        }
        Err(e) => return Err(e.into()),
    };
    spec::read_back(&created, &mut enforcement);
    let uid = created.metadata.uid.clone().unwrap_or_default();
    let mut waited = None;
    let left = site.config.launch_timeout.saturating_sub(started.elapsed());
    let attached = attached(site, &name, left, cancel, &need_of(site, plan), &mut waited).await?;
    let mut transport = transport(attached);
    let (dir, measured) = plan.inputs.as_ref().expect("over the link only with inputs");
    let limit = site.config.link_inputs_max_bytes.min(site.config.max_input_bytes);
    let at = Staging { stage_dir: STAGE_DIR, in_dir: IN_DIR, tighten: true };
    let within = upload_bound(site, measured.bytes, measured.files);
    let sent =
        crate::link::stage::over_link(&mut transport, at, Some((dir, measured)), limit, within, plan.progress.clone());
    let staged = tokio::select! {
        r = sent => r,
        _ = cancel.cancelled() => return Err(LaunchError::CancelledBeforeStart),
    };
    let inputs = match staged {
        Ok(inputs) => inputs,
        Err(NotStaged::Failed(e)) => return Err(e),
        Err(NotStaged::Refused(why)) => {
            drop(transport);
            // Gone at once (nothing of the attempt ran in it); the other way makes a Pod of
            // its own name.
            site.delete_pod(&name, true).await?;
            plan.decided.name = format!("{name}-b");
            return Ok(Err(format!("the init refused its sandbox: {why}")));
        }
    };
    enforcement.insert("inputs_staging".into(), spec::over_link_evidence());
    plan.inputs = None;
    let (uid_, gid) = site.config.user;
    Ok(Ok(Ready {
        attached: transport,
        uid,
        enforcement,
        skipped,
        inputs,
        staged_at: Some(crate::contract::unix_ms_now()),
        credentials: Some(Credentials { uid: uid_, gid, groups: site.config.groups.clone() }),
        waited,
    }))
}

/// The inputs (if any) through the init container's stdin, the way every namespace admits.
async fn through_init_container(
    site: &Arc<KubeSite>,
    req: &Request,
    plan: &mut Plan,
    cleanup: &mut Cleanup,
    cancel: &CancellationToken,
    started: Instant,
    not_over_link: Option<String>,
) -> Result<Ready, LaunchError> {
    plan.mounts.retain(|m| m != STAGE_DIR);
    let spec::Spec { pod, mut enforcement, skipped } = pod_of(site, req, plan, started, false);
    if let Some(why) = &not_over_link {
        enforcement.insert("inputs_staging".into(), spec::init_container_evidence(why));
    }
    let inputs = plan.inputs.take();
    if cancel.is_cancelled() {
        return Err(LaunchError::CancelledBeforeStart);
    }
    let name = plan.decided.name.clone();
    let created = create(site, cleanup, &name, pod).await?;
    spec::read_back(&created, &mut enforcement);
    let uid = created.metadata.uid.unwrap_or_default();
    let within = site.config.launch_timeout;
    let need = need_of(site, plan);
    let mut waited = None;
    let mut staged = None;
    let mut staged_at = None;
    // The time the upload took is not the launch's.
    let mut staging_took = Duration::ZERO;
    if let Some((dir, measured)) = inputs {
        let left = within.saturating_sub(started.elapsed());
        let p = Patience { need: &need, waited: &mut waited, soon: None };
        let at = wait(site, &name, left, cancel, true, p).await?;
        if at != Launch::Preparing {
            // The init container waits for the inputs: running past it without them would
            // give the command an empty `/in`.
            return Err(ClusterError::PodFailed {
                what: "the init container ended before the inputs were staged".into(),
            }
            .into());
        }
        let t = Instant::now();
        let staging = stage(site, &name, dir, (measured.bytes, measured.files), plan.progress.clone());
        let report = tokio::select! {
            r = staging => r?,
            _ = cancel.cancelled() => return Err(LaunchError::CancelledBeforeStart),
        };
        staging_took = t.elapsed();
        staged =
            Some(InputsStaged { skipped: report.skipped, sparse: report.sparse, tree: Some(report.tree), ..measured });
        staged_at = Some(crate::contract::unix_ms_now());
    }
    let left = within.saturating_sub(started.elapsed().saturating_sub(staging_took));
    let attached = transport(attached(site, &name, left, cancel, &need, &mut waited).await?);
    Ok(Ready { attached, uid, enforcement, skipped, inputs: staged, staged_at, credentials: None, waited })
}

/// How long an upload of `bytes` in `files` files may take (each entry of the tar adds a
/// header, and a long name another).
fn upload_bound(site: &KubeSite, bytes: u64, files: u64) -> Duration {
    let tar = bytes.saturating_add(files.saturating_mul(2048));
    site.config.api_timeout + Duration::from_secs(tar / SLOWEST_UPLOAD)
}

/// Follows the Pod until its init container runs (`preparing`, to stage the inputs) or its
/// attempt's container does; a launch error for every end before that. A Pod the scheduler
/// cannot place now is waited for (the note in `waited` says how long and why) unless no node
/// could take it even empty (`capacity`).
async fn wait(
    site: &KubeSite,
    name: &str,
    within: Duration,
    cancel: &CancellationToken,
    preparing: bool,
    p: Patience<'_>,
) -> Result<Launch, LaunchError> {
    let Patience { need, waited, soon } = p;
    let until = Instant::now() + within;
    let mut since: Option<(Instant, String)> = None;
    loop {
        let patient = waited.is_some() || since.is_some();
        let left = until.saturating_duration_since(Instant::now());
        let followed = watch::until(site, name, left, |pod| {
            if let (Some(soon), Some(p)) = (soon, pod)
                && state::prepared(p)
            {
                soon.notify_one();
            }
            let at = state::launch(pod);
            // Said as soon as the Pod is placed: an eager attach may end this wait before it returns.
            if let Some((t, reason)) = &since
                && waited.is_none()
                && !matches!(at, Launch::Unschedulable(_))
            {
                *waited = Some(room_note(t.elapsed(), reason));
            }
            match at {
                Launch::Waiting(w) => Look::Wait(w),
                Launch::Unschedulable(r) if patient => Look::Wait(format!("room on a node (the scheduler: {r})")),
                Launch::Preparing if !preparing => Look::Wait("stevedore's init container to finish".into()),
                other => Look::Done(other),
            }
        });
        let at = tokio::select! {
            r = followed => r.map_err(|e| match e {
                // Said as the launch's whole bound, whatever was left of it for this wait.
                ClusterError::StartTimeout { state, .. } => {
                    ClusterError::StartTimeout { waited: site.config.launch_timeout, state }
                }
                e => e,
            })?,
            _ = cancel.cancelled() => return Err(LaunchError::CancelledBeforeStart),
        };
        if let Launch::Unschedulable(reason) = &at
            && !patient
        {
            if let Some(why) = capacity::never_fits(site, need).await {
                return Err(ClusterError::Unschedulable { reason: format!("{reason} {why}") }.into());
            }
            since = Some((Instant::now(), reason.clone()));
            continue;
        }
        if let Some((t, reason)) = since
            && waited.is_none()
        {
            *waited = Some(room_note(t.elapsed(), &reason));
        }
        return match at {
            Launch::Preparing | Launch::Running => Ok(at),
            Launch::ImageUnavailable { image, mut why } => {
                // The node names images in full (`docker.io/library/…`).
                if image == site.init_image || image.ends_with(&format!("/{}", site.init_image)) {
                    why.push_str(
                        " (stevedore's init image: make it with `stevedore image init --tag REPO:TAG`, push it where \
                         the cluster pulls from, and name it with --init-image)",
                    );
                }
                Err(LaunchError::ImageUnavailable { image, why, permanent: false, source: None })
            }
            Launch::Unschedulable(reason) => Err(ClusterError::Unschedulable { reason }.into()),
            Launch::Failed(what) => Err(ClusterError::PodFailed { what }.into()),
            Launch::Waiting(_) => unreachable!("a wait ends only on a decision"),
        };
    }
}

/// The note of a Pod that waited `took` for room on a node.
fn room_note(took: Duration, reason: &str) -> String {
    format!(
        "the Pod waited {} ms for room on a node (the scheduler: {reason}); it fits a node of the cluster when that \
         node has room",
        took.as_millis()
    )
}

/// What a wait may wait for and tells: room on a node for the Pod (`need`; `waited` says how
/// long it waited), and `soon`, notified when the init container ended well (the attempt's
/// container starts in the same kubelet sync).
struct Patience<'a> {
    need: &'a Need,
    waited: &'a mut Option<String>,
    soon: Option<&'a tokio::sync::Notify>,
}

/// Follows the Pod until its attempt's container runs, and attaches to it: as soon as the
/// runtime runs it (tried from the init container's end on), not a kubelet relist later when
/// the API says so (the kubelet finds the container for an attach in the runtime itself).
async fn attached(
    site: &KubeSite,
    name: &str,
    within: Duration,
    cancel: &CancellationToken,
    need: &Need,
    waited: &mut Option<String>,
) -> Result<AttachedProcess, LaunchError> {
    let soon = tokio::sync::Notify::new();
    let follow = wait(site, name, within, cancel, false, Patience { need, waited, soon: Some(&soon) });
    let eager = async {
        soon.notified().await;
        let mut pause = Duration::from_millis(20);
        loop {
            // "container not found" until the runtime runs it: asked again, more slowly.
            if let Ok(a) = attach(site, name, MAIN, true).await {
                return a;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(EAGER_ATTACH_PAUSE);
        }
    };
    let attaching = async {
        tokio::select! {
            a = eager => Ok(a),
            w = follow => {
                w?;
                attach(site, name, MAIN, true).await.map_err(|e| LaunchError::staging("attaching to the attempt", e))
            }
        }
    };
    tokio::select! {
        a = attaching => a,
        _ = cancel.cancelled() => Err(LaunchError::CancelledBeforeStart),
    }
}

/// What the Pod asks of a node: its containers' limits (requests equal them), the init
/// container's above the attempt's (`spec::POD_HEADROOM`).
fn need_of(site: &KubeSite, plan: &Plan) -> Need {
    let s = &plan.sizes;
    Need {
        memory: s.memory.saturating_add(site.config.link.delivery_reserve).saturating_add(spec::POD_HEADROOM),
        cpu_millis: s.cpu_millis,
        gpus: s.gpus.map(|n| (site.config.gpu_resource.clone(), n)),
    }
}

/// Attaches to `container` of the Pod: its stdin (when `stdin`), stdout and stderr.
pub(crate) async fn attach(
    site: &KubeSite,
    pod: &str,
    container: &str,
    stdin: bool,
) -> Result<AttachedProcess, ClusterError> {
    let ap = streams(container, stdin);
    site.call(format!("attaching to {container} of Pod {pod}"), site.pods.attach(pod, &ap))
        .await
        .map_err(|e| site.forbidden(e, "pods/attach"))
}

/// The streams of `container` an attach or an exec carries: stdout and stderr, stdin when
/// asked, never a terminal (the link is binary), with room for the link's frames.
pub(crate) fn streams(container: &str, stdin: bool) -> AttachParams {
    AttachParams {
        container: Some(container.to_owned()),
        stdin,
        stdout: true,
        stderr: true,
        tty: false,
        max_stdin_buf_size: Some(256 << 10),
        max_stdout_buf_size: Some(1 << 20),
        max_stderr_buf_size: Some(64 << 10),
    }
}

/// Writes the inputs' tar into the init container's stdin and waits for its word: the tar's
/// entries it unpacked must be those the host wrote.
async fn stage(
    site: &KubeSite,
    pod: &str,
    dir: crate::inputs::InputDir,
    (bytes, files): (u64, u64),
    progress: Option<crate::contract::ProgressSink>,
) -> Result<crate::inputs::StageReport, LaunchError> {
    let mut ap = attach(site, pod, PREPARE, true)
        .await
        .map_err(|e| LaunchError::staging("attaching to the init container", e))?;
    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) = (ap.stdin(), ap.stdout(), ap.stderr()) else {
        return Err(LaunchError::Staging {
            what: "the init container's streams".into(),
            source: "not attached".into(),
        });
    };
    let (producer, chunks) = crate::inputs::tar_stream(
        dir,
        crate::inputs::Owners::User(site.config.user.0, site.config.user.1),
        site.config.max_input_bytes,
        bytes,
        progress.clone(),
    );
    let bound = upload_bound(site, bytes, files);
    let words = async { tokio::join!(words_of(&mut stdout), words_of(&mut stderr)) };
    let stdin_ref = &mut stdin;
    // The chunks go with this future, so a producer that writes after a failure never waits.
    let write = async move {
        let mut chunks = std::pin::pin!(chunks);
        while let Some(chunk) = chunks.next().await {
            stdin_ref.write_all(&chunk?).await?;
        }
        // The tar's end marker went with the last chunk; stdin stays open until the init
        // container has said its word (closing it closes the whole attach on Kubernetes 1.20).
        stdin_ref.flush().await
    };
    let both = async { tokio::join!(write, words) };
    let (written, (said, complaint)) = tokio::time::timeout(bound, both).await.map_err(|_| LaunchError::Staging {
        what: "the inputs".into(),
        source: format!("not staged within {bound:?}").into(),
    })?;
    drop(stdin);
    ap.abort();
    let report = crate::inputs::finish(producer, bytes, progress.as_ref()).await;
    let words = stevedore_init::wire::printable(format!("{} {}", said.trim(), complaint.trim()).trim());
    let report = match (report, written) {
        (Ok(r), Ok(())) => r,
        (Err(e @ LaunchError::InputTooLarge { .. }), _) => return Err(e),
        // The init container stopped taking them: its words say why.
        (_, Err(e)) if !complaint.trim().is_empty() => {
            return Err(LaunchError::Staging {
                what: "the inputs".into(),
                source: format!("the init container stopped taking them ({e}): {words}").into(),
            });
        }
        (Err(e), _) => return Err(e),
        (Ok(_), Err(e)) => return Err(LaunchError::staging("writing the inputs to the init container", e)),
    };
    let unpacked = said
        .lines()
        .find_map(|l| l.strip_prefix("prepared: "))
        .and_then(|l| l.split(", ").find_map(|part| part.split_once(" input entries")?.0.parse::<u64>().ok()));
    if unpacked != Some(report.entries) {
        return Err(LaunchError::Staging {
            what: "the inputs".into(),
            source: format!(
                "the init container unpacked {} of {} entries: {words}",
                unpacked.map_or_else(|| "none".into(), |n| n.to_string()),
                report.entries,
            )
            .into(),
        });
    }
    Ok(report)
}

/// What a stream of the init container says, to its end: the first [`PREPARE_WORDS`] bytes
/// kept, the rest read and dropped (a stream left unread would stall the whole attach).
async fn words_of(r: &mut (impl tokio::io::AsyncRead + Unpin)) -> String {
    let mut kept = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = r.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = PREPARE_WORDS.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// Ends an attach's connection when its transport is dropped.
struct Attached(AttachedProcess);

impl Drop for Attached {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The link over an attached container: its stdout carries the link, its stderr the init's
/// own diagnostics, its stdin the host's frames.
pub(crate) fn transport(mut ap: AttachedProcess) -> Transport {
    let (stdin, stdout, stderr) = (ap.stdin(), ap.stdout(), ap.stderr());
    let guard = Attached(ap);
    let out = stdout.map(|r| tokio_util::io::ReaderStream::with_capacity(r, 64 << 10).map(|c| c.map(Inbound::Link)));
    let err =
        stderr.map(|r| tokio_util::io::ReaderStream::with_capacity(r, 16 << 10).map(|c| c.map(Inbound::InitStderr)));
    let inbound = futures_util::stream::select(
        futures_util::stream::iter(out).flatten(),
        futures_util::stream::iter(err).flatten(),
    )
    .map(move |item| {
        let _ = &guard;
        item
    });
    let writer: crate::link::session::LinkWriter = match stdin {
        Some(w) => Box::pin(w),
        None => Box::pin(tokio::io::sink()),
    };
    (Box::pin(inbound), Sender::new(writer))
}
