//! How the kube rung is set up (`KubeConfig::default()` documents every default; pure).

use crate::contract::Level;
use crate::contract::limits::Limits;
use crate::link::LinkConfig;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The non-root uid and gid the attempt's containers run as (as the container rung's).
pub use stevedore_init::wire::SANDBOX_UID;

/// When the node pulls an image (the Pod's `imagePullPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ImagePull {
    /// Pull only when the node does not have it (`IfNotPresent`, the default).
    #[default]
    IfNotPresent,
    /// Pull on every attempt (`Always`).
    Always,
    /// Never pull: the image must be on the node (`Never`).
    Never,
}

/// A profile's or `run --pull`'s policy (the parser's word, which the container rung takes
/// as it is) as the Pods': the same promises (missing pulls only what the node lacks, never
/// never pulls, always always does).
impl From<stevedore_parse::profiles::PullPolicy> for ImagePull {
    fn from(p: stevedore_parse::profiles::PullPolicy) -> Self {
        use stevedore_parse::profiles::PullPolicy;
        match p {
            PullPolicy::Never => ImagePull::Never,
            PullPolicy::Always => ImagePull::Always,
            _ => ImagePull::IfNotPresent,
        }
    }
}

impl ImagePull {
    /// Kubernetes' word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            ImagePull::IfNotPresent => "IfNotPresent",
            ImagePull::Always => "Always",
            ImagePull::Never => "Never",
        }
    }
}

/// How the kube rung is set up. The builder methods set one item each.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KubeConfig {
    /// The rung's name (default `kube`).
    pub name: String,
    /// The kubeconfig file (default: as kubectl finds it: `KUBECONFIG`, else
    /// `~/.kube/config`, else the Pod's service account when stevedore runs in a cluster).
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current one).
    pub context: Option<String>,
    /// The namespace of the attempts' Pods (default: the context's, else `default`).
    pub namespace: Option<String>,
    /// stevedore's init image (`FROM scratch` + the static init; `stevedore image init`
    /// makes it). Default: `stevedore-init:<first 16 hex of the init's sha256>`, the tag
    /// `stevedore image init` gives. Name it by digest (`REPO@sha256:...`) on a real cluster.
    pub init_image: Option<String>,
    /// When the node pulls the attempt's image and the init image (default `IfNotPresent`).
    pub image_pull: ImagePull,
    /// The Pods' `runtimeClassName` (default: the cluster's default runtime).
    pub runtime_class: Option<String>,
    /// Whether that runtime class is VM-grade (kata, gVisor): the rung's level is then `vm`.
    pub runtime_class_is_vm: bool,
    /// The namespace has a deny-all NetworkPolicy for the attempts' Pods and the cluster's
    /// CNI enforces it (the README gives the YAML). Only then does the rung claim `network:
    /// none` and serve policies that require no network; every Pod otherwise has the
    /// cluster's network (default `false`).
    pub network_denied: bool,
    /// The `uid:gid` the attempt's containers run as (non-root; default 65532:65532).
    pub user: (u32, u32),
    /// The sandbox user's supplementary groups (default none), set by the root init as it
    /// drops to the user when the inputs go over the link; never read from the image's files.
    pub groups: Vec<u32>,
    /// Inputs up to this apparent size travel over the link to a root init that writes them
    /// and drops to the sandbox user, where the namespace admits such a Pod (default
    /// [`crate::link::LINK_INPUTS_MAX_BYTES`]; 0: never); otherwise the init container unpacks
    /// them (`docs/kube.md`, "Inputs").
    pub link_inputs_max_bytes: u64,
    /// Limits for what a request leaves out.
    pub defaults: Limits,
    /// Limits a request is narrowed to.
    pub ceilings: Limits,
    /// The largest `/tmp` (a memory-backed `emptyDir`: never above the memory limit;
    /// default 256 MiB).
    pub max_tmp_bytes: u64,
    /// The largest input dir staged (default 4 GiB).
    pub max_input_bytes: u64,
    /// The extended resource a GPU is asked as (default `nvidia.com/gpu`).
    pub gpu_resource: String,
    /// Node selector of the attempts' Pods.
    pub node_selector: BTreeMap<String, String>,
    /// Extra labels on the Pods (never overriding stevedore's own).
    pub labels: BTreeMap<String, String>,
    /// The environment layer between the image's and the request's (a profile's).
    pub env: BTreeMap<String, String>,
    /// Where the captures go (default: stevedore's private dir).
    pub log_dir: Option<PathBuf>,
    /// The link's settings.
    pub link: LinkConfig,
    /// Per API call (default 30 s).
    pub api_timeout: Duration,
    /// From the Pod's creation until its attempt's container runs: scheduling, pulls and the
    /// init container included (default 120 s). Past it the Pod is removed and the attempt
    /// is a launch error saying what the Pod was waiting for.
    pub launch_timeout: Duration,
    /// Attempts in flight at once (default 8).
    pub max_in_flight: usize,
    /// The image of a request that names none.
    pub image: Option<String>,
    /// Whether an attempt over `max_in_flight` waits for a slot (default `true`), or is refused.
    pub wait_for_admission: bool,
    /// Whether a finished attempt's Pod is removed after its outcome is returned, on the
    /// rung's tasks (`close` waits for them; default `false`: removed before).
    pub background_cleanup: bool,
    /// For a handler request: the argv that runs the worker binary in its image (the image's
    /// `dev.stevedore.entry` label, which the API cannot read). `None`: handlers are refused.
    pub worker_entry: Option<Vec<String>>,
    /// Allow `http://` to an API server that is not on loopback (the token would cross the
    /// network in the clear; default `false`).
    pub allow_insecure_http: bool,
    /// The incarnation stamped on the Pods (default: this process's).
    pub incarnation: Option<String>,
}

impl Default for KubeConfig {
    fn default() -> Self {
        Self {
            name: "kube".into(),
            kubeconfig: None,
            context: None,
            namespace: None,
            init_image: None,
            image_pull: ImagePull::IfNotPresent,
            runtime_class: None,
            runtime_class_is_vm: false,
            network_denied: false,
            user: (SANDBOX_UID, SANDBOX_UID),
            groups: Vec::new(),
            link_inputs_max_bytes: crate::link::LINK_INPUTS_MAX_BYTES,
            defaults: Limits::NONE,
            ceilings: Limits::NONE,
            max_tmp_bytes: 256 << 20,
            max_input_bytes: 4 << 30,
            gpu_resource: "nvidia.com/gpu".into(),
            node_selector: BTreeMap::new(),
            labels: BTreeMap::new(),
            env: BTreeMap::new(),
            log_dir: None,
            link: LinkConfig::default(),
            api_timeout: Duration::from_secs(30),
            launch_timeout: Duration::from_secs(120),
            max_in_flight: 8,
            image: None,
            wait_for_admission: true,
            background_cleanup: false,
            worker_entry: None,
            allow_insecure_http: false,
            incarnation: None,
        }
    }
}

/// What the kube rung applies where neither the request nor a default says: never
/// unlimited by accident (as the container rung's).
pub(crate) const FALLBACK: crate::contract::Limits =
    crate::contract::Limits::NONE.memory(1 << 30).disk(512 << 20).nofile(4096);

impl KubeConfig {
    /// The limits an attempt that asks for none gets: the configured defaults, else the
    /// rung's fallback, under the ceilings (`replay` holds an untrusted action to them).
    pub fn default_limits(&self) -> crate::contract::Limits {
        use crate::contract::limits::{self, RungLimits};
        let rung = RungLimits { defaults: &self.defaults, ceilings: &self.ceilings, fallback: &FALLBACK, cannot: &[] };
        limits::resolve(&crate::contract::ResourceLimits::new(), rung).limits
    }

    /// The isolation level: `vm` under a runtime class named VM-grade, else `sandboxed`.
    pub fn level(&self) -> Level {
        if self.runtime_class.is_some() && self.runtime_class_is_vm { Level::Vm } else { Level::Sandboxed }
    }

    /// Sets the kubeconfig file.
    pub fn kubeconfig(mut self, path: impl Into<PathBuf>) -> Self {
        self.kubeconfig = Some(path.into());
        self
    }

    /// Sets the namespace.
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = Some(ns.into());
        self
    }

    /// Sets the init image.
    pub fn init_image(mut self, image: impl Into<String>) -> Self {
        self.init_image = Some(image.into());
        self
    }

    /// Sets the pull policy.
    pub fn image_pull(mut self, pull: ImagePull) -> Self {
        self.image_pull = pull;
        self
    }

    /// Sets the limits a request's missing ones default to.
    pub fn defaults(mut self, l: Limits) -> Self {
        self.defaults = l;
        self
    }

    /// Sets the ceilings.
    pub fn ceilings(mut self, l: Limits) -> Self {
        self.ceilings = l;
        self
    }

    /// Sets the link's settings.
    pub fn link(mut self, link: LinkConfig) -> Self {
        self.link = link;
        self
    }

    /// Sets the captures' dir.
    pub fn log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.log_dir = Some(dir.into());
        self
    }

    /// Sets the launch timeout.
    pub fn launch_timeout(mut self, t: Duration) -> Self {
        self.launch_timeout = t;
        self
    }

    /// States that the namespace denies the attempts' network (see [`KubeConfig::network_denied`]).
    pub fn network_denied(mut self, denied: bool) -> Self {
        self.network_denied = denied;
        self
    }

    /// Sets the largest inputs that go over the link (0: never).
    pub fn link_inputs_max_bytes(mut self, bytes: u64) -> Self {
        self.link_inputs_max_bytes = bytes;
        self
    }

    /// Sets the sandbox user's supplementary groups.
    pub fn groups(mut self, groups: impl IntoIterator<Item = u32>) -> Self {
        self.groups = groups.into_iter().collect();
        self
    }

    /// Sets the worker entry for handler requests.
    pub fn worker_entry(mut self, argv: Vec<String>) -> Self {
        self.worker_entry = Some(argv);
        self
    }
}
