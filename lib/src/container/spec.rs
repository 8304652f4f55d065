//! From a request and the configuration to the engine's container spec (pure).

use super::config::ContainerConfig;
use super::labels;
use super::site::ToolsVolume;
use super::sizes::Sizes;
use crate::contract::LaunchError;
use crate::engine::EngineError;
use bollard::models::{
    ContainerCreateBody, DeviceRequest, HostConfig, HostConfigLogConfig, Mount, MountTmpfsOptions, MountType,
    MountVolumeOptions, PortBinding, ResourcesUlimits,
};
use std::collections::{BTreeMap, HashMap};
use stevedore_init::wire::{IN_DIR, INIT_NAME, OUT_DIR, STAGE_DIR, TMP_DIR, TOOLS_DIR, env as wire_env};

/// Everything the spec is built from.
#[derive(Debug, Clone)]
pub struct SpecInput<'a> {
    /// Configuration.
    pub config: &'a ContainerConfig,
    /// The image reference.
    pub image: &'a str,
    /// The volume holding stevedore's init (mounted read-only at [`TOOLS_DIR`]).
    pub tools: &'a ToolsVolume,
    /// Labels.
    pub labels: HashMap<String, String>,
    /// The input volume (read-only at `/in`), when the request has inputs.
    pub input_volume: Option<&'a str>,
    /// The inputs travel over the link (`docs/outcome.md`, "Inputs over the link"): the input
    /// volume also writable at `STAGE_DIR`, the init started as uid 0 holding only `SETUID`,
    /// `SETGID` and `SETPCAP`; it writes them there and drops to the sandbox user before the
    /// command (`Start::credentials`).
    pub stage: bool,
    /// The applied limits.
    pub applied: &'a Sizes,
    /// `VOLUME`s the image declares.
    pub image_volumes: &'a [String],
    /// Whether the engine applies its seccomp profile (stevedore leaves it in place).
    pub engine_seccomp: bool,
    /// Whether the engine is Podman (which needs some limits spelled out).
    pub podman: bool,
    /// The engine host's address published ports bind to: loopback on a local engine, every
    /// address on a remote one (whose loopback the caller cannot reach).
    pub publish_ip: &'a str,
    /// Named caches: (name, volume, path), mounted read-write.
    pub caches: &'a [(String, String, String)],
    /// The init's read-ahead hints (a parked container's, `init/src/warm.rs`), as its
    /// environment carries them.
    pub warm: Option<&'a str>,
}

/// The spec, and what enforcement it applies or skips (item → how / why).
#[derive(Debug, Clone)]
pub struct Spec {
    /// The body for `create_container`.
    pub body: ContainerCreateBody,
    /// Sizes enforcement.
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

/// `mount`, never filled from the image's files at its destination.
fn no_copy(mount: Mount) -> Mount {
    Mount { volume_options: Some(MountVolumeOptions { no_copy: Some(true), ..Default::default() }), ..mount }
}

/// The read-only mount of the tools volume at [`TOOLS_DIR`]. Should the volume be gone when
/// the container is created (another process's `reclaim --tools` took it), the engine creates
/// one of that name again: then empty (`NoCopy`: never filled from what the image holds at
/// that path, which would run as PID 1 and hold the attempt's key) and labelled as this
/// incarnation's tools, but without [`super::tools::TOOLS_CREATED`], so the rung never takes
/// it for its own and `close`, `reclaim` and `prune` remove it.
pub(crate) fn tools_mount(tools: &ToolsVolume, incarnation: Option<&str>) -> Mount {
    if let Some(dir) = &tools.bind {
        return Mount {
            typ: Some(MountType::BIND),
            source: Some(dir.clone()),
            target: Some(TOOLS_DIR.to_owned()),
            read_only: Some(true),
            ..Default::default()
        };
    }
    let mut l = labels::tools(&tools.digest, "created-by-a-mount");
    if let Some(i) = incarnation {
        l.insert(labels::INCARNATION.to_owned(), i.to_owned());
    }
    Mount {
        volume_options: Some(MountVolumeOptions { no_copy: Some(true), labels: Some(l), ..Default::default() }),
        ..volume_mount(&tools.volume, TOOLS_DIR, true)
    }
}

/// A named cache's bind, read-write and `nocopy`: an engine never fills a cache volume from
/// what the image holds at that path (a cache is the attempts' own, never the image's). A
/// bind, not a mount: Podman 4's Docker API ignores a mount's `NoCopy` and honours a bind's
/// (both seen with 4.3.1; Docker honours both). The path holds no `:` (`check_cache`).
pub(crate) fn cache_bind(volume: &str, path: &str) -> String {
    format!("{volume}:{path}:nocopy")
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

/// The first of the image's declared `VOLUME`s that lies strictly inside one of stevedore's
/// own mounts or a cache's, with that mount: the engine would make its mount point inside
/// a read-only mount (`/.stevedore/tools/sub`: a 500 at the start), and a tmpfs there would
/// need the same. Such an image is refused before anything is made (`LaunchError::ImageVolume`).
pub(crate) fn nested_volume(image_volumes: &[String], cache_paths: &[&str]) -> Option<(String, String)> {
    let ours: Vec<&str> =
        [TOOLS_DIR, IN_DIR, OUT_DIR, TMP_DIR, "/.stevedore"].into_iter().chain(cache_paths.iter().copied()).collect();
    image_volumes.iter().find_map(|v| {
        let path = std::path::Path::new(v.as_str());
        ours.iter()
            .find(|m| path != std::path::Path::new(m) && path.starts_with(m))
            .map(|m| (v.clone(), (*m).to_owned()))
    })
}

/// The image's declared `VOLUME`s that a read-only tmpfs masks: those that are not one of
/// stevedore's own mounts or a cache's.
pub(crate) fn masked_volumes(image_volumes: &[String], cache_paths: &[&str]) -> Vec<String> {
    let ours: Vec<&str> =
        [TOOLS_DIR, IN_DIR, OUT_DIR, TMP_DIR, "/.stevedore"].into_iter().chain(cache_paths.iter().copied()).collect();
    image_volumes.iter().filter(|v| !covered(v, &ours)).cloned().collect()
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Builds the container spec.
pub fn build(input: &SpecInput<'_>) -> Spec {
    let cfg = input.config;
    let a = input.applied;
    let mut enforcement = BTreeMap::new();
    let mut skipped = BTreeMap::new();
    let mounts = mounts(input, &mut enforcement);
    let binds: Vec<String> = input.caches.iter().map(|(_, volume, path)| cache_bind(volume, path)).collect();
    let reserve = cfg.link.delivery_reserve;
    let memory = clamp(a.memory.saturating_add(reserve));
    let mut host = HostConfig {
        mounts: Some(mounts),
        binds: (!binds.is_empty()).then_some(binds),
        memory: Some(memory),
        memory_swap: Some(memory),
        pids_limit: Some(clamp(a.pids)),
        ulimits: Some(ulimits(a, input.podman)),
        network_mode: Some(cfg.network.clone()),
        readonly_rootfs: Some(cfg.hardening.read_only_rootfs),
        log_config: Some(HostConfigLogConfig { typ: Some("none".into()), config: None }),
        auto_remove: Some(false),
        init: Some(false),
        runtime: cfg.runtime.clone(),
        ..Default::default()
    };
    limits(a, reserve, &mut host, &mut enforcement, &mut skipped);
    hardening(cfg, input.engine_seccomp, &mut host, &mut enforcement, &mut skipped);
    let user = if input.stage {
        root_init(cfg, &mut host, &mut enforcement);
        "0:0".to_owned()
    } else {
        if !cfg.groups.is_empty() {
            host.group_add = Some(cfg.groups.iter().map(u32::to_string).collect());
        }
        cfg.user.clone()
    };
    let exposed = publish(cfg, input.publish_ip, &mut host);

    // PID 1's own environment: Docker merges the image's ENV in and no call removes a key,
    // so every variable a loader or libc reads is set to empty. The init is static and never
    // reads them; this keeps even its libc start-up clean. The command gets the image's
    // values back in the Start frame.
    let mut env: Vec<String> = wire_env::LOADER.iter().map(|k| format!("{k}=")).collect();
    // Set always, empty where the pool gives none: an image's own never reaches the init.
    env.push(format!("{}={}", wire_env::WARM, input.warm.unwrap_or_default()));
    let body = ContainerCreateBody {
        image: Some(input.image.to_owned()),
        entrypoint: Some(vec![format!("{TOOLS_DIR}/{INIT_NAME}")]),
        cmd: Some(init_args(reserve)),
        env: Some(env),
        user: Some(user),
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

/// The evidence of the limits the engine can change on a running container (memory, pids,
/// CPU), written once for a container's create and a parked one's claim (`claimed`: the
/// limits were set with `docker update` as the attempt claimed it).
pub(crate) fn cgroup_limits_evidence(
    a: &Sizes,
    reserve: u64,
    claimed: bool,
    enforcement: &mut BTreeMap<String, String>,
    skipped: &mut BTreeMap<String, String>,
) {
    let set = if claimed { " (as claimed)" } else { "" };
    let swap = if claimed { "swap off (as claimed)" } else { "swap off (memory+swap = memory)" };
    put(enforcement, "memory", crate::link::memory_limit_text(a.memory, reserve, swap));
    put(enforcement, "pids", format!("cgroup pids limit {}{set}", a.pids));
    match a.cpu_millis {
        Some(m) => {
            put(enforcement, "cpu", format!("cfs quota of {m} millicores{set}"));
            skipped.remove("cpu");
        }
        None => {
            enforcement.remove("cpu");
            put(skipped, "cpu", "no cpu limit requested or configured".into());
        }
    }
}

/// The cgroup limits the engine does not apply (`engine::EngineFacts::features`: a rootless
/// engine on cgroup v1, or an info's `MemoryLimit`, `CpuCfsQuota`, `PidsLimit` false) move
/// from `enforcement` to `skipped`: the engine takes them and ignores them.
pub(crate) fn engine_limits(
    features: &[String],
    enforcement: &mut BTreeMap<String, String>,
    skipped: &mut BTreeMap<String, String>,
) {
    for (key, info) in [("memory", "MemoryLimit"), ("cpu", "CpuCfsQuota"), ("pids", "PidsLimit")] {
        if !features.iter().any(|f| f == key) && enforcement.remove(key).is_some() {
            let why = format!(
                "asked, but the engine does not apply it (a rootless engine on cgroup v1, which has no cgroup of \
                 its own to give a container; or its info says {info} false: no such controller)"
            );
            put(skipped, key, why);
        }
    }
}

/// The id outside that a rootless engine run by `owner` gives the container's `inside` (not
/// 0, which is the owner itself): the owner's first range in `subuid` (`name:start:count` or
/// `uid:start:count`), `inside` counted from its start, as Podman and rootless Docker map them.
pub(crate) fn subordinate(owner: u32, inside: u32, subuid: &std::path::Path) -> Option<u64> {
    let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(owner)).ok().flatten().map(|u| u.name);
    let text = std::fs::read_to_string(subuid).ok()?;
    let (start, count) = text.lines().find_map(|l| {
        let mut f = l.split(':');
        let who = f.next()?;
        let mine = who == owner.to_string() || name.as_deref() == Some(who);
        let (start, count) = (f.next()?.parse::<u64>().ok()?, f.next()?.parse::<u64>().ok()?);
        mine.then_some((start, count))
    })?;
    (inside >= 1 && u64::from(inside) <= count).then(|| start + u64::from(inside) - 1)
}

/// The init's arguments: the delivery reserve it holds (`init/src/reserve.rs`).
pub(crate) fn init_args(reserve: u64) -> Vec<String> {
    match reserve {
        0 => Vec::new(),
        r => vec!["--reserve".into(), r.to_string()],
    }
}

fn put(m: &mut BTreeMap<String, String>, k: &str, v: String) {
    m.insert(k.to_owned(), v);
}

/// The init's tools, the inputs, `/out`, `/tmp`, the caches and the image's masked volumes.
fn mounts(input: &SpecInput<'_>, enforcement: &mut BTreeMap<String, String>) -> Vec<Mount> {
    let a = input.applied;
    let mut mounts = vec![tools_mount(input.tools, input.labels.get(labels::INCARNATION).map(String::as_str))];
    let host_mounts = match &input.tools.bind {
        Some(dir) => {
            format!("only stevedore's init: the directory {dir} (this user's, 0755), read-only at {TOOLS_DIR}")
        }
        None => "none: the init comes from an engine volume, nothing from the host".into(),
    };
    put(enforcement, "host_mounts", host_mounts);
    if let Some(v) = input.input_volume {
        // Never filled from what the image holds at /in: the volume is the inputs' alone,
        // and its root stays root's 0755 (a writable image dir copied up would let the
        // command write through the staging mount).
        mounts.push(no_copy(volume_mount(v, IN_DIR, true)));
        put(enforcement, "inputs_read_only", format!("volume {v} mounted read-only at {IN_DIR}"));
        if input.stage {
            mounts.push(no_copy(volume_mount(v, STAGE_DIR, false)));
        }
    }
    // The command writes /out; only the init reads it back, so it needs no volume: a tmpfs
    // of the disk limit gives ENOSPC at the limit on any engine.
    mounts.push(tmpfs_mount(OUT_DIR, a.disk, 0o777, false));
    mounts.push(tmpfs_mount(TMP_DIR, a.tmp, 0o1777, false));
    for (name, volume, path) in input.caches {
        put(
            enforcement,
            &format!("cache.{name}"),
            format!("volume {volume} read-write at {path}, outside the disk limit"),
        );
    }
    let cache_paths: Vec<&str> = input.caches.iter().map(|(_, _, p)| p.as_str()).collect();
    let masked = masked_volumes(input.image_volumes, &cache_paths);
    for v in &masked {
        mounts.push(tmpfs_mount(v, 1 << 20, 0o755, true));
    }
    if !masked.is_empty() {
        let text = format!("declared VOLUMEs {masked:?} masked by read-only tmpfs (no anonymous volume)");
        put(enforcement, "image_volumes", text);
    }
    mounts
}

fn ulimits(a: &Sizes, podman: bool) -> Vec<ResourcesUlimits> {
    let mut ulimits = vec![ResourcesUlimits {
        name: Some("nofile".into()),
        soft: Some(clamp(a.nofile)),
        hard: Some(clamp(a.nofile)),
    }];
    if podman {
        // Podman refuses to start a container whose nproc it would have to raise (rlimit
        // type 7) unless the limit is given; the cgroup's pids limit is the real bound.
        ulimits.push(ResourcesUlimits {
            name: Some("nproc".into()),
            soft: Some(clamp(a.pids)),
            hard: Some(clamp(a.pids)),
        });
    }
    ulimits
}

/// The limits as the engine applies them, and the evidence of each.
fn limits(
    a: &Sizes,
    reserve: u64,
    host: &mut HostConfig,
    enforcement: &mut BTreeMap<String, String>,
    skipped: &mut BTreeMap<String, String>,
) {
    cgroup_limits_evidence(a, reserve, false, enforcement, skipped);
    put(enforcement, "nofile", format!("rlimit nofile {}", a.nofile));
    put(enforcement, "tmp", format!("tmpfs {TMP_DIR} of {} bytes (counts as memory)", a.tmp));
    let disk = format!("{OUT_DIR} is a tmpfs of {} bytes: ENOSPC at the limit (its pages count as memory)", a.disk);
    put(enforcement, "disk", disk);
    put(
        enforcement,
        "init",
        "stevedore's static init as PID 1 (reaps, forwards signals, kills stragglers; no loader, its own environment \
         ignored)"
            .into(),
    );
    put(enforcement, "log_driver", "none: stdout/stderr captured by stevedore, capped".into());
    if let Some(m) = a.cpu_millis {
        host.nano_cpus = Some(clamp(m).saturating_mul(1_000_000));
    }
    if let Some(n) = a.gpus {
        host.device_requests = Some(vec![DeviceRequest {
            driver: Some(String::new()),
            count: Some(clamp(n)),
            capabilities: Some(vec![vec!["gpu".into()]]),
            ..Default::default()
        }]);
        put(enforcement, "gpu", format!("{n} device(s) requested"));
    }
}

/// A container created and never started, for the archive API: the inputs' staging helper
/// (`mount`: the input volume at `/in`), the tools volume's filler (the volume at the tools
/// dir), an image's probe (nothing). No network, no logs; its entrypoint names its role and
/// exists nowhere, so a start by mistake fails.
pub(crate) fn never_started(
    image: &str,
    role: &str,
    labels: HashMap<String, String>,
    mount: Option<Mount>,
) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(image.to_owned()),
        entrypoint: Some(vec![format!("/.stevedore-{role}-never-started")]),
        cmd: Some(vec![]),
        labels: Some(labels),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            mounts: mount.map(|m| vec![m]),
            log_config: Some(HostConfigLogConfig { typ: Some("none".into()), config: None }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The never-started container that mounts `volume` read-write at `/in`: the archive API
/// refuses the attempt's own read-only mount, so inputs go in through it.
pub(crate) fn staging_helper(image: &str, volume: &str, labels: HashMap<String, String>) -> ContainerCreateBody {
    never_started(image, "helper", labels, Some(no_copy(volume_mount(volume, IN_DIR, false))))
}

/// The throwaway container that runs stevedore's init as root with a new cache volume, to
/// give the volume's root to the sandbox user (`owner`): no network, no logs, only the
/// capabilities a chown needs. The volume is bound `nocopy` at a fresh path the image
/// cannot hold (`/.stevedore-cache-<random>`): nothing of the image is copied into it, and no
/// symlink of the image's can move the chown.
pub(crate) fn cache_owner(
    image: &str,
    tools: &ToolsVolume,
    incarnation: &str,
    volume: &str,
    owner: (u32, u32),
    labels: HashMap<String, String>,
) -> ContainerCreateBody {
    let at = format!("/.stevedore-cache-{:016x}", rand::random::<u64>());
    ContainerCreateBody {
        image: Some(image.to_owned()),
        entrypoint: Some(vec![format!("{TOOLS_DIR}/{INIT_NAME}")]),
        cmd: Some(vec!["chown-dir".into(), at.clone(), owner.0.to_string(), owner.1.to_string()]),
        user: Some("0:0".into()),
        labels: Some(labels),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: Some(vec!["CHOWN".into(), "FOWNER".into()]),
            mounts: Some(vec![tools_mount(tools, Some(incarnation))]),
            binds: Some(vec![cache_bind(volume, &at)]),
            log_config: Some(HostConfigLogConfig { typ: Some("none".into()), config: None }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The init as uid 0 with the three capabilities it needs to drop itself (`init/src/privileges.rs`):
/// the engine drops every other one, and no-new-privileges stays set (`stage::not_over_link`
/// requires both).
fn root_init(cfg: &ContainerConfig, host: &mut HostConfig, enforcement: &mut BTreeMap<String, String>) {
    host.cap_add = Some(vec!["SETUID".into(), "SETGID".into(), "SETPCAP".into()]);
    put(
        enforcement,
        "non_root",
        format!(
            "user {} for the command: the init starts as uid 0 to write the inputs and drops to it, groups {:?}, \
             before the command (init_privileges)",
            cfg.user, cfg.groups
        ),
    );
    put(
        enforcement,
        "capabilities",
        "all dropped by the engine but SETUID, SETGID and SETPCAP, which the init holds only to write the inputs and \
         drops (bounding set emptied, every set cleared) before the command (init_privileges)"
            .into(),
    );
}

/// Network, read-only root, capabilities, privileges, user, runtime, seccomp: each applied
/// or skipped as configured, and said so.
fn hardening(
    cfg: &ContainerConfig,
    engine_seccomp: bool,
    host: &mut HostConfig,
    enforcement: &mut BTreeMap<String, String>,
    skipped: &mut BTreeMap<String, String>,
) {
    let put = |m: &mut BTreeMap<String, String>, k: &str, v: String| {
        m.insert(k.to_owned(), v);
    };
    if cfg.network == "none" {
        put(enforcement, "network", "none".into());
    } else {
        put(skipped, "network", format!("network mode {:?} by configuration", cfg.network));
    }
    if cfg.hardening.read_only_rootfs {
        put(enforcement, "read_only_rootfs", "root filesystem read-only".into());
    } else {
        put(skipped, "read_only_rootfs", "relaxed by configuration".into());
    }
    if cfg.hardening.drop_all_capabilities {
        host.cap_drop = Some(vec!["ALL".into()]);
        put(enforcement, "capabilities", "all dropped".into());
    } else {
        put(skipped, "capabilities", "relaxed by configuration".into());
    }
    if cfg.hardening.no_new_privileges {
        host.security_opt = Some(vec!["no-new-privileges".into()]);
        put(enforcement, "no_new_privileges", "set".into());
    } else {
        put(skipped, "no_new_privileges", "relaxed by configuration".into());
    }
    let (uid, _) = cfg.uid_gid();
    if uid == 0 || cfg.user.starts_with("root") {
        put(skipped, "non_root", format!("user {:?} by configuration", cfg.user));
    } else {
        put(enforcement, "non_root", format!("user {}", cfg.user));
    }
    if let Some(r) = &cfg.runtime {
        put(enforcement, "runtime", r.clone());
    }
    if engine_seccomp {
        put(enforcement, "seccomp", "the engine's default profile".into());
    } else {
        put(skipped, "seccomp", "the engine reports no seccomp support".into());
    }
}

/// The published ports, on `publish_ip`; returns the exposed port keys.
fn publish(cfg: &ContainerConfig, publish_ip: &str, host: &mut HostConfig) -> Vec<String> {
    let mut exposed = Vec::new();
    if !cfg.ports.is_empty() {
        let mut map = HashMap::new();
        for (cport, hport) in &cfg.ports {
            let k = format!("{cport}/tcp");
            exposed.push(k.clone());
            map.insert(
                k,
                Some(vec![PortBinding {
                    host_ip: Some(publish_ip.to_owned()),
                    host_port: Some(if *hport == 0 { String::new() } else { hport.to_string() }),
                }]),
            );
        }
        host.port_bindings = Some(map);
    }

    exposed
}

/// The launch error for an engine refusal that says a published port is taken, naming the
/// explicit host port (the one the message mentions, else the first) and the profile; the
/// engine error back when it is not about a taken port or no host port was explicit.
pub fn port_taken(cfg: &ContainerConfig, err: EngineError) -> LaunchError {
    let msg = err.message();
    let taken = msg.contains("port is already allocated") || msg.contains("address already in use");
    let explicit: Vec<(u16, u16)> = cfg.ports.iter().filter(|(_, h)| **h != 0).map(|(c, h)| (*c, *h)).collect();
    let named = explicit.iter().find(|(_, h)| msg.contains(&format!(":{h}"))).or(explicit.first());
    match named {
        Some((container_port, port)) if taken => LaunchError::PortTaken {
            port: *port,
            container_port: *container_port,
            profile: cfg.profile.clone().unwrap_or_else(|| "default".into()),
            source: err,
        },
        _ => LaunchError::Engine(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rootless engine's subordinate ids: the container's uid counted from the owner's
    /// first range, by uid or by name; none for uid 0, past the range, or another user.
    #[test]
    fn the_sandbox_user_outside_a_rootless_engine_is_a_subordinate_id() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("subuid");
        std::fs::write(&f, "someone:100000:65536\n4000123:165536:65536\n").unwrap();
        assert_eq!(subordinate(4000123, 65532, &f), Some(165536 + 65531));
        assert_eq!(subordinate(4000123, 1, &f), Some(165536));
        assert_eq!(subordinate(4000123, 0, &f), None, "inside root is the owner itself");
        assert_eq!(subordinate(4000123, 70000, &f), None, "past the range");
        assert_eq!(subordinate(4242, 65532, &f), None, "another user");
    }

    /// A rootless engine on cgroup v1 takes limits and ignores them: what its info says it
    /// does not apply is skipped, with why; what it applies stays; nothing asked stays unasked.
    #[test]
    fn limits_the_engine_does_not_apply_are_skipped() {
        let mut on: BTreeMap<String, String> =
            [("memory", "64 MiB"), ("pids", "512"), ("nofile", "1024")].map(|(k, v)| (k.into(), v.into())).into();
        let mut off = BTreeMap::from([("cpu".to_owned(), "no cpu limit requested or configured".to_owned())]);
        engine_limits(&["pids".into(), "seccomp".into()], &mut on, &mut off);
        assert_eq!(on.keys().collect::<Vec<_>>(), ["nofile", "pids"]);
        assert!(off["memory"].contains("MemoryLimit false") && off["memory"].contains("rootless"), "{off:?}");
        assert_eq!(off["cpu"], "no cpu limit requested or configured", "not asked: said as before");
        let mut on2 = on.clone();
        engine_limits(&["memory".into(), "cpu".into(), "pids".into()], &mut on2, &mut off);
        assert_eq!(on2, on, "an engine that applies them all changes nothing");
    }

    /// Issue 41, 4: `VOLUME /.stevedore/tools/sub` ended in an engine 500 at the start; a volume
    /// inside any of stevedore's mounts is found before anything is made, and only those.
    #[test]
    fn a_volume_inside_a_mount_of_stevedores_is_found() {
        let v = |s: &[&str]| s.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            nested_volume(&v(&["/data", "/.stevedore/tools/sub"]), &[]),
            Some(("/.stevedore/tools/sub".into(), TOOLS_DIR.into()))
        );
        for inside in ["/in/x", "/out/a/b", "/tmp/t", "/.stevedore/x"] {
            assert!(nested_volume(&v(&[inside]), &[]).is_some(), "{inside}");
        }
        assert_eq!(nested_volume(&v(&["/cache/deps/x"]), &["/cache/deps"]).map(|p| p.1), Some("/cache/deps".into()));
        for outside in ["/data", "/out", "/tmp/", "/output", "/.stevedore", "/input/x"] {
            assert_eq!(nested_volume(&v(&[outside]), &[]), None, "{outside}");
        }
    }
    use crate::container::sizes;
    use crate::contract::ResourceLimits;

    /// Owned strings that live as long as the test process (a test input borrows them).
    fn leak(items: &[&str]) -> &'static [String] {
        Box::leak(items.iter().map(|s| s.to_string()).collect())
    }

    fn input<'a>(cfg: &'a ContainerConfig, input_volume: Option<&'a str>, applied: &'a Sizes) -> SpecInput<'a> {
        SpecInput {
            config: cfg,
            image: "img:1",
            tools: Box::leak(Box::new(ToolsVolume {
                volume: "stevedore-tools-abc".into(),
                digest: "d1".into(),
                bind: None,
            })),
            labels: HashMap::from([
                ("dev.stevedore.managed".into(), "true".into()),
                (labels::INCARNATION.into(), "inc".into()),
            ]),
            input_volume,
            stage: false,
            applied,
            image_volumes: leak(&["/data", "/out"]),
            engine_seccomp: true,
            podman: false,
            publish_ip: "127.0.0.1",
            caches: &[],
            warm: None,
        }
    }

    /// A cache is a `nocopy` bind on every engine (a mount's `NoCopy` Podman 4 ignores), and
    /// no mount of stevedore's own, nor a masked image volume, lands at its path.
    #[test]
    fn a_cache_is_bound_nocopy() {
        let cfg = ContainerConfig::default();
        let applied = sizes::of(&ResourceLimits::new(), &cfg);
        let caches = [("pip".to_owned(), "sd-cache-pip".to_owned(), "/data".to_owned())];
        let s = build(&SpecInput { caches: &caches, ..input(&cfg, None, &applied) });
        let h = s.body.host_config.as_ref().unwrap();
        assert_eq!(h.binds.as_deref(), Some(&["sd-cache-pip:/data:nocopy".to_owned()][..]));
        let at_data = h.mounts.as_ref().unwrap().iter().filter(|m| m.target.as_deref() == Some("/data")).count();
        assert_eq!(at_data, 0, "the image's VOLUME /data is the cache, not masked");
        assert!(s.enforcement["cache.pip"].contains("sd-cache-pip"), "{:?}", s.enforcement);
        assert_eq!(build(&input(&cfg, None, &applied)).body.host_config.unwrap().binds, None, "no cache, no bind");
    }

    /// Inputs over the link: the init as uid 0 with the three capabilities it drops, the volume
    /// writable at the staging mount as well as read-only at `/in`, both never filled from the
    /// image; otherwise the configured user and groups, and no capability at all.
    #[test]
    fn a_root_init_holds_only_what_it_drops() {
        let cfg = ContainerConfig::default().groups([5000, 5001]);
        let applied = sizes::of(&ResourceLimits::new(), &cfg);
        let s = build(&SpecInput { stage: true, ..input(&cfg, Some("vin"), &applied) });
        let h = s.body.host_config.as_ref().unwrap();
        assert_eq!(s.body.user.as_deref(), Some("0:0"));
        assert_eq!(h.cap_drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(h.cap_add, Some(vec!["SETUID".to_owned(), "SETGID".to_owned(), "SETPCAP".to_owned()]));
        assert_eq!(h.security_opt, Some(vec!["no-new-privileges".to_owned()]));
        assert_eq!(h.group_add, None, "the init sets the groups as it drops");
        let mounts = h.mounts.as_ref().unwrap();
        let find = |t: &str| mounts.iter().find(|m| m.target.as_deref() == Some(t)).unwrap();
        for (at, ro) in [("/in", true), (STAGE_DIR, false)] {
            assert_eq!((find(at).source.as_deref(), find(at).read_only), (Some("vin"), Some(ro)));
            assert_eq!(find(at).volume_options.as_ref().unwrap().no_copy, Some(true));
        }
        assert!(s.enforcement["non_root"].contains("drops to it, groups [5000, 5001]"), "{:?}", s.enforcement);
        assert!(s.enforcement["capabilities"].contains("SETPCAP"), "{:?}", s.enforcement);

        let plain = build(&input(&cfg, Some("vin"), &applied));
        let h = plain.body.host_config.as_ref().unwrap();
        assert_eq!(plain.body.user.as_deref(), Some(super::super::config::SANDBOX_USER));
        assert_eq!((h.cap_add.as_ref(), h.group_add.clone()), (None, Some(vec!["5000".into(), "5001".into()])));
        assert!(h.mounts.as_ref().unwrap().iter().all(|m| m.target.as_deref() != Some(STAGE_DIR)));
    }

    #[test]
    fn seccomp_is_evidence_of_what_the_engine_applies() {
        let cfg = ContainerConfig::default();
        let applied = sizes::of(&ResourceLimits::new(), &cfg);
        let with = build(&input(&cfg, None, &applied));
        assert!(with.enforcement.contains_key("seccomp") && !with.skipped.contains_key("seccomp"));
        let without = build(&SpecInput { engine_seccomp: false, ..input(&cfg, None, &applied) });
        assert!(without.skipped.contains_key("seccomp") && !without.enforcement.contains_key("seccomp"));
    }

    #[test]
    fn hardened_spec() {
        let cfg = ContainerConfig::default();
        let applied = sizes::of(&ResourceLimits::new().with("cpu", 500).with("pids", 64), &cfg);
        let s = build(&input(&cfg, Some("vin"), &applied));
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
        assert_eq!(find("/out").typ, Some(MountType::TMPFS));
        assert_eq!(find(TOOLS_DIR).read_only, Some(true));
        assert_eq!(find(TOOLS_DIR).typ, Some(MountType::VOLUME), "nothing of the host is mounted");
        // A tools volume taken meanwhile comes back empty and labelled, never filled from the image.
        let o = find(TOOLS_DIR).volume_options.as_ref().unwrap();
        assert_eq!(o.no_copy, Some(true));
        let l = o.labels.as_ref().unwrap();
        assert_eq!(
            (l[labels::KIND].as_str(), l[labels::MANAGED].as_str(), l[labels::INCARNATION].as_str()),
            ("tools", "true", "inc")
        );
        assert!(!l.contains_key(super::super::tools::TOOLS_CREATED), "never taken for the rung's own");
        assert!(mounts.iter().all(|m| m.typ != Some(MountType::BIND)));
        assert_eq!(find("/data").read_only, Some(true), "image VOLUME masked read-only");
        assert_eq!(mounts.iter().filter(|m| m.target.as_deref() == Some("/out")).count(), 1);
        assert_eq!(find("/tmp").typ, Some(MountType::TMPFS));
        assert_eq!(s.body.user.as_deref(), Some("65532:65532"));
        // The image's CMD never reaches the init: its arguments are the rung's own.
        assert_eq!(s.body.cmd, Some(vec!["--reserve".to_owned(), (8u64 << 20).to_string()]));
        // The cgroup holds the attempt's memory and the init's delivery reserve.
        assert_eq!(h.memory, Some(i64::try_from(applied.memory + (8 << 20)).unwrap()));
        assert!(s.enforcement["memory"].contains(&format!("the attempt's {}", applied.memory)), "{:?}", s.enforcement);
        let mut none = cfg.clone();
        none.link.delivery_reserve = 0;
        let without = build(&input(&none, Some("vin"), &applied));
        assert_eq!(without.body.cmd, Some(vec![]));
        assert_eq!(without.body.host_config.unwrap().memory, Some(i64::try_from(applied.memory).unwrap()));
        assert_eq!(s.body.open_stdin, Some(true));
        assert_eq!(s.body.stdin_once, Some(true));
        assert_eq!(s.body.entrypoint, Some(vec!["/.stevedore/tools/stevedore-init".to_owned()]));
        let env = s.body.env.as_ref().unwrap();
        for k in ["LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH", "GLIBC_TUNABLES", "STEVEDORE_WARM"] {
            assert!(env.contains(&format!("{k}=")), "PID 1's {k} overridden: {env:?}");
        }
        let warmed = build(&SpecInput { warm: Some(r#"{"names":["true"]}"#), ..input(&cfg, Some("vin"), &applied) });
        let env = warmed.body.env.unwrap();
        assert!(env.contains(&r#"STEVEDORE_WARM={"names":["true"]}"#.to_owned()), "{env:?}");
        assert!(!warmed.body.cmd.unwrap().iter().any(|a| a.contains("true")), "never in PID 1's arguments");
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
        let refused = |m: &str| EngineError::Refused { op: "start container", status: 500, message: m.into() };
        let err = port_taken(&cfg, refused(msg));
        assert_eq!(err.to_string(), r#"host port 42000 (container port 9090) of profile "web" is taken"#);
        assert!(matches!(port_taken(&cfg, refused("no such image")), LaunchError::Engine(_)));
        let ephemeral_only = ContainerConfig::default().publish(80, 0);
        assert!(matches!(port_taken(&ephemeral_only, refused(msg)), LaunchError::Engine(_)));
    }

    #[test]
    fn relaxations_are_recorded_as_skipped() {
        let mut cfg = ContainerConfig { network: "bridge".into(), user: "0:0".into(), ..ContainerConfig::default() };
        cfg.hardening.read_only_rootfs = false;
        let applied = sizes::of(&ResourceLimits::new(), &cfg);
        let s = build(&input(&cfg, None, &applied));
        for k in ["network", "non_root", "read_only_rootfs", "cpu"] {
            assert!(s.skipped.contains_key(k), "{k} should be skipped");
            assert!(!s.enforcement.contains_key(k));
        }
    }
}
