//! The error a handler returns.

use std::error::Error;

pub(crate) use crate::util::error_chain;

/// The error a handler returns: a message for the outcome, whether retrying can help, and
/// optionally the underlying error (kept as `Outcome::cause` by the in-process rung).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct HandlerError {
    /// The text reported as the outcome's `handler_error`.
    pub message: String,
    /// Retrying the same request cannot help.
    pub permanent: bool,
    /// The underlying error, if any.
    #[source]
    pub source: Option<Box<dyn Error + Send + Sync + 'static>>,
}

impl HandlerError {
    /// A retryable error with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), permanent: false, source: None }
    }

    /// An error that retrying cannot fix.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self { permanent: true, ..Self::new(message) }
    }

    /// A retryable error carrying `err`, with its text as the message.
    pub fn from_error<E: Error + Send + Sync + 'static>(err: E) -> Self {
        Self { message: err.to_string(), permanent: false, source: Some(Box::new(err)) }
    }

    /// A retryable error carrying `err`, with the message `"<context>: <err>"`.
    pub fn context<E: Error + Send + Sync + 'static>(context: impl std::fmt::Display, err: E) -> Self {
        Self { message: format!("{context}: {err}"), permanent: false, source: Some(Box::new(err)) }
    }

    /// Attaches `err` as the source, keeping the message.
    pub fn with_source<E: Error + Send + Sync + 'static>(mut self, err: E) -> Self {
        self.source = Some(Box::new(err));
        self
    }

    /// Sets whether retrying can help.
    pub fn with_permanent(mut self, permanent: bool) -> Self {
        self.permanent = permanent;
        self
    }
}

// A blanket `From<E: Error>` would collide with `From<T> for T`; the common cases get
// their own so that `?` works in handlers.
impl From<std::io::Error> for HandlerError {
    fn from(err: std::io::Error) -> Self {
        Self::from_error(err)
    }
}

impl From<serde_json::Error> for HandlerError {
    fn from(err: serde_json::Error) -> Self {
        Self::from_error(err)
    }
}

impl From<tokio::task::JoinError> for HandlerError {
    fn from(err: tokio::task::JoinError) -> Self {
        Self::from_error(err)
    }
}

impl From<String> for HandlerError {
    fn from(message: String) -> Self {
        Self::new(message)
    }
}

impl From<&str> for HandlerError {
    fn from(message: &str) -> Self {
        Self::new(message)
    }
}

/// `text` cut to at most `max` bytes at a character boundary, marked when cut.
pub(crate) fn cap_text(text: &str, max: usize) -> String {
    const MARK: &str = " [truncated]";
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub(MARK.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

/// The message of a panic payload (`panic!` gives a `&str` or a `String`).
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic payload".to_owned());
    format!("handler panicked: {msg}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("inner")]
    struct Inner;

    #[test]
    fn constructors() {
        let e = HandlerError::new("boom");
        assert_eq!((e.to_string().as_str(), e.permanent), ("boom", false));
        assert!(e.source().is_none());
        assert!(HandlerError::permanent("no").permanent);
        let e = HandlerError::context("reading x", Inner);
        assert_eq!(e.to_string(), "reading x: inner");
        assert!(e.source().unwrap().downcast_ref::<Inner>().is_some());
        let e = HandlerError::from(std::io::Error::other("disk"));
        assert_eq!(e.to_string(), "disk");
        assert!(e.source().unwrap().downcast_ref::<std::io::Error>().is_some());
        let e = HandlerError::new("m").with_source(Inner).with_permanent(true);
        assert!(e.permanent && e.source.is_some());
    }

    #[test]
    fn chains() {
        assert_eq!(error_chain(&HandlerError::new("outer").with_source(Inner)), "outer: inner");
        assert_eq!(error_chain(&HandlerError::context("ctx", Inner)), "ctx: inner");
        assert_eq!(error_chain(&HandlerError::from_error(Inner)), "inner");
    }

    #[test]
    fn capping() {
        assert_eq!(cap_text("short", 100), "short");
        let long = "é".repeat(100);
        let c = cap_text(&long, 51);
        assert!(c.len() <= 51 && c.ends_with(" [truncated]"), "{c}");
    }
}
