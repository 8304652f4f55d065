//! What the cluster is, as far as the rung's credentials may see: the server's version, the
//! namespace, the nodes with what they can allocate, the runtime classes; each part the
//! credentials may not read is named as such, never fatal.

use super::site::KubeSite;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, ListParams};
use serde::Serialize;
use std::collections::BTreeMap;

/// One node.
#[derive(Debug, Clone, Serialize)]
pub struct NodeFacts {
    /// Its name.
    pub name: String,
    /// Its kubelet's version.
    pub kubelet_version: String,
    /// Its container runtime (`containerd://1.6.20`).
    pub container_runtime: String,
    /// What it can allocate to Pods (`cpu`, `memory`, `pods`, extended resources).
    pub allocatable: BTreeMap<String, String>,
    /// Whether it is Ready.
    pub ready: bool,
}

/// What the cluster is.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterCensus {
    /// The API server, as stevedore reaches it.
    pub server: String,
    /// Its version (`v1.20.2`).
    pub server_version: String,
    /// The attempts' namespace.
    pub namespace: String,
    /// The nodes (`None`: the credentials may not list them; `unreadable` says why).
    pub nodes: Option<Vec<NodeFacts>>,
    /// The runtime classes (`None`: likewise).
    pub runtime_classes: Option<Vec<String>>,
    /// What could not be read, and why.
    pub unreadable: BTreeMap<String, String>,
    /// The init image the Pods use.
    pub init_image: String,
    /// How inputs reach `/in`: over the link to a root init where the namespace admits its Pod
    /// (asked by a dry run), else through the init container, and why.
    pub inputs: String,
}

pub(crate) async fn census(site: &KubeSite) -> ClusterCensus {
    let mut unreadable = BTreeMap::new();
    let nodes: Api<Node> = Api::all(site.client.clone());
    let nodes = match site.call("listing the nodes", nodes.list(&ListParams::default())).await {
        Ok(list) => Some(list.items.iter().map(node_facts).collect()),
        Err(e) => {
            unreadable.insert("nodes".into(), crate::util::error_chain(&e));
            None
        }
    };
    let classes: Api<RuntimeClass> = Api::all(site.client.clone());
    let runtime_classes = match site.call("listing the runtime classes", classes.list(&ListParams::default())).await {
        Ok(list) => Some(list.items.iter().filter_map(|c| c.metadata.name.clone()).collect()),
        Err(e) => {
            unreadable.insert("runtime_classes".into(), crate::util::error_chain(&e));
            None
        }
    };
    let inputs = match super::admission::root_init(site).await {
        Ok(()) => "over the link to a root init (the namespace admits its Pod: a dry run)".to_owned(),
        Err(why) => format!("through the init container ({why})"),
    };
    ClusterCensus {
        inputs,
        server: site.server.clone(),
        server_version: site.server_version.clone(),
        namespace: site.namespace.clone(),
        nodes,
        runtime_classes,
        unreadable,
        init_image: site.init_image.clone(),
    }
}

fn node_facts(n: &Node) -> NodeFacts {
    let status = n.status.as_ref();
    let info = status.and_then(|s| s.node_info.as_ref());
    NodeFacts {
        name: n.metadata.name.clone().unwrap_or_default(),
        kubelet_version: info.map(|i| i.kubelet_version.clone()).unwrap_or_default(),
        container_runtime: info.map(|i| i.container_runtime_version.clone()).unwrap_or_default(),
        allocatable: status
            .and_then(|s| s.allocatable.as_ref())
            .map(|a| a.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
            .unwrap_or_default(),
        ready: status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
    }
}
