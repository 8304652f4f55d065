//! `stevedore smoke`: boot, census, one trivial jailed attempt, drain.

use crate::common::{self, Global, Rung};
use stevedore::container::ContainerExecutor;
use stevedore::contract::{Executor, Request, Status};
use stevedore::handlers::Handlers;
use tokio_util::sync::CancellationToken;

/// Runs `stevedore smoke`; the last line is `drain: ok` or `drain: failed <why>`.
pub async fn smoke(g: &Global, a: &crate::census::CensusArgs, handlers: &Handlers) -> u8 {
    let done = match common::open(g, a.rung, &()).await {
        Ok(Rung::Container(rung)) => steps(rung, handlers).await,
        Ok(Rung::Kube(rung)) => kube_steps(rung).await,
        Ok(Rung::Process(_)) => Err("smoke: the process rung has no engine to check (--rung container or kube)".into()),
        Ok(Rung::Oci(rung)) => oci_steps(rung, handlers).await,
        Err(e) => Err(format!("boot: {e}")),
    };
    match done {
        Ok(()) => {
            println!("drain: ok");
            0
        }
        Err(why) => {
            println!("drain: failed {}", stevedore_init::wire::printable(&why));
            1
        }
    }
}

async fn steps(rung: ContainerExecutor, handlers: &Handlers) -> Result<(), String> {
    println!("{}", crate::census::line(&rung));
    handler_attempt(&rung, rung.engine(), handlers).await
}

/// The oci rung's: its census line, then the same handler attempt, in the same image.
async fn oci_steps(rung: stevedore::oci::OciExecutor, handlers: &Handlers) -> Result<(), String> {
    println!("{}", serde_json::to_value(rung.census()).unwrap_or_default());
    handler_attempt(&rung, rung.engine(), handlers).await
}

/// The `true` handler in stevedore's own worker image, packed once per build.
async fn handler_attempt(
    rung: &dyn Executor,
    engine: &stevedore::engine::Engine,
    handlers: &Handlers,
) -> Result<(), String> {
    let image = {
        let _packing = crate::progress::spinner("packing stevedore's own worker image (once per build)", false);
        common::own_image(engine, handlers, false).await?
    };
    let out = tempfile_dir()?;
    let mut req = Request::handler("smoke", "true", out.join("out"))
        .worker(common::mint_worker())
        .timeout(std::time::Duration::from_secs(60));
    req.policy.image = image;
    req.fingerprint = Some(handlers.fingerprint());
    attempt(rung, &req, &out).await
}

/// Runs the trivial attempt, says how it ended, leaves nothing (its scratch dir, its
/// captures, the rung's own objects); an error unless it was `ok`.
async fn attempt(rung: &dyn Executor, req: &Request, out: &std::path::Path) -> Result<(), String> {
    let result = rung.run(req, CancellationToken::new()).await;
    let _ = std::fs::remove_dir_all(out);
    let ended = match result {
        Ok(mut outcome) => {
            // A check leaves nothing: its captures go with it.
            crate::run::drop_captures(&mut outcome);
            println!("attempt: {} ({} ms)", outcome.status, outcome.usage.wall_time_ms.unwrap_or(0));
            match outcome.status {
                Status::Ok => Ok(()),
                s => Err(format!("attempt ended {s} ({})", outcome.handler_error)),
            }
        }
        Err(e) => Err(format!("attempt: {}", stevedore::error_chain(&e))),
    };
    rung.close().await;
    ended
}

/// The smoke on a cluster: the one image a cluster that runs the rung has is stevedore's
/// init image, so the trivial attempt is its init sending a report from inside the Pod.
async fn kube_steps(rung: stevedore::kube::KubeExecutor) -> Result<(), String> {
    println!("{}", crate::kube::line(&rung).await);
    let out = tempfile_dir()?;
    let argv = [stevedore::image::init_image::INIT_PATH, "report", "note", "smoke"];
    let mut req = Request::command("smoke", argv, out.join("out"))
        .worker(common::mint_worker())
        .timeout(std::time::Duration::from_secs(120));
    req.policy.image = rung.init_image().to_owned();
    attempt(&rung, &req, &out).await
}

fn tempfile_dir() -> Result<std::path::PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("stevedore-smoke-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("scratch dir: {e}"))?;
    Ok(dir)
}
