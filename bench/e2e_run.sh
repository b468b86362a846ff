#!/usr/bin/env bash
# Shared start of bench/e2e_scale.sh and bench/e2e_trace.sh: builds the
# Release kgpu, kgpu-extender and kgpu-dra-plugin they run (not the
# sanitizer build of the test suite), makes a scratch folder, runs the
# Python benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
script=$1; shift
case " $* " in
    *" -h "*|*" --help "*) exec python3 "bench/$script" --work /nonexistent "$@" ;;
esac
if ! bin=$(scripts/upstream.sh --check 2>/dev/null); then
    echo "${script%.py}: SKIPPED: the upstream components are not built (run scripts/upstream.sh)"
    exit 77
fi
BUILD=${E2E_BENCH_BUILD:-build-rel}
if [ ! -x "$BUILD/kgpu-extender" ] || [ ! -x "$BUILD/kgpu" ] || [ ! -x "$BUILD/kgpu-dra-plugin" ]; then
    echo "${script%.py}: building a Release kgpu in $BUILD" >&2
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKGPU_BUILD_TESTS=OFF >/dev/null
    cmake --build "$BUILD" -j"$(nproc)" --target kgpu-extender kgpu kgpu-dra-plugin >/dev/null
fi
WORK=${E2E_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/kgpu-bench.XXXXXX")}
mkdir -p "$WORK"
status=0
python3 "bench/$script" --bin "$bin" --build "$BUILD" --work "$WORK" "$@" || status=$?
if [ "$status" = 0 ] && [ -z "${E2E_WORK:-}" ]; then
    rm -rf "$WORK"
else
    echo "${script%.py}: logs of every component are in $WORK" >&2
fi
exit "$status"
