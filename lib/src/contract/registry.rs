//! The registry of rungs and the selection rules.

use super::{Executor, Level, Policy};
use std::sync::Arc;

/// Why no rung can run a policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectError {
    /// no rung is registered
    #[error("no executor registered")]
    Empty,
    /// no rung reaches the policy's level and downgrade is not allowed
    #[error("no executor provides isolation level {wanted} (registered: {registered})")]
    Unsatisfiable {
        /// The level asked for.
        wanted: Level,
        /// Every rung as `name(level)`, comma-separated.
        registered: String,
    },
    /// no rung that reaches the policy's level denies the network, as the policy requires
    #[error("no executor provides isolation level {wanted} without a network (registered: {registered})")]
    NetworkNotDenied {
        /// The level asked for.
        wanted: Level,
        /// Every rung as `name(level, network)`, comma-separated.
        registered: String,
    },
    /// no rung that reaches the policy's level applies everything the policy requires enforced
    #[error("no executor provides isolation level {wanted} enforcing {required} (registered: {registered})")]
    NotEnforced {
        /// The level asked for.
        wanted: Level,
        /// What the policy requires enforced, comma-separated.
        required: String,
        /// Every rung as `name(level: what it enforces)`, comma-separated.
        registered: String,
    },
    /// a rung with this name is already registered
    #[error("an executor named {0:?} is already registered")]
    Duplicate(String),
    /// the named default is not registered
    #[error("default executor {0:?} is not registered")]
    UnknownDefault(String),
}

/// Holds the rungs and picks one per policy.
#[derive(Debug, Default, Clone)]
pub struct Registry {
    rungs: Vec<Arc<dyn Executor>>,
    default: Option<usize>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a rung. The first registered is the default until one is named.
    pub fn register(&mut self, rung: Arc<dyn Executor>) -> Result<(), SelectError> {
        if self.rungs.iter().any(|r| r.name() == rung.name()) {
            return Err(SelectError::Duplicate(rung.name().to_owned()));
        }
        self.rungs.push(rung);
        Ok(())
    }

    /// Registers a rung and makes it the default.
    pub fn register_default(&mut self, rung: Arc<dyn Executor>) -> Result<(), SelectError> {
        self.register(rung)?;
        self.default = Some(self.rungs.len() - 1);
        Ok(())
    }

    /// Names the default rung.
    pub fn set_default(&mut self, name: &str) -> Result<(), SelectError> {
        let i = self
            .rungs
            .iter()
            .position(|r| r.name() == name)
            .ok_or_else(|| SelectError::UnknownDefault(name.to_owned()))?;
        self.default = Some(i);
        Ok(())
    }

    /// The default rung.
    pub fn default_rung(&self) -> Option<&Arc<dyn Executor>> {
        self.rungs.get(self.default.unwrap_or(0))
    }

    /// Every rung.
    pub fn rungs(&self) -> &[Arc<dyn Executor>] {
        &self.rungs
    }

    /// Picks the rung for `policy`: level `None` → the default; else the weakest rung whose
    /// level ≥ the policy's (ties by name); else, with `allow_downgrade`, the default; else
    /// an error listing every rung as `name(level)`.
    pub fn select(&self, policy: &Policy) -> Result<Arc<dyn Executor>, SelectError> {
        let default = self.default_rung().ok_or(SelectError::Empty)?;
        // A policy that requires no network never gets a rung that cannot deny it, nor one
        // that does not apply everything it requires enforced.
        let meets = |r: &Arc<dyn Executor>| {
            (!policy.no_network || r.denies_network()) && {
                let has = r.enforces();
                policy.require_enforced.iter().all(|k| has.contains(&k.as_str()))
            }
        };
        if policy.level == Level::None && meets(default) {
            return Ok(default.clone());
        }
        let best = self
            .rungs
            .iter()
            .filter(|r| r.level() >= policy.level && meets(r))
            .min_by(|a, b| a.level().cmp(&b.level()).then_with(|| a.name().cmp(b.name())));
        if let Some(r) = best {
            return Ok(r.clone());
        }
        if policy.allow_downgrade && meets(default) {
            return Ok(default.clone());
        }
        if !policy.require_enforced.is_empty() {
            let registered = self
                .rungs
                .iter()
                .map(|r| format!("{}({}: {})", r.name(), r.level(), r.enforces().join(" ")))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(SelectError::NotEnforced {
                wanted: policy.level,
                required: policy.require_enforced.join(", "),
                registered,
            });
        }
        if policy.no_network {
            let registered = self
                .rungs
                .iter()
                .map(|r| {
                    format!(
                        "{}({}, {})",
                        r.name(),
                        r.level(),
                        if r.denies_network() { "no network" } else { "network" }
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            return Err(SelectError::NetworkNotDenied { wanted: policy.level, registered });
        }
        let registered =
            self.rungs.iter().map(|r| format!("{}({})", r.name(), r.level())).collect::<Vec<_>>().join(", ");
        Err(SelectError::Unsatisfiable { wanted: policy.level, registered })
    }

    /// Recovers an attempt through the rung its checkpoint names (see [`Executor::recover`]).
    pub async fn recover(
        &self,
        checkpoint: &super::Checkpoint,
        hooks: Option<super::HookSet>,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<super::Outcome, super::RecoverError> {
        let rung = self
            .rungs
            .iter()
            .find(|r| r.name() == checkpoint.rung)
            .ok_or_else(|| super::RecoverError::UnknownRung(checkpoint.rung.clone()))?;
        rung.recover(checkpoint, hooks, cancel).await
    }

    /// Checks at startup that every policy a deployment will use can be satisfied.
    pub fn check_satisfiable<'p>(&self, policies: impl IntoIterator<Item = &'p Policy>) -> Result<(), SelectError> {
        for p in policies {
            self.select(p)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{LaunchError, Outcome, ReclaimError, ReclaimReport, Request};
    use crate::util::BoxFuture;
    use tokio_util::sync::CancellationToken;

    #[derive(Debug)]
    struct Fake(&'static str, Level);

    impl Executor for Fake {
        fn name(&self) -> &str {
            self.0
        }
        fn level(&self) -> Level {
            self.1
        }
        fn denies_network(&self) -> bool {
            !self.0.starts_with("net")
        }
        fn enforces(&self) -> Vec<&'static str> {
            match self.0.contains("limits") {
                true => vec!["memory", "pids"],
                false => vec!["pids"],
            }
        }
        fn run<'a>(&'a self, _: &'a Request, _: CancellationToken) -> BoxFuture<'a, Result<Outcome, LaunchError>> {
            Box::pin(async { Err(LaunchError::Closed(self.0.into())) })
        }
        fn reclaim<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<ReclaimReport, ReclaimError>> {
            Box::pin(async { Ok(ReclaimReport::default()) })
        }
        fn close(&self) -> BoxFuture<'_, ()> {
            Box::pin(async {})
        }
    }

    fn reg(rungs: &[(&'static str, Level)]) -> Registry {
        let mut r = Registry::new();
        for (n, l) in rungs {
            r.register(Arc::new(Fake(n, *l))).unwrap();
        }
        r
    }

    #[test]
    fn level_none_takes_default() {
        let mut r = reg(&[("inproc", Level::None), ("docker", Level::Sandboxed)]);
        assert_eq!(r.select(&Policy::at_least(Level::None)).unwrap().name(), "inproc");
        r.set_default("docker").unwrap();
        assert_eq!(r.select(&Policy::at_least(Level::None)).unwrap().name(), "docker");
    }

    #[test]
    fn weakest_sufficient_rung_with_ties_by_name() {
        let r = reg(&[("vm", Level::Vm), ("zeta", Level::Sandboxed), ("alpha", Level::Sandboxed), ("p", Level::None)]);
        assert_eq!(r.select(&Policy::at_least(Level::Process)).unwrap().name(), "alpha");
        assert_eq!(r.select(&Policy::at_least(Level::Vm)).unwrap().name(), "vm");
    }

    #[test]
    fn downgrade_takes_default() {
        let r = reg(&[("inproc", Level::None), ("docker", Level::Sandboxed)]);
        let p = Policy { allow_downgrade: true, ..Policy::at_least(Level::Vm) };
        assert_eq!(r.select(&p).unwrap().name(), "inproc");
    }

    #[test]
    fn unsatisfiable_lists_every_rung() {
        let r = reg(&[("inproc", Level::None), ("docker", Level::Sandboxed)]);
        let err = r.select(&Policy::at_least(Level::Vm)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no executor provides isolation level vm (registered: inproc(none), docker(sandboxed))"
        );
        assert!(r.check_satisfiable([&Policy::at_least(Level::Vm)]).is_err());
        assert!(r.check_satisfiable([&Policy::at_least(Level::Sandboxed)]).is_ok());
    }

    #[test]
    fn a_policy_without_network_never_gets_a_rung_with_one() {
        let r = reg(&[("net-kube", Level::Sandboxed), ("docker", Level::Vm), ("net-inproc", Level::None)]);
        let p = Policy { no_network: true, ..Policy::at_least(Level::Sandboxed) };
        assert_eq!(r.select(&p).unwrap().name(), "docker", "the stronger rung that denies it, not the weaker one");
        assert_eq!(r.select(&Policy::at_least(Level::Sandboxed)).unwrap().name(), "net-kube");
        let none = Policy { no_network: true, ..Policy::at_least(Level::None) };
        assert_eq!(r.select(&none).unwrap().name(), "docker", "the default has a network");
        let r = reg(&[("net-kube", Level::Sandboxed)]);
        let p = Policy { no_network: true, allow_downgrade: true, ..Policy::at_least(Level::Sandboxed) };
        assert_eq!(
            r.select(&p).unwrap_err().to_string(),
            "no executor provides isolation level sandboxed without a network (registered: net-kube(sandboxed, network))"
        );
    }

    #[test]
    fn a_policy_that_requires_enforcement_gets_only_a_rung_that_applies_it() {
        let r = reg(&[("weak", Level::Sandboxed), ("limits-vm", Level::Vm), ("net-inproc", Level::None)]);
        let p = Policy::at_least(Level::Sandboxed).requiring(["memory"]);
        assert_eq!(r.select(&p).unwrap().name(), "limits-vm", "the stronger rung that enforces it");
        let none = Policy::at_least(Level::None).requiring(["pids"]);
        assert_eq!(r.select(&none).unwrap().name(), "weak", "the default, which enforces it");
        let p = Policy { allow_downgrade: true, ..Policy::at_least(Level::Sandboxed).requiring(["disk"]) };
        assert_eq!(
            r.select(&p).unwrap_err().to_string(),
            "no executor provides isolation level sandboxed enforcing disk (registered: weak(sandboxed: pids), \
             limits-vm(vm: memory pids), net-inproc(none: pids))"
        );
    }

    #[test]
    fn registration_errors() {
        let mut r = reg(&[("a", Level::None)]);
        assert!(matches!(r.register(Arc::new(Fake("a", Level::Vm))), Err(SelectError::Duplicate(_))));
        assert!(matches!(r.set_default("zz"), Err(SelectError::UnknownDefault(_))));
        assert!(matches!(Registry::new().select(&Policy::default()), Err(SelectError::Empty)));
    }
}
