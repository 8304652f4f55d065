//! The handler registry and its fingerprint.

use super::{HandlerContext, HandlerError};
use crate::util::BoxFuture;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use stevedore_init::wire::LaunchFailure;

/// The future a handler returns.
pub type HandlerFuture = BoxFuture<'static, Result<(), HandlerError>>;

/// A registered handler: an async function of its context.
pub type Handler = Arc<dyn Fn(HandlerContext) -> HandlerFuture + Send + Sync>;

/// The named handlers a worker offers. Cheap to clone.
///
/// Build it once at startup with [`Handlers::register`]; rungs then only read it.
#[derive(Clone, Default)]
pub struct Handlers {
    map: BTreeMap<String, Handler>,
    version: Option<String>,
}

impl Handlers {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds `version` into the fingerprint, so that a worker whose handlers changed
    /// behaviour (not only names) can say so, e.g. with its build ID.
    pub fn with_version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// Registers `f` as handler `name` (builder style).
    ///
    /// # Panics
    ///
    /// When `name` is empty, has control characters or is already registered: these are
    /// programming errors of the worker, found at its first start.
    pub fn register<F, Fut>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(HandlerContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        self.register_handler(name, Arc::new(move |ctx| Box::pin(f(ctx)) as HandlerFuture))
    }

    /// Registers an already boxed handler (builder style). Panics like [`Handlers::register`].
    pub fn register_handler(mut self, name: impl Into<String>, handler: Handler) -> Self {
        let name = name.into();
        // Names are joined with '\n' for the fingerprint: a control character in a name
        // would make two different sets hash alike.
        assert!(
            !name.is_empty() && !name.chars().any(char::is_control),
            "handler name {name:?} must be non-empty and without control characters"
        );
        let previous = self.map.insert(name.clone(), handler);
        assert!(previous.is_none(), "handler {name:?} registered twice");
        self
    }

    /// The handler named `name`.
    pub fn get(&self, name: &str) -> Option<&Handler> {
        self.map.get(name)
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.map.keys().map(String::as_str).collect()
    }

    /// The version given to [`Handlers::with_version`].
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// A stable digest of the handler set: `sha256:<hex>` of the names sorted by their
    /// bytes and joined with `'\n'`, followed, when a version was given, by `'\0'` and the
    /// version. It covers the names and the version only, not what the handlers do: the
    /// same set gives the same value in every process and on every run, whatever the
    /// registration order.
    pub fn fingerprint(&self) -> String {
        let mut h = Sha256::new();
        for (i, name) in self.map.keys().enumerate() {
            if i > 0 {
                h.update(b"\n");
            }
            h.update(name.as_bytes());
        }
        if let Some(v) = &self.version {
            h.update(b"\0");
            h.update(v.as_bytes());
        }
        format!("sha256:{:x}", h.finalize())
    }
}

/// The checks every rung makes before running handler `name` of `handlers` (whose
/// fingerprint is `have`) for a caller expecting `want`: the handler, or why it cannot start
/// and the text that says so. Written once so the rungs agree.
pub(crate) fn check(
    handlers: &Handlers,
    have: &str,
    name: &str,
    want: Option<&str>,
) -> Result<Handler, (LaunchFailure, String)> {
    if let Some(want) = want
        && want != have
    {
        return Err((
            LaunchFailure::FingerprintMismatch,
            format!("handler set fingerprint mismatch: request expects {want}, this worker has {have}"),
        ));
    }
    handlers.get(name).cloned().ok_or_else(|| (LaunchFailure::UnknownHandler, format!("unknown handler {name:?}")))
}

impl fmt::Debug for Handlers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handlers").field("names", &self.names()).field("version", &self.version).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> Handlers {
        names.iter().fold(Handlers::new(), |h, n| h.register(*n, |_| async { Ok(()) }))
    }

    #[test]
    fn fingerprint_is_stable_and_order_independent() {
        let a = set(&["echo", "true", "fail"]);
        let b = set(&["fail", "echo", "true"]);
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint(), a.clone().fingerprint());
        // Pinned: the value must not change between releases or processes.
        let expected = format!("sha256:{:x}", Sha256::digest(b"echo\nfail\ntrue"));
        assert_eq!(a.fingerprint(), expected);
        assert!(a.fingerprint().starts_with("sha256:") && a.fingerprint().len() == 7 + 64);
    }

    #[test]
    fn fingerprint_tells_sets_apart() {
        let base = set(&["a", "b"]).fingerprint();
        assert_ne!(base, set(&["a"]).fingerprint());
        assert_ne!(base, set(&["a", "b", "c"]).fingerprint());
        assert_ne!(base, set(&["a\u{a0}b"]).fingerprint());
        assert_ne!(base, set(&["a", "b"]).with_version("1").fingerprint());
        assert_ne!(set(&["a"]).with_version("1").fingerprint(), set(&["a"]).with_version("2").fingerprint());
        assert_ne!(Handlers::new().fingerprint(), set(&[""; 0]).with_version("").fingerprint());
    }

    #[test]
    fn lookup_and_names() {
        let h = set(&["b", "a"]);
        assert_eq!(h.names(), ["a", "b"]);
        assert!(h.get("a").is_some() && h.get("c").is_none());
        assert!(h.contains("b"));
        assert!(format!("{h:?}").contains("\"a\""));
    }

    #[test]
    #[should_panic(expected = "registered twice")]
    fn duplicate_panics() {
        set(&["a", "a"]);
    }

    #[test]
    #[should_panic(expected = "control characters")]
    fn newline_in_name_panics() {
        set(&["a\nb"]);
    }
}
