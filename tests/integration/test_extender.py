#!/usr/bin/env python3
"""Black-box integration tests of the real kgpu-extender binary (stdlib only).

Each test starts its own Kubernetes API server stand-in (apiserver_standin.py)
and its own kgpu-extender pointed at it with a kubeconfig, fills the stand-in
with nodes and pods through its API, and drives the extender with requests in
kube-scheduler's exact JSON (ExtenderArgs, ExtenderBindingArgs,
ExtenderPreemptionArgs). The truth the extender's state is checked against is
always the stand-in's pods: the sum of their kgpu.io/assignment annotations.

    test_extender.py --extender PATH --kgpu PATH [unittest arguments...]

Every child process (stand-ins, extenders, prometheus) runs in its own
process group and is killed on cleanup, whatever the outcome. An extender
that is stopped normally is stopped with SIGTERM and must exit 0 with no
sanitizer report in its log (the build under test is usually ASan/UBSan).

Exit status: unittest's (0 all passed, 1 otherwise); 77 when the binaries are
missing (CTest's SKIP_RETURN_CODE). KGPU_TEST_KEEP=1 keeps the temporary
folders (logs) and prints where they are.

When a test shows an extender bug before it is fixed, decorate it with
@known_bug: it then counts as an expected failure, and turns into an
"unexpected success" (a failure) once the bug is fixed, so the marker gets
removed. KGPU_TEST_STRICT=1 runs such tests as ordinary ones.
"""

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

from harness import SANITIZER_MARKS, Child, held_by_assignments, run_tests, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
STANDIN = os.path.join(HERE, "apiserver_standin.py")
CLUSTER_YAML = os.path.join(SOURCE_DIR, "examples", "cluster.yaml")
TOKEN = "kgpu-test-token-0123456789"

# Set by main() from the command line.
EXTENDER_BIN = None
KGPU_BIN = None




def known_bug(description):
    """Marks a test that shows an extender bug: an expected failure until it is fixed.

    KGPU_TEST_STRICT=1 runs them as plain tests, to see how they fail.
    """
    def wrap(fn):
        fn.__doc__ = "EXTENDER BUG: " + description
        if os.environ.get("KGPU_TEST_STRICT"):
            return fn
        return unittest.expectedFailure(fn)
    return wrap


# ---------------------------------------------------------------------------
# Plumbing: HTTP and processes
# ---------------------------------------------------------------------------

def http_request(port, method, path, body=None, headers=None, timeout=30.0):
    """One request on a fresh connection: (status, headers dict, body bytes)."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    hdrs = {}
    if body is not None:
        hdrs["Content-Type"] = "application/json"
    hdrs.update(headers or {})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_port_file(path, child, timeout=20.0):
    def ready():
        if not child.alive():
            raise AssertionError("%s exited with %s before serving:\n%s"
                                 % (os.path.basename(child.argv[0]), child.proc.returncode,
                                    child.log_tail()))
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            return None
        # The extender writes the file in place: only a finished line counts.
        return int(text) if text.endswith("\n") and text.strip().isdigit() else None
    return wait_for(ready, timeout, what="port file " + path)


# ---------------------------------------------------------------------------
# Kubernetes objects
# ---------------------------------------------------------------------------

def gpu_list(prefix, model, memory_mib, count, numa_split=True, unhealthy=()):
    """A kgpu.io/gpus inventory: count GPUs named GPU-<prefix>-<i>."""
    return [{"index": i, "uuid": "GPU-%s-%d" % (prefix, i), "model": model,
             "memory_mib": memory_mib,
             "numa": (i * 2 // count) if numa_split else -1,
             "healthy": i not in unhealthy} for i in range(count)]


def node_object(name, gpus=None, cpu="64", memory="256Gi", labels=None):
    meta = {"name": name, "labels": dict(labels or {})}
    meta["labels"].setdefault("kubernetes.io/hostname", name)
    if gpus is not None:
        meta["annotations"] = {"kgpu.io/gpus": json.dumps(gpus)}
        meta["labels"]["kgpu.io/gpu-model"] = gpus[0]["model"] if gpus else ""
        meta["labels"]["kgpu.io/gpu-count"] = str(len(gpus))
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta,
            "spec": {},
            "status": {"capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
                       "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def container(name, limits=None, cpu="100m", memory="128Mi"):
    lim = {k: str(v) for k, v in (limits or {}).items()}
    return {"name": name, "image": "busybox:1.36", "command": ["sleep", "3600"],
            "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": lim}}


def pod_object(name, containers, annotations=None, node_name=None, phase=None):
    spec = {"schedulerName": "default-scheduler", "restartPolicy": "Never",
            "containers": containers}
    if node_name:
        spec["nodeName"] = node_name
    obj = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": {"app": "kgpu-test"}},
           "spec": spec}
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def share(mem=None, core=None, count=None, alias=False):
    """resources.limits of a GPU share."""
    lim = {}
    if mem is not None:
        lim["aliyun.com/gpu-mem" if alias else "kgpu.io/gpu-mem"] = mem
    if core is not None:
        lim["kgpu.io/gpu-core"] = core
    if count is not None:
        lim["kgpu.io/gpu-count"] = count
    return lim


def whole(n):
    return {"nvidia.com/gpu": n}


def assignment_annotation(parts):
    """parts: [(container, exclusive, [(index, uuid, milli, memory_mib)])]."""
    return json.dumps([{"container": c, "exclusive": ex,
                        "gpus": [{"index": i, "uuid": u, "milli": m, "memory_mib": mm}
                                 for i, u, m, mm in gpus]} for c, ex, gpus in parts])


def pod_key(pod):
    return pod["metadata"]["namespace"], pod["metadata"]["name"]


def pod_uid(pod):
    return pod["metadata"]["uid"]


# ---------------------------------------------------------------------------
# The API server stand-in
# ---------------------------------------------------------------------------

def full_scores(res, names):
    """A prioritize answer as kube-scheduler reads it: the nodes it names get their score,
    the others 0 (schedule_one.go adds an extender's scores to the nodes listed). Checks
    the answer's own contract on the way: only nodes that were asked about, each once,
    none with score 0 (the extender leaves those out). Returns [{Host, Score}] in the
    order of `names`."""
    if not isinstance(res, list):
        raise AssertionError("prioritize answered %r" % (res,))
    got = {}
    for r in res:
        host, score = r["Host"], r["Score"]
        if host not in names or host in got or score == 0:
            raise AssertionError("prioritize listed %r (asked about %r): %r" % (r, names, res))
        got[host] = score
    return [{"Host": n, "Score": got.get(n, 0)} for n in names]


class StandIn:
    """apiserver_standin.py as a child process, with a small client for its API."""

    def __init__(self, tmp, name="standin", history=None, args=(), start_timeout=20.0):
        self.tmp = tmp
        port_file = os.path.join(tmp, name + ".port")
        argv = [sys.executable, STANDIN, "--port", "0", "--portfile", port_file,
                "--token", TOKEN]
        if history:
            argv += ["--history", str(history)]
        argv += list(args)  # more of apiserver_standin.py's options, e.g. --load
        self.child = Child(argv, os.path.join(tmp, name + ".log"))
        try:
            self.port = read_port_file(port_file, self.child, start_timeout)
        except BaseException:
            self.child.kill()
            raise
        self.url = "http://127.0.0.1:%d" % self.port
        self.nodes = {}  # name -> kgpu.io/gpus inventory (list) or None

    def stop(self):
        return self.child.stop()

    def kubeconfig(self, path):
        with open(path, "w") as f:
            f.write("apiVersion: v1\nkind: Config\ncurrent-context: standin\n"
                    "contexts:\n- name: standin\n  context: {cluster: standin, user: tester}\n"
                    "clusters:\n- name: standin\n  cluster: {server: '%s'}\n"
                    "users:\n- name: tester\n  user: {token: '%s'}\n" % (self.url, TOKEN))
        return path

    def api(self, method, path, body=None, content_type=None, expect=None):
        headers = {"Authorization": "Bearer " + TOKEN}
        if content_type:
            headers["Content-Type"] = content_type
        status, _, data = http_request(self.port, method, path, body, headers)
        obj = json.loads(data) if data else None
        if expect is not None and status not in (expect if isinstance(expect, tuple)
                                                 else (expect,)):
            raise AssertionError("stand-in %s %s answered %d: %s" % (method, path, status, obj))
        return status, obj

    # Nodes.

    def add_node(self, name, gpus=None, **kw):
        _, obj = self.api("POST", "/api/v1/nodes", node_object(name, gpus, **kw), expect=201)
        self.nodes[name] = gpus
        return obj

    def set_node_gpus(self, name, gpus):
        patch = {"metadata": {"annotations": {"kgpu.io/gpus": json.dumps(gpus)}}}
        self.api("PATCH", "/api/v1/nodes/" + name, patch, "application/merge-patch+json",
                 expect=200)
        self.nodes[name] = gpus

    def delete_node(self, name):
        self.api("DELETE", "/api/v1/nodes/" + name, expect=200)
        self.nodes.pop(name, None)

    def get_node(self, name):
        return self.api("GET", "/api/v1/nodes/" + name, expect=200)[1]

    # Pods.

    def add_pod(self, pod, ns="default"):
        return self.api("POST", "/api/v1/namespaces/%s/pods" % ns, pod, expect=201)[1]

    def get_pod(self, ns, name):
        status, obj = self.api("GET", "/api/v1/namespaces/%s/pods/%s" % (ns, name))
        return obj if status == 200 else None

    def delete_pod(self, ns, name):
        return self.api("DELETE", "/api/v1/namespaces/%s/pods/%s" % (ns, name))[0]

    def patch_pod(self, ns, name, patch):
        return self.api("PATCH", "/api/v1/namespaces/%s/pods/%s" % (ns, name), patch,
                        "application/merge-patch+json", expect=200)[1]

    def pods(self):
        return self.api("GET", "/api/v1/pods", expect=200)[1]["items"]

    # The side channel.

    def control(self, **knobs):
        return self.api("POST", "/_control", knobs, expect=200)[1]

    def stats(self):
        return self.api("GET", "/_control/stats", expect=200)[1]

    # The truth the extender must agree with.

    def truth(self):
        """{(node, gpu index): (memory MiB, milli)} summed over bound, live pods' assignments."""
        return held_by_assignments(self.pods())

    def overbooked(self, held):
        """GPUs of `held` past their capacity, by the node inventories this test created."""
        bad = []
        for (node, index), (mem, milli) in held.items():
            gpus = self.nodes.get(node) or []
            cap = [g for g in gpus if g["index"] == index]
            if not cap:
                bad.append((node, index, "unknown GPU"))
            elif mem > cap[0]["memory_mib"] or milli > 1000:
                bad.append((node, index, mem, milli))
        return bad


# ---------------------------------------------------------------------------
# The extender
# ---------------------------------------------------------------------------

class Extender:
    """kgpu-extender as a child process, with kube-scheduler's side of the wire."""

    def __init__(self, tmp, args, name="extender", wait_ready=True, log_level="info"):
        self.tmp = tmp
        self.name = name
        port_file = os.path.join(tmp, name + ".port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        argv = [EXTENDER_BIN, "--listen", "127.0.0.1:0", "--port-file", port_file]
        if log_level:
            argv += ["--log-level", log_level]
        # No kubelet or device plugin here ever marks a pod kgpu.io/allocated, so the rule
        # that keeps same-size pods apart until then is off unless a test asks for it
        # (TestAwaitingAllocation) or sets it in a --config file.
        if "--config" not in args and not any(a.startswith("--allocate-wait") for a in args):
            argv += ["--allocate-wait", "0"]
        argv += list(args)
        env = dict(os.environ)
        # Leak checks at exit; a distinct exit status per sanitizer (the log says the rest).
        env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0:exitcode=86")
        env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1:exitcode=87")
        self.child = Child(argv, os.path.join(tmp, name + ".log"), env)
        try:
            self.port = read_port_file(port_file, self.child)
            self.url = "http://127.0.0.1:%d" % self.port
            if wait_ready:
                self.wait_ready()
        except BaseException:
            self.child.kill()
            raise

    # Process.

    def wait_ready(self, timeout=20.0):
        try:
            wait_for(lambda: self.get("/readyz")[0] == 200, timeout, what="/readyz 200")
        except AssertionError as e:
            raise AssertionError("%s: %s; log tail:\n%s" % (self.name, e, self.child.log_tail()))

    def stop(self):
        """SIGTERM; the extender must exit 0 and its log must hold no sanitizer report."""
        rc = self.child.stop(signal.SIGTERM)
        return rc, self.sanitizer_report()

    def kill(self):
        self.child.kill()

    def sanitizer_report(self):
        text = self.child.log()
        for mark in SANITIZER_MARKS:
            at = text.find(mark)
            if at >= 0:
                return text[max(0, at - 200):at + 4000]
        return None

    def log(self):
        return self.child.log()

    # HTTP.

    def post(self, verb, body, timeout=30.0):
        status, headers, data = http_request(self.port, "POST", "/" + verb, body,
                                             timeout=timeout)
        return status, headers, data

    def post_json(self, verb, body, timeout=30.0):
        status, _, data = self.post(verb, body, timeout)
        try:
            obj = json.loads(data)
        except ValueError:
            raise AssertionError("%s answered %d with a body that is not JSON: %r"
                                 % (verb, status, data[:300]))
        return status, obj

    def get(self, path):
        status, _, data = http_request(self.port, "GET", path)
        return status, data.decode("utf-8", "replace")

    # kube-scheduler's calls.

    def filter(self, pod, names=None, nodes=None):
        if nodes is not None:
            args = {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
        else:
            args = {"Pod": pod, "Nodes": None, "NodeNames": list(names)}
        status, res = self.post_json("filter", args)
        if status != 200:
            raise AssertionError("filter answered %d: %s" % (status, res))
        return res

    def prioritize(self, pod, names=None, nodes=None):
        if nodes is not None:
            args = {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
        else:
            args = {"Pod": pod, "Nodes": None, "NodeNames": list(names)}
        status, res = self.post_json("prioritize", args)
        if status != 200:
            raise AssertionError("prioritize answered %d: %s" % (status, res))
        return full_scores(res, list(names) if nodes is None
                           else [n["metadata"]["name"] for n in nodes])

    def bind(self, pod, node, timeout=30.0):
        """ExtenderBindingResult.Error ("" on success)."""
        args = {"PodName": pod["metadata"]["name"], "PodNamespace": pod["metadata"]["namespace"],
                "PodUID": pod["metadata"]["uid"], "Node": node}
        status, res = self.post_json("bind", args, timeout)
        if status != 200:
            raise AssertionError("bind answered %d: %s" % (status, res))
        return res["Error"]

    def preempt(self, pod, meta_victims):
        args = {"Pod": pod, "NodeNameToVictims": {},
                "NodeNameToMetaVictims": {
                    node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0}
                    for node, uids in meta_victims.items()}}
        status, res = self.post_json("preempt", args)
        if status != 200:
            raise AssertionError("preempt answered %d: %s" % (status, res))
        return res

    def schedule(self, pod, names):
        """kube-scheduler's cycle: filter, prioritize, bind to the best. (node or None, error)."""
        res = self.filter(pod, names)
        fits = res["NodeNames"] or []
        if not fits:
            return None, "no fit: %s %s" % (res["FailedNodes"], res["FailedAndUnresolvableNodes"])
        scores = self.prioritize(pod, fits)
        best = max(scores, key=lambda s: s["Score"])["Host"]
        return best, self.bind(pod, best)

    # Operator endpoints.

    def inspect(self):
        status, text = self.get("/inspect")
        if status != 200:
            raise AssertionError("/inspect answered %d: %s" % (status, text))
        return json.loads(text)

    def held(self, doc=None):
        """{(node, gpu index): (memory MiB allocated, milli allocated)}, zeros left out."""
        doc = doc or self.inspect()
        out = {}
        for n in doc["nodes"]:
            for g in n["gpus"]:
                v = (g["memory_allocated_mib"], g["milli_allocated"])
                if v != (0, 0):
                    out[(n["name"], g["index"])] = v
        return out

    def gpu(self, node, index, doc=None):
        doc = doc or self.inspect()
        for n in doc["nodes"]:
            if n["name"] == node:
                for g in n["gpus"]:
                    if g["index"] == index:
                        return g
        return None

    def metrics(self):
        status, text = self.get("/metrics")
        if status != 200:
            raise AssertionError("/metrics answered %d" % status)
        return text

    def metric(self, name, labels=None, text=None):
        """The value of one sample, or None when absent."""
        text = text if text is not None else self.metrics()
        want = labels or {}
        for line in text.splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
            if not m or m.group(1) != name:
                continue
            got = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                  m.group(3) or ""))
            if all(got.get(k) == v for k, v in want.items()):
                return float(m.group(4))
        return None


# ---------------------------------------------------------------------------
# Test base
# ---------------------------------------------------------------------------

class ExtenderTest(unittest.TestCase):
    """Per test: a temporary folder and cleanups that take every child down."""

    maxDiff = 4000

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kgpu-ext-%s-" % self._testMethodName)
        self.addCleanup(self._remove_tmp)

    def _remove_tmp(self):
        if os.environ.get("KGPU_TEST_KEEP"):
            sys.stderr.write("\n  [kept %s]\n" % self.tmp)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def start_standin(self, **kw):
        s = StandIn(self.tmp, **kw)
        self.addCleanup(s.stop)
        return s

    def start_extender(self, args, name="extender", check_exit=True, wait_ready=True,
                       log_level="info"):
        ext = Extender(self.tmp, args, name, wait_ready=wait_ready, log_level=log_level)
        self.addCleanup(self._stop_extender, ext, check_exit)
        return ext

    def start_extender_for(self, standin, extra=(), name="extender", **kw):
        kc = standin.kubeconfig(os.path.join(self.tmp, name + ".kubeconfig"))
        return self.start_extender(["--kubeconfig", kc] + list(extra), name, **kw)

    def _stop_extender(self, ext, check_exit):
        alive = ext.child.alive()
        rc, report = ext.stop()
        if report:
            self.fail("%s: sanitizer report in its log:\n%s" % (ext.name, report))
        if check_exit and alive and rc != 0:
            self.fail("%s exited %s on SIGTERM (expected 0); log tail:\n%s"
                      % (ext.name, rc, ext.child.log_tail()))

    # Shared checks.

    def assert_state_matches(self, ext, standin, timeout=5.0):
        """Polls until /inspect equals the stand-in's truth; then checks capacities."""
        last = {}

        def same():
            last["held"], last["truth"] = ext.held(), standin.truth()
            return last["held"] == last["truth"]
        try:
            wait_for(same, timeout, interval=0.1, what="/inspect to equal the stand-in")
        except AssertionError:
            self.assertEqual(last["held"], last["truth"],
                             "/inspect (first) differs from the pods' annotations (second)")
        self.assertEqual(standin.overbooked(last["truth"]), [], "the annotations overbook GPUs")
        self.assert_within_capacity(ext)
        return last["truth"]

    def assert_within_capacity(self, ext, doc=None):
        doc = doc or ext.inspect()
        for n in doc["nodes"]:
            for g in n["gpus"]:
                where = "%s GPU %d" % (n["name"], g["index"])
                self.assertGreaterEqual(g["memory_allocated_mib"], 0, where)
                self.assertLessEqual(g["memory_allocated_mib"], g["memory_mib"], where)
                self.assertGreaterEqual(g["milli_allocated"], 0, where)
                self.assertLessEqual(g["milli_allocated"], 1000, where)
                exclusive = [p for p in g["pods"] if p["memory_mib"] == -1]
                if exclusive:
                    self.assertEqual(len(g["pods"]), 1,
                                     "%s: a whole-GPU pod shares its GPU: %s" % (where, g["pods"]))

    def parse_assignment(self, pod):
        ann = pod["metadata"].get("annotations") or {}
        self.assertIn("kgpu.io/assignment", ann, "pod %s has no assignment" % pod_key(pod)[1])
        return json.loads(ann["kgpu.io/assignment"])


# ---------------------------------------------------------------------------
# 1. Happy path
# ---------------------------------------------------------------------------

A100 = "A100-SXM4-80GB"
V100 = "V100-SXM2-32GB"


class TestHappyPath(ExtenderTest):
    """Filter, prioritize, bind, preempt against a small heterogeneous cluster."""

    def setUp(self):
        super().setUp()
        s = self.standin = self.start_standin()
        s.add_node("a100-0", gpu_list("a100-0", A100, 81920, 4))
        s.add_node("a100-1", gpu_list("a100-1", A100, 81920, 4))
        s.add_node("t4-0", gpu_list("t4-0", "T4", 15360, 2))
        s.add_node("v100-0", gpu_list("v100-0", V100, 32768, 2))
        s.add_node("cpu-0")  # no GPU inventory at all
        # v100-0 is full before the extender starts: two pods bound by an earlier extender.
        for i in range(2):
            ann = {"kgpu.io/assignment": assignment_annotation(
                       [("main", True, [(i, "GPU-v100-0-%d" % i, 1000, 32768)])]),
                   "kgpu.io/node": "v100-0", "kgpu.io/bind-time": "2025-01-01T00:00:00.0Z"}
            s.add_pod(pod_object("old-%d" % i, [container("main", whole(1))], ann,
                                 node_name="v100-0", phase="Running"))
        self.ext = self.start_extender_for(s)
        self.all_nodes = ["a100-0", "a100-1", "t4-0", "v100-0", "cpu-0"]

    def new_pod(self, name, containers, annotations=None, ns="default"):
        return self.standin.add_pod(pod_object(name, containers, annotations), ns)

    def test_adopts_pods_bound_before_start(self):
        doc = self.ext.inspect()
        for i in range(2):
            g = self.ext.gpu("v100-0", i, doc)
            self.assertEqual((g["memory_allocated_mib"], g["milli_allocated"]), (32768, 1000))
            self.assertEqual([(p["pod"], p["status"], p["memory_mib"]) for p in g["pods"]],
                             [("old-%d" % i, "bound", -1)])
        self.assertEqual(doc["totals"]["pods"], 2)
        self.assertEqual(doc["totals"]["gpus"], 12)
        self.assertEqual(sorted(n["name"] for n in doc["nodes"]),
                         ["a100-0", "a100-1", "t4-0", "v100-0"])
        self.assert_state_matches(self.ext, self.standin)

    def test_filter_fits_and_reasons(self):
        pod = self.new_pod("big-share", [container("main", share(mem=20))])
        res = self.ext.filter(pod, self.all_nodes + ["ghost-0"])
        self.assertIsNone(res["Nodes"])
        self.assertEqual(res["NodeNames"], ["a100-0", "a100-1"])
        self.assertEqual(res["Error"], "")
        self.assertEqual(sorted(res["FailedNodes"]), ["v100-0"])
        self.assertIn("20480", res["FailedNodes"]["v100-0"])
        unres = res["FailedAndUnresolvableNodes"]
        self.assertEqual(sorted(unres), ["cpu-0", "ghost-0", "t4-0"])
        self.assertIn("20480", unres["t4-0"])
        self.assertIn("15360", unres["t4-0"])
        self.assertIn("larger than any GPU", unres["t4-0"])
        self.assertIn("no GPU inventory", unres["cpu-0"])
        # Every name sent is accounted for exactly once.
        answered = res["NodeNames"] + list(res["FailedNodes"]) + list(unres)
        self.assertEqual(sorted(answered), sorted(self.all_nodes + ["ghost-0"]))

        # A whole GPU: v100-0 is full (merely failed), the rest fit except cpu-0.
        pod = self.new_pod("one-gpu", [container("main", whole(1))])
        res = self.ext.filter(pod, self.all_nodes)
        self.assertEqual(res["NodeNames"], ["a100-0", "a100-1", "t4-0"])
        self.assertIn("needs 1 whole GPU, 0 are fully free", res["FailedNodes"]["v100-0"])
        self.assertEqual(sorted(res["FailedAndUnresolvableNodes"]), ["cpu-0"])

        # More GPUs than the node has: unresolvable.
        pod = self.new_pod("three-gpus", [container("main", whole(3))])
        res = self.ext.filter(pod, self.all_nodes)
        self.assertEqual(res["NodeNames"], ["a100-0", "a100-1"])
        self.assertEqual(sorted(res["FailedAndUnresolvableNodes"]), ["cpu-0", "t4-0", "v100-0"])

        # A pod without GPUs is not kgpu's business: every node passes.
        pod = self.new_pod("cpu-only", [container("main")])
        res = self.ext.filter(pod, self.all_nodes)
        self.assertEqual(res["NodeNames"], self.all_nodes)
        self.assertEqual(res["FailedNodes"], {})
        self.assertEqual(res["FailedAndUnresolvableNodes"], {})

        # The gpushare alias means the same as kgpu.io/gpu-mem.
        pod = self.new_pod("alias", [container("main", share(mem=20, alias=True))])
        res = self.ext.filter(pod, self.all_nodes)
        self.assertEqual(res["NodeNames"], ["a100-0", "a100-1"])

    def test_prioritize_scores_every_node_in_order(self):
        pod = self.new_pod("p", [container("main", share(mem=4, core=20))])
        # The answer itself names only the nodes scoring above 0, in the order asked
        # (kube-scheduler adds nothing to the others): cpu-0, which has no GPU, is left out.
        status, raw = self.ext.post_json("prioritize", {"Pod": pod, "Nodes": None,
                                                        "NodeNames": self.all_nodes})
        self.assertEqual(status, 200, raw)
        full = self.ext.prioritize(pod, self.all_nodes)
        self.assertEqual(raw, [r for r in full if r["Score"] > 0])
        self.assertNotIn("cpu-0", [r["Host"] for r in raw])
        self.assertTrue(raw, "some node scores above 0")
        for names in (self.all_nodes, list(reversed(self.all_nodes)), ["a100-1"], []):
            res = self.ext.prioritize(pod, names)
            self.assertEqual([r["Host"] for r in res], names)
            for r in res:
                self.assertIsInstance(r["Score"], int)
                self.assertGreaterEqual(r["Score"], 0)
                self.assertLessEqual(r["Score"], 10)
            if "cpu-0" in names:
                self.assertEqual([r["Score"] for r in res if r["Host"] == "cpu-0"], [0])

        # binpack ranks a node already in use above an empty one.
        first = self.new_pod("first", [container("main", share(mem=8, core=50))])
        self.assertEqual(self.ext.bind(first, "a100-1"), "")
        bp = self.new_pod("bp", [container("main", share(mem=4, core=20))],
                          {"kgpu.io/policy": "binpack"})
        scores = {r["Host"]: r["Score"] for r in self.ext.prioritize(bp, ["a100-0", "a100-1"])}
        self.assertGreater(scores["a100-1"], scores["a100-0"], scores)
        sp = self.new_pod("sp", [container("main", share(mem=4, core=20))],
                          {"kgpu.io/policy": "spread"})
        scores = {r["Host"]: r["Score"] for r in self.ext.prioritize(sp, ["a100-0", "a100-1"])}
        self.assertGreater(scores["a100-0"], scores["a100-1"], scores)

    def test_bind_writes_the_assignment(self):
        pod = self.new_pod("train", [container("main", share(mem=20, core=30))], ns="team-a")
        node, err = self.ext.schedule(pod, self.all_nodes)
        self.assertEqual(err, "")
        self.assertIn(node, ("a100-0", "a100-1"))
        before = time.time()
        got = self.standin.get_pod("team-a", "train")
        self.assertEqual(got["spec"]["nodeName"], node)
        ann = got["metadata"]["annotations"]
        self.assertEqual(ann["kgpu.io/node"], node)
        m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{9})Z$", ann["kgpu.io/bind-time"])
        self.assertIsNotNone(m, ann["kgpu.io/bind-time"])
        bound_at = time.mktime(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) - time.timezone
        self.assertLess(abs(bound_at - before), 120, "bind-time is not now (UTC)")
        conds = got["status"].get("conditions", [])
        self.assertIn({"type": "PodScheduled", "status": "True"}, conds)

        parts = self.parse_assignment(got)
        self.assertEqual(len(parts), 1)
        self.assertEqual(parts[0]["container"], "main")
        self.assertIs(parts[0]["exclusive"], False)
        self.assertEqual(len(parts[0]["gpus"]), 1)
        g = parts[0]["gpus"][0]
        inventory = {x["index"]: x for x in self.standin.nodes[node]}
        self.assertIn(g["index"], inventory)
        self.assertEqual(g["uuid"], inventory[g["index"]]["uuid"])
        self.assertEqual((g["milli"], g["memory_mib"]), (300, 20480))

        # /inspect shows the pod on that GPU, bound.
        doc = self.ext.inspect()
        gi = self.ext.gpu(node, g["index"], doc)
        self.assertEqual((gi["memory_allocated_mib"], gi["milli_allocated"]), (20480, 300))
        self.assertEqual(gi["uuid"], g["uuid"])
        self.assertEqual(gi["pods_sharing"], 1)
        self.assertEqual(gi["pods"], [{"pod": "train", "namespace": "team-a", "container": "main",
                                       "milli": 300, "memory_mib": 20480, "status": "bound"}])
        self.assertEqual(doc["totals"]["pods"], 3)
        status, one = self.ext.get("/inspect/" + node)
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(one)["name"], node)
        self.assertEqual(self.ext.get("/inspect/no-such-node")[0], 404)
        self.assert_state_matches(self.ext, self.standin)

        # kgpu inspect --server shows it too.
        out = subprocess.run([KGPU_BIN, "inspect", "--server", self.ext.url, "--detail"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout, r"(?m)^(%s)?\s+%d\s+%s\s+20480/81920\s+25%%\s+300/1000"
                         % (node, g["index"], A100))
        self.assertIn("team-a/train (main): 20480 MiB, 300 milli", out.stdout)
        self.assertIn("%s " % node, out.stdout)
        out = subprocess.run([KGPU_BIN, "inspect", node, "--server", self.ext.url, "--json"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(json.loads(out.stdout)["gpus"][g["index"]]["memory_allocated_mib"],
                         20480)

        # A repeated bind to the same node answers success and changes nothing;
        # to another node it is refused.
        self.assertEqual(self.ext.bind(pod, node), "")
        other = "a100-1" if node == "a100-0" else "a100-0"
        err = self.ext.bind(pod, other)
        self.assertNotEqual(err, "")
        self.assertEqual(self.ext.inspect()["totals"]["pods"], 3)
        self.assert_state_matches(self.ext, self.standin)
        self.assertEqual(self.standin.stats()["unauthorized"], 0)

    def test_non_cache_mode(self):
        nodes = [self.standin.get_node(n) for n in self.all_nodes]
        pod = self.new_pod("nc", [container("main", share(mem=20))])
        res = self.ext.filter(pod, nodes=nodes)
        self.assertIsNone(res["NodeNames"])
        self.assertEqual(res["Nodes"]["kind"], "NodeList")
        self.assertEqual(res["Nodes"]["apiVersion"], "v1")
        items = res["Nodes"]["items"]
        self.assertEqual([n["metadata"]["name"] for n in items], ["a100-0", "a100-1"])
        self.assertEqual(items[0], nodes[0], "node objects must come back as sent")
        self.assertEqual(sorted(res["FailedNodes"]), ["v100-0"])
        self.assertEqual(sorted(res["FailedAndUnresolvableNodes"]), ["cpu-0", "t4-0"])

        scores = self.ext.prioritize(pod, nodes=nodes)
        self.assertEqual([r["Host"] for r in scores], self.all_nodes)
        self.assertTrue(all(0 <= r["Score"] <= 10 for r in scores))

        # An empty NodeList and a null Nodes both mean no candidates.
        self.assertIsNone(self.ext.filter(pod, nodes=[])["NodeNames"])
        status, res = self.ext.post_json("filter", {"Pod": pod, "Nodes": None, "NodeNames": None})
        self.assertEqual(status, 200)
        self.assertFalse(res.get("NodeNames"))
        self.assertFalse((res.get("Nodes") or {}).get("items"))

        # A node object the extender had not heard of teaches it nothing: inventory comes
        # from the API server's watch (or the cluster file), never from a request body.
        extra = node_object("new-0", gpu_list("new-0", "L4", 23034, 1))
        res = self.ext.filter(pod, nodes=[extra])
        self.assertEqual(res["Nodes"]["items"], [])
        self.assertIn("no GPU inventory known", res["FailedAndUnresolvableNodes"]["new-0"])
        self.assertIsNone(self.ext.gpu("new-0", 0))
        # Once the node is in the API server, the watch brings it, and Nodes.items works.
        self.standin.add_node("new-0", gpu_list("new-0", "L4", 23034, 1))
        wait_for(lambda: self.ext.gpu("new-0", 0), 10, what="new-0 from the node watch")
        extra = self.standin.get_node("new-0")
        res = self.ext.filter(pod, nodes=[extra])
        self.assertEqual([n["metadata"]["name"] for n in res["Nodes"]["items"]], ["new-0"])
        huge = self.new_pod("huge", [container("main", share(mem=23))])
        res = self.ext.filter(huge, nodes=[extra])
        self.assertEqual(res["Nodes"]["items"], [])
        self.assertIn("larger than any GPU", res["FailedAndUnresolvableNodes"]["new-0"])

        node, err = self.ext.schedule(pod, ["a100-0"])
        self.assertEqual((node, err), ("a100-0", ""))
        self.assert_state_matches(self.ext, self.standin)

    def test_multi_container_pod(self):
        pod = self.new_pod("multi", [
            container("trainer", whole(2)),
            container("sidecar", share(mem=4, core=25)),
            container("plain"),
            container("logger", share(mem=2, count=2)),
        ])
        res = self.ext.filter(pod, self.all_nodes)
        self.assertEqual(res["NodeNames"], ["a100-0", "a100-1"])
        # t4-0 has 2 GPUs: the trainer's two whole ones leave none for the shares.
        self.assertIn("t4-0", {**res["FailedNodes"], **res["FailedAndUnresolvableNodes"]})
        self.assertEqual(self.ext.bind(pod, "a100-0"), "")
        got = self.standin.get_pod("default", "multi")
        parts = {p["container"]: p for p in self.parse_assignment(got)}
        self.assertEqual(sorted(parts), ["logger", "sidecar", "trainer"])
        tr, sc, lg = parts["trainer"], parts["sidecar"], parts["logger"]
        self.assertIs(tr["exclusive"], True)
        self.assertEqual(len(tr["gpus"]), 2)
        self.assertEqual({(g["milli"], g["memory_mib"]) for g in tr["gpus"]}, {(1000, 81920)})
        self.assertIs(sc["exclusive"], False)
        self.assertEqual([(g["milli"], g["memory_mib"]) for g in sc["gpus"]], [(250, 4096)])
        self.assertEqual(len(lg["gpus"]), 2)
        self.assertEqual({(g["milli"], g["memory_mib"]) for g in lg["gpus"]}, {(0, 1024)})
        self.assertEqual(len({g["index"] for g in lg["gpus"]}), 2, "gpu-count 2: two GPUs")
        whole_idx = {g["index"] for g in tr["gpus"]}
        shared_idx = {g["index"] for g in sc["gpus"] + lg["gpus"]}
        self.assertFalse(whole_idx & shared_idx, "a share landed on a whole GPU")
        inv = {g["index"]: g["uuid"] for g in self.standin.nodes["a100-0"]}
        for p in parts.values():
            for g in p["gpus"]:
                self.assertEqual(g["uuid"], inv[g["index"]])
        self.assert_state_matches(self.ext, self.standin)

    def test_containers_that_never_fit_together_are_unresolvable(self):
        # t4-0 has 2 GPUs of 15360 MiB: three containers of 10 GiB each never fit it, even
        # empty, though each alone does. docs/install-extender.md: "Nodes the pod could not
        # use even if they were empty are listed as unresolvable".
        pod = self.new_pod("three", [container("c%d" % i, share(mem=10)) for i in range(3)])
        res = self.ext.filter(pod, ["t4-0"])
        self.assertEqual(res["NodeNames"], [])
        self.assertIn("t4-0", res["FailedAndUnresolvableNodes"], res)

    def test_init_containers(self):
        # Covered by the app container's GPUs: no allocation of its own.
        p = pod_object("covered", [container("main", share(mem=4, core=20))])
        p["spec"]["initContainers"] = [container("setup", share(mem=2, core=10))]
        p = self.standin.add_pod(p)
        self.assertEqual(self.ext.schedule(p, ["t4-0"]), ("t4-0", ""))
        parts = self.parse_assignment(self.standin.get_pod("default", "covered"))
        self.assertEqual([x["container"] for x in parts], ["main"])
        # Not covered: its own allocation, held for the pod's life.
        p = pod_object("uncovered", [container("main", share(mem=4))])
        p["spec"]["initContainers"] = [container("setup", whole(1))]
        p = self.standin.add_pod(p)
        self.assertEqual(self.ext.schedule(p, ["a100-0"]), ("a100-0", ""))
        parts = {x["container"]: x for x in
                 self.parse_assignment(self.standin.get_pod("default", "uncovered"))}
        self.assertEqual(sorted(parts), ["main", "setup"])
        self.assertIs(parts["setup"]["exclusive"], True)
        self.assertNotEqual(parts["setup"]["gpus"][0]["index"], parts["main"]["gpus"][0]["index"])
        self.assert_state_matches(self.ext, self.standin)

    def test_many_node_names(self):
        # kube-scheduler sends up to ~500 names per call in large clusters; 5000 here.
        names = ["node-%04d" % i for i in range(5000)]
        names[1234], names[4321] = "a100-0", "t4-0"
        pod = self.new_pod("wide", [container("main", share(mem=4))])
        t0 = time.monotonic()
        res = self.ext.filter(pod, names)
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(res["NodeNames"], ["a100-0", "t4-0"])
        self.assertEqual(len(res["FailedAndUnresolvableNodes"]), 4998)
        scores = self.ext.prioritize(pod, names)
        self.assertEqual([x["Host"] for x in scores], names)

    def test_gpu_model_globs(self):
        pod = self.new_pod("a100-only", [container("main", share(mem=4))],
                           {"kgpu.io/gpu-type": "A100*"})
        res = self.ext.filter(pod, self.all_nodes)
        self.assertEqual(res["NodeNames"], ["a100-0", "a100-1"])
        unres = res["FailedAndUnresolvableNodes"]
        self.assertEqual(sorted(unres), ["cpu-0", "t4-0", "v100-0"])
        self.assertIn("not allowed", unres["t4-0"])
        self.assertIn("T4", unres["t4-0"])
        self.assertIn("not allowed", unres["v100-0"])
        self.assertEqual(res["FailedNodes"], {})

        pod = self.new_pod("no-t4", [container("main", share(mem=4))],
                           {"kgpu.io/gpu-type-exclude": "T4"})
        res = self.ext.filter(pod, ["t4-0", "a100-0"])
        self.assertEqual(res["NodeNames"], ["a100-0"])
        self.assertIn("not allowed", res["FailedAndUnresolvableNodes"]["t4-0"])

        pod = self.new_pod("t4-or-v100", [container("main", share(mem=4))],
                           {"kgpu.io/gpu-type": "T4, V100*"})
        res = self.ext.filter(pod, self.all_nodes)
        self.assertEqual(res["NodeNames"], ["t4-0"])  # v100-0 is full: failed, not unresolvable
        self.assertIn("v100-0", res["FailedNodes"])
        self.assertEqual(self.ext.bind(pod, "t4-0"), "")
        # Bind checks the model too.
        a100 = self.new_pod("a100-bind", [container("main", share(mem=4))],
                            {"kgpu.io/gpu-type": "A100*"})
        self.ext.filter(a100, ["t4-0"])
        self.assertNotEqual(self.ext.bind(a100, "t4-0"), "")
        self.assertIsNone(self.standin.get_pod("default", "a100-bind")["spec"].get("nodeName"))
        self.assert_state_matches(self.ext, self.standin)

    def test_whole_gpus_and_shares_never_share_a_gpu(self):
        s1 = self.new_pod("s1", [container("main", share(mem=1))])
        self.ext.filter(s1, ["t4-0"])
        self.assertEqual(self.ext.bind(s1, "t4-0"), "")
        w2 = self.new_pod("w2", [container("main", whole(2))])
        res = self.ext.filter(w2, ["t4-0"])
        self.assertEqual(res["NodeNames"], [])
        self.assertIn("needs 2 whole GPUs, 1 is fully free", res["FailedNodes"]["t4-0"])
        self.assertNotEqual(self.ext.bind(w2, "t4-0"), "")
        w1 = self.new_pod("w1", [container("main", whole(1))])
        self.assertEqual(self.ext.filter(w1, ["t4-0"])["NodeNames"], ["t4-0"])
        self.assertEqual(self.ext.bind(w1, "t4-0"), "")
        # Both GPUs are taken now: one whole, one by a 1 GiB share. More shares go to the
        # shared GPU, never to the whole one; another whole GPU does not fit.
        for i in range(3):
            p = self.new_pod("s%d" % (i + 2), [container("main", share(mem=2, core=10))])
            self.assertEqual(self.ext.filter(p, ["t4-0"])["NodeNames"], ["t4-0"])
            self.assertEqual(self.ext.bind(p, "t4-0"), "")
        w3 = self.new_pod("w3", [container("main", whole(1))])
        self.assertEqual(self.ext.filter(w3, ["t4-0"])["NodeNames"], [])
        self.assertNotEqual(self.ext.bind(w3, "t4-0"), "")
        whole_gpu = self.parse_assignment(self.standin.get_pod("default", "w1"))[0]["gpus"][0]
        shared = {self.parse_assignment(self.standin.get_pod("default", n))[0]["gpus"][0]["index"]
                  for n in ("s1", "s2", "s3", "s4")}
        self.assertEqual(len(shared), 1)
        self.assertNotIn(whole_gpu["index"], shared)
        doc = self.ext.inspect()
        g = self.ext.gpu("t4-0", whole_gpu["index"], doc)
        self.assertEqual([p["pod"] for p in g["pods"]], ["w1"])
        self.assertEqual(g["pods_sharing"], 1)
        self.assert_within_capacity(self.ext, doc)
        self.assert_state_matches(self.ext, self.standin)

    def test_policy_spread_and_binpack(self):
        def place(name, policy):
            p = self.new_pod(name, [container("main", share(mem=2, core=10))],
                             {"kgpu.io/policy": policy})
            self.assertEqual(self.ext.filter(p, ["a100-1"])["NodeNames"], ["a100-1"])
            self.assertEqual(self.ext.bind(p, "a100-1"), "")
            return self.parse_assignment(self.standin.get_pod("default", name))[0]["gpus"][0]

        sp = [place("spread-%d" % i, "spread")["index"] for i in range(2)]
        self.assertNotEqual(sp[0], sp[1], "spread put two small shares on one GPU")
        bp = [place("binpack-%d" % i, "binpack")["index"] for i in range(2)]
        self.assertEqual(bp[0], bp[1], "binpack put two small shares on different GPUs")
        # An unknown policy is refused, not silently replaced.
        p = self.new_pod("bad-policy", [container("main", share(mem=2))],
                         {"kgpu.io/policy": "no-such-policy"})
        self.ext.filter(p, ["a100-1"])
        err = self.ext.bind(p, "a100-1")
        self.assertIn("no-such-policy", err)
        self.assert_state_matches(self.ext, self.standin)

    def test_preempt(self):
        victims = []
        for i in range(4):
            v = self.new_pod("victim-%d" % i, [container("main", whole(1))])
            self.ext.filter(v, ["a100-0"])
            self.assertEqual(self.ext.bind(v, "a100-0"), "")
            victims.append(pod_uid(v))
        pod = self.new_pod("important", [container("main", whole(2))])
        self.assertEqual(self.ext.filter(pod, ["a100-0"])["NodeNames"], [])
        res = self.ext.preempt(pod, {"a100-0": victims[:2]})["NodeNameToMetaVictims"]
        self.assertEqual(list(res), ["a100-0"])
        self.assertEqual(sorted(p["UID"] for p in res["a100-0"]["Pods"]), sorted(victims[:2]))
        self.assertEqual(res["a100-0"]["NumPDBViolations"], 0)
        # One victim frees one GPU: not enough. Victims elsewhere free nothing here.
        res = self.ext.preempt(pod, {"a100-0": victims[:1], "v100-0": [], "cpu-0": victims})
        self.assertEqual(res["NodeNameToMetaVictims"], {})
        # Victims that hold nothing on v100-0 cannot make room there.
        res = self.ext.preempt(pod, {"v100-0": victims})
        self.assertEqual(res["NodeNameToMetaVictims"], {})
        # The full-pod form (NodeNameToVictims) works too.
        vpods = [self.standin.get_pod("default", "victim-%d" % i) for i in range(4)]
        args = {"Pod": pod, "NodeNameToVictims": {
                    "a100-0": {"Pods": vpods, "NumPDBViolations": 1}},
                "NodeNameToMetaVictims": None}
        status, res = self.ext.post_json("preempt", args)
        self.assertEqual(status, 200, res)
        self.assertEqual(sorted(p["UID"] for p in res["NodeNameToMetaVictims"]["a100-0"]["Pods"]),
                         sorted(victims))
        self.assertEqual(res["NodeNameToMetaVictims"]["a100-0"]["NumPDBViolations"], 1)
        # Preempt changes nothing.
        self.assert_state_matches(self.ext, self.standin)


# Every policy a pod may name (kgpu.io/policy): the registry of src/core/policy.c.
POLICIES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd", "binpack", "spread",
            "kgpu")


class TestMultiContainer(ExtenderTest):
    """Pods of several GPU containers: filter and bind ask one placement search."""

    def setUp(self):
        super().setUp()
        s = self.standin = self.start_standin()
        s.add_node("v100-16", gpu_list("v100-16", "V100-PCIE-16GB", 16384, 2))
        s.add_node("t4-busy", gpu_list("t4-busy", "T4", 15360, 4))  # NUMA 0, 0, 1, 1
        s.add_node("t4-empty", gpu_list("t4-empty", "T4", 15360, 4))
        # Bound before the extender starts: 8 and 4 GiB on the V100s; on t4-busy, GPU 0
        # held whole and 4 GiB on GPU 1.
        for name, node, exclusive, index, mem_mib in (("held-8", "v100-16", False, 0, 8192),
                                                     ("held-4", "v100-16", False, 1, 4096),
                                                     ("held-whole", "t4-busy", True, 0, 15360),
                                                     ("held-t4", "t4-busy", False, 1, 4096)):
            gpu = (index, "GPU-%s-%d" % (node, index), 1000 if exclusive else 0, mem_mib)
            ann = {"kgpu.io/assignment": assignment_annotation([("main", exclusive, [gpu])]),
                   "kgpu.io/node": node, "kgpu.io/bind-time": "2025-01-01T00:00:00.0Z"}
            limits = whole(1) if exclusive else share(mem=mem_mib // 1024)
            s.add_pod(pod_object(name, [container("main", limits)], ann, node_name=node,
                                 phase="Running"))
        # No pods awaiting allocation: no kubelet here, and this is about the search alone.
        self.ext = self.start_extender_for(s, ["--allocate-wait", "0"])
        self.nodes = ["v100-16", "t4-busy", "t4-empty"]

    def new_pod(self, name, limits, policy=None):
        containers = [container("c%d" % i, lim) for i, lim in enumerate(limits)]
        ann = {"kgpu.io/policy": policy} if policy else None
        return self.standin.add_pod(pod_object(name, containers, ann))

    def gpus_of(self, name):
        parts = self.parse_assignment(self.standin.get_pod("default", name))
        return {p["container"]: [g["index"] for g in p["gpus"]] for p in parts}

    def test_filter_finds_any_arrangement(self):
        # Placed in the pod's order, the share took the last untouched GPU the whole one needed.
        p = self.new_pod("share-then-whole", [share(mem=2, count=2), whole(1)])
        res = self.ext.filter(p, self.nodes)
        self.assertIn("t4-busy", res["NodeNames"], res)
        self.assertEqual(self.ext.bind(p, "t4-busy"), "")
        got = self.gpus_of("share-then-whole")
        self.assertEqual(len(got["c1"]), 1)
        self.assertNotIn(got["c1"][0], got["c0"] + [0])
        # On an empty node these fit together; they were even reported unresolvable.
        p = self.new_pod("three-sizes", [share(mem=8), share(mem=8, count=2),
                                         share(mem=16, count=4)])
        res = self.ext.filter(p, ["t4-empty"])
        self.assertEqual(res["NodeNames"], ["t4-empty"], res)
        self.assertEqual(self.ext.bind(p, "t4-empty"), "")
        self.assert_state_matches(self.ext, self.standin)

    def test_spread_binds_what_filter_passed(self):
        # mem 11 fits only beside the 4 GiB; spread put mem 2 there, on the emptier GPU.
        for policy in ("spread", "random"):
            p = self.new_pod("two-%s" % policy, [share(mem=2), share(mem=11)], policy)
            self.assertEqual(self.ext.filter(p, ["v100-16"])["NodeNames"], ["v100-16"])
            self.assertEqual(self.ext.bind(p, "v100-16"), "")
            self.assertEqual(self.gpus_of("two-%s" % policy), {"c0": [0], "c1": [1]})
            self.standin.delete_pod("default", "two-%s" % policy)
            self.assert_state_matches(self.ext, self.standin)

    def test_filter_passes_iff_bind_places(self):
        # For every policy, random pods of several containers while the nodes fill up: a
        # node filter refused, bind refuses; a node filter passed, bind places the pod on.
        rng = random.Random(4242)
        passed = refused = 0
        for policy in POLICIES:
            bound = []
            for i in range(10):
                name = "%s-%d" % (policy, i)
                limits = [random_limits(rng, max_whole=2, mem_max=8)
                          for _ in range(rng.randint(2, 4))]
                p = self.new_pod(name, limits, policy)
                res = self.ext.filter(p, self.nodes)
                fits = res["NodeNames"]
                no = sorted(set(self.nodes) - set(fits))
                if no:
                    node = rng.choice(no)
                    err = self.ext.bind(p, node)
                    self.assertNotEqual(err, "", "%s: filter refused %s (%s), bind placed it"
                                        % (name, node, res["FailedNodes"].get(node)))
                    refused += 1
                if fits:
                    node = rng.choice(fits)
                    err = self.ext.bind(p, node)
                    self.assertEqual(err, "", "%s %r: filter passed %s, bind refused"
                                     % (name, limits, node))
                    bound.append(name)
                    passed += 1
            self.assert_state_matches(self.ext, self.standin)
            for name in bound:
                self.standin.delete_pod("default", name)
            self.assert_state_matches(self.ext, self.standin)
        self.assertGreater(passed, 20)
        self.assertGreater(refused, 20)


# ---------------------------------------------------------------------------
# 2. Faults
# ---------------------------------------------------------------------------

class TestKgpuPolicy(ExtenderTest):
    """The kgpu policy inside the extender: rank scores, CPU seen, scarcity learned."""

    def setUp(self):
        super().setUp()
        s = self.standin = self.start_standin()
        s.add_node("roomy-0", gpu_list("roomy-0", A100, 81920, 4), cpu="64")
        s.add_node("tight-0", gpu_list("tight-0", A100, 81920, 4), cpu="64")
        s.add_node("t4-0", gpu_list("t4-0", "T4", 15360, 4))
        self.ext = self.start_extender_for(s)

    def new_pod(self, name, containers, annotations=None):
        ann = {"kgpu.io/policy": "kgpu"}
        ann.update(annotations or {})
        return self.standin.add_pod(pod_object(name, containers, ann))

    def scores(self, pod, names):
        self.assertEqual(sorted(self.ext.filter(pod, names)["NodeNames"]), sorted(names))
        return {r["Host"]: r["Score"] for r in self.ext.prioritize(pod, names)}

    def place(self, name, node, cpu="100m", annotations=None):
        pod = self.new_pod(name, [container("main", whole(1), cpu=cpu)], annotations)
        self.assertIn(node, self.ext.filter(pod, [node])["NodeNames"])
        self.assertEqual(self.ext.bind(pod, node), "")
        return pod

    def test_kgpu_pod_is_scored_and_bound(self):
        self.place("first", "roomy-0")
        pod = self.new_pod("share", [container("main", share(mem=8, core=30))])
        names = ["roomy-0", "tight-0", "t4-0"]
        sc = self.scores(pod, names)
        self.assertEqual(sorted(sc), sorted(names))
        self.assertTrue(all(0 <= v <= 10 for v in sc.values()), sc)
        self.assertEqual(max(sc.values()), 10, sc)
        node, err = self.ext.schedule(pod, names)
        self.assertEqual(err, "")
        self.assertEqual(sc[node], 10)
        part = self.parse_assignment(self.standin.get_pod("default", "share"))[0]
        self.assertEqual(part["gpus"][0]["milli"], 300)
        self.assert_state_matches(self.ext, self.standin)

    def test_cpu_heavy_node_is_avoided(self):
        # tight-0 gives most of its CPU to one GPU pod; both A100 nodes keep free GPUs.
        self.place("cpu-hog", "tight-0", cpu="56")
        pod = self.new_pod("gpu-pod", [container("main", whole(1), cpu="16")])
        # Filter does not refuse tight-0 for CPU: kube-scheduler is the authority there.
        sc = self.scores(pod, ["roomy-0", "tight-0"])
        # Without CPU, packing would prefer tight-0 (one GPU in use already); with it,
        # tight-0's free GPUs would be stranded without CPU to serve them.
        self.assertEqual(sc["roomy-0"], 10, sc)
        self.assertLess(sc["tight-0"], 10, sc)
        self.assertEqual(self.ext.schedule(pod, ["roomy-0", "tight-0"]), ("roomy-0", ""))
        # A CPU-light GPU pod still packs onto tight-0: only CPU made the difference.
        light = self.new_pod("light", [container("main", whole(1), cpu="100m")])
        sc = self.scores(light, ["tight-0", "t4-0"])
        self.assertEqual(sc["tight-0"], 10, sc)
        # What tight-0 holds is still bound and released as before.
        self.assert_state_matches(self.ext, self.standin)

    def test_cpu_of_pods_without_kgpu_counts(self):
        """Pods bound without kgpu (CPU-only, or by another scheduler) take their node's
        CPU in the scores, and give it back when they end, are deleted, or only a relist
        shows they are gone."""
        def cpu_free(node):
            return next(n for n in self.ext.inspect()["nodes"]
                        if n["name"] == node)["cpu_free_milli"]

        def cpu_free_becomes(node, value, what):
            wait_for(lambda: cpu_free(node) == value, 10, what=what)

        self.place("user", "tight-0")  # one GPU in use there: packing prefers tight-0
        cpu_free_becomes("tight-0", 64000 - 100, "the GPU pod's CPU counted")
        names = ["roomy-0", "tight-0"]
        sc = self.scores(self.new_pod("g-0", [container("main", whole(1), cpu="16")]), names)
        self.assertEqual(sc["tight-0"], 10, sc)

        def batch(name):
            return self.standin.add_pod(pod_object(name, [container("main", None, cpu="56")],
                                                   node_name="tight-0", phase="Running"))

        # A CPU-only pod bound by kube-scheduler alone, and one of another scheduler that
        # takes nothing kgpu knows of: both count, once.
        batch("batch-0")
        other = pod_object("foreign", [container("main", None, cpu="4")], node_name="roomy-0",
                           phase="Pending")
        other["spec"]["schedulerName"] = "some-other-scheduler"
        self.standin.add_pod(other)
        cpu_free_becomes("tight-0", 64000 - 100 - 56000, "batch-0's CPU counted")
        cpu_free_becomes("roomy-0", 64000 - 4000, "the foreign pod's CPU counted")
        self.standin.patch_pod("default", "batch-0", {"metadata": {"labels": {"seen": "again"}}})
        self.assertEqual(self.ext.metric("kgpu_extender_cpu_pods"), 2)
        sc = self.scores(self.new_pod("g-1", [container("main", whole(1), cpu="16")]), names)
        self.assertEqual(sc["roomy-0"], 10, sc)
        self.assertLess(sc["tight-0"], 10, sc)
        self.assertEqual(cpu_free("tight-0"), 64000 - 100 - 56000, "counted twice")
        # A change of tight-0's inventory rebuilds the cluster: the CPU is carried over.
        self.standin.set_node_gpus("tight-0", gpu_list("tight-0", A100, 81920, 5))
        wait_for(lambda: next(n for n in self.ext.inspect()["nodes"]
                              if n["name"] == "tight-0")["gpus_total"] == 5, 10,
                 what="the inventory change")
        self.assertEqual(cpu_free("tight-0"), 64000 - 100 - 56000)
        self.assertEqual(self.ext.metric("kgpu_extender_cpu_pods"), 2)

        # Ended, then deleted: the CPU is back each time.
        self.standin.patch_pod("default", "batch-0", {"status": {"phase": "Succeeded"}})
        cpu_free_becomes("tight-0", 64000 - 100, "batch-0's CPU back when it ended")
        self.standin.delete_pod("default", "foreign")
        cpu_free_becomes("roomy-0", 64000, "the foreign pod's CPU back")
        sc = self.scores(self.new_pod("g-2", [container("main", whole(1), cpu="16")]), names)
        self.assertEqual(sc["tight-0"], 10, sc)

        # Deleted while the watch is down and the history is gone: the relist finds it.
        batch("batch-1")
        cpu_free_becomes("tight-0", 64000 - 100 - 56000, "batch-1's CPU counted")
        restarts = sum(self.ext.metric("kgpu_extender_watch_restarts_total", {"resource": r})
                       or 0 for r in ("nodes", "pods"))
        self.standin.control(drop_watches=True)
        self.standin.delete_pod("default", "batch-1")
        self.standin.control(expire_history=True)
        wait_for(lambda: sum(self.ext.metric("kgpu_extender_watch_restarts_total",
                                             {"resource": r}) or 0
                             for r in ("nodes", "pods")) > restarts, 10, what="a watch restart")
        cpu_free_becomes("tight-0", 64000 - 100, "batch-1's CPU back after the relist")
        self.assertEqual(self.ext.metric("kgpu_extender_cpu_pods"), 0)
        self.assert_state_matches(self.ext, self.standin)

    def test_pods_without_gpu_are_scored_by_prioritize_gpuless(self):
        """The second extender entry of the shipped configuration: prioritize-gpuless
        scores pods that ask for no GPU (their CPU goes where it strands no GPU) and
        gives GPU pods 0; prioritize does the reverse. Each pod is learned once."""
        names = ["roomy-0", "tight-0"]

        def gpuless(pod):
            status, res = self.ext.post_json("prioritize-gpuless",
                                             {"Pod": pod, "Nodes": None, "NodeNames": names})
            self.assertEqual(status, 200, res)
            return {r["Host"]: r["Score"] for r in full_scores(res, names)}

        for i in range(4):  # every GPU of tight-0 taken: CPU there strands nothing
            self.place("whole-%d" % i, "tight-0")
        learned = self.ext.metric("kgpu_extender_pods_learned_total")
        batch = self.new_pod("batch", [container("main", None, cpu="48")])
        sc = gpuless(batch)
        self.assertEqual(sc["tight-0"], 10, sc)
        self.assertLess(sc["roomy-0"], 10, sc)
        self.assertEqual(self.ext.metric("kgpu_extender_pods_learned_total"), learned + 1)
        self.assertEqual(gpuless(batch), sc)  # kube-scheduler's retry: learned once
        self.assertEqual(self.ext.metric("kgpu_extender_pods_learned_total"), learned + 1)
        # The GPU entry's verb leaves such pods alone, and this verb leaves GPU pods alone.
        self.assertEqual({r["Score"] for r in self.ext.prioritize(batch, names)}, {0})
        gpu = self.new_pod("gpu", [container("main", whole(1), cpu="100m")])
        self.assertEqual(set(gpuless(gpu).values()), {0})
        self.assertEqual(self.ext.metric("kgpu_extender_pods_learned_total"), learned + 1)
        # A pod asking for nothing takes nothing: no node is better, nothing is learned.
        empty = pod_object("empty", [{"name": "main", "image": "busybox:1.36"}],
                           {"kgpu.io/policy": "kgpu"})
        self.assertEqual(set(gpuless(self.standin.add_pod(empty)).values()), {0})
        # A policy kgpu does not know: 0 everywhere and counted as an invalid pod.
        bad = self.new_pod("bad", [container("main", None, cpu="1")],
                           {"kgpu.io/policy": "no-such-policy"})
        self.assertEqual(set(gpuless(bad).values()), {0})
        self.assertEqual(self.ext.metric("kgpu_extender_invalid_pods_total",
                                         {"verb": "prioritize-gpuless"}), 1)
        self.assertEqual(self.ext.metric("kgpu_extender_requests_total",
                                         {"verb": "prioritize-gpuless"}), 5)

    def test_scarcity_follows_observed_constrained_pods(self):
        self.place("t4-user", "t4-0")
        names = ["roomy-0", "tight-0", "t4-0"]
        before = self.scores(self.new_pod("u-before", [container("main", whole(1))]), names)
        # The T4 node, already in use, is where a whole GPU fragments least.
        self.assertEqual(before["t4-0"], 10, before)
        # Pods that only T4s can serve arrive (filtered, each counted once).
        for i in range(6):
            pod = self.new_pod("t4-only-%d" % i, [container("main", whole(1))],
                               {"kgpu.io/gpu-type": "T4"})
            for _ in range(2):  # a filter retry is not a second arrival
                self.assertEqual(self.ext.filter(pod, names)["NodeNames"], ["t4-0"])
        after = self.scores(self.new_pod("u-after", [container("main", whole(1))]), names)
        self.assertLess(after["t4-0"], 10, after)
        self.assertEqual(max(after["roomy-0"], after["tight-0"]), 10, after)
        # A pod without kgpu.io/policy gets the default policy, kgpu: the same scores.
        plain = self.standin.add_pod(pod_object("plain-pod", [container("main", whole(1))]))
        self.assertEqual(self.scores(plain, names), after)
        # The A100 nodes leave and come back: numbered afresh, T4 would become model 0
        # and A100 model 1, and what was learned about T4 would land on A100.
        for n in ("roomy-0", "tight-0"):
            self.standin.delete_node(n)
        wait_for(lambda: [n["name"] for n in self.ext.inspect()["nodes"]] == ["t4-0"], 10,
                 what="the A100 nodes gone")
        self.standin.add_node("roomy-0", gpu_list("roomy-0", A100, 81920, 4), cpu="64")
        self.standin.add_node("tight-0", gpu_list("tight-0", A100, 81920, 4), cpu="64")
        wait_for(lambda: len(self.ext.inspect()["nodes"]) == 3, 10, what="the A100 nodes back")
        back = self.scores(self.new_pod("u-back", [container("main", whole(1))]), names)
        self.assertLess(back["t4-0"], 10, back)
        self.assertEqual(max(back["roomy-0"], back["tight-0"]), 10, back)
        # An fgd pod is scored by fgd, with linear 0-10 scores.
        fgd = self.standin.add_pod(pod_object("fgd-pod", [container("main", whole(1))],
                                              {"kgpu.io/policy": "fgd"}))
        self.assertEqual(sorted(self.ext.filter(fgd, names)["NodeNames"]), sorted(names))
        self.assertTrue(all(0 <= r["Score"] <= 10 for r in self.ext.prioritize(fgd, names)))


class TestFaults(ExtenderTest):

    def setUp(self):
        super().setUp()
        s = self.standin = self.start_standin()
        s.add_node("t4-0", gpu_list("t4-0", "T4", 15360, 2))
        s.add_node("t4-1", gpu_list("t4-1", "T4", 15360, 2))
        self.ext = self.start_extender_for(s)

    def new_pod(self, name, limits, annotations=None):
        return self.standin.add_pod(pod_object(name, [container("main", limits)], annotations))

    def bind_failures(self, reason):
        return self.ext.metric("kgpu_extender_bind_failures_total", {"reason": reason})

    def test_api_errors_release_or_hold_the_reservation(self):
        pod = self.new_pod("p", share(mem=4, core=20))
        self.assertEqual(self.ext.filter(pod, ["t4-0"])["NodeNames"], ["t4-0"])
        # A 500 does not say whether the Binding was applied: the GPUs stay held
        # (TestBindInDoubt has the rest), and kube-scheduler's retry takes them over.
        self.standin.control(bind_status=500, bind_count=1)
        err = self.ext.bind(pod, "t4-0")
        self.assertIn("500", err)
        self.assertIn("injected bind failure", err)
        self.assertIn("default/p", err)
        self.assertIn("held on t4-0", err)
        held = self.ext.held()
        self.assertEqual(list(held.values()), [(4096, 200)])
        self.assertIsNone(self.standin.get_pod("default", "p")["spec"].get("nodeName"))
        self.assertEqual(self.bind_failures("api_error"), 1)
        node, err = self.ext.schedule(pod, ["t4-0", "t4-1"])
        self.assertEqual(err, "")
        self.assertEqual(node, "t4-0")
        self.assertEqual(self.standin.get_pod("default", "p")["spec"]["nodeName"], node)
        self.assertEqual(self.ext.held(), held)
        self.assert_state_matches(self.ext, self.standin)

        # Answers that say the Binding was refused release at once, and leak nothing.
        for status in (403, 422, 400):
            q = self.new_pod("q-%d" % status, share(mem=4))
            self.ext.filter(q, ["t4-0"])
            self.standin.control(bind_status=status)
            err = self.ext.bind(q, "t4-0")
            self.assertIn(str(status), err)
            self.assertNotIn("held on", err)
        self.assertEqual(self.bind_failures("api_error"), 4)
        self.assert_state_matches(self.ext, self.standin)
        self.assertEqual(self.ext.inspect()["totals"]["pods"], 1)
        self.assertEqual(self.ext.metric("kgpu_extender_binds_in_doubt"), 0)

    def test_pod_already_bound_conflict(self):
        # Bound by someone else (no kgpu assignment): the API server answers 409.
        pod = self.standin.add_pod(pod_object("taken", [container("main", share(mem=4))],
                                              node_name="t4-1"))
        self.ext.filter(pod, ["t4-0"])
        err = self.ext.bind(pod, "t4-0")
        self.assertIn("409", err)
        self.assertIn("already assigned", err)
        self.assertEqual(self.ext.held(), {})
        self.assertEqual(self.bind_failures("api_conflict"), 1)
        self.assertEqual(self.standin.get_pod("default", "taken")["spec"]["nodeName"], "t4-1")
        # An injected 409 is the same.
        p = self.new_pod("p", share(mem=4))
        self.ext.filter(p, ["t4-0"])
        self.standin.control(bind_status=409)
        self.assertIn("409", self.ext.bind(p, "t4-0"))
        self.assertEqual(self.bind_failures("api_conflict"), 2)
        self.assertEqual(self.ext.held(), {})
        # A pod deleted and re-created under the same name: the uid precondition refuses it.
        old = self.new_pod("again", share(mem=4))
        self.ext.filter(old, ["t4-0"])
        self.standin.delete_pod("default", "again")
        self.new_pod("again", share(mem=4))
        err = self.ext.bind(old, "t4-0")
        self.assertNotEqual(err, "")
        self.assertIsNone(self.standin.get_pod("default", "again")["spec"].get("nodeName"))
        self.assert_state_matches(self.ext, self.standin)
        self.assertEqual(self.ext.held(), {})

    def test_unreachable_api_server(self):
        pod = self.new_pod("p", share(mem=4))
        self.ext.filter(pod, ["t4-0"])
        self.standin.stop()
        t0 = time.monotonic()
        err = self.ext.bind(pod, "t4-0", timeout=60)
        self.assertNotEqual(err, "")
        self.assertLess(time.monotonic() - t0, 30)
        self.assertEqual(self.ext.held(), {})
        self.assertEqual(self.bind_failures("api_unreachable"), 1)
        self.assertEqual(self.ext.get("/healthz")[0], 200)

    def test_slow_api_binds_in_parallel(self):
        delay_ms, count = 1500, 8
        # 2 nodes x 2 GPUs x 15 GiB hold 12 shares of 5 GiB: the last 2 of 14 cannot fit.
        pods = [self.new_pod("slow-%02d" % i, share(mem=5, core=10)) for i in range(count + 6)]
        first = pods[:count]
        for p in pods:
            self.assertEqual(len(self.ext.filter(p, ["t4-0", "t4-1"])["NodeNames"]), 2)
        self.standin.control(bind_delay_ms=delay_ms)
        results = {}

        def bind(p, node):
            results[p["metadata"]["name"]] = self.ext.bind(p, node, timeout=60)
        threads = [threading.Thread(target=bind, args=(p, "t4-0" if i % 2 else "t4-1"))
                   for i, p in enumerate(first)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        # While the binds wait on the API server, their GPUs are reserved.
        time.sleep(delay_ms / 3000.0)
        doc = self.ext.inspect()
        statuses = [p["status"] for n in doc["nodes"] for g in n["gpus"] for p in g["pods"]]
        self.assertEqual(statuses.count("reserved"), count, doc)
        self.assert_within_capacity(self.ext, doc)
        # Reservations in flight count: 6 GPUs' worth of room is left for 6 more pods,
        # then nothing. These run concurrently with the first batch, too.
        late = {}

        def bind_late(p):
            late[p["metadata"]["name"]] = self.ext.bind(p, "t4-0", timeout=60)
        more = [threading.Thread(target=bind_late, args=(p,)) for p in pods[count:]]
        for t in more:
            t.start()
        for t in threads + more:
            t.join(60)
        elapsed = time.monotonic() - t0
        self.assertEqual(results, {p["metadata"]["name"]: "" for p in first})
        # 8 + 6 binds of 1.5 s each: serialised they would take 21 s.
        self.assertLess(elapsed, 0.5 * (count + 6) * delay_ms / 1000.0,
                        "binds were serialised: %.1f s" % elapsed)
        # t4-0 got 4 of the first batch (20 GiB of its 30): 2 more fit, 4 do not.
        self.assertEqual(sorted(late.values()).count(""), 2, late)
        for err in late.values():
            if err:
                self.assertIn("does not fit", err)
        self.standin.control(bind_delay_ms=0)
        self.assert_state_matches(self.ext, self.standin)
        bound = [p for p in self.standin.pods() if p["spec"].get("nodeName")]
        self.assertEqual(len(bound), count + 2)

    def watch_restarts(self):
        return sum(self.ext.metric("kgpu_extender_watch_restarts_total", {"resource": r}) or 0
                   for r in ("nodes", "pods"))

    def test_watch_faults_keep_state_true(self):
        # Some pods bound through the extender, one bound behind its back.
        for i in range(3):
            p = self.new_pod("w-%d" % i, share(mem=3, core=20))
            self.assertEqual(self.ext.schedule(p, ["t4-0", "t4-1"])[1], "")
        restarts = self.watch_restarts()

        def restarted_beyond(n):
            return lambda: self.watch_restarts() > n

        # Cut the streams; then change things while the extender re-lists and re-watches.
        self.standin.control(drop_watches=True)
        wait_for(restarted_beyond(restarts), 10, what="watch restart after drop_watches")
        self.standin.delete_pod("default", "w-0")
        ann = {"kgpu.io/assignment": assignment_annotation(
                   [("main", False, [(1, "GPU-t4-1-1", 500, 4096)])]),
               "kgpu.io/node": "t4-1"}
        self.standin.add_pod(pod_object("outside", [container("main", share(mem=4, core=50))],
                                        ann, node_name="t4-1", phase="Running"))
        self.assert_state_matches(self.ext, self.standin, timeout=10)

        # The server tells every watcher it fell behind (410 ERROR event).
        restarts = self.watch_restarts()
        opened = self.standin.stats()["watches_opened"]
        self.standin.control(expire_watches=True)
        wait_for(restarted_beyond(restarts), 10, what="watch restart after expire_watches")
        # Bind only once both reflectors watch again (their lists applied): a bind racing
        # a relist is test_relist_racing_a_bind's business.
        wait_for(lambda: self.standin.stats()["watches_opened"] >= opened + 2, 10,
                 what="both watches open again")
        p = self.new_pod("after-expire", share(mem=2))
        self.assertEqual(self.ext.schedule(p, ["t4-0", "t4-1"])[1], "")
        self.standin.delete_pod("default", "w-1")
        self.assert_state_matches(self.ext, self.standin, timeout=10)

        # Changes made while the watch is down and the history is gone: only a relist
        # (after 410 on the re-watch, and two failed lists) can find them.
        restarts = self.watch_restarts()
        self.standin.control(fail_lists=2)
        self.standin.control(drop_watches=True)
        self.standin.delete_pod("default", "w-2")
        self.standin.set_node_gpus("t4-0", gpu_list("t4-0", "T4", 15360, 2, unhealthy=(1,)))
        self.standin.control(expire_history=True)
        wait_for(restarted_beyond(restarts), 10, what="watch restart after the second drop")
        # The failed lists are the extender's to take, not this test's: wait until it has.
        wait_for(lambda: self.standin.control()["fail_lists"] == 0, 15,
                 what="the extender to take both failed lists")
        self.assert_state_matches(self.ext, self.standin, timeout=15)
        wait_for(lambda: self.ext.gpu("t4-0", 1)["healthy"] is False, 10,
                 what="the GPU marked unhealthy while the watch was down")
        self.assertGreater(self.watch_restarts(), restarts)
        self.assertEqual(self.ext.metric("kgpu_extender_assignment_conflicts_total"), 0)
        self.assertEqual(self.ext.get("/readyz")[0], 200)
        self.assertEqual(self.standin.stats()["unauthorized"], 0)

    def test_deleted_pod_frees_its_gpus(self):
        pods = []
        for i in range(3):
            p = self.new_pod("d-%d" % i, share(mem=4, core=30))
            self.assertEqual(self.ext.schedule(p, ["t4-0", "t4-1"])[1], "")
            pods.append(p)
        self.assert_state_matches(self.ext, self.standin)
        self.assertEqual(self.ext.inspect()["totals"]["pods"], 3)
        # Deleted: gone from /inspect within 3 s.
        self.standin.delete_pod("default", "d-0")
        wait_for(lambda: self.ext.inspect()["totals"]["pods"] == 2, 3, what="d-0 freed")
        self.assert_state_matches(self.ext, self.standin)
        # Finished (phase Succeeded) frees its GPUs as well.
        self.standin.patch_pod("default", "d-1", {"status": {"phase": "Succeeded"}})
        wait_for(lambda: self.ext.inspect()["totals"]["pods"] == 1, 3, what="d-1 freed")
        # Being deleted (deletionTimestamp set) counts as gone.
        self.standin.patch_pod("default", "d-2", {"metadata": {
            "deletionTimestamp": "2025-01-01T00:00:00Z"}})
        wait_for(lambda: self.ext.inspect()["totals"]["pods"] == 0, 3, what="d-2 freed")
        self.assertEqual(self.ext.held(), {})
        # The room is usable again: four 7 GiB shares fit the four 15 GiB GPUs.
        for i in range(4):
            p = self.new_pod("again-%d" % i, share(mem=14))
            self.assertEqual(self.ext.schedule(p, ["t4-0", "t4-1"])[1], "")
        self.assert_state_matches(self.ext, self.standin)

    def test_node_inventory_changes(self):
        p = self.new_pod("n-0", share(mem=4))
        self.assertEqual(self.ext.schedule(p, ["t4-1"])[1], "")
        # A new node joins; another leaves.
        self.standin.add_node("l4-0", gpu_list("l4-0", "L4", 23034, 1))
        wait_for(lambda: any(n["name"] == "l4-0" for n in self.ext.inspect()["nodes"]), 3,
                 what="l4-0 in /inspect")
        self.standin.delete_node("t4-0")
        wait_for(lambda: all(n["name"] != "t4-0" for n in self.ext.inspect()["nodes"]), 3,
                 what="t4-0 gone from /inspect")
        res = self.ext.filter(self.new_pod("n-1", share(mem=4)), ["t4-0", "t4-1", "l4-0"])
        self.assertEqual(res["NodeNames"], ["t4-1", "l4-0"])
        self.assertIn("t4-0", res["FailedAndUnresolvableNodes"])
        # Unhealthy GPUs take no new pods; the pod already there stays counted.
        gpu = self.parse_assignment(self.standin.get_pod("default", "n-0"))[0]["gpus"][0]["index"]
        self.standin.set_node_gpus("t4-1", gpu_list("t4-1", "T4", 15360, 2, unhealthy=(0, 1)))
        wait_for(lambda: self.ext.gpu("t4-1", 0)["healthy"] is False, 3, what="unhealthy")
        res = self.ext.filter(self.new_pod("n-2", share(mem=1)), ["t4-1"])
        self.assertIn("healthy", res["FailedNodes"].get("t4-1", ""))
        self.assertEqual(self.ext.gpu("t4-1", gpu)["memory_allocated_mib"], 4096)
        self.assert_state_matches(self.ext, self.standin)

    def set_node_spec(self, name, spec):
        self.standin.api("PATCH", "/api/v1/nodes/" + name, {"spec": spec},
                         "application/merge-patch+json", expect=200)

    def test_leaving_nodes_take_no_new_gpu_pods(self):
        """A node an autoscaler or a spot interruption handler is about to remove (its
        taint), or that is cordoned, takes no new GPU pod; what runs there stays counted."""
        there = self.new_pod("there", share(mem=4))
        self.assertEqual(self.ext.schedule(there, ["t4-1"]), ("t4-1", ""))
        late = self.new_pod("late", share(mem=2))
        self.assertEqual(self.ext.filter(late, ["t4-1"])["NodeNames"], ["t4-1"])
        # A taint kgpu does not know (the GPU operator's) changes nothing.
        self.set_node_spec("t4-1", {"taints": [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]})
        time.sleep(0.3)
        self.assertEqual(self.ext.metric("kgpu_extender_nodes_leaving"), 0)
        self.assertEqual(self.ext.filter(self.new_pod("n-0", share(mem=1)),
                                         ["t4-1"])["NodeNames"], ["t4-1"])
        # The spot interruption notice arrives after filter let `late` through.
        self.set_node_spec("t4-1", {"taints": [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "aws-node-termination-handler/spot-itn", "value": "1700000000",
             "effect": "NoSchedule"}]})
        wait_for(lambda: self.ext.metric("kgpu_extender_nodes_leaving") == 1, 3,
                 what="t4-1 leaving")
        err = self.ext.bind(late, "t4-1")
        self.assertIn("leaving", err)
        self.assertIn("aws-node-termination-handler/spot-itn", err)
        res = self.ext.filter(self.new_pod("n-1", share(mem=1)), ["t4-0", "t4-1"])
        self.assertEqual(res["NodeNames"], ["t4-0"])
        why = res["FailedAndUnresolvableNodes"]["t4-1"]
        self.assertIn("leaving (taint aws-node-termination-handler/spot-itn:NoSchedule)", why)
        # The pod already there keeps its GPU until it goes.
        self.assertEqual(self.ext.gpu("t4-1", self.parse_assignment(
            self.standin.get_pod("default", "there"))[0]["gpus"][0]["index"]
        )["memory_allocated_mib"], 4096)
        # The notice is withdrawn: the node takes pods again.
        self.set_node_spec("t4-1", {"taints": None})
        wait_for(lambda: self.ext.metric("kgpu_extender_nodes_leaving") == 0, 3,
                 what="t4-1 staying")
        self.assertEqual(self.ext.filter(late, ["t4-1"])["NodeNames"], ["t4-1"])
        # Cordoned (kubectl drain's first step), then Karpenter's disruption taint on t4-0.
        self.set_node_spec("t4-1", {"unschedulable": True})
        self.set_node_spec("t4-0", {"taints": [
            {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]})
        wait_for(lambda: self.ext.metric("kgpu_extender_nodes_leaving") == 2, 3,
                 what="both leaving")
        res = self.ext.filter(self.new_pod("n-2", share(mem=1)), ["t4-0", "t4-1"])
        self.assertEqual(res["NodeNames"], [])
        self.assertIn("cordoned", res["FailedAndUnresolvableNodes"]["t4-1"])
        self.assertIn("karpenter.sh/disrupted", res["FailedAndUnresolvableNodes"]["t4-0"])
        # A relist (the watch expired) keeps what it says.
        self.standin.control(expire_watches=True)
        time.sleep(0.5)
        self.assertEqual(self.ext.metric("kgpu_extender_nodes_leaving"), 2)
        self.assert_state_matches(self.ext, self.standin)

    def test_gpu_leaves_and_returns(self):
        w = self.new_pod("w", whole(2))
        self.assertEqual(self.ext.schedule(w, ["t4-0"]), ("t4-0", ""))
        # GPU 1 drops out of the device plugin's inventory for a while, then returns.
        self.standin.set_node_gpus("t4-0", gpu_list("t4-0", "T4", 15360, 1))
        wait_for(lambda: len(self.ext.inspect()["nodes"][0]["gpus"]) == 1, 3, what="shrink")
        self.standin.set_node_gpus("t4-0", gpu_list("t4-0", "T4", 15360, 2))
        wait_for(lambda: len(self.ext.inspect()["nodes"][0]["gpus"]) == 2, 3, what="regrow")
        # The pod is still bound to both GPUs in the API server.
        self.assert_state_matches(self.ext, self.standin, timeout=3)
        x = self.new_pod("x", whole(1))
        self.assertEqual(self.ext.filter(x, ["t4-0"])["NodeNames"], [])

    def test_node_deleted_and_recreated(self):
        q = self.new_pod("q", whole(1))
        self.assertEqual(self.ext.schedule(q, ["t4-1"]), ("t4-1", ""))
        self.standin.delete_node("t4-1")
        wait_for(lambda: all(n["name"] != "t4-1" for n in self.ext.inspect()["nodes"]), 3,
                 what="t4-1 gone")
        self.standin.add_node("t4-1", gpu_list("t4-1", "T4", 15360, 2))
        wait_for(lambda: any(n["name"] == "t4-1" for n in self.ext.inspect()["nodes"]), 3,
                 what="t4-1 back")
        self.assert_state_matches(self.ext, self.standin, timeout=3)

    def test_relist_racing_a_bind(self):
        self.standin.add_node("one-0", gpu_list("one-0", "T4", 15360, 1))
        # Big pods make the pod list take a while to send and read.
        pad = "x" * 100000
        for i in range(60):
            self.standin.add_pod(pod_object("filler-%d" % i, [container("main")], {"pad": pad}))
        wait_for(lambda: self.ext.gpu("one-0", 0), 3, what="one-0 known")
        for trial in range(3):
            rival = self.new_pod("rival-%d" % trial, whole(1))
            self.ext.filter(rival, ["one-0"])
            lists = self.standin.stats()["lists"]
            self.standin.control(expire_watches=True)  # both reflectors relist
            wait_for(lambda: self.standin.stats()["lists"] >= lists + 2, 5, interval=0.002,
                     what="the relists to start")
            time.sleep(0.03)
            # Bound while the pod list is on its way: the list does not have it.
            pod = self.new_pod("during-%d" % trial, whole(1))
            self.ext.filter(pod, ["one-0"])
            self.assertEqual(self.ext.bind(pod, "one-0"), "")
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                if ("one-0", 0) not in self.ext.held():
                    err = self.ext.bind(rival, "one-0")
                    self.fail("trial %d: the GPU of bound pod %s counted as free; a second "
                              "whole-GPU pod's bind then answered %r (\"\" = one GPU given "
                              "twice); the stand-in's pods overbook: %s"
                              % (trial, pod["metadata"]["name"], err,
                                 self.standin.overbooked(self.standin.truth())))
                self.assertNotEqual(self.ext.bind(rival, "one-0"), "", "one GPU given twice")
            self.assertEqual(self.standin.overbooked(self.standin.truth()), [])
            self.assert_state_matches(self.ext, self.standin)
            self.standin.delete_pod("default", "during-%d" % trial)
            wait_for(lambda: not self.ext.held(), 3, what="the GPU freed")
        self.assertEqual(self.ext.metric("kgpu_extender_assignment_conflicts_total"), 0)

    def test_zero_quantity_pod_holds_nothing(self):
        pod = self.new_pod("zero", {"kgpu.io/gpu-mem": 0})
        self.assertEqual(self.ext.schedule(pod, ["t4-0"]), ("t4-0", ""))
        self.assertEqual(self.ext.held(), {})
        self.assertEqual(self.ext.inspect()["totals"]["pods"], 0)

    def test_same_pod_bound_twice_at_once(self):
        pod = self.new_pod("twice", share(mem=4))
        self.ext.filter(pod, ["t4-0", "t4-1"])
        self.standin.control(bind_delay_ms=500)
        results = []
        threads = [threading.Thread(target=lambda n=n: results.append(self.ext.bind(pod, n)))
                   for n in ("t4-0", "t4-1", "t4-0")]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(30)
        self.standin.control(bind_delay_ms=0)
        self.assertEqual(sorted(results).count(""), 1, results)
        self.assertTrue(any("in flight" in r for r in results), results)
        self.assertEqual(self.standin.stats()["binds"], 1)
        self.assertEqual(self.ext.inspect()["totals"]["pods"], 1)
        self.assert_state_matches(self.ext, self.standin)

    def test_bind_without_filter_fetches_the_pod(self):
        # kube-scheduler called filter on another extender instance, or long ago.
        pod = self.new_pod("unseen", share(mem=6, core=40))
        self.assertEqual(self.ext.bind(pod, "t4-1"), "")
        parts = self.parse_assignment(self.standin.get_pod("default", "unseen"))
        self.assertEqual([(g["milli"], g["memory_mib"]) for g in parts[0]["gpus"]], [(400, 6144)])
        self.assertGreaterEqual(self.standin.stats()["gets"], 1)
        # A pod of that name but another uid (deleted and re-created) is refused.
        old = self.new_pod("renewed", share(mem=1))
        self.standin.delete_pod("default", "renewed")
        self.new_pod("renewed", share(mem=1))
        self.assertIn("another pod of that name", self.ext.bind(old, "t4-1"))
        self.assert_state_matches(self.ext, self.standin)

    def test_readiness_waits_for_the_lists(self):
        # A second extender whose node and pod lists fail is not ready.
        self.standin.control(fail_lists=1000)
        late = self.start_extender_for(self.standin, name="blocked", wait_ready=False)
        time.sleep(1.0)
        self.assertEqual(late.get("/readyz")[0], 503)
        self.assertEqual(late.metric("kgpu_extender_ready"), 0)
        self.assertEqual(late.get("/healthz")[0], 200)
        self.standin.control(fail_lists=0)
        late.wait_ready(timeout=15)
        self.assertEqual(late.metric("kgpu_extender_ready"), 1)


# ---------------------------------------------------------------------------
# 3. Restart
# ---------------------------------------------------------------------------

def random_limits(rng, max_whole=2, mem_max=8):
    r = rng.random()
    if r < 0.2:
        return whole(rng.randint(1, max_whole))
    if r < 0.3:
        return share(mem=2 * rng.randint(1, mem_max // 2), count=2)
    if r < 0.4:
        return share(core=rng.choice((10, 25, 50)))
    if r < 0.7:
        return share(mem=rng.randint(1, mem_max), core=rng.choice((5, 10, 20, 40)))
    return share(mem=rng.randint(1, mem_max))


class TestBindInDoubt(ExtenderTest):
    """A Binding whose answer is lost may still be applied: its GPUs stay held.

    A timeout, a broken connection or a 5xx after the request went out leave
    the bind's fate unknown. Releasing its GPUs then hands them to the next pod
    while the API server may still apply the first Binding: the same GPU twice.
    """

    def gpus_held(self, ext, node):
        return {g["index"]: g["memory_allocated_mib"] for n in ext.inspect()["nodes"]
                if n["name"] == node for g in n["gpus"] if g["memory_allocated_mib"]}

    def doubts(self, ext, outcome=None):
        if outcome is None:
            return ext.metric("kgpu_extender_binds_in_doubt")
        return ext.metric("kgpu_extender_bind_doubts_total", {"outcome": outcome})

    def test_bind_doubt_flag_is_checked(self):
        for bad in ("0", "3601", "ten"):
            out = subprocess.run([EXTENDER_BIN, "--bind-doubt", bad, "--cluster-file",
                                  os.path.join(SOURCE_DIR, "examples", "cluster.yaml")],
                                 capture_output=True, text=True, timeout=30)
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn("--bind-doubt '%s': 1..3600" % bad, out.stderr)

    def test_a_binding_that_lands_after_its_timeout_keeps_its_gpus(self):
        # With --leader-elect and a 5-s lease no API call may take over 1 s: a bind
        # the stand-in answers after 2.5 s times out, and the stand-in applies it then.
        s = self.start_standin()
        s.add_node("ld-v100-0", gpu_list("ld-v100-0", "V100", 16384, 1))
        e = self.start_extender_for(s, ["--leader-elect", "--lease-duration", "5"])
        a = s.add_pod(pod_object("ld-a", [container("main", share(mem=12))]))
        b = s.add_pod(pod_object("ld-b", [container("main", share(mem=12))]))
        self.assertEqual(e.filter(a, ["ld-v100-0"])["NodeNames"], ["ld-v100-0"])
        s.control(bind_delay_ms=2500)
        err = e.bind(a, "ld-v100-0")
        s.control(bind_delay_ms=0)
        self.assertIn("may still apply", err)
        self.assertEqual(self.doubts(e), 1)
        # Until the API server says, the GPU is a's: b (12 GiB of the 16) does not fit.
        self.assertEqual(self.gpus_held(e, "ld-v100-0"), {0: 12288})
        res = e.filter(b, ["ld-v100-0"])
        self.assertEqual(res["NodeNames"] or [], [], res)
        self.assertNotEqual(e.bind(b, "ld-v100-0"), "")
        # The Binding lands: the watch shows a bound with the GPUs kgpu held for it.
        wait_for(lambda: s.get_pod("default", "ld-a")["spec"].get("nodeName"), 10,
                 what="the late Binding to land")
        wait_for(lambda: self.doubts(e, "landed") == 1, 10, what="the doubt to resolve")
        self.assertEqual(self.doubts(e), 0)
        self.assertEqual(e.metric("kgpu_extender_assignment_conflicts_total"), 0)
        self.assertIsNone(s.get_pod("default", "ld-b")["spec"].get("nodeName"))
        truth = self.assert_state_matches(e, s, timeout=10.0)
        self.assertEqual(truth, {("ld-v100-0", 0): (12288, 0)})

    def test_an_answer_lost_after_the_binding_is_found_applied(self):
        s = self.start_standin()
        s.add_node("lo-t4-0", gpu_list("lo-t4-0", "T4", 15360, 2))
        e = self.start_extender_for(s)
        pod = s.add_pod(pod_object("lo-p", [container("main", share(mem=4))]))
        e.filter(pod, ["lo-t4-0"])
        s.control(bind_lost=1)  # applied, then answered 504
        # kgpu asks the API server at once: the pod is bound with kgpu's assignment.
        self.assertEqual(e.bind(pod, "lo-t4-0"), "")
        self.assertEqual(self.doubts(e, "landed"), 1)
        self.assertEqual(self.doubts(e), 0)
        got = s.get_pod("default", "lo-p")
        self.assertEqual(got["spec"]["nodeName"], "lo-t4-0")
        self.assertEqual(e.metric("kgpu_extender_bind_failures_total", {"reason": "api_error"}),
                         0)
        self.assert_state_matches(e, s)
        self.assertEqual(e.inspect()["totals"]["pods"], 1)

    def test_a_pod_in_doubt_is_retried_on_its_node_only(self):
        s = self.start_standin()
        s.add_node("rt-t4-0", gpu_list("rt-t4-0", "T4", 15360, 2))
        s.add_node("rt-t4-1", gpu_list("rt-t4-1", "T4", 15360, 2))
        e = self.start_extender_for(s, ["--bind-doubt", "60"])
        pod = s.add_pod(pod_object("rt-p", [container("main", share(mem=4))]))
        e.filter(pod, ["rt-t4-0"])
        s.control(bind_status=500, bind_count=1)
        err = e.bind(pod, "rt-t4-0")
        self.assertIn("500", err)
        self.assertIn("held on rt-t4-0", err)
        held = self.gpus_held(e, "rt-t4-0")
        self.assertEqual(list(held.values()), [4096])
        statuses = [p["status"] for n in e.inspect()["nodes"] for g in n["gpus"]
                    for p in g["pods"]]
        self.assertEqual(statuses, ["in-doubt"])
        out = subprocess.run([KGPU_BIN, "inspect", "--server", e.url, "--detail"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("default/rt-p (main): 4096 MiB, 0 milli [binding in doubt]", out.stdout)
        # kube-scheduler's retry: its node passes (the GPUs are held for it), others not.
        res = e.filter(pod, ["rt-t4-0", "rt-t4-1"])
        self.assertEqual(res["NodeNames"], ["rt-t4-0"])
        self.assertIn("may still apply", res["FailedNodes"]["rt-t4-1"])
        err = e.bind(pod, "rt-t4-1")
        self.assertIn("held on rt-t4-0", err)
        self.assertEqual(e.metric("kgpu_extender_bind_failures_total", {"reason": "in_doubt"}), 1)
        self.assertEqual(self.gpus_held(e, "rt-t4-1"), {})
        # On its node the retry binds with the very GPUs held.
        self.assertEqual(e.bind(pod, "rt-t4-0"), "")
        self.assertEqual(self.gpus_held(e, "rt-t4-0"), held)
        self.assertEqual(self.doubts(e), 0)
        self.assertEqual(self.doubts(e, "released"), 1)
        got = s.get_pod("default", "rt-p")
        self.assertEqual(got["spec"]["nodeName"], "rt-t4-0")
        self.assert_state_matches(e, s)

    def test_a_doubt_ends_with_its_pod_or_its_time(self):
        s = self.start_standin()
        s.add_node("ex-t4-0", gpu_list("ex-t4-0", "T4", 15360, 2))
        e = self.start_extender_for(s, ["--bind-doubt", "2"])
        p = s.add_pod(pod_object("ex-p", [container("main", share(mem=4))]))
        q = s.add_pod(pod_object("ex-q", [container("main", share(mem=4))]))
        for pod in (p, q):
            e.filter(pod, ["ex-t4-0"])
            s.control(bind_status=503, bind_count=1)
            self.assertIn("503", e.bind(pod, "ex-t4-0"))
        self.assertEqual(self.doubts(e), 2)
        self.assertEqual(sum(self.gpus_held(e, "ex-t4-0").values()), 8192)
        # A pod deleted: nothing of it can land any more.
        s.delete_pod("default", "ex-p")
        wait_for(lambda: self.doubts(e) == 1, 10, what="the deleted pod's doubt to end")
        self.assertEqual(sum(self.gpus_held(e, "ex-t4-0").values()), 4096)
        # The other waits out --bind-doubt: then its GPUs are free again.
        wait_for(lambda: self.doubts(e) == 0, 10, what="the doubt to expire")
        self.assertEqual(self.gpus_held(e, "ex-t4-0"), {})
        self.assertEqual(self.doubts(e, "expired"), 1)
        self.assertEqual(self.doubts(e, "released"), 1)
        self.assertIn("ex-q", e.log())
        self.assert_state_matches(e, s)
        # A refused connection sends nothing: released at once, no doubt.
        r = s.add_pod(pod_object("ex-r", [container("main", share(mem=4))]))
        e.filter(r, ["ex-t4-0"])
        s.stop()
        self.assertNotEqual(e.bind(r, "ex-t4-0", timeout=60), "")
        self.assertEqual(self.doubts(e), 0)
        self.assertEqual(e.held(), {})


class TestRestart(ExtenderTest):

    def test_sigkill_mid_stream(self):
        rng = random.Random(7)
        s = self.start_standin()
        nodes = ["r-a100-0", "r-a100-1", "r-t4-0"]
        s.add_node(nodes[0], gpu_list(nodes[0], "A100-PCIE-40GB", 40960, 4))
        s.add_node(nodes[1], gpu_list(nodes[1], "A100-PCIE-40GB", 40960, 4))
        s.add_node(nodes[2], gpu_list(nodes[2], "T4", 15360, 4))
        # Mostly small shares, so that most pods fit and binds keep going until the kill.
        def limits():
            r = rng.random()
            if r < 0.05:
                return whole(1)
            if r < 0.15:
                return share(mem=2 * rng.randint(1, 2), count=2)
            return share(mem=rng.randint(1, 4), core=rng.choice((None, 5, 10)))
        pods = [s.add_pod(pod_object("r-%03d" % i, [container("main", limits())]))
                for i in range(80)]
        first = self.start_extender_for(s, name="extender-a", check_exit=False)
        s.control(bind_delay_ms=150)  # binds are in flight when the extender dies

        queue = list(pods)
        lock = threading.Lock()
        ok, refused, cut = [], [], []
        killed = threading.Event()

        def worker():
            while not killed.is_set():
                with lock:
                    if not queue:
                        return
                    p = queue.pop()
                try:
                    _, err = first.schedule(p, nodes)
                except (OSError, http.client.HTTPException, ValueError, AssertionError):
                    cut.append(p)  # the extender died under this one
                    return
                (ok if err == "" else refused).append(p)
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        wait_for(lambda: len(ok) >= 15, 30, what="15 binds before the kill")
        killed.set()
        first.kill()
        for t in threads:
            t.join(30)
        self.assertTrue(queue, "every pod was scheduled before the kill: nothing mid-stream")
        self.assertTrue(cut, "no request was in flight at the kill")
        s.control(bind_delay_ms=0)

        # The new extender starts while binds the old one sent may still be landing.
        second = self.start_extender_for(s, name="extender-b")

        def settled():
            st = s.stats()
            return st["binds"] == st["binds_ok"] + st["binds_failed"]
        wait_for(settled, 10, what="the binds in flight at the kill to land")
        truth = self.assert_state_matches(second, s)
        self.assertTrue(truth)
        self.assertEqual(second.metric("kgpu_extender_assignment_conflicts_total"), 0)
        bound_uids = {pod_uid(p) for p in s.pods() if p["spec"].get("nodeName")}
        for p in ok:
            self.assertIn(pod_uid(p), bound_uids, "a bind answered success was lost")
        self.assertEqual(second.inspect()["totals"]["pods"], len(bound_uids))

        # The new extender carries on: every pod still pending is scheduled, or refused.
        for p in pods:
            cur = s.get_pod(*pod_key(p))
            if cur["spec"].get("nodeName"):
                continue
            second.schedule(cur, nodes)
        self.assert_state_matches(second, s)
        # The pods cut mid-bind that did land carry their assignment.
        landed = 0
        for p in cut:
            cur = s.get_pod(*pod_key(p))
            if cur["spec"].get("nodeName"):
                landed += 1
                self.assertEqual(cur["metadata"]["annotations"]["kgpu.io/node"],
                                 cur["spec"]["nodeName"])
        sys.stderr.write("\n  [restart: %d bound before the kill, %d cut mid-request, %d of "
                         "them landed] " % (len(ok), len(cut), landed))


# ---------------------------------------------------------------------------
# 3b. Pods awaiting kubelet's Allocate
# ---------------------------------------------------------------------------

def rfc3339(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".000000000Z"


class TestAwaitingAllocation(ExtenderTest):
    """kubelet's Allocate names no pod: the device plugin tells pods apart by their asks.

    So while a bound pod awaits allocation on a node, no pod asking the same amount of a
    device-plugin resource may be filtered to or bound on that node.
    """

    def setUp(self):
        super().setUp()
        s = self.standin = self.start_standin()
        s.add_node("aw-0", gpu_list("aw-0", A100, 81920, 2))
        s.add_node("aw-1", gpu_list("aw-1", A100, 81920, 2))
        now = time.time()
        # Bound by an earlier extender run: awaiting while its bind time is recent.
        for name, mem, when in (("early", 6, now - 5), ("stale", 5, now - 3600)):
            ann = {"kgpu.io/assignment": assignment_annotation(
                       [("main", False, [(0, "GPU-aw-1-0", 0, mem * 1024)])]),
                   "kgpu.io/node": "aw-1", "kgpu.io/bind-time": rfc3339(when)}
            s.add_pod(pod_object(name, [container("main", share(mem=mem))], ann,
                                 node_name="aw-1"))

    def start(self, wait=120):
        self.ext = self.start_extender_for(self.standin, ["--allocate-wait", str(wait)])
        return self.ext

    def new_pod(self, name, limits, init=None):
        p = pod_object(name, [container("main", limits)])
        if init is not None:
            p["spec"]["initContainers"] = [container("setup", init)]
        return self.standin.add_pod(p)

    def verdicts(self, pod, names=("aw-0", "aw-1")):
        """{node: True (fits) or the FailedNodes reason}; unresolvable is a test failure."""
        res = self.ext.filter(pod, list(names))
        self.assertEqual(res["FailedAndUnresolvableNodes"], {}, res)
        out = {n: True for n in res["NodeNames"] or []}
        out.update(res["FailedNodes"])
        return out

    def test_same_size_waits_for_allocation(self):
        ext = self.start()
        a = self.new_pod("a", share(mem=4))
        self.assertEqual(ext.filter(a, ["aw-0"])["NodeNames"], ["aw-0"])
        self.assertEqual(ext.bind(a, "aw-0"), "")

        b = self.new_pod("b", share(mem=4))
        v = self.verdicts(b)
        self.assertEqual(v["aw-1"], True, "another node is not affected")
        self.assertEqual(v["aw-0"], "waiting for kubelet to allocate default/a "
                                    "(same kgpu.io/gpu-mem: 4); retry shortly")
        # Other sizes are not affected, nor pods without GPUs.
        self.assertEqual(self.verdicts(self.new_pod("c", share(mem=2)))["aw-0"], True)
        self.assertEqual(self.verdicts(self.new_pod("cpu", {}))["aw-0"], True)
        # The gpushare alias asks the same units; gpu-core is another resource.
        self.assertIn("default/a",
                      str(self.verdicts(self.new_pod("alias", share(mem=4, alias=True)))["aw-0"]))
        self.assertEqual(self.verdicts(self.new_pod("core", share(core=4)))["aw-0"], True)
        # An init container asks kubelet for devices too, even one its app container covers.
        init = self.new_pod("init", share(mem=8), init=share(mem=4))
        self.assertIn("(same kgpu.io/gpu-mem: 4)", str(self.verdicts(init)["aw-0"]))

        # Bound by an earlier run: "early" (bound 5 s ago) awaits, "stale" (an hour) does not.
        v = self.verdicts(self.new_pod("six", share(mem=6)))
        self.assertIn("default/early (same kgpu.io/gpu-mem: 6)", str(v["aw-1"]))
        self.assertEqual(v["aw-0"], True)
        self.assertEqual(self.verdicts(self.new_pod("five", share(mem=5)))["aw-1"], True)

        # A bind that skips filter is refused too, and holds nothing.
        err = ext.bind(b, "aw-0")
        self.assertIn("waiting for kubelet to allocate default/a", err)
        self.assertEqual(ext.metric("kgpu_extender_bind_failures_total",
                                    {"reason": "awaiting_allocation"}), 1)
        self.assertIsNone(self.standin.get_pod("default", "b")["spec"].get("nodeName"))
        self.assertEqual(ext.metric("kgpu_pods_awaiting_allocation"), 2)
        node = [n for n in ext.inspect()["nodes"] if n["name"] == "aw-0"][0]
        self.assertEqual([(w["pod"], w["asks"]) for w in node["awaiting_allocation"]],
                         [("a", [{"resource": "kgpu.io/gpu-mem", "amount": 4}])])
        out = subprocess.run([KGPU_BIN, "inspect", "aw-0", "--server", ext.url],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout, r"awaiting kubelet: default/a \(kgpu.io/gpu-mem 4\), "
                                     r"\d+ s before it stops blocking")

        # The device plugin marks "a" allocated (a MODIFIED event): b may come.
        self.standin.patch_pod("default", "a", {"metadata": {"annotations": {
            "kgpu.io/allocated": rfc3339(time.time())}}})
        wait_for(lambda: self.verdicts(b)["aw-0"] is True, 5, what="b accepted on aw-0")
        self.assertEqual(ext.bind(b, "aw-0"), "")
        # Deleting a pod ends its wait as well.
        self.assertIn("default/b", str(self.verdicts(self.new_pod("b2", share(mem=4)))["aw-0"]))
        self.standin.delete_pod("default", "b")
        wait_for(lambda: self.verdicts(self.new_pod("b3", share(mem=4)))["aw-0"] is True, 5,
                 what="b's wait to end with its deletion")
        self.assert_state_matches(ext, self.standin)

    def test_concurrent_same_size_binds(self):
        ext = self.start()
        pods = [self.new_pod("r%d" % i, share(mem=4, core=10)) for i in range(2)]
        for p in pods:  # filter passes both: neither is bound yet
            self.assertEqual(ext.filter(p, ["aw-0"])["NodeNames"], ["aw-0"])
        self.standin.control(bind_delay_ms=300)
        results = {}
        threads = [threading.Thread(target=lambda p=p: results.__setitem__(
                       p["metadata"]["name"], ext.bind(p, "aw-0", timeout=30))) for p in pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.standin.control(bind_delay_ms=0)
        self.assertEqual(sorted(results.values()).count(""), 1, results)
        loser = [n for n, e in results.items() if e][0]
        self.assertIn("waiting for kubelet to allocate default/", results[loser])
        self.assertEqual(self.standin.stats()["binds"], 1)
        self.assert_state_matches(ext, self.standin)

    def test_wait_expires(self):
        ext = self.start(wait=1)
        a = self.new_pod("a", share(mem=4))
        self.assertEqual(ext.bind(a, "aw-0"), "")
        b = self.new_pod("b", share(mem=4))
        self.assertIn("default/a", str(self.verdicts(b)["aw-0"]))
        # With a 1-s wait, "early" (bound 5 s ago) no longer counts either.
        self.assertEqual(self.verdicts(self.new_pod("six", share(mem=6)))["aw-1"], True)
        time.sleep(1.1)
        self.assertEqual(self.verdicts(b)["aw-0"], True)
        self.assertEqual(ext.bind(b, "aw-0"), "")
        self.assertEqual(ext.log().count("kubelet has not asked for its devices"), 1, "warn once")
        self.assertIn("default/a on aw-0", ext.log())

    def test_allocate_wait_setting(self):
        config = os.path.join(self.tmp, "config.yaml")
        for value, ok in (("0", True), ("300", True), ("-1", False), ("1.5", False)):
            with open(config, "w") as f:
                f.write("clusterFile: %s\nallocateWaitSeconds: %s\n" % (CLUSTER_YAML, value))
            out = subprocess.run([EXTENDER_BIN, "--config", config, "--version"],
                                 capture_output=True, text=True, timeout=30)
            self.assertEqual(out.returncode, 0 if ok else 2, (value, out.stderr))
            if not ok:
                self.assertIn("allocateWaitSeconds: wrong type or out of range", out.stderr)
        for value in ("-1", "x", "86401"):
            out = subprocess.run([EXTENDER_BIN, "--allocate-wait", value], capture_output=True,
                                 text=True, timeout=30)
            self.assertEqual(out.returncode, 2, value)
            self.assertIn("--allocate-wait", out.stderr)
        out = subprocess.run([EXTENDER_BIN, "--help"], capture_output=True, text=True, timeout=30)
        self.assertIn("--allocate-wait S", out.stdout)


# ---------------------------------------------------------------------------
# 4. Stress
# ---------------------------------------------------------------------------

class TestStress(ExtenderTest):

    THREADS = 8
    SEQUENCES = 3200  # filter + bind sequences in all
    # Watch cuts and expiries during the run, so relists race binds and pod deletions
    # (test_relist_racing_a_bind is the focused version).
    WATCH_CHAOS = True

    def test_concurrent_filter_and_bind(self):
        s = self.start_standin(history=5000)
        nodes = ["s-a100-0", "s-a100-1", "s-t4-0", "s-t4-1"]
        s.add_node(nodes[0], gpu_list(nodes[0], "A100-PCIE-40GB", 40960, 4))
        s.add_node(nodes[1], gpu_list(nodes[1], "A100-PCIE-40GB", 40960, 4))
        s.add_node(nodes[2], gpu_list(nodes[2], "T4", 15360, 4))
        s.add_node(nodes[3], gpu_list(nodes[3], "T4", 15360, 4))
        s.add_node("s-cpu-0")
        # Injected 5xx leave binds in doubt (TestBindInDoubt): a short --bind-doubt lets
        # those of pods never retried end before the final comparison.
        ext = self.start_extender_for(s, ["--bind-doubt", "3"])
        candidates = nodes + ["s-cpu-0"]

        lock = threading.Lock()
        counts = {"sequences": 0, "binds": 0, "bind_ok": 0, "bind_failed": 0,
                  "filtered_out": 0, "deleted": 0}
        bound_to = {}  # uid -> node, from binds that answered success
        errors = []
        per_thread = self.SEQUENCES // self.THREADS

        def worker(seed):
            rng = random.Random(seed)
            pending, mine = [], []
            try:
                for i in range(per_thread):
                    if len(pending) < 3 or rng.random() < 0.3:
                        ann = {"kgpu.io/gpu-type": "T4"} if rng.random() < 0.1 else None
                        if rng.random() < 0.1:
                            ann = dict(ann or {}, **{"kgpu.io/policy":
                                                     rng.choice(("spread", "binpack"))})
                        pod = s.add_pod(pod_object(
                            "st-%d-%d" % (seed, i),
                            [container("main", random_limits(rng, max_whole=3, mem_max=12))],
                            ann))
                    else:
                        pod = pending.pop(rng.randrange(len(pending)))
                    res = ext.filter(pod, candidates)
                    fits = res["NodeNames"] or []
                    if fits and rng.random() < 0.8:
                        if rng.random() < 0.3:
                            scores = ext.prioritize(pod, fits)
                            node = max(scores, key=lambda x: x["Score"])["Host"]
                        else:
                            node = rng.choice(fits)
                    else:
                        node = rng.choice(nodes)  # a bind that may well not fit
                        if not fits:
                            with lock:
                                counts["filtered_out"] += 1
                    err = ext.bind(pod, node)
                    with lock:
                        counts["sequences"] += 1
                        counts["binds"] += 1
                        counts["bind_ok" if err == "" else "bind_failed"] += 1
                        if err == "":
                            bound_to[pod_uid(pod)] = node
                    if err == "":
                        mine.append(pod)
                    elif rng.random() < 0.2:
                        s.delete_pod(*pod_key(pod))
                    else:
                        pending.append(pod)
                    # Churn: pods end, their GPUs come back (through the watch).
                    if mine and rng.random() < 0.35:
                        gone = mine.pop(rng.randrange(len(mine)))
                        s.delete_pod(*pod_key(gone))
                        with lock:
                            counts["deleted"] += 1
            except Exception as e:  # reported by the main thread
                errors.append("worker %d: %r" % (seed, e))

        # Meanwhile the API server refuses a bind here and there, and (WATCH_CHAOS) cuts and
        # expires the watches now and then, each one a relist racing the binds.
        done = threading.Event()
        chaos_rng = random.Random(99)

        def chaos():
            while not done.wait(chaos_rng.uniform(0.5, 1.5)):
                try:
                    knob = chaos_rng.choice(("drop_watches", "expire_watches", "bind_status",
                                             "bind_lost", "bind_late")
                                            if self.WATCH_CHAOS else ("bind_status",))
                    if knob == "bind_status":
                        s.control(bind_status=chaos_rng.choice((500, 409, 403)), bind_count=2)
                    elif knob in ("bind_lost", "bind_late"):
                        # Answers lost: applied before the 504, or after it (a timeout
                        # whose Binding lands later: what releasing at once overbooked).
                        s.control(**{knob: 2})
                    else:
                        s.control(**{knob: True})
                    with lock:
                        counts["chaos"] = counts.get("chaos", 0) + 1
                except Exception as e:
                    errors.append("chaos: %r" % e)

        t0 = time.monotonic()
        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(self.THREADS)]
        chaos_thread = threading.Thread(target=chaos)
        for t in threads + [chaos_thread]:
            t.start()
        for t in threads:
            t.join(300)
        done.set()
        chaos_thread.join(10)
        s.control(bind_status=0, bind_count=0)
        elapsed = time.monotonic() - t0
        sys.stderr.write("\n  [stress: %s in %.1f s] " % (counts, elapsed))
        self.assertEqual(errors, [])
        self.assertEqual(counts["sequences"], per_thread * self.THREADS)
        self.assertGreaterEqual(counts["sequences"], 2000)
        self.assertGreater(counts["bind_ok"], 300, counts)
        self.assertGreater(counts["bind_failed"], 200, counts)

        self.assert_state_matches(ext, s, timeout=10)
        # Success answers and the stand-in agree pod by pod, but for Bindings that were
        # applied after their 504 (kgpu answered failure and kept their GPUs: in doubt).
        late = set(s.stats()["late_applied"])
        for p in s.pods():
            node = p["spec"].get("nodeName")
            uid = pod_uid(p)
            if node and uid not in bound_to and "default/" + p["metadata"]["name"] in late:
                self.assertEqual(p["metadata"]["annotations"]["kgpu.io/node"], node)
            elif node:
                self.assertEqual(bound_to.get(uid), node, p["metadata"]["name"])
                self.assertEqual(p["metadata"]["annotations"]["kgpu.io/node"], node)
            else:
                self.assertNotIn(uid, bound_to, p["metadata"]["name"])
        doc = ext.inspect()
        self.assertEqual(doc["totals"]["pods"],
                         len([p for p in s.pods() if p["spec"].get("nodeName")]))
        text = ext.metrics()
        self.assertEqual(ext.metric("kgpu_extender_requests_total", {"verb": "bind"}, text),
                         counts["binds"])
        failures = sum(ext.metric("kgpu_extender_bind_failures_total", {"reason": r}, text)
                       for r in ("bad_request", "unknown_pod", "unknown_node", "no_fit",
                                 "api_conflict", "api_error", "api_unreachable", "in_doubt",
                                 "awaiting_allocation"))
        self.assertEqual(failures, counts["bind_failed"])
        sys.stderr.write("[binds in doubt: %s] " % {
            o: ext.metric("kgpu_extender_bind_doubts_total", {"outcome": o}, text)
            for o in ("landed", "released", "expired")})
        conflicts = ext.metric("kgpu_extender_assignment_conflicts_total", None, text)
        if conflicts:  # what the extender said about them, to tell a race from a test bug
            # The lines that count a conflict first (refused binds make many other warnings).
            lines = ext.log().splitlines()
            said = [line for line in lines if "cannot be counted now" in line or
                    "malformed kgpu.io/" in line]
            said += [line for line in lines if " ERROR " in line or " WARN " in line][-40:]
            self.fail("%d assignment conflicts; what the extender said of them, then its last "
                      "errors and warnings:\n%s" % (conflicts, "\n".join(said)))
        self.assertEqual(ext.metric("kgpu_extender_pods", None, text), doc["totals"]["pods"])


# ---------------------------------------------------------------------------
# 5. Bad input
# ---------------------------------------------------------------------------

class TestBadInput(ExtenderTest):

    def setUp(self):
        super().setUp()
        s = self.standin = self.start_standin()
        s.add_node("t4-0", gpu_list("t4-0", "T4", 15360, 2))
        self.ext = self.start_extender_for(s, ["--max-body-bytes", "65536"])
        self.pod = s.add_pod(pod_object("p", [container("main", share(mem=4))]))

    def args(self, pod=None, names=("t4-0",)):
        return {"Pod": pod if pod is not None else self.pod, "Nodes": None,
                "NodeNames": list(names)}

    def pod_with(self, limits, annotations=None):
        p = json.loads(json.dumps(self.pod))
        p["spec"]["containers"][0]["resources"]["limits"] = {k: str(v) for k, v in limits.items()}
        if annotations:
            p["metadata"]["annotations"] = annotations
        return p

    def expect(self, verb, body, status, mention=None, path=None):
        """POSTs body; expects status and a JSON body whose Error names the problem."""
        got, headers, data = http_request(self.ext.port, "POST", path or "/" + verb, body)
        self.assertEqual(got, status, "%s %r... answered %d: %r" % (verb, str(body)[:80], got,
                                                                     data[:300]))
        self.assertTrue(headers.get("content-type", "").startswith("application/json"), headers)
        obj = json.loads(data)
        self.assertIsInstance(obj.get("Error"), str)
        self.assertTrue(obj["Error"], obj)
        if mention:
            self.assertIn(mention, obj["Error"])
        self.assertEqual(self.ext.get("/healthz"), (200, "ok\n"))
        return obj

    def expect_invalid(self, pod, mention, names=("t4-0", "ghost-0")):
        """A pod kgpu cannot honour: HTTP 200 from every verb, the reason on every node.

        kube-scheduler's extender client drops the body of any other answer, so the reason
        would never reach the pod's events (docs/install-extender.md, Troubleshooting).
        """
        res = self.ext.filter(pod, names)  # fails unless 200
        self.assertEqual((res["NodeNames"], res["FailedNodes"], res["Error"]), ([], {}, ""))
        self.assertEqual(sorted(res["FailedAndUnresolvableNodes"]), sorted(names))
        for why in res["FailedAndUnresolvableNodes"].values():
            self.assertTrue(why.startswith("kgpu: "), why)
            self.assertIn(mention, why)
        res = self.ext.filter(pod, nodes=[node_object("t4-0", gpu_list("t4-0", "T4", 15360, 2))])
        self.assertEqual(res["Nodes"]["items"], [])
        self.assertIn(mention, res["FailedAndUnresolvableNodes"]["t4-0"])
        self.assertEqual(self.ext.prioritize(pod, names),
                         [{"Host": n, "Score": 0} for n in names])
        res = self.ext.preempt(pod, {"t4-0": [pod_uid(self.pod)]})
        self.assertEqual(res["NodeNameToMetaVictims"], {})
        self.assertEqual(self.ext.get("/healthz"), (200, "ok\n"))

    def test_malformed_json(self):
        for verb in ("filter", "prioritize", "bind", "preempt"):
            self.expect(verb, "{", 400, "malformed JSON")
            self.expect(verb, "", 400)
            self.expect(verb, "[]", 400, "not a JSON object")
            self.expect(verb, "null", 400)
            self.expect(verb, '{"Pod": {}} trailing', 400)
            self.expect(verb, b'{"Pod": "\xff\xfe"}', 400)
        # Duplicate keys are refused rather than one silently winning.
        self.expect("filter", '{"Pod": {}, "Pod": {}, "NodeNames": []}', 400)
        body = json.dumps(self.args())
        self.expect("filter", body[:-1] + ', "NodeNames": ["t4-0"]}', 400)
        self.assertEqual(self.ext.metric("kgpu_extender_bad_requests_total", {"verb": "filter"}),
                         8)

    def test_node_names_scanner_agrees_with_json(self):
        # NodeNames is read by a hand-written scanner; it must accept exactly what JSON does.
        ok = '{"Pod": %s, "Nodes": null, "NodeNames": %s}'
        pod = json.dumps(self.pod)
        for names in ('["t4-0"]', '[ "t4-0" , "x" ]', '["t4\\u002d0"]', '[]', '[ ]',
                      '["\\"quoted\\""]', '["t4-0", "\u00e9t\u00e9"]'):
            status, _, data = self.ext.post("filter", ok % (pod, names))
            self.assertEqual(status, 200, (names, data))
            res = json.loads(data)
            self.assertEqual(sorted(res["NodeNames"] + list(res["FailedNodes"])
                                    + list(res["FailedAndUnresolvableNodes"])),
                             sorted(json.loads(names)), names)
            status, _, data = self.ext.post("prioritize", ok % (pod, names))
            self.assertEqual(status, 200, (names, data))
            self.assertEqual([r["Host"] for r in full_scores(json.loads(data), json.loads(names))],
                             json.loads(names))
        for names in ('["t4-0" "x"]', '[,"t4-0"]', '["t4-0"', '[1]',
                      '["a", null]', '"t4-0"', '{"a": 1}', '["t4-0"]]'):
            for verb in ("filter", "prioritize"):
                self.expect(verb, ok % (pod, names), 400)

    def test_node_names_invalid_utf8(self):
        body = ('{"Pod": %s, "Nodes": null, "NodeNames": ["t4-0", "bad\xff"]}'
                % json.dumps(self.pod)).encode("latin-1")
        status, _, data = self.ext.post("filter", body)
        self.assertEqual(status, 400, data[:300])

    def test_node_names_trailing_comma(self):
        body = '{"Pod": %s, "Nodes": null, "NodeNames": ["t4-0",]}' % json.dumps(self.pod)
        status, _, data = self.ext.post("filter", body)
        self.assertEqual(status, 400, data[:300])

    def test_wrong_types(self):
        self.expect("filter", self.args(pod="a pod"), 400, "Pod")
        self.expect("filter", {"Nodes": None, "NodeNames": ["t4-0"]}, 400, "Pod")
        self.expect("filter", {"Pod": self.pod, "NodeNames": [1]}, 400, "NodeNames[0]")
        self.expect("filter", {"Pod": self.pod, "NodeNames": ["t4-0", 2]}, 400, "NodeNames[1]")
        self.expect("filter", {"Pod": self.pod, "NodeNames": "t4-0"}, 400, "NodeNames")
        self.expect("prioritize", {"Pod": self.pod, "NodeNames": [True]}, 400, "NodeNames")
        self.expect("filter", {"Pod": self.pod, "Nodes": {"items": "x"}, "NodeNames": None},
                    400, "items")
        self.expect("filter", {"Pod": self.pod, "Nodes": {"items": [{"metadata": {}}]},
                               "NodeNames": None}, 400, "metadata.name")
        self.expect("preempt", {"Pod": self.pod, "NodeNameToVictims": "x"}, 400)
        self.expect("preempt", {"Pod": 7, "NodeNameToMetaVictims": {}}, 400, "Pod")
        # A Pod object kgpu cannot read is a pod kgpu cannot honour: 200, with the reason.
        p = json.loads(json.dumps(self.pod))
        p["spec"]["containers"] = "main"
        self.expect_invalid(p, "containers")
        p = json.loads(json.dumps(self.pod))
        p["metadata"] = []
        self.expect_invalid(p, "metadata")

    def test_bad_gpu_requests(self):
        cases = [
            ({"kgpu.io/gpu-foo": 1}, "unknown resource kgpu.io/gpu-foo"),
            ({"kgpu.io/gpu-core": 150}, "kgpu.io/gpu-core 150 outside 1..100"),
            ({"kgpu.io/gpu-mem": "abc"}, "kgpu.io/gpu-mem"),
            ({"kgpu.io/gpu-mem": "1.5"}, "not a whole number"),
            ({"kgpu.io/gpu-mem": -4}, "kgpu.io/gpu-mem"),
            ({"nvidia.com/gpu": 1, "kgpu.io/gpu-mem": 4}, "cannot be combined"),
            ({"nvidia.com/gpu": 33}, "outside 1..32"),
            ({"kgpu.io/gpu-count": 2}, "without"),
            ({"kgpu.io/gpu-mem": 1, "kgpu.io/gpu-count": 3}, "divide evenly"),
            ({"nvidia.com/gpu": -1}, "negative"),
            ({"kgpu.io/gpu-mem": 4, "aliyun.com/gpu-mem": 5}, "differ"),
            ({"kgpu.io/gpu-mem": "99999999999999999999"}, "kgpu.io/gpu-mem"),
        ]
        for limits, mention in cases:
            self.expect_invalid(self.pod_with(limits), mention)
        self.expect_invalid(self.pod_with(share(mem=4), {"kgpu.io/gpu-type": 5}),
                            "kgpu.io/gpu-type")
        self.expect_invalid(self.pod_with(share(mem=4), {"kgpu.io/policy": "nope"}),
                            "unknown policy 'nope' (annotation kgpu.io/policy)")
        # Bind fetches such a pod from the API server (filter remembered none): Error in a 200.
        bad = self.standin.add_pod(pod_object("bad", [container("main",
                                                                {"kgpu.io/gpu-core": 150})]))
        err = self.ext.bind(bad, "t4-0")
        self.assertIn("kgpu: container main: kgpu.io/gpu-core 150 outside 1..100", err)
        self.assertEqual(self.ext.metric("kgpu_extender_bind_failures_total",
                                         {"reason": "bad_request"}), 1)
        # Counted as invalid pods, not as malformed requests.
        n = len(cases) + 2
        for verb, count in (("filter", 2 * n), ("prioritize", n), ("preempt", n), ("bind", 1)):
            self.assertEqual(self.ext.metric("kgpu_extender_invalid_pods_total", {"verb": verb}),
                             count, verb)
            self.assertEqual(self.ext.metric("kgpu_extender_bad_requests_total", {"verb": verb}),
                             0, verb)
        # Nothing was reserved by any of it.
        self.assertEqual(self.ext.held(), {})

    def test_bind_bad_fields(self):
        good = {"PodName": "p", "PodNamespace": "default", "PodUID": pod_uid(self.pod),
                "Node": "t4-0"}
        for drop in good:
            body = {k: v for k, v in good.items() if k != drop}
            self.expect("bind", body, 400, "PodName, PodNamespace, PodUID and")
        self.expect("bind", dict(good, PodUID=5), 400)
        self.expect("bind", dict(good, Node=""), 400)
        self.expect("bind", dict(good, PodName="x" * 300), 400)
        self.expect("bind", dict(good, PodUID="u" * 100), 400)
        self.assertEqual(self.ext.metric("kgpu_extender_bind_failures_total",
                                         {"reason": "bad_request"}), 8)
        # Well-formed but wrong: a pod the API server does not have, a node kgpu does not know.
        err = self.ext.bind(dict(self.pod, metadata=dict(self.pod["metadata"], name="nope",
                                                         uid="no-such-uid")), "t4-0")
        self.assertIn("unknown to kgpu", err)
        self.ext.filter(self.pod, ["t4-0"])
        self.assertIn("no GPU inventory", self.ext.bind(self.pod, "ghost-0"))
        self.assertEqual(self.ext.held(), {})
        # And a good one still works.
        self.assertEqual(self.ext.bind(self.pod, "t4-0"), "")

    def test_limits_and_routing(self):
        # A body over --max-body-bytes: 413, whatever its content.
        big = self.args()
        big["Pod"]["metadata"]["annotations"] = {"padding": "x" * 100000}
        self.expect("filter", big, 413, "65536")
        # Just under it is fine.
        fits = self.args()
        fits["Pod"]["metadata"]["annotations"] = {"padding": "x" * 60000}
        status, _, _ = self.ext.post("filter", fits)
        self.assertEqual(status, 200)
        # 1000 levels deep.
        deep = '{"Pod": %s, "NodeNames": ["t4-0"], "x": %s%s}' % (
            json.dumps(self.pod), "[" * 1000, "]" * 1000)
        self.expect("filter", deep, 400, "nested deeper")
        self.expect("filter", "[" * 5000, 400)
        self.expect("bind", "{" * 3000, 400)
        # Unknown verbs, methods and paths.
        self.expect("frobnicate", self.args(), 404)
        self.expect("filter", self.args(), 404, path="/filter/more/frob")
        status, _, _ = http_request(self.ext.port, "PUT", "/filter", self.args())
        self.assertEqual(status, 405)
        status, _, _ = http_request(self.ext.port, "DELETE", "/inspect")
        self.assertEqual(status, 405)
        self.assertEqual(self.ext.get("/no-such-page")[0], 404)
        self.assertEqual(self.ext.get("/healthz"), (200, "ok\n"))
        status, text = self.ext.get("/version")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(text)["component"], "kgpu-extender")
        # Any urlPrefix works: the verb is the last path segment.
        status, _, data = self.ext.post("scheduler/ext/filter", self.args())
        self.assertEqual(status, 200, data)

    def test_half_requests_and_garbage(self):
        # A client that sends half a body and hangs up, and one that speaks no HTTP.
        for payload in (b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"Po",
                        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,
                        b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", self.ext.port), timeout=5) as c:
                try:
                    c.sendall(payload)
                    c.shutdown(socket.SHUT_WR)
                    c.recv(4096)
                except OSError:
                    pass
            self.assertEqual(self.ext.get("/healthz"), (200, "ok\n"))
        # Many clients at once, all answered.
        results = []

        def one():
            results.append(self.ext.post("filter", self.args())[0])
        threads = [threading.Thread(target=one) for _ in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual(results, [200] * 64)


# ---------------------------------------------------------------------------
# 6. Metrics
# ---------------------------------------------------------------------------

class TestMetrics(ExtenderTest):

    def setUp(self):
        super().setUp()
        s = self.standin = self.start_standin()
        s.add_node("m-a100-0", gpu_list("m-a100-0", A100, 81920, 2))
        s.add_node("m-t4-0", gpu_list("m-t4-0", "T4", 15360, 2))
        self.ext = self.start_extender_for(s)
        # Some traffic of every kind, GPUs held in one namespace.
        p = s.add_pod(pod_object("gpu-user", [container("main", share(mem=8, core=50))]),
                      "ml-team")
        self.assertEqual(self.ext.schedule(p, ["m-a100-0", "m-t4-0"])[1], "")
        self.held_node = s.get_pod("ml-team", "gpu-user")["spec"]["nodeName"]
        self.held_gpu = self.parse_assignment(s.get_pod("ml-team", "gpu-user"))[0]["gpus"][0]
        q = s.add_pod(pod_object("nope", [container("main", share(mem=100))]))
        self.ext.filter(q, ["m-t4-0"])
        self.assertNotEqual(self.ext.bind(q, "m-t4-0"), "")
        self.ext.post("filter", "{")
        self.ext.preempt(p, {"m-t4-0": []})

    def test_metrics_content(self):
        text = self.ext.metrics()
        m = self.ext.metric
        self.assertEqual(m("kgpu_extender_requests_total", {"verb": "filter"}, text), 3)
        self.assertEqual(m("kgpu_extender_requests_total", {"verb": "bind"}, text), 2)
        self.assertEqual(m("kgpu_extender_requests_total", {"verb": "preempt"}, text), 1)
        self.assertEqual(m("kgpu_extender_bad_requests_total", {"verb": "filter"}, text), 1)
        self.assertEqual(m("kgpu_extender_bind_failures_total", {"reason": "no_fit"}, text), 1)
        self.assertEqual(m("kgpu_extender_request_duration_seconds_count", {"verb": "bind"},
                           text), 2)
        self.assertEqual(m("kgpu_extender_request_duration_seconds_bucket",
                           {"verb": "bind", "le": "+Inf"}, text), 2)
        labels = {"node": self.held_node, "gpu": str(self.held_gpu["index"]),
                  "uuid": self.held_gpu["uuid"]}
        self.assertEqual(m("kgpu_gpu_memory_allocated_mib", labels, text), 8192)
        self.assertEqual(m("kgpu_gpu_compute_allocated_milli", labels, text), 500)
        self.assertEqual(m("kgpu_gpu_pods", labels, text), 1)
        self.assertEqual(m("kgpu_gpu_memory_capacity_mib", {"node": "m-t4-0", "gpu": "1"}, text),
                         15360)
        self.assertEqual(m("kgpu_extender_ready", None, text), 1)
        self.assertEqual(m("kgpu_extender_pods", None, text), 1)
        self.assertIsNotNone(m("kgpu_namespace_gpu_seconds_total", {"namespace": "ml-team"}, text))
        self.assertEqual(m("kgpu_namespace_gpus_allocated", {"namespace": "ml-team"}, text), 0.5)
        time.sleep(0.3)
        h1 = m("kgpu_namespace_gpu_seconds_total", {"namespace": "ml-team"})
        self.assertGreater(h1, 0)
        time.sleep(0.3)
        self.assertGreater(m("kgpu_namespace_gpu_seconds_total", {"namespace": "ml-team"}), h1)

    def promtool(self):
        promtool = shutil.which("promtool") or "/usr/bin/promtool"
        if not os.access(promtool, os.X_OK):
            self.skipTest("promtool not installed (looked on PATH and at /usr/bin/promtool)")
        out = subprocess.run([promtool, "check", "metrics"], input=self.ext.metrics(),
                             capture_output=True, text=True, timeout=60)
        return out.returncode, out.stdout + out.stderr

    def test_promtool_parses_metrics(self):
        # promtool exits 1 when the exposition cannot be parsed, 3 for lint problems only.
        rc, text = self.promtool()
        self.assertIn(rc, (0, 3), "promtool check metrics:\n" + text)
        lint = [line for line in text.splitlines() if line.strip()]
        self.assertEqual(lint, [], "promtool check metrics:\n" + text)

    def test_promtool_check_metrics(self):
        rc, text = self.promtool()
        self.assertEqual(rc, 0, "promtool check metrics:\n" + text)

    def test_prometheus_scrapes(self):
        prometheus = shutil.which("prometheus") or "/usr/bin/prometheus"
        if not os.access(prometheus, os.X_OK):
            self.skipTest("prometheus not installed (looked on PATH and at /usr/bin/prometheus)")
        port = free_port()
        config = os.path.join(self.tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n- job_name: kgpu-extender\n  static_configs:\n"
                    "  - targets: ['127.0.0.1:%d']\n" % self.ext.port)
        prom = Child([prometheus, "--config.file=" + config,
                      "--storage.tsdb.path=" + os.path.join(self.tmp, "tsdb"),
                      "--web.listen-address=127.0.0.1:%d" % port],
                     os.path.join(self.tmp, "prometheus.log"))
        self.addCleanup(prom.stop)

        def query(q):
            if not prom.alive():
                raise AssertionError("prometheus exited:\n" + prom.log_tail())
            try:
                status, _, data = http_request(
                    port, "GET", "/api/v1/query?query=" + urllib.parse.quote(q), timeout=5)
            except OSError:
                return None
            if status != 200:
                return None
            return json.loads(data)["data"]["result"] or None

        res = wait_for(lambda: query("kgpu_extender_requests_total"), 20, interval=0.25,
                       what="prometheus to scrape kgpu_extender_requests_total (log:\n%s)"
                       % prom.log_tail())
        verbs = {r["metric"]["verb"]: float(r["value"][1]) for r in res}
        self.assertEqual(set(verbs), {"filter", "prioritize", "bind", "preempt",
                                      "prioritize-gpuless", "filter-gpuless"})
        self.assertGreaterEqual(verbs["bind"], 2)
        up = query('up{job="kgpu-extender"}')
        self.assertEqual(float(up[0]["value"][1]), 1.0)
        res = query('kgpu_gpu_memory_allocated_mib{node="%s",gpu="%d"}'
                    % (self.held_node, self.held_gpu["index"]))
        self.assertEqual(len(res), 1)
        labels = res[0]["metric"]
        self.assertEqual(labels["uuid"], self.held_gpu["uuid"])
        self.assertEqual(labels["model"], A100 if self.held_node == "m-a100-0" else "T4")
        self.assertEqual(float(res[0]["value"][1]), 8192)
        self.assertEqual(len(query("kgpu_gpu_memory_capacity_mib")), 4)
        res = wait_for(lambda: query('kgpu_namespace_gpu_seconds_total{namespace="ml-team"} > 0'),
                       10, interval=0.25, what="GPU-hours of ml-team")
        self.assertGreater(float(res[0]["value"][1]), 0)


# ---------------------------------------------------------------------------
# 7. Cluster file
# ---------------------------------------------------------------------------

class TestCostMetrics(ExtenderTest):
    """GPU-seconds and their cost by namespace, queue, GPU model and capacity type (--prices)."""

    # Prices large enough that a second of GPU time is a visible amount of money.
    PRICES = ("prices:\n  currency: EUR\n  gpu:\n"
              "    T4: {onDemand: 7200, spot: 3600}\n"
              "    %s: {onDemand: 36000, spot: 18000}\n" % A100)

    def setUp(self):
        super().setUp()
        s = self.standin = self.start_standin()
        s.add_node("c-spot", gpu_list("c-spot", "T4", 15360, 2),
                   labels={"karpenter.sh/capacity-type": "spot"})
        s.add_node("c-od", gpu_list("c-od", A100, 81920, 2))
        s.add_node("c-unpriced", gpu_list("c-unpriced", V100, 32768, 1))
        self.prices = os.path.join(self.tmp, "prices.yaml")
        with open(self.prices, "w") as f:
            f.write(self.PRICES)
        self.ext = self.start_extender_for(s, ["--prices", self.prices])
        # One pod per node; team-a's first pod names a queue no tree defines.
        a = pod_object("a-whole", [container("main", whole(1))])
        a["metadata"]["labels"]["kgpu.io/queue"] = "made-up-by-a-tenant"
        for pod, ns, node in ((a, "team-a", "c-spot"),
                              (pod_object("b-share", [container("main", share(mem=40))]),
                               "team-b", "c-od"),
                              (pod_object("a-v100", [container("main", whole(1))]),
                               "team-a", "c-unpriced")):
            self.assertEqual(self.ext.schedule(s.add_pod(pod, ns), [node]), (node, ""))

    def series(self, text, name):
        """Every sample of name: [(labels dict, value)]."""
        out = []
        for line in text.splitlines():
            m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+)$', line)
            if m and m.group(1) == name:
                out.append((dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                            m.group(2))), float(m.group(3))))
        return out

    def test_label_sets(self):
        time.sleep(0.2)
        text = self.ext.metrics()
        secs = {(l["namespace"], l["queue"], l["model"], l["capacity_type"])
                for l, _ in self.series(text, "kgpu_namespace_gpu_seconds_total")}
        # The tenant's queue label is no queue: it must not become a series.
        self.assertEqual(secs, {("team-a", "", "T4", "spot"), ("team-b", "", A100, "on-demand"),
                                ("team-a", "", V100, "on-demand")})
        m = self.ext.metric
        self.assertEqual(m("kgpu_namespace_gpus_allocated",
                           {"namespace": "team-a", "model": "T4", "capacity_type": "spot"}, text), 1)
        self.assertEqual(m("kgpu_namespace_gpus_allocated",
                           {"namespace": "team-b", "model": A100}, text), 0.5)
        costs = {(l["namespace"], l["model"], l["capacity_type"], l["currency"])
                 for l, _ in self.series(text, "kgpu_namespace_gpu_cost_total")}
        self.assertEqual(costs, {("team-a", "T4", "spot", "EUR"),
                                 ("team-b", A100, "on-demand", "EUR")})
        self.assertGreater(m("kgpu_unpriced_gpu_seconds_total",
                             {"model": V100, "capacity_type": "on-demand"}, text), 0)
        self.assertIsNone(m("kgpu_unpriced_gpu_seconds_total", {"model": "T4"}, text))
        self.assertEqual(m("kgpu_gpu_price_per_hour", {"model": "T4", "capacity_type": "spot"},
                           text), 3600)

    def test_cost_follows_seconds_times_price(self):
        def sample():
            text = self.ext.metrics()
            m = self.ext.metric
            return {k: (m("kgpu_namespace_gpu_seconds_total", lab, text),
                        m("kgpu_namespace_gpu_cost_total", lab, text))
                    for k, lab in (("spot", {"namespace": "team-a", "model": "T4"}),
                                   ("od", {"namespace": "team-b", "model": A100}))}
        first = sample()
        time.sleep(0.5)
        second = sample()
        for key, price in (("spot", 3600.0), ("od", 36000.0)):
            (s1, c1), (s2, c2) = first[key], second[key]
            self.assertGreater(s2, s1, key)
            self.assertGreater(c2, c1, key)
            # cost = GPU-seconds / 3600 x the price of the model and capacity type
            self.assertAlmostEqual(c2, s2 / 3600.0 * price, delta=1e-5 * max(c2, 1), msg=key)
        # team-b holds half an A100: its seconds grow at half the wall clock's pace.
        (s1, _), (s2, _) = first["od"], second["od"]
        self.assertLess(s2 - s1, 0.5 * 0.5 * 3)

    def test_promtool_check_metrics_with_prices(self):
        promtool = shutil.which("promtool") or "/usr/bin/promtool"
        if not os.access(promtool, os.X_OK):
            self.skipTest("promtool not installed (looked on PATH and at /usr/bin/promtool)")
        out = subprocess.run([promtool, "check", "metrics"], input=self.ext.metrics(),
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, "promtool check metrics:\n" + out.stdout + out.stderr)

    def test_without_prices_no_cost_series(self):
        e = self.start_extender_for(self.standin, name="no-prices")
        text = wait_for(lambda: (lambda t: t if "kgpu_namespace_gpu_seconds_total{" in t
                                 else None)(e.metrics()), 10,
                        what="GPU-seconds series on the extender without --prices")
        self.assertNotIn("kgpu_namespace_gpu_cost_total{", text)
        self.assertNotIn("kgpu_unpriced_gpu_seconds_total", text)

    def test_bad_prices_file_names_file_and_field(self):
        bad = os.path.join(self.tmp, "bad.yaml")
        with open(bad, "w") as f:
            f.write("prices:\n  currency: EUR\n  gpu:\n    T4: {onDemand: -1, spot: 1}\n")
        out = subprocess.run([EXTENDER_BIN, "--cluster-file", CLUSTER_YAML, "--prices", bad],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn(bad + ": prices.gpu.T4.onDemand", out.stderr)


class TestClusterFile(ExtenderTest):

    def test_cluster_file_mode(self):
        ext = self.start_extender(["--cluster-file", CLUSTER_YAML], wait_ready=False)
        # Ready as soon as it serves: there is nothing to list.
        self.assertEqual(ext.get("/readyz"), (200, "ok\n"))
        doc = ext.inspect()
        self.assertEqual([n["name"] for n in doc["nodes"]], ["gpu-a100-0", "gpu-v100-0",
                                                             "gpu-t4-0"])
        self.assertEqual(doc["totals"]["gpus"], 14)
        names = ["gpu-a100-0", "gpu-v100-0", "gpu-t4-0"]

        def pod(name, limits, uid, annotations=None):
            p = pod_object(name, [container("main", limits)], annotations)
            p["metadata"].update(namespace="team-a", uid=uid)
            return p

        big = pod("big", share(mem=20, core=25), "uid-big")
        res = ext.filter(big, names)
        self.assertEqual(res["NodeNames"], ["gpu-a100-0", "gpu-v100-0"])
        self.assertIn("gpu-t4-0", res["FailedAndUnresolvableNodes"])
        self.assertEqual(ext.bind(big, "gpu-v100-0"), "")
        g = [g for n in ext.inspect()["nodes"] if n["name"] == "gpu-v100-0" for g in n["gpus"]
             if g["pods"]]
        self.assertEqual(len(g), 1)
        self.assertEqual((g[0]["memory_allocated_mib"], g[0]["milli_allocated"]), (20480, 250))
        self.assertEqual(g[0]["pods"][0]["pod"], "big")
        self.assertEqual(g[0]["pods"][0]["status"], "bound")
        # Fill the V100s with whole-GPU pods: 3 left, the 4th is refused.
        for i in range(4):
            w = pod("w%d" % i, whole(1), "uid-w%d" % i)
            fits = ext.filter(w, ["gpu-v100-0"])["NodeNames"]
            err = ext.bind(w, "gpu-v100-0")
            if i < 3:
                self.assertEqual((fits, err), (["gpu-v100-0"], ""))
            else:
                self.assertEqual(fits, [])
                self.assertIn("does not fit", err)
        # Bound in memory; a repeated bind is a success, an unknown pod an error.
        self.assertEqual(ext.bind(big, "gpu-v100-0"), "")
        self.assertIn("unknown to kgpu", ext.bind(pod("never", whole(1), "uid-never"),
                                                  "gpu-a100-0"))
        # Preempting two whole-GPU pods would make room for two GPUs on the V100 node; one
        # would not. (The share "big" is no victim: its GPU stays taken.)
        w = pod("w9", whole(2), "uid-w9")
        res = ext.preempt(w, {"gpu-v100-0": ["uid-w0", "uid-w1"]})
        self.assertEqual(list(res["NodeNameToMetaVictims"]), ["gpu-v100-0"])
        self.assertEqual(ext.preempt(w, {"gpu-v100-0": ["uid-w0"]})["NodeNameToMetaVictims"], {})
        w4 = pod("w4x", whole(4), "uid-w4x")
        res = ext.preempt(w4, {"gpu-v100-0": ["uid-w0", "uid-w1", "uid-w2"]})
        self.assertEqual(res["NodeNameToMetaVictims"], {})
        res = ext.preempt(w4, {"gpu-v100-0": ["uid-w0", "uid-w1", "uid-w2", "uid-big"]})
        self.assertEqual(list(res["NodeNameToMetaVictims"]), ["gpu-v100-0"])
        scores = ext.prioritize(w, names)
        self.assertEqual([s["Host"] for s in scores], names)
        doc = ext.inspect()
        self.assertEqual(doc["totals"]["pods"], 4)
        self.assertEqual(doc["totals"]["memory_allocated_mib"], 20480 + 3 * 32768)
        self.assert_within_capacity(ext, doc)
        out = subprocess.run([KGPU_BIN, "inspect", "--server", ext.url], capture_output=True,
                             text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("cluster: 3 nodes, 14 GPUs, 4 pods holding GPUs", out.stdout)

    def test_config_file(self):
        config = os.path.join(self.tmp, "config.yaml")
        with open(config, "w") as f:
            f.write("clusterFile: %s\npolicy: binpack\nmemoryUnit: 256Mi\npendingPods: 16\n"
                    "maxBodyBytes: 4096\nlogLevel: warn\n" % CLUSTER_YAML)
        # Flags have the last word over the file.
        ext = self.start_extender(["--config", config, "--max-body-bytes", "20000"],
                                  wait_ready=False, log_level=None)
        self.assertEqual(ext.get("/readyz")[0], 200)

        def pod(i, mem):
            p = pod_object("c%d" % i, [container("main", share(mem=mem))])
            p["metadata"].update(namespace="default", uid="uid-c%d" % i)
            return p
        pods = [pod(i, 4) for i in range(20)]
        for p in pods:
            self.assertEqual(ext.filter(p, ["gpu-t4-0"])["NodeNames"], ["gpu-t4-0"])
        # Only the last 16 filtered pods are remembered for their bind.
        self.assertIn("unknown to kgpu", ext.bind(pods[0], "gpu-t4-0"))
        self.assertEqual(ext.bind(pods[19], "gpu-t4-0"), "")
        self.assertEqual(ext.bind(pods[4], "gpu-t4-0"), "")
        # 4 units of 256 MiB; binpack puts both on one GPU.
        gpus = [g for n in ext.inspect()["nodes"] if n["name"] == "gpu-t4-0" for g in n["gpus"]]
        self.assertEqual(sorted(g["memory_allocated_mib"] for g in gpus), [0, 2048])
        big = pod(99, 4)
        big["metadata"]["annotations"] = {"pad": "x" * 16000}
        self.assertEqual(ext.post("filter", {"Pod": big, "NodeNames": ["gpu-t4-0"]})[0], 200)
        big["metadata"]["annotations"] = {"pad": "x" * 21000}
        self.assertEqual(ext.post("filter", {"Pod": big, "NodeNames": ["gpu-t4-0"]})[0], 413)
        # logLevel warn: the binds are not logged at info.
        self.assertNotIn(" info ", ext.log())

        with open(config, "w") as f:
            f.write("clusterFile: %s\nno_such_key: 1\n" % CLUSTER_YAML)
        out = subprocess.run([EXTENDER_BIN, "--config", config], capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(out.returncode, 2)
        self.assertIn("no_such_key: unknown key", out.stderr)
        with open(config, "w") as f:
            f.write("clusterFile: %s\nleaseDurationSeconds: 0\n" % CLUSTER_YAML)
        out = subprocess.run([EXTENDER_BIN, "--config", config], capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(out.returncode, 2)
        self.assertIn("leaseDurationSeconds: wrong type or out of range", out.stderr)
        out = subprocess.run([EXTENDER_BIN, "--cluster-file", CLUSTER_YAML, "--policy", "nope"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 2)
        self.assertIn("unknown policy 'nope'", out.stderr)

    def test_bad_cluster_file(self):
        path = os.path.join(self.tmp, "bad.yaml")
        # Each GPU field is checked by kind and range; the message names file, item and field.
        cases = [("{model: T4}", "nodes[0].gpus[0].memory_mib"),
                 ("{model: T4, memory_mib: 15360, healthy: 'false'}",
                  "nodes[0].gpus[0].healthy: needs true or false"),
                 ("{model: T4, memory_mib: 15360, index: 4294967296}",
                  "nodes[0].gpus[0].index: needs an integer 0..1023"),
                 ("{model: T4, memory_mib: 15360, numa: -2}", "nodes[0].gpus[0].numa"),
                 ("{model: T4, memory_mib: 15360, uuid: 7}", "nodes[0].gpus[0].uuid"),
                 ("{memory_mib: 15360}", "nodes[0].gpus[0].model")]
        for gpu, want in cases:
            with open(path, "w") as f:
                f.write("nodes:\n- name: n\n  gpus: [%s]\n" % gpu)
            out = subprocess.run([EXTENDER_BIN, "--cluster-file", path, "--listen",
                                  "127.0.0.1:0"], capture_output=True, text=True, timeout=30)
            self.assertNotEqual(out.returncode, 0, gpu)
            self.assertIn(want, out.stderr, gpu)
            self.assertIn("bad.yaml", out.stderr, gpu)


# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# Leader election: several replicas, one binds
# ---------------------------------------------------------------------------

class TestLeaderElection(ExtenderTest):

    def test_one_leader_binds_and_a_standby_takes_over(self):
        s = self.start_standin()
        nodes = ["le-a100-0", "le-a100-1"]
        for n in nodes:
            s.add_node(n, gpu_list(n, A100, 81920, 2))
        args = ["--leader-elect", "--lease-namespace", "kgpu-system", "--lease-duration", "3"]
        a = self.start_extender_for(s, args, name="replica-a", wait_ready=False,
                                    check_exit=False)
        b = self.start_extender_for(s, args, name="replica-b", wait_ready=False)

        def ready(e):
            return e.get("/readyz")[0] == 200
        wait_for(lambda: ready(a) or ready(b), 20, what="one replica to lead")
        time.sleep(1.5)  # a few renewals: the other must still stand by
        self.assertEqual([ready(a), ready(b)].count(True), 1, "exactly one leader")
        leader, standby = (a, b) if ready(a) else (b, a)
        status, text = standby.get("/readyz")
        self.assertEqual(status, 503)
        self.assertIn("standby", text)

        pod = s.add_pod(pod_object("le-1", [container("main", share(mem=8))]))
        self.assertEqual(standby.filter(pod, nodes)["NodeNames"], nodes)  # standbys still answer
        err = standby.bind(pod, nodes[0])
        self.assertIn("standby", err)
        self.assertEqual(standby.metric("kgpu_extender_bind_failures_total", {"reason": "standby"}), 1)
        self.assertEqual(standby.held(), {}, "a standby reserved GPUs")
        node, err = leader.schedule(pod, nodes)
        self.assertEqual(err, "")

        # The leader dies without a word: the standby takes the lease once it expires,
        # with the binding it saw through its own watch.
        leader.kill()
        wait_for(lambda: ready(standby), 15, what="the standby to take over")
        self.assert_state_matches(standby, s)
        pod2 = s.add_pod(pod_object("le-2", [container("main", whole(2))]))
        node2, err = standby.schedule(pod2, nodes)
        self.assertEqual(err, "")
        self.assertNotEqual(node2, node, "the whole-GPU pod went onto the node holding le-1")
        self.assert_state_matches(standby, s)

    def test_clean_stop_hands_the_lease_over_at_once(self):
        s = self.start_standin()
        s.add_node("le-t4-0", gpu_list("le-t4-0", "T4", 15360, 1))
        args = ["--leader-elect", "--lease-duration", "30"]
        a = self.start_extender_for(s, args, name="replica-a")  # ready means leading
        b = self.start_extender_for(s, args, name="replica-b", wait_ready=False)
        time.sleep(1)
        self.assertEqual(b.get("/readyz")[0], 503)
        rc, report = a.stop()
        self.assertEqual(rc, 0)
        self.assertIsNone(report)
        # Released on the way out: no 30-s wait for the lease to expire.
        wait_for(lambda: b.get("/readyz")[0] == 200, 10, what="the standby to lead")

    def test_leader_binds_cannot_outlive_the_handover_gap(self):
        # Lease 5 s: the leader gives up at 4 s, a standby may lead from 5 s, so no
        # API call may take longer than 1 s. A Binding that hangs is abandoned
        # (and its reservation released) before a new leader could place a pod.
        s = self.start_standin()
        s.add_node("le-v100-0", gpu_list("le-v100-0", "V100", 16384, 1))
        e = self.start_extender_for(s, ["--leader-elect", "--lease-duration", "5"],
                                    name="replica-a")
        pod = s.add_pod(pod_object("le-slow", [container("main", share(mem=4))]))
        e.filter(pod, ["le-v100-0"])
        s.control(bind_delay_ms=2500)
        started = time.monotonic()
        err = e.bind(pod, "le-v100-0")
        elapsed = time.monotonic() - started
        s.control(bind_delay_ms=0)
        self.assertNotEqual(err, "")
        self.assertLess(elapsed, 2.0, "the bind waited for the slow API server: " + err)
        # The stand-in may still apply the Binding late; either way kgpu's view must
        # end up equal to what the API server holds.
        time.sleep(1.0)
        self.assert_state_matches(e, s, timeout=10.0)

    def test_leader_elect_needs_an_api_server(self):
        out = subprocess.run([EXTENDER_BIN, "--leader-elect", "--cluster-file",
                              os.path.join(SOURCE_DIR, "examples", "cluster.yaml")],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 2)
        self.assertIn("--leader-elect needs an API server", out.stderr)

def main_with_binaries(name, description):
    """The main() of every suite that runs the extender: --extender and --kgpu (or
    KGPU_EXTENDER_BIN, KGPU_BIN) name the binaries under test; 77 (skipped) without them."""
    global EXTENDER_BIN, KGPU_BIN
    ap = argparse.ArgumentParser(description=description.splitlines()[0])
    ap.add_argument("--extender", default=os.environ.get("KGPU_EXTENDER_BIN"))
    ap.add_argument("--kgpu", default=os.environ.get("KGPU_BIN"))
    args, rest = ap.parse_known_args()
    for what, path in (("kgpu-extender", args.extender), ("kgpu", args.kgpu)):
        if not path or not os.access(path, os.X_OK):
            sys.stderr.write("%s: %s binary not found (%r): skipped\n" % (name, what, path))
            return 77
    EXTENDER_BIN, KGPU_BIN = os.path.abspath(args.extender), os.path.abspath(args.kgpu)
    return run_tests(sys.argv[0], rest)


def main():
    return main_with_binaries("test_extender", __doc__)


if __name__ == "__main__":
    sys.exit(main())
