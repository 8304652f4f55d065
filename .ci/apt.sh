# Sourced by .ci/run and .ci/engines/*.sh: Debian's apt waits for another apt or dpkg (an
# unattended upgrade, a second CI run) instead of failing at once.
# `install` waits for the dpkg lock by configuration (DPkg::Lock::Timeout, .ci/apt.conf);
# `update` takes the lists' lock, which no option waits for: apt_update waits for it, bounded.
APT_CONFIG="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/apt.conf"
export APT_CONFIG

apt_update() {
    local until=$((SECONDS + 600)) out
    while :; do
        if out=$(apt-get update "$@" 2>&1); then
            return 0
        fi
        if [[ $out == *"Could not get lock"* ]] && [ "$SECONDS" -lt "$until" ]; then
            sleep 2
            continue
        fi
        printf '%s\n' "$out" >&2
        return 1
    done
}
