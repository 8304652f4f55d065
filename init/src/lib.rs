//! stevedore's init: PID 1 of every attempt's container (and the supervisor of the process
//! rung's command), and the link it speaks with the host.
//!
//! It is a separate, statically linked program so that nothing of an image can reach it:
//! no dynamic loader runs, so an image's `LD_PRELOAD`, `LD_AUDIT`, `LD_LIBRARY_PATH` or
//! `/etc/ld.so.preload` never load code into it, and its environment never configures it
//! (it is only passed on, as the image's layer, when the Start frame asks: the kube rung). The
//! host embeds it (see the `stevedore` crate's `build.rs`) and puts it into the engine
//! through the Engine API.
//!
//! # Map
//! - [`wire`]: framing and every message of the link (host ↔ init ↔ handler runner).
//! - [`cgroup`]: the container's cgroup counters, read from inside (both versions).
//! - [`report`]: reports from the sandbox (progress, heartbeats, notes): the client and
//!   the init's limits.
//! - `run`: the init's life: start, supervise, report, wait for the ack.
//! - `link`: the link to the host, and the takeover socket a restarted host comes back on.
//! - `relay`: `stevedore-init relay`, which carries a takeover through `docker exec`.
//! - [`prepare`]: `stevedore-init prepare`, a Pod's init container (the kube rung): the init
//!   copied where the attempt runs it, the inputs unpacked from stdin.
//! - `handler`: the handler runner's socket.
//! - `sampler`: the resource timeline, sampled while the command runs, bounded in size.
//! - `reserve`: memory held while the command runs, let go for the delivery of the outputs.
//! - `stage`: a root PID 1 writing the inputs it is sent over the link (the container rung),
//!   `privileges`: giving up root before the command.
//! - `stdin`: the command's stdin from the host, within a window.
//! - [`warm`]: a parked init warming the image's caches with the pool's last programs.
//! - `child`: starting the command (the only unsafe code: the fork-to-exec window).
//! - `outdir`: sending the output dir back as a tar, within the caps.
//! - `fuzzing` (hidden): the invariants the fuzz targets in `fuzz/` check on the init's
//!   parsers (frames, the Start frame, records and claims, reports, cgroup files, takeovers).

pub mod cgroup;
mod child;
#[doc(hidden)]
pub mod fuzzing;
mod handler;
mod link;
mod outdir;
pub mod prepare;
mod privileges;
mod relay;
pub mod report;
mod reserve;
mod run;
mod sampler;
pub mod seccomp;
mod stage;
mod stdin;
pub mod tree;
pub mod warm;
pub mod wire;

pub use outdir::send as send_outputs;
pub use outdir::{Emit as EmitOutputs, walk as walk_outputs};
pub use relay::main as relay_main;
pub use run::{EXIT_SETUP_FAILED, Options, main, main_with};
