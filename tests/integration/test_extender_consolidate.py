#!/usr/bin/env python3
"""Consolidation in kgpu-extender's cluster mode (stdlib only; issue 28).

The real binary against the API server stand-in, with --consolidate: a pod
that fits none of the nodes offered gets room by moving restartable pods
(docs/autoscaling.md "Moving pods to make room"):

- only pods annotated kgpu.io/restartable: "true", of no higher priority
  than the waiting pod, are evicted, through the Eviction API, and only
  when each fits elsewhere; nothing at all without --consolidate;
- the room freed is held for the waiting pod until it is bound;
- a PodDisruptionBudget's refusal (429) moves nothing, and that pod is
  left alone for a while;
- what the waiting pod's owner reads names no pod of another namespace.

    test_extender_consolidate.py --extender PATH --kgpu PATH [unittest arguments...]

Exit status: unittest's; 77 when the binaries are missing.
"""

import sys

import test_extender as te
from harness import wait_for
from test_extender import container, gpu_list, pod_object, share, whole

RESTARTABLE = {"kgpu.io/restartable": "true"}


class ConsolidationTest(te.ExtenderTest):

    def setUp(self):
        super().setUp()
        self.s = self.start_standin()
        # Two A100 of 80 GiB, one per node: a 30 GiB share fits beside a 40 GiB one.
        self.s.add_node("n0", gpu_list("n0", "A100", 81920, 1))
        self.s.add_node("n1", gpu_list("n1", "A100", 81920, 1))
        self.n = 0

    def start(self, *extra):
        self.ext = self.start_extender_for(self.s, extra=list(extra))
        wait_for(lambda: len(self.ext.inspect()["nodes"]) == 2, 15, what="both nodes read")
        return self.ext

    def pod(self, limits, ns="default", annotations=None, priority=None):
        self.n += 1
        p = pod_object("p%d" % self.n, [container("main", limits)], annotations=annotations)
        if priority is not None:
            p["spec"]["priority"] = priority
        return self.s.add_pod(p, ns)

    def run_on(self, node, limits, **kw):
        p = self.pod(limits, **kw)
        res = self.ext.filter(p, [node])
        self.assertEqual(res["NodeNames"], [node], res)
        self.assertEqual(self.ext.bind(p, node), "")
        return p

    def bound(self):
        """Names of the pods the extender counts as bound, on every GPU."""
        return {p["pod"] for n in self.ext.inspect()["nodes"] for g in n["gpus"]
                for p in g["pods"] if p["status"] == "bound"}

    def held(self, pod):
        """Wait until the extender counts the pod as bound (the watch saw its binding)."""
        name = pod["metadata"]["name"]
        wait_for(lambda: name in self.bound(), 15, what="%s bound" % name)

    def evictions(self):
        return self.s.api("GET", "/_control/evictions", expect=200)[1]

    def fragmented(self, r_annotations=RESTARTABLE, r_priority=None):
        """n0: a 30 GiB share `r`; n1: a 40 GiB share, not restartable. A whole GPU fits
        neither, and fits n0 once r moves beside the 40 GiB one."""
        r = self.run_on("n0", share(mem=30), annotations=r_annotations, priority=r_priority)
        self.run_on("n1", share(mem=40))
        self.held(r)
        return r


class TestConsolidation(ConsolidationTest):

    def test_a_restartable_pod_moves_and_the_room_is_held(self):
        self.start("--consolidate", "1")
        r = self.fragmented()
        w = self.pod(whole(1))
        res = self.ext.filter(w, ["n0", "n1"])
        self.assertEqual(res["NodeNames"], [], res)
        self.assertIn("waits for consolidation: moving default/%s" % r["metadata"]["name"],
                      res["FailedNodes"]["n0"])
        self.assertEqual(self.evictions(), [{"pod": "default/" + r["metadata"]["name"],
                                             "status": 201}])
        self.assertEqual(self.ext.metric("kgpu_extender_consolidations_total"), 1)
        self.assertEqual(self.ext.metric("kgpu_extender_consolidation_moves_total"), 1)
        # The stand-in deleted it, as the API server does once its grace period is over.
        wait_for(lambda: r["metadata"]["name"] not in self.bound(), 15, what="r gone")
        # The GPU freed is the waiting pod's: another whole-GPU pod is refused there.
        other = self.pod(whole(1), ns="team-b")
        res = self.ext.filter(other, ["n0", "n1"])
        self.assertEqual(res["NodeNames"], [], res)
        self.assertIn("held for a pod of another namespace", res["FailedNodes"]["n0"])
        # r's replacement (its controller's new pod) fits beside the 40 GiB share.
        again = self.pod(share(mem=30), annotations=RESTARTABLE)
        self.assertEqual(self.ext.filter(again, ["n0", "n1"])["NodeNames"], ["n1"])
        res = self.ext.filter(w, ["n0", "n1"])
        self.assertEqual(res["NodeNames"], ["n0"], res)
        self.assertEqual(self.ext.bind(w, "n0"), "")
        self.assertEqual(len(self.evictions()), 1)

    def test_nothing_moves_without_the_flag_or_the_opt_in(self):
        self.start()
        self.fragmented()
        res = self.ext.filter(self.pod(whole(1)), ["n0", "n1"])
        self.assertEqual(res["NodeNames"], [])
        self.assertNotIn("consolidation", str(res))
        self.assertEqual(self.evictions(), [])

    def test_only_the_exact_opt_in_counts(self):
        self.start("--consolidate", "3")
        self.fragmented(r_annotations={"kgpu.io/restartable": "True"})
        res = self.ext.filter(self.pod(whole(1)), ["n0", "n1"])
        self.assertEqual(res["NodeNames"], [])
        self.assertEqual(self.evictions(), [])
        self.assertEqual(self.ext.metric("kgpu_extender_consolidations_total"), 0)

    def test_a_pod_of_higher_priority_is_not_moved_for_a_lower_one(self):
        self.start("--consolidate", "1")
        self.fragmented(r_priority=100)
        res = self.ext.filter(self.pod(whole(1), priority=10), ["n0", "n1"])
        self.assertEqual(res["NodeNames"], [])
        self.assertEqual(self.evictions(), [])
        # As important, or more: it is.
        res = self.ext.filter(self.pod(whole(1), priority=100), ["n0", "n1"])
        self.assertIn("waits for consolidation", res["FailedNodes"]["n0"])
        self.assertEqual(len(self.evictions()), 1)

    def test_only_the_nodes_offered_host_the_pod(self):
        """kube-scheduler offered n1 alone (n0 failed its own filters): moving r off n0
        would free a GPU the pod cannot use, and n1's share is not restartable."""
        self.start("--consolidate", "1")
        self.fragmented()
        res = self.ext.filter(self.pod(whole(1)), ["n1"])
        self.assertEqual(res["NodeNames"], [])
        self.assertEqual(self.evictions(), [])

    def test_a_move_with_nowhere_to_go_is_not_made(self):
        self.start("--consolidate", "1")
        self.run_on("n0", share(mem=50), annotations=RESTARTABLE)
        self.run_on("n1", share(mem=40))
        res = self.ext.filter(self.pod(whole(1)), ["n0", "n1"])
        self.assertEqual(res["NodeNames"], [])
        self.assertEqual(self.evictions(), [])

    def test_a_disruption_budget_refusal_moves_nothing(self):
        self.start("--consolidate", "1")
        r = self.fragmented()
        key = "default/" + r["metadata"]["name"]
        self.s.control(evict_status={key: 429})
        w = self.pod(whole(1))
        res = self.ext.filter(w, ["n0", "n1"])
        self.assertEqual(res["NodeNames"], [])
        self.assertEqual(self.evictions(), [{"pod": key, "status": 429}])
        self.assertEqual(self.ext.metric("kgpu_extender_consolidation_moves_total"), 0)
        self.assertIn("blocked by a PodDisruptionBudget", self.ext.log())
        # Asked again at once: r is left alone for a while, nothing else could move.
        res = self.ext.filter(w, ["n0", "n1"])
        self.assertEqual(res["NodeNames"], [])
        self.assertEqual(len(self.evictions()), 1)
        self.assertIn(r["metadata"]["name"], self.bound())

    def test_the_owner_reads_no_other_namespace(self):
        self.start("--consolidate", "1")
        self.fragmented()
        res = self.ext.filter(self.pod(whole(1), ns="team-b"), ["n0", "n1"])
        why = res["FailedNodes"]["n0"]
        self.assertIn("waits for consolidation: moving a pod of another namespace", why)
        self.assertNotIn("default", why)
        self.assertNotIn("p1", why)


def main():
    return te.main_with_binaries("test_extender_consolidate", __doc__)


if __name__ == "__main__":
    sys.exit(main())
