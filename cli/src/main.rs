//! The `stevedore` command: the CLI over the library (census, smoke, run, recover, reclaim,
//! caches, reports, images), and a worker with stevedore's built-in handlers: the
//! sandbox hook runs first, so the same binary is its own worker image.

mod cache;
mod census;
mod common;
mod error;
mod image;
mod kube;
mod page;
mod progress;
mod reclaim;
mod recover;
mod replay;
mod report;
mod run;
mod say;
mod smoke;
mod terminal;

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use stevedore::handlers::Handlers;

const EXAMPLES: &str = "\
Examples:
  stevedore census
  stevedore smoke
  stevedore run --image stevedore-test/busybox:latest --output ./out -- sh -c 'echo hi > /out/hi'
  stevedore run --handler echo --payload hello --output ./out
  stevedore recover ./attempt.ckpt
  stevedore replay -n 3 outcome.json
  stevedore report outcome.json --html outcome.html
  stevedore cache ls
  stevedore --config profiles.toml --profile web run --image IMG --output ./out -- httpd -f -p 8080
  stevedore reclaim --worker W
  stevedore image pack --exe ./my-worker --tag my-worker:dev

Run 'stevedore COMMAND --help' for more information on a command.";

/// Run each attempt of a job in a fresh Docker container and report, as facts, what happened.
#[derive(Debug, Parser)]
#[command(
    name = "stevedore",
    version,
    about,
    long_about = None,
    override_usage = "stevedore [OPTIONS] COMMAND",
    subcommand_value_name = "COMMAND",
    subcommand_help_heading = "Commands",
    after_help = EXAMPLES,
    disable_help_subcommand = true
)]
pub struct Cli {
    #[command(flatten)]
    global: common::Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print what the engine is and what it can enforce, as one JSON line
    #[command(after_help = "Exit status: 0 when the engine is reachable, 1 otherwise (the reason on stderr).")]
    Census(census::CensusArgs),
    /// Boot, census, run a trivial jailed attempt, drain; print `drain: ok` last
    #[command(after_help = "Works on an engine with no images: stevedore packs itself into a FROM scratch image.\n\
                            Exit status: 0 when every step succeeded, else 1 with a last line `drain: failed WHY`.")]
    Smoke(census::CensusArgs),
    /// Run one attempt of a command or handler in a fresh container
    Run(Box<run::RunArgs>),
    /// Remove the containers and volumes a worker left behind; list or remove stale worker images
    #[command(after_help = "Examples:\n  stevedore reclaim --worker W\n  stevedore reclaim --images\n\n\
                            Prints a JSON summary (containers_removed, volumes_removed, stale_images, \
                            images_removed). Exit status: 0 when the sweep ran, 1 when it could not.")]
    Reclaim(reclaim::ReclaimArgs),
    /// Finish an attempt whose `stevedore run --checkpoint FILE` died, from FILE
    #[command(after_help = "Prints the Outcome as one JSON line (evidence.recovered says how). Exit status: 0 \
                            when the attempt was recovered, 125 when it could not be (it is then removed).")]
    Recover(recover::RecoverArgs),
    /// Run an attempt again from its Outcome (`run --outcome FILE`), N times, and compare the outputs
    Replay(Box<replay::ReplayArgs>),
    /// List or remove named caches (`run --cache NAME:/path`)
    #[command(subcommand, override_usage = "stevedore cache COMMAND", disable_help_subcommand = true)]
    Cache(cache::CacheCommand),
    /// Write an attempt's page: OUTCOME.json --html FILE; or, inside an attempt, send a report
    #[command(after_help = "Examples:\n  stevedore report o.json --html o.html\n  \
                            stevedore report progress 50 half way\n\n\
                            OUTCOME.json --html FILE writes one self-contained page (the timeline, phases, outputs, \
                            logs' tails, evidence; `stevedore report o.json --help`). The reports (progress PERCENT \
                            [TEXT], heartbeat, note TEXT, data JSON) work only inside an attempt (they go to the \
                            report socket stevedore's init gave the command, fd 3). Exit status: 0 written or \
                            sent, 1 not, 2 bad arguments.")]
    Report {
        /// OUTCOME.json --html FILE | progress PERCENT [TEXT...] | heartbeat | note TEXT... | data JSON
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "REPORT")]
        args: Vec<String>,
    },
    /// Make worker images
    #[command(subcommand, override_usage = "stevedore image COMMAND", disable_help_subcommand = true)]
    Image(image::ImageCommand),
}

/// Parses the command line and runs the command; `handlers` are the worker's built-ins.
fn run_cli(handlers: Handlers) -> ExitCode {
    // Usage errors exit 125 as `docker run`'s do, so that a shell or CI never takes them
    // for the command's own status; help and version exit 0.
    let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mut cli = match Cli::try_parse_from(&raw) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 125 } else { 0 });
        }
    };
    if let Command::Run(a) = &mut cli.command {
        a.see_escape(&raw);
    }
    // kube-rs logs a failed connection itself; stevedore says it once, in its own words.
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("STEVEDORE_LOG").unwrap_or_else(|_| "warn,kube_client=off".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            say::say(format!("cannot start the runtime: {e}"));
            return ExitCode::from(1);
        }
    };
    let code = rt.block_on(async move {
        match cli.command {
            Command::Census(args) => census::census(&cli.global, &args).await,
            Command::Smoke(args) => smoke::smoke(&cli.global, &args, &handlers).await,
            Command::Run(args) => run::run(&cli.global, *args, &handlers).await,
            Command::Reclaim(args) => reclaim::reclaim(&cli.global, args).await,
            Command::Recover(args) => recover::recover(&cli.global, args).await,
            Command::Replay(args) => replay::replay(&cli.global, *args, &handlers).await,
            Command::Cache(cmd) => cache::cache(&cli.global, cmd).await,
            Command::Report { args } if page::is_page(&args) => page::main(&args),
            Command::Report { args } => stevedore_init::report::cli_main(&args).clamp(0, 255) as u8,
            Command::Image(cmd) => image::image(&cli.global, cmd, &handlers).await,
        }
    });
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    ExitCode::from(code)
}

fn main() -> ExitCode {
    let handlers = stevedore::handlers::builtin();
    stevedore::sandbox::main_hook(&handlers);
    run_cli(handlers)
}
