#!/usr/bin/env python3
"""Reclaim between tenants in kgpu-extender's cluster mode (stdlib only; issue 24).

The real binary against the API server stand-in, as test_extender_gpuqueues.py
drives it (its fixture is reused). What one tenant's reclaim may do to the
others (docs/queues.md "Reclaim", docs/security.md):

- a guarantee is reclaimed for once: the pods of reclaims under way count
  against it, so a queue guaranteed one GPU with four pods waiting evicts
  one borrower, not four;
- the room a reclaim frees is held for the pod it was freed for: another
  queue's pod is refused there, at filter and at bind, until that pod is
  bound (or deleted, or the hold's time is up);
- reclaim frees no GPUs the waiting pod's queue limits (per model, memory)
  would refuse it: no eviction for nothing;
- what a tenant reads (filter reasons, Events on its pods) names no pod of
  another namespace, nor that namespace.

    test_extender_reclaim.py --extender PATH --kgpu PATH [unittest arguments...]

Exit status: unittest's; 77 when the binaries are missing.
"""

import sys

import test_extender as te
from harness import wait_for
from test_extender import container, gpu_list, pod_object, whole
from test_extender_gpuqueues import GPUQueueTest


class ReclaimTest(GPUQueueTest):

    def setUp(self):
        super().setUp()  # the stand-in, with n0: four A100 of 80 GiB

    def begin(self, **queues):
        for name, spec in queues.items():
            # Open to every namespace: which namespace may use which queue is
            # test_extender_gpuqueues.py's business, reclaim between tenants this file's.
            spec.setdefault("namespaceSelector", {})
            self.add_queue(name, **spec)
        self.start()
        self.wait_queues(lambda q: all(n in q for n in queues), "the queues read")

    def named(self, name, limits, ns="default", queue=None, priority=None, status=None):
        p = pod_object(name, [container("main", limits)])
        if queue:
            p["metadata"]["labels"]["kgpu.io/queue"] = queue
        if priority is not None:
            p["spec"]["priority"] = priority
        if status is not None:
            p["status"] = status
        return self.s.add_pod(p, ns)

    def run_on(self, node, limits, **kw):
        p = self.pod(limits, **kw)
        res = self.ext.filter(p, [node])
        self.assertEqual(res["NodeNames"], [node], res)
        self.assertEqual(self.ext.bind(p, node), "")
        return p

    def evictions(self):
        return self.s.api("GET", "/_control/evictions", expect=200)[1]

    def gone(self, pod):
        self.s.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])


class TestReclaimBetweenTenants(ReclaimTest):

    def test_a_guarantee_is_reclaimed_for_once(self):
        self.begin(a={"guarantee": {"gpu": 1}}, b={})
        for i in range(4):
            self.run_on("n0", whole(1), queue="b", priority=i)
        self.s.control(evict_keep=True)  # victims stay until deleted, as with a grace period
        waiting = [self.pod(whole(1), queue="a") for _ in range(4)]
        first = self.ext.filter(waiting[0], ["n0"])
        self.assertIn("waits for reclaim: evicting", first["FailedNodes"]["n0"])
        later = [self.ext.filter(p, ["n0"]) for p in waiting[1:]]
        self.assertEqual(len(self.evictions()), 1, self.evictions())
        for res in later:
            self.assertEqual(res["NodeNames"], [])
            self.assertIn("queue a's guarantee is taken by the reclaims under way",
                          res["FailedNodes"]["n0"])
        # Asked again, the same: one eviction for a guarantee of one GPU.
        for p in waiting:
            self.ext.filter(p, ["n0"])
        self.assertEqual(len(self.evictions()), 1, self.evictions())
        self.assertEqual(len(self.ext.inspect()["queue_evictions"]), 1)

    def test_room_reclaimed_is_held_for_its_pod(self):
        self.begin(a={"guarantee": {"gpu": 1}}, b={}, c={})
        borrowers = [self.run_on("n0", whole(1), queue="b", priority=i) for i in range(4)]
        self.s.control(evict_keep=True)
        owner = self.pod(whole(1), ns="team-a", queue="a")
        res = self.ext.filter(owner, ["n0"])
        self.assertIn("waits for reclaim", res["FailedNodes"]["n0"])
        self.assertEqual(len(self.evictions()), 1)
        victim = self.evictions()[0]["pod"].split("/")[1]
        self.gone([b for b in borrowers if b["metadata"]["name"] == victim][0])
        self.wait_queues(lambda q: q["b"]["used"]["gpu_milli"] == 3000, "the victim gone")
        # Another queue's pod: the freed GPU is not its to take, at filter or at bind.
        other = self.pod(whole(1), ns="team-c", queue="c")
        res = self.ext.filter(other, ["n0"])
        self.assertEqual(res["NodeNames"], [], res)
        self.assertIn("held for a pod of another namespace", res["FailedNodes"]["n0"])
        self.assertIn("held for a pod of another namespace", self.ext.bind(other, "n0"))
        self.assertEqual(self.queues()["c"]["pods"], 0)
        # A pod of the owner's namespace is told whose it is.
        mate = self.pod(whole(1), ns="team-a", queue="c")
        res = self.ext.filter(mate, ["n0"])
        self.assertIn("held for pod team-a/%s" % owner["metadata"]["name"],
                      res["FailedNodes"]["n0"])
        # The owner comes back: it fits, is bound, and the hold ends with that.
        res = self.ext.filter(owner, ["n0"])
        self.assertEqual(res["NodeNames"], ["n0"], res)
        self.assertEqual(self.ext.bind(owner, "n0"), "")
        left = [b for b in borrowers if b["metadata"]["name"] != victim]
        self.gone(left[0])
        self.wait_queues(lambda q: q["b"]["used"]["gpu_milli"] == 2000, "a borrower gone")
        res = self.ext.filter(other, ["n0"])
        self.assertEqual(res["NodeNames"], ["n0"], res)
        self.assertEqual(len(self.evictions()), 1)

    def limited_by(self, limits):
        """team-a holds its one A100 of `limits`; b fills the rest of n0."""
        self.begin(a=dict(guarantee={"gpu": 3}, **limits), b={})
        self.run_on("n0", whole(1), queue="a")
        for i in range(3):
            self.run_on("n0", whole(1), queue="b", priority=0)
        self.s.control(evict_keep=True)
        waiting = self.pod(whole(1), queue="a")
        res = self.ext.filter(waiting, ["n0"])
        self.assertEqual(res["NodeNames"], [])
        self.assertNotIn("waits for reclaim", res["FailedNodes"]["n0"])
        self.assertEqual(self.evictions(), [], "an eviction for nothing")
        # T4s it may use, borrowed at a higher priority: reclaim frees one of those.
        self.s.add_node("n1", gpu_list("n1", "T4", 16384, 2))
        wait_for(lambda: any(n["name"] == "n1" for n in self.ext.inspect()["nodes"]), 15,
                 what="n1 in the inventory")
        on_t4 = [self.run_on("n1", whole(1), queue="b", priority=5) for _ in range(2)]
        res = self.ext.filter(waiting, ["n0", "n1"])
        self.assertIn("waits for reclaim", res["FailedNodes"]["n1"])
        ev = self.evictions()
        self.assertEqual(len(ev), 1, ev)
        self.assertIn(ev[0]["pod"].split("/")[1], [p["metadata"]["name"] for p in on_t4])

    def test_a_model_limit_is_checked_before_evicting(self):
        self.limited_by({"models": [{"model": "A100", "limit": {"gpu": 1}}]})

    def test_a_memory_limit_is_checked_before_evicting(self):
        # A whole GPU counts its whole memory: a second A100 would be 160 Gi, a T4 96.
        self.limited_by({"limit": {"memory": "100Gi"}})

    def test_messages_name_no_pod_of_another_namespace(self):
        self.begin(a={"guarantee": {"gpu": 2}}, b={})
        secret = [self.named("secret-job-%d" % i, whole(1), ns="team-a", queue="b", priority=i)
                  for i in range(4)]
        for p in secret:
            res = self.ext.filter(p, ["n0"])
            self.assertEqual(self.ext.bind(p, "n0"), "", res)
        self.s.control(evict_keep=True)
        mine = self.pod(whole(1), ns="team-b", queue="a")
        said = [self.ext.filter(mine, ["n0"])["FailedNodes"]["n0"]]
        self.assertIn("evicting a pod of another namespace", said[0])
        # The leader's sweep for a pod kube-scheduler found no node for: its Event.
        self.named("unplaced", whole(1), ns="team-b", queue="a", status={
            "phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                "reason": "Unschedulable"}]})

        def reclaim_event():
            items = self.s.api("GET", "/api/v1/namespaces/team-b/events", expect=200)[1]["items"]
            return [e for e in items if e.get("reason", "").startswith("GPUQueueReclaim")]
        said += [e["message"] for e in wait_for(reclaim_event, 15, what="the sweep's Event")]
        # A budget refuses the next one: the reason says so without naming it.
        self.s.control(evict_status={"team-a/" + p["metadata"]["name"]: 429 for p in secret})
        late = self.pod(whole(1), ns="team-b", queue="a", priority=100)
        self.gone(mine)  # its reclaim ends with it: late may reclaim in its stead

        def blocked():
            said.append(self.ext.filter(late, ["n0"])["FailedNodes"]["n0"])
            return "PodDisruptionBudget" in said[-1]
        wait_for(blocked, 15, interval=0.1, what="reclaim blocked by the budgets")
        self.assertIn("the eviction of a pod of another namespace was refused", said[-1])
        # A bind under a uid filtered for a pod of team-a: refused without naming it.
        forged = {"metadata": {"name": "mine", "namespace": "team-b",
                               "uid": secret[0]["metadata"]["uid"]}}
        said.append(self.ext.bind(forged, "n0"))
        self.assertIn("a pod of another namespace", said[-1])
        for text in said:
            self.assertNotIn("team-a", text)
            self.assertNotIn("secret-job", text)
        self.assertEqual(len(self.evictions()), 2 + 2, self.evictions())


def main():
    return te.main_with_binaries("test_extender_reclaim", __doc__)


if __name__ == "__main__":
    sys.exit(main())
