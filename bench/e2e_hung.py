#!/usr/bin/env python3
"""What a hung kgpu-extender costs a pod without a GPU, through the real kube-scheduler
(bench/e2e_hung.sh; issue 24, item 9).

kube-scheduler calls the shipped configuration's second extender entry (no
managedResources: filter-gpuless, prioritize-gpuless) for every pod, one pod
at a time. That entry is ignorable with its own httpTimeout, so a hung
extender should cost such a pod at most that timeout per call, and then it
is placed by kube-scheduler's own plugins. Three modes, each on a fresh
control plane (etcd, kube-apiserver, kube-scheduler) of the same run:

  plain   the shipped configuration minus its extenders;
  kgpu    the shipped configuration with kgpu-extender (a Release build);
  hung    the same, with the extender stopped (SIGSTOP) before the pods come:
          the kernel still accepts its connections and nobody answers, as
          an extender stuck on a lock or a dead disk would.

N pods without a GPU are created one at a time, each once the previous one
is bound; a pod's latency is from its creation to its bind seen on a watch.
Printed: the median and worst latency of each mode, the shipped timeout,
and the hung mode's median cost over plain. The last line of stdout is one
JSON object (medians over --runs, with every run's figures).
"""

import argparse
import json
import os
import re
import signal
import statistics
import sys
import time

import e2e_common as E


def cpu_nodes(n):
    """n nodes without GPUs: pods without a GPU are the point."""
    out = []
    for i in range(n):
        cap = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        out.append({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": "cpu-%d" % i, "labels": {
                        "kubernetes.io/hostname": "cpu-%d" % i}},
                    "status": {"capacity": cap, "allocatable": cap,
                               "conditions": [{"type": "Ready", "status": "True"}]}})
    return out


def shipped_timeouts():
    """The httpTimeout of the entry kube-scheduler calls for every pod, and its verbs."""
    text = E.shipped_scheduler_config()
    entry = text[text.index("prioritize-gpuless") - 400:]
    verbs = len(re.findall(r"(?m)^\s+(filterVerb|prioritizeVerb):", entry))
    timeout = re.search(r"(?m)^\s+httpTimeout:\s*(\S+)", text[text.index("prioritize-gpuless"):])
    return (timeout.group(1) if timeout else "?"), verbs


def run_mode(mode, a, bindir, workdir):
    E.log("== %s: starting a control plane in %s" % (mode, workdir))
    cp = E.start_control_plane(workdir, bindir)
    ext = None
    try:
        for node in cpu_nodes(a.nodes):
            cp.add_node(node)
        if mode == "plain":
            cp.start_scheduler(E.strip_extenders(E.shipped_scheduler_config()))
        else:
            sched_text, ext = E.install_kgpu(cp, a.build)
            cp.start_scheduler(sched_text, extender_url=ext.url)
        E.wait_scheduler_leader(cp)
        watch = E.PodWatch(cp)
        # A first pod, not counted: kube-scheduler's and the extender's warm-up.
        lat = []
        for i in range(a.pods + 1):
            if i == 1 and mode == "hung":
                os.kill(ext.child.pid, signal.SIGSTOP)
            name = "p-%d" % i
            pod = E.bench_pod(name, 100, 128)
            t0 = time.monotonic()
            cp.admin.post("/api/v1/namespaces/%s/pods" % E.BENCH_NS, pod)
            if watch.wait_pod(name, 60) != "bound":
                raise RuntimeError("%s: pod %s not bound in 60 s" % (mode, name))
            if i > 0:
                lat.append((watch.bound[name][0] - t0) * 1000.0)
        watch.stop()
        return {"mode": mode, "pods": a.pods, "median_ms": round(statistics.median(lat), 1),
                "worst_ms": round(max(lat), 1), "best_ms": round(min(lat), 1)}
    finally:
        if ext is not None and mode == "hung":
            try:
                os.kill(ext.child.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        cp.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--modes", default="plain,kgpu,hung")
    ap.add_argument("--bin", help="upstream bin dir (default: scripts/upstream.sh --check)")
    ap.add_argument("--build", default=os.path.join(E.REPO, "build-rel"))
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    E.install_signal_handlers()
    bindir = a.bin or E.upstream_bin()
    if not bindir:
        print("e2e_hung: SKIPPED: the upstream components are not built (scripts/upstream.sh)")
        return E.SKIP
    modes = a.modes.split(",")
    runs = []
    try:
        for r in range(a.runs):
            one = {m: run_mode(m, a, bindir, os.path.join(a.work, "run%d-%s" % (r, m)))
                   for m in modes}
            runs.append(one)
            E.log("run %d: %s" % (r + 1, {m: (one[m]["median_ms"], one[m]["worst_ms"])
                                          for m in modes}))
    finally:
        E.kill_everything()
    timeout, verbs = shipped_timeouts()
    out = {"pods_per_run": a.pods, "runs": a.runs, "shipped_http_timeout": timeout,
           "calls_per_pod": verbs}
    print("shipped gpu-less entry: httpTimeout %s, %d calls a pod" % (timeout, verbs))
    for m in modes:
        med = E.median_spread([run[m]["median_ms"] for run in runs])
        worst = E.median_spread([run[m]["worst_ms"] for run in runs])
        out["%s_median_ms" % m] = med[0]
        out["%s_median_ms_range" % m] = [med[1], med[2]]
        out["%s_worst_ms" % m] = worst[0]
        print("%-6s pod latency, creation to bind: median %8.1f ms (runs %s..%s), worst %8.1f ms"
              % (m, med[0], med[1], med[2], worst[0]))
    if "hung" in modes and "plain" in modes:
        cost = [run["hung"]["median_ms"] - run["plain"]["median_ms"] for run in runs]
        out["hung_cost_ms"] = E.median_spread(cost)[0]
        print("a hung extender costs a pod without a GPU %.1f ms (median of runs) over plain"
              % out["hung_cost_ms"])
    out["runs_detail"] = runs
    print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
