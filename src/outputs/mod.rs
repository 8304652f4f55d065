//! Outputs: extracting (and hashing) the tar the init sends, walking an output dir on the
//! host (for rungs without a tar), and naming their content types. Shared by every rung.

mod content_type;
mod extract;
mod hash;
mod walk;

pub use content_type::content_type;
pub use extract::{ExtractReport, extract_into, extract_tar};
pub use hash::{Hashed, hash_reader};
pub use walk::{WalkReport, walk};

/// Caps on what one attempt's outputs may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// The most regular files listed.
    pub max_files: usize,
    /// The most bytes over all listed files.
    pub max_total_bytes: u64,
}

impl Default for Caps {
    fn default() -> Self {
        Self { max_files: 10_000, max_total_bytes: 16 << 30 }
    }
}
