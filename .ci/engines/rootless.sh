#!/usr/bin/env bash
# Rootless Podman as an ordinary user, for CI: a user of this script's own (subordinate id
# ranges, a home and an XDG_RUNTIME_DIR under the run dir, no logind), that user's
# `podman system service` on a socket in its runtime dir, runc named as the runtime (Debian's
# crun refuses this host's cgroups), cgroupfs as the manager (no systemd user session).
#
#   .ci/engines/rootless.sh up       make the user, start its service, wait for /_ping;
#                                    prints the path of the env file (only that, on stdout)
#   .ci/engines/rootless.sh down     kill every process of the user (the service, conmon,
#                                    the pause process, catatonit, slirp4netns), remove its
#                                    containers' mounts, the user, its id ranges, the run dir
#   .ci/engines/rootless.sh status   prints "up ENV_FILE" (exit 0) or "down" (exit 1)
#
# See README.md next to this script.
set -euo pipefail
# shellcheck source=.ci/apt.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../apt.sh"

RUN_DIR=${STEVEDORE_ROOTLESS_RUN:-/run/stevedore-ci/rootless}
USER_NAME=${STEVEDORE_ROOTLESS_USER:-stevedore-rootless}
START_TIMEOUT=${STEVEDORE_ROOTLESS_START_TIMEOUT:-90}
LOCK_TIMEOUT=300
# The subordinate ids: 65536 of them, above every range already given.
RANGE=65536

log() { printf 'rootless.sh: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

case "$RUN_DIR" in
*[[:space:]]*) die "STEVEDORE_ROOTLESS_RUN must not contain whitespace" ;;
/?*/*stevedore* | /?*/*rootless*) ;;
*) die "STEVEDORE_ROOTLESS_RUN must be an absolute path whose name says stevedore or rootless (got '$RUN_DIR')" ;;
esac
# Outside the run dir: `down` removes the run dir while holding it.
LOCK=$RUN_DIR.lock
# What this script made: `down` removes a user or a run dir only with its mark.
MARK=$RUN_DIR/.made-by-rootless.sh
[[ "$USER_NAME" =~ ^[a-z][a-z0-9-]{0,30}$ ]] || die "STEVEDORE_ROOTLESS_USER must be a plain user name"

HOME_DIR=$RUN_DIR/home
XDG=$RUN_DIR/xdg
SOCK=$XDG/podman/podman.sock

ensure_tools() {
    local pkgs=() pair
    for pair in podman:podman newuidmap:uidmap slirp4netns:slirp4netns curl:curl flock:util-linux \
        findmnt:util-linux runuser:util-linux useradd:passwd; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || pkgs+=("${pair#*:}")
    done
    [ ${#pkgs[@]} -gt 0 ] || return 0
    mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
    log "installing: ${pkgs[*]}"
    apt_update -qq >&2
    # --no-install-recommends: never crun (Podman would take it as its default, and it fails here).
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-remove \
        "${pkgs[@]}" >&2
}

# The user's environment: no login session, so every variable its podman reads is given.
as_user() {
    runuser -u "$USER_NAME" -- env -i HOME="$HOME_DIR" XDG_RUNTIME_DIR="$XDG" \
        XDG_CONFIG_HOME="$HOME_DIR/.config" PATH=/usr/local/bin:/usr/bin:/bin "$@"
}

user_exists() { id -u "$USER_NAME" >/dev/null 2>&1; }

# The first id above every range in /etc/subuid and /etc/subgid (at least 200000).
free_start() {
    cat /etc/subuid /etc/subgid 2>/dev/null |
        awk -F: 'BEGIN { m = 200000 } NF == 3 { e = $2 + $3; if (e > m) m = e } END { print m }'
}

make_user() {
    install -d -m 0755 "$RUN_DIR"
    if ! user_exists; then
        useradd --home-dir "$HOME_DIR" --no-create-home --shell /usr/sbin/nologin --user-group "$USER_NAME"
        echo "$USER_NAME" >"$MARK"
        log "made user $USER_NAME (uid $(id -u "$USER_NAME"))"
    elif [ "$(cat "$MARK" 2>/dev/null)" != "$USER_NAME" ]; then
        die "a user $USER_NAME exists that this script did not make: choose another STEVEDORE_ROOTLESS_USER"
    fi
    if ! grep -q "^$USER_NAME:" /etc/subuid 2>/dev/null || ! grep -q "^$USER_NAME:" /etc/subgid 2>/dev/null; then
        local start
        start=$(free_start)
        usermod --add-subuids "$start-$((start + RANGE - 1))" --add-subgids "$start-$((start + RANGE - 1))" "$USER_NAME"
        log "gave $USER_NAME the subordinate ids $start-$((start + RANGE - 1))"
    fi
    install -d -m 0700 -o "$USER_NAME" -g "$USER_NAME" "$HOME_DIR" "$XDG"
    install -d -m 0700 -o "$USER_NAME" -g "$USER_NAME" "$HOME_DIR/.config" "$HOME_DIR/.config/containers"
    cat >"$HOME_DIR/.config/containers/containers.conf" <<EOF
# containers.conf for the stevedore CI rootless podman service (written by .ci/engines/rootless.sh)
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    chown "$USER_NAME:$USER_NAME" "$HOME_DIR/.config/containers/containers.conf"
}

ping() { curl -fsS --max-time 5 --unix-socket "$SOCK" http://d/_ping 2>/dev/null | grep -qx OK; }

service_pid() { cat "$RUN_DIR/podman.pid" 2>/dev/null || true; }

service_alive() {
    local pid
    pid=$(service_pid)
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "unix://$SOCK"
}

start_service() {
    install -d -m 0700 -o "$USER_NAME" -g "$USER_NAME" "$XDG/podman"
    rm -f "$SOCK"
    # setsid in place (the background job is no group leader): $! is runuser's pid, whose
    # child is podman; the lock fd is closed so the service does not hold it.
    setsid runuser -u "$USER_NAME" -- env -i HOME="$HOME_DIR" XDG_RUNTIME_DIR="$XDG" \
        XDG_CONFIG_HOME="$HOME_DIR/.config" PATH=/usr/local/bin:/usr/bin:/bin \
        podman system service --time=0 "unix://$SOCK" </dev/null >>"$RUN_DIR/service.log" 2>&1 9>&- &
    echo $! >"$RUN_DIR/runuser.pid"
    local deadline=$(($(date +%s) + START_TIMEOUT)) pid
    until ping; do
        [ -d "/proc/$(cat "$RUN_DIR/runuser.pid")" ] || {
            tail -n 20 "$RUN_DIR/service.log" >&2 || true
            die "the user's podman system service exited (log: $RUN_DIR/service.log)"
        }
        [ "$(date +%s)" -lt "$deadline" ] || die "no answer on $SOCK after ${START_TIMEOUT}s"
        sleep 0.2
    done
    pid=$(pgrep -u "$USER_NAME" -f "system service --time=0 unix://$SOCK" | head -n 1)
    echo "$pid" >"$RUN_DIR/podman.pid"
}

json_field() { grep -o "\"$1\":\"[^\"]*\"" | head -n 1 | cut -d'"' -f4; }

write_env() {
    local version info
    version=$(curl -fsS --max-time 10 --unix-socket "$SOCK" http://d/version)
    info=$(curl -fsS --max-time 10 --unix-socket "$SOCK" http://d/info)
    cat >"$RUN_DIR/env.tmp" <<EOF
ROOTLESS_DOCKER_HOST=unix://$SOCK
ROOTLESS_USER=$USER_NAME
ROOTLESS_UID=$(id -u "$USER_NAME")
ROOTLESS_GID=$(id -g "$USER_NAME")
ROOTLESS_HOME=$HOME_DIR
ROOTLESS_XDG_RUNTIME_DIR=$XDG
ROOTLESS_SUBUIDS=$(grep "^$USER_NAME:" /etc/subuid | head -n 1 | cut -d: -f2-)
ROOTLESS_SERVER_VERSION=$(json_field Version <<<"$version")
ROOTLESS_API_VERSION=$(json_field ApiVersion <<<"$version")
ROOTLESS_CGROUP_VERSION=$(json_field CgroupVersion <<<"$info")
ROOTLESS_LOG=$RUN_DIR/service.log
EOF
    mv "$RUN_DIR/env.tmp" "$RUN_DIR/env"
    log "engine: rootless Podman $(json_field Version <<<"$version") as $USER_NAME (uid $(id -u "$USER_NAME")), cgroup v$(json_field CgroupVersion <<<"$info")"
}

cmd_up() {
    [ "$(id -u)" = 0 ] || die "up needs root (it makes a user)"
    ensure_tools
    install -d -m 0755 "$(dirname "$RUN_DIR")"
    exec 9>"$LOCK"
    flock -w "$LOCK_TIMEOUT" 9 || die "another rootless.sh holds $LOCK"
    if user_exists && service_alive && ping; then
        log "already up (pid $(service_pid))"
        write_env
        echo "$RUN_DIR/env"
        return 0
    fi
    make_user
    local t=$SECONDS
    start_service
    log "timing: start to /_ping $((SECONDS - t)) s (pid $(service_pid), socket $SOCK)"
    write_env
    echo "$RUN_DIR/env"
}

cmd_down() {
    [ -e "$LOCK" ] || [ -d "$RUN_DIR" ] || {
        log "down (nothing to stop)"
        return 0
    }
    exec 9>"$LOCK"
    flock -w "$LOCK_TIMEOUT" 9 || die "another rootless.sh holds $LOCK"
    local made
    made=$(cat "$MARK" 2>/dev/null || true)
    if [ "$made" = "$USER_NAME" ] && user_exists; then
        local uid first count pid
        uid=$(id -u "$USER_NAME")
        IFS=: read -r _ first count < <(grep "^$USER_NAME:" /etc/subuid | head -n 1) || true
        # The containers first: their processes run as subordinate ids, which a kill by the
        # user's uid misses.
        if [ -S "$SOCK" ]; then
            timeout 60 runuser -u "$USER_NAME" -- env -i HOME="$HOME_DIR" XDG_RUNTIME_DIR="$XDG" \
                XDG_CONFIG_HOME="$HOME_DIR/.config" PATH=/usr/local/bin:/usr/bin:/bin \
                podman rm --all --force --time 0 >/dev/null 2>&1 || log "warning: podman rm --all failed"
        fi
        # Then everything the user runs (its service, conmon, the pause process that holds
        # its namespaces, catatonit, slirp4netns) and anything left of its subordinate ids.
        pkill -KILL -u "$USER_NAME" 2>/dev/null || true
        if [ -n "${first:-}" ] && [ -n "${count:-}" ]; then
            ps -eo pid=,uid= | while read -r pid u; do
                if [ "$u" -ge "$first" ] && [ "$u" -lt "$((first + count))" ]; then kill -KILL "$pid" 2>/dev/null || true; fi
            done
        fi
        for _ in $(seq 1 50); do
            pgrep -u "$uid" >/dev/null 2>&1 || break
            sleep 0.1
        done
        pgrep -u "$uid" >/dev/null 2>&1 && log "warning: processes of $USER_NAME left: $(pgrep -u "$uid" | tr '\n' ' ')"
    fi
    local mnt
    if [ -d "$RUN_DIR" ]; then
        findmnt -rn -o TARGET | awk -v d="$RUN_DIR/" 'index($0, d) == 1' | sort -r |
            while read -r mnt; do umount -l "$mnt" || true; done
    fi
    if [ "$made" = "$USER_NAME" ] && user_exists; then
        userdel "$USER_NAME" 2>/dev/null || userdel -f "$USER_NAME" || log "warning: userdel $USER_NAME failed"
        # userdel takes its subordinate ids with it; older shadow leaves them.
        if grep -q "^$USER_NAME:" /etc/subuid /etc/subgid 2>/dev/null; then
            log "warning: the subordinate ids of $USER_NAME are still in /etc/subuid or /etc/subgid"
        fi
        log "removed user $USER_NAME"
    elif user_exists; then
        log "left user $USER_NAME: this script did not make it"
    fi
    # Files of the subordinate ids (the containers' layers) are removed as root; only a run
    # dir this script made.
    if [ -n "$made" ] && [ -d "$RUN_DIR" ]; then
        rm -rf --one-file-system "${RUN_DIR:?}"
    fi
    rm -f "$LOCK"
    log "down"
}

cmd_status() {
    if user_exists && service_alive && ping && [ -f "$RUN_DIR/env" ]; then
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
*) die "usage: $0 up|down|status" ;;
esac
