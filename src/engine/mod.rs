//! The engine: connecting to it (API version negotiated, every call under a timeout), what
//! it is, and the narrow set of calls the rungs make (a seam a fake stands in for in tests).

mod api;
mod client;
mod error;
#[cfg(test)]
pub(crate) mod fake;

pub use api::Removal;
pub(crate) use api::{ByteStream, Chunk, ContainerState, ImageFacts};
pub use client::{Engine, EngineFacts, default_endpoint};
pub use error::EngineError;
