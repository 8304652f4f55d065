//! What can go wrong between the kube rung and a cluster, each in words a user acts on.

use std::time::Duration;

/// Why the cluster did not do what the rung asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// there is no usable cluster configuration
    #[error("no cluster configuration: {why}")]
    Config {
        /// What was missing or wrong.
        why: String,
        /// The cause.
        #[source]
        source: Option<Box<kube::Error>>,
    },
    /// the API server refused the credentials
    #[error("the API server refused the credentials (401 Unauthorized): {message}")]
    Unauthorized {
        /// The server's words.
        message: String,
    },
    /// the credentials lack a permission the rung needs
    #[error(
        "forbidden: the credentials may not {verb} {resource} in namespace {namespace:?} (the README's \"Kubernetes\" \
         section has the least Role the rung needs)"
    )]
    Forbidden {
        /// The verb (`create`, `get`, ...).
        verb: String,
        /// The resource (`pods`, `pods/exec`, ...).
        resource: String,
        /// The namespace.
        namespace: String,
    },
    /// the namespace does not exist
    #[error("namespace {0:?} does not exist")]
    NoNamespace(String),
    /// no node can take the Pod
    #[error("no node can take the Pod: {reason}")]
    Unschedulable {
        /// The scheduler's words.
        reason: String,
    },
    /// the namespace's ResourceQuota refuses the Pod now
    #[error("the namespace's ResourceQuota refuses the Pod: {message}")]
    Quota {
        /// The API server's words.
        message: String,
    },
    /// the Pod did not start in time
    #[error("the Pod did not start within {waited:?}: {state}")]
    StartTimeout {
        /// How long the rung waited.
        waited: Duration,
        /// What the Pod was waiting for, as the kubelet said.
        state: String,
    },
    /// the Pod failed before its attempt started
    #[error("the Pod failed before the attempt started: {what}")]
    PodFailed {
        /// What the kubelet or the init container said.
        what: String,
    },
    /// an API call failed
    #[error("{what} failed: {message}")]
    Api {
        /// The call.
        what: String,
        /// The server's or the client's words.
        message: String,
        /// The HTTP status, when the server answered.
        code: Option<u16>,
        /// The cause.
        #[source]
        source: Option<Box<kube::Error>>,
    },
    /// an API call got no answer in time
    #[error("{what} got no answer within {after:?}")]
    Timeout {
        /// The call.
        what: String,
        /// The bound.
        after: Duration,
    },
}

/// `text` with everything it quotes left out (a value read from a kubeconfig, a credential
/// plugin's output or command line, in the client's messages), so an error never carries a
/// secret.
pub(crate) fn without_values(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut quote = None;
    for c in text.chars() {
        match (quote, c) {
            (None, '"' | '\'' | '`') => {
                quote = Some(c);
                out.push('\u{2026}');
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, c) => out.push(c),
        }
    }
    out
}

impl ClusterError {
    /// An API call's error, with the server's words when it answered.
    pub(crate) fn api(what: impl Into<String>, e: kube::Error) -> Self {
        let (message, code) = match &e {
            kube::Error::Api(s) => (format!("{} ({})", s.message, s.code), Some(s.code)),
            kube::Error::UpgradeConnection(kube::client::UpgradeConnectionError::ProtocolSwitch(c)) => {
                (format!("the server answered {c} instead of upgrading the connection"), Some(c.as_u16()))
            }
            // A credential plugin's output, a kubeconfig's values: never said (only their shape).
            kube::Error::Auth(_) => {
                (format!("the credentials could not be had: {}", without_values(&e.to_string())), None)
            }
            other => (without_values(&other.to_string()), None),
        };
        if code == Some(401) {
            return ClusterError::Unauthorized { message };
        }
        // The server's own words are the message; only a client-side failure keeps its cause.
        let source = (!matches!(e, kube::Error::Api(_))).then(|| Box::new(e));
        ClusterError::Api { what: what.into(), message, code, source }
    }

    /// The HTTP status of the server's answer, if it answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            ClusterError::Api { code, .. } => *code,
            ClusterError::Unauthorized { .. } => Some(401),
            ClusterError::Forbidden { .. } => Some(403),
            ClusterError::NoNamespace(_) => Some(404),
            _ => None,
        }
    }

    /// Whether the object the call was about does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ClusterError::Api { code: Some(404), .. } | ClusterError::NoNamespace(_))
    }

    /// Whether the server could not be reached at all (no answer, a refused connection).
    pub fn is_unreachable(&self) -> bool {
        match self {
            ClusterError::Timeout { .. } => true,
            ClusterError::Api { code: None, source: Some(e), .. } => {
                matches!(**e, kube::Error::HyperError(_) | kube::Error::Service(_))
            }
            _ => false,
        }
    }
}

// The contract names no rung: a cluster's error reaches it as a cause of its own words.
impl From<ClusterError> for crate::contract::LaunchError {
    fn from(e: ClusterError) -> Self {
        crate::contract::LaunchError::Cluster(Box::new(e))
    }
}

impl From<ClusterError> for crate::contract::ReclaimError {
    fn from(e: ClusterError) -> Self {
        crate::contract::ReclaimError::Cluster(Box::new(e))
    }
}

impl From<ClusterError> for crate::contract::RecoverError {
    fn from(e: ClusterError) -> Self {
        crate::contract::RecoverError::Cluster(Box::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_client_quotes_is_never_said() {
        let said = without_values("auth exec command 'get-token --secret s3cr3t' failed: Output { stdout: \"tok3n\" }");
        assert!(!said.contains("s3cr3t") && !said.contains("tok3n"), "{said}");
        assert!(said.starts_with("auth exec command \u{2026} failed"), "{said}");
        assert_eq!(without_values("no quotes here"), "no quotes here");
        assert!(!without_values("an \"unterminated s3cr3t").contains("s3cr3t"));
    }
}
