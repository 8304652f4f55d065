#!/usr/bin/env bash
# An image of Debian packages for `stevedore run IMAGE ...`, made without a registry:
# mmdebstrap (Debian's `mmdebstrap` package) installs the packages from Debian's mirror into
# a tarball, and `docker import` makes it an image.
#
#   images/debian.sh --tag TAG [--suite SUITE] PACKAGE...
#   images/debian.sh --tag project-tests:py python3 python3-pytest
#
# The tarball has no device nodes (`--skip=output/dev`: as root, mmdebstrap would put
# /dev/null, /dev/zero... in it), so the image is a plain tree every rung can take: the
# engine gives a container its own /dev, and a rung that unpacks layers itself needs no
# privilege to create nodes.
#
# The tarball is cached in $STEVEDORE_IMAGE_CACHE (default /var/tmp/stevedore-images, which
# outlives reboots as the CI's VM disk does), named by the recipe: the suite, the sorted
# packages, the architecture and this script. A second run with the same recipe only imports
# (or finds the image already tagged from it). Delete the directory to drop the cache.
set -euo pipefail

usage() {
    echo "usage: $0 --tag TAG [--suite SUITE] PACKAGE..." >&2
    exit 2
}

tag=""
suite="bookworm"
packages=()
while [ $# -gt 0 ]; do
    case "$1" in
    --tag) [ $# -ge 2 ] || usage; tag=$2; shift 2 ;;
    --suite) [ $# -ge 2 ] || usage; suite=$2; shift 2 ;;
    -h | --help) usage ;;
    -*) echo "$0: unknown option $1" >&2; usage ;;
    *) packages+=("$1"); shift ;;
    esac
done
[ -n "$tag" ] || usage
for p in "${packages[@]}"; do
    # Package names as Debian allows them: nothing a shell or mmdebstrap reads otherwise.
    [[ "$p" =~ ^[a-z0-9][a-z0-9.+-]+$ ]] || { echo "$0: not a Debian package name: $p" >&2; exit 2; }
done
[[ "$suite" =~ ^[a-z]+$ ]] || { echo "$0: not a Debian suite: $suite" >&2; exit 2; }
command -v mmdebstrap >/dev/null || { echo "$0: needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }
command -v docker >/dev/null || { echo "$0: needs the docker command" >&2; exit 1; }

cache=${STEVEDORE_IMAGE_CACHE:-/var/tmp/stevedore-images}
arch=$(dpkg --print-architecture)
sorted=$(printf '%s\n' "${packages[@]}" | sort -u | tr '\n' ' ')
key=$( { echo "$suite $arch $sorted"; cat "$0"; } | sha256sum | cut -c1-16)
tarball="$cache/debian-$suite-$key.tar"

label="dev.stevedore.image-recipe"
if [ "$(docker image inspect -f "{{index .Config.Labels \"$label\"}}" "$tag" 2>/dev/null)" = "$key" ]; then
    echo "$0: $tag is already this recipe's image ($key)" >&2
    echo "$tag"
    exit 0
fi

mkdir -p "$cache"
# One build of a recipe at a time; a crash leaves only a .tmp-* file, which the next build of
# the recipe removes (mmdebstrap picks the format by the name's ending: .tar).
exec 9>"$tarball.lock"
flock 9
if [ ! -s "$tarball" ]; then
    started=$SECONDS
    echo "$0: building $tarball (Debian $suite, $arch: ${sorted:-no extra packages})" >&2
    include=$(IFS=,; echo "${packages[*]}")
    tmp="$cache/.tmp-debian-$suite-$key.tar"
    rm -f "$tmp"
    mmdebstrap --variant=apt --skip=output/dev --quiet \
        ${include:+--include="$include"} \
        "$suite" "$tmp" >&2
    mv "$tmp" "$tarball"
    echo "$0: built in $((SECONDS - started)) s, $(du -h "$tarball" | cut -f1)" >&2
fi
exec 9>&-

if tar -tvf "$tarball" | grep -q '^[bc]'; then
    echo "$0: $tarball holds device nodes: remove it and build again" >&2
    exit 1
fi
docker import \
    --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "ENV LANG=C.UTF-8" \
    --change "LABEL $label=$key" \
    --change 'CMD ["bash"]' \
    "$tarball" "$tag" >/dev/null
echo "$0: imported $tag from $tarball" >&2
echo "$tag"
