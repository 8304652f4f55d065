//! Every Pod body of the kube rung, and the evidence of what it enforces (pure).
//!
//! One Pod per attempt: an init container from stevedore's init image copies the init into a
//! fresh `emptyDir` (and, with inputs, unpacks them from its attached stdin into another),
//! then the attempt's container runs that init as PID 1, whatever its image, with the link on
//! its attached stdin and stdout. Only fields Kubernetes 1.20 has are used.

use super::config::KubeConfig;
use super::sizes::Sizes;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, Pod, PodSecurityContext, PodSpec, ResourceRequirements,
    SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use stevedore_init::wire::{IN_DIR, INIT_NAME, OUT_DIR, STAGE_DIR, TMP_DIR, TOOLS_DIR, env as wire_env};

/// The attempt's container.
pub(crate) const MAIN: &str = "attempt";
/// The init container that installs the init and stages the inputs.
pub(crate) const PREPARE: &str = "stevedore-prepare";
/// Where the init lives in stevedore's init image.
pub(crate) const INIT_IN_IMAGE: &str = "/stevedore-init";
/// The tools `emptyDir`'s cap (the init is ~2 MB).
const TOOLS_SIZE: u64 = 64 << 20;

/// What one attempt's Pod is made of.
#[derive(Debug)]
pub(crate) struct PodInput<'a> {
    pub config: &'a KubeConfig,
    pub name: &'a str,
    pub image: &'a str,
    pub init_image: &'a str,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub sizes: &'a Sizes,
    /// The inputs' bytes, when there are inputs.
    pub inputs: Option<u64>,
    /// The inputs go over the link to a root init (`docs/outcome.md`, "Inputs over the
    /// link"), not through the init container's stdin.
    pub root_init: bool,
    /// The command's working directory, when the request names one (else the image's).
    pub workdir: Option<&'a str>,
    /// The grace between SIGTERM and SIGKILL.
    pub grace_secs: i64,
    /// The Pod's own deadline (a backstop behind the host's), from its start.
    pub active_deadline_secs: Option<i64>,
    /// How long the init waits for the host's Start frame, and the init container for the
    /// inputs, before each gives up (a host that died before it spoke leaves no Pod waiting).
    pub host_within_ms: u64,
}

/// A Pod body and what it enforces or skips.
#[derive(Debug)]
pub(crate) struct Spec {
    pub pod: Pod,
    pub enforcement: BTreeMap<String, String>,
    pub skipped: BTreeMap<String, String>,
}

fn put(m: &mut BTreeMap<String, String>, k: &str, v: impl Into<String>) {
    m.insert(k.to_owned(), v.into());
}

/// Bytes as a Kubernetes quantity.
fn bytes(n: u64) -> Quantity {
    Quantity(n.to_string())
}

fn empty_dir(name: &str, memory: bool, size: u64) -> Volume {
    Volume {
        name: name.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: memory.then(|| "Memory".to_owned()),
            size_limit: Some(bytes(size)),
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount { name: name.to_owned(), mount_path: path.to_owned(), read_only: Some(read_only), ..Default::default() }
}

/// Non-root, read-only root filesystem, no privilege escalation, no capability, the
/// runtime's default seccomp profile.
fn hardened(cfg: &KubeConfig) -> SecurityContext {
    SecurityContext {
        run_as_user: Some(i64::from(cfg.user.0)),
        run_as_group: Some(i64::from(cfg.user.1)),
        run_as_non_root: Some(true),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
        seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
        ..Default::default()
    }
}

/// The init as uid 0 holding only the three capabilities it needs to write the inputs and
/// drop itself (`init/src/privileges.rs`); everything else as [`hardened`].
fn root_init(cfg: &KubeConfig) -> SecurityContext {
    let caps = ["SETUID", "SETGID", "SETPCAP"].map(str::to_owned).to_vec();
    SecurityContext {
        run_as_user: Some(0),
        run_as_group: Some(0),
        run_as_non_root: Some(false),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: Some(caps) }),
        ..hardened(cfg)
    }
}

/// How much the Pod's memory limit is above its attempt's container's (see `prepare`).
pub(crate) const POD_HEADROOM: u64 = 16 << 20;

/// Requests equal to limits (a Guaranteed Pod: never evicted for others' pressure first);
/// the memory is the attempt's and the init's delivery reserve (`init/src/reserve.rs`).
fn resources(cfg: &KubeConfig, s: &Sizes) -> ResourceRequirements {
    let mut r = BTreeMap::from([("memory".to_owned(), bytes(s.memory.saturating_add(cfg.link.delivery_reserve)))]);
    if let Some(m) = s.cpu_millis {
        r.insert("cpu".into(), Quantity(format!("{}m", m.max(1))));
    }
    if let Some(n) = s.gpus {
        r.insert(cfg.gpu_resource.clone(), Quantity(n.to_string()));
    }
    ResourceRequirements { limits: Some(r.clone()), requests: Some(r), ..Default::default() }
}

/// The init's arguments: how long it waits for the host's Start frame, and the delivery
/// reserve it holds meanwhile and while the command runs.
fn init_args(within_ms: u64, reserve: u64) -> Vec<String> {
    let mut args = vec!["--start-within-ms".to_owned(), within_ms.to_string()];
    if reserve > 0 {
        args.extend(["--reserve".to_owned(), reserve.to_string()]);
    }
    args
}

/// The attempt's Pod.
pub(crate) fn pod(input: &PodInput<'_>) -> Spec {
    let cfg = input.config;
    let (mut enforcement, skipped) = evidence(cfg, input.sizes);
    let v = volumes(input);
    if input.inputs.is_some() {
        put(&mut enforcement, "inputs_read_only", format!("emptyDir mounted read-only at {IN_DIR}"));
    }
    if input.root_init {
        root_init_evidence(cfg, &mut enforcement);
    }
    if let Some(rc) = &cfg.runtime_class {
        put(&mut enforcement, "runtime", format!("runtimeClassName {rc}"));
    }
    let spec = PodSpec {
        init_containers: Some(vec![prepare_container(input, v.prepare_args, v.prepare_mounts)]),
        containers: vec![main_container(input, v.main_mounts)],
        volumes: Some(v.volumes),
        restart_policy: Some("Never".into()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        share_process_namespace: Some(false),
        termination_grace_period_seconds: Some(input.grace_secs.max(1)),
        active_deadline_seconds: input.active_deadline_secs,
        runtime_class_name: cfg.runtime_class.clone(),
        node_selector: (!cfg.node_selector.is_empty()).then(|| cfg.node_selector.clone()),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(i64::from(cfg.user.0)),
            run_as_group: Some(i64::from(cfg.user.1)),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(input.name.to_owned()),
            labels: Some(input.labels.clone()),
            annotations: (!input.annotations.is_empty()).then(|| input.annotations.clone()),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    };
    Spec { pod, enforcement, skipped }
}

/// The Pod's volumes and who mounts what: the init's (written by the init container, read-only
/// for the attempt), the inputs' when there are some, `/out` and `/tmp`.
struct Volumes {
    volumes: Vec<Volume>,
    prepare_args: Vec<String>,
    prepare_mounts: Vec<VolumeMount>,
    main_mounts: Vec<VolumeMount>,
}

fn volumes(input: &PodInput<'_>) -> Volumes {
    let s = input.sizes;
    let tools_init = format!("{TOOLS_DIR}/{INIT_NAME}");
    let mut volumes = vec![empty_dir("stevedore-tools", false, TOOLS_SIZE)];
    let mut prepare_args = vec!["prepare".to_owned(), "--install".to_owned(), tools_init];
    prepare_args.extend(["--within-ms".to_owned(), input.host_within_ms.to_string()]);
    let mut prepare_mounts = vec![mount("stevedore-tools", TOOLS_DIR, false)];
    let mut main_mounts = vec![mount("stevedore-tools", TOOLS_DIR, true)];
    if let Some(n) = input.inputs {
        // On disk (inputs may be large), capped a little above their size (the kubelet
        // evicts a Pod past its emptyDir's limit).
        volumes.push(empty_dir("stevedore-in", false, n + (16 << 20)));
        main_mounts.push(mount("stevedore-in", IN_DIR, true));
        if input.root_init {
            // The same volume, writable for the root init alone, which clears the mode's
            // group and other write bits (an emptyDir is made 0777) before it writes.
            main_mounts.push(mount("stevedore-in", STAGE_DIR, false));
        } else {
            prepare_args.extend(["--inputs".to_owned(), IN_DIR.to_owned()]);
            prepare_mounts.push(mount("stevedore-in", IN_DIR, false));
        }
    }
    volumes.push(empty_dir("stevedore-out", true, s.disk));
    volumes.push(empty_dir("stevedore-tmp", true, s.tmp));
    main_mounts.push(mount("stevedore-out", OUT_DIR, false));
    main_mounts.push(mount("stevedore-tmp", TMP_DIR, false));
    Volumes { volumes, prepare_args, prepare_mounts, main_mounts }
}

/// The init container: stevedore's init image copies the init where the attempt runs it,
/// and unpacks the inputs it is sent on its stdin.
fn prepare_container(input: &PodInput<'_>, args: Vec<String>, mounts: Vec<VolumeMount>) -> Container {
    let (cfg, s) = (input.config, input.sizes);
    let through_stdin = input.inputs.is_some() && !input.root_init;
    Container {
        name: PREPARE.into(),
        image: Some(input.init_image.to_owned()),
        image_pull_policy: Some(cfg.image_pull.as_str().to_owned()),
        command: Some(vec![INIT_IN_IMAGE.to_owned()]),
        args: Some(args),
        stdin: Some(through_stdin),
        stdin_once: Some(through_stdin),
        tty: Some(false),
        volume_mounts: Some(mounts),
        // Above the attempt's container: the Pod's cgroup takes the larger of its init
        // containers' limits and the sum of its containers', so the Pod's own limit is never
        // the one the command reaches first (there the kernel would reclaim the pages of the
        // init's binary, which this container wrote, and OOM-kill among every process of the
        // Pod); the attempt's container's limit is.
        resources: Some(resources(cfg, &Sizes { memory: s.memory.saturating_add(POD_HEADROOM), ..s.clone() })),
        security_context: Some(hardened(cfg)),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

/// The attempt's container: the user's image, stevedore's init as PID 1, hardened.
fn main_container(input: &PodInput<'_>, mounts: Vec<VolumeMount>) -> Container {
    let cfg = input.config;
    // PID 1's own environment: the runtime merges the image's ENV in, and the API shows it to
    // nobody, so only what the static init's libc reads is set to empty for it; the command
    // gets everything else of the image's back (`Start::image_env`).
    // And the read-ahead hints (`init/src/warm.rs`), which no image may give the init.
    let env = wire_env::INIT_READS
        .iter()
        .chain([&wire_env::WARM])
        .map(|k| EnvVar { name: (*k).to_owned(), value: Some(String::new()), value_from: None })
        .collect();
    Container {
        name: MAIN.into(),
        image: Some(input.image.to_owned()),
        image_pull_policy: Some(cfg.image_pull.as_str().to_owned()),
        command: Some(vec![format!("{TOOLS_DIR}/{INIT_NAME}")]),
        args: Some(init_args(input.host_within_ms, cfg.link.delivery_reserve)),
        env: Some(env),
        working_dir: input.workdir.map(str::to_owned),
        stdin: Some(true),
        stdin_once: Some(true),
        tty: Some(false),
        volume_mounts: Some(mounts),
        resources: Some(resources(cfg, input.sizes)),
        security_context: Some(if input.root_init { root_init(cfg) } else { hardened(cfg) }),
        termination_message_policy: Some("File".into()),
        ..Default::default()
    }
}

/// The user and capabilities of a Pod whose init starts as root to write the inputs.
fn root_init_evidence(cfg: &KubeConfig, enforcement: &mut BTreeMap<String, String>) {
    put(
        enforcement,
        "user",
        format!(
            "runAsUser {} runAsGroup {} for the command: the init starts as runAsUser 0 to write the inputs and drops              to them, groups {:?}, before the command (init_privileges)",
            cfg.user.0, cfg.user.1, cfg.groups
        ),
    );
    if cfg.user.0 != 0 {
        put(
            enforcement,
            "non_root",
            format!(
                "uid {} for the command: the init drops from 0 to it before the command (init_privileges)",
                cfg.user.0
            ),
        );
    }
    put(
        enforcement,
        "capabilities",
        "all dropped but SETUID, SETGID and SETPCAP for the init, which holds them only to write the inputs and drops          them (bounding set emptied, every set cleared) before the command (init_privileges)",
    );
}

/// The enforcement's user and capabilities lines as the API made the Pod (an admission
/// plugin may have changed what was asked), read back from the created Pod's attempt
/// container.
pub(crate) fn read_back(created: &Pod, enforcement: &mut BTreeMap<String, String>) {
    let main = created.spec.as_ref().and_then(|s| s.containers.iter().find(|c| c.name == MAIN));
    let Some(sc) = main.and_then(|c| c.security_context.as_ref()) else {
        put(enforcement, "user", "unknown: the created Pod shows no security context for the attempt's container");
        return;
    };
    let id = |v: Option<i64>| v.map_or_else(|| "the image's".to_owned(), |v| v.to_string());
    let seen = format!(
        "read back from the created Pod: runAsUser {}, runAsGroup {}, runAsNonRoot {}",
        id(sc.run_as_user),
        id(sc.run_as_group),
        sc.run_as_non_root.unwrap_or(false)
    );
    let user = enforcement.remove("user").unwrap_or_default();
    put(enforcement, "user", if user.is_empty() { seen } else { format!("{user} ({seen})") });
    // Claimed only as the API made the Pod: the kubelet refuses to start a runAsNonRoot
    // container as uid 0. A root init's Pod says it as the init's drop (`root_init_evidence`).
    match (sc.run_as_non_root, sc.run_as_user) {
        (Some(true), Some(uid)) if uid != 0 => {
            put(enforcement, "non_root", format!("uid {uid}, runAsNonRoot (read back from the created Pod)"))
        }
        (Some(false) | None, Some(0)) if enforcement.contains_key("non_root") => {}
        _ => {
            enforcement.remove("non_root");
        }
    }
    let caps = sc.capabilities.as_ref();
    let list =
        |l: Option<&Vec<String>>| l.filter(|l| !l.is_empty()).map_or_else(|| "none".to_owned(), |l| l.join(", "));
    let seen = format!(
        "read back: drop {}, add {}",
        list(caps.and_then(|c| c.drop.as_ref())),
        list(caps.and_then(|c| c.add.as_ref()))
    );
    let said = enforcement.remove("capabilities").unwrap_or_default();
    put(enforcement, "capabilities", format!("{said} ({seen})"));
}

/// The evidence of inputs the root init wrote over the link.
pub(crate) fn over_link_evidence() -> String {
    format!(
        "an emptyDir mounted read-only at {IN_DIR}; written over the link by the init as uid 0 into the same emptyDir \
         at {STAGE_DIR} (root's entries, files 0444, dirs 0555, each by descriptor), after it checked it was alone and \
         the mount root's (its 0777 mode cleared of group and other write), empty and on {IN_DIR}'s device; then it \
         dropped to the sandbox user (init_privileges)"
    )
}

/// The evidence of inputs unpacked by the init container, and why not over the link.
pub(crate) fn init_container_evidence(why: &str) -> String {
    format!(
        "an emptyDir mounted read-only at {IN_DIR}; unpacked by stevedore's init container, as the sandbox user, from \
         its attached stdin (not over the link: {why})"
    )
}

/// What the Pod enforces, and what it cannot (item → how, or why not).
fn evidence(cfg: &KubeConfig, s: &Sizes) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut enforcement = BTreeMap::new();
    let mut skipped = BTreeMap::new();
    let how = "the Pod's (requests = limits), no swap on a kubelet node";
    put(&mut enforcement, "memory", crate::link::memory_limit_text(s.memory, cfg.link.delivery_reserve, how));
    match s.cpu_millis {
        Some(m) => put(&mut enforcement, "cpu", format!("Pod cpu limit of {m} millicores (cfs quota)")),
        None => put(&mut skipped, "cpu", "no cpu limit requested or configured"),
    }
    if let Some(n) = s.gpus {
        put(&mut enforcement, "gpu", format!("{n} of extended resource {}", cfg.gpu_resource));
    }
    put(&mut enforcement, "nofile", format!("rlimit nofile {} (set by the init)", s.nofile));
    let disk = format!(
        "{OUT_DIR} is a memory-backed emptyDir of sizeLimit {} bytes: a tmpfs of that size where the cluster sizes \
         memory-backed volumes (SizeMemoryBackedVolumes), else a limit the kubelet enforces by eviction; its pages \
         count as memory",
        s.disk
    );
    put(&mut enforcement, "disk", disk);
    put(&mut enforcement, "tmp", format!("memory-backed emptyDir {TMP_DIR} of sizeLimit {} bytes", s.tmp));
    put(&mut enforcement, "user", format!("runAsUser {} runAsGroup {}, runAsNonRoot", cfg.user.0, cfg.user.1));
    for (item, how) in [
        (
            "init",
            "stevedore's static init as PID 1, from an init container of stevedore's init image into an emptyDir \
             mounted read-only (the image's entrypoint never runs first)",
        ),
        ("read_only_rootfs", "readOnlyRootFilesystem"),
        ("capabilities", "all dropped"),
        ("no_new_privileges", "allowPrivilegeEscalation: false"),
        ("seccomp", "RuntimeDefault"),
        ("service_account", "no token mounted (automountServiceAccountToken: false), no service links"),
        ("host_namespaces", "none (no host network, pid or ipc)"),
        ("log_driver", "the link goes over the attach stream; the kubelet's log holds only the init's own words"),
    ] {
        put(&mut enforcement, item, how);
    }
    put(
        &mut skipped,
        "pids",
        "Kubernetes limits processes per node (the kubelet's podPidsLimit), not per Pod; the rung cannot see it",
    );
    put(
        &mut skipped,
        "image_volumes",
        "the image's declared VOLUMEs are the runtime's to mount (the API does not show them)",
    );
    if cfg.network_denied {
        let how = "none: the namespace's deny-all NetworkPolicy, on a CNI that enforces it (as configured)";
        put(&mut enforcement, "network", how);
    } else {
        put(
            &mut skipped,
            "network",
            "not enforced: every Pod has the cluster's network, and only a NetworkPolicy on a CNI that enforces it \
             can deny that (configure network_denied once the namespace has one)",
        );
    }
    (enforcement, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes() -> Sizes {
        Sizes {
            memory: 64 << 20,
            cpu_millis: Some(500),
            disk: 8 << 20,
            tmp: 16 << 20,
            nofile: 1024,
            gpus: None,
            narrowed: Vec::new(),
            skipped: BTreeMap::new(),
        }
    }

    fn input<'a>(cfg: &'a KubeConfig, s: &'a Sizes, inputs: Option<u64>) -> PodInput<'a> {
        PodInput {
            config: cfg,
            name: "sd-w-abc",
            image: "busybox:1",
            init_image: "stevedore-init:0123",
            labels: BTreeMap::from([("dev.stevedore.managed".into(), "true".into())]),
            annotations: BTreeMap::new(),
            sizes: s,
            inputs,
            root_init: false,
            workdir: None,
            grace_secs: 3,
            active_deadline_secs: Some(40),
            host_within_ms: 120_000,
        }
    }

    #[test]
    fn the_pod_is_hardened_guaranteed_and_runs_the_init_from_an_empty_dir() {
        let cfg = KubeConfig::default();
        let s = sizes();
        let spec = pod(&input(&cfg, &s, None)).pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.enable_service_links, Some(false));
        assert_eq!((spec.host_network, spec.host_pid, spec.host_ipc), (Some(false), Some(false), Some(false)));
        assert_eq!(spec.termination_grace_period_seconds, Some(3));
        assert_eq!(spec.active_deadline_seconds, Some(40));
        let main = &spec.containers[0];
        assert_eq!(main.command.as_ref().unwrap(), &vec![format!("{TOOLS_DIR}/{INIT_NAME}")]);
        assert_eq!(
            main.args.as_ref().unwrap(),
            &vec!["--start-within-ms", "120000", "--reserve", "8388608"],
            "the image's CMD never reaches the init; a host gone before it spoke ends it; it holds the delivery reserve"
        );
        assert_eq!((main.stdin, main.stdin_once, main.tty), (Some(true), Some(true), Some(false)));
        let sc = main.security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.run_as_user, Some(65532));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.capabilities.as_ref().unwrap().drop.as_ref().unwrap(), &vec!["ALL".to_owned()]);
        assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        let r = main.resources.as_ref().unwrap();
        assert_eq!(r.limits, r.requests, "Guaranteed");
        // The attempt's 64 MiB and the init's 8 MiB delivery reserve.
        assert_eq!(r.limits.as_ref().unwrap()["memory"].0, (72u64 << 20).to_string());
        assert_eq!(r.limits.as_ref().unwrap()["cpu"].0, "500m");
        let mounts: Vec<(&str, Option<bool>)> =
            main.volume_mounts.as_ref().unwrap().iter().map(|m| (m.mount_path.as_str(), m.read_only)).collect();
        assert_eq!(mounts, vec![(TOOLS_DIR, Some(true)), (OUT_DIR, Some(false)), (TMP_DIR, Some(false))]);
        let env: Vec<&str> = main.env.as_ref().unwrap().iter().map(|e| e.name.as_str()).collect();
        assert!(env.contains(&"GLIBC_TUNABLES"), "{env:?}");
        assert!(!env.contains(&"LD_LIBRARY_PATH"), "the image's own reaches the command: {env:?}");
        let vols = spec.volumes.as_ref().unwrap();
        let out = vols.iter().find(|v| v.name == "stevedore-out").unwrap().empty_dir.as_ref().unwrap();
        assert_eq!(out.medium.as_deref(), Some("Memory"));
        assert_eq!(out.size_limit.as_ref().unwrap().0, (8u64 << 20).to_string());
        let init = &spec.init_containers.as_ref().unwrap()[0];
        assert_eq!(init.image.as_deref(), Some("stevedore-init:0123"));
        assert_eq!(init.stdin, Some(false), "no inputs: nothing is read");
        let limits = |c: &Container| c.resources.as_ref().unwrap().limits.clone().unwrap();
        assert_eq!(limits(init)["memory"].0, (88u64 << 20).to_string(), "the Pod's limit is above its container's");
        assert_eq!(limits(init)["cpu"], limits(main)["cpu"]);
        let r = init.resources.as_ref().unwrap();
        assert_eq!(r.limits, r.requests, "the init container keeps the Pod Guaranteed");
    }

    #[test]
    fn inputs_are_staged_through_the_init_containers_stdin_and_mounted_read_only() {
        let cfg = KubeConfig::default();
        let s = sizes();
        let spec = pod(&input(&cfg, &s, Some(1000)));
        assert!(spec.enforcement.contains_key("inputs_read_only"));
        let p = spec.pod.spec.unwrap();
        let init = &p.init_containers.as_ref().unwrap()[0];
        assert_eq!((init.stdin, init.stdin_once), (Some(true), Some(true)));
        assert!(init.args.as_ref().unwrap().ends_with(&["--inputs".to_owned(), IN_DIR.to_owned()]));
        let ro = p.containers[0].volume_mounts.as_ref().unwrap().iter().find(|m| m.mount_path == IN_DIR).unwrap();
        assert_eq!(ro.read_only, Some(true));
    }

    #[test]
    fn a_root_init_holds_only_what_it_drops_and_writes_through_a_second_mount() {
        let cfg = KubeConfig::default().groups([5000]);
        let s = sizes();
        let spec = pod(&PodInput { root_init: true, ..input(&cfg, &s, Some(1000)) });
        assert!(spec.enforcement["user"].contains("runAsUser 0") && spec.enforcement["user"].contains("[5000]"));
        assert!(spec.enforcement["capabilities"].contains("SETUID, SETGID and SETPCAP"));
        assert!(spec.enforcement["non_root"].contains("drops from 0 to it"), "{:?}", spec.enforcement);
        let mut read = spec.enforcement.clone();
        read_back(&spec.pod, &mut read);
        assert_eq!(read["non_root"], spec.enforcement["non_root"], "a root init's Pod keeps the drop's words");
        let p = spec.pod.spec.unwrap();
        let init = &p.init_containers.as_ref().unwrap()[0];
        assert_eq!((init.stdin, init.stdin_once), (Some(false), Some(false)), "nothing goes through its stdin");
        assert!(!init.args.as_ref().unwrap().contains(&"--inputs".to_owned()));
        assert!(init.volume_mounts.as_ref().unwrap().iter().all(|m| m.name != "stevedore-in"));
        assert_eq!(init.security_context.as_ref().unwrap().run_as_user, Some(65532), "the init container stays");
        let main = &p.containers[0];
        let sc = main.security_context.as_ref().unwrap();
        assert_eq!((sc.run_as_user, sc.run_as_group, sc.run_as_non_root), (Some(0), Some(0), Some(false)));
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_owned()][..]));
        assert_eq!(caps.add.as_deref(), Some(&["SETUID".to_owned(), "SETGID".to_owned(), "SETPCAP".to_owned()][..]));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        let mounts: Vec<(&str, &str, Option<bool>)> = main
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only))
            .filter(|m| m.0 == "stevedore-in")
            .collect();
        assert_eq!(mounts, vec![("stevedore-in", IN_DIR, Some(true)), ("stevedore-in", STAGE_DIR, Some(false))]);
    }

    #[test]
    fn a_gpu_is_the_configured_extended_resource_in_whole_devices() {
        let cfg = KubeConfig::default();
        let s = Sizes { gpus: Some(2), ..sizes() };
        let spec = pod(&input(&cfg, &s, None));
        assert_eq!(spec.enforcement["gpu"], "2 of extended resource nvidia.com/gpu");
        let r = spec.pod.spec.unwrap().containers[0].resources.clone().unwrap();
        assert_eq!(r.limits.as_ref().unwrap()["nvidia.com/gpu"].0, "2");
        assert_eq!(r.limits, r.requests);
    }

    /// `non_root` is claimed from the created Pod, not from what was asked: runAsNonRoot with a
    /// uid other than 0 is; an admission plugin that made it root is not.
    #[test]
    fn non_root_is_read_back_from_the_created_pod() {
        let (cfg, s) = (KubeConfig::default(), sizes());
        let spec = pod(&input(&cfg, &s, None));
        let mut read = spec.enforcement.clone();
        read_back(&spec.pod, &mut read);
        assert_eq!(read["non_root"], "uid 65532, runAsNonRoot (read back from the created Pod)");
        let mut rooted = spec.pod.clone();
        let sc = rooted.spec.as_mut().unwrap().containers[0].security_context.as_mut().unwrap();
        (sc.run_as_user, sc.run_as_non_root) = (Some(0), Some(false));
        let mut read = spec.enforcement.clone();
        read_back(&rooted, &mut read);
        assert!(!read.contains_key("non_root"), "{read:?}");
    }

    #[test]
    fn the_network_is_claimed_only_when_configured_and_pids_are_skipped() {
        let s = sizes();
        let open = pod(&input(&KubeConfig::default(), &s, None));
        assert!(open.skipped["network"].contains("not enforced"));
        assert!(!open.enforcement.contains_key("network"));
        assert!(open.skipped.contains_key("pids"));
        let denied = KubeConfig::default().network_denied(true);
        let closed = pod(&input(&denied, &s, None));
        assert!(closed.enforcement["network"].contains("NetworkPolicy"));
        assert!(!closed.skipped.contains_key("network"));
    }
}
