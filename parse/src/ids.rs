//! Names that become label values, volume names and host directory names: worker and job
//! IDs, named caches and where they are mounted.

/// Whether `s` is a valid worker ID: 1-128 characters of `[A-Za-z0-9_.-]` starting with a
/// letter or digit (it becomes a label value and a host directory name, so never `.`/`..`).
pub fn valid_worker_id(s: &str) -> bool {
    s.len() <= 128
        && s.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Whether `s` is a valid job ID: 1-256 characters of `[A-Za-z0-9_.:@+=-]` starting with a
/// letter or digit (it becomes a label value).
pub fn valid_job_id(s: &str) -> bool {
    s.len() <= 256
        && s.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'@' | b'+' | b'=' | b'-'))
}

/// A numeric `UID[:GID]` (the gid defaults to the uid); `None` for anything else (images
/// have no user database stevedore reads).
pub fn parse_user(s: &str) -> Option<(u32, u32)> {
    let numeric = |x: &str| x.parse::<u32>().ok();
    match s.split_once(':') {
        Some((u, g)) => numeric(u).zip(numeric(g)),
        None => numeric(s).map(|n| (n, n)),
    }
}

/// Checks a named cache: its name (1-64 of `[a-z0-9_.-]`, starting with a letter or digit:
/// it becomes part of a volume name) and its mount path (absolute, not `/`, no `..`, outside
/// stevedore's own `/in`, `/out`, `/tmp` and `/.stevedore`).
pub fn check_cache(name: &str, path: &str) -> Result<(), String> {
    let name_ok = (1..=64).contains(&name.len())
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-'));
    if !name_ok {
        return Err(format!(
            "cache name {name:?}: 1-64 characters of a-z, 0-9, '_', '.', '-', starting with a letter or digit"
        ));
    }
    let p = std::path::Path::new(path);
    let ours = ["/in", "/out", "/tmp", "/.stevedore"];
    if !path.starts_with('/')
        || p == std::path::Path::new("/")
        || p.components().any(|c| matches!(c, std::path::Component::ParentDir))
        || ours.iter().any(|o| p.starts_with(o))
    {
        return Err(format!("cache path {path:?}: give an absolute path outside /in, /out, /tmp and /.stevedore"));
    }
    // The engine takes a cache as a bind, `volume:path:nocopy`: a ':' would split it.
    if path.contains(':') || path.chars().any(char::is_control) {
        return Err(format!("cache path {path:?}: ':' and control characters are not allowed"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_cache, parse_user};

    #[test]
    fn a_user_is_numeric() {
        assert_eq!(parse_user("1000"), Some((1000, 1000)));
        assert_eq!(parse_user("1000:2000"), Some((1000, 2000)));
        for bad in ["nobody", "1000:staff", "", ":1", "-1", "1000:"] {
            assert_eq!(parse_user(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_cache_path_is_absolute_outside_stevedores_own_and_fits_a_bind() {
        assert_eq!(check_cache("pip", "/var/cache/pip"), Ok(()));
        for bad in ["var/cache", "/", "/out/x", "/in", "/tmp/c", "/.stevedore/tools", "/a/../b", "/a:b", "/a\nb"] {
            assert!(check_cache("pip", bad).is_err(), "{bad:?}");
        }
        assert!(
            check_cache("Pip", "/c").is_err() && check_cache("", "/c").is_err() && check_cache("-p", "/c").is_err()
        );
    }
}
