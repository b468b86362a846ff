#!/usr/bin/env python3
"""Black-box tests of kgpu-dra-plugin: the real binary against kubelet's and the
API server's stand-ins (dra_standins.py).

kubelet registers the driver through its registration socket, calls
NodePrepareResources / NodeUnprepareResources over the DRA socket on v1 and
v1beta1, and the driver is restarted (cleanly and killed) between the calls.
The API stand-in serves ResourceClaims allocated as kube-scheduler writes
them (status.allocation.devices.results with consumedCapacity and shareID
for shared devices) and validates the ResourceSlices the driver publishes.

    test_dra_plugin.py --plugin PATH --source DIR [--protoc PATH] [--fake-nvml-dir DIR]
                       [unittest args]

With the fake NVML (--fake-nvml-dir), the MIG cases run the driver on NVML with
an A100-40GB in MIG mode whose instances live in FAKE_NVML_MIG_STATE, a file
that outlives the driver as the GPU's instances do, and whose deletion is a
node reboot.

77 = skipped (no grpc module or protoc).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Child, run_tests, wait_for  # noqa: E402

try:
    import grpc
    from dra_standins import (ApiStandin, DraKubelet, load_protos, validate_pool,
                              validate_slice)
except ImportError as e:  # no grpcio
    print("skipped: %s" % e)
    sys.exit(77)

ARGS = None
PB = None
CDI_CHECK = None  # cdi_check/'s binary, when it could be built
HERE = os.path.dirname(os.path.abspath(__file__))
NODE = "gpu-node-1"
DRIVER = "gpu.kgpu.io"
GiB = 1024 ** 3

GPUS = """gpus:
- {index: 0, uuid: GPU-aaaa0000, model: A100-SXM4-40GB, memory_mib: 40960, numa: 0,
   compute_capability: "8.0"}
- {index: 1, uuid: GPU-aaaa0001, model: A100-SXM4-40GB, memory_mib: 40960, numa: 0}
- {index: 2, uuid: GPU-bbbb0002, model: T4, memory_mib: 15360, numa: 1}
"""


def result(device, request="gpu", driver=DRIVER, pool=NODE, consumed=None, share=None):
    r = {"request": request, "driver": driver, "pool": pool, "device": device}
    if consumed is not None:
        r["consumedCapacity"] = consumed
    if share is not None:
        r["shareID"] = share
    return r


def claim(name, results, ns="team-a", allocated=True):
    """A ResourceClaim as kube-scheduler leaves it once allocated."""
    c = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": name, "namespace": ns, "uid": str(uuid.uuid4())},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
             "deviceClassName": DRIVER}}]}},
         "status": {}}
    if allocated:
        c["status"]["allocation"] = {"devices": {"results": results}}
    return c


class DraHarness(unittest.TestCase):
    """The driver, kubelet's and the API server's stand-ins, and a state folder."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kgpu-dra-")
        self.api = ApiStandin()
        self.node = self.api.add_node(NODE)
        self.kubelet = DraKubelet(PB)
        self.gpu_file = os.path.join(self.tmp, "gpus.yaml")
        with open(self.gpu_file, "w") as f:
            f.write(GPUS)
        self.plugins = os.path.join(self.tmp, "plugins")
        self.registry = os.path.join(self.tmp, "plugins_registry")
        self.state = os.path.join(self.tmp, "state")
        self.cdi = os.path.join(self.tmp, "cdi")
        self.shim = os.path.join(self.tmp, "libkgpu-limit.so")
        open(self.shim, "w").close()
        self.reg_sock = os.path.join(self.registry, DRIVER + "-reg.sock")
        self.dra_sock = os.path.join(self.plugins, DRIVER, "dra.sock")
        self.child = None
        self.runs = 0

    def tearDown(self):
        if self.child is not None:
            self.stop()
        self.api.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start(self, extra=(), env=None):
        """The driver on the --fake-gpus file, or with env (the fake NVML's) on NVML."""
        self.runs += 1
        log = os.path.join(self.tmp, "driver-%d.log" % self.runs)
        gpus = ["--fake-gpus", self.gpu_file] if env is None else \
            ["--nvml-lib", os.path.join(ARGS.fake_nvml_dir, "full", "libnvidia-ml.so.1")]
        argv = [ARGS.plugin, "--node-name", NODE] + gpus + [
                "--kubeconfig", self.api.kubeconfig(os.path.join(self.tmp, "kubeconfig")),
                "--state-dir", self.state, "--cdi-dir", self.cdi, "--plugin-dir", self.plugins,
                "--registry-dir", self.registry, "--shim-lib", self.shim, "--resync", "1",
                "--log-level", "debug"] + list(extra)
        self.child = Child(argv, log, env=env)
        # Not the socket's existence: a killed driver leaves its sockets behind.
        wait_for(lambda: "kgpu-dra-plugin " in self.child.log() or self.died(), 30,
                 what="the driver serving")
        self.assertTrue(self.child.alive(), self.child.log_tail())

    def died(self):
        if not self.child.alive():
            raise AssertionError("driver exited:\n" + self.child.log_tail())
        return False

    def stop(self, sig=signal.SIGTERM):
        rc = self.child.stop(sig)
        report = self.child.sanitizer_report()
        self.assertIsNone(report, report)
        if sig == signal.SIGTERM:
            self.assertEqual(rc, 0, self.child.log_tail())
        self.child = None

    def slice(self):
        slices = [s for s in self.api.slice_list() if s["spec"]["nodeName"] == NODE]
        return slices[0] if len(slices) == 1 else None

    def register(self):
        info, chosen = self.kubelet.register(self.reg_sock)
        return info, chosen

    def cdi_spec(self, uid):
        with open(os.path.join(self.cdi, "kgpu.io-gpu_%s.json" % uid)) as f:
            return json.load(f)


class DraPluginTest(DraHarness):
    # Registration.

    def test_registration_as_kubelet_v1_37(self):
        self.start()
        info, chosen = self.register()
        self.assertEqual(info.type, "DRAPlugin")
        self.assertEqual(info.name, DRIVER)
        self.assertEqual(info.endpoint, self.dra_sock)
        self.assertTrue(os.path.isabs(info.endpoint))
        self.assertEqual(list(info.supported_versions), ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
        self.assertEqual(chosen, "v1.DRAPlugin")
        # The optional health service is not advertised, and not served.
        self.assertFalse(any("Health" in v for v in info.supported_versions))
        with self.assertRaises(grpc.RpcError) as ctx:
            self.kubelet.raw(self.dra_sock,
                             "/k8s.io.kubelet.pkg.apis.dra_health.v1.DRAResourceHealth/"
                             "NodeWatchResources", b"")
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        wait_for(lambda: "kubelet registered gpu.kgpu.io" in self.child.log(), 10,
                 what="the registration status in the log")
        # kubelet's plugin folder emptied: the registration socket comes back.
        os.unlink(self.reg_sock)
        wait_for(lambda: os.path.exists(self.reg_sock), 10, what="the socket served again")
        self.assertEqual(self.register()[1], "v1.DRAPlugin")

    # The ResourceSlice.

    def test_slice_published_valid_and_idempotent(self):
        self.start()
        s = wait_for(self.slice, 20, what="the ResourceSlice")
        self.assertEqual(validate_slice(s), [])
        self.assertEqual(s["metadata"]["name"], NODE + "-" + DRIVER)
        self.assertEqual(s["spec"]["driver"], DRIVER)
        self.assertEqual(s["spec"]["pool"], {"name": NODE, "generation": 1,
                                             "resourceSliceCount": 1})
        owner = s["metadata"]["ownerReferences"][0]
        self.assertEqual((owner["kind"], owner["name"], owner["uid"]),
                         ("Node", NODE, self.node["metadata"]["uid"]))
        devs = {d["name"]: d for d in s["spec"]["devices"]}
        self.assertEqual(sorted(devs), ["gpu-0", "gpu-1", "gpu-2"])
        g0 = devs["gpu-0"]
        self.assertTrue(g0["allowMultipleAllocations"])
        self.assertEqual(g0["attributes"]["uuid"], {"string": "GPU-aaaa0000"})
        self.assertEqual(g0["attributes"]["productName"], {"string": "A100-SXM4-40GB"})
        self.assertEqual(g0["attributes"]["numaNode"], {"int": 0})
        self.assertEqual(g0["attributes"]["index"], {"int": 0})
        self.assertEqual(g0["attributes"]["memoryMiB"], {"int": 40960})
        self.assertEqual(g0["attributes"]["computeCapability"], {"version": "8.0.0"})
        self.assertNotIn("computeCapability", devs["gpu-1"]["attributes"])
        self.assertEqual(g0["capacity"]["memory"]["value"], "40Gi")
        self.assertEqual(g0["capacity"]["memory"]["requestPolicy"],
                         {"default": "40Gi", "validRange": {"min": "1Mi", "step": "1Mi"}})
        self.assertEqual(g0["capacity"]["cores"],
                         {"value": "100", "requestPolicy": {"default": "0", "validRange": {
                             "min": "0", "max": "100", "step": "1"}}})
        self.assertEqual(devs["gpu-2"]["capacity"]["memory"]["value"], "15Gi")
        # Resyncs (every second here) and a restart change nothing.
        posts, puts = self.api.writes("POST"), self.api.writes("PUT")
        time.sleep(2.5)
        self.stop()
        self.start()
        time.sleep(2.5)
        self.assertEqual((self.api.writes("POST"), self.api.writes("PUT")), (posts, puts))
        self.assertEqual(self.slice()["metadata"]["resourceVersion"],
                         s["metadata"]["resourceVersion"])
        # A GPU turns unhealthy: it stays, tainted NoSchedule, in the pool's next generation.
        with open(self.gpu_file, "w") as f:
            f.write(GPUS.replace("memory_mib: 15360, numa: 1",
                                 "memory_mib: 15360, numa: 1, healthy: false"))
        s2 = wait_for(lambda: (self.slice() or {}).get("spec", {}).get("pool", {})
                      .get("generation") == 2 and self.slice(), 20, what="generation 2")
        self.assertEqual([(d["name"], d.get("taints")) for d in s2["spec"]["devices"]],
                         [("gpu-0", None), ("gpu-1", None),
                          ("gpu-2", [{"key": "gpu.kgpu.io/unhealthy", "effect": "NoSchedule"}])])
        self.assertEqual(validate_slice(s2), [])
        # The server stamps the taint's time; that is no change to write again.
        puts = self.api.writes("PUT")
        with self.api.lock:
            for t in self.api.slices[NODE + "-" + DRIVER]["spec"]["devices"][2]["taints"]:
                t["timeAdded"] = "2026-11-29T04:00:00Z"
        time.sleep(2.5)
        self.assertEqual(self.api.writes("PUT"), puts)
        # Someone deletes the slice: the next resync makes it again.
        self.api.serve("DELETE", "/apis/resource.k8s.io/v1/resourceslices/" + NODE + "-" + DRIVER,
                       None)
        wait_for(self.slice, 20, what="the slice made again")
        # The Node deleted and made again under its name: the owner follows its new UID
        # (an owner reference to the old one would have the slice garbage-collected).
        with self.api.lock:
            self.api.nodes[NODE] = self.api._stamp({"apiVersion": "v1", "kind": "Node",
                                                    "metadata": {"name": NODE}})
            new_uid = self.api.nodes[NODE]["metadata"]["uid"]
        wait_for(lambda: ((self.slice() or {}).get("metadata", {})
                          .get("ownerReferences") or [{}])[0].get("uid") == new_uid, 20,
                 what="the owner reference to the new Node")

    def test_no_devices_while_device_plugins_serve_the_node(self):
        """One owner per node: with device plugins' GPU resources allocatable there, the
        slice carries no device, so kube-scheduler never allocates a GPU twice."""
        with self.api.lock:
            self.node["status"] = {"allocatable": {"cpu": "64", "kgpu.io/gpu-mem": "120",
                                                   "nvidia.com/gpu": "0"}}
        self.start()
        s = wait_for(self.slice, 20, what="the ResourceSlice")
        self.assertEqual(s["spec"].get("devices", []), [])
        self.assertEqual(validate_slice(s), [])
        wait_for(lambda: "also serves GPUs through device plugins (allocatable "
                 "kgpu.io/gpu-mem=120)" in self.child.log(), 10, what="the conflict logged")
        # kubelet zeroes a stopped plugin's resources: the GPUs come back at the next resync.
        with self.api.lock:
            self.node["status"]["allocatable"]["kgpu.io/gpu-mem"] = "0"
        s = wait_for(lambda: len((self.slice() or {}).get("spec", {}).get("devices", [])) == 3
                     and self.slice(), 20, what="the GPUs published")
        self.assertEqual(s["spec"]["pool"]["generation"], 2)

    def test_stray_slices_of_this_node_deleted(self):
        stray = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                 "metadata": {"name": "old-" + NODE},
                 "spec": {"driver": DRIVER, "nodeName": NODE,
                          "pool": {"name": NODE, "generation": 0, "resourceSliceCount": 1}}}
        other = json.loads(json.dumps(stray))
        other["metadata"]["name"] = "other-node-slice"
        other["spec"]["nodeName"] = other["spec"]["pool"]["name"] = "gpu-node-2"
        for s in (stray, other):
            self.api.serve("POST", "/apis/resource.k8s.io/v1/resourceslices", s)
        self.start()
        wait_for(lambda: sorted(x["metadata"]["name"] for x in self.api.slice_list()) ==
                 sorted(["other-node-slice", NODE + "-" + DRIVER]), 20,
                 what="the stray slice gone, the other node's kept")

    # Prepare and unprepare.

    def expect_contract(self, spec, uid, request, uuids, memory_mib, core_pct):
        """The CDI device carries the device plugin's Allocate contract."""
        self.assertEqual(spec["cdiVersion"], "0.5.0")
        self.assertEqual(spec["kind"], "kgpu.io/gpu")
        dev = {d["name"]: d for d in spec["devices"]}["%s-%s" % (uid, request)]
        env = dict(e.split("=", 1) for e in dev["containerEdits"]["env"])
        self.assertEqual(env["NVIDIA_VISIBLE_DEVICES"], ",".join(uuids))
        self.assertEqual(env["KGPU_MEMORY_LIMIT_MIB"], str(memory_mib))
        self.assertEqual(env["KGPU_CORE_LIMIT_PCT"], str(core_pct))
        self.assertEqual(env["KGPU_SHARED_DIR"], "/var/run/kgpu")
        self.assertEqual(env["KGPU_CONTAINER"], request)
        mounts = {m["containerPath"]: m for m in dev["containerEdits"]["mounts"]}
        limits = mounts["/etc/kgpu/limits"]
        self.assertIn("ro", limits["options"])
        self.assertEqual(limits["hostPath"],
                         os.path.join(self.state, "pods", uid, request + ".limits"))
        with open(limits["hostPath"]) as f:
            text = f.read()
        self.assertTrue(text.startswith("# kgpu limits v1\n"), text)
        for i, u in enumerate(uuids):
            self.assertIn("device %d uuid=%s memory_mib=%d core_pct=%d" % (i, u, memory_mib,
                                                                           core_pct), text)
        self.assertEqual(mounts["/var/run/kgpu"]["hostPath"],
                         os.path.join(self.state, "pods", uid, "shared"))
        self.assertIn("rw", mounts["/var/run/kgpu"]["options"])
        self.assertEqual(mounts["/usr/lib/kgpu/libkgpu-limit.so"]["hostPath"], self.shim)
        preload = mounts["/etc/ld.so.preload"]["hostPath"]
        with open(preload) as f:
            self.assertEqual(f.read(), "/usr/lib/kgpu/libkgpu-limit.so\n")
        scheds = [p for p in mounts if p.startswith("/var/run/kgpu-gpu/")]
        self.assertEqual(scheds, ["/var/run/kgpu-gpu/%s.sched" % u for u in uuids]
                         if core_pct < 100 else [])
        for p in scheds:
            self.assertTrue(os.path.exists(mounts[p]["hostPath"]))

    def test_prepare_unprepare_both_versions_across_restarts(self):
        share_a, share_b = str(uuid.uuid4()), str(uuid.uuid4())
        mem8 = self.api.put_claim(claim("mem8", [result(
            "gpu-0", consumed={"memory": "8Gi", "cores": "0"}, share=share_a)]))
        core30 = self.api.put_claim(claim("core30", [result(
            "gpu-0", consumed={"memory": "4Gi", "cores": "30"}, share=share_b)]))
        whole2 = self.api.put_claim(claim("whole2", [
            result("gpu-0", request="pair"), result("gpu-1", request="pair")]))
        refs = [(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"])
                for c in (mem8, core30, whole2)]
        self.start()
        _, service = self.register()
        answers = self.kubelet.prepare(self.dra_sock, service, refs)
        self.assertEqual(sorted(answers), sorted(r[1] for r in refs))
        for ref in refs:
            self.assertEqual(answers[ref[1]].error, "", answers[ref[1]].error)
        a = answers[refs[0][1]]
        self.assertEqual(len(a.devices), 1)
        d = a.devices[0]
        self.assertEqual((list(d.request_names), d.pool_name, d.device_name),
                         (["gpu"], NODE, "gpu-0"))
        self.assertEqual(list(d.cdi_device_ids), ["kgpu.io/gpu=%s-gpu" % refs[0][1]])
        self.assertEqual(d.share_id, share_a)
        self.expect_contract(self.cdi_spec(refs[0][1]), refs[0][1], "gpu", ["GPU-aaaa0000"],
                             8192, 100)
        self.expect_contract(self.cdi_spec(refs[1][1]), refs[1][1], "gpu", ["GPU-aaaa0000"],
                             4096, 30)
        w = answers[refs[2][1]]
        self.assertEqual([x.device_name for x in w.devices], ["gpu-0", "gpu-1"])
        # One CDI device per request, named once: kubelet would pass a repeated ID twice.
        self.assertEqual([list(x.cdi_device_ids) for x in w.devices],
                         [["kgpu.io/gpu=%s-pair" % refs[2][1]], []])
        self.assertEqual([x.share_id for x in w.devices], ["", ""])
        self.expect_contract(self.cdi_spec(refs[2][1]), refs[2][1], "pair",
                             ["GPU-aaaa0000", "GPU-aaaa0001"], 40960, 100)

        # kubelet retries: the same answer, no new read of the claim.
        reads = sum(1 for m, p in self.api.requests if "resourceclaims" in p)
        again = self.kubelet.prepare(self.dra_sock, service, refs[:1])
        self.assertEqual(again[refs[0][1]], a)
        self.assertEqual(sum(1 for m, p in self.api.requests if "resourceclaims" in p), reads)

        # Restart; the CDI folder is emptied as a reboot empties /var/run. The claim
        # is deleted from the API server: the checkpoint still answers.
        self.stop()
        shutil.rmtree(self.cdi)
        self.api.delete_claim("team-a", "mem8")
        self.start()
        self.assertTrue(os.path.exists(os.path.join(self.cdi, "kgpu.io-gpu_%s.json"
                                                    % refs[0][1])))
        _, service = self.register()
        again = self.kubelet.prepare(self.dra_sock, "v1beta1.DRAPlugin", refs[:1])
        self.assertEqual(again[refs[0][1]].error, "")
        # v1beta1 has no share IDs; the rest is the same.
        self.assertEqual([(list(x.request_names), x.device_name, list(x.cdi_device_ids))
                          for x in again[refs[0][1]].devices],
                         [(["gpu"], "gpu-0", ["kgpu.io/gpu=%s-gpu" % refs[0][1]])])

        # Unprepare on v1beta1 and v1, killed in between; then again (kubelet retries).
        got = self.kubelet.unprepare(self.dra_sock, "v1beta1.DRAPlugin", refs[:1])
        self.assertEqual(got[refs[0][1]].error, "")
        self.assertFalse(os.path.exists(os.path.join(self.cdi, "kgpu.io-gpu_%s.json"
                                                     % refs[0][1])))
        self.assertFalse(os.path.exists(os.path.join(self.state, "pods", refs[0][1])))
        self.stop(signal.SIGKILL)
        self.start()
        got = self.kubelet.unprepare(self.dra_sock, "v1.DRAPlugin", refs)
        self.assertEqual({k: v.error for k, v in got.items()}, {r[1]: "" for r in refs})
        self.assertEqual(sorted(os.listdir(self.cdi)), [])
        self.assertEqual(sorted(os.listdir(os.path.join(self.state, "pods"))), [])
        with open(os.path.join(self.state, "checkpoint.json")) as f:
            self.assertEqual(json.load(f), {"version": 1, "claims": []})
        # The deleted claim is now unknown: prepare fails for it, by name.
        got = self.kubelet.prepare(self.dra_sock, "v1.DRAPlugin", refs[:1])
        self.assertIn("no ResourceClaim team-a/mem8", got[refs[0][1]].error)

    def test_cdi_specs_read_by_the_runtimes_library(self):
        """containerd's own CDI library loads the specs and injects exactly their edits."""
        if CDI_CHECK is None:
            self.skipTest("cdi_check not built (needs Go and the CDI module in the cache)")
        shared = self.api.put_claim(claim("shared", [result(
            "gpu-1", consumed={"memory": "2Gi", "cores": "25"}, share=str(uuid.uuid4()))]))
        pair = self.api.put_claim(claim("pair", [result("gpu-0", request="pair"),
                                                 result("gpu-1", request="pair")]))
        refs = [("team-a", c["metadata"]["uid"], c["metadata"]["name"]) for c in (shared, pair)]
        self.start()
        got = self.kubelet.prepare(self.dra_sock, "v1.DRAPlugin", refs)
        ids = [i for r in refs for d in got[r[1]].devices for i in d.cdi_device_ids]
        self.assertEqual(len(ids), 2)
        for cdi_id, ref in zip(ids, refs):
            r = subprocess.run([CDI_CHECK, self.cdi, cdi_id], capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            out = json.loads(r.stdout)
            self.assertEqual(out["errors"], [])
            self.assertEqual(out["unknown"], [])
            self.assertTrue(out["injected"])
            dev = self.cdi_spec(ref[1])["devices"][0]["containerEdits"]
            self.assertEqual(sorted(out["env"]), sorted(dev["env"]))
            # The library orders mounts by their container paths; the set is the spec's.
            self.assertEqual(sorted((m["source"], m["destination"], m.get("type"), m["options"])
                                    for m in out["mounts"]),
                             sorted((m["hostPath"], m["containerPath"], m["type"], m["options"])
                                    for m in dev["mounts"]))
        # Both claims in one container: the library takes both, later env wins. kgpu
        # asks for one kgpu claim per container (docs/install-dra.md).
        r = subprocess.run([CDI_CHECK, self.cdi] + ids, capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(json.loads(r.stdout)["errors"], [])

    def test_mps_mode_as_the_device_plugin(self):
        """--sharing mps: the device plugin's MPS contract, and no start without the daemon."""
        pipes = os.path.join(self.tmp, "mps")
        os.makedirs(pipes)
        log = os.path.join(self.tmp, "no-daemon.log")
        child = Child([ARGS.plugin, "--node-name", NODE, "--fake-gpus", self.gpu_file,
                       "--kubeconfig", self.api.kubeconfig(os.path.join(self.tmp, "kc")),
                       "--state-dir", self.state, "--cdi-dir", self.cdi, "--plugin-dir",
                       self.plugins, "--registry-dir", self.registry, "--sharing", "mps",
                       "--mps-pipe-dir", pipes], log)
        self.assertEqual(child.wait_exit(30), 1)
        self.assertIn("no MPS control daemon serves this node", child.log())
        os.mkfifo(os.path.join(pipes, "control"))
        c = self.api.put_claim(claim("mps30", [result("gpu-2", consumed={
            "memory": "3Gi", "cores": "30"}, share=str(uuid.uuid4()))]))
        uid = c["metadata"]["uid"]
        self.start(["--sharing", "mps", "--mps-pipe-dir", pipes])
        got = self.kubelet.prepare(self.dra_sock, "v1.DRAPlugin", [("team-a", uid, "mps30")])
        self.assertEqual(got[uid].error, "")
        dev = self.cdi_spec(uid)["devices"][0]["containerEdits"]
        env = dict(e.split("=", 1) for e in dev["env"])
        self.assertEqual(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "30")
        self.assertEqual(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=3072M")
        self.assertEqual(env["CUDA_MPS_PIPE_DIRECTORY"], "/tmp/nvidia-mps")
        mounts = {m["containerPath"]: m["hostPath"] for m in dev["mounts"]}
        self.assertEqual(mounts["/tmp/nvidia-mps"], pipes)
        self.assertFalse([p for p in mounts if p.startswith("/var/run/kgpu-gpu/")])

    def test_bad_claims_fail_alone_with_reasons(self):
        good = self.api.put_claim(claim("good", [result("gpu-2", consumed={
            "memory": "1Gi", "cores": "10"}, share=str(uuid.uuid4()))]))
        cases = {
            "unknown-device": ([result("gpu-7")], "device gpu-7, which node gpu-node-1 does not"),
            "other-pool": ([result("gpu-0", pool="gpu-node-2")], "not of this node's pool"),
            "too-much-memory": ([result("gpu-2", consumed={"memory": "16Gi"})],
                                "outside 1 MiB .. the GPU's 15360 MiB"),
            "too-many-cores": ([result("gpu-0", consumed={"memory": "1Gi", "cores": "150"})],
                               "exceed the GPU's 100"),
            "bad-quantity": ([result("gpu-0", consumed={"memory": "lots"})], "memory:"),
            "other-driver": ([result("gpu-0", driver="gpu.nvidia.com")],
                             "has no device of gpu.kgpu.io"),
            "no-driver": ([{"request": "gpu", "pool": NODE, "device": "gpu-0"}],
                          "has no driver"),
            "results-not-list": ({"oops": 1}, "is not a list"),
        }
        refs = [(good["metadata"]["namespace"], good["metadata"]["uid"], "good")]
        want = {}
        for name, (results, reason) in cases.items():
            c = claim(name, results)
            if not isinstance(results, list):
                c["status"]["allocation"]["devices"]["results"] = results
            c = self.api.put_claim(c)
            refs.append(("team-a", c["metadata"]["uid"], name))
            want[c["metadata"]["uid"]] = reason
        pending = self.api.put_claim(claim("pending", [], allocated=False))
        refs.append(("team-a", pending["metadata"]["uid"], "pending"))
        want[pending["metadata"]["uid"]] = "is not allocated"
        stale = self.api.put_claim(claim("recreated", [result("gpu-0")]))
        refs.append(("team-a", str(uuid.uuid4()), "recreated"))
        want[refs[-1][1]] = "it was deleted and made again"
        refs.append(("team-a", str(uuid.uuid4()), "gone"))
        want[refs[-1][1]] = "no ResourceClaim team-a/gone"
        refs.append(("team-a", "../../etc", "evil"))
        want["../../etc"] = "is malformed"
        self.api.claim_faults[("team-a", "flaky")] = 500
        refs.append(("team-a", str(uuid.uuid4()), "flaky"))
        want[refs[-1][1]] = "HTTP 500"
        self.assertIsNotNone(stale)
        self.start()
        got = self.kubelet.prepare(self.dra_sock, "v1.DRAPlugin", refs)
        self.assertEqual(got[refs[0][1]].error, "")
        self.assertEqual(len(got[refs[0][1]].devices), 1)
        for uid, reason in want.items():
            self.assertIn(reason, got[uid].error, (uid, got[uid].error))
            self.assertEqual(len(got[uid].devices), 0)
            self.assertFalse(os.path.exists(os.path.join(self.cdi, "kgpu.io-gpu_%s.json" % uid)))
        self.assertEqual(sorted(os.listdir(self.cdi)), ["kgpu.io-gpu_%s.json" % refs[0][1]])
        # Unprepare of never-prepared or malformed claims.
        got = self.kubelet.unprepare(self.dra_sock, "v1.DRAPlugin", refs[-3:])
        self.assertIn("malformed", got["../../etc"].error)
        self.assertEqual(got[refs[-1][1]].error, "")

    def test_malformed_messages(self):
        self.start()
        for method in ("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                       "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
                       "/pluginregistration.Registration/NotifyRegistrationStatus"):
            with self.assertRaises(grpc.RpcError) as ctx:
                self.kubelet.raw(self.dra_sock, method, b"\x0a\xff\xff\xff\xff\x0f")
            self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, method)
        m = PB["dra_v1"]
        big = m.NodePrepareResourcesRequest(claims=[
            m.Claim(namespace="a", uid="u%d" % i, name="n") for i in range(300)])
        with self.assertRaises(grpc.RpcError) as ctx:
            self.kubelet.raw(self.dra_sock,
                             "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                             big.SerializeToString())
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(self.register()[1], "v1.DRAPlugin")

    def test_gpus_named_in_nvidias_cdi_spec(self):
        """--gpu-cdi-kind: each device also names its GPU in NVIDIA's CDI spec, so the
        runtime gives it where NVIDIA_VISIBLE_DEVICES from unprivileged containers is
        ignored (docs/security.md); kgpu's own device still once per request."""
        pair = self.api.put_claim(claim("pair", [result("gpu-0", request="pair"),
                                                 result("gpu-1", request="pair")]))
        ref = ("team-a", pair["metadata"]["uid"], "pair")
        self.start(["--gpu-cdi-kind", "nvidia.com/gpu"])
        got = self.kubelet.prepare(self.dra_sock, "v1.DRAPlugin", [ref])[ref[1]]
        self.assertEqual(got.error, "")
        self.assertEqual([list(x.cdi_device_ids) for x in got.devices],
                         [["kgpu.io/gpu=%s-pair" % ref[1], "nvidia.com/gpu=GPU-aaaa0000"],
                          ["nvidia.com/gpu=GPU-aaaa0001"]])
        self.stop()
        for bad in ("nvidia.com", "nvidia.com/gpu/x", "-bad/gpu", "a" * 200 + "/gpu"):
            r = subprocess.run([ARGS.plugin, "--gpu-cdi-kind", bad, "--node-name", NODE],
                               capture_output=True, text=True, timeout=30)
            self.assertNotEqual(r.returncode, 0, bad)
            self.assertIn("--gpu-cdi-kind", r.stderr + r.stdout, bad)

    def test_corrupt_checkpoint_refuses_to_start(self):
        os.makedirs(self.state)
        with open(os.path.join(self.state, "checkpoint.json"), "w") as f:
            f.write('{"version": 1, "claims": [{"uid": "../x"}]}')
        log = os.path.join(self.tmp, "corrupt.log")
        child = Child([ARGS.plugin, "--node-name", NODE, "--fake-gpus", self.gpu_file,
                       "--kubeconfig", self.api.kubeconfig(os.path.join(self.tmp, "kc")),
                       "--state-dir", self.state, "--cdi-dir", self.cdi,
                       "--plugin-dir", self.plugins, "--registry-dir", self.registry], log)
        rc = child.wait_exit(30)
        self.assertEqual(rc, 1)
        self.assertIn("checkpoint.json: claim 0", child.log())


MIG_GPUS = ("GPU-aaaa0000,NVIDIA A100-SXM4-40GB,40960,0000:3b:00.0,8.0;"
            "GPU-aaaa0001,NVIDIA A100-SXM4-40GB,40960,0000:3c:00.0,8.0")


class DraMigTest(DraHarness):
    """MIG through the fake NVML: GPU 0 in MIG mode, GPU 1 not."""

    def setUp(self):
        super().setUp()
        if not ARGS.fake_nvml_dir or not os.path.exists(
                os.path.join(ARGS.fake_nvml_dir, "full", "libnvidia-ml.so.1")):
            self.skipTest("no fake NVML (--fake-nvml-dir)")
        self.mig_state = os.path.join(self.tmp, "mig.state")
        self.env = dict(os.environ, FAKE_NVML_GPUS=MIG_GPUS, FAKE_NVML_MIG="0",
                        FAKE_NVML_MIG_STATE=self.mig_state)

    def slices(self):
        return sorted((s for s in self.api.slice_list() if s["spec"]["nodeName"] == NODE),
                      key=lambda s: s["metadata"]["name"])

    def instances(self):
        """The fake GPU's GPU instances: (GPU UUID, GI ID, NVML profile, start)."""
        try:
            with open(self.mig_state) as f:
                return sorted((w[1], int(w[2]), int(w[3]), int(w[4]))
                              for w in (line.split() for line in f) if w and w[0] == "gi")
        except FileNotFoundError:
            return []

    def checkpoint(self):
        with open(os.path.join(self.state, "checkpoint.json")) as f:
            return json.load(f)

    def mig_uuid(self, uid, device):
        for c in self.checkpoint()["claims"]:
            for d in c["devices"]:
                if c["uid"] == uid and d["device"] == device:
                    return d["mig"]["uuid"]
        return None

    def visible(self, uid):
        env = self.cdi_spec(uid)["devices"][0]["containerEdits"]["env"]
        return [e.split("=", 1)[1] for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")]

    def put(self, name, *results):
        c = self.api.put_claim(claim(name, list(results)))
        return ("team-a", c["metadata"]["uid"], name)

    def test_mig_slices_published_and_valid(self):
        self.start(env=self.env)
        got = wait_for(lambda: len(self.slices()) == 2 and self.slices(), 20,
                       what="two slices: devices and counters")
        for s in got:
            self.assertEqual(validate_slice(s), [], s["metadata"]["name"])
        self.assertEqual(validate_pool(got), [])
        devs, sets = got[0]["spec"]["devices"], got[1]["spec"]["sharedCounters"]
        self.assertEqual([x["metadata"]["name"] for x in got],
                         [NODE + "-" + DRIVER, NODE + "-" + DRIVER + "-01"])
        names = [d["name"] for d in devs]
        # gpu-0, its 18 partitions, the 1g.5gb ones from start 6 down; gpu-1 as before.
        self.assertEqual(len(names), 20)
        self.assertEqual(names[:3], ["gpu-0", "gpu-0-mig-1g-5gb-6", "gpu-0-mig-1g-5gb-5"])
        self.assertEqual(names[-1], "gpu-1")
        self.assertNotIn("consumesCounters", devs[-1])
        self.assertEqual([x["name"] for x in sets], ["gpu-0-slices"])
        three = next(d for d in devs if d["name"] == "gpu-0-mig-3g-20gb-4")
        self.assertEqual(three["attributes"]["profile"], {"string": "3g.20gb"})
        self.assertEqual(three["capacity"], {"memory": {"value": "19968Mi"}})
        self.assertEqual(sorted(three["consumesCounters"][0]["counters"]),
                         ["compute-slices", "memory-slice-4", "memory-slice-5",
                          "memory-slice-6", "memory-slice-7"])
        # Resyncs write nothing more; a restart neither.
        time.sleep(2.5)
        writes = (self.api.writes("POST"), self.api.writes("PUT"))
        self.stop()
        self.start(env=self.env)
        time.sleep(2.5)
        self.assertEqual((self.api.writes("POST"), self.api.writes("PUT")), writes)
        # With the fake inventory file no MIG is offered: back to one slice, the
        # counters' slice deleted, the pool's generation moved on.
        self.stop()
        self.start()
        wait_for(lambda: len(self.slices()) == 1, 20, what="one slice again")
        s = self.slices()[0]
        self.assertEqual(s["spec"]["pool"]["generation"], 2)
        self.assertEqual(s["spec"]["pool"]["resourceSliceCount"], 1)
        self.assertEqual(validate_pool(self.slices()), [])

    def test_mig_prepare_overlap_restart_reboot_unprepare(self):
        part = self.put("part", result("gpu-0-mig-3g-20gb-4"))
        small = self.put("small", result("gpu-0-mig-1g-5gb-6"))   # inside slices 4-7
        beside = self.put("beside", result("gpu-0-mig-1g-5gb-3"))
        whole = self.put("whole", result("gpu-0", consumed={"memory": "8Gi"},
                                         share=str(uuid.uuid4())))
        plain = self.put("plain", result("gpu-1"))
        self.start(["--gpu-cdi-kind", "nvidia.com/gpu"], env=self.env)
        _, service = self.register()
        got = self.kubelet.prepare(self.dra_sock, service, [part, beside, plain])
        self.assertEqual({k: v.error for k, v in got.items()},
                         {part[1]: "", beside[1]: "", plain[1]: ""})
        self.assertEqual([(g, p, st) for g, _, p, st in self.instances()],
                         [("GPU-aaaa0000", 2, 4), ("GPU-aaaa0000", 0, 3)])
        mig = self.mig_uuid(part[1], "gpu-0-mig-3g-20gb-4")
        self.assertTrue(mig.startswith("MIG-"), mig)
        # The container gets exactly that instance, in kgpu's spec and NVIDIA's.
        self.assertEqual(self.visible(part[1]), [mig])
        self.assertEqual(list(got[part[1]].devices[0].cdi_device_ids),
                         ["kgpu.io/gpu=%s-gpu" % part[1], "nvidia.com/gpu=" + mig])
        with open(os.path.join(self.state, "pods", part[1], "gpu.limits")) as f:
            self.assertIn("uuid=%s memory_mib=19968" % mig, f.read())
        self.assertEqual(self.visible(plain[1]), ["GPU-aaaa0001"])
        # Overlapping claims are refused, by the driver itself, and leave nothing.
        got = self.kubelet.prepare(self.dra_sock, service, [small, whole])
        self.assertIn("gpu-0-mig-1g-5gb-6 (1g.5gb on memory slices 6-6) overlaps "
                      "gpu-0-mig-3g-20gb-4", got[small[1]].error)
        self.assertIn("gpu-0 (the whole GPU) overlaps", got[whole[1]].error)
        self.assertEqual(len(self.instances()), 2)
        self.assertFalse(os.path.exists(os.path.join(self.cdi, "kgpu.io-gpu_%s.json"
                                                     % small[1])))
        # A driver restart keeps the instances as they are.
        self.stop()
        self.start(env=self.env)
        self.assertEqual(len(self.instances()), 2)
        self.assertEqual(self.mig_uuid(part[1], "gpu-0-mig-3g-20gb-4"), mig)
        # A reboot: the instances and /var/run/cdi are gone; the driver makes the
        # instances again at their placements and writes the specs with their UUIDs.
        self.stop(signal.SIGKILL)
        os.unlink(self.mig_state)
        shutil.rmtree(self.cdi)
        self.start(env=self.env)
        self.assertEqual([(g, p, st) for g, _, p, st in self.instances()],
                         [("GPU-aaaa0000", 2, 4), ("GPU-aaaa0000", 0, 3)])
        again = self.mig_uuid(part[1], "gpu-0-mig-3g-20gb-4")
        self.assertEqual(self.visible(part[1]), [again])
        _, service = self.register()
        got = self.kubelet.prepare(self.dra_sock, service, [part])
        self.assertEqual(got[part[1]].error, "")
        # Unprepare destroys the instance; twice is fine.
        for _ in range(2):
            got = self.kubelet.unprepare(self.dra_sock, service, [part, beside])
            self.assertEqual({k: v.error for k, v in got.items()}, {part[1]: "", beside[1]: ""})
        self.assertEqual(self.instances(), [])
        self.assertEqual(sorted(c["uid"] for c in self.checkpoint()["claims"]), [plain[1]])
        # The GPU free again: shares of the whole GPU share its one full instance.
        whole2 = self.put("whole2", result("gpu-0", consumed={"memory": "4Gi"},
                                           share=str(uuid.uuid4())))
        got = self.kubelet.prepare(self.dra_sock, service, [whole, whole2])
        self.assertEqual({k: v.error for k, v in got.items()}, {whole[1]: "", whole2[1]: ""})
        self.assertEqual([(p, st) for _, _, p, st in self.instances()], [(4, 0)])
        full = self.visible(whole[1])
        self.assertEqual(self.visible(whole2[1]), full)
        self.assertTrue(full[0].startswith("MIG-"))
        self.kubelet.unprepare(self.dra_sock, service, [whole])
        self.assertEqual(len(self.instances()), 1)
        self.kubelet.unprepare(self.dra_sock, service, [whole2])
        self.assertEqual(self.instances(), [])

    def test_mig_creation_failure_leaves_nothing(self):
        part = self.put("part", result("gpu-0-mig-2g-10gb-2"))
        self.start(env=dict(self.env, FAKE_NVML_MIG_CI_FAIL="2"))
        _, service = self.register()
        got = self.kubelet.prepare(self.dra_sock, service, [part])
        self.assertIn("making MIG instance gpu-0-mig-2g-10gb-2", got[part[1]].error)
        self.assertEqual(self.instances(), [])
        self.assertFalse(os.path.exists(os.path.join(self.cdi, "kgpu.io-gpu_%s.json"
                                                     % part[1])))
        self.assertFalse(os.path.exists(os.path.join(self.state, "pods", part[1])))
        # Nothing checkpointed (the file is not even written).
        self.assertFalse(os.path.exists(os.path.join(self.state, "checkpoint.json")))
        # Without the failure, kubelet's retry prepares it.
        self.stop()
        self.start(env=self.env)
        _, service = self.register()
        got = self.kubelet.prepare(self.dra_sock, service, [part])
        self.assertEqual(got[part[1]].error, "")
        self.assertEqual([(p, st) for _, _, p, st in self.instances()], [(1, 2)])
        # A reboot after which the instance cannot be made again: no spec is left
        # naming the parent GPU in its place, and kubelet's Prepare gets the error.
        spec = os.path.join(self.cdi, "kgpu.io-gpu_%s.json" % part[1])
        self.stop(signal.SIGKILL)
        os.unlink(self.mig_state)
        self.start(env=dict(self.env, FAKE_NVML_MIG_CI_FAIL="2"))
        self.assertFalse(os.path.exists(spec))
        _, service = self.register()
        got = self.kubelet.prepare(self.dra_sock, service, [part])
        self.assertIn("making MIG instance gpu-0-mig-2g-10gb-2", got[part[1]].error)
        self.assertEqual(self.instances(), [])
        # Once it can be made, the retry has it again.
        self.stop()
        self.start(env=self.env)
        self.assertEqual([(p, st) for _, _, p, st in self.instances()], [(1, 2)])
        self.assertTrue(self.visible(part[1])[0].startswith("MIG-"))


def build_cdi_check(out_dir):
    """Builds cdi_check/ (containerd's CDI library) offline; its path, or None."""
    go = shutil.which(ARGS.go) if ARGS.go else None
    if go is None:
        return None
    exe = os.path.join(out_dir, "cdi_check")
    env = dict(os.environ, GOPROXY="off", GOFLAGS="-mod=mod", CGO_ENABLED="0")
    r = subprocess.run([go, "build", "-o", exe, "."], cwd=os.path.join(HERE, "cdi_check"),
                       env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        print("cdi_check not built (its modules are not in the Go module cache?): %s"
              % r.stderr[-500:], file=sys.stderr)
        return None
    return exe


def main():
    global ARGS, PB, CDI_CHECK
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugin", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--protoc", default="protoc")
    ap.add_argument("--go", default="go", help="Go toolchain for cdi_check ('' = none)")
    ap.add_argument("--fake-nvml-dir", default=os.environ.get("KGPU_FAKE_NVML_DIR"),
                    help="the fake NVML builds (tests/fake); without it the MIG cases skip")
    ARGS, rest = ap.parse_known_args()
    if not ARGS.protoc or not shutil.which(ARGS.protoc):
        print("skipped: protoc not found")
        return 77
    PB = load_protos(ARGS.source, ARGS.protoc)
    build_dir = tempfile.mkdtemp(prefix="kgpu-cdi-check-")
    try:
        CDI_CHECK = build_cdi_check(build_dir)
        return run_tests(sys.argv[0], rest)
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
