#!/usr/bin/env bash
# A container-native CI pipeline with the stevedore command: each step runs in a fresh
# container, its outputs are the next step's inputs, a named cache keeps downloaded
# dependencies across the steps of a run, and a failing step stops the pipeline with its own
# exit status and the tail of its log.
#
# The cache belongs to the run (`ci-example-deps-<run>`, removed at its end), so two runs on
# one engine never share one; CACHE=NAME shares a cache across runs on purpose (it is then
# kept: `stevedore cache rm NAME`).
#
#   bash lib/examples/ci/pipeline.sh                 # fetch → build → test, all green
#   FAIL_AT=test bash lib/examples/ci/pipeline.sh    # the test step fails: exit 3, log tail shown
#
# STEVEDORE (default target/debug/stevedore) and IMAGE (default the tests' busybox image,
# stevedore-test/busybox:latest; `cargo test` builds it) can be overridden.
set -euo pipefail

stevedore=${STEVEDORE:-target/debug/stevedore}
image=${IMAGE:-stevedore-test/busybox:latest}
work=$(mktemp -d "${TMPDIR:-/tmp}/stevedore-ci-example.XXXXXX")
if [ -n "${CACHE:-}" ]; then
    cache_name=$CACHE
    trap 'rm -rf "$work"' EXIT
else
    # The run's own: the work dir's unique suffix names it.
    cache_name="ci-example-deps-$(basename "$work" | sed 's/.*\.//' | tr 'A-Z' 'a-z')"
    trap '"$stevedore" cache rm "$cache_name" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
fi
cache="$cache_name:/cache/deps"

# step NAME INPUT_DIR SCRIPT: runs SCRIPT in a fresh container; its outputs land in
# $work/NAME, its captured streams in $work/logs. On failure: the log tail, and the step's
# own exit status for the pipeline.
step() {
    local name=$1 input=$2 script=$3
    local args=(run --image "$image" --output "$work/$name" --logs "$work/logs" --outcome "$work/$name.json"
        --cache "$cache" --timeout 60s --memory 128m -e "FAIL_AT=${FAIL_AT:-}" -e "STEP=$name")
    [ -n "$input" ] && args+=(--input "$input")
    echo "== $name"
    local code=0
    "$stevedore" "${args[@]}" -- sh -c "$script" || code=$?
    if [ "$code" -ne 0 ]; then
        local log
        log=$(sed -n 's/.*"stderr":{"path":"\([^"]*\)".*/\1/p' "$work/$name.json")
        echo "== $name failed with exit status $code; the end of its log ($log):" >&2
        [ -n "$log" ] && tail -n 5 "$log" >&2
        exit "$code"
    fi
}

# fetch: "downloads" a dependency once into the cache, then uses it.
step fetch "" '
    if [ -e /cache/deps/lib.txt ]; then echo "cache hit"; else echo "cache miss: fetching"; echo "lib v1" > /cache/deps/lib.txt; fi
    mkdir -p /out/src
    printf "a\nb\nc\n" > /out/src/data.txt
    cp /cache/deps/lib.txt /out/src/'

# build: reads the fetched sources (read-only at /in), writes the artifact.
step build "$work/fetch" '
    cat /in/src/lib.txt /in/src/data.txt > /out/app.txt
    wc -l < /out/app.txt > /out/lines'

# test: checks the artifact, writes a junit report.
step test "$work/build" '
    n=$(cat /in/lines)
    if [ "$FAIL_AT" = "$STEP" ]; then echo "assertion failed: expected 5 lines, got $n (FAIL_AT=test)" >&2; exit 3; fi
    [ "$n" -eq 4 ] || { echo "expected 4 lines, got $n" >&2; exit 1; }
    echo "<testsuite tests=\"1\" failures=\"0\"/>" > /out/junit.xml'

echo "== pipeline green: $(cat "$work/test.json" | sed -n 's/.*"outputs":\[{"name":"\([^"]*\)".*/\1/p')"
