//! Plumbing every module may use and that uses nothing of the crate: boxed futures, boxed
//! causes, error chains as one line.

use std::future::Future;
use std::pin::Pin;

/// A `Send` boxed future, so the rungs' traits work as trait objects (`Arc<dyn Executor>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A boxed cause from the filesystem or elsewhere.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `bytes` random bytes as lowercase hex: an attempt's own ID.
pub(crate) fn random_hex(bytes: usize) -> String {
    hex(&(0..bytes).map(|_| rand::random::<u8>()).collect::<Vec<u8>>())
}

/// `bytes` as lowercase hex (keys, digests).
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The bytes of lowercase or uppercase `hex`; `None` for an odd length or another character.
pub(crate) fn unhex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) || !hex.is_ascii() {
        return None;
    }
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok()).collect()
}

/// The error's text followed by its sources' (those its text does not already end with),
/// on one line: for places that keep or print only text.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.ends_with(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

/// Runs `work` to its end on a thread and a runtime of its own, and waits for it at most
/// `within`; whether it ended in time. For a Drop backstop: the caller's runtime may be
/// shutting down (a panic unwinding through `block_on`) or be the one thread that would have
/// to run the work, so nothing of it is used. `work` must not need that runtime either (an
/// engine client of its own: `Engine::redial`).
#[cfg(feature = "docker")]
pub fn finish_apart(name: &str, within: std::time::Duration, work: impl Future<Output = ()> + Send + 'static) -> bool {
    let (done, ended) = std::sync::mpsc::channel::<()>();
    let spawned = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
            rt.block_on(work);
        }
        let _ = done.send(());
    });
    spawned.is_ok() && ended.recv_timeout(within).is_ok()
}

/// Says that the unit test on this thread is skipped, and why: on stderr, and as a line
/// `test<TAB>why` appended to the file `STEVEDORE_TEST_SKIP_LOG` names, as the command's
/// integration tests do (`.ci/run` lists every skip at its end).
#[cfg(all(test, any(feature = "docker", feature = "process")))]
pub(crate) fn test_skip(why: &str) {
    use std::io::Write;
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    eprintln!("SKIP: {why}");
    if let Some(log) = std::env::var_os("STEVEDORE_TEST_SKIP_LOG") {
        let clean = |s: &str| s.replace(['\t', '\n', '\r'], " ");
        let line = format!("{}\t{}\n", clean(&test), clean(why));
        std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .unwrap_or_else(|e| {
                panic!("recording the skip of {test} in {}: {e}", std::path::Path::new(&log).display())
            });
    }
}
