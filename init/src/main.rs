//! The `stevedore-init` binary: PID 1 of every attempt's container (no arguments), the
//! takeover relay (`relay <link-id> [within-ms]`), the report client (`report ...`), and a
//! Pod's init container (`prepare [--install PATH] [--inputs DIR]`).

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
        // An attempt's PID 1 as the rung started it: giving up when no Start frame came in
        // time (the kube rung's Pods), holding the delivery's reserve.
        Some(flag) if flag.starts_with("--") => match stevedore_init::Options::parse(&args) {
            Ok(options) => stevedore_init::main_with(options),
            Err(why) => {
                eprintln!("stevedore-init: {why}");
                2
            }
        },
        Some("relay") if (2..=3).contains(&args.len()) => {
            stevedore_init::relay_main(&args[1], args.get(2).map(String::as_str))
        }
        Some("report") => stevedore_init::report::cli_main(&args[1..]),
        // A Pod's init container (the kube rung): the init where the attempt runs it, the inputs.
        Some("prepare") => stevedore_init::prepare::main(&args[1..]),
        // A parked init's warming, as the sandbox's user (`init/src/warm.rs`).
        Some("warm") => stevedore_init::warm::main(&args[1..]),
        // Run by the host, as root, in a throwaway container: hands a new cache volume's
        // root to the sandbox user (the engine makes it root's, and the archive API cannot
        // change the root of what it extracts into).
        Some("chown-dir") if args.len() == 4 => chown_dir(&args[1], &args[2], &args[3]),
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

fn chown_dir(dir: &str, uid: &str, gid: &str) -> i32 {
    let (Ok(uid), Ok(gid)) = (uid.parse::<u32>(), gid.parse::<u32>()) else {
        eprintln!("stevedore-init chown-dir: uid and gid must be numbers");
        return 2;
    };
    let path = std::path::Path::new(dir);
    if !path.is_absolute() {
        eprintln!("stevedore-init chown-dir: {dir} is not absolute");
        return 2;
    }
    let owner = (Some(nix::unistd::Uid::from_raw(uid)), Some(nix::unistd::Gid::from_raw(gid)));
    let done =
        nix::unistd::fchownat(nix::fcntl::AT_FDCWD, path, owner.0, owner.1, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            .and_then(|()| {
                nix::sys::stat::fchmodat(
                    nix::fcntl::AT_FDCWD,
                    path,
                    nix::sys::stat::Mode::from_bits_truncate(0o755),
                    nix::sys::stat::FchmodatFlags::FollowSymlink,
                )
            });
    match done {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("stevedore-init chown-dir {dir}: {e}");
            1
        }
    }
}
