#!/usr/bin/env python3
"""The FGD study's workload replayed through the real kube-scheduler and kgpu (bench/e2e_trace.sh).

Cluster: every node of openb_node_list_gpu_node.csv as a Node object with the
trace's CPU and memory and its GPUs (kgpu.io/gpus, nvidia.com/gpu,
kgpu.io/gpu-core 100 per GPU, kgpu.io/gpu-mem at the model's nominal size).
Workload: exactly the pod sequence `kgpu simulate --workload --seeds SEED
--inflate 1.3` prints (the study's draws with replacement to 130 % of GPU
capacity, shuffled with the seed), so nothing of the method is re-implemented
here. Each pod asks for the trace's CPU and memory; a whole-GPU pod
(gpu_milli 1000) for nvidia.com/gpu: num_gpu, a fractional one for
kgpu.io/gpu-core: gpu_milli / 10 (the trace records compute only); gpu_spec
becomes the kgpu.io/gpu-type annotation.

One pod at a time, as the study's simulator: create it, wait until the watch
shows it bound or marked Unschedulable by kube-scheduler, then the next. An
unschedulable pod is deleted at once: in the study a pod that fits nowhere
fails for good, and left Pending kube-scheduler would retry it for the rest of
the run (arrivals only take room, so a retry can never succeed; it only costs
time). Allocation % = GPU milli of the bound pods / capacity, checked against
the extender's /inspect.

The prediction is `kgpu simulate --policy kgpu --kube-scheduler default` for
the same seed: kube-scheduler's node sample, its default score plugins
(NodeResourcesFit LeastAllocated, BalancedAllocation) plus the extender's 0-10
score x 5 x 10, ties at random, pods without a GPU placed by the plugins alone
(they never reach the extender). Also reported: the extender's scores alone
(--extender-scores) and the policy's own best node (the study's method).

The last line of stdout is one JSON object.
"""

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import time

import e2e_common as E

# Nominal MiB per GPU of the trace's models (src/core/trace.c uses the same).
MODEL_MIB = {"P100": 16384, "T4": 16384, "V100M16": 16384, "V100M32": 32768, "A10": 24576,
             "A100": 81920}
DEFAULT_MIB = 16384


def read_nodes(path, limit=None):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return rows[:limit] if limit else rows


def node_objects(rows):
    out = []
    for r in rows:
        ngpu = int(r["gpu"])
        model = r["model"]
        node = E.cluster.node_object(r["sn"], model, ngpu, MODEL_MIB.get(model, DEFAULT_MIB),
                                     cpu="%dm" % int(r["cpu_milli"]),
                                     memory="%dMi" % int(r["memory_mib"]))
        for k in ("capacity", "allocatable"):  # the study has no pod-count limit
            node["status"][k]["pods"] = "1000"
        out.append(node)
    return out


def workload(kgpu, nodes_csv, pods_csv, seed, inflate):
    r = subprocess.run([kgpu, "simulate", "--nodes", nodes_csv, "--pods", pods_csv,
                        "--seeds", str(seed), "--inflate", str(inflate), "--workload"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError("kgpu simulate --workload: %s" % r.stderr.strip())
    return list(csv.DictReader(io.StringIO(r.stdout)))


def prediction(kgpu, nodes_csv, pods_csv, seed, inflate, choice=()):
    """kgpu simulate's result for the seed; choice: extra options saying how nodes are chosen."""
    argv = [kgpu, "simulate", "--nodes", nodes_csv, "--pods", pods_csv, "--seeds", str(seed),
            "--inflate", str(inflate), "--policy", "kgpu", "--json", "--threads", "1"]
    argv += list(choice)
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError("kgpu simulate: %s" % r.stderr.strip())
    res = json.loads(r.stdout)["results"][0]
    return {"alloc_pct_130": res["alloc_pct_130"], "pods": res["pods"],
            "pods_failed": res["pods_failed"]}


def pod_for(k, row):
    ngpu, milli = int(row["num_gpu"]), int(row["gpu_milli"])
    ext = {}
    if ngpu > 0 and milli >= 1000:
        ext = {E.WHOLE: ngpu}
    elif ngpu > 0:
        ext = {E.CORE: milli // 10}
    ann = None
    if row["gpu_spec"]:
        ann = {"kgpu.io/gpu-type": ",".join(row["gpu_spec"].split("|"))}
    return E.bench_pod("t-%05d" % k, int(row["cpu_milli"]), int(row["memory_mib"]), ext, ann)


def gpu_milli_of(row):
    return int(row["num_gpu"]) * int(row["gpu_milli"])


def run_once(r, a, bindir, kgpu, nodes_csv, rows, seq):
    workdir = os.path.join(a.work, "run%d" % r)
    E.log("== run %d: control plane in %s" % (r + 1, workdir))
    cp = E.start_control_plane(workdir, bindir)
    try:
        t = E.create_all(cp, "/api/v1/nodes", node_objects(rows), 2, 8, "nodes")
        E.log("%d nodes created in %.1f s" % (len(rows), t))
        sched_text, ext = E.install_kgpu(cp, a.build)
        cp.start_scheduler(sched_text, extender_url=ext.url, extra=a.scheduler_args)
        E.wait_scheduler_leader(cp)
        watch = E.PodWatch(cp)
        capacity = 1000 * sum(int(n["gpu"]) for n in rows)
        bound = pending = stuck = 0
        alloc = arrived = 0
        t0 = time.monotonic()
        pods_path = "/api/v1/namespaces/%s/pods" % E.BENCH_NS
        for k, row in enumerate(seq):
            pod = pod_for(k, row)
            name = pod["metadata"]["name"]
            cp.admin.post(pods_path, pod)
            arrived += gpu_milli_of(row)
            outcome = watch.wait_pod(name, a.pod_timeout)
            if outcome == "bound":
                bound += 1
                alloc += gpu_milli_of(row)
            else:
                if outcome is None:
                    stuck += 1
                    E.log("pod %s (%s) neither bound nor unschedulable after %.0f s" % (
                        name, dict(row), a.pod_timeout))
                pending += 1
                cp.admin.delete(pods_path + "/" + name, grace=0)
            if (k + 1) % 500 == 0:
                el = time.monotonic() - t0
                E.log("%d/%d pods (%.0f/s): %d bound, %d failed; arrived %.1f %%, "
                      "allocated %.2f %%" % (k + 1, len(seq), (k + 1) / el, bound, pending,
                                             100.0 * arrived / capacity,
                                             100.0 * alloc / capacity))
        elapsed = time.monotonic() - t0
        watch.stop()
        held = ext.held()
        inspect_milli = sum(v[1] for v in held.values())
        res = {"alloc_pct_130_real": round(100.0 * alloc / capacity, 4),
               "alloc_pct_130_inspect": round(100.0 * inspect_milli / capacity, 4),
               "arrival_pct": round(100.0 * arrived / capacity, 2),
               "pods_bound": bound, "pods_pending": pending, "pods_stuck": stuck,
               "unallocated_gpus": round((capacity - alloc) / 1000.0, 1),
               "elapsed_s": round(elapsed, 1), "pods_per_s": round(len(seq) / elapsed, 1)}
        res["extender_latency"], res["extender_p99_ms"] = E.extender_latency(ext)
        res["extender_peak_rss_mb"] = round(E.peak_rss_mb(ext.child.pid) or 0, 1)
        try:
            res["scheduler"] = E.scheduler_breakdown(E.scheduler_metrics(cp))
        except Exception as e:  # noqa: BLE001
            res["scheduler"] = {"error": str(e)[:200]}
        E.log("run %d: %s" % (r + 1, {k: v for k, v in res.items()
                                      if k not in ("scheduler", "extender_latency")}))
        return res
    finally:
        E.kill_everything()
        cp.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--inflate", type=float, default=1.3)
    ap.add_argument("--smoke", action="store_true",
                    help="the first 40 nodes of the node list (the workload scaled to them)")
    ap.add_argument("--node-limit", type=int, default=None)
    ap.add_argument("--pod-timeout", type=float, default=60)
    ap.add_argument("--kube-scheduler", default="default",
                    help="the simulator's model of the scheduler configuration (kgpu simulate "
                         "--kube-scheduler SPEC); default: the shipped one")
    ap.add_argument("--scheduler-arg", action="append", default=[], dest="scheduler_args")
    ap.add_argument("--bin")
    ap.add_argument("--build", default=os.path.join(E.REPO, "build-rel"))
    ap.add_argument("--work", required=True)
    ap.add_argument("--trace-dir", default=E.TRACE_DIR)
    ap.add_argument("--pod-file", default="openb_pod_list_default.csv")
    a = ap.parse_args()
    if a.smoke:
        a.node_limit = a.node_limit or 40
    E.install_signal_handlers()
    bindir = a.bin or E.upstream_bin()
    if not bindir:
        print("e2e_trace: SKIPPED: the upstream components are not built "
              "(scripts/upstream.sh; --check must exit 0)")
        return E.SKIP
    nodes_csv = os.path.join(a.trace_dir, "openb_node_list_gpu_node.csv")
    pods_csv = os.path.join(a.trace_dir, a.pod_file)
    if not (os.path.exists(nodes_csv) and os.path.exists(pods_csv)):
        print("e2e_trace: SKIPPED: no trace in %s (KGPU_TRACE_DIR)" % a.trace_dir)
        return E.SKIP
    kgpu = os.path.join(a.build, "kgpu")
    for b in (kgpu, os.path.join(a.build, "kgpu-extender")):
        if not os.access(b, os.X_OK):
            print("e2e_trace: no %s: build it first" % b, file=sys.stderr)
            return 1
    os.makedirs(a.work, exist_ok=True)
    rows = read_nodes(nodes_csv, a.node_limit)
    if a.node_limit:
        nodes_csv = os.path.join(a.work, "nodes-%d.csv" % a.node_limit)
        with open(nodes_csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["sn", "cpu_milli", "memory_mib", "gpu", "model"])
            w.writeheader()
            w.writerows(rows)
    seq = workload(kgpu, nodes_csv, pods_csv, a.seed, a.inflate)
    # The prediction: kube-scheduler as configured (shipped: weight 5, its default node
    # sample and score plugins, pods without GPU placed without kgpu), then two references.
    sim = prediction(kgpu, nodes_csv, pods_csv, a.seed, a.inflate,
                     ["--kube-scheduler", a.kube_scheduler])
    ext_only = prediction(kgpu, nodes_csv, pods_csv, a.seed, a.inflate, ["--extender-scores"])
    best = prediction(kgpu, nodes_csv, pods_csv, a.seed, a.inflate)
    E.log("%d nodes, %d pods (seed %d); simulator: %.2f %% through kube-scheduler (%s), "
          "%.2f %% through the extender's 0-10 scores alone, %.2f %% choosing the best node" % (
              len(rows), len(seq), a.seed, sim["alloc_pct_130"], a.kube_scheduler,
              ext_only["alloc_pct_130"], best["alloc_pct_130"]))
    runs = []
    try:
        for r in range(a.runs):
            runs.append(run_once(r, a, bindir, kgpu, nodes_csv, rows, seq))
    finally:
        E.kill_everything()

    def med(key):
        return E.median_spread([x[key] for x in runs])
    real, lo, hi = med("alloc_pct_130_real")
    out = {"nodes": len(rows), "pods": len(seq), "seed": a.seed, "runs": a.runs,
           "alloc_pct_130_real": real, "alloc_pct_130_real_range": [lo, hi],
           "alloc_pct_130_sim": round(sim["alloc_pct_130"], 4),
           "sim_model": "kgpu simulate --policy kgpu --kube-scheduler " + a.kube_scheduler,
           "alloc_pct_130_sim_extender_only": round(ext_only["alloc_pct_130"], 4),
           "alloc_pct_130_sim_best_node": round(best["alloc_pct_130"], 4),
           "gap_points": round(real - sim["alloc_pct_130"], 3),
           "sim_pods_failed": sim["pods_failed"],
           "pods_bound": med("pods_bound")[0], "pods_pending": med("pods_pending")[0],
           "pods_stuck": max(x["pods_stuck"] for x in runs),
           "pods_per_s": med("pods_per_s")[0],
           "extender_p99_ms": med("extender_p99_ms")[0],
           "extender_peak_rss_mb": max(x["extender_peak_rss_mb"] for x in runs),
           "runs_detail": runs}
    print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
