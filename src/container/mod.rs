//! The container rung: each attempt in a fresh Docker container.

pub mod attempt;
pub mod config;
pub mod engine;
pub mod env;
mod executor;
pub mod labels;
pub mod logs;
pub mod pipe;
mod reclaim;
pub mod spec;
pub mod staging;
pub mod tools;

pub use config::{ContainerConfig, Hardening, LiveOutput, PullPolicy, Stream};
pub use engine::{Engine, EngineFacts, Removal};
pub use executor::ContainerExecutor;
