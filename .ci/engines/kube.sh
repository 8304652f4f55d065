#!/usr/bin/env bash
# A real single-node Kubernetes v1.20.2 for CI, on this host: etcd, a private containerd,
# kube-apiserver, kubelet, kube-scheduler and kube-controller-manager, all inside a network
# namespace of their own. The host reaches the API server through a TLS pass-through
# forwarder on 127.0.0.1. The four server binaries (and kubectl) are built from Debian
# bookworm's `kubernetes` source package and cached.
#
#   .ci/engines/kube.sh build          install what it needs and build the binaries into the cache
#                                      (nothing when they are there); starts nothing
#   .ci/engines/kube.sh up             build (or take from the cache), start, wait for the
#                                      node to be Ready, run a smoke Pod; prints the path of the
#                                      env file (only that, on stdout)
#   .ci/engines/kube.sh down           stop everything it started, remove the run state
#   .ci/engines/kube.sh status         prints "up ENV_FILE" (exit 0) or "down" (exit 1)
#   .ci/engines/kube.sh import IMG...  docker save IMG... | ctr (private containerd) import
#   .ci/engines/kube.sh key            prints the cache key of the current recipe
#   .ci/engines/kube.sh _build KEY [force]   (internal) the build, in a session of its own
#
# STEVEDORE_KUBE_REBUILD=1 .ci/engines/kube.sh up   rebuilds even if the build is cached.
#
# See README.md next to this script for the env file, the cache and the timings.
set -euo pipefail
# shellcheck source=.ci/apt.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../apt.sh"

CACHE_ROOT=${STEVEDORE_KUBE_CACHE:-/var/tmp/stevedore-ci/kube}
RUN_DIR=${STEVEDORE_KUBE_RUN:-/run/stevedore-ci/kube}
READY_TIMEOUT=${STEVEDORE_KUBE_READY_TIMEOUT:-300}
SMOKE_TIMEOUT=${STEVEDORE_KUBE_SMOKE_TIMEOUT:-180}
MIRROR=${STEVEDORE_KUBE_MIRROR:-http://deb.debian.org/debian}
LOCK_TIMEOUT=2400 # a concurrent `up` may be building (5 min here from a cold Go cache, more under load)

# Fixed names and addresses. All addresses live only inside the network namespace.
NETNS=stevedore-kube
NETNS_PATH=/run/netns/$NETNS
CGROUP_NAME=stevedore-kube # kubelet cgroupRoot; the daemons run in $CGROUP_NAME/daemons
NODE_NAME=stevedore-kube-node
NODE_IP=10.231.0.2
NODE_IFACE=kube0 # veth pair kube0 <-> kube1, both ends inside the namespace
POD_CIDR=10.232.0.0/24
SERVICE_CIDR=10.233.0.0/24
SERVICE_IP=10.233.0.1
CNI_NET=stevedore-kube
CNI_BRIDGE=stvk0
FEATURE_GATES=SizeMemoryBackedVolumes=true
PAUSE_IMAGE=stevedore-ci.local/pause:3.4
BUSYBOX_IMAGE=stevedore-ci.local/busybox:1.35
SMOKE_POD=stevedore-kube-smoke
RESTRICTED_NS=stevedore-restricted # PodSecurityPolicy admits no root init there (setup_psp)

SOCK=$RUN_DIR/containerd/containerd.sock
PKI=$RUN_DIR/pki
KCFG=$RUN_DIR/kubeconfig
PIDS=$RUN_DIR/pids
LOGS=$RUN_DIR/log
SCRIPT=$(readlink -f "${BASH_SOURCE[0]}")

log() { printf 'kube.sh: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

for dir in "$RUN_DIR" "$CACHE_ROOT"; do
    case "$dir" in
    *[[:space:]]*) die "STEVEDORE_KUBE_RUN and STEVEDORE_KUBE_CACHE must not contain whitespace" ;;
    /?*) ;;
    *) die "STEVEDORE_KUBE_RUN and STEVEDORE_KUBE_CACHE must be absolute paths below / (got '$dir')" ;;
    esac
done

# ---------------------------------------------------------------------------------------------
# The recipe. Everything from here to "end of the recipe" feeds the cache key (recipe_key):
# edit any of it and the next `up` builds anew; leave it alone and the cached build is reused.
# ---------------------------------------------------------------------------------------------
RECIPE_SUITE=bookworm
RECIPE_SRC_PKG=kubernetes
RECIPE_SRC_VERSION=1.20.5+really1.20.2-1.1+deb12u1
RECIPE_GO_PKG=golang-1.19-go
RECIPE_GOROOT=/usr/lib/go-1.19
RECIPE_REFLECT2=/usr/share/gocode/src/github.com/modern-go/reflect2
RECIPE_TARGETS="kube-apiserver kubelet kube-scheduler kube-controller-manager kubectl"
RECIPE_TAGS=providerless
RECIPE_KUBE_VERSION=v1.20.2
RECIPE_GIT_COMMIT=faecb196815e248d3ecfb03c680a4507229c2a56 # upstream v1.20.2
# The kubelet hard-codes /var/log/pods, /var/log/containers and /var/lib/kubelet/device-plugins:
# they go under this directory instead, which `down` removes.
RECIPE_HOST_DIR=/var/lib/stevedore-kube

# Downloads (once, into $CACHE_ROOT/downloads) and unpacks the Debian source package into $1.
# deb-src comes from a temporary source list: nothing under /etc/apt changes.
recipe_fetch() {
    local src=$1 dl="$CACHE_ROOT/downloads" t
    local dsc="$dl/${RECIPE_SRC_PKG}_${RECIPE_SRC_VERSION}.dsc"
    if [ ! -f "$dsc" ]; then
        t=$(mktemp -d "$CACHE_ROOT/.apt-XXXXXX")
        mkdir -p "$t/lists/partial" "$t/parts" "$t/dl"
        echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $RECIPE_SUITE main" \
            >"$t/sources.list"
        local o=(-o "Dir::Etc::SourceList=$t/sources.list" -o "Dir::Etc::SourceParts=$t/parts"
            -o "Dir::State::Lists=$t/lists" -o "APT::Sandbox::User=root")
        apt_update "${o[@]}" -qq >&2
        (cd "$t/dl" && apt-get "${o[@]}" source -qq --download-only \
            "$RECIPE_SRC_PKG=$RECIPE_SRC_VERSION" >&2) ||
            die "apt-get source $RECIPE_SRC_PKG=$RECIPE_SRC_VERSION failed (is that version still on $MIRROR?)"
        mkdir -p "$dl"
        mv "$t/dl/"* "$dl/"
        rm -rf "$t"
    fi
    # Applies debian/patches; checks the files against the .dsc's checksums.
    dpkg-source -x "$dsc" "$src" >&2 || {
        rm -rf "$dl"
        die "dpkg-source -x failed; removed $dl (a broken download?); run up again"
    }
}

# The fixes for building the 1.20 tree with Go 1.19, and three kubelet patches.
recipe_patch() {
    local src=$1 f
    # reflect2 1.0.1 breaks on Go >= 1.18: Debian's 1.0.2 instead.
    [ -f "$RECIPE_REFLECT2/reflect2.go" ] || die "missing $RECIPE_REFLECT2 (golang-github-modern-go-reflect2-dev)"
    rm -rf "$src/vendor/github.com/modern-go/reflect2"
    cp -r "$RECIPE_REFLECT2" "$src/vendor/github.com/modern-go/reflect2"
    # The kubelet would rewrite host sysctls (vm.overcommit_memory, kernel.panic,
    # kernel.panic_on_oops, ...) at start: only warn (protectKernelDefaults still errors).
    f=$src/pkg/kubelet/cm/container_manager_linux.go
    sed -i 's/^\tb := KernelTunableModify$/\tb := KernelTunableWarn/' "$f"
    grep -q '^	b := KernelTunableWarn$' "$f" || die "sysctl patch did not apply to $f"
    # Host paths the kubelet hard-codes (not under --root-dir): a directory of our own.
    local logs=(pkg/kubelet/kubelet.go pkg/kubelet/kuberuntime/kuberuntime_manager.go
        pkg/kubelet/kuberuntime/legacy.go)
    local plugins=(staging/src/k8s.io/kubelet/pkg/apis/deviceplugin/v1alpha/constants.go
        staging/src/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/constants.go)
    (
        cd "$src"
        sed -i -e "s|\"/var/log/pods\"|\"$RECIPE_HOST_DIR/log/pods\"|" \
            -e "s|\"/var/log/containers\"|\"$RECIPE_HOST_DIR/log/containers\"|" "${logs[@]}"
        sed -i "s|\"/var/lib/kubelet/device-plugins/\"|\"$RECIPE_HOST_DIR/device-plugins/\"|" "${plugins[@]}"
        if grep -n '"/var/log/pods"\|"/var/log/containers"\|"/var/lib/kubelet/device-plugins/"' \
            "${logs[@]}" "${plugins[@]}" >&2; then
            die "host path patch did not apply"
        fi
        [ "$(grep -c "\"$RECIPE_HOST_DIR/" "${logs[@]}" "${plugins[@]}" | awk -F: '{ n += $2 } END { print n }')" = 5 ] ||
            die "host path patch: expected 5 replacements"
    )
}

# Go in GOPATH mode (module mode fails under Go >= 1.16 with this tree), offline.
recipe_go() {
    env GO111MODULE=off GOPATH="$GOPATH_DIR" GOCACHE="$CACHE_ROOT/go-build" GOROOT="$RECIPE_GOROOT" \
        GOENV=off GOFLAGS= GOPROXY=off CGO_ENABLED=0 PATH="$RECIPE_GOROOT/bin:$PATH" "$@"
}

# pkg/generated/openapi/zz_generated.openapi.go is not in the tarball: the Makefile's rule
# (Makefile.generated_files, KUBE target), done by hand.
recipe_openapi() {
    local tree=$1 work=$2 inputs
    (
        cd "$tree"
        recipe_go go build -trimpath -p 1 -o "$work/openapi-gen" \
            k8s.io/kubernetes/vendor/k8s.io/kube-openapi/cmd/openapi-gen
        # ALL_GO_DIRS (hack/make-rules/helpers/cache_go_dirs.sh), then the files with a
        # `// +k8s:` tag, minus code-generator and sample-apiserver, then those asking for
        # openapi-gen: their directories.
        inputs=$(
            set +o pipefail # an xargs batch without a match is fine
            find -H . -not \( \( -path './_*' -o -path './.*' -o -path ./vendor \) -prune \) \
            -type f -name '*.go' | sed -e 's|^./staging/src|vendor|' -e 's|/[^/]*$||' -e 's|^./||' |
            LC_ALL=C sort -u |
            xargs -d '\n' sh -c 'exec find "$@" -maxdepth 1 -type f -name "*.go"' sh |
            xargs -d '\n' grep -l '^// *+k8s:' |
            grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/' |
            xargs -d '\n' grep -l '+k8s:openapi-gen=' | xargs -d '\n' -n1 dirname | LC_ALL=C sort -u |
            sed 's|^|k8s.io/kubernetes/|' | paste -sd, -
        )
        [ -n "$inputs" ] || die "openapi-gen: no input packages found"
        recipe_go "$work/openapi-gen" --logtostderr -i "$inputs" -o "$GOPATH_DIR/src" \
            -p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi \
            -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt -r "$work/violations.report" >&2
        [ -f pkg/generated/openapi/zz_generated.openapi.go ] || die "openapi-gen wrote nothing"
        diff "$work/violations.report" api/api-rules/violation_exceptions.list >&2 ||
            die "openapi-gen: the API rule violations differ from api/api-rules/violation_exceptions.list"
    )
}

recipe_build() {
    local tree=$1 out=$2 ldflags="-s -w" pkg target t date
    date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    for pkg in k8s.io/kubernetes/vendor/k8s.io/component-base/version \
        k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$RECIPE_KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=20"
        ldflags+=" -X $pkg.gitCommit=$RECIPE_GIT_COMMIT -X $pkg.gitTreeState=dirty -X $pkg.buildDate=$date"
    done
    mkdir -p "$out/bin"
    for target in $RECIPE_TARGETS; do
        t=$(now)
        (cd "$tree" && recipe_go go build -trimpath -p 1 -tags "$RECIPE_TAGS" -ldflags "$ldflags" \
            -o "$out/bin/$target" "k8s.io/kubernetes/cmd/$target")
        log "timing: go build $target $(since "$t") s"
    done
    "$out/bin/kube-apiserver" --version | grep -qx "Kubernetes $RECIPE_KUBE_VERSION" ||
        die "kube-apiserver --version: $("$out/bin/kube-apiserver" --version)"
}

# The pod sandbox ("pause") binary, from the tree (Debian ships no pause image).
recipe_pause() {
    local tree=$1 out=$2
    gcc -Os -Wall -Werror -static -DVERSION=v3.4-stevedore -o "$out/pause" "$tree/build/pause/linux/pause.c"
    strip "$out/pause"
}
# ------------------------------------------ end of the recipe --------------------------------

recipe_key() {
    {
        printf '%s\n' recipe-v1 "$RECIPE_SUITE" "$RECIPE_SRC_PKG" "$RECIPE_SRC_VERSION" "$RECIPE_GO_PKG" \
            "$RECIPE_GOROOT" "$RECIPE_REFLECT2" "$RECIPE_TARGETS" "$RECIPE_TAGS" "$RECIPE_KUBE_VERSION" \
            "$RECIPE_GIT_COMMIT" "$RECIPE_HOST_DIR"
        dpkg-query -W -f='${Package} ${Version}\n' "$RECIPE_GO_PKG" golang-github-modern-go-reflect2-dev \
            2>/dev/null || true
        declare -f recipe_fetch recipe_patch recipe_go recipe_openapi recipe_build recipe_pause
    } | sha256sum | cut -c1-16
}

# apt-get install that never removes a package (plain -y would, silently).
apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-remove "$@" >&2
}

NEEDED_PKGS="golang-1.19-go golang-github-modern-go-reflect2-dev etcd-server containerd runc
containernetworking-plugins socat openssl gcc libc6-dev binutils dpkg-dev xz-utils busybox-static
curl jq iproute2 util-linux"

ensure_tools() {
    local pkgs=() p t
    for p in $NEEDED_PKGS; do
        [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || pkgs+=("$p")
    done
    command -v docker >/dev/null 2>&1 || die "needs the docker CLI and the host's dockerd (image builds)"
    [ ${#pkgs[@]} -gt 0 ] || return 0
    t=$(now)
    log "installing: ${pkgs[*]}"
    apt_update -qq >&2
    apt_install "${pkgs[@]}" || die "could not install: ${pkgs[*]}"
    # etcd-server enables a host etcd.service; policy-rc.d stops it from starting on this
    # machine kind. Say so if it runs anyway (ours is in the namespace and does not clash).
    if [ -d /run/systemd/system ] && systemctl is-active -q etcd 2>/dev/null; then
        log "warning: the etcd-server package started the host's etcd.service (not ours; stop it if unwanted)"
    fi
    log "timing: install $(since "$t") s"
}

umount_below() {
    local dir=$1 mnt
    findmnt -rn -o TARGET | awk -v d="$dir/" 'index($0, d) == 1' | sort -r |
        while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
}

remove_tree() {
    [ -e "$1" ] || return 0
    umount_below "$1"
    rm -rf --one-file-system "$1"
}

# Builds $CACHE_ROOT/$1 unless it is complete (or $2 is "force"). Runs in a subshell for its
# own traps; niced, the Go build with -p 1: the machine is shared.
build_cache() (
    local key=$1 force=${2:-} dest="$CACHE_ROOT/$1" tmp
    mkdir -p "$CACHE_ROOT"
    exec 8>"$CACHE_ROOT/.lock"
    flock -w "$LOCK_TIMEOUT" 8 || die "another build holds $CACHE_ROOT/.lock"
    [ "$force" = force ] || [ ! -f "$dest/complete" ] || exit 0
    # We hold the lock: any other .build-* dir is a killed build's leftover.
    for tmp in "$CACHE_ROOT"/.build-* "$CACHE_ROOT"/.apt-*; do remove_tree "$tmp"; done
    tmp="$CACHE_ROOT/.build-$key-$$"
    trap 'remove_tree "$tmp"' EXIT
    trap 'exit 130' INT TERM
    renice -n 19 -p "$BASHPID" >/dev/null
    ionice -c 2 -n 7 -p "$BASHPID" 2>/dev/null || true
    mkdir -p "$tmp/out" "$tmp/work" "$tmp/gopath/src/k8s.io"
    log "building Kubernetes $RECIPE_KUBE_VERSION (key $key) in $tmp"
    local t0 t
    t0=$(now)
    t=$(now)
    recipe_fetch "$tmp/src"
    recipe_patch "$tmp/src"
    log "timing: source fetch + unpack + patch $(since "$t") s"
    ln -s ../../../src "$tmp/gopath/src/k8s.io/kubernetes"
    GOPATH_DIR=$tmp/gopath
    local tree=$GOPATH_DIR/src/k8s.io/kubernetes
    t=$(now)
    recipe_openapi "$tree" "$tmp/work"
    log "timing: openapi-gen $(since "$t") s"
    recipe_build "$tree" "$tmp/out"
    recipe_pause "$tree" "$tmp/out"
    declare -f recipe_fetch recipe_patch recipe_go recipe_openapi recipe_build recipe_pause >"$tmp/out/recipe.txt"
    touch "$tmp/out/complete"
    rm -rf "$dest" # an incomplete leftover (no "complete" marker)
    mv -T "$tmp/out" "$dest"
    log "timing: build total $(since "$t0") s ($(du -sh "$dest" | cut -f1) of binaries," \
        "Go cache $(du -sh "$CACHE_ROOT/go-build" | cut -f1))"
    # Drop other keys' builds unless the running cluster uses one.
    local in_use="" other
    [ -f "$RUN_DIR/cache_key" ] && in_use=$(cat "$RUN_DIR/cache_key")
    for other in "$CACHE_ROOT"/*/; do
        other=${other%/}
        case "${other##*/}" in "$key" | "$in_use" | downloads | go-build) continue ;; esac
        log "removing the stale build ${other##*/}"
        rm -rf --one-file-system "$other"
    done
)

# The build runs in a session of its own (`kube.sh _build KEY [force]`), so that a SIGTERM or
# SIGINT to `up` reaches the whole build (go and its compilers), which then removes its temp dir.
run_build() {
    local bpid rc=0
    setsid bash "$SCRIPT" _build "$@" </dev/null 9>&- &
    bpid=$!
    trap 'kill -TERM -- "-$bpid" 2>/dev/null; wait "$bpid"; exit 143' INT TERM
    wait "$bpid" || rc=$?
    trap - INT TERM
    [ "$rc" = 0 ] || die "the build failed (exit $rc)"
}

# ---------------------------------------------------------------------------------------------
# Processes. Each runs in its own session (setsid), with its pid in $PIDS/NAME.pid, its output
# in $LOGS/NAME.log, in the cgroup $CGROUP_NAME/daemons (so what containerd spawns, i.e. the
# shims, can be found there too) and, unless it is the host-side forwarder, in the namespace.
# ---------------------------------------------------------------------------------------------
cgroup_roots() { findmnt -rn -t cgroup,cgroup2 -o TARGET | sort -u; }

setup_cgroups() {
    local root d f
    for root in $(cgroup_roots); do
        for d in "$root/$CGROUP_NAME" "$root/$CGROUP_NAME/daemons"; do
            mkdir -p "$d"
            for f in cpuset.cpus cpuset.mems; do # cgroup v1 cpuset: children start empty
                if [ -f "$d/$f" ] && [ -z "$(cat "$d/$f")" ]; then cat "${d%/*}/$f" >"$d/$f"; fi
            done
        done
    done
}

# Every pid in our cgroup trees (containers, shims, daemons).
cgroup_pids() {
    local root
    for root in $(cgroup_roots); do
        [ -d "$root/$CGROUP_NAME" ] || continue
        find "$root/$CGROUP_NAME" -name cgroup.procs -exec cat {} + 2>/dev/null || true
    done | sort -un
}

remove_cgroups() {
    local root
    for root in $(cgroup_roots); do
        [ -d "$root/$CGROUP_NAME" ] || continue
        find "$root/$CGROUP_NAME" -depth -type d -exec rmdir {} \; 2>/dev/null || true
        [ ! -d "$root/$CGROUP_NAME" ] || log "warning: could not remove the cgroup $root/$CGROUP_NAME"
    done
}

# start NAME host|netns COMMAND...
start() {
    local name=$1 where=$2 enter=()
    shift 2
    [ "$where" = netns ] && enter=(nsenter "--net=$NETNS_PATH" --)
    # sh moves itself into the daemons cgroup, then execs (the pid stays the same). The
    # background job is not a process-group leader, so setsid execs in place too.
    # shellcheck disable=SC2016 # $$, $1 and $@ are for the inner sh
    setsid sh -c 'for d in $1; do echo $$ >"$d/cgroup.procs"; done; shift; exec "$@"' sh \
        "$(for r in $(cgroup_roots); do printf '%s ' "$r/$CGROUP_NAME/daemons"; done)" \
        "${enter[@]}" "$@" </dev/null >"$LOGS/$name.log" 2>&1 8>&- 9>&- &
    local pid=$!
    echo "$pid" >"$PIDS/$name.pid"
    disown "$pid" 2>/dev/null || true
    # Until the fork has exec'd, its command line is this script's: wait for that, so that
    # `alive` is meaningful from here on. Bounded generously: on a loaded machine (two cores
    # busy with builds) the exec of the last daemons started took over 5 s, and a daemon not
    # exec'd yet was taken for one that had exited.
    for _ in $(seq 1 3000); do
        if ours "$pid" || [ ! -d "/proc/$pid" ]; then break; fi
        sleep 0.02
    done
}

pid_of() { cat "$PIDS/$1.pid" 2>/dev/null || true; }

# Ours: the pid is alive and its command line names the run dir.
ours() { [ -n "$1" ] && [ -r "/proc/$1/cmdline" ] && tr '\0' '\n' <"/proc/$1/cmdline" | grep -qF -- "$RUN_DIR/"; }

alive() { ours "$(pid_of "$1")"; }

# Exists and is not a zombie (what we started is reaped by init, not by us, and that can lag).
running() {
    local st
    st=$(sed -E 's/^.*\) ([A-Za-z]).*$/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}

stop() {
    local name=$1 pid t
    pid=$(pid_of "$name")
    if ours "$pid"; then
        t=$(now)
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do
            running "$pid" || break
            sleep 0.1
        done
        ! running "$pid" || kill -KILL "$pid" 2>/dev/null || true
        log "stopped $name (pid $pid, $(since "$t") s)"
    fi
    rm -f "$PIDS/$name.pid"
}

ALL_PROCS="etcd containerd fwd-netns fwd-host kube-apiserver kubelet kube-scheduler kube-controller-manager"

check_alive() {
    local name
    for name in $ALL_PROCS; do
        [ -f "$PIDS/$name.pid" ] || continue
        alive "$name" || {
            tail -n 30 "$LOGS/$name.log" >&2 || true
            die "$name exited (log: $LOGS/$name.log)"
        }
    done
}

# wait_for DESCRIPTION TIMEOUT COMMAND...: polls COMMAND, failing early if a process died.
wait_for() {
    local what=$1 timeout=$2 deadline
    shift 2
    deadline=$(($(date +%s) + timeout))
    until "$@"; do
        check_alive
        if [ "$(date +%s)" -ge "$deadline" ]; then
            [ -z "${ON_TIMEOUT:-}" ] || "$ON_TIMEOUT"
            die "$what: not after ${timeout}s"
        fi
        sleep 0.5
    done
}

in_netns() { nsenter "--net=$NETNS_PATH" -- "$@"; }

ctr_() { ctr --address "$SOCK" -n k8s.io "$@"; }

# Containers' processes and their shims: through containerd while it runs, then whatever is
# left in our cgroups, by pid.
stop_pods() {
    local ids left id t
    alive containerd || return 0
    t=$(now)
    ids=$(ctr_ tasks ls -q 2>/dev/null || true)
    [ -n "$ids" ] || return 0
    for id in $ids; do ctr_ tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    # Deleting a task ends its shim and unmounts its rootfs (the CRI plugin may beat us to it).
    for _ in $(seq 1 25); do
        left=$(ctr_ tasks ls -q 2>/dev/null || true)
        [ -n "$left" ] || break
        for id in $left; do ctr_ tasks delete "$id" >/dev/null 2>&1 || true; done
        sleep 0.2
    done
    log "stopped $(echo "$ids" | wc -w) container task(s) ($(since "$t") s)"
}

kill_cgroup_leftovers() {
    local pids n=0
    for _ in $(seq 1 50); do
        pids=$(cgroup_pids)
        [ -n "$pids" ] || break
        n=$(echo "$pids" | wc -w)
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
        sleep 0.2
    done
    [ -z "$(cgroup_pids)" ] || log "warning: processes left in the cgroup $CGROUP_NAME: $(cgroup_pids | tr '\n' ' ')"
    [ "$n" = 0 ] || log "killed $n leftover process(es) in the cgroup $CGROUP_NAME"
}

# containerd 1.6 puts the shims' sockets in /run/containerd/s/sha256(address/ns/id).
remove_shim_sockets() {
    local d id
    for d in "$RUN_DIR/containerd/state/io.containerd.runtime.v2.task/k8s.io"/*/; do
        [ -d "$d" ] || continue
        id=$(basename "$d")
        rm -f "/run/containerd/s/$(printf '%s' "$SOCK/k8s.io/$id" | sha256sum | cut -c1-64)"
    done
    if [ -f "$RUN_DIR/created-run-containerd" ]; then
        rmdir /run/containerd/s /run/containerd 2>/dev/null || true
    fi
}

stop_all() {
    stop kubelet
    stop kube-controller-manager
    stop kube-scheduler
    stop_pods
    stop containerd
    stop kube-apiserver
    stop etcd
    stop fwd-host
    stop fwd-netns
    kill_cgroup_leftovers
    remove_shim_sockets
    umount_below "$RUN_DIR"
    if [ -e "$NETNS_PATH" ]; then
        ip netns delete "$NETNS" 2>/dev/null || log "warning: ip netns delete $NETNS failed"
    fi
    # `ip netns add` leaves /run/netns as a bind mount of itself: undo it if we made it.
    if [ -f "$RUN_DIR/created-run-netns" ] && [ -d /run/netns ] && [ -z "$(ls -A /run/netns)" ]; then
        umount /run/netns 2>/dev/null || true
        rmdir /run/netns 2>/dev/null || true
    fi
    remove_cgroups
    # libcni caches each attachment in /var/lib/cni/results/NETWORK-SANDBOXID-IFNAME (ours and
    # containerd's own loopback network); a CNI DEL removes it, a kill does not.
    local id
    for id in "$RUN_DIR/containerd/root/io.containerd.grpc.v1.cri/sandboxes"/*/; do
        [ -d "$id" ] || continue
        id=$(basename "$id")
        rm -f /var/lib/cni/results/*-"$id"-* 2>/dev/null || true
    done
    rm -f /var/lib/cni/results/"$CNI_NET"-* 2>/dev/null || true
    if [ -f "$RUN_DIR/created-var-lib-cni" ]; then
        rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true
    fi
    rm -rf --one-file-system "$RECIPE_HOST_DIR"
    local keep
    for keep in "$RUN_DIR"/* "$RUN_DIR"/.[!.]*; do
        case "${keep##*/}" in log | .lock | '*' | '.[!.]*') continue ;; esac
        rm -rf --one-file-system "$keep"
    done
}

# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
make_pki() {
    local d=$PKI who
    mkdir -p "$d"
    printf '%s\n' 'basicConstraints=critical,CA:TRUE' 'keyUsage=critical,keyCertSign,cRLSign' \
        'subjectKeyIdentifier=hash' >"$d/ca.ext"
    printf '%s\n' 'basicConstraints=critical,CA:FALSE' \
        'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=serverAuth' \
        "subjectAltName=IP:127.0.0.1,IP:$NODE_IP,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" \
        'subjectKeyIdentifier=hash' 'authorityKeyIdentifier=keyid,issuer' >"$d/apiserver.ext"
    printf '%s\n' 'basicConstraints=critical,CA:FALSE' \
        'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=clientAuth' \
        'subjectKeyIdentifier=hash' 'authorityKeyIdentifier=keyid,issuer' >"$d/client.ext"
    openssl genrsa -out "$d/ca.key" 2048 2>/dev/null
    openssl req -new -key "$d/ca.key" -subj "/CN=stevedore-ci kube CA" -out "$d/ca.csr"
    openssl x509 -req -in "$d/ca.csr" -signkey "$d/ca.key" -extfile "$d/ca.ext" -days 3650 \
        -out "$d/ca.crt" 2>/dev/null
    local name subj ext
    for who in "apiserver|/CN=kube-apiserver|apiserver.ext" \
        "apiserver-kubelet-client|/O=system:masters/CN=kube-apiserver-kubelet-client|client.ext"; do
        IFS='|' read -r name subj ext <<<"$who"
        openssl genrsa -out "$d/$name.key" 2048 2>/dev/null
        openssl req -new -key "$d/$name.key" -subj "$subj" -out "$d/$name.csr"
        openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
            -extfile "$d/$ext" -days 3650 -out "$d/$name.crt" 2>/dev/null
    done
    # One RSA key signs and verifies the service-account tokens.
    openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
    openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
    rm -f "$d"/*.csr "$d"/*.ext "$d"/*.srl
    chmod 0600 "$d"/*.key
    # Static tokens: token,user,uid,"groups"
    local admin rung noexec kubelet sched kcm
    admin=$(openssl rand -hex 24)
    rung=$(openssl rand -hex 24)
    noexec=$(openssl rand -hex 24)
    kubelet=$(openssl rand -hex 24)
    sched=$(openssl rand -hex 24)
    kcm=$(openssl rand -hex 24)
    cat >"$d/tokens.csv" <<EOF
$admin,stevedore-admin,stevedore-admin,system:masters
$rung,stevedore-rung,stevedore-rung
$noexec,stevedore-noexec,stevedore-noexec
$kubelet,system:node:$NODE_NAME,system:node:$NODE_NAME,system:nodes
$sched,system:kube-scheduler,system:kube-scheduler
$kcm,system:kube-controller-manager,system:kube-controller-manager
EOF
    chmod 0600 "$d/tokens.csv"
}

token_of() { awk -F, -v u="$1" '$2 == u { print $1 }' "$PKI/tokens.csv"; }

# write_kubeconfig FILE SERVER USER
write_kubeconfig() {
    local file=$1 server=$2 user=$3
    cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: stevedore-kube
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $user
  user:
    token: $(token_of "$user")
contexts:
- name: $user@stevedore-kube
  context:
    cluster: stevedore-kube
    user: $user
    namespace: default
current-context: $user@stevedore-kube
EOF
    chmod 0600 "$file"
}

write_configs() {
    mkdir -p "$RUN_DIR/containerd" "$RUN_DIR/cni/net.d" "$RUN_DIR/cni/ipam" "$KCFG" "$RUN_DIR/kubelet" \
        "$RUN_DIR/kubelet-pki" "$RUN_DIR/kubelet-plugins" "$RUN_DIR/etcd" "$RUN_DIR/apiserver" \
        "$RUN_DIR/scheduler" "$RUN_DIR/controller-manager"
    chmod 0700 "$RUN_DIR/etcd"
    cat >"$RUN_DIR/containerd/config.toml" <<EOF
# A private containerd for the stevedore CI Kubernetes (written by .ci/engines/kube.sh).
version = 2
root = "$RUN_DIR/containerd/root"
state = "$RUN_DIR/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  address = ""
  level = "info"
[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$RUN_DIR/containerd/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$PAUSE_IMAGE"
    netns_mounts_under_state_dir = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_selinux = false
    # No CAP_SYS_RESOURCE here: runc cannot lower oom_score_adj below containerd's own (the
    # kubelet asks -998 for sandboxes), so clamp it instead of failing every sandbox.
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          BinaryName = "$(command -v runc)"
          Root = "$RUN_DIR/containerd/runc"
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "$RUN_DIR/cni/net.d"
      max_conf_num = 1
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "$RUN_DIR/containerd/certs.d"
EOF
    # A bridge in the namespace, host-local IPAM with its state in the run dir; no ipMasq and
    # no portmap (both would need iptables).
    cat >"$RUN_DIR/cni/net.d/10-$CNI_NET.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$CNI_NET",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$RUN_DIR/cni/ipam"
      }
    }
  ]
}
EOF
    cat >"$RUN_DIR/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $PKI/ca.crt
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_NAME
failSwapOn: false
imageGCHighThresholdPercent: 100
makeIPTablesUtilChains: false
protectKernelDefaults: false
hairpinMode: none
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
serializeImagePulls: false
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
featureGates:
  SizeMemoryBackedVolumes: true
EOF
    # Inside the namespace the components reach the API server directly.
    write_kubeconfig "$KCFG/kubelet" "https://$NODE_IP:6443" "system:node:$NODE_NAME"
    write_kubeconfig "$KCFG/kube-scheduler" "https://127.0.0.1:6443" system:kube-scheduler
    write_kubeconfig "$KCFG/kube-controller-manager" "https://127.0.0.1:6443" system:kube-controller-manager
}

setup_netns() {
    ip netns add "$NETNS"
    ip -n "$NETNS" link set lo up
    ip -n "$NETNS" link add name "$NODE_IFACE" type veth peer name kube1
    ip -n "$NETNS" addr add "$NODE_IP/24" dev "$NODE_IFACE"
    ip -n "$NETNS" link set kube1 up
    ip -n "$NETNS" link set "$NODE_IFACE" up
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The host side: 127.0.0.1:PORT -> a unix socket -> (socat in the namespace) -> the API
# server. TLS passes through untouched. `nodelay` on both TCP legs: with Nagle on, a request
# written in two pieces (headers, then body) waits for a delayed ACK, 40 ms a hop, which a
# client talking to the API server directly never pays.
start_forwarder() {
    start fwd-netns netns socat -t 30 "UNIX-LISTEN:$RUN_DIR/apiserver.sock,fork,unlink-early,mode=600" \
        TCP:127.0.0.1:6443,nodelay
    wait_for "forwarder socket" 10 test -S "$RUN_DIR/apiserver.sock"
    local attempt port
    for attempt in 1 2 3 4 5; do
        port=$((20000 + RANDOM % 40000))
        port_free "$port" || continue
        start fwd-host host socat -t 30 "TCP-LISTEN:$port,bind=127.0.0.1,fork,reuseaddr,nodelay" \
            "UNIX-CONNECT:$RUN_DIR/apiserver.sock"
        for _ in $(seq 1 20); do
            alive fwd-host || break
            if ! port_free "$port"; then
                echo "$port" >"$RUN_DIR/port"
                return 0
            fi
            sleep 0.1
        done
        stop fwd-host
        log "forwarder on port $port did not start (attempt $attempt)"
    done
    die "could not start the forwarder on 127.0.0.1"
}

server() { echo "https://127.0.0.1:$(cat "$RUN_DIR/port")"; }

# api METHOD PATH [JSON]: the API as the admin, through the forwarder.
api() {
    local args=(-sS --fail-with-body --max-time 20 --cacert "$PKI/ca.crt"
        -H "Authorization: Bearer $(token_of stevedore-admin)" -X "$1")
    [ $# -lt 3 ] || args+=(-H 'Content-Type: application/json' --data-binary "$3")
    curl "${args[@]}" "$(server)$2"
}

api_quiet() { api "$@" >/dev/null 2>&1; }

etcd_healthy() { in_netns curl -fsS --max-time 5 http://127.0.0.1:2379/health 2>/dev/null | grep -q '"health":"true"'; }
containerd_up() { ctr --address "$SOCK" version >/dev/null 2>&1; }
apiserver_ready() { api_quiet GET /readyz; }

node_ready() {
    local node
    node=$(api GET "/api/v1/nodes/$NODE_NAME" 2>/dev/null) || return 1
    jq -e '
        ([.status.conditions[]? | select(.type == "Ready" and .status == "True")] | length == 1)
        and ([.spec.taints[]? | select(.key == "node.kubernetes.io/not-ready")] | length == 0)' \
        <<<"$node" >/dev/null
}

default_sa_ready() {
    local sa ns=${1:-default}
    sa=$(api GET "/api/v1/namespaces/$ns/serviceaccounts/default" 2>/dev/null) || return 1
    jq -e '(.secrets // []) | length > 0' <<<"$sa" >/dev/null
}
restricted_sa_ready() { default_sa_ready "$RESTRICTED_NS"; }

# Docker images for the node: the pause image and a busybox, both FROM scratch, with the
# legacy builder and no network.
build_images() {
    local key=$1 d=$RUN_DIR/images
    mkdir -p "$d/pause" "$d/busybox"
    cp "$CACHE_ROOT/$key/pause" "$d/pause/pause"
    printf '%s\n' 'FROM scratch' 'COPY pause /pause' 'ENTRYPOINT ["/pause"]' >"$d/pause/Dockerfile"
    cp /bin/busybox "$d/busybox/busybox"
    printf '%s\n' 'FROM scratch' 'COPY busybox /bin/busybox' 'RUN ["/bin/busybox","--install","-s","/bin"]' \
        'CMD ["/bin/sh"]' >"$d/busybox/Dockerfile"
    local img
    for img in "pause:$PAUSE_IMAGE" "busybox:$BUSYBOX_IMAGE"; do
        DOCKER_BUILDKIT=0 docker build -q --network none -t "${img#*:}" "$d/${img%%:*}" \
            >"$LOGS/docker-build-${img%%:*}.log" 2>&1 || {
            cat "$LOGS/docker-build-${img%%:*}.log" >&2
            die "docker build ${img#*:} failed"
        }
    done
    rm -rf "$d"
}

import_images() {
    [ $# -gt 0 ] || die "usage: kube.sh import IMAGE..."
    containerd_up || die "the cluster's containerd is not running ($SOCK)"
    docker save "$@" | ctr --address "$SOCK" -n k8s.io images import - >/dev/null
}

# PodSecurityPolicy admission is on, as on many 1.20 clusters: a Pod is admitted only under a
# policy its creator may `use`. `stevedore-ci-any` admits anything (the admin, and the rung's
# users in `default`, where the rung's init may start as root to write the inputs);
# `stevedore-ci-restricted` admits only non-root Pods without added capabilities, the only one
# the rung's user may use in $RESTRICTED_NS (where the rung must fall back: issue 43).
setup_psp() {
    local seccomp='"annotations":{"seccomp.security.alpha.kubernetes.io/allowedProfileNames":"*"}'
    local any_groups='"seLinux":{"rule":"RunAsAny"},"supplementalGroups":{"rule":"RunAsAny"},"fsGroup":{"rule":"RunAsAny"}'
    local psp=/apis/policy/v1beta1/podsecuritypolicies
    api POST "$psp" "{\"metadata\":{\"name\":\"stevedore-ci-any\",$seccomp},
        \"spec\":{\"privileged\":true,\"allowPrivilegeEscalation\":true,\"allowedCapabilities\":[\"*\"],
          \"volumes\":[\"*\"],\"hostNetwork\":true,\"hostIPC\":true,\"hostPID\":true,
          \"hostPorts\":[{\"min\":0,\"max\":65535}],\"runAsUser\":{\"rule\":\"RunAsAny\"},$any_groups}}" >/dev/null
    api POST "$psp" "{\"metadata\":{\"name\":\"stevedore-ci-restricted\",$seccomp},
        \"spec\":{\"privileged\":false,\"allowPrivilegeEscalation\":false,\"requiredDropCapabilities\":[\"ALL\"],
          \"volumes\":[\"emptyDir\",\"configMap\",\"secret\",\"projected\",\"downwardAPI\"],
          \"runAsUser\":{\"rule\":\"MustRunAsNonRoot\"},$any_groups}}" >/dev/null
    api POST /api/v1/namespaces "{\"metadata\":{\"name\":\"$RESTRICTED_NS\"}}" >/dev/null
}

# use_psp NAME: the rule that lets a Role's subjects create Pods under that policy.
use_psp() { printf '{"apiGroups":["policy"],"resources":["podsecuritypolicies"],"verbs":["use"],"resourceNames":["%s"]}' "$1"; }

setup_rbac() {
    setup_psp
    local rules_exec rules_noexec rules_restricted pods='{"apiGroups":[""],"resources":["pods"],"verbs":["create","get","list","watch","delete"]}'
    local podlog='{"apiGroups":[""],"resources":["pods/log"],"verbs":["get"]}'
    local streams='{"apiGroups":[""],"resources":["pods/attach","pods/exec"],"verbs":["get","create"]}'
    rules_exec="[$pods,$streams,$podlog,$(use_psp stevedore-ci-any)]"
    rules_noexec="[$pods,{\"apiGroups\":[\"\"],\"resources\":[\"pods/attach\"],\"verbs\":[\"get\",\"create\"]},$podlog,$(use_psp stevedore-ci-any)]"
    rules_restricted="[$pods,$streams,$podlog,$(use_psp stevedore-ci-restricted)]"
    local rb=/apis/rbac.authorization.k8s.io/v1/namespaces/default
    api POST "$rb/roles" "{\"metadata\":{\"name\":\"stevedore-rung\"},\"rules\":$rules_exec}" >/dev/null
    api POST "$rb/roles" "{\"metadata\":{\"name\":\"stevedore-rung-noexec\"},\"rules\":$rules_noexec}" >/dev/null
    local rr=/apis/rbac.authorization.k8s.io/v1/namespaces/$RESTRICTED_NS
    api POST "$rr/roles" "{\"metadata\":{\"name\":\"stevedore-rung\"},\"rules\":$rules_restricted}" >/dev/null
    # Optional for the rung (README, "Kubernetes"): with nodes readable, a Pod no node could
    # take even empty fails at once, naming the biggest node; without, it waits launch_timeout.
    local crb=/apis/rbac.authorization.k8s.io/v1
    api POST "$crb/clusterroles" '{"metadata":{"name":"stevedore-rung-nodes"},
        "rules":[{"apiGroups":[""],"resources":["nodes"],"verbs":["get","list"]}]}' >/dev/null
    api POST "$crb/clusterrolebindings" '{"metadata":{"name":"stevedore-rung-nodes"},
        "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"stevedore-rung-nodes"},
        "subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"stevedore-rung"}]}' >/dev/null
    local user role ns
    for user in default:stevedore-rung:stevedore-rung default:stevedore-noexec:stevedore-rung-noexec \
        "$RESTRICTED_NS:stevedore-rung:stevedore-rung"; do
        IFS=: read -r ns user role <<<"$user"
        api POST "/apis/rbac.authorization.k8s.io/v1/namespaces/$ns/rolebindings" "{\"metadata\":{\"name\":\"$user\"},
            \"roleRef\":{\"apiGroup\":\"rbac.authorization.k8s.io\",\"kind\":\"Role\",\"name\":\"$role\"},
            \"subjects\":[{\"apiGroup\":\"rbac.authorization.k8s.io\",\"kind\":\"User\",\"name\":\"$user\"}]}" >/dev/null
    done
}

smoke_pod_done() {
    local pod
    pod=$(api GET "/api/v1/namespaces/default/pods/$SMOKE_POD" 2>/dev/null) || return 1
    jq -e '.status.phase == "Failed" or .status.phase == "Succeeded"' <<<"$pod" >/dev/null
}

# On a smoke Pod timeout: its status and the namespace's recent events.
smoke_pod_diag() {
    api GET "/api/v1/namespaces/default/pods/$SMOKE_POD" 2>/dev/null | jq -c '.status' >&2 || true
    api GET /api/v1/namespaces/default/events 2>/dev/null |
        jq -r '.items[] | "\(.lastTimestamp) \(.involvedObject.name) \(.reason): \(.message)"' |
        tail -n 15 >&2 || true
}
smoke_pod_gone() {
    local code
    code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 10 --cacert "$PKI/ca.crt" \
        -H "Authorization: Bearer $(token_of stevedore-admin)" \
        "$(server)/api/v1/namespaces/default/pods/$SMOKE_POD" 2>/dev/null || true)
    [ "$code" = 404 ]
}

smoke_pod() {
    local t pod code phase logs
    t=$(now)
    api POST /api/v1/namespaces/default/pods "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",
        \"metadata\":{\"name\":\"$SMOKE_POD\"},
        \"spec\":{\"restartPolicy\":\"Never\",\"automountServiceAccountToken\":false,
          \"terminationGracePeriodSeconds\":1,
          \"containers\":[{\"name\":\"smoke\",\"image\":\"$BUSYBOX_IMAGE\",\"imagePullPolicy\":\"Never\",
            \"command\":[\"/bin/sh\",\"-c\",\"echo stevedore kube smoke; exit 3\"]}]}}" >/dev/null
    ON_TIMEOUT=smoke_pod_diag wait_for "smoke Pod to terminate" "$SMOKE_TIMEOUT" smoke_pod_done
    pod=$(api GET "/api/v1/namespaces/default/pods/$SMOKE_POD")
    code=$(jq -r '.status.containerStatuses[0].state.terminated.exitCode' <<<"$pod")
    phase=$(jq -r '.status.phase' <<<"$pod")
    log "timing: smoke Pod create to terminated $(since "$t") s (phase $phase, exit code $code)"
    if [ "$code" != 3 ] || [ "$phase" != Failed ]; then
        die "smoke Pod: exit code $code, phase $phase (expected 3, Failed)"
    fi
    logs=$(api GET "/api/v1/namespaces/default/pods/$SMOKE_POD/log")
    [ "$logs" = "stevedore kube smoke" ] || die "smoke Pod log: '$logs'"
    api DELETE "/api/v1/namespaces/default/pods/$SMOKE_POD?gracePeriodSeconds=0" >/dev/null
    wait_for "smoke Pod deletion" 60 smoke_pod_gone
}

write_import_wrapper() {
    mkdir -p "$RUN_DIR/bin"
    cat >"$RUN_DIR/bin/kube-import" <<EOF
#!/usr/bin/env bash
# Puts local docker images onto the stevedore CI Kubernetes node (written by .ci/engines/kube.sh):
#   kube-import IMAGE...   (then use them in Pods with imagePullPolicy: Never)
set -euo pipefail
[ \$# -gt 0 ] || { echo "usage: \$0 IMAGE..." >&2; exit 2; }
docker save "\$@" | ctr --address $SOCK -n k8s.io images import - >/dev/null
EOF
    chmod 0755 "$RUN_DIR/bin/kube-import"
    ln -sf "$CACHE_ROOT/$(cat "$RUN_DIR/cache_key")/bin/kubectl" "$RUN_DIR/bin/kubectl"
}

write_env() {
    local version
    version=$(api GET /version | jq -r .gitVersion)
    # The clients' kubeconfigs: through the forwarder, CA embedded, a static token each.
    write_kubeconfig "$KCFG/admin" "$(server)" stevedore-admin
    write_kubeconfig "$KCFG/rung" "$(server)" stevedore-rung
    write_kubeconfig "$KCFG/noexec" "$(server)" stevedore-noexec
    cat >"$RUN_DIR/env.tmp" <<EOF
KUBE_ADMIN_CONFIG=$KCFG/admin
KUBE_RUNG_CONFIG=$KCFG/rung
KUBE_NOEXEC_CONFIG=$KCFG/noexec
KUBE_SERVER=$(server)
KUBE_CA=$PKI/ca.crt
KUBE_ADMIN_TOKEN=$(token_of stevedore-admin)
KUBE_RUNG_TOKEN=$(token_of stevedore-rung)
KUBE_NOEXEC_TOKEN=$(token_of stevedore-noexec)
KUBE_NODE=$NODE_NAME
KUBE_NODE_IP=$NODE_IP
KUBE_NAMESPACE=default
KUBE_RESTRICTED_NAMESPACE=$RESTRICTED_NS
KUBE_VERSION=$version
KUBE_FEATURE_GATES=$FEATURE_GATES
KUBE_IMPORT=$RUN_DIR/bin/kube-import
KUBE_KUBECTL=$RUN_DIR/bin/kubectl
KUBE_CONTAINERD_SOCK=$SOCK
KUBE_BUSYBOX_IMAGE=$BUSYBOX_IMAGE
KUBE_PAUSE_IMAGE=$PAUSE_IMAGE
KUBE_NETNS=$NETNS
KUBE_LOG_DIR=$LOGS
EOF
    mv "$RUN_DIR/env.tmp" "$RUN_DIR/env"
    log "cluster: Kubernetes $version, node $NODE_NAME ($NODE_IP), API $(server)"
}

healthy() {
    local name
    for name in $ALL_PROCS; do alive "$name" || return 1; done
    [ -f "$RUN_DIR/port" ] && [ -f "$PKI/tokens.csv" ] && apiserver_ready && node_ready
}

start_cluster() {
    local key=$1 t
    mkdir -p "$PIDS" "$LOGS"
    [ -e /run/containerd ] || touch "$RUN_DIR/created-run-containerd"
    [ -e /var/lib/cni ] || touch "$RUN_DIR/created-var-lib-cni"
    [ -e /run/netns ] || touch "$RUN_DIR/created-run-netns"
    make_pki
    write_configs
    setup_netns
    setup_cgroups
    local bin=$CACHE_ROOT/$key/bin

    t=$(now)
    start etcd netns etcd --name stevedore-kube --data-dir "$RUN_DIR/etcd" \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster stevedore-kube=http://127.0.0.1:2380 --initial-cluster-state new \
        --unsafe-no-fsync --logger zap --log-level warn
    wait_for "etcd health" 60 etcd_healthy
    log "etcd healthy after $(since "$t") s"

    t=$(now)
    start containerd netns containerd --config "$RUN_DIR/containerd/config.toml"
    wait_for "containerd" 60 containerd_up
    log "containerd up after $(since "$t") s"

    t=$(now)
    build_images "$key"
    import_images "$PAUSE_IMAGE" "$BUSYBOX_IMAGE"
    log "images $PAUSE_IMAGE and $BUSYBOX_IMAGE built and imported in $(since "$t") s"

    t=$(now)
    start_forwarder
    start kube-apiserver netns "$bin/kube-apiserver" \
        --etcd-servers=http://127.0.0.1:2379 \
        --bind-address=0.0.0.0 --secure-port=6443 --insecure-port=0 --advertise-address="$NODE_IP" \
        --cert-dir="$RUN_DIR/apiserver" \
        --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
        --client-ca-file="$PKI/ca.crt" \
        --token-auth-file="$PKI/tokens.csv" \
        --authorization-mode=Node,RBAC \
        --enable-admission-plugins=NodeRestriction,PodSecurityPolicy \
        --allow-privileged=true \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
        --service-cluster-ip-range="$SERVICE_CIDR" \
        --endpoint-reconciler-type=none \
        --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
        --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
        --kubelet-preferred-address-types=InternalIP \
        --feature-gates="$FEATURE_GATES" \
        --profiling=false
    wait_for "kube-apiserver /readyz" 180 apiserver_ready
    log "kube-apiserver ready after $(since "$t") s"
    setup_rbac

    start kubelet netns "$bin/kubelet" \
        --config="$RUN_DIR/kubelet-config.yaml" --kubeconfig="$KCFG/kubelet" \
        --container-runtime=remote --container-runtime-endpoint="unix://$SOCK" \
        --node-ip="$NODE_IP" --hostname-override="$NODE_NAME" \
        --pod-infra-container-image="$PAUSE_IMAGE" \
        --root-dir="$RUN_DIR/kubelet" --cert-dir="$RUN_DIR/kubelet-pki" \
        --volume-plugin-dir="$RUN_DIR/kubelet-plugins"
    start kube-scheduler netns "$bin/kube-scheduler" \
        --kubeconfig="$KCFG/kube-scheduler" --leader-elect=false \
        --bind-address=127.0.0.1 --port=0 --cert-dir="$RUN_DIR/scheduler" \
        --feature-gates="$FEATURE_GATES"
    start kube-controller-manager netns "$bin/kube-controller-manager" \
        --kubeconfig="$KCFG/kube-controller-manager" --leader-elect=false \
        --bind-address=127.0.0.1 --port=0 --cert-dir="$RUN_DIR/controller-manager" \
        --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
        --use-service-account-credentials=true \
        --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
        --feature-gates="$FEATURE_GATES"
    wait_for "node $NODE_NAME Ready and untainted" "$READY_TIMEOUT" node_ready
    wait_for "service account default/default" 60 default_sa_ready
    wait_for "service account $RESTRICTED_NS/default" 60 restricted_sa_ready
}

cmd_up() {
    ensure_tools
    mkdir -p "$RUN_DIR"
    exec 9>"$RUN_DIR/.lock"
    flock -w "$LOCK_TIMEOUT" 9 || die "another kube.sh holds $RUN_DIR/.lock"
    if healthy; then
        log "already up (API $(server))"
        write_env
        echo "$RUN_DIR/env"
        return 0
    fi
    [ ! -f "$PIDS/kube-apiserver.pid" ] || log "a previous cluster is not healthy: restarting"
    stop_all
    local key t t0
    t0=$(now)
    key=$(recipe_key)
    t=$(now)
    if [ "${STEVEDORE_KUBE_REBUILD:-0}" = 1 ]; then
        run_build "$key" force
        log "timing: build $(since "$t") s"
    elif [ -f "$CACHE_ROOT/$key/complete" ]; then
        log "timing: cache hit, $CACHE_ROOT/$key"
    else
        run_build "$key"
        log "timing: build $(since "$t") s"
    fi
    # From here on a failure stops whatever was started.
    trap 'rc=$?; if [ $rc != 0 ]; then log "up failed: stopping what it started (logs: $LOGS)"; stop_all || true; fi' EXIT
    trap 'exit 130' INT TERM
    echo "$key" >"$RUN_DIR/cache_key"
    t=$(now)
    start_cluster "$key"
    log "timing: bring-up to node Ready $(since "$t") s"
    smoke_pod
    write_import_wrapper
    write_env
    trap - EXIT INT TERM
    log "timing: up total $(since "$t0") s"
    echo "$RUN_DIR/env"
}

cmd_build() {
    ensure_tools
    local key t
    key=$(recipe_key)
    if [ "${STEVEDORE_KUBE_REBUILD:-0}" != 1 ] && [ -f "$CACHE_ROOT/$key/complete" ]; then
        log "build: cache hit, $CACHE_ROOT/$key"
        return 0
    fi
    t=$(now)
    if [ "${STEVEDORE_KUBE_REBUILD:-0}" = 1 ]; then run_build "$key" force; else run_build "$key"; fi
    log "timing: build $(since "$t") s"
}

cmd_down() {
    [ -d "$RUN_DIR" ] || [ -e "$NETNS_PATH" ] || {
        log "down (nothing to stop)"
        return 0
    }
    mkdir -p "$RUN_DIR"
    exec 9>"$RUN_DIR/.lock"
    flock -w "$LOCK_TIMEOUT" 9 || die "another kube.sh holds $RUN_DIR/.lock"
    local t
    t=$(now)
    stop_all
    log "down ($(since "$t") s)"
}

cmd_status() {
    if [ -f "$RUN_DIR/env" ] && healthy; then
        echo "up $RUN_DIR/env"
    else
        echo down
        return 1
    fi
}

case "${1:-}" in
build) cmd_build ;;
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
import)
    shift
    import_images "$@"
    ;;
key)
    recipe_key
    ;;
_build)
    shift
    build_cache "$@"
    ;;
*)
    echo "usage: $0 build|up|down|status|import IMAGE...|key" >&2
    exit 2
    ;;
esac
