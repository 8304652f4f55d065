//! stevedore's labels fitted to Kubernetes' rules, the Pods' names, and the selectors that
//! find them (pure).
//!
//! A label value there is at most 63 characters of `[A-Za-z0-9._-]`, starting and ending
//! with a letter or digit. A value that fits is kept as it is; one that does not (a worker ID
//! with a `/` or a space, a long job ID) becomes `sd-` and 32 hex digits of its sha256, and
//! the value itself goes into an annotation of the same key, which `reclaim` checks, so two
//! values that fit to the same label are never taken for each other.

use crate::labels::{self, AttemptLabels, Kind};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// The most characters of a label value.
const VALUE_MAX: usize = 63;

/// Whether `v` is a valid label value as it is.
pub(crate) fn fits(v: &str) -> bool {
    let b = v.as_bytes();
    v.is_empty()
        || (b.len() <= VALUE_MAX
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')))
}

/// `v` as a label value: itself when it fits, else `sd-` and 32 hex digits of its sha256.
pub(crate) fn fit(v: &str) -> String {
    if fits(v) {
        return v.to_owned();
    }
    let digest = Sha256::digest(v.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("sd-{hex}")
}

/// A Pod's labels and annotations for one attempt: stevedore's labels with fitted values,
/// and each value that had to be fitted as an annotation under the same key.
pub(crate) fn of_attempt(l: &AttemptLabels<'_>) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut labels = BTreeMap::new();
    let mut annotations = BTreeMap::new();
    for (k, v) in l.for_kind(Kind::Attempt, "pod") {
        // An extra label of the configuration whose key Kubernetes refuses is dropped.
        if !key_fits(&k) {
            continue;
        }
        let fitted = fit(&v);
        if fitted != v {
            annotations.insert(k.clone(), v);
        }
        labels.insert(k, fitted);
    }
    (labels, annotations)
}

/// Whether `k` is a label key Kubernetes takes (`[prefix/]name`, the name as a value but
/// never empty).
fn key_fits(k: &str) -> bool {
    let name =
        k.rsplit_once('/').map_or(k, |(prefix, name)| if prefix.is_empty() || prefix.len() > 253 { "" } else { name });
    !name.is_empty() && fits(name)
}

/// The selector of every Pod of `worker` (its fitted value; the annotation tells apart).
pub(crate) fn worker_selector(worker: &str) -> String {
    format!("{}=true,{}={}", labels::MANAGED, labels::WORKER, fit(worker))
}

/// Whether a Pod's labels and annotations name exactly `worker` (never another worker whose
/// ID fits to the same value).
pub(crate) fn is_of_worker(
    labels_: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    worker: &str,
) -> bool {
    let label = labels_.get(labels::WORKER).map(String::as_str);
    let kind = labels_.get(labels::KIND).map(String::as_str);
    let kind_reclaimed = kind.is_some_and(|k| Kind::RECLAIMED.iter().any(|r| r.as_str() == k));
    let exact = match annotations.get(labels::WORKER) {
        Some(full) => full == worker,
        None => label == Some(worker),
    };
    labels_.get(labels::MANAGED).map(String::as_str) == Some("true") && kind_reclaimed && exact
}

/// The Pod's name: `sd-`, the worker ID made a DNS label (lowercase letters, digits and
/// `-`, at most 30), `-`, the attempt ID.
pub(crate) fn pod_name(worker: &str, attempt_id: &str) -> String {
    let mut w: String =
        worker.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).take(30).collect();
    while w.ends_with('-') {
        w.pop();
    }
    let w = w.trim_start_matches('-');
    if w.is_empty() { format!("sd-{attempt_id}") } else { format!("sd-{w}-{attempt_id}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::Owner;

    #[test]
    fn values_that_fit_are_kept_and_others_are_hashed_and_kept_whole_in_an_annotation() {
        assert!(fits("worker-1") && fits("a.b_c") && fits(""));
        assert!(!fits("-x") && !fits("x-") && !fits("a/b") && !fits("a b") && !fits(&"a".repeat(64)));
        assert_eq!(fit("worker-1"), "worker-1");
        let hashed = fit("team/worker 1");
        assert!(hashed.starts_with("sd-") && hashed.len() == 35 && fits(&hashed), "{hashed}");
        assert_ne!(fit("team/worker 1"), fit("team/worker 2"));
        let extra = BTreeMap::from([
            ("team".to_owned(), "blue".to_owned()),
            ("bad key!".to_owned(), "a value that does not fit".to_owned()),
            ("dev.stevedore.worker".to_owned(), "spoofed".to_owned()),
        ]);
        let l = AttemptLabels {
            owner: Owner { worker: "team/worker 1", incarnation: "inc-1", executor: "kube" },
            attempt_id: "abc123",
            job: Some(("job with spaces", 2)),
            app: None,
            org: None,
            extra: &extra,
        };
        let (labels_, annotations) = of_attempt(&l);
        assert_eq!(labels_[labels::WORKER], hashed);
        assert_eq!(annotations[labels::WORKER], "team/worker 1");
        assert_eq!(annotations[labels::JOB], "job with spaces");
        assert_eq!(labels_[labels::ATTEMPT], "2");
        assert_eq!(labels_[labels::KIND], "attempt");
        assert_eq!(labels_["team"], "blue");
        assert!(!labels_.contains_key("bad key!") && !annotations.contains_key("bad key!"));
        assert!(labels_.values().all(|v| fits(v)));
        assert!(is_of_worker(&labels_, &annotations, "team/worker 1"));
        assert!(!is_of_worker(&labels_, &annotations, "team/worker 2"));
        assert_eq!(
            worker_selector("team/worker 1"),
            format!("dev.stevedore.managed=true,dev.stevedore.worker={hashed}")
        );
    }

    #[test]
    fn a_pod_of_another_worker_or_kind_or_unlabelled_is_never_its() {
        let mut l = BTreeMap::from([
            (labels::MANAGED.to_owned(), "true".to_owned()),
            (labels::WORKER.to_owned(), "w1".to_owned()),
            (labels::KIND.to_owned(), "attempt".to_owned()),
        ]);
        let none = BTreeMap::new();
        assert!(is_of_worker(&l, &none, "w1"));
        assert!(!is_of_worker(&l, &none, "w2"));
        // An annotation that says another worker wins over a label that looks right.
        let other = BTreeMap::from([(labels::WORKER.to_owned(), "w1 ".to_owned())]);
        assert!(!is_of_worker(&l, &other, "w1"));
        l.insert(labels::KIND.to_owned(), "cache".to_owned());
        assert!(!is_of_worker(&l, &none, "w1"));
        assert!(!is_of_worker(&BTreeMap::new(), &none, "w1"));
    }

    #[test]
    fn pod_names_are_dns_labels() {
        assert_eq!(pod_name("cli-0123abcd", "a1b2c3"), "sd-cli-0123abcd-a1b2c3");
        assert_eq!(pod_name("Team/Worker_1", "a1b2c3"), "sd-team-worker-1-a1b2c3");
        assert_eq!(pod_name("///", "a1b2c3"), "sd-a1b2c3");
        let long = pod_name(&"x".repeat(200), "a1b2c3");
        assert!(long.len() <= 63, "{long}");
    }
}
