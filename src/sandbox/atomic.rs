//! Writing a file in the control area atomically, without following what the command,
//! running as the same user, may have planted there.

use nix::fcntl::OFlag;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Writes `dir/name` through a fresh temp file and a rename, so the reader never sees half
/// a file. The command runs as the same uid and may have planted a symlink or a directory
/// at either name; neither is followed.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    remove_any(&tmp)?;
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    let dst = dir.join(name);
    match fs::rename(&tmp, &dst) {
        Err(_) if fs::symlink_metadata(&dst).is_ok_and(|m| m.is_dir()) => {
            fs::remove_dir_all(&dst)?;
            fs::rename(&tmp, &dst)
        }
        r => r,
    }
}

fn remove_any(p: &Path) -> io::Result<()> {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(p),
        Ok(_) => fs::remove_file(p),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_planted_symlinks_and_dirs() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        fs::write(&victim, "untouched").unwrap();
        std::os::unix::fs::symlink(&victim, d.path().join(".result.json.tmp")).unwrap();
        fs::create_dir(d.path().join("result.json")).unwrap();
        fs::write(d.path().join("result.json/x"), "x").unwrap();
        write_atomic(d.path(), "result.json", b"{}").unwrap();
        assert_eq!(fs::read(d.path().join("result.json")).unwrap(), b"{}");
        assert_eq!(fs::read(&victim).unwrap(), b"untouched");
        std::os::unix::fs::symlink(&victim, d.path().join("payload")).unwrap();
        write_atomic(d.path(), "payload", b"new").unwrap();
        assert!(!fs::symlink_metadata(d.path().join("payload")).unwrap().is_symlink());
        assert_eq!(fs::read(&victim).unwrap(), b"untouched");
    }
}
