//! The `stevedore-init` binary: PID 1 of every attempt's container (no arguments), the
//! takeover relay (`relay <link-id>`), and the report client (`report ...`).

fn main() {
    let args: Vec<String> = match std::env::args_os().skip(1).map(|a| a.into_string()).collect() {
        Ok(a) => a,
        Err(_) => {
            eprintln!("stevedore-init: arguments must be UTF-8");
            std::process::exit(2);
        }
    };
    let code = match args.first().map(String::as_str) {
        None => stevedore_init::main(),
        Some("relay") if args.len() == 2 => stevedore_init::relay_main(&args[1]),
        Some("report") => stevedore_init::report::cli_main(&args[1..]),
        Some(other) => {
            eprintln!(
                "stevedore-init: unknown verb {other:?}. Without arguments it is an attempt's init; \
                 `report progress|heartbeat|note|data ...` sends a report from inside an attempt"
            );
            2
        }
    };
    std::process::exit(code);
}
