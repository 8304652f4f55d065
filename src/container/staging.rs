//! Staging the caller's input dir as a tar owned by the sandbox user (the caller's files
//! are only read: owner, mode and content stay as they are).

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// What staging left out of the input tar.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageReport {
    /// Entries written.
    pub entries: u64,
    /// Bytes of file content.
    pub bytes: u64,
    /// Entries skipped (FIFOs, sockets, devices), by relative path.
    pub skipped: Vec<String>,
}

/// Writes `dir` as a tar whose entries belong to `uid:gid` with their modes kept (plus
/// owner read, and owner search on directories), symlinks kept as symlinks.
pub fn write_input_tar(dir: &Path, uid: u32, gid: u32, out: impl Write) -> io::Result<StageReport> {
    let mut b = tar::Builder::new(out);
    b.follow_symlinks(false);
    let mut report = StageReport::default();
    add_dir(&mut b, dir, Path::new(""), uid, gid, &mut report)?;
    b.into_inner()?.flush()?;
    Ok(report)
}

fn header_for(meta: &fs::Metadata, uid: u32, gid: u32, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_metadata_in_mode(meta, tar::HeaderMode::Complete);
    h.set_uid(uid.into());
    h.set_gid(gid.into());
    h.set_mode(mode);
    h
}

fn add_dir<W: Write>(
    b: &mut tar::Builder<W>,
    root: &Path,
    rel: &Path,
    uid: u32,
    gid: u32,
    report: &mut StageReport,
) -> io::Result<()> {
    let mut entries: Vec<_> = fs::read_dir(root.join(rel))?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let rel_path = rel.join(e.file_name());
        let meta = fs::symlink_metadata(e.path())?;
        let ft = meta.file_type();
        let perm = meta.mode() & 0o777;
        if ft.is_dir() {
            let mut h = header_for(&meta, uid, gid, perm | 0o700);
            h.set_size(0);
            b.append_data(&mut h, &rel_path, io::empty())?;
            report.entries += 1;
            add_dir(b, root, &rel_path, uid, gid, report)?;
        } else if ft.is_file() {
            let mut h = header_for(&meta, uid, gid, perm | 0o400);
            let f = fs::File::open(e.path())?;
            b.append_data(&mut h, &rel_path, f)?;
            report.entries += 1;
            report.bytes += meta.len();
        } else if ft.is_symlink() {
            let target = fs::read_link(e.path())?;
            let mut h = header_for(&meta, uid, gid, 0o777);
            h.set_size(0);
            b.append_link(&mut h, &rel_path, &target)?;
            report.entries += 1;
        } else if ft.is_fifo() || ft.is_socket() || ft.is_block_device() || ft.is_char_device() {
            report.skipped.push(rel_path.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn tar_gives_ownership_to_the_sandbox_user_and_keeps_the_source() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        fs::create_dir(d.join("sub")).unwrap();
        fs::write(d.join("sub/a.txt"), b"hello").unwrap();
        fs::set_permissions(d.join("sub/a.txt"), fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink("sub/a.txt", d.join("link")).unwrap();
        nix::unistd::mkfifo(&d.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let before = fs::metadata(d.join("sub/a.txt")).unwrap();
        let mut buf = Vec::new();
        let r = write_input_tar(d, 65532, 65533, &mut buf).unwrap();
        assert_eq!(r.skipped, vec!["fifo".to_owned()]);
        assert_eq!(r.bytes, 5);
        let mut ar = tar::Archive::new(&buf[..]);
        let mut seen = Vec::new();
        for e in ar.entries().unwrap() {
            let e = e.unwrap();
            let h = e.header();
            assert_eq!(h.uid().unwrap(), 65532);
            assert_eq!(h.gid().unwrap(), 65533);
            seen.push((e.path().unwrap().display().to_string(), h.entry_type(), h.mode().unwrap()));
        }
        assert!(seen.contains(&("sub/a.txt".into(), tar::EntryType::Regular, 0o600)));
        assert!(seen.iter().any(|(p, t, _)| p == "link" && *t == tar::EntryType::Symlink));
        let after = fs::metadata(d.join("sub/a.txt")).unwrap();
        assert_eq!((before.uid(), before.mode()), (after.uid(), after.mode()), "source untouched");
    }
}
