#!/usr/bin/env python3
"""Scheduling throughput of the real kube-scheduler without and with kgpu (bench/e2e_scale.sh).

N Node objects of 8 GPUs each (A100-80GB, V100-32GB, T4, A10 in turn), and M
pods whose shapes (num_gpu, gpu_milli, cpu_milli, memory) are drawn with a
fixed seed from the Alibaba trace's default pod list, scheduled three ways, on
a fresh control plane each (etcd, kube-apiserver, kube-scheduler, in that
order of the same run, so machine noise hits all three alike):

  plain         kube-scheduler alone with the shipped configuration minus its
                extenders; GPU pods ask for whole GPUs (nvidia.com/gpu: a
                fractional pod of the trace asks for one);
  kgpu          the shipped configuration with kgpu-extender (a Release build);
                the same pods;
  kgpu_shares   the same with the trace's fractional pods asking for kgpu's
                shares: kgpu.io/gpu-core (gpu_milli / 10) and kgpu.io/gpu-mem
                (the same fraction of a 15 GiB card, at least one 1 GiB unit).
  dra           GPUs through Dynamic Resource Allocation: the nodes are DRA nodes
                (kgpu.io/gpu-allocator=dra, no GPU resources) with the ResourceSlice
                kgpu-dra-plugin publishes for their model, and each GPU pod names a
                ResourceClaim of class gpu.kgpu.io (a fraction asks its memory and
                cores of one GPU's consumable capacity, a whole pod `count` whole
                devices); kube-scheduler alone (its DRA allocator) places them;
  dra_kgpu      the same pods and slices with the configuration the chart renders
                with dra.enabled, so kgpu's second entry holds them to their queues
                (filter-gpuless) and scores them (prioritize-gpuless).
                dra_ratio = dra_kgpu / dra: what kgpu's scores cost DRA.

The claims of the DRA modes are created before the timed span (as the pods of
--precreate are): their creation is the operator's, not the scheduler's.

--profile DIR adds CPU profiles of kube-apiserver, kube-scheduler (pprof) and
the extender (perf) over the first seconds of each mode's scheduling span.

Throughput = pods bound / (last bind seen - first creation), binds seen on a
watch. Pods are created by P processes x T threads, all released at once;
their own rate (pods / creation span) is reported beside it. CPU seconds of
every process over the scheduling span, kube-scheduler's own latency
breakdown (/metrics on its secure port) and the extender's request latency
histogram (per verb) say where the time goes.

The last line of stdout is one JSON object (medians over --runs, with the
spread of each figure and every run's details under "runs").
"""

import argparse
import csv
import json
import os
import random
import sys
import time

import e2e_common as E

MODELS = [  # (model as the device plugin would report it, MiB per GPU)
    ("NVIDIA A100-SXM4-80GB", 81920),
    ("Tesla V100-SXM2-32GB", 32768),
    ("Tesla T4", 15360),
    ("NVIDIA A10", 23028),
]
GPUS_PER_NODE = 8
NODE_CPU, NODE_MEMORY = "128", "1024Gi"
SHARE_CARD_GIB = 15  # kgpu.io/gpu-mem of a share: its fraction of the smallest card


def trace_shapes(path, n, seed):
    """n shapes (cpu_milli, memory_mib, num_gpu, gpu_milli) drawn with replacement."""
    with open(path) as f:
        rows = [(int(r["cpu_milli"]), int(r["memory_mib"]), int(r["num_gpu"]),
                 int(r["gpu_milli"])) for r in csv.DictReader(f)]
    # The bench's nodes have 128 cores and 1 TiB: leave out the few shapes no node could hold.
    rows = [r for r in rows if r[0] <= 128000 and r[1] <= 1024 * 1024 and r[2] <= GPUS_PER_NODE]
    rng = random.Random(seed)
    return [rng.choice(rows) for _ in range(n)]


def pods_for(mode, shapes):
    out = []
    for i, (cpu, mem, ngpu, milli) in enumerate(shapes):
        ext = {}
        if ngpu > 0 and (mode != "kgpu_shares" or milli >= 1000):
            ext = {E.WHOLE: ngpu}  # a fraction rounds up to one whole GPU
        elif ngpu > 0:
            ext = {E.CORE: max(1, milli // 10),
                   E.MEM: max(1, round(SHARE_CARD_GIB * milli / 1000))}
        out.append(E.bench_pod("p-%05d" % i, cpu, mem, ext))
    return out


def nodes(n, dra=False):
    """n nodes of the models in turn; dra: nodes whose GPUs kgpu-dra-plugin offers (no GPU
    resources, the DRA label)."""
    out = []
    for i in range(n):
        model, mib = MODELS[i % len(MODELS)]
        out.append(E.cluster.node_object(
            "n-%05d" % i, model, 0 if dra else GPUS_PER_NODE, mib, cpu=NODE_CPU,
            memory=NODE_MEMORY, labels={"kgpu.io/gpu-allocator": "dra"} if dra else None))
    return out


DRA_DRIVER = "gpu.kgpu.io"
RESOURCE_API = "/apis/resource.k8s.io/v1"
SLICE_SUFFIX = "-" + DRA_DRIVER


def fake_gpus(model, mib, tag):
    """kgpu-dra-plugin's --fake-gpus file: GPUS_PER_NODE GPUs of one model, 4 per NUMA node."""
    lines = ["gpus:"]
    for g in range(GPUS_PER_NODE):
        lines.append("- {index: %d, uuid: GPU-%s-%02d, model: %s, memory_mib: %d, numa: %d}"
                     % (g, tag, g, model.replace(" ", "-"), mib, g // 4))
    return "\n".join(lines) + "\n"


def driver_slices(cp, a, workdir):
    """{model: ResourceSlice} as the real kgpu-dra-plugin publishes it for a node of that
    model: the driver runs once per model against this control plane, on a template
    node, and the bench copies what it published (the upstream API server validated it)."""
    plugin = os.path.join(a.build, "kgpu-dra-plugin")
    kc = cp.admin_kubeconfig
    out = {}
    for k, (model, mib) in enumerate(MODELS):
        node = "tmpl-%d" % k
        cp.add_node(E.cluster.node_object(node, model, 0, mib,
                                          labels={"kgpu.io/gpu-allocator": "dra"}))
        d = os.path.join(workdir, node)
        dirs = {x: os.path.join(d, x) for x in ("plugins", "registry", "state", "cdi")}
        for x in dirs.values():
            os.makedirs(x, exist_ok=True)
        with open(os.path.join(d, "gpus.yaml"), "w") as f:
            f.write(fake_gpus(model, mib, "TMPL%d" % k))
        shim = os.path.join(d, "libkgpu-limit.so")
        open(shim, "w").close()
        child = E.harness.Child([plugin, "--node-name", node, "--fake-gpus",
                                 os.path.join(d, "gpus.yaml"), "--kubeconfig", kc,
                                 "--state-dir", dirs["state"], "--cdi-dir", dirs["cdi"],
                                 "--plugin-dir", dirs["plugins"],
                                 "--registry-dir", dirs["registry"], "--shim-lib", shim],
                                os.path.join(d, "driver.log"))
        try:
            path = RESOURCE_API + "/resourceslices/" + node + SLICE_SUFFIX

            def published():
                if not child.alive():
                    raise RuntimeError("kgpu-dra-plugin exited:\n" + child.log_tail())
                s = cp.admin.try_get(path)
                return s if s and len((s.get("spec") or {}).get("devices") or []) \
                    == GPUS_PER_NODE else None
            out[model] = E.cluster.wait_for(published, 60, "the %s slice" % model,
                                            interval=0.2)
        finally:
            child.stop()
        cp.admin.delete(RESOURCE_API + "/resourceslices/" + node + SLICE_SUFFIX, missing_ok=True)
        cp.admin.delete("/api/v1/nodes/" + node, missing_ok=True)
    return out


def node_slices(cp, templates, n):
    """One ResourceSlice per bench node, copied from its model's template with the node's
    name, owner, pool and GPU UUIDs."""
    uids = {o["metadata"]["name"]: o["metadata"]["uid"]
            for o in cp.admin.get("/api/v1/nodes")["items"]}
    out = []
    for i in range(n):
        k = i % len(MODELS)
        model = MODELS[k][0]
        node = "n-%05d" % i
        text = json.dumps(templates[model]).replace("tmpl-%d" % k, node).replace(
            "GPU-TMPL%d-" % k, "GPU-%05d-" % i)
        s = json.loads(text)
        meta = s["metadata"]
        s["metadata"] = {"name": meta["name"], "labels": meta.get("labels") or {},
                         "ownerReferences": [dict(meta["ownerReferences"][0], uid=uids[node])]}
        s.pop("status", None)
        out.append(s)
    return out


def dra_workload(shapes):
    """(claims, pods) of the DRA modes: a GPU pod names its own claim."""
    claims, pods = [], []
    for i, (cpu, mem, ngpu, milli) in enumerate(shapes):
        name = "p-%05d" % i
        pod = E.bench_pod(name, cpu, mem)
        if ngpu > 0:
            if milli >= 1000:
                exactly = {"deviceClassName": DRA_DRIVER, "allocationMode": "ExactCount",
                           "count": ngpu}
            else:
                exactly = {"deviceClassName": DRA_DRIVER, "capacity": {"requests": {
                    "memory": "%dGi" % max(1, round(SHARE_CARD_GIB * milli / 1000)),
                    "cores": str(max(1, milli // 10))}}}
            claims.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "metadata": {"name": name, "namespace": E.BENCH_NS},
                           "spec": {"devices": {"requests": [{"name": "gpu",
                                                              "exactly": exactly}]}}})
            pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
            pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
        pods.append(pod)
    return claims, pods


def round2(x):
    return round(x, 2) if x is not None else None


def run_mode(mode, a, bindir, workdir, shapes):
    """One mode on a fresh control plane; a dict of figures."""
    E.log("== %s: starting a control plane in %s" % (mode, workdir))
    cp = E.start_control_plane(workdir, bindir, profiling=bool(a.profile))
    ext = None
    try:
        dra = mode.startswith("dra")
        t = E.create_all(cp, "/api/v1/nodes", nodes(a.nodes, dra),
                         a.processes, a.threads, "nodes")
        E.log("%s: %d nodes created in %.1f s" % (mode, a.nodes, t))
        if dra:
            cp.kubectl("apply", "-k", os.path.join(E.REPO, "deploy", "dra"))  # the DeviceClass
            templates = driver_slices(cp, a, workdir)
            t = E.create_all(cp, RESOURCE_API + "/resourceslices",
                             node_slices(cp, templates, a.nodes), a.processes, a.threads,
                             "ResourceSlices")
            E.log("%s: %d ResourceSlices created in %.1f s" % (mode, a.nodes, t))
            claims, pods = dra_workload(shapes)
            t = E.create_all(cp, RESOURCE_API + "/namespaces/%s/resourceclaims" % E.BENCH_NS,
                             claims, a.processes, a.threads, "ResourceClaims")
            E.log("%s: %d ResourceClaims created in %.1f s" % (mode, len(claims), t))
            managed = len(claims)
        else:
            pods = pods_for(mode, shapes)
            managed = sum(1 for p in pods
                          if p["spec"]["containers"][0]["resources"].get("limits"))
        watch = E.PodWatch(cp)
        creators = E.Creators(cp, "/api/v1/namespaces/%s/pods" % E.BENCH_NS, pods,
                              a.processes, a.threads)
        time.sleep(1.0)  # creator processes up and waiting
        if a.precreate:  # every pod Pending before kube-scheduler starts: its rate alone
            creators.start()
            created, errors, c0, c1 = creators.wait()
        if mode in ("plain", "dra"):
            sched_text = E.strip_extenders(E.shipped_scheduler_config())
            cp.start_scheduler(E.with_qps(sched_text, a.qps), extra=a.scheduler_args)
        else:
            # With DRA, as the chart renders it with dra.enabled: filter-gpuless too.
            values = a.chart_values + (["scheduler.filterDraPods=true"] if dra else [])
            sched_text, ext = E.install_kgpu(cp, a.build, values)
            cp.start_scheduler(E.with_qps(sched_text, a.qps), extender_url=ext.url,
                               extra=a.scheduler_args)
        E.wait_scheduler_leader(cp)
        # The extender's memory with the nodes listed, before any pod: where a peak is made.
        ready_rss = (E.status_mb(ext.child.pid, "VmRSS"), E.peak_rss_mb(ext.child.pid)) \
            if ext is not None else None
        pids = E.process_table(cp, ext)
        cpu0 = E.cpu_snapshot(pids)
        wall0 = time.monotonic()
        prof = None
        if a.profile:  # over the first --profile-seconds of scheduling
            prof = E.Profiles(a.profile, mode, cp, a.profile_seconds,
                              ext.child.pid if ext is not None else None)
            prof.start()
        if not a.precreate:
            creators.start()
            created, errors, c0, c1 = creators.wait()
        if created != len(pods):
            raise RuntimeError("%s: created %d of %d pods: %s" % (mode, created, len(pods),
                                                                    errors))
        E.log("%s: %d pods created in %.1f s (%.0f/s), %d bound so far" % (
            mode, created, c1 - c0, created / max(c1 - c0, 1e-9), len(watch.bound)))
        done = watch.wait_count(len(pods), a.stall, progress=lambda n: E.log(
            "%s: %d of %d pods bound" % (mode, n, len(pods))))
        cpu1 = E.cpu_snapshot(pids)
        wall = time.monotonic() - wall0
        watch.stop()
        if prof is not None:
            prof.finish()
        binds = sorted(t for t, _ in watch.bound.values())
        bound = len(binds)
        # From the first creation to the last bind; with --precreate, from the first bind.
        first = binds[0] if a.precreate and binds else c0
        span = (binds[-1] - first) if binds else None
        res = {
            "mode": mode, "pods": len(pods), "pods_to_extender": managed if ext else 0,
            "gpu_pods": managed,
            "bound": bound, "all_bound": done,
            "pods_per_s": round(bound / span, 1) if span else 0.0,
            "span_s": round(span, 2) if span else None,
            "create_s": round(c1 - c0, 2),
            "create_pods_per_s": round(created / max(c1 - c0, 1e-9), 1),
            "unschedulable": len(set(watch.unsched) - set(watch.bound)),
            "cpu_s": E.cpu_delta(cpu0, cpu1), "wall_s": round(wall, 2),
        }
        # Bind rate once creation is over: what the scheduler does with a full queue.
        after = [t for t in binds if t > c1]
        if len(after) > 1:
            res["pods_per_s_after_creation"] = round(len(after) / (after[-1] - c1), 1)
        try:
            res["scheduler"] = E.scheduler_breakdown(E.scheduler_metrics(cp))
            # kube-scheduler's cycle runs one pod at a time: its mean bounds the rate.
            res["scheduling_algorithm_ms"] = res["scheduler"].get(
                "scheduling_algorithm_duration_mean_ms")
        except Exception as e:  # noqa: BLE001 -- a figure missing is not a failed run
            res["scheduler"] = {"error": str(e)[:200]}
        if ext is not None:
            # The peak of scheduling alone, before this scrape of /metrics renders every GPU.
            peak_sched = E.peak_rss_mb(ext.child.pid)
            res["extender_latency"], res["extender_p99_ms"] = E.extender_latency(ext)
            conns = res["extender_latency"].pop("connections", None)
            if conns is not None and bound:  # TLS handshakes kube-scheduler made per pod
                res["extender_connections_per_pod"] = round(conns / bound, 3)
            res["extender_peak_rss_mb"] = round(E.peak_rss_mb(ext.child.pid) or 0, 1)
            res["extender_rss_mb"] = {
                "ready": round(ready_rss[0] or 0, 1), "peak_at_ready": round(ready_rss[1] or 0, 1),
                "peak_before_metrics_scrape": round(peak_sched or 0, 1),
                "end": round(E.status_mb(ext.child.pid, "VmRSS") or 0, 1)}
        E.log("%s: %d/%d bound, %.1f pods/s over %.1f s; CPU s %s" % (
            mode, bound, len(pods), res["pods_per_s"], span or 0, res["cpu_s"]))
        if not done:
            left = sorted(set(p["metadata"]["name"] for p in pods) - set(watch.bound))
            E.log("%s: %d pods not bound (%d marked unschedulable), e.g. %s" % (
                mode, len(left), len(set(left) & set(watch.unsched)),
                [(n, watch.unsched.get(n, (0, "no verdict"))[1][:200]) for n in left[:3]]))
        return res
    finally:
        cp.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="50 nodes, 200 pods")
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--processes", type=int, default=2, help="creator processes")
    ap.add_argument("--threads", type=int, default=8, help="threads per creator process")
    ap.add_argument("--stall", type=float, default=120,
                    help="give up when no pod was bound for this many seconds")
    ap.add_argument("--modes", default="plain,kgpu,kgpu_shares",
                    help="comma-separated, of plain, kgpu, kgpu_shares, dra, dra_kgpu "
                         "(default plain,kgpu,kgpu_shares)")
    ap.add_argument("--precreate", action="store_true",
                    help="for analysis: create every pod before kube-scheduler starts and time "
                         "from its first bind to its last (its rate without the creator)")
    ap.add_argument("--qps", type=int, default=1000,
                    help="kube-scheduler's clientConnection qps (burst 2x), as a large cluster "
                         "raises it (docs/install-extender.md); 0: its default 50, which caps "
                         "the Bindings plain kube-scheduler posts itself (default 1000)")
    ap.add_argument("--set", action="append", default=[], dest="chart_values",
                    metavar="KEY=VALUE",
                    help="a chart value for the kgpu modes, e.g. --set "
                         "scheduler.scoreGpulessPods=false (no second extender entry)")
    ap.add_argument("--profile", metavar="DIR",
                    help="CPU profiles of kube-apiserver, kube-scheduler (pprof) and "
                         "kgpu-extender (perf, when installed) over the scheduling span, with "
                         "their top functions, in DIR (docs/e2e.md)")
    ap.add_argument("--profile-seconds", type=int, default=20,
                    help="length of each --profile (default 20)")
    ap.add_argument("--scheduler-arg", action="append", default=[], dest="scheduler_args",
                    help="extra kube-scheduler flag, e.g. --scheduler-arg=--v=4")
    ap.add_argument("--bin", help="upstream bin dir (default: scripts/upstream.sh --check)")
    ap.add_argument("--build", default=os.path.join(E.REPO, "build-rel"))
    ap.add_argument("--work", required=True)
    ap.add_argument("--pod-file", default=os.path.join(E.TRACE_DIR, "openb_pod_list_default.csv"))
    a = ap.parse_args()
    if a.smoke:
        a.nodes, a.pods = 50, 200
    E.install_signal_handlers()
    bindir = a.bin or E.upstream_bin()
    if not bindir:
        print("e2e_scale: SKIPPED: the upstream components are not built "
              "(scripts/upstream.sh; --check must exit 0)")
        return E.SKIP
    if not os.path.exists(a.pod_file):
        print("e2e_scale: SKIPPED: no trace pod file %s (KGPU_TRACE_DIR)" % a.pod_file)
        return E.SKIP
    if not os.access(os.path.join(a.build, "kgpu-extender"), os.X_OK):
        print("e2e_scale: no %s/kgpu-extender: build it first" % a.build, file=sys.stderr)
        return 1
    shapes = trace_shapes(a.pod_file, a.pods, a.seed)
    modes = a.modes.split(",")
    runs = []
    try:
        for r in range(a.runs):
            one = {}
            for mode in modes:
                one[mode] = run_mode(mode, a, bindir, os.path.join(a.work, "run%d-%s" % (r, mode)),
                                     shapes)
            runs.append(one)
            E.log("run %d: %s" % (r + 1, {m: one[m]["pods_per_s"] for m in modes}))
    finally:
        E.kill_everything()

    def fig(mode, key):
        return E.median_spread([run[mode].get(key) for run in runs if mode in run])

    out = {"nodes": a.nodes, "gpus": a.nodes * GPUS_PER_NODE, "pods": a.pods, "runs": a.runs,
           "seed": a.seed, "precreate": a.precreate, "qps": a.qps or 50,
           "chart_values": a.chart_values,
           "creators": "%d processes x %d threads" % (a.processes, a.threads)}
    for mode in modes:
        med, lo, hi = fig(mode, "pods_per_s")
        out["%s_pods_per_s" % mode] = med
        out["%s_pods_per_s_range" % mode] = [lo, hi]
        out["%s_create_pods_per_s" % mode] = fig(mode, "create_pods_per_s")[0]
        # Where the CPU went: seconds per component over the run, and per pod bound.
        comps = sorted({c for run in runs if mode in run for c in run[mode]["cpu_s"]})
        out["%s_cpu_s" % mode] = {c: E.median_spread(
            [run[mode]["cpu_s"].get(c) for run in runs if mode in run])[0] for c in comps}
        out["%s_cpu_ms_per_pod" % mode] = {c: round2(E.median_spread(
            [1000.0 * run[mode]["cpu_s"][c] / run[mode]["bound"] for run in runs
             if mode in run and run[mode]["cpu_s"].get(c) is not None and run[mode]["bound"]])[0])
            for c in comps}
        out["%s_scheduling_algorithm_ms" % mode] = fig(mode, "scheduling_algorithm_ms")[0]
    def ratio(num, den):
        """(median, min, max) of num's pods/s over den's, run by run; Nones without both."""
        return E.median_spread([run[num]["pods_per_s"] / run[den]["pods_per_s"] for run in runs
                                if num in run and den in run and run[den]["pods_per_s"]])

    med, lo, hi = ratio("kgpu", "plain")
    out["ratio"] = round(med, 3) if med is not None else None
    out["ratio_range"] = [round(lo, 3), round(hi, 3)] if med is not None else None
    med = ratio("kgpu_shares", "plain")[0]
    if med is not None:
        out["shares_ratio"] = round(med, 3)
    # DRA: what kgpu's scores cost kube-scheduler's own allocator, and DRA against plain pods.
    for key, num, den in (("dra_ratio", "dra_kgpu", "dra"), ("dra_vs_plain", "dra", "plain")):
        med, lo, hi = ratio(num, den)
        if med is not None:
            out[key], out[key + "_range"] = round(med, 3), [round(lo, 3), round(hi, 3)]
    if any("dra_kgpu" in run for run in runs):
        for verb in ("filter-gpuless", "prioritize-gpuless"):
            v = [run["dra_kgpu"]["extender_latency"][verb]["p99_ms"] for run in runs
                 if verb in run.get("dra_kgpu", {}).get("extender_latency", {})]
            out["dra_kgpu_extender_%s_p99_ms" % verb.replace("-", "_")] = \
                E.median_spread(v)[0]
    p99 = [run[m].get("extender_p99_ms") for run in runs for m in ("kgpu", "kgpu_shares")
           if m in run]
    out["extender_p99_ms"] = E.median_spread(p99)[0]
    for verb in ("filter", "prioritize", "bind", "prioritize-gpuless"):
        v = [run[m]["extender_latency"][verb]["p99_ms"] for run in runs
             for m in ("kgpu", "kgpu_shares")
             if m in run and verb in run[m].get("extender_latency", {})]
        out["extender_%s_p99_ms" % verb.replace("-", "_")] = E.median_spread(v)[0]
        # Calls per pod bound through kgpu: what kube-scheduler sends for each.
        c = [run[m]["extender_latency"][verb]["count"] / run[m]["bound"] for run in runs
             for m in ("kgpu", "kgpu_shares")
             if m in run and run[m]["bound"] and verb in run[m].get("extender_latency", {})]
        out["extender_%s_calls_per_pod" % verb.replace("-", "_")] = \
            round(E.median_spread(c)[0], 3) if c else None
    c = [run[m].get("extender_connections_per_pod") for run in runs
         for m in ("kgpu", "kgpu_shares") if m in run]
    out["extender_connections_per_pod"] = E.median_spread(c)[0]
    rss = [run[m].get("extender_peak_rss_mb") for run in runs
           for m in ("kgpu", "kgpu_shares", "dra_kgpu") if m in run]
    out["extender_peak_rss_mb"] = max([x for x in rss if x is not None], default=None)
    out["all_bound"] = all(run[m]["all_bound"] for run in runs for m in run)
    out["runs_detail"] = runs
    print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
