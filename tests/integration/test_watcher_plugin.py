#!/usr/bin/env python3
"""The device plugin's watcher through the real kgpu-device-plugin binary.

The plugin runs with --watch-config against the fake NVML (processes
scripted through FAKE_NVML_PROCS), a fake /proc of cgroup files (procRoot)
and limits files as Allocate writes them, without an API server. Checked:
/metrics and /healthz over HTTP, the figures of a container under and over
its share, `promtool check metrics` on the real scrape (where Debian's
prometheus package is installed), enforce: kill stopping only the offending
container's process (real child processes), a misspelt setting refusing to
start, and a clean stop on SIGTERM (the sanitizer build fails the exit on a
leak).

    test_watcher_plugin.py --plugin PATH --fake-nvml-dir DIR [--promtool PATH]

Standard library only; 77 = skipped (the fake NVML is missing).
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

ARGS = None

UID_A = "11111111-2222-3333-4444-555555555555"
UID_B = "66666666-7777-8888-9999-000000000000"
CID_1 = "1" * 64
CID_2 = "2" * 64
MIB = 1024 * 1024


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def samples(text):
    """{'name{labels}': value} of a scrape."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def labels(container, uid, cid, gpu="0", uuid="GPU-aaaa"):
    return ('{namespace="",pod="",container="%s",pod_uid="%s",container_id="%s",gpu="%s",'
            'gpu_uuid="%s"' % (container, uid, cid, gpu, uuid))


class WatcherPlugin(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kgpu-watch-it-")
        for d in ("plugins", "proc", "state/pods"):
            os.makedirs(os.path.join(self.tmp, d))
        self.port = free_port()
        self.children = []
        self.plugin = None
        self.log = None

    def tearDown(self):
        if self.plugin is not None and self.plugin.poll() is None:
            self.plugin.kill()
            self.plugin.wait()
        for c in self.children:
            if c.poll() is None:
                c.kill()
                c.wait()
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write(self, rel, text):
        path = os.path.join(self.tmp, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.rename(path + ".tmp", path)  # the fake NVML reads it meanwhile
        return path

    def limits(self, uid, container, mib, core=None):
        line = "device 0 uuid=GPU-aaaa memory_mib=%d" % mib
        if core is not None:
            line += " core_pct=%d" % core
        self.write("state/pods/%s/%s.limits" % (uid, container), "# kgpu limits v1\n%s\n" % line)

    def child_in(self, uid, cid):
        """A real process whose fake cgroup (systemd driver, containerd) names (uid, cid)."""
        c = subprocess.Popen(["sleep", "600"])
        self.children.append(c)
        self.write("proc/%d/cgroup" % c.pid,
                   "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/"
                   "cri-containerd-%s.scope\n" % (uid.replace("-", "_"), cid))
        return c

    def procs(self, lines):
        self.write("procs", "".join("%s\n" % l for l in lines))

    def config(self, extra=""):
        return self.write("watch.yaml",
                          "intervalSeconds: 0.2\nmetricsListen: \"127.0.0.1:%d\"\n"
                          "procRoot: %s\n%s" % (self.port, os.path.join(self.tmp, "proc"), extra))

    def start(self, config, extra_env=None, extra_args=()):
        env = dict(os.environ,
                   FAKE_NVML_GPUS="GPU-aaaa,NVIDIA A100-SXM4-40GB,40960,00000000:3B:00.0",
                   FAKE_NVML_PROCS=os.path.join(self.tmp, "procs"))
        env.update(extra_env or {})
        lib = os.path.join(ARGS.fake_nvml_dir, "full", "libnvidia-ml.so.1")
        self.log = open(os.path.join(self.tmp, "plugin.log"), "w+")
        self.plugin = subprocess.Popen(
            [ARGS.plugin, "--no-api-server", "--nvml-lib", lib,
             "--plugin-dir", os.path.join(self.tmp, "plugins"),
             "--state-dir", os.path.join(self.tmp, "state"), "--shim-lib", "none",
             "--watch-config", config] + list(extra_args), env=env, stdout=self.log,
            stderr=subprocess.STDOUT)

    def plugin_log(self):
        self.log.seek(0)
        return self.log.read()

    def get(self, path):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.port, path),
                                        timeout=5) as r:
                return r.status, r.headers.get("Content-Type", ""), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, "", ""

    def wait_for(self, what, pred, timeout=10):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            if self.plugin.poll() is not None:
                self.fail("the plugin exited (%s): %s" % (self.plugin.returncode, self.plugin_log()))
            try:
                status, ctype, body = self.get("/metrics")
                last = body
                if status == 200 and pred(samples(body)):
                    return body, ctype
            except OSError:
                pass
            time.sleep(0.1)
        self.fail("timed out waiting for %s; last scrape:\n%s" % (what, last))

    def stop(self):
        self.plugin.send_signal(signal.SIGTERM)
        rc = self.plugin.wait(timeout=30)
        self.assertEqual(rc, 0, "exit status on SIGTERM; log:\n" + self.plugin_log())

    def test_figures_promtool_and_kill(self):
        self.limits(UID_A, "train", 4096, core=30)
        self.limits(UID_B, "serve", 8192)
        bad = self.child_in(UID_A, CID_1)
        neighbour = self.child_in(UID_B, CID_2)
        self.procs(["0 %d 1000 20" % bad.pid, "0 %d 6000 10" % neighbour.pid])
        self.start(self.config("enforce: kill\n"))
        a, b = labels("train", UID_A, CID_1), labels("serve", UID_B, CID_2)
        used_a = "kgpu_container_gpu_memory_used_bytes" + a + "}"
        body, ctype = self.wait_for("train's figures", lambda s: used_a in s)
        self.assertTrue(ctype.startswith("text/plain; version=0.0.4"), ctype)
        s = samples(body)
        self.assertEqual(s["kgpu_watcher_up"], 1)
        self.assertEqual(s[used_a], 1000 * MIB)
        self.assertEqual(s["kgpu_container_gpu_memory_share_bytes" + a + "}"], 4096 * MIB)
        self.assertEqual(s["kgpu_container_gpu_core_share_percent" + a + "}"], 30)
        self.assertEqual(s["kgpu_container_gpu_throttled" + a + ',resource="memory"}'], 0)
        self.assertEqual(s["kgpu_container_gpu_memory_share_bytes" + b + "}"], 8192 * MIB)
        if ARGS.promtool:
            r = subprocess.run([ARGS.promtool, "check", "metrics"], input=body, text=True,
                               capture_output=True)
            self.assertEqual(r.returncode, 0, "promtool: " + r.stdout + r.stderr)
        else:
            print("promtool not installed: the scrape's format is checked by test_watcher only")
        self.assertEqual(self.get("/healthz")[0], 200)
        self.assertEqual(self.get("/other")[0], 404)

        # Over its memory share: its GPU process is killed, the neighbour's is not.
        self.procs(["0 %d 5000 20" % bad.pid, "0 %d 6000 10" % neighbour.pid])
        try:
            rc = bad.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.fail("the offender was not killed; log:\n" + self.plugin_log())
        self.assertEqual(rc, -signal.SIGKILL)
        self.assertIsNone(neighbour.poll(), "the neighbour was killed")
        self.procs(["0 %d 6000 10" % neighbour.pid])  # NVML no longer lists the dead process
        self.wait_for("the kill counted",
                      lambda s: s.get('kgpu_watcher_kills_total{result="killed"}') == 1 and
                      used_a not in s)
        self.assertIn("killed 1 GPU process", self.plugin_log())
        self.assertIsNone(neighbour.poll())
        self.stop()

    def test_mig_devices_judged_by_kubelets_checkpoint(self):
        # A 1g.5gb (GI 7, slice 0) and a 3g.20gb (GI 2, slice 4) made beforehand.
        state = self.write("mig-state", "gi GPU-aaaa 7 0 0\nci GPU-aaaa 7 0 0 0\n"
                                        "gi GPU-aaaa 2 2 4\nci GPU-aaaa 2 0 2 0\n")
        mine = self.child_in(UID_A, CID_1)
        intruder = self.child_in(UID_B, CID_2)
        self.start(self.config("enforce: kill\n"),
                   {"FAKE_NVML_MIG": "0", "FAKE_NVML_MIG_STATE": state},
                   ["--mig-strategy", "mixed"])
        uuids = {}
        deadline = time.time() + 10
        while len(uuids) < 2 and time.time() < deadline:
            for line in self.plugin_log().splitlines():
                if "MIG device MIG-" in line and "advertised as" in line:
                    uuid = line.split("MIG device ")[1].split(" ")[0]
                    uuids[line.split("(")[1].split(",")[0]] = uuid
            time.sleep(0.1)
        self.assertEqual(sorted(uuids), ["1g.5gb", "3g.20gb"], self.plugin_log())
        one, three = uuids["1g.5gb"], uuids["3g.20gb"]
        # kubelet gave the 1g device to A's container "train", the 3g one to nobody.
        self.write("plugins/kubelet_internal_checkpoint",
                   '{"Data":{"PodDeviceEntries":[{"PodUID":"%s","ContainerName":"train",'
                   '"ResourceName":"nvidia.com/mig-1g.5gb","DeviceIDs":{"-1":["%s"]},'
                   '"AllocResp":"Cg=="}],"RegisteredDevices":{}},"Checksum":1}' % (UID_A, one))
        self.procs(["0:7:0 %d 1000 0" % mine.pid, "0:2:0 %d 500 0" % intruder.pid])
        a = labels("", UID_A, CID_1, uuid=one)
        share_a = "kgpu_container_gpu_memory_share_bytes" + a + "}"
        body, _ = self.wait_for("A's MIG figures", lambda s: share_a in s)
        s = samples(body)
        self.assertEqual(s[share_a], 4864 * MIB)
        self.assertEqual(s["kgpu_container_gpu_memory_used_bytes" + a + "}"], 1000 * MIB)
        self.assertEqual(s["kgpu_container_gpu_unallocated" + a + "}"], 0)
        # B's process in a MIG device kubelet gave it not: over a share of zero, killed.
        try:
            rc = intruder.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.fail("the intruder was not killed; log:\n" + self.plugin_log())
        self.assertEqual(rc, -signal.SIGKILL)
        self.assertIsNone(mine.poll(), "the holder was killed")
        self.assertIn(three, self.plugin_log())
        self.procs(["0:7:0 %d 1000 0" % mine.pid])
        self.stop()

    def test_misspelt_setting_refuses_to_start(self):
        self.start(self.config("enforcement: kill\n"))
        rc = self.plugin.wait(timeout=30)
        self.assertNotEqual(rc, 0)
        self.assertIn("unknown setting 'enforcement'", self.plugin_log())

    def test_no_nvml_serves_up_zero(self):
        # A node whose NVML cannot be opened still answers /metrics, saying so.
        config = self.config()
        env = dict(os.environ)
        self.log = open(os.path.join(self.tmp, "plugin.log"), "w+")
        gpus = self.write("gpus.yaml", "gpus:\n- {index: 0, uuid: GPU-aaaa, model: T4, "
                                       "memory_mib: 15360}\n")
        self.plugin = subprocess.Popen(
            [ARGS.plugin, "--no-api-server", "--fake-gpus", gpus,
             "--nvml-lib", os.path.join(self.tmp, "no-such-libnvidia-ml.so.1"),
             "--plugin-dir", os.path.join(self.tmp, "plugins"),
             "--state-dir", os.path.join(self.tmp, "state"), "--shim-lib", "none",
             "--watch-config", config],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_for("scan errors", lambda s: s.get("kgpu_watcher_scan_errors_total", 0) >= 2
                      and s.get("kgpu_watcher_up") == 0)
        self.stop()


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugin", required=True)
    ap.add_argument("--fake-nvml-dir", required=True)
    ap.add_argument("--promtool", default=shutil.which("promtool") or "")
    ARGS, rest = ap.parse_known_args()
    if not os.path.exists(os.path.join(ARGS.fake_nvml_dir, "full", "libnvidia-ml.so.1")):
        print("fake NVML not built: skipped")
        sys.exit(77)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
