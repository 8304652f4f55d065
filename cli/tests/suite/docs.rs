//! The repository's reference (`docs/outcome.md`) against the code: the example Outcome
//! field by field, and every word of its tables.

use std::collections::BTreeSet;
use stevedore::contract::{Outcome, Reason, Source};

fn doc() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/outcome.md")).unwrap()
}

/// The backticked words in the first column of the table under `heading`.
fn table_words(doc: &str, heading: &str) -> Vec<String> {
    let start = doc.find(&format!("## {heading}\n")).unwrap_or_else(|| panic!("no section {heading}"));
    let section = &doc[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    section.lines().filter(|l| l.starts_with("| `")).filter_map(|l| l.split('`').nth(1).map(str::to_owned)).collect()
}

fn keys(v: &serde_json::Value, path: &str, out: &mut BTreeSet<String>) {
    if let serde_json::Value::Object(m) = v {
        for (k, v) in m {
            let p = format!("{path}.{k}");
            out.insert(p.clone());
            // Maps keyed by data (enforcement, ports, ...) have no fixed keys below them.
            if !matches!(k.as_str(), "enforcement" | "skipped" | "ports") {
                keys(v, &p, out);
            }
        }
    } else if let serde_json::Value::Array(a) = v {
        for item in a {
            keys(item, &format!("{path}[]"), out);
        }
    }
}

#[test]
fn the_example_is_an_outcome_field_by_field() {
    let doc = doc();
    let start = doc.find("```json\n").unwrap() + 8;
    let end = start + doc[start..].find("```").unwrap();
    let example: serde_json::Value = serde_json::from_str(&doc[start..end]).expect("the example is JSON");
    let outcome: Outcome = serde_json::from_value(example.clone()).expect("the example is an Outcome");
    let back = serde_json::to_value(&outcome).unwrap();
    let (mut want, mut got) = (BTreeSet::new(), BTreeSet::new());
    keys(&example, "", &mut want);
    keys(&back, "", &mut got);
    assert_eq!(want, got, "fields in the doc but not the code, or the other way round");
    assert_eq!(back, example, "every value survives the round trip");
}

#[test]
fn the_reason_and_status_words_are_the_codes() {
    let doc = doc();
    let words = table_words(&doc, "Reasons");
    let code: Vec<String> = Reason::ALL.iter().map(|r| r.as_str().to_owned()).collect();
    assert_eq!(words, code);
    let statuses: BTreeSet<String> = table_words(&doc, "Statuses").into_iter().collect();
    let code: BTreeSet<String> = ["ok", "handler_error", "timeout", "oom_killed", "killed", "launch_failed"]
        .into_iter()
        .map(|s| serde_json::from_value::<stevedore::Status>(s.into()).unwrap().to_string())
        .collect();
    assert_eq!(statuses, code);
}

#[test]
fn the_usage_sources_are_the_codes() {
    let words = table_words(&doc(), "Usage sources");
    assert_eq!(words.len(), 10);
    for w in &words {
        let s: Source = w.parse().unwrap_or_else(|e| panic!("{w}: {e}"));
        assert_eq!(&s.to_string(), w);
    }
}

#[test]
fn the_labels_and_kinds_are_the_codes() {
    use stevedore::container::labels::*;
    let doc = doc();
    let words = table_words(&doc, "Labels");
    let (labels, kinds): (Vec<String>, Vec<String>) = words.into_iter().partition(|w| w.starts_with(PREFIX));
    let code = [MANAGED, WORKER, INCARNATION, EXECUTOR, JOB, ATTEMPT, APP, ORG, ATTEMPT_ID, ROLE, KIND];
    assert_eq!(labels, code);
    let code: Vec<String> =
        [Kind::Attempt, Kind::Pool, Kind::Tools, Kind::Cache].iter().map(|k| k.as_str().to_owned()).collect();
    assert_eq!(kinds, code);
}
