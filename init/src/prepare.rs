//! `stevedore-init prepare`: what a Pod's init container does before the attempt's container
//! starts (the kube rung). It runs from stevedore's own init image (`FROM scratch` + this
//! binary), as the sandbox's user, with nothing of the attempt's image:
//!
//! - `--install PATH` copies this very binary to `PATH` (in a fresh `emptyDir` that the
//!   attempt's container mounts read-only and runs as PID 1), 0555, never over a file;
//! - `--inputs DIR` then reads the inputs as a tar on stdin (the host attaches to this
//!   container and writes it) and unpacks it into `DIR` (another fresh `emptyDir`, mounted
//!   read-only at `/in`), nothing outside it, and stops at the tar's end marker.
//!
//! It prints one line on stdout (`prepared: ...`) and exits 0, or says why on stderr and exits
//! 1; the host waits for that end before it lets the Pod go on, so a failure is its launch
//! error, never a half-staged `/in`.

use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path};

/// Runs the verb with its arguments (after `prepare`); the process exit code.
pub fn main(args: &[String]) -> i32 {
    let prepared = parse(args).and_then(|p| {
        if let Some(ms) = p.within_ms {
            // A host that died before it wrote the inputs would leave this waiting forever.
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(ms));
                let _ = writeln!(io::stderr(), "stevedore-init prepare: not done within {ms} ms: the host is gone");
                std::process::exit(1);
            });
        }
        run(&p, &mut io::stdin().lock())
    });
    match prepared {
        Ok(said) => {
            let _ = writeln!(io::stdout(), "prepared: {said}");
            let _ = io::stdout().flush();
            0
        }
        Err(why) => {
            let _ = writeln!(io::stderr(), "stevedore-init prepare: {why}");
            1
        }
    }
}

/// What to prepare.
#[derive(Debug, Default, PartialEq, Eq)]
struct Prepare {
    install: Option<String>,
    inputs: Option<String>,
    /// Give up after this many milliseconds.
    within_ms: Option<u64>,
}

fn parse(args: &[String]) -> Result<Prepare, String> {
    let mut p = Prepare::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--within-ms" {
            let ms = it.next().and_then(|v| v.parse().ok()).ok_or("--within-ms needs a number of milliseconds")?;
            p.within_ms = Some(ms);
            continue;
        }
        let slot = match flag.as_str() {
            "--install" => &mut p.install,
            "--inputs" => &mut p.inputs,
            other => {
                return Err(format!(
                    "unknown argument {other:?} (usage: prepare [--install PATH] [--inputs DIR] [--within-ms N])"
                ));
            }
        };
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if !value.starts_with('/') {
            return Err(format!("{flag} {value:?}: the path must be absolute"));
        }
        *slot = Some(value.clone());
    }
    if p.install.is_none() && p.inputs.is_none() {
        return Err("nothing to prepare (usage: prepare [--install PATH] [--inputs DIR])".into());
    }
    Ok(p)
}

fn run(p: &Prepare, stdin: &mut dyn Read) -> Result<String, String> {
    let mut said = Vec::new();
    if let Some(dest) = &p.install {
        let bytes = install(Path::new(dest))?;
        said.push(format!("init at {dest} ({bytes} bytes)"));
    }
    if let Some(dir) = &p.inputs {
        let (entries, bytes) = unpack(stdin, Path::new(dir))?;
        said.push(format!("{entries} input entries ({bytes} bytes) in {dir}"));
    }
    Ok(said.join(", "))
}

/// Copies this binary to `dest`, a new file (never over one, never through a symlink).
fn install(dest: &Path) -> Result<u64, String> {
    let mut src = std::fs::File::open("/proc/self/exe").map_err(|e| format!("cannot open this binary: {e}"))?;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o555)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(dest)
        .map_err(|e| format!("cannot create {}: {e}", dest.display()))?;
    let n = io::copy(&mut src, &mut out).map_err(|e| format!("copying to {}: {e}", dest.display()))?;
    out.sync_all().map_err(|e| format!("syncing {}: {e}", dest.display()))?;
    Ok(n)
}

/// Unpacks a tar from `input` into `dir`: regular files, directories and symlinks only, at
/// relative paths without `..`; directories get their modes last (a read-only one is still
/// filled). Stops at the tar's end marker; a tar cut short is an error.
fn unpack(input: &mut dyn Read, dir: &Path) -> Result<(u64, u64), String> {
    let mut archive = tar::Archive::new(input);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_overwrite(false);
    let mut dirs = Vec::new();
    let (mut entries, mut bytes) = (0u64, 0u64);
    for entry in archive.entries().map_err(|e| format!("reading the inputs: {e}"))? {
        let mut entry = entry.map_err(|e| format!("reading the inputs: {e}"))?;
        let path = entry.path().map_err(|e| format!("an input's name: {e}"))?.into_owned();
        if path.as_os_str().is_empty()
            || path.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(format!("input entry {} is not a plain relative path", path.display()));
        }
        match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Symlink => {}
            tar::EntryType::Directory => {
                // Made writable now, its own mode set after everything in it.
                make_dir(dir, &path)?;
                dirs.push((path, entry.header().mode().unwrap_or(0o755)));
                entries += 1;
                continue;
            }
            other => return Err(format!("input entry {} is of a kind not staged ({other:?})", path.display())),
        }
        bytes += entry.size();
        // `unpack_in` refuses a path that would leave `dir` (through `..` or a symlink made
        // by an earlier entry).
        if !entry.unpack_in(dir).map_err(|e| format!("input {}: {e}", path.display()))? {
            return Err(format!("input entry {} would leave {}", path.display(), dir.display()));
        }
        entries += 1;
    }
    // Deepest first, so that a read-only parent is set after its children.
    dirs.sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
    for (path, mode) in dirs {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join(&path), std::fs::Permissions::from_mode(mode & 0o7777))
            .map_err(|e| format!("input dir {}: {e}", path.display()))?;
    }
    Ok((entries, bytes))
}

/// Makes `path` (relative) under `dir`, each missing component 0755, never through a symlink.
fn make_dir(dir: &Path, path: &Path) -> Result<(), String> {
    let mut at = dir.to_path_buf();
    for c in path.components() {
        let Component::Normal(name) = c else { continue };
        at.push(name);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(format!("input dir {}: {} is in the way", path.display(), at.display())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir(&at).map_err(|e| format!("input dir {}: {e}", path.display()))?;
            }
            Err(e) => return Err(format!("input dir {}: {e}", path.display())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn arguments_are_absolute_paths_and_something_is_asked() {
        assert_eq!(
            parse(&args(&["--install", "/t/init", "--inputs", "/in"])).unwrap(),
            Prepare { install: Some("/t/init".into()), inputs: Some("/in".into()), within_ms: None }
        );
        assert_eq!(parse(&args(&["--within-ms", "5000", "--install", "/i"])).unwrap().within_ms, Some(5000));
        assert!(parse(&args(&["--within-ms", "soon", "--install", "/i"])).is_err());
        assert!(parse(&args(&[])).unwrap_err().contains("nothing to prepare"));
        assert!(parse(&args(&["--install", "t"])).unwrap_err().contains("absolute"));
        assert!(parse(&args(&["--install"])).unwrap_err().contains("needs a value"));
        assert!(parse(&args(&["--bogus", "/x"])).unwrap_err().contains("unknown argument"));
    }

    fn tar_with(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h
    }

    #[test]
    fn inputs_unpack_with_their_modes_and_a_read_only_dir_is_filled() {
        let tmp = tempfile::tempdir().unwrap();
        let bytes = tar_with(|b| {
            b.append_data(&mut header(tar::EntryType::Directory, 0o555, 0), "ro", io::empty()).unwrap();
            b.append_data(&mut header(tar::EntryType::Regular, 0o444, 5), "ro/a.txt", &b"hello"[..]).unwrap();
            b.append_link(&mut header(tar::EntryType::Symlink, 0o777, 0), "link", "ro/a.txt").unwrap();
        });
        // Bytes after the end marker are never read as entries.
        let mut input = [bytes, b"trailing garbage".to_vec()].concat();
        let (entries, n) = unpack(&mut input.as_slice(), tmp.path()).unwrap();
        assert_eq!((entries, n), (3, 5));
        assert_eq!(std::fs::read(tmp.path().join("ro/a.txt")).unwrap(), b"hello");
        assert_eq!(std::fs::metadata(tmp.path().join("ro")).unwrap().permissions().mode() & 0o777, 0o555);
        assert_eq!(std::fs::metadata(tmp.path().join("ro/a.txt")).unwrap().permissions().mode() & 0o777, 0o444);
        assert_eq!(std::fs::read_link(tmp.path().join("link")).unwrap(), Path::new("ro/a.txt"));
        // The temp dir can go: its read-only dir is made writable again.
        std::fs::set_permissions(tmp.path().join("ro"), std::fs::Permissions::from_mode(0o755)).unwrap();
        input.clear();
    }

    #[test]
    fn an_entry_that_would_leave_the_dir_or_a_cut_tar_is_refused() {
        let outside = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        // A symlink to outside, then a file through it.
        let bytes = tar_with(|b| {
            b.append_link(&mut header(tar::EntryType::Symlink, 0o777, 0), "esc", outside.path()).unwrap();
            b.append_data(&mut header(tar::EntryType::Regular, 0o644, 1), "esc/x", &b"x"[..]).unwrap();
        });
        let err = unpack(&mut bytes.as_slice(), tmp.path()).unwrap_err();
        assert!(err.contains("esc/x"), "{err}");
        let tmp = tempfile::tempdir().unwrap();
        let bytes = tar_with(|b| {
            b.append_link(&mut header(tar::EntryType::Symlink, 0o777, 0), "esc", outside.path()).unwrap();
            b.append_data(&mut header(tar::EntryType::Directory, 0o755, 0), "esc/d", io::empty()).unwrap();
        });
        let err = unpack(&mut bytes.as_slice(), tmp.path()).unwrap_err();
        assert!(err.contains("in the way"), "{err}");
        assert!(!outside.path().join("d").exists(), "no dir made outside");
        assert!(!outside.path().join("x").exists(), "nothing written outside");
        // `..` in a name (written raw: the builder refuses it).
        let mut h = header(tar::EntryType::Regular, 0o644, 1);
        h.as_gnu_mut().unwrap().name[..7].copy_from_slice(b"../evil");
        h.set_cksum();
        let mut raw = h.as_bytes().to_vec();
        raw.extend_from_slice(&[b'x'; 512]);
        raw.extend_from_slice(&[0; 1024]);
        let err = unpack(&mut raw.as_slice(), tmp.path()).unwrap_err();
        assert!(err.contains("plain relative path"), "{err}");
        // A tar cut in the middle of a file.
        let whole = tar_with(|b| {
            b.append_data(&mut header(tar::EntryType::Regular, 0o644, 4096), "big", &[7u8; 4096][..]).unwrap();
        });
        let err = unpack(&mut &whole[..1024], tempfile::tempdir().unwrap().path()).unwrap_err();
        assert!(err.contains("big") || err.contains("reading"), "{err}");
        // A device is not staged.
        let dev = tar_with(|b| {
            b.append_data(&mut header(tar::EntryType::Char, 0o644, 0), "tty", io::empty()).unwrap();
        });
        assert!(unpack(&mut dev.as_slice(), tmp.path()).unwrap_err().contains("not staged"));
    }

    #[test]
    fn install_never_writes_over_a_file_or_through_a_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = tmp.path().join("init");
        let n = install(&dest).unwrap();
        assert!(n > 0);
        assert_eq!(std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777, 0o555);
        assert!(install(&dest).unwrap_err().contains("cannot create"));
        let target = tmp.path().join("target");
        std::os::unix::fs::symlink(&target, tmp.path().join("link")).unwrap();
        assert!(install(&tmp.path().join("link")).is_err());
        assert!(!target.exists());
    }
}
