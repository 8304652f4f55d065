//! `stevedore run`: one attempt of a plain command or a handler, the way `docker run` users
//! expect: the container's stdout and stderr on stevedore's, the exit status of the command,
//! one line for people at the end, the Outcome JSON where `--outcome` says.

mod args;
mod execute;
mod rungs;

pub use args::RunArgs;
pub(crate) use args::{action_key, env_pair};
pub(crate) use execute::execute;

use crate::common::Global;
use crate::error::CliError;
use crate::report as human;
use args::request;
use std::io::Write;
use std::path::Path;
use stevedore::contract::Outcome;
use stevedore::handlers::Handlers;

/// Removes a stale outcome file, so that after a refusal none is there.
fn clear_outcome(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => {
            std::fs::remove_file(path).map_err(|e| format!("--outcome {}: cannot replace it: {e}", path.display()))
        }
        Ok(_) => Err(format!("--outcome {}: not a regular file", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("--outcome {}: {e}", path.display())),
    }
}

/// Writes the outcome file whole (a temporary file renamed over it).
fn write_outcome(path: &Path, json: &str) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp =
        dir.join(format!(".{}.{:08x}", path.file_name().unwrap_or_default().to_string_lossy(), rand::random::<u32>()));
    {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(json.as_bytes())?;
        f.write_all(b"\n")?;
    }
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The per-run captures go when the run ends, unless kept with `--logs`.
pub(crate) fn drop_captures(o: &mut Outcome) {
    let mut removed = false;
    for cap in [&mut o.evidence.logs.stdout, &mut o.evidence.logs.stderr] {
        if let Some(p) = cap.path.take() {
            removed |= std::fs::remove_file(&p).is_ok();
            if let Some(dir) = Path::new(&p).parent() {
                // Only when empty: another run of the same worker may still write there.
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
    if removed {
        o.evidence.notes.push("the captures were removed at the end of the run (keep them with --logs DIR)".into());
    }
}

/// Runs `stevedore run`.
pub async fn run(g: &Global, a: RunArgs, handlers: &Handlers) -> u8 {
    match attempt(g, &a, handlers).await {
        Ok(code) => code,
        Err(e) => e.said(),
    }
}

/// The options' refusals before a request is made, as `docker run` has them.
fn check(a: &RunArgs) -> Result<(), CliError> {
    if a.tty && a.handler.is_some() {
        return Err("-t: a handler speaks the protocol on its streams; a terminal is for a command".into());
    }
    if a.tty && a.interactive && !crate::terminal::stdin_is_terminal() {
        return Err("-it: the input is not a terminal (-i alone passes a pipe or a file as the command's stdin)".into());
    }
    if a.interactive && a.handler.is_some() {
        return Err("-i: a handler takes its payload (--payload), not a stdin".into());
    }
    Ok(())
}

/// The attempt, its Outcome where `--outcome` says and its line for people; the exit status.
async fn attempt(g: &Global, a: &RunArgs, handlers: &Handlers) -> Result<u8, CliError> {
    let to_stdout = a.outcome.as_deref() == Some(Path::new("-"));
    if let Some(path) = a.outcome.as_deref().filter(|_| !to_stdout) {
        clear_outcome(path)?;
    }
    check(a)?;
    let req = request(a)?;
    let (outcome, got, req) = execute(g, a, req, handlers, to_stdout).await?;
    let code = match outcome {
        Some(Ok(mut o)) => {
            if a.logs.is_none() {
                drop_captures(&mut o);
            }
            let json = o.to_json();
            if to_stdout {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{json}").and_then(|()| out.flush());
            } else if let Some(path) = &a.outcome
                && let Err(e) = write_outcome(path, &json)
            {
                crate::say::say(format!("cannot write the outcome to {}: {e}", path.display()));
            }
            if !a.quiet {
                crate::say::say(human::summary(&o, req.policy.grace(), &a.output));
            }
            if a.exit_zero { 0 } else { human::exit_code(&o) }
        }
        Some(Err(e)) => CliError::Launch(e).said(),
        None => 0,
    };
    Ok(got.unwrap_or(code))
}
