//! A parked init warming its image before the claim (the hints in its environment,
//! [`crate::wire::env::WARM`], never in its arguments, which `/proc/1/cmdline` shows to
//! whatever runs in the sandbox later): the programs the pool's last attempts ran, looked up
//! along `PATH` and read once through the container's root, so that the claim's `execve` and
//! the command's first page faults find them in the kernel's caches. On a root served by a
//! FUSE daemon (the engine's fuse-overlayfs) every first lookup, every lookup that misses and
//! every first read of a fresh container is a round trip to that daemon: the first `execve`
//! in a fresh container measured 6 ms, 1 ms warmed (`docs/link.md`, "A parked init reads
//! ahead").
//!
//! Nothing of it runs as root: a root init (the one that writes the inputs, `stage`) warms
//! through a child it starts as the sandbox's user (`as_user`, supplementary groups dropped;
//! the child refuses to read as root or with any group), and none at all without that. A claim
//! that arrives meanwhile ends the warming: the child is killed and reaped before the init
//! reads the host's first frame, so the claim's check that the init is alone still holds and
//! the claim never waits for it. A file is opened without blocking and read only when it is a
//! regular file, within [`MAX_BYTES`] and [`MAX_TIME`] in all: the hints are the host's, the
//! files are the image's.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Hints of each kind taken at most.
pub const MAX_HINTS: usize = 8;
/// A hint's length at most, in bytes.
pub const MAX_HINT_LEN: usize = 1024;
/// What the warming reads at most, in all.
pub const MAX_BYTES: u64 = 32 << 20;
/// How long the warming may take at most: past it, what is left is not read.
pub const MAX_TIME: Duration = Duration::from_millis(300);
/// `execvp`'s search path where the environment sets none (glibc's `_CS_PATH`).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// What to warm: names as a command gives them (looked up along `PATH`), files by their path
/// in the image (read, with the ELF interpreter each names).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Warm {
    /// Program names without a slash.
    pub names: Vec<String>,
    /// Absolute paths of files in the image.
    pub files: Vec<String>,
    /// The user a root init warms as (never root).
    pub as_user: Option<(u32, u32)>,
}

impl Warm {
    /// Whether there is nothing to warm.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.files.is_empty()
    }

    /// The hints as the environment carries them ([`crate::wire::env::WARM`], JSON), checked:
    /// at most [`MAX_HINTS`] of each kind, each a name without '/' or an absolute path, the
    /// user never root.
    pub fn parse(json: &str) -> Result<Self, String> {
        let w: Warm = serde_json::from_str(json).map_err(|e| format!("{}: {e}", crate::wire::env::WARM))?;
        let bad = w.names.len() > MAX_HINTS
            || w.files.len() > MAX_HINTS
            || !w.names.iter().all(|n| valid_name(n))
            || !w.files.iter().all(|f| valid_file(f))
            || w.as_user.is_some_and(|(u, g)| u == 0 || g == 0);
        if bad {
            return Err(format!(
                "{}: at most {MAX_HINTS} of each, each a name without '/' or an absolute path, the user not root",
                crate::wire::env::WARM
            ));
        }
        Ok(w)
    }

    /// The hints as the environment carries them.
    pub fn to_env(&self) -> String {
        serde_json::to_string(self).expect("always serialises")
    }

    /// The hints the init was started with, if any.
    pub(crate) fn from_env() -> Result<Option<Self>, String> {
        match std::env::var(crate::wire::env::WARM) {
            Ok(v) if !v.is_empty() => Self::parse(&v).map(Some),
            _ => Ok(None),
        }
    }
}

/// A program name a command may give: no slash, no NUL, not `.` or `..`, bounded.
pub fn valid_name(n: &str) -> bool {
    !n.is_empty() && n.len() <= MAX_HINT_LEN && !n.contains(['/', '\0']) && n != "." && n != ".."
}

/// A file of the image: absolute, bounded, no NUL, no `..`.
pub fn valid_file(f: &str) -> bool {
    f.starts_with('/') && f.len() <= MAX_HINT_LEN && !f.contains('\0') && !f.split('/').any(|c| c == "..")
}

/// Warms as `w` says, before the init reads its first frame; returns when done, or as soon as
/// `claimed` says the host has written (the claim never waits for it), with what was read
/// (`None`: nothing asked, or a root init told no user to warm as).
pub(crate) fn before_park(w: &Warm, claimed: &dyn Fn() -> bool) -> Option<ReadAhead> {
    if w.is_empty() {
        return None;
    }
    let began = Instant::now();
    let until = began + MAX_TIME;
    let mut seen = if nix::unistd::geteuid().is_root() {
        let (uid, gid) = w.as_user?;
        in_child(uid, gid, until, claimed)
    } else {
        warm(w, until, claimed)
    };
    seen.ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
    Some(seen)
}

/// A root init's warming: `stevedore-init warm` as `uid`:`gid` (std drops the supplementary
/// groups when it sets the uid as root; leaving uid 0 clears the permitted and effective
/// capability sets), its one line read from a pipe of its own (stdio is the link), killed and
/// reaped at the claim or at `until`.
fn in_child(uid: u32, gid: u32, until: Instant, claimed: &dyn Fn() -> bool) -> ReadAhead {
    use std::os::unix::process::CommandExt;
    let failed = ReadAhead { failed: true, ..ReadAhead::default() };
    let child = std::process::Command::new("/proc/self/exe")
        .arg("warm")
        .uid(uid)
        .gid(gid)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn();
    let Ok(mut child) = child else { return failed };
    let mut out = child.stdout.take().expect("piped");
    let mut line = Vec::new();
    let mut cut = false;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || claimed() {
            cut = true;
            break;
        }
        // Whichever comes first: the child's line (or its end), the host's first frame.
        let mut fds = [nix::poll::PollFd::new(std::os::fd::AsFd::as_fd(&out), nix::poll::PollFlags::POLLIN)];
        let wait = u16::try_from(left.as_millis().clamp(1, 10)).unwrap_or(10);
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(wait)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(_) => {
                cut = true;
                break;
            }
        }
        let mut buf = [0u8; 512];
        match out.read(&mut buf) {
            Ok(0) => break,
            Ok(n) if line.len() < 4096 => line.extend_from_slice(&buf[..n]),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    if cut {
        let _ = child.kill();
    }
    let status = child.wait();
    match (cut, status) {
        (false, Ok(st)) if st.success() => {
            serde_json::from_slice::<ReadAhead>(&line).ok().filter(|r| r.uid != 0).unwrap_or(failed)
        }
        (true, _) => ReadAhead { cut: true, uid, ..ReadAhead::default() },
        _ => failed,
    }
}

/// `stevedore-init warm`: the warming itself, as the user it runs as, the hints from its
/// environment; prints what it read as one JSON line ([`ReadAhead`]). It refuses to read as
/// root or with any supplementary group.
pub fn main(args: &[String]) -> i32 {
    if !args.is_empty() {
        eprintln!("stevedore-init warm: takes no arguments (the hints are in {})", crate::wire::env::WARM);
        return 2;
    }
    let w = match Warm::from_env() {
        Ok(w) => w.unwrap_or_default(),
        Err(why) => {
            eprintln!("stevedore-init warm: {why}");
            return 2;
        }
    };
    let groups = nix::unistd::getgroups().unwrap_or_default();
    if nix::unistd::geteuid().is_root() || nix::unistd::getegid().as_raw() == 0 || !groups.is_empty() {
        eprintln!("stevedore-init warm: reads nothing as root or with a supplementary group");
        return 3;
    }
    let seen = warm(&w, Instant::now() + MAX_TIME, &|| false);
    println!("{}", serde_json::to_string(&seen).expect("always serialises"));
    0
}

/// What a parked init read ahead (`InitRecord::read_ahead`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ReadAhead {
    /// The uid it read as.
    pub uid: u32,
    /// Names looked up along `PATH`.
    pub names: u32,
    /// Files read (ELF interpreters and the loader's cache included).
    pub files: u32,
    /// Bytes read, in all.
    pub bytes: u64,
    /// Whether a bound ([`MAX_BYTES`], [`MAX_TIME`]) cut it short.
    pub cut: bool,
    /// Whether the child that reads could not run (nothing was read).
    pub failed: bool,
    /// How long it took, in ms, before the init waited for the claim.
    pub ms: u64,
}

/// Looks each name up along `PATH` (misses included: a lookup that missed is cached too) and
/// reads each file and the ELF interpreter it names (and then the loader's cache) once,
/// within the bounds, until `stop` says the claim came.
fn warm(w: &Warm, until: Instant, stop: &dyn Fn() -> bool) -> ReadAhead {
    let mut seen = ReadAhead { uid: nix::unistd::getuid().as_raw(), ..ReadAhead::default() };
    let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.to_owned());
    let over = |seen: &mut ReadAhead| {
        let over = Instant::now() >= until || stop();
        seen.cut |= over;
        over
    };
    for name in &w.names {
        seen.names += 1;
        for dir in path.split(':') {
            if over(&mut seen) {
                return seen;
            }
            let dir = if dir.is_empty() { "." } else { dir };
            if std::fs::metadata(Path::new(dir).join(name)).is_ok() {
                break;
            }
        }
    }
    let mut budget = MAX_BYTES;
    let mut done: Vec<String> = Vec::new();
    let mut queue: std::collections::VecDeque<String> = w.files.iter().cloned().collect();
    while let Some(file) = queue.pop_front() {
        if done.contains(&file) {
            continue;
        }
        if over(&mut seen) {
            return seen;
        }
        if let Some(interp) = read(Path::new(&file), &mut budget, until, &mut seen) {
            queue.push_front("/etc/ld.so.cache".to_owned());
            queue.push_front(interp);
        }
        done.push(file);
    }
    seen.cut |= budget == 0;
    seen
}

/// Reads `path` through, if it is a regular file, within `budget` and `until`; returns the
/// ELF interpreter it names, if any.
fn read(path: &Path, budget: &mut u64, until: Instant, seen: &mut ReadAhead) -> Option<String> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY | nix::libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    seen.files += 1;
    let mut buf = vec![0u8; 256 << 10];
    let mut interp = None;
    let mut first = true;
    while *budget > 0 && Instant::now() < until {
        let want = buf.len().min(usize::try_from(*budget).unwrap_or(usize::MAX));
        let n = match f.read(&mut buf[..want]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if first {
            interp = elf_interp(&buf[..n]);
            first = false;
        }
        *budget = budget.saturating_sub(n as u64);
        seen.bytes += n as u64;
    }
    interp
}

/// The interpreter a 64-bit little-endian ELF file names (`PT_INTERP`), where its program
/// headers and the name lie within `head`.
pub fn elf_interp(head: &[u8]) -> Option<String> {
    if head.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |at: usize| Some(u16::from_le_bytes(head.get(at..at + 2)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(head.get(at..at + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    if phentsize < 56 {
        return None;
    }
    for i in 0..phnum.min(64) {
        let ph = phoff.checked_add(i.checked_mul(phentsize)?)?;
        let kind = u32::from_le_bytes(head.get(ph..ph + 4)?.try_into().ok()?);
        if kind != 3 {
            continue;
        }
        let off = usize::try_from(u64_at(ph + 8)?).ok()?;
        let len = usize::try_from(u64_at(ph + 32)?).ok()?.min(MAX_HINT_LEN);
        let raw = head.get(off..off.checked_add(len)?)?;
        let name = raw.split(|&b| b == 0).next()?;
        let name = std::str::from_utf8(name).ok()?;
        return valid_file(name).then(|| name.to_owned());
    }
    None
}

/// Where `program` resolves for a command started with `path` and `cwd`, as the file's
/// canonical path: what the pool warms for the next attempts on its image. `None` where it
/// does not resolve to a regular file.
pub(crate) fn resolve(program: &str, path: Option<&str>, cwd: &str) -> Option<String> {
    let candidates: Vec<std::path::PathBuf> = if program.contains('/') {
        vec![Path::new(cwd).join(program)]
    } else {
        path.unwrap_or(DEFAULT_PATH)
            .split(':')
            .map(|d| Path::new(if d.is_empty() { cwd } else { d }).join(program))
            .map(|p| if p.is_absolute() { p } else { Path::new(cwd).join(p) })
            .collect()
    };
    let found = candidates.into_iter().find(|p| {
        nix::unistd::access(p.as_path(), nix::unistd::AccessFlags::X_OK).is_ok()
            && std::fs::metadata(p).is_ok_and(|m| m.is_file())
    })?;
    let real = std::fs::canonicalize(found).ok()?.into_os_string().into_string().ok()?;
    valid_file(&real).then_some(real)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hints_are_bounded_names_and_absolute_paths_and_never_root() {
        let w = Warm::parse(r#"{"names":["true"],"files":["/bin/busybox"],"as_user":[65532,65532]}"#).unwrap();
        assert_eq!(w.names, ["true"]);
        assert_eq!(w.as_user, Some((65532, 65532)));
        assert_eq!(Warm::parse(&w.to_env()).unwrap(), w);
        for bad in [
            r#"{"names":["a/b"]}"#,
            r#"{"names":[".."]}"#,
            r#"{"names":[""]}"#,
            r#"{"files":["bin/x"]}"#,
            r#"{"files":["/a/../etc/shadow"]}"#,
            r#"{"files":["/a\u0000b"]}"#,
            r#"{"as_user":[0,1]}"#,
            r#"{"as_user":[1,0]}"#,
            r#"{"other":1}"#,
            r#"{"names":["1","2","3","4","5","6","7","8","9"]}"#,
            "not json",
        ] {
            assert!(Warm::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_interpreter_of_an_elf_file_is_read_from_its_program_headers() {
        let mut head = vec![0u8; 512];
        head[..6].copy_from_slice(b"\x7fELF\x02\x01");
        head[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        head[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        head[0x38..0x3a].copy_from_slice(&2u16.to_le_bytes());
        // A PT_LOAD, then the PT_INTERP naming a path at 300.
        head[64..68].copy_from_slice(&1u32.to_le_bytes());
        let ph = 64 + 56;
        head[ph..ph + 4].copy_from_slice(&3u32.to_le_bytes());
        head[ph + 8..ph + 16].copy_from_slice(&300u64.to_le_bytes());
        let name = b"/lib64/ld-linux-x86-64.so.2\0";
        head[ph + 32..ph + 40].copy_from_slice(&(name.len() as u64).to_le_bytes());
        head[300..300 + name.len()].copy_from_slice(name);
        assert_eq!(elf_interp(&head).as_deref(), Some("/lib64/ld-linux-x86-64.so.2"));
        // Out of bounds, truncated, relative, or not ELF: nothing, and no panic.
        head[ph + 8..ph + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(elf_interp(&head), None);
        head[ph + 8..ph + 16].copy_from_slice(&300u64.to_le_bytes());
        head[300] = b'l';
        assert_eq!(elf_interp(&head), None);
        assert_eq!(elf_interp(&head[..100]), None);
        assert_eq!(elf_interp(b"#!/bin/sh\n"), None);
        // This test's own binary: a static or dynamic ELF, either way no panic.
        let me = std::fs::read("/proc/self/exe").unwrap();
        if let Some(i) = elf_interp(&me) {
            assert!(Path::new(&i).exists(), "{i}");
        }
    }

    #[test]
    fn only_regular_files_are_read_and_never_past_the_budget() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let big = d.path().join("big");
        std::fs::File::create(&big).unwrap().set_len(3 * MAX_BYTES).unwrap();
        let far = Instant::now() + Duration::from_secs(60);
        let mut seen = ReadAhead::default();
        let mut budget = MAX_BYTES;
        // A FIFO nobody writes to, a directory, a device: opened without blocking, not read.
        for p in [fifo.as_path(), d.path(), Path::new("/dev/zero"), Path::new("/nonexistent")] {
            assert_eq!(read(p, &mut budget, far, &mut seen), None, "{}", p.display());
        }
        assert_eq!((seen.files, seen.bytes), (0, 0));
        read(&big, &mut budget, far, &mut seen);
        assert_eq!((seen.files, seen.bytes, budget), (1, MAX_BYTES, 0));
        // Past the time bound nothing more is read.
        let mut budget = MAX_BYTES;
        read(&big, &mut budget, Instant::now(), &mut seen);
        assert_eq!(budget, MAX_BYTES);
        // The whole warming reports the cut.
        let w = Warm { files: vec![big.to_str().unwrap().to_owned()], ..Warm::default() };
        // A claim stops it before anything is read.
        assert_eq!(warm(&w, far, &|| true).bytes, 0);
        let all = warm(&w, far, &|| false);
        assert_eq!((all.files, all.bytes, all.cut), (1, MAX_BYTES, true));
    }

    #[test]
    fn a_program_resolves_along_path_to_its_canonical_file() {
        let d = tempfile::tempdir().unwrap();
        let bin = d.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let real = bin.join("busybox");
        std::fs::write(&real, b"x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("busybox", bin.join("true")).unwrap();
        std::fs::write(bin.join("noexec"), b"x").unwrap();
        let path = format!("/nonexistent:{}", bin.display());
        let want = std::fs::canonicalize(&real).unwrap().to_str().unwrap().to_owned();
        assert_eq!(resolve("true", Some(&path), "/").as_deref(), Some(want.as_str()));
        assert_eq!(resolve("bin/true", None, d.path().to_str().unwrap()).as_deref(), Some(want.as_str()));
        assert_eq!(resolve("noexec", Some(&path), "/"), None);
        assert_eq!(resolve("bin", Some(d.path().to_str().unwrap()), "/"), None);
        assert_eq!(resolve("absent", Some(&path), "/"), None);
    }
}
