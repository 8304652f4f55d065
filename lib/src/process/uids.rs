//! Who the process rung's commands run as. As root, each attempt gets a uid and gid of its
//! own from a range no user database names (`/etc/passwd`, `/etc/group`, `/etc/subuid`,
//! `/etc/subgid`): two attempts then never share a uid, so one can neither signal, ptrace
//! nor read another's `/proc` entries or files. A uid is leased under a lock file in the
//! rung's base dir (held for the attempt's life, so every process on the host that uses the
//! same base dir shares the range safely, and a crashed worker's locks go with it), and it
//! is taken again only after a sweep found nothing of its last attempt: no process, no
//! file in the host's shared dirs (`/tmp`, `/var/tmp`, `/dev/shm`, `/dev/mqueue`), no SysV
//! IPC object. The sweep runs when an attempt ends (it kills what is left of that uid and
//! removes its files there), and again before a uid whose last holder did not finish it is
//! leased. Without a range (a fixed uid, or the worker's own) the uid is not dedicated:
//! nothing is swept, and attempts take turns unless sharing is allowed.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A range of uids (and the gids of the same numbers) for the attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    /// The first uid.
    pub first: u32,
    /// How many.
    pub count: u32,
}

/// The default range: 65536 uids from 0x60000000 (1610612736), far above the ranges login
/// users, system users, systemd's dynamic users and the usual `/etc/subuid` allocations
/// take; checked against this host's databases when the rung starts.
pub const DEFAULT_UIDS: UidRange = UidRange { first: 0x6000_0000, count: 65536 };

impl UidRange {
    /// The last uid.
    pub fn last(&self) -> u32 {
        self.first.saturating_add(self.count.saturating_sub(1))
    }

    /// Whether `id` is in the range.
    pub fn contains(&self, id: u32) -> bool {
        (self.first..=self.last()).contains(&id)
    }

    fn overlaps(&self, start: u64, count: u64) -> bool {
        let (a0, a1) = (u64::from(self.first), u64::from(self.last()));
        let b1 = start.saturating_add(count.saturating_sub(1));
        count > 0 && start <= a1 && a0 <= b1
    }
}

impl std::fmt::Display for UidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last())
    }
}

/// Why uids cannot be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UidError {
    /// the range is not usable at all
    #[error("uid range {range} cannot be used: {why}")]
    BadRange {
        /// The range.
        range: UidRange,
        /// Why.
        why: &'static str,
    },
    /// a user database names an id of the range
    #[error("uid range {range} overlaps {file}: {entry}; configure another range (ProcessConfig::uids)")]
    Overlap {
        /// The range.
        range: UidRange,
        /// The database.
        file: PathBuf,
        /// The entry (name and ids; never a password field).
        entry: String,
    },
    /// every uid is in use or not yet clean
    #[error(
        "no uid of range {range} is free: {busy} in use by attempts or processes, {dirty} still holding files or IPC \
         objects of earlier attempts"
    )]
    Exhausted {
        /// The range.
        range: UidRange,
        /// Held by attempts in flight or used by processes.
        busy: u64,
        /// Kept back because a sweep found something of theirs.
        dirty: u64,
    },
    /// the fixed uid is taken by another attempt
    #[error(
        "uid {uid} runs another attempt: the process rung runs every attempt as that uid, one at a time (configure a \
         uid range to run them side by side, or allow sharing with ProcessConfig::share_uid, which leaves them \
         unisolated from each other)"
    )]
    Taken {
        /// The uid.
        uid: u32,
    },
    /// the lock files cannot be used
    #[error("the uid leases in {path}")]
    Io {
        /// Where.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Checks `range` against the user databases under `etc` (`/etc` on a real host): no user
/// or group of it, no subordinate range overlapping it.
pub fn check_range(range: UidRange, etc: &Path) -> Result<(), UidError> {
    let bad = |why| Err(UidError::BadRange { range, why });
    if range.count == 0 {
        return bad("it is empty");
    }
    if range.first == 0 || u64::from(range.first) + u64::from(range.count) > u64::from(u32::MAX) - 1 {
        return bad("it must not hold uid 0, and must end below 4294967294");
    }
    if range.contains(65534) || range.contains(65535) {
        return bad("it must not hold nobody (65534) or 65535");
    }
    for (file, fields) in [("passwd", &[2usize, 3][..]), ("group", &[2][..])] {
        let path = etc.join(file);
        for line in read_lines(&path)? {
            let cols: Vec<&str> = line.split(':').collect();
            for &i in fields {
                if let Some(id) = cols.get(i).and_then(|c| c.parse::<u32>().ok())
                    && range.contains(id)
                {
                    let entry = format!("{} has id {id}", cols.first().copied().unwrap_or("?"));
                    return Err(UidError::Overlap { range, file: path, entry });
                }
            }
        }
    }
    for file in ["subuid", "subgid"] {
        let path = etc.join(file);
        for line in read_lines(&path)? {
            let cols: Vec<&str> = line.split(':').collect();
            if let (Some(start), Some(count)) =
                (cols.get(1).and_then(|c| c.parse::<u64>().ok()), cols.get(2).and_then(|c| c.parse::<u64>().ok()))
                && range.overlaps(start, count)
            {
                let entry = format!("{} has {start}-{}", cols[0], start + count.saturating_sub(1));
                return Err(UidError::Overlap { range, file: path, entry });
            }
        }
    }
    Ok(())
}

/// The non-comment lines of a database; a missing one has none.
fn read_lines(path: &Path) -> Result<Vec<String>, UidError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(text.lines().filter(|l| !l.trim_start().starts_with('#')).map(str::to_owned).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(UidError::Io { path: path.to_owned(), source }),
    }
}

/// The uids (real, effective, saved and filesystem) of every process `/proc` lists.
pub(crate) fn process_uids() -> HashSet<u32> {
    let mut uids = HashSet::new();
    let Ok(dir) = fs::read_dir("/proc") else { return uids };
    for e in dir.flatten() {
        if !e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        let Ok(status) = fs::read_to_string(e.path().join("status")) else { continue };
        if let Some(line) = status.lines().find(|l| l.starts_with("Uid:")) {
            uids.extend(line.split_whitespace().skip(1).filter_map(|u| u.parse::<u32>().ok()));
        }
    }
    uids
}

/// The pids whose real, effective or saved uid is `uid`.
fn pids_of(uid: u32) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
                s.lines()
                    .find(|l| l.starts_with("Uid:"))
                    .is_some_and(|l| l.split_whitespace().skip(1).any(|u| u.parse::<u32>() == Ok(uid)))
            })
        })
        .collect()
}

/// What a lease file says of its uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Never used, or its last attempt's sweep found nothing.
    Clean,
    /// Leased; if the lock is free, its holder died before sweeping.
    Busy,
    /// A sweep found something of it: swept again before it is leased.
    Dirty,
}

/// The uids of one rung's attempts.
#[derive(Debug)]
pub(crate) struct Uids {
    range: UidRange,
    /// Dedicated uids are swept; a fixed uid or the worker's own is not.
    dedicated: bool,
    dir: PathBuf,
    cursor: Mutex<u32>,
}

/// One attempt's uid, held until [`Lease::release`] (or, as a backstop, until dropped: the
/// lock goes, and the uid is swept before its next lease).
#[derive(Debug)]
pub(crate) struct Lease {
    pub uid: u32,
    dedicated: bool,
    /// The lease file, `flock`ed: closing it (dropping the lease) releases the lock.
    file: nix::fcntl::Flock<File>,
}

impl Uids {
    /// The leases of `range` kept in `dir` (made 0700 if missing). `dedicated`: the range is
    /// the rung's own (checked with [`check_range`]), so what its uids leave is swept.
    pub fn new(range: UidRange, dedicated: bool, dir: PathBuf) -> Result<Self, UidError> {
        super::dirs::ensure_dir(&dir, 0o700)
            .map_err(|e| UidError::Io { path: dir.clone(), source: io::Error::other(e.to_string()) })?;
        Ok(Self { range, dedicated, dir, cursor: Mutex::new(0) })
    }

    /// Leases a uid no other attempt holds and no process uses (blocking: call it off the
    /// runtime's threads).
    pub fn lease(&self) -> Result<Lease, UidError> {
        let in_use = if self.dedicated { process_uids() } else { HashSet::new() };
        let mut cursor = self.cursor.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (mut busy, mut dirty) = (0u64, 0u64);
        for i in 0..self.range.count {
            let offset = cursor.wrapping_add(i) % self.range.count;
            let uid = self.range.first + offset;
            if in_use.contains(&uid) {
                busy += 1;
                continue;
            }
            let Some(mut file) = self.try_lock(uid)? else {
                busy += 1;
                continue;
            };
            if self.dedicated && state_of(&mut file) != State::Clean && !sweep(uid) {
                set_state(&mut file, State::Dirty);
                dirty += 1;
                continue;
            }
            set_state(&mut file, State::Busy);
            *cursor = offset.wrapping_add(1) % self.range.count;
            return Ok(Lease { uid, dedicated: self.dedicated, file });
        }
        if !self.dedicated {
            return Err(UidError::Taken { uid: self.range.first });
        }
        Err(UidError::Exhausted { range: self.range, busy, dirty })
    }

    /// The lease of `uid` for an attempt taken over from a crashed worker (whose lock went
    /// with it): `None` when another attempt holds it, or it is not this rung's.
    pub fn adopt(&self, uid: u32) -> Result<Option<Lease>, UidError> {
        if !self.range.contains(uid) {
            return Ok(None);
        }
        Ok(self.try_lock(uid)?.map(|file| Lease { uid, dedicated: self.dedicated, file }))
    }

    /// Sweeps `uid` if no attempt holds it (what a crashed worker left): whether it is clean.
    pub fn reclaim(&self, uid: u32) -> Result<bool, UidError> {
        if !self.dedicated || !self.range.contains(uid) {
            return Ok(true);
        }
        let Some(file) = self.try_lock(uid)? else { return Ok(false) };
        Ok(Lease { uid, dedicated: true, file }.release())
    }

    fn try_lock(&self, uid: u32) -> Result<Option<nix::fcntl::Flock<File>>, UidError> {
        let path = self.dir.join(uid.to_string());
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&path)
            .map_err(|source| UidError::Io { path: path.clone(), source })?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(locked) => Ok(Some(locked)),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, e)) => Err(UidError::Io { path, source: e.into() }),
        }
    }
}

impl Lease {
    /// Ends the lease: kills what is left of the uid, removes what it left in the shared
    /// dirs, and marks it clean (or dirty, when something could not go). Blocking. Whether
    /// it is clean.
    pub fn release(mut self) -> bool {
        if !self.dedicated {
            set_state(&mut self.file, State::Clean);
            return true;
        }
        let clean = sweep(self.uid);
        set_state(&mut self.file, if clean { State::Clean } else { State::Dirty });
        clean
    }
}

fn state_of(file: &mut File) -> State {
    let mut s = String::new();
    let _ = file.seek(io::SeekFrom::Start(0)).and_then(|_| file.read_to_string(&mut s));
    match s.trim() {
        "" | "clean" => State::Clean,
        "busy" => State::Busy,
        _ => State::Dirty,
    }
}

fn set_state(file: &mut File, state: State) {
    let word = match state {
        State::Clean => "clean",
        State::Busy => "busy",
        State::Dirty => "dirty",
    };
    let _ =
        file.set_len(0).and_then(|()| file.seek(io::SeekFrom::Start(0))).and_then(|_| file.write_all(word.as_bytes()));
}

/// The host's dirs every user may write in, where an attempt could leave something behind.
const SHARED_DIRS: [&str; 4] = ["/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue"];
/// Entries looked at per shared dir, at most.
const MAX_SWEPT: usize = 200_000;

/// Kills every process of `uid`, removes its entries in [`SHARED_DIRS`], and checks that no
/// process, file or SysV IPC object of it is left: whether it is clean.
fn sweep(uid: u32) -> bool {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for _ in 0..100 {
        let pids = pids_of(uid);
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut clean = pids_of(uid).is_empty();
    for dir in SHARED_DIRS {
        clean &= remove_owned(Path::new(dir), uid);
    }
    clean && !owns_ipc(uid)
}

/// Whether a SysV shared memory segment, semaphore set or message queue belongs to `uid`.
fn owns_ipc(uid: u32) -> bool {
    ["shm", "sem", "msg"].iter().any(|kind| {
        let Ok(text) = fs::read_to_string(format!("/proc/sysvipc/{kind}")) else { return false };
        let mut lines = text.lines();
        let Some(header) = lines.next() else { return false };
        let Some(col) = header.split_whitespace().position(|h| h == "uid") else { return false };
        lines.any(|l| l.split_whitespace().nth(col).and_then(|u| u.parse::<u32>().ok()) == Some(uid))
    })
}

/// Removes every entry of `top` (recursively, on its own filesystem) that belongs to `uid`,
/// never following a symlink; whether nothing of `uid` is left there.
fn remove_owned(top: &Path, uid: u32) -> bool {
    use nix::fcntl::{OFlag, open};
    use nix::sys::stat::{Mode, fstat};
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let Ok(fd) = open(top, flags, Mode::empty()) else { return true };
    let Ok(st) = fstat(&fd) else { return true };
    let mut budget = MAX_SWEPT;
    clean_dir(fd, st.st_dev, uid, false, 0, &mut budget)
}

/// Removes what `uid` owns in the dir `fd` (everything, when `all`: the dir is `uid`'s own);
/// whether nothing of `uid` is left.
fn clean_dir(fd: std::os::fd::OwnedFd, dev: u64, uid: u32, all: bool, depth: usize, budget: &mut usize) -> bool {
    use nix::dir::Dir;
    use nix::fcntl::{AtFlags, OFlag, openat};
    use nix::sys::stat::{Mode, SFlag, fstatat};
    use nix::unistd::{UnlinkatFlags, unlinkat};
    let Ok(mut d) = Dir::from_fd(fd) else { return false };
    let Ok(base) = std::os::fd::AsFd::as_fd(&d).try_clone_to_owned() else { return false };
    let names: Vec<Vec<u8>> = d
        .iter()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_bytes().to_vec())
        .filter(|n| n != b"." && n != b"..")
        .collect();
    let mut clean = true;
    for name in names {
        if *budget == 0 {
            return false;
        }
        *budget -= 1;
        let Ok(st) = fstatat(&base, name.as_slice(), AtFlags::AT_SYMLINK_NOFOLLOW) else { continue };
        let mine = all || st.st_uid == uid;
        let is_dir = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR;
        if is_dir && st.st_dev == dev && depth < 32 {
            let sub = openat(
                &base,
                name.as_slice(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            );
            if let Ok(sub) = sub {
                clean &= clean_dir(sub, dev, uid, mine, depth + 1, budget);
            }
        }
        if mine {
            let how = if is_dir { UnlinkatFlags::RemoveDir } else { UnlinkatFlags::NoRemoveDir };
            if unlinkat(&base, name.as_slice(), how).is_err() && st.st_uid == uid {
                clean = false;
            }
        }
    }
    clean
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etc(files: &[(&str, &str)]) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        for (name, text) in files {
            fs::write(t.path().join(name), text).unwrap();
        }
        t
    }

    #[test]
    fn the_range_is_checked_against_every_user_database() {
        let r = UidRange { first: 200_000, count: 1000 };
        let clean = etc(&[
            ("passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"),
            ("group", "root:x:0:\n"),
            ("subuid", "alice:100000:65536\n"),
            ("subgid", "alice:100000:65536\n"),
        ]);
        check_range(r, clean.path()).unwrap();
        for (file, text, named) in [
            ("passwd", "svc:x:200500:10::/:/bin/false\n", "svc has id 200500"),
            ("passwd", "svc:x:10:200999::/:/bin/false\n", "svc has id 200999"),
            ("group", "grp:x:200000:\n", "grp has id 200000"),
            ("subuid", "bob:150000:65536\n", "bob has 150000-215535"),
            ("subgid", "bob:200999:1\n", "bob has 200999-200999"),
        ] {
            let t = etc(&[(file, text)]);
            let err = check_range(r, t.path()).unwrap_err();
            assert!(matches!(err, UidError::Overlap { .. }), "{err}");
            assert!(err.to_string().contains(named), "{err}");
        }
        let t = etc(&[("subuid", "bob:201000:10\nc:199000:1000\n")]);
        check_range(r, t.path()).unwrap();
        for bad in
            [UidRange { first: 0, count: 10 }, UidRange { first: 65000, count: 1000 }, UidRange { first: 5, count: 0 }]
        {
            assert!(matches!(check_range(bad, clean.path()), Err(UidError::BadRange { .. })), "{bad}");
        }
        check_range(DEFAULT_UIDS, clean.path()).unwrap();
    }

    #[test]
    fn leases_are_exclusive_and_taken_in_turn() {
        let t = tempfile::tempdir().unwrap();
        let range = UidRange { first: 0x6100_0000, count: 3 };
        let a = Uids::new(range, false, t.path().join("uids")).unwrap();
        let b = Uids::new(range, false, t.path().join("uids")).unwrap();
        let one = a.lease().unwrap();
        let two = b.lease().unwrap();
        assert_ne!(one.uid, two.uid, "two holders never share a uid");
        let three = a.lease().unwrap();
        assert!(matches!(b.lease(), Err(UidError::Taken { .. })), "the range is used up");
        drop(three);
        assert!(b.lease().is_ok(), "a dropped lease frees its uid");
        assert!(one.release() && two.release());
    }

    #[test]
    fn a_sweep_removes_what_a_uid_left_and_only_that() {
        if !nix::unistd::geteuid().is_root() {
            crate::util::test_skip("needs root to own files as another uid");
            return;
        }
        let uid = 0x6200_0000 + (rand::random::<u32>() % 1000);
        let t = tempfile::tempdir().unwrap();
        let mine = t.path().join("mine");
        fs::create_dir_all(mine.join("deep")).unwrap();
        fs::write(mine.join("deep/f"), b"x").unwrap();
        fs::write(t.path().join("theirs"), b"keep").unwrap();
        fs::write(t.path().join("my-file"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", t.path().join("my-link")).unwrap();
        for p in [mine.clone(), mine.join("deep"), mine.join("deep/f"), t.path().join("my-file")] {
            std::os::unix::fs::chown(&p, Some(uid), Some(uid)).unwrap();
        }
        std::os::unix::fs::lchown(t.path().join("my-link"), Some(uid), Some(uid)).unwrap();
        let target = fs::metadata("/etc/passwd").unwrap();
        assert!(remove_owned(t.path(), uid));
        assert!(!mine.exists() && !t.path().join("my-file").exists() && !t.path().join("my-link").exists());
        assert_eq!(fs::read(t.path().join("theirs")).unwrap(), b"keep");
        let after = fs::metadata("/etc/passwd").unwrap();
        assert_eq!((after.len(), after.modified().unwrap()), (target.len(), target.modified().unwrap()));
    }

    /// A uid a process uses is never leased; a released uid's leftover process is killed;
    /// one that still owns an IPC object is kept back (`dirty`) until it owns nothing.
    #[test]
    #[expect(unsafe_code, reason = "SysV shmget/shmctl, to give a segment to the uid under test (nix has no SysV shm)")]
    fn a_uid_is_leased_only_when_nothing_of_it_is_left() {
        use std::os::unix::process::{CommandExt, ExitStatusExt};
        if !nix::unistd::geteuid().is_root() {
            crate::util::test_skip("needs root to run processes as another uid");
            return;
        }
        let uid = 0x6300_0000 + (rand::random::<u32>() % 100_000);
        let t = tempfile::tempdir().unwrap();
        let uids = Uids::new(UidRange { first: uid, count: 1 }, true, t.path().join("uids")).unwrap();
        let sleeper = || std::process::Command::new("/bin/sleep").arg("1000").uid(uid).gid(uid).spawn().unwrap();

        // A process of that uid that no lease knows of: the uid is busy.
        let mut stranger = sleeper();
        let err = uids.lease().unwrap_err();
        assert!(matches!(err, UidError::Exhausted { busy: 1, dirty: 0, .. }), "{err}");
        stranger.kill().unwrap();
        stranger.wait().unwrap();

        // An attempt that leaves a process and a SysV segment behind.
        let lease = uids.lease().unwrap();
        let mut left = sleeper();
        // SAFETY: plain SysV calls on a segment this test makes and removes.
        let shm = unsafe { nix::libc::shmget(nix::libc::IPC_PRIVATE, 4096, 0o600) };
        assert!(shm >= 0, "shmget: {}", io::Error::last_os_error());
        // The segment goes with the test, whichever assertion fails.
        struct Segment(i32);
        impl Drop for Segment {
            fn drop(&mut self) {
                // SAFETY: removes the segment this test made; a second removal only fails.
                unsafe { nix::libc::shmctl(self.0, nix::libc::IPC_RMID, std::ptr::null_mut()) };
            }
        }
        let segment = Segment(shm);
        // SAFETY: `shmid_ds` is a plain C struct, all zeroes a valid value; IPC_STAT fills it.
        let mut ds: nix::libc::shmid_ds = unsafe { std::mem::zeroed() };
        // SAFETY: `shm` is this test's segment and `ds` a live, writable struct of its type.
        assert_eq!(unsafe { nix::libc::shmctl(shm, nix::libc::IPC_STAT, &mut ds) }, 0);
        ds.shm_perm.uid = uid;
        // SAFETY: as above; IPC_SET only reads `ds`.
        assert_eq!(unsafe { nix::libc::shmctl(shm, nix::libc::IPC_SET, &mut ds) }, 0);
        assert!(!lease.release(), "the segment is still the uid's");
        assert_eq!(left.wait().unwrap().signal(), Some(nix::libc::SIGKILL), "the leftover process was killed");
        let err = uids.lease().unwrap_err();
        assert!(matches!(err, UidError::Exhausted { busy: 0, dirty: 1, .. }), "{err}");

        // Once nothing of it is left, the next lease sweeps it and takes it.
        // SAFETY: removes this test's segment; IPC_RMID takes no buffer.
        assert_eq!(unsafe { nix::libc::shmctl(shm, nix::libc::IPC_RMID, std::ptr::null_mut()) }, 0);
        std::mem::forget(segment);
        let again = uids.lease().expect("a clean uid is leased again");
        assert_eq!(again.uid, uid);
        assert!(again.release());
    }
}
