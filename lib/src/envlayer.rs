//! Environment layering (pure): image `ENV` < profile < request < stevedore's own.

use crate::contract::EnvOverride;
use std::collections::BTreeMap;

/// The merged environment and which keys were overridden by which layer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layered {
    /// The final environment, sorted by key.
    pub env: Vec<(String, String)>,
    /// Keys set by more than one layer (never values).
    pub overrides: Vec<EnvOverride>,
}

/// Merges layers, lowest first: each is (layer name, key → value).
pub fn layer(layers: &[(&str, Vec<(String, String)>)]) -> Layered {
    let mut merged: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    let mut origin: BTreeMap<String, String> = BTreeMap::new();
    for (name, vars) in layers {
        for (k, v) in vars {
            let entry = merged.entry(k.clone()).or_insert_with(|| (String::new(), Vec::new()));
            if let Some(prev) = origin.insert(k.clone(), (*name).to_owned())
                && !entry.1.contains(&prev)
            {
                entry.1.push(prev);
            }
            entry.0 = v.clone();
        }
    }
    let mut overrides = Vec::new();
    let mut env = Vec::with_capacity(merged.len());
    for (k, (v, overrode)) in merged {
        let won = origin[&k].clone();
        let overrode: Vec<String> = overrode.into_iter().filter(|l| *l != won).collect();
        if !overrode.is_empty() {
            overrides.push(EnvOverride { key: k.clone(), origin: won, overrode });
        }
        env.push((k, v));
    }
    Layered { env, overrides }
}

#[cfg(feature = "docker")]
/// Parses `KEY=VALUE` strings (as in an image's `ENV`), skipping malformed entries.
pub fn parse_pairs<'a>(items: impl IntoIterator<Item = &'a String>) -> Vec<(String, String)> {
    items
        .into_iter()
        .filter_map(|s| s.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn each_layer_overrides_the_one_below() {
        let l = layer(&[
            ("image", kv(&[("PATH", "/bin"), ("A", "img"), ("B", "img")])),
            ("profile", kv(&[("A", "prof"), ("C", "prof")])),
            ("request", kv(&[("B", "req"), ("C", "req"), ("STEVEDORE_OUT", "/evil")])),
            ("protocol", kv(&[("STEVEDORE_OUT", "/out")])),
        ]);
        let env: BTreeMap<_, _> = l.env.iter().cloned().collect();
        assert_eq!(env["PATH"], "/bin");
        assert_eq!(env["A"], "prof");
        assert_eq!(env["B"], "req");
        assert_eq!(env["C"], "req");
        assert_eq!(env["STEVEDORE_OUT"], "/out", "a request cannot override protocol variables");
        let o: BTreeMap<_, _> =
            l.overrides.iter().map(|o| (o.key.clone(), (o.origin.clone(), o.overrode.clone()))).collect();
        assert_eq!(o["A"], ("profile".into(), vec!["image".into()]));
        assert_eq!(o["C"], ("request".into(), vec!["profile".into()]));
        assert_eq!(o["STEVEDORE_OUT"], ("protocol".into(), vec!["request".into()]));
        assert!(!o.contains_key("PATH"));
        assert!(!format!("{:?}", l.overrides).contains("/evil"), "values never appear");
    }

    #[test]
    #[cfg(feature = "docker")]
    fn parses_image_env() {
        let items = vec!["A=1".to_owned(), "B=x=y".to_owned(), "junk".to_owned()];
        assert_eq!(parse_pairs(&items), kv(&[("A", "1"), ("B", "x=y")]));
    }
}
