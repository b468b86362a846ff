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
