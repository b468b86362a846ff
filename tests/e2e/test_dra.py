"""The DRA suite: kgpu-dra-plugin on a real node, claims allocated by the real
kube-scheduler and prepared for real containers.

One control plane (cluster.ControlPlane: etcd, kube-apiserver, kube-scheduler
at the pinned release) and one node (node.Node: the pinned kubelet with
containerd 2.x, its runc shim and ctr, all built by scripts/upstream.sh, and
node/fake-nvidia-runtime in front of runc, which mounts the fake driver into
containers whose NVIDIA_VISIBLE_DEVICES names GPUs). deploy/dra is applied
as shipped (namespace, RBAC, DeviceClass, DaemonSet), and the driver runs on
the node in the pod its DaemonSet would make (DraDriverPod): its
ServiceAccount's token, so its RBAC is what is tested, its init container
installing libkgpu-limit.so, its locked-down security context, and NVML (the
fake one the runtime mounts, as NVIDIA's runtime mounts the real one) for
the GPUs.

What is real here and stood in for by tests/integration/test_dra_upstream.py:
kubelet's plugin watcher registers the driver, kubelet's DRA manager calls
NodePrepareResources before the containers start and NodeUnprepareResources
after the pod ends, containerd's CRI resolves the CDI device names kubelet
hands it against the specs the driver wrote, and libkgpu-limit.so inside the
container holds the program to the allocated share.

Feature gates: none are set. DynamicResourceAllocation is GA, and
DRAConsumableCapacity (beta since 1.36) is on by default at v1.37.2 in
kube-apiserver, kube-scheduler and kubelet; test_01 checks that the server
kept the slice's consumable-capacity fields, which it drops when the gate
is off.

Skipped, with the reason, where the machine cannot run the node.
"""

import json
import os
import signal
import unittest

import cluster
import harness
import node as nodemod
import node_images
from node_images import CTX_MIB, OOM, first_int, parse_job
from cluster import wait_for

CONFIG = {}  # filled by e2e.py: bin dir, build dir, work dir
DRIVER = "gpu.kgpu.io"
NS = "kgpu-dra-e2e"
RESOURCE = "/apis/resource.k8s.io/v1"
V100 = {"index": 0, "uuid": "GPU-6b670000-0000-4000-8000-0000000000d0",
        "model": "Tesla V100-SXM2-16GB", "memory_mib": 16384}
T4 = {"index": 1, "uuid": "GPU-6b670000-0000-4000-8000-0000000000d1", "model": "Tesla T4",
      "memory_mib": 15360}
GPUS = [V100, T4]
# In MIG mode (the fake NVML's FAKE_NVML_MIG): published as partitions of class
# mig.gpu.kgpu.io beside its whole device, never given to the whole-GPU tests' claims.
A100 = {"index": 2, "uuid": "GPU-6b670000-0000-4000-8000-0000000000d2",
        "model": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960}
MIG_CLASS = "mig." + DRIVER


def containerd_bin(bindir):
    """Where scripts/upstream.sh put containerd 2.x: containerd-<version> in the bin dir."""
    for name in sorted(os.listdir(bindir)) if os.path.isdir(bindir) else []:
        d = os.path.join(bindir, name)
        if name.startswith("containerd-v2.") and all(
                os.access(os.path.join(d, t), os.X_OK)
                for t in ("containerd", "containerd-shim-runc-v2", "ctr")):
            return d
    return None


DRA_NS = "kgpu-dra"
DS_CONTAINER = "kgpu-dra-plugin"


class DraDriverPod:
    """kgpu-dra-plugin as deploy/dra's DaemonSet runs it, in a pod on the real node: the
    pod the DaemonSet controller (not run here) would make from the template the API
    server holds, bound to the node. Changed, as the DaemonSet's own comment tells an
    operator whose kubelet keeps its root folder elsewhere: each host path with the
    mount path and flag that name it (kubelet's plugin folders are under its --root-dir
    in the scratch folder, and the state and CDI folders are too, so the host's
    /var/run/cdi is never touched). Standing in for components that do not run:
    hostNetwork and KUBERNETES_SERVICE_HOST/PORT naming the API server's loopback address
    (kube-proxy), and the kube-root-ca.crt ConfigMap (kube-controller-manager). The GPUs
    are found through NVML, as on a GPU node: the DaemonSet's NVIDIA_VISIBLE_DEVICES=all
    makes the node's runtime mount the fake libnvidia-ml.so.1 into it."""

    def __init__(self, cp, node, workdir):
        self.cp, self.node, self.dir = cp, node, workdir
        os.makedirs(workdir, exist_ok=True)
        self.state_dir = os.path.join(workdir, "state")
        self.cdi_dir = os.path.join(workdir, "cdi")
        self.host_paths = {"/var/lib/kubelet/plugins": node.dra_plugin_dir,
                           "/var/lib/kubelet/plugins_registry": node.dra_registry_dir,
                           "/var/lib/kgpu/dra": self.state_dir, "/var/run/cdi": self.cdi_dir}
        self.name = "kgpu-dra-plugin-" + node.name
        self.extra_env = {}  # more environment for the driver's container (recreate())
        self.kills = 0
        self.saved = []  # logs of containers that are gone

    def _pod_spec(self):
        ds = self.cp.admin.get("/apis/apps/v1/namespaces/%s/daemonsets/kgpu-dra-plugin"
                               % DRA_NS)
        tmpl = ds["spec"]["template"]
        spec = dict(tmpl["spec"], nodeName=self.node.name, hostNetwork=True)
        for v in spec["volumes"]:
            old = v.get("hostPath", {}).get("path")
            if old in self.host_paths:
                v["hostPath"]["path"] = self.host_paths[old]
                os.makedirs(self.host_paths[old], exist_ok=True)
        for c in spec["containers"]:
            if c["name"] != DS_CONTAINER:
                continue
            for m in c["volumeMounts"]:
                m["mountPath"] = self.host_paths.get(m["mountPath"], m["mountPath"])
            cmd = []
            for arg in c["command"]:
                flag, eq, value = arg.partition("=")
                cmd.append(flag + eq + self.host_paths.get(value, value) if eq else arg)
            c["command"] = cmd
            c["env"] = list(c.get("env") or []) + [
                {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(self.cp.api_port)}] + [
                {"name": k, "value": v} for k, v in sorted(self.extra_env.items())]
        return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
                "metadata": dict(tmpl["metadata"], name=self.name, namespace=DRA_NS)}

    def _path(self):
        return "/api/v1/namespaces/%s/pods/%s" % (DRA_NS, self.name)

    def pod(self):
        return self.cp.admin.try_get(self._path())

    def restarts(self):
        for st in (self.pod() or {}).get("status", {}).get("containerStatuses") or []:
            if st["name"] == DS_CONTAINER:
                return st["restartCount"], "running" in st.get("state", {})
        return 0, False

    def start(self):
        """Creates the pod, or after kill() waits for kubelet to restart its container; then
        waits until kubelet has registered the driver."""
        if self.pod() is None:
            self.cp.publish_root_ca(DRA_NS)
            self.cp.admin.post("/api/v1/namespaces/%s/pods" % DRA_NS, self._pod_spec())

        def registered():
            p = self.pod() or {}
            if p.get("status", {}).get("phase") == "Failed":
                raise AssertionError("%s failed: %s" % (self.name, json.dumps(p["status"])))
            n, running = self.restarts()
            return (running and n >= self.kills and
                    "kubelet registered " + DRIVER in self.current_log())
        try:
            wait_for(registered, 90, "pod %s to register with kubelet" % self.name,
                     interval=0.5)
        except AssertionError as e:
            raise AssertionError("%s\nstatus: %s\nlog:\n%s" % (
                e, json.dumps((self.pod() or {}).get("status"))[:2000], self.log_tail()))
        return self

    def _plugin_pids(self):
        """The driver's process on this machine, found by its --plugin-dir in the node's
        scratch folder (so never another node's or another suite's)."""
        want = ("--plugin-dir=" + self.node.dra_plugin_dir).encode()
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open("/proc/%s/cmdline" % entry, "rb") as f:
                        argv = f.read().split(b"\0")
                except OSError:
                    continue
                if argv and argv[0].endswith(b"kgpu-dra-plugin") and want in argv:
                    out.append(int(entry))
        return out

    def kill(self):
        """kill -9 of the driver in its container, as a crash; kubelet restarts it."""
        pids = self._plugin_pids()
        assert pids, "the driver's process is not on this machine"
        self.saved.append(self.current_log())
        self.kills += 1
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

    def current_log(self):
        st, text = self.cp.admin.raw("GET", self._path() + "/log?container=" + DS_CONTAINER)
        return text.decode("utf-8", "replace") if st == 200 else ""

    def log(self):
        return "".join(self.saved) + self.current_log()

    def log_tail(self, n=30):
        return "\n".join(self.log().splitlines()[-n:])

    def save_log(self):
        with open(os.path.join(self.dir, "kgpu-dra-plugin.log"), "w") as f:
            f.write(self.log())

    def recreate(self, **env):
        """The pod deleted and made again with `env` added to the container's environment
        (a pod's environment cannot change in place), as a DaemonSet rollout does."""
        self.stop()
        self.extra_env = dict(env)
        self.kills = 0
        return self.start()

    def stop(self):
        if self.pod() is None:
            return
        self.save_log()
        self.cp.admin.delete(self._path())
        wait_for(lambda: self.pod() is None, 60, "pod %s to go" % self.name, interval=0.3)

    def cdi_specs(self):
        return sorted(os.listdir(self.cdi_dir)) if os.path.isdir(self.cdi_dir) else []

    def checkpoint_uids(self):
        try:
            with open(os.path.join(self.state_dir, "checkpoint.json")) as f:
                return sorted(c["uid"] for c in json.load(f).get("claims") or [])
        except FileNotFoundError:
            return []

    def sanitizer_reports(self):
        text = self.log()
        return [text[max(0, text.find(m) - 300):text.find(m) + 4000]
                for m in harness.SANITIZER_MARKS if m in text]


class DraSuite(unittest.TestCase):
    cp = node = driver = None

    @classmethod
    def setUpClass(cls):
        reason = nodemod.cannot_run_reason(CONFIG["bin"])
        ctrd = containerd_bin(CONFIG["bin"])
        if reason is None and ctrd is None:
            reason = "containerd 2.x is not built in %s (scripts/upstream.sh)" % CONFIG["bin"]
        if reason:
            nodemod.cannot_run("this machine cannot run a kubelet with a CDI runtime: " + reason)
        cls.cp = cluster.ControlPlane(CONFIG["work"], CONFIG["bin"]).start()
        try:
            cls._bring_up(ctrd)
        except BaseException:
            cls._tear_down()
            raise

    @classmethod
    def _bring_up(cls, ctrd):
        cp, build = cls.cp, CONFIG["build"]
        cp.kubectl("apply", "-k", os.path.join(cluster.REPO, "deploy", "dra"))
        cp.ensure_namespace(NS)
        work = cp.p("dra")
        cdi = os.path.join(work, "cdi")
        cls.node = nodemod.Node(cp, cp.p("node"), build, gpus=GPUS + [A100],
                                labels={"kgpu.io/gpu-allocator": "dra"},
                                containerd_bin=ctrd, cdi_dirs=[cdi], mig_gpus=[A100["index"]])
        cls.node.start(preloaded=[os.path.join(build, "libkgpu-limit.so"),
                                  cls.node.fake_cuda, cls.node.fake_nvml], dra_image=True)
        cls.driver = DraDriverPod(cp, cls.node, work)
        assert cls.driver.cdi_dir == cdi
        cls.driver.start()
        cp.start_scheduler(cluster.PLAIN_SCHEDULER_CONFIG)
        cls.slice = wait_for(cls.published, 60, "the driver's ResourceSlice", interval=0.5)

    @classmethod
    def node_slices(cls):
        """The node's slices of the driver, all of one generation of its pool, or []."""
        q = "fieldSelector=spec.nodeName%%3D%s%%2Cspec.driver%%3D%s" % (cls.node.name, DRIVER)
        items = cls.cp.admin.get(RESOURCE + "/resourceslices?" + q).get("items") or []
        gens = {s["spec"]["pool"]["generation"] for s in items}
        if not items or len(gens) != 1 or any(
                s["spec"]["pool"]["resourceSliceCount"] != len(items) for s in items):
            return []
        return sorted(items, key=lambda s: s["metadata"]["name"])

    @classmethod
    def published(cls):
        """The node's first slice, its devices those of every slice that are whole GPUs,
        once every GPU has one (the MIG GPU's partitions left out: they carry `mig`)."""
        slices = cls.node_slices()
        whole = [d for s in slices for d in s["spec"].get("devices") or []
                 if "mig" not in d["attributes"]]
        if len(whole) != len(GPUS) + 1:
            return None
        first = json.loads(json.dumps(slices[0]))
        first["spec"]["devices"] = [d for d in whole
                                    if d["attributes"]["uuid"]["string"] != A100["uuid"]]
        return first

    @classmethod
    def tearDownClass(cls):
        cls._tear_down()

    @classmethod
    def _tear_down(cls):
        if cls.driver is not None and cls.node is not None and not cls.node.cleaned:
            try:
                cls.driver.save_log()
            except Exception as e:  # noqa: BLE001 -- the teardown goes on
                print("saving the driver's log: %s" % e)
        # The node takes every pod down, the driver's among them, then the control plane.
        for part in (cls.node, cls.cp):
            if part is not None:
                part.stop()

    def setUp(self):
        self.pods, self.claims = [], []

    def tearDown(self):
        uids = [c["metadata"]["uid"] for c in
                (self.cp.admin.try_get(self.claim_path(n)) for n in self.claims) if c]
        for name in self.pods:
            self.delete_pod(name)
        # kubelet unprepares once the containers are gone, after the pod left the API.
        for uid in uids:
            self.wait_unprepared(uid)
        for name in self.claims:
            self.delete_claim(name)
        self.assertEqual(self.driver.sanitizer_reports(), [])

    # -- helpers ----------------------------------------------------------------

    def claim_path(self, name=None):
        return RESOURCE + "/namespaces/%s/resourceclaims" % NS + ("/" + name if name else "")

    def create_mig_claim(self, name, profile):
        """A claim for one MIG partition of `profile` ("3g.20gb") of class mig.gpu.kgpu.io."""
        self.cp.admin.post(self.claim_path(), {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": MIG_CLASS,
                "selectors": [{"cel": {"expression": 'device.attributes["%s"].profile == "%s"'
                                       % (DRIVER, profile)}}]}}]}}})
        self.claims.append(name)

    def mig_instances(self):
        """The fake NVML's GPU instances on the A100 now: sorted [(start, NVML GI profile)]."""
        try:
            with open(self.node.mig_state) as f:
                lines = [l.split() for l in f]
        except FileNotFoundError:
            return []
        return sorted((int(l[4]), int(l[3])) for l in lines
                      if len(l) >= 5 and l[0] == "gi" and l[1] == A100["uuid"])

    def cdi_env(self, uid):
        """The env of the claim's CDI device, as the runtime injects it."""
        with open(os.path.join(self.driver.cdi_dir, self.cdi_spec_of(uid))) as f:
            spec = json.load(f)
        return [e for d in spec["devices"] for e in d["containerEdits"].get("env") or []]

    def mig_uuid(self, uid):
        vis = [e.split("=", 1)[1] for e in self.cdi_env(uid)
               if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
        self.assertEqual(len(vis), 1, self.cdi_env(uid))
        self.assertTrue(vis[0].startswith("MIG-"), vis)
        return vis[0]

    def wait_unschedulable(self, name):
        def unschedulable():
            p = self.cp.get_pod(NS, name)
            conds = p.get("status", {}).get("conditions") or []
            return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conds)
        wait_for(unschedulable, 60, "%s to be unschedulable" % name, interval=0.5)

    def create_claim(self, name, memory, model="Tesla V100", cores=None):
        req = {"memory": memory}
        if cores is not None:
            req["cores"] = str(cores)
        self.cp.admin.post(self.claim_path(), {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER,
                "selectors": [{"cel": {"expression":
                                       'device.attributes["%s"].model.startsWith("%s")'
                                       % (DRIVER, model)}}],
                "capacity": {"requests": req}}}]}}})
        self.claims.append(name)

    def delete_claim(self, name):
        """The claim gone, its capacity free for the next test (cluster.drop_claim)."""
        self.cp.drop_claim(self.claim_path(name))

    def delete_pod(self, name):
        """Gracefully, as a user would: kubelet stops the containers, then the pod goes."""
        self.cp.admin.delete(cluster.pod_path(NS, name))
        wait_for(lambda: self.cp.get_pod(NS, name) is None, 60, "pod %s to go" % name)

    def wait_unprepared(self, uid):
        """kubelet's NodeUnprepareResources reached the driver: the CDI spec, the claim's
        files and its checkpoint entry are gone."""
        def gone():
            return (self.cdi_spec_of(uid) not in self.driver.cdi_specs() and
                    uid not in self.driver.checkpoint_uids() and
                    not os.path.exists(os.path.join(self.driver.state_dir, "pods", uid)))
        try:
            wait_for(gone, 60, "claim %s to be unprepared" % uid, interval=0.3)
        except AssertionError as e:
            raise AssertionError("%s\nkubelet:\n%s\ndriver:\n%s" % (
                e, "\n".join(l for l in self.node.kubelet_log().splitlines()
                              if "nprepare" in l)[-2000:], self.driver.log_tail(10)))

    def claim(self, name):
        return self.cp.admin.get(self.claim_path(name))

    def job(self, name, claim, args):
        self.cp.create_pod({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "automountServiceAccountToken": False,
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": "main", "image": node_images.JOB_IMAGE,
                                     "imagePullPolicy": "Never",
                                     "command": ["/bin/gpu_job"] + [str(a) for a in args],
                                     "resources": {"claims": [{"name": "gpu"}]}}]}})
        self.pods.append(name)

    def wait_phase(self, name, phases=("Succeeded",), timeout=90):
        return self.cp.wait_phase(NS, name, phases, timeout, ("driver", self.driver.log_tail))

    def wait_holding(self, name, timeout=90):
        self.wait_phase(name, ("Running",), timeout)
        wait_for(lambda: "holding" in self.node.logs(NS, name), 30,
                 "pod %s to hold its memory" % name, interval=0.3)

    def output(self, name):
        return parse_job(self.node.logs(NS, name))

    def check_share(self, name, gpu, mib, out=None):
        """gpu_job in pod `name` saw GPU `gpu` only, with a share of `mib` MiB: an allocation
        within the share succeeded and one past it failed."""
        out = out or self.output(name)
        self.assertEqual(out["env"][0], "NVIDIA_VISIBLE_DEVICES=" + gpu["uuid"], out)
        self.assertIn("KGPU_MEMORY_LIMIT_MIB=%d" % mib, out["env"])
        self.assertEqual(out["limits"][0], "# kgpu limits v1")
        self.assertRegex(out["limits"][1], r"^device 0 uuid=%s memory_mib=%d\b"
                         % (gpu["uuid"], mib))
        self.assertEqual(out["shim"], ["loaded"], "libkgpu-limit.so is not in the process")
        # CUDA's UUID is the device's 16 bytes, which gpu_job prints after "GPU-"; a MIG
        # device's are its MIG UUID's.
        self.assertEqual([u.split("-", 1)[1] for u in out["uuid"]],
                         [gpu["uuid"].split("-", 1)[1]], "the container sees another GPU")
        self.assertEqual(first_int(out["total_mib"]), mib)
        self.assertEqual(first_int(out["nvml_total_mib"]), mib)
        self.assertEqual(out["alloc_within"], ["0 mib %d" % (mib - CTX_MIB)])
        self.assertEqual(first_int(out["alloc_past"]), OOM, "one MiB past the share was given")
        return out

    def cdi_spec_of(self, uid):
        return "kgpu.io-gpu_%s.json" % uid

    # -- 1. registration and the slice -------------------------------------------------

    def test_01_registered_and_published(self):
        """kubelet's plugin watcher found the driver (its registration socket, kubelet's
        log), and the real server accepted its slice with consumable capacity kept."""
        reg = os.path.join(self.node.dra_registry_dir, DRIVER + "-reg.sock")
        self.assertTrue(os.path.exists(reg), reg)
        # kubelet's NotifyRegistrationStatus said yes.
        wait_for(lambda: "kubelet registered " + DRIVER in self.driver.log(), 30,
                 "kubelet to register the driver")
        s = self.slice
        node = self.node.node()
        self.assertEqual(s["spec"]["nodeName"], self.node.name)
        self.assertEqual(s["spec"]["driver"], DRIVER)
        self.assertEqual(s["metadata"]["ownerReferences"][0]["uid"], node["metadata"]["uid"])
        devs = {d["attributes"]["uuid"]["string"]: d for d in s["spec"]["devices"]}
        self.assertEqual(sorted(devs), sorted(g["uuid"] for g in GPUS))
        v = devs[V100["uuid"]]
        self.assertTrue(v.get("allowMultipleAllocations"), v)
        self.assertIn("requestPolicy", v["capacity"]["memory"], v)
        self.assertEqual(v["attributes"]["model"]["string"], V100["model"])
        # Found through NVML in the driver's container: the fake one's PCI address.
        self.assertEqual(v["attributes"]["pciBusID"]["string"], "0000:01:00.0")

    # -- 2. two claims on one GPU, each held to its share -----------------------------------

    def test_02_two_claims_share_one_gpu(self):
        """Two claims of 6 and 4 GiB on the one V100, their pods running at once: each
        container sees only the V100, as big as its share, and is refused one MiB past
        it. Deleting a pod unprepares its claim only."""
        self.create_claim("share-a", "6Gi")
        self.create_claim("share-b", "4Gi")
        self.job("share-a", "share-a", ["run", "max", 120])
        self.job("share-b", "share-b", ["run", "max", 120])
        self.wait_holding("share-a")
        self.wait_holding("share-b")
        res = {n: self.claim(n)["status"]["allocation"]["devices"]["results"]
               for n in ("share-a", "share-b")}
        v100 = next(d["name"] for d in self.slice["spec"]["devices"]
                    if d["attributes"]["uuid"]["string"] == V100["uuid"])
        for n, rs in res.items():
            self.assertEqual([r["device"] for r in rs], [v100], n)
            self.assertTrue(rs[0].get("shareID"), rs)
        self.assertNotEqual(res["share-a"][0]["shareID"], res["share-b"][0]["shareID"])
        self.check_share("share-a", V100, 6144)
        self.check_share("share-b", V100, 4096)
        uids = {n: self.claim(n)["metadata"]["uid"] for n in ("share-a", "share-b")}
        for n in ("share-a", "share-b"):
            self.assertIn(self.cdi_spec_of(uids[n]), self.driver.cdi_specs())
        self.assertEqual(self.driver.checkpoint_uids(), sorted(uids.values()))
        # share-b deleted: kubelet unprepared its claim; share-a's stays prepared and runs.
        self.delete_pod("share-b")
        self.wait_unprepared(uids["share-b"])
        self.assertEqual(self.driver.checkpoint_uids(), [uids["share-a"]])
        self.assertIn(self.cdi_spec_of(uids["share-a"]), self.driver.cdi_specs())
        self.assertEqual(self.cp.get_pod(NS, "share-a")["status"]["phase"], "Running")
        self.delete_pod("share-a")
        self.wait_unprepared(uids["share-a"])

    def test_02b_finished_pod_unprepares(self):
        """A pod that ran to completion: kubelet unprepares its claim without waiting for
        the pod to be deleted."""
        self.create_claim("once", "1Gi", model="Tesla T4")
        self.job("once", "once", ["run", "max"])
        self.wait_phase("once")
        self.check_share("once", T4, 1024)
        self.wait_unprepared(self.claim("once")["metadata"]["uid"])

    def test_03_over_the_gpus_memory_waits(self):
        """A claim that fits on no GPU beside the ones holding memory is not allocated:
        kube-scheduler counts the consumed capacity."""
        self.create_claim("hold-12", "12Gi")
        self.job("hold-12", "hold-12", ["run", "max", 30])
        self.wait_holding("hold-12")
        self.create_claim("no-room", "8Gi")
        self.job("no-room", "no-room", ["show"])

        def unschedulable():
            p = self.cp.get_pod(NS, "no-room")
            conds = p.get("status", {}).get("conditions") or []
            return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conds)
        wait_for(unschedulable, 60, "no-room to be unschedulable", interval=0.5)
        self.assertFalse(self.claim("no-room").get("status", {}).get("allocation"))

    # -- 4. a driver restart between prepare and unprepare ---------------------------------

    def test_04_driver_restart_between_prepare_and_unprepare(self):
        """kill -9 of the driver while its claim's pod runs; restarted, it registers again,
        still holds the claim (checkpoint, CDI spec, limits), and the restarted driver is
        the one kubelet asks to unprepare when the pod is deleted."""
        self.create_claim("restart", "2Gi", model="Tesla T4")
        self.job("restart", "restart", ["run", "max", 600])
        self.wait_holding("restart")
        uid = self.claim("restart")["metadata"]["uid"]
        self.assertIn(self.cdi_spec_of(uid), self.driver.cdi_specs())
        self.assertEqual(self.driver.checkpoint_uids(), [uid])
        cid = self.cp.get_pod(NS, "restart")["status"]["containerStatuses"][0]["containerID"]
        self.driver.kill()
        self.driver.start()
        self.assertEqual(self.driver.restarts()[0], 1)
        # Nothing lost: the claim is still prepared, its files in place.
        self.assertIn(self.cdi_spec_of(uid), self.driver.cdi_specs())
        self.assertEqual(self.driver.checkpoint_uids(), [uid])
        self.check_share("restart", T4, 2048)
        p = self.cp.get_pod(NS, "restart")
        self.assertEqual(p["status"]["containerStatuses"][0]["containerID"], cid)
        self.assertEqual(p["status"]["phase"], "Running")
        # Deleting the pod: kubelet asks the restarted driver to unprepare.
        self.delete_pod("restart")
        self.wait_unprepared(uid)
        self.assertEqual(self.driver.checkpoint_uids(), [])
        self.assertIn("unprepared ResourceClaim %s/restart (%s)" % (NS, uid),
                      self.driver.current_log())

    # -- 5. a kubelet restart with a claim prepared ------------------------------------------

    # -- 6. a classic extended resource served through DRA -------------------------------

    def test_06_extended_resource_served_by_dra(self):
        """DRA extended-resource mapping (KEP-5004, GA in 1.37): with the DeviceClass's
        extendedResourceName set to nvidia.com/gpu, a pod that asks for `nvidia.com/gpu: 1`
        on this node, which no device plugin serves, gets a whole GPU through the driver:
        kube-scheduler allocates a claim for it, kubelet prepares it, containerd injects
        the CDI spec, and the container sees the one GPU, all of its memory its own."""
        # After test_05's kubelet restart the slice is republished at the driver's next
        # resync: wait for it, as a pod created now would.
        wait_for(self.published, 60, "the driver's ResourceSlice", interval=0.5)
        path = RESOURCE + "/deviceclasses/" + DRIVER
        cls = self.cp.admin.get(path)
        self.cp.admin.merge_patch(path, {"spec": {"extendedResourceName": "nvidia.com/gpu"}})
        try:
            self.cp.create_pod({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "classic", "namespace": NS},
                "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                         "automountServiceAccountToken": False,
                         "containers": [{"name": "main", "image": node_images.JOB_IMAGE,
                                         "imagePullPolicy": "Never",
                                         "command": ["/bin/gpu_job", "run", "max"],
                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
            self.pods.append("classic")
            pod = self.wait_phase("classic")
            st = pod["status"].get("extendedResourceClaimStatus") or {}
            claim = st.get("resourceClaimName")
            self.assertTrue(claim, "no extendedResourceClaimStatus: %s" % json.dumps(pod["status"]))
            out = self.output("classic")
            gpu = next(g for g in GPUS if out["env"][0] == "NVIDIA_VISIBLE_DEVICES=" + g["uuid"])
            # A whole GPU: the claim consumed all of its memory, and the share is all of it.
            self.check_share("classic", gpu, gpu["memory_mib"], out)
            c = self.claim(claim)
            self.assertEqual([r["device"] for r in c["status"]["allocation"]["devices"]
                              ["results"]], ["gpu-%d" % gpu["index"]])
            # Finished: unprepared as any claim; the pod and (kube-controller-manager's part)
            # its claim go, so the GPU is free again.
            self.wait_unprepared(c["metadata"]["uid"])
            self.delete_pod("classic")
            self.pods.remove("classic")
            self.cp.drop_claim(self.claim_path(claim))
        finally:
            self.cp.admin.merge_patch(path, {"spec": {"extendedResourceName": None}})
        self.assertNotIn("extendedResourceName", self.cp.admin.get(path)["spec"], cls)

    def test_05_kubelet_restart_keeps_the_claim(self):
        """kubelet restarted while a pod with a compute share (30 %) runs: the driver
        registers with the new kubelet, which does not prepare the claim again; the
        container keeps running; the pod's deletion still unprepares the claim."""
        self.create_claim("kubelet", "2Gi", model="Tesla T4", cores=30)
        self.job("kubelet", "kubelet", ["run", "max", 600])
        self.wait_holding("kubelet")
        uid = self.claim("kubelet")["metadata"]["uid"]
        out = self.check_share("kubelet", T4, 2048)
        self.assertIn("KGPU_CORE_LIMIT_PCT=30", out["env"])
        self.assertRegex(out["limits"][1], r"core_pct=30\b")
        cid = self.cp.get_pod(NS, "kubelet")["status"]["containerStatuses"][0]["containerID"]
        marker = "kubelet registered " + DRIVER
        before = self.driver.log().count(marker)
        prepare_call = "DRAPlugin/NodePrepareResources"
        calls = self.driver.log().count(prepare_call)
        slice_uid = self.published()["metadata"]["uid"]
        self.node.restart_kubelet()
        wait_for(lambda: self.driver.log().count(marker) > before, 60,
                 "the driver to register with the restarted kubelet", interval=0.3)
        self.node.wait_ready()
        # kubelet deletes its node's ResourceSlices when it starts. Told of the new
        # registration, the driver checks its slice every 2 s for a while and creates it
        # again; at its --resync of 300 s the node had no devices for up to 5 minutes.
        s = wait_for(self.published, 20, "the slice back after the kubelet restart",
                     interval=0.3)
        print("    slice %s by the restart" % (
            "recreated" if s["metadata"]["uid"] != slice_uid else "kept"))
        p = self.cp.get_pod(NS, "kubelet")
        self.assertEqual(p["status"]["phase"], "Running")
        self.assertEqual(p["status"]["containerStatuses"][0]["containerID"], cid)
        self.assertEqual(self.driver.checkpoint_uids(), [uid])
        # kubelet's own checkpoint knew the claim prepared: it did not ask again.
        self.assertEqual(self.driver.log().count(prepare_call), calls)
        self.delete_pod("kubelet")
        self.wait_unprepared(uid)

    # -- 7. MIG: partitions published, allocated without overlap, made on demand ------

    def test_07_mig_partitions_published(self):
        """The A100 in MIG mode: the real API server accepted its partitions (devices that
        consume counters) and its counter set, in slices of one pool generation; the
        whole A100 consumes every counter; the other GPUs consume none."""
        slices = wait_for(self.node_slices, 30, "the node's slices", interval=0.5)
        sets = [c for s in slices for c in s["spec"].get("sharedCounters") or []]
        self.assertEqual(len(sets), 1, sets)
        counters = sets[0]["counters"]
        self.assertEqual(sorted(counters), sorted(["compute-slices"] +
                                                  ["memory-slice-%d" % i for i in range(8)]))
        devs = [d for s in slices for d in s["spec"].get("devices") or []]
        for s in slices:  # a slice holds devices or counters, never both (validation)
            self.assertFalse(s["spec"].get("devices") and s["spec"].get("sharedCounters"))
        by_name = {d["name"]: d for d in devs}
        whole = by_name["gpu-%d" % A100["index"]]
        used = whole["consumesCounters"][0]["counters"]
        self.assertEqual(sorted(used), sorted(counters))
        for g in GPUS:
            self.assertNotIn("consumesCounters", by_name["gpu-%d" % g["index"]])
        mig = [d for d in devs if "mig" in d["attributes"]]
        ones = [d["attributes"]["migStart"]["int"] for d in mig
                if d["attributes"]["profile"]["string"] == "1g.5gb"]
        # kgpu's order: kube-scheduler takes the first free one, from the high slots down.
        self.assertEqual(ones, [6, 5, 4, 3, 2, 1, 0])
        profiles = {d["attributes"]["profile"]["string"] for d in mig}
        self.assertEqual(profiles, {"1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb",
                                    "7g.40gb"})

    def test_08_mig_profiles_share_a_gpu_never_overlapping(self):
        """Claims for 4g.20gb and 3g.20gb: the real kube-scheduler gives them partitions of
        the A100 whose memory slices do not overlap; kubelet prepares each, the driver
        makes the instance, and each container sees only its instance, as big as the
        profile. A claim for the whole A100 waits while they exist, and a 1g (no compute
        slice left) too; gone, the whole A100 is allocated and made one full instance."""
        self.assertEqual(self.mig_instances(), [])
        self.create_mig_claim("mig-4g", "4g.20gb")
        self.create_mig_claim("mig-3g", "3g.20gb")
        self.job("mig-4g", "mig-4g", ["run", "max", 120])
        self.job("mig-3g", "mig-3g", ["run", "max", 120])
        self.wait_holding("mig-4g")
        self.wait_holding("mig-3g")
        slices = {}
        for n in ("mig-4g", "mig-3g"):
            rs = self.claim(n)["status"]["allocation"]["devices"]["results"]
            self.assertEqual(len(rs), 1, rs)
            slices[n] = rs[0]["device"]
        self.assertEqual(slices, {"mig-4g": "gpu-2-mig-4g-20gb-0",
                                  "mig-3g": "gpu-2-mig-3g-20gb-4"})
        # NVML_GPU_INSTANCE_PROFILE_4_SLICE (3) and _3_SLICE (2), at memory slices 0 and 4.
        self.assertEqual(self.mig_instances(), [(0, 3), (4, 2)])
        uids = {n: self.claim(n)["metadata"]["uid"] for n in ("mig-4g", "mig-3g")}
        for n, mib in (("mig-4g", 19968), ("mig-3g", 19968)):
            mig = self.mig_uuid(uids[n])
            out = self.check_share(n, {"uuid": mig}, mib)
            self.assertEqual(out["env"][0], "NVIDIA_VISIBLE_DEVICES=" + mig)
        self.assertNotEqual(self.mig_uuid(uids["mig-4g"]), self.mig_uuid(uids["mig-3g"]))
        # No compute slice left for a 1g; the whole A100 is taken by its partitions.
        self.create_mig_claim("mig-1g", "1g.5gb")
        self.job("mig-1g", "mig-1g", ["show"])
        self.cp.admin.post(self.claim_path(), {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "whole-a100", "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER, "selectors": [{"cel": {"expression":
                    'device.attributes["%s"].uuid == "%s"' % (DRIVER, A100["uuid"])}}]}}]}}})
        self.claims.append("whole-a100")
        self.job("whole-a100", "whole-a100", ["run", "max"])
        self.wait_unschedulable("mig-1g")
        self.wait_unschedulable("whole-a100")
        self.assertFalse(self.claim("whole-a100").get("status", {}).get("allocation"))
        self.assertFalse(self.claim("mig-1g").get("status", {}).get("allocation"))
        # The partitions' pods and claims gone: their instances are destroyed, and the
        # whole A100 goes to its claim, as one instance of the full profile (7g.40gb).
        for n in ("mig-4g", "mig-3g", "mig-1g"):
            self.delete_pod(n)
            self.pods.remove(n)
        for n in ("mig-4g", "mig-3g"):
            self.wait_unprepared(uids[n])
        for n in ("mig-4g", "mig-3g", "mig-1g"):
            self.delete_claim(n)
            self.claims.remove(n)
        self.assertEqual(self.mig_instances(), [])
        self.wait_phase("whole-a100")
        rs = self.claim("whole-a100")["status"]["allocation"]["devices"]["results"]
        self.assertEqual([r["device"] for r in rs], ["gpu-2"])
        uid = self.claim("whole-a100")["metadata"]["uid"]
        self.wait_unprepared(uid)
        self.assertEqual(self.mig_instances(), [])

    def test_09_mig_instance_survives_driver_restart_and_reboot(self):
        """A 2g.10gb partition prepared, then the driver killed: restarted, it finds its
        instance (same UUID, same placement). Then the GPU's instances lost, as a node
        reboot loses them, and the driver restarted: it makes the instance again where
        the claim's allocation says. The pod's deletion destroys it."""
        self.create_mig_claim("mig-2g", "2g.10gb")
        self.job("mig-2g", "mig-2g", ["run", "max", 600])
        self.wait_holding("mig-2g")
        uid = self.claim("mig-2g")["metadata"]["uid"]
        dev = self.claim("mig-2g")["status"]["allocation"]["devices"]["results"][0]["device"]
        self.assertEqual(dev, "gpu-2-mig-2g-10gb-4")  # kgpu's order: the high slots first
        before = self.mig_instances()
        self.assertEqual(before, [(4, 1)])  # NVML_GPU_INSTANCE_PROFILE_2_SLICE
        mig = self.mig_uuid(uid)
        self.driver.kill()
        self.driver.start()
        self.assertEqual(self.mig_instances(), before)
        self.assertEqual(self.mig_uuid(uid), mig)
        self.assertEqual(self.driver.checkpoint_uids(), [uid])
        # A reboot: the fake NVML's instances gone; the driver restarted makes it again.
        os.unlink(self.node.mig_state)
        self.assertEqual(self.mig_instances(), [])
        self.driver.kill()
        self.driver.start()
        wait_for(lambda: self.mig_instances() == before, 30,
                 "the instance made again after the reboot", interval=0.3)
        self.assertIn(self.cdi_spec_of(uid), self.driver.cdi_specs())
        self.mig_uuid(uid)
        self.delete_pod("mig-2g")
        self.wait_unprepared(uid)
        self.assertEqual(self.mig_instances(), [])

    # -- 10. an unhealthy GPU: its devices tainted -------------------------------------

    def test_10_unhealthy_gpu_is_tainted(self):
        """An XID the driver counts as critical on the T4 (the fake NVML delivers 79, fallen
        off the bus): the driver keeps publishing the T4 but taints its device
        (DRADeviceTaints, GA in 1.37), and the real kube-scheduler allocates a new claim
        for the T4 nothing; the driver recreated without the XID, the taint is gone and
        the waiting claim is allocated."""
        try:
            self.driver.recreate(FAKE_NVML_XID="%d:79" % T4["index"])

            def tainted():
                s = self.published()
                t4 = [d for d in (s or {}).get("spec", {}).get("devices", [])
                      if d["attributes"]["uuid"]["string"] == T4["uuid"]]
                return t4[0] if t4 and t4[0].get("taints") else None
            dev = wait_for(tainted, 60, "the T4's device to be tainted", interval=0.5)
            self.assertEqual([t["effect"] for t in dev["taints"]], ["NoSchedule"], dev)
            self.assertFalse(any(d.get("taints") for d in self.published()["spec"]["devices"]
                                 if d["attributes"]["uuid"]["string"] != T4["uuid"]))
            self.create_claim("on-sick", "1Gi", model="Tesla T4")
            self.job("on-sick", "on-sick", ["show"])
            self.wait_unschedulable("on-sick")
            self.assertFalse(self.claim("on-sick").get("status", {}).get("allocation"))
        finally:
            self.driver.recreate()
        wait_for(lambda: not any(d.get("taints") for d in
                                 (self.published() or {"spec": {"devices": [{"taints": 1}]}})
                                 ["spec"]["devices"]), 60, "the taint to go", interval=0.5)
        self.wait_phase("on-sick")
        self.assertEqual([r["device"] for r in self.claim("on-sick")["status"]["allocation"]
                          ["devices"]["results"]], ["gpu-%d" % T4["index"]])


if __name__ == "__main__":
    raise SystemExit("run through tests/e2e/e2e.py (scripts/e2e.sh --suite dra)")
