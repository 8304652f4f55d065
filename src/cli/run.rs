//! `stevedore run`: one attempt of a plain command or a handler.

use super::common::{self, Global};
use crate::contract::{Executor, Policy, Request, ResourceLimits, limits::key, parse_cpus, parse_duration, parse_size};
use crate::handlers::Handlers;
use crate::link::LiveOutput;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

const RUN_AFTER_HELP: &str = "\
Prints the Outcome as ONE JSON object on stdout; the container's output goes live to stderr.

Exit status:
  0        the attempt ran, whatever its status (with --exit-status: its exit code, or 128+signal)
  125      refused, launch error or bad options (message on stderr; nothing is left in the engine)
  130/143  cancelled by SIGINT/SIGTERM (SIGTERM, grace, SIGKILL; a second signal removes it at once)

Examples:
  stevedore run --image stevedore-test/busybox:latest --input ./in --output ./out \\
      --memory 256m --cpus 0.5 --timeout 30s -- sh -c 'wc -c /in/* > /out/sizes.txt'
  stevedore run --handler echo --payload hello --output ./out
  stevedore --config profiles.toml --profile dev run -e K=V --image IMG --output ./out -- env";

/// Arguments of `stevedore run`.
#[derive(Debug, clap::Args)]
#[command(
    override_usage = "stevedore run [OPTIONS] --output DIR -- ARGV...\n       stevedore run [OPTIONS] --output DIR --handler NAME [--payload STR]",
    after_help = RUN_AFTER_HELP
)]
pub struct RunArgs {
    /// Image to run in (default for handlers: stevedore's own worker image)
    #[arg(long, value_name = "IMAGE", help_heading = "Attempt")]
    image: Option<String>,
    /// Worker ID (default: a unique one, shown on stderr)
    #[arg(long, value_name = "ID", help_heading = "Attempt")]
    worker: Option<String>,
    /// Job ID (default: a unique one)
    #[arg(long, value_name = "ID", help_heading = "Attempt")]
    job: Option<String>,
    /// Attempt number
    #[arg(long, default_value_t = 1, value_name = "N", help_heading = "Attempt")]
    attempt: u32,
    /// Directory mounted read-only at /in
    #[arg(long, value_name = "DIR", help_heading = "Files")]
    input: Option<PathBuf>,
    /// Named input slot NAME=RELATIVE_PATH (repeatable)
    #[arg(long = "slot", value_name = "NAME=PATH", help_heading = "Files")]
    slots: Vec<String>,
    /// Empty directory that receives /out
    #[arg(long, value_name = "DIR", help_heading = "Files")]
    output: PathBuf,
    /// Memory limit (e.g. 64m, 1g)
    #[arg(long, value_name = "SIZE", help_heading = "Limits (narrowed to the profile's ceilings)")]
    memory: Option<String>,
    /// CPU limit in cores (e.g. 0.5)
    #[arg(long, value_name = "N", help_heading = "Limits (narrowed to the profile's ceilings)")]
    cpus: Option<String>,
    /// Process limit
    #[arg(long, value_name = "N", help_heading = "Limits (narrowed to the profile's ceilings)")]
    pids: Option<u64>,
    /// Disk limit for /out (e.g. 50m)
    #[arg(long, value_name = "SIZE", help_heading = "Limits (narrowed to the profile's ceilings)")]
    disk: Option<String>,
    /// Deadline from now (e.g. 10s, 500ms, 2m)
    #[arg(long, value_name = "DUR", help_heading = "Limits (narrowed to the profile's ceilings)")]
    timeout: Option<String>,
    /// Time between SIGTERM and SIGKILL (default 30s)
    #[arg(long, value_name = "DUR", help_heading = "Limits (narrowed to the profile's ceilings)")]
    grace: Option<String>,
    /// Set an environment variable (repeatable; above the image's and the profile's)
    #[arg(long = "env", short = 'e', value_name = "K=V", help_heading = "Attempt")]
    env: Vec<String>,
    /// Which rung runs the attempt: container (default) or process (a child process under a
    /// dedicated uid when run as root; see `stevedore::process`)
    #[arg(long, value_name = "RUNG", default_value = "container", value_parser = ["container", "process"], help_heading = "Attempt")]
    rung: String,
    /// Network mode (default: the profile's, else none; only modes the profile allows)
    #[arg(long, value_name = "MODE", help_heading = "Attempt")]
    network: Option<String>,
    /// Do not stream the container's output to stderr
    #[arg(long, short = 'q', help_heading = "Output")]
    quiet: bool,
    /// Exit with the attempt's exit code (or 128+signal) instead of 0
    #[arg(long, help_heading = "Output")]
    exit_status: bool,
    /// Write the attempt's checkpoint to FILE (0600, new) before its command starts, so that
    /// `stevedore recover FILE` can finish it if this process dies
    #[arg(long, value_name = "FILE", help_heading = "Recovery")]
    checkpoint: Option<PathBuf>,
    /// How long the attempt keeps running after this process is gone, waiting for
    /// `stevedore recover` (default 0: it is stopped at once)
    #[arg(long, value_name = "DUR", help_heading = "Recovery")]
    host_loss_grace: Option<String>,
    /// Run this handler of the worker image instead of a command
    #[arg(long, value_name = "NAME", conflicts_with = "argv", help_heading = "Handler")]
    handler: Option<String>,
    /// Payload for the handler
    #[arg(long, value_name = "STR", conflicts_with = "payload_file", help_heading = "Handler")]
    payload: Option<String>,
    /// Payload for the handler, from a file
    #[arg(long, value_name = "FILE", help_heading = "Handler")]
    payload_file: Option<PathBuf>,
    /// Expected handler-set fingerprint
    #[arg(long, value_name = "FP", help_heading = "Handler")]
    fingerprint: Option<String>,
    /// The command to run
    #[arg(last = true, value_name = "ARGV")]
    argv: Vec<std::ffi::OsString>,
}

/// A refusal: nothing was created (exit 125, as `docker run`).
fn fail(msg: impl std::fmt::Display) -> u8 {
    eprintln!("stevedore: {msg}");
    125
}

fn request(a: &RunArgs) -> Result<Request, String> {
    let job = a.job.clone().unwrap_or_else(|| format!("run-{:08x}", rand::random::<u32>()));
    let argv = a
        .argv
        .iter()
        .enumerate()
        .map(|(i, arg)| {
            arg.to_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("argument {i} of the command ({}) is not valid UTF-8", arg.to_string_lossy()))
        })
        .collect::<Result<Vec<String>, String>>()?;
    let mut req = match (&a.handler, argv.is_empty()) {
        (Some(h), true) => Request::handler(job, h.clone(), a.output.clone()),
        (None, false) => Request::command(job, argv, a.output.clone()),
        (Some(_), false) => return Err("give either --handler or a command after --, not both".into()),
        (None, true) => return Err("nothing to run: give a command after -- or --handler NAME".into()),
    };
    req.attempt = a.attempt;
    req.worker_id = a.worker.clone().unwrap_or_else(common::mint_worker);
    if let Some(p) = &a.payload {
        req.payload = p.clone().into_bytes();
    }
    if let Some(f) = &a.payload_file {
        req.payload = std::fs::read(f).map_err(|e| format!("cannot read payload file {}: {e}", f.display()))?;
    }
    req.input_dir = a.input.clone();
    for s in &a.slots {
        let (k, v) = s.split_once('=').ok_or_else(|| format!("invalid --slot {s:?}: expected NAME=PATH"))?;
        req.inputs.insert(k.to_owned(), PathBuf::from(v));
    }
    let mut limits = ResourceLimits::new();
    if let Some(m) = &a.memory {
        limits = limits.with(key::MEMORY, parse_size(m).map_err(|e| format!("--memory: {e}"))?);
    }
    if let Some(c) = &a.cpus {
        limits = limits.with(key::CPU, parse_cpus(c).map_err(|e| format!("--cpus: {e}"))?);
    }
    if let Some(p) = a.pids {
        limits = limits.with(key::PIDS, p);
    }
    if let Some(d) = &a.disk {
        limits = limits.with(key::DISK, parse_size(d).map_err(|e| format!("--disk: {e}"))?);
    }
    req.limits = limits;
    let mut policy = Policy::default();
    if let Some(g) = &a.grace {
        policy = policy.with_grace(parse_duration(g).map_err(|e| format!("--grace: {e}"))?);
    }
    if let Some(img) = &a.image {
        policy.image = img.clone();
    }
    req.policy = policy;
    if let Some(t) = &a.timeout {
        req = req.timeout(parse_duration(t).map_err(|e| format!("--timeout: {e}"))?);
    }
    for kv in &a.env {
        let (k, v) = kv.split_once('=').ok_or_else(|| format!("invalid --env {kv:?}: expected K=V"))?;
        req.env.insert(k.to_owned(), v.to_owned());
    }
    req.fingerprint = a.fingerprint.clone();
    req.validate().map_err(|e| format!("invalid request: {e}"))?;
    Ok(req)
}

/// Runs `stevedore run`.
pub async fn run(g: &Global, a: RunArgs, handlers: &Handlers) -> u8 {
    let req = match request(&a) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    // Install signal handlers before anything can be created, so no signal leaks a container.
    let (mut sigint, mut sigterm) = match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
        (Ok(i), Ok(t)) => (i, t),
        _ => return fail("cannot install signal handlers"),
    };
    let adjust = |cfg: &mut crate::container::ContainerConfig| {
        if let Some(n) = &a.network {
            common::choose_network(cfg, n)?;
        }
        if let Some(g) = &a.host_loss_grace {
            cfg.host_loss.grace = parse_duration(g).map_err(|e| format!("--host-loss-grace: {e}"))?;
        }
        Ok(())
    };
    let mut req = req;
    let rung: std::sync::Arc<dyn Executor> = if a.rung == "process" {
        let mut cfg = crate::process::ProcessConfig::default();
        if let Some(grace) = &a.host_loss_grace {
            match parse_duration(grace) {
                Ok(d) => cfg.host_loss.grace = d,
                Err(e) => return fail(format!("--host-loss-grace: {e}")),
            }
        }
        match crate::process::ProcessExecutor::new(cfg) {
            Ok(r) => std::sync::Arc::new(r),
            Err(e) => return fail(e),
        }
    } else {
        let rung = match common::rung(g, 125, adjust).await {
            Ok(r) => r,
            Err(code) => return code,
        };
        if req.handler_name().is_some() && req.policy.image.is_empty() {
            match common::own_image(&rung, handlers).await {
                Ok(tag) => req.policy.image = tag,
                Err(e) => return fail(e),
            }
        }
        std::sync::Arc::new(rung)
    };
    if a.worker.is_none() {
        eprintln!("stevedore: worker {}", req.worker_id);
    }
    req.hooks = Some(crate::contract::HookSet(std::sync::Arc::new(common::CliHooks {
        checkpoint: a.checkpoint.clone(),
        quiet: a.quiet,
    })));
    if !a.quiet {
        let (live, mut chunks) = LiveOutput::channel(256);
        req.live = Some(live);
        tokio::spawn(async move {
            while let Some(c) = chunks.recv().await {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(&c.bytes);
                let _ = err.flush();
            }
        });
    }
    let cancel = CancellationToken::new();
    let mut got: Option<i32> = None;
    let outcome = {
        let fut = rung.run(&req, cancel.clone());
        tokio::pin!(fut);
        loop {
            tokio::select! {
                r = &mut fut => break Some(r),
                _ = sigint.recv() => {
                    if got.is_some() { break None; }
                    got = Some(2);
                    cancel.cancel();
                }
                _ = sigterm.recv() => {
                    if got.is_some() { break None; }
                    got = Some(15);
                    cancel.cancel();
                }
            }
        }
    };
    // A second signal drops the attempt: its cleanup kills and removes the container now;
    // `close` waits for that cleanup.
    tokio::time::timeout(Duration::from_secs(60), rung.close()).await.ok();
    let code = match outcome {
        Some(Ok(o)) => {
            println!("{}", o.to_json());
            if a.exit_status {
                match (o.exit_code, o.signal) {
                    (Some(c), _) => (c & 0xff) as u8,
                    (None, Some(s)) => (128 + s).min(255) as u8,
                    _ if o.status == crate::contract::Status::Ok => 0,
                    _ => 1,
                }
            } else {
                0
            }
        }
        Some(Err(e)) => fail(crate::contract::error_chain(&e)),
        None => 0,
    };
    match got {
        Some(2) => 130,
        Some(15) => 143,
        _ => code,
    }
}
