#!/usr/bin/env bash
# The end-to-end suites: kgpu against the real upstream Kubernetes components
# (built from their Go modules at pinned versions by scripts/upstream.sh).
#
#   scripts/e2e.sh                          every suite
#   scripts/e2e.sh --suite control-plane    kgpu-extender under a real kube-apiserver
#                                           and kube-scheduler (etcd on loopback)
#   scripts/e2e.sh --suite node             a real kubelet, containerd and runc on this
#                                           machine joined to that control plane, running
#                                           kgpu-device-plugin and libkgpu-limit.so in
#                                           real containers (needs root; skipped otherwise)
#   scripts/e2e.sh --suite dra              kgpu-dra-plugin on such a node with containerd 2.x
#                                           (CDI): claims allocated by kube-scheduler, prepared
#                                           by kubelet, shares enforced in the containers
#   scripts/e2e.sh --suite install          `helm install` of kgpu's own-scheduler mode, every
#                                           part a real pod (kube-controller-manager and
#                                           kube-proxy run too): routing, upgrade, uninstall
#   scripts/e2e.sh --suite multicluster     Kueue's MultiKueue on a manager and two worker
#                                           control planes (each worker with kgpu-extender,
#                                           kube-scheduler and kube-controller-manager),
#                                           kgpu-dispatcher choosing the worker
#   scripts/e2e.sh --suite control-plane -k preempt    tests whose name has "preempt"
#
# Ends with the line `N passed, N failed`; exits non-zero on any failure.
# Every process it starts is stopped at the end, also on Ctrl-C or SIGTERM.
# Without Go >= 1.26 it cannot build the components: it says so and exits 0
# (skipped), or 1 (failed) under CI=true. Environment: E2E_BUILD (the kgpu
# build to test; default build-test, as scripts/test.sh leaves it), E2E_WORK
# (scratch folder; kept after a failure for its logs), KGPU_UPSTREAM_CACHE.
set -euo pipefail
cd "$(dirname "$0")/.."

args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --suite) args+=(--suite "$2"); shift 2 ;;
        -k) args+=(-k "$2"); shift 2 ;;
        -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "e2e.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

rc=0
bin=$(./scripts/upstream.sh) || rc=$?
if [ "$rc" = 2 ] && [ "${CI:-}" = true ]; then
    # In CI a suite that cannot run is a failure: a skip would pass unseen.
    echo "e2e.sh: FAILED: CI=true and this machine cannot build the upstream components (above)." >&2
    echo "0 passed, 1 failed"
    exit 1
elif [ "$rc" = 2 ]; then
    echo "e2e.sh: SKIPPED: this machine cannot build the upstream components (above)."
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
elif [ "$rc" != 0 ]; then
    echo "e2e.sh: building the upstream components failed (exit $rc)" >&2
    exit "$rc"
fi
for tool in openssl python3; do
    command -v "$tool" >/dev/null || { echo "e2e.sh: $tool is missing (scripts/deps.sh)" >&2; exit 1; }
done

BUILD=${E2E_BUILD:-build-test}
# What the suites run: the node suite adds the device plugin, the limit library and the
# fake driver (libcuda.so.1, libnvidia-ml.so.1) that its containers get.
need=(kgpu-extender kgpu kgpu-dispatcher kgpu-device-plugin kgpu-dra-plugin libkgpu-limit.so
      fake-cuda/full/libcuda.so.1 tests/fake-nvml-plain/libnvidia-ml.so.1)
for f in "${need[@]}"; do
    if [ ! -e "$BUILD/$f" ]; then
        cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKGPU_SANITIZE=ON >/dev/null
        cmake --build "$BUILD" -j"$(nproc)" --target kgpu-extender kgpu kgpu-dispatcher kgpu-device-plugin \
            kgpu-dra-plugin kgpu-limit fake_cuda_full fake_nvml_plain >/dev/null
        break
    fi
done

WORK=${E2E_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/kgpu-e2e.XXXXXX")}
mkdir -p "$WORK"
status=0
# In the background, so that a SIGTERM or SIGHUP sent to this script alone (as CI
# runners do) reaches the suites, which then take down what they started.
python3 tests/e2e/e2e.py --bin "$bin" --build "$BUILD" --work "$WORK" "${args[@]}" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null' TERM HUP
trap 'kill -INT "$pid" 2>/dev/null' INT
while :; do
    wait "$pid" && status=0 || status=$?
    kill -0 "$pid" 2>/dev/null || break   # wait returned for a trapped signal: wait on
done
trap - TERM HUP INT
# Never remove through a mount the node suite failed to take down.
if grep -qF " $WORK" /proc/self/mountinfo 2>/dev/null; then
    echo "e2e.sh: something is still mounted under $WORK: not removing it" >&2
    [ "$status" != 0 ] || status=1
elif [ "$status" = 0 ] && [ -z "${E2E_WORK:-}" ]; then
    rm -rf "$WORK"
else
    echo "e2e.sh: logs of every component are in $WORK" >&2
fi
exit "$status"
