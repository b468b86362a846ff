#!/usr/bin/env python3
"""Black-box tests of `kgpu report` (docs/autoscaling.md "Cost per team").

The real kgpu binary reads a text exposition from a file, from a small HTTP
server standing for the extender's /metrics, and from the real extender run
with --prices; and asks a stand-in of Prometheus' HTTP API for the increase
over a range. Each test checks the numbers printed, not only the exit status.
Python 3, standard library only.
"""
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_extender as te  # noqa: E402
from test_extender import (A100, ExtenderTest, container, gpu_list, pod_object,  # noqa: E402
                           share, whole)

EXPOSITION = """\
# HELP kgpu_namespace_gpu_seconds_total GPU time.
# TYPE kgpu_namespace_gpu_seconds_total counter
kgpu_namespace_gpu_seconds_total{namespace="team-a",queue="",model="T4",capacity_type="spot"} 7200
kgpu_namespace_gpu_seconds_total{namespace="team-a",queue="",model="V100",capacity_type="on-demand"} 3600
kgpu_namespace_gpu_seconds_total{namespace="team-b",queue="research",model="A100",capacity_type="on-demand"} 1800
kgpu_namespace_gpus_allocated{namespace="team-a",queue="",model="T4",capacity_type="spot"} 1
kgpu_namespace_gpu_cost_total{namespace="team-a",queue="",model="T4",capacity_type="spot",currency="EUR"} 0.24
kgpu_namespace_gpu_cost_total{namespace="team-b",queue="research",model="A100",capacity_type="on-demand",currency="EUR"} 1.8
kgpu_unpriced_gpu_seconds_total{model="V100",capacity_type="on-demand"} 3600
kgpu_extender_ready 1
"""


class Server:
    """A one-thread HTTP server answering GETs with handler(path) -> (status, body)."""

    def __init__(self, handler):
        outer = self
        self.paths = []

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.paths.append(self.path)
                status, body = handler(self.path)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def kgpu(*args):
    return subprocess.run([te.KGPU_BIN, "report"] + list(args), capture_output=True, text=True,
                          timeout=60)


class ReportTest(ExtenderTest):

    def report_json(self, *args):
        out = kgpu(*args, "--output", "json")
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout)

    def serve(self, handler):
        s = Server(handler)
        self.addCleanup(s.close)
        return s

    def check_numbers(self, doc):
        rows = {(r["namespace"], r["queue"], r["model"], r["capacity_type"]):
                (r["gpu_hours"], r.get("cost"), r.get("currency")) for r in doc["rows"]}
        self.assertEqual(rows, {("team-a", "", "T4", "spot"): (2.0, 0.24, "EUR"),
                                ("team-a", "", "V100", "on-demand"): (1.0, None, None),
                                ("team-b", "research", "A100", "on-demand"):
                                (0.5, 1.8, "EUR")})
        totals = {t["namespace"]: (t["gpu_hours"], t.get("cost"), t.get("currency"))
                  for t in doc["namespaces"]}
        self.assertEqual(totals, {"team-a": (3.0, 0.24, "EUR"), "team-b": (0.5, 1.8, "EUR")})
        self.assertEqual(doc["unpriced"],
                         [{"model": "V100", "capacity_type": "on-demand", "gpu_hours": 1.0}])


class TestFromMetrics(ReportTest):

    def write(self, text):
        path = os.path.join(self.tmp, "metrics.txt")
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_file_json(self):
        self.check_numbers(self.report_json("--metrics", self.write(EXPOSITION)))

    def test_file_table(self):
        out = kgpu("--metrics", self.write(EXPOSITION))
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = [line.split() for line in out.stdout.splitlines()]
        self.assertIn(["team-a", "(total)", "3.000", "0.24", "EUR"], lines)
        self.assertIn(["team-b", "research", "A100", "on-demand", "0.500", "1.80", "EUR"], lines)
        self.assertIn(["team-a", "-", "V100", "on-demand", "1.000", "-"], lines)
        self.assertIn(["V100", "on-demand", "1.000", "GPU-hours"], lines)

    def test_http_metrics(self):
        s = self.serve(lambda path: (200, EXPOSITION) if path == "/metrics" else (404, "no"))
        self.check_numbers(self.report_json("--metrics", s.url + "/metrics"))
        self.assertEqual(s.paths, ["/metrics"])

    def test_malformed_line_named(self):
        bad = EXPOSITION + 'kgpu_namespace_gpu_seconds_total{namespace="x\\q"} 1\n'
        s = self.serve(lambda path: (200, bad))
        out = kgpu("--metrics", s.url + "/metrics")
        self.assertEqual(out.returncode, 1)
        self.assertIn(s.url + "/metrics:11: label namespace: unknown escape", out.stderr)
        out = kgpu("--metrics", self.write(EXPOSITION.replace(" 7200", " -5")))
        self.assertEqual(out.returncode, 1)
        self.assertIn(":3: kgpu_namespace_gpu_seconds_total: -5 is not a count", out.stderr)

    def test_server_error_and_bad_arguments(self):
        s = self.serve(lambda path: (500, "boom"))
        out = kgpu("--metrics", s.url + "/metrics")
        self.assertEqual(out.returncode, 1)
        self.assertIn("answered 500: boom", out.stderr)
        for args, want in ((["--metrics", "x", "--range", "30d"], "--range is for --prometheus"),
                           (["--prometheus", s.url, "--range", "30d]"], "--range: digits"),
                           (["--metrics", "x", "--prometheus", s.url], "one of --metrics"),
                           (["--metrics", "x", "--output", "yaml"], "--output: table or json")):
            out = kgpu(*args)
            self.assertEqual(out.returncode, 2, args)
            self.assertIn(want, out.stderr)


class TestDocsExample(ReportTest):
    """docs/autoscaling.md shows `kgpu report` on examples/cost-metrics.txt: that is its output."""

    def test_docs_show_the_real_output(self):
        with open(os.path.join(te.SOURCE_DIR, "docs", "autoscaling.md")) as f:
            text = f.read()
        cmd = "$ kgpu report --metrics examples/cost-metrics.txt\n"
        self.assertIn(cmd, text)
        shown = text.split(cmd, 1)[1].split("```", 1)[0]
        out = subprocess.run([te.KGPU_BIN, "report", "--metrics", "examples/cost-metrics.txt"],
                             capture_output=True, text=True, timeout=60, cwd=te.SOURCE_DIR)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(shown, out.stdout)
        # And the example's costs are its seconds at examples/prices.yaml's prices.
        self.assertIn("1440.000       172.80 USD", out.stdout)  # T4 spot at 0.12


def vector(samples):
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [time.time(), str(v)]} for m, v in samples]}})


class TestFromPrometheus(ReportTest):

    def prometheus(self, path):
        u = urllib.parse.urlparse(path)
        if u.path != "/api/v1/query":
            return 404, "not found"
        q = urllib.parse.parse_qs(u.query)["query"][0]
        self.queries.append(q)
        if "kgpu_namespace_gpu_seconds_total" in q:
            return 200, vector([
                ({"namespace": "team-a", "queue": "", "model": "T4", "capacity_type": "spot"},
                 7200),
                ({"namespace": "team-a", "queue": "", "model": "V100",
                  "capacity_type": "on-demand"}, 3600),
                ({"namespace": "team-b", "queue": "research", "model": "A100",
                  "capacity_type": "on-demand"}, 1800)])
        if "kgpu_namespace_gpu_cost_total" in q:
            return 200, vector([
                ({"namespace": "team-a", "queue": "", "model": "T4", "capacity_type": "spot",
                  "currency": "EUR"}, 0.24),
                ({"namespace": "team-b", "queue": "research", "model": "A100",
                  "capacity_type": "on-demand", "currency": "EUR"}, 1.8)])
        return 200, vector([({"model": "V100", "capacity_type": "on-demand"}, 3600)])

    def test_queries_and_numbers(self):
        self.queries = []
        s = self.serve(self.prometheus)
        doc = self.report_json("--prometheus", s.url + "/", "--range", "7d")
        self.check_numbers(doc)
        self.assertEqual(doc["range"], "7d")
        self.assertEqual(self.queries, [
            "max by (namespace, queue, model, capacity_type) "
            "(increase(kgpu_namespace_gpu_seconds_total[7d]))",
            "max by (namespace, queue, model, capacity_type, currency) "
            "(increase(kgpu_namespace_gpu_cost_total[7d]))",
            "max by (model, capacity_type) (increase(kgpu_unpriced_gpu_seconds_total[7d]))"])

    def test_default_range_is_30d(self):
        self.queries = []
        s = self.serve(self.prometheus)
        self.report_json("--prometheus", s.url)
        self.assertTrue(all("[30d]" in q for q in self.queries), self.queries)

    def test_prometheus_error_and_bad_answer(self):
        s = self.serve(lambda path: (200, json.dumps({"status": "error",
                                                      "error": "parse error at char 3"})))
        out = kgpu("--prometheus", s.url)
        self.assertEqual(out.returncode, 1)
        self.assertIn("status error: parse error at char 3", out.stderr)
        s = self.serve(lambda path: (200, json.dumps({"status": "success", "data": {
            "resultType": "vector", "result": [{"metric": {"namespace": 5}, "value": [1, "2"]}]}})))
        out = kgpu("--prometheus", s.url)
        self.assertEqual(out.returncode, 1)
        self.assertIn("data.result[0]: label namespace: expected a string", out.stderr)


class TestAgainstTheExtender(ReportTest):
    """The real extender with --prices: what /metrics counts is what report prints."""

    def test_report_of_live_metrics(self):
        s = self.start_standin()
        s.add_node("r-spot", gpu_list("r-spot", "T4", 15360, 1),
                   labels={"cloud.google.com/gke-spot": "true"})
        s.add_node("r-od", gpu_list("r-od", A100, 81920, 1))
        prices = os.path.join(self.tmp, "prices.yaml")
        with open(prices, "w") as f:
            f.write("prices:\n  currency: USD\n  gpu:\n    T4: {onDemand: 7200, spot: 3600}\n"
                    "    %s: {onDemand: 36000, spot: 18000}\n" % A100)
        ext = self.start_extender_for(s, ["--prices", prices])
        for pod, ns, node in ((pod_object("w", [container("main", whole(1))]), "ml", "r-spot"),
                              (pod_object("h", [container("main", share(mem=40))]), "ml", "r-od")):
            self.assertEqual(ext.schedule(s.add_pod(pod, ns), [node]), (node, ""))
        time.sleep(0.5)
        doc = self.report_json("--metrics", "http://127.0.0.1:%d/metrics" % ext.port)
        rows = {(r["model"], r["capacity_type"]): r for r in doc["rows"]}
        self.assertEqual(set(rows), {("T4", "spot"), (A100, "on-demand")})
        for (model, cap), price in ((("T4", "spot")), 3600.0), (((A100, "on-demand")), 36000.0):
            r = rows[(model, cap)]
            self.assertEqual((r["namespace"], r["queue"], r["currency"]), ("ml", "", "USD"))
            self.assertGreater(r["gpu_hours"], 0)
            # /metrics prints GPU-seconds to the microsecond: the cost agrees to that.
            self.assertAlmostEqual(r["cost"], r["gpu_hours"] * price,
                                   delta=price / 3600 * 2e-6 + 1e-9)
        total = doc["namespaces"][0]
        self.assertEqual(total["namespace"], "ml")
        self.assertAlmostEqual(total["cost"], sum(r["cost"] for r in doc["rows"]), places=6)
        self.assertEqual(doc["unpriced"], [])


class TestBenchmarks(ReportTest):
    """`kgpu bench-export` (a benchmark Job's sidecar) and `kgpu report --benchmarks`."""

    def free_port(self):
        import socket
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        return port

    def exporter(self, result, workload="tracksim", model="Tesla T4", cluster="worker-b"):
        port = self.free_port()
        child = subprocess.Popen([te.KGPU_BIN, "bench-export", "--file", result, "--workload",
                                  workload, "--gpu-model", model, "--cluster", cluster,
                                  "--listen", "127.0.0.1:%d" % port],
                                 stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: (child.terminate(), child.wait(timeout=20)))

        def metrics():
            try:
                return te.http_request(port, "GET", "/metrics")[2].decode()
            except OSError:
                return None
        te.wait_for(lambda: metrics() is not None, 20, what="bench-export serving")
        return port, metrics, child

    def test_bench_export_serves_the_workloads_figure(self):
        result = os.path.join(self.tmp, "throughput")
        port, metrics, child = self.exporter(result, model='Tesla "T4"\nx')
        # Nothing written yet: no figure, no error.
        text = metrics()
        self.assertNotIn("kgpu_workload_throughput{", text)
        self.assertIn("kgpu_workload_benchmark_errors_total{", text)
        self.assertIn(" 0\n", text.split("kgpu_workload_benchmark_errors_total{")[1])
        with open(result, "w") as f:
            f.write("123.5\n")
        text = metrics()
        # The labels are the flags', escaped; the value the file's.
        self.assertIn('kgpu_workload_throughput{workload="tracksim",gpu_model="Tesla \\"T4\\"\\nx",'
                      'cluster="worker-b"} 123.5\n', text)
        # What the workload writes is outside input: anything but one finite number >= 0
        # leaves the figure out and is counted.
        for bad in ("-1", "nan", "inf", "12 13", "", "x" * 5000):
            with open(result, "w") as f:
                f.write(bad)
            text = metrics()
            self.assertNotIn("kgpu_workload_throughput{", text, bad)
        self.assertRegex(text, r"kgpu_workload_benchmark_errors_total\{[^}]*\} 6\n")
        self.assertEqual(te.http_request(port, "GET", "/nope")[0], 404)
        child.terminate()
        self.assertEqual(child.wait(timeout=20), 0)
        out = subprocess.run([te.KGPU_BIN, "bench-export", "--file", result], capture_output=True,
                             text=True, timeout=30)
        self.assertEqual(out.returncode, 2)

    def test_report_ranks_models_by_throughput_per_price(self):
        expo = os.path.join(self.tmp, "bench.prom")
        with open(expo, "w") as f:
            f.write('kgpu_workload_throughput{workload="tracksim",gpu_model="T4",cluster="b"} 80\n'
                    'kgpu_workload_throughput{workload="tracksim",gpu_model="%s",cluster="a"} 400\n'
                    'kgpu:workload_throughput:max30d{workload="gan",gpu_model="T4",cluster="b"} 5\n'
                    'kgpu_workload_throughput{workload="gan",gpu_model="H100",cluster="c"} 90\n'
                    'kgpu_workload_throughput{workload="gan",gpu_model="T4",cluster="x"} NaN\n'
                    'kgpu_extender_ready 1\n' % A100)
        prices = os.path.join(self.tmp, "prices.yaml")
        with open(prices, "w") as f:
            f.write("prices:\n  currency: EUR\n  gpu:\n    T4: {onDemand: 0.4, spot: 0.1}\n"
                    "    %s: {onDemand: 4.0, spot: 1.5}\n" % A100)
        doc = self.report_json("--benchmarks", expo, "--prices", prices)
        got = [(r["workload"], r["gpu_model"], r.get("throughput_per_price")) for r in doc]
        # tracksim: the T4 (80/0.4 = 200) before the A100 (400/4 = 100); gan: priced first.
        self.assertEqual(got, [("gan", "T4", 12.5), ("gan", "H100", None),
                               ("tracksim", "T4", 200.0), ("tracksim", A100, 100.0)])
        # Without prices: by throughput; served over HTTP like a Prometheus /federate.
        with open(expo) as f:
            text = f.read()
        srv = self.serve(lambda path: (200, text))
        doc = self.report_json("--benchmarks", srv.url + "/federate?match[]=x")
        self.assertEqual([(r["workload"], r["gpu_model"]) for r in doc],
                         [("gan", "H100"), ("gan", "T4"), ("tracksim", A100), ("tracksim", "T4")])
        self.assertTrue(srv.paths[0].startswith("/federate"))
        table = kgpu("--benchmarks", expo, "--prices", prices)
        self.assertEqual(table.returncode, 0, table.stderr)
        self.assertRegex(table.stdout, r"tracksim\s+T4\s+b\s+80.00\s+0.40\s+200.00")
        for args in (["--benchmarks", expo, "--metrics", expo], ["--prices", prices, "--metrics",
                                                                 expo]):
            self.assertEqual(kgpu(*args).returncode, 2, args)
        with open(expo, "w") as f:
            f.write("kgpu_workload_throughput{workload=\"a\" 1\n")
        bad = kgpu("--benchmarks", expo)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("bench.prom:1:", bad.stderr)


def main():
    return te.main_with_binaries("test_report", __doc__)


if __name__ == "__main__":
    sys.exit(main())
