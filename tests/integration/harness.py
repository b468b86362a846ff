"""What the black-box suites share: child processes and waiting (stdlib only).

Every child runs in its own process group and is remembered until it is
stopped, so that run_tests() can take all of them down whatever happens —
a failing test, Ctrl-C, or CTest's timeout signal.
"""

import json
import os
import signal
import subprocess
import threading
import time
import unittest

# What a sanitizer writes when it finds something (the builds under test are ASan/UBSan).
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                   "WARNING: ThreadSanitizer", "SUMMARY: UndefinedBehaviorSanitizer")

_CHILDREN = set()
_CHILDREN_LOCK = threading.Lock()


class Child:
    """A child process in its own process group, its output in a log file."""

    def __init__(self, argv, log_path, env=None):
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True, env=env)
        with _CHILDREN_LOCK:
            _CHILDREN.add(self)

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def signal_group(self, sig):
        # Only while the leader is not reaped: after that its id may name someone else.
        if self.proc.returncode is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, sig=signal.SIGTERM, timeout=20.0):
        """Signals the group, waits; SIGKILL if it lingers. Returns the exit status."""
        if self.alive():
            self.signal_group(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.proc.wait(10)
        if not self._log.closed:
            self._log.close()
        with _CHILDREN_LOCK:
            _CHILDREN.discard(self)
        return self.proc.returncode

    def kill(self):
        return self.stop(signal.SIGKILL)

    def wait_exit(self, timeout):
        """The exit status once it exits by itself within timeout, else None."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_tail(self, n=40):
        return "\n".join(self.log().splitlines()[-n:])

    def sanitizer_report(self):
        """The first sanitizer report in the log, with some context, or None."""
        text = self.log()
        for mark in SANITIZER_MARKS:
            at = text.find(mark)
            if at >= 0:
                return text[max(0, at - 300):at + 4000]
        return None


def held_by_assignments(pods):
    """{(node, gpu index): (memory MiB, milli)} summed over bound, live pods' kgpu.io/assignment
    annotations: the truth an extender's /inspect must agree with. Zeros left out."""
    held = {}
    for pod in pods:
        meta, spec = pod["metadata"], pod.get("spec", {})
        node = spec.get("nodeName")
        ann = meta.get("annotations") or {}
        if not node or "kgpu.io/assignment" not in ann:
            continue
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if meta.get("deletionTimestamp"):
            continue
        if ann.get("kgpu.io/node", node) != node:
            continue
        for part in json.loads(ann["kgpu.io/assignment"]):
            for g in part["gpus"]:
                mem, milli = held.get((node, g["index"]), (0, 0))
                held[(node, g["index"])] = (mem + g["memory_mib"], milli + g["milli"])
    return {k: v for k, v in held.items() if v != (0, 0)}


def kill_all_children():
    with _CHILDREN_LOCK:
        children = list(_CHILDREN)
    for c in children:
        c.signal_group(signal.SIGKILL)


def wait_for(predicate, timeout, interval=0.02, what="condition"):
    """Polls predicate() until it returns a true value; returns it, or raises AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after %.1f s waiting for %s" % (timeout, what))
        time.sleep(interval)


def run_tests(argv0, rest):
    """unittest.main over `rest`; every child is killed at the end or on a signal. Exit status."""
    def on_signal(signum, frame):
        # unittest would record an exception raised here as one test's error and go on:
        # take the children down and leave at once instead.
        kill_all_children()
        os._exit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        prog = unittest.main(argv=[argv0] + rest, exit=False, verbosity=2)
    finally:
        kill_all_children()
    return 0 if prog.result.wasSuccessful() else 1
