#!/usr/bin/env bash
# What a target's corpus runs of the parsers' own code (the init's and stevedore-parse's
# sources; not the fuzz harness in `fuzzing.rs`, not dependencies): per source file that the
# corpus enters, the lines run; then every function it enters, with the share of its code
# regions run. By `cargo +nightly fuzz coverage` and nightly's llvm-cov
# (`rustup component add llvm-tools-preview --toolchain nightly`).
#
#   fuzz/coverage.sh TARGET
set -euo pipefail
cd "$(dirname "$0")"
target=${1:?usage: fuzz/coverage.sh TARGET}
mkdir -p target/logs
cargo +nightly fuzz coverage "$target" >"target/logs/$target.coverage.log" 2>&1
triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
llvm_cov="$(rustc +nightly --print sysroot)/lib/rustlib/$triple/bin/llvm-cov"
bin="target/$triple/coverage/$triple/release/$target"
mapfile -t sources < <(find "$PWD/../init/src" "$PWD/../parse/src" -name '*.rs' ! -name fuzzing.rs | sort)
"$llvm_cov" export -format=text "$bin" -instr-profile="coverage/$target/coverage.profdata" "${sources[@]}" |
    python3 coverage.py "$(cd .. && pwd)"
