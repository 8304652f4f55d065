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
/// What the object is for within its kind: `container`, `stage`, `in`, `init`.
pub const ROLE: &str = "dev.stevedore.role";
/// How long the object lives and who removes it (see [`Kind`]).
pub const KIND: &str = "dev.stevedore.kind";
/// On a `tools` object: the sha256 of the init it holds.
pub const TOOLS_DIGEST: &str = "dev.stevedore.tools.digest";
/// The attempt's own ID (shared by its container and volumes).
pub const ATTEMPT_ID: &str = "dev.stevedore.attempt_id";
/// On worker images: the handler-set fingerprint.
pub const FINGERPRINT: &str = "dev.stevedore.fingerprint";
/// On worker images: the JSON argv prefix that runs the worker binary.
pub const ENTRY: &str = "dev.stevedore.entry";

/// How long an object lives, and who removes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Kind {
    /// An attempt's container and volumes: removed by the attempt; a worker's `reclaim`
    /// removes what a crashed process left.
    Attempt,
    /// Prepared ahead of an attempt (warm pool): used once; a worker's `reclaim` removes
    /// them, except its own live pool.
    Pool,
    /// stevedore's init, shared per digest by every worker on the engine (no worker label):
    /// removed only when stale and unused.
    Tools,
    /// A named cache that outlives attempts: removed only by an explicit command.
    Cache,
}

impl Kind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Attempt => "attempt",
            Kind::Pool => "pool",
            Kind::Tools => "tools",
            Kind::Cache => "cache",
        }
    }

    /// The kinds a worker's `reclaim` removes.
    pub const RECLAIMED: [Kind; 2] = [Kind::Attempt, Kind::Pool];
}

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

impl<'a> AttemptLabels<'a> {
    /// The labels of `req`'s attempt `attempt_id`: its job, attempt number and scope.
    pub fn of_request(
        owner: Owner<'a>,
        req: &'a crate::contract::Request,
        attempt_id: &'a str,
        extra: &'a BTreeMap<String, String>,
    ) -> Self {
        Self {
            owner,
            attempt_id,
            job: Some((&req.job_id, req.attempt)),
            app: req.app_id.as_deref(),
            org: req.org_id.as_deref(),
            extra,
        }
    }

    /// The label map for an attempt's object with `role`.
    pub fn for_role(&self, role: &str) -> HashMap<String, String> {
        self.for_kind(Kind::Attempt, role)
    }

    /// The label map for an object of `kind` with `role`.
    pub fn for_kind(&self, kind: Kind, role: &str) -> HashMap<String, String> {
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
        put(KIND, kind.as_str());
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

/// Whether labels say the object belongs to `worker` and is of a kind its `reclaim` removes
/// (a second check after the engine's filter). Objects from before kinds existed count as
/// attempts.
pub fn reclaimable_by(labels: &HashMap<String, String>, worker: &str) -> bool {
    let kind = labels.get(KIND).map(String::as_str).unwrap_or("attempt");
    labels.get(MANAGED).map(String::as_str) == Some("true")
        && labels.get(WORKER).map(String::as_str) == Some(worker)
        && Kind::RECLAIMED.iter().any(|k| k.as_str() == kind)
}

/// The labels of a tools object (a rung's init volume, its fill helper) for the init of `digest`.
pub fn tools(digest: &str, role: &str) -> HashMap<String, String> {
    HashMap::from([
        (MANAGED.to_owned(), "true".to_owned()),
        (KIND.to_owned(), Kind::Tools.as_str().to_owned()),
        (TOOLS_DIGEST.to_owned(), digest.to_owned()),
        (ROLE.to_owned(), role.to_owned()),
    ])
}

/// The label naming a cache (on volumes of kind `cache`).
pub const CACHE: &str = "dev.stevedore.cache";

/// The volume of cache `name` for the app and org scope: the name for people, a digest of the
/// scope so different apps and orgs never share one.
pub fn cache_volume(name: &str, app: Option<&str>, org: Option<&str>) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [app.unwrap_or(""), org.unwrap_or(""), name] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let d: String = h.finalize().iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("stevedore-cache-{name}-{d}")
}

/// The labels of cache `name` in the app and org scope.
pub fn cache(name: &str, app: Option<&str>, org: Option<&str>) -> HashMap<String, String> {
    let mut m = HashMap::from([
        (MANAGED.to_owned(), "true".to_owned()),
        (KIND.to_owned(), Kind::Cache.as_str().to_owned()),
        (CACHE.to_owned(), name.to_owned()),
        (ROLE.to_owned(), "cache".to_owned()),
    ]);
    if let Some(a) = app {
        m.insert(APP.to_owned(), a.to_owned());
    }
    if let Some(o) = org {
        m.insert(ORG.to_owned(), o.to_owned());
    }
    m
}

/// Whether `labels` are exactly those of cache `name` in the scope (so a cache can never
/// name someone else's volume, an attempt's or the tools').
pub fn is_cache(labels: &HashMap<String, String>, name: &str, app: Option<&str>, org: Option<&str>) -> bool {
    let get = |k: &str| labels.get(k).map(String::as_str);
    get(MANAGED) == Some("true")
        && get(KIND) == Some(Kind::Cache.as_str())
        && get(CACHE) == Some(name)
        && get(APP) == app
        && get(ORG) == org
}

/// The engine filter that selects every cache.
pub fn cache_filter() -> HashMap<String, Vec<String>> {
    HashMap::from([("label".to_owned(), vec![format!("{MANAGED}=true"), format!("{KIND}=cache")])])
}

/// The engine filter that selects every tools object.
pub fn tools_filter() -> HashMap<String, Vec<String>> {
    HashMap::from([("label".to_owned(), vec![format!("{MANAGED}=true"), format!("{KIND}=tools")])])
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
        assert_eq!(m[KIND], "attempt");
        assert!(reclaimable_by(&m, "w1"));
        assert!(!reclaimable_by(&m, "w2"));
        let cache = l.for_kind(Kind::Cache, "cache");
        assert!(!reclaimable_by(&cache, "w1"), "a worker's reclaim never removes a cache");
        assert!(!reclaimable_by(&tools("abc", "init"), "w1"), "nor a rung's tools");
        let ahead = AttemptLabels { job: None, ..l };
        assert!(!ahead.for_role("attempt").contains_key(JOB));
    }

    #[test]
    fn caches_are_scoped_and_recognised_exactly() {
        let a = cache_volume("cargo", Some("app1"), None);
        assert!(a.starts_with("stevedore-cache-cargo-"));
        assert_ne!(a, cache_volume("cargo", Some("app2"), None), "another app, another volume");
        assert_ne!(a, cache_volume("cargo", None, Some("app1")), "app and org are not interchangeable");
        let l = cache("cargo", Some("app1"), None);
        assert!(is_cache(&l, "cargo", Some("app1"), None));
        assert!(!is_cache(&l, "cargo", Some("app2"), None));
        assert!(!is_cache(&l, "npm", Some("app1"), None));
        assert!(!is_cache(&tools("abc", "content"), "cargo", None, None));
        assert!(!reclaimable_by(&l, "w1"));
    }

    #[test]
    fn filter_is_exact() {
        let f = worker_filter("w1");
        assert_eq!(f["label"], vec!["dev.stevedore.managed=true".to_owned(), "dev.stevedore.worker=w1".to_owned()]);
    }
}
