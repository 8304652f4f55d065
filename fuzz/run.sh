#!/usr/bin/env bash
# Fuzzes one target for a while, then prints what libFuzzer counted.
#
#   fuzz/run.sh TARGET [SECONDS]      (default 3600; needs nightly and `cargo install cargo-fuzz`)
#
# Release build with debug assertions (-O -a), AddressSanitizer (cargo-fuzz's default). New
# inputs go to corpus/TARGET, crashes to artifacts/TARGET; then `cargo +nightly fuzz cmin
# -O -a TARGET` shrinks the corpus before it is committed. `-timeout=10` stands for "time
# linear in the input" (an input that takes 10 s is reported as a timeout artifact), and
# `-rss_limit_mb` for "memory bounded by the caps".
set -euo pipefail
cd "$(dirname "$0")"
target=${1:?usage: fuzz/run.sh TARGET [SECONDS]}
seconds=${2:-3600}
case "$target" in
    # An outputs tar needs room for several 512-byte blocks.
    extract) max_len=16384 ;;
    # Past the 4 KiB a report may have, so the cap itself is fuzzed.
    report) max_len=8192 ;;
    *) max_len=4096 ;;
esac
mkdir -p "corpus/$target" "artifacts/$target"
mkdir -p target/logs
log="target/logs/$target.log"
started=$(date +%s)
set +e
cargo +nightly fuzz run -O -a "$target" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
    -print_final_stats=1 >"$log" 2>&1
rc=$?
set -e
took=$(($(date +%s) - started))
# The last status line ("#N DONE cov: C ft: F corp: K/..."), and libFuzzer's final stats.
status=$(grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE)' "$log" | tail -n 1 || true)
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
echo "fuzz: $target: ${took}s, exit $rc, execs ${execs:-?}, exec/s ${rate:-?}; last: ${status:-none}"
echo "fuzz: log in fuzz/$log; crashes, if any, in fuzz/artifacts/$target/"
exit "$rc"
