//! stevedore runs each attempt of a job in a fresh sandbox and reports, as facts, what
//! happened: status, exit code or signal, usage as the kernel counted it, hashed outputs,
//! and the enforcement that was actually applied.
//!
//! # What a job engine uses
//! A [`Request`] goes to a rung (an [`Executor`]: [`ContainerExecutor`], `KubeExecutor`,
//! [`ProcessExecutor`], [`InProcessExecutor`]), chosen by a [`Registry`] from the request's [`Policy`]; the rung
//! returns an [`Outcome`] (`Err(`[`LaunchError`]`)` only when nothing ran). [`Hooks`] give
//! the engine a checkpoint (to [`Executor::recover`] after a restart), cancellation, the
//! sandbox's reports and the outcome as they happen. A worker binary that runs handlers
//! calls [`sandbox::main_hook`] first thing in `main`.
//!
//! # Map
//! - [`contract`]: the engine-agnostic words: the request, the outcome and its vocabulary,
//!   limits, policies, hooks, checkpoints, the [`Executor`] trait, the registry.
//! - [`handlers`]: the handler registry of a worker binary, and stevedore's built-ins.
//! - [`sandbox`]: the sandbox side: the handler runner and the embedded static init.
//! - [`container`] (feature `docker`): the container rung on a Docker-API engine, its
//!   configuration, labels and named caches; [`engine`]: how it reaches the engine;
//!   [`image`]: worker images made without a registry; [`profiles`]: named configurations.
//! - [`process`] (feature `process`): the process rung, a child process per attempt.
#![cfg_attr(
    feature = "oci",
    doc = "- [`oci`] (feature `oci`): the oci rung, a bundle per attempt run by the OCI runtime (runc) \
           with no daemon; images exported from the local engine."
)]
#![cfg_attr(
    not(feature = "oci"),
    doc = "- `oci` (feature `oci`, not in this build): the oci rung, a bundle per attempt run by the OCI \
           runtime (runc) with no daemon."
)]
#![cfg_attr(
    feature = "kube",
    doc = "- [`kube`] (feature `kube`): the kube rung, a Pod per attempt on a Kubernetes cluster; \
           stevedore's init comes from its init image ([`image::init_image`])."
)]
#![cfg_attr(
    not(feature = "kube"),
    doc = "- `kube` (feature `kube`, not in this build): the kube rung, a Pod per attempt on a \
           Kubernetes cluster; stevedore's init comes from its init image ([`image::init_image`])."
)]
//! - The in-process rung ([`InProcessExecutor`], level `none`).
//! - Inside (not public): `attempt`, the life of an attempt whose PID 1 is stevedore's init,
//!   written once for every rung that runs it, admission and the rung's `Executor` included
//!   (`attempt::front`); `link`, its host side (frames, the reader, supervision, claims);
//!   `outputs`, `inputs`, `hostdir`, `pipe`, `util`.
//! - `stevedore-init` (crate `init/`) is the init itself and the link's wire;
//!   `stevedore-parse` (crate `parse/`) the host's parsers of untrusted bytes.

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

// Without a rung that runs the init (only the in-process one), the init's side is unused.
#![cfg_attr(
    not(any(feature = "docker", feature = "process", feature = "kube")),
    expect(dead_code, unused_imports, reason = "only the in-process rung is built")
)]

#[cfg(any(feature = "docker", feature = "process", feature = "kube"))]
mod attempt;
#[cfg(feature = "docker")]
pub mod container;
pub mod contract;
#[cfg(feature = "docker")]
pub mod engine;
#[cfg(any(feature = "docker", feature = "kube"))]
pub(crate) mod envlayer;
pub mod handlers;
pub(crate) mod hostdir;
#[cfg(feature = "docker")]
pub mod image;
mod inprocess;
pub(crate) mod inputs;
#[cfg(feature = "kube")]
pub mod kube;
#[cfg(any(feature = "docker", feature = "kube"))]
pub mod labels;
pub(crate) mod link;
#[cfg(feature = "oci")]
pub mod oci;
pub(crate) mod outputs;
pub(crate) mod pipe;
#[cfg(feature = "process")]
pub mod process;
#[cfg(feature = "docker")]
pub mod profiles;
pub mod replay;
pub mod sandbox;
mod util;

/// The Kubernetes client: [`kube::ClusterError`]'s API causes carry its error.
#[cfg(feature = "kube")]
pub use ::kube as kube_client;
/// The Docker API client: [`engine::EngineError`]'s `Connect` and `Api` carry its error as
/// their cause, so a caller who matches on it names the same crate and version.
#[cfg(feature = "docker")]
pub use bollard;
#[cfg(feature = "docker")]
pub use container::{ContainerConfig, ContainerExecutor};
pub use contract::{
    Checkpoint, Evidence, Executor, HookSet, Hooks, LaunchError, Level, LiveChunk, LiveOutput, Next, Outcome,
    OutputFile, Phase, Policy, Progress, ProgressSink, Reason, ReclaimReport, Registry, Report, Request,
    ResourceLimits, SandboxReport, Status, StdinFeed, Stream, Terminal, Usage,
};
pub use handlers::{HandlerContext, HandlerError, Handlers};
pub use inprocess::InProcessExecutor;
#[cfg(feature = "kube")]
pub use kube::{KubeConfig, KubeExecutor};
pub use link::{Collection, HostLoss, LinkConfig};
#[cfg(feature = "oci")]
pub use oci::{OciConfig, OciExecutor};
pub use outputs::{Caps as OutputCaps, hash_backend, hash_reader};
#[cfg(feature = "process")]
pub use process::{ProcessConfig, ProcessExecutor};
pub use tokio_util::sync::CancellationToken;
pub use util::{BoxFuture, error_chain};
