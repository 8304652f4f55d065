//! stevedore runs each attempt of a job in a fresh Docker container and reports, as facts,
//! what happened.

pub mod container;
pub mod contract;
pub mod image;
pub mod outputs;
pub mod protocol;
pub mod sandbox;

pub use contract::*;
