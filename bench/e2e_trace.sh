#!/usr/bin/env bash
# The FGD study's workload (Alibaba default trace, 1,213 nodes, inflated to
# 130 % of GPU capacity, the seed's order) replayed one pod at a time through
# the real kube-scheduler and kgpu, against the simulator's prediction for
# the same seed (bench/e2e_trace.py).
#
#   bench/e2e_trace.sh [--seed 42] [--runs N] [--smoke] [...]
#
# The last line of stdout is a JSON object: alloc_pct_130_real (median over
# --runs), alloc_pct_130_sim, pods_bound, pods_pending, ... Progress goes to
# stderr. Needs the upstream components (scripts/upstream.sh) and the trace
# (KGPU_TRACE_DIR); without them it says SKIPPED and exits 77. Every process
# it starts is stopped at the end, also on Ctrl-C or SIGTERM.
exec "$(dirname "$0")/e2e_run.sh" e2e_trace.py "$@"
