#!/usr/bin/env python3
"""End-to-end test of kgpu's whole data flow with the real binaries.

One Kubernetes API server stand-in (apiserver_standin.py); two fake GPU nodes,
each with its own kgpu-device-plugin (--fake-gpus, --node-name, --kubeconfig to
the stand-in, its own --plugin-dir and --state-dir) and its own kubelet
stand-in (kubelet_standin.py, Python grpcio); one kgpu-extender with
--kubeconfig and the shipped configuration (deploy/extender/config.yaml: kgpu,
1Gi unit, allocateWaitSeconds 120). The test plays kube-scheduler (filter,
prioritize, bind in its JSON, NodeNames as with nodeCacheCapable) and kubelet
(GetPreferredAllocation with the node's free IDs, then Allocate with the
preferred IDs, container by container in kubelet's order, init containers'
devices reused by app containers) and checks what each part hands the next:

  1. each plugin publishes kgpu.io/gpus and its labels on the Node it was
     given; the extender learns those GPUs through its watch;
  2. a pod goes filter -> prioritize -> bind -> GetPreferredAllocation ->
     Allocate and ends with the GPU of its kgpu.io/assignment;
  3. two same-size pods arrive at once for one node: one binds, the other is
     refused ("waiting for kubelet to allocate ...") until kubelet has
     allocated the first and the plugin has marked it; then it binds, and
     each pod gets the GPU of its own assignment;
  4. a pod with an init and two app containers;
  5. a GPU turns unhealthy in a node's fake file: kubelet sees it within 1 s,
     the node annotation and the extender follow, no new pod lands on it;
  6. every binary exits 0 on SIGTERM with no sanitizer report.

The pieces come from the two black-box suites: the stand-in, the extender
and kube-scheduler's side of the wire from test_extender.py; the plugin,
the kubelet stand-in and the checks of an Allocate answer from
test_device_plugin.py (one PluginCase per node, used as that node's rig).

    test_end_to_end.py --extender PATH --plugin PATH [--protoc PATH]
                       [unittest arguments...]

Run it with an interpreter that can import grpc (/usr/bin/python3 on Debian);
without grpc, protoc or a binary it exits 77 (skipped). KGPU_TEST_KEEP=1
keeps the temporary folders (logs). A test that shows a bug in a binary is
marked @known_bug (an expected failure until fixed); KGPU_TEST_STRICT=1 runs
such tests as plain ones.
"""

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness                    # noqa: E402
import test_device_plugin as tdp  # noqa: E402  (its grpc import may fail: main() skips)
import test_extender as te        # noqa: E402

SOURCE_DIR = tdp.SOURCE_DIR
MEM, CORE = tdp.MEM, tdp.CORE
SHIPPED_CONFIG = os.path.join(SOURCE_DIR, "deploy", "extender", "config.yaml")
SCHEDULER_TIMEOUT = 5.0  # kube-scheduler's httpTimeout in deploy/extender/scheduler-config.yaml
SEED = int(os.environ.get("KGPU_TEST_SEED", "1"))

known_bug = tdp.known_bug


def annotations(obj):
    return (obj or {}).get("metadata", {}).get("annotations") or {}


def shipped_extender_config(path):
    """The config.yaml held by the ConfigMap in deploy/extender/config.yaml, written to path,
    without its `tls:` block: this suite plays kube-scheduler over plain HTTP, as an operator
    trying kgpu without certificates would (the config's own comment says how). The shipped
    TLS and client-certificate setup is what test_extender_tls and scripts/e2e.sh check.
    Its probeListen becomes 127.0.0.1:0."""
    with open(SHIPPED_CONFIG) as f:
        lines = f.read().splitlines()
    start = lines.index("  config.yaml: |") + 1
    body = []
    in_tls = False
    for line in lines[start:]:
        if line.strip() and not line.startswith("    "):
            break
        line = line[4:]
        if line.startswith("tls:"):
            in_tls = True
            continue
        if in_tls and (line.startswith(" ") or not line.strip()):
            continue
        in_tls = False
        # The probe listener on any free loopback port, not the shipped fixed one: another
        # test (or anything on this machine) holding that port must not stop this suite.
        if line.startswith("probeListen:"):
            line = "probeListen: 127.0.0.1:0"
        body.append(line)

    with open(path, "w") as f:
        f.write("\n".join(body) + "\n")
    return path


# ---------------------------------------------------------------------------
# One GPU node: fake GPUs, a device plugin, a kubelet stand-in
# ---------------------------------------------------------------------------

class Node:
    """A GPU node's host. The rig is test_device_plugin's PluginCase, used as a helper."""

    def __init__(self, name, gpus, standin):
        self.name = name
        self.gpus = gpus
        self.standin = standin
        self.rig = tdp.PluginCase()   # 'runTest': an instance for its helpers, never run
        self.rig.setUp()               # tmp, plugin and state folders, a dummy --shim-lib
        self.rig.node = name
        self.plugin = None
        self.rng = random.Random("%s-%d" % (name, SEED))

    def by_uuid(self, uuid):
        for g in self.gpus:
            if g["uuid"] == uuid:
                return g
        raise AssertionError("%s has no GPU %s" % (self.name, uuid))

    def start(self):
        rig = self.rig
        rig.start_kubelet()
        kubeconfig = self.standin.kubeconfig(os.path.join(rig.tmp, "kubeconfig"))
        self.plugin = rig.start_plugin(["--kubeconfig", kubeconfig, "--node-name", self.name],
                                       gpus=self.gpus, name="plugin-" + self.name)

    def wait_up(self):
        rig = self.rig
        try:
            rig.kubelet.wait_registered((MEM, CORE), timeout=15)
            for r in (MEM, CORE):
                rig.kubelet.wait_list(r, timeout=10)
        except AssertionError as e:
            raise AssertionError("%s: %s\nplugin log:\n%s"
                                 % (self.name, e, self.plugin.child.log_tail()))

    # kubelet's device manager, for one container and one resource.

    def admit(self, resource, n, reuse=()):
        """devicesToAllocate, then Allocate. Returns (ids, ContainerAllocateResponse).

        reuse: devices of init containers the app container may take first, as kubelet
        does; when they are not enough, GetPreferredAllocation gets the free healthy IDs
        plus those taken, with the taken ones as must_include, and the whole size.
        """
        rig, k = self.rig, self.rig.kubelet
        taken = list(reuse)[:n]
        if len(taken) < n:
            available = rig.free_ids(resource) + taken
            pref = k.preferred(resource, available, taken, n)
            rig.assertEqual(len(pref), n, "%s: GetPreferredAllocation gave %d IDs for %d: %r"
                            % (self.name, len(pref), n, pref))
            rig.assertEqual(len(set(pref)), n, "GetPreferredAllocation repeats an ID: %r" % pref)
            rig.assertTrue(set(pref) <= set(available), "preferred IDs not offered: %r" % pref)
            rig.assertTrue(set(taken) <= set(pref), "must_include IDs left out: %r" % pref)
            ids = pref
        else:
            ids = taken
        sent = list(ids)
        self.rng.shuffle(sent)  # kubelet hands Allocate an unordered set
        try:
            resp = k.allocate(resource, sent)
        except tdp.grpc.RpcError as e:
            raise AssertionError("%s: kubelet's Allocate of %d %s failed: %s: %s\nplugin log:\n%s"
                                 % (self.name, n, resource, e.code(), e.details(),
                                    self.plugin.child.log_tail(10)))
        rig.assertEqual(len(resp.container_responses), 1)
        rig.used.setdefault(resource, set()).update(ids)
        return ids, resp.container_responses[0]

    def admit_pod(self, pod, order=None):
        """kubelet admits a pod: init containers, then app containers, each resource of each.

        order: {container: [resources in the order kubelet's map gives them]}; default
        gpu-mem first. Returns {container: {resource: (ids, response)}}.
        """
        spec = pod["spec"]
        # kubelet's devicesToReuse: an init container's devices may serve the containers
        # after it; an app container's devices are no longer reusable once it has them.
        reusable = {}  # resource -> [IDs]
        out = {}
        for init, c in [(True, c) for c in spec.get("initContainers") or []] + \
                       [(False, c) for c in spec["containers"]]:
            limits = c.get("resources", {}).get("limits", {})
            resources = [r for r in (order or {}).get(c["name"], (MEM, CORE)) if r in limits]
            for r in resources:
                ids, resp = self.admit(r, int(limits[r]), reusable.get(r, []))
                pool = reusable.setdefault(r, [])
                if init:
                    pool += [i for i in ids if i not in pool]
                else:
                    pool[:] = [i for i in pool if i not in ids]
                out.setdefault(c["name"], {})[r] = (ids, resp)
        return out


# ---------------------------------------------------------------------------
# The test: one cluster for all steps
# ---------------------------------------------------------------------------

class TestEndToEnd(unittest.TestCase):
    maxDiff = 6000

    @classmethod
    def setUpClass(cls):
        cls.t_start = time.monotonic()
        cls.tmp = tempfile.mkdtemp(prefix="kgpu-e2e-")
        cls.standin = cls.ext = None
        cls.nodes = {}
        cls.stopped = False
        try:
            cls._bring_up()
        except BaseException:
            cls._cleanup()
            raise

    @classmethod
    def _bring_up(cls):
        s = cls.standin = te.StandIn(cls.tmp)
        # The Nodes exist first, as kubelet registers them: allocatable CPU and memory,
        # no GPU annotation. The plugins add theirs.
        inventories = {"e2e-t4": tdp.make_gpus(2, memory_mib=15360, model="Tesla T4",
                                               numa=(0, 1)),
                       "e2e-a100": tdp.make_gpus(2, memory_mib=40960,
                                                 model="NVIDIA A100-SXM4-40GB", numa=(0,))}
        for name, gpus in inventories.items():
            s.add_node(name, cpu="32", memory="128Gi")
            s.nodes[name] = gpus  # what te.StandIn.overbooked() checks against
        # The extender starts before the plugins: it learns the GPUs through its watch.
        config = shipped_extender_config(os.path.join(cls.tmp, "config.yaml"))
        kubeconfig = s.kubeconfig(os.path.join(cls.tmp, "extender.kubeconfig"))
        cls.ext = te.Extender(cls.tmp, ["--config", config, "--kubeconfig", kubeconfig])
        for name, gpus in inventories.items():
            cls.nodes[name] = Node(name, gpus, s)
        for n in cls.nodes.values():
            n.start()
        for n in cls.nodes.values():
            n.wait_up()
        cls.t4, cls.a100 = cls.nodes["e2e-t4"], cls.nodes["e2e-a100"]

    @classmethod
    def tearDownClass(cls):
        try:
            if not cls.stopped:
                cls._stop_all_checked()
        finally:
            cls._cleanup()

    @classmethod
    def _cleanup(cls):
        for n in cls.nodes.values():
            for p in n.rig.plugins:
                p.child.stop(signal.SIGKILL)
            for p in n.rig.plugins:
                p.stopped = True   # checked (or not wanted) already: tearDown only kills
            try:
                n.rig.tearDown()   # kubelet stand-in down, its folder removed (or kept)
            except Exception:
                pass
        if cls.ext is not None:
            cls.ext.child.stop(signal.SIGKILL)
        if cls.standin is not None:
            cls.standin.child.stop(signal.SIGKILL)
        if os.environ.get("KGPU_TEST_KEEP"):
            sys.stderr.write("\nend-to-end: kept %s\n" % cls.tmp)
        else:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def _stop_all_checked(cls):
        """SIGTERM to every binary: exit 0, no sanitizer report (plugins: sockets gone)."""
        cls.stopped = True
        problems = []
        for n in cls.nodes.values():
            try:
                n.plugin.stop()  # test_device_plugin's checks: rc 0, sockets, sanitizers
            except AssertionError as e:
                problems.append("%s: %s" % (n.name, e))
        if cls.ext is not None:
            alive = cls.ext.child.alive()
            rc, report = cls.ext.stop()
            if report:
                problems.append("kgpu-extender: sanitizer report:\n" + report)
            if rc != 0:
                problems.append("kgpu-extender exited %s on SIGTERM (alive before: %s):\n%s"
                                % (rc, alive, cls.ext.child.log_tail()))
        if cls.standin is not None:
            rc = cls.standin.stop()
            if rc != 0:
                problems.append("API stand-in exited %s:\n%s" % (rc, cls.standin.child.log_tail()))
        if problems:
            raise AssertionError("\n\n".join(problems))

    def setUp(self):
        if self.stopped:
            self.skipTest("the binaries were stopped already")
        for n in self.nodes.values():
            self.assertTrue(n.plugin.child.alive(), "%s's plugin died:\n%s"
                            % (n.name, n.plugin.child.log_tail()))
        self.assertTrue(self.ext.child.alive(), "the extender died:\n" + self.ext.child.log_tail())

    # Helpers.

    def logs(self):
        out = ["--- extender ---", self.ext.child.log_tail(25)]
        for n in self.nodes.values():
            out += ["--- plugin %s ---" % n.name, n.plugin.child.log_tail(25)]
        return "\n".join(out)

    def wait(self, predicate, timeout, what, interval=0.02):
        try:
            return te.wait_for(predicate, timeout, interval=interval, what=what)
        except AssertionError as e:
            raise AssertionError("%s\n%s" % (e, self.logs()))

    def timed(self, verb, fn, *args, **kw):
        t0 = time.monotonic()
        out = fn(*args, **kw)
        took = time.monotonic() - t0
        self.assertLess(took, SCHEDULER_TIMEOUT, "%s took %.2f s, past kube-scheduler's "
                        "httpTimeout" % (verb, took))
        return out

    def new_pod(self, ns, name, containers, init=None):
        pod = te.pod_object(name, containers)
        if init:
            pod["spec"]["initContainers"] = init
        return self.standin.add_pod(pod, ns)

    def pod(self, pod):
        return self.standin.get_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])

    def filter(self, pod, names):
        """The filter answer, checked against the nodeCacheCapable rules."""
        res = self.timed("filter", self.ext.filter, pod, names)
        self.assertFalse(res.get("Error"), res)
        fits = res["NodeNames"] or []
        self.assertTrue(set(fits) <= set(names), "filter returned names it was not sent: %r" % res)
        failed = set(res["FailedNodes"] or {}) | set(res["FailedAndUnresolvableNodes"] or {})
        self.assertEqual(set(fits) | failed, set(names), res)
        self.assertEqual(set(fits) & failed, set(), res)
        return res

    def schedule(self, pod, names):
        """kube-scheduler's cycle: filter, prioritize, bind to the best. Returns the node."""
        res = self.filter(pod, names)
        fits = res["NodeNames"] or []
        self.assertTrue(fits, "no node fits %s: %r\n%s" % (pod["metadata"]["name"], res,
                                                           self.logs()))
        scores = self.timed("prioritize", self.ext.prioritize, pod, fits)
        self.assertEqual(sorted(s["Host"] for s in scores), sorted(fits))
        for s in scores:
            self.assertTrue(0 <= s["Score"] <= 10, scores)
        best = max(scores, key=lambda s: s["Score"])["Host"]
        err = self.timed("bind", self.ext.bind, pod, best)
        self.assertEqual(err, "", "bind of %s to %s: %s" % (pod["metadata"]["name"], best, err))
        return best

    def bound(self, pod, node):
        """The pod as the API server holds it after the extender's Binding; its assignment."""
        got = self.pod(pod)
        self.assertEqual(got["spec"].get("nodeName"), node)
        ann = annotations(got)
        self.assertEqual(ann.get("kgpu.io/node"), node)
        self.assertIn("kgpu.io/bind-time", ann)
        self.assertNotIn("kgpu.io/allocated", ann)
        assignment = json.loads(ann["kgpu.io/assignment"])
        node_uuids = {g["uuid"] for g in self.nodes[node].gpus}
        for part in assignment:
            for g in part["gpus"]:
                self.assertIn(g["uuid"], node_uuids, "assignment names a GPU not on %s" % node)
                self.assertEqual(self.nodes[node].by_uuid(g["uuid"])["index"], g["index"])
        return got, assignment

    def expected_gpus(self, node, pod, assignment, cname):
        """[(gpu dict, memory_mib, core_pct)] for a container, as the plugin must hand it out.

        The container's own assignment entry; an init container without one gets the first
        GPUs of the first app entry large enough for it, with its own amounts.
        """
        containers = {c["name"]: (c, False) for c in pod["spec"]["containers"]}
        containers.update({c["name"]: (c, True)
                           for c in pod["spec"].get("initContainers") or []})
        c, init = containers[cname]
        limits = c["resources"]["limits"]
        core = int(limits.get(CORE, 0))
        parts = {p["container"]: p for p in assignment}
        if cname in parts:
            return [(node.by_uuid(g["uuid"]), g["memory_mib"], g["milli"] // 10 or 100)
                    for g in parts[cname]["gpus"]]
        self.assertTrue(init, "app container %s has no assignment entry: %r" % (cname, assignment))
        mem = int(limits.get(MEM, 0)) * 1024
        for p in assignment:
            if p["container"] in containers and not containers[p["container"]][1] and \
                    p["gpus"] and p["gpus"][0]["memory_mib"] >= mem and \
                    p["gpus"][0]["milli"] >= core * 10:
                return [(node.by_uuid(p["gpus"][0]["uuid"]), mem, core or 100)]
        self.fail("no app entry holds init container %s: %r" % (cname, assignment))

    def assert_admitted(self, node, pod, assignment, answers, pod_units):
        """Every container's answers: env and mounts with its first resource, the others empty,
        the limits files; the preferred IDs on the container's assigned GPUs."""
        got = self.pod(pod)
        for cname, per_res in answers.items():
            want = self.expected_gpus(node, pod, assignment, cname)
            uuids = {g["uuid"] for g, _, _ in want}
            primary = MEM if MEM in per_res else CORE
            for r, (ids, resp) in per_res.items():
                self.assertTrue(all(i.split("::")[0] in uuids for i in ids),
                                "%s %s: kubelet's IDs for %s are not on its GPUs %s: %r"
                                % (pod["metadata"]["name"], cname, r, sorted(uuids), ids))
                if r == primary:
                    self.assertEqual(resp.envs["NVIDIA_VISIBLE_DEVICES"],
                                     ",".join(g["uuid"] for g, _, _ in want),
                                     "%s container %s got another pod's or container's GPU"
                                     % (pod["metadata"]["name"], cname))
                    node.rig.assert_container_response(resp, got, cname, want,
                                                       pod_units=pod_units)
                else:
                    node.rig.assert_empty_response(resp)

    def assert_allocated(self, pod):
        ann = annotations(self.pod(pod))
        self.assertRegex(ann.get("kgpu.io/allocated", ""), r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
        self.assertNotIn("kgpu.io/allocating", ann)

    def assert_state_matches(self, timeout=5.0):
        """The extender's /inspect agrees with the pods' assignments; nothing overbooked."""
        last = {}

        def same():
            last["held"], last["truth"] = self.ext.held(), self.standin.truth()
            return last["held"] == last["truth"]
        try:
            te.wait_for(same, timeout, interval=0.05, what="/inspect to equal the stand-in")
        except AssertionError:
            self.assertEqual(last["held"], last["truth"],
                             "/inspect (first) differs from the pods' annotations (second)")
        self.assertEqual(self.standin.overbooked(last["truth"]), [])

    def inspect_gpus(self, node):
        """{index: GPU object of /inspect} of one node."""
        return {g["index"]: g for x in self.ext.inspect()["nodes"] if x["name"] == node
                for g in x["gpus"]}

    def awaiting(self, node):
        for n in self.ext.inspect()["nodes"]:
            if n["name"] == node:
                return [(w["namespace"], w["pod"]) for w in n["awaiting_allocation"]]
        return None

    # 1. Inventory: plugin -> node annotation -> extender

    def test_1_plugins_publish_and_extender_learns(self):
        for n in self.nodes.values():
            def published(n=n):
                node = self.standin.get_node(n.name)
                text = annotations(node).get("kgpu.io/gpus")
                return node if text and json.loads(text) == n.gpus else None
            node = self.wait(published, 10, "%s's kgpu.io/gpus annotation" % n.name)
            labels = node["metadata"]["labels"]
            self.assertEqual(labels["kgpu.io/gpu-model"], n.gpus[0]["model"].replace(" ", "-"))
            self.assertEqual(labels["kgpu.io/gpu-count"], "2")
            # What kubelet registered stays: the plugin patches, it does not replace.
            self.assertEqual(labels["kubernetes.io/hostname"], n.name)
            self.assertEqual(node["status"]["allocatable"]["cpu"], "32")
            self.assertEqual(node["status"]["allocatable"]["memory"], "128Gi")
            # kubelet's view: 15 (or 40) IDs of 1 GiB per GPU, 100 gpu-core IDs per GPU.
            self.assertEqual(set(n.rig.kubelet.lists[MEM]),
                             {i for g in n.gpus for i in tdp.ids_of(g, MEM)})
            self.assertEqual(len(n.rig.kubelet.lists[CORE]), 200)

        def learned():
            doc = self.ext.inspect()
            got = {x["name"]: [{k: g[k] for k in ("index", "uuid", "model", "memory_mib",
                                                  "numa", "healthy")} for g in x["gpus"]]
                   for x in doc["nodes"]}
            return got if all(got.get(n.name) == n.gpus for n in self.nodes.values()) else None
        self.wait(learned, 10, "the extender's /inspect to show both nodes' GPUs")
        # Filter answers follow the learned memory: 20 GiB fits an A100, never a T4.
        probe = self.new_pod("e2e-probe", "big", [te.container("main", te.share(mem=20))])
        res = self.filter(probe, ["e2e-t4", "e2e-a100"])
        self.assertEqual(res["NodeNames"], ["e2e-a100"])
        self.assertEqual(list(res["FailedAndUnresolvableNodes"]), ["e2e-t4"])
        self.assertIn("asks 20480 MiB of GPU memory, largest GPU here has 15360 MiB",
                      res["FailedAndUnresolvableNodes"]["e2e-t4"])
        self.standin.delete_pod("e2e-probe", "big")

    # 2. One pod through the whole flow

    def test_2_one_pod_scheduled_and_allocated(self):
        pod = self.new_pod("e2e-solo", "solo",
                           [te.container("main", te.share(mem=2, core=20))])
        node_name = self.schedule(pod, ["e2e-t4", "e2e-a100"])
        node = self.nodes[node_name]
        got, assignment = self.bound(pod, node_name)
        self.assertEqual([p["container"] for p in assignment], ["main"])
        self.assertEqual(assignment[0]["gpus"][0]["memory_mib"], 2048)
        self.assertEqual(assignment[0]["gpus"][0]["milli"], 200)
        self.assertIn(("e2e-solo", "solo"), self.awaiting(node_name))
        answers = node.admit_pod(got)
        self.assert_admitted(node, got, assignment, answers, pod_units=2)
        self.assert_allocated(pod)
        self.wait(lambda: self.awaiting(node_name) == [], 5,
                  "the extender to see solo allocated")
        self.assert_state_matches()

    # 3. Two pods of one size at the same moment for the same node

    def race(self, ns, limits, orders=(None, None)):
        """Two pods asking `limits` reach kube-scheduler at the same moment, for e2e-t4 only.

        Returns [(pod, assignment, answers)] in the order they were bound.
        """
        t4 = self.t4
        pods = [self.new_pod(ns, "twin-%d" % i, [te.container("main", limits)])
                for i in range(2)]
        # Two scheduling cycles at once (a second scheduler replica, or a retry meeting a
        # fresh pod): both filters pass, as neither pod is bound yet, then both bind.
        results = {}
        barrier = threading.Barrier(2)

        def cycle(p):
            barrier.wait(5)
            res = self.ext.filter(p, ["e2e-t4"])
            scores = self.ext.prioritize(p, res["NodeNames"] or [])
            barrier.wait(5)
            results[p["metadata"]["name"]] = (res, scores, self.ext.bind(p, "e2e-t4"))
        threads = [threading.Thread(target=cycle, args=(p,)) for p in pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual(len(results), 2, results)
        for name, (res, scores, _) in results.items():
            self.assertEqual(res["NodeNames"], ["e2e-t4"], "%s: %r" % (name, res))
            self.assertEqual([s["Host"] for s in scores], ["e2e-t4"])
        errors = {name: r[2] for name, r in results.items()}
        self.assertEqual(sorted(errors.values()).count(""), 1,
                         "exactly one of two same-size binds may win: %r" % errors)
        first = [p for p in pods if errors[p["metadata"]["name"]] == ""][0]
        second = [p for p in pods if p is not first][0]
        fname, sname = first["metadata"]["name"], second["metadata"]["name"]
        reason = "waiting for kubelet to allocate %s/%s (same kgpu.io/gpu-mem: 4); retry shortly" \
            % (ns, fname)
        self.assertIn(reason, errors[sname])
        self.assertIsNone(self.pod(second)["spec"].get("nodeName"), "the refused pod was bound")
        got1, assign1 = self.bound(first, "e2e-t4")
        failures = self.ext.metric("kgpu_extender_bind_failures_total",
                                   {"reason": "awaiting_allocation"}) or 0

        # kube-scheduler retries the second: filter refuses the node, naming the first.
        res = self.filter(second, ["e2e-t4"])
        self.assertEqual(res["NodeNames"] or [], [])
        self.assertEqual(res["FailedNodes"], {"e2e-t4": reason})
        self.assertEqual(res["FailedAndUnresolvableNodes"] or {}, {})
        self.assertEqual(self.awaiting("e2e-t4"), [(ns, fname)])
        left = [w["seconds_left"] for x in self.ext.inspect()["nodes"] if x["name"] == "e2e-t4"
                for w in x["awaiting_allocation"]]
        self.assertTrue(100 < left[0] <= 120, "allocateWaitSeconds is not the shipped 120: %.1f s "
                        "left" % left[0])
        # A bind that comes anyway is refused as well, and holds nothing.
        self.assertIn(reason, self.timed("bind", self.ext.bind, second, "e2e-t4"))
        self.assertEqual(self.ext.metric("kgpu_extender_bind_failures_total",
                                         {"reason": "awaiting_allocation"}), failures + 1)
        self.assertIsNone(self.pod(second)["spec"].get("nodeName"))

        # kubelet admits the first; the plugin marks it allocated.
        answers1 = t4.admit_pod(got1, orders[0])
        self.assert_admitted(t4, got1, assign1, answers1, pod_units=4)
        self.assert_allocated(first)

        # The extender sees the MODIFIED event and lets the second in.
        t0 = time.monotonic()
        self.wait(lambda: (self.ext.filter(second, ["e2e-t4"])["NodeNames"] or []) == ["e2e-t4"],
                  5, "the extender to accept %s once %s is allocated" % (sname, fname),
                  interval=0.01)
        took = time.monotonic() - t0
        self.assertLess(took, 2.0, "the allocated mark took %.2f s to reach filter" % took)
        self.assertEqual(self.schedule(second, ["e2e-t4"]), "e2e-t4")
        got2, assign2 = self.bound(second, "e2e-t4")
        self.assertEqual(self.awaiting("e2e-t4"), [(ns, sname)])

        # kubelet admits the second.
        answers2 = t4.admit_pod(got2, orders[1])
        self.assert_admitted(t4, got2, assign2, answers2, pod_units=4)
        self.assert_allocated(second)

        # Each pod's answer is its own assignment's GPU, and so are kubelet's device IDs.
        for got, assign, answers in ((got1, assign1, answers1), (got2, assign2, answers2)):
            uuid = assign[0]["gpus"][0]["uuid"]
            for r, (ids, resp) in answers["main"].items():
                self.assertTrue(all(i.startswith(uuid + "::") for i in ids),
                                "GetPreferredAllocation did not steer %s onto %s: %r"
                                % (r, uuid, ids))
            resp = answers["main"][MEM][1]
            self.assertEqual(resp.envs["NVIDIA_VISIBLE_DEVICES"], uuid,
                             "%s got another pod's GPU" % got["metadata"]["name"])
            self.assertEqual(resp.envs["KGPU_MEMORY_LIMIT_MIB"], "4096")
            limits_file = os.path.join(t4.rig.state_dir, "pods", got["metadata"]["uid"],
                                       "main.limits")
            with open(limits_file) as f:
                self.assertEqual(f.read(), tdp.limits_text(
                    [(uuid, 4096, int(limits.get(CORE, 100)))]))
        self.assertNotEqual(got1["metadata"]["uid"], got2["metadata"]["uid"])
        self.wait(lambda: self.awaiting("e2e-t4") == [], 5, "nothing awaiting on e2e-t4")
        self.assert_state_matches()
        return [(got1, assign1, answers1), (got2, assign2, answers2)]

    def test_3a_same_size_pods_at_once(self):
        """gpu-mem 4 twice: the policy may put both on one GPU (kgpu packs them)."""
        self.race("e2e-race", te.share(mem=4))

    def test_3b_same_size_pods_at_once_on_two_gpus(self):
        """gpu-mem 4 and gpu-core 60 twice: they cannot share a GPU, so a mix-up would show."""
        placed = self.race("e2e-race2", te.share(mem=4, core=60),
                           orders=({"main": (MEM, CORE)}, {"main": (CORE, MEM)}))
        self.assertNotEqual(placed[0][1][0]["gpus"][0]["uuid"], placed[1][1][0]["gpus"][0]["uuid"],
                            "two 60 % pods on one GPU")

    def test_3c_many_same_size_pods_with_async_binds(self):
        """Twelve small pods at once for both nodes, as kube-scheduler really runs them.

        kube-scheduler filters the next pod while earlier binds are still in flight (it binds
        asynchronously) and puts a pod whose bind failed back in its queue after a backoff;
        each node's kubelet admits the pods bound to it one at a time, in bind order. The
        pods ask gpu-mem 1, 2 or 3, some gpu-core 5 too: at no moment may two pods awaiting
        allocation on one node share an ask, and every pod must end allocated with the GPU
        of its own assignment.
        """
        ns = "e2e-storm"
        names = ["e2e-t4", "e2e-a100"]
        pods = [self.new_pod(ns, "s-%02d" % i, [te.container(
                    "main", te.share(mem=1 + i % 3, core=5 if i % 4 == 1 else None))])
                for i in range(12)]

        def asks(pod):
            return {(r, int(v)) for c in pod["spec"]["containers"] for r, v in
                    c["resources"]["limits"].items() if r in (MEM, CORE)}
        lock = threading.Lock()
        queue = list(pods)   # (kube-scheduler's active queue)
        backoff = []         # (when due, pod)
        in_flight = set()
        bound = {}           # pod name -> node
        admitted = {}        # pod name -> (pod as kubelet saw it, answers)
        problems = []
        refused = [0]        # filter verdicts and binds refused while a same-size pod awaited
        done = threading.Event()

        def bind(pod, node):
            name = pod["metadata"]["name"]
            try:
                err = self.ext.bind(pod, node)
            except Exception as e:  # noqa: BLE001 (reported below)
                err = "bind call failed: %r" % e
            with lock:
                in_flight.discard(name)
                if err == "":
                    bound[name] = node
                    return
                if "waiting for kubelet to allocate" in err:
                    refused[0] += 1
                elif "memory free" not in err:  # room taken by a bind in flight: retried
                    problems.append("bind %s to %s: %s" % (name, node, err))
                backoff.append((time.monotonic() + 0.02, pod))

        def kubelet(node):
            try:
                while not done.is_set():
                    waiting = [p for p in self.standin.pods()
                               if p["metadata"]["namespace"] == ns
                               and p["spec"].get("nodeName") == node.name
                               and "kgpu.io/allocated" not in annotations(p)]
                    seen = {}
                    for p in waiting:
                        for a in asks(p):
                            if a in seen:
                                problems.append("%s and %s await allocation on %s at once, "
                                                "both asking %s %d: kubelet's Allocate cannot "
                                                "tell them apart" % (seen[a], p["metadata"]["name"],
                                                                     node.name, a[0], a[1]))
                                return
                            seen[a] = p["metadata"]["name"]
                    if not waiting:
                        time.sleep(0.005)
                        continue
                    # kubelet admits in the order it saw the pods bound.
                    pod = min(waiting, key=lambda p: int(p["metadata"]["resourceVersion"]))
                    order = {"main": (CORE, MEM)} if len(admitted) % 3 == 0 else None
                    answers = node.admit_pod(pod, order)
                    with lock:
                        admitted[pod["metadata"]["name"]] = (pod, answers)
            except Exception as e:  # noqa: BLE001 (reported below)
                problems.append("kubelet %s: %s" % (node.name, e))

        kubelets = [threading.Thread(target=kubelet, args=(n,), daemon=True)
                    for n in self.nodes.values()]
        for t in kubelets:
            t.start()
        binders = []
        t0 = time.monotonic()
        deadline = t0 + 20
        try:
            while time.monotonic() < deadline and not problems:
                with lock:
                    if len(admitted) == len(pods):
                        break
                    now = time.monotonic()
                    queue += [p for due, p in backoff if due <= now]
                    backoff[:] = [(due, p) for due, p in backoff if due > now]
                    pod = queue.pop(0) if queue else None
                if pod is None:
                    time.sleep(0.005)
                    continue
                res = self.filter(pod, names)
                fits = res["NodeNames"] or []
                for node, why in (res["FailedNodes"] or {}).items():
                    if "waiting for kubelet to allocate" in why:
                        refused[0] += 1
                    elif "memory free" not in why:  # e2e-t4 may fill up: kgpu packs
                        problems.append("filter %s: %s: %s" % (pod["metadata"]["name"], node,
                                                              why))
                if not fits:
                    with lock:
                        backoff.append((time.monotonic() + 0.02, pod))
                    continue
                scores = self.ext.prioritize(pod, fits)
                best = max(scores, key=lambda x: x["Score"])["Host"]
                with lock:
                    in_flight.add(pod["metadata"]["name"])
                t = threading.Thread(target=bind, args=(pod, best), daemon=True)
                t.start()
                binders.append(t)
        finally:
            done.set()
            for t in binders + kubelets:
                t.join(20)
        took = time.monotonic() - t0
        self.assertEqual(problems, [], "\n" + self.logs())
        self.assertEqual(sorted(admitted), sorted(p["metadata"]["name"] for p in pods),
                         "not every pod was bound and admitted within 20 s (bound: %r)\n%s"
                         % (bound, self.logs()))
        for name, (pod, answers) in sorted(admitted.items()):
            node = self.nodes[bound[name]]
            got = self.pod(pod)
            self.assertEqual(got["spec"]["nodeName"], node.name)
            assignment = json.loads(annotations(got)["kgpu.io/assignment"])
            self.assert_admitted(node, got, assignment, answers,
                                 pod_units=int(got["spec"]["containers"][0]["resources"]
                                               ["limits"][MEM]))
            self.assert_allocated(got)
        self.assert_state_matches()
        sys.stderr.write("\n  [12 pods bound and admitted in %.2f s; %d refusals while a "
                         "pod of the same size awaited kubelet]\n" % (took, refused[0]))

    # 4. A pod with an init container and two app containers

    def test_4_multi_container_pod(self):
        pod = self.new_pod(
            "e2e-multi", "multi",
            [te.container("train", te.share(mem=6)),
             te.container("side", te.share(mem=3, core=30))],
            init=[te.container("setup", te.share(mem=2))])
        node_name = self.schedule(pod, ["e2e-t4", "e2e-a100"])
        node = self.nodes[node_name]
        got, assignment = self.bound(pod, node_name)
        by_name = {p["container"]: p for p in assignment}
        # The init container runs before the app containers: train's share holds it.
        self.assertEqual(sorted(by_name), ["side", "train"])
        self.assertEqual([(g["memory_mib"], g["milli"]) for g in by_name["train"]["gpus"]],
                         [(6144, 0)])
        self.assertEqual([(g["memory_mib"], g["milli"]) for g in by_name["side"]["gpus"]],
                         [(3072, 300)])
        # kubelet: setup, train (reusing setup's devices), side (gpu-core first this time).
        answers = node.admit_pod(got, order={"side": (CORE, MEM)})
        self.assertEqual(list(answers), ["setup", "train", "side"])
        self.assert_admitted(node, got, assignment, answers, pod_units=9)
        setup_ids = set(answers["setup"][MEM][0])
        self.assertTrue(setup_ids <= set(answers["train"][MEM][0]),
                        "train did not get setup's devices back, as kubelet reuses them")
        self.assertEqual(answers["setup"][MEM][1].envs["KGPU_MEMORY_LIMIT_MIB"], "2048")
        self.assertEqual(answers["train"][MEM][1].envs["KGPU_MEMORY_LIMIT_MIB"], "6144")
        self.assertEqual(answers["side"][MEM][1].envs["KGPU_MEMORY_LIMIT_MIB"], "3072")
        self.assertEqual(answers["side"][MEM][1].envs["KGPU_CORE_LIMIT_PCT"], "30")
        self.assertEqual(answers["side"][MEM][1].envs["NVIDIA_VISIBLE_DEVICES"],
                         by_name["side"]["gpus"][0]["uuid"])
        self.assertEqual(answers["train"][MEM][1].envs["NVIDIA_VISIBLE_DEVICES"],
                         by_name["train"]["gpus"][0]["uuid"])
        self.assertEqual(answers["setup"][MEM][1].envs["NVIDIA_VISIBLE_DEVICES"],
                         by_name["train"]["gpus"][0]["uuid"])
        uid = got["metadata"]["uid"]
        files = sorted(f for f in node.rig.pod_files() if f.startswith(uid))
        self.assertEqual(files, sorted([uid, uid + "/shared", uid + "/setup.limits",
                                        uid + "/train.limits", uid + "/side.limits"]))
        self.assert_allocated(pod)
        self.assert_state_matches()

    # 5. A GPU turns unhealthy

    def test_5_unhealthy_gpu(self):
        node = self.a100
        rig = node.rig
        doc = self.inspect_gpus("e2e-a100")
        # The GPU with the most room goes bad: then only the other may take new pods.
        bad = max(node.gpus, key=lambda g: doc[g["index"]]["memory_mib"] -
                  doc[g["index"]]["memory_allocated_mib"])
        good = [g for g in node.gpus if g is not bad][0]
        gpus = [dict(g, healthy=(g is not bad)) for g in node.gpus]
        t0 = time.monotonic()
        rig.write_gpus(gpus, atomic=True)
        bad_ids = {MEM: set(tdp.ids_of(bad, MEM)), CORE: set(tdp.ids_of(bad, CORE))}
        for r in (MEM, CORE):
            t, _ = rig.kubelet.wait_list(
                r, lambda d, r=r: all(d[i].health == ("Unhealthy" if i in bad_ids[r]
                                                      else "Healthy") for i in d),
                since=t0, timeout=5)
            self.assertLess(t - t0, 1.0, "%s turned Unhealthy in ListAndWatch after %.2f s"
                            % (r, t - t0))

        def annotated():
            text = annotations(self.standin.get_node("e2e-a100")).get("kgpu.io/gpus")
            return text and json.loads(text) == gpus
        self.wait(annotated, 5, "healthy:false in e2e-a100's kgpu.io/gpus")
        self.wait(lambda: [g["healthy"] for _, g in sorted(self.inspect_gpus("e2e-a100").items())]
                  == [g["healthy"] for g in gpus], 5, "the extender to see the GPU unhealthy")

        # A new pod on that node lands on the healthy GPU, whatever the policy prefers.
        pod = self.new_pod("e2e-health", "after", [te.container("main", te.share(mem=5))])
        self.assertEqual(self.schedule(pod, ["e2e-a100"]), "e2e-a100")
        got, assignment = self.bound(pod, "e2e-a100")
        self.assertEqual([g["uuid"] for g in assignment[0]["gpus"]], [good["uuid"]],
                         "the extender placed a pod on the unhealthy GPU")
        answers = node.admit_pod(got)  # kubelet offers healthy IDs only
        self.assert_admitted(node, got, assignment, answers, pod_units=5)
        self.assert_allocated(pod)

        # A pod only the unhealthy GPU has room for: refused, naming the best healthy room.
        doc = self.inspect_gpus("e2e-a100")
        free_good = doc[good["index"]]["memory_mib"] - doc[good["index"]]["memory_allocated_mib"]
        free_bad = doc[bad["index"]]["memory_mib"] - doc[bad["index"]]["memory_allocated_mib"]
        units = free_good // 1024 + 1
        self.assertLessEqual(units * 1024, free_bad, "the test needs room on the bad GPU")
        big = self.new_pod("e2e-health", "big", [te.container("main", te.share(mem=units))])
        res = self.filter(big, ["e2e-a100"])
        self.assertEqual(res["NodeNames"] or [], [])
        self.assertEqual(res["FailedNodes"],
                         {"e2e-a100": "no single GPU has %d MiB memory free; best has %d"
                                      % (units * 1024, free_good)})
        err = self.timed("bind", self.ext.bind, big, "e2e-a100")
        self.assertIn("no single GPU has %d MiB memory free" % (units * 1024), err)
        self.assertIsNone(self.pod(big)["spec"].get("nodeName"))

        # Healthy again: kubelet, the annotation and the extender follow; the pod fits.
        t0 = time.monotonic()
        rig.write_gpus(node.gpus, atomic=True)
        t, _ = rig.kubelet.wait_list(MEM, lambda d: all(x.health == "Healthy"
                                                        for x in d.values()),
                                     since=t0, timeout=5)
        self.assertLess(t - t0, 1.0)
        self.wait(lambda: (self.filter(big, ["e2e-a100"])["NodeNames"] or []) == ["e2e-a100"],
                  5, "the extender to see the GPU healthy again")
        self.assertEqual(self.schedule(big, ["e2e-a100"]), "e2e-a100")
        got, assignment = self.bound(big, "e2e-a100")
        self.assertEqual([g["uuid"] for g in assignment[0]["gpus"]], [bad["uuid"]])
        answers = node.admit_pod(got)
        self.assert_admitted(node, got, assignment, answers, pod_units=units)
        self.assert_allocated(big)
        self.assert_state_matches()

    # 6. Stopping

    def test_6_sigterm_everything_exits_0(self):
        # Nothing awaits kubelet any more, and the extender's view equals the API server's.
        self.assertEqual(self.ext.inspect()["totals"]["pods_awaiting_allocation"], 0)
        self.assert_state_matches()
        took = time.monotonic() - self.t_start
        placed = []
        for p in self.standin.pods():
            ann = annotations(p)
            if "kgpu.io/assignment" in ann:
                gpus = {g["uuid"]: "%s/gpu%d" % (p["spec"]["nodeName"], g["index"])
                        for n in self.nodes.values() if n.name == p["spec"]["nodeName"]
                        for g in n.gpus}
                placed.append("%s/%s: %s" % (p["metadata"]["namespace"], p["metadata"]["name"],
                              ", ".join("%s->%s" % (x["container"], "+".join(
                                  gpus[g["uuid"]] for g in x["gpus"]))
                                  for x in json.loads(ann["kgpu.io/assignment"]))))
        sys.stderr.write("\n  [placements: %s]\n  [the flow took %.1f s before stopping]\n"
                         % ("; ".join(sorted(placed)), took))
        type(self)._stop_all_checked()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extender", default=os.environ.get("KGPU_EXTENDER_BIN"))
    ap.add_argument("--plugin", default=os.environ.get("KGPU_DEVICE_PLUGIN_BIN"))
    ap.add_argument("--protoc", default="protoc")
    args, rest = ap.parse_known_args()
    if tdp.grpc is None:
        sys.stderr.write("test_end_to_end: cannot import grpc (%s) with %s: skipped\n"
                         % (tdp._IMPORT_ERROR, sys.executable))
        return 77
    for what, path in (("kgpu-extender", args.extender), ("kgpu-device-plugin", args.plugin)):
        if not path or not os.access(path, os.X_OK):
            sys.stderr.write("test_end_to_end: %s not found (%r): skipped\n" % (what, path))
            return 77
    protoc = shutil.which(args.protoc)
    if protoc is None:
        sys.stderr.write("test_end_to_end: protoc not found: skipped\n")
        return 77
    te.EXTENDER_BIN = os.path.abspath(args.extender)
    tdp.PLUGIN_BIN = os.path.abspath(args.plugin)
    tdp.PROTOC = protoc
    tdp.PB = tdp.load_messages(SOURCE_DIR, protoc)

    # Both suites' children are harness.Child: run_tests kills them all.
    return harness.run_tests(sys.argv[0], rest)


if __name__ == "__main__":
    sys.exit(main())
