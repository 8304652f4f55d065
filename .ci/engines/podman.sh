#!/usr/bin/env bash
# Podman's Docker-compatible API on this host, for CI: a rootful `podman system service`
# on its own unix socket, with its own storage, run root and network config under the run dir
# (nothing shared with a host podman or with dockerd).
#
#   .ci/engines/podman.sh up       start the service (if not running), wait for /_ping;
#                                  prints the path of the env file (only that, on stdout)
#   .ci/engines/podman.sh down     stop the service, remove its containers and storage
#   .ci/engines/podman.sh status   prints "up ENV_FILE" (exit 0) or "down" (exit 1)
#
# See README.md next to this script.
set -euo pipefail
# shellcheck source=.ci/apt.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../apt.sh"

RUN_DIR=${STEVEDORE_PODMAN_RUN:-/run/stevedore-ci/podman}
START_TIMEOUT=${STEVEDORE_PODMAN_START_TIMEOUT:-60}
LOCK_TIMEOUT=300

log() { printf 'podman.sh: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

case "$RUN_DIR" in
*[[:space:]]*) die "STEVEDORE_PODMAN_RUN must not contain whitespace" ;;
/?*) ;;
*) die "STEVEDORE_PODMAN_RUN must be an absolute path below / (got '$RUN_DIR')" ;;
esac

SOCK=$RUN_DIR/podman.sock
CONF=$RUN_DIR/containers.conf

ensure_tools() {
    local pkgs=() pair
    for pair in podman:podman curl:curl flock:util-linux findmnt:util-linux; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || pkgs+=("${pair#*:}")
    done
    [ ${#pkgs[@]} -gt 0 ] || return 0
    mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
    log "installing: ${pkgs[*]}"
    apt_update -qq >&2
    # --no-remove: never let apt remove a package to make room.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-remove \
        "${pkgs[@]}" >&2
}

# podman with this run dir's config and storage.
pm() { CONTAINERS_CONF=$CONF podman --root "$RUN_DIR/storage" --runroot "$RUN_DIR/runroot" "$@"; }

service_pid() { cat "$RUN_DIR/podman.pid" 2>/dev/null || true; }

service_alive() {
    local pid
    pid=$(service_pid)
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] &&
        tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "unix://$SOCK"
}

# Whether the service this script just started still runs: its pid (our child) is there and
# not a zombie. Its command line is not looked at: right after the fork it is still this
# shell's, until setsid has exec'd podman (on a busy machine that takes a while).
child_running() {
    local pid state
    pid=$(service_pid)
    [ -n "$pid" ] && state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) && [ "$state" != Z ]
}

ping() { curl -fsS --max-time 5 --unix-socket "$SOCK" http://d/_ping 2>/dev/null | grep -qx OK; }

# Rootful Podman gives every container nofile and nproc limits of 1048576 unless told
# otherwise; without CAP_SYS_RESOURCE (the case on this machine) runc then fails with
# "error setting rlimit type 7/6: operation not permitted", which the Docker API reports
# as 409 on attach/start. Defaults no higher than the service's own hard limits avoid it.
write_conf() {
    local nofile=$1 nproc=$2
    cat >"$CONF" <<EOF
# containers.conf for the stevedore CI podman service (written by .ci/engines/podman.sh)
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[network]
network_config_dir = "$RUN_DIR/net"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$RUN_DIR/tmp"
EOF
}

hard_limit() { awk -v what="$2" '$0 ~ "^Max " what " " { print $(NF-1) }' "/proc/$1/limits"; }

min() { if [ "$1" = unlimited ] || { [ "$2" != unlimited ] && [ "$2" -lt "$1" ]; }; then echo "$2"; else echo "$1"; fi; }

start_service() {
    rm -f "$SOCK" "$RUN_DIR/podman.pid"
    # The background job is not a process-group leader, so setsid execs in place and $! is
    # podman's pid. The lock fd is closed so the service does not hold it.
    CONTAINERS_CONF=$CONF setsid podman --root "$RUN_DIR/storage" --runroot "$RUN_DIR/runroot" \
        system service --time=0 "unix://$SOCK" </dev/null >>"$RUN_DIR/service.log" 2>&1 9>&- &
    echo $! >"$RUN_DIR/podman.pid"
    local deadline=$(($(date +%s) + START_TIMEOUT))
    until ping; do
        child_running || {
            tail -n 20 "$RUN_DIR/service.log" >&2 || true
            die "podman system service exited (log: $RUN_DIR/service.log)"
        }
        [ "$(date +%s)" -lt "$deadline" ] || die "no answer on $SOCK after ${START_TIMEOUT}s"
        sleep 0.2
    done
}

stop_service() {
    local pid
    pid=$(service_pid)
    if service_alive; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do
            [ -d "/proc/$pid" ] || break
            sleep 0.2
        done
        [ ! -d "/proc/$pid" ] || kill -KILL "$pid" 2>/dev/null || true
        log "stopped podman system service (pid $pid)"
    fi
    rm -f "$RUN_DIR/podman.pid" "$SOCK"
}

json_field() { grep -o "\"$1\":\"[^\"]*\"" | head -n 1 | cut -d'"' -f4; }

write_env() {
    local version info
    version=$(curl -fsS --max-time 10 --unix-socket "$SOCK" http://d/version)
    info=$(curl -fsS --max-time 10 --unix-socket "$SOCK" http://d/info)
    cat >"$RUN_DIR/env.tmp" <<EOF
PODMAN_DOCKER_HOST=unix://$SOCK
PODMAN_SOCKET=$SOCK
PODMAN_SERVER_VERSION=$(json_field Version <<<"$version")
PODMAN_API_VERSION=$(json_field ApiVersion <<<"$version")
PODMAN_CGROUP_VERSION=$(json_field CgroupVersion <<<"$info")
PODMAN_PID=$(service_pid)
PODMAN_LOG=$RUN_DIR/service.log
EOF
    mv "$RUN_DIR/env.tmp" "$RUN_DIR/env"
    log "engine: Podman $(json_field Version <<<"$version") (Docker API $(json_field ApiVersion <<<"$version")), cgroup v$(json_field CgroupVersion <<<"$info")"
}

cmd_up() {
    ensure_tools
    mkdir -p "$RUN_DIR"
    exec 9>"$RUN_DIR/.lock"
    flock -w "$LOCK_TIMEOUT" 9 || die "another podman.sh holds $RUN_DIR/.lock"
    if service_alive && ping; then
        log "already up (pid $(service_pid))"
        write_env
        echo "$RUN_DIR/env"
        return 0
    fi
    stop_service
    mkdir -p "$RUN_DIR/storage" "$RUN_DIR/runroot" "$RUN_DIR/net" "$RUN_DIR/tmp"
    local t nofile nproc got_nofile got_nproc
    t=$(now)
    # Podman lowers its own RLIMIT_NPROC to 32768 at start (seen with 4.3.1).
    nofile=$(min "$(ulimit -Hn)" 1048576)
    nproc=$(min "$(ulimit -Hu)" 32768)
    write_conf "$nofile" "$nproc"
    start_service
    got_nofile=$(hard_limit "$(service_pid)" 'open files')
    got_nproc=$(hard_limit "$(service_pid)" processes)
    if [ "$(min "$nofile" "$got_nofile")" != "$nofile" ] || [ "$(min "$nproc" "$got_nproc")" != "$nproc" ]; then
        log "the service runs with nofile=$got_nofile nproc=$got_nproc: restarting with those defaults"
        stop_service
        write_conf "$(min "$nofile" "$got_nofile")" "$(min "$nproc" "$got_nproc")"
        start_service
    fi
    log "timing: start to /_ping $(since "$t") s (pid $(service_pid), socket $SOCK)"
    write_env
    echo "$RUN_DIR/env"
}

cmd_down() {
    [ -d "$RUN_DIR" ] || {
        log "down (nothing to stop)"
        return 0
    }
    exec 9>"$RUN_DIR/.lock"
    flock -w "$LOCK_TIMEOUT" 9 || die "another podman.sh holds $RUN_DIR/.lock"
    stop_service
    if [ -d "$RUN_DIR/storage" ] && [ -f "$CONF" ] && command -v podman >/dev/null 2>&1; then
        # Containers outlive the service (conmon): stop and remove them, then the storage.
        pm rm --all --force --time 0 >/dev/null 2>&1 || log "warning: podman rm --all failed"
        pm pod rm --all --force >/dev/null 2>&1 || true
    fi
    local mnt
    findmnt -rn -o TARGET | awk -v d="$RUN_DIR/" 'index($0, d) == 1' | sort -r |
        while read -r mnt; do umount -l "$mnt" || true; done
    rm -rf --one-file-system "${RUN_DIR:?}/storage" "${RUN_DIR:?}/runroot" "${RUN_DIR:?}/net" \
        "${RUN_DIR:?}/tmp" "$RUN_DIR/env" "$RUN_DIR/env.tmp" "$CONF"
    log "down"
}

cmd_status() {
    if service_alive && [ -f "$RUN_DIR/env" ]; then
        echo "up $RUN_DIR/env"
    else
        echo down
        return 1
    fi
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
*)
    echo "usage: $0 up|down|status" >&2
    exit 2
    ;;
esac
