#!/usr/bin/env python3
"""kgpu-dra-plugin against the real kube-apiserver and kube-scheduler (v1.37.2).

No stand-in on the API side: etcd, kube-apiserver and kube-scheduler are the
upstream binaries scripts/upstream.sh built (tests/e2e/cluster.py starts
them). deploy/dra is applied with the real kubectl, the driver runs as its
ServiceAccount (a TokenRequest token, so its RBAC is what is tested), its
ResourceSlice must pass the real validation, and kube-scheduler's DRA
plugin allocates the claims of examples/dra/ against the slice's consumable
capacity. kubelet is still the grpcio stand-in (dra_standins.DraKubelet): it
prepares the claims kube-scheduler allocated, and the CDI specs must carry
what was allocated. No container runs: that needs a node with a CDI-capable
runtime (the e2e suite's part).

    test_dra_upstream.py --plugin PATH --source DIR [--protoc PATH] [--bin DIR]

77 = skipped (upstream binaries not built, or no grpc module or protoc).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import Child, run_tests, wait_for  # noqa: E402

ARGS = None
PB = None
NODE = "dra-node-1"
NS = "dra-demo"
DRIVER = "gpu.kgpu.io"

# Four A100s, two per NUMA node, and two T4s: every example fits whatever
# order kube-scheduler takes them in.
GPUS = """gpus:
- {index: 0, uuid: GPU-a1000000, model: A100-SXM4-40GB, memory_mib: 40960, numa: 0, compute_capability: "8.0"}
- {index: 1, uuid: GPU-a1000001, model: A100-SXM4-40GB, memory_mib: 40960, numa: 0, compute_capability: "8.0"}
- {index: 2, uuid: GPU-a1000002, model: A100-SXM4-40GB, memory_mib: 40960, numa: 1, compute_capability: "8.0"}
- {index: 3, uuid: GPU-a1000003, model: A100-SXM4-40GB, memory_mib: 40960, numa: 1, compute_capability: "8.0"}
- {index: 4, uuid: GPU-7400004, model: Tesla-T4, memory_mib: 15360, numa: 1}
- {index: 5, uuid: GPU-7400005, model: Tesla-T4, memory_mib: 15360, numa: 1}
"""


def quantity_bytes(q):
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    for s, m in units.items():
        if q.endswith(s):
            return int(q[:-len(s)]) * m
    return int(q)


class DraUpstreamTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import cluster  # tests/e2e/cluster.py: the control plane on loopback
        cls.tmp = tempfile.mkdtemp(prefix="kgpu-dra-up-")
        cls.cp = cluster.ControlPlane(os.path.join(cls.tmp, "cp"), ARGS.bin,
                                      log=lambda m: print(m, file=sys.stderr)).start()
        cls.cluster = cluster

    @classmethod
    def tearDownClass(cls):
        cls.cp.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_examples_allocated_by_kube_scheduler_and_prepared(self):
        cp, cluster = self.cp, self.cluster
        # The manifests as shipped, through the real API server's validation.
        cp.kubectl("apply", "-k", os.path.join(ARGS.source, "deploy", "dra"))
        cls = cp.admin.get("/apis/resource.k8s.io/v1/deviceclasses/" + DRIVER)
        # Whole GPUs and shares only; MIG partitions are mig.gpu.kgpu.io's. Both selectors
        # passed the real server's CEL compilation.
        self.assertEqual(cls["spec"]["selectors"][0]["cel"]["expression"],
                         'device.driver == "gpu.kgpu.io" && '
                         '!("mig" in device.attributes["gpu.kgpu.io"])')
        mig = cp.admin.get("/apis/resource.k8s.io/v1/deviceclasses/mig." + DRIVER)
        self.assertIn('"mig" in device.attributes["gpu.kgpu.io"]',
                      mig["spec"]["selectors"][0]["cel"]["expression"])
        node = cluster.node_object(NODE, "A100-SXM4-40GB", 0, 40960)
        node["metadata"].setdefault("labels", {})["kgpu.io/gpu-allocator"] = "dra"
        cp.add_node(node)

        # The driver, with its ServiceAccount's token: its RBAC is what it gets.
        token = cp.service_account_token("kgpu-dra", "kgpu-dra-plugin")
        kc = cluster.kubeconfig(os.path.join(self.tmp, "dra.kubeconfig"), cp.server,
                                cp.pki.ca_crt, token=token)
        gpu_file = os.path.join(self.tmp, "gpus.yaml")
        with open(gpu_file, "w") as f:
            f.write(GPUS)
        shim = os.path.join(self.tmp, "libkgpu-limit.so")
        open(shim, "w").close()
        d = {k: os.path.join(self.tmp, k) for k in ("plugins", "registry", "state", "cdi")}
        driver = Child([ARGS.plugin, "--node-name", NODE, "--fake-gpus", gpu_file,
                        "--kubeconfig", kc, "--state-dir", d["state"], "--cdi-dir", d["cdi"],
                        "--plugin-dir", d["plugins"], "--registry-dir", d["registry"],
                        "--shim-lib", shim, "--resync", "2"],
                       os.path.join(self.tmp, "driver.log"))
        try:
            self.run_with_driver(driver, d)
        finally:
            driver.stop()
            report = driver.sanitizer_report()
            self.assertIsNone(report, report)

    def run_with_driver(self, driver, d):
        cp = self.cp

        def slice_accepted():
            if not driver.alive():
                raise AssertionError("driver exited:\n" + driver.log_tail())
            return cp.admin.try_get("/apis/resource.k8s.io/v1/resourceslices/%s-%s"
                                    % (NODE, DRIVER))
        s = wait_for(slice_accepted, 60, what="the ResourceSlice accepted by kube-apiserver")
        self.assertEqual(len(s["spec"]["devices"]), 6)
        node = cp.admin.get("/api/v1/nodes/" + NODE)
        self.assertEqual(s["metadata"]["ownerReferences"][0]["uid"], node["metadata"]["uid"])
        dev0 = s["spec"]["devices"][0]
        # The server kept consumable capacity and its policy (the feature is on).
        self.assertTrue(dev0.get("allowMultipleAllocations"), dev0)
        self.assertIn("requestPolicy", dev0["capacity"]["memory"], dev0)
        self.assertNotIn("HTTP 403", driver.log())  # the ClusterRole is enough
        # Resyncs leave an unchanged slice alone.
        rv = s["metadata"]["resourceVersion"]
        time.sleep(5)
        self.assertEqual(slice_accepted()["metadata"]["resourceVersion"], rv)

        cp.ensure_namespace(NS)
        cp.start_scheduler(self.cluster.PLAIN_SCHEDULER_CONFIG)
        examples = os.path.join(ARGS.source, "examples", "dra")
        names = ["a100-8gib", "gpu-30pct", "two-gpus-one-numa"]
        for n in names:
            cp.kubectl("-n", NS, "apply", "-f", os.path.join(examples, n + ".yaml"))
        # A second 8 GiB claim, to see two claims share one GPU when they must: the
        # A100s are taken apart by the whole pair otherwise.
        with open(os.path.join(examples, "a100-8gib.yaml")) as f:
            second = f.read().replace("a100-8gib", "a100-8gib-2")
        cp.kubectl("-n", NS, "apply", "-f", "-", input=second)
        names.append("a100-8gib-2")

        def allocated():
            cp.check_alive()
            out = {}
            for n in names:
                c = cp.admin.get("/apis/resource.k8s.io/v1/namespaces/%s/resourceclaims/%s"
                                 % (NS, n))
                if not c.get("status", {}).get("allocation"):
                    return None
                out[n] = c
            return out
        try:
            claims = wait_for(allocated, 90, interval=0.5, what="kube-scheduler's allocations")
        except AssertionError:
            pods = {n: (cp.get_pod(NS, n) or {}).get("status") for n in names}
            raise AssertionError("not allocated; pods: %s\nscheduler:\n%s" % (
                json.dumps(pods)[:3000], cp.scheduler.log()[-3000:]))
        for n in names:
            wait_for(lambda: (cp.get_pod(NS, n) or {}).get("spec", {}).get("nodeName") == NODE,
                     30, what="pod %s bound" % n)

        uuid_of = {x["name"]: x["attributes"]["uuid"]["string"] for x in s["spec"]["devices"]}
        numa_of = {x["name"]: x["attributes"]["numaNode"]["int"] for x in s["spec"]["devices"]}
        model_of = {x["name"]: x["attributes"]["model"]["string"] for x in s["spec"]["devices"]}
        res = {n: c["status"]["allocation"]["devices"]["results"] for n, c in claims.items()}
        for n in ("a100-8gib", "a100-8gib-2"):
            self.assertEqual(len(res[n]), 1)
            r = res[n][0]
            self.assertTrue(model_of[r["device"]].startswith("A100"), r)
            self.assertEqual(quantity_bytes(r["consumedCapacity"]["memory"]), 8 << 30, r)
            self.assertEqual(quantity_bytes(r["consumedCapacity"]["cores"]), 0, r)
            self.assertTrue(r.get("shareID"), r)
        r30 = res["gpu-30pct"][0]
        self.assertEqual(r30["consumedCapacity"]["cores"], "30")
        self.assertEqual(quantity_bytes(r30["consumedCapacity"]["memory"]), 4 << 30)
        pair = res["two-gpus-one-numa"]
        self.assertEqual(len(pair), 2)
        self.assertEqual(numa_of[pair[0]["device"]], numa_of[pair[1]["device"]])
        # Whole devices: their default memory, all of it.
        for r in pair:
            self.assertEqual(quantity_bytes(r["consumedCapacity"]["memory"]),
                             quantity_bytes(next(x for x in s["spec"]["devices"]
                                                 if x["name"] == r["device"])
                                            ["capacity"]["memory"]["value"]))
        # Nothing over a device's capacity, whoever shares it.
        used = {}
        for rs in res.values():
            for r in rs:
                u = used.setdefault(r["device"], [0, 0])
                u[0] += quantity_bytes(r["consumedCapacity"]["memory"])
                u[1] += int(r["consumedCapacity"]["cores"])
        for dev, (mem, cores) in used.items():
            cap = next(x for x in s["spec"]["devices"] if x["name"] == dev)["capacity"]
            self.assertLessEqual(mem, quantity_bytes(cap["memory"]["value"]), dev)
            self.assertLessEqual(cores, 100, dev)

        # kubelet's part: register, prepare what kube-scheduler allocated.
        from dra_standins import DraKubelet
        kubelet = DraKubelet(PB)
        reg = os.path.join(d["registry"], DRIVER + "-reg.sock")
        info, service = kubelet.register(reg)
        self.assertEqual(service, "v1.DRAPlugin")
        refs = [(NS, c["metadata"]["uid"], n) for n, c in claims.items()]
        got = kubelet.prepare(info.endpoint, service, refs)
        for ns, uid, n in refs:
            self.assertEqual(got[uid].error, "", (n, got[uid].error))
            with open(os.path.join(d["cdi"], "kgpu.io-gpu_%s.json" % uid)) as f:
                spec = json.load(f)
            self.assertEqual([list(x.cdi_device_ids) for x in got[uid].devices][0],
                             ["kgpu.io/gpu=%s-%s" % (uid, spec["devices"][0]["name"]
                                                     .split(uid + "-")[1])])
            env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
            self.assertEqual(env["NVIDIA_VISIBLE_DEVICES"],
                             ",".join(uuid_of[r["device"]] for r in res[n]))
            for r in res[n]:
                share = [x.share_id for x in got[uid].devices if x.device_name == r["device"]]
                self.assertEqual(share, [r.get("shareID", "")])
        with open(os.path.join(d["cdi"], "kgpu.io-gpu_%s.json"
                               % claims["gpu-30pct"]["metadata"]["uid"])) as f:
            env30 = dict(e.split("=", 1) for e in json.load(f)["devices"][0]["containerEdits"]
                         ["env"])
        self.assertEqual((env30["KGPU_CORE_LIMIT_PCT"], env30["KGPU_MEMORY_LIMIT_MIB"]),
                         ("30", "4096"))
        got = kubelet.unprepare(info.endpoint, service, refs)
        self.assertEqual({k: v.error for k, v in got.items()}, {r[1]: "" for r in refs})
        self.assertEqual(os.listdir(d["cdi"]), [])

        # A device plugin starts serving the node's GPUs: the driver withdraws its devices
        # (a slice without devices, which the real server accepts), and publishes them
        # again once the plugin's resources are zero.
        status_path = "/api/v1/nodes/%s/status" % NODE
        cp.admin.merge_patch(status_path, {"status": {"allocatable": {"kgpu.io/gpu-mem": "40"}}})
        wait_for(lambda: not (slice_accepted()["spec"].get("devices")), 30,
                 what="no devices while a device plugin serves the node")
        cp.admin.merge_patch(status_path, {"status": {"allocatable": {"kgpu.io/gpu-mem": "0"}}})
        wait_for(lambda: len(slice_accepted()["spec"].get("devices") or []) == 6, 30,
                 what="the devices back")


def main():
    global ARGS, PB
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugin", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--protoc", default="protoc")
    ap.add_argument("--bin", help="upstream binaries (default: scripts/upstream.sh --bin)")
    ARGS, rest = ap.parse_known_args()
    if ARGS.bin is None:
        ARGS.bin = subprocess.run(["bash", os.path.join(ARGS.source, "scripts", "upstream.sh"),
                                   "--bin"], capture_output=True, text=True).stdout.strip()
    need = ["etcd", "kube-apiserver", "kube-scheduler", "kubectl"]
    if not ARGS.bin or not all(os.path.exists(os.path.join(ARGS.bin, b)) for b in need):
        print("skipped: upstream binaries not built (scripts/upstream.sh)")
        return 77
    try:
        import grpc  # noqa: F401
        from dra_standins import load_protos
    except ImportError as e:
        print("skipped: %s" % e)
        return 77
    if not ARGS.protoc or not shutil.which(ARGS.protoc):
        print("skipped: protoc not found")
        return 77
    sys.path.insert(0, os.path.join(ARGS.source, "tests", "e2e"))
    PB = load_protos(ARGS.source, ARGS.protoc)
    return run_tests(sys.argv[0], rest)


if __name__ == "__main__":
    sys.exit(main())
