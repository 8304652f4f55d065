//! stevedore's host-side parsers of bytes it does not trust, kept apart from the engine and
//! the async runtime so they can be unit-tested and fuzzed on their own (`fuzz/`, with a
//! small sanitizer build). The `stevedore` crate re-exports what it uses.
//!
//! # Map
//! - [`outputs`]: the outputs tar from the init, extracted into the caller's dir and hashed,
//!   within caps; [`outputs::OutputFile`] and [`outputs::RefusedEntry`].
//! - [`limits`]: sizes, CPU amounts and durations as people type them.
//! - [`profiles`]: profiles files (TOML), parsed strictly into a checked [`profiles::Profile`].
//! - [`ids`]: worker and job IDs, named caches.
//! - [`images`]: image references, and the local names close to a missing one.
//! - `fuzzing` (hidden): the fuzz targets' invariants on these parsers.

#[doc(hidden)]
pub mod fuzzing;
pub mod ids;
pub mod images;
pub mod limits;
pub mod outputs;
pub mod profiles;
