//! stevedore runs each attempt of a job in a fresh Docker container and reports, as facts,
//! what happened.

pub mod contract;
/// Named async handlers a worker offers, their registry and the built-in set.
pub mod handlers;
/// The in-process rung: runs a handler on a task of the worker itself (level `none`).
pub mod inprocess;
pub mod outputs;
pub mod protocol;
pub mod sandbox;

pub use contract::*;
