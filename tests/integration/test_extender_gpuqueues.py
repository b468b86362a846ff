#!/usr/bin/env python3
"""GPU queues in kgpu-extender's cluster mode (stdlib only; issue 15).

The real binary against the API server stand-in, which serves GPUQueue
objects (kgpu.io/v1alpha1, status subresource), namespaces and the
Eviction API, as test_extender.py drives it (its helpers are reused):

- the tree comes from GPUQueue objects, a namespace's queue from its
  kgpu.io/queue annotation; no CRD (404): queues off, said once, and on
  as soon as the resource is served;
- the status written through /status: observedGeneration, used, borrowed,
  pods, pending, the Valid condition; written again only when it changes;
- an invalid set of queues: Valid False on every queue with the error,
  and the last valid tree still enforced;
- a pod's label names only a queue its namespace may use (issue 24): a
  tenant labelling its pods with another team's queue is refused at filter
  and bind, charged to its own queue when found running, and never
  reclaimed for; a tree with a guarantee no limit above it can honour is
  refused, Valid False;
- reclaim through the Eviction API: 201 (the victim charged until its pod
  is gone), 429 (a PodDisruptionBudget: another victim is chosen, and with
  none left the reason names the refused pod), 404 (gone already).

    test_extender_gpuqueues.py --extender PATH --kgpu PATH [unittest arguments...]

Exit status: unittest's; 77 when the binaries are missing.
"""

import sys
import time

import test_extender as te
from harness import wait_for
from test_extender import (ExtenderTest, assignment_annotation, container, gpu_list, pod_object,
                           whole)

GQ = "/apis/kgpu.io/v1alpha1/gpuqueues"


def gpuqueue(name, **spec):
    return {"apiVersion": "kgpu.io/v1alpha1", "kind": "GPUQueue", "metadata": {"name": name},
            "spec": spec}


class GPUQueueTest(ExtenderTest):

    def setUp(self):
        super().setUp()
        self.s = self.start_standin()
        self.s.add_node("n0", gpu_list("n0", "A100", 81920, 4))
        self.n = 0

    def start(self):
        self.ext = self.start_extender_for(self.s)
        return self.ext

    def add_queue(self, name, **spec):
        # The tests' pods run in namespace default: their labels may name these queues.
        spec.setdefault("namespaces", ["default"])
        self.s.api("POST", GQ, gpuqueue(name, **spec), expect=201)

    def queue_obj(self, name):
        return self.s.api("GET", GQ + "/" + name, expect=200)[1]

    def pod(self, limits, ns="default", queue=None, priority=None):
        self.n += 1
        p = pod_object("p%d" % self.n, [container("main", limits)])
        if queue:
            p["metadata"]["labels"]["kgpu.io/queue"] = queue
        if priority is not None:
            p["spec"]["priority"] = priority
        return self.s.add_pod(p, ns)

    def run_pod(self, limits, **kw):
        p = self.pod(limits, **kw)
        res = self.ext.filter(p, ["n0"])
        self.assertEqual(res["NodeNames"], ["n0"], res)
        self.assertEqual(self.ext.bind(p, "n0"), "")
        return p

    def queues(self):
        return {q["name"]: q for q in self.ext.inspect()["queues"]}

    def wait_queues(self, pred, what):
        return wait_for(lambda: pred(self.queues()), 15, what=what)

    def wait_status(self, name, pred, what):
        def ok():
            st = self.queue_obj(name).get("status")
            return st if st is not None and pred(st) else None
        return wait_for(ok, 15, what=what)


class TestGPUQueues(GPUQueueTest):

    def test_crd_absent_then_served(self):
        self.s.control(crd_absent=True)
        self.start()
        time.sleep(1.5)  # a few relists
        doc = self.ext.inspect()
        self.assertFalse(doc["queues_enabled"])
        self.assertEqual(self.ext.log().count("no GPUQueue resource"), 1)
        self.run_pod(whole(1), queue="team-a")  # queues off: nothing refused
        self.s.control(crd_absent=False)
        self.add_queue("team-a", limit={"gpu": 1})
        self.wait_queues(lambda q: "team-a" in q and q["team-a"]["pods"] == 1,
                         "queues on, the running pod charged")
        res = self.ext.filter(self.pod(whole(1), queue="team-a"), ["n0"])
        self.assertEqual(res["FailedNodes"]["n0"], "queue team-a would use 2 GPUs of its limit 1")

    def test_status_namespace_and_limit(self):
        self.s.api("POST", "/api/v1/namespaces", {"metadata": {
            "name": "ml-a", "annotations": {"kgpu.io/queue": "team-a"}}}, expect=201)
        self.add_queue("org", guarantee={"gpu": 2}, limit={"gpu": "3"})
        self.add_queue("team-a", parent="org", guarantee={"gpu": "1500m", "memory": "80Gi"},
                       limit={"gpu": 2, "memory": 274877906944})
        self.start()
        self.wait_queues(lambda q: "team-a" in q, "the GPUQueues read")
        self.run_pod(whole(1), ns="ml-a")  # in team-a by its namespace
        st = self.wait_status("team-a", lambda st: st.get("pods") == 1, "team-a's status")
        self.assertEqual(st["observedGeneration"], 1)
        self.assertEqual(st["used"], {"gpu": "1", "memory": "80Gi"})
        self.assertEqual((st["borrowed"], st["pending"]), ({"gpu": "0"}, 0))
        self.assertEqual([(c["type"], c["status"], c["reason"]) for c in st["conditions"]],
                         [("Valid", "True", "Valid")])
        self.assertIn("lastTransitionTime", st["conditions"][0])
        # Over team-a's limit: refused with the reason, and pending in the status.
        res = self.ext.filter(self.pod(whole(2), ns="ml-a"), ["n0"])
        self.assertEqual(res["FailedNodes"]["n0"], "queue team-a would use 3 GPUs of its limit 2")
        st = self.wait_status("team-a", lambda st: st.get("pending") == 1, "pending 1")
        self.assertEqual(self.wait_status("org", lambda s: s.get("pending") == 1, "org")["pods"], 1)
        # Written only when it changes.
        time.sleep(2.5)
        before = self.s.stats()["status_patches"]
        time.sleep(5)
        self.assertEqual(self.s.stats()["status_patches"], before)
        # A new spec: observed.
        self.s.api("PATCH", GQ + "/team-a", {"spec": {"weight": 3}},
                   "application/merge-patch+json", expect=200)
        self.wait_status("team-a", lambda st: st.get("observedGeneration") == 2,
                         "observedGeneration 2")
        self.assertEqual(self.queues()["team-a"]["weight"], 3)

    def test_invalid_set_keeps_the_last_valid_tree(self):
        self.add_queue("team-a", limit={"gpu": 1})
        self.start()
        self.wait_status("team-a", lambda st: st["conditions"][0]["status"] == "True", "valid")
        self.add_queue("lost", parent="nowhere")
        for name in ("team-a", "lost"):
            st = self.wait_status(name, lambda st: st["conditions"][0]["status"] == "False",
                                  "Valid False on " + name)
            c = st["conditions"][0]
            self.assertEqual(c["reason"], "InvalidQueues")
            self.assertIn("queue lost: parent nowhere is not defined", c["message"])
            self.assertIn("keeps enforcing the last valid set of queues", c["message"])
        self.assertIn("stays in force", self.ext.log())
        self.run_pod(whole(1), queue="team-a")
        res = self.ext.filter(self.pod(whole(1), queue="team-a"), ["n0"])
        self.assertEqual(res["FailedNodes"]["n0"], "queue team-a would use 2 GPUs of its limit 1")
        self.assertNotIn("lost", self.queues())
        self.s.api("DELETE", GQ + "/lost", expect=200)
        self.wait_status("team-a", lambda st: st["conditions"][0]["status"] == "True",
                         "valid again")


class TestTenantBoundaries(GPUQueueTest):
    """Issue 24: a tenant limited to 1 GPU labels its pods with team-a's queue."""

    def namespace(self, name, queue=None, labels=None):
        meta = {"name": name}
        if queue:
            meta["annotations"] = {"kgpu.io/queue": queue}
        if labels:
            meta["labels"] = labels
        self.s.api("POST", "/api/v1/namespaces", {"metadata": meta}, expect=201)

    def test_a_label_naming_another_teams_queue(self):
        self.s.add_node("n1", gpu_list("n1", "A100", 81920, 4))
        self.namespace("tenant", "tenant-q")
        self.namespace("ml-a", "team-a")
        self.namespace("batch", labels={"kgpu.io/tier": "batch"})
        self.add_queue("tenant-q", limit={"gpu": 1}, namespaces=[])
        self.add_queue("team-a", guarantee={"gpu": 2}, namespaces=[])
        self.add_queue("b", namespaces=[],
                       namespaceSelector={"matchLabels": {"kgpu.io/tier": "batch"}})
        # Found running after a restart with the forbidden label: 1 GPU of n0.
        gpu = (0, "GPU-n0-0", 1000, 81920)
        ann = {"kgpu.io/assignment": assignment_annotation([("main", True, [gpu])]),
               "kgpu.io/node": "n0", "kgpu.io/bind-time": "2025-01-01T00:00:00.0Z"}
        held = pod_object("held", [container("main", whole(1))], ann, node_name="n0",
                          phase="Running")
        held["metadata"]["labels"]["kgpu.io/queue"] = "team-a"
        self.s.add_pod(held, "tenant")
        self.start()
        self.wait_queues(lambda q: "team-a" in q and q["tenant-q"]["pods"] == 1,
                         "the held pod charged to its namespace's queue")
        q = self.queues()
        self.assertEqual((q["team-a"]["pods"], q["team-a"]["used"]["gpu_milli"]), (0, 0))
        self.assertEqual(q["tenant-q"]["used"]["gpu_milli"], 1000)
        self.assertIn("pod tenant/held: queue team-a (the pod's kgpu.io/queue label) does not "
                      "exist or is not open to namespace tenant", self.ext.log())
        self.assertIn("charged to queue tenant-q", self.ext.log())
        # Borrowers of b (admitted by its selector) take every other GPU.
        borrowers = []
        for i in range(7):
            p = self.pod(whole(1), ns="batch", queue="b", priority=i)
            res = self.ext.filter(p, ["n0", "n1"])
            self.assertTrue(res["NodeNames"], res)
            self.assertEqual(self.ext.bind(p, res["NodeNames"][0]), "")
            borrowers.append(p)
        # A new pod with the label: refused at filter on every node, and at bind, in words
        # that name the namespace and the queue it gave, nothing of team-a's tree; no reclaim.
        p = self.pod(whole(1), ns="tenant", queue="team-a", priority=100)
        res = self.ext.filter(p, ["n0", "n1"])
        self.assertEqual(res["NodeNames"], [])
        for node in ("n0", "n1"):
            self.assertIn("queue team-a (the pod's kgpu.io/queue label) does not exist or is "
                          "not open to namespace tenant", res["FailedNodes"][node])
        self.assertIn("not open to namespace tenant", self.ext.bind(p, "n0"))
        self.assertEqual(self.s.api("GET", "/_control/evictions", expect=200)[1], [])
        # Left Unschedulable for the sweep, with a higher priority than team-a's own pod.
        self.s.patch_pod("tenant", p["metadata"]["name"], {"status": {"conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}})
        own = self.pod(whole(1), ns="ml-a", priority=1)
        self.s.patch_pod("ml-a", own["metadata"]["name"], {"status": {"conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}})
        # The sweep reclaims for team-a's own pod only (the tenant's came first, if ever).
        ev = wait_for(lambda: self.ext.inspect()["queue_evictions"], 15,
                      what="a reclaim for team-a's own pod")
        self.assertEqual({(e["for_namespace"], e["for_pod"]) for e in ev},
                         {("ml-a", own["metadata"]["name"])})
        self.assertEqual(len(self.s.api("GET", "/_control/evictions", expect=200)[1]), 1)
        self.assertEqual(self.queues()["team-a"]["pending"], 1)

    def test_a_guarantee_no_limit_above_can_honour(self):
        self.add_queue("team-a", limit={"gpu": 2})
        self.start()
        self.wait_status("team-a", lambda st: st["conditions"][0]["status"] == "True", "valid")
        self.add_queue("ml", parent="team-a", guarantee={"gpu": 4})
        for name in ("team-a", "ml"):
            st = self.wait_status(name, lambda st: st["conditions"][0]["status"] == "False",
                                  "Valid False on " + name)
            self.assertIn("queue ml: guarantee.gpu 4 cannot be honoured: queue team-a above it "
                          "has limit.gpu 2", st["conditions"][0]["message"])
        self.assertNotIn("ml", self.queues())


class TestEvictions(GPUQueueTest):

    def setUp(self):
        super().setUp()
        self.add_queue("a", guarantee={"gpu": 2})
        self.add_queue("b")
        self.start()
        self.wait_queues(lambda q: "b" in q, "queues")
        self.borrowers = [self.run_pod(whole(1), queue="b", priority=i) for i in range(4)]

    def evictions(self):
        return self.s.api("GET", "/_control/evictions", expect=200)[1]

    def name(self, i):
        return "default/" + self.borrowers[i]["metadata"]["name"]

    def test_evicted_then_gone(self):
        self.s.control(evict_keep=True)
        waiting = self.pod(whole(1), queue="a")
        res = self.ext.filter(waiting, ["n0"])
        self.assertEqual(res["NodeNames"], [])
        self.assertIn("waits for reclaim: evicting %s (queue b)" % self.name(0),
                      res["FailedNodes"]["n0"])
        self.assertEqual(self.evictions(), [{"pod": self.name(0), "status": 201}])
        ev = self.ext.inspect()["queue_evictions"]
        self.assertEqual([(e["pod"], e["outcome"], e["for_queue"]) for e in ev],
                         [(self.borrowers[0]["metadata"]["name"], "evicted", "a")])
        # Still charged while its pod is there, and not evicted twice.
        self.assertEqual(self.queues()["b"]["used"]["gpu_milli"], 4000)
        res = self.ext.filter(waiting, ["n0"])
        self.assertIn("waits for reclaim", res["FailedNodes"]["n0"])
        self.assertEqual(len(self.evictions()), 1)
        self.assertEqual(self.queues()["a"]["pending"], 1)
        self.s.delete_pod("default", self.borrowers[0]["metadata"]["name"])
        self.wait_queues(lambda q: q["b"]["used"]["gpu_milli"] == 3000, "the victim released")
        res = self.ext.filter(waiting, ["n0"])
        self.assertEqual(res["NodeNames"], ["n0"], res)
        self.assertEqual(self.ext.bind(waiting, "n0"), "")
        self.assertEqual(self.queues()["b"]["evictions"], 1)
        text = self.ext.metrics()
        self.assertEqual(self.ext.metric("kgpu_queue_evictions_total", {"queue": "b"}, text), 1)
        self.assertIn("reclaim: %s (queue b" % self.name(0), self.ext.log())

    def test_disruption_budget_and_gone(self):
        self.s.control(evict_status={self.name(0): 429, self.name(1): 429, self.name(2): 404})
        waiting = self.pod(whole(1), queue="a")
        # b0 refused, then b1 refused, then b2 already gone: the pod fits.
        for want in (self.name(0), self.name(1)):
            res = self.ext.filter(waiting, ["n0"])
            self.assertIn("evicting %s" % want, res["FailedNodes"]["n0"])
        res = self.ext.filter(waiting, ["n0"])
        self.assertIn("evicting %s" % self.name(2), res["FailedNodes"]["n0"])
        self.assertEqual([e["status"] for e in self.evictions()], [429, 429, 404])
        outcomes = [e["outcome"] for e in self.ext.inspect()["queue_evictions"]]
        self.assertEqual(outcomes, ["gone", "blocked", "blocked"])
        res = self.ext.filter(waiting, ["n0"])
        self.assertEqual(res["NodeNames"], ["n0"], res)
        self.assertEqual(self.ext.bind(waiting, "n0"), "")
        # Another pod of a: b3 is refused too, and nothing else would make room.
        self.s.control(evict_status={self.name(0): 429, self.name(1): 429, self.name(3): 429})
        waiting = self.pod(whole(1), queue="a")
        res = self.ext.filter(waiting, ["n0"])
        self.assertIn("evicting %s" % self.name(3), res["FailedNodes"]["n0"])
        res = self.ext.filter(waiting, ["n0"])
        self.assertIn("reclaim is blocked by a PodDisruptionBudget: the eviction of default/",
                      res["FailedNodes"]["n0"])
        self.assertEqual(len(self.evictions()), 4)


def main():
    return te.main_with_binaries("test_extender_gpuqueues", __doc__)


if __name__ == "__main__":
    sys.exit(main())
