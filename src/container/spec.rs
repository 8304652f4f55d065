//! From a request and the configuration to the engine's container spec (pure).

use super::config::ContainerConfig;
use crate::contract::{LaunchError, NarrowedLimit, ResourceLimits, limits::key};
use crate::protocol::{CONTROL_DIR, IN_DIR, INIT_MARKER, OUT_DIR, TMP_DIR, TOOLS_DIR};
use bollard::models::{
    ContainerCreateBody, DeviceRequest, HostConfig, HostConfigLogConfig, Mount, MountTmpfsOptions, MountType,
    PortBinding, ResourcesUlimits,
};
use std::collections::{BTreeMap, HashMap};

/// Size of the control area (request, payload and records).
pub const CONTROL_BYTES: u64 = 16 << 20;

/// The limits actually applied to one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Memory in bytes (swap off).
    pub memory: u64,
    /// Processes.
    pub pids: u64,
    /// Bytes in `/out`.
    pub disk: u64,
    /// CPU in millicores, if capped.
    pub cpu_millis: Option<u64>,
    /// Open files.
    pub nofile: u64,
    /// Size of `/tmp`.
    pub tmp: u64,
    /// Whole GPUs, if any.
    pub gpus: Option<u64>,
    /// Limits narrowed by a ceiling.
    pub narrowed: Vec<NarrowedLimit>,
}

/// Applies defaults and ceilings to the request's limits.
pub fn apply_limits(req: &ResourceLimits, cfg: &ContainerConfig) -> Applied {
    let mut narrowed = Vec::new();
    let mut pick = |k: &str, asked: Option<u64>, default: Option<u64>| -> Option<u64> {
        let v = asked.or(default)?;
        match cfg.ceilings.limits.get(k).copied().filter(|c| *c > 0) {
            Some(c) if v > c => {
                narrowed.push(NarrowedLimit { key: k.to_owned(), from: v, to: c, why: "profile ceiling".into() });
                Some(c)
            }
            _ => Some(v),
        }
    };
    let memory =
        pick(key::MEMORY, req.memory_bytes(), Some(cfg.default_memory_bytes)).unwrap_or(cfg.default_memory_bytes);
    let pids = pick(key::PIDS, req.pids(), Some(cfg.default_pids)).unwrap_or(cfg.default_pids);
    let disk = pick(key::DISK, req.disk_bytes(), Some(cfg.default_disk_bytes)).unwrap_or(cfg.default_disk_bytes);
    let cpu_millis = pick(key::CPU, req.cpu_millis(), cfg.default_cpu_millis);
    let nofile = pick(key::NOFILE, req.get(key::NOFILE), Some(cfg.default_nofile)).unwrap_or(cfg.default_nofile);
    let gpus = pick(key::GPU, req.get(key::GPU), None).map(|m| m.div_ceil(1000));
    let tmp = cfg.max_tmp_bytes.min(memory);
    Applied { memory, pids, disk, cpu_millis, nofile, tmp, gpus, narrowed }
}

/// The names of the attempt's volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volumes {
    /// Inputs (read-only at `/in`), if the request has an input dir.
    pub input: Option<String>,
    /// Outputs (tmpfs, writable at `/out`).
    pub output: String,
    /// Control area (tmpfs).
    pub control: String,
}

/// Everything the spec is built from.
#[derive(Debug, Clone)]
pub struct SpecInput<'a> {
    /// Configuration.
    pub config: &'a ContainerConfig,
    /// The image reference.
    pub image: &'a str,
    /// The argv that runs stevedore's init from [`TOOLS_DIR`] (without the marker).
    pub init_argv: &'a [String],
    /// Host dir of the tools bundle (bind-mounted read-only).
    pub tools_host_dir: String,
    /// Labels.
    pub labels: HashMap<String, String>,
    /// The attempt's volumes.
    pub volumes: &'a Volumes,
    /// The applied limits.
    pub applied: &'a Applied,
    /// `VOLUME`s the image declares.
    pub image_volumes: &'a [String],
    /// Whether the engine applies its seccomp profile (stevedore leaves it in place).
    pub engine_seccomp: bool,
}

/// The spec, and what enforcement it applies or skips (item → how / why).
#[derive(Debug, Clone)]
pub struct Spec {
    /// The body for `create_container`.
    pub body: ContainerCreateBody,
    /// Applied enforcement.
    pub enforcement: BTreeMap<String, String>,
    /// Skipped enforcement.
    pub skipped: BTreeMap<String, String>,
}

pub(crate) fn volume_mount(source: &str, target: &str, read_only: bool) -> Mount {
    Mount {
        typ: Some(MountType::VOLUME),
        source: Some(source.to_owned()),
        target: Some(target.to_owned()),
        read_only: Some(read_only),
        ..Default::default()
    }
}

fn tmpfs_mount(target: &str, size: u64, mode: i64, read_only: bool) -> Mount {
    Mount {
        typ: Some(MountType::TMPFS),
        target: Some(target.to_owned()),
        read_only: Some(read_only),
        tmpfs_options: Some(MountTmpfsOptions {
            size_bytes: Some(i64::try_from(size).unwrap_or(i64::MAX)),
            mode: Some(mode),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn covered(path: &str, ours: &[&str]) -> bool {
    let p = path.trim_end_matches('/');
    ours.contains(&p)
}

/// Builds the container spec.
pub fn build(input: &SpecInput<'_>) -> Spec {
    let cfg = input.config;
    let a = input.applied;
    let mut enforcement = BTreeMap::new();
    let mut skipped = BTreeMap::new();
    let put = |m: &mut BTreeMap<String, String>, k: &str, v: String| {
        m.insert(k.to_owned(), v);
    };

    let mut mounts = vec![Mount {
        typ: Some(MountType::BIND),
        source: Some(input.tools_host_dir.clone()),
        target: Some(TOOLS_DIR.to_owned()),
        read_only: Some(true),
        ..Default::default()
    }];
    if let Some(v) = &input.volumes.input {
        mounts.push(volume_mount(v, IN_DIR, true));
        put(&mut enforcement, "inputs_read_only", format!("volume {v} mounted read-only at {IN_DIR}"));
    }
    mounts.push(volume_mount(&input.volumes.output, OUT_DIR, false));
    mounts.push(volume_mount(&input.volumes.control, CONTROL_DIR, false));
    mounts.push(tmpfs_mount(TMP_DIR, a.tmp, 0o1777, false));
    let ours = [TOOLS_DIR, IN_DIR, OUT_DIR, CONTROL_DIR, TMP_DIR, "/.stevedore"];
    let mut masked = Vec::new();
    for v in input.image_volumes {
        if !covered(v, &ours) {
            mounts.push(tmpfs_mount(v, 1 << 20, 0o755, true));
            masked.push(v.clone());
        }
    }
    if !masked.is_empty() {
        put(
            &mut enforcement,
            "image_volumes",
            format!("declared VOLUMEs {masked:?} masked by read-only tmpfs (no anonymous volume)"),
        );
    }

    let mut host = HostConfig {
        mounts: Some(mounts),
        memory: Some(a.memory as i64),
        memory_swap: Some(a.memory as i64),
        pids_limit: Some(a.pids as i64),
        ulimits: Some(vec![ResourcesUlimits {
            name: Some("nofile".into()),
            soft: Some(a.nofile as i64),
            hard: Some(a.nofile as i64),
        }]),
        network_mode: Some(cfg.network.clone()),
        readonly_rootfs: Some(cfg.hardening.read_only_rootfs),
        log_config: Some(HostConfigLogConfig { typ: Some("none".into()), config: None }),
        auto_remove: Some(false),
        init: Some(false),
        runtime: cfg.runtime.clone(),
        ..Default::default()
    };
    put(&mut enforcement, "memory", format!("cgroup memory limit {} bytes, swap off (memory+swap = memory)", a.memory));
    put(&mut enforcement, "pids", format!("cgroup pids limit {}", a.pids));
    put(&mut enforcement, "nofile", format!("rlimit nofile {}", a.nofile));
    put(&mut enforcement, "tmp", format!("tmpfs {TMP_DIR} of {} bytes (counts as memory)", a.tmp));
    put(
        &mut enforcement,
        "disk",
        format!("{OUT_DIR} is a tmpfs volume of {} bytes: ENOSPC at the limit (its pages count as memory)", a.disk),
    );
    put(&mut enforcement, "init", "stevedore init as PID 1 (reaps, forwards signals, kills stragglers)".into());
    put(&mut enforcement, "log_driver", "none: stdout/stderr captured by stevedore, capped".into());
    put(&mut enforcement, "host_mounts", format!("only {TOOLS_DIR} (read-only) from the host"));
    match a.cpu_millis {
        Some(m) => {
            host.nano_cpus = Some((m as i64) * 1_000_000);
            put(&mut enforcement, "cpu", format!("cfs quota of {m} millicores"));
        }
        None => put(&mut skipped, "cpu", "no cpu limit requested or configured".into()),
    }
    if let Some(n) = a.gpus {
        {
            host.device_requests = Some(vec![DeviceRequest {
                driver: Some(String::new()),
                count: Some(n as i64),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..Default::default()
            }]);
            put(&mut enforcement, "gpu", format!("{n} device(s) requested"));
        }
    }
    if cfg.network == "none" {
        put(&mut enforcement, "network", "none".into());
    } else {
        put(&mut skipped, "network", format!("network mode {:?} by configuration", cfg.network));
    }
    if cfg.hardening.read_only_rootfs {
        put(&mut enforcement, "read_only_rootfs", "root filesystem read-only".into());
    } else {
        put(&mut skipped, "read_only_rootfs", "relaxed by configuration".into());
    }
    if cfg.hardening.drop_all_capabilities {
        host.cap_drop = Some(vec!["ALL".into()]);
        put(&mut enforcement, "capabilities", "all dropped".into());
    } else {
        put(&mut skipped, "capabilities", "relaxed by configuration".into());
    }
    if cfg.hardening.no_new_privileges {
        host.security_opt = Some(vec!["no-new-privileges".into()]);
        put(&mut enforcement, "no_new_privileges", "set".into());
    } else {
        put(&mut skipped, "no_new_privileges", "relaxed by configuration".into());
    }
    let (uid, _) = cfg.uid_gid();
    if uid == 0 || cfg.user.starts_with("root") {
        put(&mut skipped, "non_root", format!("user {:?} by configuration", cfg.user));
    } else {
        put(&mut enforcement, "non_root", format!("user {}", cfg.user));
    }
    if let Some(r) = &cfg.runtime {
        put(&mut enforcement, "runtime", r.clone());
    }
    if input.engine_seccomp {
        put(&mut enforcement, "seccomp", "the engine's default profile".into());
    } else {
        put(&mut skipped, "seccomp", "the engine reports no seccomp support".into());
    }
    let mut exposed = Vec::new();
    if !cfg.ports.is_empty() {
        let mut map = HashMap::new();
        for (cport, hport) in &cfg.ports {
            let k = format!("{cport}/tcp");
            exposed.push(k.clone());
            map.insert(
                k,
                Some(vec![PortBinding {
                    host_ip: Some("127.0.0.1".into()),
                    host_port: Some(if *hport == 0 { String::new() } else { hport.to_string() }),
                }]),
            );
        }
        host.port_bindings = Some(map);
    }

    let mut entrypoint = input.init_argv.to_vec();
    entrypoint.push(INIT_MARKER.to_owned());
    entrypoint.push(CONTROL_DIR.to_owned());
    let body = ContainerCreateBody {
        image: Some(input.image.to_owned()),
        entrypoint: Some(entrypoint),
        cmd: Some(Vec::new()),
        user: Some(cfg.user.clone()),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        open_stdin: Some(true),
        stdin_once: Some(true),
        tty: Some(false),
        labels: Some(input.labels.clone()),
        host_config: Some(host),
        exposed_ports: (!exposed.is_empty()).then_some(exposed),
        stop_signal: Some("SIGTERM".into()),
        ..Default::default()
    };
    Spec { body, enforcement, skipped }
}

/// The launch error for an engine refusal `msg` that says a published port is taken, naming
/// the explicit host port (the one the message mentions, else the first) and the profile;
/// `None` when `msg` is not about a taken port or no host port was explicit.
pub fn port_taken(
    cfg: &ContainerConfig,
    msg: &str,
    source: crate::contract::Cause,
) -> Result<LaunchError, crate::contract::Cause> {
    let taken = msg.contains("port is already allocated") || msg.contains("address already in use");
    let explicit: Vec<(u16, u16)> = cfg.ports.iter().filter(|(_, h)| **h != 0).map(|(c, h)| (*c, *h)).collect();
    let named = explicit.iter().find(|(_, h)| msg.contains(&format!(":{h}"))).or(explicit.first());
    match named {
        Some((container_port, port)) if taken => Ok(LaunchError::PortTaken {
            port: *port,
            container_port: *container_port,
            profile: cfg.profile.clone().unwrap_or_else(|| "default".into()),
            source,
        }),
        _ => Err(source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::config::Ceilings;

    /// Owned strings that live as long as the test process (a test input borrows them).
    fn leak(items: &[&str]) -> &'static [String] {
        Box::leak(items.iter().map(|s| s.to_string()).collect())
    }

    fn input<'a>(cfg: &'a ContainerConfig, vols: &'a Volumes, applied: &'a Applied) -> SpecInput<'a> {
        SpecInput {
            config: cfg,
            image: "img:1",
            init_argv: leak(&["/.stevedore/tools/stevedore"]),
            tools_host_dir: "/tmp/tools".into(),
            labels: HashMap::from([("dev.stevedore.managed".into(), "true".into())]),
            volumes: vols,
            applied,
            image_volumes: leak(&["/data", "/out"]),
            engine_seccomp: true,
        }
    }

    #[test]
    fn seccomp_is_evidence_of_what_the_engine_applies() {
        let cfg = ContainerConfig::default();
        let applied = apply_limits(&ResourceLimits::new(), &cfg);
        let vols = Volumes { input: None, output: "o".into(), control: "c".into() };
        let with = build(&input(&cfg, &vols, &applied));
        assert!(with.enforcement.contains_key("seccomp") && !with.skipped.contains_key("seccomp"));
        let without = build(&SpecInput { engine_seccomp: false, ..input(&cfg, &vols, &applied) });
        assert!(without.skipped.contains_key("seccomp") && !without.enforcement.contains_key("seccomp"));
    }

    #[test]
    fn defaults_are_never_unlimited() {
        let cfg = ContainerConfig::default();
        let a = apply_limits(&ResourceLimits::new(), &cfg);
        assert_eq!(a.memory, 1 << 30);
        assert_eq!(a.pids, 512);
        assert_eq!(a.disk, 512 << 20);
        assert_eq!(a.cpu_millis, None);
        assert_eq!(a.tmp, 256 << 20);
        let small = apply_limits(&ResourceLimits::new().with("memory", 64 << 20), &cfg);
        assert_eq!(small.tmp, 64 << 20, "/tmp no larger than the memory limit");
    }

    #[test]
    fn ceilings_narrow_and_say_so() {
        let cfg = ContainerConfig {
            ceilings: Ceilings { limits: BTreeMap::from([("memory".into(), 128 << 20)]) },
            ..ContainerConfig::default()
        };
        let a = apply_limits(&ResourceLimits::new().with("memory", 1 << 30).with("gpu", 1500), &cfg);
        assert_eq!(a.memory, 128 << 20);
        assert_eq!(
            a.narrowed,
            vec![NarrowedLimit { key: "memory".into(), from: 1 << 30, to: 128 << 20, why: "profile ceiling".into() }]
        );
        assert_eq!(a.gpus, Some(2));
    }

    #[test]
    fn hardened_spec() {
        let cfg = ContainerConfig::default();
        let vols = Volumes { input: Some("vin".into()), output: "vout".into(), control: "vctl".into() };
        let applied = apply_limits(&ResourceLimits::new().with("cpu", 500).with("pids", 64), &cfg);
        let s = build(&input(&cfg, &vols, &applied));
        let h = s.body.host_config.as_ref().unwrap();
        assert_eq!(h.memory, h.memory_swap, "swap disabled");
        assert_eq!(h.nano_cpus, Some(500_000_000));
        assert_eq!(h.pids_limit, Some(64));
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        assert_eq!(h.readonly_rootfs, Some(true));
        assert_eq!(h.cap_drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(h.security_opt, Some(vec!["no-new-privileges".to_owned()]));
        assert_eq!(h.log_config.as_ref().unwrap().typ.as_deref(), Some("none"));
        assert_eq!(h.auto_remove, Some(false));
        let mounts = h.mounts.as_ref().unwrap();
        let find = |t: &str| mounts.iter().find(|m| m.target.as_deref() == Some(t)).unwrap();
        assert_eq!(find("/in").read_only, Some(true));
        assert_eq!(find("/out").read_only, Some(false));
        assert_eq!(find(TOOLS_DIR).read_only, Some(true));
        assert_eq!(find("/data").read_only, Some(true), "image VOLUME masked read-only");
        assert_eq!(mounts.iter().filter(|m| m.target.as_deref() == Some("/out")).count(), 1);
        assert_eq!(find("/tmp").typ, Some(MountType::TMPFS));
        assert_eq!(s.body.user.as_deref(), Some("65532:65532"));
        assert_eq!(s.body.cmd, Some(vec![]), "the image's CMD never reaches the init");
        assert_eq!(s.body.open_stdin, Some(true));
        assert_eq!(s.body.stdin_once, Some(true));
        let ep = s.body.entrypoint.unwrap();
        assert_eq!(&ep[1..], &[INIT_MARKER.to_owned(), CONTROL_DIR.to_owned()]);
        for k in [
            "memory",
            "pids",
            "cpu",
            "network",
            "read_only_rootfs",
            "capabilities",
            "no_new_privileges",
            "non_root",
            "disk",
            "image_volumes",
        ] {
            assert!(s.enforcement.contains_key(k), "missing enforcement {k}");
        }
        assert!(s.skipped.is_empty(), "{:?}", s.skipped);
    }

    #[test]
    fn a_taken_port_names_the_port_and_the_profile() {
        let cfg = ContainerConfig {
            ports: BTreeMap::from([(80, 0), (8080, 41000), (9090, 42000)]),
            profile: Some("web".into()),
            ..ContainerConfig::default()
        };
        let msg = "Error starting userland proxy: listen tcp4 127.0.0.1:42000: bind: address already in use";
        let err = port_taken(&cfg, msg, msg.into()).unwrap();
        assert_eq!(err.to_string(), r#"host port 42000 (container port 9090) of profile "web" is taken"#);
        assert!(port_taken(&cfg, "no such image", "x".into()).is_err());
        let ephemeral_only = ContainerConfig { ports: BTreeMap::from([(80, 0)]), ..ContainerConfig::default() };
        assert!(port_taken(&ephemeral_only, msg, "x".into()).is_err());
    }

    #[test]
    fn relaxations_are_recorded_as_skipped() {
        let mut cfg = ContainerConfig { network: "bridge".into(), user: "0:0".into(), ..ContainerConfig::default() };
        cfg.hardening.read_only_rootfs = false;
        let vols = Volumes { input: None, output: "o".into(), control: "c".into() };
        let applied = apply_limits(&ResourceLimits::new(), &cfg);
        let s = build(&input(&cfg, &vols, &applied));
        for k in ["network", "non_root", "read_only_rootfs", "cpu"] {
            assert!(s.skipped.contains_key(k), "{k} should be skipped");
            assert!(!s.enforcement.contains_key(k));
        }
    }
}
