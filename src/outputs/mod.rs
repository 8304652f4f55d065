//! Walking, hashing and safely extracting outputs: shared by every rung.
//!
//! STUB interface (to be implemented): signatures are fixed, bodies are not.

use crate::contract::{OutputFile, RefusedEntry};
use std::io::{self, Read};
use std::path::Path;

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

/// What a walk of an output dir found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalkReport {
    /// Regular files, sorted by name, hashed.
    pub files: Vec<OutputFile>,
    /// Entries not followed or hashed, with why.
    pub refused: Vec<RefusedEntry>,
    /// Sum of the listed files' sizes.
    pub total_bytes: u64,
    /// The caps were reached: the list is incomplete.
    pub limit_hit: bool,
}

/// Walks `dir`, never following a symlink at any component, and hashes every regular file.
pub fn walk(dir: &Path, caps: &Caps) -> io::Result<WalkReport> {
    let _ = (dir, caps);
    unimplemented!("outputs::walk")
}

/// What extracting a tar of outputs did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtractReport {
    /// Entries written.
    pub entries: u64,
    /// Bytes of regular-file content written.
    pub bytes: u64,
    /// Entries not extracted (devices, unsafe paths, over the cap), with why.
    pub skipped: Vec<RefusedEntry>,
}

/// Extracts an untrusted tar stream into `dest`, after removing the leading `strip`
/// component (e.g. `out` for a Docker archive of `/out`).
pub fn extract_tar(r: impl Read, strip: &str, dest: &Path, max_bytes: u64) -> io::Result<ExtractReport> {
    let _ = (r, strip, dest, max_bytes);
    unimplemented!("outputs::extract_tar")
}
