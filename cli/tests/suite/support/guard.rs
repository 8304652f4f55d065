//! What watches the tests from outside the harness: a time limit on every test that needs
//! an engine or a dedicated uid, and one line at the end of the run naming what was
//! skipped and why (the harness captures a test's own output, so a skip would be silent).
//! Each skip also goes, by name, to the file `STEVEDORE_TEST_SKIP_LOG` names: `.ci/run`
//! lists them all at its end, per stage (one binary's last line scrolls away among many).

#![expect(unsafe_code, reason = "atexit, to print the skip summary once the harness is done")]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// How long one test may run: `STEVEDORE_TEST_TIMEOUT` seconds, else 10 minutes (the
/// longest test takes about one on a busy machine).
fn limit() -> Duration {
    let secs = std::env::var("STEVEDORE_TEST_TIMEOUT").ok().and_then(|s| s.parse().ok()).unwrap_or(600);
    Duration::from_secs(secs)
}

/// Deadlines of the tests running now, by the thread each runs on.
static WATCHED: Mutex<BTreeMap<u64, (String, Instant)>> = Mutex::new(BTreeMap::new());

/// Writes past the harness's capture, on the process's own stderr.
fn say(line: &str) {
    let mut err = std::fs::File::options().append(true).open("/dev/stderr").ok();
    if let Some(f) = err.as_mut() {
        let _ = writeln!(f, "{line}");
    }
}

/// This thread's entry in [`WATCHED`], removed when its test ends (its thread with it).
struct Armed(u64);

impl Drop for Armed {
    fn drop(&mut self) {
        WATCHED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.0);
    }
}

/// Starts (or restarts) the time limit of the test running on this thread. Past it, the
/// whole run stops with exit status 124, naming the test: a hang fails, it never waits out
/// CI's own limit.
pub fn time_limit() {
    static WATCHER: Once = Once::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    thread_local! {
        static ARMED: Armed = Armed(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    }
    let name = std::thread::current().name().unwrap_or("a test").to_owned();
    let id = ARMED.with(|a| a.0);
    WATCHED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id, (name, Instant::now() + limit()));
    WATCHER.call_once(|| {
        std::thread::spawn(|| {
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let late = {
                    let w = WATCHED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    w.values().find(|(_, by)| Instant::now() > *by).map(|(n, _)| n.clone())
                };
                if let Some(test) = late {
                    say(&format!(
                        "TIMEOUT: test {test} ran longer than {}s (STEVEDORE_TEST_TIMEOUT): stopping the run",
                        limit().as_secs()
                    ));
                    std::process::exit(124);
                }
            }
        });
    });
}

/// Tests skipped in this run, and why.
static SKIPPED: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

extern "C" fn summary() {
    let skipped = SKIPPED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut by_why: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, why) in skipped.iter() {
        *by_why.entry(why.as_str()).or_default() += 1;
    }
    if !by_why.is_empty() {
        let parts: Vec<String> = by_why.iter().map(|(why, n)| format!("{n} ({why})")).collect();
        say(&format!(
            "SKIPPED: {} tests passed without running: {} (under CI=true an unreachable engine fails instead)",
            skipped.len(),
            parts.join(", ")
        ));
    }
}

/// The variable naming the file each skip is appended to.
pub const SKIP_LOG: &str = "STEVEDORE_TEST_SKIP_LOG";

/// Appends `test<TAB>why` to `log`. One write of the whole line to a file opened to append:
/// the lines of tests skipping at once (threads, or test binaries sharing the file) never
/// interleave. A tab or line break inside either part becomes a space.
pub fn record_skip(log: &Path, test: &str, why: &str) -> std::io::Result<()> {
    let clean = |s: &str| s.replace(['\t', '\n', '\r'], " ");
    let line = format!("{}\t{}\n", clean(test), clean(why));
    std::fs::File::options().create(true).append(true).open(log)?.write_all(line.as_bytes())
}

/// Records that the test on this thread is skipped, and why; the run's last line says so,
/// and so does the file [`SKIP_LOG`] names, if any. Under `CI=true` the callers fail
/// instead where the contract asks it (an engine).
pub fn skip(why: impl Into<String>) {
    static AT_EXIT: Once = Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: `summary` takes no arguments, never unwinds (it only formats and writes)
        // and touches only statics that outlive the process's exit.
        unsafe {
            nix::libc::atexit(summary);
        }
    });
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    let why = why.into();
    if let Some(log) = std::env::var_os(SKIP_LOG) {
        // A skip that cannot be told would be a silent one: the test fails instead.
        record_skip(Path::new(&log), &test, &why).unwrap_or_else(|e| {
            panic!("recording the skip of {test} in {} ({SKIP_LOG}): {e}", Path::new(&log).display())
        });
    }
    SKIPPED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((test, why));
}
