"""The control-plane suite: kgpu-extender under the real kube-apiserver and kube-scheduler.

One control plane for the whole suite (setUpClass); tests run in order and
each leaves the cluster as it found it (its pods deleted), so they can also
be run one at a time (`scripts/e2e.sh --suite control-plane -k preempt`).
Nodes have no kubelet: they are Node objects with the capacity and the
kgpu.io/gpus annotation that kubelet and kgpu's device plugin would write.
"""

import base64
import http.client
import json
import os
import re
import socket
import subprocess
import threading
import time
import unittest
import urllib.parse

import cluster
import harness
import kgpu_deploy
from cluster import CORE, COUNT, E2E_NS, MEM, WHOLE, node_object, pod_object, wait_for

A100, T4, V100 = "NVIDIA A100-SXM4-80GB", "Tesla T4", "Tesla V100-SXM2-16GB"
NODES = {  # name: (model, GPUs, MiB each, NUMA of each)
    "gpu-a100-0": (A100, 4, 81920, [0, 0, 1, 1]),
    "gpu-a100-1": (A100, 4, 81920, [0, 0, 1, 1]),
    "gpu-t4-0": (T4, 4, 15360, [0, 0, 1, 1]),
    "gpu-v100-0": (V100, 2, 16384, [0, 0]),
}
GQ = "/apis/kgpu.io/v1alpha1/gpuqueues"
QLABEL = "kgpu.io/queue"
CONFIG = {}  # filled by e2e.py: bin dir, build dir, work dir
# Impersonation headers for the admin: kgpu's extender by name, with the admin's rights.
AS_KGPU = {"Impersonate-User": "system:serviceaccount:kgpu-system:kgpu-extender",
           "Impersonate-Group": "system:masters"}


def annotations(obj):
    return (obj.get("metadata") or {}).get("annotations") or {}


class ControlPlaneSuite(unittest.TestCase):
    cp = None

    @classmethod
    def setUpClass(cls):
        cls.cp = cluster.ControlPlane(CONFIG["work"], CONFIG["bin"]).start()
        try:
            cls._bring_up()
        except BaseException:
            cls.cp.stop()
            raise

    @classmethod
    def _bring_up(cls):
        cp = cls.cp
        cls.sched_config, ext_config = kgpu_deploy.install(cp, CONFIG["build"], values=[
            # No kubelet and no device plugin run in this suite, so no pod is ever marked
            # kgpu.io/allocated: turn off the wait that holds back same-size pods until then.
            "extender.config.allocateWaitSeconds=0",
            # DRA pods run here (the driver apart from the chart): their queue's limits
            # hold before allocation only with filter-gpuless.
            "scheduler.filterDraPods=true",
            # Consolidation on: only pods annotated kgpu.io/restartable move (test_20).
            "extender.config.consolidateMoves=1",
            # The scale-down guard every 2 s rather than 30 (test_21).
            "extender.config.scaleDownGuardSeconds=2",
        ])
        cls.ext_config = ext_config
        cp.ensure_namespace(E2E_NS)
        for prio, value in (("kgpu-e2e-low", 100), ("kgpu-e2e-high", 100000)):
            cp.admin.post("/apis/scheduling.k8s.io/v1/priorityclasses",
                          {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                           "metadata": {"name": prio}, "value": value})
        cls.inventory = {}
        for name, (model, n, mib, numa) in NODES.items():
            node = node_object(name, model, n, mib, numa)
            cls.inventory[name] = json.loads(node["metadata"]["annotations"]["kgpu.io/gpus"])
            cp.add_node(node)
        cls.ext = kgpu_deploy.Extender(cp, CONFIG["build"], ext_config, name="kgpu-extender-a")
        cls.ext.start()
        wait_for(cls.ext.ready, 60, "the extender's /readyz")
        cls.vip = kgpu_deploy.ServiceVip(cp, [cls.ext], publish_ip=cluster.host_ip())
        cls.vip.wait_ready(cls.ext)
        cp.start_scheduler(cls.sched_config, extender_url=cls.vip.url)

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "vip", None):
            cls.vip.stop()
        if cls.cp:
            cls.cp.stop()

    def setUp(self):
        self.created = []
        self.cleanups = []  # API paths to delete after the pods, in order

    def tearDown(self):
        for ns, name in self.created:
            self.cp.delete_pod(ns, name)
        for ns, name in self.created:
            wait_for(lambda ns=ns, name=name: self.cp.get_pod(ns, name) is None, 30,
                     "pod %s/%s to go" % (ns, name))
        for path in self.cleanups:
            self.cp.admin.delete(path)
        for path in self.cleanups:
            wait_for(lambda path=path: self.cp.admin.try_get(path) is None, 30,
                     "%s to go" % path)
        for e in [self.ext] + list(getattr(self, "more_extenders", [])):
            report = e.sanitizer_report()
            self.assertIsNone(report, "%s: sanitizer report:\n%s" % (e.name, report))

    # -- helpers ------------------------------------------------------------

    def create(self, name, containers, **kw):
        pod = pod_object(name, containers, **kw)
        self.cp.create_pod(pod)
        self.created.append((pod["metadata"]["namespace"], name))
        return pod

    def wait_bound(self, name, ns=E2E_NS, timeout=60):
        def bound():
            p = self.cp.get_pod(ns, name)
            return p if p and p["spec"].get("nodeName") else None
        try:
            return wait_for(bound, timeout, "pod %s/%s to be bound" % (ns, name))
        except AssertionError:
            raise AssertionError("pod %s/%s not bound; events: %s\nscheduler log:\n%s" % (
                ns, name, [e.get("message") for e in self.cp.events_for(ns, name)],
                self.cp.scheduler.log_tail(30)))

    def assignment(self, pod):
        ann = annotations(pod)
        self.assertIn("kgpu.io/assignment", ann, "bound without kgpu's assignment: %r" % ann)
        return json.loads(ann["kgpu.io/assignment"])

    def gpus_of(self, pod):
        """[(container, gpu index, uuid, memory MiB, milli)] of a bound pod's assignment."""
        out = []
        node = pod["spec"]["nodeName"]
        uuids = {g["index"]: g["uuid"] for g in self.inventory[node]}
        for part in self.assignment(pod):
            for g in part["gpus"]:
                self.assertEqual(g["uuid"], uuids.get(g["index"]),
                                 "assignment names a GPU %r that %s does not have" % (g, node))
                out.append((part["container"], g["index"], g["uuid"], g["memory_mib"],
                            g["milli"]))
        return out

    def truth(self):
        """{(node, gpu index): (memory MiB, milli)} from every bound pod's annotation."""
        return harness.held_by_assignments(self.cp.admin.list_all("/api/v1/pods"))

    def overbooked(self, held):
        bad = []
        for (node, index), (mem, milli) in held.items():
            caps = [g for g in self.inventory.get(node, []) if g["index"] == index]
            if not caps:
                bad.append((node, index, "no such GPU"))
            elif mem > caps[0]["memory_mib"] or milli > 1000:
                bad.append((node, index, mem, milli))
        return bad

    def assert_state_matches(self, ext=None, timeout=15):
        """/inspect equals what the API server's pods say; no GPU past its capacity."""
        ext = ext or self.ext
        last = {}

        def same():
            last["held"], last["truth"] = ext.held(), self.truth()
            return last["held"] == last["truth"]
        try:
            wait_for(same, timeout, "/inspect to equal the pods' assignments", interval=0.2)
        except AssertionError:
            self.assertEqual(last.get("held"), last.get("truth"),
                             "%s /inspect (first) differs from the API server (second)" % ext.name)
        self.assertEqual(self.overbooked(last["truth"]), [])
        return last["truth"]

    def failed_scheduling(self, name, ns=E2E_NS, timeout=60):
        def event():
            for e in self.cp.events_for(ns, name):
                if e.get("reason") == "FailedScheduling":
                    return e["message"]
            return None
        return wait_for(event, timeout, "a FailedScheduling event for %s" % name, interval=0.2)

    # -- 1. every kind of GPU request, bound by kube-scheduler through kgpu -----

    def test_1_requests_bound_through_kgpu(self):
        cases = {
            # name: (containers, annotations, check(pod, gpus))
            "whole-2": ([("main", {WHOLE: 2})], None,
                        lambda node, g: [x[4] for x in g] == [1000, 1000]),
            "mem-8": ([("main", {MEM: 8})], None,
                      lambda node, g: [x[3] for x in g] == [8192]),
            "core-30": ([("main", {MEM: 2, CORE: 30})], None,
                        lambda node, g: [(x[3], x[4]) for x in g] == [(2048, 300)]),
            "mem-6-over-3": ([("main", {MEM: 6, COUNT: 3})], None,
                             lambda node, g: sorted(x[3] for x in g) == [2048] * 3 and
                             len({x[1] for x in g}) == 3),
            "t4-only": ([("main", {MEM: 4})], {"kgpu.io/gpu-type": "Tesla T4*"},
                        lambda node, g: NODES[node][0] == T4),
            "no-a100": ([("main", {MEM: 4})], {"kgpu.io/gpu-type-exclude": "*A100*"},
                        lambda node, g: NODES[node][0] != A100),
            "multi": ([("a", {MEM: 3}), ("b", {WHOLE: 1}), ("c", {MEM: 2, CORE: 20})], None,
                      lambda node, g: {x[0] for x in g} == {"a", "b", "c"}),
        }
        for name, (containers, ann, _) in cases.items():
            self.create(name, containers, annotations=ann)
        for name, (containers, ann, check) in cases.items():
            pod = self.wait_bound(name)
            node = pod["spec"]["nodeName"]
            gpus = self.gpus_of(pod)
            self.assertTrue(check(node, gpus), "%s on %s got %r" % (name, node, gpus))
            self.assertEqual(annotations(pod).get("kgpu.io/node", node), node)
        self.assert_state_matches()

    # -- 2. a pod that fits nowhere, and an invalid one: kgpu's reason in the event -----

    def test_2_unschedulable_reason_reaches_events(self):
        self.create("too-big", [("main", {MEM: 100})])
        msg = self.failed_scheduling("too-big")
        # Ask the extender for its own reasons for this pod on these nodes.
        pod = self.cp.get_pod(E2E_NS, "too-big")
        st, ans = self.ext.post("/filter", {"Pod": pod, "NodeNames": sorted(NODES)})
        self.assertEqual(st, 200)
        reasons = set((ans.get("FailedNodes") or {}).values()) | set(
            (ans.get("FailedAndUnresolvableNodes") or {}).values())
        self.assertTrue(reasons, ans)
        self.assertTrue(any(r in msg for r in reasons),
                        "event %r carries none of kgpu's reasons %r" % (msg, reasons))
        self.assertIsNone(self.cp.get_pod(E2E_NS, "too-big")["spec"].get("nodeName"))

        self.create("invalid", [("main", {MEM: 2, CORE: 150})])
        msg = self.failed_scheduling("invalid")
        self.assertRegex(msg, r"(?i)gpu-core|150", "the invalid request's reason: %r" % msg)
        self.assertNotIn("code 400", msg)

    # -- 3. preemption through kube-scheduler with kgpu's preempt verb -----------

    def test_3_preemption_frees_the_gpus_the_preemptor_needs(self):
        v100 = ("kgpu.io/gpu-type", "Tesla V100*")
        low = []
        for i in range(2):
            name = "low-%d" % i
            self.create(name, [("main", {MEM: 12})], annotations=dict([v100]),
                        priority_class="kgpu-e2e-low")
            low.append(name)
        held = {n: self.gpus_of(self.wait_bound(n))[0][1] for n in low}
        self.assertEqual(sorted(held.values()), [0, 1], "one 12 GiB pod per 16 GiB V100")
        preempt_calls = self.ext.metric("kgpu_extender_requests_total", 'verb="preempt"')
        self.create("high", [("main", {MEM: 10})], annotations=dict([v100]),
                    priority_class="kgpu-e2e-high")
        pod = self.wait_bound("high", timeout=90)
        self.assertEqual(pod["spec"]["nodeName"], "gpu-v100-0")
        gone = [n for n in low if self.cp.get_pod(E2E_NS, n) is None]
        self.assertEqual(len(gone), 1, "exactly one victim: %r" % gone)
        got = self.gpus_of(pod)[0][1]
        self.assertEqual(got, held[gone[0]], "bound on the GPU its victim freed")
        self.assertGreater(self.ext.metric("kgpu_extender_requests_total", 'verb="preempt"'),
                           preempt_calls, "kube-scheduler never called kgpu's preempt verb")
        self.assert_state_matches()

    # -- 4. deletes free GPUs; nodes added, relabelled, re-annotated, removed -----

    def test_4_deletes_and_node_changes_are_followed(self):
        self.create("held", [("main", {MEM: 40})])
        pod = self.wait_bound("held")
        node, idx = pod["spec"]["nodeName"], self.gpus_of(pod)[0][1]
        self.assertIn((node, idx), self.assert_state_matches())
        self.cp.delete_pod(E2E_NS, "held")
        wait_for(lambda: (node, idx) not in self.ext.held(), 15, "the GPU to be freed")

        # A node joins with a model nobody else has; a pod asking for it lands there.
        h100 = node_object("gpu-h100-0", "NVIDIA H100 80GB HBM3", 8, 81559)
        self.inventory["gpu-h100-0"] = json.loads(h100["metadata"]["annotations"]["kgpu.io/gpus"])
        self.cp.add_node(h100)
        wait_for(lambda: any(n["name"] == "gpu-h100-0" for n in self.ext.inspect()["nodes"]), 15,
                 "the new node in /inspect")
        self.create("on-h100", [("main", {MEM: 8})], annotations={"kgpu.io/gpu-type": "*H100*"})
        self.assertEqual(self.wait_bound("on-h100")["spec"]["nodeName"], "gpu-h100-0")

        # Relabelled: kube-scheduler's own nodeSelector and kgpu agree on the new label.
        self.cp.admin.merge_patch("/api/v1/nodes/gpu-h100-0",
                                  {"metadata": {"labels": {"pool": "e2e-h100"}}})
        pod = pod_object("by-label", [("main", {MEM: 4})])
        pod["spec"]["nodeSelector"] = {"pool": "e2e-h100"}
        self.cp.create_pod(pod)
        self.created.append((E2E_NS, "by-label"))
        self.assertEqual(self.wait_bound("by-label")["spec"]["nodeName"], "gpu-h100-0")

        # Re-annotated: GPUs 0-6 turn unhealthy; the next pod must use GPU 7.
        gpus = self.inventory["gpu-h100-0"]
        changed = [dict(g, healthy=(g["index"] == 7)) for g in gpus]
        used = {x[1] for n in ("on-h100", "by-label")
                for x in self.gpus_of(self.cp.get_pod(E2E_NS, n))}
        self.cp.admin.merge_patch("/api/v1/nodes/gpu-h100-0", {"metadata": {"annotations": {
            "kgpu.io/gpus": json.dumps(changed, separators=(",", ":"))}}})
        wait_for(lambda: [g["healthy"] for n in self.ext.inspect()["nodes"]
                          if n["name"] == "gpu-h100-0" for g in n["gpus"]] ==
                 [g["index"] == 7 for g in gpus], 15, "the health change in /inspect")
        self.create("healthy-only", [("main", {MEM: 30})],
                    annotations={"kgpu.io/gpu-type": "*H100*"})
        pod = self.wait_bound("healthy-only")
        self.assertEqual(pod["spec"]["nodeName"], "gpu-h100-0")
        self.assertEqual([x[1] for x in self.gpus_of(pod)], [7], "used: %r" % used)

        # Removed: the node leaves the extender's inventory; its pods go with it.
        for n in ("on-h100", "by-label", "healthy-only"):
            self.cp.delete_pod(E2E_NS, n)
        self.cp.admin.delete("/api/v1/nodes/gpu-h100-0")
        del self.inventory["gpu-h100-0"]
        wait_for(lambda: all(n["name"] != "gpu-h100-0" for n in self.ext.inspect()["nodes"]),
                 15, "the node to leave /inspect")
        self.create("h100-gone", [("main", {MEM: 8})], annotations={"kgpu.io/gpu-type": "*H100*"})
        self.failed_scheduling("h100-gone")
        self.assert_state_matches()

    # -- 5. kill -9 with binds in flight; the restarted extender equals the truth -----

    def test_5_restart_with_binds_in_flight(self):
        names = ["burst-%02d" % i for i in range(24)]
        stop = threading.Event()

        def create_all():
            for i, n in enumerate(names):
                if stop.is_set():
                    return
                self.create(n, [("main", {MEM: 1 + i % 5, CORE: 5})])
        t = threading.Thread(target=create_all)
        t.start()
        wait_for(lambda: self.ext.metric("kgpu_extender_requests_total", 'verb="bind"') >= 4,
                 60, "binds under way")
        self.ext.kill()
        time.sleep(0.5)
        self.ext.start()
        t.join()
        for n in names:
            self.wait_bound(n, timeout=120)
        truth = self.assert_state_matches()
        self.assertTrue(truth)

    # -- 6. two replicas, leader election on a real Lease -------------------------

    def test_6_leader_election_handover(self):
        self.ext.kill()
        a = kgpu_deploy.Extender(self.cp, CONFIG["build"], self.ext_config,
                                 name="kgpu-extender-ha-a", leader_elect=True)
        b = kgpu_deploy.Extender(self.cp, CONFIG["build"], self.ext_config,
                                 name="kgpu-extender-ha-b", leader_elect=True)
        self.more_extenders = [a, b]
        try:
            self._handover(a, b)
        finally:
            # Whatever happened: back to one replica without leader election for what follows.
            for e in (a, b):
                if e.child is not None:
                    e.stop()
            self.ext.start()
            wait_for(self.ext.ready, 60, "the single extender ready again")
            self.vip.set_replicas([self.ext])
            self.more_extenders = []

    def _handover(self, a, b):
        a.start()
        b.start()
        self.vip.set_replicas([a, b])
        lease_path = "/apis/coordination.k8s.io/v1/namespaces/kgpu-system/leases/kgpu-extender"

        def holder():
            lease = self.cp.admin.try_get(lease_path)
            who = lease and lease["spec"].get("holderIdentity") or ""
            # The identity is POD_NAME, made unique per process with "_<pid>".
            return who.split("_")[0]
        leader_name = wait_for(holder, 60, "a lease holder")
        self.assertIn(leader_name, (a.name, b.name))
        leader, standby = (a, b) if leader_name == a.name else (b, a)
        wait_for(leader.ready, 30, "the leader to be ready")
        self.assertFalse(standby.ready(), "the standby must not be ready (no Service traffic)")
        self.vip.wait_ready(leader)

        names = ["ha-%02d" % i for i in range(8)]
        for n in names[:4]:
            self.create(n, [("main", {MEM: 3})])
        for n in names[:4]:
            self.wait_bound(n)
        # Only the leader bound them: kube-scheduler's calls reach the ready replica alone.
        self.assertEqual(standby.metric("kgpu_extender_requests_total", 'verb="bind"'), 0)
        self.assertGreaterEqual(leader.metric("kgpu_extender_requests_total", 'verb="bind"'), 4)
        # And a bind sent to the standby anyway is refused, not performed.
        st, ans = standby.post("/bind", {"PodName": "x", "PodNamespace": E2E_NS, "PodUID": "u",
                                         "Node": "gpu-t4-0"})
        self.assertEqual(st, 200)
        self.assertTrue(ans.get("Error"), "a standby must refuse binds: %r" % ans)
        self.assert_state_matches(ext=standby)  # the standby's state is current too

        t0 = time.monotonic()
        leader.kill()
        for n in names[4:]:
            self.create(n, [("main", {MEM: 3})])
        wait_for(lambda: holder() == standby.name, 60, "the standby to take the lease",
                 interval=0.1)
        took = time.monotonic() - t0
        for n in names[4:]:
            self.wait_bound(n, timeout=90)
        print("lease handover after kill -9 of the leader: %.1f s" % took)
        self.assertLess(took, 15 + 2 + 3, "handover took %.1f s (lease 15 s)" % took)
        self.assert_state_matches(ext=standby)
        # The old leader comes back as the standby: current, not ready, not binding.
        leader.start()
        wait_for(lambda: leader.held() == standby.held(), 30, "the old leader's state")
        self.assertEqual(holder(), standby.name)
        self.assertFalse(leader.ready())

    # -- 7. RBAC: the shipped roles suffice, and nothing more is allowed -----------

    def test_7_rbac_is_least_privilege(self):
        token = self.cp.service_account_token("kgpu-system", "kgpu-extender")
        me = cluster.Api("127.0.0.1", self.cp.api_port, self.cp.pki.ca_crt, token=token)
        self.assertIsInstance(me.get("/api/v1/nodes?limit=1"), dict)
        self.assertIsInstance(me.get("/api/v1/pods?limit=1"), dict)
        # DRA: slices and claims are read, never written (kube-scheduler allocates).
        self.assertIsInstance(me.get("/apis/resource.k8s.io/v1/resourceslices?limit=1"), dict)
        self.assertIsInstance(me.get("/apis/resource.k8s.io/v1/resourceclaims?limit=1"), dict)
        refused = [
            ("POST", "/apis/resource.k8s.io/v1/namespaces/e2e/resourceclaims",
             {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
              "metadata": {"name": "x"}, "spec": {}}),
            ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/anything", None),
            ("POST", "/api/v1/namespaces/kgpu-system/secrets",
             {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}}),
            ("GET", "/api/v1/namespaces/kgpu-system/secrets", None),
            ("GET", "/api/v1/namespaces/kube-system/configmaps", None),
            ("POST", "/api/v1/namespaces/e2e/pods", pod_object("sneaky", [("m", {MEM: 1})])),
            # nodes: patch, for the scale-down guard's three annotations alone
            # (RBAC grants patch; the admission policy kgpu-extender-node-guard the rest).
            ("PATCH", "/api/v1/nodes/gpu-t4-0", {"metadata": {"labels": {"x": "y"}}}),
            ("PATCH", "/api/v1/nodes/gpu-t4-0", {"metadata": {"annotations": {"x": "y"}}}),
            ("PATCH", "/api/v1/nodes/gpu-t4-0", {"spec": {"unschedulable": True}}),
            ("PATCH", "/api/v1/nodes/gpu-t4-0", {"metadata": {"annotations": {
                "karpenter.sh/do-not-disrupt": "5m"}}}),
            ("PATCH", "/api/v1/nodes/gpu-t4-0", {"metadata": {"annotations": {
                "kgpu.io/gpus": "[]"}}}),
            ("DELETE", "/api/v1/namespaces/e2e/pods/anything", None),
            ("PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-scheduler",
             {}),
        ]
        for method, path, body in refused:
            ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
            st, text = me.raw(method, path, json.dumps(body) if body is not None else None, ctype)
            self.assertEqual(st, 403, "%s %s answered %d: %s" % (method, path, st, text[:200]))
        # What the guard writes is let through (and taken back).
        for value in ("true", None):
            st, text = me.raw("PATCH", "/api/v1/nodes/gpu-v100-0", json.dumps(
                {"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": value}}}),
                "application/merge-patch+json")
            self.assertEqual(st, 200, text[:300])
        r = self.cp.kubectl("auth", "can-i", "--list", "-n", "kgpu-system",
                            "--as=system:serviceaccount:kgpu-system:kgpu-extender")
        self.assertNotIn("secrets", r.stdout)

    # -- 8. kubectl kgpu inspect, through kubectl's plugin mechanism -----------------

    def test_8_kubectl_kgpu_inspect(self):
        """With the shipped defaults /inspect needs a client certificate: `kgpu inspect
        --server` with one works (through the Service, TLS passed through); the API
        server's service proxy, which has none, is refused and kgpu says what to do."""
        if cluster.host_ip() is None:
            self.skipTest("no non-loopback address for the API server to proxy to")
        tls = self.cp.kgpu_tls
        self.assertIsNotNone(tls, "the chart's defaults serve HTTPS")
        self.create("seen", [("main", {MEM: 5})])
        pod = self.wait_bound("seen")
        plugdir = self.cp.p("plugins")
        os.makedirs(plugdir, exist_ok=True)
        link = os.path.join(plugdir, "kubectl-kgpu")
        if not os.path.lexists(link):
            os.symlink(os.path.join(CONFIG["build"], "kgpu"), link)
        env = dict(os.environ, PATH=plugdir + os.pathsep + os.environ.get("PATH", ""),
                   KUBECONFIG=self.cp.admin_kubeconfig)
        env.pop("KGPU_EXTENDER", None)

        def kubectl(*args):
            return subprocess.run([self.cp.tool("kubectl")] + list(args), env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        r = kubectl("plugin", "list")
        self.assertIn("kubectl-kgpu", r.stdout + r.stderr)
        # As after `kubectl port-forward service/kgpu-extender 12346`: the Service's address,
        # the serving certificate checked against the operator's CA, a client certificate.
        direct = ["--server", self.vip.url, "--cacert", tls.ca,
                  "--cert", tls.harness_crt, "--key", tls.harness_key]
        r = kubectl("kgpu", "inspect", "--json", *direct)
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual(sorted(n["name"] for n in doc["nodes"]), sorted(self.inventory))
        node = pod["spec"]["nodeName"]
        idx = self.gpus_of(pod)[0][1]
        gpu = [g for n in doc["nodes"] if n["name"] == node for g in n["gpus"]][idx]
        self.assertIn("seen", [p["pod"] for p in gpu["pods"]])
        r = kubectl("kgpu", "inspect", node, "--detail", *direct)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(node, r.stdout)
        self.assertIn("seen", r.stdout)
        # Without the client certificate: refused by the extender itself.
        r = kubectl("kgpu", "inspect", "--server", self.vip.url, "--cacert", tls.ca)
        self.assertEqual(r.returncode, 1)
        self.assertIn("403", r.stderr)

        # Through the API server's service proxy: the API server authenticates the user,
        # then reaches the extender without a client certificate. Refused, with the way out.
        wait_for(lambda: self.vip.published, 20, "the Service's endpoints")
        r = kubectl("get", "--raw", "/api/v1/namespaces/kgpu-system/services/"
                    "https:kgpu-extender:12346/proxy/inspect")
        self.assertNotEqual(r.returncode, 0)
        self.assertNotIn('"nodes"', r.stdout)
        r = kubectl("kgpu", "inspect", "--json")
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("requires a client certificate", r.stderr)
        self.assertIn("--server https://127.0.0.1:12346", r.stderr)
        self.assertEqual(r.stdout, "")

    # -- 9. what the stand-ins must agree with: paging through a real list ---------------

    def test_9_restart_pages_through_many_pods(self):
        """A restarted extender lists 1,200 pods in pages (limit/continue) and accounts for all."""
        bulk = {}
        for name in ("gpu-bulk-0", "gpu-bulk-1"):
            node = node_object(name, "NVIDIA A100-SXM4-80GB", 8, 81920)
            bulk[name] = json.loads(node["metadata"]["annotations"]["kgpu.io/gpus"])
            self.inventory[name] = bulk[name]
            self.cp.add_node(node)
        made = []
        for i in range(1200):
            node = "gpu-bulk-%d" % (i % 2)
            g = bulk[node][(i // 2) % 8]
            name = "bulk-%04d" % i
            pod = pod_object(name, [("main", {MEM: 1})])
            pod["spec"]["nodeName"] = node  # bound already, as by an earlier scheduler run
            pod["metadata"]["annotations"] = {
                "kgpu.io/node": node,
                "kgpu.io/assignment": json.dumps([{"container": "main", "exclusive": False,
                                                   "gpus": [{"index": g["index"],
                                                             "uuid": g["uuid"],
                                                             "milli": 0,
                                                             "memory_mib": 1024}]}])}
            # Written as an earlier kgpu run wrote them: under kgpu's own name (the
            # admission policy lets nobody else write kgpu.io/assignment or create a GPU
            # pod bound already), with the admin's rights (the extender's RBAC creates
            # no pods).
            self.cp.admin.req("POST", cluster.pod_path(E2E_NS), pod, headers=AS_KGPU)
            made.append(name)
        self.created.extend((E2E_NS, n) for n in made)
        audit_from = self.cp.audit_size()
        self.ext.kill()
        self.ext.start()
        wait_for(self.ext.ready, 90, "readiness after the relist")
        truth = self.assert_state_matches(timeout=30)
        self.assertEqual(truth[("gpu-bulk-0", 0)], (75 * 1024, 0))
        # What kube-apiserver saw: the extender's pod list came in pages.
        lists = [e for e in self.cp.audit_events(audit_from)
                 if e.get("verb") == "list" and e.get("objectRef", {}).get("resource") == "pods"
                 and e.get("user", {}).get("username") ==
                 "system:serviceaccount:kgpu-system:kgpu-extender"]
        uris = [e["requestURI"] for e in lists]
        self.assertTrue(any("limit=" in u for u in uris), uris)
        conts = [u for u in uris if "continue=" in u]
        self.assertGreaterEqual(len(conts), 2, "1,200 pods in pages of at most 500: %r" % uris)
        self.assertFalse([u for u in conts if "resourceVersion=" in u],
                         "a continued list must not name a resourceVersion")
        for name in bulk:
            del self.inventory[name]
        for ns, name in self.created:
            self.cp.delete_pod(ns, name)
        self.created = []
        for name in bulk:
            self.cp.admin.delete("/api/v1/nodes/" + name)

    # -- the shipped entry for pods without a GPU --------------------------------

    def test_10_pods_without_gpu_are_scored_by_kgpu(self):
        """The shipped configuration's second extender entry (no managedResources):
        kube-scheduler sends a pod that asks for no GPU to prioritize-gpuless, the policy
        learns it once, and kube-scheduler binds it itself, without an assignment."""
        verb = 'verb="prioritize-gpuless"'
        calls = self.ext.metric("kgpu_extender_requests_total", verb)
        learned = self.ext.metric("kgpu_extender_pods_learned_total")
        self.create("cpu-only", [("main", {"memory": "64Mi"})])
        pod = self.wait_bound("cpu-only")
        self.assertNotIn("kgpu.io/assignment", annotations(pod))
        self.assertGreater(self.ext.metric("kgpu_extender_requests_total", verb), calls)
        self.assertEqual(self.ext.metric("kgpu_extender_pods_learned_total"), learned + 1)
        self.assertEqual(self.ext.metric("kgpu_extender_invalid_pods_total", verb), 0)
        # A GPU pod is scored by the first entry; this one's call for it learns nothing.
        self.create("gpu-too", [("main", {MEM: 2})])
        self.wait_bound("gpu-too")
        self.assertEqual(self.ext.metric("kgpu_extender_pods_learned_total"), learned + 2)
        self.assert_state_matches()

    # -- 11-14. GPU queues: the GPUQueue resource, limits, reclaim, PDBs --------------

    def queue(self, name, spec):
        """Creates the GPUQueue `name`; deleted after the test's pods. A root opens itself
        (and the queues below it) to the pods of E2E_NS by the namespace's name label,
        which the API server sets."""
        if not spec.get("parent"):
            spec = dict(spec)
            spec.setdefault("namespaceSelector",
                            {"matchLabels": {"kubernetes.io/metadata.name": E2E_NS}})
        path = GQ + "/" + name
        self.cp.admin.post(GQ, {"apiVersion": "kgpu.io/v1alpha1", "kind": "GPUQueue",
                                "metadata": {"name": name}, "spec": spec})
        self.cleanups.insert(0, path)  # children before parents
        return path

    def queue_status(self, name, want, timeout=30):
        """Waits until the GPUQueue's status has every (dotted key, value) of `want` and
        speaks of its current generation; returns the object."""
        last = {}

        def ok():
            q = self.cp.admin.get(GQ + "/" + name)
            last["q"] = q
            st = q.get("status") or {}
            if st.get("observedGeneration") != q["metadata"]["generation"]:
                return None
            for key, value in want.items():
                v = st
                for part in key.split("."):
                    v = v.get(part) if isinstance(v, dict) else None
                if v != value:
                    return None
            return q
        try:
            return wait_for(ok, timeout, "GPUQueue %s status %r" % (name, want), interval=0.2)
        except AssertionError:
            raise AssertionError("GPUQueue %s: status %r, wanted %r; extender log:\n%s" % (
                name, (last.get("q") or {}).get("status"), want, self.ext.child.log_tail(30)))

    def condition(self, q, ctype):
        for c in (q.get("status") or {}).get("conditions") or []:
            if c.get("type") == ctype:
                return c
        return None

    def fill_with_borrowers(self, queue, extra_labels=None):
        """Pods of `queue` on every GPU of the cluster: one of 4 GPUs on each 4-GPU node,
        one of 2 on the V100 node. Returns {pod: node}."""
        where = {}
        labels = dict({"app": "kgpu-e2e", QLABEL: queue}, **(extra_labels or {}))
        for i, n in enumerate([4, 4, 4, 2]):
            name = "%s-%d" % (queue, i)
            self.create(name, [("main", {WHOLE: n})], labels=labels)
            where[name] = self.wait_bound(name)["spec"]["nodeName"]
        self.assertEqual(sorted(where.values()), sorted(NODES), "one pod on every node")
        return where

    def play_kubelet(self, ns=E2E_NS):
        """No kubelet runs here: finish what an eviction started, as kubelet would once
        the containers stop. Returns the names of the pods finished."""
        done = []
        for p in self.cp.admin.get("/api/v1/namespaces/%s/pods" % ns)["items"]:
            if p["metadata"].get("deletionTimestamp"):
                self.cp.delete_pod(ns, p["metadata"]["name"])
                done.append(p["metadata"]["name"])
        return done

    def nudger(self, every=5.0):
        """A function that, called in a wait loop, changes a label of one node every
        `every` seconds: a cluster change, on which kube-scheduler tries its unschedulable
        pods again (a PodDisruptionBudget's status change is not one). The label goes
        after the test."""
        path = "/api/v1/nodes/gpu-t4-0"
        last = [0.0, 0]

        def nudge():
            if time.monotonic() - last[0] >= every:
                last[0], last[1] = time.monotonic(), last[1] + 1
                self.cp.admin.merge_patch(path, {"metadata": {"labels": {
                    "kgpu-e2e/nudge": str(last[1])}}})
        self.addCleanup(lambda: self.cp.admin.merge_patch(
            path, {"metadata": {"labels": {"kgpu-e2e/nudge": None}}}))
        return nudge

    def evictions(self, offset):
        """(pod name, HTTP code, user) of each Eviction created since the audit offset."""
        out = []
        for e in self.cp.audit_events(offset):
            ref = e.get("objectRef") or {}
            if ref.get("subresource") == "eviction" and e.get("verb") == "create" and \
                    e.get("stage") == "ResponseComplete":
                out.append((ref.get("name"), (e.get("responseStatus") or {}).get("code"),
                            (e.get("user") or {}).get("username")))
        return out

    def test_11_gpu_queues_are_read_and_their_status_written(self):
        crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gpuqueues.kgpu.io"
        wait_for(lambda: self.condition(self.cp.admin.get(crd), "Established"), 30,
                 "the GPUQueue CRD to be established")
        self.queue("org", {"guarantee": {"gpu": 8}, "limit": {"gpu": 12, "memory": "2Ti"}})
        self.queue("team-a", {"parent": "org", "guarantee": {"gpu": 4}, "weight": 2})
        self.queue("team-b", {"parent": "org", "guarantee": {"gpu": "1.5"}})
        # The API server validates the spec: not a quantity, a weight out of range.
        for bad in ({"guarantee": {"gpu": "lots"}}, {"weight": 5000}):
            st, text = self.cp.admin.raw("POST", GQ, json.dumps(
                {"apiVersion": "kgpu.io/v1alpha1", "kind": "GPUQueue",
                 "metadata": {"name": "bad"}, "spec": bad}))
            self.assertEqual(st, 422, "%r accepted: %s" % (bad, text[:200]))
        # A namespace whose pods belong to team-a unless they say otherwise.
        # (Kept afterwards: without kube-controller-manager a deleted namespace never goes.)
        ns = "e2e-team-a"
        self.cp.ensure_namespace(ns)
        self.cp.admin.merge_patch("/api/v1/namespaces/" + ns,
                                  {"metadata": {"annotations": {QLABEL: "team-a"}}})

        self.create("qa-label", [("main", {WHOLE: 2})],
                    labels={"app": "kgpu-e2e", QLABEL: "team-a"})
        self.create("qa-namespace", [("main", {WHOLE: 1})], ns=ns)
        self.create("qb-share", [("main", {MEM: 8, CORE: 50})],
                    labels={"app": "kgpu-e2e", QLABEL: "team-b"})
        self.create("q-default", [("main", {WHOLE: 1})])
        # A label naming a queue its namespace may not use (issue 24): refused, with why.
        self.create("qa-forbidden", [("main", {WHOLE: 1})], ns=ns,
                    labels={"app": "kgpu-e2e", QLABEL: "team-b"})
        for name, pns in (("qa-label", E2E_NS), ("qa-namespace", ns), ("qb-share", E2E_NS),
                          ("q-default", E2E_NS)):
            self.wait_bound(name, ns=pns)
        self.assertIn("queue team-b (the pod's kgpu.io/queue label) does not exist or is not "
                      "open to namespace e2e-team-a", self.failed_scheduling("qa-forbidden", ns))
        self.cp.delete_pod(ns, "qa-forbidden")
        a = self.queue_status("team-a", {"used.gpu": "3", "pods": 2, "pending": 0})
        self.assertEqual(self.condition(a, "Valid").get("status"), "True", a["status"])
        # A share of half a GPU: its compute, whatever its memory.
        self.queue_status("team-b", {"used.gpu": "0.5", "pods": 1})
        # The parent holds its children's pods, not the default queue's.
        self.queue_status("org", {"used.gpu": "3.5", "pods": 3})
        self.assert_state_matches()
        out = self.cp.kubectl("get", "gpuqueues", "-o", "wide").stdout
        self.assertRegex(out, r"(?m)^team-a\s+org\s+4\s+3\s+0\s+0\s", out)

        # A queue whose parent does not exist: said on it; the others keep working.
        self.queue("team-c", {"parent": "no-such-queue"})
        c = wait_for(lambda: (lambda q: q if (self.condition(q, "Valid") or {}).get(
            "status") == "False" else None)(self.cp.admin.get(GQ + "/team-c")), 30,
            "team-c to be marked not valid")
        self.assertIn("no-such-queue", self.condition(c, "Valid").get("message", ""))
        self.create("qa-more", [("main", {WHOLE: 1})],
                    labels={"app": "kgpu-e2e", QLABEL: "team-a"})
        self.wait_bound("qa-more")
        self.queue_status("team-a", {"used.gpu": "4", "pods": 3})

    def test_12_a_queue_over_its_limit_is_refused_with_the_reason(self):
        self.queue("team-a", {"guarantee": {"gpu": 1}, "limit": {"gpu": 2}})
        lab = {"app": "kgpu-e2e", QLABEL: "team-a"}
        self.create("lim-0", [("main", {WHOLE: 2})], labels=lab)
        self.wait_bound("lim-0")
        self.queue_status("team-a", {"used.gpu": "2"})
        self.create("lim-1", [("main", {WHOLE: 1})], labels=lab)
        msg = self.failed_scheduling("lim-1")
        self.assertIn("queue team-a would use 3 GPUs of its limit 2", msg)
        self.queue_status("team-a", {"pending": 1})
        self.assertIsNone(self.cp.get_pod(E2E_NS, "lim-1")["spec"].get("nodeName"))
        # Room in the queue again: the waiting pod goes.
        self.cp.delete_pod(E2E_NS, "lim-0")
        self.wait_bound("lim-1")
        self.queue_status("team-a", {"used.gpu": "1", "pending": 0})

    def test_13_reclaim_evicts_a_borrower_through_the_eviction_api(self):
        """team-b borrows every GPU; team-a's pod within its guarantee makes the extender
        evict, through the Eviction API, the one borrower whose GPUs it can use: one
        4-GPU pod, not the 2-GPU one that a priority-and-age rule would take first."""
        self.queue("team-a", {"guarantee": {"gpu": 4}})
        self.queue("team-b", {"guarantee": {"gpu": 2}})
        where = self.fill_with_borrowers("team-b")
        self.queue_status("team-b", {"used.gpu": "14", "borrowed.gpu": "12"})
        audit = self.cp.audit_size()
        self.create("owner", [("main", {WHOLE: 4})],
                    labels={"app": "kgpu-e2e", QLABEL: "team-a"})
        # kube-scheduler tries the pod again when the victim goes; if the extender's watch
        # has not seen it go by then, the pod waits for the next cluster change.
        nudge = self.nudger(every=10.0)

        def bound():
            nudge()
            self.play_kubelet()
            p = self.cp.get_pod(E2E_NS, "owner")
            return p if p["spec"].get("nodeName") else None
        pod = wait_for(bound, 90, "team-a's pod to be bound after reclaim", interval=0.2)
        gone = [n for n in where if self.cp.get_pod(E2E_NS, n) is None]
        self.assertEqual(len(gone), 1, "exactly one victim: %r" % gone)
        self.assertEqual(where[gone[0]], pod["spec"]["nodeName"], "on the GPUs it freed")
        self.assertNotEqual(where[gone[0]], "gpu-v100-0")
        ev = self.evictions(audit)
        sa = "system:serviceaccount:kgpu-system:kgpu-extender"
        self.assertIn((gone[0], 201, sa), ev, ev)
        self.assertEqual([e for e in ev if e[1] in (200, 201)], [(gone[0], 201, sa)], ev)
        self.queue_status("team-a", {"used.gpu": "4", "pods": 1, "pending": 0})
        self.queue_status("team-b", {"used.gpu": "10", "pods": 3})
        self.assert_state_matches()

    def test_14_reclaim_respects_pod_disruption_budgets(self):
        self.queue("team-a", {"guarantee": {"gpu": 4}})
        self.queue("team-b", {"guarantee": {"gpu": 2}})
        where = self.fill_with_borrowers("team-b", {"pdb": "team-b"})
        # The Eviction API ignores budgets for Pending pods, and evicts pods that are not
        # Ready when the budget is met: report them running and ready, as kubelet would.
        for name in where:
            self.cp.admin.merge_patch(cluster.pod_path(E2E_NS, name) + "/status", {"status": {
                "phase": "Running", "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "True"}]}})
        pdbs = "/apis/policy/v1/namespaces/%s/poddisruptionbudgets" % E2E_NS
        pdb = self.cp.admin.post(pdbs, {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "team-b"},
            "spec": {"minAvailable": 4, "selector": {"matchLabels": {"pdb": "team-b"}}}})
        self.cleanups.append(pdbs + "/team-b")

        def disruption_controller(allowed, generation):
            # No kube-controller-manager here: write what its disruption controller would.
            self.cp.admin.merge_patch(pdbs + "/team-b/status", {"status": {
                "observedGeneration": generation, "disruptionsAllowed": allowed,
                "currentHealthy": 4, "desiredHealthy": 4 - allowed, "expectedPods": 4}})
        disruption_controller(0, pdb["metadata"]["generation"])
        audit = self.cp.audit_size()
        self.create("owner", [("main", {WHOLE: 4})],
                    labels={"app": "kgpu-e2e", QLABEL: "team-a"})
        nudge = self.nudger()

        def pdb_named():
            nudge()
            return next((e["message"] for e in self.cp.events_for(E2E_NS, "owner")
                         if "PodDisruptionBudget" in e.get("message", "")), None)
        msg = wait_for(pdb_named, 90, "the owner's event to name the PodDisruptionBudget",
                       interval=0.5)
        self.assertRegex(msg, r"team-b-[0-2]")
        refused = self.evictions(audit)
        self.assertTrue(refused and all(code == 429 for _, code, _ in refused), refused)
        self.assertEqual(self.play_kubelet(), [])
        self.assertEqual([n for n in where if self.cp.get_pod(E2E_NS, n) is None], [])
        self.queue_status("team-a", {"pending": 1})

        # The budget allows one disruption: the next try evicts one pod, and only one.
        pdb = self.cp.admin.merge_patch(pdbs + "/team-b", {"spec": {"minAvailable": 3}})
        disruption_controller(1, pdb["metadata"]["generation"])

        def bound():
            nudge()
            self.play_kubelet()
            p = self.cp.get_pod(E2E_NS, "owner")
            return p if p["spec"].get("nodeName") else None
        pod = wait_for(bound, 120, "team-a's pod to be bound once the budget allows",
                       interval=0.5)
        gone = [n for n in where if self.cp.get_pod(E2E_NS, n) is None]
        self.assertEqual(len(gone), 1, gone)
        self.assertEqual(where[gone[0]], pod["spec"]["nodeName"])
        self.assertEqual(len([e for e in self.evictions(audit) if e[1] in (200, 201)]), 1)
        self.assert_state_matches()

    # -- 0. the shipped defaults authenticate: who gets in, who does not ----------------

    # -- 15. pods that get their GPUs through DRA, placed by kgpu's scores ----------------

    def dra_claim(self, name, requests=None):
        """A ResourceClaim for one device of class gpu.kgpu.io; `requests`: its capacity
        requests (memory, cores), None for a whole GPU (the default memory is all of it)."""
        exactly = {"deviceClassName": "gpu.kgpu.io"}
        if requests:
            exactly["capacity"] = {"requests": requests}
        path = "/apis/resource.k8s.io/v1/namespaces/%s/resourceclaims" % E2E_NS
        self.cp.admin.post(path, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": E2E_NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}})
        return path + "/" + name

    def dra_pod(self, name, claim, labels=None):
        pod = pod_object(name, [("main", {})], labels=labels)
        c = pod["spec"]["containers"][0]
        c["resources"] = {"requests": {"cpu": "2"}, "claims": [{"name": "gpu"}]}
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        self.cp.create_pod(pod)
        self.created.append((E2E_NS, name))

    def test_15_dra_pods_are_placed_by_kgpus_scores(self):
        """Two nodes whose GPUs kgpu's DRA driver publishes (kgpu.io/gpu-allocator=dra),
        claims allocated by kube-scheduler's own DRA allocator. Its own plugins would send
        each next pod to the emptier node (LeastAllocated on the 2 CPUs each asks); the
        shipped configuration's prioritize-gpuless entry gets the pod, the extender reads
        the claims and the slices, and kgpu's scores pack the second 30 % share beside the
        first, on the same GPU, and a whole GPU on the same node, keeping the other
        node's two GPUs whole."""
        cp, build = self.cp, CONFIG["build"]
        dra_dir = os.path.join(cluster.REPO, "deploy", "dra")
        cp.kubectl("apply", "-k", dra_dir)
        drivers, claims, nodes = [], [], ["dra-a", "dra-b"]
        tmp = os.path.join(CONFIG["work"], "dra-15")
        verb = 'verb="prioritize-gpuless"'
        calls = self.ext.metric("kgpu_extender_requests_total", verb)
        try:
            os.makedirs(tmp, exist_ok=True)
            shim = os.path.join(tmp, "libkgpu-limit.so")
            open(shim, "w").close()
            for name in nodes:
                node = node_object(name, "A100-SXM4-40GB", 0, 40960, cpu="16", memory="64Gi",
                                   labels={"kgpu.io/gpu-allocator": "dra"})
                cp.add_node(node)
                # The driver's token as kubelet projects it into the DaemonSet's pod on
                # that node: bound to the pod, so it names the node, which the admission
                # policy kgpu-agents-own-node requires (its slices only).
                agent = pod_object("dra-agent-" + name, [("main", {})], ns="kgpu-dra")
                agent["spec"].update(nodeName=name, serviceAccountName="kgpu-dra-plugin")
                agent["spec"]["containers"][0]["resources"] = {}  # nothing for the scores
                agent = cp.admin.post(cluster.pod_path("kgpu-dra"), agent)
                self.created.append(("kgpu-dra", agent["metadata"]["name"]))
                token = cp.service_account_token("kgpu-dra", "kgpu-dra-plugin", pod=agent)
                kc = cluster.kubeconfig(os.path.join(tmp, name + "-dra.kubeconfig"), cp.server,
                                        cp.pki.ca_crt, token=token)
                gpus = os.path.join(tmp, name + "-gpus.yaml")
                with open(gpus, "w") as f:
                    f.write("gpus:\n" + "".join(
                        "- {index: %d, uuid: GPU-%s-%d, model: A100-SXM4-40GB, "
                        "memory_mib: 40960, numa: 0}\n" % (i, name, i) for i in range(2)))
                d = {k: os.path.join(tmp, name, k) for k in ("plugins", "registry", "state",
                                                             "cdi")}
                for path in d.values():
                    os.makedirs(path, exist_ok=True)
                drivers.append(harness.Child(
                    [os.path.join(build, "kgpu-dra-plugin"), "--node-name", name,
                     "--fake-gpus", gpus, "--kubeconfig", kc, "--state-dir", d["state"],
                     "--cdi-dir", d["cdi"], "--plugin-dir", d["plugins"],
                     "--registry-dir", d["registry"], "--shim-lib", shim, "--resync", "2"],
                    os.path.join(tmp, name + "-driver.log")))
            for name in nodes:
                wait_for(lambda name=name: len((cp.admin.try_get(
                    "/apis/resource.k8s.io/v1/resourceslices/%s-gpu.kgpu.io" % name) or {})
                    .get("spec", {}).get("devices") or []) == 2, 60,
                    "the ResourceSlice of %s" % name)

            def allocation(path):
                c = cp.admin.get(path)
                r = ((c.get("status") or {}).get("allocation") or {}).get("devices", {})
                return [(x["pool"], x["device"]) for x in r.get("results", [])]

            def placed(pod, claim):
                node = self.wait_bound(pod)["spec"]["nodeName"]
                got = wait_for(lambda: allocation(claim), 30, "%s allocated" % claim)
                self.assertEqual([p for p, _ in got], [node], got)
                return node, got[0][1]

            claims.append(self.dra_claim("share-1", {"memory": "8Gi", "cores": "30"}))
            self.dra_pod("dra-share-1", "share-1")
            first, dev = placed("dra-share-1", claims[-1])
            self.assertEqual(dev, "gpu-0")  # first fit in the slice's order
            # The extender counts the allocation it read from the claim.
            wait_for(lambda: self.ext.held().get((first, 0)) == (8192, 300), 30,
                     "the extender to charge share-1 on %s gpu 0 (holds %r)"
                     % (first, self.ext.held()))

            claims.append(self.dra_claim("share-2", {"memory": "8Gi", "cores": "30"}))
            self.dra_pod("dra-share-2", "share-2")
            self.assertEqual(placed("dra-share-2", claims[-1]), (first, "gpu-0"),
                             "kgpu packs the second share beside the first")
            wait_for(lambda: self.ext.held().get((first, 0)) == (16384, 600), 30,
                     "the extender to charge both shares")

            claims.append(self.dra_claim("whole-1"))
            self.dra_pod("dra-whole-1", "whole-1")
            self.assertEqual(placed("dra-whole-1", claims[-1]), (first, "gpu-1"),
                             "a whole GPU where it breaks no pair of free GPUs")
            self.assertGreaterEqual(self.ext.metric("kgpu_extender_requests_total", verb),
                                    calls + 3)
            self.assertEqual(self.ext.metric("kgpu_extender_invalid_pods_total", verb), 0)

            # Claims count in GPU queues (issue 24): a queue limited to one GPU is charged
            # the claim of its first DRA pod at allocation, and its second DRA pod is
            # refused before kube-scheduler allocates (filter-gpuless), though a GPU is
            # free; it goes once the first is gone.
            self.queue("dra-team", {"limit": {"gpu": 1}})
            lab = {"app": "kgpu-e2e", QLABEL: "dra-team"}

            def used():
                for q in self.ext.inspect().get("queues", []):
                    if q["name"] == "dra-team":
                        return q["used"]["gpu_milli"] or 0
                return None
            wait_for(lambda: used() == 0, 30, "the extender to read queue dra-team")
            claims.append(self.dra_claim("whole-2"))
            self.dra_pod("dra-whole-2", "whole-2", labels=lab)
            second, _ = placed("dra-whole-2", claims[-1])
            self.assertNotEqual(second, first, "the emptier node's pair is the only room")
            wait_for(lambda: used() == 1000, 30, "the claim charged to dra-team (%r)" % used())
            claims.append(self.dra_claim("whole-3"))
            self.dra_pod("dra-whole-3", "whole-3", labels=lab)
            msg = self.failed_scheduling("dra-whole-3")
            self.assertIn("dra-team", msg)
            self.assertIn("limit 1", msg)
            self.assertEqual(allocation(claims[-1]), [], "refused before allocation")
            cp.delete_pod(E2E_NS, "dra-whole-2")
            wait_for(lambda: cp.get_pod(E2E_NS, "dra-whole-2") is None, 30, "dra-whole-2 gone")
            # As the resourceclaim controller would; kube-scheduler may then place
            # dra-whole-3 at once, so the queue goes 1000 -> 0 -> 1000 between two looks.
            cp.drop_claim(claims[-2])
            nudge = self.nudger(every=5.0)

            def bound3():
                nudge()
                return cp.get_pod(E2E_NS, "dra-whole-3")["spec"].get("nodeName")
            wait_for(bound3, 90, "dra-whole-3 bound once dra-team has room")
            self.assertEqual(placed("dra-whole-3", claims[-1])[0], second)
            wait_for(lambda: used() == 1000, 30, "whole-3 charged (%r)" % used())
        finally:
            for ns, name in self.created:
                cp.delete_pod(ns, name)
            for ns, name in self.created:
                wait_for(lambda ns=ns, name=name: cp.get_pod(ns, name) is None, 30,
                         "pod %s/%s to go" % (ns, name))
            self.created = []
            for path in claims:
                cp.drop_claim(path)
            for d in drivers:
                d.stop()
            for name in nodes:
                cp.admin.delete("/apis/resource.k8s.io/v1/resourceslices/%s-gpu.kgpu.io" % name)
                cp.admin.delete("/api/v1/nodes/" + name)
            cp.kubectl("delete", "-k", dra_dir, "--ignore-not-found", "--wait=false",
                       check=False)
        # Claims gone: the extender holds nothing on the DRA nodes any more.
        wait_for(lambda: not any(n in nodes for n, _ in self.ext.held()), 30,
                 "the extender to release the DRA claims")
        for d in drivers:
            report = d.sanitizer_report()
            self.assertIsNone(report, report)

    # -- 16. the admission policies: what kgpu trusts, nobody else writes ------------

    def tenant(self, ns="e2e-tenant"):
        """A tenant of namespace ns: a ServiceAccount that may do anything with pods there
        (and nothing else), as an API client."""
        cp = self.cp
        cp.ensure_namespace(ns)
        for path, obj in (
                ("/api/v1/namespaces/%s/serviceaccounts" % ns,
                 {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant"}}),
                ("/apis/rbac.authorization.k8s.io/v1/namespaces/%s/roles" % ns,
                 {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                  "metadata": {"name": "tenant"},
                  "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}]}),
                ("/apis/rbac.authorization.k8s.io/v1/namespaces/%s/rolebindings" % ns,
                 {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                  "metadata": {"name": "tenant"},
                  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                              "name": "tenant"},
                  "subjects": [{"kind": "ServiceAccount", "name": "tenant",
                                "namespace": ns}]})):
            if cp.admin.try_get(path + "/tenant") is None:
                cp.admin.post(path, obj)
        token = cp.service_account_token(ns, "tenant")
        return cluster.Api("127.0.0.1", cp.api_port, cp.pki.ca_crt, token=token)

    def test_16_admission_policies_keep_kgpus_bookkeeping(self):
        """The chart's ValidatingAdmissionPolicies, on by default, in the real API server:
        a tenant cannot create a GPU pod past kube-scheduler (spec.nodeName), nor write,
        change or remove kgpu.io/assignment; a node agent's pod-bound token changes only
        its own node, only kgpu.io/ keys, and only pods bound there."""
        cp, ns = self.cp, "e2e-tenant"
        for name in ("kgpu-pod-bookkeeping", "kgpu-agents-own-node"):
            pol = cp.admin.get("/apis/admissionregistration.k8s.io/v1/"
                               "validatingadmissionpolicies/" + name)
            # The API server type-checks every expression against the matched kinds.
            warnings = ((pol.get("status") or {}).get("typeChecking") or {}).get(
                "expressionWarnings")
            self.assertFalse(warnings, "%s: %r" % (name, warnings))
        me = self.tenant(ns)
        path = cluster.pod_path(ns)
        forged = json.dumps([{"container": "main", "exclusive": True, "gpus": [
            {"index": g["index"], "uuid": g["uuid"], "milli": 1000, "memory_mib": 15360}
            for g in self.inventory["gpu-t4-0"]]}])

        def refused(method, p, body, what):
            ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
            st, text = me.raw(method, p, json.dumps(body), ctype)
            self.assertEqual(st, 403, "%s was let through: %s" % (what, text[:300]))
            return json.loads(text)["message"]

        # Bound at creation: both with and without an assignment of its own.
        pod = pod_object("sneak", [("main", {MEM: 1})], ns=ns)
        pod["spec"]["nodeName"] = "gpu-t4-0"
        msg = refused("POST", path, pod, "a GPU pod created with spec.nodeName")
        self.assertIn("may not create it with spec.nodeName set", msg)
        pod["metadata"]["annotations"] = {"kgpu.io/assignment": forged, "kgpu.io/node": "gpu-t4-0"}
        refused("POST", path, pod, "a GPU pod with nodeName and an assignment")
        # Unbound, with an assignment: the extender's bind would find one there.
        del pod["spec"]["nodeName"]
        msg = refused("POST", path, pod, "a pod created with kgpu.io/assignment")
        self.assertIn("may not set, change or remove them", msg)
        # A pod without GPUs may still name its node: not kgpu's business.
        cpu = pod_object("cpu-only", [("main", {})], ns=ns)
        cpu["spec"]["nodeName"] = "gpu-t4-0"
        me.post(path, cpu)
        self.created.append((ns, "cpu-only"))

        # A pod placed by kgpu: its bookkeeping stays as kgpu wrote it.
        me.post(path, pod_object("placed", [("main", {MEM: 2})], ns=ns))
        self.created.append((ns, "placed"))
        placed = self.wait_bound("placed", ns=ns)
        written = annotations(placed)["kgpu.io/assignment"]
        mine = cluster.pod_path(ns, "placed")
        for change in ({"kgpu.io/assignment": None}, {"kgpu.io/assignment": forged},
                       {"kgpu.io/bind-time": None}, {"kgpu.io/allocated": "true"}):
            refused("PATCH", mine, {"metadata": {"annotations": change}}, "patch %r" % change)
        me.merge_patch(mine, {"metadata": {"annotations": {"team.example/owner": "me"}}})
        self.assertEqual(annotations(cp.get_pod(ns, "placed"))["kgpu.io/assignment"], written)

        # The device plugin's credentials, as a taken-over node would hold them.
        dp_ns, dp_sa = "kgpu-node", "kgpu-device-plugin"
        # Its node is not the one "placed" runs on, and "other" is a third.
        here, other_node = [n for n in sorted(NODES) if n != placed["spec"]["nodeName"]][:2]
        agent = pod_object("agent-on-t4", [("main", {})], ns=dp_ns)
        agent["spec"].update(nodeName=here, serviceAccountName=dp_sa)
        agent["spec"]["containers"][0]["resources"] = {}
        agent = cp.admin.post(cluster.pod_path(dp_ns), agent)
        self.created.append((dp_ns, "agent-on-t4"))
        bound = cluster.Api("127.0.0.1", cp.api_port, cp.pki.ca_crt,
                            token=cp.service_account_token(dp_ns, dp_sa, pod=agent))
        unbound = cluster.Api("127.0.0.1", cp.api_port, cp.pki.ca_crt,
                              token=cp.service_account_token(dp_ns, dp_sa))

        def patch(api, p, body):
            return api.raw("PATCH", p, json.dumps(body), "application/merge-patch+json")

        own, other = "/api/v1/nodes/" + here, "/api/v1/nodes/" + other_node
        probe = {"metadata": {"labels": {"kgpu.io/e2e-probe": "1"}}}
        st, text = patch(bound, own, probe)
        self.assertEqual(st, 200, text[:300])
        for api, p, body, why in (
                (bound, other, probe, "only that node"),
                (bound, own, {"metadata": {"labels": {"node-role.kubernetes.io/x": ""}}},
                 "only kgpu.io/ labels"),
                (bound, own, {"metadata": {"annotations": {"example.com/x": "1"}}},
                 "only kgpu.io/ labels"),
                (bound, own, {"spec": {"unschedulable": True}}, "not its spec"),
                (bound, mine, {"metadata": {"annotations": {"kgpu.io/allocated": "x"}}},
                 "only pods bound to that node"),
                (unbound, own, probe, "must use the token of its pod")):
            st, text = patch(api, p, body)
            self.assertEqual(st, 403, "%s %r: %s" % (p, body, text[:300]))
            self.assertIn(why, json.loads(text)["message"])
        cp.admin.merge_patch(own, {"metadata": {"labels": {"kgpu.io/e2e-probe": None}}})

    # -- 17. kgpu's own scheduler: GPU pods routed to it by the chart's policy -----------

    def test_17_own_scheduler_routing_in_the_api_server(self):
        """ownScheduler.enabled: the chart's MutatingAdmissionPolicy, evaluated by the real
        API server, gives GPU pods (asking in a container or an init container) kgpu's
        scheduler, and leaves alone pods without a GPU, pods that name another scheduler,
        and, with a namespace selector, namespaces it does not select."""
        cp = self.cp
        text = kgpu_deploy.render(cp, CONFIG["build"], values=[
            "ownScheduler.enabled=true", "ownScheduler.tlsSecretName=unused",
            "ownScheduler.routing.via=policy"])
        docs = [d for d in text.split("\n---\n")
                if re.search(r"(?m)^kind: MutatingAdmissionPolicy(Binding)?$", d)]
        self.assertEqual(len(docs), 2, "the chart's routing policy and its binding")
        cp.kubectl("apply", "-f", "-", input="\n---\n".join(docs))
        base = "/apis/admissionregistration.k8s.io/v1/"
        for plural in ("mutatingadmissionpolicybindings", "mutatingadmissionpolicies"):
            self.cleanups.append(base + plural + "/kgpu-scheduler-routing")
        ns = "e2e-routing"
        cp.ensure_namespace(ns)
        n = [0]

        def scheduler_of(containers, init=None, scheduler=None, in_ns=ns):
            n[0] += 1
            pod = pod_object("route-%d" % n[0], containers, ns=in_ns, init=init)
            if scheduler:
                pod["spec"]["schedulerName"] = scheduler
            made = cp.admin.post(cluster.pod_path(in_ns), pod)
            self.created.append((in_ns, pod["metadata"]["name"]))
            return made["spec"]["schedulerName"]

        # The policy takes effect once the API server has loaded it.
        wait_for(lambda: scheduler_of([("main", {MEM: 1})]) == "kgpu-scheduler", 30,
                 "the routing policy to take effect")
        self.assertEqual(scheduler_of([("main", {WHOLE: 1})]), "kgpu-scheduler")
        self.assertEqual(scheduler_of([("main", {})], init=[("fetch", {MEM: 2})]),
                         "kgpu-scheduler")
        self.assertEqual(scheduler_of([("main", {})]), "default-scheduler")
        self.assertEqual(scheduler_of([("main", {MEM: 1})], scheduler="team-sched"),
                         "team-sched")
        # Only the namespaces the selector picks.
        cp.admin.merge_patch(base + "mutatingadmissionpolicybindings/kgpu-scheduler-routing",
                             {"spec": {"matchResources": {"namespaceSelector": {
                                 "matchLabels": {"kgpu.io/e2e-route": "yes"}}}}})
        wait_for(lambda: scheduler_of([("main", {MEM: 1})]) == "default-scheduler", 30,
                 "the selector to take effect")
        cp.admin.merge_patch("/api/v1/namespaces/" + ns,
                             {"metadata": {"labels": {"kgpu.io/e2e-route": "yes"}}})
        wait_for(lambda: scheduler_of([("main", {MEM: 1})]) == "kgpu-scheduler", 30,
                 "the labelled namespace to be routed")

    def test_18_own_scheduler_routing_by_the_extenders_webhook(self):
        """ownScheduler.routing.via=webhook (clusters without the v1 policy): the chart's
        MutatingWebhookConfiguration, called by the real API server without a client
        certificate, routes GPU pods through the extender's POST /mutate/pods; pods without
        a GPU never reach it. With the extender down, creating a GPU pod fails with the
        webhook's error, and pods without a GPU are still created."""
        import yaml  # python3-yaml (scripts/deps.sh)
        cp, tls = self.cp, self.cp.kgpu_tls
        if tls is None:
            self.skipTest("the extender runs without TLS here; webhooks need HTTPS")
        with open(tls.ca, "rb") as f:
            ca_bundle = base64.b64encode(f.read()).decode()
        text = kgpu_deploy.render(cp, CONFIG["build"], values=[
            "ownScheduler.enabled=true", "ownScheduler.tlsSecretName=unused",
            "ownScheduler.routing.via=webhook", "ownScheduler.routing.caBundle=" + ca_bundle])
        hooks = [d for d in yaml.safe_load_all(text)
                 if d and d.get("kind") == "MutatingWebhookConfiguration"]
        self.assertEqual(len(hooks), 1)
        self.assertIn('routePodsTo: "kgpu-scheduler"', text)
        # The extender's webhook, run as its pod would run it, called by URL (no kube-proxy).
        route = kgpu_deploy.Extender(cp, CONFIG["build"], self.ext_config,
                                     name="kgpu-extender-route",
                                     extra=["--route-pods-to", "kgpu-scheduler"]).start()
        try:
            hook = hooks[0]
            cc = hook["webhooks"][0]["clientConfig"]
            self.assertEqual(cc["service"]["path"], "/mutate/pods")
            del cc["service"]
            cc["url"] = "https://127.0.0.1:%d/mutate/pods" % route.port
            path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
            cp.admin.post(path, hook)
            self.cleanups.append(path + "/" + hook["metadata"]["name"])
            ns = "e2e-webhook"
            cp.ensure_namespace(ns)
            n = [0]

            def create(containers, scheduler=None):
                n[0] += 1
                pod = pod_object("hook-%d" % n[0], containers, ns=ns)
                if scheduler:
                    pod["spec"]["schedulerName"] = scheduler
                st, body = cp.admin.raw("POST", cluster.pod_path(ns), json.dumps(pod),
                                        "application/json")
                if st == 201:
                    self.created.append((ns, pod["metadata"]["name"]))
                return st, json.loads(body)

            def scheduler_of(containers, scheduler=None):
                st, body = create(containers, scheduler)
                self.assertEqual(st, 201, body)
                return body["spec"]["schedulerName"]

            wait_for(lambda: scheduler_of([("main", {MEM: 1})]) == "kgpu-scheduler", 30,
                     "the webhook to take effect")
            self.assertEqual(scheduler_of([("main", {})], ), "default-scheduler")
            self.assertEqual(scheduler_of([("main", {WHOLE: 1})], "team-sched"), "team-sched")
            # kgpu down: GPU pods are refused with the webhook's error, the others created.
            route.child.stop()
            st, body = create([("main", {MEM: 1})])
            self.assertEqual(st, 500, body)
            self.assertIn("pods.routing.kgpu.io", body.get("message", ""))
            self.assertEqual(scheduler_of([("main", {})]), "default-scheduler")
        finally:
            route.child.stop()

    def test_19_no_new_gpu_pod_on_a_leaving_node(self):
        """A node a spot interruption handler or an autoscaler is removing takes no new GPU
        pod, even one tolerating every taint (kube-scheduler's TaintToleration lets it
        through; kgpu's filter does not)."""
        spot = "aws-node-termination-handler/spot-itn"
        leaving = sorted(n for n in NODES if n != "gpu-v100-0")

        def taint(node, keys):
            self.cp.admin.merge_patch("/api/v1/nodes/" + node, {"spec": {"taints": [
                {"key": k, "value": "e2e", "effect": "NoSchedule"} for k in keys] or None}})

        def tolerant(name):
            pod = pod_object(name, [("main", {WHOLE: 1})])
            pod["spec"]["tolerations"] = [{"operator": "Exists"}]
            self.cp.create_pod(pod)
            self.created.append((E2E_NS, name))

        try:
            for node in leaving:
                taint(node, [spot])
            wait_for(lambda: self.ext.metric("kgpu_extender_nodes_leaving") == len(leaving),
                     30, "the extender to see the taints")
            for i in range(2):  # gpu-v100-0's two GPUs
                tolerant("spot-%d" % i)
                self.assertEqual(self.wait_bound("spot-%d" % i)["spec"]["nodeName"],
                                 "gpu-v100-0")
            # Cluster Autoscaler marks the last node too, and a GPU there comes free (so
            # kube-scheduler's own resource check passes it): nowhere to go, and why.
            taint("gpu-v100-0", ["ToBeDeletedByClusterAutoscaler"])
            wait_for(lambda: self.ext.metric("kgpu_extender_nodes_leaving") == len(NODES),
                     30, "the extender to see the last taint")
            self.cp.delete_pod(E2E_NS, "spot-1")
            wait_for(lambda: self.cp.get_pod(E2E_NS, "spot-1") is None, 30, "spot-1 to go")
            tolerant("spot-2")
            msg = self.failed_scheduling("spot-2")
            self.assertIn("node is leaving (taint %s:NoSchedule)" % spot, msg)
            self.assertIn("node is leaving (taint ToBeDeletedByClusterAutoscaler:NoSchedule)",
                          msg)
            # The notices are withdrawn: the waiting pod goes.
            for node in leaving + ["gpu-v100-0"]:
                taint(node, [])
            self.assertIn(self.wait_bound("spot-2")["spec"]["nodeName"], leaving)
            self.assert_state_matches()
        finally:
            for node in leaving + ["gpu-v100-0"]:
                taint(node, [])

    def test_20_consolidation_moves_a_restartable_share(self):
        """Every T4 holds something: a whole-GPU T4 pod fits nowhere. The extender evicts
        the one restartable share, through the Eviction API, so that it fits; the share's
        replacement goes beside another share; nothing else is evicted."""
        t4 = {"kgpu.io/gpu-type": "Tesla T4*"}
        audit = self.cp.audit_size()
        self.create("big", [("main", {MEM: 10})], annotations=t4)
        self.wait_bound("big")
        for i in range(2):
            self.create("full-%d" % i, [("main", {WHOLE: 1})], annotations=t4)
            self.wait_bound("full-%d" % i)
        # spread: the emptiest GPU, the last T4 left (binpack would go beside "big").
        self.create("mover", [("main", {MEM: 4})], annotations=dict(
            t4, **{"kgpu.io/restartable": "true", "kgpu.io/policy": "spread"}))
        mover = self.wait_bound("mover")
        self.assertEqual(mover["spec"]["nodeName"], "gpu-t4-0")
        freed = self.assignment(mover)[0]["gpus"][0]["index"]
        self.create("whole", [("main", {WHOLE: 1})], annotations=t4)
        nudge = self.nudger(every=10.0)

        def bound():
            nudge()
            self.play_kubelet()
            p = self.cp.get_pod(E2E_NS, "whole")
            return p if p["spec"].get("nodeName") else None
        pod = wait_for(bound, 90, "the whole-GPU pod to be bound after the move", interval=0.2)
        self.assertEqual(pod["spec"]["nodeName"], "gpu-t4-0")
        self.assertEqual(self.assignment(pod)[0]["gpus"][0]["index"], freed)
        self.assertIsNone(self.cp.get_pod(E2E_NS, "mover"))
        sa = "system:serviceaccount:kgpu-system:kgpu-extender"
        self.assertEqual([e for e in self.evictions(audit) if e[1] in (200, 201)],
                         [("mover", 201, sa)])
        # Its controller's new pod: the only room left is beside "big".
        self.create("mover-2", [("main", {MEM: 4})],
                    annotations=dict(t4, **{"kgpu.io/restartable": "true"}))
        big = self.assignment(self.cp.get_pod(E2E_NS, "big"))[0]["gpus"][0]["index"]
        again = self.wait_bound("mover-2")
        self.assertEqual(self.assignment(again)[0]["gpus"][0]["index"], big)
        self.assertGreaterEqual(self.ext.metric("kgpu_extender_consolidation_moves_total"), 1)
        self.assert_state_matches()

    def test_21_scale_down_guard_annotates_the_node_of_a_share_that_fits_nowhere_else(self):
        """gpu-t4-0 is the only T4 node: a T4 share there could run nowhere else, so the
        leader's guard marks the node for Cluster Autoscaler and Karpenter through the
        real API server (merge patch, the chart's RBAC), and unmarks it when the share
        ends. Nodes whose pods could move, or with none, are never marked."""
        ca, karpenter = ("cluster-autoscaler.kubernetes.io/scale-down-disabled",
                         "karpenter.sh/do-not-disrupt")

        def ann(node):
            return self.cp.admin.get("/api/v1/nodes/" + node)["metadata"].get(
                "annotations") or {}

        def guarded(node):
            a = ann(node)
            return a.get(ca) == "true" and a.get(karpenter) == "true" and \
                "kgpu.io/scale-down-guard" in a
        # The pods of the tests before are gone: within a round or two no node is marked.
        wait_for(lambda: not any(guarded(n) for n in NODES), 30, "no node marked")
        self.create("t4-share", [("main", {MEM: 4})],
                    annotations={"kgpu.io/gpu-type": "Tesla T4*"})
        self.wait_bound("t4-share")
        wait_for(lambda: guarded("gpu-t4-0"), 30, "gpu-t4-0 kept from scale-down")
        self.assertIn("fits no GPU of the other nodes", ann("gpu-t4-0")["kgpu.io/scale-down-guard"])
        for node in ("gpu-a100-0", "gpu-a100-1", "gpu-v100-0"):
            self.assertFalse(guarded(node), node)
        self.cp.delete_pod(E2E_NS, "t4-share")
        wait_for(lambda: self.cp.get_pod(E2E_NS, "t4-share") is None, 30, "t4-share to go")
        wait_for(lambda: not any(k in ann("gpu-t4-0") for k in
                                 (ca, karpenter, "kgpu.io/scale-down-guard")),
                 30, "gpu-t4-0 released")
        self.assertEqual(self.ext.metric("kgpu_extender_nodes_scale_down_guarded"), 0)

    def test_0_only_kube_scheduler_gets_in(self):
        """The extender runs the chart's config (HTTPS, client CA); kube-scheduler runs the
        shipped tlsConfig. Its calls succeed; a client without a certificate, or with one
        from another CA (the cluster's own), gets nothing but the probes; plain HTTP gets
        no answer; a refused call changes nothing."""
        shipped_sched, shipped_ext = self.cp.kgpu_shipped
        self.assertRegex(shipped_ext, r"(?m)^  clientCA: /etc/kgpu-tls/ca.crt$")
        self.assertRegex(shipped_ext, r"(?m)^probeListen: ")
        ext_cfg = self.cp.scheduler_config_text
        self.assertIn("enableHTTPS: true", shipped_sched)
        for key in ("caFile", "serverName", "certFile", "keyFile"):
            self.assertRegex(shipped_sched, r"(?m)^\s+%s: " % key)
        self.assertRegex(ext_cfg, r"(?m)^\s*-?\s*urlPrefix: https://127\.0\.0\.1:%d$" %
                         self.vip.port)
        tls = self.cp.kgpu_tls

        # kube-scheduler's calls: filter, prioritize and bind all reached the extender.
        before = {v: self.ext.metric("kgpu_extender_requests_total", 'verb="%s"' % v)
                  for v in ("filter", "bind")}
        self.create("authn-ok", [("main", {MEM: 2})])
        self.wait_bound("authn-ok")
        for verb, n in before.items():
            self.assertGreater(self.ext.metric("kgpu_extender_requests_total",
                                               'verb="%s"' % verb), n, verb)

        held, nodes = self.ext.held(), self.ext.inspect()["nodes"]
        fake = {"Pod": pod_object("intruder", [("main", {WHOLE: 8})]),
                "Nodes": {"items": [node_object("fake-node", A100, 32, 81920)]},
                "NodeNames": None}
        strangers = {
            "no certificate": self.cp.kgpu_tls.context(cert=False),
            "the cluster CA's admin certificate": tls.context(
                cert=(self.cp.admin_crt, self.cp.admin_key)),
            "a certificate the cluster CA gave kgpu-extender's own name": tls.context(
                cert=self.cp.pki.issue("impostor", "kube-scheduler")),
        }
        for who, ctx in strangers.items():
            for url in (self.ext.url, self.vip.url):  # directly, and through the Service
                with self.subTest(who=who, url=url):
                    for path in ("/filter", "/prioritize", "/preempt"):
                        st, body = self._call(url, "POST", path, ctx, fake)
                        self.assertEqual(st, 403, "%s %s: %r" % (who, path, body))
                    st, body = self._call(url, "POST", "/bind", ctx, {
                        "PodName": "authn-ok", "PodNamespace": E2E_NS, "PodUID": "x",
                        "Node": "gpu-t4-0"})
                    self.assertEqual(st, 403, body)
                    for path in ("/inspect", "/metrics", "/inspect/gpu-t4-0"):
                        st, body = self._call(url, "GET", path, ctx)
                        self.assertEqual(st, 403, "%s %s: %r" % (who, path, body))
                        self.assertNotIn(b"gpu-", body)
                    # /healthz and /readyz need no certificate here either.
                    self.assertEqual(self._call(url, "GET", "/healthz", ctx)[0], 200)
                    self.assertEqual(self._call(url, "GET", "/readyz", ctx)[0], 200)
        # The probe port: plain HTTP, anyone, /healthz and /readyz (kubelet's), nothing more.
        self.assertIsNotNone(self.ext.probe_port, "the extender has a probe listener")
        self.assertEqual(self.ext.probe("/healthz"), 200)
        self.assertEqual(self.ext.probe("/readyz"), 200)
        for path in ("/inspect", "/metrics", "/inspect/gpu-t4-0"):
            self.assertEqual(self.ext.probe(path), 404, path)
        for path in ("/filter", "/bind"):
            self.assertEqual(self.ext.probe(path, method="POST"), 405, path)
        # Plain HTTP to the HTTPS port: no HTTP answer at all.
        st = self._plain(self.vip.port)
        self.assertIsNone(st, "plain HTTP answered %r" % st)
        # Nothing they sent changed what the extender knows.
        self.assertEqual(self.ext.held(), held)
        self.assertEqual(self.ext.inspect()["nodes"], nodes)
        self.assertEqual(self.cp.get_pod(E2E_NS, "authn-ok")["spec"]["nodeName"],
                         self.wait_bound("authn-ok")["spec"]["nodeName"])
        self.assert_state_matches()

    @staticmethod
    def _call(url, method, path, ctx, doc=None):
        """(status, body) of one HTTPS request with TLS context ctx; (0, error) when the
        TLS handshake or connection failed."""
        u = urllib.parse.urlsplit(url)
        c = http.client.HTTPSConnection(u.hostname, u.port, context=ctx, timeout=10)
        try:
            body = json.dumps(doc).encode() if doc is not None else None
            c.request(method, path, body=body,
                      headers={"Content-Type": "application/json"} if body else {})
            r = c.getresponse()
            return r.status, r.read()
        except (OSError, http.client.HTTPException) as e:
            return 0, str(e).encode()
        finally:
            c.close()

    @staticmethod
    def _plain(port):
        """The status line of a plain-HTTP GET /healthz to port, None when none came."""
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            try:
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                pass
        return data.split(b"\r\n", 1)[0].decode("latin-1") if data.startswith(b"HTTP/") \
            else None
