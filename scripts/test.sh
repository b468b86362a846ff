#!/usr/bin/env bash
# Quick start, second command (and what CI runs): install the Debian
# packages, build with AddressSanitizer and UndefinedBehaviorSanitizer, and
# run the whole test suite under CTest. Tests that need the Alibaba trace
# report themselves skipped when it is absent (set KGPU_TRACE_DIR to point
# at its csv/ folder).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
BUILD=${TEST_BUILD:-build-test}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKGPU_SANITIZE=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
cd "$BUILD"
ctest --output-on-failure -j"$(nproc)"
