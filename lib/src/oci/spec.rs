//! The attempt's `config.json`, built with `oci-spec` (pure): the cached root read-only,
//! stevedore's init bound read-only at [`TOOLS_DIR`] and run as PID 1, `/out` and `/tmp`
//! size-limited tmpfs, `/in` a read-only bind of the private copy, fresh namespaces (pid,
//! mount, ipc, uts, network: a new network namespace has only `lo`), a non-root user, every
//! capability set empty, `noNewPrivileges`, runc's default masked and read-only paths,
//! `/sys` read-only, only the runtime's standard device nodes, and the limits as cgroups
//! under stevedore's own parent. The limits resolved by the one rule (`sizes`).

use super::config::{FALLBACK, OciConfig};
use super::site::Seccomp;
use crate::contract::limits::{self, RungLimits};
use crate::contract::{NarrowedLimit, ResourceLimits};
use oci_spec::OciSpecError;
use oci_spec::runtime::{
    LinuxBuilder, LinuxCapabilitiesBuilder, LinuxCpuBuilder, LinuxDeviceCgroupBuilder, LinuxMemoryBuilder,
    LinuxNamespaceBuilder, LinuxNamespaceType, LinuxPidsBuilder, LinuxResourcesBuilder, Mount, MountBuilder,
    PosixRlimitBuilder, PosixRlimitType, ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
    get_default_maskedpaths, get_default_mounts, get_default_readonly_paths,
};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use stevedore_init::wire::{IN_DIR, INIT_NAME, OUT_DIR, TMP_DIR, TOOLS_DIR};

/// The cgroup parent of every attempt (`cgroupsPath` is `/<PARENT>/<attempt's name>`).
pub(crate) const CGROUP_PARENT: &str = "stevedore-oci";

/// One attempt's sandbox, sized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sizes {
    /// Memory in bytes for the command (swap off); the cgroup adds the delivery reserve.
    pub memory: u64,
    pub pids: u64,
    /// Bytes in `/out` (its tmpfs's size).
    pub disk: u64,
    pub cpu_millis: Option<u64>,
    pub nofile: u64,
    /// Size of `/tmp` (a tmpfs: it counts as memory, so never above it).
    pub tmp: u64,
    pub narrowed: Vec<NarrowedLimit>,
    /// What this rung cannot enforce of what was asked.
    pub skipped: BTreeMap<String, String>,
}

const CANNOT: &[(&str, &str)] = &[("gpu", "the oci rung passes no GPU through yet")];

/// The request's limits on this rung.
pub(crate) fn sizes(req: &ResourceLimits, cfg: &OciConfig) -> Sizes {
    let rung = RungLimits { defaults: &cfg.defaults, ceilings: &cfg.ceilings, fallback: &FALLBACK, cannot: CANNOT };
    let a = limits::resolve(req, rung);
    let l = a.limits;
    let given = |v: Option<u64>, fallback: Option<u64>| v.or(fallback).unwrap_or(0);
    let memory = given(l.memory_bytes, FALLBACK.memory_bytes);
    Sizes {
        memory,
        pids: given(l.pids, FALLBACK.pids),
        disk: given(l.disk_bytes, FALLBACK.disk_bytes),
        cpu_millis: l.cpu_millis,
        nofile: given(l.nofile, FALLBACK.nofile),
        tmp: cfg.max_tmp_bytes.min(memory),
        narrowed: a.narrowed,
        skipped: a.skipped,
    }
}

/// What the spec is made of.
#[derive(Debug)]
pub(crate) struct SpecInput<'a> {
    /// The image's cached root filesystem.
    pub rootfs: &'a Path,
    /// A host dir holding only stevedore's init.
    pub tools: &'a Path,
    /// The private, sealed copy of the inputs.
    pub input: Option<&'a Path>,
    /// The host's tmpfs for `/out`, in the bundle.
    pub out: &'a Path,
    pub sizes: &'a Sizes,
    pub user: (u32, u32),
    /// The attempt's name: its cgroup and hostname.
    pub name: &'a str,
    /// The init's delivery reserve, added to the cgroup's memory.
    pub reserve: u64,
    /// The seccomp filter, and who installs it.
    pub seccomp: &'a Seccomp,
    /// The AppArmor profile the command runs under, or why there is none.
    pub apparmor: &'a Result<String, String>,
    /// The rung holds the memory cgroup above the runtime's (`held`): the runtime's gets no
    /// memory limit, and sits at `<name>/held::LEAF`.
    pub held: bool,
}

/// The AppArmor profile attempts run under on this host: `profile` when the kernel has
/// AppArmor on and that profile loaded (the rung loads none itself: that is the host's
/// `apparmor_parser`, as for Docker); else why not, for the evidence and the census.
pub(crate) fn host_apparmor(profile: &str) -> Result<String, String> {
    let enabled = std::fs::read_to_string("/sys/module/apparmor/parameters/enabled").unwrap_or_default();
    if enabled.trim() != "Y" {
        return Err("this host's kernel has no AppArmor enabled".into());
    }
    let loaded = std::fs::read_to_string("/sys/kernel/security/apparmor/profiles").unwrap_or_default();
    match loaded.lines().any(|l| l.split(" (").next() == Some(profile)) {
        true => Ok(profile.to_owned()),
        false => Err(format!("AppArmor is on but the profile {profile} is not loaded (load it, as Docker does)")),
    }
}

/// The init's arguments: the delivery reserve it holds (`init/src/reserve.rs`), the seccomp
/// filter it installs on itself (`init/src/seccomp.rs`).
fn init_args(reserve: u64, seccomp: &Seccomp) -> Vec<String> {
    let mut argv = vec![format!("{TOOLS_DIR}/{INIT_NAME}")];
    if reserve > 0 {
        argv.extend(["--reserve".to_owned(), reserve.to_string()]);
    }
    if let Seccomp::ByInit { .. } = seccomp {
        argv.extend(["--seccomp".to_owned(), format!("{TOOLS_DIR}/{}", stevedore_init::seccomp::FILE_NAME)]);
    }
    argv
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn mount(dest: &str, typ: &str, source: &Path, options: Vec<String>) -> Result<Mount, OciSpecError> {
    MountBuilder::default().destination(dest).typ(typ).source(source).options(options).build()
}

/// The mounts: the runtime's defaults (`/proc`, `/dev` and its standard nodes, `/sys`
/// read-only), then the init, `/out`, `/tmp` and `/in`.
fn mounts(input: &SpecInput<'_>) -> Result<Vec<Mount>, OciSpecError> {
    let s = |v: &[&str]| v.iter().map(|o| (*o).to_owned()).collect::<Vec<_>>();
    let mut m = get_default_mounts();
    m.push(mount(TOOLS_DIR, "bind", input.tools, s(&["bind", "ro", "nosuid", "nodev"]))?);
    m.push(mount(OUT_DIR, "bind", input.out, s(&["bind", "rw", "nosuid", "nodev", "noexec"]))?);
    let mut tmp = s(&["nosuid", "nodev", "mode=1777"]);
    tmp.push(format!("size={}", input.sizes.tmp));
    m.push(mount(TMP_DIR, "tmpfs", Path::new("tmpfs"), tmp)?);
    if let Some(dir) = input.input {
        m.push(mount(IN_DIR, "bind", dir, s(&["bind", "ro", "nosuid", "nodev"]))?);
    }
    Ok(m)
}

/// The attempt's `config.json`.
pub(crate) fn build(input: &SpecInput<'_>) -> Result<Spec, OciSpecError> {
    let z = &input.sizes;
    let none = HashSet::new;
    let caps = LinuxCapabilitiesBuilder::default()
        .bounding(none())
        .effective(none())
        .inheritable(none())
        .permitted(none())
        .ambient(none())
        .build()?;
    let user = UserBuilder::default().uid(input.user.0).gid(input.user.1).build()?;
    let nofile =
        PosixRlimitBuilder::default().typ(PosixRlimitType::RlimitNofile).soft(z.nofile).hard(z.nofile).build()?;
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(user)
        .args(init_args(input.reserve, input.seccomp))
        // The init's own environment: nothing (it gets the command's in the Start frame).
        .env(Vec::<String>::new())
        .cwd("/")
        .capabilities(caps)
        .no_new_privileges(true)
        .rlimits(vec![nofile]);
    let process = match input.apparmor {
        Ok(profile) => process.apparmor_profile(profile.clone()),
        Err(_) => process,
    }
    .build()?;
    let root = RootBuilder::default().path(input.rootfs).readonly(true).build()?;
    let memory = clamp(z.memory.saturating_add(input.reserve));
    let mut resources = LinuxResourcesBuilder::default()
        // Everything denied; the runtime allows its standard nodes after this rule.
        .devices(vec![LinuxDeviceCgroupBuilder::default().allow(false).access("rwm").build()?])
        .pids(LinuxPidsBuilder::default().limit(clamp(z.pids)).build()?);
    if !input.held {
        resources = resources.memory(LinuxMemoryBuilder::default().limit(memory).swap(memory).build()?);
    }
    if let Some(m) = z.cpu_millis {
        resources = resources.cpu(LinuxCpuBuilder::default().quota(clamp(m * 100)).period(100_000u64).build()?);
    }
    let namespaces = [
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Network,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
    ]
    .into_iter()
    .map(|typ| LinuxNamespaceBuilder::default().typ(typ).build())
    .collect::<Result<Vec<_>, _>>()?;
    let mut linux = LinuxBuilder::default()
        .namespaces(namespaces)
        .resources(resources.build()?)
        .cgroups_path(match input.held {
            true => format!("/{CGROUP_PARENT}/{}/{}", input.name, super::held::LEAF),
            false => format!("/{CGROUP_PARENT}/{}", input.name),
        })
        .masked_paths(get_default_maskedpaths())
        .readonly_paths(get_default_readonly_paths());
    if let Seccomp::ByRuntime { profile, .. } = input.seccomp {
        linux = linux.seccomp(profile.clone());
    }
    let linux = linux.build()?;
    SpecBuilder::default()
        .version("1.0.2")
        .root(root)
        .process(process)
        .hostname(input.name.chars().take(63).collect::<String>())
        .mounts(mounts(input)?)
        .linux(linux)
        .build()
}

/// What the spec enforces, and what it does not, for the evidence.
pub(crate) fn enforcement(input: &SpecInput<'_>) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let z = input.sizes;
    let mut on = BTreeMap::new();
    let mut off = z.skipped.clone();
    let mut put = |k: &str, v: String| {
        on.insert(k.to_owned(), v);
    };
    put("memory", crate::link::memory_limit_text(z.memory, input.reserve, "swap off (memory+swap = memory)"));
    put("pids", format!("cgroup pids limit {}", z.pids));
    match z.cpu_millis {
        Some(m) => put("cpu", format!("cfs quota of {m} millicores")),
        None => {
            off.insert("cpu".into(), "no cpu limit requested or configured".into());
        }
    }
    put(
        "disk",
        format!(
            "/out is a tmpfs of {} bytes (nosuid, nodev, noexec) the host mounted, walked in place at the end",
            z.disk
        ),
    );
    put("tmp", format!("/tmp is a tmpfs of {} bytes (nosuid, nodev), counted as memory", z.tmp));
    put("nofile", format!("{} open files per process", z.nofile));
    put("network", "none: a new network namespace with only lo".into());
    put("read_only_rootfs", "root filesystem read-only (the image cache, shared by attempts)".into());
    put("capabilities", "all five sets empty".into());
    put("no_new_privileges", "set".into());
    put("non_root", format!("user {}:{}", input.user.0, input.user.1));
    put("namespaces", "pid, mount, ipc, uts, network: fresh".into());
    put("proc", "runc's default masked and read-only /proc paths; /sys read-only".into());
    put("devices", "the runtime's standard nodes only (cgroup: everything else denied)".into());
    put("init", format!("stevedore's static init as PID 1, bound read-only at {TOOLS_DIR}"));
    if input.input.is_some() {
        put("inputs", "a private copy made and held by stevedore, root's without write bits, bound read-only".into());
    }
    let rules = |s: &oci_spec::runtime::LinuxSeccomp| s.syscalls().as_ref().map_or(0, Vec::len);
    match input.seccomp {
        Seccomp::ByInit { profile, syscalls } => put(
            "seccomp",
            format!(
                "{} for a command without capabilities: {} rules naming {syscalls} system calls, default \
                 action errno; compiled once to BPF for this machine's ABI (a 32-bit system call is \
                 refused) and installed by the init on itself before anything of the image runs",
                super::seccomp::ORIGIN,
                rules(profile)
            ),
        ),
        Seccomp::ByRuntime { profile, why } => put(
            "seccomp",
            format!(
                "{} for a command without capabilities: {} rules, default action errno; compiled \
                 by the runtime on each start ({why})",
                super::seccomp::ORIGIN,
                rules(profile)
            ),
        ),
        Seccomp::Off => {
            off.insert("seccomp".into(), "relaxed by configuration".into());
        }
    }
    match input.apparmor {
        Ok(profile) => put("apparmor", format!("profile {profile}")),
        Err(why) => {
            off.insert("apparmor".into(), why.clone());
        }
    }
    (on, off)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_json(input_dir: Option<&Path>, by_runtime: bool) -> serde_json::Value {
        let z = sizes(&ResourceLimits::new().with("memory", 64 << 20).with("cpu", 500), &OciConfig::default());
        let profile = super::super::seccomp::for_attempt("x86_64", "6.1.0").unwrap();
        let seccomp = match by_runtime {
            true => Seccomp::ByRuntime { profile, why: "configured".into() },
            false => Seccomp::ByInit { profile, syscalls: 300 },
        };
        let input = SpecInput {
            rootfs: Path::new("/cache/abc/rootfs"),
            tools: Path::new("/run/stevedore-oci/tools"),
            input: input_dir,
            out: Path::new("/b/out"),
            sizes: &z,
            user: (65532, 65532),
            name: "w-0123-a1",
            reserve: 8 << 20,
            seccomp: &seccomp,
            apparmor: &Ok("docker-default".into()),
            held: false,
        };
        serde_json::to_value(build(&input).unwrap()).unwrap()
    }

    #[test]
    fn the_spec_is_hardened_and_runs_the_init_as_pid_1() {
        let s = spec_json(Some(Path::new("/b/in")), true);
        assert_eq!(s["root"]["readonly"], true);
        assert_eq!(s["process"]["args"][0], "/.stevedore/tools/stevedore-init");
        assert_eq!(s["process"]["args"][2], (8u64 << 20).to_string());
        assert_eq!(s["process"]["user"]["uid"], 65532);
        assert_eq!(s["process"]["noNewPrivileges"], true);
        assert_eq!(s["process"]["apparmorProfile"], "docker-default");
        for set in ["bounding", "effective", "inheritable", "permitted", "ambient"] {
            assert_eq!(s["process"]["capabilities"][set], serde_json::json!([]), "{set}");
        }
        let ns: Vec<&str> =
            s["linux"]["namespaces"].as_array().unwrap().iter().map(|n| n["type"].as_str().unwrap()).collect();
        assert_eq!(ns, ["pid", "network", "ipc", "uts", "mount"]);
        assert_eq!(s["linux"]["resources"]["memory"]["limit"], (64 << 20) + (8 << 20));
        assert_eq!(s["linux"]["resources"]["memory"]["swap"], (64 << 20) + (8 << 20));
        assert_eq!(s["linux"]["resources"]["cpu"]["quota"], 50_000);
        assert_eq!(s["linux"]["cgroupsPath"], "/stevedore-oci/w-0123-a1");
        assert_eq!(s["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(s["linux"]["seccomp"]["architectures"][0], "SCMP_ARCH_X86_64");
        assert!(s["linux"]["maskedPaths"].as_array().unwrap().contains(&"/proc/kcore".into()));
        let mounts = s["mounts"].as_array().unwrap();
        let at = |d: &str| mounts.iter().find(|m| m["destination"] == d).unwrap_or_else(|| panic!("{d}"));
        assert!(at("/sys")["options"].as_array().unwrap().contains(&"ro".into()));
        assert!(at("/in")["options"].as_array().unwrap().contains(&"ro".into()));
        assert!(at(TOOLS_DIR)["options"].as_array().unwrap().contains(&"ro".into()));
        assert!(at("/tmp")["options"].as_array().unwrap().contains(&format!("size={}", 64 << 20).into()));
        assert_eq!(at("/out")["source"], "/b/out");
        assert!(at("/out")["options"].as_array().unwrap().contains(&"noexec".into()));
        assert!(spec_json(None, true)["mounts"].as_array().unwrap().iter().all(|m| m["destination"] != "/in"));
    }

    #[test]
    fn a_filter_compiled_once_is_the_init_s_to_install_and_not_the_runtime_s() {
        let s = spec_json(None, false);
        assert!(s["linux"].get("seccomp").is_none(), "the runtime compiles nothing");
        let args: Vec<&str> = s["process"]["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert_eq!(args[3..], ["--seccomp", "/.stevedore/tools/seccomp.bpf"]);
        assert_eq!(s["process"]["noNewPrivileges"], true, "the init may install a filter unprivileged");
    }
}
