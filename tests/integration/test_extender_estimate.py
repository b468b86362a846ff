#!/usr/bin/env python3
"""POST /estimate of kgpu-extender (stdlib only; issue 29).

The real binary against the API server stand-in: what the cluster could
take, as kgpu-dispatcher asks it (docs/multicluster.md "The estimate"):

- copies counted as kgpu would place them, per GPU model, the model
  include/exclude annotations honoured, capped by `count`;
- the pods in flight (`reserve`) taken first, so a burst is not counted
  twice; bound pods leave less; the state is not changed by asking;
- prices of the first copy's GPUs from --prices, spot or on-demand by the
  node's labels; the cluster's name from --cluster-name;
- a malformed request gets 400 naming the field; a pod kgpu cannot
  estimate gets its own error, the others are still answered.

    test_extender_estimate.py --extender PATH --kgpu PATH [unittest arguments...]

Exit status: unittest's; 77 when the binaries are missing.
"""

import json
import os
import subprocess
import sys

import test_extender as te
from harness import wait_for
from test_extender import container, gpu_list, pod_object, share, whole

A100 = "NVIDIA A100-SXM4-80GB"


def ask(pod, count=None):
    e = {"pod": pod}
    if count is not None:
        e["count"] = count
    return e


class EstimateTest(te.ExtenderTest):

    def setUp(self):
        super().setUp()
        s = self.s = self.start_standin()
        s.add_node("a100-0", gpu_list("a100-0", A100, 81920, 2),
                   labels={"karpenter.sh/capacity-type": "spot", "pool": "a100"})
        s.add_node("t4-0", gpu_list("t4-0", "T4", 15360, 4))
        self.n = 0

    def start(self, *extra):
        self.ext = self.start_extender_for(self.s, extra=list(extra))
        wait_for(lambda: len(self.ext.inspect()["nodes"]) == 2, 15, what="both nodes read")
        return self.ext

    def pod(self, limits, annotations=None):
        self.n += 1
        return pod_object("p%d" % self.n, [container("main", limits)], annotations=annotations)

    def estimate(self, body, expect=200):
        status, res = self.ext.post_json("estimate", body)
        self.assertEqual(status, expect, res)
        return res

    def test_copies_by_model_and_cap(self):
        self.start("--cluster-name", "worker-a")
        res = self.estimate({"pods": [ask(self.pod(whole(1)), 100),
                                      ask(self.pod(whole(1)), 3),
                                      ask(self.pod(whole(4)), 10),
                                      ask(self.pod(share(mem=40)), 100)]})
        self.assertEqual(res["cluster"], "worker-a")
        one, capped, four, mem40 = res["pods"]
        self.assertEqual(one["fit"], 6)
        self.assertEqual(one["byModel"], {A100: 2, "T4": 4})
        self.assertEqual(capped["fit"], 3)
        self.assertEqual(four["fit"], 1)
        self.assertEqual(four["byModel"], {"T4": 1})
        # 40 GiB shares: two per A100 of 80 GiB, none on a 15 GiB T4.
        self.assertEqual(mem40["fit"], 4)
        self.assertEqual(mem40["byModel"], {A100: 4})
        self.assertEqual(mem40["firstModel"], A100)
        self.assertEqual(res["models"][A100]["gpus"], 2)
        self.assertEqual(res["models"]["T4"]["wholeFree"], 4)
        self.assertEqual(res["freeMilli"], 6000)
        # The policy's score of the first copy's place, where one fits.
        self.assertIsInstance(one["score"], int)
        no = self.estimate({"pods": [ask(self.pod(whole(8)))]})["pods"][0]
        self.assertNotIn("score", no)

    def test_model_annotations(self):
        self.start()
        t4 = self.pod(whole(1), {"kgpu.io/gpu-type": "T4"})
        not_t4 = self.pod(whole(1), {"kgpu.io/gpu-type-exclude": "T4"})
        h100 = self.pod(whole(1), {"kgpu.io/gpu-type": "*H100*"})
        res = self.estimate({"pods": [ask(t4, 100), ask(not_t4, 100), ask(h100, 100)]})
        self.assertEqual([p["fit"] for p in res["pods"]], [4, 2, 0])
        self.assertEqual(res["pods"][1]["byModel"], {A100: 2})
        self.assertNotIn("firstModel", {k for k, v in res["pods"][2].items() if v is not None})

    def test_reserve_and_bound_pods_leave_less(self):
        ext = self.start()
        a100 = {"kgpu.io/gpu-type": "A100*,NVIDIA A100*"}
        q = {"pods": [ask(self.pod(whole(1), a100), 100)]}
        self.assertEqual(self.estimate(q)["pods"][0]["fit"], 2)
        # One A100 in flight to this cluster: one left; three in flight: two found room.
        q["reserve"] = [ask(self.pod(whole(1), a100), 1)]
        res = self.estimate(q)
        self.assertEqual(res["pods"][0]["fit"], 1)
        self.assertEqual(res["pods"][0]["reserved"], 1)
        q["reserve"] = [ask(self.pod(whole(1), a100), 3)]
        res = self.estimate(q)
        self.assertEqual(res["pods"][0]["fit"], 0)
        self.assertEqual(res["pods"][0]["reservedMissed"], 1)
        # Asking changed nothing: no GPU is held.
        self.assertEqual(ext.held(), {})
        del q["reserve"]
        # A pod bound on an A100 leaves one.
        p = self.s.add_pod(self.pod(whole(1), a100), "default")
        self.assertEqual(ext.filter(p, ["a100-0"])["NodeNames"], ["a100-0"])
        self.assertEqual(ext.bind(p, "a100-0"), "")
        wait_for(lambda: self.estimate(q)["pods"][0]["fit"] == 1, 10, what="one A100 left")
        self.assertEqual(self.estimate(q)["freeMilli"], 5000)

    def test_prices_by_capacity_type(self):
        prices = os.path.join(self.tmp, "prices.yaml")
        with open(prices, "w") as f:
            f.write("prices:\n  currency: EUR\n  gpu:\n    T4: {onDemand: 0.4, spot: 0.1}\n"
                    "    %s: {onDemand: 4.0, spot: 1.5}\n" % A100)
        self.start("--prices", prices)
        res = self.estimate({"pods": [
            ask(self.pod(whole(2), {"kgpu.io/gpu-type": "T4"})),
            ask(self.pod(whole(1), {"kgpu.io/gpu-type-exclude": "T4"})),
            ask(self.pod(share(core=25), {"kgpu.io/gpu-type": "T4"}))]})
        two_t4, one_a100, quarter = res["pods"]
        self.assertAlmostEqual(two_t4["pricePerHour"], 0.8)     # on-demand node
        self.assertAlmostEqual(one_a100["pricePerHour"], 1.5)   # spot node
        self.assertAlmostEqual(quarter["pricePerHour"], 0.1)    # a quarter of 0.4

    def test_node_groups_grow(self):
        groups = os.path.join(self.tmp, "groups.yaml")
        with open(groups, "w") as f:
            f.write("nodeGroups:\n"
                    "  - name: a100-more\n    maxNodes: 3\n    nodeLabels: {pool: a100}\n"
                    "    gpus: {model: %s, count: 2, memoryMiB: 81920}\n"
                    "  - name: l4-zero\n    maxNodes: 2\n    nodeLabels: {pool: l4}\n"
                    "    gpus: {model: NVIDIA L4, count: 4, memoryMiB: 23034}\n" % A100)
        self.start("--node-groups", groups)
        a100 = {"kgpu.io/gpu-type": "*A100*"}
        res = self.estimate({"pods": [ask(self.pod(whole(1), a100), 100),
                                      ask(self.pod(whole(1), a100), 3),
                                      ask(self.pod(whole(4), a100), 10),
                                      ask(self.pod(share(mem=20)), 100)]})
        one, capped, four, share20 = res["pods"]
        # a100-0 is one of a100-more's three: two more nodes of two GPUs.
        self.assertEqual((one["fit"], one["grow"], one["growByGroup"]), (2, 4, {"a100-more": 4}))
        self.assertEqual((capped["fit"], capped["grow"]), (2, 3))  # each capped at count
        self.assertEqual((four["fit"], four["grow"], four["growByGroup"]), (0, 0, {}))
        # 20 GiB shares: four per 80 GiB A100, so 2 more nodes x 8; one per 22.5 GiB L4, so
        # 2 nodes x 4 of a group that has none yet.
        self.assertEqual(share20["growByGroup"], {"a100-more": 16, "l4-zero": 8})
        with open(groups, "w") as f:
            f.write("nodeGroups:\n  - name: g\n    maxNodes: 3\n    nodeLabels: {pool: a}\n")
        out = subprocess.run([te.EXTENDER_BIN, "--node-groups", groups, "--cluster-file",
                              os.path.join(te.SOURCE_DIR, "examples", "cluster.yaml")],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("nodeGroups[0]: name, maxNodes, nodeLabels and gpus are all required",
                      out.stderr)

    def test_bad_requests_name_the_field(self):
        self.start()
        ok = ask(self.pod(whole(1)))
        for body, words in (
                (b"{not json", "malformed JSON"),
                ([], "not a JSON object"),
                ({}, "at least one pod"),
                ({"pods": [ok], "extra": 1}, "unknown field extra"),
                ({"pods": "x"}, "pods: expected an array"),
                ({"pods": [ok] * 33}, "at most 32"),
                ({"pods": [{"pod": 1}]}, "pods[0].pod"),
                ({"pods": [{"pod": {}, "count": 0}]}, "pods[0].count"),
                ({"pods": [{"pod": {}, "count": 5000}]}, "pods[0].count"),
                ({"pods": [dict(ok, why=1)]}, "pods[0]: unknown field why"),
                ({"pods": [ok], "reserve": [ask(self.pod({"kgpu.io/gpu-core": "abc"}))]},
                 "reserve[0]")):
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            status, _, data = self.ext.post("estimate", raw)
            self.assertEqual(status, 400, (body, data))
            self.assertIn(words, json.loads(data)["Error"], body)
        # Pods kgpu cannot estimate get their own error; the rest is answered.
        two = pod_object("two", [container("a", whole(1)), container("b", whole(1))])
        res = self.estimate({"pods": [ask(two), ask(self.pod({})), ok,
                                      ask(self.pod(whole(1), {"kgpu.io/policy": "nope"}))]})
        self.assertIn("only pods of one GPU container", res["pods"][0]["error"])
        self.assertIn("no GPU", res["pods"][1]["error"])
        self.assertEqual(res["pods"][2]["fit"], 1)
        self.assertIn("unknown policy", res["pods"][3]["error"])
        # A cluster name that no MultiKueueCluster could have stops the start.
        out = subprocess.run([te.EXTENDER_BIN, "--cluster-name", "Not_A_Label", "--cluster-file",
                              os.path.join(te.SOURCE_DIR, "examples", "cluster.yaml")],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("not a DNS label", out.stderr)


if __name__ == "__main__":
    sys.exit(te.main_with_binaries("test_extender_estimate", __doc__))
