#!/usr/bin/env bash
# Every policy under churn (kgpu simulate --churn) on every pod list of the
# Alibaba trace that records times (the 11-column files), as three markdown
# tables: peak GPU allocation %, pods that had to wait, and the 99th
# percentile of waiting time; means of the seeds. fgd also runs --online.
#   bench/churn_table.sh [-k KGPU] [-s SEEDS] [-x SPEEDUP] [-i INFLATE] [TRACE_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
KGPU=./build-rel/kgpu SEEDS=42-51 SPEEDUP=10000 INFLATE=1.3
while getopts "k:s:x:i:" opt; do
  case $opt in
  k) KGPU=$OPTARG ;;
  s) SEEDS=$OPTARG ;;
  x) SPEEDUP=$OPTARG ;;
  i) INFLATE=$OPTARG ;;
  *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
TRACE=${1:-${KGPU_TRACE_DIR:-../shared/traces/alibaba-gpu-v2023/csv}}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
files=()
for f in "$TRACE"/openb_pod_list_*.csv; do
  # The 5-column multigpu files carry no creation or deletion times.
  [ "$(head -1 "$f" | tr ',' '\n' | wc -l)" -ge 11 ] && files+=("$(basename "$f")")
done
for f in "${files[@]}"; do
  common=(simulate --churn --speedup "$SPEEDUP" --inflate "$INFLATE" --seeds "$SEEDS" --json
          --no-timing --nodes "$TRACE/openb_node_list_gpu_node.csv" --pods "$TRACE/$f")
  "$KGPU" "${common[@]}" >"$tmp/$f.all.json"
  "$KGPU" "${common[@]}" --policy fgd --online >"$tmp/$f.online.json"
done
python3 - "$tmp" "${files[@]}" <<'PY'
import json, os, sys
tmp, files = sys.argv[1], sys.argv[2:]
rows = {}
for f in files:
    res = json.load(open(os.path.join(tmp, f + ".all.json")))["results"]
    res += [dict(r, policy="fgd:online") for r in
            json.load(open(os.path.join(tmp, f + ".online.json")))["results"]]
    rows[f] = {r["policy"]: r for r in res}
pols = list(rows[files[0]])
for title, key, fmt in (("peak GPU allocation %", "alloc_peak_pct", "{:.2f}"),
                        ("pods that waited", "waited", "{:.0f}"),
                        ("wait p99, s", "wait_p99_s", "{:.1f}")):
    print(f"\n{title}\n")
    print("| pod file | " + " | ".join(pols) + " |")
    print("|---|" + "---|" * len(pols))
    for f in files:
        cells = [fmt.format(rows[f][p][key]) for p in pols]
        print(f"| {f[len('openb_pod_list_'):-4]} | " + " | ".join(cells) + " |")
never = {p: sum(rows[f][p]["never_placed"] for f in files) for p in pols}
print("\nnever placed, all files: " + ", ".join(f"{p} {v:.0f}" for p, v in never.items()))
PY
