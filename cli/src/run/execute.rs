//! One attempt on the rung the options choose, with the live output, the terminal, the
//! progress and the signals as `run` has them.

use super::RunArgs;
use crate::common::{self, Global, RungKind};
use crate::error::CliError;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use stevedore::contract::{HookSet, Outcome, Request};
use stevedore::handlers::Handlers;
use stevedore::{LiveOutput, Stream};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// This process's stdin as the command's: read on a thread of its own (a read that blocks on
/// a terminal must never keep the process from exiting), in chunks, with the feed's
/// back-pressure; its end is the command's EOF.
fn stdin_feed() -> stevedore::StdinFeed {
    let (tx, feed) = stevedore::StdinFeed::channel(16);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut input = std::io::stdin().lock();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match input.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if tx.blocking_send(bytes::Bytes::copy_from_slice(&buf[..n])).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    crate::say::say(format!("reading stdin: {e}; the command's stdin ends here"));
                    return;
                }
            }
        }
    });
    feed
}

/// Says what the first signal does: the attempt stops as a cancellation, within its grace.
fn first_signal(name: &str, grace: Duration, quiet: bool) {
    if !quiet {
        crate::say::say(format!(
            "{name}: stopping the attempt (SIGTERM to the command, SIGKILL after the {} s grace); \
             another signal kills and removes it at once",
            grace.as_secs_f64()
        ));
    }
}

/// Says what the second signal does; the attempt is dropped (`None`: no Outcome).
fn second_signal<T>(name: &str, quiet: bool) -> Option<T> {
    if !quiet {
        crate::say::say(format!("{name} again: killing and removing the attempt now; there is no Outcome"));
    }
    None
}

/// Prints the container's streams as they come: stdout on stdout (unless `stdout_to_err`),
/// stderr on stderr. A closed stdout stops that copy, never the attempt.
fn live_printer(stdout_to_err: bool) -> (LiveOutput, tokio::task::JoinHandle<()>) {
    let (live, mut chunks) = LiveOutput::channel(1024);
    let task = tokio::spawn(async move {
        let mut stdout_open = true;
        while let Some(c) = chunks.recv().await {
            if c.stream == Stream::Stdout && !stdout_to_err {
                if stdout_open {
                    let mut out = std::io::stdout().lock();
                    stdout_open = out.write_all(&c.bytes).and_then(|()| out.flush()).is_ok();
                }
            } else {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(&c.bytes).and_then(|()| err.flush());
            }
        }
    });
    (live, task)
}

/// What [`execute`] gives: the attempt's end (`None`: dropped by a second signal), the exit
/// status a first signal asks for, the request as it ran.
pub(crate) type Executed = (Option<Result<Outcome, stevedore::LaunchError>>, Option<u8>, Request);

/// Runs `req` on the rung `a` chooses and configures, with the live output, the terminal, the
/// progress and the signals as `run` has them; `Err`: why nothing ran.
pub(crate) async fn execute(
    g: &Global,
    a: &RunArgs,
    mut req: Request,
    handlers: &Handlers,
    to_stdout: bool,
) -> Result<Executed, CliError> {
    // Installed before anything can be created, so no signal leaks a container.
    let (mut sigint, mut sigterm) = match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
        (Ok(i), Ok(t)) => (i, t),
        _ => return Err("cannot install signal handlers".into()),
    };
    let rung = common::open(g, RungKind::chosen(g, a.rung), a).await?;
    match &rung {
        common::Rung::Container(r) => own_image_for(&mut req, r.engine(), handlers, a.quiet).await?,
        common::Rung::Oci(r) => own_image_for(&mut req, r.engine(), handlers, a.quiet).await?,
        _ => {}
    }
    let rung = rung.executor();
    let printer = (!a.quiet).then(|| {
        let (live, task) = live_printer(to_stdout);
        req.live = Some(live);
        task
    });
    let mut follow = None;
    if a.tty {
        match crate::terminal::following() {
            Ok((terminal, f)) => {
                req.tty = Some(terminal);
                follow = Some(f);
            }
            Err(e) => return Err(format!("-t: cannot follow this terminal's size: {e}").into()),
        }
    }
    // Raw once the command has started (the `started` hook): until then ^C stops stevedore
    // as ever (a long pull), and every refusal is said on the terminal as it was.
    let raw = (a.tty && a.interactive).then(|| Arc::new(crate::terminal::RawSlot::default()));
    if a.interactive {
        req.stdin = Some(stdin_feed());
    }
    let bars = crate::progress::on_terminal(a.quiet);
    req.progress = bars.as_ref().map(crate::progress::Bars::sink);
    req.hooks = Some(HookSet(Arc::new(common::CliHooks {
        checkpoint: a.checkpoint.clone(),
        quiet: a.quiet,
        raw_on_start: raw.clone(),
    })));
    let cancel = CancellationToken::new();
    let mut got: Option<u8> = None;
    let outcome = {
        let fut = rung.run(&req, cancel.clone());
        tokio::pin!(fut);
        loop {
            tokio::select! {
                r = &mut fut => break Some(r),
                _ = sigint.recv() => {
                    if got.is_some() { break second_signal("SIGINT", a.quiet); }
                    got = Some(130);
                    first_signal("SIGINT", req.policy.grace(), a.quiet);
                    cancel.cancel();
                }
                _ = sigterm.recv() => {
                    if got.is_some() { break second_signal("SIGTERM", a.quiet); }
                    got = Some(143);
                    first_signal("SIGTERM", req.policy.grace(), a.quiet);
                    cancel.cancel();
                }
            }
        }
    };
    // The terminal as it was before anything more is said on it, and no bar left on it (a
    // transfer cut short never said it finished).
    if let Some(raw) = &raw {
        raw.leave();
    }
    drop(follow);
    drop(bars);
    // A second signal drops the attempt: its cleanup kills and removes the container now;
    // `close` waits for that cleanup.
    tokio::time::timeout(Duration::from_secs(60), rung.close()).await.ok();
    req.live = None;
    if let Some(p) = printer {
        let _ = tokio::time::timeout(Duration::from_secs(5), p).await;
    }
    Ok((outcome, got, req))
}

/// A handler named without an image runs in stevedore's own worker image, packed here once
/// per build.
async fn own_image_for(
    req: &mut Request,
    engine: &stevedore::engine::Engine,
    handlers: &Handlers,
    quiet: bool,
) -> Result<(), CliError> {
    if req.handler_name().is_some() && req.policy.image.is_empty() {
        let packing = crate::progress::spinner("packing stevedore's own worker image (once per build)", quiet);
        let packed = common::own_image(engine, handlers, quiet).await;
        drop(packing);
        req.policy.image = packed?;
    }
    Ok(())
}
