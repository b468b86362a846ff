"""The node suite: a real kubelet and container runtime running kgpu's device plugin,
and libkgpu-limit.so inside real containers.

One control plane and one node (node.Node: kubelet + containerd + runc + CNI, on
this machine) for the whole suite; kgpu installed from its Helm chart, the extender
and the device plugin run as processes with their ServiceAccounts' tokens
(kgpu_deploy). The node has two fake GPUs of different models, so a pod can be
pinned to one with kgpu.io/gpu-type. The containers run tests/e2e/node/gpu_job.c
from an image built here; the runtime mounts the fake driver into containers that
the plugin gave GPUs, as NVIDIA's runtime mounts the real one.

Tests run in order (their names are numbered) and each deletes its pods. Skipped,
with the reason, where the machine cannot run a kubelet (node.cannot_run_reason); an
error instead under CI=true (node.cannot_run).
"""

import base64
import copy
import json
import os
import re
import shutil
import time
import tomllib
import unittest

import cluster
import kgpu_deploy
import node as nodemod
import node_images
from node_images import CTX_MIB, OOM, first_int, parse_job
from cluster import E2E_NS, MEM, pod_object, wait_for

CONFIG = {}  # filled by e2e.py: bin dir, build dir, work dir

V100 = {"uuid": "GPU-6b670000-0000-4000-8000-000000000000", "model": "Tesla V100-SXM2-16GB",
        "memory_mib": 16384}
T4 = {"uuid": "GPU-6b670000-0000-4000-8000-000000000001", "model": "Tesla T4",
      "memory_mib": 15360}
GPUS = [V100, T4]
CONTROL_NODE = "kgpu-e2e-control"


def strategic_merge(base, patch):
    """A strategic merge patch as far as pod specs need it: maps merge key by key, lists
    of named objects (containers) merge by name, anything else is replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = strategic_merge(base[k], v) if k in base else v
        return out
    named = lambda xs: all(isinstance(x, dict) and "name" in x for x in xs)  # noqa: E731
    if isinstance(base, list) and isinstance(patch, list) and named(base) and named(patch):
        out = [dict(x) for x in base]
        for item in patch:
            at = [i for i, x in enumerate(out) if x["name"] == item["name"]]
            if at:
                out[at[0]] = strategic_merge(out[at[0]], item)
            else:
                out.append(item)
        return out
    return patch


class NodeSuite(unittest.TestCase):
    cp = node = plugin = ext = vip = None

    @classmethod
    def setUpClass(cls):
        reason = nodemod.cannot_run_reason(CONFIG["bin"])
        if reason:
            nodemod.cannot_run("this machine cannot run a kubelet: " + reason)
        cls.cp = cluster.ControlPlane(CONFIG["work"], CONFIG["bin"]).start()
        try:
            cls._bring_up()
        except BaseException:
            cls._tear_down()
            raise

    @classmethod
    def _bring_up(cls):
        cp, build = cls.cp, CONFIG["build"]
        # The chart as an operator without GPUs would install it: fake GPUs from a file
        # (--set-file), the state folder in this run's scratch folder.
        state = cp.p("kgpu-state")
        gpus_file = cp.p("fake-gpus.yaml")
        with open(gpus_file, "w") as f:
            f.write(kgpu_deploy.fake_gpus_yaml(GPUS))
        sched_config, ext_config = kgpu_deploy.install(
            cp, build, values=["devicePlugin.args.stateDir=" + state],
            files=["devicePlugin.args.fakeGpus=" + gpus_file])
        cp.ensure_namespace(E2E_NS)
        cls.node = nodemod.Node(cp, cp.p("node"), build, gpus=GPUS,
                                labels={"kgpu.io/gpu-node": "true"})
        cls.node.start(preloaded=[os.path.join(build, "libkgpu-limit.so"),
                                  cls.node.fake_cuda, cls.node.fake_nvml], kgpu_image=True)
        cls.plugin = kgpu_deploy.DevicePluginPod(cp, cls.node, state).start()
        cls.ext = kgpu_deploy.Extender(cp, build, ext_config, name="kgpu-extender-a").start()
        wait_for(cls.ext.ready, 60, "the extender's /readyz")
        # The extender "runs" on a control-plane node without a kubelet: the Pod object that
        # stands for its replica must not land on the real node, whose kubelet would try to
        # start it (and pull its image).
        cp.add_node(cluster.node_object(CONTROL_NODE, "none", 0, 0))
        cls.vip = kgpu_deploy.ServiceVip(cp, [cls.ext], publish_ip=cls.node.ip,
                                         pod_node=CONTROL_NODE)
        cls.vip.wait_ready(cls.ext)
        cp.start_scheduler(sched_config, extender_url=cls.vip.url)
        cls.wait_capacity(16 + 15)

    @classmethod
    def tearDownClass(cls):
        cls._tear_down()

    @classmethod
    def _tear_down(cls):
        # The node before the control plane: kubelet takes its pods down through the API.
        for part in (cls.vip, cls.plugin, cls.node, cls.cp):
            if part is not None:
                part.stop()

    def setUp(self):
        self.created = []

    def tearDown(self):
        for name in self.created:
            self.cp.admin.delete(cluster.pod_path(E2E_NS, name), grace=0)
        for name in self.created:
            wait_for(lambda name=name: self.cp.get_pod(E2E_NS, name) is None, 60,
                     "pod %s to go" % name)
        self.assertEqual(self.plugin.sanitizer_reports(), [])
        report = self.ext.sanitizer_report()
        self.assertIsNone(report, "sanitizer report:\n%s" % report)

    # -- helpers ----------------------------------------------------------------

    @classmethod
    def node_obj(cls):
        return cls.node.node()

    @classmethod
    def wait_capacity(cls, units, field="allocatable", timeout=60):
        def ok():
            st = cls.node_obj()["status"]
            return st.get(field, {}).get(MEM) == str(units)
        try:
            wait_for(ok, timeout, "node %s %s to be %d" % (field, MEM, units), interval=0.5)
        except AssertionError:
            raise AssertionError("node status: %s\nplugin log:\n%s" % (
                json.dumps(cls.node_obj()["status"].get(field)), cls.plugin.log_tail(30)))

    def job(self, name, mem, args, gpu_type=None, restart="Never", binary="/bin/gpu_job"):
        pod = pod_object(name, [("main", {MEM: mem})],
                         annotations={"kgpu.io/gpu-type": gpu_type} if gpu_type else None)
        c = pod["spec"]["containers"][0]
        c.update(image=node_images.JOB_IMAGE, imagePullPolicy="Never",
                 command=[binary] + [str(a) for a in args])
        pod["spec"]["restartPolicy"] = restart
        self.cp.create_pod(pod)
        self.created.append(name)
        return pod

    def pod(self, name):
        return self.cp.get_pod(E2E_NS, name)

    def wait_phase(self, name, phases=("Succeeded",), timeout=90):
        return self.cp.wait_phase(E2E_NS, name, phases, timeout, ("plugin", self.plugin.log_tail))

    def wait_running(self, name, timeout=90):
        """Running with its container started (gpu_job has printed its first lines)."""
        p = self.wait_phase(name, ("Running",), timeout)
        wait_for(lambda: "holding" in self.node.logs(E2E_NS, name) or
                 "done" in self.node.logs(E2E_NS, name), 30, "pod %s to hold" % name,
                 interval=0.3)
        return p

    def output(self, name, container=None):
        return parse_job(self.node.logs(E2E_NS, name, container))

    def assignment(self, pod, container="main"):
        """The one GPU the extender gave `container`; an init container without an entry of
        its own gets the first GPU of the first app container that has one."""
        ann = pod["metadata"].get("annotations") or {}
        self.assertIn("kgpu.io/assignment", ann)
        parts = json.loads(ann["kgpu.io/assignment"])
        mine = [p for p in parts if p["container"] == container] or parts[:1]
        gpus = [g for part in mine for g in part["gpus"]]
        self.assertEqual(len(gpus), 1, parts)
        return gpus[0]

    def uuid_of(self, index):
        return GPUS[index]["uuid"]

    def check_share(self, name, mib, out=None, container="main", core=100):
        """What gpu_job saw in container `container` of pod `name`: the extender's GPU and a
        share of `mib` MiB (and `core` percent of its compute)."""
        pod = self.pod(name)
        g = self.assignment(pod, container)
        if container == "main":
            self.assertEqual(g["memory_mib"], mib)
        uuid = self.uuid_of(g["index"])
        out = out or self.output(name, container)
        self.assertEqual(out["env"][0], "NVIDIA_VISIBLE_DEVICES=" + uuid, out)
        self.assertIn("KGPU_MEMORY_LIMIT_MIB=%d" % mib, out["env"])
        self.assertIn("KGPU_CONTAINER=" + container, out["env"])
        # As docs/install-device-plugin.md says a container gets them.
        self.assertIn("KGPU_SHARED_DIR=/var/run/kgpu", out["env"])
        self.assertIn("KGPU_CORE_LIMIT_PCT=%d" % core, out["env"])  # 100: none asked
        self.assertEqual(out["limits"][0], "# kgpu limits v1")
        self.assertRegex(out["limits"][1], r"^device 0 uuid=%s memory_mib=%d core_pct=%d\b"
                         % (re.escape(uuid), mib, core))
        self.assertEqual(out["shim"], ["loaded"], "libkgpu-limit.so is not in the process")
        self.assertEqual(out["uuid"], [uuid], "the container sees another GPU")
        # The card has more than the share; the program sees the share as the card.
        self.assertLess(mib, GPUS[g["index"]]["memory_mib"])
        self.assertEqual(first_int(out["total_mib"]), mib)
        self.assertEqual(out["meminfo"][-1], "0 free_mib %d total_mib %d" % (mib - CTX_MIB, mib))
        self.assertEqual(first_int(out["nvml_total_mib"]), mib)
        return g, out

    def held(self):
        return self.ext.held()

    # -- 1. registration --------------------------------------------------------------

    def test_01_registration(self):
        n = self.node_obj()
        st = n["status"]
        for field in ("capacity", "allocatable"):
            self.assertEqual(st[field].get(MEM), "31", st[field])  # 16 + 15 units of 1 GiB
            self.assertEqual(st[field].get("kgpu.io/gpu-core"), "200", st[field])
        ann = json.loads(n["metadata"]["annotations"]["kgpu.io/gpus"])
        self.assertEqual([(g["index"], g["uuid"], g["model"], g["memory_mib"], g["healthy"])
                          for g in ann],
                         [(i, g["uuid"], g["model"], g["memory_mib"], True)
                          for i, g in enumerate(GPUS)])
        labels = n["metadata"]["labels"]
        self.assertEqual(labels.get("kgpu.io/gpu-count"), "2")
        self.assertEqual(labels.get("kgpu.io/gpu-model"), "mixed")
        for sock in ("kgpu-gpu-mem.sock", "kgpu-gpu-core.sock", "kubelet.sock"):
            self.assertTrue(os.path.exists(os.path.join(self.node.plugin_dir, sock)), sock)
        inv = {x["name"]: x for x in self.ext.inspect()["nodes"]}
        self.assertIn(self.node.name, inv, "the extender does not know the real node")
        self.assertEqual(len(inv[self.node.name]["gpus"]), 2)

    # -- 2. one pod, one share ------------------------------------------------------

    def test_02_share_pod(self):
        self.job("share", 4, ["run", "max"], gpu_type="Tesla V100*")
        pod = self.wait_phase("share")
        ann = pod["metadata"]["annotations"]
        self.assertIn("kgpu.io/allocated", ann, "kubelet's Allocate did not mark the pod")
        self.assertEqual(pod["spec"]["nodeName"], self.node.name)
        g, out = self.check_share("share", 4096)
        self.assertEqual(g["index"], 0)
        self.assertEqual(out["alloc_within"], ["0 mib %d" % (4096 - CTX_MIB)])
        self.assertEqual(first_int(out["alloc_past"]), OOM, "one MiB past the share was given")
        # The plugin wrote the file that was mounted: on the host, under the pod's UID.
        limits = os.path.join(self.plugin.state_dir, "pods", pod["metadata"]["uid"],
                              "main.limits")
        with open(limits) as f:
            self.assertIn("memory_mib=4096", f.read())

    # -- 3. two pods on one GPU; a CI burst ---------------------------------------------

    def test_03_two_pods_one_gpu(self):
        self.job("big", 6, ["run", "max", 30], gpu_type="Tesla V100*")
        self.wait_running("big")
        self.job("small", 2, ["run", 3000, 8], gpu_type="Tesla V100*")
        self.wait_running("small")
        # Both run: the extender holds both shares on the one GPU.
        self.assertEqual(self.held().get((self.node.name, 0), (0, 0))[0], 6144 + 2048)
        self.wait_phase("small")
        big, small = self.output("big"), self.output("small")
        self.check_share("big", 6144, big)
        self.check_share("small", 2048, small)
        self.assertEqual(self.assignment(self.pod("big"))["index"],
                         self.assignment(self.pod("small"))["index"])
        # big holds its whole share; small cannot have 3000 MiB although the card has it.
        self.assertEqual(big["alloc_within"], ["0 mib %d" % (6144 - CTX_MIB)])
        self.assertEqual(first_int(big["alloc_past"]), OOM)
        self.assertEqual(small["alloc"], ["%d mib 3000" % OOM])

    def test_04_ci_burst(self):
        names = ["ci-%d" % i for i in range(4)]
        t0 = time.monotonic()
        for n in names:
            self.job(n, 4, ["run", "max", 8], gpu_type="Tesla V100*")
        pods = [self.wait_phase(n, timeout=120) for n in names]
        elapsed = time.monotonic() - t0
        spans = []
        for n, p in zip(names, pods):
            g, out = self.check_share(n, 4096)
            self.assertEqual(g["index"], 0)
            self.assertEqual(out["alloc_within"], ["0 mib %d" % (4096 - CTX_MIB)])
            self.assertEqual(first_int(out["alloc_past"]), OOM)
            term = p["status"]["containerStatuses"][0]["state"]["terminated"]
            self.assertEqual(term["exitCode"], 0)
            spans.append((term["startedAt"], term["finishedAt"]))
        # All four ran at once: each started before any finished.
        self.assertLess(max(s for s, _ in spans), min(f for _, f in spans), spans)
        print("    4 jobs of 4 GiB on one 16 GiB GPU: all done %.1f s after creation" % elapsed)

    # -- 4. delete and recreate ---------------------------------------------------

    def test_05_delete_frees_share(self):
        self.job("reuse", 3, ["run", "max", 300], gpu_type="Tesla T4*")
        first = self.wait_running("reuse")
        key = (self.node.name, 1)
        self.assertEqual(self.held().get(key, (0, 0))[0], 3072)
        uid1 = first["metadata"]["uid"]
        self.cp.admin.delete(cluster.pod_path(E2E_NS, "reuse"))  # graceful: kubelet stops it
        wait_for(lambda: self.pod("reuse") is None, 60, "pod reuse to go")
        wait_for(lambda: self.held().get(key, (0, 0))[0] == 0, 30,
                 "the extender to free the share")
        self.job("reuse", 5, ["run", "max"], gpu_type="Tesla T4*")
        second = self.wait_phase("reuse")
        self.assertNotEqual(second["metadata"]["uid"], uid1)
        self.check_share("reuse", 5120)
        # kubelet's checkpoint no longer holds devices for the deleted pod.
        with open(os.path.join(self.node.plugin_dir, "kubelet_internal_checkpoint")) as f:
            checkpoint = f.read()
        self.assertNotIn(uid1, checkpoint)
        self.assertIn(second["metadata"]["uid"], checkpoint)

    # -- 5. restarts ---------------------------------------------------------------

    def test_06_plugin_restart(self):
        self.job("steady", 2, ["run", "max", 300], gpu_type="Tesla V100*")
        before = self.wait_running("steady")
        cid = before["status"]["containerStatuses"][0]["containerID"]
        self.plugin.restart()
        wait_for(lambda: "registered kgpu.io/gpu-mem" in self.plugin.log(), 30,
                 "the restarted plugin to register")
        self.wait_capacity(31)
        # The running container is untouched: same container, same limits, still loaded.
        r = self.cp.kubectl("exec", "-n", E2E_NS, "steady", "--", "/bin/gpu_job", "show")
        shown = parse_job(r.stdout)
        self.assertEqual(shown["shim"], ["loaded"])
        self.assertRegex(shown["limits"][1], r"memory_mib=2048\b")
        now = self.pod("steady")["status"]["containerStatuses"][0]
        self.assertEqual(now["containerID"], cid)
        self.assertEqual(now["restartCount"], 0)
        self.job("after-plugin", 3, ["run", "max"], gpu_type="Tesla V100*")
        self.wait_phase("after-plugin")
        self.check_share("after-plugin", 3072)

    def test_07_kubelet_restart(self):
        self.job("survivor", 2, ["run", "max", 300], gpu_type="Tesla V100*")
        before = self.wait_running("survivor")
        cid = before["status"]["containerStatuses"][0]["containerID"]
        served = self.allocations()
        self.assertEqual(self.allocations("survivor"), 1)
        registrations = self.plugin.log().count("registered kgpu.io/gpu-mem")
        self.node.restart_kubelet()
        wait_for(lambda: self.plugin.log().count("registered kgpu.io/gpu-mem")
                 > registrations, 60, "the plugin to register with the new kubelet")
        self.node.wait_ready()
        self.wait_capacity(31)
        now = self.pod("survivor")
        self.assertEqual(now["status"]["phase"], "Running")
        self.assertEqual(now["status"]["containerStatuses"][0]["containerID"], cid)
        # kubelet's checkpoint and the plugin agree on what the survivor was given: device
        # IDs of the extender's GPU only, and the plugin's answer with that GPU and its
        # limits file (kept by kubelet as the serialized AllocateResponse).
        uuid = self.uuid_of(self.assignment(before)["index"])
        entries = self.checkpoint(before["metadata"]["uid"])
        self.assertEqual([(e["ContainerName"], e["ResourceName"]) for e in entries],
                         [("main", MEM)])
        ids = [i for per_numa in entries[0]["DeviceIDs"].values() for i in per_numa]
        self.assertEqual(len(ids), 2)
        self.assertTrue(all(i.startswith(uuid + "::") for i in ids), ids)
        answer = base64.b64decode(entries[0]["AllocResp"])
        self.assertIn(uuid.encode(), answer)
        self.assertIn(b"/etc/kgpu/limits", answer)
        self.job("after-kubelet", 3, ["run", "max"], gpu_type="Tesla V100*")
        self.wait_phase("after-kubelet")
        self.check_share("after-kubelet", 3072)
        # Only the new pod's container was allocated: nothing of the survivor again.
        self.assertEqual(self.allocations("survivor"), 1)
        self.assertEqual(self.allocations() - served, self.allocations("after-kubelet"))
        self.assertEqual(self.allocations("after-kubelet"), 1)
        held = self.held().get((self.node.name, 0), (0, 0))[0]
        self.assertEqual(held, 2048, "after-kubelet finished; only survivor holds V100 memory")

    def checkpoint(self, pod_uid):
        """kubelet's device manager checkpoint entries of one pod."""
        with open(os.path.join(self.node.plugin_dir, "kubelet_internal_checkpoint")) as f:
            doc = json.load(f)
        return [e for e in doc["Data"]["PodDeviceEntries"] or [] if e["PodUID"] == pod_uid]

    def allocations(self, name=None):
        """The plugin's "Allocate N resource: pod ns/name ..." lines, of one pod or all."""
        pat = re.compile(r"\bAllocate \d+ \S+: pod %s/%s " % (
            E2E_NS, re.escape(name) if name else r"\S+"))
        return len(pat.findall(self.plugin.log()))

    # -- 6. an unhealthy GPU ---------------------------------------------------------

    def test_08_unhealthy_gpu(self):
        self.job("on-t4", 2, ["run", "max", 300], gpu_type="Tesla T4*")
        self.wait_running("on-t4")
        try:
            self.plugin.write_gpus([V100, dict(T4, healthy=False)])
            self.wait_capacity(16)  # kubelet's allocatable drops by the T4's 15 units
            self.assertEqual(self.node_obj()["status"]["capacity"][MEM], "31")
            ann = json.loads(self.node_obj()["metadata"]["annotations"]["kgpu.io/gpus"])
            self.assertEqual([g["healthy"] for g in ann], [True, False])

            # kubelet reports the running pod's devices unhealthy in its status.
            def reported():
                cs = self.pod("on-t4")["status"]["containerStatuses"][0]
                for r in cs.get("allocatedResourcesStatus") or []:
                    if r["name"] == MEM and any(x.get("health") == "Unhealthy"
                                                for x in r.get("resources") or []):
                        return True
                return False
            wait_for(reported, 60, "kubelet to report on-t4's devices Unhealthy", interval=0.5)

            # The extender places nothing more on the T4.
            self.job("wants-t4", 1, ["run", "max"], gpu_type="Tesla T4*")
            time.sleep(5)
            p = self.pod("wants-t4")
            self.assertFalse(p["spec"].get("nodeName"), "placed on an unhealthy GPU")
            msgs = " ".join(e.get("message", "") for e in self.cp.events_for(E2E_NS, "wants-t4"))
            self.assertIn("FailedScheduling", " ".join(
                e.get("reason", "") for e in self.cp.events_for(E2E_NS, "wants-t4")), msgs)
            self.assertEqual(self.pod("on-t4")["status"]["phase"], "Running")
        finally:
            self.plugin.write_gpus(GPUS)
        self.wait_capacity(31)
        self.wait_phase("wants-t4")

    # -- 7. what the library cannot reach -----------------------------------------------

    def test_09_static_binary_is_not_covered(self):
        """docs/shim.md: a statically linked program does not load the library, so its
        share is not enforced; the environment and the limits file still name it. (Static
        glibc then crashes inside the dlopened driver, as such programs do with the real
        one: the test reads what it saw before.)"""
        self.job("static", 2, ["run", "max"], gpu_type="Tesla V100*",
                 binary="/bin/gpu_job_static")
        self.wait_phase("static", ("Succeeded", "Failed"))
        out = self.output("static")
        self.assertEqual(out["shim"], ["absent"])
        self.assertRegex(out["limits"][1], r"memory_mib=2048\b")
        self.assertEqual(first_int(out["total_mib"]), V100["memory_mib"],
                         "a static program saw a share: update docs/shim.md")

    def test_09b_musl_program_cannot_reach_the_driver(self):
        """A program on musl does not load the library either, nor can it load the driver,
        which is built for glibc: it gets no GPU at all, and says why."""
        if not shutil.which("musl-gcc"):
            self.skipTest("musl-gcc is missing (Debian's musl-tools, scripts/deps.sh)")
        self.job("musl", 2, ["run", "max"], gpu_type="Tesla V100*", binary="/bin/gpu_job_musl")
        pod = self.wait_phase("musl", ("Failed",))
        self.assertEqual(pod["status"]["containerStatuses"][0]["state"]["terminated"]
                         ["exitCode"], 3)
        out = self.output("musl")
        self.assertEqual(out["shim"], ["absent"])
        self.assertRegex(out["limits"][1], r"memory_mib=2048\b")
        self.assertTrue(out["driver"][0].startswith("unavailable "), out["driver"])
        self.assertNotIn("cuInit", out)

    def test_10_broken_limits_file_fails_closed(self):
        """A limits file that cannot be parsed: CUDA is refused in the container, with a
        message naming the file and the line."""
        self.job("broken", 2, ["run", 100, 300], gpu_type="Tesla V100*")
        pod = self.wait_running("broken")
        path = os.path.join(self.plugin.state_dir, "pods", pod["metadata"]["uid"], "main.limits")
        with open(path, "r+") as f:  # in place: the container's bind mount sees it
            text = f.read()
            f.seek(0)
            f.write(text.replace("memory_mib=2048", "memory_mib=lots"))
            f.truncate()
        r = self.cp.kubectl("exec", "-n", E2E_NS, "broken", "--", "/bin/gpu_job", "run", "max",
                            check=False)
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        out = parse_job(r.stdout)
        self.assertNotEqual(first_int(out["cuInit"]), 0)
        self.assertIn("kgpu-limit: /etc/kgpu/limits:2: memory_mib", r.stderr)
        self.assertIn("GPU access is refused", r.stderr)

    def test_11_missing_limits_file_fails_closed(self):
        """The limits file gone from the host before a container restarts (the container
        is restarted with kubelet's checkpointed Allocate answer): containerd creates a
        missing bind-mount source as an empty directory, so the container starts with a
        directory at /etc/kgpu/limits, and the library refuses CUDA with a message."""
        self.job("gone", 2, ["run", 100, 2], gpu_type="Tesla V100*", restart="Always")
        pod = self.wait_running("gone")
        path = os.path.join(self.plugin.state_dir, "pods", pod["metadata"]["uid"], "main.limits")
        os.unlink(path)
        refusal = ("kgpu-limit: cannot read limits file /etc/kgpu/limits: Is a directory; "
                   "GPU access is refused in this process")
        wait_for(lambda: refusal in self.node.logs(E2E_NS, "gone"), 90,
                 "the restarted container to be refused CUDA", interval=1)
        out = self.output("gone")
        self.assertNotEqual(first_int(out["cuInit"]), 0)
        self.assertNotIn("alloc", out, "the container allocated without its limits file")
        self.assertTrue(os.path.isdir(path), "the runtime did not create the missing source")
        self.assertGreaterEqual(
            self.pod("gone")["status"]["containerStatuses"][0]["restartCount"], 1)

    # -- several containers ----------------------------------------------------------

    def test_13_init_and_two_containers(self):
        """kubelet's order and per-container answers: an init container and two app
        containers (one also asking for compute), each with its own share, in one pod."""
        CORE = "kgpu.io/gpu-core"
        pod = pod_object("multi", [("a", {MEM: 2, CORE: 25}), ("b", {MEM: 3})],
                         init=[("setup", {MEM: 1})],
                         annotations={"kgpu.io/gpu-type": "Tesla V100*"})
        for c, args in zip(pod["spec"]["initContainers"] + pod["spec"]["containers"],
                           (["run", "max"], ["run", "max", 2], ["run", "max", 2])):
            c.update(image=node_images.JOB_IMAGE, imagePullPolicy="Never",
                     command=["/bin/gpu_job"] + [str(x) for x in args])
        pod["spec"]["restartPolicy"] = "Never"
        self.cp.create_pod(pod)
        self.created.append("multi")
        self.wait_phase("multi")
        for container, mib, core in (("setup", 1024, 100), ("a", 2048, 25), ("b", 3072, 100)):
            _, out = self.check_share("multi", mib, container=container, core=core)
            self.assertEqual(out["alloc_within"], ["0 mib %d" % (mib - CTX_MIB)], container)
            self.assertEqual(first_int(out["alloc_past"]), OOM, container)
        # kubelet asked in its order: the init container first, then the app containers,
        # once per container and resource (a's compute share included).
        order = re.findall(r"\bAllocate \d+ (\S+): pod %s/multi (?:init )?container (\S+)"
                           % E2E_NS, self.plugin.log())
        self.assertEqual([c for _, c in order if _ == MEM], ["setup", "a", "b"], order)
        self.assertIn((CORE, "a"), order, order)

    def test_13b_compute_shares_take_turns(self):
        """Two pods with 30 % and 70 % compute shares of one GPU, running as different
        users, take turns through the schedule file the plugin mounts into both: the fake
        driver's timeline, which both share through a hostPath file, shows the split."""
        CORE, SECONDS = "kgpu.io/gpu-core", 4
        split = self.cp.p("compute-split")
        os.makedirs(split, exist_ok=True)
        os.chmod(split, 0o777)
        go, gpu = os.path.join(split, "go"), os.path.join(split, "gpu")
        for path in (go, gpu):
            if os.path.exists(path):
                os.unlink(path)
        with open(gpu, "wb"):
            pass
        os.chmod(gpu, 0o666)  # the fake driver would make it 0600, its first user's
        for name, core, uid in (("core30", 30, 1000), ("core70", 70, 2000)):
            pod = pod_object(name, [("main", {MEM: 1, CORE: core})],
                             annotations={"kgpu.io/gpu-type": "Tesla V100*"})
            pod["spec"]["containers"][0].update(
                image=node_images.JOB_IMAGE, imagePullPolicy="Never",
                command=["/bin/gpu_job", "share", "/split/go", str(SECONDS)],
                env=[{"name": "FAKE_CUDA_GPU_FILE", "value": "/split/gpu"}],
                volumeMounts=[{"name": "split", "mountPath": "/split"}],
                securityContext={"runAsUser": uid, "runAsGroup": uid})
            pod["spec"]["volumes"] = [{"name": "split",
                                       "hostPath": {"path": split, "type": "Directory"}}]
            pod["spec"]["restartPolicy"] = "Never"
            self.cp.create_pod(pod)
            self.created.append(name)
        for name in ("core30", "core70"):
            self.wait_phase(name, ("Running", "Succeeded"))
            wait_for(lambda name=name: "ready" in self.node.logs(E2E_NS, name), 60,
                     "pod %s to be ready" % name, interval=0.3)
        t0 = time.monotonic_ns() + 500_000_000
        with open(go + ".tmp", "w") as f:
            f.write("%d\n" % t0)
        os.chmod(go + ".tmp", 0o644)
        os.rename(go + ".tmp", go)
        for name in ("core30", "core70"):
            self.wait_phase(name, timeout=SECONDS + 60)
        a, b = self.output("core30"), self.output("core70")
        self.assertEqual(self.assignment(self.pod("core30"))["index"], 0)
        self.assertEqual(self.assignment(self.pod("core70"))["index"], 0)
        for out, core in ((a, 30), (b, 70)):
            self.assertIn("KGPU_CORE_LIMIT_PCT=%d" % core, out["env"])
            self.assertEqual(out["shim"], ["loaded"])
            self.assertEqual(out["launch_failed"], ["0"])
        ga, gb = first_int(a["gpu_ns"]) / 1e9, first_int(b["gpu_ns"]) / 1e9
        # Both joined the one schedule the plugin made, as their own users, and waited
        # their turns on it. A member (gpusched.h, version 3, after 152 bytes of header):
        # id[64], share u32, waits u32, seen_ns u64, ...; 120 bytes. Members seen since t0
        # are these.
        with open(os.path.join(self.plugin.state_dir, "sched", V100["uuid"] + ".sched"),
                  "rb") as f:
            data = f.read()
        members = {}
        for i in range(64):
            m = data[152 + 120 * i:152 + 120 * (i + 1)]
            if m[0] and int.from_bytes(m[72:80], "little") >= t0:
                members[int.from_bytes(m[64:68], "little")] = int.from_bytes(m[68:72], "little")
        self.assertEqual(sorted(members), [30, 70], members)
        self.assertTrue(all(w > 0 for w in members.values()), "no turns taken: %s" % members)
        share = ga / (ga + gb)
        print("compute split on the node: 30 %% pod %.3f s, 70 %% pod %.3f s of GPU time: "
              "%.1f %% / %.1f %%" % (ga, gb, 100 * share, 100 * (1 - share)))
        self.assertGreater(ga + gb, 0.5 * SECONDS, "the GPU was mostly idle")
        self.assertAlmostEqual(share, 0.30, delta=0.05,
                               msg="30 %% pod got %.1f %% of the GPU" % (100 * share))

    # -- the CI runner examples ------------------------------------------------------

    def test_14_runner_examples(self):
        """examples/ci-runners/ on the node: job pods as GitLab Runner's Kubernetes executor
        makes them (containers build and helper, the runner's node selector, the example's
        pod-spec patch merged in) and as ARC makes runner pods (the example's
        template.spec), two of each at once. The job's container gets its 4 GiB share,
        GitLab's helper container no GPU at all."""
        try:
            import yaml
        except ImportError:
            self.skipTest("PyYAML is missing: the examples' YAML cannot be read")
        ex = os.path.join(cluster.REPO, "examples", "ci-runners")
        with open(os.path.join(ex, "gitlab-runner-config.toml"), "rb") as f:
            kube = tomllib.load(f)["runners"][0]["kubernetes"]
        gitlab = {"containers": [{"name": "build", "image": kube["image"]},
                                 {"name": "helper", "image": "gitlab-runner-helper"}],
                  "nodeSelector": dict(kube["node_selector"])}
        for patch in kube["pod_spec"]:
            self.assertEqual(patch["patch_type"], "strategic")
            gitlab = strategic_merge(gitlab, yaml.safe_load(patch["patch"]))
        with open(os.path.join(ex, "arc-values.yaml")) as f:
            arc = yaml.safe_load(f)["template"]["spec"]
        pods = {"gitlab-job-0": (gitlab, "build"), "gitlab-job-1": (gitlab, "build"),
                "arc-runner-0": (arc, "runner"), "arc-runner-1": (arc, "runner")}
        for name, (spec, main) in pods.items():
            spec = copy.deepcopy(spec)
            for c in spec["containers"]:
                # No registry here: the examples' images become the job image.
                c.update(image=node_images.JOB_IMAGE, imagePullPolicy="Never",
                         command=["/bin/gpu_job"] + (["run", "max", "3"] if c["name"] == main
                                                     else ["show"]))
            spec.update(restartPolicy="Never", automountServiceAccountToken=False,
                        terminationGracePeriodSeconds=0)
            self.cp.create_pod({"apiVersion": "v1", "kind": "Pod", "spec": spec,
                                "metadata": {"name": name, "namespace": E2E_NS}})
            self.created.append(name)
        for name, (_, main) in pods.items():
            self.wait_phase(name)
            _, out = self.check_share(name, 4096, container=main)
            self.assertEqual(out["alloc_within"], ["0 mib %d" % (4096 - CTX_MIB)], name)
            self.assertEqual(first_int(out["alloc_past"]), OOM, name)
        helper = self.output("gitlab-job-0", "helper")
        self.assertEqual(helper["env"][0], "NVIDIA_VISIBLE_DEVICES=")
        self.assertEqual(helper["limits"], ["absent"])
        self.assertEqual(helper["shim"], ["absent"])

    # -- the figure in docs/ci-runners.md ----------------------------------------------

    def test_12_ci_capacity(self):
        """How many CI jobs one 16 GiB GPU runs at once, per share size: a measurement, run
        by hand (KGPU_E2E_CI_CAPACITY=1,2,4,8 scripts/e2e.sh --suite node -k capacity).
        For each share S GiB, 16/S + 2 jobs that each take all of their share and hold it
        for KGPU_E2E_CI_HOLD seconds (20) are created at once on the V100."""
        spec = os.environ.get("KGPU_E2E_CI_CAPACITY")
        if not spec:
            self.skipTest("a measurement: set KGPU_E2E_CI_CAPACITY=1,2,4,8 to run it")
        hold = int(os.environ.get("KGPU_E2E_CI_HOLD", "20"))
        print()
        for share in (int(x) for x in spec.split(",")):
            fit = V100["memory_mib"] // (share * 1024)
            names = ["cap%d-%d" % (share, i) for i in range(fit + 2)]
            for n in names:
                self.job(n, share, ["run", "max", hold], gpu_type="Tesla V100*")
            pods = [self.wait_phase(n, timeout=60 + 3 * hold * len(names) // fit)
                    for n in names]
            created = min(p["metadata"]["creationTimestamp"] for p in pods)
            spans = []
            for n, p in zip(names, pods):
                _, out = self.check_share(n, share * 1024)
                self.assertEqual(first_int(out["alloc_past"]), OOM)
                t = p["status"]["containerStatuses"][0]["state"]["terminated"]
                spans.append((t["startedAt"], t["finishedAt"]))
            # Most jobs running at once (RFC 3339 UTC strings compare as times).
            peak = max(sum(1 for s, f in spans if s <= at < f) for at, _ in spans)
            self.assertEqual(peak, fit, spans)
            starts = sorted(s for s, _ in spans)

            def secs(a, b):
                fmt = "%Y-%m-%dT%H:%M:%SZ"
                return (time.mktime(time.strptime(b, fmt)) -
                        time.mktime(time.strptime(a, fmt)))
            print("    share %d GiB: %d jobs, at most %d at once (%d GiB each, %d MiB "
                  "usable); the first %d all running %.0f s after creation, all %d done in "
                  "%.0f s (hold %d s)" % (
                      share, len(names), peak, share, share * 1024 - CTX_MIB, fit,
                      secs(created, starts[fit - 1]), len(names),
                      secs(created, max(f for _, f in spans)), hold), flush=True)
            for n in names:
                self.cp.admin.delete(cluster.pod_path(E2E_NS, n), grace=0)
            for n in names:
                wait_for(lambda n=n: self.pod(n) is None, 60, "pod %s to go" % n)
            self.created = [c for c in self.created if c not in names]
