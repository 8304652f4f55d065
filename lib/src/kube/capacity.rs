//! Whether a Pod the scheduler cannot place now could ever be placed: only a request that no
//! node could take even empty (above every node's allocatable, or no node matching the
//! selector) fails at once; any other waits within `launch_timeout` for room (a full cluster
//! empties). Nodes are read when the credentials may list them; when they may not, nothing
//! can be told, and the attempt waits.

use super::site::KubeSite;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use std::collections::BTreeMap;

/// What the Pod asks of a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Need {
    pub memory: u64,
    pub cpu_millis: Option<u64>,
    /// The extended resource and how many.
    pub gpus: Option<(String, u64)>,
}

/// Why no node could ever take `need` (naming the biggest node), or `None` when one could
/// (or the nodes cannot be read).
pub(crate) async fn never_fits(site: &KubeSite, need: &Need) -> Option<String> {
    let nodes: Api<Node> = Api::all(site.client.clone());
    let list = site.call("listing the nodes", nodes.list(&ListParams::default())).await.ok()?;
    judge(&list.items, &site.config.node_selector, need)
}

/// The pure part of [`never_fits`].
fn judge(nodes: &[Node], selector: &BTreeMap<String, String>, need: &Need) -> Option<String> {
    let matching: Vec<&Node> = nodes
        .iter()
        .filter(|n| {
            let labels = n.metadata.labels.as_ref();
            selector.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        })
        .collect();
    if matching.is_empty() {
        return Some(format!("no node of the cluster's {} matches the node selector {selector:?}", nodes.len()));
    }
    let allocatable = |n: &Node, key: &str| {
        n.status.as_ref().and_then(|s| s.allocatable.as_ref()).and_then(|a| a.get(key)).and_then(|q| quantity(&q.0))
    };
    let fits = |n: &&Node| {
        allocatable(n, "memory").is_some_and(|m| m >= u128::from(need.memory) * 1000)
            && need.cpu_millis.is_none_or(|c| allocatable(n, "cpu").is_some_and(|a| a >= u128::from(c)))
            && need.gpus.as_ref().is_none_or(|(k, g)| allocatable(n, k).is_some_and(|a| a >= u128::from(*g) * 1_000))
    };
    if matching.iter().any(fits) {
        return None;
    }
    let biggest = matching.iter().max_by_key(|n| allocatable(n, "memory").unwrap_or(0))?;
    let name = biggest.metadata.name.as_deref().unwrap_or("a node");
    let said = |key: &str| {
        biggest
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get(key))
            .map_or_else(|| "none".to_owned(), |q| q.0.clone())
    };
    let mut asked = format!("memory {}", need.memory);
    if let Some(c) = need.cpu_millis {
        asked.push_str(&format!(", cpu {c}m"));
    }
    if let Some((k, g)) = &need.gpus {
        asked.push_str(&format!(", {k} {g}"));
    }
    Some(format!(
        "the Pod asks {asked}, more than any node could give even empty: the biggest, {name}, can allocate memory {}, \
         cpu {}",
        said("memory"),
        said("cpu")
    ))
}

/// A Kubernetes quantity in thousandths of its unit (so `cpu: 1500m` is 1_500_000 and
/// `memory: 1Ki` is 1_024_000); `None` when it is not one.
fn quantity(q: &str) -> Option<u128> {
    let q = q.trim();
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    let frac: String = frac.chars().chain(std::iter::repeat('0')).take(3).collect();
    let milli = whole.parse::<u128>().ok()?.checked_mul(1000)?.checked_add(frac.parse::<u128>().ok()?)?;
    let factor: u128 = match suffix {
        "" => 1000,
        "m" => 1,
        "k" => 1000 * 1000,
        "M" => 1000 * 1000u128.pow(2),
        "G" => 1000 * 1000u128.pow(3),
        "T" => 1000 * 1000u128.pow(4),
        "Ki" => 1000 * 1024,
        "Mi" => 1000 * 1024u128.pow(2),
        "Gi" => 1000 * 1024u128.pow(3),
        "Ti" => 1000 * 1024u128.pow(4),
        _ => return None,
    };
    milli.checked_mul(factor)?.checked_div(1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn node(name: &str, memory: &str, cpu: &str, labels: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
        n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            allocatable: Some(BTreeMap::from([
                ("memory".to_owned(), Quantity(memory.into())),
                ("cpu".to_owned(), Quantity(cpu.into())),
            ])),
            ..Default::default()
        });
        n
    }

    #[test]
    fn quantities_read_as_kubernetes_writes_them() {
        assert_eq!(quantity("2"), Some(2000));
        assert_eq!(quantity("1500m"), Some(1500));
        assert_eq!(quantity("1.5"), Some(1500));
        assert_eq!(quantity("24506744Ki"), Some(24_506_744 * 1024 * 1000));
        assert_eq!(quantity("1G"), Some(1_000_000_000_000));
        assert_eq!(quantity("3Zi"), None);
        assert_eq!(quantity(""), None);
    }

    #[test]
    fn only_a_pod_no_node_could_ever_take_fails_at_once() {
        let nodes = [node("small", "1Gi", "2", &[("zone", "a")]), node("big", "24Gi", "2", &[("zone", "b")])];
        let need = |gib: u64| Need { memory: gib << 30, cpu_millis: Some(500), gpus: None };
        assert_eq!(judge(&nodes, &BTreeMap::new(), &need(3)), None, "fits the big node once it empties");
        let why = judge(&nodes, &BTreeMap::new(), &need(64)).unwrap();
        assert!(why.contains("the biggest, big, can allocate memory 24Gi, cpu 2"), "{why}");
        let zone_a = BTreeMap::from([("zone".to_owned(), "a".to_owned())]);
        assert!(judge(&nodes, &zone_a, &need(3)).unwrap().contains("the biggest, small"));
        let zone_c = BTreeMap::from([("zone".to_owned(), "c".to_owned())]);
        assert!(judge(&nodes, &zone_c, &need(1)).unwrap().contains("matches the node selector"));
        let cpu = Need { memory: 1 << 20, cpu_millis: Some(3000), gpus: None };
        assert!(judge(&nodes, &BTreeMap::new(), &cpu).is_some(), "more cpu than any node");
    }
}
