//! `stevedore recover FILE`: finishes an attempt whose `stevedore run --checkpoint FILE`
//! died, from its checkpoint; prints its Outcome on stdout and exits as `run` would have
//! (the table in `docs/outcome.md`), so a CI step that recovers still fails when it failed.

use crate::common::{self, Global, RungKind};
use crate::error::CliError;
use std::path::PathBuf;
use std::sync::Arc;
use stevedore::contract::{Checkpoint, HookSet, RecoverError};
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

/// The rung as the checkpoint's: its name, its namespace, the captures where `--logs` says.
struct Resume<'a> {
    cp: &'a Checkpoint,
    logs: Option<&'a PathBuf>,
}

impl common::Adjust for Resume<'_> {
    fn container(&self, cfg: &mut stevedore::container::ContainerConfig) -> Result<(), String> {
        cfg.name = self.cp.rung.clone();
        cfg.log_dir = self.logs.cloned();
        Ok(())
    }

    fn process(&self, cfg: &mut stevedore::process::ProcessConfig) -> Result<(), String> {
        cfg.name = self.cp.rung.clone();
        cfg.log_dir = self.logs.cloned();
        Ok(())
    }

    fn oci(&self, cfg: &mut stevedore::oci::OciConfig) -> Result<(), String> {
        cfg.name = self.cp.rung.clone();
        cfg.log_dir = self.logs.cloned();
        Ok(())
    }

    fn kube(&self, cfg: &mut stevedore::kube::KubeConfig) -> Result<(), String> {
        cfg.name = self.cp.rung.clone();
        if let stevedore::contract::Target::Pod { namespace, .. } = &self.cp.target {
            cfg.namespace = Some(namespace.clone());
        }
        cfg.log_dir = self.logs.cloned();
        Ok(())
    }
}

/// Runs `stevedore recover`.
pub async fn recover(g: &Global, a: RecoverArgs) -> u8 {
    let fail = |m: String| CliError::Refused(m).said();
    let json = match std::fs::read(&a.checkpoint) {
        Ok(j) => j,
        Err(e) => return fail(format!("cannot read {}: {e}", a.checkpoint.display())),
    };
    let cp = match Checkpoint::from_json(&json) {
        Ok(c) => c,
        Err(e) => return fail(format!("{}: {e}", a.checkpoint.display())),
    };
    let kind = match (&cp.target, cp.level) {
        (stevedore::contract::Target::Pod { .. }, _) => RungKind::Kube,
        (stevedore::contract::Target::Runtime { .. }, _) => RungKind::Oci,
        (_, stevedore::contract::Level::Process) => RungKind::Process,
        _ => RungKind::Container,
    };
    let rung = match common::open(g, kind, &Resume { cp: &cp, logs: a.logs.as_ref() }).await {
        Ok(r) => r.executor(),
        Err(e) => return e.said(),
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
        Err(e) => {
            if matches!(e, RecoverError::Gone(_)) {
                let _ = std::fs::remove_file(&a.checkpoint);
            }
            CliError::Failed(stevedore::error_chain(&e)).exiting(125).said()
        }
    }
}
