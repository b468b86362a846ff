#!/usr/bin/env python3
"""kgpu-expander as Cluster Autoscaler reaches it: gRPC over TLS (grpcio, a
client stack apart from the server's), /grpcplugin.Expander/BestOptions, with
the v1.Node templates and v1.Pods encoded from Kubernetes' own protobuf
definitions (k8s.io/api's generated.proto at the version scripts/upstream.sh
pins, from the Go module cache), so that the field numbers kgpu reads are
checked against upstream's, not against its own copy.

Run with an interpreter that can import grpc (on Debian /usr/bin/python3 with
python3-grpcio and python3-protobuf). Without grpc, protoc or the k8s.io/api
module it exits 77 (skipped), except under CI=true, where that is a failure.
"""
import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import grpc
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
except ImportError:  # pragma: no cover
    grpc = None

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
METHOD = "/grpcplugin.Expander/BestOptions"
ARGS = None
MSG = {}  # message classes by full name


def skip(why):
    if os.environ.get("CI") == "true":
        print("test_expander: FAILED: CI=true and " + why)
        sys.exit(1)
    print("test_expander: skipped: " + why)
    sys.exit(77)


def k8s_api_dirs():
    """The k8s.io/api and k8s.io/apimachinery module folders upstream.sh's Kubernetes uses."""
    with open(os.path.join(ROOT, "scripts", "upstream.sh")) as f:
        text = f.read()
    m = re.search(r"^K8S_VERSION=v1\.(\d+\.\d+)", text, re.M)
    if not m:
        skip("no K8S_VERSION in scripts/upstream.sh")
    version = "v0." + m.group(1)
    try:
        cache = subprocess.run(["go", "env", "GOMODCACHE"], check=True, capture_output=True,
                               text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        cache = os.path.expanduser("~/go/pkg/mod")
    api = os.path.join(cache, "k8s.io", "api@" + version)
    mach = os.path.join(cache, "k8s.io", "apimachinery@" + version)
    if not os.path.isdir(api) or not os.path.isdir(mach):
        skip("k8s.io/api %s is not in the Go module cache (%s): run scripts/upstream.sh"
             % (version, cache))
    return api, mach


def load_messages(tmp):
    api, mach = k8s_api_dirs()
    out = os.path.join(tmp, "protos.pb")
    subprocess.run([ARGS.protoc, "--include_imports", "--descriptor_set_out=" + out,
                    "--proto_path=k8s.io/api=" + api,
                    "--proto_path=k8s.io/apimachinery=" + mach,
                    "--proto_path=" + os.path.join(ROOT, "proto"),
                    "k8s.io/api/core/v1/generated.proto", "ca_expander.proto"],
                   check=True, capture_output=True)
    with open(out, "rb") as f:
        fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    factory = message_factory.MessageFactory(pool)
    for name in ("k8s.io.api.core.v1.Node", "k8s.io.api.core.v1.Pod",
                 "kgpu.caexp.BestOptionsRequest", "kgpu.caexp.BestOptionsResponse"):
        MSG[name] = factory.GetPrototype(pool.FindMessageTypeByName(name))


# ---------------------------------------------------------------------------
# Cluster Autoscaler's side: templates, pending pods, the request
# ---------------------------------------------------------------------------

def template(product, gpus, mib, labels=None):
    """A node group's template as a cloud provider builds one for a group at zero:
    GPU feature discovery's labels and nvidia.com/gpu in capacity and allocatable."""
    n = MSG["k8s.io.api.core.v1.Node"]()
    n.metadata.name = "template-node-for-%s-%d" % (product.replace(" ", "-").lower(), gpus)
    n.metadata.labels["nvidia.com/gpu.product"] = product
    n.metadata.labels["nvidia.com/gpu.memory"] = str(mib)
    n.metadata.labels["kubernetes.io/os"] = "linux"
    for k, v in (labels or {}).items():
        n.metadata.labels[k] = v
    for field in (n.status.capacity, n.status.allocatable):
        for k, v in (("cpu", "32"), ("memory", "128Gi"), ("pods", "110"),
                     ("nvidia.com/gpu", str(gpus))):
            field[k].string = v
    t = n.spec.taints.add()
    t.key, t.value, t.effect = "nvidia.com/gpu", "present", "NoSchedule"
    n.status.conditions.add(type="Ready", status="True")
    return n.SerializeToString()


def pod(name, limits, tolerate_gpu=True):
    p = MSG["k8s.io.api.core.v1.Pod"]()
    p.metadata.name, p.metadata.namespace, p.metadata.uid = name, "ci", "uid-" + name
    p.metadata.labels["app"] = "gitlab-ci-job"
    c = p.spec.containers.add()
    c.name, c.image = "build", "registry.example/ci:1"
    c.resources.requests["cpu"].string = "1"
    c.resources.requests["memory"].string = "2Gi"
    for k, v in limits.items():
        c.resources.limits[k].string = str(v)
    if tolerate_gpu:  # what ExtendedResourceToleration adds
        p.spec.tolerations.add(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
    p.spec.schedulerName = "default-scheduler"
    return p.SerializeToString()


def request(groups, options):
    """groups: {id: template bytes}; options: [(id, node count, [pod bytes])]."""
    r = MSG["kgpu.caexp.BestOptionsRequest"]()
    for gid, node in groups.items():
        r.nodeBytesMap[gid] = node
    for gid, count, pods in options:
        o = r.options.add()
        o.nodeGroupId, o.nodeCount, o.debug = gid, count, "ca estimator"
        o.podBytes.extend(pods)
    return r.SerializeToString()


# ---------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_certs(tmp):
    """A CA and a server certificate for 127.0.0.1 and localhost, made with openssl."""
    def run(*a):
        subprocess.run(["openssl"] + list(a), check=True, capture_output=True)
    ca_key, ca = os.path.join(tmp, "ca.key"), os.path.join(tmp, "ca.crt")
    key, csr, crt = (os.path.join(tmp, n) for n in ("srv.key", "srv.csr", "srv.crt"))
    ext = os.path.join(tmp, "ext.cnf")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
        "-days", "2", "-subj", "/CN=kgpu-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
        "-subj", "/CN=kgpu-expander")
    run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
        "-out", crt, "-days", "2", "-extfile", ext)
    return ca, crt, key


class ExpanderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kgpu-expander-")
        load_messages(cls.tmp)
        cls.ca, crt, key = make_certs(cls.tmp)
        cls.port = free_port()
        cls.log = open(os.path.join(cls.tmp, "expander.log"), "w+")
        cls.proc = subprocess.Popen([ARGS.expander, "--listen", "127.0.0.1:%d" % cls.port,
                                     "--tls-cert", crt, "--tls-key", key],
                                    stdout=cls.log, stderr=subprocess.STDOUT)
        with open(cls.ca, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        cls.channel = grpc.secure_channel("localhost:%d" % cls.port, creds)
        try:
            grpc.channel_ready_future(cls.channel).result(timeout=20)
        except grpc.FutureTimeoutError:
            cls.tearDownClass()
            raise AssertionError("kgpu-expander did not come up")
        cls.call = cls.channel.unary_unary(METHOD)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.proc.terminate()
        try:
            cls.proc.wait(10)
        except subprocess.TimeoutExpired:
            cls.proc.kill()
            cls.proc.wait()
        cls.log.seek(0)
        out = cls.log.read()
        cls.log.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if "ERROR: AddressSanitizer" in out or "runtime error:" in out:
            raise AssertionError("sanitizer report:\n" + out)

    def best(self, groups, options):
        r = MSG["kgpu.caexp.BestOptionsResponse"].FromString(
            self.call(request(groups, options), timeout=5))
        return [o.nodeGroupId for o in r.options]

    def test_share_too_big_for_any_gpu_of_a_group(self):
        """A 12 GiB share: 2 x 8 GiB GPUs hold it by node sums (Cluster Autoscaler's
        view), no single one does; the group of 16 GiB GPUs is chosen, and when it is
        not offered, nothing is: no useless scale-up."""
        groups = {"p4": template("Tesla P4", 2, 7680), "t4": template("Tesla T4", 2, 15360)}
        pods = [pod("job-0", {"kgpu.io/gpu-mem": 12})]
        self.assertEqual(self.best(groups, [("p4", 1, pods), ("t4", 1, pods)]), ["t4"])
        self.assertEqual(self.best(groups, [("p4", 1, pods)]), [])

    def test_the_group_that_places_every_pending_pod(self):
        """Three whole-GPU CI jobs: one 2-GPU node places two, one 4-GPU node all three."""
        groups = {"t4x2": template("Tesla T4", 2, 15360),
                  "v100x4": template("Tesla V100-SXM2-16GB", 4, 16384)}
        pods = [pod("job-%d" % i, {"nvidia.com/gpu": 1}) for i in range(3)]
        self.assertEqual(self.best(groups, [("t4x2", 1, pods), ("v100x4", 1, pods)]),
                         ["v100x4"])

    def test_shares_packed_per_gpu(self):
        """Four 10 GiB shares fit a 2 x 24 GiB node two per GPU; on 2 x 15 GiB GPUs only
        two fit, whatever the 30 GiB sum says."""
        groups = {"t4x2": template("Tesla T4", 2, 15360),
                  "l4x2": template("NVIDIA L4", 2, 24576)}
        pods = [pod("s-%d" % i, {"kgpu.io/gpu-mem": 10}) for i in range(4)]
        self.assertEqual(self.best(groups, [("t4x2", 1, pods), ("l4x2", 1, pods)]),
                         ["l4x2"])

    def test_errors_are_grpc_statuses(self):
        with self.assertRaises(grpc.RpcError) as e:
            self.call(b"\xff\xff\xff\xff\x0f", timeout=5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("BestOptionsRequest", e.exception.details())
        groups = {"t4": template("Tesla T4", 2, 15360)}
        with self.assertRaises(grpc.RpcError) as e:
            self.call(request(groups, [("t4", 1, [pod("typo", {"kgpu.io/gpu-memory": 4})])]),
                      timeout=5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("option 0 (group t4): pod 0", e.exception.details())
        other = self.channel.unary_unary("/grpcplugin.Expander/Other")
        with self.assertRaises(grpc.RpcError) as e:
            other(b"", timeout=5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        # The server still answers afterwards.
        self.assertEqual(self.best(groups, [("t4", 1, [pod("ok", {"nvidia.com/gpu": 1})])]),
                         ["t4"])

    def test_plaintext_is_refused(self):
        """Cluster Autoscaler only speaks TLS to an expander; a plaintext client gets nowhere."""
        ch = grpc.insecure_channel("127.0.0.1:%d" % self.port)
        try:
            with self.assertRaises(grpc.RpcError) as e:
                ch.unary_unary(METHOD)(request({}, []), timeout=3)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
        finally:
            ch.close()

    def test_alpn_offers_h2(self):
        """gRPC-Go clients (Cluster Autoscaler's) refuse a TLS server that does not
        negotiate h2 by ALPN; openssl s_client shows what is negotiated."""
        out = subprocess.run(["openssl", "s_client", "-alpn", "h2", "-CAfile", self.ca,
                              "-connect", "127.0.0.1:%d" % self.port, "-servername",
                              "localhost"], input=b"", capture_output=True, timeout=20).stdout
        self.assertIn(b"ALPN protocol: h2", out)
        self.assertIn(b"Verify return code: 0 (ok)", out)

    def test_bad_flags_and_files(self):
        def run(*args):
            return subprocess.run([ARGS.expander] + list(args), capture_output=True, text=True,
                                  timeout=20)
        r = run("--listen", "127.0.0.1:1")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--tls-cert and --tls-key are required", r.stderr)
        r = run("--tls-cert", "x", "--tls-key", "y", "--memory-unit", "12")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--memory-unit '12'", r.stderr)
        missing = os.path.join(self.tmp, "no-such.crt")
        r = run("--tls-cert", missing, "--tls-key", missing)
        self.assertEqual(r.returncode, 1)
        self.assertIn(missing, r.stderr)
        # A key that is not PEM: refused at start, not at the first call.
        junk = os.path.join(self.tmp, "junk.pem")
        with open(junk, "w") as f:
            f.write("not a key\n")
        r = run("--listen", "127.0.0.1:%d" % free_port(), "--tls-cert", junk, "--tls-key", junk)
        self.assertEqual(r.returncode, 1)

    def test_prices(self):
        """With examples/prices.yaml: among groups that all place the pod, the cheapest,
        spot when the group is spot; a prices file with a mistake stops the start."""
        port = free_port()
        crt, key = os.path.join(self.tmp, "srv.crt"), os.path.join(self.tmp, "srv.key")
        proc = subprocess.Popen([ARGS.expander, "--listen", "127.0.0.1:%d" % port,
                                 "--tls-cert", crt, "--tls-key", key,
                                 "--prices", os.path.join(ROOT, "examples", "prices.yaml")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(self.ca, "rb") as f:
            ch = grpc.secure_channel("localhost:%d" % port,
                                     grpc.ssl_channel_credentials(root_certificates=f.read()))
        try:
            grpc.channel_ready_future(ch).result(timeout=20)
            call = ch.unary_unary(METHOD)

            def best(groups, options):
                r = MSG["kgpu.caexp.BestOptionsResponse"].FromString(
                    call(request(groups, options), timeout=5))
                return [o.nodeGroupId for o in r.options]
            groups = {"a100": template("NVIDIA A100-SXM4-80GB", 2, 81920),
                      "t4": template("Tesla T4", 2, 15360),
                      "t4-spot": template("Tesla T4", 2, 15360,
                                          {"eks.amazonaws.com/capacityType": "SPOT"})}
            pods = [pod("job", {"nvidia.com/gpu": 1})]
            self.assertEqual(best(groups, [("a100", 1, pods), ("t4", 1, pods)]), ["t4"])
            self.assertEqual(best(groups, [("a100", 1, pods), ("t4", 1, pods),
                                           ("t4-spot", 1, pods)]), ["t4-spot"])
            # A 20 GiB share fits only the A100s: the price does not buy a node that cannot.
            big = [pod("big", {"kgpu.io/gpu-mem": 20})]
            self.assertEqual(best(groups, [("a100", 1, big), ("t4", 1, big)]), ["a100"])
        finally:
            ch.close()
            proc.terminate()
            proc.wait(10)
        bad = os.path.join(self.tmp, "bad-prices.yaml")
        with open(bad, "w") as f:
            f.write("prices:\n  gpu:\n    Tesla T4: {onDemand: 0.35, spot: cheap}\n")
        r = subprocess.run([ARGS.expander, "--tls-cert", crt, "--tls-key", key, "--prices", bad],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual(r.returncode, 1)
        self.assertIn("prices.gpu.Tesla T4.spot: expected a price per hour", r.stderr)

    def test_concurrent_calls(self):
        groups = {"p4": template("Tesla P4", 2, 7680), "t4": template("Tesla T4", 2, 15360)}
        pods = [pod("job-%d" % i, {"kgpu.io/gpu-mem": 12}) for i in range(2)]
        req = request(groups, [("p4", 2, pods), ("t4", 2, pods)])
        futures = [self.call.future(req, timeout=10) for _ in range(32)]
        for f in futures:
            r = MSG["kgpu.caexp.BestOptionsResponse"].FromString(f.result())
            self.assertEqual([o.nodeGroupId for o in r.options], ["t4"])


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--expander", required=True)
    ap.add_argument("--protoc", default=shutil.which("protoc") or "protoc")
    ARGS, rest = ap.parse_known_args()
    if grpc is None:
        skip("this interpreter cannot import grpc and protobuf (python3-grpcio, "
             "python3-protobuf)")
    if not shutil.which(ARGS.protoc) and not os.path.exists(ARGS.protoc):
        skip("no protoc (protobuf-compiler)")
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
