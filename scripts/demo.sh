#!/usr/bin/env bash
# Quick start, first command: install the Debian packages kgpu needs (as
# root; otherwise print the apt-get line), build, and simulate the bundled
# example cluster and workload with every placement policy.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh --build
BUILD=${BUILD:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKGPU_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD" -j"$(nproc)" >/dev/null
mkdir -p out
"$BUILD"/kgpu simulate --nodes examples/nodes.csv --pods examples/pods.csv --plot out/example.svg
echo "plot of allocation against arrival: out/example.svg"
