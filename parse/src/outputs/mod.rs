//! The outputs tar the init sends: extracted into the caller's dir, every file hashed as it
//! is written, within caps; and the records that describe what came out.

mod content_type;
mod extract;
mod hash;

pub use content_type::{SNIFF_LEN, content_type};
pub use extract::{ExtractReport, extract_into, extract_tar};
pub(crate) use extract::{MAX_REFUSED, extract_bounded};
pub use hash::hash_backend;

use serde::{Deserialize, Serialize};

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

/// One regular file found in the output dir.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputFile {
    /// Path relative to the output dir, `/`-separated.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// `sha256:<64 lowercase hex>`.
    pub hash: String,
    /// A MIME type; `application/octet-stream` when unknown.
    pub content_type: String,
}

/// An output entry that was not followed or hashed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedEntry {
    /// The entry's path relative to the output dir, escaped when not UTF-8.
    pub name: String,
    /// Why: `symlink`, `fifo`, `socket`, `device`, `non_utf8_name`, `unreadable`, `over_cap`, ...
    pub why: String,
}
