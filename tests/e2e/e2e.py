#!/usr/bin/env python3
"""Runs the end-to-end suites against real upstream components (see scripts/e2e.sh).

usage: e2e.py --bin DIR --build DIR --work DIR --suite NAME [-k PATTERN ...]

Prints each test's outcome and ends with the plain line `N passed, N failed`
(`, N skipped` when some were skipped); exits 1 on any failure or error.
Every process a suite starts is a harness.Child in its own process group:
they are all killed when the run ends, fails, or is interrupted (SIGINT,
SIGTERM, SIGHUP); then what the node suite set up besides processes (its
containers, mounts, cgroups, network) is undone too (node.emergency_cleanup).
"""

import argparse
import os
import signal
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))

import harness  # noqa: E402

SUITES = {"control-plane": "test_control_plane", "node": "test_node", "dra": "test_dra",
          "install": "test_install", "multicluster": "test_multicluster"}


def undo_node():
    """What the node suite set up outside processes (mounts, cgroups, the pods' bridge,
    kernel settings), undone even when its tearDownClass never ran."""
    node = sys.modules.get("node")
    if node is not None:
        node.emergency_cleanup()


class Result(unittest.TextTestResult):
    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        self.stream.writeln("    (%.1f s)" % (time.monotonic() - self._t0))
        self.stream.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--suite", action="append", choices=sorted(SUITES))
    ap.add_argument("-k", action="append", default=[], dest="patterns")
    a = ap.parse_args()

    def on_signal(signum, frame):
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the cleanup short
        harness.kill_all_children()
        undo_node()
        print("\ninterrupted by signal %d: every process started was killed" % signum,
              flush=True)
        os._exit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    passed = failed = skipped = 0
    try:
        for suite in a.suite or sorted(SUITES):
            mod = __import__(SUITES[suite])
            mod.CONFIG.update(bin=a.bin, build=os.path.abspath(a.build),
                              work=os.path.join(a.work, suite))
            loader = unittest.TestLoader()
            if a.patterns:
                loader.testNamePatterns = ["*%s*" % p for p in a.patterns]
            tests = loader.loadTestsFromModule(mod)
            print("== suite %s: %d tests" % (suite, tests.countTestCases()), flush=True)
            runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2, resultclass=Result)
            res = runner.run(tests)
            n = res.testsRun
            bad = len(res.failures) + len(res.errors) + len(res.unexpectedSuccesses)
            sk = len(res.skipped)
            # A class whose set-up failed ran none of its tests: count them all as failed.
            if n == 0 and bad:
                bad = max(bad, tests.countTestCases())
            failed += bad
            skipped += sk
            # A suite skipped whole (setUpClass: the machine cannot run it) ran nothing.
            passed += max(0, n - bad - sk)
    finally:
        harness.kill_all_children()
        undo_node()
    line = "%d passed, %d failed" % (passed, failed)
    if skipped:
        line += ", %d skipped" % skipped
    print(line)
    return 1 if failed or (passed == 0 and not skipped) else 0


if __name__ == "__main__":
    sys.exit(main())
