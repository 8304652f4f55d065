//! The `stevedore-init` binary: PID 1 of every attempt's container.

fn main() {
    if std::env::args_os().len() > 1 {
        eprintln!("stevedore-init takes no arguments: it reads its start from the link on stdin");
        std::process::exit(stevedore_init::EXIT_SETUP_FAILED);
    }
    std::process::exit(stevedore_init::main());
}
