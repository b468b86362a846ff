#!/usr/bin/env python3
"""kgpu-extender under attack from the network (stdlib only): issue 12.

Each test plays one attack on the real binary (cluster-file mode: no API
server needed) and asserts, within a deadline, that the extender keeps
serving and that its state stays exact:

- thousands of slow connections: /healthz on the probe port still answers
  within 1 s, and a filter on the scheduling port is still answered;
- bytes trickled one at a time cannot extend a connection past
  --request-timeout;
- HTTP framing: conflicting Content-Length is 400, so is Transfer-Encoding
  together with Content-Length; an oversized one is 413
  before any body is sent, a chunked body that never ends is cut off;
- /inspect/%ff is a 400, not a 500;
- memory: stalled uploads are refused past --max-buffered-bytes (asserted on
  the bytes the extender accounts, from /metrics), huge node lists and
  bodies that would parse into huge trees are refused; the RSS read from
  /proc is printed.

    test_extender_hardening.py --extender PATH [unittest arguments...]

Exit status: unittest's; 77 when the binary is missing.
"""

import argparse
import json
import os
import resource
import socket
import sys
import threading
import time
import unittest

import test_extender as te
from harness import run_tests, wait_for
from test_extender import (CLUSTER_YAML, ExtenderTest, container, free_port, http_request,
                           pod_object, share)

# Source addresses for the attackers: any 127.0.0.0/8 address reaches loopback,
# so per-client limits can be exercised from one machine.
ATTACKERS = ["127.0.0.%d" % i for i in range(2, 12)]


def proc_memory(pid):
    """(VmRSS, VmHWM) of pid in bytes, from /proc."""
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) * 1024
    return out.get("VmRSS", 0), out.get("VmHWM", 0)


def raw_exchange(port, data, timeout=5.0, source=None):
    """Sends data on a fresh connection and reads until the server closes: (bytes, seconds)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                 source_address=(source, 0) if source else None)
    t0 = time.monotonic()
    out = b""
    try:
        s.sendall(data)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except OSError:
        pass
    finally:
        s.close()
    return out, time.monotonic() - t0


def status_of(reply):
    try:
        return int(reply.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def closed_by_peer(sock, timeout):
    """Whether the server ends the connection within timeout (EOF or reset)."""
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(4096):
                return True
    except socket.timeout:
        return False
    except OSError:
        return True


class HardeningTest(ExtenderTest):
    """A cluster-file extender with a probe port; helpers for its endpoints."""

    def start(self, extra=(), cluster=CLUSTER_YAML):
        self.probe_port = free_port()
        self.ext = self.start_extender(
            ["--cluster-file", cluster, "--probe-listen", "127.0.0.1:%d" % self.probe_port]
            + list(extra), wait_ready=False)
        wait_for(lambda: http_request(self.probe_port, "GET", "/readyz")[0] == 200, 60,
                 what="/readyz on the probe port")
        return self.ext

    def pod(self, name, mem=4):
        p = pod_object(name, [container("main", share(mem=mem))])
        p["metadata"].update(namespace="default", uid="uid-" + name)
        return p

    def assert_state_exact(self, expect_pods):
        """/inspect holds exactly the pods bound by the test, nothing from the attacks."""
        doc = self.ext.inspect()
        held = sorted(p["pod"] for n in doc["nodes"] for g in n["gpus"] for p in g["pods"])
        self.assertEqual(held, sorted(expect_pods))
        self.assertEqual(doc["totals"]["pods"], len(expect_pods))

    def schedule(self, name):
        p = self.pod(name)
        res = self.ext.filter(p, ["gpu-t4-0", "gpu-v100-0"])
        self.assertTrue(res["NodeNames"], res)
        self.assertEqual(self.ext.bind(p, res["NodeNames"][0]), "")

    def metric(self, name, labels=None):
        return self.ext.metric(name, labels)

    def print_memory(self, what):
        rss, hwm = proc_memory(self.ext.child.pid)
        sys.stderr.write("\n  [%s: extender VmRSS %.1f MiB, VmHWM %.1f MiB (ASan build: "
                         "shadow memory included)]\n" % (what, rss / 2**20, hwm / 2**20))


class TestLockOut(HardeningTest):

    def test_thousands_of_slow_connections(self):
        want = 2000
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        need = want + 600
        if soft < need:
            if hard != resource.RLIM_INFINITY and hard < need:
                self.skipTest("RLIMIT_NOFILE hard limit %d < %d" % (hard, need))
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        per_client = 256
        self.start(["--max-connections", "3000", "--max-connections-per-client", str(per_client)])
        # Attackers: each connection sends a request line and stops, from ten addresses.
        socks = []
        self.addCleanup(lambda: [s.close() for s in socks])
        for i in range(want):
            s = socket.socket()
            s.setblocking(True)
            s.bind((ATTACKERS[i % 8], 0))
            s.connect(("127.0.0.1", self.ext.port))
            s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        wait_for(lambda: (self.metric("kgpu_extender_http_connections") or 0) >= want, 20,
                 interval=0.2, what="%d connections held" % want)
        held = self.metric("kgpu_extender_http_connections")
        # The probe port answers within 1 s, again and again.
        worst = 0.0
        for _ in range(5):
            t0 = time.monotonic()
            status, _, body = http_request(self.probe_port, "GET", "/healthz", timeout=1.0)
            worst = max(worst, time.monotonic() - t0)
            self.assertEqual((status, body), (200, b"ok\n"))
        self.assertLess(worst, 1.0)
        # kube-scheduler, from its own address, is still answered.
        t0 = time.monotonic()
        self.schedule("during-attack")
        took = time.monotonic() - t0
        sys.stderr.write("\n  [%d slow connections held (%d by the extender's count); /healthz on "
                         "the probe port worst %.3f s; filter+bind %.3f s]\n"
                         % (len(socks), held, worst, took))
        self.print_memory("%d slow connections" % len(socks))
        # One address cannot take more than its share: the extra connections are closed.
        extra = []
        self.addCleanup(lambda: [s.close() for s in extra])
        for _ in range(40):
            s = socket.create_connection(("127.0.0.1", self.ext.port),
                                         source_address=(ATTACKERS[0], 0))
            extra.append(s)
        room = per_client - want // 8  # what ATTACKERS[0] had left of its share

        def still_open():
            n = 0
            for s in extra:
                try:
                    n += s.recv(1, socket.MSG_DONTWAIT) != b""
                except BlockingIOError:
                    n += 1
                except OSError:
                    pass
            return n
        wait_for(lambda: still_open() <= room, 5, interval=0.1,
                 what="connections past the per-client limit closed")
        self.assert_state_exact(["during-attack"])

    def test_trickled_bytes_do_not_extend_the_deadline(self):
        self.start(["--request-timeout", "2"])
        socks = [socket.create_connection(("127.0.0.1", self.ext.port)) for _ in range(20)]
        self.addCleanup(lambda: [s.close() for s in socks])
        request = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b" " * 100
        t0 = time.monotonic()
        alive = list(socks)
        sent = 0
        # One byte per connection every 0.25 s: a request that would take 40 s in all.
        while alive and time.monotonic() - t0 < 10:
            for s in list(alive):
                try:
                    s.send(request[sent:sent + 1])
                except OSError:
                    alive.remove(s)
            sent += 1
            time.sleep(0.25)
        took = time.monotonic() - t0
        self.assertEqual(alive, [], "trickling connections outlived the 2 s deadline")
        self.assertLess(took, 8.0)
        sys.stderr.write("\n  [20 trickling connections closed after %.1f s (deadline 2 s)]\n"
                         % took)
        self.assertGreaterEqual(self.metric("kgpu_extender_http_deadline_closes_total"), 20)
        # An idle connection is closed at the deadline too; a prompt request is served.
        idle = socket.create_connection(("127.0.0.1", self.ext.port))
        self.addCleanup(idle.close)
        self.assertTrue(closed_by_peer(idle, 6.0))
        self.schedule("after-trickle")
        self.assert_state_exact(["after-trickle"])


class TestFraming(HardeningTest):

    def setUp(self):
        super().setUp()
        self.start(["--max-body-bytes", "65536", "--request-timeout", "3"])

    def test_conflicting_content_length(self):
        reply, _ = raw_exchange(self.ext.port, b"POST /filter HTTP/1.1\r\nHost: x\r\n"
                                b"Content-Length: 2\r\nContent-Length: 20\r\n\r\n{}")
        self.assertEqual(status_of(reply), 400, reply)
        self.assertIn(b"Content-Length", reply)
        reply, _ = raw_exchange(self.ext.port, b"POST /filter HTTP/1.1\r\nHost: x\r\n"
                                b"Content-Length: 2, 20\r\n\r\n{}")
        self.assertEqual(status_of(reply), 400, reply)
        self.assertGreaterEqual(self.metric("kgpu_extender_http_refused_total",
                                            {"reason": "bad_framing"}), 1)

    def test_chunked_with_content_length_is_refused(self):
        # RFC 9112 6.1: a proxy reading the other header would see a second,
        # smuggled request; refused, and nothing after it on the connection is served.
        body = b'{"PodName":"p","PodNamespace":"d","PodUID":"u","Node":"n"}'
        reply, took = raw_exchange(self.ext.port, b"POST /bind HTTP/1.1\r\nHost: x\r\n"
                                   b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
                                   b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) +
                                   b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertEqual(status_of(reply), 400, reply)
        self.assertIn(b"Transfer-Encoding", reply)
        self.assertEqual(reply.count(b"HTTP/1.1 "), 1, reply)
        self.assertLess(took, 2.0)

    def test_oversized_content_length_is_refused_before_the_body(self):
        for extra in (b"", b"Expect: 100-continue\r\n"):
            reply, took = raw_exchange(self.ext.port, b"POST /filter HTTP/1.1\r\nHost: x\r\n"
                                       b"Content-Length: 1000000000\r\n" + extra + b"\r\n")
            self.assertEqual(status_of(reply), 413, reply)
            self.assertNotIn(b"100 Continue", reply)
            self.assertLess(took, 2.0)
        self.assertEqual(self.metric("kgpu_extender_http_refused_total", {"reason": "too_large"}),
                         2)

    def test_endless_chunked_body_is_ended(self):
        # Fast: cut off at --max-body-bytes.
        s = socket.create_connection(("127.0.0.1", self.ext.port), timeout=10)
        self.addCleanup(s.close)
        s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        t0, sent = time.monotonic(), 0
        try:
            while time.monotonic() - t0 < 10:
                s.sendall(b"1000\r\n" + b" " * 4096 + b"\r\n")
                sent += 4096
        except OSError:
            pass
        self.assertLess(time.monotonic() - t0, 10, "an endless chunked body was drained")
        self.assertLess(sent, 4 << 20)
        # Slow: cut off at --request-timeout.
        s2 = socket.create_connection(("127.0.0.1", self.ext.port), timeout=10)
        self.addCleanup(s2.close)
        s2.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < 10:
                s2.sendall(b"10\r\n" + b" " * 16 + b"\r\n")
                time.sleep(0.1)
        except OSError:
            pass
        self.assertLess(time.monotonic() - t0, 8, "a slow endless chunked body was drained")
        self.assertEqual(self.ext.get("/healthz"), (200, "ok\n"))

    def test_inspect_of_a_byte_no_name_has(self):
        for path in ("/inspect/%ff", "/inspect/%c3%28", "/inspect/" + "a" * 300):
            status, _, body = http_request(self.ext.port, "GET", path)
            self.assertEqual(status, 400, (path, body))
        status, _, _ = http_request(self.ext.port, "GET", "/inspect/no-such-node")
        self.assertEqual(status, 404)
        status, _, _ = http_request(self.ext.port, "GET", "/inspect/gpu-t4-0")
        self.assertEqual(status, 200)

    def test_probe_port_serves_only_probes(self):
        for path, want in (("/healthz", 200), ("/readyz", 200), ("/version", 200),
                           ("/inspect", 404), ("/metrics", 404)):
            self.assertEqual(http_request(self.probe_port, "GET", path)[0], want, path)
        self.assertNotEqual(http_request(self.probe_port, "POST", "/filter", "{}")[0], 200)


class TestMetricsStream(HardeningTest):
    """/metrics of a large cluster is written as the client reads it, from a snapshot;
    slow readers hold at most EXT_METRICS_STREAMS (4) snapshots."""

    NODES, GPUS = 4000, 8  # ~20 MB of text: more than loopback's socket buffers hold

    def big_cluster(self):
        path = os.path.join(self.tmp, "big-cluster.json")
        nodes = [{"name": "node-%04d" % i,
                  "gpus": [{"index": g, "uuid": "GPU-%04d-%d" % (i, g), "model": "Tesla T4",
                            "memory_mib": 15360} for g in range(self.GPUS)]}
                 for i in range(self.NODES)]
        with open(path, "w") as f:
            json.dump({"nodes": nodes}, f)
        return path

    def test_slow_readers_hold_at_most_four_snapshots(self):
        self.start(cluster=self.big_cluster())
        readers = []
        self.addCleanup(lambda: [s.close() for s in readers])
        for _ in range(4):
            s = socket.create_connection(("127.0.0.1", self.ext.port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(20)
            head = s.recv(1024)
            self.assertEqual(status_of(head), 200, head)
            self.assertIn(b"chunked", head.lower())
            readers.append(s)  # and never read again
        status, _, body = http_request(self.ext.port, "GET", "/metrics", timeout=20)
        self.assertEqual(status, 503, body[:300])
        self.assertIn(b"too many /metrics answers", body)
        # Nothing else waits on them: probes, the scheduling verbs.
        self.assertEqual(http_request(self.probe_port, "GET", "/healthz")[0], 200)
        self.print_memory("4 /metrics readers stalled on a %d-GPU cluster"
                          % (self.NODES * self.GPUS))
        p = self.pod("during-stall")
        res = self.ext.filter(p, ["node-0001", "node-0002"])
        self.assertEqual(sorted(res["NodeNames"]), ["node-0001", "node-0002"])
        self.assertEqual(self.ext.bind(p, "node-0001"), "")
        for s in readers:
            s.close()
        # Closed, their snapshots go, and a whole scrape reads every GPU of every family.
        text = wait_for(lambda: (lambda r: r[2] if r[0] == 200 else None)(
            http_request(self.ext.port, "GET", "/metrics", timeout=60)), 20,
            what="/metrics answered again")
        text = text.decode()
        self.assertTrue(text.endswith("\n"))
        for family in ("kgpu_gpu_memory_allocated_mib", "kgpu_gpu_memory_capacity_mib",
                       "kgpu_gpu_compute_allocated_milli", "kgpu_gpu_compute_capacity_milli",
                       "kgpu_gpu_pods"):
            self.assertEqual(text.count("# TYPE %s gauge\n" % family), 1, family)
            self.assertEqual(text.count("\n%s{" % family), self.NODES * self.GPUS, family)
        self.assertIn('kgpu_gpu_memory_allocated_mib{node="node-0001",gpu="', text)
        held = [line for line in text.splitlines()
                if line.startswith('kgpu_gpu_pods{node="node-0001"') and line.endswith(" 1")]
        self.assertEqual(len(held), 1, held)
        self.assertIn("\nkgpu_extender_ready 1\n", text)
        self.assertEqual(text.count("\n# TYPE kgpu_extender_requests_total counter\n"), 1)


class TestMemory(HardeningTest):

    def test_stalled_uploads_are_refused_past_the_budget(self):
        mib = 1 << 20
        self.start(["--max-body-bytes", str(mib), "--max-buffered-bytes", str(4 * mib),
                    "--request-timeout", "20"])
        stalled = []
        self.addCleanup(lambda: [s.close() for s in stalled])
        head = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{" % mib
        for _ in range(4):
            s = socket.create_connection(("127.0.0.1", self.ext.port))
            s.sendall(head)
            stalled.append(s)
        wait_for(lambda: self.metric("kgpu_extender_http_buffered_bytes") == 4 * mib, 10,
                 what="4 stalled uploads charged")
        # The fifth upload does not fit: 503 before its body is sent.
        reply, took = raw_exchange(self.ext.port, head)
        self.assertEqual(status_of(reply), 503, reply)
        self.assertIn(b"Retry-After", reply)
        # Small calls still get through: their bodies are charged when they fit.
        self.assertEqual(http_request(self.ext.port, "GET", "/healthz")[0], 200)
        self.print_memory("4 stalled 1 MiB uploads")
        for s in stalled:
            s.close()
        wait_for(lambda: self.metric("kgpu_extender_http_buffered_bytes") == 0, 10,
                 what="the budget given back")
        self.assertEqual(self.metric("kgpu_extender_http_buffered_bytes_peak"), 4 * mib)
        self.schedule("after-uploads")
        self.assert_state_exact(["after-uploads"])

    def test_huge_node_lists_and_trees_are_refused(self):
        self.start(["--max-body-bytes", str(8 << 20), "--max-buffered-bytes", str(64 << 20),
                    "--max-node-names", "5000"])
        pod = self.pod("p")
        # 700,000 names (the fast path) and 100,000 with an escape (jansson's path).
        for names, escaped in ((["n%d" % i for i in range(700000)], False),
                               (["n%d" % i for i in range(100000)], True)):
            body = json.dumps({"Pod": pod, "NodeNames": names})
            if escaped:
                body = body.replace('"n1"', '"\\u006e1"', 1)
            status, obj = self.ext.post_json("filter", body)
            # Refused by the count of names, or before parsing by what parsing would cost.
            self.assertIn(status, (400, 413), obj)
            self.assertIn("maxNodeNames" if status == 400 else "too complex", obj["Error"])
        # Bodies that would parse into trees far larger than themselves.
        for bomb in ("[" + ",".join(["[]"] * 2000000) + "]",
                     '{"Pod": {}, "x": [' + ",".join(["{}"] * 1000000) + "]}"):
            status, obj = self.ext.post_json("filter", bomb)
            self.assertIn(status, (413, 503), obj)
        hwm = proc_memory(self.ext.child.pid)[1]
        self.print_memory("a million names, tree bombs")
        self.assertLessEqual(self.metric("kgpu_extender_http_buffered_bytes_peak"), 64 << 20)
        sys.stderr.write("  [bytes accounted at peak: %.1f MiB of 64]\n"
                         % (self.metric("kgpu_extender_http_buffered_bytes_peak") / 2**20))
        self.assertGreater(hwm, 0)
        self.schedule("after-bombs")
        self.assert_state_exact(["after-bombs"])

    def test_limits_that_cannot_hold_are_refused(self):
        import subprocess
        out = subprocess.run([te.EXTENDER_BIN, "--cluster-file", CLUSTER_YAML,
                              "--max-body-bytes", str(8 << 20), "--max-buffered-bytes",
                              str(1 << 20)], capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("maxBufferedBytes", out.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--extender", required=True)
    args, rest = ap.parse_known_args()
    if not os.access(args.extender, os.X_OK):
        print("skipped: no extender binary at %s" % args.extender)
        return 77
    te.EXTENDER_BIN = args.extender
    return run_tests(sys.argv[0], rest)


if __name__ == "__main__":
    sys.exit(main())
