"""The install suite: kgpu installed by `helm install` in its own-scheduler mode, as an
operator of a managed cluster would, with every part running as a real pod.

One control plane with kube-controller-manager (Deployments, DaemonSets, EndpointSlices,
namespaces, garbage collection) and one real node (node.Node: kubelet, containerd, runc,
the bridge CNI with the bridge as the pods' gateway) with kube-proxy in nftables mode,
so that pods reach the API server at 10.96.0.1 and kgpu's scheduler reaches the
extender's Service. The cluster's own kube-scheduler runs too, unchanged: it places
the pods that ask for no GPU. The images are kgpu's (scripts/image.sh, as users build
it) and the upstream kube-scheduler's at the cluster's version, made here from the
binary scripts/upstream.sh built. Nothing is run outside a pod except the components
a managed cluster provides.

There is no cluster DNS here (CoreDNS is not one of the components this project
builds): the install pins the extender Service's cluster IP and names it in
kube-scheduler's urlPrefix (extender.service.clusterIP, scheduler.urlPrefix), as
docs/install.md says for clusters without DNS. The extender's certificates are made
as the operator makes them (kgpu_deploy.ExtenderTls), put in the two Secrets the chart
names, right after `helm install` (its pods wait for them).

Tests run in order: install and route (printing the time from `helm install` to the
first shared pod Running), upgrade without losing a bound share, uninstall leaving
only the GPUQueue CRD.
"""

import base64
import http.client
import json
import os
import subprocess
import time
import unittest

import cluster
import kgpu_deploy
import node as nodemod
import node_images
from cluster import E2E_NS, MEM, pod_object, wait_for
from node_images import CTX_MIB, OOM, first_int, parse_job

CONFIG = {}  # filled by e2e.py: bin dir, build dir, work dir

GPUS = [{"uuid": "GPU-1a570000-0000-4000-8000-000000000000", "model": "NVIDIA A100-SXM4-40GB",
         "memory_mib": 16384},
        {"uuid": "GPU-1a570000-0000-4000-8000-000000000001", "model": "NVIDIA A100-SXM4-40GB",
         "memory_mib": 16384}]
RELEASE = "kgpu"
EXT_NS, DP_NS = kgpu_deploy.NS, kgpu_deploy.DP_NS
SERVICE_IP = "10.96.200.200"  # in the control plane's 10.96.0.0/16
OWN = "kgpu-scheduler"
K8S_VERSION = "v1.37.2"  # scripts/upstream.sh's K8S_VERSION: the chart's default image tag


def cannot_run_reason(bindir):
    reason = nodemod.cannot_run_reason(bindir)
    if reason:
        return reason
    for tool in ("kube-controller-manager", "kube-proxy", "helm"):
        if not os.path.exists(os.path.join(bindir, tool)):
            return "%s is not built (scripts/upstream.sh)" % tool
    if subprocess.run(["nft", "list", "tables"], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode != 0:
        return "nft does not answer (kube-proxy's nftables mode needs it)"
    if not os.path.exists("/proc/sys/net/bridge/bridge-nf-call-iptables"):
        return "no br_netfilter (kube-proxy needs bridged replies to pass netfilter)"
    return None


class InstallSuite(unittest.TestCase):
    cp = node = None

    @classmethod
    def setUpClass(cls):
        reason = cannot_run_reason(CONFIG["bin"])
        if reason:
            nodemod.cannot_run("this machine cannot run the install suite: " + reason)
        cls.cp = cluster.ControlPlane(CONFIG["work"], CONFIG["bin"]).start(reachable=True)
        try:
            cls._bring_up()
        except BaseException:
            cls._tear_down()
            raise

    @classmethod
    def _bring_up(cls):
        cp, build = cls.cp, CONFIG["build"]
        cp.start_controller_manager()
        # The cluster's own kube-scheduler, as shipped: no extender.
        cp.start_scheduler("apiVersion: kubescheduler.config.k8s.io/v1\n"
                           "kind: KubeSchedulerConfiguration\n"
                           "clientConnection:\n  kubeconfig: x\n"
                           "leaderElection:\n  leaderElect: false\n")
        sched_image = node_images.kube_scheduler_image(
            cp.p("images"), cp.tool("kube-scheduler"), K8S_VERSION)
        cls.node = nodemod.Node(cp, cp.p("node"), build, gpus=GPUS, gateway=True,
                                labels={"kgpu.io/gpu-node": "true"})
        cls.node.start(preloaded=[os.path.join(build, "libkgpu-limit.so"),
                                  cls.node.fake_cuda, cls.node.fake_nvml], kgpu_image=True,
                       extra_images=[sched_image])
        for name, path in cls.node.images:
            if name in (node_images.KGPU_IMAGE, sched_image[0]):
                print("image %s: %.1f MB (docker-archive)" % (name, os.path.getsize(path) / 1e6))
        # After the node registered: kube-proxy reads its Node's addresses at start.
        cp.start_proxy(cls.node.name, nodemod.POD_SUBNET)
        cls.tls = kgpu_deploy.ExtenderTls(cp)
        cls.state = cp.p("kgpu-state")
        cls.gpus_file = cp.p("fake-gpus.yaml")
        with open(cls.gpus_file, "w") as f:
            f.write(kgpu_deploy.fake_gpus_yaml(GPUS))

    @classmethod
    def tearDownClass(cls):
        cls._tear_down()

    @classmethod
    def _tear_down(cls):
        if cls.cp is not None and getattr(cls, "installed", False):
            cls.helm("uninstall", RELEASE, "--wait", "--timeout", "120s", check=False)
        for name in ("cpu", "share-a", "share-b"):
            if cls.cp is not None:
                cls.cp.admin.delete(cluster.pod_path(E2E_NS, name), grace=0)
        for part in (cls.node, cls.cp):
            if part is not None:
                part.stop()
        if cls.cp is not None:
            cls.cp.stop_proxy()

    # -- helpers ----------------------------------------------------------------

    @classmethod
    def helm(cls, *args, check=True, timeout=300):
        argv = [cls.cp.tool("helm"), "--kubeconfig", cls.cp.admin_kubeconfig,
                "--namespace", "default"] + list(args)
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, env=dict(os.environ, HELM_CACHE_HOME=cls.cp.p("helm"),
                                                     HELM_CONFIG_HOME=cls.cp.p("helm"),
                                                     HELM_DATA_HOME=cls.cp.p("helm")))
        if check and r.returncode != 0:
            raise AssertionError("helm %s: exit %d\n%s" % (" ".join(args), r.returncode,
                                                           r.stdout[-4000:]))
        return r.stdout

    @classmethod
    def values(cls):
        return ["--set", "ownScheduler.enabled=true",
                "--set", "ownScheduler.tlsSecretName=kgpu-scheduler-tls",
                "--set", "ownScheduler.replicas=1",
                "--set", "extender.replicas=1",
                "--set", "extender.service.clusterIP=" + SERVICE_IP,
                "--set", "scheduler.urlPrefix=https://%s:12346" % SERVICE_IP,
                "--set", "devicePlugin.args.stateDir=" + cls.state,
                "--set-file", "devicePlugin.args.fakeGpus=" + cls.gpus_file]

    @classmethod
    def create_secrets(cls):
        """The operator's part: the extender's serving certificate with its CA, and the
        scheduler's client certificate with the same CA, as Secrets in kgpu-system."""
        def b64(path):
            with open(path, "rb") as f:
                return base64.b64encode(f.read()).decode()
        t = cls.tls
        for name, crt, key in (("kgpu-extender-tls", t.server_crt, t.server_key),
                               ("kgpu-scheduler-tls", t.scheduler_crt, t.scheduler_key)):
            cls.cp.admin.post("/api/v1/namespaces/%s/secrets" % EXT_NS, {
                "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": name, "namespace": EXT_NS},
                "data": {"tls.crt": b64(crt), "tls.key": b64(key), "ca.crt": b64(t.ca)}})

    def pods_of(self, ns, selector):
        q = "/api/v1/namespaces/%s/pods?labelSelector=%s" % (ns, selector)
        return self.cp.admin.get(q)["items"]

    def ready(self, pod):
        conds = pod.get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    def wait_ready(self, ns, selector, what, timeout=180):
        def ok():
            pods = self.pods_of(ns, selector)
            return pods and all(self.ready(p) and not p["metadata"].get("deletionTimestamp")
                                for p in pods)
        try:
            wait_for(ok, timeout, what, interval=0.5)
        except AssertionError:
            raise AssertionError("%s:\n%s\n%s" % (what, self.describe(ns), self.logs(ns)))
        return self.pods_of(ns, selector)

    def describe(self, ns):
        pods = self.cp.admin.get("/api/v1/namespaces/%s/pods" % ns)["items"]
        return "\n".join("%s %s %s" % (p["metadata"]["name"], p["status"].get("phase"),
                                       json.dumps(p["status"].get("containerStatuses"))[:800])
                         for p in pods)

    def logs(self, ns):
        out = []
        for p in self.cp.admin.get("/api/v1/namespaces/%s/pods" % ns)["items"]:
            for c in p["spec"]["containers"]:
                st, text = self.cp.admin.raw("GET", "/api/v1/namespaces/%s/pods/%s/log?"
                                             "container=%s&tailLines=30"
                                             % (ns, p["metadata"]["name"], c["name"]))
                out.append("--- %s/%s:\n%s" % (p["metadata"]["name"], c["name"],
                                               text.decode("utf-8", "replace")))
        return "\n".join(out)

    def held(self):
        """{gpu index: MiB} the extender holds on the node, asked as an operator's tool
        would, through its Service's cluster IP (kube-proxy), with a client certificate."""
        ctx = self.tls.context()
        ctx.check_hostname = False  # dialled by the Service's IP; the CA is still checked
        c = http.client.HTTPSConnection(SERVICE_IP, 12346, context=ctx, timeout=10)
        c.request("GET", "/inspect")
        r = c.getresponse()
        body = r.read()
        self.assertEqual(r.status, 200, body[:500])
        return {g["index"]: g["memory_allocated_mib"] for n in json.loads(body)["nodes"]
                if n["name"] == self.node.name for g in n["gpus"] if g["memory_allocated_mib"]}

    def job(self, name, mem, args):
        """A pod with no schedulerName asking `mem` units of GPU memory."""
        pod = pod_object(name, [("main", {MEM: mem})])
        c = pod["spec"]["containers"][0]
        c.update(image=node_images.JOB_IMAGE, imagePullPolicy="Never",
                 command=["/bin/gpu_job"] + [str(a) for a in args])
        pod["spec"]["restartPolicy"] = "Never"
        return self.cp.create_pod(pod)

    def wait_phase(self, name, phases, timeout=120):
        return self.cp.wait_phase(E2E_NS, name, phases, timeout)

    def scheduled_by(self, name):
        """Who placed pod `name`: the reporting component of its Scheduled events."""
        return [e.get("reportingComponent") or e.get("source", {}).get("component")
                for e in self.cp.events_for(E2E_NS, name) if e["reason"] == "Scheduled"]

    def gpu_of(self, name):
        ann = self.cp.get_pod(E2E_NS, name)["metadata"].get("annotations") or {}
        self.assertIn("kgpu.io/assignment", ann)
        gpus = [g for part in json.loads(ann["kgpu.io/assignment"]) for g in part["gpus"]]
        self.assertEqual(len(gpus), 1, gpus)
        return gpus[0]

    # -- 1. install ---------------------------------------------------------------

    def test_01_install_routes_gpu_pods_to_kgpus_scheduler(self):
        cp = self.cp
        cp.ensure_namespace(E2E_NS)
        t0 = time.monotonic()
        self.helm("install", RELEASE, os.path.join(cluster.REPO, "deploy", "helm", "kgpu"),
                  *self.values())
        type(self).installed = True
        self.create_secrets()
        self.wait_ready(EXT_NS, "app.kubernetes.io/name=kgpu-extender", "the extender Ready")
        self.wait_ready(EXT_NS, "app.kubernetes.io/name=" + OWN, "kgpu's scheduler Ready")
        self.wait_ready(DP_NS, "app.kubernetes.io/name=kgpu-device-plugin",
                        "the device plugin Ready")
        wait_for(lambda: cp.admin.get("/api/v1/nodes/" + self.node.name)["status"]
                 .get("allocatable", {}).get(MEM) == "32", 90, "the node's GPU memory")
        # A GPU pod that names no scheduler: routed to kgpu's, placed, and inside its share.
        self.job("share-a", 4, ["run", "max"])
        pod = cp.get_pod(E2E_NS, "share-a")
        self.assertEqual(pod["spec"]["schedulerName"], OWN)
        self.wait_phase("share-a", ("Succeeded",))
        elapsed = time.monotonic() - t0
        pod = cp.get_pod(E2E_NS, "share-a")
        self.assertEqual(pod["spec"]["nodeName"], self.node.name)
        g = self.gpu_of("share-a")
        self.assertEqual(g["memory_mib"], 4096)
        out = parse_job(self.node.logs(E2E_NS, "share-a"))
        self.assertIn("KGPU_MEMORY_LIMIT_MIB=4096", out["env"])
        self.assertEqual(out["alloc_within"], ["0 mib %d" % (4096 - CTX_MIB)])
        self.assertEqual(first_int(out["alloc_past"]), OOM, "one MiB past the share was given")
        self.assertEqual(self.scheduled_by("share-a"), [OWN])
        print("    helm install to the first shared pod done: %.1f s" % elapsed)
        # A pod without a GPU keeps the cluster's scheduler.
        cpu = pod_object("cpu", [("main", {})])
        cpu["spec"]["containers"][0].update(image=node_images.JOB_IMAGE,
                                            imagePullPolicy="Never",
                                            command=["/bin/gpu_job", "env"])
        cpu["spec"]["restartPolicy"] = "Never"
        cp.create_pod(cpu)
        self.assertEqual(cp.get_pod(E2E_NS, "cpu")["spec"]["schedulerName"],
                         "default-scheduler")
        self.wait_phase("cpu", ("Succeeded", "Failed"))
        self.assertEqual(self.scheduled_by("cpu"), ["default-scheduler"])

    # -- 2. upgrade -----------------------------------------------------------------

    def test_02_upgrade_keeps_bound_shares(self):
        cp = self.cp
        if not getattr(self, "installed", False):
            self.skipTest("not installed")
        self.job("share-b", 12, ["run", "max", 600])  # holds 12 of a GPU's 16 units
        self.wait_phase("share-b", ("Running",))
        held = self.gpu_of("share-b")["index"]
        before = {p["metadata"]["name"] for p in
                  self.pods_of(EXT_NS, "app.kubernetes.io/name=kgpu-extender")}
        self.helm("upgrade", RELEASE, os.path.join(cluster.REPO, "deploy", "helm", "kgpu"),
                  *(self.values() + ["--set", "extender.config.logLevel=debug"]))
        wait_for(lambda: {p["metadata"]["name"] for p in self.pods_of(
            EXT_NS, "app.kubernetes.io/name=kgpu-extender")}.isdisjoint(before), 120,
            "the extender's pods to be replaced", interval=0.5)
        self.wait_ready(EXT_NS, "app.kubernetes.io/name=kgpu-extender", "the new extender")
        self.assertEqual(cp.get_pod(E2E_NS, "share-b")["status"]["phase"], "Running")
        # The new extender read share-b's share back from the cluster.
        wait_for(lambda: self.held() == {held: 12288}, 30, "the new extender to hold share-b")
        # The new extender knows share-b's 12 units: 12 more fit only on the other GPU.
        cp.admin.delete(cluster.pod_path(E2E_NS, "share-a"), grace=0)
        self.job("share-a", 12, ["run", "max"])
        self.wait_phase("share-a", ("Succeeded",))
        self.assertNotEqual(self.gpu_of("share-a")["index"], held,
                            "after the upgrade a share was placed over share-b's")

    # -- 3. uninstall ---------------------------------------------------------------

    def test_03_uninstall_leaves_only_the_crd(self):
        cp = self.cp
        if not getattr(self, "installed", False):
            self.skipTest("not installed")
        for name in ("share-a", "share-b", "cpu"):
            cp.admin.delete(cluster.pod_path(E2E_NS, name), grace=0)
        self.helm("uninstall", RELEASE, "--wait", "--timeout", "180s")
        type(self).installed = False
        for ns in (EXT_NS, DP_NS):
            wait_for(lambda ns=ns: cp.admin.try_get("/api/v1/namespaces/" + ns) is None, 180,
                     "namespace %s to go" % ns, interval=0.5)
        left = []
        for path in ("/apis/rbac.authorization.k8s.io/v1/clusterroles",
                     "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                     "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies",
                     "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings",
                     "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                     "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
                     "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                     "/apis/scheduling.k8s.io/v1/priorityclasses"):
            for o in cp.admin.get(path + "?labelSelector=app.kubernetes.io/instance="
                                  + RELEASE)["items"]:
                left.append("%s %s" % (path.rsplit("/", 1)[1], o["metadata"]["name"]))
        self.assertEqual(left, ["customresourcedefinitions gpuqueues.kgpu.io"])
        # A GPU pod created now is not routed: no policy is left to do it.
        self.job("share-b", 1, ["env"])
        self.assertEqual(cp.get_pod(E2E_NS, "share-b")["spec"]["schedulerName"],
                         "default-scheduler")
