#!/usr/bin/env bash
# kgpu's MIG profile tables (src/core/mig.c) against a real driver's NVML:
# for each GPU its name, memory and MIG mode and, where MIG is supported,
# every GPU instance profile NVML reports with its placements beside kgpu's
# entry. Read-only: it never changes the MIG mode and never creates or
# destroys an instance, so it may run on a node in service.
#
# It needs only a C compiler and the C library: kgpu-mig-check is compiled
# straight from its few sources (no CMake, no build packages), and NVML is
# loaded at run time as kgpu's node agents load it.
#
#   scripts/mig-check.sh               build, then check this machine's GPUs
#   scripts/mig-check.sh --build-only  build only (to carry to a GPU machine)
#   scripts/mig-check.sh --no-build    check with a binary built before
#
# Exit status: 0 every table matched (or MIG mode is off and the driver
# reads the profiles only in MIG mode: printed as "profiles readable only in
# MIG mode"), 1 a difference, 2 a failure, 77 no NVIDIA driver here.
#
# Environment: MIG_CHECK_BUILD (folder for the binary, default
# build-mig-check), CC (default cc), KGPU_NVML_LIB (the library to load,
# default libnvidia-ml.so.1 from the loader's path).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=all
case ${1:-} in
    "") ;;
    --build-only) mode=build ;;
    --no-build) mode=run ;;
    *) echo "usage: scripts/mig-check.sh [--build-only | --no-build]" >&2; exit 2 ;;
esac
out=${MIG_CHECK_BUILD:-build-mig-check}
bin=$out/kgpu-mig-check

if [ "$mode" != run ]; then
    mkdir -p "$out" || exit 2
    # The same sources the CMake target kgpu-mig-check uses, minus the
    # libraries the rest of kgpu_common pulls in.
    ${CC:-cc} -std=gnu11 -O2 -Wall -Wextra -Werror -Iinclude -Isrc/gpu -Isrc/common -Isrc/core \
        tests/integration/mig_check.c src/gpu/nvml.c src/gpu/nvml_mig.c src/core/mig.c \
        src/core/error.c src/common/fileio.c -ldl -o "$bin" || {
        echo "mig-check: build failed" >&2
        exit 2
    }
    echo "mig-check: built $bin"
fi
[ "$mode" = build ] && exit 0
[ -x "$bin" ] || { echo "mig-check: $bin missing: build it first" >&2; exit 2; }
if [ -n "${KGPU_NVML_LIB:-}" ]; then
    "$bin" --nvml-lib "$KGPU_NVML_LIB"
else
    "$bin"
fi
rc=$?
case $rc in
    0) echo "mig-check: PASSED" ;;
    77) echo "mig-check: SKIPPED: no NVIDIA driver here" ;;
    1) echo "mig-check: FAILED: kgpu's MIG tables differ from NVML (above)" ;;
    *) echo "mig-check: ERROR ($rc)" ;;
esac
exit $rc
