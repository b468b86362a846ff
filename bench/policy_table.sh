#!/usr/bin/env bash
# Policy x pod file table of the FGD study's measure (allocation % at 130 %
# arrival and unallocated GPUs, mean of the seeds) for every pod list of the
# Alibaba trace, as markdown. Each cell is one `kgpu simulate --json` run.
#   bench/policy_table.sh [-k KGPU] [-s SEEDS] [-r] [-o] [TRACE_DIR] [POLICY...]
#   -r: random ties (kube-scheduler's way) instead of the study's seeded order
#   -o: --online for every policy (kgpu is online either way)
# A policy written NAME:online runs with --online in the same table.
set -euo pipefail
cd "$(dirname "$0")/.."
KGPU=./build-rel/kgpu SEEDS=42-51 EXTRA=()
while getopts "k:s:ro" opt; do
  case $opt in
  k) KGPU=$OPTARG ;;
  s) SEEDS=$OPTARG ;;
  r) EXTRA+=(--random-ties) ;;
  o) EXTRA+=(--online) ;;
  *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
TRACE=${1:-${KGPU_TRACE_DIR:-../shared/traces/alibaba-gpu-v2023/csv}}
shift || true
POLICIES=("$@")
[ ${#POLICIES[@]} -gt 0 ] || POLICIES=(fgd fgd:online kgpu)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
files=$(cd "$TRACE" && ls openb_pod_list_*.csv)
for f in $files; do
  for p in "${POLICIES[@]}"; do
    name=${p%:online}
    flags=("${EXTRA[@]}")
    [ "$p" != "$name" ] && flags+=(--online)
    "$KGPU" simulate --nodes "$TRACE/openb_node_list_gpu_node.csv" --pods "$TRACE/$f" \
      --policy "$name" --seeds "$SEEDS" --json --no-timing "${flags[@]}" >"$tmp/$f.$p.json"
  done
done
python3 - "$tmp" "$files" "${POLICIES[@]}" <<'PY'
import json, sys, os
tmp, files, pols = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
print("| pod file | " + " | ".join(pols) + " |")
print("|---|" + "---|" * len(pols))
for f in files:
    cells = []
    for p in pols:
        r = json.load(open(os.path.join(tmp, f"{f}.{p}.json")))["results"][0]
        cells.append(f"{r['alloc_pct_130']:.2f} ({r['unallocated_gpus']:.0f})")
    print(f"| {f[len('openb_pod_list_'):-4]} | " + " | ".join(cells) + " |")
PY
