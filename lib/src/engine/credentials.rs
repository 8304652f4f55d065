//! Registry credentials for a pull, found the way the docker CLI finds them: the config dir
//! (`DOCKER_CONFIG`, else `~/.docker`), its `config.json`'s `credHelpers` for the image's
//! registry, else its `credsStore`, else its `auths` entry (`auth`: base64 of `user:password`,
//! or `username`/`password`, or an `identitytoken`). A helper is `docker-credential-NAME get`,
//! given the server on stdin, answering `{"Username", "Secret"}` on stdout.
//!
//! Invariant: a secret never leaves this module but inside the pull's `X-Registry-Auth`
//! header: [`RegistryAuth`]'s `Debug` shows only where it came from, no error carries one,
//! and nothing of it is logged or put in the evidence.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The registry docker.io images come from, as the docker CLI names it in `config.json`.
const DOCKER_HUB: &str = "https://index.docker.io/v1/";
/// How long a credential helper may take (a keychain may ask the user; a helper that hangs
/// must not hang the attempt).
const HELPER_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of `config.json` read.
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Credentials for one registry, ready for the engine's pull.
#[derive(Clone)]
pub struct RegistryAuth {
    pub(crate) creds: bollard::auth::DockerCredentials,
    /// Where they came from (`config.json auths`, `helper NAME`): what may be shown.
    pub from: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("server", &self.creds.serveraddress)
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
}

/// Why credentials could not be found (never a secret in the message).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CredentialsError {
    /// the docker config file cannot be read or parsed
    #[error("cannot use the docker config file {path}: {why}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// a credential helper failed
    #[error("the credential helper docker-credential-{helper} failed for {server}: {why}")]
    Helper {
        /// The helper's name.
        helper: String,
        /// The registry it was asked for.
        server: String,
        /// What went wrong (its stderr's first line, or how it ended).
        why: String,
    },
}

/// The docker CLI's config dir: `DOCKER_CONFIG`, else `$HOME/.docker`.
pub fn default_config_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".docker"))
}

/// The registry an image reference names (`docker.io` for a bare `name` or `user/name`): the
/// first path component when it has a `.` or a `:` or is `localhost`, as the docker CLI reads it.
pub fn registry_of(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => first,
        _ => "docker.io",
    }
}

/// A key of `auths` (`https://host:port/v1/`, `host:port`) as the host it is for.
fn host_of_key(key: &str) -> &str {
    let rest = key.strip_prefix("https://").or_else(|| key.strip_prefix("http://")).unwrap_or(key);
    rest.split('/').next().unwrap_or(rest)
}

fn is_hub(host: &str) -> bool {
    matches!(host, "docker.io" | "index.docker.io" | "registry-1.docker.io")
}

// No `Debug`: these hold secrets.
/// The entry of `map` for `host`: the key exactly as the docker CLI writes it (`server`) first,
/// then any key for the same host, the first in sorted order (so the same file always gives the
/// same answer).
fn pick_entry<'a, V>(map: &'a HashMap<String, V>, host: &str, server: &str) -> Option<(&'a String, &'a V)> {
    if let Some(kv) = map.get_key_value(server).or_else(|| map.get_key_value(host)) {
        return Some(kv);
    }
    let mut keys: Vec<&String> = map
        .keys()
        .filter(|k| {
            let h = host_of_key(k);
            h == host || (is_hub(host) && is_hub(h))
        })
        .collect();
    keys.sort();
    keys.first().and_then(|k| map.get_key_value(k.as_str()))
}

fn pick<'a>(map: &'a HashMap<String, String>, host: &str, server: &str) -> Option<&'a String> {
    pick_entry(map, host, server).map(|(_, v)| v)
}

#[derive(Default, serde::Deserialize)]
struct ConfigFile {
    #[serde(default)]
    auths: HashMap<String, AuthEntry>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: HashMap<String, String>,
}

#[derive(Default, serde::Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

/// The credentials for pulling `image`, from the docker config dir `dir` (`None`: none
/// configured). Helpers are looked up on `path` (a `PATH` value). No config file, no entry
/// and a helper that has none all mean anonymous: `Ok(None)`.
pub async fn for_image(
    image: &str,
    dir: Option<&Path>,
    path: Option<&std::ffi::OsStr>,
) -> Result<Option<RegistryAuth>, CredentialsError> {
    let Some(dir) = dir else { return Ok(None) };
    let file = dir.join("config.json");
    let raw = match std::fs::File::open(&file) {
        Ok(f) => {
            use std::io::Read;
            let mut raw = Vec::new();
            f.take(MAX_CONFIG_BYTES)
                .read_to_end(&mut raw)
                .map_err(|e| CredentialsError::Config { path: file.clone(), why: e.to_string() })?;
            raw
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CredentialsError::Config { path: file, why: e.to_string() }),
    };
    // Only where and what kind of error: serde's own message may quote the value it found
    // (a password of the wrong type, say).
    let config: ConfigFile = serde_json::from_slice(&raw).map_err(|e| CredentialsError::Config {
        path: file.clone(),
        why: format!(
            "not the docker CLI's config ({:?} error at line {}, column {})",
            e.classify(),
            e.line(),
            e.column()
        ),
    })?;
    let host = registry_of(image);
    let server = if is_hub(host) { DOCKER_HUB.to_owned() } else { host.to_owned() };
    let helper =
        pick(&config.cred_helpers, host, &server).cloned().or(config.creds_store.clone()).filter(|h| !h.is_empty());
    if let Some(helper) = helper {
        return from_helper(&helper, &server, path).await;
    }
    let Some((key, entry)) = pick_entry(&config.auths, host, &server) else { return Ok(None) };
    let bad =
        |why: &str| CredentialsError::Config { path: file.clone(), why: format!("the auths entry {key:?}: {why}") };
    let (username, password) = match (&entry.auth, &entry.username, &entry.password) {
        (Some(a), _, _) if !a.is_empty() => {
            use base64::Engine as _;
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(a.trim())
                .map_err(|_| bad("its auth is not base64"))?;
            let text = String::from_utf8(decoded).map_err(|_| bad("its auth is not text"))?;
            let (u, p) = text.split_once(':').ok_or_else(|| bad("its auth is not user:password"))?;
            (Some(u.to_owned()), Some(p.to_owned()))
        }
        (_, u, p) => (u.clone(), p.clone()),
    };
    let token = entry.identitytoken.clone().filter(|t| !t.is_empty());
    if username.is_none() && token.is_none() {
        return Ok(None);
    }
    Ok(Some(RegistryAuth {
        creds: bollard::auth::DockerCredentials {
            username,
            password,
            identitytoken: token,
            serveraddress: Some(server),
            ..Default::default()
        },
        from: format!("{} auths", file.display()),
    }))
}

#[derive(serde::Deserialize)]
struct HelperAnswer {
    #[serde(rename = "Username", default)]
    username: String,
    #[serde(rename = "Secret", default)]
    secret: String,
}

/// Asks `docker-credential-<helper> get` for `server`'s credentials.
async fn from_helper(
    helper: &str,
    server: &str,
    path: Option<&std::ffi::OsStr>,
) -> Result<Option<RegistryAuth>, CredentialsError> {
    use std::process::Stdio;
    use tokio::io::AsyncWriteExt;
    let fail = |why: String| CredentialsError::Helper { helper: helper.to_owned(), server: server.to_owned(), why };
    if !helper.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.') {
        return Err(fail("not a helper name".into()));
    }
    let program = format!("docker-credential-{helper}");
    // As the docker CLI looks (Go's LookPath): absolute entries only, so no helper is taken
    // from the current dir, and only an executable file.
    let exe = path
        .map(std::env::split_paths)
        .into_iter()
        .flatten()
        .filter(|d| d.is_absolute())
        .map(|d| d.join(&program))
        .find(|p| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(|| fail("not found on PATH".into()))?;
    let mut child = tokio::process::Command::new(&exe)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| fail(format!("cannot start it: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(server.as_bytes()).await;
    }
    let ended = tokio::time::timeout(HELPER_TIMEOUT, child.wait_with_output()).await;
    let output = match ended {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return Err(fail(format!("cannot wait for it: {e}"))),
        Err(_) => return Err(fail(format!("no answer within {HELPER_TIMEOUT:?}"))),
    };
    let (status, out, err) = (output.status, output.stdout, output.stderr);
    let said = |b: &[u8]| String::from_utf8_lossy(b).lines().next().unwrap_or("").chars().take(200).collect::<String>();
    if !status.success() {
        // The helpers' protocol: this answer means "none stored", which is anonymous.
        if said(&out).contains("credentials not found") {
            return Ok(None);
        }
        // Its stdout is never shown: it may hold the answer.
        let why = if err.is_empty() { String::new() } else { format!(": {}", said(&err)) };
        return Err(fail(format!("{status}{why}")));
    }
    let answer: HelperAnswer =
        serde_json::from_slice(&out).map_err(|_| fail("its answer is not the helper protocol's JSON".into()))?;
    if answer.secret.is_empty() {
        return Ok(None);
    }
    let mut creds = bollard::auth::DockerCredentials { serveraddress: Some(server.to_owned()), ..Default::default() };
    if answer.username == "<token>" {
        creds.identitytoken = Some(answer.secret);
    } else {
        creds.username = Some(answer.username);
        creds.password = Some(answer.secret);
    }
    Ok(Some(RegistryAuth { creds, from: format!("helper {helper}") }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_registry_of_a_reference() {
        assert_eq!(registry_of("busybox"), "docker.io");
        assert_eq!(registry_of("library/busybox:1"), "docker.io");
        assert_eq!(registry_of("127.0.0.1:5000/a/b:t"), "127.0.0.1:5000");
        assert_eq!(registry_of("localhost/x"), "localhost");
        assert_eq!(registry_of("ghcr.io/o/r@sha256:00"), "ghcr.io");
        assert_eq!(host_of_key("https://index.docker.io/v1/"), "index.docker.io");
        assert_eq!(host_of_key("reg.example:5000"), "reg.example:5000");
    }

    fn config(dir: &Path, json: &str) {
        std::fs::write(dir.join("config.json"), json).unwrap();
    }

    #[tokio::test]
    async fn auths_give_the_user_and_password_and_debug_shows_neither() {
        let t = tempfile::tempdir().unwrap();
        // base64("alice:s3cret")
        config(
            t.path(),
            r#"{"auths": {"http://127.0.0.1:5000/v2/": {"auth": "YWxpY2U6czNjcmV0"}, "other:1": {"username": "bob", "password": "pw"}}}"#,
        );
        let a = for_image("127.0.0.1:5000/x:1", Some(t.path()), None).await.unwrap().expect("found");
        assert_eq!((a.creds.username.as_deref(), a.creds.password.as_deref()), (Some("alice"), Some("s3cret")));
        assert_eq!(a.creds.serveraddress.as_deref(), Some("127.0.0.1:5000"));
        let shown = format!("{a:?}");
        assert!(!shown.contains("s3cret") && !shown.contains("alice"), "{shown}");
        let b = for_image("other:1/y", Some(t.path()), None).await.unwrap().expect("found");
        assert_eq!(b.creds.username.as_deref(), Some("bob"));
        assert!(for_image("busybox", Some(t.path()), None).await.unwrap().is_none(), "no entry: anonymous");
        assert!(for_image("x", None, None).await.unwrap().is_none());
        assert!(for_image("x", Some(&t.path().join("none")), None).await.unwrap().is_none(), "no file: anonymous");
        config(t.path(), r#"{"auths": {"127.0.0.1:5000": {"auth": "!!"}}}"#);
        let e = for_image("127.0.0.1:5000/x", Some(t.path()), None).await.unwrap_err().to_string();
        assert!(e.contains("not base64") && e.contains("config.json"), "{e}");
        config(t.path(), r#"{"auths": {"a": {"password": "hunter2"#);
        let e = for_image("a/x", Some(t.path()), None).await.unwrap_err().to_string();
        assert!(e.contains("not the docker CLI's config") && !e.contains("hunter2"), "{e}");
        // A value of the wrong type is not quoted back either.
        config(t.path(), r#"{"auths": {"a": "dXNlcjpodW50ZXIy"}, "x": {"password": 31415926}}"#);
        let e = for_image("a/x", Some(t.path()), None).await.unwrap_err().to_string();
        assert!(!e.contains("dXNlcjpodW50ZXIy") && e.contains("line 1"), "{e}");
        // Two keys for one registry: the one the docker CLI writes wins, every time.
        config(
            t.path(),
            r#"{"auths": {"http://h:5000/v2/": {"username": "stale", "password": "x"}, "h:5000": {"username": "fresh", "password": "y"}}}"#,
        );
        for _ in 0..5 {
            let a = for_image("h:5000/x", Some(t.path()), None).await.unwrap().unwrap();
            assert_eq!(a.creds.username.as_deref(), Some("fresh"));
        }
    }

    #[tokio::test]
    async fn a_helper_answers_for_its_registry_and_its_failure_is_named() {
        let t = tempfile::tempdir().unwrap();
        let bin = t.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let helper = bin.join("docker-credential-fake");
        std::fs::write(
            &helper,
            "#!/bin/sh\nread server\ncase \"$server\" in\n  127.0.0.1:5000) echo '{\"ServerURL\":\"x\",\"Username\":\"carol\",\"Secret\":\"tok\"}' ;;\n  https://index.docker.io/v1/) echo 'credentials not found in native keychain'; exit 1 ;;\n  leaky.example) echo '{\"Username\":\"u\",\"Secret\":\"leaked\"}'; exit 2 ;;\n  *) echo 'the keychain is locked' >&2; exit 3 ;;\nesac\n",
        )
        .unwrap();
        std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
        config(t.path(), r#"{"credsStore": "fake", "auths": {"127.0.0.1:5000": {"auth": "eDp5"}}}"#);
        let path = Some(bin.as_os_str());
        let a = for_image("127.0.0.1:5000/x", Some(t.path()), path).await.unwrap().expect("the helper's");
        assert_eq!((a.creds.username.as_deref(), a.creds.password.as_deref()), (Some("carol"), Some("tok")));
        assert_eq!(a.from, "helper fake");
        assert!(for_image("busybox", Some(t.path()), path).await.unwrap().is_none(), "none stored: anonymous");
        let e = for_image("reg.example/x", Some(t.path()), path).await.unwrap_err().to_string();
        assert!(e.contains("docker-credential-fake") && e.contains("the keychain is locked"), "{e}");
        let e = for_image("reg.example/x", Some(t.path()), Some(t.path().as_os_str())).await.unwrap_err().to_string();
        assert!(e.contains("not found on PATH"), "{e}");
        // A helper that failed after printing an answer: its stdout is not shown.
        let e = for_image("leaky.example/x", Some(t.path()), path).await.unwrap_err().to_string();
        assert!(!e.contains("leaked") && e.contains("exit status: 2"), "{e}");
        // A relative PATH entry is never searched (no helper from the current dir).
        let e = for_image("reg.example/x", Some(t.path()), Some(std::ffi::OsStr::new("bin"))).await.unwrap_err();
        assert!(e.to_string().contains("not found on PATH"), "{e}");
        // credHelpers wins for its registry.
        config(t.path(), r#"{"credsStore": "missing", "credHelpers": {"127.0.0.1:5000": "fake"}}"#);
        assert!(for_image("127.0.0.1:5000/x", Some(t.path()), path).await.unwrap().is_some());
    }
}
