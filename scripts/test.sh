#!/usr/bin/env bash
# Quick start, second command (and what CI runs): install the Debian
# packages, build with AddressSanitizer and UndefinedBehaviorSanitizer, and
# run the whole test suite under CTest, build and check the container image
# (scripts/image.sh, where Docker answers), then the end-to-end suites against
# the real Kubernetes components (scripts/e2e.sh; it builds them from their
# Go modules once, into a cache outside the tree). Tests that need the
# Alibaba trace report themselves skipped when it is absent (set
# KGPU_TRACE_DIR to point at its csv/ folder).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
status=0
# The upstream components first (built once, cached outside the tree): CTest's
# Helm chart test and its DRA test against the real API server need them, and
# would skip on a machine that has not built them yet. Exit 2: this machine
# cannot build them (no Go 1.26); those tests skip and scripts/e2e.sh says so.
up=0
./scripts/upstream.sh >/dev/null || up=$?
if [ "$up" != 0 ] && [ "$up" != 2 ]; then
    echo "test.sh: building the upstream components failed (scripts/upstream.sh: exit $up)"
    status=1
fi
BUILD=${TEST_BUILD:-build-test}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKGPU_SANITIZE=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
(cd "$BUILD" && ctest --output-on-failure -j"$(nproc)") || status=1
# The Release build of the Quick start's first command (scripts/demo.sh) and of
# scripts/bench.sh: -O3 warns where the sanitizer build does not, and warnings
# are errors there too.
REL=${RELEASE_BUILD:-build-release-check}
cmake -S . -B "$REL" -DCMAKE_BUILD_TYPE=Release -DKGPU_BUILD_TESTS=OFF >/dev/null
cmake --build "$REL" -j"$(nproc)" >/dev/null || { echo "test.sh: the Release build failed"; status=1; }
# The container image, built and checked as users build it (scripts/image.sh).
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    ./scripts/image.sh || status=1
elif [ "${CI:-}" = true ]; then
    echo "test.sh: FAILED: CI=true and no Docker engine answers: the image cannot be built"
    status=1
else
    echo "test.sh: no Docker engine answers: the image is not built (scripts/image.sh)"
fi
E2E_BUILD="$BUILD" ./scripts/e2e.sh || status=1
exit "$status"
