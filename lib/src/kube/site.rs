//! The kube rung's site: what the rung shares with each of its attempts (the cluster's
//! client, the namespace, the configuration, the init image, what the credentials were found
//! to allow, the tasks). State and the bounded calls every other file makes through it.

use super::config::KubeConfig;
use super::error::ClusterError;
use crate::attempt::SiteBase;
use crate::attempt::front::Gate;
use crate::hostdir::Captures;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use std::collections::HashSet;
use std::sync::Mutex;

/// What the rung shares with each attempt.
pub(crate) struct KubeSite {
    pub client: kube::Client,
    pub pods: Api<Pod>,
    pub namespace: String,
    /// The API server, as the messages name it.
    pub server: String,
    /// Its `gitVersion`.
    pub server_version: String,
    pub config: KubeConfig,
    pub base: SiteBase,
    /// stevedore's init image, as the Pods name it.
    pub init_image: String,
    /// The permissions the rung needs, once checked (a success is kept; a refusal is asked again).
    pub access: tokio::sync::Mutex<bool>,
    /// Whether the namespace admits the Pod of a root init, once known (`admission`).
    pub root_init: tokio::sync::Mutex<Option<Result<(), String>>>,
    /// Pods this rung deleted itself while their attempt ran (a hard stop): their end is
    /// not someone else's removal.
    pub hard_stopped: Mutex<HashSet<String>>,
    /// Pods whose init's last frame arrived: deleted with grace 0 at once, never followed
    /// for the kubelet's next sync (`cleanup::Work::run`).
    pub concluded: Mutex<HashSet<String>>,
    /// Admission: the attempts in flight.
    pub gate: Gate,
}

impl std::fmt::Debug for KubeSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSite")
            .field("server", &self.server)
            .field("namespace", &self.namespace)
            .field("init_image", &self.init_image)
            .finish_non_exhaustive()
    }
}

impl KubeSite {
    pub fn new(
        client: kube::Client,
        namespace: String,
        server: String,
        server_version: String,
        config: KubeConfig,
        incarnation: String,
    ) -> Self {
        let pods = Api::namespaced(client.clone(), &namespace);
        let init_image = config.init_image.clone().unwrap_or_else(default_init_image);
        let base = SiteBase::new(incarnation, Captures::new(config.log_dir.clone()));
        let gate = Gate::new(config.max_in_flight, config.wait_for_admission, None);
        Self {
            client,
            pods,
            namespace,
            server,
            server_version,
            config,
            base,
            init_image,
            access: tokio::sync::Mutex::new(false),
            root_init: tokio::sync::Mutex::new(None),
            hard_stopped: Mutex::default(),
            concluded: Mutex::default(),
            gate,
        }
    }

    /// Runs one API call under the rung's per-call bound.
    pub async fn call<T>(
        &self,
        what: impl Into<String>,
        fut: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ClusterError> {
        let what = what.into();
        match tokio::time::timeout(self.config.api_timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.explain(what, e)),
            Err(_) => Err(ClusterError::Timeout { what, after: self.config.api_timeout }),
        }
    }

    /// An API error in the rung's words: a missing namespace named as such.
    pub fn explain(&self, what: String, e: kube::Error) -> ClusterError {
        let err = ClusterError::api(what, e);
        if let ClusterError::Api { code: Some(404), message, .. } = &err
            && message.contains(&format!("namespaces \"{}\" not found", self.namespace))
        {
            return ClusterError::NoNamespace(self.namespace.clone());
        }
        err
    }

    /// A 403 on `resource` named as the permission it is (WebSocket upgrades are `get`
    /// on 1.20, `create` later: both are named).
    pub fn forbidden(&self, e: ClusterError, resource: &str) -> ClusterError {
        match e.code() {
            Some(403) => ClusterError::Forbidden {
                verb: "get, create".into(),
                resource: resource.into(),
                namespace: self.namespace.clone(),
            },
            _ => e,
        }
    }

    /// Deletes a Pod: at once when nothing of it runs any more (`done`), else with a second
    /// of grace (the kubelet stops its containers: TERM, then KILL). Gone already is fine.
    pub async fn delete_pod(&self, name: &str, done: bool) -> Result<bool, ClusterError> {
        let dp = DeleteParams { grace_period_seconds: Some(if done { 0 } else { 1 }), ..DeleteParams::default() };
        match self.call(format!("deleting Pod {name}"), self.pods.delete(name, &dp)).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The Pod as the API has it now (`None`: gone).
    /// The Pod as the API server's cache has it (`resourceVersion=0`: no read of etcd, which
    /// a node busy writing statuses can make a hundred ms): for evidence, never a decision.
    pub async fn cached_pod(&self, name: &str) -> Result<Option<Pod>, ClusterError> {
        self.read_pod(name, &kube::api::GetParams::any()).await
    }

    pub async fn get_pod(&self, name: &str) -> Result<Option<Pod>, ClusterError> {
        self.read_pod(name, &kube::api::GetParams::default()).await
    }

    async fn read_pod(&self, name: &str, params: &kube::api::GetParams) -> Result<Option<Pod>, ClusterError> {
        match self.call(format!("reading Pod {name}"), self.pods.get_with(name, params)).await {
            Ok(p) => Ok(Some(p)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The tag `stevedore image init` gives the embedded init: `stevedore-init:<16 hex>`.
pub fn default_init_image() -> String {
    let digest = crate::sandbox::init_binary::sha256();
    format!("stevedore-init:{}", &digest[..16.min(digest.len())])
}
