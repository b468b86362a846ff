#!/usr/bin/env bash
# Issue 14, part 4: the checks that need a real NVIDIA GPU, as one command on
# a GPU machine that has this repository and the Debian build packages
# (scripts/deps.sh). No CUDA compiler is needed: the programs find the driver
# as CUDA runtimes do (dlopen of libcuda.so.1 and libnvidia-ml.so.1) and load
# their kernels as PTX, which the driver compiles. A few minutes:
#
#   1. shim_gpu_check   a memory share through the real driver: the share
#                       shown, within it, past it (dlsym, cuGetProcAddress)
#   2. shim_gpu_real    real CUDA programs under libkgpu-limit.so: a kernel
#                       writing all of a share, allocations past it; a pool
#                       that keeps freed memory; VMM memory released while
#                       mapped; two processes with 30 % and 70 % compute
#                       shares under saturating load (and, for comparison,
#                       without the schedule)
#   3. shim_gpu_watch   the device plugin's watcher against the real NVML: a
#                       process over its memory share is seen and killed
#                       (enforce: kill), one within it is left alone
#
# Prints each program's figures and a summary. Exit status: 0 all passed,
# 1 something failed, 77 no GPU here (nothing run).
#
# A GPU machine without the build packages (gRPC, jansson, ...: the whole
# project is configured): build elsewhere with `--build-only`, which also
# copies into <build>/carrylib the shared libraries shim_gpu_watch needs
# beyond the C library, take the repository with the build folder there
# (same architecture, glibc 2.34 or newer), and run `--no-build` there.
#
# Environment:
# GPU_CHECK_BUILD (build folder, default build-gpu), GPU_CHECK_FORCE (build and
# run even where no driver is seen), KGPU_GPU_CHECK_MIB (the
# memory share, default 2048 for shim_gpu_real), KGPU_GPU_CHECK_SECONDS (each
# compute run, default 10). docs/shim.md, "On a real GPU", records results.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=all
case ${1:-} in
    "") ;;
    --build-only) mode=build ;;
    --no-build) mode=run ;;
    *) echo "usage: scripts/gpu-check.sh [--build-only | --no-build]" >&2; exit 2 ;;
esac

# Before building anything: is there a driver at all? (GPU_CHECK_FORCE=1 goes on
# regardless: each program then says for itself that it skips.)
if [ "$mode" != build ] && [ -z "${GPU_CHECK_FORCE:-}" ] &&
   ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' && [ ! -e /dev/nvidiactl ]; then
    echo "gpu-check: SKIPPED: no NVIDIA GPU here (the loader finds no libcuda.so.1 and there" \
         "is no /dev/nvidiactl); run this on a machine with an NVIDIA GPU and its driver."
    exit 77
fi
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader \
        2>/dev/null | sed 's/^/gpu-check: GPU /'
fi

BUILD=${GPU_CHECK_BUILD:-build-gpu}
if [ "$mode" != run ]; then
    echo "gpu-check: building into $BUILD"
    # Without sanitizers: the library is preloaded into the driver's processes,
    # where ASan cannot come first.
    mkdir -p "$BUILD"
    log=$BUILD/gpu-check-build.log
    if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKGPU_SANITIZE=OFF >"$log" 2>&1 ||
       ! cmake --build "$BUILD" -j"$(nproc)" --target kgpu-limit shim_gpu_check shim_gpu_real \
            shim_gpu_watch >>"$log" 2>&1; then
        tail -30 "$log"
        echo "gpu-check: the build failed (whole log: $log; scripts/deps.sh installs what it" \
             "needs, or build elsewhere with --build-only and run here with --no-build)" >&2
        exit 1
    fi
fi
if [ "$mode" = build ]; then
    rm -rf "$BUILD/carrylib"
    mkdir -p "$BUILD/carrylib"
    ldd "$BUILD/tests/shim_gpu_watch" | awk '$3 ~ /^\// {print $3}' |
        grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libresolv|libpthread|libdl)\.so' |
        xargs -r cp -L -t "$BUILD/carrylib"
    echo "gpu-check: built into $BUILD ($(du -sh "$BUILD" | cut -f1)); on the GPU machine:" \
         "GPU_CHECK_BUILD=$BUILD scripts/gpu-check.sh --no-build"
    exit 0
fi
for f in libkgpu-limit.so tests/shim_gpu_check tests/shim_gpu_real tests/shim_gpu_watch; do
    if [ ! -e "$BUILD/$f" ]; then
        echo "gpu-check: $BUILD/$f is missing: build it first (without --no-build)" >&2
        exit 1
    fi
done
# The programs find the library and each other here, wherever the folder was built.
KGPU_GPU_CHECK_LIB=$(realpath "$BUILD/libkgpu-limit.so")
KGPU_GPU_CHECK_REAL=$(realpath "$BUILD/tests/shim_gpu_real")
export KGPU_GPU_CHECK_LIB KGPU_GPU_CHECK_REAL

declare -A result
ran=0 failed=0
for prog in shim_gpu_check shim_gpu_real shim_gpu_watch; do
    echo
    echo "== $prog"
    if [ "$prog" = shim_gpu_watch ] && [ -d "$BUILD/carrylib" ]; then
        LD_LIBRARY_PATH=$(realpath "$BUILD/carrylib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
            timeout 600 "$BUILD/tests/$prog"
    else
        timeout 600 "$BUILD/tests/$prog"
    fi
    rc=$?
    case $rc in
        0) result[$prog]=passed; ran=$((ran + 1)) ;;
        77) result[$prog]=skipped ;;
        124) result[$prog]="FAILED (over 600 s)"; ran=$((ran + 1)); failed=$((failed + 1)) ;;
        *) result[$prog]="FAILED (exit $rc)"; ran=$((ran + 1)); failed=$((failed + 1)) ;;
    esac
done

echo
echo "== summary"
for prog in shim_gpu_check shim_gpu_real shim_gpu_watch; do
    printf 'gpu-check: %-15s %s\n' "$prog" "${result[$prog]}"
done
if [ "$failed" -gt 0 ]; then
    exit 1
fi
if [ "$ran" -eq 0 ]; then
    echo "gpu-check: SKIPPED: no GPU answered (see above)"
    exit 77
fi
exit 0
