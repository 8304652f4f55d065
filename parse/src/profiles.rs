//! Profiles files: named configurations of the container rung, in TOML, parsed strictly
//! (an unknown key is an error naming the key and its line) and checked value by value.
//!
//! ```toml
//! [profiles.dev]
//! image = "stevedore-worker:latest"   # worker image for handlers
//! runtime = "runc"
//! network = "bridge"                 # default "none"; published ports need another mode
//! allow_networks = ["none"]           # other modes `run --network` may choose (default: none)
//! user = "65532:65532"
//! log_cap = "4m"
//! pull = "never"                      # never | if_missing | always
//! max_in_flight = 4
//! wait_for_admission = true
//! labels = { team = "infra" }
//! ports = { "8080" = 0 }              # container port = host port (0: ephemeral), on 127.0.0.1
//! allow_publish = true                # `run -p` may add ports (default true; needs a network)
//! allow_root = false                  # `run -u 0` may run as root (default false)
//! caches = { cargo = "/cache/cargo" }  # named caches, kept across attempts
//! allow_caches = true                 # `run --cache` may add caches (default true)
//! pool = { size = 2, worker = "w1" }  # a warm pool (for a long-lived process using this profile)
//! background_cleanup = false          # remove an attempt's objects after returning its outcome
//! env = { RUST_LOG = "info" }
//! env_files = { API_TOKEN = "/run/secrets/token" }   # value read from the file (secrets)
//! defaults = { memory = "256m", cpus = "1", pids = 128, disk = "100m" }
//! ceilings = { memory = "1g", cpus = "2" }
//!
//! [profiles.cluster]
//! rung = "kube"                       # container (default) | process | kube
//! defaults = { memory = "256m", cpus = "0.5" }
//! kube = { namespace = "ci", init_image = "registry.example.com/stevedore-init:1", launch_timeout = "3m" }
//! # kube also takes kubeconfig, context, runtime_class, runtime_class_is_vm, network_denied
//! ```
//!
//! [`parse`] reads no file: `env_files` are named here and read by the caller
//! (`stevedore::profiles::load`), so parsing a hostile file touches nothing on the host.

use crate::ids::{check_cache, valid_worker_id};
use crate::limits::{parse_cpus, parse_duration, parse_size};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Why a profile could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// the file cannot be read
    #[error("cannot read profiles file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// the file is not valid
    #[error("invalid profiles file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (names the key and the line).
        message: String,
    },
    /// the profile is not in the file
    #[error("no profile {name:?} in {path} (have: {have})")]
    Unknown {
        /// The profile.
        name: String,
        /// The file.
        path: PathBuf,
        /// The profiles it has.
        have: String,
    },
    /// a value is invalid
    #[error("profile {profile:?}: invalid {what}: {why}")]
    Value {
        /// The profile.
        profile: String,
        /// Which value.
        what: String,
        /// Why.
        why: String,
    },
}

/// When to pull an image that is not present.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PullPolicy {
    /// Never pull; a missing image is a permanent launch error.
    Never,
    /// Pull only when the image is missing (the default; `missing` as docker spells it).
    #[default]
    #[serde(alias = "missing")]
    IfMissing,
    /// Always pull before the attempt.
    Always,
}

/// A profile's `defaults` or `ceilings`, parsed.
pub use crate::limits::Limits;

/// A profile's warm pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// Containers kept ready.
    pub size: usize,
    /// The worker ID they are labelled with (valid).
    pub worker: String,
    /// Their image, when not the profile's.
    pub image: Option<String>,
}

/// The rungs a profile may name.
pub const RUNGS: &[&str] = &["container", "process", "kube"];

/// A profile's settings of the kube rung.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kube {
    /// The kubeconfig file.
    pub kubeconfig: Option<PathBuf>,
    /// Its context.
    pub context: Option<String>,
    /// The Pods' namespace.
    pub namespace: Option<String>,
    /// stevedore's init image as the cluster pulls it.
    pub init_image: Option<String>,
    /// The Pods' runtime class.
    pub runtime_class: Option<String>,
    /// Whether that runtime class is VM-grade.
    pub runtime_class_is_vm: bool,
    /// The namespace denies the Pods' network (a NetworkPolicy on an enforcing CNI).
    pub network_denied: bool,
    /// From a Pod's creation until its attempt runs.
    pub launch_timeout: Option<std::time::Duration>,
}

/// One profile, every value parsed and checked. Env values are never shown by `Debug`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Profile {
    /// The rung the profile runs attempts on (`container` when absent).
    pub rung: Option<String>,
    /// The kube rung's settings.
    pub kube: Option<Kube>,
    /// The worker image for handlers.
    pub image: Option<String>,
    /// The OCI runtime.
    pub runtime: Option<String>,
    /// The network mode (the rung's default when absent).
    pub network: Option<String>,
    /// Other network modes a request may choose.
    pub allow_networks: Vec<String>,
    /// The sandbox user.
    pub user: Option<String>,
    /// The cap on each captured stream, in bytes.
    pub log_cap_bytes: Option<u64>,
    /// When to pull.
    pub pull: Option<PullPolicy>,
    /// The most attempts in flight.
    pub max_in_flight: Option<usize>,
    /// Whether an attempt over the bounds waits (else it is refused).
    pub wait_for_admission: Option<bool>,
    /// Extra labels on every object.
    pub labels: BTreeMap<String, String>,
    /// Published ports: container port → host port (0: ephemeral). Never empty unless the
    /// network is not `none`.
    pub ports: BTreeMap<u16, u16>,
    /// Whether a request may publish more ports (default true).
    pub allow_publish: bool,
    /// Whether a request may run as root (default false).
    pub allow_root: bool,
    /// Named caches: name → mount path, each checked.
    pub caches: BTreeMap<String, String>,
    /// Whether a request may add caches (default true).
    pub allow_caches: bool,
    /// A warm pool.
    pub pool: Option<Pool>,
    /// Whether an attempt's objects are removed after its outcome is returned.
    pub background_cleanup: bool,
    /// Environment of every attempt.
    pub env: BTreeMap<String, String>,
    /// Environment keys whose values are read from these files by the caller.
    pub env_files: BTreeMap<String, PathBuf>,
    /// Limits of a request that sets none.
    pub defaults: Limits,
    /// The most a request may ask for.
    pub ceilings: Limits,
}

impl fmt::Debug for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Profile")
            .field("rung", &self.rung)
            .field("kube", &self.kube)
            .field("image", &self.image)
            .field("runtime", &self.runtime)
            .field("network", &self.network)
            .field("allow_networks", &self.allow_networks)
            .field("user", &self.user)
            .field("log_cap_bytes", &self.log_cap_bytes)
            .field("pull", &self.pull)
            .field("max_in_flight", &self.max_in_flight)
            .field("wait_for_admission", &self.wait_for_admission)
            .field("labels", &self.labels)
            .field("ports", &self.ports)
            .field("allow_publish", &self.allow_publish)
            .field("allow_root", &self.allow_root)
            .field("caches", &self.caches)
            .field("allow_caches", &self.allow_caches)
            .field("pool", &self.pool)
            .field("background_cleanup", &self.background_cleanup)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("env_files", &self.env_files)
            .field("defaults", &self.defaults)
            .field("ceilings", &self.ceilings)
            .finish()
    }
}

/// Parses profiles `text` (from `path`, named in errors) and checks profile `name`.
pub fn parse(text: &str, path: &Path, name: &str) -> Result<Profile, ProfileError> {
    let file: RawFile =
        toml::from_str(text).map_err(|e| ProfileError::Parse { path: path.to_path_buf(), message: e.to_string() })?;
    let have = file.profiles.keys().cloned().collect::<Vec<_>>().join(", ");
    let mut profiles = file.profiles;
    let raw = profiles.remove(name).ok_or_else(|| ProfileError::Unknown {
        name: name.into(),
        path: path.to_path_buf(),
        have,
    })?;
    raw.check(name)
}

impl Profile {
    /// The first setting only the container rung has (ports, caches, a pool, a runtime, a
    /// network), by its name: what the kube rung refuses.
    pub fn container_only(&self) -> Option<&'static str> {
        [
            ("ports", !self.ports.is_empty()),
            ("caches", !self.caches.is_empty()),
            ("pool", self.pool.is_some()),
            ("runtime (use kube.runtime_class)", self.runtime.is_some()),
            ("network", self.network.as_deref().is_some_and(|n| n != "none")),
        ]
        .into_iter()
        .find_map(|(what, set)| set.then_some(what))
    }

    /// The profile as a profiles file holding only it, under `name`, in the plainest form
    /// of every value (sizes in bytes, CPU in millicores): [`parse`] reads it back as `self`.
    pub fn to_toml(&self, name: &str) -> String {
        let raw = RawFile { profiles: BTreeMap::from([(name.to_owned(), RawProfile::from(self))]) };
        toml::to_string(&raw).expect("a profile of strings, numbers and tables renders as TOML")
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    profiles: BTreeMap<String, RawProfile>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpus: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pids: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    disk: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nofile: Option<u64>,
}

impl RawLimits {
    /// The table as limits; `what` (`defaults`, `ceilings`) names it in errors.
    fn check(&self, what: &str, bad: &dyn Fn(&str, String) -> ProfileError) -> Result<Limits, ProfileError> {
        let size = |k: &str, v: &Option<String>| -> Result<Option<u64>, ProfileError> {
            v.as_deref().map(|v| parse_size(v).map_err(|e| bad(&format!("{what}.{k}"), e.to_string()))).transpose()
        };
        let cpu = self.cpus.as_deref().map(|c| parse_cpus(c).map_err(|e| bad(&format!("{what}.cpus"), e.to_string())));
        Ok(Limits {
            memory_bytes: size("memory", &self.memory)?,
            cpu_millis: cpu.transpose()?,
            pids: self.pids,
            disk_bytes: size("disk", &self.disk)?,
            gpu_millis: None,
            nofile: self.nofile,
        })
    }
}

impl From<&Limits> for RawLimits {
    fn from(l: &Limits) -> Self {
        RawLimits {
            memory: l.memory_bytes.map(|n| n.to_string()),
            cpus: l.cpu_millis.map(|m| format!("{m}m")),
            pids: l.pids,
            disk: l.disk_bytes.map(|n| n.to_string()),
            nofile: l.nofile,
        }
    }
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawKube {
    #[serde(skip_serializing_if = "Option::is_none")]
    kubeconfig: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    context: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    init_image: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime_class: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime_class_is_vm: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    network_denied: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    launch_timeout: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    #[serde(skip_serializing_if = "Option::is_none")]
    rung: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kube: Option<RawKube>,
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<String>,
    #[serde(default)]
    allow_networks: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    log_cap: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pull: Option<PullPolicy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_in_flight: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    wait_for_admission: Option<bool>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    ports: BTreeMap<String, u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allow_publish: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allow_root: Option<bool>,
    #[serde(default)]
    caches: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allow_caches: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pool: Option<RawPool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    background_cleanup: Option<bool>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    env_files: BTreeMap<String, PathBuf>,
    #[serde(default)]
    defaults: RawLimits,
    #[serde(default)]
    ceilings: RawLimits,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    size: usize,
    worker: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<String>,
}

impl RawProfile {
    fn check(self, name: &str) -> Result<Profile, ProfileError> {
        let bad = |what: &str, why: String| ProfileError::Value { profile: name.into(), what: what.into(), why };
        let pool = match self.pool {
            Some(p) if !valid_worker_id(&p.worker) => {
                return Err(bad("pool.worker", format!("{:?} is not a valid worker id", p.worker)));
            }
            Some(p) => Some(Pool { size: p.size, worker: p.worker, image: p.image }),
            None => None,
        };
        for (cache, path) in &self.caches {
            check_cache(cache, path).map_err(|why| bad(&format!("caches.{cache}"), why))?;
        }
        let log_cap_bytes =
            self.log_cap.as_deref().map(parse_size).transpose().map_err(|e| bad("log_cap", e.to_string()))?;
        let mut ports = BTreeMap::new();
        for (cport, hport) in self.ports {
            // Digits only: `str::parse` also takes a sign (`+80`), a second spelling of 80.
            let c = Some(&cport)
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|p| p.parse::<u16>().ok())
                .filter(|&c| c != 0)
                .ok_or_else(|| bad("ports", format!("container port {cport:?} is not a port number (1-65535)")))?;
            if ports.insert(c, hport).is_some() {
                return Err(bad("ports", format!("container port {c} is given twice")));
            }
        }
        if !ports.is_empty() && self.network.as_deref().unwrap_or("none") == "none" {
            return Err(bad("ports", "published ports need a network mode other than none".into()));
        }
        if let Some(r) = self.rung.as_deref().filter(|r| !RUNGS.contains(r)) {
            return Err(bad("rung", format!("{r:?} is not one of {}", RUNGS.join(", "))));
        }
        let kube = match self.kube {
            None => None,
            Some(k) => Some(Kube {
                launch_timeout: k
                    .launch_timeout
                    .as_deref()
                    .map(parse_duration)
                    .transpose()
                    .map_err(|e| bad("kube.launch_timeout", e.to_string()))?
                    // Whole milliseconds: what `to_toml` writes reads back the same.
                    .map(|d| std::time::Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))),
                kubeconfig: k.kubeconfig,
                context: k.context,
                namespace: k.namespace,
                init_image: k.init_image,
                runtime_class: k.runtime_class,
                runtime_class_is_vm: k.runtime_class_is_vm.unwrap_or(false),
                network_denied: k.network_denied.unwrap_or(false),
            }),
        };
        let profile = Profile {
            rung: self.rung,
            kube,
            image: self.image,
            runtime: self.runtime,
            network: self.network,
            allow_networks: self.allow_networks,
            user: self.user,
            log_cap_bytes,
            pull: self.pull,
            max_in_flight: self.max_in_flight,
            wait_for_admission: self.wait_for_admission,
            labels: self.labels,
            ports,
            allow_publish: self.allow_publish.unwrap_or(true),
            allow_root: self.allow_root.unwrap_or(false),
            caches: self.caches,
            allow_caches: self.allow_caches.unwrap_or(true),
            pool,
            background_cleanup: self.background_cleanup.unwrap_or(false),
            env: self.env,
            env_files: self.env_files,
            defaults: self.defaults.check("defaults", &bad)?,
            ceilings: self.ceilings.check("ceilings", &bad)?,
        };
        // What does not map to a Pod is refused here, named, never ignored.
        if profile.rung.as_deref() == Some("kube")
            && let Some(what) = profile.container_only()
        {
            return Err(bad(what, "not available on the kube rung".into()));
        }
        Ok(profile)
    }
}

impl From<&Profile> for RawProfile {
    fn from(p: &Profile) -> Self {
        RawProfile {
            rung: p.rung.clone(),
            kube: p.kube.as_ref().map(|k| RawKube {
                kubeconfig: k.kubeconfig.clone(),
                context: k.context.clone(),
                namespace: k.namespace.clone(),
                init_image: k.init_image.clone(),
                runtime_class: k.runtime_class.clone(),
                runtime_class_is_vm: Some(k.runtime_class_is_vm),
                network_denied: Some(k.network_denied),
                launch_timeout: k.launch_timeout.map(|d| format!("{}ms", d.as_millis())),
            }),
            image: p.image.clone(),
            runtime: p.runtime.clone(),
            network: p.network.clone(),
            allow_networks: p.allow_networks.clone(),
            user: p.user.clone(),
            log_cap: p.log_cap_bytes.map(|n| n.to_string()),
            pull: p.pull,
            max_in_flight: p.max_in_flight,
            wait_for_admission: p.wait_for_admission,
            labels: p.labels.clone(),
            ports: p.ports.iter().map(|(c, h)| (c.to_string(), *h)).collect(),
            allow_publish: Some(p.allow_publish),
            allow_root: Some(p.allow_root),
            caches: p.caches.clone(),
            allow_caches: Some(p.allow_caches),
            pool: p.pool.as_ref().map(|p| RawPool { size: p.size, worker: p.worker.clone(), image: p.image.clone() }),
            background_cleanup: Some(p.background_cleanup),
            env: p.env.clone(),
            env_files: p.env_files.clone(),
            defaults: RawLimits::from(&p.defaults),
            ceilings: RawLimits::from(&p.ceilings),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_a(text: &str) -> Result<Profile, ProfileError> {
        parse(text, Path::new("p.toml"), "a")
    }

    #[test]
    fn a_kube_profile_is_checked_and_reads_back_as_itself() {
        let text = "[profiles.a]\nrung = \"kube\"\ndefaults = { memory = \"64m\" }\n\
                    kube = { namespace = \"ci\", launch_timeout = \"90s\", network_denied = true }\n";
        let p = parse_a(text).unwrap();
        assert_eq!(p.rung.as_deref(), Some("kube"));
        let k = p.kube.clone().unwrap();
        assert_eq!(
            (k.namespace.as_deref(), k.launch_timeout, k.network_denied),
            (Some("ci"), Some(std::time::Duration::from_secs(90)), true)
        );
        assert_eq!(parse(&p.to_toml("a"), Path::new("p.toml"), "a").unwrap(), p);
        let odd = parse_a("[profiles.a]\nkube = { launch_timeout = \"1.0000001s\" }\n").unwrap();
        assert_eq!(parse(&odd.to_toml("a"), Path::new("p.toml"), "a").unwrap(), odd, "whole milliseconds");
        let bad = parse_a("[profiles.a]\nrung = \"k8s\"\n").unwrap_err().to_string();
        assert!(bad.contains("\"k8s\" is not one of container, process, kube"), "{bad}");
        let caches = parse_a("[profiles.a]\nrung = \"kube\"\ncaches = { c = \"/cache\" }\n").unwrap_err().to_string();
        assert!(caches.contains("caches") && caches.contains("kube rung"), "{caches}");
        let typo = parse_a("[profiles.a]\nkube = { namespaces = \"x\" }\n").unwrap_err().to_string();
        assert!(typo.contains("namespaces"), "an unknown key is named: {typo}");
        let timeout = parse_a("[profiles.a]\nkube = { launch_timeout = \"soon\" }\n").unwrap_err().to_string();
        assert!(timeout.contains("kube.launch_timeout"), "{timeout}");
    }

    #[test]
    fn good_file() {
        let text = "[profiles.a]\nnetwork = \"bridge\"\npull = \"never\"\nenv = { A = \"s3cr3t\" }\n\
             env_files = { TOKEN = \"/run/secrets/token\" }\n\
             defaults = { memory = \"256m\", cpus = \"0.5\" }\nceilings = { memory = \"1g\" }\nports = { \"8080\" = 0 }\n";
        let p = parse_a(text).unwrap();
        assert_eq!(p.network.as_deref(), Some("bridge"));
        assert_eq!(p.pull, Some(PullPolicy::Never));
        assert_eq!(p.env_files["TOKEN"], Path::new("/run/secrets/token"), "named, not read");
        assert_eq!((p.defaults.memory_bytes, p.defaults.cpu_millis), (Some(256 << 20), Some(500)));
        assert_eq!(p.ceilings.memory_bytes, Some(1 << 30));
        assert_eq!(p.ports[&8080], 0);
        assert!((p.allow_publish, p.allow_root, p.allow_caches) == (true, false, true), "the defaults");
        assert!(!format!("{p:?}").contains("s3cr3t"), "Debug never shows env values");
        assert_eq!(parse_a(&p.to_toml("a")).unwrap(), p, "{}", p.to_toml("a"));
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let text = "[profiles.dev]\nnetwork = \"none\"\nnetwrok = \"bridge\"\n";
        let err = parse(text, Path::new("p.toml"), "dev").unwrap_err().to_string();
        assert!(err.contains("netwrok"), "{err}");
        assert!(err.contains("line 3"), "{err}");
    }

    #[test]
    fn published_ports_need_a_network() {
        let err = parse_a("[profiles.a]\nports = { \"80\" = 0 }\n").unwrap_err().to_string();
        assert!(err.contains("profile \"a\"") && err.contains("ports") && err.contains("none"), "{err}");
    }

    #[test]
    fn a_container_port_has_one_spelling() {
        for (ports, why) in [
            ("\"+80\" = 1", "not a port number"),
            ("\"0\" = 1", "not a port number"),
            ("\"\" = 1", "not a port number"),
            ("\"65536\" = 1", "not a port number"),
            ("\"80\" = 1, \"080\" = 2", "given twice"),
        ] {
            let err = parse_a(&format!("[profiles.a]\nnetwork = \"bridge\"\nports = {{ {ports} }}\n")).unwrap_err();
            assert!(err.to_string().contains(why), "{ports}: {err}");
        }
    }

    #[test]
    fn bad_values_name_the_profile_and_the_value() {
        for (text, what) in [
            ("defaults = { memory = \"lots\" }", "defaults.memory"),
            ("ceilings = { cpus = \"half\" }", "ceilings.cpus"),
            ("log_cap = \"10x\"", "log_cap"),
            ("pool = { size = 1, worker = \"../w\" }", "pool.worker"),
            ("caches = { c = \"/out/c\" }", "caches.c"),
        ] {
            let err = parse_a(&format!("[profiles.a]\n{text}\n")).unwrap_err();
            assert!(
                matches!(&err, ProfileError::Value { profile, what: w, .. } if profile == "a" && w == what),
                "{err}"
            );
        }
    }

    #[test]
    fn unknown_profile_lists_the_others() {
        let err = parse("[profiles.a]\n[profiles.b]\n", Path::new("p.toml"), "c").unwrap_err().to_string();
        assert!(err.contains("a, b"), "{err}");
    }
}
