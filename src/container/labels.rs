//! Labels on everything stevedore creates, and the filters that find them (pure).

use std::collections::{BTreeMap, HashMap};

/// The reverse-DNS prefix of every label.
pub const PREFIX: &str = "dev.stevedore.";
/// `true` on everything stevedore manages.
pub const MANAGED: &str = "dev.stevedore.managed";
/// The worker ID.
pub const WORKER: &str = "dev.stevedore.worker";
/// The boot of the process that created the object.
pub const INCARNATION: &str = "dev.stevedore.incarnation";
/// The rung's name.
pub const EXECUTOR: &str = "dev.stevedore.executor";
/// The job ID.
pub const JOB: &str = "dev.stevedore.job";
/// The attempt number.
pub const ATTEMPT: &str = "dev.stevedore.attempt";
/// The application scope.
pub const APP: &str = "dev.stevedore.app";
/// The organisation scope.
pub const ORG: &str = "dev.stevedore.org";
/// What the object is for: `attempt`, `stage`, `in`, `out`, `control`.
pub const ROLE: &str = "dev.stevedore.role";
/// The attempt's own ID (shared by its container and volumes).
pub const ATTEMPT_ID: &str = "dev.stevedore.attempt_id";
/// On worker images: the handler-set fingerprint.
pub const FINGERPRINT: &str = "dev.stevedore.fingerprint";
/// On worker images: the JSON argv prefix that runs the worker binary.
pub const ENTRY: &str = "dev.stevedore.entry";

/// Who an object belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner<'a> {
    /// Worker ID.
    pub worker: &'a str,
    /// Incarnation.
    pub incarnation: &'a str,
    /// Rung name.
    pub executor: &'a str,
}

/// The labels of one attempt's objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptLabels<'a> {
    /// The owner.
    pub owner: Owner<'a>,
    /// The attempt's own ID.
    pub attempt_id: &'a str,
    /// Job ID and attempt number; `None` for an object prepared ahead of its attempt.
    pub job: Option<(&'a str, u32)>,
    /// App scope.
    pub app: Option<&'a str>,
    /// Org scope.
    pub org: Option<&'a str>,
    /// Extra labels from the configuration (never overriding stevedore's own).
    pub extra: &'a BTreeMap<String, String>,
}

impl AttemptLabels<'_> {
    /// The label map for an object with `role`.
    pub fn for_role(&self, role: &str) -> HashMap<String, String> {
        let mut m: HashMap<String, String> =
            self.extra.iter().filter(|(k, _)| !k.starts_with(PREFIX)).map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut put = |k: &str, v: &str| {
            m.insert(k.to_owned(), v.to_owned());
        };
        put(MANAGED, "true");
        put(WORKER, self.owner.worker);
        put(INCARNATION, self.owner.incarnation);
        put(EXECUTOR, self.owner.executor);
        put(ATTEMPT_ID, self.attempt_id);
        put(ROLE, role);
        if let Some((job, attempt)) = self.job {
            put(JOB, job);
            put(ATTEMPT, &attempt.to_string());
        }
        if let Some(a) = self.app {
            put(APP, a);
        }
        if let Some(o) = self.org {
            put(ORG, o);
        }
        m
    }
}

/// The engine filter (`label=...` entries) that selects every object of `worker`.
pub fn worker_filter(worker: &str) -> HashMap<String, Vec<String>> {
    HashMap::from([("label".to_owned(), vec![format!("{MANAGED}=true"), format!("{WORKER}={worker}")])])
}

/// Whether labels say the object belongs to `worker` (a second check after the engine's filter).
pub fn belongs_to(labels: &HashMap<String, String>, worker: &str) -> bool {
    labels.get(MANAGED).map(String::as_str) == Some("true") && labels.get(WORKER).map(String::as_str) == Some(worker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_labels() {
        let extra = BTreeMap::from([("team".to_owned(), "x".to_owned()), (MANAGED.to_owned(), "false".to_owned())]);
        let l = AttemptLabels {
            owner: Owner { worker: "w1", incarnation: "inc", executor: "docker" },
            attempt_id: "a1",
            job: Some(("job-9", 2)),
            app: Some("app"),
            org: None,
            extra: &extra,
        };
        let m = l.for_role("attempt");
        assert_eq!(m[MANAGED], "true", "extra labels never override stevedore's");
        assert_eq!(m[WORKER], "w1");
        assert_eq!(m[INCARNATION], "inc");
        assert_eq!(m[EXECUTOR], "docker");
        assert_eq!(m[JOB], "job-9");
        assert_eq!(m[ATTEMPT], "2");
        assert_eq!(m[APP], "app");
        assert!(!m.contains_key(ORG));
        assert_eq!(m["team"], "x");
        assert!(belongs_to(&m, "w1"));
        assert!(!belongs_to(&m, "w2"));
        let ahead = AttemptLabels { job: None, ..l };
        assert!(!ahead.for_role("attempt").contains_key(JOB));
    }

    #[test]
    fn filter_is_exact() {
        let f = worker_filter("w1");
        assert_eq!(f["label"], vec!["dev.stevedore.managed=true".to_owned(), "dev.stevedore.worker=w1".to_owned()]);
    }
}
