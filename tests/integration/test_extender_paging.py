#!/usr/bin/env python3
"""The real kgpu-extender against a 20,000-pod, 1,000-node cluster (stdlib only).

The API server stand-in (apiserver_standin.py) pages lists as kube-apiserver
does: limit/continue from one snapshot, remainingItemCount, 410 Expired once
a compaction drops the snapshot. Each test loads the cluster into a fresh
stand-in with --load, starts the extender and checks, from the stand-in's
request log, how it listed (pages of 500, the same selector on every page,
no resourceVersion with continue, the watch from the list's resourceVersion)
and, from /inspect, that it ended with exactly the GPUs the bound pods'
assignments hold:

- a plain start, in about 40 pages;
- a start whose pod list loses its snapshot half-way (the stand-in holds a
  continued page, the test changes pods and compacts): the extender lists
  again and ends with the new state, not the old pages stitched to new ones;
- a start against a server that ignores limit and answers in one page.

The extender's peak resident memory (VmHWM) is printed for each start.

    test_extender_paging.py --extender PATH --kgpu PATH [unittest arguments...]

Exit status: unittest's; 77 when the binaries are missing.
"""

import json
import os
import sys
import time

import test_extender as te
from harness import wait_for
from test_extender import (ExtenderTest, assignment_annotation, container, gpu_list,
                           node_object, pod_object, share)

NODES = 1000
PODS = 20000
GPUS_PER_NODE = 8
GPU_PODS_PER_NODE = 10      # bound, with an assignment: 10,000
CPU_PODS = 6000             # bound without kgpu
PENDING_PODS = 3000         # not bound
TERMINAL_PODS = PODS - NODES * GPU_PODS_PER_NODE - CPU_PODS - PENDING_PODS  # 1,000 finished
NAMESPACES = 20
MODEL = "A100-SXM4-80GB"
# The extender's pod list and watch: what every page must repeat.
POD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
# deploy/extender/deployment.yaml's memory limit, held by a paged start of a build
# without sanitizers (ASan's shadow memory and quarantine take several times more).
MEMORY_LIMIT_MIB = 256


def node_name(j):
    return "gpu-%04d" % j


def realistic(pod, i, node):
    """Adds what a real pod carries and kgpu never reads: about 2 KB more JSON."""
    meta, spec = pod["metadata"], pod["spec"]
    meta["labels"].update({"app.kubernetes.io/name": "train-%d" % (i % 97),
                           "pod-template-hash": "%08x" % (i * 2654435761 % 2**32)})
    meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                "name": "train-%d-%08x" % (i % 97, i), "uid": "%032x" % i,
                                "controller": True, "blockOwnerDeletion": True}]
    meta["managedFields"] = [{"manager": "kube-controller-manager", "operation": "Update",
                              "apiVersion": "v1", "time": "2025-01-01T00:00:00Z",
                              "fieldsType": "FieldsV1",
                              "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}},
                                                          "f:ownerReferences": {".": {}}},
                                           "f:spec": {"f:containers": {'k:{"name":"main"}': {
                                               ".": {}, "f:image": {}, "f:name": {},
                                               "f:resources": {".": {}, "f:limits": {}}}}}}},
                             {"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                              "time": "2025-01-01T00:00:05Z", "fieldsType": "FieldsV1",
                              "subresource": "status",
                              "fieldsV1": {"f:status": {"f:conditions": {}, "f:phase": {},
                                                        "f:podIP": {}, "f:startTime": {}}}}]
    for c in spec["containers"]:
        c["env"] = [{"name": "RANK", "value": str(i)}, {"name": "WORLD", "value": "64"}]
        c["volumeMounts"] = [{"name": "kube-api-access", "readOnly": True,
                              "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
        c["terminationMessagePath"] = "/dev/termination-log"
        c["imagePullPolicy"] = "IfNotPresent"
    spec["volumes"] = [{"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt",
                                                             "path": "ca.crt"}]}}]}}]
    spec["tolerations"] = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                            "effect": "NoExecute", "tolerationSeconds": 300}]
    status = pod.setdefault("status", {})
    status.setdefault("phase", "Pending")
    status["qosClass"] = "Burstable"
    if node:
        status.update(hostIP="10.0.%d.%d" % (i // 250 % 250, i % 250),
                      podIP="10.1.%d.%d" % (i // 250 % 250, i % 250),
                      startTime="2025-01-01T00:00:01Z",
                      conditions=[{"type": t, "status": "True",
                                   "lastTransitionTime": "2025-01-01T00:00:02Z"}
                                  for t in ("Initialized", "Ready", "ContainersReady",
                                            "PodScheduled")],
                      containerStatuses=[{"name": "main", "ready": True, "restartCount": 0,
                                          "image": "busybox:1.36",
                                          "imageID": "docker.io/library/busybox@sha256:" +
                                          "%064x" % i,
                                          "containerID": "containerd://%064x" % (i + 1),
                                          "started": True,
                                          "state": {"running": {
                                              "startedAt": "2025-01-01T00:00:03Z"}}}])
    return pod


def gpu_pod(name, ns, node, gpu, i, phase="Running", mem=4096, milli=100):
    ann = {"kgpu.io/assignment": assignment_annotation(
               [("main", False, [(gpu, "GPU-%s-%d" % (node, gpu), milli, mem)])]),
           "kgpu.io/node": node, "kgpu.io/bind-time": "2025-01-01T00:00:00.0Z",
           "kubectl.kubernetes.io/last-applied-configuration": "{}" * 100}
    pod = pod_object(name, [container("main", share(mem=mem // 1024, core=milli // 10))], ann,
                     node_name=node, phase=phase)
    pod["metadata"]["namespace"] = ns
    return realistic(pod, i, node)


def cluster():
    """(the --load document, {(ns, name): pod} of the kgpu pods bound and running)."""
    nodes = [node_object(node_name(j), gpu_list(node_name(j), MODEL, 81920, GPUS_PER_NODE),
                         cpu="128", memory="1Ti") for j in range(NODES)]
    pods, gpu_pods, i = [], {}, 0
    for j in range(NODES):
        for k in range(GPU_PODS_PER_NODE):
            ns, name = "team-%02d" % (i % NAMESPACES), "gpu-%05d" % i
            pods.append(gpu_pod(name, ns, node_name(j), k % GPUS_PER_NODE, i))
            gpu_pods[(ns, name)] = pods[-1]
            i += 1
    for c in range(CPU_PODS):
        pod = pod_object("cpu-%05d" % i, [container("main")], node_name=node_name(c % NODES),
                         phase="Running")
        pod["metadata"]["namespace"] = "team-%02d" % (i % NAMESPACES)
        pods.append(realistic(pod, i, node_name(c % NODES)))
        i += 1
    for _ in range(PENDING_PODS):
        pod = pod_object("pending-%05d" % i, [container("main", share(mem=8))])
        pod["metadata"]["namespace"] = "team-%02d" % (i % NAMESPACES)
        pods.append(realistic(pod, i, None))
        i += 1
    for t in range(TERMINAL_PODS):
        # Finished pods with assignments: out of the extender's field selector, and of the truth.
        j = t % NODES
        pods.append(gpu_pod("done-%05d" % i, "team-%02d" % (i % NAMESPACES), node_name(j),
                            t % GPUS_PER_NODE, i, phase="Succeeded" if t % 2 else "Failed",
                            mem=81920, milli=1000))
        i += 1
    assert len(pods) == PODS
    return {"nodes": nodes, "pods": pods}, gpu_pods


_CLUSTER = {}


def load_file(tmp):
    """The cluster as a --load file in tmp; built once per run."""
    if not _CLUSTER:
        _CLUSTER["doc"], _CLUSTER["gpu_pods"] = cluster()
        _CLUSTER["text"] = json.dumps(_CLUSTER["doc"])
    path = os.path.join(tmp, "cluster.json")
    with open(path, "w") as f:
        f.write(_CLUSTER["text"])
    return path


def sanitized(path):
    with open(path, "rb") as f:
        return b"__asan_init" in f.read()


def peak_rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


class TestListPaging(ExtenderTest):

    def start_cluster(self, **knobs):
        """A stand-in with the cluster loaded and `knobs` set, its log empty."""
        t0 = time.monotonic()
        s = self.start_standin(args=["--load", load_file(self.tmp)], start_timeout=180)
        s.nodes = {n["metadata"]["name"]: json.loads(n["metadata"]["annotations"]["kgpu.io/gpus"])
                   for n in _CLUSTER["doc"]["nodes"]}
        s.control(reset_stats=True, **knobs)
        sys.stderr.write("\n  [stand-in loaded %d nodes, %d pods (%.0f MB of JSON) in %.1f s]\n"
                         % (NODES, PODS, len(_CLUSTER["text"]) / 1e6, time.monotonic() - t0))
        return s

    def start(self, standin, what):
        t0 = time.monotonic()
        ext = self.start_extender_for(standin, wait_ready=False)
        ext.wait_ready(timeout=240)
        self.report_peak(ext, "%s: ready in %.1f s" % (what, time.monotonic() - t0))
        return ext

    def report_peak(self, ext, what):
        peak = peak_rss_mib(ext.child.pid)
        sys.stderr.write("  [%s, peak RSS (VmHWM) %.0f MiB]\n" % (what, peak))
        return peak

    def assert_fits_memory_limit(self, peak):
        if not sanitized(te.EXTENDER_BIN):
            self.assertLessEqual(peak, MEMORY_LIMIT_MIB, "the start outgrew the Deployment's limit")

    def requests(self, standin):
        """The stand-in's request log, once the extender watches pods (after its pod list)."""
        def log():
            _, doc = standin.api("GET", "/_control/requests", expect=200)
            return doc if any(w["kind"] == "pods" for w in doc["watches"]) else None
        return wait_for(log, 30, interval=0.1, what="the pod watch")

    def pod_lists(self, log):
        """The pod list requests, split into starts (each from its first page)."""
        starts = []
        for e in log["lists"]:
            if e["kind"] != "pods" or e["namespace"] is not None or e["limit"] is None:
                continue  # not the extender's (the test's own lists ask no limit)
            if not e["continue"]:
                starts.append([])
            self.assertTrue(starts, "a continued page before any first page: %s" % e)
            starts[-1].append(e)
        return starts

    def assert_paged_alike(self, pages, selector):
        """Every page: limit 500, the first page's selectors, no resourceVersion."""
        first = pages[0]
        self.assertFalse(first["continue"])
        for e in pages:
            self.assertEqual(e["limit"], "500", e)
            self.assertEqual(e["fieldSelector"], selector, e)
            self.assertEqual(e["labelSelector"], first["labelSelector"], e)
            self.assertIsNone(e["resourceVersion"], e)

    def assert_gpus_accounted(self, ext, standin, want_pods):
        truth = self.assert_state_matches(ext, standin, timeout=60)
        self.assertEqual(len(truth), NODES * GPUS_PER_NODE)
        self.assertEqual(ext.inspect()["totals"]["pods"], want_pods)
        self.assertEqual(ext.metric("kgpu_extender_assignment_conflicts_total"), 0)

    def test_start_pages_20000_pods(self):
        s = self.start_cluster()
        ext = self.start(s, "paged start")
        self.assert_fits_memory_limit(peak_rss_mib(ext.child.pid))
        log = self.requests(s)
        starts = self.pod_lists(log)
        self.assertEqual(len(starts), 1, "the pod list started more than once")
        pages = starts[0]
        self.assert_paged_alike(pages, POD_SELECTOR)
        live = PODS - TERMINAL_PODS
        self.assertEqual(len(pages), (live + 499) // 500)
        self.assertGreaterEqual(len([e for e in pages if e["continue"]]), 30)
        self.assertEqual({e["rv"] for e in pages}, {pages[0]["rv"]}, "pages of several snapshots")
        self.assertEqual(sum(e["items"] for e in pages), live)
        # With a selector the server does not count what remains.
        self.assertTrue(all(e["remainingItemCount"] is None for e in pages))
        # The nodes: two pages, and without a selector the first says how many follow.
        node_pages = [e for e in log["lists"] if e["kind"] == "nodes"]
        self.assertEqual([(e["continue"], e["items"], e["remainingItemCount"])
                          for e in node_pages], [(False, 500, 500), (True, 500, None)])
        # The watch goes on from the list's snapshot.
        pod_watches = [w for w in log["watches"] if w["kind"] == "pods"]
        self.assertEqual(pod_watches[0]["resourceVersion"], pages[0]["rv"])
        self.assertEqual(pod_watches[0]["fieldSelector"], POD_SELECTOR)
        self.assert_gpus_accounted(ext, s, NODES * GPU_PODS_PER_NODE)

    def test_token_expires_mid_list(self):
        # The first continued pod page waits until the test has changed pods and compacted.
        s = self.start_cluster(hold_continues="pods")
        ext = self.start_extender_for(s, wait_ready=False)
        wait_for(lambda: s.stats()["continues_held"] >= 1, 120, interval=0.1,
                 what="a continued pod page held")
        # The first page is delivered. Change it: the first two GPU pods in key order were on it.
        first = sorted(_CLUSTER["gpu_pods"])[:2]
        s.delete_pod(*first[0])
        s.patch_pod(first[1][0], first[1][1], {"status": {"phase": "Succeeded"}})
        # ...and bind a new one behind the extender's back.
        s.add_pod(gpu_pod("late", "team-00", node_name(7), 3, 99999, mem=8192, milli=300),
                  "team-00")
        s.control(compact=True, hold_continues="")
        ext.wait_ready(timeout=240)
        self.assert_fits_memory_limit(self.report_peak(ext, "expired mid-list"))
        self.assertEqual(s.stats()["lists_expired"], 1)
        log = self.requests(s)
        starts = self.pod_lists(log)
        self.assertEqual(len(starts), 2, "expected one pod list cut short by 410, then a whole one")
        cut, whole = starts
        self.assertEqual([e["status"] for e in cut], [200, 410])
        self.assertTrue(all(e["status"] == 200 for e in whole))
        self.assert_paged_alike(cut, POD_SELECTOR)
        self.assert_paged_alike(whole, POD_SELECTOR)
        self.assertGreater(int(whole[0]["rv"]), int(cut[0]["rv"]))
        self.assertEqual({e["rv"] for e in whole}, {whole[0]["rv"]})
        self.assertEqual(sum(e["items"] for e in whole), PODS - TERMINAL_PODS - 2 + 1)
        pod_watches = [w for w in log["watches"] if w["kind"] == "pods"]
        self.assertEqual(pod_watches[0]["resourceVersion"], whole[0]["rv"])
        # Exactly the new state: the two changed pods' GPUs free, the late pod's held.
        self.assert_gpus_accounted(ext, s, NODES * GPU_PODS_PER_NODE - 2 + 1)
        doc = ext.inspect()
        self.assertEqual(ext.gpu(node_name(7), 3, doc)["memory_allocated_mib"], 4096 + 8192)
        names = {p["pod"] for n in doc["nodes"] for g in n["gpus"] for p in g["pods"]}
        self.assertNotIn(first[0][1], names)
        self.assertNotIn(first[1][1], names)
        self.assertIn("late", names)

    def test_server_ignoring_limit(self):
        s = self.start_cluster(ignore_limit=True)
        ext = self.start(s, "unpaged start (the server ignores limit)")
        starts = self.pod_lists(self.requests(s))
        self.assertEqual(len(starts), 1)
        self.assertEqual(len(starts[0]), 1, "no continue token, so one request")
        self.assert_paged_alike(starts[0], POD_SELECTOR)
        self.assertEqual(starts[0][0]["items"], PODS - TERMINAL_PODS)
        self.assert_gpus_accounted(ext, s, NODES * GPU_PODS_PER_NODE)


def main():
    return te.main_with_binaries("test_extender_paging", __doc__)


if __name__ == "__main__":
    sys.exit(main())
