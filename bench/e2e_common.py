"""What the end-to-end benchmarks share (bench/e2e_scale.py, bench/e2e_trace.py).

They run the real upstream control plane of tests/e2e/cluster.py (etcd,
kube-apiserver, kube-scheduler) and kgpu-extender as a process
(tests/e2e/kgpu_deploy.py), and measure from the API: a watch on the
benchmark's namespace records, in this process's monotonic clock, when each
pod was first seen bound or marked unschedulable. Pods and nodes are created
by creator processes (several threads each), so Python's global lock does not
make the creator the bottleneck; CLOCK_MONOTONIC is system-wide, so their
times and the watch's compare.

Every process started is a harness.Child (or a creator process registered
here): on_signal() and finish() kill them all, also on Ctrl-C or SIGTERM.
Standard library only.
"""

import http.client
import json
import multiprocessing
import os
import re
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

import harness  # noqa: E402
import cluster  # noqa: E402
import kgpu_deploy  # noqa: E402

SKIP = 77  # CTest's SKIP_RETURN_CODE for the smoke test
BENCH_NS = "bench"
WHOLE, MEM, CORE = cluster.WHOLE, cluster.MEM, cluster.CORE
TRACE_DIR = os.environ.get("KGPU_TRACE_DIR",
                           os.path.join(os.path.dirname(REPO), "shared", "traces",
                                        "alibaba-gpu-v2023", "csv"))

_CREATORS = []  # multiprocessing.Process objects alive


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def kill_everything():
    for p in list(_CREATORS):
        if p.is_alive():
            p.kill()
    harness.kill_all_children()


def install_signal_handlers():
    def on_signal(signum, frame):
        kill_everything()
        print("\ninterrupted by signal %d: every process started was killed" % signum,
              file=sys.stderr, flush=True)
        os._exit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)


def upstream_bin():
    """The upstream bin dir if scripts/upstream.sh has built everything, else None."""
    r = subprocess.run([os.path.join(REPO, "scripts", "upstream.sh"), "--check"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        return None
    return r.stdout.strip().splitlines()[-1]


def median_spread(values):
    """(median, min, max) of the numbers in values, None for an empty list."""
    v = [x for x in values if x is not None]
    if not v:
        return None, None, None
    return statistics.median(v), min(v), max(v)


# ---------------------------------------------------------------------------
# Objects
# ---------------------------------------------------------------------------

def bench_pod(name, cpu_milli, memory_mib, extended=None, annotations=None, ns=BENCH_NS):
    """A pod with the trace's CPU and memory requests and extended resources (requests
    equal to limits, as Kubernetes requires for them)."""
    ext = {k: str(v) for k, v in (extended or {}).items()}
    req = dict(ext, cpu="%dm" % cpu_milli, memory="%dMi" % memory_mib)
    container = {"name": "main", "image": "registry.invalid/kgpu-bench:none",
                 "resources": {"requests": req}}
    if ext:
        container["resources"]["limits"] = dict(ext)
    meta = {"name": name, "namespace": ns, "labels": {"app": "kgpu-bench"}}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 0,
                     "automountServiceAccountToken": False, "enableServiceLinks": False}}


def strip_extenders(config_text):
    """The shipped KubeSchedulerConfiguration without its top-level `extenders:` block:
    the same scheduler, without kgpu (the baseline)."""
    out, skipping = [], False
    for line in config_text.splitlines():
        top = bool(line) and not line[0].isspace() and not line.startswith(("#", "-"))
        if top:
            skipping = line.startswith("extenders:")
        if not skipping:
            out.append(line)
    return "\n".join(out) + "\n"


def with_qps(config_text, qps):
    """The configuration with clientConnection.qps/burst set (qps 0: unchanged). kube-scheduler
    defaults to 50/100, which caps the binds it makes itself (not the extender's)."""
    if not qps:
        return config_text
    out = re.sub(r"(?m)^clientConnection:\s*$",
                 "clientConnection:\n  qps: %d\n  burst: %d" % (qps, 2 * qps), config_text)
    if out == config_text:
        raise AssertionError("no top-level clientConnection: in the scheduler configuration")
    return out


def extender_config(text):
    """The chart's extender config with allocateWaitSeconds 0.

    No kubelet and no device plugin run here, so no pod is ever marked
    kgpu.io/allocated; with the shipped 120 s, the extender would keep every
    second pod of the same size off a node for two minutes after the first
    (the rule that lets the device plugin tell same-size pods apart), which
    measures a wait that a real cluster ends in milliseconds."""
    if re.search(r"(?m)^\s*allocateWaitSeconds:", text):
        return re.sub(r"(?m)^(\s*allocateWaitSeconds:\s*).*$", r"\g<1>0", text)
    return text.rstrip("\n") + "\nallocateWaitSeconds: 0\n"


# ---------------------------------------------------------------------------
# Creating objects from several processes
# ---------------------------------------------------------------------------

def _creator(api_args, path, objs, threads, start, out):
    """A creator process: POSTs objs with `threads` threads once `start` is set; puts
    (number created, [errors], first start, last end) on `out`."""
    api = cluster.Api(*api_args)
    lock = threading.Lock()
    idx = [0]
    errors = []
    done = [0]

    def work():
        while True:
            with lock:
                i = idx[0]
                idx[0] += 1
            if i >= len(objs):
                return
            try:
                api.post(path, objs[i])
                if path == "/api/v1/nodes":
                    # As cluster.ControlPlane.add_node: the TaintNodesByCondition admission
                    # plugin gives each new Node the not-ready taint, which only the node
                    # lifecycle controller (not run here) would remove once Ready.
                    api.merge_patch(path + "/" + objs[i]["metadata"]["name"],
                                    {"spec": {"taints": None}})
                with lock:
                    done[0] += 1
            except Exception as e:  # noqa: BLE001 -- reported back to the parent
                with lock:
                    if len(errors) < 5:
                        errors.append(str(e)[:300])
    start.wait()
    t0 = time.monotonic()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put((done[0], errors, t0, time.monotonic()))


class Creators:
    """P processes x T threads creating objects at one path; start() releases them."""

    def __init__(self, cp, path, objs, processes=2, threads=8):
        ctx = multiprocessing.get_context("spawn")
        self.start_ev = ctx.Event()
        self.out = ctx.Queue()
        api_args = ("127.0.0.1", cp.api_port, cp.pki.ca_crt, cp.admin_crt, cp.admin_key)
        self.procs = []
        for k in range(processes):
            part = objs[k::processes]
            p = ctx.Process(target=_creator, args=(api_args, path, part, threads,
                                                   self.start_ev, self.out), daemon=True)
            p.start()
            _CREATORS.append(p)
            self.procs.append(p)
        self.n = len(objs)

    def start(self):
        t = time.monotonic()
        self.start_ev.set()
        return t

    def wait(self, timeout=3600):
        """(created, errors, first start, last end) over every creator."""
        created, errors, t0, t1 = 0, [], None, None
        for _ in self.procs:
            n, errs, a, b = self.out.get(timeout=timeout)
            created += n
            errors += errs
            t0 = a if t0 is None else min(t0, a)
            t1 = b if t1 is None else max(t1, b)
        for p in self.procs:
            p.join(10)
            if p in _CREATORS:
                _CREATORS.remove(p)
        return created, errors, t0, t1


def create_all(cp, path, objs, processes=2, threads=8, what="objects"):
    c = Creators(cp, path, objs, processes, threads)
    c.start()
    created, errors, t0, t1 = c.wait()
    if created != len(objs):
        raise RuntimeError("created %d of %d %s: %s" % (created, len(objs), what, errors))
    return t1 - t0


# ---------------------------------------------------------------------------
# Watching pods
# ---------------------------------------------------------------------------

class PodWatch:
    """Records when each pod of a namespace was first seen bound, or marked unschedulable
    by kube-scheduler, in time.monotonic(). Runs in a daemon thread."""

    def __init__(self, cp, ns=BENCH_NS):
        self.cp, self.ns = cp, ns
        self.bound = {}    # name -> (monotonic time, node)
        self.unsched = {}  # name -> (monotonic time, message)
        self.cond = threading.Condition()
        self.stopping = False
        self.error = None
        lst = cp.admin.get("/api/v1/namespaces/%s/pods?limit=1" % ns)
        self.rv = lst["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _stream(self):
        ctx = ssl.create_default_context(cafile=self.cp.pki.ca_crt)
        ctx.load_cert_chain(self.cp.admin_crt, self.cp.admin_key)
        c = http.client.HTTPSConnection("127.0.0.1", self.cp.api_port, context=ctx, timeout=None)
        q = urllib.parse.urlencode({"watch": "1", "resourceVersion": self.rv,
                                    "allowWatchBookmarks": "true",
                                    "timeoutSeconds": "3000"})
        c.request("GET", "/api/v1/namespaces/%s/pods?%s" % (self.ns, q),
                  headers={"Accept": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError("watch: HTTP %d %s" % (r.status, r.read()[:300]))
        try:
            while not self.stopping:
                line = r.readline()
                if not line:
                    return
                t = time.monotonic()
                ev = json.loads(line)
                obj = ev.get("object") or {}
                if ev.get("type") == "ERROR":
                    raise RuntimeError("watch error: %s" % obj.get("message"))
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    self.rv = rv
                if ev.get("type") in ("ADDED", "MODIFIED"):
                    self._see(obj, t)
        finally:
            c.close()

    def _see(self, obj, t):
        name = obj["metadata"]["name"]
        node = (obj.get("spec") or {}).get("nodeName")
        changed = False
        with self.cond:
            if node and name not in self.bound:
                self.bound[name] = (t, node)
                changed = True
            elif not node and name not in self.unsched:
                for c in (obj.get("status") or {}).get("conditions") or []:
                    if (c.get("type") == "PodScheduled" and c.get("status") == "False"
                            and c.get("reason") == "Unschedulable"):
                        self.unsched[name] = (t, c.get("message", ""))
                        changed = True
            if changed:
                self.cond.notify_all()

    def _run(self):
        while not self.stopping:
            try:
                self._stream()
            except Exception as e:  # noqa: BLE001 -- keep watching; remember the last error
                if self.stopping:
                    return
                self.error = e
                time.sleep(0.2)

    def wait_pod(self, name, timeout):
        """'bound', 'unschedulable' or None (timeout)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                if name in self.bound:
                    return "bound"
                if name in self.unsched:
                    return "unschedulable"
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)

    def wait_count(self, n, stall_timeout, progress=None, settle=5.0):
        """Waits until n pods are bound or marked unschedulable (then `settle` seconds more
        for a marked one to be bound after all), or none has been bound for stall_timeout s.
        True when every pod was bound."""
        last, last_t = -1, time.monotonic()
        next_report = time.monotonic() + 10
        settled_at = None
        with self.cond:
            while len(self.bound) < n:
                now = time.monotonic()
                if len(self.bound) != last:
                    last, last_t = len(self.bound), now
                elif now - last_t > stall_timeout:
                    return False
                if len(self.bound) + len(set(self.unsched) - set(self.bound)) >= n:
                    settled_at = settled_at or now
                    if now - settled_at >= settle:
                        return False
                if progress and now >= next_report:
                    progress(len(self.bound))
                    next_report = now + 10
                self.cond.wait(1.0)
        return True

    def stop(self):
        self.stopping = True


# ---------------------------------------------------------------------------
# Processes and metrics
# ---------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system CPU seconds of a process (its threads included), or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None


def status_mb(pid, field):
    """A kB field of /proc/PID/status (VmHWM: peak resident set, VmRSS: now) in MB, or None."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def peak_rss_mb(pid):
    return status_mb(pid, "VmHWM")


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """Prometheus text -> [(name, {label: value}, float)]."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.append((m.group(1), labels, v))
    return out


def histogram(samples, name, match=None):
    """{'buckets': [(le, cumulative count)], 'sum', 'count'} of one histogram, summed over
    the series whose labels include `match`."""
    match = match or {}
    buckets, total, count = {}, 0.0, 0.0

    def ok(lab):
        return all(lab.get(k) == v for k, v in match.items())
    for n, lab, v in samples:
        if not ok(lab):
            continue
        if n == name + "_bucket":
            le = float("inf") if lab["le"] == "+Inf" else float(lab["le"])
            buckets[le] = buckets.get(le, 0.0) + v
        elif n == name + "_sum":
            total += v
        elif n == name + "_count":
            count += v
    return {"buckets": sorted(buckets.items()), "sum": total, "count": count}


def quantile(h, q):
    """histogram_quantile as Prometheus computes it (linear within the bucket)."""
    b = h["buckets"]
    if not b or b[-1][1] <= 0:
        return None
    rank = q * b[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in b:
        if c >= rank:
            if le == float("inf"):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return b[-1][0]


def scheduler_metrics(cp):
    """kube-scheduler's /metrics from its secure port, as the admin (system:masters)."""
    return parse_metrics(_https_get(cp.scheduler_port, "/metrics", cp, 30)
                         .decode("utf-8", "replace"))


def _https_get(port, path, cp, timeout):
    """GET from a control-plane component's secure port as the admin; the body."""
    ctx = ssl._create_unverified_context()  # self-signed serving certificates
    ctx.load_cert_chain(cp.admin_crt, cp.admin_key)
    c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError("GET %s: HTTP %d %s" % (path, r.status, body[:200]))
        return body
    finally:
        c.close()


class Profiles:
    """CPU profiles over one span (bench --profile): kube-apiserver's and kube-scheduler's
    own pprof endpoints (the API server started with --profiling=true), and kgpu-extender
    under `perf record` when perf is installed. Each goes to DIR/<mode>-<component>.*, with
    a `-top.txt` beside it (go tool pprof -top, perf report)."""

    def __init__(self, out_dir, mode, cp, seconds, ext_pid=None):
        self.out, self.mode, self.cp, self.seconds = out_dir, mode, cp, seconds
        self.ext_pid = ext_pid
        self.threads, self.perf, self.files = [], None, []
        os.makedirs(out_dir, exist_ok=True)

    def _pprof(self, name, port):
        path = os.path.join(self.out, "%s-%s.pprof" % (self.mode, name))
        try:
            data = _https_get(port, "/debug/pprof/profile?seconds=%d" % self.seconds, self.cp,
                              self.seconds + 60)
            with open(path, "wb") as f:
                f.write(data)
            self.files.append(path)
        except Exception as e:  # noqa: BLE001 -- a profile missing is not a failed run
            log("profile of %s: %s" % (name, e))

    def start(self):
        for name, port in (("kube-apiserver", self.cp.api_port),
                           ("kube-scheduler", self.cp.scheduler_port)):
            t = threading.Thread(target=self._pprof, args=(name, port), daemon=True)
            t.start()
            self.threads.append(t)
        perf = shutil.which("perf")
        if self.ext_pid and perf:
            path = os.path.join(self.out, "%s-kgpu-extender.perf" % self.mode)
            self.perf = (subprocess.Popen(
                [perf, "record", "-q", "-e", "cpu-clock", "-g", "-p", str(self.ext_pid), "-o",
                 path, "--", "sleep", str(self.seconds)], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL), path)

    def finish(self):
        for t in self.threads:
            t.join(self.seconds + 90)
        if self.perf:
            self.perf[0].wait(self.seconds + 60)
            self.files.append(self.perf[1])
        go = shutil.which("go") or ("/usr/local/go/bin/go"
                                    if os.path.exists("/usr/local/go/bin/go") else None)
        for path in self.files:
            top = os.path.splitext(path)[0] + "-top.txt"
            if path.endswith(".pprof") and go:
                argv = [go, "tool", "pprof", "-top", "-nodecount=40", path]
            elif path.endswith(".perf"):
                argv = ["perf", "report", "-i", path, "--no-children", "--sort", "dso,sym",
                        "--stdio", "--percent-limit", "0.5"]
            else:
                continue
            with open(top, "w") as f:
                subprocess.run(argv, stdout=f, stderr=subprocess.DEVNULL, timeout=300)
        log("%s: profiles in %s" % (self.mode, self.out))


def scheduler_breakdown(samples):
    """Mean milliseconds per scheduling attempt in each extension point and in total."""
    out = {}
    att = histogram(samples, "scheduler_scheduling_attempt_duration_seconds",
                    {"result": "scheduled"})
    if att["count"]:
        out["attempt_scheduled_mean_ms"] = round(1000 * att["sum"] / att["count"], 3)
        p99 = quantile(att, 0.99)
        out["attempt_scheduled_p99_ms"] = round(1000 * p99, 3) if p99 is not None else None
        out["attempts_scheduled"] = int(att["count"])
    points = sorted({lab.get("extension_point") for n, lab, v in samples
                     if n == "scheduler_framework_extension_point_duration_seconds_count"})
    for p in points:
        h = histogram(samples, "scheduler_framework_extension_point_duration_seconds",
                      {"extension_point": p, "status": "Success"})
        if h["count"]:
            out["point_%s_mean_ms" % p] = round(1000 * h["sum"] / h["count"], 3)
    for name in ("scheduler_scheduling_algorithm_duration_seconds",
                 "scheduler_e2e_scheduling_duration_seconds",
                 "scheduler_pod_scheduling_sli_duration_seconds"):
        h = histogram(samples, name)
        if h["count"]:
            out[name.replace("scheduler_", "").replace("_seconds", "") + "_mean_ms"] = \
                round(1000 * h["sum"] / h["count"], 3)
    return out


def extender_latency(ext):
    """p50/p99 ms per verb of kgpu_extender_request_duration_seconds, and the worst p99;
    out["connections"]: connections the extender accepted (each a TLS handshake)."""
    samples = parse_metrics(ext.metrics())
    out, worst = {}, None
    acc = [v for n, _, v in samples if n == "kgpu_extender_http_connections_total"]
    if acc:
        out["connections"] = int(acc[0])
    for verb in ("filter", "prioritize", "bind", "filter-gpuless", "prioritize-gpuless"):
        h = histogram(samples, "kgpu_extender_request_duration_seconds", {"verb": verb})
        if not h["count"]:
            continue
        p50, p99 = quantile(h, 0.5), quantile(h, 0.99)
        out[verb] = {"count": int(h["count"]), "mean_ms": round(1000 * h["sum"] / h["count"], 3),
                     "p50_ms": round(1000 * p50, 3), "p99_ms": round(1000 * p99, 3)}
        worst = p99 if worst is None else max(worst, p99)
    return out, (round(1000 * worst, 3) if worst is not None else None)


# ---------------------------------------------------------------------------
# A control plane with or without kgpu
# ---------------------------------------------------------------------------

def start_control_plane(workdir, bindir, profiling=False):
    cp = cluster.ControlPlane(workdir, bindir, log=log).start(
        apiserver_args=["--profiling=true"] if profiling else ())
    cp.ensure_namespace(BENCH_NS)
    return cp


def install_kgpu(cp, build_dir, values=()):
    """kgpu's objects from the chart (kustomize with KGPU_E2E_KUSTOMIZE=1), with extra chart
    `values` (KEY=VALUE), and the extender as a process; returns (scheduler config text,
    Extender)."""
    sched_text, ext_text = kgpu_deploy.install(
        cp, build_dir, values=["extender.config.allocateWaitSeconds=0"] + list(values))
    ext = kgpu_deploy.Extender(cp, build_dir, extender_config(ext_text), name="kgpu-extender")
    ext.start()
    cluster.wait_for(ext.ready, 300, "the extender's /readyz", interval=0.2)
    return sched_text, ext


def shipped_scheduler_config():
    """deploy/extender/scheduler-config.yaml, for the baseline when kgpu is not installed."""
    with open(os.path.join(REPO, "deploy", "extender", "scheduler-config.yaml")) as f:
        return f.read()


def wait_scheduler_leader(cp, timeout=60):
    """With leaderElect (the shipped setting) kube-scheduler schedules once it holds its Lease."""
    def leader():
        lease = cp.admin.try_get(
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-scheduler")
        return lease and (lease.get("spec") or {}).get("holderIdentity")
    if "leaderElect: true" in open(cp.p("kube-scheduler-config.yaml")).read():
        cluster.wait_for(leader, timeout, "kube-scheduler to take its Lease", interval=0.2)


def process_table(cp, ext=None):
    """{name: pid} of the processes whose CPU the benchmarks report."""
    pids = {name: c.pid for name, c in cp.children.items()
            if name in ("etcd", "kube-apiserver", "kube-scheduler")}
    if ext is not None:
        pids["kgpu-extender"] = ext.child.pid
    return pids


def cpu_snapshot(pids):
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def cpu_delta(before, after):
    return {k: (round(after[k] - before[k], 2) if after.get(k) is not None and
                before.get(k) is not None else None) for k in before}
