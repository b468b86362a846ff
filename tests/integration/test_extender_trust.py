#!/usr/bin/env python3
"""What kgpu-extender believes, and whom (stdlib only; issue 12's trust and state items).

The real binary against the API server stand-in, or a cluster file, driven in
kube-scheduler's wire format as test_extender.py does (its helpers are reused):

- No inventory from strangers: Node objects in a filter's Nodes.items (the
  nodeCacheCapable: false form, which any client can send) name candidates
  and nothing more. A node that is not in the API server is failed, binding
  to it fails, and a known node's object cannot change its GPUs.
- The GPU model table (64 ids) holds what the inventory has: models that no
  node has any more are reclaimed at a relist or a node's removal, so a real
  new model is accepted after junk ones left.
- An observer never holds scheduling: filter calls complete while /inspect
  renders a large state over and over (the figures are
  bench/bench_inspect_contention's; this asserts only a generous bound).
- Smaller wrong answers: preempt keeps every victim it was sent; a flood of
  filtered pods does not cost a real pod its bind; a bind under another
  pod's name is refused.
- A forged assignment: a pod bound by its author (spec.nodeName) with a
  kgpu.io/assignment giving more than it asks for is not counted as written
  (its GPUs stay kgpu's to give), and the metric and log say why.

    test_extender_trust.py --extender PATH --kgpu PATH [unittest arguments...]

Exit status: unittest's; 77 when the binaries are missing.
"""

import json
import os
import sys
import threading
import time

import test_extender as te
from harness import wait_for
from test_extender import (A100, ExtenderTest, container, gpu_list, http_request, node_object,
                           pod_object, pod_uid, share, whole)


def nodes_args(pod, nodes):
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}


class TestNoInventoryFromStrangers(ExtenderTest):
    """Nodes.items narrows the candidates; it never creates or changes a node."""

    def setUp(self):
        super().setUp()
        s = self.standin = self.start_standin()
        s.add_node("a100-0", gpu_list("a100-0", A100, 81920, 4))
        s.add_node("t4-0", gpu_list("t4-0", "T4", 15360, 2))
        s.add_node("cpu-0")
        self.ext = self.start_extender_for(s)

    def new_pod(self, name, limits, annotations=None):
        return self.standin.add_pod(pod_object(name, [container("main", limits)], annotations))

    def test_fake_node_is_not_created_and_bind_to_it_fails(self):
        before = self.ext.inspect()
        fake = node_object("fake-0", gpu_list("fake-0", A100, 81920, 32))
        pod = self.new_pod("p", whole(8))
        res = self.ext.filter(pod, nodes=[fake])
        self.assertEqual(res["Nodes"]["items"], [])
        self.assertIn("no GPU inventory known to kgpu", res["FailedAndUnresolvableNodes"]["fake-0"])
        self.assertEqual(self.ext.prioritize(pod, nodes=[fake]), [{"Host": "fake-0", "Score": 0}])
        self.assertEqual(self.ext.inspect(), before)
        err = self.ext.bind(pod, "fake-0")
        self.assertIn("no GPU inventory known to kgpu", err)
        self.assertEqual(self.standin.stats()["binds"], 0)
        self.assertEqual(self.ext.held(), {})

    def test_known_node_object_cannot_change_its_gpus(self):
        # The request claims a100-0 has 32 GPUs of another model: kgpu keeps the watch's 4.
        lie = self.standin.get_node("a100-0")
        lie["metadata"]["annotations"]["kgpu.io/gpus"] = json.dumps(
            gpu_list("a100-0", "H100", 81920, 32))
        pod = self.new_pod("eight", whole(8))
        res = self.ext.filter(pod, nodes=[lie])
        self.assertEqual(res["Nodes"]["items"], [])
        self.assertIn("a100-0", res["FailedAndUnresolvableNodes"])
        doc = self.ext.inspect()
        a100 = [n for n in doc["nodes"] if n["name"] == "a100-0"][0]
        self.assertEqual([g["model"] for g in a100["gpus"]], [A100] * 4)
        self.assertIn("does not fit", self.ext.bind(pod, "a100-0"))

    def test_many_fake_nodes_leave_the_state_as_it_was(self):
        before = self.ext.inspect()
        fakes = [node_object("fake-%05d" % i, gpu_list("fake-%05d" % i, "X%d" % (i % 100), 1024, 8))
                 for i in range(3000)]
        pod = self.new_pod("p", share(mem=1))
        res = self.ext.filter(pod, nodes=fakes)
        self.assertEqual(res["Nodes"]["items"], [])
        self.assertEqual(len(res["FailedAndUnresolvableNodes"]), len(fakes))
        self.assertEqual(self.ext.inspect(), before)

    def test_non_cache_mode_with_the_watch(self):
        """kube-scheduler with nodeCacheCapable: false: the Node objects it sends are the API
        server's, and the nodes are known from the watch."""
        nodes = [self.standin.get_node(n) for n in ("a100-0", "t4-0", "cpu-0")]
        pod = self.new_pod("nc", share(mem=20))
        res = self.ext.filter(pod, nodes=nodes)
        self.assertEqual([n["metadata"]["name"] for n in res["Nodes"]["items"]], ["a100-0"])
        self.assertEqual(res["Nodes"]["items"][0], nodes[0], "node objects come back as sent")
        self.assertEqual(sorted(res["FailedAndUnresolvableNodes"]), ["cpu-0", "t4-0"])
        scores = self.ext.prioritize(pod, nodes=res["Nodes"]["items"])
        self.assertEqual([s["Host"] for s in scores], ["a100-0"])
        self.assertEqual(self.ext.bind(pod, "a100-0"), "")
        # A node that joins the API server is usable in this form as soon as it is watched.
        self.standin.add_node("l4-0", gpu_list("l4-0", "L4", 23034, 1))
        wait_for(lambda: self.ext.gpu("l4-0", 0), 10, what="l4-0 from the watch")
        pod = self.new_pod("nc2", share(mem=20))
        res = self.ext.filter(pod, nodes=[self.standin.get_node("l4-0")])
        self.assertEqual([n["metadata"]["name"] for n in res["Nodes"]["items"]], ["l4-0"])
        self.assertEqual(self.ext.bind(pod, "l4-0"), "")
        self.assert_state_matches(self.ext, self.standin)


def junk_gpus(node, first, count):
    """count GPUs of count distinct junk models, junk-<first>...: what a broken plugin says."""
    return [{"index": i, "uuid": "GPU-%s-%d" % (node, i), "model": "junk-%d" % (first + i),
             "memory_mib": 1024, "numa": -1, "healthy": True} for i in range(count)]


class TestModelTable(ExtenderTest):
    """The 64 GPU model ids hold the models the inventory has, not every name ever seen."""

    def setUp(self):
        super().setUp()
        s = self.standin = self.start_standin()
        s.add_node("a100-0", gpu_list("a100-0", A100, 81920, 4))
        s.add_node("t4-0", gpu_list("t4-0", "T4", 15360, 2))
        self.ext = self.start_extender_for(s)

    def models(self):
        return {g["model"] for n in self.ext.inspect()["nodes"] for g in n["gpus"]}

    def test_strangers_cannot_fill_the_table(self):
        # Two calls naming 64 new models (the attack of issue 12), then a real new node.
        pod = self.standin.add_pod(pod_object("p", [container("main", share(mem=1))]))
        for k in range(2):
            fake = node_object("fake-%d" % k, junk_gpus("fake-%d" % k, 32 * k, 32))
            self.ext.filter(pod, nodes=[fake])
        self.standin.add_node("h100-0", gpu_list("h100-0", "H100", 81920, 2))
        wait_for(lambda: "H100" in self.models(), 10, what="the H100 node accepted")
        self.assertEqual(self.ext.bind(pod, "h100-0"), "")

    def test_models_gone_are_reclaimed(self):
        # A broken device plugin reports 62 junk models (the API server is trusted, and
        # wrong): with A100 and T4 the table is full, and a real new model is refused.
        self.standin.add_node("junk-0", junk_gpus("junk-0", 0, 31))
        self.standin.add_node("junk-1", junk_gpus("junk-1", 31, 31))
        wait_for(lambda: len(self.models()) == 64, 10, what="64 models")
        self.standin.add_node("h100-0", gpu_list("h100-0", "H100", 81920, 2))
        wait_for(lambda: "more than 64 distinct GPU models" in self.ext.log(), 10,
                 what="the 65th model refused")
        self.assertNotIn("H100", self.models())
        # The plugin is fixed: the junk nodes report their real GPUs (a rebuild of each).
        self.standin.set_node_gpus("junk-0", gpu_list("junk-0", "L4", 23034, 2))
        self.standin.delete_node("junk-1")
        wait_for(lambda: self.models() == {A100, "T4", "L4"}, 10, what="junk models gone")
        # A new real model is accepted from the watch...
        self.standin.add_node("h100-1", gpu_list("h100-1", "H100", 81920, 2))
        wait_for(lambda: "H100" in self.models(), 10, what="H100 accepted")
        # ...and a relist brings the node refused before.
        restarts = self.ext.metric("kgpu_extender_watch_restarts_total", {"resource": "nodes"})
        self.standin.control(expire_watches=True)
        wait_for(lambda: self.ext.metric("kgpu_extender_watch_restarts_total",
                                         {"resource": "nodes"}) > restarts, 10, what="relist")
        wait_for(lambda: self.ext.gpu("h100-0", 0), 10, what="h100-0 after the relist")
        pod = self.standin.add_pod(pod_object("on-h100", [container("main", share(mem=4))]))
        self.assertEqual(self.ext.schedule(pod, ["h100-0"]), ("h100-0", ""))
        # Pods that name a model by glob still find it where it is.
        t4 = self.standin.add_pod(pod_object("t4-only", [container("main", share(mem=4))],
                                             {"kgpu.io/gpu-type": "T4"}))
        res = self.ext.filter(t4, ["a100-0", "t4-0", "h100-0", "h100-1", "junk-0"])
        self.assertEqual(res["NodeNames"], ["t4-0"])
        self.assert_state_matches(self.ext, self.standin)


class TestObserversDoNotBlockFilter(ExtenderTest):
    """/inspect renders a large state from a snapshot: filter does not wait for it."""

    NODES = 5000

    def test_filter_completes_while_inspect_renders(self):
        path = os.path.join(self.tmp, "cluster.yaml")
        with open(path, "w") as f:
            f.write("nodes:\n")
            for i in range(self.NODES):
                f.write("- name: node-%04d\n  gpus:\n" % i)
                for g in range(8):
                    f.write("  - {index: %d, uuid: GPU-%04d-%d, model: %s, memory_mib: 81920}\n"
                            % (g, i, g, A100))
        ext = self.start_extender(["--cluster-file", path], log_level="warn")
        names = ["node-%04d" % (i * 7 % self.NODES) for i in range(500)]
        renders, stop = [], threading.Event()

        def observe():
            while not stop.is_set():
                t0 = time.monotonic()
                status, _, body = http_request(ext.port, "GET", "/inspect", timeout=120)
                renders.append((t0, time.monotonic(), status, len(body)))

        t = threading.Thread(target=observe)
        t.start()
        try:
            wait_for(lambda: renders, 120, what="one /inspect rendered")
            filters = []
            until = time.monotonic() + max(3.0, 2 * (renders[0][1] - renders[0][0]))
            i = 0
            while time.monotonic() < until:
                pod = pod_object("f-%d" % i, [container("main", share(mem=4))])
                pod["metadata"].update(namespace="default", uid="uid-f-%d" % i)
                t0 = time.monotonic()
                status, res = ext.post_json("filter", {"Pod": pod, "Nodes": None,
                                                       "NodeNames": names})
                filters.append((t0, time.monotonic(), status, len(res["NodeNames"] or [])))
                i += 1
        finally:
            stop.set()
            t.join(180)
        self.assertTrue(all(r[2] == 200 for r in renders), renders[:3])
        self.assertGreater(renders[0][3], 1000000, "a large document")
        self.assertTrue(filters)
        self.assertTrue(all(f[2] == 200 and f[3] == 500 for f in filters))
        render = sorted(r[1] - r[0] for r in renders)[len(renders) // 2]
        longest = max(f[1] - f[0] for f in filters)
        overlapping = [f for f in filters if any(r[0] <= f[0] and f[1] <= r[1] for r in renders)]
        sys.stderr.write("\n  [%d renders of %.1f MB, median %.2f s; %d filters, %d within a "
                         "render, longest %.3f s]\n" % (len(renders), renders[0][3] / 1e6, render,
                                                        len(filters), len(overlapping), longest))
        self.assertTrue(overlapping, "no filter completed while /inspect rendered")
        # Generous (the snapshot takes milliseconds): a filter that waited for a render under
        # the lock took a third of the render or more (0.4 s of 0.9 s with 3,000 nodes).
        self.assertLess(longest, max(0.5, render / 4),
                        "a filter waited %.2f s while /inspect took %.2f s" % (longest, render))


class TestSmallerWrongAnswers(ExtenderTest):

    def setUp(self):
        super().setUp()
        s = self.standin = self.start_standin()
        s.add_node("a100-0", gpu_list("a100-0", A100, 81920, 4))
        self.ext = self.start_extender_for(s)

    def new_pod(self, name, limits, annotations=None):
        return self.standin.add_pod(pod_object(name, [container("main", limits)], annotations))

    def test_preempt_keeps_every_victim(self):
        holders = []
        for i in range(2):
            v = self.new_pod("holder-%d" % i, whole(2))
            self.assertEqual(self.ext.schedule(v, ["a100-0"]), ("a100-0", ""))
            holders.append(pod_uid(v))
        pod = self.new_pod("important", whole(4))
        # 700 victims (small pods without GPUs, say) and the two that hold the GPUs.
        uids = ["cpu-victim-%d" % i for i in range(700)] + holders
        res = self.ext.preempt(pod, {"a100-0": uids})["NodeNameToMetaVictims"]
        self.assertEqual([p["UID"] for p in res["a100-0"]["Pods"]], uids)
        # The same in the full-pod form.
        full = [{"metadata": {"name": "v%d" % i, "namespace": "default", "uid": u}}
                for i, u in enumerate(uids)]
        status, res = self.ext.post_json("preempt", {
            "Pod": pod, "NodeNameToVictims": {"a100-0": {"Pods": full, "NumPDBViolations": 3}},
            "NodeNameToMetaVictims": None})
        self.assertEqual(status, 200, res)
        self.assertEqual([p["UID"] for p in res["NodeNameToMetaVictims"]["a100-0"]["Pods"]],
                         uids)
        self.assertEqual(res["NodeNameToMetaVictims"]["a100-0"]["NumPDBViolations"], 3)
        # Without the holders among the victims, no room.
        res = self.ext.preempt(pod, {"a100-0": uids[:700]})["NodeNameToMetaVictims"]
        self.assertEqual(res, {})
        # A victim without a UID is no request kube-scheduler sends: 400, with the reason.
        status, res = self.ext.post_json("preempt", {
            "Pod": pod, "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {"a100-0": {"Pods": [{"UID": "x"}, {}],
                                                 "NumPDBViolations": 0}}})
        self.assertEqual(status, 400, res)
        self.assertIn("no UID", res["Error"])

    def test_filter_flood_then_bind(self):
        real = self.new_pod("real", share(mem=4))
        self.assertEqual(self.ext.filter(real, ["a100-0"])["NodeNames"], ["a100-0"])
        # More filtered pods than the extender remembers (pendingPods, 1024), none real.
        flood = json.dumps({"Pod": pod_object("x", [container("main", share(mem=1))]),
                            "Nodes": None, "NodeNames": ["a100-0"]})

        def send(first, count):
            for i in range(first, first + count):
                body = flood.replace('"name": "x"', '"name": "flood-%d", "namespace": '
                                     '"default", "uid": "flood-uid-%d"' % (i, i))
                status, _, _ = http_request(self.ext.port, "POST", "/filter", body)
                assert status == 200, status

        threads = [threading.Thread(target=send, args=(k * 275, 275)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        gets = self.standin.stats()["gets"]
        self.assertEqual(self.ext.bind(real, "a100-0"), "")
        self.assertGreater(self.standin.stats()["gets"], gets, "the bind asked for the pod")
        self.assert_state_matches(self.ext, self.standin)

    def test_bind_under_another_name_is_refused(self):
        a = self.new_pod("pod-a", share(mem=4))
        self.new_pod("pod-b", share(mem=4))
        self.assertEqual(self.ext.filter(a, ["a100-0"])["NodeNames"], ["a100-0"])
        args = {"PodName": "pod-b", "PodNamespace": "default", "PodUID": pod_uid(a),
                "Node": "a100-0"}
        status, res = self.ext.post_json("bind", args)
        self.assertEqual(status, 200)
        self.assertIn("another name", res["Error"])
        self.assertEqual(self.standin.stats()["binds"], 0)
        self.assertEqual(self.ext.held(), {})
        # The real bind works; after it, the other name is refused still.
        self.assertEqual(self.ext.bind(a, "a100-0"), "")
        status, res = self.ext.post_json("bind", args)
        self.assertIn("another name", res["Error"])
        self.assertEqual(self.standin.stats()["binds"], 1)
        # Names that are no pod's cannot reach an API path.
        for bad in ("../secrets", "pod-a?watch=1", "Pod-A", ""):
            status, res = self.ext.post_json("bind", dict(args, PodName=bad))
            self.assertEqual(status, 400, (bad, res))
        self.assert_state_matches(self.ext, self.standin)

    def test_unknown_policy_refused_at_filter(self):
        pod = self.new_pod("bad-policy", share(mem=2), {"kgpu.io/policy": "no-such-policy"})
        res = self.ext.filter(pod, ["a100-0"])
        self.assertEqual(res["NodeNames"], [])
        self.assertIn("no-such-policy", res["FailedAndUnresolvableNodes"]["a100-0"])


class TestClusterFileMode(ExtenderTest):
    """Without an API server, the filter-to-bind memory is all a bind has."""

    def cluster(self):
        path = os.path.join(self.tmp, "cluster.yaml")
        with open(path, "w") as f:
            f.write("nodes:\n- name: n0\n  gpus:\n")
            for g in range(4):
                f.write("  - {index: %d, uuid: GPU-n0-%d, model: T4, memory_mib: 15360}\n"
                        % (g, g))
        return path

    def pod(self, name, limits=None):
        p = pod_object(name, [container("main", limits or share(mem=1))])
        p["metadata"].update(namespace="team-a", uid="uid-" + name)
        return p

    def test_recently_filtered_pods_are_kept(self):
        config = os.path.join(self.tmp, "config.yaml")
        with open(config, "w") as f:
            f.write("pendingPods: 16\n")
        ext = self.start_extender(["--cluster-file", self.cluster(), "--config", config,
                                   "--allocate-wait", "0"])
        real = self.pod("real")
        ext.filter(real, ["n0"])
        for i in range(15):
            ext.filter(self.pod("other-%d" % i), ["n0"])
        ext.filter(real, ["n0"])  # kube-scheduler filters it again before its bind
        for i in range(15, 30):
            ext.filter(self.pod("other-%d" % i), ["n0"])
        self.assertEqual(ext.bind(real, "n0"), "")
        # The least recently filtered are forgotten, with a reason that says so.
        err = ext.bind(self.pod("other-0"), "n0")
        self.assertIn("the last 16 pods filtered", err)

    def test_bind_under_another_name_is_refused(self):
        ext = self.start_extender(["--cluster-file", self.cluster()])
        a = self.pod("pod-a")
        ext.filter(a, ["n0"])
        other = dict(a, metadata=dict(a["metadata"], name="pod-b"))
        self.assertIn("another name", ext.bind(other, "n0"))
        other = dict(a, metadata=dict(a["metadata"], namespace="team-b"))
        self.assertIn("another name", ext.bind(other, "n0"))
        self.assertEqual(ext.inspect()["totals"]["pods"], 0)
        self.assertEqual(ext.bind(a, "n0"), "")
        self.assertIn("another name", ext.bind(dict(a, metadata=dict(a["metadata"],
                                                                      name="pod-b")), "n0"))
        self.assertEqual(ext.bind(a, "n0"), "", "a repeated bind still succeeds")
        self.assertEqual(ext.inspect()["totals"]["pods"], 1)


class TestForgedAssignment(ExtenderTest):
    """A pod created with spec.nodeName never meets kube-scheduler or the extender's bind:
    whatever kgpu.io/assignment it carries was written by its author (issue 24, item 2)."""

    def setUp(self):
        super().setUp()
        self.standin = self.start_standin()
        self.standin.add_node("t4-0", gpu_list("t4-0", "T4", 15360, 2))

    def bound(self, name, limits, parts):
        ann = {"kgpu.io/assignment": te.assignment_annotation(parts), "kgpu.io/node": "t4-0",
               "kgpu.io/bind-time": "2025-01-01T00:00:00.0Z"}
        return self.standin.add_pod(pod_object(name, [container("main", limits)], ann,
                                               node_name="t4-0", phase="Running"))

    def test_assignment_beyond_the_request_is_not_adopted(self):
        # One 1 GiB unit asked for; both GPUs, whole, written.
        self.bound("forged", share(mem=1),
                   [("main", True, [(0, "GPU-t4-0-0", 1000, 15360),
                                    (1, "GPU-t4-0-1", 1000, 15360)])])
        # A genuine one (what kgpu's bind writes for 2 units) is adopted as written.
        self.bound("genuine", share(mem=2), [("main", False, [(1, "GPU-t4-0-1", 0, 2048)])])
        ext = self.start_extender_for(self.standin, ["--allocate-wait", "0"])
        wait_for(lambda: ext.metric("kgpu_extender_assignments_refused_total") == 1, 10,
                 what="the forged assignment refused")
        self.assertEqual(ext.held(), {("t4-0", 1): (2048, 0)})
        self.assertIn("2 GPUs, the pod asks for 1", ext.log())
        # The GPU it claimed is still kgpu's to give.
        pod = self.standin.add_pod(pod_object("real", [container("main", whole(1))]))
        self.assertEqual(ext.schedule(pod, ["t4-0"]), ("t4-0", ""))
        self.assertEqual(ext.metric("kgpu_extender_assignment_conflicts_total"), 0)

    def test_a_binding_kgpu_did_not_send_while_its_own_is_in_doubt(self):
        # kgpu's Binding got a 500: its GPUs are held in doubt. Then the pod is bound by
        # a Binding kgpu did not send, with an assignment of its author's (both GPUs whole
        # for a 4 GiB share). kgpu's reservation goes (its own Binding cannot land now),
        # and the forged assignment is refused as any other: nothing is counted for it.
        s = self.standin
        ext = self.start_extender_for(s, ["--allocate-wait", "0"])
        pod = s.add_pod(pod_object("doubt", [container("main", share(mem=4))]))
        self.assertEqual(ext.filter(pod, ["t4-0"])["NodeNames"], ["t4-0"])
        s.control(bind_status=500, bind_count=1)
        self.assertIn("held on t4-0", ext.bind(pod, "t4-0"))
        self.assertEqual(sum(m for m, _ in ext.held().values()), 4096)
        forged = te.assignment_annotation([("main", True, [(0, "GPU-t4-0-0", 1000, 15360),
                                                           (1, "GPU-t4-0-1", 1000, 15360)])])
        s.api("POST", "/api/v1/namespaces/default/pods/doubt/binding",
              {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": "doubt", "annotations": {
                   "kgpu.io/assignment": forged, "kgpu.io/node": "t4-0"}},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "t4-0"}}, expect=201)
        wait_for(lambda: ext.metric("kgpu_extender_assignments_refused_total") == 1, 10,
                 what="the forged assignment refused")
        self.assertEqual(ext.held(), {})
        self.assertEqual(ext.metric("kgpu_extender_binds_in_doubt"), 0)
        self.assertEqual(ext.metric("kgpu_extender_bind_doubts_total", {"outcome": "released"}),
                         1)
        # Both GPUs are still kgpu's to give.
        for name in ("real-0", "real-1"):
            real = s.add_pod(pod_object(name, [container("main", whole(1))]))
            self.assertEqual(ext.schedule(real, ["t4-0"]), ("t4-0", ""))
        self.assertEqual(ext.metric("kgpu_extender_assignment_conflicts_total"), 0)

    def test_more_memory_than_asked_is_not_adopted(self):
        self.bound("greedy", share(mem=1), [("main", False, [(0, "GPU-t4-0-0", 0, 15360)])])
        ext = self.start_extender_for(self.standin, ["--allocate-wait", "0"])
        wait_for(lambda: ext.metric("kgpu_extender_assignments_refused_total") == 1, 10,
                 what="the forged assignment refused")
        self.assertEqual(ext.held(), {})


def main():
    return te.main_with_binaries("test_extender_trust", __doc__)


if __name__ == "__main__":
    sys.exit(main())
