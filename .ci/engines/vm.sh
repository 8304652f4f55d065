#!/usr/bin/env bash
# A second Docker engine for CI, in a qemu VM (Debian bookworm, cgroup v2) that shares
# nothing with the host: its own kernel, disk, dockerd and containerd.
#
#   .ci/engines/vm.sh up       build the disk if missing, boot, wait for the engine;
#                              prints the path of the env file (only that, on stdout)
#   .ci/engines/vm.sh down     stop qemu, remove the per-run overlay
#   .ci/engines/vm.sh status   prints "up ENV_FILE" (exit 0) or "down" (exit 1)
#   .ci/engines/vm.sh key      prints the cache key of the current recipe
#   .ci/engines/vm.sh exec CMD runs CMD as root in the VM over ssh (the tests' engine faults:
#                              `systemctl restart docker`, filling /var/lib/docker)
#
# STEVEDORE_VM_REBUILD=1 .ci/engines/vm.sh up   rebuilds the disk even if it is cached.
#
# See README.md next to this script for the endpoints, the env file and the timings.
set -euo pipefail
# shellcheck source=.ci/apt.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../apt.sh"

CACHE_ROOT=${STEVEDORE_VM_CACHE:-/var/cache/stevedore-ci/vm}
RUN_DIR=${STEVEDORE_VM_RUN:-/run/stevedore-ci/vm}
BOOT_TIMEOUT=${STEVEDORE_VM_BOOT_TIMEOUT:-300} # 48 s on an idle host, 130 s on a busy one
VM_MEM=${STEVEDORE_VM_MEM:-4096}
VM_SMP=${STEVEDORE_VM_SMP:-2}
# restrict=on: the guest reaches neither the host nor the outside; the host-side forwards
# (127.0.0.1 only) still work. STEVEDORE_VM_RESTRICT=off gives the guest NAT access.
VM_RESTRICT=${STEVEDORE_VM_RESTRICT:-on}
MIRROR=${STEVEDORE_VM_MIRROR:-http://deb.debian.org/debian}
LOCK_TIMEOUT=900 # a concurrent `up` may be building the disk

SSH_ALIAS=stevedore-ci-vm

log() { printf 'vm.sh: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

for dir in "$RUN_DIR" "$CACHE_ROOT"; do
    case "$dir" in
    *[[:space:]]*) die "STEVEDORE_VM_RUN and STEVEDORE_VM_CACHE must not contain whitespace" ;;
    /?*) ;;
    *) die "STEVEDORE_VM_RUN and STEVEDORE_VM_CACHE must be absolute paths below / (got '$dir')" ;;
    esac
done

# ---------------------------------------------------------------------------------------------
# The recipe. Everything from here to "end of the recipe" feeds the cache key (recipe_key):
# edit any of it and the next `up` builds a new disk; leave it alone and the cached one is reused.
# ---------------------------------------------------------------------------------------------
RECIPE_SUITE=bookworm
RECIPE_INCLUDE=linux-image-amd64,systemd-sysv,docker.io,iproute2,udev,kmod,e2fsprogs,ca-certificates,openssh-server,dbus,socat
# Rootless Podman for an ordinary user (issue 50): podman's Recommends, which --include skips,
# and a provider of its virtual container-network-stack, which debootstrap cannot resolve.
RECIPE_INCLUDE+=,podman,uidmap,slirp4netns,fuse-overlayfs,dbus-user-session,catatonit,containernetworking-plugins
RECIPE_DISK_SIZE=8G

# Certificates (docker CLI layout for the client: ca.pem cert.pem key.pem) and ssh keys.
recipe_material() {
    local out=$1 d
    d=$(mktemp -d)
    mkdir -p "$out/tls-server" "$out/client" "$out/ssh"
    printf '%s\n' 'basicConstraints=critical,CA:TRUE' 'keyUsage=critical,keyCertSign,cRLSign' \
        'subjectKeyIdentifier=hash' >"$d/ca.ext"
    printf '%s\n' 'basicConstraints=critical,CA:FALSE' \
        'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=serverAuth' \
        'subjectAltName=IP:127.0.0.1,DNS:localhost' 'subjectKeyIdentifier=hash' \
        'authorityKeyIdentifier=keyid,issuer' >"$d/server.ext"
    printf '%s\n' 'basicConstraints=critical,CA:FALSE' \
        'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=clientAuth' \
        'subjectKeyIdentifier=hash' 'authorityKeyIdentifier=keyid,issuer' >"$d/client.ext"
    openssl genrsa -out "$d/ca-key.pem" 2048 2>/dev/null
    openssl req -new -key "$d/ca-key.pem" -subj "/CN=stevedore-ci VM CA" -out "$d/ca.csr"
    openssl x509 -req -in "$d/ca.csr" -signkey "$d/ca-key.pem" -extfile "$d/ca.ext" \
        -days 3650 -out "$d/ca.pem" 2>/dev/null
    local who
    for who in server client; do
        openssl genrsa -out "$d/$who-key.pem" 2048 2>/dev/null
        openssl req -new -key "$d/$who-key.pem" -subj "/CN=stevedore-ci VM $who" -out "$d/$who.csr"
        openssl x509 -req -in "$d/$who.csr" -CA "$d/ca.pem" -CAkey "$d/ca-key.pem" \
            -CAcreateserial -extfile "$d/$who.ext" -days 3650 -out "$d/$who-cert.pem" 2>/dev/null
    done
    cp "$d/ca.pem" "$d/server-cert.pem" "$d/server-key.pem" "$out/tls-server/"
    cp "$d/ca.pem" "$out/client/ca.pem"
    cp "$d/client-cert.pem" "$out/client/cert.pem"
    cp "$d/client-key.pem" "$out/client/key.pem"
    chmod 0600 "$out/tls-server/server-key.pem" "$out/client/key.pem"
    rm -rf "$d"
    ssh-keygen -q -t ed25519 -N '' -C stevedore-ci-client -f "$out/ssh/id_ed25519"
    ssh-keygen -q -t ed25519 -N '' -C $SSH_ALIAS-host -f "$out/ssh/host_ed25519"
}

recipe_debootstrap() {
    local rootfs=$1 debs=$2
    mkdir -p "$debs"
    debootstrap --variant=minbase --include="$RECIPE_INCLUDE" --cache-dir="$debs" \
        "$RECIPE_SUITE" "$rootfs" "$MIRROR" >&2
}

recipe_configure() {
    local r=$1 m=$2
    echo $SSH_ALIAS >"$r/etc/hostname"
    printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n' $SSH_ALIAS >"$r/etc/hosts"
    printf '/dev/vda\t/\text4\trw,errors=remount-ro\t0\t0\n' >"$r/etc/fstab"

    # Network: systemd-networkd, DHCP on every en* link (slirp answers DHCP).
    printf '[Match]\nName=en*\n\n[Network]\nDHCP=ipv4\n' >"$r/etc/systemd/network/20-wired.network"
    chroot "$r" systemctl enable -q systemd-networkd
    # Nothing periodic in a CI guest.
    chroot "$r" systemctl mask -q apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer \
        e2scrub_reap.service fstrim.timer

    # ssh: root by key only, with a host key made by the harness (so the client can pin it).
    rm -f "$r"/etc/ssh/ssh_host_*
    install -m 0600 "$m/ssh/host_ed25519" "$r/etc/ssh/ssh_host_ed25519_key"
    install -m 0644 "$m/ssh/host_ed25519.pub" "$r/etc/ssh/ssh_host_ed25519_key.pub"
    printf '%s\n' 'HostKey /etc/ssh/ssh_host_ed25519_key' 'PermitRootLogin prohibit-password' \
        'PasswordAuthentication no' 'KbdInteractiveAuthentication no' 'UseDNS no' \
        >"$r/etc/ssh/sshd_config.d/stevedore-ci.conf"
    install -d -m 0700 "$r/root/.ssh"
    install -m 0600 "$m/ssh/id_ed25519.pub" "$r/root/.ssh/authorized_keys"

    # dockerd: unix socket + mutual TLS on 2376. One dockerd applies its TLS settings to every
    # tcp:// and fd:// listener, so plain tcp 2375 is a socat front on the unix socket, and
    # the packaged unit (Requires=docker.socket, -H fd://) is replaced, not extended.
    install -d -m 0700 "$r/etc/docker/tls"
    install -m 0644 "$m/tls-server/ca.pem" "$m/tls-server/server-cert.pem" "$r/etc/docker/tls/"
    install -m 0600 "$m/tls-server/server-key.pem" "$r/etc/docker/tls/"
    local exec_start='ExecStart=/usr/sbin/dockerd -H unix:///run/docker.sock -H tcp://0.0.0.0:2376'
    exec_start+=' --tlsverify --tlscacert=/etc/docker/tls/ca.pem'
    exec_start+=' --tlscert=/etc/docker/tls/server-cert.pem --tlskey=/etc/docker/tls/server-key.pem'
    # shellcheck disable=SC2016 # $DOCKER_OPTS is for systemd to expand
    exec_start+=' --containerd=/run/containerd/containerd.sock $DOCKER_OPTS'
    {
        echo '# stevedore CI: the packaged unit without docker.socket, listening on unix + TLS 2376'
        sed -e '/^Requires=docker.socket$/d' -e 's/ docker\.socket//' \
            -e "s|^ExecStart=.*|$exec_start|" "$r/lib/systemd/system/docker.service"
    } >"$r/etc/systemd/system/docker.service"
    grep -q -- '--tlsverify' "$r/etc/systemd/system/docker.service" || die "docker.service: no ExecStart"
    if awk '!/^#/ && /docker\.socket/ { found = 1 } END { exit !found }' "$r/etc/systemd/system/docker.service"; then
        die "docker.service: docker.socket left"
    fi
    chroot "$r" systemctl mask -q docker.socket
    cat >"$r/etc/systemd/system/docker-plain-tcp.service" <<'EOF'
[Unit]
Description=Plain tcp 2375 front for the Docker unix socket (stevedore CI)
After=docker.service
Wants=docker.service

[Service]
# -t: after one side's EOF (a half-close, e.g. stdin closed on attach) keep the other
# direction open for up to an hour instead of socat's default 0.5 s.
ExecStart=/usr/bin/socat -t 3600 TCP-LISTEN:2375,fork,reuseaddr UNIX-CONNECT:/run/docker.sock
Restart=always

[Install]
WantedBy=multi-user.target
EOF
    chroot "$r" systemctl enable -q docker.service containerd.service docker-plain-tcp.service
    # cgroup v2 is bookworm's default (systemd 252, unified hierarchy); `up` checks it.
    recipe_rootless "$r"
}

# Rootless Podman as the ordinary user `rootless` (uid 1000, subordinate ids 100000-165535):
# a lingering systemd user manager (started at boot, no login) whose cgroup has cpu, memory
# and pids delegated (the user@.service drop-in), running that user's Podman API service and
# a plain tcp 2377 front on it (the user's own socat, like 2375's). The service itself is
# delegated cpu, memory and pids: Podman reads the controllers it may use from its own cgroup.
recipe_rootless() {
    local r=$1 units=/home/rootless/.config/systemd/user
    chroot "$r" useradd -m -u 1000 -U -s /bin/sh rootless
    echo 'rootless:100000:65536' >"$r/etc/subuid"
    echo 'rootless:100000:65536' >"$r/etc/subgid"
    install -d "$r/var/lib/systemd/linger"
    : >"$r/var/lib/systemd/linger/rootless"
    install -d "$r/etc/systemd/system/user@.service.d"
    # OOM scores at 0: systemd 252 runs the user manager at 100 and its units at 200, and the
    # Docker API's default OomScoreAdj is 0, which runc may not lower to without privilege
    # ("nsexec: failed to update /proc/self/oom_score_adj": every container of the API fails).
    printf '[Service]\nDelegate=cpu cpuset io memory pids\nOOMScoreAdjust=0\n' \
        >"$r/etc/systemd/system/user@.service.d/delegate.conf"
    install -d "$r/etc/systemd/user.conf.d"
    printf '[Manager]\nDefaultOOMScoreAdjust=0\n' >"$r/etc/systemd/user.conf.d/stevedore-ci.conf"
    install -d "$r$units/default.target.wants" "$r/home/rootless/.config/containers"
    printf '%s\n' '[Unit]' "Description=The user's Podman API (stevedore CI)" '' '[Service]' \
        'ExecStartPre=/bin/mkdir -p %t/podman' \
        'ExecStart=/usr/bin/podman system service --time=0 unix://%t/podman/podman.sock' 'Restart=always' \
        'Delegate=cpu memory pids' \
        '' '[Install]' 'WantedBy=default.target' >"$r$units/podman-api.service"
    printf '%s\n' '[Unit]' "Description=Plain tcp 2377 front for the user's Podman socket (stevedore CI)" \
        'After=podman-api.service' 'Wants=podman-api.service' '' '[Service]' \
        'ExecStart=/usr/bin/socat -t 3600 TCP-LISTEN:2377,fork,reuseaddr UNIX-CONNECT:%t/podman/podman.sock' \
        'Restart=always' '' '[Install]' 'WantedBy=default.target' >"$r$units/podman-tcp.service"
    ln -s ../podman-api.service "$r$units/default.target.wants/podman-api.service"
    ln -s ../podman-tcp.service "$r$units/default.target.wants/podman-tcp.service"
    # runc, as every other engine here runs; the systemd cgroup manager (the delegated slice).
    printf '%s\n' '[engine]' 'runtime = "runc"' 'cgroup_manager = "systemd"' \
        >"$r/home/rootless/.config/containers/containers.conf"
    # The kernel's own overlay (rootless since 5.13), not the vfs copy Podman would pick.
    printf '%s\n' '[storage]' 'driver = "overlay"' >"$r/home/rootless/.config/containers/storage.conf"
    chroot "$r" chown -R rootless:rootless /home/rootless
}

recipe_mkfs() {
    local rootfs=$1 disk=$2
    rm -f "$disk"
    truncate -s "$RECIPE_DISK_SIZE" "$disk"
    mkfs.ext4 -q -F -L stevedore-root -d "$rootfs" "$disk"
}

VM_APPEND="root=/dev/vda rw console=ttyS0 apparmor=0 panic=-1"
# ------------------------------------------ end of the recipe --------------------------------

recipe_key() {
    {
        printf '%s\n' recipe-v1 "$RECIPE_SUITE" "$RECIPE_INCLUDE" "$RECIPE_DISK_SIZE" "$VM_APPEND" \
            "$SSH_ALIAS"
        declare -f recipe_material recipe_debootstrap recipe_configure recipe_rootless recipe_mkfs
    } | sha256sum | cut -c1-16
}

# apt-get install that never removes a package (plain -y would, silently).
apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-remove "$@" >&2
}

# This machine kind ships qemu-utils from bookworm-backports (10.x), which Breaks bookworm's
# qemu-system-common 7.2: take the qemu packages from bookworm-backports then, through a
# temporary source list (nothing under /etc/apt is changed).
apt_install_backports() {
    local t rc=0
    t=$(mktemp -d)
    mkdir -p "$t/lists/partial" "$t/archives/partial"
    { cat /etc/apt/sources.list 2>/dev/null || true; echo "deb $MIRROR bookworm-backports main"; } >"$t/sources.list"
    local o=(-o "Dir::Etc::sourcelist=$t/sources.list" -o "Dir::State::lists=$t/lists"
        -o "Dir::Cache::archives=$t/archives")
    # The whole request from backports where it has a version (-t), not only the qemu-*
    # packages named: their own dependencies (qemu-system-data, seabios) must follow them.
    apt_update "${o[@]}" -qq >&2 &&
        DEBIAN_FRONTEND=noninteractive apt-get "${o[@]}" install -y -qq --no-install-recommends \
            --no-remove -t bookworm-backports "$@" >&2 || rc=$?
    rm -rf "$t"
    return "$rc"
}

ensure_tools() {
    local pkgs=() pair
    for pair in qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils debootstrap:debootstrap \
        mkfs.ext4:e2fsprogs openssl:openssl ssh:openssh-client ssh-keygen:openssh-client \
        curl:curl flock:util-linux findmnt:util-linux; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || pkgs+=("${pair#*:}")
    done
    [ ${#pkgs[@]} -gt 0 ] || return 0
    mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
    log "installing: ${pkgs[*]}"
    apt_update -qq >&2
    if ! apt_install "${pkgs[@]}"; then
        log "bookworm's packages conflict with installed ones; retrying with bookworm-backports for qemu-*"
        apt_install_backports "${pkgs[@]}" || die "could not install: ${pkgs[*]}"
    fi
}

# Unmount anything left mounted below $1 (a killed debootstrap leaves proc/sys/dev mounts).
umount_below() {
    local dir=$1 mnt
    findmnt -rn -o TARGET | awk -v d="$dir/" 'index($0, d) == 1' | sort -r |
        while read -r mnt; do umount -l "$mnt" || true; done
}

remove_tree() {
    [ -e "$1" ] || return 0
    umount_below "$1"
    rm -rf --one-file-system "$1"
}

# Builds $CACHE_ROOT/$1 unless it is complete (or $2 is "force"). Runs in a subshell for its
# own traps.
build_cache() (
    local key=$1 force=${2:-} dest="$CACHE_ROOT/$1" tmp
    mkdir -p "$CACHE_ROOT"
    exec 8>"$CACHE_ROOT/.lock"
    flock -w "$LOCK_TIMEOUT" 8 || die "another build holds $CACHE_ROOT/.lock"
    [ "$force" = force ] || [ ! -f "$dest/complete" ] || exit 0
    # We hold the lock: any other .build-* dir is a killed build's leftover.
    for tmp in "$CACHE_ROOT"/.build-*; do remove_tree "$tmp"; done
    tmp="$CACHE_ROOT/.build-$key-$$"
    trap 'remove_tree "$tmp"' EXIT
    trap 'exit 130' INT TERM
    mkdir -p "$tmp"
    log "building the VM disk (key $key) in $tmp"
    local t0 t
    t0=$(now)
    t=$(now)
    recipe_material "$tmp"
    recipe_debootstrap "$tmp/rootfs" "$CACHE_ROOT/debs"
    log "timing: debootstrap ${RECIPE_SUITE} $(since "$t") s"
    t=$(now)
    recipe_configure "$tmp/rootfs" "$tmp"
    local kernel initrd
    kernel=$(find "$tmp/rootfs/boot" -maxdepth 1 -name 'vmlinuz-*' | sort -V | tail -n 1)
    initrd=$(find "$tmp/rootfs/boot" -maxdepth 1 -name 'initrd.img-*' | sort -V | tail -n 1)
    if [ -z "$kernel" ] || [ -z "$initrd" ]; then die "no kernel/initrd in the rootfs /boot"; fi
    cp "$kernel" "$tmp/vmlinuz"
    cp "$initrd" "$tmp/initrd.img"
    umount_below "$tmp/rootfs"
    recipe_mkfs "$tmp/rootfs" "$tmp/disk.img"
    log "timing: configure + mkfs.ext4 $(since "$t") s"
    remove_tree "$tmp/rootfs"
    declare -f recipe_material recipe_debootstrap recipe_configure recipe_rootless recipe_mkfs >"$tmp/recipe.txt"
    touch "$tmp/complete"
    rm -rf "$dest" # an incomplete leftover (no "complete" marker)
    mv -T "$tmp" "$dest"
    trap - EXIT
    log "timing: disk build total $(since "$t0") s ($(du -sh "$dest/disk.img" | cut -f1) used of $RECIPE_DISK_SIZE)"
    # Drop other keys' disks unless a running VM still uses one as its backing file.
    local in_use="" other
    [ -f "$RUN_DIR/cache_key" ] && qemu_alive && in_use=$(cat "$RUN_DIR/cache_key")
    for other in "$CACHE_ROOT"/*/; do
        other=${other%/}
        case "${other##*/}" in "$key" | "$in_use" | debs) continue ;; esac
        log "removing the stale cache ${other##*/}"
        rm -rf --one-file-system "$other"
    done
)

qemu_pid() { cat "$RUN_DIR/qemu.pid" 2>/dev/null || true; }

qemu_alive() {
    local pid
    pid=$(qemu_pid)
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] &&
        tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$RUN_DIR/overlay.qcow2"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pick_ports() {
    local picked=() p
    while [ ${#picked[@]} -lt 4 ]; do
        p=$((20000 + RANDOM % 40000))
        case " ${picked[*]} " in *" $p "*) continue ;; esac
        port_free "$p" && picked+=("$p")
    done
    echo "${picked[*]}"
}

# Files the clients need, copied out of the cache so the run dir stands alone.
write_client_files() {
    local cache=$1 ssh_port=$2 real_ssh
    rm -rf "${RUN_DIR:?}/client" "${RUN_DIR:?}/ssh" "${RUN_DIR:?}/bin"
    mkdir -p "$RUN_DIR/client" "$RUN_DIR/ssh/state" "$RUN_DIR/bin"
    install -m 0644 "$cache/client/ca.pem" "$cache/client/cert.pem" "$RUN_DIR/client/"
    install -m 0600 "$cache/client/key.pem" "$RUN_DIR/client/"
    install -m 0600 "$cache/ssh/id_ed25519" "$RUN_DIR/ssh/id_ed25519"
    # The guest's host key is known in advance: pinned under an alias, so the port does not matter.
    printf '%s %s\n' $SSH_ALIAS "$(cut -d' ' -f1,2 "$cache/ssh/host_ed25519.pub")" >"$RUN_DIR/ssh/known_hosts"
    cat >"$RUN_DIR/ssh/config" <<EOF
# ssh client config for the stevedore CI VM (written by .ci/engines/vm.sh).
# "127.0.0.1:$ssh_port" is an alias on purpose: bollard hands ssh the destination
# "root@127.0.0.1:$ssh_port" verbatim (no -p), see README.md.
Host 127.0.0.1:$ssh_port $SSH_ALIAS
    HostName 127.0.0.1
    Port $ssh_port
Host 127.0.0.1:$ssh_port $SSH_ALIAS 127.0.0.1
    User root
    IdentityFile $RUN_DIR/ssh/id_ed25519
    IdentitiesOnly yes
    IdentityAgent none
    HostKeyAlias $SSH_ALIAS
    UserKnownHostsFile $RUN_DIR/ssh/known_hosts
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    UpdateHostKeys no
    BatchMode yes
    ConnectTimeout 10
    ServerAliveInterval 15
    LogLevel ERROR
EOF
    real_ssh=$(PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$RUN_DIR/bin" | paste -sd:) command -v ssh)
    printf '#!/bin/sh\n# ssh with the CI VM config: put this directory first in PATH for the docker CLI\n# and for bollard (both run "ssh" from PATH and pass no -F).\nexec %s -F %s "$@"\n' \
        "$real_ssh" "$RUN_DIR/ssh/config" >"$RUN_DIR/bin/ssh"
    chmod 0755 "$RUN_DIR/bin/ssh"
}

start_qemu() {
    local cache=$1 attempt ports p1 p2 p3 p4
    qemu-img create -q -f qcow2 -b "$cache/disk.img" -F raw "$RUN_DIR/overlay.qcow2"
    for attempt in 1 2 3; do
        ports=$(pick_ports)
        read -r p1 p2 p3 p4 <<<"$ports"
        rm -f "$RUN_DIR/qemu.pid"
        : >"$RUN_DIR/console.log"
        if qemu-system-x86_64 -name stevedore-ci-vm -machine q35 \
            -accel tcg,thread=multi -cpu max -smp "$VM_SMP" -m "$VM_MEM" \
            -kernel "$cache/vmlinuz" -initrd "$cache/initrd.img" -append "$VM_APPEND" \
            -drive "file=$RUN_DIR/overlay.qcow2,format=qcow2,if=virtio,cache=unsafe,discard=unmap" \
            -netdev "user,id=n0,restrict=$VM_RESTRICT,hostfwd=tcp:127.0.0.1:$p1-:2375,hostfwd=tcp:127.0.0.1:$p2-:2376,hostfwd=tcp:127.0.0.1:$p3-:22,hostfwd=tcp:127.0.0.1:$p4-:2377" \
            -device virtio-net-pci,netdev=n0,romfile= \
            -object rng-random,id=rng0,filename=/dev/urandom -device virtio-rng-pci,rng=rng0 \
            -display none -vga none -monitor none -parallel none \
            -serial "file:$RUN_DIR/console.log" \
            -daemonize -pidfile "$RUN_DIR/qemu.pid" 2>"$RUN_DIR/qemu.err" 8>&- 9>&-; then
            echo "$p1 $p2 $p3 $p4" >"$RUN_DIR/ports"
            return 0
        fi
        log "qemu failed to start (attempt $attempt): $(tr '\n' ' ' <"$RUN_DIR/qemu.err")"
    done
    die "qemu did not start"
}

ping_plain() { curl -fsS --max-time 5 "http://127.0.0.1:$1/_ping" 2>/dev/null | grep -qx OK; }
ping_tls() {
    curl -fsS --max-time 5 --cacert "$RUN_DIR/client/ca.pem" --cert "$RUN_DIR/client/cert.pem" \
        --key "$RUN_DIR/client/key.pem" "https://127.0.0.1:$1/_ping" 2>/dev/null | grep -qx OK
}
# Through the wrapper and the bollard-style destination, into the guest's docker CLI.
ping_ssh() {
    "$RUN_DIR/bin/ssh" "root@127.0.0.1:$1" docker version --format '{{.Server.Version}}' \
        </dev/null >/dev/null 2>&1
}

wait_ready() {
    local t0=$1 p1=$2 p2=$3 p3=$4 p4=$5 deadline plain="" tls="" ssh="" rootless=""
    deadline=$(($(date +%s) + BOOT_TIMEOUT))
    while :; do
        qemu_alive || {
            tail -n 30 "$RUN_DIR/console.log" >&2 || true
            die "qemu exited during boot (console: $RUN_DIR/console.log)"
        }
        [ -n "$plain" ] || ! ping_plain "$p1" || { plain=$(since "$t0") && log "plain tcp answers after $plain s"; }
        [ -n "$tls" ] || ! ping_tls "$p2" || { tls=$(since "$t0") && log "TLS answers after $tls s"; }
        [ -n "$ssh" ] || ! ping_ssh "$p3" || { ssh=$(since "$t0") && log "ssh answers after $ssh s"; }
        [ -n "$rootless" ] || ! ping_plain "$p4" || { rootless=$(since "$t0") && log "rootless Podman answers after $rootless s"; }
        [ -n "$plain" ] && [ -n "$tls" ] && [ -n "$ssh" ] && [ -n "$rootless" ] && return 0
        if [ "$(date +%s)" -ge "$deadline" ]; then
            tail -n 30 "$RUN_DIR/console.log" >&2 || true
            die "engine not ready after ${BOOT_TIMEOUT}s (plain:${plain:-no} tls:${tls:-no} ssh:${ssh:-no} rootless:${rootless:-no}); console: $RUN_DIR/console.log"
        fi
        sleep 1
    done
}

json_field() { grep -o "\"$1\":\"[^\"]*\"" | head -n 1 | cut -d'"' -f4; }

write_env() {
    local p1 p2 p3 p4 version info cgroup server api
    read -r p1 p2 p3 p4 <"$RUN_DIR/ports"
    version=$(curl -fsS --max-time 10 "http://127.0.0.1:$p1/version")
    info=$(curl -fsS --max-time 10 "http://127.0.0.1:$p1/info")
    server=$(json_field Version <<<"$version")
    api=$(json_field ApiVersion <<<"$version")
    cgroup=$(json_field CgroupVersion <<<"$info")
    [ "$cgroup" = 2 ] || die "the VM engine reports cgroup version '$cgroup', expected 2"
    # The user's Podman: rootless, on the same cgroup v2 (its delegated slice).
    info=$(curl -fsS --max-time 30 "http://127.0.0.1:$p4/info")
    grep -q '"Rootless":true' <<<"$info" || die "the VM's Podman on 2377 does not say it is rootless"
    [ "$(json_field CgroupVersion <<<"$info")" = 2 ] || die "the VM's rootless Podman is not on cgroup v2"
    cat >"$RUN_DIR/env.tmp" <<EOF
VM_DOCKER_HOST=tcp://127.0.0.1:$p1
VM_TLS_HOST=tcp://127.0.0.1:$p2
VM_CERT_PATH=$RUN_DIR/client
VM_SSH_HOST=ssh://root@127.0.0.1:$p3
VM_ROOTLESS_HOST=tcp://127.0.0.1:$p4
VM_SSH_KEY=$RUN_DIR/ssh/id_ed25519
VM_SSH_CONFIG=$RUN_DIR/ssh/config
VM_SSH_KNOWN_HOSTS=$RUN_DIR/ssh/known_hosts
VM_SSH_PATH=$RUN_DIR/bin
VM_SSH_XDG_STATE_HOME=$RUN_DIR/ssh/state
VM_SERVER_VERSION=$server
VM_API_VERSION=$api
VM_CGROUP_VERSION=$cgroup
VM_QEMU_PID=$(qemu_pid)
VM_CONSOLE_LOG=$RUN_DIR/console.log
EOF
    mv "$RUN_DIR/env.tmp" "$RUN_DIR/env"
    log "engine: Docker $server (API $api), cgroup v$cgroup"
}

stop_qemu() {
    local pid
    pid=$(qemu_pid)
    if qemu_alive; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do
            [ -d "/proc/$pid" ] || break
            sleep 0.2
        done
        [ ! -d "/proc/$pid" ] || kill -KILL "$pid" 2>/dev/null || true
        log "stopped qemu (pid $pid)"
    fi
    rm -f "$RUN_DIR/qemu.pid" "$RUN_DIR/overlay.qcow2" "$RUN_DIR/env" "$RUN_DIR/env.tmp" \
        "$RUN_DIR/ports" "$RUN_DIR/cache_key" "$RUN_DIR/qemu.err"
    rm -rf "${RUN_DIR:?}/client" "${RUN_DIR:?}/ssh" "${RUN_DIR:?}/bin"
}

cmd_up() {
    ensure_tools
    mkdir -p "$RUN_DIR"
    exec 9>"$RUN_DIR/.lock"
    flock -w "$LOCK_TIMEOUT" 9 || die "another vm.sh holds $RUN_DIR/.lock"
    if qemu_alive && [ -f "$RUN_DIR/ports" ]; then
        local p1 p2 p3 p4
        read -r p1 p2 p3 p4 <"$RUN_DIR/ports"
        if ping_plain "$p1" && ping_tls "$p2" && ping_ssh "$p3" && ping_plain "$p4"; then
            log "already up (qemu pid $(qemu_pid))"
            write_env
            echo "$RUN_DIR/env"
            return 0
        fi
        log "qemu runs but the engine does not answer: restarting"
    fi
    stop_qemu
    local key t
    key=$(recipe_key)
    t=$(now)
    if [ "${STEVEDORE_VM_REBUILD:-0}" = 1 ]; then
        build_cache "$key" force
        log "timing: build $(since "$t") s"
    elif [ -f "$CACHE_ROOT/$key/complete" ]; then
        log "using the cached disk $CACHE_ROOT/$key"
    else
        build_cache "$key"
        log "timing: build $(since "$t") s"
    fi
    echo "$key" >"$RUN_DIR/cache_key"
    t=$(now)
    start_qemu "$CACHE_ROOT/$key"
    local p1 p2 p3 p4
    read -r p1 p2 p3 p4 <"$RUN_DIR/ports"
    write_client_files "$CACHE_ROOT/$key" "$p3"
    log "qemu pid $(qemu_pid), ports plain $p1, tls $p2, ssh $p3, rootless Podman $p4; console: $RUN_DIR/console.log"
    wait_ready "$t" "$p1" "$p2" "$p3" "$p4"
    log "timing: boot to engine ready $(since "$t") s"
    write_env
    echo "$RUN_DIR/env"
}

cmd_down() {
    [ -d "$RUN_DIR" ] || {
        log "down (nothing to stop)"
        return 0
    }
    exec 9>"$RUN_DIR/.lock"
    flock -w "$LOCK_TIMEOUT" 9 || die "another vm.sh holds $RUN_DIR/.lock"
    stop_qemu
    log "down"
}

cmd_status() {
    if qemu_alive && [ -f "$RUN_DIR/env" ]; then
        echo "up $RUN_DIR/env"
    else
        echo down
        return 1
    fi
}

cmd_exec() {
    qemu_alive && [ -f "$RUN_DIR/ssh/config" ] || die "the VM is not up"
    exec ssh -F "$RUN_DIR/ssh/config" "$SSH_ALIAS" "$@"
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
key) recipe_key ;;
exec)
    shift
    cmd_exec "$@"
    ;;
*)
    echo "usage: $0 up|down|status|key|exec CMD..." >&2
    exit 2
    ;;
esac
