//! Executor profiles: a TOML file of named configurations of the container rung.
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
//! ```
//!
//! The default file is `$STEVEDORE_CONFIG`, else `$XDG_CONFIG_HOME/stevedore/profiles.toml`,
//! else `~/.config/stevedore/profiles.toml`.

use crate::container::{ContainerConfig, PullPolicy};
use crate::contract::{limits::key, parse_cpus, parse_size};
use serde::Deserialize;
use std::collections::BTreeMap;
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    profiles: BTreeMap<String, Profile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Limits {
    memory: Option<String>,
    cpus: Option<String>,
    pids: Option<u64>,
    disk: Option<String>,
    nofile: Option<u64>,
}

impl Limits {
    /// The table as limits; `what` (`defaults`, `ceilings`) names it in errors.
    fn parse(
        &self,
        what: &str,
        bad: &dyn Fn(&str, String) -> ProfileError,
    ) -> Result<crate::contract::ResourceLimits, ProfileError> {
        let mut l = crate::contract::ResourceLimits::new();
        let size = |k: &str, v: &Option<String>| -> Result<Option<u64>, ProfileError> {
            v.as_deref().map(|v| parse_size(v).map_err(|e| bad(&format!("{what}.{k}"), e.to_string()))).transpose()
        };
        if let Some(m) = size("memory", &self.memory)? {
            l = l.with(key::MEMORY, m);
        }
        if let Some(d) = size("disk", &self.disk)? {
            l = l.with(key::DISK, d);
        }
        if let Some(c) = &self.cpus {
            l = l.with(key::CPU, parse_cpus(c).map_err(|e| bad(&format!("{what}.cpus"), e.to_string()))?);
        }
        if let Some(n) = self.pids {
            l = l.with(key::PIDS, n);
        }
        if let Some(n) = self.nofile {
            l = l.with(key::NOFILE, n);
        }
        Ok(l)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Profile {
    image: Option<String>,
    runtime: Option<String>,
    network: Option<String>,
    #[serde(default)]
    allow_networks: Vec<String>,
    user: Option<String>,
    log_cap: Option<String>,
    pull: Option<PullPolicy>,
    max_in_flight: Option<usize>,
    wait_for_admission: Option<bool>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    ports: BTreeMap<String, u16>,
    allow_publish: Option<bool>,
    allow_root: Option<bool>,
    #[serde(default)]
    caches: BTreeMap<String, String>,
    allow_caches: Option<bool>,
    pool: Option<PoolProfile>,
    background_cleanup: Option<bool>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    env_files: BTreeMap<String, PathBuf>,
    #[serde(default)]
    defaults: Limits,
    #[serde(default)]
    ceilings: Limits,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolProfile {
    size: usize,
    worker: String,
    image: Option<String>,
}

/// The default profiles file.
pub fn default_path() -> PathBuf {
    if let Ok(p) = std::env::var("STEVEDORE_CONFIG") {
        return PathBuf::from(p);
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from("/etc"));
    base.join("stevedore").join("profiles.toml")
}

/// Loads profile `name` (default `default`) from `path` (default [`default_path`]).
pub fn load(path: Option<&Path>, name: Option<&str>) -> Result<ContainerConfig, ProfileError> {
    let path = path.map(Path::to_path_buf).unwrap_or_else(default_path);
    let text = std::fs::read_to_string(&path).map_err(|source| ProfileError::Read { path: path.clone(), source })?;
    parse(&text, &path, name.unwrap_or("default"))
}

/// Parses profiles text and builds the configuration of profile `name`.
pub fn parse(text: &str, path: &Path, name: &str) -> Result<ContainerConfig, ProfileError> {
    let file: File =
        toml::from_str(text).map_err(|e| ProfileError::Parse { path: path.to_path_buf(), message: e.to_string() })?;
    let have = file.profiles.keys().cloned().collect::<Vec<_>>().join(", ");
    let mut profiles = file.profiles;
    let p = profiles.remove(name).ok_or_else(|| ProfileError::Unknown {
        name: name.into(),
        path: path.to_path_buf(),
        have,
    })?;
    let bad = |what: &str, why: String| ProfileError::Value { profile: name.into(), what: what.into(), why };
    let mut cfg = ContainerConfig { profile: Some(name.to_owned()), ..ContainerConfig::default() };
    cfg.worker_image = p.image;
    cfg.runtime = p.runtime;
    if let Some(n) = p.network {
        cfg.network = n;
    }
    // A request cannot turn on what its profile does not allow (README.md, "A short tour": profiles).
    cfg.network_choices = Some(p.allow_networks.into_iter().collect());
    if let Some(u) = p.user {
        cfg.user = u;
    }
    cfg.allow_publish = p.allow_publish.unwrap_or(true);
    cfg.allow_root = p.allow_root.unwrap_or(false);
    cfg.allow_caches = p.allow_caches.unwrap_or(true);
    cfg.background_cleanup = p.background_cleanup.unwrap_or(false);
    if let Some(pool) = p.pool {
        if !crate::contract::valid_worker_id(&pool.worker) {
            return Err(bad("pool.worker", format!("{:?} is not a valid worker id", pool.worker)));
        }
        let mut pc = crate::container::PoolConfig::new(pool.size, pool.worker);
        pc.image = pool.image;
        cfg.pool = Some(pc);
    }
    for (name, path) in p.caches {
        let c = crate::container::CacheMount { name: name.clone(), path };
        c.check().map_err(|why| bad(&format!("caches.{name}"), why))?;
        cfg.caches.push(c);
    }
    if let Some(c) = p.log_cap {
        cfg.log_cap_bytes = parse_size(&c).map_err(|e| bad("log_cap", e.to_string()))?;
    }
    if let Some(pull) = p.pull {
        cfg.pull = pull;
    }
    if let Some(m) = p.max_in_flight {
        cfg.max_in_flight = m;
    }
    if let Some(w) = p.wait_for_admission {
        cfg.wait_for_admission = w;
    }
    cfg.labels = p.labels;
    for (cport, hport) in p.ports {
        let c: u16 = cport.parse().map_err(|_| bad("ports", format!("container port {cport:?} is not a number")))?;
        cfg.ports.insert(c, hport);
    }
    if !cfg.ports.is_empty() && cfg.network == "none" {
        return Err(bad("ports", "published ports need a network mode other than none".into()));
    }
    cfg.env = p.env;
    for (k, file) in p.env_files {
        let v = std::fs::read_to_string(&file)
            .map_err(|e| bad("env_files", format!("{k}: cannot read {}: {e}", file.display())))?;
        cfg.env.insert(k, v.trim_end_matches('\n').to_owned());
    }
    for (k, v) in p.defaults.parse("defaults", &bad)?.0 {
        cfg.defaults.0.insert(k, v);
    }
    cfg.ceilings = p.ceilings.parse("ceilings", &bad)?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_file() {
        let t = tempfile::tempdir().unwrap();
        let secret = t.path().join("token");
        std::fs::write(&secret, "s3cr3t\n").unwrap();
        let text = format!(
            "[profiles.dev]\nnetwork = \"bridge\"\npull = \"never\"\nenv = {{ A = \"1\" }}\nenv_files = {{ TOKEN = {:?} }}\n\
             defaults = {{ memory = \"256m\", cpus = \"0.5\" }}\nceilings = {{ memory = \"1g\" }}\nports = {{ \"8080\" = 0 }}\n",
            secret.display().to_string()
        );
        let cfg = parse(&text, Path::new("p.toml"), "dev").unwrap();
        assert_eq!(cfg.network, "bridge");
        assert_eq!(cfg.pull, PullPolicy::Never);
        assert_eq!(cfg.env["TOKEN"], "s3cr3t");
        assert_eq!(cfg.defaults.memory_bytes(), Some(256 << 20));
        assert_eq!(cfg.defaults.cpu_millis(), Some(500));
        assert_eq!(cfg.ceilings.memory_bytes(), Some(1 << 30));
        assert_eq!(cfg.ports[&8080], 0);
        assert!(!format!("{cfg:?}").contains("s3cr3t"), "Debug never shows env values");
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let text = "[profiles.dev]\nnetwork = \"none\"\nnetwrok = \"bridge\"\n";
        let err = parse(text, Path::new("p.toml"), "dev").unwrap_err().to_string();
        assert!(err.contains("netwrok"), "{err}");
        assert!(err.contains("line 3"), "{err}");
    }

    #[test]
    fn a_profile_allows_only_its_network_and_listed_ones() {
        let cfg = parse("[profiles.a]\n", Path::new("p.toml"), "a").unwrap();
        assert_eq!(cfg.network, "none");
        assert_eq!(cfg.network_choices, Some(Default::default()), "nothing else unless listed");
        let cfg = parse("[profiles.a]\nallow_networks = [\"bridge\"]\n", Path::new("p.toml"), "a").unwrap();
        assert_eq!(cfg.network_choices.unwrap().into_iter().collect::<Vec<_>>(), ["bridge"]);
    }

    #[test]
    fn published_ports_need_a_network() {
        let err = parse("[profiles.a]\nports = { \"80\" = 0 }\n", Path::new("p.toml"), "a").unwrap_err().to_string();
        assert!(err.contains("profile \"a\"") && err.contains("ports") && err.contains("none"), "{err}");
    }

    #[test]
    fn unknown_profile_lists_the_others() {
        let err = parse("[profiles.a]\n[profiles.b]\n", Path::new("p.toml"), "c").unwrap_err().to_string();
        assert!(err.contains("a, b"), "{err}");
    }
}
