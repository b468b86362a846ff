#!/usr/bin/env bash
# Builds kgpu's container image (Dockerfile) on this machine, with no
# registry: the Debian base the Dockerfile starts FROM is made here from
# Debian's packages (debootstrap --variant=minbase, then docker import),
# once, and kept in Docker under its name; then an ordinary docker build.
# Then it checks the image: every binary starts in it, under a read-only
# root file system and as the non-root user, and the library is there.
#
#   scripts/image.sh                       build and check ghcr.io/kgpu/kgpu:<chart appVersion>
#   scripts/image.sh --tag REGISTRY/kgpu:V name it for your registry (then docker push it)
#   scripts/image.sh --rebuild-base        make the Debian base again (fresh packages)
#   scripts/image.sh --save FILE           also write the image as a docker-archive tarball
#
# Needs Docker; making the base needs root and debootstrap (installed when
# missing, as root). Environment: KGPU_DEBIAN_MIRROR (default
# http://deb.debian.org/debian). Prints each image's size.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=kgpu.local/debian:bookworm
SUITE=bookworm
MIRROR=${KGPU_DEBIAN_MIRROR:-http://deb.debian.org/debian}
APP_VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' deploy/helm/kgpu/Chart.yaml)
TAG=ghcr.io/kgpu/kgpu:$APP_VERSION
rebuild=0
save=""
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) TAG=$2; shift 2 ;;
        --rebuild-base) rebuild=1; shift ;;
        --save) save=$2; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

command -v docker >/dev/null || { echo "image.sh: docker is not installed" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "image.sh: the Docker engine does not answer" >&2; exit 1; }

size_of() {
    docker image inspect -f '{{.Size}}' "$1" | awk '{ printf "%.1f MB", $1 / 1e6 }'
}

# ---- the Debian base -------------------------------------------------------
if [ "$rebuild" = 1 ] || ! docker image inspect "$BASE" >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "image.sh: making the Debian base $BASE needs root (debootstrap)" >&2
        exit 1
    fi
    if ! command -v debootstrap >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            debootstrap >/dev/null
    fi
    work=$(mktemp -d /tmp/kgpu-image-base.XXXXXX)
    trap 'rm -rf "$work"' EXIT
    echo "image.sh: making $BASE from $MIRROR ($SUITE, minbase)"
    start=$SECONDS
    if ! debootstrap --variant=minbase "$SUITE" "$work/root" "$MIRROR" >"$work/log" 2>&1; then
        tail -20 "$work/log" >&2
        echo "image.sh: debootstrap failed (log above)" >&2
        exit 1
    fi
    # What a build stage has no use for: package lists (apt-get update
    # fetches them), caches, documentation.
    rm -rf "$work"/root/var/lib/apt/lists/* "$work"/root/var/cache/apt/*.bin \
        "$work"/root/var/cache/apt/archives/*.deb "$work"/root/usr/share/doc/* \
        "$work"/root/usr/share/man/* "$work"/root/usr/share/info/*
    tar --numeric-owner -C "$work/root" -c . |
        docker import --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
    echo "image.sh: $BASE made in $((SECONDS - start)) s: $(size_of "$BASE")"
fi

# ---- the image ---------------------------------------------------------------
start=$SECONDS
log=$(mktemp /tmp/kgpu-image-build.XXXXXX)
if ! docker build --build-arg "BASE=$BASE" -t "$TAG" -f Dockerfile . >"$log" 2>&1; then
    tail -30 "$log" >&2
    echo "image.sh: docker build failed (the end of its output above; all of it in $log)" >&2
    exit 1
fi
rm -f "$log"
echo "image.sh: $TAG built in $((SECONDS - start)) s: $(size_of "$TAG")"

# ---- the checks ----------------------------------------------------------------
# As the chart runs them: read-only root, no capabilities, the extender's user.
run() { docker run --rm --read-only --cap-drop ALL --user 65532:65532 --network none "$@"; }
fail=0
check() { # what, then the command
    local what=$1
    shift
    local out
    if ! out=$("$@" 2>&1); then
        echo "image.sh: FAILED: $what:" >&2
        printf '%s\n' "$out" | tail -5 >&2
        fail=1
    fi
}
for bin in kgpu kgpu-extender kgpu-device-plugin kgpu-dra-plugin kgpu-expander; do
    # --help starts the program: every shared library it needs is in the image.
    check "$bin --help in the image" run --entrypoint "/usr/bin/$bin" "$TAG" --help
done
check "the interception library" run --entrypoint /bin/sh "$TAG" -c \
    'test -s /usr/lib/kgpu/libkgpu-limit.so'
check "the install-shim script's tools" run --entrypoint /bin/sh "$TAG" -c \
    'for t in sh mkdir cp chmod mv; do command -v $t >/dev/null || exit 1; done'
check "a read-only root" run --entrypoint /bin/sh "$TAG" -c '! touch /usr/bin/x 2>/dev/null'
check "the default user is not root" sh -c \
    "test \"\$(docker image inspect -f '{{.Config.User}}' '$TAG')\" = 65532:65532"
check "no package manager in the runtime" run --entrypoint /bin/sh "$TAG" -c \
    '! test -e /usr/bin/apt-get && ! test -e /usr/bin/dpkg'
[ "$fail" = 0 ] || exit 1
echo "image.sh: $TAG checked: four binaries start, library present, read-only, user 65532"

if [ -n "$save" ]; then
    docker save -o "$save" "$TAG"
    echo "image.sh: saved $TAG to $save ($(du -h "$save" | cut -f1))"
fi
