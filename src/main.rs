//! The `stevedore` command: a worker with built-in handlers and the CLI over the library.

fn main() -> std::process::ExitCode {
    let handlers = stevedore::handlers::builtin();
    stevedore::sandbox::main_hook(&handlers);
    stevedore::cli::main(handlers)
}
