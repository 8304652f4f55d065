//! What an executable is: its sha256, remembered by file identity (device, inode, size,
//! mtime) under the base, so a prepare of an unchanged binary does not hash it again.

use super::*;

/// The sha256 of a file, as 64 lowercase hex digits.
pub fn sha256_file(path: &Path) -> io::Result<String> {
    let hashed = crate::outputs::hash_reader(fs::File::open(path)?, 0)?;
    Ok(hashed.hash.trim_start_matches("sha256:").to_owned())
}

/// The sha256 of `exe` (64 lowercase hex digits), remembered under `base` by the file's
/// identity (device, inode, size, modification time) so that a process start does not
/// re-read a large binary that has not changed; any write or replacement changes the
/// identity. `base` is checked like the bundles it sits beside.
pub fn exe_digest(exe: &Path, base: &Path) -> Result<String, BundleError> {
    let file = open_exe(exe).map_err(|source| BundleError::ReadExe { path: exe.to_owned(), source })?;
    digest_of(&file, exe, base)
}

/// Opens an executable for reading: a regular file (through symlinks: the path is what the
/// caller names), never blocking on a FIFO planted in its place.
pub(super) fn open_exe(exe: &Path) -> io::Result<fs::File> {
    let file =
        fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC).open(exe)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok(file)
}

/// The identity a digest is remembered by.
pub(super) fn identity(meta: &fs::Metadata) -> String {
    format!("{:x}-{:x}-{:x}-{:x}.{:x}", meta.dev(), meta.ino(), meta.len(), meta.mtime(), meta.mtime_nsec())
}

pub(super) fn is_digest(d: &str) -> bool {
    d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// [`exe_digest`] of an open executable (read from its start).
pub(super) fn digest_of(file: &fs::File, exe: &Path, base: &Path) -> Result<String, BundleError> {
    let read_err = |source| BundleError::ReadExe { path: exe.to_owned(), source };
    let key = identity(&file.metadata().map_err(read_err)?);
    ensure_base(base)?;
    let dir = base.join(DIGESTS);
    let memo = dir.join(&key);
    if let Ok(d) = fs::read_to_string(&memo)
        && is_digest(&d)
    {
        // Its mtime is its last use (remembered digests unused for long are pruned).
        let now = TimeSpec::UTIME_NOW;
        let _ = utimensat(nix::fcntl::AT_FDCWD, &memo, &now, &now, UtimensatFlags::NoFollowSymlink);
        return Ok(d);
    }
    let mut reader = file;
    reader.rewind().map_err(read_err)?;
    let hashed = crate::outputs::hash_reader(reader, 0).map_err(read_err)?;
    let digest = hashed.hash.trim_start_matches("sha256:").to_owned();
    // Remembered only when the file did not change while it was read.
    if file.metadata().is_ok_and(|m| identity(&m) == key) {
        // Remembering is an optimisation: a failure only costs the next start a re-read.
        let tmp = dir.join(format!(".{key}.{:08x}", rand::random::<u32>()));
        let remembered = fs::DirBuilder::new().mode(0o700).recursive(true).create(&dir).and_then(|()| {
            fs::write(&tmp, &digest)?;
            fs::rename(&tmp, &memo)
        });
        if remembered.is_err() {
            let _ = fs::remove_file(&tmp);
        }
    }
    Ok(digest)
}
