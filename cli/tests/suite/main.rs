//! The integration tests, one binary (cargo's own test suite has the same shape): a module
//! per area, one set of helpers (`support`). Those that need an engine talk to the real one
//! (`DOCKER_HOST`, else the local socket); outside CI they are skipped when none answers, and
//! the binary says so at the end. `soak` is a binary of its own: it reads its process's RSS.

mod support;

mod architecture;
mod attacks;
mod cli;
mod command;
mod container;
mod docs;
mod engines;
mod front;
mod handlers;
mod hardening;
mod hooks;
mod images;
mod init;
mod kube;
mod leftovers;
mod levels;
mod link_inputs;
mod oci;
mod page;
mod pool;
mod process;
mod reclaim;
mod recover;
mod registry;
mod replay;
mod rootless;
mod run_cli;
mod skips;
mod usage;
