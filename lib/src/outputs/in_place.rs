//! Collecting an output dir the host holds itself (the oci rung's `/out`, a tmpfs it mounted in
//! the attempt's bundle), in place, once every process of the attempt but its init is gone:
//! no tar over the link. The walk is the init's own (`init/src/outdir.rs`: nothing followed,
//! the caps, the budget, the deadline, every refusal named), the writing the extractor's
//! (`stevedore_parse::outputs::extract_into`: only files and directories made, by descriptor,
//! hashed as written): the two joined by a pipe inside this process, so what the host delivers
//! is exactly what the link would have carried.

use super::{Caps, ExtractReport, extract_into};
use std::io::{self, BufWriter};
use std::os::fd::{AsFd, OwnedFd};
use stevedore_init::wire::{OutputEnd, OutputSpec};

/// What the pipe between the walk and the writer holds at most (Linux's default bound for an
/// unprivileged `F_SETPIPE_SZ`): fewer, larger hand-overs between the two threads.
const PIPE_BYTES: usize = 1 << 20;

/// What an in-place collection delivered: the files written into `dest` and hashed, the walk's
/// own end record (what it saw, refused, left out for the caps or the deadline), and why the
/// writing stopped early, if it did.
#[derive(Debug)]
pub(crate) struct Collected {
    pub report: ExtractReport,
    pub end: OutputEnd,
    pub error: Option<String>,
}

/// Walks `spec.dir` (a host path) and writes what fits `caps` into `dest`, hashing it.
pub(crate) fn collect(spec: &OutputSpec, dest: &OwnedFd, caps: &Caps) -> Collected {
    let mut report = ExtractReport::default();
    let (reader, writer) = match io::pipe() {
        Ok(p) => p,
        Err(e) => {
            let end = OutputEnd { error: Some(format!("no pipe for the collection: {e}")), ..OutputEnd::default() };
            return Collected { report, end, error: Some(format!("no pipe for the collection: {e}")) };
        }
    };
    // A smaller pipe only costs hand-overs.
    let _ = nix::fcntl::fcntl(writer.as_fd(), nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_BYTES as i32));
    std::thread::scope(|s| {
        let walk = s.spawn(move || {
            let mut w = BufWriter::with_capacity(PIPE_BYTES, writer);
            let mut end = stevedore_init::send_outputs(spec, &mut w);
            if let Err(e) = io::Write::flush(&mut w) {
                end.error.get_or_insert_with(|| format!("writing the tar: {e}"));
            }
            end
        });
        let written = extract_into(&reader, dest, caps, &mut report);
        // A writer stopped at a cap reads no further: the walk's next write fails and it ends.
        drop(reader);
        let end = walk.join().unwrap_or_else(|_| OutputEnd {
            error: Some("the walk of the output dir panicked".into()),
            ..OutputEnd::default()
        });
        let error = written.err().map(|e| format!("writing the outputs: {e}"));
        Collected { report, end, error }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn spec(dir: &std::path::Path, max_files: u64, max_bytes: u64) -> OutputSpec {
        OutputSpec {
            dir: dir.display().to_string(),
            max_files,
            max_bytes,
            collect_min_ms: 0,
            collect_bytes_per_s: 0,
            host_walks: false,
        }
    }

    #[test]
    fn files_are_delivered_hashed_and_nothing_is_followed() {
        let (src, dest, outside) =
            (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::create_dir(src.path().join("sub")).unwrap();
        std::fs::write(src.path().join("sub/a.txt"), b"hello").unwrap();
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(src.path().join("big.bin"), &big).unwrap();
        std::fs::write(outside.path().join("secret"), b"host").unwrap();
        symlink(outside.path().join("secret"), src.path().join("link")).unwrap();
        symlink(outside.path(), src.path().join("dirlink")).unwrap();
        let d = stevedore_init::tree::open_root(dest.path(), false).unwrap();
        let got = collect(&spec(src.path(), 100, 1 << 30), &d, &Caps { max_files: 100, max_total_bytes: 1 << 30 });
        assert_eq!(got.error, None);
        let names: Vec<&str> = got.report.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["big.bin", "sub/a.txt"]);
        use sha2::Digest;
        assert_eq!(got.report.files[0].hash, format!("sha256:{:x}", sha2::Sha256::digest(&big)));
        assert_eq!(std::fs::read(dest.path().join("sub/a.txt")).unwrap(), b"hello");
        let refused: Vec<(&str, &str)> = got.end.refused.iter().map(|r| (r.name.as_str(), r.why.as_str())).collect();
        assert_eq!(refused, [("dirlink", "symlink"), ("link", "symlink")]);
        assert!(!dest.path().join("link").exists() && !dest.path().join("dirlink").exists());
        assert_eq!((got.end.files, got.end.seen.files), (2, 2));
    }

    #[test]
    fn the_caps_stop_the_writing_and_the_walk_ends_too() {
        let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        for i in 0..50 {
            std::fs::write(src.path().join(format!("f{i:02}")), vec![b'x'; 100_000]).unwrap();
        }
        let d = stevedore_init::tree::open_root(dest.path(), false).unwrap();
        // The writer's cap below the walk's: the writer stops reading, the walk must still end.
        let got = collect(&spec(src.path(), 100, 1 << 30), &d, &Caps { max_files: 3, max_total_bytes: 1 << 30 });
        assert_eq!(got.report.files.len(), 3);
        assert!(got.report.limit_hit);
        let dest2 = tempfile::tempdir().unwrap();
        let d2 = stevedore_init::tree::open_root(dest2.path(), false).unwrap();
        let got = collect(&spec(src.path(), 5, 1 << 30), &d2, &Caps::default());
        assert_eq!(got.report.files.len(), 5);
        assert!(got.end.over_cap);
    }
}
