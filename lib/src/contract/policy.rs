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
    /// What must be enforced, by the names of the evidence's `enforcement` ([`ENFORCEABLE`]):
    /// only rungs whose census says they apply them all are selected
    /// ([`crate::Executor::enforces`]), and an attempt whose rung, reading back what it
    /// applied, did not apply one ends `launch_failed`/`not_enforced` before its command runs.
    /// Empty by default: each rung applies what it can and names the rest in `skipped`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub require_enforced: Vec<String>,
}

/// The names `Policy::require_enforced` takes: the evidence's `enforcement` keys that say a
/// limit or a hardening was applied.
pub const ENFORCEABLE: &[&str] = &[
    "memory",
    "cpu",
    "pids",
    "disk",
    "network",
    "seccomp",
    "apparmor",
    "non_root",
    "read_only_rootfs",
    "capabilities",
    "no_new_privileges",
];

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

    /// Of `require_enforced`, what `enforcement` (the attempt's, as its rung read back what it
    /// applied) lacks or `skipped` names, each with why (the skip's words, or that it is not
    /// among what was applied).
    pub(crate) fn not_enforced(
        &self,
        enforcement: &std::collections::BTreeMap<String, String>,
        skipped: &std::collections::BTreeMap<String, String>,
    ) -> Vec<(String, String)> {
        self.require_enforced
            .iter()
            .filter_map(|k| match (enforcement.contains_key(k), skipped.get(k)) {
                (_, Some(why)) => Some((k.clone(), why.clone())),
                (false, None) => {
                    Some((k.clone(), "not among what the rung applied (for a limit: none was asked)".into()))
                }
                (true, None) => None,
            })
            .collect()
    }

    /// Requires `what` enforced (builder style).
    pub fn requiring<I: IntoIterator<Item = S>, S: Into<String>>(mut self, what: I) -> Self {
        self.require_enforced.extend(what.into_iter().map(Into::into));
        self
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

    /// Required and applied: fine; required and skipped: the skip's words; required and not
    /// applied at all: said so; not required: never looked at.
    #[test]
    fn what_is_required_is_checked_against_what_was_applied() {
        let map = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let applied = map(&[("memory", "64 MiB"), ("pids", "512"), ("cpu", "500m")]);
        let skipped = map(&[("cpu", "no cgroup"), ("disk", "no mount")]);
        let p = Policy::default().requiring(["memory", "cpu", "network"]);
        let missing = p.not_enforced(&applied, &skipped);
        assert_eq!(missing[0], ("cpu".to_owned(), "no cgroup".to_owned()), "skipped wins over applied");
        assert_eq!(missing[1].0, "network");
        assert!(missing[1].1.contains("not among"), "{missing:?}");
        assert_eq!(missing.len(), 2);
        assert!(Policy::default().not_enforced(&applied, &skipped).is_empty());
    }

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
