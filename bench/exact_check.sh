#!/bin/sh
# Checks that two kgpu binaries place every pod alike: `kgpu simulate --json
# --no-timing` output, byte for byte, for every policy, in the study's tie
# order, with random ties and online, on the default trace and on synthetic
# clusters of `kgpu example`. For speed changes that must not change results
# (docs/policy.md, "Deciding at scale").
#
#   bench/exact_check.sh OLD_KGPU NEW_KGPU [TRACE_DIR]
#
# TRACE_DIR defaults to $KGPU_TRACE_DIR, else ../shared/traces/alibaba-gpu-v2023/csv;
# without it only the synthetic clusters run. KGPU_EXACT_SEEDS (default 42-43)
# and KGPU_EXACT_SIZES (default "300 1000 2000") set the runs. Exit 1 on any
# difference, naming it.
set -eu
old=$1
new=$2
trace=${3:-${KGPU_TRACE_DIR:-../shared/traces/alibaba-gpu-v2023/csv}}
seeds=${KGPU_EXACT_SEEDS:-42-43}
sizes=${KGPU_EXACT_SIZES:-300 1000 2000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
runs=0

compare() { # label nodes pods [simulate options]
    label=$1 nodes=$2 pods=$3
    shift 3
    "$old" simulate --nodes "$nodes" --pods "$pods" --seeds "$seeds" --json --no-timing "$@" \
        >"$work/old.json"
    "$new" simulate --nodes "$nodes" --pods "$pods" --seeds "$seeds" --json --no-timing "$@" \
        >"$work/new.json"
    runs=$((runs + 1))
    if cmp -s "$work/old.json" "$work/new.json"; then
        echo "same      $label $*"
    else
        echo "DIFFERENT $label $*"
        fail=1
    fi
}

sets=""
for n in $sizes; do
    "$new" example --out "$work/ex$n" --nodes "$n" --seed 3 >/dev/null
    sets="$sets ex$n:$work/ex$n/nodes.csv:$work/ex$n/pods.csv"
done
if [ -f "$trace/openb_pod_list_default.csv" ]; then
    sets="default:$trace/openb_node_list_gpu_node.csv:$trace/openb_pod_list_default.csv $sets"
    sets="$sets gpuspec20:$trace/openb_node_list_gpu_node.csv:$trace/openb_pod_list_gpuspec20.csv"
else
    echo "no trace at $trace: synthetic clusters only" >&2
fi
for s in $sets; do
    label=${s%%:*}
    rest=${s#*:}
    nodes=${rest%%:*}
    pods=${rest#*:}
    compare "$label" "$nodes" "$pods"
    compare "$label" "$nodes" "$pods" --random-ties
    compare "$label" "$nodes" "$pods" --online --policy fgd,kgpu
    compare "$label" "$nodes" "$pods" --online --random-ties --policy fgd,kgpu
done
echo "$runs comparisons, seeds $seeds: $([ $fail = 0 ] && echo all identical || echo DIFFERENCES)"
exit $fail
