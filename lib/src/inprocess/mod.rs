//! The in-process rung (level `none`): handlers on the worker's own runtime.

mod executor;

pub use executor::InProcessExecutor;

#[cfg(test)]
mod tests;
