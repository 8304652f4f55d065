//! Executor profiles: a TOML file of named configurations of the container rung.
//!
//! The file's format, and its strict parsing, are `stevedore_parse::profiles` (`parse/`);
//! this module finds the file, reads the secrets an `env_files` entry names, and turns the
//! checked profile into a [`ContainerConfig`].
//!
//! The default file is `$STEVEDORE_CONFIG`, else `$XDG_CONFIG_HOME/stevedore/profiles.toml`,
//! else `~/.config/stevedore/profiles.toml`.

use crate::container::{CacheMount, ContainerConfig, PoolConfig};
use std::path::{Path, PathBuf};
pub use stevedore_parse::profiles::ProfileError;

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
    let (text, path) = read(path)?;
    parse(&text, &path, name.unwrap_or("default"))
}

/// The profiles file's text, and where it was read (`path`, else [`default_path`]).
fn read(path: Option<&Path>) -> Result<(String, PathBuf), ProfileError> {
    let path = path.map(Path::to_path_buf).unwrap_or_else(default_path);
    let text = std::fs::read_to_string(&path).map_err(|source| ProfileError::Read { path: path.clone(), source })?;
    Ok((text, path))
}

/// Parses profiles text and builds the configuration of profile `name`, reading the files
/// its `env_files` name.
pub fn parse(text: &str, path: &Path, name: &str) -> Result<ContainerConfig, ProfileError> {
    from_profile(stevedore_parse::profiles::parse(text, path, name)?, name)
}

/// A checked profile as the container rung's configuration, reading the files its
/// `env_files` name.
fn from_profile(p: stevedore_parse::profiles::Profile, name: &str) -> Result<ContainerConfig, ProfileError> {
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
    cfg.allow_publish = p.allow_publish;
    cfg.allow_root = p.allow_root;
    cfg.allow_caches = p.allow_caches;
    cfg.background_cleanup = p.background_cleanup;
    if let Some(pool) = p.pool {
        let mut pc = PoolConfig::new(pool.size, pool.worker);
        pc.image = pool.image;
        cfg.pool = Some(pc);
    }
    cfg.caches = p.caches.into_iter().map(|(name, path)| CacheMount { name, path }).collect();
    if let Some(c) = p.log_cap_bytes {
        cfg.link.log_cap_bytes = c;
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
    cfg.ports = p.ports;
    cfg.env = p.env;
    for (k, file) in p.env_files {
        let v = std::fs::read_to_string(&file)
            .map_err(|e| bad("env_files", format!("{k}: cannot read {}: {e}", file.display())))?;
        cfg.env.insert(k, v.trim_end_matches('\n').to_owned());
    }
    cfg.defaults = p.defaults;
    cfg.ceilings = p.ceilings;
    Ok(cfg)
}

/// The rung profile `name` of `path` names (`None`: the container rung's, the default).
pub fn rung(path: Option<&Path>, name: Option<&str>) -> Result<Option<String>, ProfileError> {
    let (text, path) = read(path)?;
    Ok(stevedore_parse::profiles::parse(&text, &path, name.unwrap_or("default"))?.rung)
}

/// Loads profile `name` (default `default`) from `path` as the kube rung's configuration.
#[cfg(feature = "kube")]
pub fn load_kube(path: Option<&Path>, name: Option<&str>) -> Result<crate::kube::KubeConfig, ProfileError> {
    let (text, path) = read(path)?;
    parse_kube(&text, &path, name.unwrap_or("default"))
}

/// Profile `name` as the kube rung's configuration: what the container and kube rungs share
/// (limits, environment and its secrets, labels, the sandbox user, the log cap, the pull
/// policy, admission), and its `kube` table. What only the container rung has is refused.
#[cfg(feature = "kube")]
pub fn parse_kube(text: &str, path: &Path, name: &str) -> Result<crate::kube::KubeConfig, ProfileError> {
    let mut p = stevedore_parse::profiles::parse(text, path, name)?;
    let bad = |what: &str, why: String| ProfileError::Value { profile: name.into(), what: what.into(), why };
    // What only the container rung has is refused, whatever the profile's `rung` says:
    // never silently dropped.
    if let Some(what) = p.container_only() {
        return Err(bad(what, "not available on the kube rung".into()));
    }
    let mut cfg = crate::kube::KubeConfig::default();
    if let Some(u) = &p.user {
        let user =
            crate::contract::parse_user(u).ok_or_else(|| bad("user", format!("{u:?}: give a numeric UID[:GID]")))?;
        if user.0 == 0 || user.1 == 0 {
            return Err(bad("user", "the kube rung runs attempts as non-root only".into()));
        }
        cfg.user = user;
    }
    if let Some(pull) = p.pull {
        cfg.image_pull = pull.into();
    }
    let kube = p.kube.take();
    let container = from_profile(p, name)?;
    cfg.image = container.worker_image;
    cfg.wait_for_admission = container.wait_for_admission;
    cfg.background_cleanup = container.background_cleanup;
    cfg.defaults = container.defaults;
    cfg.ceilings = container.ceilings;
    cfg.env = container.env;
    cfg.labels = container.labels;
    cfg.link = container.link;
    cfg.max_in_flight = container.max_in_flight;
    if let Some(k) = kube {
        cfg.kubeconfig = k.kubeconfig;
        cfg.context = k.context;
        cfg.namespace = k.namespace;
        cfg.init_image = k.init_image;
        cfg.runtime_class = k.runtime_class;
        cfg.runtime_class_is_vm = k.runtime_class_is_vm;
        cfg.network_denied = k.network_denied;
        if let Some(t) = k.launch_timeout {
            cfg.launch_timeout = t;
        }
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::PullPolicy;

    #[test]
    fn good_file() {
        let t = tempfile::tempdir().unwrap();
        let secret = t.path().join("token");
        std::fs::write(&secret, "s3cr3t\n").unwrap();
        let text = format!(
            "[profiles.dev]\nnetwork = \"bridge\"\npull = \"never\"\nenv = {{ A = \"1\" }}\nenv_files = {{ TOKEN = {:?} }}\n\
             defaults = {{ memory = \"256m\", cpus = \"0.5\" }}\nceilings = {{ memory = \"1g\" }}\nports = {{ \"8080\" = 0 }}\n\
             caches = {{ cargo = \"/cache/cargo\" }}\npool = {{ size = 2, worker = \"w1\" }}\nlog_cap = \"4m\"\n",
            secret.display().to_string()
        );
        let cfg = parse(&text, Path::new("p.toml"), "dev").unwrap();
        assert_eq!(cfg.network, "bridge");
        assert_eq!(cfg.pull, PullPolicy::Never);
        assert_eq!(cfg.env["TOKEN"], "s3cr3t");
        assert_eq!(cfg.defaults.memory_bytes, Some(256 << 20));
        assert_eq!(cfg.defaults.cpu_millis, Some(500));
        assert_eq!(cfg.ceilings.memory_bytes, Some(1 << 30));
        assert_eq!(cfg.ceilings.cpu_millis, None);
        assert_eq!(cfg.ports[&8080], 0);
        assert_eq!(cfg.caches, [CacheMount { name: "cargo".into(), path: "/cache/cargo".into() }]);
        assert_eq!(cfg.pool.as_ref().map(|p| (p.size, p.worker.as_str())), Some((2, "w1")));
        assert_eq!(cfg.link.log_cap_bytes, 4 << 20);
        assert!(!format!("{cfg:?}").contains("s3cr3t"), "Debug never shows env values");
    }

    #[test]
    #[cfg(feature = "kube")]
    fn a_kube_profile_configures_the_kube_rung() {
        let text = "[profiles.k]\nrung = \"kube\"\npull = \"never\"\nuser = \"1000:1000\"\nenv = { A = \"1\" }\n\
                    defaults = { memory = \"64m\" }\nkube = { namespace = \"ci\", runtime_class = \"kata\", \
                    runtime_class_is_vm = true }\n";
        let cfg = parse_kube(text, Path::new("p.toml"), "k").unwrap();
        assert_eq!(cfg.namespace.as_deref(), Some("ci"));
        assert_eq!(cfg.image_pull, crate::kube::ImagePull::Never);
        assert_eq!(cfg.user, (1000, 1000));
        assert_eq!(cfg.env["A"], "1");
        assert_eq!(cfg.defaults.memory_bytes, Some(64 << 20));
        assert_eq!(cfg.level(), crate::contract::Level::Vm, "a runtime class named VM-grade");
        let root = "[profiles.k]\nrung = \"kube\"\nuser = \"0:0\"\n";
        assert!(parse_kube(root, Path::new("p.toml"), "k").unwrap_err().to_string().contains("non-root"));
        let named = "[profiles.k]\nuser = \"nobody\"\n";
        assert!(parse_kube(named, Path::new("p.toml"), "k").unwrap_err().to_string().contains("numeric"));
        // A container profile used with --rung kube: its container-only settings are refused, not dropped.
        let caches = "[profiles.c]\ncaches = { cargo = \"/cache/cargo\" }\n";
        assert!(parse_kube(caches, Path::new("p.toml"), "c").unwrap_err().to_string().contains("caches"));
        let image = "[profiles.i]\nimage = \"busybox\"\nwait_for_admission = false\nbackground_cleanup = true\n";
        let cfg = parse_kube(image, Path::new("p.toml"), "i").unwrap();
        assert_eq!(
            (cfg.image.as_deref(), cfg.wait_for_admission, cfg.background_cleanup),
            (Some("busybox"), false, true)
        );
    }

    #[test]
    fn an_unreadable_secret_names_its_key_and_file() {
        let text = "[profiles.a]\nenv_files = { TOKEN = \"/no/such/secret\" }\n";
        let err = parse(text, Path::new("p.toml"), "a").unwrap_err().to_string();
        assert!(err.contains("env_files") && err.contains("TOKEN") && err.contains("/no/such/secret"), "{err}");
    }

    #[test]
    fn a_profile_allows_only_its_network_and_listed_ones() {
        let cfg = parse("[profiles.a]\n", Path::new("p.toml"), "a").unwrap();
        assert_eq!(cfg.network, "none");
        assert_eq!(cfg.network_choices, Some(Default::default()), "nothing else unless listed");
        let cfg = parse("[profiles.a]\nallow_networks = [\"bridge\"]\n", Path::new("p.toml"), "a").unwrap();
        assert_eq!(cfg.network_choices.unwrap().into_iter().collect::<Vec<_>>(), ["bridge"]);
    }
}
