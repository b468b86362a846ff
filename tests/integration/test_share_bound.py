#!/usr/bin/env python3
"""Tests of bench/share_bound.py, the optimal-packing analysis of a run's GPU
shares: its linear-programming bound and packing on instances whose optimum
is known, and on a real `kgpu simulate --json` run, where the bound must lie
between the simulator's own classical bound and the GPUs the policy used.
Needs SciPy (python3-scipy); 77 = skipped without it."""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import unittest

if importlib.util.find_spec("scipy") is None:
    print("SciPy is not installed (python3-scipy): skipped")
    sys.exit(77)

ARGS = None


def load_tool():
    sys.path.insert(0, os.path.join(ARGS.source, "bench"))
    import share_bound
    return share_bound


class TestShareBound(unittest.TestCase):
    def test_known_optima(self):
        sb = load_tool()
        cases = [
            ({810: 100, 100: 150}, 105),  # one 100 beside each 810, the other 50 ten to a GPU
            ({260: 7}, 3),                # three 260s to a GPU
            ({600: 4, 400: 4}, 4),
            ({500: 3}, 2),
            ({470: 9, 320: 3}, 6),        # total 5.19; e.g. 4 x (470+470), 470+320, 320+320
        ]
        for hist, opt in cases:
            lp, lb, found = sb.lp_bound(hist)
            with self.subTest(hist=hist):
                self.assertLessEqual(lb, opt)
                self.assertGreaterEqual(found, opt)
                self.assertEqual(found, opt)  # these are small enough to solve exactly
                self.assertGreaterEqual(lp, sum(k * v for k, v in hist.items()) / 1000 - 1e-9)

    def test_lp_beats_fluid(self):
        # Four 810s and three 200s total 3.84 GPUs, but a 200 fits no 810's
        # leftover, so every packing needs 5; the LP sees it.
        sb = load_tool()
        lp, lb, found = sb.lp_bound({810: 4, 200: 3})
        self.assertLess(lp, 5 + 1e-9)
        self.assertEqual(lb, 5)
        self.assertEqual(found, 5)

    def test_on_a_simulator_run(self):
        sb = load_tool()
        out = subprocess.run(
            [ARGS.kgpu, "simulate", "--nodes", os.path.join(ARGS.source, "examples/nodes.csv"),
             "--pods", os.path.join(ARGS.source, "examples/pods.csv"), "--policy", "fgd,kgpu",
             "--seeds", "42-44", "--json", "--no-timing"],
            check=True, capture_output=True, text=True).stdout
        doc = json.loads(out)
        for r in doc["results"]:
            sp = r["share_packing"]
            self.assertEqual(len(sp["sizes_by_seed"]), 3)
            for used, h in zip(sp["gpus_by_seed"], sp["sizes_by_seed"]):
                hist = {int(k): v for k, v in h.items()}
                self.assertTrue(hist, "a run of the example places shares")
                _, lb, found = sb.lp_bound(hist)
                self.assertLessEqual(lb, found)
                self.assertLessEqual(lb, used)
            # The LP bound is at least the simulator's L2/DFF bound (a mean here).
            means = sum(sb.lp_bound({int(k): v for k, v in h.items()})[1]
                        for h in sp["sizes_by_seed"]) / 3
            self.assertGreaterEqual(means + 1e-9, sp["gpus_lower_bound"])
        # And the report runs end to end.
        rep = subprocess.run([sys.executable, os.path.join(ARGS.source, "bench/share_bound.py")],
                             input=out, check=True, capture_output=True, text=True).stdout
        self.assertIn("kgpu       mean", rep)


    def test_bad_input_is_named(self):
        tool = os.path.join(ARGS.source, "bench/share_bound.py")
        churn = subprocess.run(
            [ARGS.kgpu, "simulate", "--churn", "--nodes",
             os.path.join(ARGS.source, "examples/nodes.csv"), "--pods",
             os.path.join(ARGS.source, "examples/pods.csv"), "--policy", "kgpu", "--seeds", "1",
             "--json", "--no-timing"], check=True, capture_output=True, text=True).stdout
        for text, said in ((churn, "results[0] has no"), ("{]", "standard input:"),
                           ('{"results": []}', "not `kgpu simulate --json` output")):
            p = subprocess.run([sys.executable, tool], input=text, capture_output=True, text=True)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(said, p.stderr)
            self.assertNotIn("Traceback", p.stderr)

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--kgpu", required=True)
    ap.add_argument("--source", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
