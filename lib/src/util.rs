//! Plumbing every module may use and that uses nothing of the crate: boxed futures, boxed
//! causes, error chains as one line.

use std::future::Future;
use std::pin::Pin;

/// A `Send` boxed future, so the rungs' traits work as trait objects (`Arc<dyn Executor>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A boxed cause from the filesystem or elsewhere.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The error's text followed by its sources' (those its text does not already end with),
/// on one line: for places that keep or print only text.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.ends_with(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}
