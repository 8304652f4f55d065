//! stevedore runs each attempt of a job in a fresh container and reports, as facts, what
//! happened: status, exit code or signal, usage as the kernel counted it, hashed outputs,
//! and the enforcement that was actually applied.
//!
//! # Map
//! - [`contract`]: the engine-agnostic part: [`Request`], [`Outcome`] and its words, the
//!   one judge, the [`Executor`] trait every rung implements, the [`Registry`].
//! - [`handlers`]: the handler registry every rung that runs handlers shares, and the
//!   built-in handlers of the `stevedore` binary.
//! - [`inprocess`]: the in-process rung (level `none`).
//! - [`process`]: the process rung (level `process`): a child process under a dedicated uid.
//! - [`container`]: the container rung (level `sandboxed`, or `vm` under a VM-grade runtime).
//! - [`engine`]: the connection to a Docker-API engine and the narrow set of calls made.
//! - [`link`]: the host side of the link to stevedore's init: captures, live output, claims.
//! - [`sandbox`]: the sandbox side: the handler runner ([`sandbox::main_hook`]) and the
//!   embedded static init (the `stevedore-init` crate).
//! - [`outputs`]: extracting and hashing outputs, walking an output dir.
//! - `stevedore_parse` (crate `parse/`): the host's parsers of untrusted bytes (the outputs
//!   tar, sizes and durations, profiles files, ids), pure and fuzzed; re-exported where used.
//! - [`image`]: packing a worker binary into a `FROM scratch` image without a registry.
//! - [`profiles`]: named configurations of the container rung, from TOML.
//! - [`cli`]: the `stevedore` command.
//!
//! `docs/` in the repository states the Outcome and its words, the labels and the link.
//!
//! # Quick start
//! A worker binary calls the sandbox hook first thing in `main`, so the container rung can
//! re-exec it as the handler runner inside a worker image:
//!
//! ```no_run
//! use stevedore::{CancellationToken, ContainerConfig, ContainerExecutor, Executor, Handlers, Request};
//!
//! fn main() {
//!     let handlers = Handlers::new().register("hello", |ctx| async move {
//!         std::fs::write(ctx.output_dir.join("hello.txt"), b"hi")?;
//!         Ok(())
//!     });
//!     stevedore::sandbox::main_hook(&handlers); // returns unless started by stevedore's init
//!     tokio::runtime::Runtime::new().unwrap().block_on(async {
//!         let rung = ContainerExecutor::connect(ContainerConfig::default()).await.expect("engine reachable");
//!         // A restarted worker with the same ID removes what its previous life leaked.
//!         let _ = rung.reclaim("worker-1").await;
//!         let req = Request::command("job-1", ["sh", "-c", "echo hi > /out/hi.txt"], "/tmp/out-1")
//!             .worker("worker-1")
//!             .image("busybox:latest")
//!             .memory(256 << 20)
//!             .timeout(std::time::Duration::from_secs(30));
//!         let outcome = rung.run(&req, CancellationToken::new()).await.expect("launched");
//!         println!("{}", outcome.to_json());
//!         rung.close().await;
//!     });
//! }
//! ```

pub mod cli;
pub mod container;
pub mod contract;
pub mod engine;
pub mod handlers;
pub(crate) mod hostdir;
pub mod image;
pub mod inprocess;
pub mod link;
pub mod outputs;
pub mod process;
pub mod profiles;
pub mod sandbox;

/// The wire of the link (shared with the init).
pub use stevedore_init::wire;

pub use bollard;
pub use container::{ContainerConfig, ContainerExecutor};
pub use contract::{
    Checkpoint, Evidence, Executor, Hooks, LaunchError, Level, Next, Outcome, OutputFile, Policy, Reason,
    ReclaimReport, Registry, Request, ResourceLimits, Status, Usage,
};
pub use handlers::{HandlerContext, HandlerError, Handlers};
pub use inprocess::InProcessExecutor;
pub use link::{LiveChunk, LiveOutput, Stream};
pub use process::{ProcessConfig, ProcessExecutor};
pub use tokio_util::sync::CancellationToken;
