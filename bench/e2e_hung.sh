#!/usr/bin/env bash
# What a hung kgpu-extender costs a pod without a GPU through the real
# kube-scheduler: creation-to-bind latency without extenders, with
# kgpu-extender, and with kgpu-extender stopped (bench/e2e_hung.py).
#
#   bench/e2e_hung.sh [--runs N] [--pods N] [...]
#
# The last line of stdout is a JSON object (medians over --runs). Needs the
# upstream components (scripts/upstream.sh); without them it says SKIPPED and
# exits 77. Builds a Release kgpu-extender in build-rel (E2E_BENCH_BUILD) if
# it is missing. Every process it starts is stopped at the end, also on
# Ctrl-C or SIGTERM.
exec "$(dirname "$0")/e2e_run.sh" e2e_hung.py "$@"
