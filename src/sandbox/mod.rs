//! What runs inside the container: stevedore's init (PID 1) and the handler runner.

mod atomic;
pub mod cgroup;
pub mod handler;
pub mod init;

use crate::handlers::Handlers;
use crate::protocol::{HANDLER_MARKER, INIT_MARKER};

/// Call first thing in a worker's `main`: when the process was started by the container
/// rung (as the init or as the handler runner) this runs that role and exits the
/// process; otherwise it returns and `main` goes on.
pub fn main_hook(handlers: &Handlers) {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some(INIT_MARKER) => std::process::exit(init::main(&args[2..])),
        Some(HANDLER_MARKER) => std::process::exit(handler::main(handlers, &args[2..])),
        _ => {}
    }
}
