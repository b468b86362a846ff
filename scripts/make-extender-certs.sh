#!/usr/bin/env bash
# Makes the certificates kgpu-extender's shipped configuration expects: a CA
# of your own, the extender's serving certificate, and a client certificate
# for kube-scheduler, all signed by that CA. Then prints the command that
# stores them as the Secret the extender mounts, and which files to copy to
# the control-plane nodes. Nothing is sent to the cluster.
#
#   scripts/make-extender-certs.sh [--out DIR] [--namespace NS] [--days N] [--ip ADDR]...
#   scripts/make-extender-certs.sh --out DIR --client NAME    one more client
#                                  certificate from DIR's CA (for kgpu inspect,
#                                  Prometheus); makes DIR/NAME.crt, DIR/NAME.key
#
#   --out DIR        where to write (default ./kgpu-extender-certs); must not
#                    hold certificates already, unless --force
#   --namespace NS   the extender's namespace (default kgpu-system): the
#                    serving certificate names kgpu-extender.NS.svc and
#                    kgpu-extender.NS.svc.cluster.local
#   --ip ADDR        also an IP address in the serving certificate, e.g. the
#                    Service's cluster IP when urlPrefix uses it (repeatable)
#   --days N         validity (default 365); the extender reads its files only
#                    at start, so renewing means a new Secret and a restart
#
# Files: ca.crt (trust anchor for both sides), ca.key (keep it off the
# cluster: whoever holds it can mint a client the extender accepts),
# tls.crt/tls.key (the extender), client.crt/client.key (kube-scheduler).
# The serving certificate also names localhost and 127.0.0.1, so that
# `kubectl port-forward` followed by `kgpu inspect --server https://127.0.0.1:12346`
# verifies it. Keys are ECDSA P-256, which GnuTLS (the extender) and Go
# (kube-scheduler) both accept. Needs openssl.
set -euo pipefail

out=./kgpu-extender-certs ns=kgpu-system days=365 force=0 client=""
ips=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out=$2; shift 2 ;;
        --namespace) ns=$2; shift 2 ;;
        --days) days=$2; shift 2 ;;
        --ip) ips+=("$2"); shift 2 ;;
        --client) client=$2; shift 2 ;;
        --force) force=1; shift ;;
        -h|--help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "make-extender-certs.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
command -v openssl >/dev/null || { echo "make-extender-certs.sh: openssl is missing" >&2; exit 1; }
case "$days" in ''|*[!0-9]*) echo "make-extender-certs.sh: --days takes a number" >&2; exit 2 ;; esac
case "$client" in *[!A-Za-z0-9._-]*) echo "make-extender-certs.sh: --client: letters, digits, . _ - only" >&2; exit 2 ;; esac

umask 077
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# issue NAME CN EXTENDED_KEY_USAGE [SAN]: NAME.key and NAME.crt signed by the CA.
issue() {
    local name=$1 cn=$2 eku=$3 san=${4:-}
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$out/$name.key" -out "$tmp/$name.csr" -subj "/O=kgpu/CN=$cn" 2>/dev/null
    {
        echo "basicConstraints=critical,CA:FALSE"
        echo "keyUsage=critical,digitalSignature"
        echo "extendedKeyUsage=$eku"
        [ -n "$san" ] && echo "subjectAltName=$san"
    } >"$tmp/$name.ext"
    openssl x509 -req -in "$tmp/$name.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
        -CAcreateserial -CAserial "$tmp/ca.srl" -days "$days" -sha256 \
        -extfile "$tmp/$name.ext" -out "$out/$name.crt" 2>/dev/null
}

if [ -n "$client" ]; then
    [ -f "$out/ca.crt" ] && [ -f "$out/ca.key" ] ||
        { echo "make-extender-certs.sh: $out has no ca.crt and ca.key to sign with" >&2; exit 1; }
    if [ -e "$out/$client.crt" ] && [ "$force" = 0 ]; then
        echo "make-extender-certs.sh: $out/$client.crt exists (--force replaces it)" >&2; exit 1
    fi
    issue "$client" "$client" clientAuth
    echo "$out/$client.crt and $out/$client.key: a client certificate the extender accepts."
    exit 0
fi

for f in ca.crt ca.key tls.crt tls.key client.crt client.key; do
    if [ -e "$out/$f" ] && [ "$force" = 0 ]; then
        echo "make-extender-certs.sh: $out/$f exists; --force makes a new CA and replaces all" >&2
        exit 1
    fi
done

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$out/ca.key" -out "$out/ca.crt" -days "$days" -sha256 \
    -subj "/O=kgpu/CN=kgpu-extender-ca" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

svc="kgpu-extender.$ns.svc"
san="DNS:$svc,DNS:$svc.cluster.local,DNS:localhost,IP:127.0.0.1"
for ip in "${ips[@]}"; do san="$san,IP:$ip"; done
issue tls "$svc" serverAuth "$san"
issue client kube-scheduler clientAuth

cat <<EOF
Made in $out: ca.crt, ca.key, tls.crt, tls.key, client.crt, client.key.

1. The extender's Secret (its namespace must exist; the Helm chart or
   kubectl apply -k deploy/extender creates it):

   kubectl -n $ns create secret generic kgpu-extender-tls --type=kubernetes.io/tls \\
     --from-file=tls.crt=$out/tls.crt --from-file=tls.key=$out/tls.key \\
     --from-file=ca.crt=$out/ca.crt

2. kube-scheduler's files, on every control-plane node, beside
   scheduler-config.yaml (its tlsConfig names them):

   install -m 0644 $out/ca.crt     /etc/kubernetes/kgpu/ca.crt
   install -m 0644 $out/client.crt /etc/kubernetes/kgpu/client.crt
   install -m 0600 $out/client.key /etc/kubernetes/kgpu/client.key

3. Keep $out/ca.key somewhere safe and off the cluster. More client
   certificates (kgpu inspect, Prometheus):
   $0 --out $out --client NAME
EOF
