#!/usr/bin/env python3
"""The monitoring files for GPU cost per team (docs/autoscaling.md "Cost per team").

- deploy/prometheus/kgpu-rules.yaml passes `promtool check rules`, and
  `promtool test rules` computes the monthly bill from counters of two
  extender replicas as the docs say: the larger replica's increase (max,
  never the sum), GPU-hours = GPU-seconds / 3600, cost per namespace,
  queue, model and capacity type, the unpriced hours.
- deploy/grafana/kgpu-cost.json is valid JSON with a panel "Monthly GPU
  bill per team", and every kgpu name in its queries is a metric the
  extender writes (a `# TYPE` line of src/extender/metrics.c) or a rule the
  rules file records, so a renamed metric cannot leave the dashboard empty.
- The federated view (docs/multicluster.md "Federated view"): the central
  Prometheus's configuration deploy/prometheus/kgpu-federation.yaml passes
  `promtool check config`; its rules deploy/prometheus/kgpu-federated-rules.yaml
  compute, from two clusters' series with two extender replicas each, GPUs,
  allocated, free and whole-free per cluster and model (one replica counted,
  never both), cost per team, kgpu-dispatcher's nominations and throughput
  per price; deploy/grafana/kgpu-clusters.json queries only names that the
  extender, kgpu-dispatcher, kgpu bench figures or the rules provide.

  test_monitoring.py --source SRC_DIR [--promtool PATH]
77 = skipped (promtool missing).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ARGS = None

# Two replicas counting the same pods (one T4 GPU for 48 h at 0.12 EUR an hour); replica b
# restarted at minute 600, its counter reset and a minute lost: the bill is a's.
RULE_TESTS = """\
rule_files:
  - %(rules)s
evaluation_interval: 15m
tests:
  - interval: 1m
    input_series:
      - series: 'kgpu_namespace_gpu_seconds_total{instance="a",namespace="ml",queue="train",model="T4",capacity_type="spot"}'
        values: '0+60x2880'
      - series: 'kgpu_namespace_gpu_seconds_total{instance="b",namespace="ml",queue="train",model="T4",capacity_type="spot"}'
        values: '0+60x599 0+60x2280'
      - series: 'kgpu_namespace_gpu_cost_total{instance="a",namespace="ml",queue="train",model="T4",capacity_type="spot",currency="EUR"}'
        values: '0+0.002x2880'
      - series: 'kgpu_namespace_gpu_cost_total{instance="b",namespace="ml",queue="train",model="T4",capacity_type="spot",currency="EUR"}'
        values: '0+0.002x599 0+0.002x2280'
      - series: 'kgpu_unpriced_gpu_seconds_total{instance="a",model="V100",capacity_type="on-demand"}'
        values: '0+30x2880'
    promql_expr_test:
      - expr: kgpu:namespace_gpu_hours:increase30d
        eval_time: 48h
        exp_samples:
          - labels: 'kgpu:namespace_gpu_hours:increase30d{namespace="ml",queue="train",model="T4",capacity_type="spot"}'
            value: 48
      - expr: round(kgpu:namespace_gpu_cost:increase30d, 0.001)
        eval_time: 48h
        exp_samples:
          - labels: '{namespace="ml",queue="train",model="T4",capacity_type="spot",currency="EUR"}'
            value: 5.76
      - expr: kgpu:unpriced_gpu_hours:increase30d
        eval_time: 48h
        exp_samples:
          - labels: 'kgpu:unpriced_gpu_hours:increase30d{model="V100",capacity_type="on-demand"}'
            value: 24
      - expr: round(kgpu:namespace_gpu_cost_per_hour:rate5m, 0.001)
        eval_time: 48h
        exp_samples:
          - labels: '{namespace="ml",queue="train",model="T4",capacity_type="spot",currency="EUR"}'
            value: 0.12
"""


# Two clusters federated: worker-a has two A100s (one taken whole, by both replicas' count),
# worker-b two T4s with a quarter of one taken; the dispatcher nominated worker-b 6 times a
# minute; a benchmark figure and the prices to divide it by.
FED_TESTS = """\
rule_files:
  - %(rules)s
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'kgpu_gpu_compute_capacity_milli{cluster="worker-a",instance="a1",node="n0",gpu="0",model="A100"}'
        values: '1000x10'
      - series: 'kgpu_gpu_compute_capacity_milli{cluster="worker-a",instance="a2",node="n0",gpu="0",model="A100"}'
        values: '1000x10'
      - series: 'kgpu_gpu_compute_capacity_milli{cluster="worker-a",instance="a1",node="n0",gpu="1",model="A100"}'
        values: '1000x10'
      - series: 'kgpu_gpu_compute_capacity_milli{cluster="worker-a",instance="a2",node="n0",gpu="1",model="A100"}'
        values: '1000x10'
      - series: 'kgpu_gpu_compute_allocated_milli{cluster="worker-a",instance="a1",node="n0",gpu="0",model="A100"}'
        values: '1000x10'
      - series: 'kgpu_gpu_compute_allocated_milli{cluster="worker-a",instance="a2",node="n0",gpu="0",model="A100"}'
        values: '1000x10'
      - series: 'kgpu_gpu_compute_allocated_milli{cluster="worker-a",instance="a1",node="n0",gpu="1",model="A100"}'
        values: '0x10'
      - series: 'kgpu_gpu_compute_allocated_milli{cluster="worker-a",instance="a2",node="n0",gpu="1",model="A100"}'
        values: '0x10'
      - series: 'kgpu_gpu_compute_capacity_milli{cluster="worker-b",instance="b1",node="t0",gpu="0",model="T4"}'
        values: '1000x10'
      - series: 'kgpu_gpu_compute_capacity_milli{cluster="worker-b",instance="b1",node="t0",gpu="1",model="T4"}'
        values: '1000x10'
      - series: 'kgpu_gpu_compute_allocated_milli{cluster="worker-b",instance="b1",node="t0",gpu="0",model="T4"}'
        values: '250x10'
      - series: 'kgpu_gpu_compute_allocated_milli{cluster="worker-b",instance="b1",node="t0",gpu="1",model="T4"}'
        values: '0x10'
      - series: 'kgpu_namespace_gpu_cost_total{cluster="worker-b",instance="b1",namespace="ml",queue="q",model="T4",capacity_type="spot",currency="EUR"}'
        values: '0+0.002x10'
      - series: 'kgpu_dispatcher_nominations_total{cluster="worker-b",instance="m",reason="best"}'
        values: '0+6x10'
      - series: 'kgpu_dispatcher_unplaceable_total{cluster="manager",instance="m"}'
        values: '0+1x10'
      - series: 'kgpu_workload_throughput{workload="tracksim",gpu_model="T4",cluster="worker-b"}'
        values: '70x10'
      - series: 'kgpu_gpu_price_per_hour{cluster="worker-b",instance="b1",model="T4",capacity_type="on-demand",currency="EUR"}'
        values: '0.35x10'
    promql_expr_test:
      - expr: kgpu:cluster_gpus:count
        eval_time: 5m
        exp_samples:
          - labels: 'kgpu:cluster_gpus:count{cluster="worker-a",model="A100"}'
            value: 2
          - labels: 'kgpu:cluster_gpus:count{cluster="worker-b",model="T4"}'
            value: 2
      - expr: kgpu:cluster_gpus_free:sum
        eval_time: 5m
        exp_samples:
          - labels: 'kgpu:cluster_gpus_free:sum{cluster="worker-a",model="A100"}'
            value: 1
          - labels: 'kgpu:cluster_gpus_free:sum{cluster="worker-b",model="T4"}'
            value: 1.75
      - expr: kgpu:cluster_gpus_whole_free:count
        eval_time: 5m
        exp_samples:
          - labels: 'kgpu:cluster_gpus_whole_free:count{cluster="worker-a",model="A100"}'
            value: 1
          - labels: 'kgpu:cluster_gpus_whole_free:count{cluster="worker-b",model="T4"}'
            value: 1
      - expr: kgpu:cluster_gpu_allocation:ratio
        eval_time: 5m
        exp_samples:
          - labels: 'kgpu:cluster_gpu_allocation:ratio{cluster="worker-a"}'
            value: 0.5
          - labels: 'kgpu:cluster_gpu_allocation:ratio{cluster="worker-b"}'
            value: 0.125
      - expr: round(kgpu:cluster_namespace_gpu_cost_per_hour:rate5m, 0.001)
        eval_time: 10m
        exp_samples:
          - labels: '{cluster="worker-b",namespace="ml",queue="q",model="T4",capacity_type="spot",currency="EUR"}'
            value: 0.12
      - expr: kgpu:dispatcher_nominations:rate5m * 60
        eval_time: 10m
        exp_samples:
          - labels: '{cluster="worker-b",reason="best"}'
            value: 6
      - expr: kgpu:dispatcher_unplaceable:rate5m * 60
        eval_time: 10m
        exp_samples:
          - labels: '{}'
            value: 1
      - expr: kgpu:workload_throughput:max30d
        eval_time: 30m
        exp_samples:
          - labels: 'kgpu:workload_throughput:max30d{workload="tracksim",gpu_model="T4",cluster="worker-b"}'
            value: 70
      - expr: kgpu:workload_throughput_per_price:ratio
        eval_time: 5m
        exp_samples:
          - labels: 'kgpu:workload_throughput_per_price:ratio{workload="tracksim",gpu_model="T4",cluster="worker-b"}'
            value: 200
"""


def promtool():
    p = ARGS.promtool or shutil.which("promtool") or "/usr/bin/promtool"
    return p if os.access(p, os.X_OK) else None


class TestRules(unittest.TestCase):

    def setUp(self):
        self.rules = os.path.join(ARGS.source, "deploy", "prometheus", "kgpu-rules.yaml")

    def test_check_rules(self):
        out = subprocess.run([promtool(), "check", "rules", self.rules], capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("SUCCESS: 4 rules found", out.stdout)

    def test_bill_from_two_replicas(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tests.yaml")
            with open(path, "w") as f:
                f.write(RULE_TESTS % {"rules": os.path.abspath(self.rules)})
            out = subprocess.run([promtool(), "test", "rules", path], capture_output=True,
                                 text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)


class TestDashboard(unittest.TestCase):

    def known_names(self):
        with open(os.path.join(ARGS.source, "src", "extender", "metrics.c")) as f:
            names = set(re.findall(r"# TYPE (kgpu_[a-z0-9_]+) ", f.read()))
        with open(os.path.join(ARGS.source, "deploy", "prometheus", "kgpu-rules.yaml")) as f:
            names |= set(re.findall(r"record: (kgpu:[a-z0-9_:]+)", f.read()))
        return names

    def test_queries_use_existing_names(self):
        with open(os.path.join(ARGS.source, "deploy", "grafana", "kgpu-cost.json")) as f:
            board = json.load(f)
        known = self.known_names()
        self.assertIn("kgpu_namespace_gpu_cost_total", known)
        self.assertIn("kgpu:namespace_gpu_cost:increase30d", known)
        titles = [p["title"] for p in board["panels"]]
        self.assertIn("Monthly GPU bill per team", titles)
        exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
        exprs.append(board["templating"]["list"][1]["definition"])
        used = set()
        for e in exprs:
            used |= set(re.findall(r"\bkgpu[_:][a-zA-Z0-9_:]+", e))
        self.assertTrue(used)
        self.assertEqual(sorted(used - known), [], "names no metric or rule has")
        bill = board["panels"][titles.index("Monthly GPU bill per team")]
        self.assertIn("kgpu:namespace_gpu_cost:increase30d", bill["targets"][0]["expr"])


class TestFederation(unittest.TestCase):

    def path(self, *p):
        return os.path.join(ARGS.source, "deploy", *p)

    def test_config_and_rules_check(self):
        out = subprocess.run([promtool(), "check", "config",
                              self.path("prometheus", "kgpu-federation.yaml")],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("SUCCESS: 11 rules found", out.stdout)

    def test_rules_over_two_clusters(self):
        rules = self.path("prometheus", "kgpu-federated-rules.yaml")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tests.yaml")
            with open(path, "w") as f:
                f.write(FED_TESTS % {"rules": os.path.abspath(rules)})
            out = subprocess.run([promtool(), "test", "rules", path], capture_output=True,
                                 text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)

    def test_dashboard_uses_existing_names(self):
        with open(os.path.join(ARGS.source, "src", "extender", "metrics.c")) as f:
            text = f.read()
        known = set(re.findall(r"# TYPE (kgpu_[a-z0-9_]+) ", text))
        known |= set(re.findall(r'\{"(kgpu_gpu_[a-z_]+)"', text))  # the per-GPU families
        with open(os.path.join(ARGS.source, "src", "dispatcher", "dispatcher.c")) as f:
            known |= set(re.findall(r"# TYPE (kgpu_dispatcher_[a-z_]+) ", f.read()))
        known |= {"kgpu_dispatcher_estimate_seconds_bucket", "kgpu_workload_throughput"}
        with open(self.path("prometheus", "kgpu-federated-rules.yaml")) as f:
            rules = f.read()
        known |= set(re.findall(r"record: (kgpu:[a-z0-9_:]+)", rules))
        used_in_rules = set(re.findall(r"\bkgpu_[a-z0-9_]+", rules))
        self.assertEqual(sorted(used_in_rules - known), [], "the rules read names nothing writes")
        with open(self.path("grafana", "kgpu-clusters.json")) as f:
            board = json.load(f)
        exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
        exprs.append(board["templating"]["list"][1]["definition"])
        used = set()
        for e in exprs:
            used |= set(re.findall(r"\bkgpu[_:][a-zA-Z0-9_:]+", e))
        self.assertIn("kgpu:cluster_gpus_free:sum", used)
        self.assertEqual(sorted(used - known), [], "names no metric or rule has")


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True)
    ap.add_argument("--promtool")
    ARGS, rest = ap.parse_known_args()
    if promtool() is None:
        sys.stderr.write("test_monitoring: promtool not found: skipped\n")
        return 77
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
