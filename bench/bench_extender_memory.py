#!/usr/bin/env python3
"""Peak memory of kgpu-extender under the worst request mix, against its container limit.

The shipped Deployment gives the extender 256 Mi. This starts the extender on
a cluster file of --nodes GPU nodes (8 GPUs each) with --pods pods bound
through filter and bind, then, all at once for --seconds:

- slow clients holding connections with almost a full header buffer each,
- stalled uploads of the largest body accepted (Content-Length maxBodyBytes,
  half sent, then nothing), more than the buffer budget admits,
- filters with maxNodeNames names and with far more (refused), and bodies
  that would parse into trees much larger than themselves,
- /inspect of the whole cluster, from several clients in a loop,
- and kube-scheduler's ordinary filter calls, whose latency is reported.

It samples VmRSS/VmHWM of the extender from /proc every 50 ms and prints the
peak against the limit. Measure a build without sanitizers (ASan's shadow
memory and quarantine would dominate):

    cmake -S . -B build-12a/rel -DCMAKE_BUILD_TYPE=RelWithDebInfo
    cmake --build build-12a/rel --target kgpu-extender
    bench/bench_extender_memory.py --extender build-12a/rel/kgpu-extender

--serve-threads 0 runs libmicrohttpd with a thread per connection instead of
epoll, for comparison. Exit status 1 when the peak passes --limit-mib.
"""

import argparse
import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time


def vm(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "Threads"):
                out[k] = int(v.split()[0])
    return out


def request(port, method, path, body=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        c.request(method, path, body=body, headers=hdrs)
        r = c.getresponse()
        return r.status, r.read()
    except (OSError, http.client.HTTPException) as e:
        return None, str(e).encode()
    finally:
        c.close()


def pod(name, mem=4):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": "uid-" + name},
            "spec": {"containers": [{"name": "main", "resources": {
                "limits": {"kgpu.io/gpu-mem": str(mem)}}}]}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--extender", default="build-12a/rel/kgpu-extender")
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--slow", type=int, default=2000, help="slow connections")
    ap.add_argument("--uploads", type=int, default=16, help="stalled max-size uploads")
    ap.add_argument("--inspectors", type=int, default=4)
    ap.add_argument("--big", type=int, default=2, help="clients sending huge name lists and bombs")
    ap.add_argument("--serve-threads", type=int, default=None)
    ap.add_argument("--limit-mib", type=float, default=256)
    ap.add_argument("--extra", default="", help="more extender flags, space-separated")
    a = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = a.slow + a.uploads + 512
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    tmp = tempfile.mkdtemp(prefix="kgpu-bench-mem-")
    names = ["node-%05d" % i for i in range(a.nodes)]
    cluster = {"nodes": [{"name": n, "gpus": [
        {"uuid": "GPU-%s-%d" % (n, g), "model": "A100-SXM4-80GB", "memory_mib": 81920}
        for g in range(8)]} for n in names]}
    with open(os.path.join(tmp, "cluster.yaml"), "w") as f:
        json.dump(cluster, f)  # JSON is YAML
    argv = [a.extender, "--cluster-file", os.path.join(tmp, "cluster.yaml"),
            "--listen", "127.0.0.1:0", "--port-file", os.path.join(tmp, "port"),
            "--probe-listen", "", "--log-level", "warn"] + a.extra.split()
    if a.serve_threads is not None:
        argv += ["--serve-threads", str(a.serve_threads)]
    ext = subprocess.Popen(argv, stderr=open(os.path.join(tmp, "log"), "w"))
    try:
        deadline = time.time() + 60
        while not os.path.exists(os.path.join(tmp, "port")) or \
                not open(os.path.join(tmp, "port")).read().endswith("\n"):
            if ext.poll() is not None or time.time() > deadline:
                sys.exit("extender did not start: " + open(os.path.join(tmp, "log")).read())
            time.sleep(0.1)
        port = int(open(os.path.join(tmp, "port")).read())
        # The state: pods bound through filter and bind, as kube-scheduler would.
        for i in range(a.pods):
            p = pod("p%d" % i)
            window = [names[(i * 7 + k) % a.nodes] for k in range(500)]
            st, res = request(port, "POST", "/filter", json.dumps(
                {"Pod": p, "NodeNames": window, "Nodes": None}))
            ok = json.loads(res)["NodeNames"]
            request(port, "POST", "/bind", json.dumps(
                {"PodName": p["metadata"]["name"], "PodNamespace": "default",
                 "PodUID": p["metadata"]["uid"], "Node": ok[0]}))
        base = vm(ext.pid)
        print("state: %d nodes, %d GPUs, %d pods bound; VmRSS %.1f MiB"
              % (a.nodes, a.nodes * 8, a.pods, base["VmRSS"] / 1024))
        max_body = 8 << 20  # the default maxBodyBytes
        if "--max-body-bytes" in a.extra:
            max_body = int(a.extra.split("--max-body-bytes")[1].split()[0])

        stop = threading.Event()
        counts = {}
        lock = threading.Lock()

        def count(k):
            with lock:
                counts[k] = counts.get(k, 0) + 1

        socks = []
        slow_done = threading.Event()

        def slow_clients():
            try:
                slow_clients_open()
            finally:
                slow_done.set()

        def slow_clients_open():
            hdr = b"POST /filter HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 12000
            for i in range(a.slow):
                if stop.is_set():
                    return
                try:
                    s = socket.socket()
                    s.bind(("127.0.0.%d" % (2 + i % 10), 0))
                    s.connect(("127.0.0.1", port))
                    s.sendall(hdr)
                    socks.append(s)
                except OSError:
                    count("slow refused")

        def stalled_uploads():
            while not stop.is_set():
                held = []
                for _ in range(a.uploads):
                    try:
                        s = socket.create_connection(("127.0.0.1", port))
                        s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                                  % max_body)
                        s.sendall(b" " * (max_body // 2))
                        held.append(s)
                        count("upload started")
                    except OSError:
                        count("upload refused")
                stop.wait(5)
                for s in held:
                    s.close()

        big_names = json.dumps({"Pod": pod("big"), "NodeNames": names * 4, "Nodes": None})
        bomb = "[" + ",".join(["{}"] * 1000000) + "]"

        def big_requests():
            while not stop.is_set():
                for body in (big_names, bomb):
                    st, _ = request(port, "POST", "/filter", body)
                    count("big %s" % st)

        def inspectors():
            while not stop.is_set():
                st, body = request(port, "GET", "/inspect", timeout=60)
                count("inspect %s" % st)

        lat = []

        def scheduler():
            # Measured once the slow clients are in: the bench's own connection storm shares
            # this interpreter's lock, and would be counted as the extender's latency.
            slow_done.wait()
            i = 0
            while not stop.is_set():
                p = pod("s%d" % i)
                i += 1
                t0 = time.monotonic()
                st, _ = request(port, "POST", "/filter", json.dumps(
                    {"Pod": p, "NodeNames": names[:500], "Nodes": None}))
                lat.append(time.monotonic() - t0)
                count("filter %s" % st)
                time.sleep(0.02)

        peak = {"VmRSS": 0, "Threads": 0}

        def sampler():
            while not stop.is_set():
                v = vm(ext.pid)
                peak["VmRSS"] = max(peak["VmRSS"], v["VmRSS"])
                peak["Threads"] = max(peak["Threads"], v["Threads"])
                stop.wait(0.05)

        threads = [threading.Thread(target=f) for f in
                   [sampler, slow_clients, stalled_uploads, scheduler]
                   + [big_requests] * a.big + [inspectors] * a.inspectors]
        for t in threads:
            t.start()
        stop.wait(a.seconds)
        stop.set()
        for t in threads:
            t.join(120)
        end = vm(ext.pid)
        for s in socks:
            s.close()
        lat.sort()
        hwm = end["VmHWM"] / 1024
        print("mix: %d slow connections held, %d stalled %d-byte uploads at a time, "
              "%d inspectors, %.0f s" % (len(socks), a.uploads, max_body, a.inspectors,
                                           a.seconds))
        print("answers: " + ", ".join("%s: %d" % kv for kv in sorted(counts.items())))
        if lat:
            print("kube-scheduler filter (500 names) during the mix: p50 %.1f ms, p99 %.1f ms, "
                  "max %.1f ms" % (lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3,
                                   lat[-1] * 1e3))
        print("peak threads %d" % peak["Threads"])
        print("peak RSS (VmHWM) %.1f MiB of the %.0f MiB limit (%.0f %%); idle with state %.1f MiB"
              % (hwm, a.limit_mib, 100 * hwm / a.limit_mib, base["VmRSS"] / 1024))
        return 0 if hwm <= a.limit_mib else 1
    finally:
        ext.terminate()
        try:
            ext.wait(30)
        except subprocess.TimeoutExpired:
            ext.kill()


if __name__ == "__main__":
    sys.exit(main())
