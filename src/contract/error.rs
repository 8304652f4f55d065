//! Launch errors: attempts stopped before the sandbox started.

use super::RequestError;

/// The error's text followed by its sources' (those its text does not already end with),
/// on one line: for places that keep or print only text.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.ends_with(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

/// A boxed cause from an engine or the filesystem.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why an attempt never ran. A handler that ran and failed is an `Ok(Outcome)`, never this.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// the request is invalid
    #[error("invalid request: {0}")]
    InvalidRequest(#[from] RequestError),
    /// the engine cannot be reached
    #[error("engine unreachable at {endpoint}")]
    EngineUnreachable {
        /// Where stevedore looked for it.
        endpoint: String,
        /// The cause.
        #[source]
        source: Cause,
    },
    /// the image is not available
    #[error("image {image:?} is not available: {why}")]
    ImageUnavailable {
        /// The image.
        image: String,
        /// Why.
        why: String,
    },
    /// the image's handler set is not the one the caller expects
    #[error("handler set fingerprint mismatch: request expects {expected}, image {image:?} has {actual}")]
    FingerprintMismatch {
        /// The image.
        image: String,
        /// What the request expects.
        expected: String,
        /// What the image carries.
        actual: String,
    },
    /// the handler is not in the image's handler set
    #[error("unknown handler {0:?}")]
    UnknownHandler(String),
    /// staging inputs or outputs failed
    #[error("staging failed: {what}")]
    Staging {
        /// What was being staged.
        what: String,
        /// The cause.
        #[source]
        source: Cause,
    },
    /// an engine call failed before the sandbox started
    #[error("engine call {op} failed")]
    Engine {
        /// The call.
        op: &'static str,
        /// The cause.
        #[source]
        source: Cause,
    },
    /// the configuration does not allow the request
    #[error("not allowed by configuration: {0}")]
    NotAllowed(String),
    /// a host port the configuration publishes explicitly is already in use (no fallback)
    #[error("host port {port} (container port {container_port}) of profile {profile:?} is taken")]
    PortTaken {
        /// The host port.
        port: u16,
        /// The container port it was to forward to.
        container_port: u16,
        /// The profile that asked for it (`default` without one).
        profile: String,
        /// The engine's message.
        #[source]
        source: Cause,
    },
    /// the rung is closed
    #[error("executor {0} is closed and accepts no new attempts")]
    Closed(String),
    /// admission refused the attempt
    #[error("admission refused: {0}")]
    AdmissionRefused(String),
    /// the attempt was cancelled before its sandbox started
    #[error("cancelled before start")]
    CancelledBeforeStart,
}

impl LaunchError {
    /// Whether retrying the same request cannot help.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            LaunchError::InvalidRequest(_)
                | LaunchError::FingerprintMismatch { .. }
                | LaunchError::UnknownHandler(_)
                | LaunchError::NotAllowed(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permanence() {
        assert!(LaunchError::InvalidRequest(RequestError::AttemptZero).is_permanent());
        assert!(
            LaunchError::FingerprintMismatch { image: "i".into(), expected: "a".into(), actual: "b".into() }
                .is_permanent()
        );
        assert!(!LaunchError::Closed("c".into()).is_permanent());
        let e = LaunchError::EngineUnreachable { endpoint: "unix:///x".into(), source: "refused".into() };
        assert!(!e.is_permanent());
        assert_eq!(e.to_string(), "engine unreachable at unix:///x");
        let e = LaunchError::FingerprintMismatch { image: "i".into(), expected: "aaa".into(), actual: "bbb".into() };
        assert!(e.to_string().contains("aaa") && e.to_string().contains("bbb"));
    }
}
