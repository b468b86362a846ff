#!/bin/sh
# Placement at scale (issue 17): one simulator run (`kgpu simulate`, study's
# method, seed 42, one thread) of fgd and kgpu on synthetic clusters of
# `kgpu example --nodes N --seed 3`, the build before the decision index and
# this one side by side in the same run, their outputs compared byte for
# byte (--no-timing), then each decision's time (bench_decide: p50, p99,
# with the index and, up to KGPU_SCALE_SCAN_MAX nodes, scanning every node)
# and peak RSS. Prints a markdown table; asserts nothing.
#
#   bench/bench_scale.sh
#
# Environment:
#   KGPU_NEW            kgpu binary to measure (default build-rel/kgpu)
#   KGPU_BENCH_DECIDE   bench_decide of the same build (default build-rel/bench/bench_decide)
#   KGPU_OLD            kgpu binary to compare with; without it, KGPU_OLD_REV
#                       (default 09a267d, before the index) is built in Release
#                       into a temporary folder
#   KGPU_SCALE_SIZES    node counts (default "1000 4000 16000 64000")
#   KGPU_SCALE_POLICIES (default "fgd kgpu")
#   KGPU_SCALE_OLD_MAX  largest size the old build runs at (default 16000)
#   KGPU_SCALE_LIMIT    seconds an old run may take before it is stopped (default 600)
#   KGPU_SCALE_SCAN_MAX largest size bench_decide also runs --scan at (default 4000)
#
# Seconds are CPU seconds (user + system) of the one process, the figure
# that holds on a machine shared with other work; wall seconds beside them.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
new=${KGPU_NEW:-$here/build-rel/kgpu}
decide=${KGPU_BENCH_DECIDE:-$here/build-rel/bench/bench_decide}
sizes=${KGPU_SCALE_SIZES:-1000 4000 16000 64000}
policies=${KGPU_SCALE_POLICIES:-fgd kgpu}
old_max=${KGPU_SCALE_OLD_MAX:-16000}
limit=${KGPU_SCALE_LIMIT:-600}
scan_max=${KGPU_SCALE_SCAN_MAX:-4000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

old=${KGPU_OLD:-}
if [ -z "$old" ]; then
    rev=${KGPU_OLD_REV:-09a267d}
    echo "building the old kgpu ($rev) in $work/old ..." >&2
    mkdir -p "$work/old/src"
    git -C "$here" archive "$rev" | tar -x -C "$work/old/src"
    cmake -S "$work/old/src" -B "$work/old/build" -DCMAKE_BUILD_TYPE=Release \
        -DKGPU_BUILD_TESTS=OFF >/dev/null
    cmake --build "$work/old/build" --target kgpu -j2 >/dev/null
    old=$work/old/build/kgpu
fi

# run BIN OUT: one simulate run; prints "cpu_s wall_s rss_mb", or "- - -" past the limit.
run() {
    if timeout "$2" /usr/bin/time -f "%U %S %e %M" -o "$work/time" "$1" simulate \
        --nodes "$work/ex$n/nodes.csv" --pods "$work/ex$n/pods.csv" --policy "$p" --seeds 42 \
        --threads 1 --no-timing --json >"$3" 2>/dev/null; then
        awk '{printf "%.2f %.2f %.0f\n", $1 + $2, $3, $4 / 1024}' "$work/time"
    else
        echo "- - -"
    fi
}

echo "| nodes | pods in file | policy | old CPU s (wall) | new CPU s (wall) | speedup | same output" \
    "| decision p50 / p99, new | p50 / p99, scan | peak RSS old / new |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for n in $sizes; do
    "$new" example --out "$work/ex$n" --nodes "$n" --seed 3 >/dev/null
    for p in $policies; do
        set -- $(run "$new" 0 "$work/new.json")
        ncpu=$1 nwall=$2 nrss=$3
        pods=$(grep -o '"pods_in_file": *[0-9]*' "$work/new.json" | tr -dc 0-9)
        ocpu=- owall=- orss=- same=-
        if [ "$n" -le "$old_max" ]; then
            set -- $(run "$old" "$limit" "$work/old.json")
            ocpu=$1 owall=$2 orss=$3
            if [ "$ocpu" = - ]; then
                ocpu="> $limit"
            elif cmp -s "$work/old.json" "$work/new.json"; then
                same=yes
            else
                same=NO
            fi
        fi
        speed=-
        case $ocpu in [0-9]*) speed=$(awk -v o="$ocpu" -v w="$ncpu" \
            'BEGIN {printf "%.0fx", (w > 0 ? o / w : 0)}') ;; esac
        d=$("$decide" "$work/ex$n/nodes.csv" "$work/ex$n/pods.csv" "$p" 42)
        dp=$(echo "$d" | sed 's/.*p50_us=\([0-9.]*\) p99_us=\([0-9.]*\).*/\1 \/ \2 us/')
        sp=-
        if [ "$n" -le "$scan_max" ]; then
            s=$("$decide" "$work/ex$n/nodes.csv" "$work/ex$n/pods.csv" "$p" 42 --scan)
            sp=$(echo "$s" | sed 's/.*p50_us=\([0-9.]*\) p99_us=\([0-9.]*\).*/\1 \/ \2 us/')
        fi
        echo "| $n | $pods | $p | $ocpu ($owall) | $ncpu ($nwall) | $speed | $same | $dp | $sp" \
            "| $orss / $nrss MB |"
    done
done
