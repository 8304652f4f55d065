//! The handler runner: runs one handler inside the sandbox, as the command stevedore's init
//! starts (`<worker binary> __stevedore_handler`). It talks to the init over the socket the
//! init gave it as stdin: hello (its handler set's fingerprint) up, the request and the
//! payload down, the record up. The host trusts none of it beyond what it checks.

use crate::handlers::{Handler, HandlerContext, Handlers, cap_text, error_chain, panic_text};
use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};
use stevedore_init::wire::{
    self, Decoder, HandlerHello, HandlerRecord, HandlerRequest, HandlerResult, IN_DIR, Kind, LaunchFailure, OUT_DIR,
};
use tokio_util::sync::CancellationToken;

/// The runner's exit codes; the record says the same, and more.
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

/// The runner's entry point (from `sandbox::main_hook`); returns the process exit code.
/// The input and output dirs are [`IN_DIR`] and [`OUT_DIR`] unless `$STEVEDORE_IN` /
/// `$STEVEDORE_OUT` say otherwise.
pub fn main(handlers: &Handlers) -> i32 {
    if std::env::var(wire::env::HANDLER_FD).as_deref() != Ok("0") {
        eprintln!(
            "stevedore handler runner: started without the init's socket ({} is not set): the runner \
             only runs under stevedore's init",
            wire::env::HANDLER_FD
        );
        return exit_code::LAUNCH_FAILED;
    }
    let socket = match take_stdin() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("stevedore handler runner: cannot take the init's socket: {e}");
            return exit_code::LAUNCH_FAILED;
        }
    };
    let dir = |var: &str, default: &str| std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
    let (input, output) = (dir(wire::env::IN, IN_DIR), dir(wire::env::OUT, OUT_DIR));
    run_on(handlers, File::from(socket), &input, &output, CancellationToken::new(), true)
}

/// Moves the socket off fd 0 (close-on-exec, so the handler's own children never inherit
/// it) and puts `/dev/null` in its place.
fn take_stdin() -> io::Result<OwnedFd> {
    let socket = nix::unistd::dup(io::stdin().as_fd())?;
    fcntl(socket.as_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    let null = nix::fcntl::open("/dev/null", OFlag::O_RDONLY | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())?;
    nix::unistd::dup2_stdin(null)?;
    Ok(socket)
}

/// What the runner found: the record's result, error text, permanence and launch failure.
struct Verdict {
    result: HandlerResult,
    error: String,
    permanent: bool,
    launch: Option<LaunchFailure>,
}

impl Verdict {
    fn launch_failed(error: String, permanent: bool, why: LaunchFailure) -> Self {
        Self { result: HandlerResult::LaunchFailed, error, permanent, launch: Some(why) }
    }
}

fn send(socket: &mut File, kind: Kind, body: &[u8]) -> io::Result<()> {
    socket.write_all(&wire::encode(kind, body))
}

/// Reads the request and the payload from the init.
fn receive(socket: &mut File) -> Result<(HandlerRequest, Vec<u8>), String> {
    let mut d = Decoder::new(|k| matches!(k, Kind::HandlerRequest | Kind::HandlerPayload));
    let mut request = None;
    let mut payload = None;
    let mut buf = vec![0u8; 64 << 10];
    while request.is_none() || payload.is_none() {
        match d.next_frame() {
            Ok(Some(f)) if f.kind == Kind::HandlerRequest => {
                request = Some(
                    wire::parse_claim::<HandlerRequest>(&f.body, Kind::HandlerRequest.max_body())
                        .map_err(|e| e.to_string())?,
                );
            }
            Ok(Some(f)) => payload = Some(f.body),
            Ok(None) => match socket.read(&mut buf) {
                Ok(0) => return Err("the init closed the socket before sending the request".into()),
                Ok(n) => d.feed(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading the request: {e}")),
            },
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok((request.expect("looped until set"), payload.expect("looped until set")))
}

/// Runs the handler the init asks for over `socket`, with the given input and output dirs,
/// and sends its record; returns the exit code. Cancels the handler on SIGTERM (when
/// `on_sigterm`) or at its deadline, then waits for it (the init SIGKILLs it after the
/// grace). Blocks on a runtime of its own: do not call it from async code.
fn run_on(
    handlers: &Handlers,
    mut socket: File,
    in_dir: &Path,
    out_dir: &Path,
    cancel: CancellationToken,
    on_sigterm: bool,
) -> i32 {
    let fingerprint = handlers.fingerprint();
    let hello = HandlerHello { protocol: wire::PROTOCOL, fingerprint: fingerprint.clone() };
    if let Err(e) = send(&mut socket, Kind::HandlerHello, &serde_json::to_vec(&hello).expect("serialises")) {
        eprintln!("stevedore handler runner: cannot talk to the init: {e}");
        return exit_code::LAUNCH_FAILED;
    }
    let verdict = match receive(&mut socket) {
        Err(why) => Verdict::launch_failed(format!("reading the request: {why}"), true, LaunchFailure::BadRequest),
        Ok((req, payload)) => match prepare(handlers, &fingerprint, req, payload, in_dir, out_dir, cancel) {
            Ok((handler, ctx)) => execute(handler, ctx, on_sigterm),
            Err(refused) => refused,
        },
    };
    if !verdict.error.is_empty() {
        eprintln!("stevedore handler runner: {}", stevedore_init::wire::printable(&verdict.error));
    }
    let record = HandlerRecord {
        result: verdict.result,
        error: cap_text(&verdict.error, wire::MAX_ERROR_TEXT),
        permanent: verdict.permanent,
        fingerprint,
        launch: verdict.launch,
    };
    if let Err(e) = send(&mut socket, Kind::HandlerRecord, &serde_json::to_vec(&record).expect("serialises")) {
        // Without a record the host reports the attempt as lost, which is what it is.
        eprintln!("stevedore handler runner: sending the record failed: {e}");
    }
    match record.result {
        HandlerResult::Ok => exit_code::OK,
        HandlerResult::Error => exit_code::HANDLER_ERROR,
        HandlerResult::LaunchFailed => exit_code::LAUNCH_FAILED,
        HandlerResult::Panicked => exit_code::PANICKED,
    }
}

/// The handler and its context, or why it cannot start. The checks are the ones every rung
/// makes (`handlers::check`), so the rungs agree on every launch case.
fn prepare(
    handlers: &Handlers,
    fingerprint: &str,
    req: HandlerRequest,
    payload: Vec<u8>,
    in_dir: &Path,
    out_dir: &Path,
    cancel: CancellationToken,
) -> Result<(Handler, HandlerContext), Verdict> {
    let handler = crate::handlers::check(handlers, fingerprint, &req.handler, req.fingerprint.as_deref())
        .map_err(|(why, text)| Verdict::launch_failed(text, true, why))?;
    let mut inputs = std::collections::BTreeMap::new();
    for (slot, path) in &req.inputs {
        let resolved = resolve_input(in_dir, path).ok_or_else(|| {
            Verdict::launch_failed(
                format!("input slot {slot:?}: path {path:?} is not under {IN_DIR}"),
                true,
                LaunchFailure::BadRequest,
            )
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
        prior_outputs: req.prior_outputs.into_iter().map(crate::link::convert::prior_in).collect(),
        deadline: req.deadline_ms.map(|ms| Instant::now() + Duration::from_millis(ms)),
        cancel,
        // The init's report socket, which this process inherited (fd 3).
        reporter: match stevedore_init::report::socket_from_env() {
            Ok(fd) => crate::handlers::Reporter::new(move |r| {
                stevedore_init::report::send_on(fd, &crate::link::convert::report_out(r)).is_ok()
            }),
            Err(_) => crate::handlers::Reporter::none(),
        },
    };
    Ok((handler, ctx))
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
        Err(e) => {
            return Verdict {
                result: HandlerResult::Error,
                error: format!("starting the runtime: {e}"),
                permanent: false,
                launch: None,
            };
        }
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
    let verdict = |result, error, permanent| Verdict { result, error, permanent, launch: None };
    match joined {
        Ok(Ok(())) => verdict(HandlerResult::Ok, String::new(), false),
        Ok(Err(e)) => verdict(HandlerResult::Error, error_chain(&e), e.permanent),
        Err(e) if e.is_panic() => verdict(HandlerResult::Panicked, panic_text(&*e.into_panic()), false),
        Err(e) => verdict(HandlerResult::Error, format!("handler task ended: {e}"), false),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handlers::{HandlerError, builtin};
    use std::collections::BTreeMap;
    use std::os::unix::net::UnixStream;

    struct Area {
        _t: tempfile::TempDir,
        input: PathBuf,
        output: PathBuf,
    }

    fn area() -> Area {
        let t = tempfile::tempdir().unwrap();
        let [input, output] = ["in", "out"].map(|d| t.path().join(d));
        for d in [&input, &output] {
            std::fs::create_dir(d).unwrap();
        }
        Area { _t: t, input, output }
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

    /// Plays the init: sends `req` and `payload`, runs the runner, reads hello and record.
    fn run_with(
        h: &Handlers,
        a: &Area,
        req: &HandlerRequest,
        payload: &[u8],
        cancel: CancellationToken,
    ) -> (i32, HandlerHello, HandlerRecord) {
        let (init, runner) = UnixStream::pair().unwrap();
        let mut init = init;
        init.write_all(&wire::encode(Kind::HandlerRequest, &serde_json::to_vec(req).unwrap())).unwrap();
        init.write_all(&wire::encode(Kind::HandlerPayload, payload)).unwrap();
        let code = run_on(h, File::from(OwnedFd::from(runner)), &a.input, &a.output, cancel, false);
        let mut d = Decoder::new(|k| matches!(k, Kind::HandlerHello | Kind::HandlerRecord));
        let mut bytes = Vec::new();
        init.shutdown(std::net::Shutdown::Write).unwrap();
        init.read_to_end(&mut bytes).unwrap();
        d.feed(&bytes);
        let hello: HandlerHello = serde_json::from_slice(&d.next_frame().unwrap().unwrap().body).unwrap();
        let record: HandlerRecord = serde_json::from_slice(&d.next_frame().unwrap().unwrap().body).unwrap();
        (code, hello, record)
    }

    fn run(h: &Handlers, a: &Area, req: &HandlerRequest, payload: &[u8]) -> (i32, HandlerRecord) {
        let (code, hello, record) = run_with(h, a, req, payload, CancellationToken::new());
        assert_eq!(hello.fingerprint, h.fingerprint());
        (code, record)
    }

    #[test]
    fn ok_writes_outputs_and_record() {
        let a = area();
        let h = builtin();
        let (code, r) = run(&h, &a, &request("echo"), b"hi there");
        assert_eq!(code, exit_code::OK);
        assert_eq!(std::fs::read(a.output.join("payload")).unwrap(), b"hi there");
        assert_eq!((r.result, r.error.as_str(), r.permanent), (HandlerResult::Ok, "", false));
        assert_eq!(r.fingerprint, h.fingerprint());
    }

    #[test]
    fn handler_errors_and_panics() {
        let a = area();
        let (code, r) = run(&builtin(), &a, &request("fail"), b"bad input");
        assert_eq!(code, exit_code::HANDLER_ERROR);
        assert_eq!((r.result, r.error.as_str(), r.permanent), (HandlerResult::Error, "bad input", false));
        let (_, r) = run(&builtin(), &a, &request("fail-permanent"), b"");
        assert!(r.permanent);
        let (code, r) = run(&builtin(), &a, &request("fail"), "x".repeat(wire::MAX_ERROR_TEXT * 2).as_bytes());
        assert_eq!(code, exit_code::HANDLER_ERROR);
        assert!(r.error.len() <= wire::MAX_ERROR_TEXT);
        let (code, r) = run(&builtin(), &a, &request("panic"), b"oh no");
        assert_eq!((code, r.result), (exit_code::PANICKED, HandlerResult::Panicked));
        assert!(r.error.contains("oh no"), "{}", r.error);
    }

    #[test]
    fn launch_failures_are_permanent_and_named() {
        let a = area();
        let h = builtin();
        let (code, r) = run(&h, &a, &request("nope"), b"");
        assert_eq!(code, exit_code::LAUNCH_FAILED);
        assert_eq!(
            (r.result, r.permanent, r.launch),
            (HandlerResult::LaunchFailed, true, Some(LaunchFailure::UnknownHandler))
        );
        assert!(r.error.contains("unknown handler"), "{}", r.error);
        let req = HandlerRequest { fingerprint: Some("sha256:feed".into()), ..request("true") };
        let (_, r) = run(&h, &a, &req, b"");
        assert_eq!(r.launch, Some(LaunchFailure::FingerprintMismatch));
        assert!(r.error.contains("sha256:feed") && r.error.contains(&h.fingerprint()), "{}", r.error);
        let req = HandlerRequest { fingerprint: Some(h.fingerprint()), ..request("true") };
        assert_eq!(run(&h, &a, &req, b"").0, exit_code::OK);
    }

    #[test]
    fn inputs_resolve_under_the_input_dir() {
        let a = area();
        std::fs::create_dir(a.input.join("sub")).unwrap();
        std::fs::write(a.input.join("sub/in.txt"), b"copied").unwrap();
        let inputs = BTreeMap::from([("in".to_owned(), "/in/sub/in.txt".to_owned())]);
        let (code, r) = run(&builtin(), &a, &HandlerRequest { inputs, ..request("cat-input") }, b"");
        assert_eq!(code, exit_code::OK, "{:?}", r.error);
        assert_eq!(std::fs::read(a.output.join("copy")).unwrap(), b"copied");
        for bad in ["/etc/passwd", "../x.txt", "/in/../etc"] {
            let inputs = BTreeMap::from([("in".to_owned(), bad.to_owned())]);
            let (code, r) = run(&builtin(), &a, &HandlerRequest { inputs, ..request("cat-input") }, b"");
            assert_eq!((code, r.launch), (exit_code::LAUNCH_FAILED, Some(LaunchFailure::BadRequest)), "{bad}");
        }
    }

    #[test]
    fn deadline_and_cancellation_reach_the_handler() {
        let a = area();
        let start = Instant::now();
        let (code, r) = run(&builtin(), &a, &HandlerRequest { deadline_ms: Some(50), ..request("sleep") }, b"60000");
        assert_eq!((code, r.error.as_str()), (exit_code::HANDLER_ERROR, "cancelled"));
        assert!(start.elapsed() < Duration::from_secs(10));
        let cancel = CancellationToken::new();
        cancel.cancel();
        let (code, _, r) = run_with(&builtin(), &a, &request("sleep"), b"60000", cancel);
        assert_eq!((code, r.error.as_str()), (exit_code::HANDLER_ERROR, "cancelled"));
    }

    #[test]
    fn error_sources_are_kept_as_text() {
        let a = area();
        let h = Handlers::new()
            .register("io", |_| async { Err(HandlerError::new("saving").with_source(io::Error::other("disk full"))) });
        let (_, r) = run(&h, &a, &request("io"), b"");
        assert_eq!(r.error, "saving: disk full");
    }

    #[test]
    fn a_request_that_is_not_one_is_a_bad_request() {
        let a = area();
        let (init, runner) = UnixStream::pair().unwrap();
        let mut init = init;
        init.write_all(&wire::encode(Kind::HandlerRequest, b"{\"handler\":1}")).unwrap();
        let code =
            run_on(&builtin(), File::from(OwnedFd::from(runner)), &a.input, &a.output, CancellationToken::new(), false);
        assert_eq!(code, exit_code::LAUNCH_FAILED);
    }
}
