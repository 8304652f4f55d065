#!/usr/bin/env bash
# Shrinks a target's corpus to the inputs that add coverage, keeping the named ones (seeds,
# real captures, regressions: every file whose name is not libFuzzer's 40-hex-digit hash),
# which say what they are and which `cargo test` replays by name.
#
#   fuzz/cmin.sh TARGET
set -euo pipefail
cd "$(dirname "$0")"
target=${1:?usage: fuzz/cmin.sh TARGET}
keep=$(mktemp -d)
trap 'rm -rf "$keep"' EXIT
find "corpus/$target" -maxdepth 1 -type f -regextype posix-extended ! -regex '.*/[0-9a-f]{40}' -exec cp -p {} "$keep/" \;
before=$(find "corpus/$target" -maxdepth 1 -type f | wc -l)
cargo +nightly fuzz cmin -O -a "$target" >"target/logs/$target.cmin.log" 2>&1
find "$keep" -type f -exec cp -p {} "corpus/$target/" \;
echo "cmin: $target: $before -> $(find "corpus/$target" -maxdepth 1 -type f | wc -l) inputs ($(find "$keep" -type f | wc -l) named kept)"
