//! Where the engine is and how to reach it, the way the docker CLI reads it (pure):
//! `DOCKER_HOST` (`unix://`, `tcp://`, `https://`, `ssh://`), `DOCKER_TLS_VERIFY` with
//! `DOCKER_CERT_PATH` (`ca.pem`, `cert.pem`, `key.pem`; default `~/.docker`).
//!
//! Plain tcp to an address that is not loopback is refused unless explicitly allowed: it
//! hands root on that engine to anyone on the network path.

use std::fmt;
use std::path::{Path, PathBuf};

/// How the engine is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Transport {
    /// A unix socket on this host.
    Unix,
    /// Plain http over tcp.
    Tcp,
    /// https over tcp, with a client certificate (mutual TLS).
    Tls,
    /// ssh to a host that runs `docker system dial-stdio`.
    Ssh,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Unix => "unix",
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
            Transport::Ssh => "ssh",
        })
    }
}

/// Settings that decide the transport beside the address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Connection {
    /// The address (`unix:///var/run/docker.sock`, `tcp://host:2376`, `ssh://user@host`);
    /// `None`: `DOCKER_HOST`, else the local socket.
    pub host: Option<String>,
    /// Use TLS with the certificates in this dir; `None`: as `DOCKER_TLS_VERIFY` and
    /// `DOCKER_CERT_PATH` say.
    pub tls_cert_path: Option<PathBuf>,
    /// Allow plain tcp to an address that is not loopback.
    pub allow_insecure_tcp: bool,
}

/// A resolved endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The address as given (normalised: a bare path becomes `unix://path`), with any
    /// password replaced by `***`: what is printed and recorded.
    pub url: String,
    /// How it is reached.
    pub transport: Transport,
    /// The host the connector dials, for tcp, TLS and ssh.
    pub host: Option<String>,
    /// The certificates' dir, for TLS.
    pub cert_path: Option<PathBuf>,
    /// The address handed to the connector (it may hold an ssh user's name; never a password).
    pub(crate) dial: String,
}

impl Endpoint {
    /// Whether the engine shares this host's loopback (a unix socket, or tcp to loopback).
    pub fn is_local(&self) -> bool {
        match self.transport {
            Transport::Unix => true,
            _ => self.host.as_deref().is_some_and(is_loopback),
        }
    }
}

/// Why an endpoint cannot be used. Every address in these messages is redacted
/// ([`redact`]): a password given in one is never printed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// the scheme is not one stevedore speaks
    #[error("engine address {0:?}: unknown scheme (use unix://, tcp://, https:// or ssh://)")]
    Scheme(String),
    /// the address has no host
    #[error("engine address {0:?} has no host")]
    NoHost(String),
    /// plain tcp to a remote address
    #[error(
        "engine address {0:?} is plain tcp to a host that is not loopback: anyone on the path gets root on that \
         engine. Use TLS (DOCKER_TLS_VERIFY=1 with DOCKER_CERT_PATH, or --tls-cert-path) or ssh://, or allow it \
         explicitly (--allow-insecure-tcp)"
    )]
    InsecureTcp(String),
    /// the address holds something that could make the connector dial another host than
    /// the one checked (userinfo, a query, a fragment, a backslash, a path, a space)
    #[error("engine address {address:?}: {why}")]
    Ambiguous {
        /// The address, redacted.
        address: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// Whether `host` (a name or an address, without port) is loopback.
pub fn is_loopback(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h == "localhost" || h.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// `url` with the secret part of its userinfo replaced by `***`: for ssh the password
/// (`ssh://user:***@host`), for every other scheme the whole userinfo (`tcp://***@host`).
/// Userinfo is what precedes an `@` in the authority (up to the first `/`, `?`, `#` or
/// backslash, where a connector ends it too).
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let end = rest.find(['/', '?', '#', '\\']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let Some(at) = authority.rfind('@') else { return url.to_owned() };
    let (userinfo, host) = authority.split_at(at);
    let shown = match (scheme, userinfo.split_once(':')) {
        ("ssh", Some((user, _))) => format!("{user}:***"),
        ("ssh", None) => userinfo.to_owned(),
        _ => "***".to_owned(),
    };
    format!("{scheme}://{shown}{host}{tail}")
}

/// The host a connector that is handed `http://{authority}` dials: parsed exactly as bollard
/// parses it (the `url` crate, on the same string it builds), so the policy is decided on
/// the host that is dialled. Anything that could be read two ways is refused first.
fn dialled_host(authority: &str, shown: &str) -> Result<String, EndpointError> {
    let ambiguous = |why| EndpointError::Ambiguous { address: shown.to_owned(), why };
    if authority.contains(['?', '#']) {
        return Err(ambiguous("a query or fragment is not allowed in an engine address"));
    }
    if authority.contains('\\') {
        return Err(ambiguous("a backslash is not allowed in an engine address"));
    }
    if authority.contains('@') {
        return Err(ambiguous("userinfo (user@ or user:password@) is not allowed in a tcp or https address"));
    }
    if authority.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ambiguous("spaces and control characters are not allowed in an engine address"));
    }
    let authority = authority.strip_suffix('/').unwrap_or(authority);
    if authority.contains('/') {
        return Err(ambiguous("a path is not allowed in a tcp or https address"));
    }
    let parsed = url::Url::parse(&format!("http://{authority}/v1.41/_ping"))
        .map_err(|_| ambiguous("not a valid host[:port]"))?;
    let host = parsed.host_str().filter(|h| !h.is_empty()).ok_or_else(|| EndpointError::NoHost(shown.to_owned()))?;
    Ok(host.to_owned())
}

/// The host part of an ssh address's authority: no user, no port.
fn ssh_host(rest: &str, shown: &str) -> Result<String, EndpointError> {
    let ambiguous = |why| EndpointError::Ambiguous { address: shown.to_owned(), why };
    if rest.contains(['?', '#', '\\']) || rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ambiguous("a query, fragment, backslash or space is not allowed in an ssh address"));
    }
    let authority = rest.split('/').next().unwrap_or("");
    if let Some((userinfo, _)) = authority.rsplit_once('@')
        && userinfo.contains(':')
    {
        return Err(ambiguous("a password in an ssh address is not supported: use a key (ssh-agent or ~/.ssh/config)"));
    }
    let hostport = authority.rsplit('@').next().unwrap_or("");
    let host = if hostport.starts_with('[') {
        hostport.split(']').next().map(|h| format!("{h}]")).unwrap_or_default()
    } else {
        hostport.split(':').next().unwrap_or("").to_owned()
    };
    if host.is_empty() {
        return Err(EndpointError::NoHost(shown.to_owned()));
    }
    Ok(host)
}

/// The default certificates' dir of the docker CLI.
fn default_cert_path(home: Option<&Path>) -> PathBuf {
    home.map(|h| h.join(".docker")).unwrap_or_else(|| PathBuf::from(".docker"))
}

/// Resolves `c` against the environment `env` (a lookup, so tests need no real one).
pub fn resolve(c: &Connection, env: impl Fn(&str) -> Option<String>) -> Result<Endpoint, EndpointError> {
    let url = c
        .host
        .clone()
        .or_else(|| env("DOCKER_HOST").filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "unix:///var/run/docker.sock".to_owned());
    let url = if url.starts_with('/') { format!("unix://{url}") } else { url };
    let shown = redact(&url);
    let tls_env = env("DOCKER_TLS_VERIFY").is_some_and(|v| !v.is_empty() && v != "0");
    let cert_path = c.tls_cert_path.clone().or_else(|| {
        tls_env.then(|| {
            env("DOCKER_CERT_PATH")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| default_cert_path(env("HOME").as_deref().map(Path::new)))
        })
    });
    let (scheme, rest) = url.split_once("://").ok_or_else(|| EndpointError::Scheme(shown.clone()))?;
    let (transport, host) = match scheme {
        "unix" => (Transport::Unix, None),
        "tcp" | "http" | "https" => {
            let host = dialled_host(rest, &shown)?;
            let tls = scheme == "https" || cert_path.is_some();
            if !tls && !is_loopback(&host) && !c.allow_insecure_tcp {
                return Err(EndpointError::InsecureTcp(shown));
            }
            (if tls { Transport::Tls } else { Transport::Tcp }, Some(host))
        }
        "ssh" => (Transport::Ssh, Some(ssh_host(rest, &shown)?)),
        _ => return Err(EndpointError::Scheme(shown)),
    };
    let cert_path = if transport == Transport::Tls {
        Some(cert_path.unwrap_or_else(|| default_cert_path(env("HOME").as_deref().map(Path::new))))
    } else {
        None
    };
    Ok(Endpoint { url: shown, transport, host, cert_path, dial: url })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
    }

    fn at(host: &str) -> Connection {
        Connection { host: Some(host.into()), ..Connection::default() }
    }

    #[test]
    fn the_docker_cli_variables() {
        let e = resolve(&Connection::default(), env(&[])).unwrap();
        assert_eq!((e.url.as_str(), e.transport), ("unix:///var/run/docker.sock", Transport::Unix));
        assert!(e.is_local());
        let e = resolve(&Connection::default(), env(&[("DOCKER_HOST", "/run/podman.sock")])).unwrap();
        assert_eq!(e.url, "unix:///run/podman.sock");
        let e = resolve(&Connection::default(), env(&[("DOCKER_HOST", "tcp://127.0.0.1:2375")])).unwrap();
        assert_eq!((e.transport, e.host.as_deref()), (Transport::Tcp, Some("127.0.0.1")));
        assert!(e.is_local());
        let tls =
            [("DOCKER_HOST", "tcp://docker.example:2376"), ("DOCKER_TLS_VERIFY", "1"), ("DOCKER_CERT_PATH", "/c")];
        let e = resolve(&Connection::default(), env(&tls)).unwrap();
        assert_eq!((e.transport, e.cert_path.as_deref()), (Transport::Tls, Some(Path::new("/c"))));
        assert!(!e.is_local());
        let e = resolve(
            &Connection::default(),
            env(&[("DOCKER_HOST", "tcp://d:2376"), ("DOCKER_TLS_VERIFY", "1"), ("HOME", "/h")]),
        )
        .unwrap();
        assert_eq!(e.cert_path.as_deref(), Some(Path::new("/h/.docker")));
        let e = resolve(&at("ssh://root@build-1:2222"), env(&[])).unwrap();
        assert_eq!((e.transport, e.host.as_deref()), (Transport::Ssh, Some("build-1")));
        // An explicit host wins over the environment.
        let e = resolve(&at("unix:///x.sock"), env(&[("DOCKER_HOST", "tcp://1.2.3.4:2375")])).unwrap();
        assert_eq!(e.url, "unix:///x.sock");
    }

    #[test]
    fn plain_tcp_to_a_remote_host_is_refused_unless_allowed() {
        let err = resolve(&at("tcp://10.0.0.5:2375"), env(&[])).unwrap_err();
        assert!(matches!(err, EndpointError::InsecureTcp(_)));
        assert!(err.to_string().contains("--allow-insecure-tcp"));
        let ok = Connection { allow_insecure_tcp: true, ..at("tcp://10.0.0.5:2375") };
        assert_eq!(resolve(&ok, env(&[])).unwrap().transport, Transport::Tcp);
        for local in ["tcp://localhost:2375", "tcp://127.0.0.7:2375", "tcp://[::1]:2375"] {
            assert_eq!(resolve(&at(local), env(&[])).unwrap().transport, Transport::Tcp, "{local}");
        }
        assert!(matches!(resolve(&at("ftp://x"), env(&[])), Err(EndpointError::Scheme(_))));
        assert!(resolve(&at("tcp://"), env(&[])).is_err());
    }

    /// The loopback check and the connector read an address one way: an off-host address
    /// dressed as loopback (`?@`, `#@`, `\@`, userinfo) is refused, never dialled in plain text.
    #[test]
    fn the_policy_is_decided_on_the_host_that_is_dialled() {
        for tricky in [
            "tcp://192.0.2.7:2375?@127.0.0.1",
            "tcp://192.0.2.7:2375#@127.0.0.1",
            "tcp://192.0.2.7:2375\\@127.0.0.1",
            "tcp://192.0.2.7:2375/@127.0.0.1",
            "tcp://127.0.0.1@192.0.2.7:2375",
            "http://192.0.2.7:2375?x=@localhost",
            "https://192.0.2.7:2376?@127.0.0.1",
            "tcp://127.0.0.1 :2375",
        ] {
            let err = resolve(&at(tricky), env(&[])).expect_err(tricky);
            assert!(matches!(err, EndpointError::Ambiguous { .. }), "{tricky}: {err}");
        }
        // What is accepted is dialled where it was checked.
        let e = resolve(&at("tcp://127.0.0.1:2375/"), env(&[])).unwrap();
        assert_eq!((e.host.as_deref(), e.dial.as_str()), (Some("127.0.0.1"), "tcp://127.0.0.1:2375/"));
        let e = resolve(&at("tcp://[::1]:2375"), env(&[])).unwrap();
        assert_eq!(e.host.as_deref(), Some("[::1]"));
        assert!(e.is_local());
        let e = resolve(&Connection { allow_insecure_tcp: true, ..at("tcp://LOCALHOST.:2375") }, env(&[])).unwrap();
        assert_eq!(e.host.as_deref(), Some("localhost."), "the connector's own normalisation");
    }

    #[test]
    fn passwords_in_addresses_are_never_shown() {
        assert_eq!(redact("tcp://admin:hunter2@10.0.0.5:2375"), "tcp://***@10.0.0.5:2375");
        assert_eq!(redact("https://admin:hunter2@d:2376/x"), "https://***@d:2376/x");
        assert_eq!(redact("ssh://root:hunter2@build-1"), "ssh://root:***@build-1");
        assert_eq!(redact("ssh://root@build-1"), "ssh://root@build-1");
        assert_eq!(redact("unix:///var/run/docker.sock"), "unix:///var/run/docker.sock");
        for url in ["tcp://admin:hunter2@10.0.0.5:2375", "https://admin:hunter2@d:2376", "ssh://root:hunter2@h"] {
            let err = resolve(&at(url), env(&[])).expect_err(url);
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
        let err = resolve(&Connection::default(), env(&[("DOCKER_HOST", "tcp://u:hunter2@10.1.1.1:1")])).unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
}
