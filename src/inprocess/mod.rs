mod executor;

pub use executor::{DEFAULT_NAME, InProcessExecutor};

#[cfg(test)]
mod tests;
