#!/usr/bin/env bash
# Scheduling throughput of the real kube-scheduler without kgpu, with kgpu
# (whole GPUs) and with kgpu's GPU shares: 5,000 nodes of 8 GPUs, 10,000 pods
# shaped like the Alibaba trace's default pod list (bench/e2e_scale.py).
#
#   bench/e2e_scale.sh [--runs N] [--smoke] [--nodes N] [--pods N] [...]
#
# The last line of stdout is a JSON object (medians over --runs):
# plain_pods_per_s, kgpu_pods_per_s, kgpu_shares_pods_per_s, ratio,
# extender_p99_ms, extender_peak_rss_mb, ... Progress goes to stderr.
# Needs the upstream components (scripts/upstream.sh) and the trace
# (KGPU_TRACE_DIR); without them it says SKIPPED and exits 77.
# --modes plain,dra,dra_kgpu measures the DRA path (dra_ratio); --profile
# DIR takes CPU profiles of every component (docs/e2e.md).
# Builds a Release kgpu-extender in build-rel (E2E_BENCH_BUILD) if it is
# missing.
# Every process it starts is stopped at the end, also on Ctrl-C or SIGTERM.
# Environment: E2E_WORK (scratch folder, kept for its logs; default a
# temporary one, removed after a clean run).
exec "$(dirname "$0")/e2e_run.sh" e2e_scale.py "$@"
