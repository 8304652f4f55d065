//! Handlers: named async functions a worker offers, shared by every rung that runs them
//! (in-process, and inside the container through the handler runner).

mod builtin;
mod context;
mod error;
mod registry;

pub use builtin::builtin;
pub use context::{HandlerContext, Reporter};
pub use error::HandlerError;
pub(crate) use error::{cap_text, error_chain, panic_text};
pub(crate) use registry::check;
pub use registry::{Handler, HandlerFuture, Handlers};
