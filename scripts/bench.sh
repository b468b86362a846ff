#!/usr/bin/env bash
# Runs the benchmarks of bench/ on a Release build and, when the Alibaba
# trace is present, the policy study on several of its pod lists.
#   scripts/bench.sh [TRACE_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TRACE=${1:-${KGPU_TRACE_DIR:-../shared/traces/alibaba-gpu-v2023/csv}}

cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKGPU_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD" -j"$(nproc)" >/dev/null

echo "== bench_sim"
"$BUILD"/bench/bench_sim "$TRACE"
echo "== bench_extender"
"$BUILD"/bench/bench_extender "$BUILD"/kgpu-extender 5 2
echo "== bench_sweep (tenants' unschedulable pods: the table's memory; prioritize-gpuless during a sweep)"
"$BUILD"/bench/bench_sweep 100 3
echo "== bench_policy (one decision on a 5,000-node cluster)"
"$BUILD"/bench/bench_policy 5000 9
echo "== bench_shim (cuMemAlloc+cuMemFree pair, with and without libkgpu-limit.so)"
"$BUILD"/bench/bench_shim

if [ -f "$TRACE/openb_pod_list_default.csv" ]; then
  for f in default cpu050 gpushare40 gpuspec20 multigpu20; do
    echo "== study: openb_pod_list_$f.csv (seeds 42-51, inflate 1.3)"
    "$BUILD"/kgpu simulate --nodes "$TRACE/openb_node_list_gpu_node.csv" \
      --pods "$TRACE/openb_pod_list_$f.csv" --seeds 42-51 --inflate 1.3
  done
fi
