//! The sandbox side: what runs inside the container for the worker. The handler runner
//! (reached through [`main_hook`]), and stevedore's own init, embedded as a static
//! executable (`init_binary`; its code is the `stevedore-init` crate).

pub(crate) mod handler;
pub mod init_binary;

use crate::handlers::Handlers;
use stevedore_init::wire::HANDLER_MARKER;

/// Call first thing in a worker's `main`: when the process was started by stevedore's init
/// as the handler runner, this runs the handler and exits the process; otherwise it returns
/// and `main` goes on. A worker image whose binary does not call it is refused with
/// `LaunchError::HandlerProtocol`, naming this function.
pub fn main_hook(handlers: &Handlers) {
    if std::env::args_os().nth(1).is_some_and(|a| a == HANDLER_MARKER) {
        std::process::exit(handler::main(handlers));
    }
}
