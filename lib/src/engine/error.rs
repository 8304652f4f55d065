//! Engine errors: the call that failed, named once, with the engine's own error as the cause.

use std::time::Duration;

/// An engine call that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// the engine's address cannot be used
    #[error(transparent)]
    Endpoint(#[from] super::endpoint::EndpointError),
    /// the engine could not be reached or its address is invalid
    #[error("cannot connect to the engine at {endpoint}")]
    Connect {
        /// Where.
        endpoint: String,
        /// The cause.
        #[source]
        source: Box<bollard::errors::Error>,
    },
    /// the call took longer than stevedore's own timeout
    #[error("engine call {op} timed out after {after:?}")]
    Timeout {
        /// The call.
        op: &'static str,
        /// The timeout.
        after: Duration,
    },
    /// the engine answered with an error
    #[error("engine call {op} failed")]
    Api {
        /// The call.
        op: &'static str,
        /// The cause (boxed: bollard's error is large).
        #[source]
        source: Box<bollard::errors::Error>,
    },
    /// a fake engine refused the call (tests)
    #[error("engine call {op} failed: {message}")]
    Refused {
        /// The call.
        op: &'static str,
        /// The status code it answered with.
        status: u16,
        /// Its message.
        message: String,
    },
}

impl EngineError {
    fn status(&self) -> Option<(u16, &str)> {
        match self {
            EngineError::Api { source, .. } => match source.as_ref() {
                bollard::errors::Error::DockerResponseServerError { status_code, message } => {
                    Some((*status_code, message))
                }
                _ => None,
            },
            EngineError::Refused { status, message, .. } => Some((*status, message)),
            _ => None,
        }
    }

    /// Whether stevedore stopped waiting: the engine may still do (or have done) the call.
    pub fn is_timeout(&self) -> bool {
        matches!(self, EngineError::Timeout { .. })
    }

    /// Whether trying again later may succeed: no answer in time, a connection lost or
    /// refused, or the engine's own failure (5xx), never its refusal of the call (4xx).
    pub fn is_transient(&self) -> bool {
        match self {
            EngineError::Timeout { .. } | EngineError::Connect { .. } => true,
            EngineError::Api { .. } | EngineError::Refused { .. } => {
                self.status().is_none_or(|(status, _)| status >= 500)
            }
            _ => false,
        }
    }

    /// Whether the engine said the object does not exist.
    pub fn is_not_found(&self) -> bool {
        self.status().is_some_and(|(s, _)| s == 404)
    }

    /// Whether the engine refused because the name is taken.
    pub fn is_conflict(&self) -> bool {
        self.status().is_some_and(|(s, _)| s == 409)
    }

    /// Whether the engine refused because someone else is removing the object.
    pub(crate) fn is_removal_in_progress(&self) -> bool {
        self.status().is_some_and(|(s, m)| s == 409 && m.contains("already in progress"))
    }

    /// The engine's message, if it sent one, else this error's text.
    pub fn message(&self) -> String {
        match self.status() {
            Some((_, m)) => m.to_owned(),
            None => crate::util::error_chain(self),
        }
    }
}
