//! `KubeExecutor`: the kube rung's public face: connecting like kubectl, the census and the
//! access check. Its `Executor` is the shared front's (`attempt::front`), over this rung's
//! `Launch` (`attempt`).

use super::config::KubeConfig;
use super::error::{ClusterError, without_values};
use super::site::KubeSite;
use crate::contract::LaunchError;
use std::sync::Arc;

/// Runs each attempt in a fresh Pod on a Kubernetes cluster (1.20 and later). Cheap to clone;
/// clones share the client, the admission bound and the tasks.
#[derive(Debug, Clone)]
pub struct KubeExecutor {
    site: Arc<KubeSite>,
}

/// The client configuration, found the way kubectl finds it.
async fn load(cfg: &KubeConfig) -> Result<kube::Config, ClusterError> {
    let options = kube::config::KubeConfigOptions { context: cfg.context.clone(), ..Default::default() };
    // The client's words may quote a kubeconfig's values: those are never said.
    let config_error = |what: String, e: &dyn std::fmt::Display| ClusterError::Config {
        why: format!("{what}: {}", without_values(&e.to_string())),
        source: None,
    };
    match &cfg.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| config_error(format!("cannot read kubeconfig {}", path.display()), &e))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| config_error(format!("kubeconfig {}", path.display()), &e))
        }
        None if cfg.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| config_error("KUBECONFIG or ~/.kube/config".into(), &e)),
        None => kube::Config::infer().await.map_err(|e| {
            config_error("neither KUBECONFIG, ~/.kube/config nor a Pod's service account gave a cluster".into(), &e)
        }),
    }
}

/// Plain http to a server that is not on loopback hands the token to the network.
fn check_transport(url: &http::Uri, allow: bool) -> Result<(), ClusterError> {
    let loopback = match url.host() {
        Some(h) => {
            h == "localhost" || h.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
        None => false,
    };
    if url.scheme_str() == Some("http") && !loopback && !allow {
        return Err(ClusterError::Config {
            why: format!(
                "the API server {url} is plain http on a non-loopback address: the credentials would cross the \
                 network in the clear (use https, or allow it with allow_insecure_http)"
            ),
            source: None,
        });
    }
    Ok(())
}

impl KubeExecutor {
    /// Connects to the cluster as kubectl would (the configuration's kubeconfig, else
    /// `KUBECONFIG`, else `~/.kube/config`, else the Pod's service account) and reads the
    /// server's version. Every rung of a process shares the process's incarnation.
    pub async fn connect(config: KubeConfig) -> Result<Self, LaunchError> {
        let kcfg = load(&config).await?;
        check_transport(&kcfg.cluster_url, config.allow_insecure_http)?;
        let server = kcfg.cluster_url.to_string();
        let namespace = config.namespace.clone().unwrap_or_else(|| kcfg.default_namespace.clone());
        let namespace = if namespace.is_empty() { "default".to_owned() } else { namespace };
        let client = kube::Client::try_from(kcfg).map_err(|e| ClusterError::Config {
            why: format!("cannot make a client for {server}"),
            source: Some(Box::new(e)),
        })?;
        let version = match tokio::time::timeout(config.api_timeout, client.apiserver_version()).await {
            Ok(Ok(v)) => v.git_version,
            Ok(Err(e)) => {
                let e = ClusterError::api("reading the server's version", e);
                return Err(match e.code() {
                    None => LaunchError::ClusterUnreachable { server, source: Box::new(e) },
                    Some(_) => e.into(),
                });
            }
            Err(_) => {
                let source =
                    ClusterError::Timeout { what: "reading the server's version".into(), after: config.api_timeout };
                return Err(LaunchError::ClusterUnreachable { server, source: Box::new(source) });
            }
        };
        let incarnation =
            config.incarnation.clone().unwrap_or_else(|| crate::contract::incarnation::current().to_owned());
        let site = Arc::new(KubeSite::new(client, namespace, server, version, config, incarnation));
        Ok(Self { site })
    }

    /// The configuration.
    pub fn config(&self) -> &KubeConfig {
        &self.site.config
    }

    /// The namespace the Pods go into.
    pub fn namespace(&self) -> &str {
        &self.site.namespace
    }

    /// The API server's version (`v1.20.2`).
    pub fn server_version(&self) -> &str {
        &self.site.server_version
    }

    /// The init image the Pods use.
    pub fn init_image(&self) -> &str {
        &self.site.init_image
    }

    /// The incarnation stamped on everything this rung creates.
    pub fn incarnation(&self) -> &str {
        &self.site.base.incarnation
    }

    /// What the cluster is, as far as the credentials may see.
    pub async fn census(&self) -> super::ClusterCensus {
        super::census::census(&self.site).await
    }

    /// Checks that the credentials may do everything the rung does (create, watch, attach
    /// to, exec in and delete Pods in the namespace); the first permission missing, named.
    pub async fn check_access(&self) -> Result<(), ClusterError> {
        super::access::ensure(&self.site).await
    }
}

crate::attempt::front::executor!(KubeExecutor, site);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_is_refused_off_loopback_only() {
        let uri = |s: &str| s.parse::<http::Uri>().unwrap();
        assert!(check_transport(&uri("http://10.0.0.5:8080"), false).unwrap_err().to_string().contains("in the clear"));
        assert!(check_transport(&uri("http://10.0.0.5:8080"), true).is_ok());
        assert!(check_transport(&uri("http://127.0.0.1:8080"), false).is_ok());
        assert!(check_transport(&uri("http://[::1]:8080"), false).is_ok());
        assert!(check_transport(&uri("https://10.0.0.5:6443"), false).is_ok());
    }
}
