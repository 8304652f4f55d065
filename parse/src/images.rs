//! Image references as people type them: which of the engine's local images a missing one
//! was probably meant to be, so a typo is named before anything is pulled.

/// `name` as the engine stores it: Docker Hub's default registry and `library/` dropped, the
/// tag `latest` added when there is neither a tag nor a digest.
pub fn normalized(name: &str) -> String {
    let mut n = name.trim();
    for prefix in ["docker.io/", "index.docker.io/", "registry-1.docker.io/"] {
        n = n.strip_prefix(prefix).unwrap_or(n);
    }
    let n = n.strip_prefix("library/").unwrap_or(n);
    let last = n.rsplit('/').next().unwrap_or(n);
    if last.contains(':') || n.contains('@') { n.to_owned() } else { format!("{n}:latest") }
}

/// The local images (`local`: their tags) whose names are close to `wanted`, best first (at
/// most 3): the same repository under another tag, or a name a few keystrokes away. Empty
/// when `wanted` is there itself, or nothing is close.
pub fn close_names<'a>(wanted: &str, local: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let want = normalized(wanted);
    let (want_repo, _) = split_tag(&want);
    let mut scored: Vec<(usize, String)> = Vec::new();
    for tag in local {
        let have = normalized(tag);
        if have == want {
            return Vec::new();
        }
        let (repo, _) = split_tag(&have);
        let distance = strsim::levenshtein(&want, &have);
        // A few edits, more for a longer name (a fifth of it), never more than the name.
        let close = distance <= (want.len() / 5).max(2) || (repo == want_repo && !repo.is_empty());
        if close && !scored.iter().any(|(_, t)| *t == have) {
            scored.push((if repo == want_repo { 0 } else { distance }, have));
        }
    }
    scored.sort();
    scored.into_iter().take(3).map(|(_, t)| t).collect()
}

/// `repo` and `tag` of a normalized reference (a digest counts as the tag).
fn split_tag(n: &str) -> (&str, &str) {
    if let Some((repo, digest)) = n.split_once('@') {
        return (repo, digest);
    }
    match n.rfind(':') {
        Some(i) if !n[i..].contains('/') => (&n[..i], &n[i + 1..]),
        _ => (n, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: [&str; 4] =
        ["stevedore-test/busybox:latest", "busybox:1.36", "registry.local:5000/team/app:v2", "alpine:latest"];

    #[test]
    fn names_are_normalized_as_the_engine_stores_them() {
        assert_eq!(normalized("busybox"), "busybox:latest");
        assert_eq!(normalized("docker.io/library/busybox:1.36"), "busybox:1.36");
        assert_eq!(normalized("registry.local:5000/app"), "registry.local:5000/app:latest");
        assert_eq!(normalized("app@sha256:abcd"), "app@sha256:abcd");
    }

    #[test]
    fn a_typo_or_another_tag_is_named() {
        assert_eq!(close_names("stevedore-test/busybx", LOCAL), ["stevedore-test/busybox:latest"]);
        assert_eq!(close_names("busybox", LOCAL), ["busybox:1.36"], "the same repository, another tag");
        assert_eq!(close_names("alpnie", LOCAL), ["alpine:latest"]);
        assert_eq!(close_names("registry.local:5000/team/app:v3", LOCAL), ["registry.local:5000/team/app:v2"]);
    }

    #[test]
    fn nothing_close_or_the_image_itself_names_nothing() {
        assert!(close_names("postgres:16", LOCAL).is_empty());
        assert!(close_names("docker.io/library/alpine", LOCAL).is_empty(), "it is there");
        assert!(close_names("x", []).is_empty());
    }
}
