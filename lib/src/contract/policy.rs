//! The caller's isolation policy for one attempt.

use super::Level;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The grace period when a policy gives none (or a zero one).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// What isolation an attempt needs and how it is stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// The minimum isolation level.
    pub level: Level,
    /// Time between SIGTERM and SIGKILL, in milliseconds; zero or negative means [`DEFAULT_GRACE`].
    #[serde(default)]
    pub grace_period_ms: i64,
    /// Run on the default rung when no rung reaches `level`.
    #[serde(default)]
    pub allow_downgrade: bool,
    /// Image override; empty means the worker's own image.
    #[serde(default)]
    pub image: String,
    /// The attempt must have no network: only rungs that deny it are selected
    /// ([`crate::Executor::denies_network`]; a Pod has the cluster's network unless its
    /// namespace denies it). Default `false`: a rung's own network setting stands.
    #[serde(default)]
    pub no_network: bool,
}

impl Policy {
    /// A policy that needs at least `level`.
    pub fn at_least(level: Level) -> Self {
        Self { level, ..Self::default() }
    }

    /// The effective grace period.
    pub fn grace(&self) -> Duration {
        if self.grace_period_ms <= 0 { DEFAULT_GRACE } else { Duration::from_millis(self.grace_period_ms as u64) }
    }

    /// Refuses an attempt whose policy requires no network on rung `rung`, which does not
    /// deny it (`denies`): a rung called directly keeps the registry's promise too.
    pub(crate) fn admit_network(&self, rung: &str, denies: bool) -> Result<(), super::LaunchError> {
        if self.no_network && !denies {
            return Err(super::LaunchError::NotAllowed(format!(
                "the policy requires no network, and rung {rung} cannot deny it"
            )));
        }
        Ok(())
    }

    /// Sets the grace period (builder style).
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace_period_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_defaults() {
        assert_eq!(Policy::default().grace(), DEFAULT_GRACE);
        let p = Policy { grace_period_ms: -5, ..Policy::default() };
        assert_eq!(p.grace(), Duration::from_secs(30));
        let p = Policy::default().with_grace(Duration::from_millis(1500));
        assert_eq!(p.grace(), Duration::from_millis(1500));
        let closed = Policy { no_network: true, ..Policy::default() };
        assert!(closed.admit_network("kube", true).is_ok());
        let err = closed.admit_network("kube", false).unwrap_err().to_string();
        assert!(err.contains("requires no network") && err.contains("kube"), "{err}");
        assert!(Policy::default().admit_network("kube", false).is_ok(), "a rung's own setting stands");
    }
}
