//! The oci rung's site: what the rung shares with each of its attempts (the runtime and its
//! state dir, the bundles' dir, the image cache, the init's host copy, the engine the images
//! come from, the gate, the tasks).

use super::cache::Cache;
use super::config::OciConfig;
use crate::attempt::SiteBase;
use crate::attempt::front::Gate;
use crate::engine::Engine;
use std::path::PathBuf;

/// What the rung shares with each attempt.
#[derive(Debug)]
pub(crate) struct OciSite {
    pub config: OciConfig,
    pub base: SiteBase,
    pub engine: Engine,
    /// The runtime, resolved once.
    pub runtime: PathBuf,
    /// What `runtime --version` says, first line.
    pub runtime_version: String,
    /// The runtime's `--root`.
    pub state: PathBuf,
    /// One bundle dir per attempt.
    pub bundles: PathBuf,
    /// A host dir holding only the init (0755 inside the rung's 0700 base), bound read-only.
    pub tools: PathBuf,
    pub init_digest: String,
    pub images: Cache,
    /// Docker's default seccomp profile resolved for this machine, and who installs it.
    pub seccomp: Seccomp,
    /// Whether the runtime hands the init its takeover socket (`run --preserve-fds`): without
    /// it (gVisor's `runsc`) an attempt cannot be recovered after a worker restart.
    pub takeover: bool,
    /// Whether the rung holds the memory cgroup above the runtime's (`held`): the runtime
    /// removes its own with the sandbox (gVisor's `runsc`, by what `--version` says).
    pub holds_cgroup: bool,
    /// The AppArmor profile of every command, or why there is none on this host.
    pub apparmor: Result<String, String>,
    pub gate: Gate,
    /// How each running attempt's `runtime run` ended, by container id, until its removal:
    /// the witness of an end without a record.
    pub exits: std::sync::Mutex<std::collections::HashMap<String, Exit>>,
}

/// How the commands' seccomp filter is applied.
#[derive(Debug)]
pub(crate) enum Seccomp {
    /// Relaxed by configuration.
    Off,
    /// Compiled to BPF once, beside the init in the tools dir, which installs it on itself
    /// before anything else (`init/src/seccomp.rs`); `syscalls` the calls it names.
    ByInit { profile: oci_spec::runtime::LinuxSeccomp, syscalls: usize },
    /// In `config.json`, compiled by the runtime on every start: configured so, or `why`
    /// the compile could not be had here.
    ByRuntime { profile: oci_spec::runtime::LinuxSeccomp, why: String },
}

impl Seccomp {
    /// The profile, where one applies.
    pub fn profile(&self) -> Option<&oci_spec::runtime::LinuxSeccomp> {
        match self {
            Self::Off => None,
            Self::ByInit { profile, .. } | Self::ByRuntime { profile, .. } => Some(profile),
        }
    }
}

/// `runtime run`'s exit status once it ended (its code, or 128 + the signal that killed it:
/// the runtime's own rule for its container's PID 1).
pub(crate) type Exit = tokio::sync::watch::Receiver<Option<i32>>;

impl OciSite {
    /// The exit of the attempt `id`'s runtime, while it is recorded.
    pub fn exit_of(&self, id: &str) -> Option<Exit> {
        self.exits.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(id).cloned()
    }

    /// `runtime --root <state> <args…>`, with nothing of the worker's environment.
    pub fn runtime_cmd(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.runtime);
        cmd.env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .arg("--root")
            .arg(&self.state)
            .args(&self.config.runtime_args)
            .args(args)
            .stdin(std::process::Stdio::null());
        cmd
    }

    /// Runs a short runtime command to its end (bounded); its error text, when it failed.
    pub async fn runtime_call(&self, args: &[&str]) -> Result<(), String> {
        let mut cmd = self.runtime_cmd(args);
        cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).kill_on_drop(true);
        let out = tokio::time::timeout(std::time::Duration::from_secs(30), cmd.output())
            .await
            .map_err(|_| format!("{} {} did not answer within 30 s", self.runtime.display(), args.join(" ")))?
            .map_err(|e| format!("{} {}: {e}", self.runtime.display(), args.join(" ")))?;
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "{} {}: {} ({})",
            self.runtime.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        ))
    }
}
