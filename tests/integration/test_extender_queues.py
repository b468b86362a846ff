#!/usr/bin/env python3
"""GPU queues in kgpu-extender, --cluster-file mode (stdlib only; issue 15).

The real binary with a cluster file and a configuration with `queues:` and
`namespaceQueues:`, driven in kube-scheduler's wire format as
test_extender.py does (its helpers are reused); pods leave with
DELETE /pods/NS/NAME. Every rule of docs/queues.md "The extender":

- a pod's queue: its kgpu.io/queue label, else its namespace's queue, else
  `default`; a label may name only the namespace's queue, those below it and
  queues that admit the namespace; anything else is refused, naming the
  namespace and the queue given (issue 24);
- filter refuses a node where the pod would take its queue (or an
  ancestor) over its limit, in the fit reasons' words;
- charged at bind on the GPUs chosen, released when the pod leaves;
- a pod within its guarantee is never refused for quota: borrowers are
  reclaimed, chosen so the GPUs freed are the ones the pod uses, never a
  pod within its own queue's guarantee, and the evictions are reported;
- /inspect, /metrics (promtool) and `kgpu inspect --queues` show the tree;
- configuration errors name the file and the field;
- random admissions and releases never leave a queue over its limit.

    test_extender_queues.py --extender PATH --kgpu PATH [unittest arguments...]

Exit status: unittest's; 77 when the binaries are missing.
"""

import json
import os
import random
import shutil
import subprocess
import sys

import test_extender as te
from test_extender import ExtenderTest, container, http_request, pod_object, share, whole

CLUSTER = """nodes:
  - name: n0
    gpus:
%s
  - name: n1
    gpus:
%s
""" % ("\n".join("      - {index: %d, uuid: GPU-n0-%d, model: A100, memory_mib: 40960}" % (i, i)
                 for i in range(4)),
       "\n".join("      - {index: %d, uuid: GPU-n1-%d, model: A100, memory_mib: 40960}" % (i, i)
                 for i in range(4)))

# org guarantees its two teams 6 GPUs and lets them take 7 together; team-c borrows only.
# Pods of ns-x may name org, the teams below it and team-c; a tenant's only its own queue.
QUEUES = """queues:
  - name: org
    namespaces: [ns-x]
    guarantee: {gpu: 6}
    limit: {gpu: "7"}
  - name: team-a
    parent: org
    guarantee: {gpu: 4, memory: 160Gi}
    limit: {gpu: "4500m"}
  - name: team-b
    parent: org
    weight: 2
    guarantee: {gpu: "2"}
    limit: {gpu: 6, memory: 274877906944}
  - name: team-c
    namespaces: [ns-x]
    limit: {gpu: 0.5}
  - name: tenant-q
    limit: {gpu: 1}
namespaceQueues: {ns-b: team-b, tenant: tenant-q}
"""

NODES = ["n0", "n1"]


class QueueTest(ExtenderTest):

    def start(self, queues=QUEUES):
        cluster = os.path.join(self.tmp, "cluster.yaml")
        with open(cluster, "w") as f:
            f.write(CLUSTER)
        config = os.path.join(self.tmp, "config.yaml")
        with open(config, "w") as f:
            f.write("clusterFile: %s\n%s" % (cluster, queues))
        self.ext = self.start_extender(["--config", config], wait_ready=False)
        self.n = 0
        return self.ext

    def pod(self, limits, queue=None, ns="ns-x", priority=None, name=None):
        self.n += 1
        name = name or "p%d" % self.n
        p = pod_object(name, [container("main", limits)])
        p["metadata"].update(namespace=ns, uid="uid-%s-%s" % (ns, name))
        if queue is not None:
            p["metadata"]["labels"]["kgpu.io/queue"] = queue
        if priority is not None:
            p["spec"]["priority"] = priority
        return p

    def run_pod(self, limits, queue=None, ns="ns-x", nodes=NODES, **kw):
        """filter then bind to the first node passed; the pod, or fail."""
        p = self.pod(limits, queue, ns, **kw)
        res = self.ext.filter(p, nodes)
        self.assertTrue(res["NodeNames"], res)
        self.assertEqual(self.ext.bind(p, res["NodeNames"][0]), "")
        p["node"] = res["NodeNames"][0]
        return p

    def delete(self, p):
        status, _, body = http_request(self.ext.port, "DELETE", "/pods/%s/%s" % (
            p["metadata"]["namespace"], p["metadata"]["name"]))
        self.assertEqual(status, 200, body)

    def queues(self):
        return {q["name"]: q for q in self.ext.inspect()["queues"]}


class TestQueues(QueueTest):

    def test_queue_of_a_pod(self):
        self.start()
        self.run_pod(whole(1), queue="team-a", ns="ns-x")  # the label: org admits ns-x
        self.run_pod(whole(1), ns="ns-b")                  # the namespace's queue
        self.run_pod(whole(1), ns="ns-x")                  # default
        q = self.queues()
        self.assertEqual((q["team-a"]["pods"], q["team-b"]["pods"], q["default"]["pods"]),
                         (1, 1, 1))
        self.assertEqual(q["org"]["pods"], 2)
        self.assertEqual(q["team-a"]["used"], {"gpu_milli": 1000, "memory_mib": 40960})
        # A queue nobody defined: refused on every node, naming it; nothing held.
        res = self.ext.filter(self.pod(whole(1), queue="nope"), NODES)
        self.assertEqual(res["NodeNames"], [])
        for node in NODES:
            self.assertIn("queue nope (the pod's kgpu.io/queue label) does not exist or is not "
                          "open to namespace ns-x", res["FailedNodes"][node])
        p = self.pod(whole(1), queue="nope")
        self.ext.filter(p, NODES)
        self.assertIn("queue nope (the pod's kgpu.io/queue label) does not exist",
                      self.ext.bind(p, "n0"))

    def test_a_tenant_cannot_take_another_teams_queue(self):
        """Issue 24, item 1: the tenant limited to 1 GPU labels its pods team-a."""
        self.start()
        self.run_pod(whole(1), ns="tenant")  # its own queue, at its limit now
        # Borrowers of team-b and default take every other GPU; team-a is below its guarantee.
        for _ in range(5):
            self.run_pod(whole(1), queue="team-b")
        for _ in range(2):
            self.run_pod(whole(1))
        for label in ("team-a", "org", "default"):
            p = self.pod(whole(1), queue=label, ns="tenant")
            res = self.ext.filter(p, NODES)
            self.assertEqual(res["NodeNames"], [], res)
            for node in NODES:
                reason = res["FailedNodes"][node]
                self.assertIn("queue %s (the pod's kgpu.io/queue label) does not exist or is not "
                              "open to namespace tenant" % label, reason)
                self.assertNotIn("team-b", reason)
            self.assertIn("not open to namespace tenant", self.ext.bind(p, "n1"))
        # Nothing evicted for it, nothing charged to team-a; team-b's namespace neither.
        self.assertEqual(self.ext.inspect()["queue_evictions"], [])
        q = self.queues()
        self.assertEqual((q["team-a"]["pods"], q["tenant-q"]["pods"]), (0, 1))
        res = self.ext.filter(self.pod(whole(1), queue="team-a", ns="ns-b"), NODES)
        self.assertIn("not open to namespace ns-b", res["FailedNodes"]["n0"])
        # team-a's own pods still reclaim what they are guaranteed.
        res = self.ext.filter(self.pod(whole(1), queue="team-a"), NODES)
        self.assertEqual(len(self.ext.inspect()["queue_evictions"]), 1, res)

    def test_limit_refused_in_fit_reason_words(self):
        self.start()
        pods = [self.run_pod(whole(1), queue="team-a") for _ in range(4)]
        self.run_pod(share(mem=1, core=50), queue="team-a")  # 4.5: at its limit
        res = self.ext.filter(self.pod(share(mem=1, core=50), queue="team-a"), NODES)
        self.assertEqual(res["NodeNames"], [])
        self.assertEqual(res["FailedNodes"]["n1"],
                         "queue team-a would use 5 GPUs of its limit 4.5")
        self.assertEqual(res["FailedAndUnresolvableNodes"], {})
        # Memory limits in MiB, and a root queue's limit: team-c may hold half a GPU.
        self.run_pod(share(mem=1, core=50), queue="team-c")
        res = self.ext.filter(self.pod(share(mem=1, core=10), queue="team-c"), NODES)
        self.assertEqual(res["FailedNodes"]["n1"],
                         "queue team-c would use 0.6 GPUs of its limit 0.5")
        # Released on delete: team-a has room again.
        self.delete(pods[0])
        self.assertEqual(self.queues()["team-a"]["used"]["gpu_milli"], 3500)
        self.run_pod(share(mem=1, core=50), queue="team-a")
        self.assertEqual(self.queues()["team-a"]["used"]["gpu_milli"], 4000)
        status, _, _ = http_request(self.ext.port, "DELETE", "/pods/ns-x/no-such-pod")
        self.assertEqual(status, 404)

    def test_charged_on_the_gpus_chosen(self):
        self.start()
        p = self.run_pod(share(mem=8, core=25), queue="team-b")
        q = self.queues()
        self.assertEqual(q["team-b"]["used"], {"gpu_milli": 250, "memory_mib": 8192})
        self.assertEqual(q["org"]["used"], {"gpu_milli": 250, "memory_mib": 8192})
        self.assertEqual(q["team-b"]["borrowed"], {"gpu_milli": 0})
        # Whole GPUs count their whole memory.
        w = self.run_pod(whole(2), queue="team-b")
        self.assertEqual(self.queues()["team-b"]["used"],
                         {"gpu_milli": 2250, "memory_mib": 8192 + 2 * 40960})
        self.assertEqual(self.queues()["team-b"]["borrowed"], {"gpu_milli": 250})
        self.delete(p)
        self.delete(w)
        q = self.queues()
        self.assertEqual((q["team-b"]["used"], q["team-b"]["pods"], q["org"]["pods"]),
                         ({"gpu_milli": 0, "memory_mib": 0}, 0, 0))

    def test_reclaim_spares_pods_within_their_guarantee(self):
        self.start()
        within = [self.run_pod(whole(1), queue="team-b", nodes=["n0"]) for _ in range(2)]
        borrowers = [self.run_pod(whole(1), nodes=[n], priority=i)
                     for i, n in enumerate(["n0", "n0", "n1", "n1", "n1", "n1"])]
        self.assertEqual(sum(len(g["pods"]) for n in self.ext.inspect()["nodes"]
                             for g in n["gpus"]), 8)
        # team-a is below its guarantee: the cluster is full, so borrowers make room.
        waiting = self.pod(whole(1), queue="team-a")
        res = self.ext.filter(waiting, NODES)
        self.assertEqual(len(res["NodeNames"]), 1, res)
        doc = self.ext.inspect()
        ev = doc["queue_evictions"]
        self.assertEqual(len(ev), 1)
        self.assertEqual((ev[0]["queue"], ev[0]["for_queue"], ev[0]["for_pod"],
                          ev[0]["gpu_milli_freed"], ev[0]["outcome"]),
                         ("default", "team-a", waiting["metadata"]["name"], 1000, "applied"))
        # The lowest priority borrower on the node the pod then fits.
        victim = [b for b in borrowers if b["metadata"]["name"] == ev[0]["pod"]][0]
        self.assertEqual(victim["node"], res["NodeNames"][0])
        same_node = [b for b in borrowers if b["node"] == victim["node"]]
        self.assertEqual(victim["spec"]["priority"], min(b["spec"]["priority"] for b in same_node))
        self.assertEqual(self.ext.bind(waiting, res["NodeNames"][0]), "")
        q = {x["name"]: x for x in doc["queues"]}
        self.assertEqual((q["default"]["evictions"], q["team-b"]["pods"]), (1, 2))
        self.assertIn("reclaim: %s/%s (queue default" % ("ns-x", ev[0]["pod"]), self.ext.log())
        self.assertEqual(len(within), 2)

    def test_never_evicts_a_pod_within_its_queues_guarantee(self):
        self.start("queues:\n  - {name: a, guarantee: {gpu: 7}, namespaces: [ns-x]}\n"
                   "  - {name: b, guarantee: {gpu: 2}, namespaces: [ns-x]}\n")
        for _ in range(8):
            self.run_pod(whole(1), queue="a")
        # b is below its guarantee: a borrows one GPU, and gives exactly that one back.
        self.run_pod(whole(1), queue="b")
        self.assertEqual([e["queue"] for e in self.ext.inspect()["queue_evictions"]], ["a"])
        # b is still below its guarantee, but a is at its own: nothing is evicted, the pod
        # waits for room with the capacity reasons.
        res = self.ext.filter(self.pod(whole(1), queue="b"), NODES)
        self.assertEqual(res["NodeNames"], [])
        self.assertIn("needs 1 whole GPU", res["FailedNodes"]["n0"])
        q = self.queues()
        self.assertEqual((q["a"]["pods"], q["a"]["borrowed"], q["b"]["pods"]),
                         (7, {"gpu_milli": 0}, 1))
        self.assertEqual(len(self.ext.inspect()["queue_evictions"]), 1)

    def test_reclaim_frees_gpus_the_pod_can_use(self):
        self.start()
        # default borrows everything: two pods on n0's four GPUs, four one-GPU pods on n1.
        self.run_pod(whole(2), nodes=["n0"], priority=0)
        self.run_pod(whole(2), nodes=["n0"], priority=0)
        small = [self.run_pod(share(mem=4, core=10), nodes=["n1"], priority=0)
                 for _ in range(4)]
        self.run_pod(whole(1), nodes=["n1"], priority=5)
        self.run_pod(whole(1), nodes=["n1"], priority=5)
        self.run_pod(whole(1), nodes=["n1"], priority=5)
        # team-a wants two GPUs on one node: one two-GPU pod frees exactly that.
        waiting = self.pod(whole(2), queue="team-a")
        res = self.ext.filter(waiting, NODES)
        self.assertEqual(res["NodeNames"], ["n0"], res)
        ev = self.ext.inspect()["queue_evictions"]
        self.assertEqual([(e["node"], e["gpu_milli_freed"]) for e in ev], [("n0", 2000)])
        self.assertEqual(self.ext.bind(waiting, "n0"), "")
        self.assertEqual(len(small), 4)

    def test_ancestor_limit_reclaims_for_a_pod_within_its_guarantee(self):
        self.start()
        # team-b borrows up to org's limit of 7 with team-a's one GPU.
        self.run_pod(whole(1), queue="team-a")
        for _ in range(6):
            self.run_pod(whole(1), queue="team-b", priority=1)
        self.assertEqual(self.queues()["org"]["used"]["gpu_milli"], 7000)
        # team-a is within its guarantee: org's limit is taken by team-b borrowing.
        waiting = self.pod(whole(1), queue="team-a")
        res = self.ext.filter(waiting, NODES)
        self.assertEqual(len(res["NodeNames"]), 1, res)
        ev = self.ext.inspect()["queue_evictions"]
        self.assertEqual([e["queue"] for e in ev], ["team-b"])
        self.assertEqual(self.ext.bind(waiting, res["NodeNames"][0]), "")
        q = self.queues()
        self.assertEqual((q["org"]["used"]["gpu_milli"], q["team-b"]["used"]["gpu_milli"]),
                         (7000, 5000))
        # team-c is over its guarantee (none): refused, never reclaims.
        res = self.ext.filter(self.pod(share(mem=1, core=60), queue="team-c"), NODES)
        self.assertEqual(res["NodeNames"], [])
        self.assertEqual(len(self.ext.inspect()["queue_evictions"]), 1)
        self.assertEqual(self.queues()["team-c"]["pending"], 1)

    def test_inspect_metrics_and_cli(self):
        self.start()
        self.run_pod(whole(1), queue="team-a")
        self.run_pod(share(mem=4, core=50), queue="team-b")
        self.ext.filter(self.pod(whole(1), queue="team-c"), NODES)  # over its limit: pending
        doc = self.ext.inspect()
        self.assertTrue(doc["queues_enabled"])
        q = {x["name"]: x for x in doc["queues"]}
        self.assertEqual(q["team-a"], {
            "name": "team-a", "parent": "org", "depth": 1, "weight": 1,
            "guarantee": {"gpu_milli": 4000, "memory_mib": 163840},
            "limit": {"gpu_milli": 4500, "memory_mib": None},
            "used": {"gpu_milli": 1000, "memory_mib": 40960}, "borrowed": {"gpu_milli": 0},
            "pods": 1, "pending": 0, "evictions": 0})
        self.assertEqual(q["team-b"]["limit"], {"gpu_milli": 6000, "memory_mib": 262144})
        self.assertEqual((q["team-c"]["pending"], q["default"]["parent"]), (1, None))
        text = self.ext.metrics()
        m = self.ext.metric
        self.assertEqual(m("kgpu_queue_used_gpus", {"queue": "org"}, text), 1.5)
        self.assertEqual(m("kgpu_queue_limit_gpus", {"queue": "team-a"}, text), 4.5)
        self.assertEqual(m("kgpu_queue_guarantee_memory_bytes", {"queue": "team-a"}, text),
                         160 * 2 ** 30)
        self.assertIsNone(m("kgpu_queue_limit_gpus", {"queue": "default"}, text))
        self.assertEqual(m("kgpu_queue_used_memory_bytes", {"queue": "team-b"}, text),
                         4 * 2 ** 30)
        self.assertEqual(m("kgpu_queue_pending_pods", {"queue": "team-c"}, text), 1)
        self.assertEqual(m("kgpu_queue_evictions_total", {"queue": "team-b"}, text), 0)
        self.assertEqual(m("kgpu_queue_borrowed_gpus", {"queue": "team-b"}, text), 0)
        promtool = shutil.which("promtool")
        if promtool:
            out = subprocess.run([promtool, "check", "metrics"], input=text,
                                 capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        out = subprocess.run([te.KGPU_BIN, "inspect", "--queues", "--server", self.ext.url],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertTrue(any(l.startswith("org ") for l in lines), out.stdout)
        self.assertTrue(any(l.startswith("  team-a ") and " 4.5 " in l for l in lines),
                        out.stdout)
        self.assertTrue(any(l.startswith("team-c ") for l in lines), out.stdout)

    def test_inspect_lists_parents_before_children(self):
        """Issue 24, item 7: depth first, whatever order the file defines them in."""
        self.start("queues:\n  - {name: leaf, parent: mid}\n  - {name: top}\n"
                   "  - {name: other}\n  - {name: mid, parent: top}\n"
                   "  - {name: leaf2, parent: top}\n")
        rows = self.ext.inspect()["queues"]
        self.assertEqual([(q["name"], q["depth"]) for q in rows],
                         [("top", 0), ("mid", 1), ("leaf", 2), ("leaf2", 1), ("other", 0),
                          ("default", 0)])

    def test_a_guarantee_no_limit_above_can_honour(self):
        err = self.refused_config("queues:\n  - {name: team-a, limit: {gpu: 2}}\n"
                                  "  - {name: ml, parent: team-a, guarantee: {gpu: 4}}\n")
        self.assertIn("queue ml: guarantee.gpu 4 cannot be honoured: queue team-a above it has "
                      "limit.gpu 2", err)

    def refused_config(self, queues):
        cluster = os.path.join(self.tmp, "cluster.yaml")
        with open(cluster, "w") as f:
            f.write(CLUSTER)
        config = os.path.join(self.tmp, "bad.yaml")
        with open(config, "w") as f:
            f.write("clusterFile: %s\n%s" % (cluster, queues))
        out = subprocess.run([te.EXTENDER_BIN, "--config", config], capture_output=True,
                             text=True, timeout=30)
        self.assertEqual(out.returncode, 2, out.stderr)
        return out.stderr

    def test_config_errors_name_file_and_field(self):
        cluster = os.path.join(self.tmp, "cluster.yaml")
        with open(cluster, "w") as f:
            f.write(CLUSTER)

        def refused(text, args=()):
            config = os.path.join(self.tmp, "bad.yaml")
            with open(config, "w") as f:
                f.write(text)
            out = subprocess.run([te.EXTENDER_BIN, "--config", config] + list(args),
                                 capture_output=True, text=True, timeout=30)
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn(config, out.stderr)
            return out.stderr
        err = refused("clusterFile: %s\nqueues:\n  - {name: a, limit: {gpu: lots}}\n" % cluster)
        self.assertIn("queues[0] (a).limit.gpu", err)
        err = refused("clusterFile: %s\nqueues:\n  - {name: a, parent: b}\n" % cluster)
        self.assertIn("queue a", err)
        err = refused("clusterFile: %s\nnamespaceQueues: {ns: 3}\n" % cluster)
        self.assertIn("namespaceQueues.ns", err)
        err = refused("queues:\n  - {name: a}\n", ["--kubeconfig", "/nonexistent"])
        self.assertIn("queues come from GPUQueue objects in cluster mode", err)

    def test_no_queues_nothing_refused(self):
        self.start(queues="")
        for _ in range(8):
            self.run_pod(whole(1), queue="anything")
        doc = self.ext.inspect()
        self.assertEqual((doc["queues_enabled"], doc["queues"]), (False, []))


class TestQueueProperty(QueueTest):

    def test_random_admissions_never_pass_a_limit(self):
        self.start()
        rng = random.Random(int(os.environ.get("KGPU_TEST_SEED", "15")))
        limits = {"org": 7000, "team-a": 4500, "team-b": 6000, "team-c": 500}
        running = []
        for step in range(160):
            if running and rng.random() < 0.35:
                self.delete(running.pop(rng.randrange(len(running))))
            else:
                asks = rng.choice([whole(1), whole(2), share(mem=4, core=25),
                                   share(mem=8, core=50), share(mem=2, core=10, count=2)])
                queue = rng.choice(["team-a", "team-b", "team-c", None])
                p = self.pod(asks, queue=queue, priority=rng.randrange(3))
                res = self.ext.filter(p, NODES)
                if res["NodeNames"]:
                    if self.ext.bind(p, res["NodeNames"][0]) == "":
                        running.append(p)
                # Pods reclaim evicted are gone from the extender: forget them too.
                gone = {(e["namespace"], e["pod"]) for e in self.ext.inspect()["queue_evictions"]}
                running = [r for r in running
                           if (r["metadata"]["namespace"], r["metadata"]["name"]) not in gone]
            doc = self.ext.inspect()
            for q in doc["queues"]:
                if q["name"] in limits:
                    self.assertLessEqual(q["used"]["gpu_milli"], limits[q["name"]],
                                         "step %d: %s" % (step, q))
            self.assertEqual(sum(q["pods"] for q in doc["queues"] if q["parent"] is None),
                             doc["totals"]["pods"])


def main():
    return te.main_with_binaries("test_extender_queues", __doc__)


if __name__ == "__main__":
    sys.exit(main())
