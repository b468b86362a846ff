#!/usr/bin/env bash
# Installs the Debian packages kgpu builds and tests with (Debian 12).
# As root it runs apt-get; otherwise it prints the line to run and fails if
# anything is missing. Safe to run again: it installs only what is missing.
#
#   scripts/deps.sh           what the build and the whole test suite need
#   scripts/deps.sh --build   only what building and running kgpu needs (the
#                             Quick start's first command, scripts/demo.sh)
#
# Packages that ship a service (prometheus, containerd) are installed for
# the tests' own use, which start them by hand: their services are not
# started, and are disabled where systemd runs, so nothing is left running
# that was not asked for.
set -euo pipefail

build_only=0
[ "${1:-}" = "--build" ] && build_only=1

BUILD_PACKAGES=(
  build-essential cmake pkg-config   # toolchain
  libjansson-dev                     # JSON: kube-scheduler and API server wire formats, simulator output
  libmicrohttpd-dev                  # HTTP server of kgpu-extender
  libgnutls28-dev                    # TLS client-certificate checks on the extender port
  libcurl4-openssl-dev               # HTTP client for the Kubernetes API and kgpu inspect
  libyaml-dev                        # YAML: config, cluster file, kubeconfig
  libprotobuf-c-dev protobuf-c-compiler  # kubelet device plugin API messages (C)
  libgrpc-dev                        # gRPC core (C API): kubelet's device plugin sockets
  liblz4-dev libzstd-dev             # static PIC decoders linked into libkgpu-limit.so: compressed fatbinary entries
)
TEST_PACKAGES=(
  python3-grpcio python3-protobuf protobuf-compiler  # the kubelet stand-in of the device plugin tests
  libcmocka-dev                      # unit test framework
  libxml2-utils                      # xmllint: tests check the SVG plot is well-formed XML
  python3                            # the API server stand-in and load drivers of integration tests
  python3-scipy                      # bench/share_bound.py: LP bound on packing a run's GPU shares
  python3-yaml                       # the Helm chart test parses helm's and kustomize's output
  prometheus                         # promtool and a real server scrape /metrics in a test
  openssl                            # throwaway certificates for the TLS test
  containerd runc                    # the e2e node suite's container runtime (kubelet's CRI)
  containernetworking-plugins        # its pods' network: bridge, host-local, loopback
  iproute2                           # ... and taking that bridge down again
  musl-tools                         # ... and a job program on another C library
)

PACKAGES=("${BUILD_PACKAGES[@]}")
[ "$build_only" = 1 ] || PACKAGES+=("${TEST_PACKAGES[@]}")
SERVICES=(prometheus containerd)  # packages above whose install starts a service

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "kgpu needs these Debian packages; run as root:" >&2
  echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# No service starts while packages install (Debian's policy-rc.d convention),
# unless the machine already has a policy of its own.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "installed: ${missing[*]}"
# ... nor at the next boot: the tests start their own.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  for svc in "${SERVICES[@]}"; do
    if printf '%s\n' "${missing[@]}" | grep -qx "$svc"; then
      systemctl disable --now "$svc" >/dev/null 2>&1 || true
    fi
  done
fi
