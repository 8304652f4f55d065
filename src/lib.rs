//! stevedore runs each attempt of a job in a fresh Docker container and reports, as facts,
//! what happened: status, exit code or signal, usage as the kernel counted it, hashed
//! outputs, and the enforcement that was actually applied.
//!
//! # Map
//! - [`contract`]: the engine-agnostic part: `Request`, `Outcome`, `Status` and the one
//!   function that decides it, the `Executor` trait, the `Registry`.
//! - [`handlers`]: the handler registry every rung that runs handlers shares, and the
//!   built-in handlers of the `stevedore` binary.
//! - [`inprocess`]: the in-process rung (level `none`).
//! - [`container`]: the container rung (level `sandboxed`, or `vm` under a VM-grade runtime).
//! - [`sandbox`]: what runs inside the container: stevedore's init (PID 1) and the handler runner.
//! - [`protocol`]: the wire between the host and the sandbox.
//! - [`outputs`]: walking, hashing and safely extracting outputs.
//! - [`image`]: packing a worker binary into a FROM scratch image without a registry, and
//!   listing or removing the stale ones.
//! - [`profiles`]: named configurations of the container rung, from TOML.
//! - [`cli`]: the `stevedore` command.
//!
//! # Quick start
//! A worker binary calls the sandbox hook first thing in `main`, so the container rung can
//! re-exec it as the container's init and as the handler runner:
//!
//! ```no_run
//! use stevedore::container::{ContainerConfig, ContainerExecutor};
//! use stevedore::handlers::Handlers;
//! use stevedore::{Executor, Request};
//! use tokio_util::sync::CancellationToken;
//!
//! fn main() {
//!     let handlers = Handlers::new().register("hello", |ctx| async move {
//!         std::fs::write(ctx.output_dir.join("hello.txt"), b"hi")?;
//!         Ok(())
//!     });
//!     stevedore::sandbox::main_hook(&handlers); // returns unless started by the rung
//!     tokio::runtime::Runtime::new().unwrap().block_on(async {
//!         let rung = ContainerExecutor::connect(ContainerConfig::default(), stevedore::contract::incarnation::current())
//!             .await
//!             .expect("engine reachable");
//!         // A restarted worker with the same ID removes what its previous life leaked.
//!         let _ = rung.reclaim("worker-1").await;
//!         let mut req = Request::command("job-1", ["sh", "-c", "echo hi > /out/hi.txt"], "/tmp/out-1").worker("worker-1");
//!         req.policy.image = "busybox:latest".into();
//!         let outcome = rung.run(&req, CancellationToken::new()).await.expect("launched");
//!         println!("{}", outcome.to_json());
//!         rung.close().await;
//!     });
//! }
//! ```

pub mod cli;
pub mod container;
pub mod contract;
pub mod handlers;
pub mod image;
/// The in-process rung (level `none`).
pub mod inprocess;
pub mod outputs;
pub mod profiles;
pub mod protocol;
pub mod sandbox;

pub use contract::*;
