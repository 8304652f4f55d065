//! The `stevedore` command; inside a container, also its init.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(stevedore::protocol::INIT_MARKER) {
        std::process::exit(stevedore::sandbox::init::main(&args[2..]));
    }
}
