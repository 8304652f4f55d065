//! The `stevedore` command: census, smoke, run, reclaim, image pack.

mod census;
mod common;
mod image;
mod reclaim;
mod run;
mod smoke;

use crate::handlers::Handlers;
use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Run each attempt of a job in a fresh Docker container and report, as facts, what happened.
#[derive(Debug, Parser)]
#[command(name = "stevedore", version, about, long_about = None)]
pub struct Cli {
    #[command(flatten)]
    global: common::Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print what the engine is and what it can enforce, as one JSON line
    Census,
    /// Boot, census, run a trivial jailed attempt, drain; print `drain: ok` last
    Smoke,
    /// Run one attempt of a command or handler in a fresh container
    Run(Box<run::RunArgs>),
    /// Remove what a worker left behind
    Reclaim(reclaim::ReclaimArgs),
    /// Manage worker images
    #[command(subcommand)]
    Image(image::ImageCommand),
}

/// Parses the command line and runs the command; `handlers` are the worker's built-ins.
pub fn main(handlers: Handlers) -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("STEVEDORE_LOG").unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("stevedore: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = rt.block_on(async move {
        match cli.command {
            Command::Census => census::census(&cli.global).await,
            Command::Smoke => smoke::smoke(&cli.global, &handlers).await,
            Command::Run(args) => run::run(&cli.global, *args, &handlers).await,
            Command::Reclaim(args) => reclaim::reclaim(&cli.global, args).await,
            Command::Image(cmd) => image::image(&cli.global, cmd, &handlers).await,
        }
    });
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    ExitCode::from(code)
}
