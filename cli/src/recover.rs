//! `stevedore recover FILE`: finishes an attempt whose `stevedore run --checkpoint FILE`
//! died, from its checkpoint; prints its Outcome on stdout and exits as `run` would have
//! (the table in `docs/outcome.md`), so a CI step that recovers still fails when it failed.

use crate::common::{self, Global};
use std::path::PathBuf;
use std::sync::Arc;
use stevedore::contract::{Checkpoint, Executor, HookSet, RecoverError};
use tokio_util::sync::CancellationToken;

/// Arguments of `stevedore recover`.
#[derive(Debug, clap::Args)]
pub struct RecoverArgs {
    /// The checkpoint `stevedore run --checkpoint` wrote
    #[arg(value_name = "FILE")]
    checkpoint: PathBuf,
    /// Do not print the attempt's reports on stderr
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Keep the captured stdout and stderr in DIR: the one `run --logs DIR` was given, so
    /// the captures go on where they were (default: stevedore's own dir, removed at the end)
    #[arg(long, value_name = "DIR")]
    logs: Option<PathBuf>,
}

/// Runs `stevedore recover`.
pub async fn recover(g: &Global, a: RecoverArgs) -> u8 {
    let fail = |m: String| {
        crate::say::say(m);
        125
    };
    let json = match std::fs::read(&a.checkpoint) {
        Ok(j) => j,
        Err(e) => return fail(format!("cannot read {}: {e}", a.checkpoint.display())),
    };
    let cp = match Checkpoint::from_json(&json) {
        Ok(c) => c,
        Err(e) => return fail(format!("{}: {e}", a.checkpoint.display())),
    };
    let rung: Arc<dyn Executor> = if let stevedore::contract::Target::Pod { namespace, .. } = &cp.target {
        match crate::kube::rung(g, 125, |cfg| {
            cfg.name = cp.rung.clone();
            cfg.namespace = Some(namespace.clone());
            cfg.log_dir = a.logs.clone();
            Ok(())
        })
        .await
        {
            Ok(r) => Arc::new(r),
            Err(code) => return code,
        }
    } else if cp.level == stevedore::contract::Level::Process {
        let mut cfg = stevedore::process::ProcessConfig::default().name(cp.rung.clone());
        cfg.log_dir = a.logs.clone();
        match stevedore::process::ProcessExecutor::new(cfg) {
            Ok(r) => Arc::new(r),
            Err(e) => return fail(e.to_string()),
        }
    } else {
        match common::rung(g, 125, |cfg| {
            cfg.name = cp.rung.clone();
            cfg.log_dir = a.logs.clone();
            Ok(())
        })
        .await
        {
            Ok(r) => Arc::new(r),
            Err(code) => return code,
        }
    };
    let hooks = HookSet(Arc::new(common::CliHooks { checkpoint: None, quiet: a.quiet, raw_on_start: None }));
    let cancel = CancellationToken::new();
    let watch = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            watch.cancel();
        }
    });
    let result = rung.recover(&cp, Some(hooks), cancel).await;
    rung.close().await;
    match result {
        Ok(mut o) => {
            // As `run`'s: removed at the end unless kept with `--logs`.
            if a.logs.is_none() {
                crate::run::drop_captures(&mut o);
            }
            println!("{}", o.to_json());
            if !a.quiet {
                let grace = std::time::Duration::from_millis(cp.grace_ms);
                crate::say::say(crate::report::summary(&o, grace, &cp.output_dir));
            }
            // The checkpoint holds the attempt's key; the attempt is over.
            let _ = std::fs::remove_file(&a.checkpoint);
            crate::report::exit_code(&o)
        }
        Err(e @ RecoverError::Gone(_)) => {
            let _ = std::fs::remove_file(&a.checkpoint);
            fail(stevedore::error_chain(&e))
        }
        Err(e) => fail(stevedore::error_chain(&e)),
    }
}
