//! Tar entries the images are made of: root-owned, with fixed modes and no timestamps, so
//! the same files always make the same tar.

use std::io::{self, Write};

/// A directory's mode in every tar stevedore makes.
const DIR_MODE: u32 = 0o755;

/// A header owned by root with a zero mtime, so that the same files make the same tar.
pub(crate) fn root_header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header
}

/// Appends a 0755 root-owned dir entry (`path` ends with `/`).
pub(crate) fn append_dir<W: Write>(tar: &mut tar::Builder<W>, path: &str) -> io::Result<()> {
    tar.append_data(&mut root_header(tar::EntryType::Directory, 0, DIR_MODE), path, io::empty())
}

/// Appends a root-owned regular file held in memory.
pub(crate) fn append_bytes<W: Write>(tar: &mut tar::Builder<W>, path: &str, mode: u32, data: &[u8]) -> io::Result<()> {
    tar.append_data(&mut root_header(tar::EntryType::Regular, data.len() as u64, mode), path, data)
}
