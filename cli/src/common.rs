//! Options every command shares, and building the rung from them.

use crate::error::CliError;
use std::path::PathBuf;
use stevedore::container::{ContainerConfig, ContainerExecutor};
use stevedore::contract::{Executor, LaunchError};
use stevedore::handlers::Handlers;
use stevedore::image::{PackSpec, ensure_image};
use stevedore::kube::{KubeConfig, KubeExecutor};
use stevedore::oci::{OciConfig, OciExecutor};
use stevedore::process::{ProcessConfig, ProcessExecutor};

/// Options of every command.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Global Options")]
pub struct Global {
    /// Engine address: unix:///PATH, tcp://HOST:PORT, https://HOST:PORT or ssh://USER@HOST
    /// (default: $DOCKER_HOST, else the local socket)
    #[arg(long, short = 'H', global = true, value_name = "URL")]
    pub host: Option<String>,
    /// Use TLS with ca.pem, cert.pem and key.pem from DIR (default: as DOCKER_TLS_VERIFY and
    /// DOCKER_CERT_PATH say)
    #[arg(long, global = true, value_name = "DIR")]
    pub tls_cert_path: Option<PathBuf>,
    /// Allow plain tcp to an engine that is not on loopback (anyone on the path gets root on it)
    #[arg(long, global = true)]
    pub allow_insecure_tcp: bool,
    /// Profiles file (default: $XDG_CONFIG_HOME/stevedore/profiles.toml)
    #[arg(long, global = true, env = "STEVEDORE_CONFIG", value_name = "FILE", hide_env_values = true)]
    pub config: Option<PathBuf>,
    /// Profile to use from the profiles file (default: "default")
    #[arg(long, global = true, value_name = "NAME")]
    pub profile: Option<String>,
    /// Kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else the Pod's service
    /// account when run in a cluster)
    #[arg(long, global = true, value_name = "FILE", help_heading = "Kubernetes (--rung kube)")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: its current one)
    #[arg(long, global = true, value_name = "NAME", help_heading = "Kubernetes (--rung kube)")]
    pub context: Option<String>,
    /// Namespace of the attempts' Pods (default: the context's, else default)
    #[arg(long, global = true, value_name = "NS", help_heading = "Kubernetes (--rung kube)")]
    pub namespace: Option<String>,
    /// stevedore's init image as the cluster pulls it (default: stevedore-init:<digest>, made
    /// by `stevedore image init`; push it where the cluster pulls from)
    #[arg(long, global = true, value_name = "IMAGE", help_heading = "Kubernetes (--rung kube)")]
    pub init_image: Option<String>,
    /// The namespace has a deny-all NetworkPolicy on a CNI that enforces it (the README has
    /// it): only then are the Pods said to have no network
    #[arg(long, global = true, help_heading = "Kubernetes (--rung kube)")]
    pub network_denied: bool,
    /// The OCI runtime of the oci rung (default: runc; gVisor's runsc makes it the vm level,
    /// shown by the kernel its attempts see)
    #[arg(long, global = true, value_name = "PATH", help_heading = "OCI runtime (--rung oci)")]
    pub oci_runtime: Option<String>,
    /// A global flag the oci rung's runtime gets before every command, repeatable (runsc
    /// here: --oci-runtime-arg=--platform=ptrace --oci-runtime-arg=--network=none)
    #[arg(
        long = "oci-runtime-arg",
        global = true,
        value_name = "ARG",
        allow_hyphen_values = true,
        help_heading = "OCI runtime (--rung oci)"
    )]
    pub oci_runtime_args: Vec<String>,
}

/// The container configuration for these options.
pub fn config(g: &Global) -> Result<ContainerConfig, String> {
    let mut cfg = match (&g.config, &g.profile) {
        (None, None) => ContainerConfig::default(),
        _ => stevedore::profiles::load(g.config.as_deref(), g.profile.as_deref()).map_err(|e| {
            let mut text = stevedore::error_chain(&e);
            if g.config.is_none() && matches!(e, stevedore::profiles::ProfileError::Read { .. }) {
                text.push_str(" (--profile needs a profiles file: give --config FILE, or set STEVEDORE_CONFIG)");
            }
            text
        })?,
    };
    if g.host.is_some() {
        cfg.connection.host = g.host.clone();
    }
    if g.tls_cert_path.is_some() {
        cfg.connection.tls_cert_path = g.tls_cert_path.clone();
    }
    cfg.connection.allow_insecure_tcp |= g.allow_insecure_tcp;
    match std::env::var("STEVEDORE_INIT_FROM").as_deref() {
        Err(_) | Ok("" | "auto") => {}
        Ok("volume") => cfg.init_from_host = false,
        Ok(other) => return Err(format!("STEVEDORE_INIT_FROM={other:?}: expected auto or volume")),
    }
    Ok(cfg)
}

/// Connects the rung.
pub async fn connect(cfg: ContainerConfig) -> Result<ContainerExecutor, LaunchError> {
    ContainerExecutor::connect(cfg).await
}

/// Switches the network mode as a request asks, unless the profile forbids that mode.
pub fn choose_network(cfg: &mut ContainerConfig, mode: &str) -> Result<(), String> {
    if mode != cfg.network
        && let Some(allowed) = &cfg.network_choices
        && !allowed.contains(mode)
    {
        let allowed: Vec<&str> =
            std::iter::once(cfg.network.as_str()).chain(allowed.iter().map(String::as_str)).collect();
        return Err(format!(
            "profile {:?} forbids network mode {mode:?} (allowed: {}; a profile permits others with allow_networks)",
            cfg.profile.as_deref().unwrap_or("default"),
            allowed.join(", ")
        ));
    }
    cfg.network = mode.to_owned();
    Ok(())
}

/// Refuses a configuration that would silently not do what it says.
fn check(cfg: &ContainerConfig) -> Result<(), String> {
    if !cfg.ports.is_empty() && cfg.network == "none" {
        let ports: Vec<String> = cfg.ports.keys().map(u16::to_string).collect();
        let allowed = match &cfg.network_choices {
            Some(c) if c.is_empty() => "it allows no other mode; a profile allows one with allow_networks".to_owned(),
            Some(c) => format!("it allows {}", c.iter().cloned().collect::<Vec<_>>().join(", ")),
            None => "e.g. --network bridge".to_owned(),
        };
        return Err(format!(
            "ports {} need a network, and the network mode of profile {:?} is none ({allowed})",
            ports.join(", "),
            cfg.profile.as_deref().unwrap_or("default"),
        ));
    }
    Ok(())
}

/// The rungs the command runs attempts on, by the name `--rung` and a profile's `rung` give
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RungKind {
    /// A container on a Docker-API engine
    Container,
    /// A child process, under a dedicated uid when run as root
    Process,
    /// A Pod on a Kubernetes cluster (see the Kubernetes options)
    Kube,
    /// A bundle run by the OCI runtime (runc) directly, no daemon; as root
    Oci,
}

impl RungKind {
    /// Its name, as `--rung` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Container => "container",
            Self::Process => "process",
            Self::Kube => "kube",
            Self::Oci => "oci",
        }
    }

    /// The kind of the rung a name in an Outcome or a profile gives (an executor's name:
    /// `docker` is the container rung's).
    pub fn of_name(name: &str) -> Option<Self> {
        match name {
            "docker" => Some(Self::Container),
            _ => <Self as clap::ValueEnum>::from_str(name, false).ok(),
        }
    }

    /// `flag`, else the profile's `rung`, else the container rung. A profile that cannot be
    /// read is said on the container rung's path, with its hints.
    pub fn chosen(g: &Global, flag: Option<Self>) -> Self {
        flag.or_else(|| crate::kube::profile_rung(g).ok().flatten().and_then(|r| Self::of_name(&r)))
            .unwrap_or(Self::Container)
    }
}

impl std::fmt::Display for RungKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a command changes in each rung's configuration before the rung is opened; each
/// default changes nothing. An `Err` is the refusal, said as is.
pub trait Adjust {
    /// The container rung's.
    fn container(&self, _cfg: &mut ContainerConfig) -> Result<(), String> {
        Ok(())
    }
    /// The process rung's.
    fn process(&self, _cfg: &mut ProcessConfig) -> Result<(), String> {
        Ok(())
    }
    /// The kube rung's.
    fn kube(&self, _cfg: &mut KubeConfig) -> Result<(), String> {
        Ok(())
    }
    /// The oci rung's.
    fn oci(&self, _cfg: &mut OciConfig) -> Result<(), String> {
        Ok(())
    }
}

/// The configured rungs as they are.
impl Adjust for () {}

/// An opened rung, of its kind.
#[derive(Debug)]
pub enum Rung {
    /// The container rung.
    Container(ContainerExecutor),
    /// The process rung.
    Process(ProcessExecutor),
    /// The kube rung.
    Kube(KubeExecutor),
    /// The oci rung.
    Oci(OciExecutor),
}

impl Rung {
    /// As an executor, whatever its kind.
    pub fn executor(self) -> std::sync::Arc<dyn Executor> {
        match self {
            Self::Container(r) => std::sync::Arc::new(r),
            Self::Process(r) => std::sync::Arc::new(r),
            Self::Kube(r) => std::sync::Arc::new(r),
            Self::Oci(r) => std::sync::Arc::new(r),
        }
    }

    /// The container rung, or a refusal naming what needs it.
    pub fn container(self, what: &str) -> Result<ContainerExecutor, CliError> {
        match self {
            Self::Container(r) => Ok(r),
            other => Err(CliError::Refused(format!("{what} needs the container rung, not the {}", other.kind()))),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> RungKind {
        match self {
            Self::Container(_) => RungKind::Container,
            Self::Process(_) => RungKind::Process,
            Self::Kube(_) => RungKind::Kube,
            Self::Oci(_) => RungKind::Oci,
        }
    }
}

/// Opens the rung `kind` for these options, after `adjust` had its say on its configuration:
/// the one way every command opens a rung. Bad options and a profile that forbids what
/// `adjust` asks are refusals; a rung that cannot be reached or set up ends with 125 (a tool
/// that ends with 1 says so with [`CliError::exiting`]).
pub async fn open(g: &Global, kind: RungKind, adjust: &dyn Adjust) -> Result<Rung, CliError> {
    let unreachable = |e: &dyn std::error::Error| CliError::Unreachable { what: stevedore::error_chain(e), code: 125 };
    match kind {
        RungKind::Container => {
            let mut cfg = config(g)?;
            adjust.container(&mut cfg).and_then(|()| check(&cfg))?;
            connect(cfg).await.map(Rung::Container).map_err(|e| unreachable(&e))
        }
        RungKind::Process => {
            let mut cfg = ProcessConfig::default();
            adjust.process(&mut cfg)?;
            ProcessExecutor::new(cfg).map(Rung::Process).map_err(|e| unreachable(&e))
        }
        RungKind::Kube => {
            let mut cfg = crate::kube::config(g)?;
            adjust.kube(&mut cfg)?;
            KubeExecutor::connect(cfg).await.map(Rung::Kube).map_err(|e| unreachable(&e))
        }
        RungKind::Oci => {
            let mut cfg = OciConfig::default();
            if let Some(r) = &g.oci_runtime {
                cfg = cfg.runtime(r);
            }
            if !g.oci_runtime_args.is_empty() {
                cfg = cfg.runtime_args(g.oci_runtime_args.iter().cloned());
            }
            adjust.oci(&mut cfg)?;
            OciExecutor::new(cfg).await.map(Rung::Oci).map_err(|e| unreachable(&e))
        }
    }
}

/// The container rung for a tool (exit 1 when it cannot be opened).
pub async fn engine(g: &Global) -> Result<ContainerExecutor, CliError> {
    open(g, RungKind::Container, &()).await.and_then(|r| r.container("this command")).map_err(|e| e.exiting(1))
}

/// Makes sure stevedore's own worker image exists (packing this binary on first use) and
/// returns its tag; a bundle added to the host's cache on the way is said unless `quiet`.
pub async fn own_image(engine: &stevedore::engine::Engine, handlers: &Handlers, quiet: bool) -> Result<String, String> {
    let (exe, tag) = own_tag()?;
    let mut spec = PackSpec::new(exe, tag.clone());
    spec.fingerprint = Some(handlers.fingerprint());
    let packed = ensure_image(engine, &spec).await.map_err(|e| format!("cannot build own worker image: {e}"))?;
    if let Some(added) = packed.bundle_added.as_ref().filter(|_| !quiet) {
        crate::say::say(bundle_added(added));
    }
    Ok(tag)
}

/// The line that says the bundle cache grew: by how much, where, what it holds now and
/// how to bound or move it.
pub fn bundle_added(a: &stevedore::image::bundle::BundleAdded) -> String {
    use stevedore::image::bundle::{CAP_ENV, DIR_ENV};
    format!(
        "cached a {} bundle of the packed binary as {}: the cache holds {} of its {} cap ({CAP_ENV} bounds it, \
         {DIR_ENV} moves it)",
        crate::report::mib(a.bytes),
        a.dir.display(),
        crate::report::mib(a.cache_bytes),
        crate::report::mib(a.cap_bytes),
    )
}

/// This binary and the tag of its own worker image (`stevedore-worker:<digest16>`).
pub fn own_tag() -> Result<(std::path::PathBuf, String), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate own binary: {e}"))?;
    let digest = stevedore::image::bundle::exe_digest(&exe, &stevedore::image::bundle::default_base())
        .map_err(|e| format!("cannot read own binary: {e}"))?;
    let tag = format!("stevedore-worker:{}", &digest[..16.min(digest.len())]);
    Ok((exe, tag))
}

/// Mints a worker ID for a command run without one.
pub fn mint_worker() -> String {
    format!("cli-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

/// The command's hooks: the checkpoint into a file, reports onto stderr.
#[derive(Debug)]
pub struct CliHooks {
    /// Where the checkpoint goes, if anywhere.
    pub checkpoint: Option<PathBuf>,
    /// Whether reports stay off stderr.
    pub quiet: bool,
    /// This terminal, put in raw mode once the command has started (`-it`): until then
    /// ^C is still stevedore's (a long pull can be stopped) and nothing typed goes anywhere.
    pub raw_on_start: Option<std::sync::Arc<crate::terminal::RawSlot>>,
}

impl stevedore::contract::Hooks for CliHooks {
    fn checkpoint<'a>(&'a self, c: &'a stevedore::contract::Checkpoint) -> stevedore::contract::HookResult<'a> {
        Box::pin(async move {
            let Some(path) = &self.checkpoint else { return Ok(()) };
            write_secret(path, c.to_json().as_bytes()).map_err(|e| {
                stevedore::contract::HookError::new(format!("cannot write the checkpoint {}: {e}", path.display()))
            })
        })
    }

    fn started<'a>(
        &'a self,
        _: &'a stevedore::contract::AttemptRef,
        info: &'a stevedore::contract::StartedInfo,
    ) -> stevedore::contract::HookResult<'a> {
        Box::pin(async move {
            if let Some(slot) = &self.raw_on_start {
                slot.enter();
            }
            if !self.quiet {
                for (port, addr) in &info.ports {
                    crate::say::say(format!("port {port} published at {addr}"));
                }
            }
            Ok(())
        })
    }

    fn report<'a>(
        &'a self,
        _: &'a stevedore::contract::AttemptRef,
        r: &'a stevedore::contract::SandboxReport,
    ) -> stevedore::contract::HookResult<'a> {
        Box::pin(async move {
            if !self.quiet {
                crate::say::say(format!("report {}", report_line(r)));
            }
            Ok(())
        })
    }
}

/// One report as a line for people.
pub fn report_line(r: &stevedore::contract::SandboxReport) -> String {
    use stevedore::contract::ReportKind;
    let text = r.report.text.as_deref().map(|t| format!(" {t}")).unwrap_or_default();
    match r.report.kind {
        ReportKind::Progress => format!("progress {}%{text}", r.report.percent.unwrap_or(0.0)),
        ReportKind::Heartbeat => "heartbeat".into(),
        ReportKind::Note => format!("note{text}"),
        ReportKind::Data => format!("data {}", r.report.value.as_ref().map(ToString::to_string).unwrap_or_default()),
        _ => "report".into(),
    }
}

/// Writes a new file only this user can read (never through a symlink, never over a file).
pub fn write_secret(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// Far more than any Outcome (its timeline is capped at 16 KB, most of its lists at a thousand
/// entries): a bigger file is not one, and is not read whole.
const MAX_OUTCOME_BYTES: u64 = 64 << 20;

/// The text of the Outcome file at `path` (`-`: stdin), read within [`MAX_OUTCOME_BYTES`]:
/// an Outcome given to `report` or `replay` is input.
pub fn read_outcome_text(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let name = path.display();
    let mut json = String::new();
    let read = if path == std::path::Path::new("-") {
        std::io::stdin().lock().take(MAX_OUTCOME_BYTES + 1).read_to_string(&mut json)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(MAX_OUTCOME_BYTES + 1).read_to_string(&mut json))
    };
    read.map_err(|e| format!("cannot read the Outcome {name}: {e}"))?;
    if json.len() as u64 > MAX_OUTCOME_BYTES {
        return Err(format!("{name}: over {} MiB, too large to be an Outcome", MAX_OUTCOME_BYTES >> 20));
    }
    Ok(json)
}

/// The payload in the file `path`, read within the largest a request takes (a bigger one is
/// refused as the request would refuse it, without reading it whole).
pub fn read_payload(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let max = stevedore::contract::MAX_PAYLOAD_BYTES;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read payload file {}: {e}", path.display()))?;
    if bytes.len() > max {
        return Err(format!("payload file {}: over the {max}-byte limit", path.display()));
    }
    Ok(bytes)
}
