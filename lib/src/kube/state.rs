//! What a Pod's status says of an attempt, read the same way everywhere (pure): where its
//! launch stands, why it failed, and how its attempt's container ended.

use super::spec::{MAIN, PREPARE};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// Where a Pod's launch stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Launch {
    /// Not there yet; what it waits for, in words.
    Waiting(String),
    /// The init container runs (it waits for the inputs on its stdin).
    Preparing,
    /// The attempt's container runs: its init waits for the Start frame.
    Running,
    /// The image (of the attempt, or stevedore's init image) cannot be had.
    ImageUnavailable { image: String, why: String },
    /// No node can take it.
    Unschedulable(String),
    /// It failed or ended before its attempt's container ran the init (or the init ended
    /// before the host spoke).
    Failed(String),
}

/// The reasons a kubelet gives a container that waits for an image it cannot have.
const IMAGE_REASONS: &[&str] = &["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"];
/// The reasons a kubelet gives a container it could not make or start.
const FAILED_REASONS: &[&str] = &["CreateContainerConfigError", "CreateContainerError", "RunContainerError"];

/// What the kubelet or a registry says, as an error or a note may carry it: at most
/// [`SAID_MAX`] bytes, control characters escaped (a container's termination message is the
/// container's own words).
fn said(m: &str) -> String {
    stevedore_init::wire::printable(&stevedore_init::wire::cap_text(m.trim(), SAID_MAX))
}

/// The most of one message kept.
const SAID_MAX: usize = 512;

fn status<'a>(list: Option<&'a Vec<ContainerStatus>>, name: &str) -> Option<&'a ContainerStatus> {
    list?.iter().find(|c| c.name == name)
}

/// A container's waiting state that means it will not start: the launch's end.
fn stuck(c: &ContainerStatus) -> Option<Launch> {
    let waiting = c.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref().unwrap_or_default();
    let message = said(waiting.message.as_deref().unwrap_or_default());
    if IMAGE_REASONS.contains(&reason) {
        let why = if message.is_empty() { reason.to_owned() } else { format!("{reason}: {message}") };
        return Some(Launch::ImageUnavailable { image: c.image.clone(), why });
    }
    FAILED_REASONS.contains(&reason).then(|| Launch::Failed(format!("container {}: {reason}: {message}", c.name)))
}

/// How a terminated container ended, in words.
fn ended(c: &ContainerStatus) -> Option<String> {
    let t = c.state.as_ref()?.terminated.as_ref()?;
    let mut s = format!("container {} exited with code {}", c.name, t.exit_code);
    if let Some(r) = &t.reason {
        s.push_str(&format!(" ({r})"));
    }
    if let Some(m) = t.message.as_deref().filter(|m| !m.trim().is_empty()) {
        s.push_str(&format!(": {}", said(m)));
    }
    Some(s)
}

/// Where `pod`'s launch stands (`None`: the Pod is gone).
pub(crate) fn launch(pod: Option<&Pod>) -> Launch {
    let Some(pod) = pod else { return Launch::Failed("the Pod was deleted".into()) };
    let Some(st) = &pod.status else { return Launch::Waiting("the Pod to get a status".into()) };
    if pod.metadata.deletion_timestamp.is_some() {
        return Launch::Failed("the Pod is being deleted".into());
    }
    let scheduled = st.conditions.iter().flatten().find(|c| c.type_ == "PodScheduled");
    if let Some(c) = scheduled
        && c.status == "False"
        && c.reason.as_deref() == Some("Unschedulable")
    {
        return Launch::Unschedulable(c.message.as_deref().map_or_else(|| "Unschedulable".into(), said));
    }
    let prepare = status(st.init_container_statuses.as_ref(), PREPARE);
    let main = status(st.container_statuses.as_ref(), MAIN);
    for c in [prepare, main].into_iter().flatten() {
        if let Some(end) = stuck(c) {
            return end;
        }
    }
    if let Some(p) = prepare
        && let Some(t) = p.state.as_ref().and_then(|s| s.terminated.as_ref())
        && t.exit_code != 0
    {
        return Launch::Failed(ended(p).unwrap_or_default());
    }
    if let Some(m) = main
        && let Some(s) = &m.state
    {
        if s.running.is_some() {
            return Launch::Running;
        }
        if s.terminated.is_some() {
            return Launch::Failed(ended(m).unwrap_or_default());
        }
    }
    match st.phase.as_deref() {
        Some("Failed") => {
            let why = [st.reason.as_deref(), st.message.as_deref()].into_iter().flatten().map(said).collect::<Vec<_>>();
            return Launch::Failed(if why.is_empty() { "the Pod failed".into() } else { why.join(": ") });
        }
        Some("Succeeded") => return Launch::Failed("the Pod ended".into()),
        _ => {}
    }
    if prepare.and_then(|p| p.state.as_ref()).is_some_and(|s| s.running.is_some()) {
        return Launch::Preparing;
    }
    let what = match (scheduled.map(|c| c.status.as_str()), prepare, main) {
        (None | Some("False"), _, _) => "the scheduler".to_owned(),
        (_, Some(p), _) if p.state.as_ref().and_then(|s| s.terminated.as_ref()).is_none() => {
            waiting_words(p, "stevedore's init image")
        }
        (_, _, Some(m)) => waiting_words(m, "the attempt's container"),
        _ => "the kubelet".to_owned(),
    };
    Launch::Waiting(what)
}

fn waiting_words(c: &ContainerStatus, what: &str) -> String {
    match c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
        Some(w) => format!(
            "{what} ({}{})",
            w.reason.as_deref().unwrap_or("waiting"),
            w.message.as_deref().map(|m| format!(": {}", said(m))).unwrap_or_default()
        ),
        None => what.to_owned(),
    }
}

/// How the attempt's container ended, as the kubelet saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MainEnd {
    /// Its exit code, once it terminated.
    pub exit_code: Option<i32>,
    /// Whether the kubelet said `OOMKilled` (evidence only: on cgroup v1 it says so when any
    /// process of the container was OOM-killed, whatever became of the init).
    pub oom_killed: bool,
    /// Its container ID (`containerd://...`).
    pub container_id: Option<String>,
    /// The node it ran on.
    pub node: Option<String>,
    /// The image's ID as the node resolved it.
    pub image_id: Option<String>,
    /// Why the kubelet ended the Pod itself, when it did (`Evicted: …`, `DeadlineExceeded: …`).
    pub pod_ended_by: Option<String>,
}

/// The attempt's container's end and identity, from `pod`.
pub(crate) fn main_end(pod: &Pod) -> MainEnd {
    let st = pod.status.as_ref();
    let main = status(st.and_then(|s| s.container_statuses.as_ref()), MAIN);
    let terminated = main.and_then(|m| m.state.as_ref()).and_then(|s| s.terminated.as_ref());
    MainEnd {
        exit_code: terminated.map(|t| t.exit_code),
        oom_killed: terminated.is_some_and(|t| t.reason.as_deref() == Some("OOMKilled")),
        container_id: main.and_then(|m| m.container_id.clone()),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        image_id: main.map(|m| m.image_id.clone()).filter(|i| !i.is_empty()),
        pod_ended_by: st.and_then(|s| s.reason.as_ref()).map(|r| {
            let message = said(st.and_then(|s| s.message.as_deref()).unwrap_or_default());
            if message.is_empty() { said(r) } else { format!("{}: {message}", said(r)) }
        }),
    }
}

/// Whether nothing of the Pod runs any more and nothing will: a Pod that ended (its phase
/// says so) can be deleted at once. A Pod whose containers only wait may still be started
/// by its kubelet: it is not finished.
pub(crate) fn finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// Whether no container of the Pod runs: it ended, or none has started (it waits for an
/// image, for its node, for the kubelet). Such a Pod is deleted at once: its kubelet stops
/// whatever it was starting when it sees it gone, where a graceful delete of a Pod being
/// started waits for the kubelet's next sync (37 s seen here, on 1.20).
pub(crate) fn nothing_runs(pod: &Pod) -> bool {
    if finished(pod) {
        return true;
    }
    let Some(st) = &pod.status else { return true };
    st.init_container_statuses
        .iter()
        .flatten()
        .chain(st.container_statuses.iter().flatten())
        .all(|c| c.state.as_ref().is_none_or(|s| s.running.is_none()))
}

/// Whether stevedore's init container ended well: the attempt's container starts next (the
/// kubelet starts it in the same sync, a relist before the API says so).
pub(crate) fn prepared(pod: &Pod) -> bool {
    let st = pod.status.as_ref();
    status(st.and_then(|s| s.init_container_statuses.as_ref()), PREPARE)
        .and_then(|c| c.state.as_ref()?.terminated.as_ref())
        .is_some_and(|t| t.exit_code == 0)
}

/// Whether the attempt's container runs (its init may be about to end by itself).
pub(crate) fn main_runs(pod: &Pod) -> bool {
    let st = pod.status.as_ref();
    status(st.and_then(|s| s.container_statuses.as_ref()), MAIN)
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "status": json})).unwrap()
    }

    #[test]
    fn a_pod_is_read_as_its_launch_stands() {
        assert_eq!(launch(None), Launch::Failed("the Pod was deleted".into()));
        let unsched = pod(serde_json::json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/1 nodes are available: 1 Insufficient memory."}]}));
        assert_eq!(
            launch(Some(&unsched)),
            Launch::Unschedulable("0/1 nodes are available: 1 Insufficient memory.".into())
        );
        let pull = pod(serde_json::json!({"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "initContainerStatuses": [{"name": PREPARE, "image": "stevedore-init:1", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"waiting": {"reason": "ErrImageNeverPull",
                "message": "Container image \"stevedore-init:1\" is not present with pull policy of Never"}}}]}));
        match launch(Some(&pull)) {
            Launch::ImageUnavailable { image, why } => {
                assert_eq!(image, "stevedore-init:1");
                assert!(why.starts_with("ErrImageNeverPull: Container image"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        let preparing = pod(serde_json::json!({"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "initContainerStatuses": [{"name": PREPARE, "image": "i", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"running": {}}}]}));
        assert_eq!(launch(Some(&preparing)), Launch::Preparing);
        let failed_prepare = pod(serde_json::json!({"phase": "Failed",
            "initContainerStatuses": [{"name": PREPARE, "image": "i", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"terminated": {"exitCode": 1, "reason": "Error",
                "message": "stevedore-init prepare: input entry x would leave /in"}}}]}));
        match launch(Some(&failed_prepare)) {
            Launch::Failed(w) => assert!(w.contains("exited with code 1") && w.contains("would leave"), "{w}"),
            other => panic!("{other:?}"),
        }
        let running = pod(serde_json::json!({"phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": MAIN, "image": "busybox", "imageID": "sha256:ab", "ready": true,
                "restartCount": 0, "containerID": "containerd://c1", "state": {"running": {}}}]}));
        assert_eq!(launch(Some(&running)), Launch::Running);
        let waiting = pod(serde_json::json!({"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": MAIN, "image": "busybox", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]}));
        assert!(matches!(launch(Some(&waiting)), Launch::Waiting(w) if w.contains("ContainerCreating")));
    }

    #[test]
    fn what_the_kubelet_says_is_bounded_and_escaped() {
        let long =
            pod(serde_json::json!({"phase": "Failed", "reason": "Evicted", "message": "x\u{1b}[2J".repeat(500)}));
        let said = main_end(&long).pod_ended_by.unwrap();
        // 3000 bytes said, 512 kept (escaped: about twice as long, here).
        assert!(said.len() < SAID_MAX * 2 + 16 && !said.contains('\u{1b}'), "{said:?}");
    }

    #[test]
    fn the_kubelets_oom_word_is_kept_apart_from_the_exit() {
        let p = pod(serde_json::json!({"phase": "Succeeded",
            "containerStatuses": [{"name": MAIN, "image": "busybox", "imageID": "sha256:ab", "ready": false,
                "restartCount": 0, "containerID": "containerd://c1",
                "state": {"terminated": {"exitCode": 0, "reason": "OOMKilled"}}}]}));
        let end = main_end(&p);
        assert_eq!((end.exit_code, end.oom_killed), (Some(0), true));
        assert_eq!(end.pod_ended_by, None);
        let evicted = pod(serde_json::json!({"phase": "Failed", "reason": "Evicted",
            "message": "Usage of EmptyDir volume \"stevedore-out\" exceeds the limit \"8Mi\"."}));
        assert_eq!(
            main_end(&evicted).pod_ended_by.as_deref(),
            Some("Evicted: Usage of EmptyDir volume \"stevedore-out\" exceeds the limit \"8Mi\".")
        );
        assert_eq!(end.container_id.as_deref(), Some("containerd://c1"));
        assert!(finished(&p) && !main_runs(&p));
        let running = pod(serde_json::json!({"phase": "Running",
            "containerStatuses": [{"name": MAIN, "image": "b", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"running": {}}}]}));
        assert!(!finished(&running) && main_runs(&running));
        let pulling = pod(serde_json::json!({"phase": "Pending",
            "containerStatuses": [{"name": MAIN, "image": "b", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"waiting": {"reason": "ErrImagePull"}}}]}));
        assert!(!finished(&pulling) && nothing_runs(&pulling), "a waiting container: deleted at once");
        let preparing = pod(serde_json::json!({"phase": "Pending",
            "initContainerStatuses": [{"name": PREPARE, "image": "i", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"running": {}}}]}));
        assert!(!nothing_runs(&preparing), "the init container runs: a grace, and followed");
        assert!(!nothing_runs(&running));
    }
}
