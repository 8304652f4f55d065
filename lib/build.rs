//! Builds stevedore's init (the `../init/` crate) as a static executable and hands it to the
//! library, which embeds it (`sandbox::init_binary`) and puts it into every engine it uses.
//!
//! Static, so that no dynamic loader runs as PID 1 of a container: an image's `LD_PRELOAD`,
//! `LD_AUDIT` or `/etc/ld.so.preload` can then never load code into the init. The build is
//! a nested `cargo build` of the init with `-C target-feature=+crt-static` and the `init`
//! profile (small, stripped), into `<target dir>/stevedore-init`, shared by every profile of
//! the outer build, so it is compiled once per checkout.
//!
//! `STEVEDORE_INIT_BIN=/path` embeds that file instead (e.g. a prebuilt init for a client
//! that cannot build one). On a target that is not Linux nothing is built: the library then
//! refuses to connect a container rung and names both platforms.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let dest = place();
    // Hashed once here, not by every process that puts the init somewhere (2 MB: ~1.5 ms).
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(&dest).expect("the init was just placed");
    println!("cargo:rustc-env=STEVEDORE_INIT_SHA256={:x}", Sha256::digest(&bytes));
}

/// Builds (or takes, or stubs) the init into `OUT_DIR`; returns where it is.
fn place() -> PathBuf {
    println!("cargo:rerun-if-changed=../init/src");
    println!("cargo:rerun-if-changed=../init/Cargo.toml");
    println!("cargo:rerun-if-changed=../Cargo.lock");
    println!("cargo:rerun-if-env-changed=STEVEDORE_INIT_BIN");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dest = out.join("stevedore-init");
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    println!("cargo:rustc-env=STEVEDORE_INIT_TARGET={target}");
    if let Some(given) = std::env::var_os("STEVEDORE_INIT_BIN") {
        copy(Path::new(&given), &dest);
        return dest;
    }
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        // An empty file: `sandbox::init_binary` reports that no init is embedded.
        std::fs::write(&dest, b"").expect("OUT_DIR is writable");
        return dest;
    }
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    // OUT_DIR is <target dir>[/<triple>]/<profile>/build/<pkg>-<hash>/out.
    let target_dir = out.ancestors().nth(4).expect("OUT_DIR has the usual shape").join("stevedore-init");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(manifest_dir.join("../init/Cargo.toml"))
        .args(["--profile", "init", "--bin", "stevedore-init", "--offline", "--target", &target])
        .arg("--target-dir")
        .arg(&target_dir);
    // The outer build's flags are for the outer build (a fuzzer's sanitizers, clippy's
    // wrapper); the init gets exactly its own.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_TARGET_DIR",
        "CARGO_PROFILE_RELEASE_DEBUG",
        "CARGO_INCREMENTAL",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("CARGO_ENCODED_RUSTFLAGS", "-Ctarget-feature=+crt-static");
    let status = cmd.status().expect("cargo runs");
    assert!(
        status.success(),
        "building the static init failed ({status}); set STEVEDORE_INIT_BIN to use a prebuilt one"
    );
    copy(&target_dir.join(&target).join("init").join("stevedore-init"), &dest);
    dest
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copying the init from {}: {e}", from.display()));
}
