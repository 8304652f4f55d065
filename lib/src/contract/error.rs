//! Launch errors: attempts stopped before their sandbox ran the command.

use super::RequestError;
#[cfg(feature = "docker")]
use crate::engine::EngineError;

use crate::util::Cause;

/// Why an attempt never ran. A handler that ran and failed is an `Ok(Outcome)`, never this.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// the request is invalid
    #[error("invalid request: {0}")]
    InvalidRequest(#[from] RequestError),
    /// the engine cannot be reached
    #[cfg(feature = "docker")]
    #[error("engine unreachable at {endpoint}")]
    EngineUnreachable {
        /// Where stevedore looked for it.
        endpoint: String,
        /// The cause.
        #[source]
        source: EngineError,
    },
    /// the image is not available
    #[error("image {image:?} is not available: {why}")]
    ImageUnavailable {
        /// The image.
        image: String,
        /// Why, in words.
        why: String,
        /// Retrying cannot help (e.g. absent under pull policy `never`).
        permanent: bool,
        /// The engine's error, when there is one.
        #[source]
        source: Option<Cause>,
    },
    /// the image cannot run handlers
    #[error("image {image:?} is not a stevedore worker image: {why}")]
    NotAWorkerImage {
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
    /// the worker binary does not speak the handler protocol
    #[error(
        "the worker binary {worker} did not answer the handler protocol: does its main call \
         stevedore::sandbox::main_hook first? ({detail})"
    )]
    HandlerProtocol {
        /// Which worker binary: `of image "<ref>"`, or its path on the host.
        worker: String,
        /// What was seen: its exit, and the tail of its stderr.
        detail: String,
    },
    /// this client cannot serve as the engine's init
    #[error(
        "this stevedore cannot be the init on this engine: the init is built for {client}, the engine runs {engine}"
    )]
    InitUnavailable {
        /// The init's platform.
        client: String,
        /// The engine's platform.
        engine: String,
    },
    /// the image declares a volume inside one of stevedore's own mounts
    #[error(
        "image {image:?} declares VOLUME {volume} inside {mount}, where stevedore mounts its own: the engine \
         cannot make a volume there, and no retry changes the image (rebuild it without that VOLUME)"
    )]
    ImageVolume {
        /// The image.
        image: String,
        /// Its declared volume.
        volume: String,
        /// stevedore's mount it lies under.
        mount: String,
    },
    /// the inputs are larger than allowed
    #[error("the input dir holds {bytes} bytes, over the limit of {limit} bytes")]
    InputTooLarge {
        /// Their apparent size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// staging inputs failed
    #[error("staging failed: {what}")]
    Staging {
        /// What was being staged.
        what: String,
        /// The cause.
        #[source]
        source: Cause,
    },
    /// an engine call failed before the sandbox started
    #[cfg(feature = "docker")]
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// the cluster cannot be reached
    #[cfg(feature = "kube")]
    #[error("cluster unreachable at {server}")]
    ClusterUnreachable {
        /// The API server stevedore looked for.
        server: String,
        /// The cause (the kube rung's `ClusterError`).
        #[source]
        source: Cause,
    },
    /// the cluster refused or could not do what the attempt needs before it started (the
    /// kube rung's `ClusterError`)
    #[cfg(feature = "kube")]
    #[error(transparent)]
    Cluster(Cause),
    /// the configuration does not allow the request
    #[error("not allowed by configuration: {0}")]
    NotAllowed(String),
    /// a host port the configuration publishes explicitly is already in use (no fallback)
    #[cfg(feature = "docker")]
    #[error("host port {port} (container port {container_port}) of profile {profile:?} is taken")]
    PortTaken {
        /// The host port.
        port: u16,
        /// The container port it was to forward to.
        container_port: u16,
        /// The profile that asked for it (`default` without one).
        profile: String,
        /// The engine's error.
        #[source]
        source: EngineError,
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
    /// the engine's checkpoint hook failed, so the command was not started
    #[error("the checkpoint hook failed; the command was not started")]
    Hook(#[source] super::HookError),
}

impl LaunchError {
    /// Staging `what` failed with `e`.
    pub(crate) fn staging(what: impl Into<String>, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        LaunchError::Staging { what: what.into(), source: Box::new(e) }
    }

    /// Whether retrying the same request cannot help.
    pub fn is_permanent(&self) -> bool {
        match self {
            LaunchError::InvalidRequest(_)
            | LaunchError::NotAWorkerImage { .. }
            | LaunchError::FingerprintMismatch { .. }
            | LaunchError::HandlerProtocol { .. }
            | LaunchError::InitUnavailable { .. }
            | LaunchError::InputTooLarge { .. }
            | LaunchError::ImageVolume { .. }
            | LaunchError::NotAllowed(_) => true,
            LaunchError::ImageUnavailable { permanent, .. } => *permanent,
            _ => false,
        }
    }

    /// What a job engine should do next: give up on a permanent error or a cancellation
    /// before the start, else requeue (the attempt never ran, so no retry is spent).
    pub fn next(&self) -> super::Next {
        if self.is_permanent() || matches!(self, LaunchError::CancelledBeforeStart) {
            super::Next::GiveUp
        } else {
            super::Next::Requeue
        }
    }

    /// The engine's error behind this one, if any (e.g. to ask `is_not_found()`).
    #[cfg(feature = "docker")]
    pub fn engine_error(&self) -> Option<&EngineError> {
        match self {
            LaunchError::Engine(e)
            | LaunchError::EngineUnreachable { source: e, .. }
            | LaunchError::PortTaken { source: e, .. } => Some(e),
            LaunchError::ImageUnavailable { source, .. } => source.as_ref()?.downcast_ref(),
            _ => None,
        }
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
        let absent =
            LaunchError::ImageUnavailable { image: "i".into(), why: "w".into(), permanent: true, source: None };
        assert!(absent.is_permanent());
        let e = LaunchError::FingerprintMismatch { image: "i".into(), expected: "aaa".into(), actual: "bbb".into() };
        assert!(e.to_string().contains("aaa") && e.to_string().contains("bbb"));
        let e = LaunchError::HandlerProtocol { worker: "of image \"w:1\"".into(), detail: "exited 1".into() };
        assert!(e.to_string().contains("stevedore::sandbox::main_hook"));
    }
}
