#!/usr/bin/env bash
# The kube rung's cold cost against a bare Pod (issue 46), on the cluster of
# `.ci/engines/kube.sh up`: medians of PAIRS alternating runs of
#   bare     kubectl run --rm -i --restart=Never IMAGE -- true   (the same user, namespace, image)
#   cold     stevedore run --rung kube --image IMAGE -- true
#   inputs   the same with 4 inputs of 4 KiB (over the link to a root init, in `default`)
#   init-ctr the same in KUBE_RESTRICTED_NAMESPACE (its policy refuses a root init: the init
#            container's stdin)
# and the ratios against `bare`. Both sides are whole processes: connect, create, attach,
# the command, the removal.
#
#   lib/examples/bench_kube.sh ENV_FILE [PAIRS]     (PAIRS: 10 by default; .ci/run runs 3)
set -euo pipefail
env_file=${1:?usage: bench_kube.sh ENV_FILE [PAIRS]}
pairs=${2:-10}
# shellcheck disable=SC1090 # the harness writes it
. "$env_file"
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${STEVEDORE_BIN:-$root/target/debug/stevedore}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/in"
for i in 1 2 3 4; do head -c 4096 /dev/urandom >"$work/in/f$i"; done
# This build's init image on the node (the rung names it by the init's digest).
tag=$("$bin" image init | python3 -c "import json, sys; print(json.load(sys.stdin)[\"tag\"])")
[ -n "$tag" ] || { echo "bench_kube: stevedore image init printed no tag" >&2; exit 1; }
"$KUBE_IMPORT" "$tag"
kubectl=("$KUBE_KUBECTL" --kubeconfig "$KUBE_RUNG_CONFIG")

ms() { echo $(($(date +%s%N) / 1000000)); }
one() {
    local what=$1 s e
    shift
    rm -rf "$work/out"
    s=$(ms)
    "$@" >/dev/null 2>"$work/err" || { echo "bench_kube: $what failed:" >&2; cat "$work/err" >&2; exit 1; }
    e=$(ms)
    echo "$what $((e - s))" >>"$work/times"
}
run() {
    "$bin" run --rung kube --kubeconfig "$KUBE_RUNG_CONFIG" --pull never --image "$KUBE_BUSYBOX_IMAGE" \
        --output "$work/out" "$@" -- true
}
for i in $(seq 1 "$pairs"); do
    one bare "${kubectl[@]}" run "bench-bare-$$-$i" --rm -i --quiet --restart=Never \
        --image="$KUBE_BUSYBOX_IMAGE" --image-pull-policy=Never -- true
    one cold run
    one inputs run --input "$work/in"
    one init-ctr run --namespace "$KUBE_RESTRICTED_NAMESPACE" --input "$work/in"
done
python3 - "$work/times" "$pairs" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    what, t = line.split()
    runs.setdefault(what, []).append(int(t))
bare = statistics.median(runs["bare"])
print(f"kube bench: {sys.argv[2]} alternating pairs, medians (ms), ratio to a bare Pod")
for what in ["bare", "cold", "inputs", "init-ctr"]:
    m = statistics.median(runs[what])
    print(f"  {what:9} {m:7.0f} ms  {m / bare:5.2f} x   (min {min(runs[what])}, max {max(runs[what])})")
cold = statistics.median(runs["cold"]) / bare
print(f"  target: cold <= 1.2 x bare: {'met' if cold <= 1.2 else 'not met'} ({cold:.2f} x)")
PY
