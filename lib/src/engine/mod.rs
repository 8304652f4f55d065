//! The engine: connecting to it (API version negotiated, every call under a timeout), what
//! it is, and the narrow set of calls the rungs make (a seam a fake stands in for in tests).

mod api;
mod client;
pub mod credentials;
pub mod endpoint;
mod error;
#[cfg(test)]
pub(crate) mod fake;
mod watch;

#[cfg(test)]
pub(crate) use api::EngineApi;
pub use api::Removal;
pub(crate) use api::{Attached, Built, ByteStream, Chunk, ContainerState, ImageFacts, ImageInfo, PathKind};
pub use client::{CHANGE_TIMEOUT, Engine, EngineFacts, client_max_api};
pub use endpoint::{Connection, Endpoint, Transport};
pub use error::EngineError;
pub(crate) use watch::Mark;
