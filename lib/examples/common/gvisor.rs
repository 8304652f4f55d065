//! (v) gVisor's `runsc` on the oci rung against `docker run --runtime` of the same (issue 45):
//! cold `true`, alternating pairs, medians. The engine gets `runsc` only for the bench: merged
//! into its `daemon.json` under a unique name, reloaded with SIGHUP (never a restart), and the
//! file put back (its runtimes said explicitly, reloaded, then its own bytes) on every way out,
//! a guard's `Drop` included.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const DAEMON_JSON: &str = "/etc/docker/daemon.json";

/// The engine's configuration as it was, put back on drop.
pub struct Registered {
    pub name: String,
    before: Option<Vec<u8>>,
    dockerd: i32,
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("stevedore-{:08x}", rand::random::<u32>()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

fn dockerd_pid() -> Result<i32, String> {
    let pids = std::fs::read_dir("/proc").map_err(|e| e.to_string())?;
    pids.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "dockerd"))
        .ok_or_else(|| "no local dockerd".into())
}

/// SIGHUP, then `docker info` until `name` is (`present`) or is not among its runtimes.
fn reload(dockerd: i32, name: &str, present: bool) -> Result<(), String> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(dockerd), nix::sys::signal::Signal::SIGHUP)
        .map_err(|e| format!("SIGHUP to dockerd: {e}"))?;
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        let out = std::process::Command::new("docker")
            .args(["info", "--format", "{{json .Runtimes}}"])
            .output()
            .map_err(|e| e.to_string())?;
        if String::from_utf8_lossy(&out.stdout).contains(&format!("\"{name}\"")) == present {
            return Ok(());
        }
        // A bench, not a test: polling the engine's own answer is the signal here.
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("the engine did not reload {name} within 60 s"))
}

impl Registered {
    /// `runsc` (ptrace platform, no network) merged into the engine's runtimes.
    pub fn runsc(runsc: &Path) -> Result<Self, String> {
        let dockerd = dockerd_pid()?;
        let name = format!("stevedore-bench-runsc-{:08x}", rand::random::<u32>());
        let before = std::fs::read(DAEMON_JSON).ok();
        let mut conf: serde_json::Value = match &before {
            Some(b) => serde_json::from_slice(b).map_err(|e| format!("{DAEMON_JSON}: {e}"))?,
            None => serde_json::json!({}),
        };
        let entry = serde_json::json!({ "path": runsc, "runtimeArgs": ["--platform=ptrace", "--network=none"] });
        conf.as_object_mut()
            .ok_or("daemon.json is not an object")?
            .entry("runtimes")
            .or_insert_with(|| serde_json::json!({}))
            .as_object_mut()
            .ok_or("its runtimes are not an object")?
            .insert(name.clone(), entry);
        let registered = Self { name, before, dockerd };
        write_atomically(Path::new(DAEMON_JSON), &serde_json::to_vec_pretty(&conf).unwrap())
            .map_err(|e| format!("{DAEMON_JSON}: {e}"))?;
        reload(dockerd, &registered.name, true)?;
        Ok(registered)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut conf: serde_json::Value =
            self.before.as_deref().and_then(|b| serde_json::from_slice(b).ok()).unwrap_or(serde_json::json!({}));
        if let Some(obj) = conf.as_object_mut() {
            obj.entry("runtimes").or_insert_with(|| serde_json::json!({}));
        }
        let _ = write_atomically(Path::new(DAEMON_JSON), &serde_json::to_vec_pretty(&conf).unwrap_or_default());
        if let Err(e) = reload(self.dockerd, &self.name, false) {
            eprintln!("bench: {e}");
        }
        let _ = match &self.before {
            Some(bytes) => write_atomically(Path::new(DAEMON_JSON), bytes),
            None => std::fs::remove_file(DAEMON_JSON),
        };
    }
}

/// `runsc`, where installed.
pub fn find_runsc() -> Option<PathBuf> {
    ["/usr/bin/runsc", "/usr/sbin/runsc", "/usr/local/bin/runsc"].into_iter().map(PathBuf::from).find(|p| p.is_file())
}
