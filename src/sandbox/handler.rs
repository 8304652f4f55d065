//! The handler runner: runs one handler inside the container, as the command that
//! stevedore's init starts (`<worker binary> __stevedore_handler [control dir]`).
//!
//! It reads [`REQUEST_FILE`] and [`PAYLOAD_FILE`] from the control dir, runs the handler
//! with `/in` and `/out`, and leaves a [`HandlerRecord`] in [`HANDLER_FILE`]. The host
//! trusts none of it beyond what it bound-checks.

use crate::handlers::{Handler, HandlerContext, Handlers, cap_text, error_chain, panic_text};
use crate::protocol::{
    self, CONTROL_DIR, HANDLER_FILE, HANDLER_MARKER, HandlerRecord, HandlerRequest, HandlerResult, IN_DIR, OUT_DIR,
    PAYLOAD_FILE, REQUEST_FILE, parse_claim,
};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The runner's exit codes; the record in [`HANDLER_FILE`] says the same, and more.
pub mod exit_code {
    /// The handler returned `Ok`.
    pub const OK: i32 = 0;
    /// The handler returned an error.
    pub const HANDLER_ERROR: i32 = 1;
    /// The handler could not be started (bad request, unknown handler, fingerprint).
    pub const LAUNCH_FAILED: i32 = 2;
    /// The handler panicked.
    pub const PANICKED: i32 = 3;
}

/// The runner's entry point; returns the process exit code.
///
/// `args` is either the process's whole argv (everything up to and including
/// [`HANDLER_MARKER`] is skipped) or the arguments after the marker: at most one, the
/// control dir (default: `$STEVEDORE_CONTROL`, else [`CONTROL_DIR`]). The input and
/// output dirs are [`IN_DIR`] and [`OUT_DIR`] unless `$STEVEDORE_IN` / `$STEVEDORE_OUT`
/// say otherwise.
pub fn main(handlers: &Handlers, args: &[String]) -> i32 {
    let rest = match args.iter().position(|a| a == HANDLER_MARKER) {
        Some(i) => &args[i + 1..],
        None => args,
    };
    let dir_from =
        |var: &str, default: &str| std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
    let control = match rest {
        [] => dir_from(protocol::env::CONTROL, CONTROL_DIR),
        [dir] => PathBuf::from(dir),
        _ => {
            eprintln!("stevedore handler runner: usage: {HANDLER_MARKER} [CONTROL_DIR]");
            return exit_code::LAUNCH_FAILED;
        }
    };
    run_in(handlers, &control, &dir_from(protocol::env::IN, IN_DIR), &dir_from(protocol::env::OUT, OUT_DIR))
}

/// Runs the handler the control dir asks for, with the given input and output dirs, and
/// writes its record; returns the exit code. Cancels the handler on SIGTERM or at its
/// deadline, then waits for it (the init SIGKILLs it after the grace).
///
/// Blocks on a runtime of its own: do not call it from async code.
pub fn run_in(handlers: &Handlers, control_dir: &Path, in_dir: &Path, out_dir: &Path) -> i32 {
    run_with(handlers, control_dir, in_dir, out_dir, CancellationToken::new(), true)
}

/// What the runner found: the record's result, error text and permanence.
struct Verdict {
    result: HandlerResult,
    error: String,
    permanent: bool,
}

impl Verdict {
    fn launch_failed(error: String, permanent: bool) -> Self {
        Self { result: HandlerResult::LaunchFailed, error, permanent }
    }
}

fn run_with(
    handlers: &Handlers,
    control_dir: &Path,
    in_dir: &Path,
    out_dir: &Path,
    cancel: CancellationToken,
    on_sigterm: bool,
) -> i32 {
    let fingerprint = handlers.fingerprint();
    let verdict = match prepare(handlers, &fingerprint, control_dir, in_dir, out_dir, cancel) {
        Ok((handler, ctx)) => execute(handler, ctx, on_sigterm),
        Err(refused) => refused,
    };
    if !verdict.error.is_empty() {
        eprintln!("stevedore handler runner: {}", verdict.error);
    }
    let record = HandlerRecord {
        result: verdict.result,
        error: cap_text(&verdict.error, protocol::MAX_ERROR_TEXT),
        permanent: verdict.permanent,
        fingerprint,
    };
    if let Err(e) = write_record(control_dir, &record) {
        // Without a record the host reports the attempt as lost, which is what it is.
        eprintln!("stevedore handler runner: writing {HANDLER_FILE} failed: {e}");
    }
    match record.result {
        HandlerResult::Ok => exit_code::OK,
        HandlerResult::Error => exit_code::HANDLER_ERROR,
        HandlerResult::LaunchFailed => exit_code::LAUNCH_FAILED,
        HandlerResult::Panicked => exit_code::PANICKED,
    }
}

fn prepare(
    handlers: &Handlers,
    fingerprint: &str,
    control_dir: &Path,
    in_dir: &Path,
    out_dir: &Path,
    cancel: CancellationToken,
) -> Result<(Handler, HandlerContext), Verdict> {
    let req_path = control_dir.join(REQUEST_FILE);
    let req: HandlerRequest =
        std::fs::File::open(&req_path).map_err(protocol::ClaimError::Io).and_then(parse_claim).map_err(|e| {
            let permanent = !matches!(e, protocol::ClaimError::Io(_));
            Verdict::launch_failed(format!("reading {}: {}", req_path.display(), error_chain(&e)), permanent)
        })?;
    let payload = read_payload(&control_dir.join(PAYLOAD_FILE))?;
    if let Some(expected) = req.fingerprint.as_deref()
        && expected != fingerprint
    {
        return Err(Verdict::launch_failed(
            format!("handler set fingerprint mismatch: request expects {expected}, this worker has {fingerprint}"),
            true,
        ));
    }
    let Some(handler) = handlers.get(&req.handler).cloned() else {
        return Err(Verdict::launch_failed(format!("unknown handler {:?}", req.handler), true));
    };
    let mut inputs = std::collections::BTreeMap::new();
    for (slot, path) in &req.inputs {
        let resolved = resolve_input(in_dir, path).ok_or_else(|| {
            Verdict::launch_failed(format!("input slot {slot:?}: path {path:?} is not under {IN_DIR}"), true)
        })?;
        inputs.insert(slot.clone(), resolved);
    }
    let ctx = HandlerContext {
        job_id: req.job_id,
        attempt: req.attempt,
        payload,
        input_dir: in_dir.to_path_buf(),
        output_dir: out_dir.to_path_buf(),
        inputs,
        prior_outputs: req.prior_outputs,
        deadline: req.deadline_ms.map(|ms| Instant::now() + Duration::from_millis(ms)),
        cancel,
    };
    Ok((handler, ctx))
}

fn read_payload(path: &Path) -> Result<Vec<u8>, Verdict> {
    let max = crate::contract::MAX_PAYLOAD_BYTES;
    let mut payload = Vec::new();
    match std::fs::File::open(path) {
        // The init may skip writing an empty payload.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(payload),
        Err(e) => {
            return Err(Verdict::launch_failed(format!("reading {}: {e}", path.display()), false));
        }
        Ok(f) => {
            payload = protocol::read_capped(f, max as u64)
                .map_err(|e| Verdict::launch_failed(format!("reading {}: {e}", path.display()), false))?;
        }
    }
    if payload.len() > max {
        return Err(Verdict::launch_failed(format!("payload exceeds the {max}-byte limit"), true));
    }
    Ok(payload)
}

/// `path` (absolute under [`IN_DIR`], or relative to it) under `in_dir`; `None` when it
/// would leave it.
fn resolve_input(in_dir: &Path, path: &str) -> Option<PathBuf> {
    let path = Path::new(path);
    let rel = if path.is_absolute() { path.strip_prefix(IN_DIR).ok()? } else { path };
    rel.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir)).then(|| in_dir.join(rel))
}

fn execute(handler: Handler, ctx: HandlerContext, on_sigterm: bool) -> Verdict {
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return Verdict::launch_failed(format!("starting the runtime: {e}"), false),
    };
    let handler_cancel = ctx.cancel.clone();
    let deadline = ctx.deadline;
    let joined = rt.block_on(async move {
        let mut sigterm = if on_sigterm {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .inspect_err(|e| eprintln!("stevedore handler runner: cannot listen for SIGTERM: {e}"))
                .ok()
        } else {
            None
        };
        // Called inside the task, so that a handler panicking before its first await is
        // caught like any other panic.
        let mut task = tokio::spawn(async move { handler(ctx).await });
        let at_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(at_deadline);
        loop {
            // After cancelling, keep waiting: the handler may still write its outputs and
            // return, and the init enforces the grace period.
            let armed = !handler_cancel.is_cancelled();
            tokio::select! {
                biased;
                joined = &mut task => break joined,
                () = &mut at_deadline, if armed => handler_cancel.cancel(),
                () = sigterm_received(&mut sigterm), if armed => handler_cancel.cancel(),
            }
        }
    });
    // Blocking tasks a handler left behind must not hold up the record or the exit.
    rt.shutdown_background();
    match joined {
        Ok(Ok(())) => Verdict { result: HandlerResult::Ok, error: String::new(), permanent: false },
        Ok(Err(e)) => Verdict { result: HandlerResult::Error, error: error_chain(&e), permanent: e.permanent },
        Err(e) if e.is_panic() => {
            Verdict { result: HandlerResult::Panicked, error: panic_text(&*e.into_panic()), permanent: false }
        }
        Err(e) => Verdict { result: HandlerResult::Error, error: format!("handler task ended: {e}"), permanent: false },
    }
}

async fn sigterm_received(sig: &mut Option<tokio::signal::unix::Signal>) {
    match sig {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

fn write_record(control_dir: &Path, record: &HandlerRecord) -> io::Result<()> {
    let json = serde_json::to_vec(record).map_err(io::Error::other)?;
    super::atomic::write_atomic(control_dir, HANDLER_FILE, &json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handlers::{HandlerError, builtin};
    use std::collections::BTreeMap;

    struct Area {
        _t: tempfile::TempDir,
        control: PathBuf,
        input: PathBuf,
        output: PathBuf,
    }

    fn area() -> Area {
        let t = tempfile::tempdir().unwrap();
        let [control, input, output] = ["control", "in", "out"].map(|d| t.path().join(d));
        for d in [&control, &input, &output] {
            std::fs::create_dir(d).unwrap();
        }
        Area { _t: t, control, input, output }
    }

    fn request(handler: &str) -> HandlerRequest {
        HandlerRequest {
            handler: handler.into(),
            fingerprint: None,
            job_id: "job-1".into(),
            attempt: 1,
            inputs: BTreeMap::new(),
            prior_outputs: Vec::new(),
            deadline_ms: None,
        }
    }

    fn stage(a: &Area, req: &HandlerRequest, payload: &[u8]) {
        std::fs::write(a.control.join(REQUEST_FILE), serde_json::to_vec(req).unwrap()).unwrap();
        std::fs::write(a.control.join(PAYLOAD_FILE), payload).unwrap();
    }

    fn record(a: &Area) -> HandlerRecord {
        parse_claim(std::fs::File::open(a.control.join(HANDLER_FILE)).unwrap()).unwrap()
    }

    fn run(h: &Handlers, a: &Area) -> i32 {
        run_in(h, &a.control, &a.input, &a.output)
    }

    #[test]
    fn ok_writes_outputs_and_record() {
        let a = area();
        stage(&a, &request("echo"), b"hi there");
        let h = builtin();
        assert_eq!(run(&h, &a), exit_code::OK);
        assert_eq!(std::fs::read(a.output.join("payload")).unwrap(), b"hi there");
        let r = record(&a);
        assert_eq!((r.result, r.error.as_str(), r.permanent), (HandlerResult::Ok, "", false));
        assert_eq!(r.fingerprint, h.fingerprint());
        let left: Vec<_> = std::fs::read_dir(&a.control).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 3, "no temporary file left behind: {left:?}");
    }

    #[test]
    fn handler_errors() {
        let a = area();
        stage(&a, &request("fail"), b"bad input");
        assert_eq!(run(&builtin(), &a), exit_code::HANDLER_ERROR);
        let r = record(&a);
        assert_eq!((r.result, r.error.as_str(), r.permanent), (HandlerResult::Error, "bad input", false));

        let a = area();
        stage(&a, &request("fail-permanent"), b"");
        assert_eq!(run(&builtin(), &a), exit_code::HANDLER_ERROR);
        assert!(record(&a).permanent);
    }

    #[test]
    fn error_text_is_capped() {
        let a = area();
        stage(&a, &request("fail"), "x".repeat(protocol::MAX_ERROR_TEXT * 2).as_bytes());
        assert_eq!(run(&builtin(), &a), exit_code::HANDLER_ERROR);
        assert!(record(&a).error.len() <= protocol::MAX_ERROR_TEXT);
    }

    #[test]
    fn panic_is_recorded() {
        let a = area();
        stage(&a, &request("panic"), b"oh no");
        assert_eq!(run(&builtin(), &a), exit_code::PANICKED);
        let r = record(&a);
        assert_eq!(r.result, HandlerResult::Panicked);
        assert!(r.error.contains("oh no"), "{}", r.error);
    }

    #[test]
    fn unknown_handler_is_permanent_launch_failure() {
        let a = area();
        stage(&a, &request("nope"), b"");
        assert_eq!(run(&builtin(), &a), exit_code::LAUNCH_FAILED);
        let r = record(&a);
        assert_eq!((r.result, r.permanent), (HandlerResult::LaunchFailed, true));
        assert!(r.error.contains("unknown handler"), "{}", r.error);
    }

    #[test]
    fn fingerprint_mismatch_names_both_values() {
        let a = area();
        let h = builtin();
        stage(&a, &HandlerRequest { fingerprint: Some("sha256:feed".into()), ..request("true") }, b"");
        assert_eq!(run(&h, &a), exit_code::LAUNCH_FAILED);
        let r = record(&a);
        assert_eq!((r.result, r.permanent), (HandlerResult::LaunchFailed, true));
        assert!(r.error.contains("sha256:feed") && r.error.contains(&h.fingerprint()), "{}", r.error);

        let a = area();
        stage(&a, &HandlerRequest { fingerprint: Some(h.fingerprint()), ..request("true") }, b"");
        assert_eq!(run(&h, &a), exit_code::OK);
    }

    #[test]
    fn request_is_read_strictly() {
        let a = area();
        let mut v = serde_json::to_value(request("true")).unwrap();
        v["extra"] = serde_json::json!(1);
        std::fs::write(a.control.join(REQUEST_FILE), v.to_string()).unwrap();
        assert_eq!(run(&builtin(), &a), exit_code::LAUNCH_FAILED);
        let r = record(&a);
        assert_eq!((r.result, r.permanent), (HandlerResult::LaunchFailed, true));

        let a = area();
        std::fs::write(a.control.join(REQUEST_FILE), vec![b' '; protocol::MAX_RECORD_BYTES as usize + 1]).unwrap();
        assert_eq!(run(&builtin(), &a), exit_code::LAUNCH_FAILED);
        assert!(record(&a).error.contains("larger than"));

        let a = area();
        assert_eq!(run(&builtin(), &a), exit_code::LAUNCH_FAILED, "no request at all");
        assert!(!record(&a).permanent);
    }

    #[test]
    fn missing_payload_is_empty() {
        let a = area();
        std::fs::write(a.control.join(REQUEST_FILE), serde_json::to_vec(&request("echo")).unwrap()).unwrap();
        assert_eq!(run(&builtin(), &a), exit_code::OK);
        assert_eq!(std::fs::read(a.output.join("payload")).unwrap(), b"");
    }

    #[test]
    fn inputs_resolve_under_the_input_dir() {
        let a = area();
        std::fs::write(a.input.join("x.txt"), b"xx").unwrap();
        std::fs::create_dir(a.input.join("sub")).unwrap();
        std::fs::write(a.input.join("sub/in.txt"), b"copied").unwrap();
        let inputs = BTreeMap::from([("in".to_owned(), "/in/sub/in.txt".to_owned()), ("x".into(), "x.txt".into())]);
        stage(&a, &HandlerRequest { inputs: inputs.clone(), ..request("cat-input") }, b"");
        assert_eq!(run(&builtin(), &a), exit_code::OK, "{:?}", record(&a).error);
        assert_eq!(std::fs::read(a.output.join("copy")).unwrap(), b"copied");

        for bad in ["/etc/passwd", "../x.txt", "/in/../etc"] {
            let a = area();
            let inputs = BTreeMap::from([("in".to_owned(), bad.to_owned())]);
            stage(&a, &HandlerRequest { inputs, ..request("cat-input") }, b"");
            assert_eq!(run(&builtin(), &a), exit_code::LAUNCH_FAILED, "{bad}");
            assert_eq!(record(&a).result, HandlerResult::LaunchFailed);
        }
    }

    #[test]
    fn deadline_cancels_the_handler() {
        let a = area();
        stage(&a, &HandlerRequest { deadline_ms: Some(50), ..request("sleep") }, b"60000");
        let start = Instant::now();
        assert_eq!(run(&builtin(), &a), exit_code::HANDLER_ERROR);
        assert!(start.elapsed() < Duration::from_secs(10));
        assert_eq!(record(&a).error, "cancelled");
    }

    #[test]
    fn cancellation_reaches_the_handler() {
        let a = area();
        stage(&a, &request("sleep"), b"60000");
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert_eq!(run_with(&builtin(), &a.control, &a.input, &a.output, cancel, false), exit_code::HANDLER_ERROR);
        assert_eq!(record(&a).error, "cancelled");
    }

    #[test]
    fn error_sources_are_kept_as_text() {
        let a = area();
        stage(&a, &request("io"), b"");
        let h = Handlers::new()
            .register("io", |_| async { Err(HandlerError::new("saving").with_source(io::Error::other("disk full"))) });
        assert_eq!(run(&h, &a), exit_code::HANDLER_ERROR);
        assert_eq!(record(&a).error, "saving: disk full");
    }

    #[test]
    fn main_takes_the_control_dir_after_the_marker() {
        let a = area();
        stage(&a, &request("no-such-handler"), b"");
        let control = a.control.to_string_lossy().into_owned();
        let argv = ["/tools/ld.so", "/tools/stevedore", HANDLER_MARKER, &control].map(String::from);
        assert_eq!(main(&builtin(), &argv), exit_code::LAUNCH_FAILED);
        assert!(record(&a).error.contains("no-such-handler"));
        assert_eq!(main(&builtin(), &[HANDLER_MARKER.into(), "a".into(), "b".into()]), exit_code::LAUNCH_FAILED);
    }
}
