#!/usr/bin/env bash
# Issue 14, part 4: the checks that need a real NVIDIA GPU, as one command on
# a GPU machine that has this repository and the Debian build packages
# (scripts/deps.sh). No CUDA compiler is needed: the programs find the driver
# as CUDA runtimes do (dlopen of libcuda.so.1 and libnvidia-ml.so.1) and load
# their kernels as PTX, which the driver compiles. About six minutes on one GPU:
#
#   1. shim_gpu_check   a memory share through the real driver: the share
#                       shown, within it, past it (dlsym, cuGetProcAddress)
#   2. shim_gpu_real    real CUDA programs under libkgpu-limit.so: a kernel
#                       writing all of a share, allocations past it; a pool
#                       that keeps freed memory; VMM memory released while
#                       mapped
#   3. shim_gpu_share   compute shares: two containers at 30/70 and 10/90
#                       launching flat out, in training steps (25 kernels,
#                       sync), as one CUDA graph per step, and with four
#                       processes each (each within 5 points of its share);
#                       recorded only: the split without the library, and a
#                       25 % victim's slowdown next to a 75 % noisy neighbour
#   4. shim_gpu_watch   the device plugin's watcher against the real NVML: a
#                       process over its memory share is seen and killed
#                       (enforce: kill), one within it is left alone
#   5. mps              where nvidia-cuda-mps-control exists: a private MPS
#                       control daemon; its control pipe is where the device
#                       plugin's MPS mode looks for it, and an MPS client
#                       under the library is held to its pinned memory limit
#                       below a larger share (else skipped, with a message)
#
# shim_gpu_check prints the context's charge next to NVML's count for its
# process, repeated in the summary (docs/shim.md, "The context footprint").
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
# of shim_gpu_share's 15 compute runs, default 8). docs/shim.md, "On a real GPU", records results.
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
            shim_gpu_share shim_gpu_watch >>"$log" 2>&1; then
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
for f in libkgpu-limit.so tests/shim_gpu_check tests/shim_gpu_real tests/shim_gpu_share \
         tests/shim_gpu_watch; do
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
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
record() { # record NAME RC
    case $2 in
        0) result[$1]=passed; ran=$((ran + 1)) ;;
        77) result[$1]=skipped ;;
        124) result[$1]="FAILED (over 600 s)"; ran=$((ran + 1)); failed=$((failed + 1)) ;;
        *) result[$1]="FAILED (exit $2)"; ran=$((ran + 1)); failed=$((failed + 1)) ;;
    esac
}
for prog in shim_gpu_check shim_gpu_real shim_gpu_share shim_gpu_watch; do
    echo
    echo "== $prog"
    if [ "$prog" = shim_gpu_watch ] && [ -d "$BUILD/carrylib" ]; then
        LD_LIBRARY_PATH=$(realpath "$BUILD/carrylib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
            timeout 600 "$BUILD/tests/$prog" | tee "$LOGS/$prog"
    else
        timeout 600 "$BUILD/tests/$prog" | tee "$LOGS/$prog"
    fi
    record "$prog" "${PIPESTATUS[0]}"
done

# MPS: only where the node could run it. A private control daemon (its own
# pipe and log folders), stopped again at the end; clients reach it through
# CUDA_MPS_PIPE_DIRECTORY, as the device plugin's MPS mode hands it out.
echo
echo "== mps"
if ! command -v nvidia-cuda-mps-control >/dev/null; then
    echo "skipped: nvidia-cuda-mps-control is not on this machine (MPS mode is not checked)"
    result[mps]=skipped
else
    mps=$LOGS/mps
    mkdir -p "$mps/pipe" "$mps/log"
    export CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log
    if ! nvidia-cuda-mps-control -d; then
        echo "FAIL: nvidia-cuda-mps-control -d did not start"
        record mps 1
    else
        sleep 1
        rc=0
        if [ -p "$mps/pipe/control" ]; then
            echo "the control pipe is $mps/pipe/control, where kgpu-device-plugin --sharing mps" \
                 "looks for it"
        else
            echo "FAIL: no control pipe in $mps/pipe: the device plugin's MPS check would refuse"
            ls -l "$mps/pipe"
            rc=1
        fi
        # A 4 GiB share for the library, 1 GiB pinned by MPS: MPS must refuse first.
        KGPU_GPU_CHECK_MIB=4096 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M \
            CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 timeout 120 "$BUILD/tests/shim_gpu_check" \
            >"$LOGS/mps-client" 2>&1
        sed 's/^/  mps client: /' "$LOGS/mps-client"
        if grep -q 'allocation within the share failed: 2' "$LOGS/mps-client"; then
            echo "an allocation the library allowed (4 GiB share) was refused by MPS's 1 GiB limit"
        else
            echo "FAIL: MPS did not hold the client to CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M"
            rc=1
        fi
        echo get_server_list | nvidia-cuda-mps-control | sed 's/^/  mps server: /'
        echo quit | nvidia-cuda-mps-control
        record mps $rc
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi

echo
echo "== summary"
for prog in shim_gpu_check shim_gpu_real shim_gpu_share shim_gpu_watch mps; do
    printf 'gpu-check: %-15s %s\n' "$prog" "${result[$prog]}"
done
grep -h -e '^context:' -e 'NVML counts' -e 'NVML lists no process' "$LOGS/shim_gpu_check" \
    2>/dev/null | sed 's/^/gpu-check: /'
grep -h -e '^share ' -e '^without the library' -e '^noisy neighbour' "$LOGS/shim_gpu_share" \
    2>/dev/null | sed 's/^/gpu-check: /'
if [ "$failed" -gt 0 ]; then
    exit 1
fi
if [ "$ran" -eq 0 ]; then
    echo "gpu-check: SKIPPED: no GPU answered (see above)"
    exit 77
fi
exit 0
