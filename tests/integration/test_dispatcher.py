#!/usr/bin/env python3
"""kgpu-dispatcher, MultiKueue's external dispatcher (stdlib only; issue 29).

The real binary against two real kgpu-extenders (worker clusters in
--cluster-file mode: worker-a with A100s, worker-b with T4s) and a manager
API server stand-in here that serves Kueue's AdmissionChecks,
MultiKueueConfigs, MultiKueueClusters and Workloads and takes merge patches
of a Workload's status with resourceVersion preconditions, as the real one
does. Each round is one `kgpu-dispatcher --once`. What is checked is which
cluster each Workload's .status.nominatedClusterNames names:

- a GPU type only one worker has goes there; a share that fits only the
  free GPUs of one worker goes there; nothing fits: nothing is nominated;
- a burst spreads by capacity: dispatches in flight are reserved, so six
  one-GPU jobs fill two A100s and four T4s instead of piling onto one;
- a worker whose extender does not answer, or whose MultiKueueCluster is
  not Active, or that is not in the Workload's MultiKueueConfig, is never
  nominated; a nomination to a worker that went away is replaced;
- preference annotation, static table and benchmark figures order the
  clusters as documented, but never buy a cluster that cannot place it;
- Workloads that do not wait for a dispatcher are left alone, and a status
  that changed since it was read (409) is not overwritten.

    test_dispatcher.py --dispatcher PATH --extender PATH --kgpu PATH [unittest args...]

Exit status: unittest's; 77 when a binary is missing.
"""

import argparse
import copy
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import urllib.parse

import test_extender as te
from harness import run_tests, wait_for
from test_extender import container, pod_object, share, whole

DISPATCHER_BIN = None
A100 = "NVIDIA A100-SXM4-80GB"
KUEUE = "/apis/kueue.x-k8s.io/v1beta2/"


def node(name, model, mib, count):
    return {"name": name, "gpus": [{"uuid": "GPU-%s-%d" % (name, i), "model": model,
                                    "memory_mib": mib} for i in range(count)]}


class Manager:
    """The manager cluster's API server, as far as the dispatcher reads and writes it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.objects = {"admissionchecks": [], "multikueueconfigs": [],
                        "multikueueclusters": [], "workloads": []}
        self.patches = []
        self.rv = 100
        mgr = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def reply(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                path = urllib.parse.urlparse(self.path).path
                kind = path[len(KUEUE):] if path.startswith(KUEUE) else None
                with mgr.lock:
                    if kind not in mgr.objects:
                        return self.reply(404, {"kind": "Status", "code": 404})
                    items = copy.deepcopy(mgr.objects[kind])
                self.reply(200, {"kind": "List", "metadata": {"resourceVersion": str(mgr.rv)},
                                 "items": items})

            def do_PATCH(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                path = urllib.parse.urlparse(self.path)
                parts = path.path[len(KUEUE):].split("/")  # namespaces/NS/workloads/NAME/status
                with mgr.lock:
                    mgr.patches.append((self.path, self.headers["Content-Type"], body))
                    for w in mgr.objects["workloads"]:
                        m = w["metadata"]
                        if [m["namespace"], m["name"]] != [parts[1], parts[3]]:
                            continue
                        if body["metadata"].get("resourceVersion") != m["resourceVersion"]:
                            return self.reply(409, {"kind": "Status", "code": 409,
                                                    "reason": "Conflict"})
                        w["status"]["nominatedClusterNames"] = \
                            body["status"]["nominatedClusterNames"]
                        mgr.rv += 1
                        m["resourceVersion"] = str(mgr.rv)
                        return self.reply(200, w)
                self.reply(404, {"kind": "Status", "code": 404})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path):
        with open(path, "w") as f:
            f.write("apiVersion: v1\nkind: Config\ncurrent-context: m\n"
                    "clusters:\n- name: m\n  cluster:\n    server: http://127.0.0.1:%d\n"
                    "contexts:\n- name: m\n  context:\n    cluster: m\n    user: u\n"
                    "users:\n- name: u\n  user:\n    token: t\n" % self.port)
        return path

    def topology(self, clusters=("worker-a", "worker-b"), active=("worker-a", "worker-b")):
        with self.lock:
            self.objects["admissionchecks"] = [
                {"metadata": {"name": "mk"},
                 "spec": {"controllerName": "kueue.x-k8s.io/multikueue",
                          "parameters": {"apiGroup": "kueue.x-k8s.io",
                                         "kind": "MultiKueueConfig", "name": "mk-config"}}},
                {"metadata": {"name": "other"},
                 "spec": {"controllerName": "example.com/provisioning"}}]
            self.objects["multikueueconfigs"] = [
                {"metadata": {"name": "mk-config"}, "spec": {"clusters": list(clusters)}}]
            self.objects["multikueueclusters"] = [
                {"metadata": {"name": c}, "status": {"conditions": [
                    {"type": "Active", "status": "True" if c in active else "False"}]}}
                for c in ("worker-a", "worker-b", "worker-c")]

    def add_workload(self, name, limits, count=1, annotations=None, labels=None, status=None):
        pod = pod_object(name, [container("main", limits)], annotations=annotations)
        tmpl = {"metadata": {"labels": labels or {}, "annotations": annotations or {}},
                "spec": pod["spec"]}
        st = {"conditions": [{"type": "QuotaReserved", "status": "True"}],
              "admissionChecks": [{"name": "mk", "state": "Pending"}]}
        if status is not None:
            st = status
        with self.lock:
            self.rv += 1
            self.objects["workloads"].append({
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                "metadata": {"namespace": "team-a", "name": name, "uid": "uid-" + name,
                             "resourceVersion": str(self.rv)},
                "spec": {"podSets": [{"name": "main", "count": count, "template": tmpl}]},
                "status": st})

    def nominated(self, name):
        with self.lock:
            for w in self.objects["workloads"]:
                if w["metadata"]["name"] == name:
                    return w["status"].get("nominatedClusterNames")
        raise KeyError(name)

    def admit(self, name, cluster):
        """What Kueue does once a worker reserved quota."""
        with self.lock:
            for w in self.objects["workloads"]:
                if w["metadata"]["name"] == name:
                    w["status"]["clusterName"] = cluster
                    w["status"].pop("nominatedClusterNames", None)
                    w["status"]["admissionChecks"][0]["state"] = "Ready"


class DispatcherTest(te.ExtenderTest):

    def setUp(self):
        super().setUp()
        self.mgr = Manager()
        self.addCleanup(self.mgr.stop)
        self.mgr.topology()
        self.workers = {}
        self.add_worker("worker-a", [node("a100-0", A100, 81920, 2)])
        self.add_worker("worker-b", [node("t4-0", "T4", 15360, 4)])
        self.kubeconfig = self.mgr.kubeconfig(os.path.join(self.tmp, "manager.kubeconfig"))
        self.n = 0

    def add_worker(self, name, nodes, extra=()):
        path = os.path.join(self.tmp, name + ".yaml")
        with open(path, "w") as f:
            json.dump({"nodes": nodes}, f)
        self.workers[name] = self.start_extender(["--cluster-file", path, "--cluster-name", name]
                                                 + list(extra), name=name + str(len(extra)))

    def clusters_file(self, extra=()):
        path = os.path.join(self.tmp, "clusters.yaml")
        with open(path, "w") as f:
            f.write("clusters:\n")
            for name, ext in list(self.workers.items()) + list(extra):
                url = ext if isinstance(ext, str) else ext.url
                f.write("  - name: %s\n    extender: %s\n" % (name, url))
        return path

    def dispatch(self, *extra, expect=0, clusters=None):
        argv = [DISPATCHER_BIN, "--once", "--kubeconfig", self.kubeconfig, "--clusters",
                clusters or self.clusters_file(), "--log-level", "debug"] + list(extra)
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, expect, out.stderr)
        for mark in te.SANITIZER_MARKS:
            self.assertNotIn(mark, out.stderr)
        return out.stderr

    def occupy(self, worker, node_name, limits):
        """A pod bound on a worker's node through its extender, as kube-scheduler would."""
        self.n += 1
        p = pod_object("busy%d" % self.n, [container("main", limits)])
        p["metadata"].update(namespace="team-z", uid="uid-busy%d" % self.n)
        ext = self.workers[worker]
        self.assertEqual(ext.filter(p, [node_name])["NodeNames"], [node_name])
        self.assertEqual(ext.bind(p, node_name), "")


class TestPlacement(DispatcherTest):

    def test_gpu_type_only_one_worker_has(self):
        self.mgr.add_workload("wants-a100", whole(1), annotations={"kgpu.io/gpu-type": "*A100*"})
        self.mgr.add_workload("wants-t4", whole(1), annotations={"kgpu.io/gpu-type": "T4"})
        self.mgr.add_workload("wants-h100", whole(1), annotations={"kgpu.io/gpu-type": "*H100*"})
        log = self.dispatch()
        self.assertEqual(self.mgr.nominated("wants-a100"), ["worker-a"], log)
        self.assertEqual(self.mgr.nominated("wants-t4"), ["worker-b"])
        self.assertIsNone(self.mgr.nominated("wants-h100"), log)
        self.assertIn("no cluster can place", log)
        # Server-side apply as Kueue's admission field manager, with the resourceVersion read.
        path, ctype, body = self.mgr.patches[0]
        self.assertEqual(ctype, "application/apply-patch+yaml")
        self.assertIn("/status?fieldManager=kueue-admission&force=true", path)
        self.assertEqual(body["status"], {"nominatedClusterNames": ["worker-a"]})
        self.assertIn("resourceVersion", body["metadata"])

    def test_the_apply_keeps_what_kueues_manager_owns(self):
        """The fields Kueue's admission manager owns go back as they are; no other field
        (those are other managers'), so that Kueue's own later apply, which omits the
        nomination, removes it."""
        owned = {"f:status": {
            "f:conditions": {'k:{"type":"QuotaReserved"}': {
                ".": {}, "f:type": {}, "f:status": {}, "f:reason": {}}},
            "f:admissionChecks": {'k:{"name":"mk"}': {".": {}, "f:name": {}, "f:state": {}}},
            "f:admission": {".": {}, "f:clusterQueue": {}},
            "f:requeueState": {}}}
        status = {"conditions": [{"type": "QuotaReserved", "status": "True", "reason": "R",
                                  "message": "another manager's"},
                                 {"type": "Other", "status": "True"}],
                  "admissionChecks": [{"name": "mk", "state": "Pending", "message": "x"},
                                      {"name": "other", "state": "Ready"}],
                  "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "main"}]},
                  "resourceRequests": [{"name": "main"}]}
        self.mgr.add_workload("w", whole(1), status=status)
        with self.mgr.lock:
            self.mgr.objects["workloads"][0]["metadata"]["managedFields"] = [
                {"manager": "kueue-admission", "operation": "Apply", "subresource": "status",
                 "fieldsType": "FieldsV1", "fieldsV1": owned},
                {"manager": "kueue-admission", "operation": "Update", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:status": {"f:resourceRequests": {}}}}]
        self.dispatch()
        body = self.mgr.patches[0][2]
        self.assertEqual(body["status"], {
            "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "R"}],
            "admissionChecks": [{"name": "mk", "state": "Pending"}],
            "admission": {"clusterQueue": "cq"},  # podSetAssignments: not in its set
            "nominatedClusterNames": ["worker-a"]})
        self.assertNotIn("managedFields", body["metadata"])
        self.assertEqual(body["metadata"]["uid"], "uid-w")
        self.assertEqual((body["apiVersion"], body["kind"]),
                         ("kueue.x-k8s.io/v1beta2", "Workload"))

    def test_a_share_that_fits_only_one_workers_free_gpus(self):
        # 20 GiB per pod: no T4 (15 GiB) holds it; the A100s do, until they are taken.
        self.mgr.add_workload("big-share", share(mem=20))
        self.dispatch()
        self.assertEqual(self.mgr.nominated("big-share"), ["worker-a"])
        # A 10 GiB share fits both; with worker-a's A100s taken whole, only worker-b.
        self.occupy("worker-a", "a100-0", whole(2))
        self.mgr.add_workload("small-share", share(mem=10))
        self.mgr.add_workload("big-share-2", share(mem=20))
        self.dispatch()
        self.assertEqual(self.mgr.nominated("small-share"), ["worker-b"])
        self.assertIsNone(self.mgr.nominated("big-share-2"))

    def test_a_burst_spreads_by_capacity(self):
        for i in range(7):
            self.mgr.add_workload("burst-%d" % i, whole(1))
        self.mgr.add_workload("pair", whole(2), count=2)  # two pods of two GPUs each
        log = self.dispatch()
        got = [self.mgr.nominated("burst-%d" % i) for i in range(7)]
        counts = {c: sum(1 for g in got if g == [c]) for c in ("worker-a", "worker-b")}
        # Six GPUs in all: two A100s and four T4s; the seventh and the pair find none left.
        self.assertEqual(counts, {"worker-a": 2, "worker-b": 4}, log)
        self.assertEqual(got.count(None), 1)
        self.assertIsNone(self.mgr.nominated("pair"))
        # Once admitted and held by the worker, the in-flight reserve is not counted twice:
        # a fresh dispatcher (nothing in flight) sees the extenders' own state.
        self.mgr.admit("burst-0", self.mgr.nominated("burst-0")[0])

    def test_a_pod_set_of_several_pods_needs_room_for_all(self):
        self.mgr.add_workload("four-t4", whole(1), count=4, annotations={"kgpu.io/gpu-type": "T4"})
        self.mgr.add_workload("three-any", whole(1), count=3)
        self.dispatch()
        self.assertEqual(self.mgr.nominated("four-t4"), ["worker-b"])
        # worker-b is spoken for; worker-a has two: three pods fit nowhere now.
        self.assertIsNone(self.mgr.nominated("three-any"))


class TestWorkersThatGoAway(DispatcherTest):

    def test_an_unreachable_extender_is_not_nominated(self):
        self.workers["worker-a"].kill()
        self.mgr.add_workload("any", whole(1))
        self.mgr.add_workload("a100", whole(1), annotations={"kgpu.io/gpu-type": "*A100*"})
        log = self.dispatch()
        self.assertEqual(self.mgr.nominated("any"), ["worker-b"])
        self.assertIsNone(self.mgr.nominated("a100"))
        self.assertIn("cluster worker-a: estimate failed", log)

    def test_inactive_or_unlisted_clusters_are_not_nominated(self):
        self.mgr.topology(active=("worker-b",))
        self.mgr.add_workload("any", whole(1), annotations={"kgpu.io/gpu-type": "*A100*,T4"})
        self.dispatch()
        self.assertEqual(self.mgr.nominated("any"), ["worker-b"])
        # Not in the MultiKueueConfig: never, even though its extender answers.
        self.mgr.topology(clusters=("worker-b",))
        self.mgr.add_workload("a100", whole(1), annotations={"kgpu.io/gpu-type": "*A100*"})
        self.dispatch()
        self.assertIsNone(self.mgr.nominated("a100"))

    def test_a_nomination_to_a_cluster_that_went_away_is_replaced(self):
        self.mgr.add_workload("w", whole(1), annotations={"kgpu.io/gpu-type-preference": "*A100*"})
        self.dispatch()
        self.assertEqual(self.mgr.nominated("w"), ["worker-a"])
        self.dispatch()  # still valid: left alone
        self.assertEqual(len(self.mgr.patches), 1)
        self.mgr.topology(active=("worker-b",))
        self.dispatch()
        self.assertEqual(self.mgr.nominated("w"), ["worker-b"])


class TestChoice(DispatcherTest):

    def bench(self, a100, t4):
        path = os.path.join(self.tmp, "bench.prom")
        with open(path, "w") as f:
            f.write("# TYPE kgpu_workload_throughput gauge\n"
                    'kgpu_workload_throughput{workload="tracksim",gpu_model="%s",'
                    'cluster="worker-a"} %s\n'
                    'kgpu_workload_throughput{workload="tracksim",gpu_model="T4",'
                    'cluster="worker-b"} %s\n'
                    'kgpu_workload_throughput{workload="gan",gpu_model="T4",'
                    'cluster="worker-b"} NaN\n' % (A100, a100, t4))
        return path

    def test_benchmarks_change_the_choice(self):
        labels = {"kgpu.io/workload": "tracksim"}
        self.mgr.add_workload("t1", whole(1), labels=labels)
        self.dispatch("--benchmarks", self.bench(a100=50, t4=100))
        self.assertEqual(self.mgr.nominated("t1"), ["worker-b"])
        self.mgr.add_workload("t2", whole(1), labels=labels)
        self.dispatch("--benchmarks", self.bench(a100=300, t4=100))
        self.assertEqual(self.mgr.nominated("t2"), ["worker-a"])
        # Figures never buy a cluster that cannot place it.
        self.occupy("worker-a", "a100-0", whole(1))
        self.occupy("worker-a", "a100-0", whole(1))
        self.mgr.add_workload("t3", whole(1), labels=labels)
        self.dispatch("--benchmarks", self.bench(a100=300, t4=100))
        self.assertEqual(self.mgr.nominated("t3"), ["worker-b"])

    def test_growth_counts_only_when_no_cluster_fits_now(self):
        groups = os.path.join(self.tmp, "groups.yaml")
        with open(groups, "w") as f:
            f.write("nodeGroups:\n  - {name: t4-pool, maxNodes: 2, nodeLabels: {pool: t4},\n"
                    "     gpus: {model: T4, count: 4, memoryMiB: 15360}}\n")
        self.workers["worker-b"].kill()
        t4 = node("t4-0", "T4", 15360, 4)
        t4["labels"] = {"pool": "t4"}
        self.add_worker("worker-b", [t4], ["--node-groups", groups])
        # Six GPUs now in all: a 5-pod job fits nowhere now; worker-b can grow a node of 4.
        self.mgr.add_workload("five", whole(1), count=5)
        self.mgr.add_workload("two", whole(1), count=2, annotations={"kgpu.io/gpu-type": "*A100*"})
        log = self.dispatch()
        self.assertEqual(self.mgr.nominated("five"), ["worker-b"], log)
        self.assertIn("grow 4", log)
        # Where room exists now, growth does not count: the A100 pair goes to worker-a.
        self.assertEqual(self.mgr.nominated("two"), ["worker-a"])
        # Beyond what the groups can add: nothing.
        self.mgr.add_workload("nine", whole(1), count=9, annotations={"kgpu.io/gpu-type": "T4"})
        self.dispatch()
        self.assertIsNone(self.mgr.nominated("nine"))

    def test_preference_then_table(self):
        table = os.path.join(self.tmp, "table.yaml")
        with open(table, "w") as f:
            f.write("workloads:\n  gan: ['*A100*']\n  fit: [T4]\n")
        # A workload's own preference wins over the table's for its key.
        self.mgr.add_workload("fit", whole(1), labels={"kgpu.io/workload": "fit"},
                              annotations={"kgpu.io/gpu-type-preference": "*A100*"})
        self.dispatch("--table", table)
        self.assertEqual(self.mgr.nominated("fit"), ["worker-a"])
        self.mgr.add_workload("likes-t4", whole(1),
                              annotations={"kgpu.io/gpu-type-preference": "T4, *A100*"})
        self.mgr.add_workload("likes-a100", whole(1),
                              annotations={"kgpu.io/gpu-type-preference": "*A100*"})
        self.mgr.add_workload("gan", whole(1), labels={"kgpu.io/workload": "gan"})
        self.mgr.add_workload("fit-2", whole(1), labels={"kgpu.io/workload": "fit"})
        self.dispatch("--table", table)
        self.assertEqual(self.mgr.nominated("likes-t4"), ["worker-b"])
        self.assertEqual(self.mgr.nominated("likes-a100"), ["worker-a"])
        self.assertEqual(self.mgr.nominated("gan"), ["worker-a"])
        self.assertEqual(self.mgr.nominated("fit-2"), ["worker-b"])
        # A preference is an order, not a requirement: with the A100s spoken for, T4.
        self.mgr.add_workload("likes-a100-late", whole(1),
                              annotations={"kgpu.io/gpu-type-preference": "*A100*"})
        self.occupy("worker-a", "a100-0", whole(2))
        self.dispatch("--table", table)
        self.assertEqual(self.mgr.nominated("likes-a100-late"), ["worker-b"])


class TestOrder(DispatcherTest):

    def test_higher_priority_then_older_first(self):
        # One A100 left after this: the later, higher-priority workload gets it, then the
        # older of two equal ones.
        self.occupy("worker-a", "a100-0", whole(1))
        a100 = {"kgpu.io/gpu-type": "*A100*"}
        self.mgr.add_workload("old-low", whole(1), annotations=a100)
        self.mgr.add_workload("new-high", whole(1), annotations=a100)
        with self.mgr.lock:
            for w in self.mgr.objects["workloads"]:
                name = w["metadata"]["name"]
                w["spec"]["priority"] = 1000 if name == "new-high" else 10
                w["metadata"]["creationTimestamp"] = ("2026-11-29T10:00:00Z" if name == "old-low"
                                                      else "2026-11-29T11:00:00Z")
        self.dispatch()
        self.assertEqual(self.mgr.nominated("new-high"), ["worker-a"])
        self.assertIsNone(self.mgr.nominated("old-low"))

    def test_an_unplaceable_workload_is_asked_again_after_a_pause(self):
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        self.mgr.add_workload("h100", whole(1), annotations={"kgpu.io/gpu-type": "*H100*"})
        child = subprocess.Popen([DISPATCHER_BIN, "--kubeconfig", self.kubeconfig,
                                  "--clusters", self.clusters_file(), "--interval", "0.2",
                                  "--listen", "127.0.0.1:%d" % port],
                                 stderr=subprocess.DEVNULL)
        try:
            def metric(name):
                try:
                    text = te.http_request(port, "GET", "/metrics")[2].decode()
                except OSError:
                    return -1
                m = re.search(r"^%s (\d+)$" % name, text, re.M)
                return int(m.group(1)) if m else -1
            wait_for(lambda: metric("kgpu_dispatcher_rounds_total") >= 15, 30, what="15 rounds")
            # Asked once in 15 rounds (3 s): the first pause is 5 s. Two clusters, one each.
            self.assertEqual(metric("kgpu_dispatcher_unplaceable_total"), 1)
            self.assertEqual(metric("kgpu_dispatcher_estimate_seconds_count"), 2)
        finally:
            child.terminate()
            self.assertEqual(child.wait(timeout=20), 0)


class TestLeftAlone(DispatcherTest):

    def test_workloads_that_do_not_wait_are_not_touched(self):
        quota = {"type": "QuotaReserved", "status": "True"}
        pending = {"name": "mk", "state": "Pending"}
        cases = {
            "no-quota": {"conditions": [], "admissionChecks": [pending]},
            "admitted": {"conditions": [quota], "admissionChecks": [pending],
                         "clusterName": "worker-b"},
            "ready": {"conditions": [quota], "admissionChecks": [{"name": "mk",
                                                                  "state": "Ready"}]},
            "not-multikueue": {"conditions": [quota],
                               "admissionChecks": [{"name": "other", "state": "Pending"}]},
            "finished": {"conditions": [quota, {"type": "Finished", "status": "True"}],
                         "admissionChecks": [pending]},
        }
        for name, st in cases.items():
            self.mgr.add_workload(name, whole(1), status=st)
        self.dispatch()
        self.assertEqual(self.mgr.patches, [])

    def test_a_status_changed_since_it_was_read_is_not_overwritten(self):
        self.mgr.add_workload("w", whole(1))
        orig = self.mgr.server.RequestHandlerClass.do_PATCH

        def racing(handler):
            with self.mgr.lock:  # Kueue wrote the status between the list and the patch
                w = self.mgr.objects["workloads"][0]
                w["metadata"]["resourceVersion"] = "999999"
            return orig(handler)
        self.mgr.server.RequestHandlerClass.do_PATCH = racing
        log = self.dispatch()
        self.mgr.server.RequestHandlerClass.do_PATCH = orig
        self.assertIsNone(self.mgr.nominated("w"))
        self.assertIn("Conflict", log)
        self.dispatch()
        self.assertEqual(self.mgr.nominated("w"), ["worker-a"])

    def test_bad_flags_and_files(self):
        bad = os.path.join(self.tmp, "bad.yaml")
        for text, words in (("clusters: []\n", "1..64 entries"),
                            ("clusters:\n- name: A\n  extender: http://x\n", "DNS label"),
                            ("clusters:\n- name: a\n  extender: ftp://x\n", "http:// or https://"),
                            ("clusters:\n- {name: a, extender: 'http://x', cert: c}\n",
                             "cert and key"),
                            ("clusters:\n- {name: a, extender: 'http://x', ca: c}\n",
                             "need an https://"),
                            ("clusters:\n- {name: a, extender: 'http://x'}\n"
                             "- {name: a, extender: 'http://y'}\n", "a twice"),
                            ("clusters:\n- {name: a, extender: 'http://x', zone: z}\n",
                             "unknown key zone")):
            with open(bad, "w") as f:
                f.write(text)
            out = subprocess.run([DISPATCHER_BIN, "--once", "--kubeconfig", self.kubeconfig,
                                  "--clusters", bad], capture_output=True, text=True, timeout=30)
            self.assertEqual(out.returncode, 2, text)
            self.assertIn(words, out.stderr)
        out = subprocess.run([DISPATCHER_BIN, "--clusters", self.clusters_file(), "--interval",
                              "0"], capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 2)
        table = os.path.join(self.tmp, "table.yaml")
        with open(table, "w") as f:
            f.write("workloads:\n  gan: []\n")
        self.dispatch("--table", table, expect=2)
        # A manager that does not answer: the round fails, exit 1.
        self.mgr.stop()
        self.dispatch(expect=1)


class TestInspectClusters(DispatcherTest):
    """`kgpu inspect --clusters FILE`: the same clusters file, each worker per GPU model."""

    def inspect(self, *extra, clusters=None, expect=0):
        out = subprocess.run([te.KGPU_BIN, "inspect", "--clusters",
                              clusters or self.clusters_file()] + list(extra),
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, expect, out.stderr)
        return out.stdout

    def test_per_cluster_and_model(self):
        self.occupy("worker-a", "a100-0", whole(1))
        self.occupy("worker-b", "t4-0", share(mem=4))
        doc = json.loads(self.inspect("--json"))
        rows = {c["cluster"]: c for c in doc}
        self.assertEqual(rows["worker-a"]["models"],
                         [{"model": A100, "gpus": 2, "allocated_gpus": 1.0, "whole_free": 1,
                           "pods": 1}])
        t4 = rows["worker-b"]["models"][0]
        self.assertEqual((t4["gpus"], t4["whole_free"], t4["pods"]), (4, 3, 1))
        self.assertTrue(rows["worker-b"]["reachable"])
        text = self.inspect()
        self.assertRegex(text, r"worker-a\s+NVIDIA A100-SXM4-80GB\s+2\s+1.00 \(50%\)\s+1\s+1")
        # A cluster that does not answer: its row says so, the others are shown.
        dead = self.clusters_file(extra=[("worker-z", "http://127.0.0.1:1")])
        text = self.inspect(clusters=dead)
        self.assertRegex(text, r"worker-z\s+unreachable: ")
        self.assertIn("worker-a", text)
        doc = json.loads(self.inspect("--json", clusters=dead))
        self.assertFalse([c for c in doc if c["cluster"] == "worker-z"][0]["reachable"])
        # None answers: exit 1. A bad file, or flags for one extender: 2.
        for w in self.workers.values():
            w.kill()
        self.inspect(expect=1)
        bad = os.path.join(self.tmp, "bad.yaml")
        with open(bad, "w") as f:
            f.write("clusters: []\n")
        self.inspect(clusters=bad, expect=2)
        self.inspect("--detail", expect=2)


class TestMetrics(DispatcherTest):

    def test_metrics_count_nominations(self):
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        self.mgr.add_workload("w", whole(1), annotations={"kgpu.io/gpu-type": "T4"})
        self.mgr.add_workload("x", whole(1), annotations={"kgpu.io/gpu-type": "*H100*"})
        child = subprocess.Popen([DISPATCHER_BIN, "--kubeconfig", self.kubeconfig,
                                  "--clusters", self.clusters_file(), "--interval", "0.2",
                                  "--listen", "127.0.0.1:%d" % port],
                                 stderr=subprocess.DEVNULL)
        try:
            def metrics():
                try:
                    return te.http_request(port, "GET", "/metrics")[2].decode()
                except OSError:
                    return ""
            wait_for(lambda: 'reason="only"} 1' in metrics(), 20, what="a nomination counted")
            text = metrics()
            self.assertIn('kgpu_dispatcher_nominations_total{cluster="worker-b",reason="only"} 1',
                          text)
            self.assertIn('kgpu_dispatcher_cluster_up{cluster="worker-a"} 1', text)
            self.assertRegex(text, r"kgpu_dispatcher_unplaceable_total [1-9]")
            self.assertRegex(text, r"kgpu_dispatcher_estimate_seconds_count [1-9]")
        finally:
            child.terminate()
            self.assertEqual(child.wait(timeout=20), 0)


def main():
    global DISPATCHER_BIN
    ap = argparse.ArgumentParser()
    ap.add_argument("--dispatcher", default=os.environ.get("KGPU_DISPATCHER_BIN"))
    args, rest = ap.parse_known_args()
    if not args.dispatcher or not os.access(args.dispatcher, os.X_OK):
        sys.stderr.write("test_dispatcher: kgpu-dispatcher not found: skipped\n")
        return 77
    DISPATCHER_BIN = os.path.abspath(args.dispatcher)
    sys.argv = [sys.argv[0]] + rest
    return te.main_with_binaries("test_dispatcher", __doc__)


if __name__ == "__main__":
    sys.exit(main())
