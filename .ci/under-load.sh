#!/usr/bin/env bash
# Runs a command (default: `cargo test`) several times while busy loops load the machine,
# and prints each run's wall time and result: the suite must pass on a busy machine.
#
#   .ci/under-load.sh                      # 3 × `cargo test` beside 2 busy loops
#   LOOPS=4 RUNS=1 .ci/under-load.sh bash .ci/run
#
# The loops are shell loops (no stress tool needed), one per core by default; they are
# stopped on every way out.
set -euo pipefail
cd "$(dirname "$0")/.."

loops=${LOOPS:-$(nproc)}
runs=${RUNS:-3}
[ "$#" -gt 0 ] || set -- cargo test

pids=()
stop() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap stop EXIT
for _ in $(seq 1 "$loops"); do
    (while :; do :; done) &
    pids+=($!)
done
echo "under-load: $loops busy loops (pids ${pids[*]}), $runs runs of: $*" >&2

failed=0
results=()
for run in $(seq 1 "$runs"); do
    started=$SECONDS
    if "$@"; then verdict=ok; else verdict="FAILED ($?)"; failed=$((failed + 1)); fi
    results+=("run $run: $verdict in $((SECONDS - started))s")
    echo "under-load: run $run: $verdict in $((SECONDS - started))s" >&2
done
echo "under-load: ${results[*]}" >&2
[ "$failed" -eq 0 ]
