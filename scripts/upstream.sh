#!/usr/bin/env bash
# Builds the upstream components the end-to-end suites run -- etcd,
# kube-apiserver, kube-scheduler, kubectl, kubelet, kube-controller-manager
# and kube-proxy (the install suite), helm and containerd
# (with its runc shim and ctr) -- from their
# published Go modules at the versions pinned below, into a cache outside
# the source tree keyed by version. A second run with the same versions
# builds nothing. Nothing of theirs enters this repository.
#
#   scripts/upstream.sh            build what is missing, print the bin dir
#   scripts/upstream.sh --check    exit 0 if everything is built, 1 if not,
#                                  2 if this machine's Go is too old
#   scripts/upstream.sh --bin      print the bin dir (builds nothing)
#   scripts/upstream.sh --containerd-bin
#                                  print containerd's folder inside it (builds nothing)
#   scripts/upstream.sh --kueue-dir
#                                  print Kueue's folder inside it: the kueue binary and
#                                  crds/, its CustomResourceDefinitions (builds nothing)
#
# A version bump is one line: K8S_VERSION (the staging modules k8s.io/* are
# pinned to the matching v0.x.y by reading k8s.io/kubernetes's own go.mod),
# ETCD_VERSION (the etcd that release's build/dependencies.yaml names),
# HELM_VERSION or CONTAINERD_VERSION (a 2.x: CDI injection is always on
# there; Debian's 1.6 has none). containerd lives in a folder of its own
# inside the bin dir, named by its version, so adding or bumping it does not
# rebuild the rest.
#
# Cold cost on the project's 2-core machine (docs/e2e.md): about 21 minutes,
# Kubernetes' seven commands 14 of them.
set -euo pipefail

K8S_VERSION=v1.37.2
ETCD_VERSION=v3.7.0
HELM_VERSION=v4.3.1
CONTAINERD_VERSION=v2.4.2
KUEUE_VERSION=v0.17.0   # MultiKueue's external dispatcher API (nominatedClusterNames)
GO_MIN=1.26       # what k8s.io/kubernetes ${K8S_VERSION}'s go.mod asks for

CACHE=${KGPU_UPSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kgpu-upstream}
BIN="$CACHE/bin-k8s-$K8S_VERSION-etcd-$ETCD_VERSION-helm-$HELM_VERSION"
CTRD_BIN="$BIN/containerd-$CONTAINERD_VERSION"
KUEUE_DIR="$BIN/kueue-$KUEUE_VERSION"
K8S_CMDS=(kube-apiserver kube-scheduler kubectl kubelet kube-controller-manager kube-proxy)
TOOLS=(etcd "${K8S_CMDS[@]}" helm
       "containerd-$CONTAINERD_VERSION/containerd"
       "containerd-$CONTAINERD_VERSION/containerd-shim-runc-v2"
       "containerd-$CONTAINERD_VERSION/ctr"
       "kueue-$KUEUE_VERSION/kueue")

say() { echo "upstream: $*" >&2; }

go_ok() {
    command -v go >/dev/null 2>&1 || { say "no Go on PATH (need >= $GO_MIN)"; return 1; }
    local v
    v=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
    if [ "$(printf '%s\n%s\n' "$GO_MIN" "$v" | sort -V | head -1)" != "$GO_MIN" ]; then
        say "Go $v is older than the $GO_MIN that Kubernetes $K8S_VERSION needs"
        return 1
    fi
}

all_built() {
    local t
    for t in "${TOOLS[@]}"; do [ -x "$BIN/$t" ] || return 1; done
}

if [ "${1:-}" = "--check" ]; then
    all_built && { echo "$BIN"; exit 0; }
    go_ok || exit 2
    exit 1
fi
if [ "${1:-}" = "--bin" ]; then echo "$BIN"; exit 0; fi
if [ "${1:-}" = "--containerd-bin" ]; then echo "$CTRD_BIN"; exit 0; fi
if [ "${1:-}" = "--kueue-dir" ]; then echo "$KUEUE_DIR"; exit 0; fi

if all_built; then echo "$BIN"; exit 0; fi
go_ok || exit 2

mkdir -p "$BIN" "$CACHE/src"
# One build at a time: a second caller (a parallel test, a benchmark) waits
# for the first and then finds everything built.
exec 9>"$CACHE/.lock"
flock 9
if all_built; then echo "$BIN"; exit 0; fi
# The module cache and build cache live in the usual Go places (GOMODCACHE,
# GOCACHE); only the small go.mod files that pin each tool live here.
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

# --- Kubernetes: one module that requires k8s.io/kubernetes at the pinned
# tag and replaces each staging module (required there as v0.0.0) with the
# published v0.<minor>.<patch> of the same release.
k8s_dir="$CACHE/src/k8s-$K8S_VERSION"
staging="v0.${K8S_VERSION#v1.}"
# Resolved for this list of commands; a command added to it resolves again.
if [ "$(cat "$k8s_dir/.resolved" 2>/dev/null)" != "${K8S_CMDS[*]}" ]; then
    rm -rf "$k8s_dir"; mkdir -p "$k8s_dir"
    (
        cd "$k8s_dir"
        go mod init kgpu.invalid/upstream-k8s >/dev/null 2>&1
        go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
        gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
                sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
        mods=$(sed -n 's/^[[:space:]]*\(k8s\.io\/[a-z0-9-]*\) v0\.0\.0$/\1/p' "$gomod")
        [ -n "$mods" ] || { say "found no staging modules in $gomod"; exit 1; }
        for m in $mods; do go mod edit -replace "$m=$m@$staging"; done
        go mod edit -require "k8s.io/kubernetes@$K8S_VERSION"
        printf 'package upstream\n' > doc.go
        pkgs=()
        for t in "${K8S_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$t@$K8S_VERSION"); done
        go get "${pkgs[@]}" >&2
    )
    echo "${K8S_CMDS[*]}" > "$k8s_dir/.resolved"
fi
# The version the binaries report (kubectl version, /version, skew checks).
minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMinor=$minor"
k8s_ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
k8s_ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
k8s_ldflags+=" -X k8s.io/client-go/pkg/version.gitMajor=1"
k8s_ldflags+=" -X k8s.io/client-go/pkg/version.gitMinor=$minor"
for t in "${K8S_CMDS[@]}"; do
    [ -x "$BIN/$t" ] && continue
    say "building $t $K8S_VERSION (cold: several minutes)"
    (cd "$k8s_dir" && go build -trimpath -ldflags "$k8s_ldflags" \
        -o "$BIN/$t.tmp" "k8s.io/kubernetes/cmd/$t")
    mv "$BIN/$t.tmp" "$BIN/$t"
done

# --- One tool from a module of its own: a small go.mod in DIR that requires
# PACKAGE at VERSION, then the build of PACKAGE with LDFLAGS into $BIN/NAME.
build_module() { # NAME DIR PACKAGE VERSION LDFLAGS
    local name=$1 dir=$2 pkg=$3 version=$4 ldflags=$5
    [ -x "$BIN/$name" ] && return 0
    mkdir -p "$dir"
    (
        cd "$dir"
        [ -f go.mod ] || go mod init "kgpu.invalid/upstream-$name" >/dev/null 2>&1
        printf 'package upstream\n' > doc.go
        go get "$pkg@$version" >&2
        say "building $name $version"
        go build -trimpath -ldflags "$ldflags" -o "$BIN/$name.tmp" "$pkg"
    )
    mv "$BIN/$name.tmp" "$BIN/$name"
}

# etcd: the server module's main package.
build_module etcd "$CACHE/src/etcd-$ETCD_VERSION" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "-s -w"

# helm: renders deploy/helm/kgpu for the suites.
helm_major=${HELM_VERSION#v}; helm_major=${helm_major%%.*}
helm_mod="helm.sh/helm/v$helm_major"
build_module helm "$CACHE/src/helm-$HELM_VERSION" "$helm_mod/cmd/helm" "$HELM_VERSION" \
    "-s -w -X $helm_mod/internal/version.version=$HELM_VERSION"

# containerd 2.x, its runc shim and ctr (to import the suites' locally built
# images): one module, three main packages. The tags leave out the snapshotters
# that need cgo or kernel features the suites do not use (overlayfs and native
# stay in).
ctrd_dir="$CACHE/src/containerd-$CONTAINERD_VERSION"
ctrd_mod=github.com/containerd/containerd/v2
ctrd_ldflags="-s -w -X $ctrd_mod/version.Version=$CONTAINERD_VERSION"
ctrd_ldflags+=" -X $ctrd_mod/version.Package=$ctrd_mod"
for t in containerd containerd-shim-runc-v2 ctr; do
    [ -x "$CTRD_BIN/$t" ] && continue
    mkdir -p "$ctrd_dir" "$CTRD_BIN"
    (
        cd "$ctrd_dir"
        [ -f go.mod ] || go mod init kgpu.invalid/upstream-containerd >/dev/null 2>&1
        printf 'package upstream\n' > doc.go
        go get "$ctrd_mod/cmd/$t@$CONTAINERD_VERSION" >&2
        say "building $t $CONTAINERD_VERSION (cold: several minutes)"
        go build -trimpath -tags "no_btrfs no_devmapper no_zfs" -ldflags "$ctrd_ldflags" \
            -o "$CTRD_BIN/$t.tmp" "$ctrd_mod/cmd/$t"
    )
    mv "$CTRD_BIN/$t.tmp" "$CTRD_BIN/$t"
done

# Kueue: its manager, and its CustomResourceDefinitions as the module ships
# them (config/components/crd/bases), copied next to it so that the suite
# needs nothing from the module cache. Its own folder: a bump rebuilds only it.
if [ ! -x "$KUEUE_DIR/kueue" ]; then
    kueue_src="$CACHE/src/kueue-$KUEUE_VERSION"
    mkdir -p "$kueue_src" "$KUEUE_DIR"
    (
        cd "$kueue_src"
        [ -f go.mod ] || go mod init kgpu.invalid/upstream-kueue >/dev/null 2>&1
        printf 'package upstream\n' > doc.go
        go get "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION" >&2
        say "building kueue $KUEUE_VERSION (cold: about 4 minutes)"
        go build -trimpath -ldflags "-s -w" -o "$KUEUE_DIR/kueue.tmp" sigs.k8s.io/kueue/cmd/kueue
        moddir=$(go list -m -f '{{.Dir}}' "sigs.k8s.io/kueue")
        rm -rf "$KUEUE_DIR/crds"; mkdir -p "$KUEUE_DIR/crds"
        cp "$moddir"/config/components/crd/bases/*.yaml "$KUEUE_DIR/crds/"
        chmod u+w "$KUEUE_DIR"/crds/*.yaml
    )
    mv "$KUEUE_DIR/kueue.tmp" "$KUEUE_DIR/kueue"
fi

all_built || { say "not every tool was built"; exit 1; }
echo "$BIN"
