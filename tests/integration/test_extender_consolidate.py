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
- what the waiting pod's owner reads names no pod of another namespace;

and the scale-down guard (--scale-down-guard): a node whose shares could not
run on the other nodes carries Cluster Autoscaler's and Karpenter's
do-not-remove annotations until it may go; an operator's own are untouched.

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


CA = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
KARPENTER = "karpenter.sh/do-not-disrupt"
MARK = "kgpu.io/scale-down-guard"


class TestScaleDownGuard(ConsolidationTest):
    """--scale-down-guard: a node whose shares could not run on the other nodes carries
    Cluster Autoscaler's and Karpenter's do-not-remove annotations, with kgpu's mark;
    they go once it may be removed; an operator's own annotation is never touched."""

    def annotations(self, node):
        obj = self.s.api("GET", "/api/v1/nodes/" + node, expect=200)[1]
        return obj["metadata"].get("annotations") or {}

    def guarded(self, node):
        a = self.annotations(node)
        return a.get(CA) == "true" and a.get(KARPENTER) == "true" and MARK in a

    def patch_node(self, node, patch):
        self.s.api("PATCH", "/api/v1/nodes/" + node, patch, "application/merge-patch+json",
                   expect=200)

    def test_a_node_whose_shares_fit_nowhere_else_stays(self):
        self.start("--scale-down-guard", "1")
        a = self.run_on("n0", share(mem=50))
        self.run_on("n1", share(mem=40))
        # 50 + 40 GiB fit no one A100: neither node may go.
        wait_for(lambda: self.guarded("n0") and self.guarded("n1"), 15, what="both guarded")
        why = self.annotations("n0")[MARK]
        self.assertIn("fits no GPU of the other nodes", why)
        self.assertNotIn(a["metadata"]["name"], why)  # counts only, no pod named
        wait_for(lambda: self.ext.metric("kgpu_extender_nodes_scale_down_guarded") == 2, 15,
                 what="the gauge")
        # An empty A100 comes: each share could go there, so both may be removed.
        self.s.add_node("n2", gpu_list("n2", "A100", 81920, 1))
        wait_for(lambda: not self.guarded("n0") and not self.guarded("n1"), 15,
                 what="both released")
        for n in ("n0", "n1"):
            ann = self.annotations(n)
            for key in (CA, KARPENTER, MARK):
                self.assertNotIn(key, ann)
        # The empty node is leaving (an autoscaler's taint): it is no room.
        self.patch_node("n2", {"spec": {"taints": [
            {"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]}})
        wait_for(lambda: self.guarded("n0") and self.guarded("n1"), 15, what="guarded again")
        # The 50 GiB share goes: n0 is empty (nothing to keep it for), and n1's 40 GiB
        # share would fit there now, so n1 may go as well.
        self.s.delete_pod("default", a["metadata"]["name"])
        wait_for(lambda: not self.guarded("n0") and not self.guarded("n1"), 15,
                 what="both released")
        wait_for(lambda: self.ext.metric("kgpu_extender_nodes_scale_down_guarded") == 0, 15,
                 what="the gauge at 0")

    def test_an_operators_annotation_is_never_touched(self):
        self.patch_node("n0", {"metadata": {"annotations": {CA: "true"}}})
        self.start("--scale-down-guard", "1")
        p = self.run_on("n0", share(mem=50))
        self.run_on("n1", share(mem=40))
        wait_for(lambda: self.guarded("n1"), 15, what="n1 guarded")
        self.assertEqual(self.annotations("n0"), {**self.annotations("n0"), CA: "true"})
        self.assertNotIn(MARK, self.annotations("n0"))
        self.assertNotIn(KARPENTER, self.annotations("n0"))
        self.s.delete_pod("default", p["metadata"]["name"])
        wait_for(lambda: not self.guarded("n1"), 15, what="n1 released")
        self.assertEqual(self.annotations("n0").get(CA), "true")  # still the operator's

    def test_off(self):
        self.start("--scale-down-guard", "0")
        self.run_on("n0", share(mem=50))
        self.run_on("n1", share(mem=40))
        import time
        time.sleep(2)
        self.assertFalse(self.guarded("n0") or self.guarded("n1"))


class TestEmptyingNodes(ConsolidationTest):
    """--consolidate-nodes: a node whose GPU pods are all restartable and could all run on
    the other nodes is emptied through the Eviction API, one at a time, and closed to new
    GPU pods meanwhile, so that an autoscaler removes it."""

    def test_a_node_of_restartable_pods_that_fit_elsewhere_is_emptied(self):
        self.start("--scale-down-guard", "1", "--consolidate-nodes")
        r = self.run_on("n0", share(mem=30), annotations=RESTARTABLE)
        self.run_on("n1", share(mem=40))  # could move to n0, but is not restartable
        key = "default/" + r["metadata"]["name"]
        wait_for(lambda: self.evictions() == [{"pod": key, "status": 201}], 15,
                 what="n0's pod evicted")
        self.assertEqual(self.ext.metric("kgpu_extender_nodes_emptied_total"), 1)
        # n0 takes no new GPU pod while it is being emptied; n1 does.
        res = self.ext.filter(self.pod(share(mem=10)), ["n0", "n1"])
        self.assertEqual(res["NodeNames"], ["n1"], res)
        self.assertIn("kgpu is emptying it", res["FailedAndUnresolvableNodes"]["n0"])
        # The pod's replacement goes to n1; n1 itself is never emptied (not restartable).
        again = self.pod(share(mem=30), annotations=RESTARTABLE)
        self.assertEqual(self.ext.filter(again, ["n0", "n1"])["NodeNames"], ["n1"])
        import time
        time.sleep(2.5)
        self.assertEqual(len(self.evictions()), 1, self.evictions())

    def test_nothing_is_emptied_without_the_flag_or_room(self):
        self.start("--scale-down-guard", "1")
        self.run_on("n0", share(mem=30), annotations=RESTARTABLE)
        self.run_on("n1", share(mem=40))
        import time
        time.sleep(2.5)
        self.assertEqual(self.evictions(), [])
        self.assertEqual(self.ext.metric("kgpu_extender_nodes_emptied_total"), 0)

    def test_no_room_elsewhere_no_emptying(self):
        self.start("--scale-down-guard", "1", "--consolidate-nodes")
        self.run_on("n0", share(mem=50), annotations=RESTARTABLE)
        self.run_on("n1", share(mem=40), annotations=RESTARTABLE)
        import time
        time.sleep(2.5)
        self.assertEqual(self.evictions(), [])  # neither share fits beside the other

    def test_the_flag_needs_the_guard(self):
        import subprocess
        out = subprocess.run([te.EXTENDER_BIN, "--consolidate-nodes", "--scale-down-guard", "0",
                              "--cluster-file", te.os.path.join(te.SOURCE_DIR, "examples",
                                                                "cluster.yaml")],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("--consolidate-nodes runs in the scale-down guard's rounds", out.stderr)


def main():
    return te.main_with_binaries("test_extender_consolidate", __doc__)


if __name__ == "__main__":
    sys.exit(main())
