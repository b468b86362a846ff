#!/usr/bin/env python3
"""Black-box integration tests of the real kgpu-device-plugin binary.

kubelet is played by kubelet_standin.py (Python grpcio: a gRPC stack other
than the plugin's gRPC core C API), the Kubernetes API by
apiserver_standin.py, the GPUs by a --fake-gpus file or the fake
libnvidia-ml.so.1 built in tests/fake. Pods are created in the API stand-in
already bound, with the annotations the extender's Binding writes
(kgpu.io/assignment, kgpu.io/node, kgpu.io/bind-time); the tests then make
kubelet's calls in kubelet's order and check every field of the answers, the
files on the host and the pod annotations.

    test_device_plugin.py --plugin PATH --fake-nvml-dir DIR [--protoc PATH]
                          [unittest arguments...]

Run it with an interpreter that can import grpc (on Debian /usr/bin/python3
with python3-grpcio); without grpc or protoc it exits 77 (skipped).

Every child runs in its own process group and is killed on cleanup. Every
plugin a test started is stopped with SIGTERM at its end and must exit 0,
remove its sockets and leave no sanitizer report in its log.
KGPU_TEST_KEEP=1 keeps the temporary folders (logs) and prints where they are.

A test that shows a bug in a module this suite does not own is marked
@known_bug: an expected failure until it is fixed, then an "unexpected
success" (a failure) so the marker gets removed. KGPU_TEST_STRICT=1 runs
such tests as plain ones.
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from harness import Child, run_tests, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
API_STANDIN = os.path.join(HERE, "apiserver_standin.py")
TOKEN = "kgpu-dp-test-token-42"

PLUGIN_BIN = None
FAKE_NVML_DIR = None
PROTOC = "protoc"
PB = None  # the deviceplugin_pb2 module, compiled once

MEM, CORE, WHOLE, ALIAS = "kgpu.io/gpu-mem", "kgpu.io/gpu-core", "nvidia.com/gpu", \
    "aliyun.com/gpu-mem"
SOCKETS = {MEM: "kgpu-gpu-mem.sock", CORE: "kgpu-gpu-core.sock", WHOLE: "kgpu-nvidia-gpu.sock",
           ALIAS: "kgpu-aliyun-gpu-mem.sock"}
SHIM_IN_CONTAINER = "/usr/lib/kgpu/libkgpu-limit.so"
SCHED_SIZE = 7832  # sizeof(kgpu_sched_file) (version 3), src/shim/gpusched.h, x86-64 and arm64



try:
    import grpc
    from kubelet_standin import KubeletStandin, load_messages, socket_alive
except ImportError as _e:  # reported in main(): the suite is skipped
    grpc = None
    _IMPORT_ERROR = _e


def known_bug(description):
    """A test that shows a bug outside this suite's reach: expected to fail until fixed."""
    def wrap(fn):
        fn.__doc__ = "KNOWN BUG: " + description
        if os.environ.get("KGPU_TEST_STRICT"):
            return fn
        return unittest.expectedFailure(fn)
    return wrap


# ---------------------------------------------------------------------------
# The API server stand-in (one for the whole run; each test has its own node)
# ---------------------------------------------------------------------------

class Api:
    def __init__(self, tmp):
        port_file = os.path.join(tmp, "apiserver.port")
        self.child = Child([sys.executable, API_STANDIN, "--port", "0", "--portfile", port_file,
                            "--token", TOKEN], os.path.join(tmp, "apiserver.log"))

        def port():
            if not self.child.alive():
                raise AssertionError("API stand-in exited:\n" + self.child.log_tail())
            try:
                with open(port_file) as f:
                    text = f.read()
            except OSError:
                return None
            return int(text) if text.endswith("\n") else None
        self.port = wait_for(port, 20, what="the API stand-in's port")

    def kubeconfig(self, path):
        with open(path, "w") as f:
            f.write("apiVersion: v1\nkind: Config\ncurrent-context: standin\n"
                    "contexts:\n- name: standin\n  context: {cluster: standin, user: tester}\n"
                    "clusters:\n- name: standin\n  cluster: {server: 'http://127.0.0.1:%d'}\n"
                    "users:\n- name: tester\n  user: {token: '%s'}\n" % (self.port, TOKEN))
        return path

    def call(self, method, path, body=None, content_type="application/json", expect=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            headers = {"Authorization": "Bearer " + TOKEN}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = content_type
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        obj = json.loads(raw) if raw else None
        if expect is not None and resp.status != expect:
            raise AssertionError("API %s %s: %d %s" % (method, path, resp.status, obj))
        return resp.status, obj

    def add_node(self, name):
        self.call("POST", "/api/v1/nodes", {"metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name}}, "spec": {}, "status": {}}, expect=201)

    def node(self, name):
        return self.call("GET", "/api/v1/nodes/" + name, expect=200)[1]

    # Pods live in the current test's namespace (self.ns, set by each test).

    def add_pod(self, pod):
        return self.call("POST", "/api/v1/namespaces/%s/pods" % self.ns, pod, expect=201)[1]

    def pod(self, name):
        status, obj = self.call("GET", "/api/v1/namespaces/%s/pods/%s" % (self.ns, name))
        return obj if status == 200 else None

    def patch_pod(self, name, patch):
        return self.call("PATCH", "/api/v1/namespaces/%s/pods/%s" % (self.ns, name), patch,
                         "application/merge-patch+json", expect=200)[1]

    def delete_pod(self, name):
        self.call("DELETE", "/api/v1/namespaces/%s/pods/%s" % (self.ns, name), expect=200)

    def stats(self):
        return self.call("GET", "/_control/stats", expect=200)[1]


API = None
_API_TMP = None


def setUpModule():
    global API, _API_TMP
    _API_TMP = tempfile.mkdtemp(prefix="kgpu-dp-api-")
    API = Api(_API_TMP)


def tearDownModule():
    if API is not None:
        API.child.stop()
    if os.environ.get("KGPU_TEST_KEEP"):
        sys.stderr.write("API stand-in log kept in %s\n" % _API_TMP)
    elif _API_TMP:
        shutil.rmtree(_API_TMP, ignore_errors=True)


# ---------------------------------------------------------------------------
# GPUs, pods and what the plugin should answer
# ---------------------------------------------------------------------------

_SEQ = [0]


def next_seq():
    _SEQ[0] += 1
    return _SEQ[0]


def make_gpus(n, memory_mib=15360, model="Tesla T4", numa=(0,), healthy=True):
    """n GPUs with UUIDs unique to this run; numa cycles through the given nodes."""
    seq = next_seq()
    return [{"index": i, "uuid": "GPU-%08x-%04x-4000-8000-%012x" % (os.getpid(), seq, i),
             "model": model, "memory_mib": memory_mib, "numa": numa[i % len(numa)],
             "healthy": healthy} for i in range(n)]


def gpus_yaml(gpus):
    out = ["# fake GPUs for test_device_plugin.py", "gpus:"]
    for g in gpus:
        out += ["  - index: %d" % g["index"], "    uuid: %s" % g["uuid"],
                "    model: %s" % json.dumps(g["model"]), "    memory_mib: %d" % g["memory_mib"],
                "    numa: %d" % g["numa"], "    healthy: %s" % str(g["healthy"]).lower()]
    return "\n".join(out) + "\n"


def ids_of(gpu, resource, unit_mib=1024):
    if resource == WHOLE:
        return [gpu["uuid"]]
    n = 100 if resource == CORE else gpu["memory_mib"] // unit_mib
    return ["%s::%d" % (gpu["uuid"], k) for k in range(n)]


def container(name, limits):
    return {"name": name, "image": "busybox:1.36", "command": ["sleep", "3600"],
            "resources": {"limits": {k: str(v) for k, v in limits.items()}}}


def part(name, gpus, exclusive=False):
    """One assignment entry: gpus is [(gpu dict, milli, memory_mib)]."""
    return {"container": name, "exclusive": exclusive,
            "gpus": [{"index": g["index"], "uuid": g["uuid"], "milli": milli,
                      "memory_mib": mem} for g, milli, mem in gpus]}


def bound_pod(name, node, containers, parts, init_containers=None, extra_annotations=None,
              assignment_text=None):
    """A pod as it is right after the extender's Binding: on `node`, with the assignment."""
    ann = {"kgpu.io/assignment": assignment_text if assignment_text is not None
           else json.dumps(parts, separators=(",", ":")),
           "kgpu.io/node": node,
           "kgpu.io/bind-time": time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())}
    ann.update(extra_annotations or {})
    spec = {"schedulerName": "default-scheduler", "restartPolicy": "Never",
            "nodeName": node, "containers": containers}
    if init_containers:
        spec["initContainers"] = init_containers
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": ann}, "spec": spec}


def annotations(pod):
    return (pod or {}).get("metadata", {}).get("annotations") or {}


def limits_text(lines):
    """The limits file for [(uuid, memory_mib, core_pct)]."""
    return "# kgpu limits v1\n" + "".join(
        "device %d uuid=%s memory_mib=%d core_pct=%d\n" % (i, u, m, c)
        for i, (u, m, c) in enumerate(lines))


# ---------------------------------------------------------------------------
# The test base: a folder, a kubelet stand-in, plugins
# ---------------------------------------------------------------------------

class Plugin:
    def __init__(self, tc, args, env_extra=None, name=None):
        self.tc = tc
        self.name = name or "plugin%d" % len(tc.plugins)
        argv = [PLUGIN_BIN, "--plugin-dir", tc.plugin_dir, "--state-dir", tc.state_dir,
                "--log-level", "debug"] + list(args)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("KUBERNETES_SERVICE") and not k.startswith("FAKE_NVML")}
        env.pop("NODE_NAME", None)
        env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0:exitcode=86")
        env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1:exitcode=87")
        env.update(env_extra or {})
        self.argv = argv
        self.child = Child(argv, os.path.join(tc.tmp, self.name + ".log"), env)
        self.started = time.monotonic()
        self.stopped = False

    def sanitizer_report(self):
        return self.child.sanitizer_report()

    def stop(self):
        """SIGTERM: exit 0, sockets gone, no sanitizer report (asserted)."""
        self.stopped = True
        rc = self.child.stop(signal.SIGTERM)
        report = self.sanitizer_report()
        self.tc.assertIsNone(report, "%s: sanitizer report:\n%s" % (self.name, report))
        self.tc.assertEqual(rc, 0, "%s exited %s on SIGTERM; log:\n%s"
                            % (self.name, rc, self.child.log_tail()))
        left = [n for n in os.listdir(self.tc.plugin_dir)
                if n.startswith("kgpu-") and n.endswith(".sock")]
        self.tc.assertEqual(left, [], "%s left its sockets behind" % self.name)


class PluginCase(unittest.TestCase):
    unit = 1024

    def setUp(self):
        # Short paths: a unix socket path must fit in 108 bytes.
        self.tmp = tempfile.mkdtemp(prefix="kdp-")
        self.plugin_dir = os.path.join(self.tmp, "dp")
        self.state_dir = os.path.join(self.tmp, "state")
        os.makedirs(self.plugin_dir)
        self.shim = os.path.join(self.tmp, "libkgpu-limit.so")
        with open(self.shim, "w") as f:
            f.write("not really a library: the plugin only checks that it is there\n")
        self.gpu_file = os.path.join(self.tmp, "gpus.yaml")
        self.plugins = []
        self.kubelet = None
        self.node = "node-%d-%d" % (os.getpid(), next_seq())
        self.ns = "ns-%d" % next_seq()
        if API is not None:
            API.ns = self.ns
        self.used = {}  # resource -> IDs kubelet has handed out

    def tearDown(self):
        try:
            for p in self.plugins:
                if not p.stopped and p.child.alive():
                    p.stop()
        finally:
            for p in self.plugins:
                p.child.stop(signal.SIGKILL)
            if self.kubelet is not None:
                self.kubelet.stop()
            if os.environ.get("KGPU_TEST_KEEP"):
                sys.stderr.write("\n%s: kept %s\n" % (self.id(), self.tmp))
            else:
                shutil.rmtree(self.tmp, ignore_errors=True)

    # Setting up.

    def write_gpus(self, gpus, atomic=False):
        text = gpus_yaml(gpus)
        if atomic:
            tmp = self.gpu_file + ".new"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, self.gpu_file)
        else:
            with open(self.gpu_file, "w") as f:
                f.write(text)

    def start_kubelet(self):
        self.kubelet = KubeletStandin(self.plugin_dir, SOURCE_DIR, pb=PB).start()
        return self.kubelet

    def start_plugin(self, args=(), gpus=None, api=False, shim=True, env=None, name=None):
        args = list(args)
        if gpus is not None:
            self.write_gpus(gpus)
            args += ["--fake-gpus", self.gpu_file]
        if api:
            API.add_node(self.node)
            args += ["--kubeconfig", API.kubeconfig(os.path.join(self.tmp, "kubeconfig")),
                     "--node-name", self.node]
        if shim:
            args += ["--shim-lib", self.shim]
        p = Plugin(self, args, env, name)
        self.plugins.append(p)
        return p

    def wait_serving(self, plugin, resources=(MEM, CORE), timeout=10.0):
        def up():
            if not plugin.child.alive():
                raise AssertionError("%s exited with %s:\n%s" % (
                    plugin.name, plugin.child.proc.returncode, plugin.child.log_tail()))
            return all(socket_alive(os.path.join(self.plugin_dir, SOCKETS[r]))
                       for r in resources)
        wait_for(up, timeout, what="the plugin's sockets")

    def up(self, gpus, args=(), api=False, resources=(MEM, CORE), **kw):
        """kubelet, then the plugin; waits for every resource's first device list."""
        if self.kubelet is None:
            self.start_kubelet()
        p = self.start_plugin(args, gpus, api, **kw)
        try:
            self.kubelet.wait_registered(resources, timeout=10)
            for r in resources:
                self.kubelet.wait_list(r, timeout=10)
        except AssertionError as e:
            raise AssertionError("%s\nplugin log:\n%s" % (e, p.child.log_tail()))
        return p

    # kubelet's side of an allocation.

    def free_ids(self, resource):
        devices = self.kubelet.lists[resource]
        used = self.used.get(resource, set())
        return [i for i, d in devices.items() if d.health == "Healthy" and i not in used]

    def admit(self, resource, n, must_include=()):
        """GetPreferredAllocation then Allocate for one container, as kubelet does it.

        Returns (ids, ContainerAllocateResponse); raises grpc.RpcError as Allocate does.
        """
        available = self.free_ids(resource)
        ids = self.kubelet.preferred(resource, available, must_include, n)
        self.assertEqual(len(ids), n, "GetPreferredAllocation returned %r for %d" % (ids, n))
        self.assertEqual(len(set(ids)), n, "GetPreferredAllocation repeats an ID: %r" % ids)
        self.assertTrue(set(ids) <= set(available), "preferred IDs not offered: %r" % ids)
        resp = self.kubelet.allocate(resource, ids)
        self.assertEqual(len(resp.container_responses), 1)
        self.used.setdefault(resource, set()).update(ids)
        return ids, resp.container_responses[0]

    def assert_rpc_error(self, code, fn, *args, contains=()):
        with self.assertRaises(grpc.RpcError) as cm:
            fn(*args)
        err = cm.exception
        self.assertEqual(err.code(), code, "details: %s" % err.details())
        for text in contains:
            self.assertIn(text, err.details())
        return err.details()

    def assert_empty_response(self, r):
        self.assertEqual(dict(r.envs), {})
        self.assertEqual(len(r.mounts), 0)
        self.assertEqual(len(r.devices), 0)
        self.assertEqual(dict(r.annotations), {})
        self.assertEqual(len(r.cdi_devices), 0)

    def assert_container_response(self, r, pod, cname, gpus, unit=1024, pod_units=None,
                                  shim=True, cdi="uuid"):
        """gpus: [(gpu dict, memory_mib, core_pct)]; checks env, mounts and the host files.

        cdi: how the GPUs are named as CDI devices ("uuid", "index"; None: no CDI devices,
        --device-list-strategy envvar).
        """
        uid = pod["metadata"]["uid"]
        mem_each = gpus[0][1]
        total = sum(m for _, m, _ in gpus)
        env = {"NVIDIA_VISIBLE_DEVICES": ",".join(g["uuid"] for g, _, _ in gpus),
               "KGPU_MEMORY_LIMIT_MIB": str(mem_each),
               "KGPU_CORE_LIMIT_PCT": str(gpus[0][2]),
               "KGPU_SHARED_DIR": "/var/run/kgpu",
               "KGPU_CONTAINER": cname,
               "ALIYUN_COM_GPU_MEM_CONTAINER": str(total // unit),
               "ALIYUN_COM_GPU_MEM_DEV": str(gpus[0][0]["memory_mib"] // unit),
               "ALIYUN_COM_GPU_MEM_IDX": str(gpus[0][0]["index"]),
               "ALIYUN_COM_GPU_MEM_POD": str(pod_units if pod_units is not None
                                             else total // unit)}
        self.assertEqual(dict(r.envs), env)
        pod_dir = os.path.join(self.state_dir, "pods", uid)
        mounts = {("/etc/kgpu/limits", os.path.join(pod_dir, cname + ".limits"), True),
                  ("/var/run/kgpu", os.path.join(pod_dir, "shared"), False)}
        if shim:
            mounts |= {(SHIM_IN_CONTAINER, self.shim, True),
                       ("/etc/ld.so.preload", os.path.join(self.state_dir, "ld.so.preload"),
                        True)}
        # A compute share: that GPU's schedule, read-write, one file each, never the
        # directory (which would show the node's other GPUs' schedules).
        sched = [g["uuid"] for g, _, c in gpus if c < 100]
        mounts |= {("/var/run/kgpu-gpu/%s.sched" % u, self.sched_file(u), False) for u in sched}
        got = [(m.container_path, m.host_path, m.read_only) for m in r.mounts]
        self.assertEqual(len(got), len(mounts), got)
        self.assertEqual(set(got), mounts)
        self.assertEqual(len(r.devices), 0)
        self.assertEqual(dict(r.annotations), {})
        # The GPUs as CDI devices, named as nvidia-ctk names them: the runtime injects these,
        # whatever NVIDIA_VISIBLE_DEVICES the container sets itself.
        want = [] if cdi is None else ["nvidia.com/gpu=%s" % (
            g["uuid"] if cdi == "uuid" else g["index"]) for g, _, _ in gpus]
        self.assertEqual([d.name for d in r.cdi_devices], want)
        # The files behind the mounts.
        path = os.path.join(pod_dir, cname + ".limits")
        with open(path) as f:
            self.assertEqual(f.read(), limits_text([(g["uuid"], m, c) for g, m, c in gpus]))
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o444)
        shared = os.path.join(pod_dir, "shared")
        self.assertTrue(os.path.isdir(shared))
        self.assertEqual(stat.S_IMODE(os.stat(shared).st_mode), 0o1777)
        if shim:
            with open(os.path.join(self.state_dir, "ld.so.preload")) as f:
                self.assertEqual(f.read(), SHIM_IN_CONTAINER + "\n")
        for u in sched:
            self.assert_schedule(u)

    def sched_file(self, uuid):
        return os.path.join(self.state_dir, "sched", uuid + ".sched")

    def assert_schedule(self, uuid):
        """The GPU's schedule as the library expects it, usable by containers of any user."""
        d = os.path.join(self.state_dir, "sched")
        self.assertEqual(stat.S_IMODE(os.stat(d).st_mode), 0o700)
        st = os.lstat(self.sched_file(uuid))
        self.assertTrue(stat.S_ISREG(st.st_mode))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o666)
        self.assertEqual(st.st_size, SCHED_SIZE)
        with open(self.sched_file(uuid), "rb") as f:
            head = f.read(16)
        self.assertEqual(head[:8], b"KGPUSCHD")
        self.assertEqual(struct.unpack("=II", head[8:16]), (3, 64))  # version, members

    def pod_files(self):
        root = os.path.join(self.state_dir, "pods")
        out = []
        for dirpath, dirs, files in os.walk(root):
            out += [os.path.relpath(os.path.join(dirpath, n), root) for n in dirs + files]
        return sorted(out)


# ---------------------------------------------------------------------------
# 1. Registration and device lists
# ---------------------------------------------------------------------------

class TestRegistration(PluginCase):
    def check_lists(self, gpus, unit, resources):
        for r in resources:
            _, devices = self.kubelet.wait_list(r)
            want = {}
            for g in gpus:
                for i in ids_of(g, r, unit):
                    want[i] = ("Healthy" if g["healthy"] else "Unhealthy",
                               [g["numa"]] if g["numa"] >= 0 else None)
            got = {i: (d.health, d.numa) for i, d in devices.items()}
            self.assertEqual(set(got), set(want), "%s: device IDs differ" % r)
            self.assertEqual(got, want, "%s: health or topology differ" % r)

    def test_registers_both_resources_with_exact_devices(self):
        gpus = make_gpus(3, numa=(0, 1, -1))
        gpus[2]["healthy"] = False
        self.up(gpus, ["--no-api-server"])
        regs = self.kubelet.registered()
        self.assertEqual(set(regs), {MEM, CORE}, "only the two default resources register")
        for r in (MEM, CORE):
            req = regs[r]
            self.assertEqual(req.version, "v1beta1")
            self.assertEqual(req.endpoint, SOCKETS[r])
            self.assertEqual(req.resource_name, r)
            self.assertTrue(req.HasField("options"))
            self.assertTrue(req.options.get_preferred_allocation_available)
            self.assertFalse(req.options.pre_start_required)
            opts = self.kubelet.options(r)
            self.assertTrue(opts.get_preferred_allocation_available)
            self.assertFalse(opts.pre_start_required)
            self.assertEqual(self.kubelet.endpoints[r].options, opts)
        self.check_lists(gpus, 1024, (MEM, CORE))
        # 15360 MiB at 1Gi: 15 IDs per GPU, 100 gpu-core IDs per GPU.
        self.assertEqual(len(self.kubelet.lists[MEM]), 45)
        self.assertEqual(len(self.kubelet.lists[CORE]), 300)
        # PreStartContainer is not required, but answering it must not hurt.
        self.kubelet.prestart(MEM, ids_of(gpus[0], MEM)[:1])

    def test_memory_unit_512mi_and_optional_resources(self):
        gpus = make_gpus(2, numa=(1,))
        self.up(gpus, ["--no-api-server", "--memory-unit", "512Mi", "--whole-gpus",
                       "--gpushare-alias"], resources=(MEM, CORE, WHOLE, ALIAS))
        regs = self.kubelet.registered()
        self.assertEqual(set(regs), {MEM, CORE, WHOLE, ALIAS})
        for r in (WHOLE, ALIAS):
            self.assertEqual(regs[r].endpoint, SOCKETS[r])
            self.assertEqual(regs[r].version, "v1beta1")
        self.check_lists(gpus, 512, (MEM, CORE, WHOLE, ALIAS))
        self.assertEqual(len(self.kubelet.lists[MEM]), 60)   # 30 per GPU
        self.assertEqual(len(self.kubelet.lists[ALIAS]), 60)
        self.assertEqual(sorted(self.kubelet.lists[WHOLE]), sorted(g["uuid"] for g in gpus))


class TestMpsMode(PluginCase):
    """--sharing mps starts only where the MPS control daemon's pipe is (docs: "MPS mode")."""

    def test_refuses_to_start_without_the_control_pipe(self):
        self.start_kubelet()
        pipes = os.path.join(self.tmp, "mps")
        os.mkdir(pipes)
        p = self.start_plugin(["--no-api-server", "--sharing", "mps", "--mps-pipe-dir", pipes],
                              make_gpus(1))
        self.assertEqual(p.child.wait_exit(30), 1)
        p.stopped = True
        self.assertIsNone(p.sanitizer_report())
        log = p.child.log()
        self.assertIn("MPS mode: %s/control is missing" % pipes, log)
        self.assertIn("nvidia-cuda-mps-control -d", log)
        self.assertEqual([n for n in os.listdir(self.plugin_dir) if n != "kubelet.sock"], [],
                         "it created sockets before refusing")
        self.assertEqual(self.kubelet.registered(), {})

    def test_serves_where_the_daemon_listens(self):
        pipes = os.path.join(self.tmp, "mps")
        os.mkdir(pipes)
        os.mkfifo(os.path.join(pipes, "control"))
        p = self.up(make_gpus(1), ["--no-api-server", "--sharing", "mps", "--mps-pipe-dir", pipes])
        self.assertTrue(p.child.alive())


class TestStateFilesystem(PluginCase):
    """Containers write into --state-dir outside ephemeral-storage: it must be a bounded
    filesystem (docs: "The state folder's filesystem")."""

    def test_refuses_a_state_folder_on_a_larger_filesystem(self):
        self.start_kubelet()
        p = self.start_plugin(["--no-api-server", "--state-limit", "1Mi", "--state-check",
                               "refuse"], make_gpus(1))
        self.assertEqual(p.child.wait_exit(30), 1)
        p.stopped = True
        self.assertIsNone(p.sanitizer_report())
        log = p.child.log()
        self.assertIn("--state-dir %s is on a filesystem of" % self.state_dir, log)
        self.assertIn("more than --state-limit (1 MiB)", log)
        self.assertEqual(self.kubelet.registered(), {})

    def test_warns_by_default_and_serves(self):
        p = self.up(make_gpus(1), ["--no-api-server", "--state-limit", "1Mi"])
        self.assertIn("more than --state-limit (1 MiB)", p.child.log())
        self.assertTrue(p.child.alive())

    def test_a_small_enough_filesystem_passes(self):
        p = self.up(make_gpus(1), ["--no-api-server", "--state-limit", "1Ei",
                                   "--state-check", "refuse"])
        self.assertNotIn("--state-limit", p.child.log())

    def test_bad_values_are_refused(self):
        for args, msg in ((["--state-limit", "lots"], "--state-limit lots: expected a size"),
                          (["--state-check", "maybe"], "--state-check maybe: expected warn")):
            r = subprocess.run([PLUGIN_BIN] + args, capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2)
            self.assertIn(msg, r.stderr)


# ---------------------------------------------------------------------------
# 2. kubelet's message size limit
# ---------------------------------------------------------------------------

class TestMessageSizeGuard(PluginCase):
    def test_too_small_unit_fails_at_start_naming_a_unit(self):
        self.start_kubelet()
        gpus = make_gpus(8, memory_mib=81920, model="NVIDIA A100-SXM4-80GB")
        p = self.start_plugin(["--no-api-server", "--memory-unit", "1Mi"], gpus)
        rc = p.child.wait_exit(30)
        p.stopped = True
        self.assertIsNotNone(rc, "the plugin serves 655360 IDs instead of refusing")
        self.assertNotEqual(rc, 0)
        log = p.child.log()
        self.assertIsNone(p.sanitizer_report())
        m = re.search(r"use a memory unit of at least (\d+) MiB", log)
        self.assertIsNotNone(m, "no unit named in:\n" + p.child.log_tail())
        self.assertIn("kgpu.io/gpu-mem", log)
        self.assertEqual([n for n in os.listdir(self.plugin_dir) if n != "kubelet.sock"], [],
                         "it created sockets before refusing")
        self.assertEqual(self.kubelet.registered(), {})
        # The unit it names works, and leaves the list under kubelet's 4 MiB.
        named = int(m.group(1))
        self.assertGreater(named, 1)
        self.assertLessEqual(named, 64, "far larger than needed")
        self.up(None, ["--no-api-server", "--memory-unit", "%dMi" % named,
                       "--fake-gpus", self.gpu_file])
        devices = self.kubelet.lists[MEM]
        self.assertEqual(len(devices), 8 * (81920 // named))
        size = PB.ListAndWatchResponse(devices=[
            PB.Device(ID=i, health=d.health, topology=PB.TopologyInfo(
                nodes=[PB.NUMANode(ID=n) for n in d.numa])) for i, d in devices.items()
        ]).ByteSize()
        self.assertLessEqual(size, 1 << 20)

    def test_named_unit_is_close_to_the_smallest(self):
        gpus = make_gpus(8, memory_mib=81920, model="NVIDIA A100-SXM4-80GB")
        p = self.start_plugin(["--no-api-server", "--memory-unit", "32Mi"], gpus)
        self.assertIsNotNone(p.child.wait_exit(30))
        p.stopped = True
        m = re.search(r"use a memory unit of at least (\d+) MiB", p.child.log())
        self.assertIsNotNone(m, p.child.log_tail())
        self.assertLessEqual(int(m.group(1)), 48)


# ---------------------------------------------------------------------------
# 3. kubelet restarts, and a kubelet that starts late
# ---------------------------------------------------------------------------

class TestKubeletRestart(PluginCase):
    def test_reregisters_after_kubelet_restart(self):
        gpus = make_gpus(2)
        self.up(gpus, ["--no-api-server"])
        for round in range(2):
            old = dict(self.kubelet.endpoints)
            t0 = time.monotonic()
            self.kubelet.restart()
            regs = self.kubelet.wait_registered((MEM, CORE), since=t0, timeout=5)
            took = time.monotonic() - t0
            self.assertLess(took, 2.0, "re-registration took %.2f s" % took)
            for r in (MEM, CORE):
                self.assertEqual(regs[r].endpoint, SOCKETS[r])
                self.assertTrue(old[r].ended.is_set(), "the old stream is still open")
                _, devices = self.kubelet.wait_list(r, since=t0)
                self.assertEqual(set(devices), {i for g in gpus for i in ids_of(g, r)})
                ep = self.kubelet.endpoints[r]
                self.assertFalse(ep.ended.is_set(), "new stream ended: %s" % ep.error)
            # The new connection serves calls.
            self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.kubelet.allocate,
                                  MEM, ids_of(gpus[0], MEM)[:2], contains=("API server",))

    def test_restarts_in_quick_succession(self):
        gpus = make_gpus(1)
        self.up(gpus, ["--no-api-server"])
        for pause in (0.0, 0.05, 0.0, 0.25, 0.0, 0.12):
            t0 = time.monotonic()
            self.kubelet.restart(pause=pause)
            self.kubelet.wait_registered((MEM, CORE), since=t0, timeout=5)
            for r in (MEM, CORE):
                _, devices = self.kubelet.wait_list(r, since=t0, timeout=5)
                self.assertEqual(set(devices), set(ids_of(gpus[0], r)))
            self.assertLess(time.monotonic() - t0, 2.0 + pause)
        # Exactly the two resources, each from its own socket, after every restart.
        for t, req in self.kubelet.registrations:
            self.assertEqual(req.endpoint, SOCKETS[req.resource_name])

    def test_kubelet_started_after_the_plugin(self):
        gpus = make_gpus(1)
        p = self.start_plugin(["--no-api-server"], gpus)
        self.wait_serving(p)
        time.sleep(0.5)  # a few of the plugin's loops with no kubelet.sock
        t0 = time.monotonic()
        self.start_kubelet()
        self.kubelet.wait_registered((MEM, CORE), timeout=3)
        self.assertLess(time.monotonic() - t0, 2.0)
        _, devices = self.kubelet.wait_list(MEM)
        self.assertEqual(set(devices), set(ids_of(gpus[0], MEM)))

    def test_kubelet_refusing_registration_is_retried(self):
        gpus = make_gpus(1)
        self.start_kubelet()
        self.kubelet.register_status = (grpc.StatusCode.UNAVAILABLE, "not yet")
        p = self.start_plugin(["--no-api-server"], gpus)
        self.kubelet.wait(lambda: len(self.kubelet.registrations) >= 2, 5,
                          "a second attempt after a refused registration")
        self.kubelet.register_status = None
        t0 = time.monotonic()
        self.kubelet.wait_registered((MEM, CORE), since=t0, timeout=4)
        self.kubelet.wait_list(CORE, since=t0)
        self.assertTrue(p.child.alive())


# ---------------------------------------------------------------------------
# 4. Health from the fake file
# ---------------------------------------------------------------------------

class TestHealth(PluginCase):
    def measure(self, gpus, atomic, want_health):
        """Writes the file; seconds until both lists show GPU 1 in want_health."""
        t0 = time.monotonic()
        self.write_gpus(gpus, atomic=atomic)
        bad = set(ids_of(gpus[1], MEM))

        def shows(devices):
            return all(devices[i].health == want_health for i in bad) and all(
                d.health == "Healthy" for i, d in devices.items() if i not in bad)
        t_mem, _ = self.kubelet.wait_list(MEM, shows, since=t0, timeout=5)
        bad = set(ids_of(gpus[1], CORE))
        t_core, _ = self.kubelet.wait_list(CORE, shows, since=t0, timeout=5)
        return max(t_mem, t_core) - t0

    def node_healthy(self):
        ann = annotations(API.node(self.node)).get("kgpu.io/gpus")
        return [g["healthy"] for g in json.loads(ann)] if ann else None

    def test_unhealthy_within_a_second_and_back(self):
        gpus = make_gpus(2, numa=(0, 1))
        self.up(gpus, api=True)
        wait_for(lambda: self.node_healthy() == [True, True], 5, what="node annotation")
        node = API.node(self.node)
        self.assertEqual(json.loads(annotations(node)["kgpu.io/gpus"]), gpus)
        self.assertEqual(node["metadata"]["labels"]["kgpu.io/gpu-model"], "Tesla-T4")
        self.assertEqual(node["metadata"]["labels"]["kgpu.io/gpu-count"], "2")
        self.assertEqual(node["metadata"]["labels"]["kubernetes.io/hostname"], self.node)
        gpus[1]["healthy"] = False
        took = self.measure(gpus, atomic=False, want_health="Unhealthy")
        if os.environ.get("KGPU_TEST_VERBOSE"):
            sys.stderr.write("health: Unhealthy reached kubelet after %.3f s\n" % took)
        self.assertLess(took, 1.0, "GPU 1 turned Unhealthy after %.2f s" % took)
        wait_for(lambda: self.node_healthy() == [True, False], 3, what="healthy:false on node")
        gpus[1]["healthy"] = True
        took = self.measure(gpus, atomic=True, want_health="Healthy")
        self.assertLess(took, 1.0, "GPU 1 turned Healthy again after %.2f s" % took)
        wait_for(lambda: self.node_healthy() == [True, True], 3, what="healthy:true on node")

    def test_slow_api_server_does_not_hold_back_health(self):
        """Publishing the node is the API server's pace; kubelet's lists must not wait on it."""
        gpus = make_gpus(2)
        self.up(gpus, api=True)
        wait_for(lambda: self.node_healthy() == [True, True], 5, what="node annotation")
        API.call("POST", "/_control", {"patch_delay_ms": 3000}, expect=200)
        try:
            gpus[1]["healthy"] = False
            took1 = self.measure(gpus, atomic=True, want_health="Unhealthy")
            time.sleep(0.4)  # the plugin's PATCH of the node is under way now
            gpus[1]["healthy"] = True
            took2 = self.measure(gpus, atomic=True, want_health="Healthy")
        finally:
            API.call("POST", "/_control", {"patch_delay_ms": 0}, expect=200)
        self.assertLess(took1, 1.0)
        self.assertLess(took2, 1.0, "health waited %.2f s for a node PATCH" % took2)
        # The node ends up with the newest state, not the one whose PATCH was slow.
        wait_for(lambda: self.node_healthy() == [True, True], 10, what="healthy again on node")
        time.sleep(0.5)
        self.assertEqual(self.node_healthy(), [True, True])

    def test_node_labels_for_mixed_models(self):
        gpus = make_gpus(2, model="NVIDIA A100-SXM4-40GB", numa=(-1,))
        self.up(gpus, api=True)
        wait_for(lambda: self.node_healthy() == [True, True], 5, what="node annotation")
        labels = API.node(self.node)["metadata"]["labels"]
        self.assertEqual(labels["kgpu.io/gpu-model"], "NVIDIA-A100-SXM4-40GB")
        self.assertEqual(labels["kgpu.io/gpu-count"], "2")
        gpus = gpus + make_gpus(1, model="Tesla T4", numa=(-1,))
        gpus[2]["index"] = 2
        self.write_gpus(gpus, atomic=True)
        wait_for(lambda: self.node_healthy() == [True, True, True], 3, what="3 GPUs published")
        node = API.node(self.node)
        self.assertEqual(json.loads(annotations(node)["kgpu.io/gpus"]), gpus)
        self.assertEqual(node["metadata"]["labels"]["kgpu.io/gpu-model"], "mixed")
        self.assertEqual(node["metadata"]["labels"]["kgpu.io/gpu-count"], "3")
        _, devices = self.kubelet.wait_list(MEM, lambda d: len(d) == 45)
        self.assertEqual(set(devices), {i for g in gpus for i in ids_of(g, MEM)})

    def test_health_reaches_kubelet_while_it_keeps_calling(self):
        """A busy server (back-to-back unary calls) must still stream health changes."""
        gpus = make_gpus(2)
        self.up(gpus, ["--no-api-server"])
        stop = threading.Event()
        calls = [0]

        def hammer():
            while not stop.is_set():
                self.kubelet.options(MEM)
                calls[0] += 1
        threads = [threading.Thread(target=hammer, daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.3)
            gpus[1]["healthy"] = False
            took = self.measure(gpus, atomic=True, want_health="Unhealthy")
        finally:
            stop.set()
            for t in threads:
                t.join(10)
        self.assertGreater(calls[0], 10)
        self.assertLess(took, 1.0, "health took %.2f s to reach kubelet under load" % took)

    def test_broken_file_keeps_the_previous_inventory(self):
        gpus = make_gpus(2)
        p = self.up(gpus, ["--no-api-server"])
        t0 = time.monotonic()
        with open(self.gpu_file, "w") as f:
            f.write("gpus: [ {index: 0, uuid: }\n")
        wait_for(lambda: "keeping the previous inventory" in p.child.log(), 3,
                 what="the plugin's complaint")
        later = [h for h in self.kubelet.history if h[0] >= t0]
        self.assertEqual(later, [], "a broken file changed the device lists")
        gpus[0]["healthy"] = False
        self.write_gpus(gpus)
        _, devices = self.kubelet.wait_list(
            MEM, lambda d: d[ids_of(gpus[0], MEM)[0]].health == "Unhealthy", since=t0)
        self.assertEqual(len(devices), 30)


# ---------------------------------------------------------------------------
# 5. The fake NVML
# ---------------------------------------------------------------------------

class TestFakeNvml(PluginCase):
    UUIDS = ("GPU-11111111-2222-4333-8444-555555555555",
             "GPU-66666666-7777-4888-8999-000000000000")

    def nvml_env(self, **extra):
        env = {"FAKE_NVML_GPUS": "%s,Tesla T4,15360,00000000:3B:00.0;"
                                 "%s,NVIDIA A100-SXM4-40GB,40960,00000000:86:00.0" % self.UUIDS}
        env.update(extra)
        return env

    def sysfs(self):
        """A /sys with a NUMA node for the first GPU's bus ID only."""
        root = os.path.join(self.tmp, "sys")
        dev = os.path.join(root, "bus", "pci", "devices", "0000:3b:00.0")
        os.makedirs(dev)
        with open(os.path.join(dev, "numa_node"), "w") as f:
            f.write("1\n")
        return root

    def nvml_plugin(self, variant, env, extra=()):
        lib = os.path.join(FAKE_NVML_DIR, variant, "libnvidia-ml.so.1")
        if not os.path.exists(lib):
            self.skipTest("fake NVML %s not built (%s)" % (variant, lib))
        return ["--no-api-server", "--nvml-lib", lib] + list(extra), env

    def test_discovers_gpus_and_numa(self):
        args, env = self.nvml_plugin("full", self.nvml_env(), ["--sysfs", self.sysfs()])
        self.start_kubelet()
        p = self.start_plugin(args, env=env)
        self.kubelet.wait_registered((MEM, CORE), timeout=10)
        _, devices = self.kubelet.wait_list(MEM)
        want = {}
        for uuid, mib, numa in ((self.UUIDS[0], 15360, [1]), (self.UUIDS[1], 40960, None)):
            for k in range(mib // 1024):
                want["%s::%d" % (uuid, k)] = ("Healthy", numa)
        self.assertEqual({i: (d.health, d.numa) for i, d in devices.items()}, want)
        _, core = self.kubelet.wait_list(CORE)
        self.assertEqual(len(core), 200)
        self.assertIn("Tesla T4", p.child.log())

    def test_xid_marks_the_gpu_unhealthy(self):
        args, env = self.nvml_plugin("full", self.nvml_env(FAKE_NVML_XID="1:79"))
        self.start_kubelet()
        p = self.start_plugin(args, env=env)
        self.kubelet.wait_registered((MEM, CORE), timeout=10)
        first, _ = self.kubelet.wait_list(MEM)

        def bad(devices):
            return all(d.health == ("Unhealthy" if i.startswith(self.UUIDS[1]) else "Healthy")
                       for i, d in devices.items())
        t, _ = self.kubelet.wait_list(MEM, bad, timeout=3)
        self.assertLess(t - p.started, 3.0)
        self.kubelet.wait_list(CORE, bad, timeout=1)
        self.assertIn("XID 79", p.child.log())
        # It stays unhealthy: nothing turns it back.
        time.sleep(0.5)
        self.assertTrue(bad(self.kubelet.lists[MEM]))

    def test_gpu_lost_at_start_leaves_the_others_served(self):
        args, env = self.nvml_plugin("full", self.nvml_env(FAKE_NVML_LOST="1"))
        self.start_kubelet()
        p = self.start_plugin(args, env=env)
        try:
            _, devices = self.kubelet.wait_list(MEM, timeout=5)
        except AssertionError:
            p.stopped = not p.child.alive()
            raise
        healthy = {i for i, d in devices.items() if d.health == "Healthy"}
        self.assertEqual(healthy, {"%s::%d" % (self.UUIDS[0], k) for k in range(15)})

    def test_missing_required_symbol_fails_naming_it(self):
        args, env = self.nvml_plugin("nomeminfo", self.nvml_env())
        p = self.start_plugin(args, env=env)
        rc = p.child.wait_exit(20)
        p.stopped = True
        self.assertIsNotNone(rc, "the plugin runs without nvmlDeviceGetMemoryInfo")
        self.assertNotEqual(rc, 0)
        self.assertIn("nvmlDeviceGetMemoryInfo", p.child.log())
        self.assertIsNone(p.sanitizer_report())
        self.assertEqual(os.listdir(self.plugin_dir), [])

    def test_without_event_functions_warns_and_serves(self):
        args, env = self.nvml_plugin("noevents", self.nvml_env(FAKE_NVML_XID="1:79"))
        self.start_kubelet()
        p = self.start_plugin(args, env=env)
        _, devices = self.kubelet.wait_list(MEM, timeout=10)
        self.assertEqual(len(devices), 15 + 40)
        self.assertIn("no event functions", p.child.log())


class TestStaticMig(PluginCase):
    """--mig-strategy: instances an operator made, advertised as NVIDIA's plugin does."""
    A100 = "GPU-a100a100-2222-4333-8444-555555555555"
    A100B = "GPU-a100a100-2222-4333-8444-666666666666"
    T4 = "GPU-11111111-2222-4333-8444-555555555555"
    MIG1 = "nvidia.com/mig-1g.5gb"
    MIG3 = "nvidia.com/mig-3g.20gb"
    MIG2 = "nvidia.com/mig-2g.10gb"

    @staticmethod
    def gi_lines(gpu, layout):
        """State lines for (profile, start) pairs: GI IDs follow the placement as the driver's."""
        lines = []
        # NVML profile (GI and CI: the full-size CI's profile), GI ID of the first start
        shapes = {"1g.5gb": (0, 0, 7), "2g.10gb": (1, 1, 3), "3g.20gb": (2, 2, 1),
                  "7g.40gb": (4, 4, 0)}
        for prof, start in layout:
            nvml, ci_prof, first = shapes[prof]
            step = {0: 1, 1: 2, 2: 4, 4: 8}[nvml]
            gi = first + start // step
            lines.append("gi %s %d %d %d" % (gpu, gi, nvml, start))
            lines.append("ci %s %d 0 %d 0" % (gpu, gi, ci_prof))
        return lines

    def write_state(self, lines):
        tmp = self.state_file + ".new"
        with open(tmp, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp, self.state_file)

    def mig_up(self, strategy, gpus, mig="0", lines=(), resources=(), extra=(), api=False):
        lib = os.path.join(FAKE_NVML_DIR, "full", "libnvidia-ml.so.1")
        if not os.path.exists(lib):
            self.skipTest("fake NVML not built (%s)" % lib)
        self.state_file = os.path.join(self.tmp, "mig-state")
        self.write_state(lines)
        spec = ";".join("%s,%s,%d,0000000%d:3B:00.0" % (u, name, mib, i)
                        for i, (u, name, mib) in enumerate(gpus))
        env = {"FAKE_NVML_GPUS": spec, "FAKE_NVML_MIG": mig,
               "FAKE_NVML_MIG_STATE": self.state_file}
        if self.kubelet is None:
            self.start_kubelet()
        t0 = time.monotonic()
        p = self.start_plugin(([] if api else ["--no-api-server"]) +
                              ["--nvml-lib", lib, "--mig-strategy", strategy] + list(extra),
                              env=env, api=api)
        try:
            self.kubelet.wait_registered((MEM, CORE) + tuple(resources), since=t0, timeout=10)
            for r in resources:
                self.kubelet.wait_list(r, timeout=10)
        except AssertionError as e:
            raise AssertionError("%s\nplugin log:\n%s" % (e, p.child.log_tail()))
        return p

    def a100_t4(self):
        return [(self.A100, "NVIDIA A100-SXM4-40GB", 40960), (self.T4, "Tesla T4", 15360)]

    def assert_mig_ids(self, devices, n):
        self.assertEqual(len(devices), n, devices)
        for i, d in devices.items():
            self.assertRegex(i, r"^MIG-[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$")
            self.assertEqual(d.health, "Healthy")

    def test_mixed_lists_each_profile_and_no_share_of_a_mig_gpu(self):
        layout = [("3g.20gb", 0), ("1g.5gb", 4), ("1g.5gb", 5), ("1g.5gb", 6)]
        p = self.mig_up("mixed", self.a100_t4(), lines=self.gi_lines(self.A100, layout),
                        resources=(self.MIG1, self.MIG3))
        _, ones = self.kubelet.wait_list(self.MIG1)
        _, threes = self.kubelet.wait_list(self.MIG3)
        self.assert_mig_ids(ones, 3)
        self.assert_mig_ids(threes, 1)
        self.assertFalse(set(ones) & set(threes))
        # The GPU in MIG mode is offered neither as shares nor whole: only the T4's units.
        _, mem = self.kubelet.wait_list(MEM)
        self.assertEqual(set(mem), {"%s::%d" % (self.T4, k) for k in range(15)})
        _, core = self.kubelet.wait_list(CORE)
        self.assertEqual(len(core), 100)
        self.assertNotIn(WHOLE, self.kubelet.registered())
        self.assertIn("is in MIG mode: not offered whole or as kgpu.io shares", p.child.log())
        self.assertTrue(socket_alive(os.path.join(self.plugin_dir, "kgpu-mig-1g.5gb.sock")))

    def test_mixed_allocate_answers_the_instance_and_its_files(self):
        layout = [("3g.20gb", 0), ("1g.5gb", 4)]
        self.mig_up("mixed", self.a100_t4(), lines=self.gi_lines(self.A100, layout),
                    resources=(self.MIG1, self.MIG3))
        ids, r = self.admit(self.MIG3, 1)
        mig = ids[0]
        envs = dict(r.envs)
        self.assertEqual(envs["NVIDIA_VISIBLE_DEVICES"], mig)
        self.assertEqual(envs["KGPU_MEMORY_LIMIT_MIB"], "19968")
        self.assertEqual(envs["KGPU_CORE_LIMIT_PCT"], "100")
        self.assertEqual([c.name for c in r.cdi_devices], ["nvidia.com/gpu=" + mig])
        limits = os.path.join(self.state_dir, "pods", mig, "mig.limits")
        got = {(m.container_path, m.host_path, m.read_only) for m in r.mounts}
        self.assertEqual(got, {
            ("/etc/kgpu/limits", limits, True),
            ("/var/run/kgpu", os.path.join(self.state_dir, "pods", mig, "shared"), False),
            (SHIM_IN_CONTAINER, self.shim, True),
            ("/etc/ld.so.preload", os.path.join(self.state_dir, "ld.so.preload"), True)})
        with open(limits) as f:
            self.assertEqual(f.read(), "# kgpu limits v1\n"
                             "device 0 uuid=%s memory_mib=19968 core_pct=100\n" % mig)
        # An ID of another profile, or none the plugin lists, is refused by name.
        _, ones = self.kubelet.wait_list(self.MIG1)
        one = list(ones)[0]
        self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.kubelet.allocate,
                              self.MIG3, [one], contains=(one, "not a MIG device"))
        self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.kubelet.allocate,
                              self.MIG1, ["MIG-made-up"], contains=("MIG-made-up",))
        self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.kubelet.allocate,
                              self.MIG1, [one, one], contains=("twice",))

    def test_instances_coming_and_going_update_the_lists(self):
        self.mig_up("mixed", self.a100_t4(), lines=self.gi_lines(self.A100, [("1g.5gb", 6)]),
                    resources=(self.MIG1,))
        _, ones = self.kubelet.wait_list(self.MIG1)
        self.assert_mig_ids(ones, 1)
        self.write_state(self.gi_lines(self.A100, [("1g.5gb", 6), ("1g.5gb", 5),
                                                   ("2g.10gb", 0)]))
        _, ones = self.kubelet.wait_list(self.MIG1, lambda d: len(d) == 2, timeout=10)
        # A profile that appears gets its resource registered then.
        self.kubelet.wait_registered((self.MIG2,), timeout=10)
        _, twos = self.kubelet.wait_list(self.MIG2, lambda d: len(d) == 1, timeout=10)
        self.write_state(self.gi_lines(self.A100, [("1g.5gb", 5)]))
        self.kubelet.wait_list(self.MIG1, lambda d: len(d) == 1 and set(d) < set(ones),
                               timeout=10)
        # A profile whose instances all went stays registered, with nothing in it.
        self.kubelet.wait_list(self.MIG2, lambda d: len(d) == 0, timeout=10)

    def test_single_lists_every_instance_as_a_gpu(self):
        gpus = [(self.A100, "NVIDIA A100-SXM4-40GB", 40960),
                (self.A100B, "NVIDIA A100-SXM4-40GB", 40960)]
        lines = self.gi_lines(self.A100, [("1g.5gb", s) for s in range(7)]) + \
            self.gi_lines(self.A100B, [("1g.5gb", 0), ("1g.5gb", 3)])
        self.mig_up("single", gpus, mig="0,1", lines=lines, resources=(WHOLE,))
        _, whole = self.kubelet.wait_list(WHOLE, lambda d: len(d) == 9, timeout=10)
        self.assert_mig_ids(whole, 9)
        self.assertEqual(self.kubelet.lists[MEM], {})
        ids, r = self.admit(WHOLE, 2)
        self.assertEqual(dict(r.envs)["NVIDIA_VISIBLE_DEVICES"], ",".join(ids))
        self.assertEqual(dict(r.envs)["KGPU_MEMORY_LIMIT_MIB"], "4864")
        self.assertEqual(len(r.cdi_devices), 2)

    def test_single_with_mismatched_profiles_advertises_no_mig(self):
        gpus = [(self.A100, "NVIDIA A100-SXM4-40GB", 40960)]
        lines = self.gi_lines(self.A100, [("3g.20gb", 0), ("1g.5gb", 4)])
        p = self.mig_up("single", gpus, lines=lines, resources=(WHOLE,))
        _, whole = self.kubelet.wait_list(WHOLE)
        self.assertEqual(whole, {})
        wait_for(lambda: "1g.5gb and 3g.20gb" in p.child.log() or
                 "3g.20gb and 1g.5gb" in p.child.log(), 10, what="the reason in the log")
        self.assertIn("--mig-strategy mixed", p.child.log())
        # Made alike, the node's instances are listed.
        self.write_state(self.gi_lines(self.A100, [("3g.20gb", 0), ("3g.20gb", 4)]))
        _, whole = self.kubelet.wait_list(WHOLE, lambda d: len(d) == 2, timeout=10)
        self.assert_mig_ids(whole, 2)

    def test_single_beside_a_whole_gpu_advertises_no_mig(self):
        p = self.mig_up("single", self.a100_t4(),
                        lines=self.gi_lines(self.A100, [("1g.5gb", 0)]), resources=(WHOLE,))
        _, whole = self.kubelet.wait_list(WHOLE)
        self.assertEqual(set(whole), {self.T4})
        wait_for(lambda: "listed whole" in p.child.log(), 10, what="the reason in the log")

    def test_none_advertises_no_mig_and_no_share_of_it(self):
        p = self.mig_up("none", self.a100_t4(),
                        lines=self.gi_lines(self.A100, [("1g.5gb", 0)]))
        _, mem = self.kubelet.wait_list(MEM)
        self.assertEqual(len(mem), 15)
        self.assertIn("--mig-strategy none", p.child.log())
        self.assertEqual(set(self.kubelet.registered()), {MEM, CORE})

    def test_mig_folders_stay_while_their_device_does(self):
        lines = self.gi_lines(self.A100, [("1g.5gb", 0)])
        p = self.mig_up("mixed", self.a100_t4(), lines=lines, resources=(self.MIG1,))
        _, ones = self.kubelet.wait_list(self.MIG1)
        mig = list(ones)[0]
        p.stop()
        gone = "MIG-00000000-0000-4000-8000-000000000000"
        for name in (mig, gone):
            os.makedirs(os.path.join(self.state_dir, "pods", name, "shared"))
        # With an API server the clean-up runs at start: a listed device's folder stays.
        self.mig_up("mixed", self.a100_t4(), lines=lines, resources=(self.MIG1,), api=True)
        wait_for(lambda: not os.path.exists(os.path.join(self.state_dir, "pods", gone)), 5,
                 what="the gone MIG device's folder to go")
        self.assertTrue(os.path.isdir(os.path.join(self.state_dir, "pods", mig, "shared")))

    def test_bad_strategy_is_refused(self):
        p = self.start_plugin(["--no-api-server", "--mig-strategy", "both"], gpus=make_gpus(1))
        rc = p.child.wait_exit(20)
        p.stopped = True
        self.assertNotEqual(rc, 0)
        self.assertIn("--mig-strategy: expected none, single or mixed", p.child.log())


# ---------------------------------------------------------------------------
# 6. Allocate: which pod gets which GPU
# ---------------------------------------------------------------------------

class AllocateCase(PluginCase):
    def bring_up(self, n=2, args=(), **kw):
        self.gpus = make_gpus(n, numa=(0, 1))
        self.p = self.up(self.gpus, list(args), api=True, **kw)
        return self.gpus

    def one_gpu_pod(self, name, gpu, units=4, core=None):
        limits = {MEM: units}
        if core is not None:
            limits[CORE] = core
        return API.add_pod(bound_pod(name, self.node, [container("main", limits)],
                                     [part("main", [(gpu, (core or 0) * 10, units * 1024)])]))

    def assert_allocated(self, pod):
        ann = annotations(API.pod(pod["metadata"]["name"]))
        self.assertIn("kgpu.io/allocated", ann)
        self.assertRegex(ann["kgpu.io/allocated"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
        self.assertNotIn("kgpu.io/allocating", ann)


class TestAllocate(AllocateCase):
    def test_two_same_size_pods_awaiting_is_refused_then_each_gets_its_gpu(self):
        gpus = self.bring_up()
        a = self.one_gpu_pod("pod-a", gpus[0])
        b = self.one_gpu_pod("pod-b", gpus[1])
        before = {n: API.pod(n) for n in ("pod-a", "pod-b")}
        ids = self.free_ids(MEM)[:4]
        self.assert_rpc_error(grpc.StatusCode.ABORTED, self.kubelet.allocate, MEM, ids,
                              contains=(self.ns + "/pod-a", self.ns + "/pod-b",
                                        "refusing to guess"))
        # Nothing changed: no files, no annotations.
        self.assertEqual(self.pod_files(), [])
        for n, pod in before.items():
            self.assertEqual(API.pod(n), pod, "%s changed after a refused Allocate" % n)
        # GetPreferredAllocation cannot tell either: it packs instead of failing.
        pref = self.kubelet.preferred(MEM, self.free_ids(MEM), (), 4)
        self.assertEqual(len(pref), 4)
        self.assertEqual(len({i.split("::")[0] for i in pref}), 1, "packing spread %r" % pref)
        # A is done (kubelet admitted it earlier, say): B is the only one left.
        API.patch_pod("pod-a", {"metadata": {"annotations": {
            "kgpu.io/allocated": "2026-01-01T00:00:00Z"}}})
        ids, r = self.admit(MEM, 4)
        self.assertTrue(all(i.startswith(gpus[1]["uuid"] + "::") for i in ids),
                        "preferred IDs not on B's GPU: %r" % ids)
        self.assert_container_response(r, b, "main", [(gpus[1], 4096, 100)])
        self.assert_allocated(b)
        self.assertEqual(self.pod_files(), sorted([b["metadata"]["uid"],
                                                   b["metadata"]["uid"] + "/main.limits",
                                                   b["metadata"]["uid"] + "/shared"]))
        self.assertNotIn(a["metadata"]["uid"], self.pod_files())

    def test_pods_bound_one_after_the_other(self):
        gpus = self.bring_up()
        a = self.one_gpu_pod("pod-c", gpus[0])
        _, r = self.admit(MEM, 4)
        self.assert_container_response(r, a, "main", [(gpus[0], 4096, 100)])
        self.assert_allocated(a)
        b = self.one_gpu_pod("pod-d", gpus[1])
        ids, r = self.admit(MEM, 4)
        self.assertTrue(all(i.startswith(gpus[1]["uuid"]) for i in ids), ids)
        self.assert_container_response(r, b, "main", [(gpus[1], 4096, 100)])
        self.assert_allocated(b)

    def test_quick_succession_kubelet_admits_a_then_b(self):
        """The extender binds B the moment A is allocated; kubelet admits each at once."""
        gpus = self.bring_up()
        for round in range(4):
            names = ("q%d-a" % round, "q%d-b" % round)
            bound = {}

            def extender():
                # B waits for A's mark, as the extender's allocateWait rule makes it.
                wait_for(lambda: "kgpu.io/allocated" in annotations(API.pod(names[0])), 10,
                         interval=0.002, what="A allocated")
                bound["b"] = self.one_gpu_pod(names[1], gpus[(round + 1) % 2])
            bound["a"] = self.one_gpu_pod(names[0], gpus[round % 2])
            t = threading.Thread(target=extender, daemon=True)
            t.start()
            _, ra = self.admit(MEM, 4)
            wait_for(lambda: "b" in bound, 10, interval=0.002, what="B bound")
            _, rb = self.admit(MEM, 4)
            t.join(10)
            self.assertEqual(ra.envs["NVIDIA_VISIBLE_DEVICES"], gpus[round % 2]["uuid"])
            self.assertEqual(rb.envs["NVIDIA_VISIBLE_DEVICES"], gpus[(round + 1) % 2]["uuid"])
            self.assertEqual(ra.envs["KGPU_CONTAINER"], "main")
            self.assert_allocated(bound["a"])
            self.assert_allocated(bound["b"])
            self.used.clear()

    def test_different_sizes_awaiting_together_kubelet_admits_b_first(self):
        gpus = self.bring_up()
        a = self.one_gpu_pod("big", gpus[0], units=6)
        b = self.one_gpu_pod("small", gpus[1], units=2, core=25)
        # kubelet admits B first: gpu-core before gpu-mem (its map order is random).
        ids, rc = self.admit(CORE, 25)
        self.assertTrue(all(i.startswith(gpus[1]["uuid"]) for i in ids), ids)
        self.assert_empty_response(rc)
        ann = annotations(API.pod("small"))
        self.assertEqual(ann.get("kgpu.io/allocating"), "main:kgpu.io/gpu-core")
        self.assertNotIn("kgpu.io/allocated", ann)
        _, rm = self.admit(MEM, 2)
        self.assert_container_response(rm, b, "main", [(gpus[1], 2048, 25)])
        self.assert_allocated(b)
        _, ra = self.admit(MEM, 6)
        self.assert_container_response(ra, a, "main", [(gpus[0], 6144, 100)])
        self.assert_allocated(a)

    def test_shim_none_and_missing_shim(self):
        gpus = self.bring_up(1, shim=False, args=["--shim-lib", "none"])
        a = self.one_gpu_pod("noshim", gpus[0], units=3)
        _, r = self.admit(MEM, 3)
        self.assert_container_response(r, a, "main", [(gpus[0], 3072, 100)], shim=False)
        self.assertFalse(os.path.exists(os.path.join(self.state_dir, "ld.so.preload")))

    def test_missing_shim_fails_allocate(self):
        gpus = self.bring_up(1)
        os.unlink(self.shim)
        self.one_gpu_pod("shimless", gpus[0], units=3)
        self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.kubelet.allocate, MEM,
                              self.free_ids(MEM)[:3], contains=(self.shim, "--shim-lib none"))
        self.assertNotIn("kgpu.io/allocating", annotations(API.pod("shimless")))
        self.assertEqual(self.pod_files(), [])

    def test_two_gpu_container(self):
        gpus = self.bring_up(2)
        pod = API.add_pod(bound_pod(
            "wide", self.node, [container("main", {MEM: 8, CORE: 40, "kgpu.io/gpu-count": 2})],
            [part("main", [(gpus[0], 400, 4096), (gpus[1], 400, 4096)])]))
        ids, rm = self.admit(MEM, 8)
        self.assertEqual(sum(i.startswith(gpus[0]["uuid"]) for i in ids), 4, ids)
        self.assertEqual(sum(i.startswith(gpus[1]["uuid"]) for i in ids), 4, ids)
        self.assert_container_response(rm, pod, "main", [(gpus[0], 4096, 40),
                                                         (gpus[1], 4096, 40)])
        self.assertEqual(annotations(API.pod("wide")).get("kgpu.io/allocating"),
                         "main:kgpu.io/gpu-mem")
        _, rc = self.admit(CORE, 40)
        self.assert_empty_response(rc)
        self.assert_allocated(pod)

    def test_compute_shares_get_their_gpus_schedule_and_no_other(self):
        gpus = self.bring_up(2)
        # A stale schedule of another layout is replaced for the containers to come.
        os.makedirs(os.path.join(self.state_dir, "sched"), mode=0o755)
        with open(self.sched_file(gpus[1]["uuid"]), "wb") as f:
            f.write(b"KGPUSCHD" + b"\0" * 100)
        got = {}
        for name, gpu, units, core in (("c30", gpus[0], 3, 30), ("c70", gpus[0], 5, 70),
                                       ("other", gpus[1], 2, 50), ("memonly", gpus[0], 1, None)):
            pod = self.one_gpu_pod(name, gpu, units=units, core=core)
            _, r = self.admit(MEM, units)
            self.assert_container_response(r, pod, "main", [(gpu, units * 1024, core or 100)])
            got[name] = {m.container_path: m.host_path for m in r.mounts
                         if m.container_path.startswith("/var/run/kgpu-gpu")}
            if core is not None:
                ino = os.stat(self.sched_file(gpu["uuid"])).st_ino
                _, rc = self.admit(CORE, core)
                self.assert_empty_response(rc)
                # The file is made once and kept: later containers join the same one.
                self.assertEqual(os.stat(self.sched_file(gpu["uuid"])).st_ino, ino)
            self.assert_allocated(pod)
        # Both shares of GPU 0 share one host file, by the path the library opens.
        path0 = "/var/run/kgpu-gpu/%s.sched" % gpus[0]["uuid"]
        self.assertEqual(got["c30"], {path0: self.sched_file(gpus[0]["uuid"])})
        self.assertEqual(got["c70"], got["c30"])
        # The container on GPU 1 sees its own GPU's schedule only; a memory-only share
        # takes no turns and gets none.
        self.assertEqual(list(got["other"]), ["/var/run/kgpu-gpu/%s.sched" % gpus[1]["uuid"]])
        self.assertEqual(got["memonly"], {})
        self.assertEqual(sorted(os.listdir(os.path.join(self.state_dir, "sched"))),
                         sorted(g["uuid"] + ".sched" for g in gpus))

    def test_gpushare_alias_and_whole_gpus(self):
        gpus = self.bring_up(2, args=["--whole-gpus", "--gpushare-alias"],
                             resources=(MEM, CORE, WHOLE, ALIAS))
        alias = API.add_pod(bound_pod("gpushare", self.node, [container("main", {ALIAS: 5})],
                                      [part("main", [(gpus[1], 0, 5120)])]))
        ids, r = self.admit(ALIAS, 5)
        self.assertTrue(all(i.startswith(gpus[1]["uuid"] + "::") for i in ids), ids)
        self.assert_container_response(r, alias, "main", [(gpus[1], 5120, 100)])
        self.assert_allocated(alias)
        whole = API.add_pod(bound_pod(
            "whole", self.node, [container("main", {WHOLE: 1})],
            [part("main", [(gpus[0], 1000, gpus[0]["memory_mib"])], exclusive=True)]))
        ids, r = self.admit(WHOLE, 1)
        self.assertEqual(ids, [gpus[0]["uuid"]])
        self.assert_container_response(r, whole, "main", [(gpus[0], 15360, 100)], pod_units=0)
        self.assertFalse([m for m in r.mounts if "kgpu-gpu" in m.container_path])
        self.assertFalse(os.path.exists(os.path.join(self.state_dir, "sched")))
        self.assert_allocated(whole)

    def test_terminating_pod_never_matches(self):
        gpus = self.bring_up(1)
        self.one_gpu_pod("leaving", gpus[0], units=3)
        API.patch_pod("leaving", {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
        self.assert_rpc_error(grpc.StatusCode.NOT_FOUND, self.kubelet.allocate, MEM,
                              self.free_ids(MEM)[:3], contains=(self.node,))
        # Without kgpu.io/node (an older extender) the pod still matches by spec.nodeName.
        pod = API.add_pod(bound_pod("plain", self.node, [container("main", {MEM: 3})],
                                    [part("main", [(gpus[0], 0, 3072)])]))
        API.patch_pod("plain", {"metadata": {"annotations": {"kgpu.io/node": None}}})
        _, r = self.admit(MEM, 3)
        self.assert_container_response(r, pod, "main", [(gpus[0], 3072, 100)])

    def test_stale_pod_directories_are_removed_at_start(self):
        os.makedirs(os.path.join(self.state_dir, "pods", "gone-uid", "shared"))
        with open(os.path.join(self.state_dir, "pods", "gone-uid", "main.limits"), "w") as f:
            f.write("# kgpu limits v1\n")
        self.bring_up(1)
        wait_for(lambda: not os.path.exists(os.path.join(self.state_dir, "pods", "gone-uid")),
                 3, what="the stale pod directory to go")

    def kubelet_checkpoint(self, uids):
        """kubelet's device manager checkpoint, listing `uids` as holding devices."""
        entries = [{"PodUID": u, "ContainerName": "main", "ResourceName": MEM,
                    "DeviceIDs": {"0": ["x"]}, "AllocResp": "AA=="} for u in uids]
        with open(os.path.join(self.plugin_dir, "kubelet_internal_checkpoint"), "w") as f:
            json.dump({"Data": {"PodDeviceEntries": entries or None,
                                "RegisteredDevices": {MEM: ["x"]}}, "Checksum": 1}, f)

    def test_gone_pod_directory_waits_for_kubelet_to_stop_its_containers(self):
        """A pod force-deleted leaves the API server while its containers still run and
        write into its folder: the folder goes only once kubelet no longer lists the pod."""
        running, gone = "0a1b2c3d-0000-4000-8000-000000000001", "0a1b2c3d-0000-4000-8000-000000000002"
        for uid in (running, gone):
            os.makedirs(os.path.join(self.state_dir, "pods", uid, "shared"))
        self.kubelet_checkpoint([running])
        self.bring_up(1)
        wait_for(lambda: not os.path.exists(os.path.join(self.state_dir, "pods", gone)), 3,
                 what="the folder of the pod kubelet no longer lists to go")
        self.p.stop()  # the API thread finishes its pass before it stops
        self.assertTrue(os.path.isdir(os.path.join(self.state_dir, "pods", running, "shared")),
                        "removed while kubelet still lists the pod")
        self.assertIn("keeping %s/pods/%s" % (self.state_dir, running), self.p.child.log())
        # kubelet has stopped the containers and dropped the entry: the next pass removes it.
        self.kubelet_checkpoint([])
        t0 = time.monotonic()
        self.p = self.start_plugin(
            ["--fake-gpus", self.gpu_file, "--kubeconfig", os.path.join(self.tmp, "kubeconfig"),
             "--node-name", self.node], name="again")
        self.kubelet.wait_registered((MEM, CORE), since=t0, timeout=10)
        wait_for(lambda: not os.path.exists(os.path.join(self.state_dir, "pods", running)), 3,
                 what="the stopped pod's folder to go")

    def test_unreadable_kubelet_checkpoint_removes_nothing(self):
        os.makedirs(os.path.join(self.state_dir, "pods", "gone-uid", "shared"))
        with open(os.path.join(self.plugin_dir, "kubelet_internal_checkpoint"), "w") as f:
            f.write('{"Data": {"PodDeviceEntries": [{"PodUID": 7}]}}')
        self.bring_up(1)
        wait_for(lambda: "pod directory cleanup skipped" in self.p.child.log(), 3,
                 what="the cleanup to give up")
        self.assertIn("PodDeviceEntries[0].PodUID: expected a pod UID", self.p.child.log())
        self.assertTrue(os.path.isdir(os.path.join(self.state_dir, "pods", "gone-uid")))


# ---------------------------------------------------------------------------
# 7. A pod with an init container and two app containers
# ---------------------------------------------------------------------------

class TestMultiContainer(AllocateCase):
    def test_kubelet_order_progress_and_completion(self):
        gpus = self.bring_up(2)
        pod = API.add_pod(bound_pod(
            "multi", self.node,
            [container("app", {MEM: 4}), container("side", {MEM: 2, CORE: 30})],
            [part("app", [(gpus[0], 0, 4096)]), part("side", [(gpus[1], 300, 2048)])],
            init_containers=[container("init", {MEM: 2})]))
        name = "multi"

        def progress():
            ann = annotations(API.pod(name))
            self.assertNotIn("kgpu.io/allocated", ann)
            return ann.get("kgpu.io/allocating")
        # Init container: folded into app's GPU, with its own amount.
        ids, r = self.admit(MEM, 2)
        self.assertTrue(all(i.startswith(gpus[0]["uuid"]) for i in ids), ids)
        self.assert_container_response(r, pod, "init", [(gpus[0], 2048, 100)], pod_units=6)
        self.assertEqual(progress(), "init:kgpu.io/gpu-mem")
        # kubelet reuses the init container's devices for app containers.
        self.used[MEM] -= set(ids)
        ids, r = self.admit(MEM, 4)
        self.assertTrue(all(i.startswith(gpus[0]["uuid"]) for i in ids), ids)
        self.assert_container_response(r, pod, "app", [(gpus[0], 4096, 100)], pod_units=6)
        self.assertEqual(progress(), "init:kgpu.io/gpu-mem,app:kgpu.io/gpu-mem")
        # side: gpu-core first (not its primary resource), then gpu-mem.
        ids, r = self.admit(CORE, 30)
        self.assertTrue(all(i.startswith(gpus[1]["uuid"]) for i in ids), ids)
        self.assert_empty_response(r)
        self.assertEqual(progress(),
                         "init:kgpu.io/gpu-mem,app:kgpu.io/gpu-mem,side:kgpu.io/gpu-core")
        self.assertFalse(os.path.exists(os.path.join(self.state_dir, "pods",
                                                     pod["metadata"]["uid"], "side.limits")))
        ids, r = self.admit(MEM, 2)
        self.assertTrue(all(i.startswith(gpus[1]["uuid"]) for i in ids), ids)
        self.assert_container_response(r, pod, "side", [(gpus[1], 2048, 30)], pod_units=6)
        self.assert_allocated(pod)
        uid = pod["metadata"]["uid"]
        self.assertEqual(self.pod_files(), sorted([uid, uid + "/shared", uid + "/init.limits",
                                                   uid + "/app.limits", uid + "/side.limits"]))
        # Nothing awaits any more.
        self.assert_rpc_error(grpc.StatusCode.NOT_FOUND, self.kubelet.allocate, MEM,
                              self.free_ids(MEM)[:2], contains=(self.node,))


    def test_plugin_restart_between_containers_loses_nothing(self):
        gpus = self.bring_up(2)
        pod = API.add_pod(bound_pod(
            "restarted", self.node, [container("one", {MEM: 3}), container("two", {MEM: 3})],
            [part("one", [(gpus[0], 0, 3072)]), part("two", [(gpus[1], 0, 3072)])]))
        _, r = self.admit(MEM, 3)
        self.assert_container_response(r, pod, "one", [(gpus[0], 3072, 100)], pod_units=6)
        self.p.stop()
        t0 = time.monotonic()
        self.p = self.start_plugin(
            ["--fake-gpus", self.gpu_file, "--kubeconfig", os.path.join(self.tmp, "kubeconfig"),
             "--node-name", self.node], name="again")
        self.kubelet.wait_registered((MEM, CORE), since=t0, timeout=10)
        self.kubelet.wait_list(MEM, since=t0)
        # Its start-up clean-up keeps the live pod's files.
        time.sleep(0.5)
        uid = pod["metadata"]["uid"]
        self.assertIn(uid + "/one.limits", self.pod_files())
        _, r = self.admit(MEM, 3)
        self.assert_container_response(r, pod, "two", [(gpus[1], 3072, 100)], pod_units=6)
        self.assert_allocated(pod)
        self.assertEqual(self.pod_files(), sorted([uid, uid + "/shared", uid + "/one.limits",
                                                   uid + "/two.limits"]))


# ---------------------------------------------------------------------------
# 8. GetPreferredAllocation
# ---------------------------------------------------------------------------

class TestPreferred(AllocateCase):
    def test_steers_to_the_assigned_gpu(self):
        gpus = self.bring_up(3)
        self.one_gpu_pod("steer", gpus[1], units=5, core=20)
        for r, n in ((MEM, 5), (CORE, 20)):
            avail = self.free_ids(r)
            pref = self.kubelet.preferred(r, avail, (), n)
            self.assertEqual(len(pref), n)
            self.assertTrue(all(i.startswith(gpus[1]["uuid"] + "::") for i in pref), pref)
            # must_include comes first and is kept even off the assigned GPU.
            must = [ids_of(gpus[2], r)[7]]
            pref = self.kubelet.preferred(r, avail, must, n)
            self.assertEqual(len(pref), n)
            self.assertEqual(pref[0], must[0])
            self.assertEqual(len(set(pref)), n)
            self.assertEqual(sum(i.startswith(gpus[1]["uuid"]) for i in pref), n - 1, pref)

    def test_packs_without_a_match(self):
        gpus = self.bring_up(3)
        # GPU 2 has the fewest free IDs: packing starts there.
        avail = ids_of(gpus[0], MEM) + ids_of(gpus[1], MEM)[:10] + ids_of(gpus[2], MEM)[:3]
        pref = self.kubelet.preferred(MEM, avail, (), 5)
        self.assertEqual(pref[:3], ids_of(gpus[2], MEM)[:3])
        self.assertEqual(pref[3:], ids_of(gpus[1], MEM)[:2])
        pref = self.kubelet.preferred(MEM, avail, (), 2)
        self.assertEqual(pref, ids_of(gpus[2], MEM)[:2])
        self.assertEqual(self.kubelet.preferred(MEM, avail, (), 0), [])
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.kubelet.preferred, MEM,
                              avail[:3], (), 4)

    def test_packing_stays_on_the_must_include_gpu(self):
        gpus = self.bring_up(2)
        avail = ids_of(gpus[0], MEM) + ids_of(gpus[1], MEM)
        must = [ids_of(gpus[1], MEM)[5]]
        pref = self.kubelet.preferred(MEM, avail, must, 3)
        self.assertEqual(pref[0], must[0])
        self.assertTrue(all(i.startswith(gpus[1]["uuid"]) for i in pref), pref)


# ---------------------------------------------------------------------------
# 9. Bad input, and the plugin keeps serving
# ---------------------------------------------------------------------------

class TestBadInput(AllocateCase):
    def assert_still_serving(self, round):
        """ListAndWatch streams alive and updating; a good Allocate works."""
        for r in (MEM, CORE):
            ep = self.kubelet.endpoints[r]
            self.assertFalse(ep.ended.is_set(), "%s stream ended: %s" % (r, ep.error))
        pod = self.one_gpu_pod("good-%d" % round, self.gpus[0], units=1)
        _, r = self.admit(MEM, 1)
        self.assertEqual(r.envs["NVIDIA_VISIBLE_DEVICES"], self.gpus[0]["uuid"])
        self.assert_allocated(pod)

    def test_bad_requests_and_pods(self):
        gpus = self.bring_up(2)
        # A malformed assignment on the one awaiting pod.
        API.add_pod(bound_pod("broken", self.node, [container("main", {MEM: 3})], None,
                              assignment_text="[{\"container\": \"main\", \"gpus\": 7"))
        self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.kubelet.allocate, MEM,
                              self.free_ids(MEM)[:3],
                              contains=(self.ns + "/broken", "kgpu.io/assignment"))
        self.assertEqual(self.pod_files(), [])
        self.assertNotIn("kgpu.io/allocating", annotations(API.pod("broken")))
        self.assert_still_serving(0)
        # An ID the plugin never listed, and one given twice.
        self.one_gpu_pod("ids", gpus[1], units=2)
        bogus = "GPU-not-a-real-one::3"
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.kubelet.allocate, MEM,
                              [ids_of(gpus[1], MEM)[0], bogus], contains=(bogus,))
        twice = ids_of(gpus[1], MEM)[1]
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.kubelet.allocate, MEM,
                              [twice, twice], contains=(twice,))
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.kubelet.allocate, MEM,
                              [ids_of(gpus[1], CORE)[99]], contains=("::99",))
        self.assertNotIn("kgpu.io/allocating", annotations(API.pod("ids")))
        API.delete_pod("ids")
        self.assert_still_serving(1)
        # A pod deleted between its bind and kubelet's Allocate.
        self.one_gpu_pod("deleted", gpus[1], units=5)
        API.delete_pod("deleted")
        self.assert_rpc_error(grpc.StatusCode.NOT_FOUND, self.kubelet.allocate, MEM,
                              self.free_ids(MEM)[:5], contains=(self.node, "5"))
        self.assert_still_serving(2)
        # Bytes that are no AllocateRequest, and no PreferredAllocationRequest.
        garbage = b"\xff\xff\xff\xff\x0f\x07garbage"
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, self.kubelet.allocate_raw, MEM,
                              garbage)
        ep = self.kubelet.endpoint(MEM)
        raw = ep.channel.unary_unary("/v1beta1.DevicePlugin/GetPreferredAllocation",
                                     request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, raw, garbage)
        unknown = ep.channel.unary_unary("/v1beta1.DevicePlugin/Nope",
                                         request_serializer=lambda b: b,
                                         response_deserializer=lambda b: b)
        with self.assertRaises(grpc.RpcError) as cm:
            unknown(b"", timeout=10)
        self.assertIn(cm.exception.code(), (grpc.StatusCode.UNIMPLEMENTED,))
        self.assert_still_serving(3)
        # A terminal pod never matches.
        API.add_pod(bound_pod("done", self.node, [container("main", {MEM: 7})],
                              [part("main", [(gpus[0], 0, 7168)])]))
        API.patch_pod("done", {"status": {"phase": "Failed"}})
        self.assert_rpc_error(grpc.StatusCode.NOT_FOUND, self.kubelet.allocate, MEM,
                              self.free_ids(MEM)[:7])
        # A pod on another node (kgpu.io/node says so) never matches either.
        API.add_pod(bound_pod("elsewhere", self.node, [container("main", {MEM: 7})],
                              [part("main", [(gpus[0], 0, 7168)])],
                              extra_annotations={"kgpu.io/node": "other-node"}))
        self.assert_rpc_error(grpc.StatusCode.NOT_FOUND, self.kubelet.allocate, MEM,
                              self.free_ids(MEM)[:7])
        # Units that disagree with the assignment (a different memoryUnit at the extender).
        API.add_pod(bound_pod("units", self.node, [container("main", {MEM: 9})],
                              [part("main", [(gpus[0], 0, 9 * 512)])]))
        self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.kubelet.allocate, MEM,
                              self.free_ids(MEM)[:9], contains=(self.ns + "/units", "memory unit"))
        API.delete_pod("units")
        self.assert_still_serving(4)
        self.assertTrue(self.p.child.alive())

    def test_assignment_naming_a_gpu_the_node_lacks(self):
        gpus = self.bring_up(1)
        stranger = make_gpus(1)[0]
        API.add_pod(bound_pod("stranger", self.node, [container("main", {MEM: 2})],
                              [part("main", [(stranger, 0, 2048)])]))
        self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.kubelet.allocate, MEM,
                              self.free_ids(MEM)[:2],
                              contains=(self.ns + "/stranger", stranger["uuid"], self.node))
        self.assertEqual(self.pod_files(), [])
        self.assertNotIn("kgpu.io/allocating", annotations(API.pod("stranger")))
        API.delete_pod("stranger")
        # A compute-only share whose entry lists no GPU: nothing to give, so no success.
        API.add_pod(bound_pod("nogpu", self.node, [container("main", {CORE: 20})],
                              [part("main", [])]))
        self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.kubelet.allocate, CORE,
                              self.free_ids(CORE)[:20], contains=(self.ns + "/nogpu", "no GPU"))
        self.assertNotIn("kgpu.io/allocated", annotations(API.pod("nogpu")))
        API.delete_pod("nogpu")
        self.gpus = gpus
        self.assert_still_serving(0)

    def test_assigned_gpu_turned_unhealthy_is_refused(self):
        """Bound to GPU 1, which breaks before kubelet admits the pod: no broken GPU handed out."""
        gpus = self.bring_up(2)
        pod = self.one_gpu_pod("late", gpus[1], units=2)
        sick = [dict(g) for g in gpus]
        sick[1]["healthy"] = False
        since = time.monotonic()
        self.write_gpus(sick, atomic=True)
        self.kubelet.wait_list(MEM, lambda d: d[gpus[1]["uuid"] + "::0"].health == "Unhealthy",
                               since=since, timeout=2)
        # kubelet offers healthy IDs only: all on GPU 0.
        self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.kubelet.allocate, MEM,
                              self.free_ids(MEM)[:2],
                              contains=(self.ns + "/late", gpus[1]["uuid"], "unhealthy"))
        self.assertEqual(self.pod_files(), [])
        self.assertNotIn("kgpu.io/allocated", annotations(API.pod("late")))
        self.assertNotIn("kgpu.io/allocating", annotations(API.pod("late")))
        # Healthy again (before kubelet gave up on the pod): it gets its own GPU.
        since = time.monotonic()
        self.write_gpus(gpus, atomic=True)
        self.kubelet.wait_list(MEM, lambda d: d[gpus[1]["uuid"] + "::0"].health == "Healthy",
                               since=since, timeout=2)
        ids, r = self.admit(MEM, 2)
        self.assertTrue(all(i.startswith(gpus[1]["uuid"]) for i in ids), ids)
        self.assert_container_response(r, pod, "main", [(gpus[1], 2048, 100)])

    def test_unreadable_progress_blocks_the_node_until_fixed(self):
        """A pod whose kgpu.io/allocating cannot be read may be the one kubelet admits:
        every Allocate is refused naming it, rather than a guess."""
        gpus = self.bring_up(2)
        API.add_pod(bound_pod("garbled", self.node, [container("main", {MEM: 3})],
                              [part("main", [(gpus[0], 0, 3072)])],
                              extra_annotations={"kgpu.io/allocating": "who:knows"}))
        good = self.one_gpu_pod("fine", gpus[1], units=2)
        self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.kubelet.allocate, MEM,
                              self.free_ids(MEM)[:2],
                              contains=(self.ns + "/garbled", "kgpu.io/allocating"))
        API.delete_pod("garbled")
        _, r = self.admit(MEM, 2)
        self.assert_container_response(r, good, "main", [(gpus[1], 2048, 100)])

    def test_api_server_unreachable_is_unavailable(self):
        gpus = self.bring_up(1)
        self.one_gpu_pod("later", gpus[0], units=2)
        API.call("POST", "/_control", {"fail_lists": 1}, expect=200)
        self.assert_rpc_error(grpc.StatusCode.UNAVAILABLE, self.kubelet.allocate, MEM,
                              self.free_ids(MEM)[:2], contains=("500",))
        _, r = self.admit(MEM, 2)
        self.assertEqual(r.envs["NVIDIA_VISIBLE_DEVICES"], gpus[0]["uuid"])


# ---------------------------------------------------------------------------
# 10. Without an API server
# ---------------------------------------------------------------------------

class TestTenantBoundaries(AllocateCase):
    """Issue 24: what a tenant who writes its own pod cannot get from Allocate."""

    def forged_pod(self, name, gpus, parts_gpus, exclusive, limits=None):
        """A pod created already bound (spec.nodeName), with an assignment written by hand."""
        return API.add_pod(bound_pod(name, self.node,
                                     [container("main", limits or {MEM: 1})],
                                     [part("main", parts_gpus, exclusive=exclusive)]))

    def assert_refused_untouched(self, name, ids, resource=MEM, contains=()):
        before = API.pod(name)
        self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.kubelet.allocate,
                              resource, ids, contains=(self.ns + "/" + name,) + tuple(contains))
        self.assertEqual(API.pod(name), before, "%s changed after a refused Allocate" % name)
        self.assertEqual(self.pod_files(), [])

    def test_forged_assignment_of_every_gpu_is_refused(self):
        """The attack as reported: both GPUs, all their memory and compute, for one unit."""
        gpus = self.bring_up()
        self.forged_pod("greedy", gpus, [(g, 1000, 15360) for g in gpus], True)
        ids = self.kubelet.preferred(MEM, self.free_ids(MEM), (), 1)
        self.assert_refused_untouched("greedy", ids, contains=("whole GPUs",))
        # Not exclusive: two GPUs for a container that asks one.
        API.delete_pod("greedy")
        self.forged_pod("greedy2", gpus, [(g, 0, 512) for g in gpus], False)
        self.assert_refused_untouched("greedy2", ids, contains=("2 GPU(s), but it asks 1",))
        # One GPU, but all its memory and all its compute.
        API.delete_pod("greedy2")
        self.forged_pod("greedy3", gpus, [(gpus[0], 1000, 15360)], False)
        self.assert_refused_untouched("greedy3", [i for i in self.free_ids(MEM)
                                                  if i.startswith(gpus[0]["uuid"])][:1],
                                      contains=("15360",))

    def test_assignment_on_a_gpu_kubelet_did_not_allocate_is_refused(self):
        """Whole GPUs are kubelet's exclusive accounting: an assignment of a GPU kubelet did
        not give the container is refused. A share's devices only count capacity: kubelet
        may take them on another GPU (it could not follow the preferred allocation), and
        the pod kgpu placed is served as assigned, with a warning."""
        gpus = self.bring_up(args=["--whole-gpus"], resources=(MEM, CORE, WHOLE))
        API.add_pod(bound_pod(
            "elsewhere", self.node, [container("main", {WHOLE: 1})],
            [part("main", [(gpus[1], 1000, gpus[1]["memory_mib"])], exclusive=True)]))
        self.assert_refused_untouched("elsewhere", [gpus[0]["uuid"]], resource=WHOLE,
                                      contains=(gpus[1]["uuid"], "did not allocate"))
        # Steered as kubelet is, the same pod gets its GPU.
        ids, r = self.admit(WHOLE, 1)
        self.assertEqual(ids, [gpus[1]["uuid"]])
        self.assert_allocated(API.pod("elsewhere"))
        # A share on units of the other GPU: served on its assigned GPU, and said.
        pod = self.one_gpu_pod("units-elsewhere", gpus[1], units=4)
        on0 = [i for i in self.free_ids(MEM) if i.startswith(gpus[0]["uuid"])][:4]
        r = self.kubelet.allocate(MEM, on0)
        self.assert_container_response(r.container_responses[0], pod, "main",
                                       [(gpus[1], 4096, 100)])
        wait_for(lambda: "kubelet counted its kgpu.io/gpu-mem devices on another GPU"
                 in self.p.child.log(), 10, what="the warning")

    def test_gpus_by_index_and_without_cdi(self):
        gpus = self.bring_up(args=["--device-id-strategy", "index"])
        pod = self.one_gpu_pod("by-index", gpus[1], units=2)
        _, r = self.admit(MEM, 2)
        self.assert_container_response(r, pod, "main", [(gpus[1], 2048, 100)], cdi="index")

    def test_envvar_strategy_has_no_cdi_devices(self):
        gpus = self.bring_up(1, args=["--device-list-strategy", "envvar",
                                      "--cdi-kind", "example.com/gpu"])
        pod = self.one_gpu_pod("env-only", gpus[0], units=2)
        _, r = self.admit(MEM, 2)
        self.assert_container_response(r, pod, "main", [(gpus[0], 2048, 100)], cdi=None)


class TestNoApiServer(PluginCase):
    def test_without_credentials_allocate_refuses(self):
        gpus = make_gpus(2)
        p = self.up(gpus)  # no --kubeconfig, no in-cluster variables
        self.assertIn("running without an API server", p.child.log())
        self.assertEqual(len(self.kubelet.lists[MEM]), 30)
        for r in (MEM, CORE):
            self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.kubelet.allocate, r,
                                  ids_of(gpus[0], r)[:2],
                                  contains=("without an API server", "which pod"))
        # Preferred allocation still packs.
        self.assertEqual(len(self.kubelet.preferred(MEM, self.free_ids(MEM), (), 3)), 3)
        self.assertEqual(os.listdir(self.state_dir), ["ld.so.preload"])

    def test_no_api_server_flag(self):
        gpus = make_gpus(1)
        self.up(gpus, ["--no-api-server"])
        self.assert_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, self.kubelet.allocate, MEM,
                              ids_of(gpus[0], MEM)[:1], contains=("which pod",))


# ---------------------------------------------------------------------------
# 11. Stopping
# ---------------------------------------------------------------------------

class TestStop(AllocateCase):
    def test_sigterm_with_open_streams_and_calls(self):
        gpus = self.bring_up(2)
        self.one_gpu_pod("stopping", gpus[0], units=2)
        self.admit(MEM, 2)
        stop = threading.Event()

        def hammer():
            while not stop.is_set():
                try:
                    self.kubelet.options(CORE)
                except grpc.RpcError:
                    pass
        t = threading.Thread(target=hammer, daemon=True)
        t.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        self.p.stop()  # asserts exit 0, sockets removed, no sanitizer report
        stop.set()
        t.join(10)
        self.assertLess(time.monotonic() - t0, 5.0)
        for r in (MEM, CORE):
            self.assertTrue(self.kubelet.endpoints[r].ended.wait(5))
        self.assertIn("stopped", self.p.child.log())

    def test_streams_and_calls_cut_short(self):
        """Streams opened and cancelled, calls abandoned mid-way: no leak, no crash."""
        gpus = make_gpus(2)
        p = self.up(gpus, ["--no-api-server"])
        path = os.path.join(self.plugin_dir, SOCKETS[MEM])
        channels = [grpc.insecure_channel("unix:" + path) for _ in range(4)]
        streams = []
        for i in range(24):
            ch = channels[i % 4]
            law = ch.unary_stream("/v1beta1.DevicePlugin/ListAndWatch",
                                  request_serializer=PB.Empty.SerializeToString,
                                  response_deserializer=PB.ListAndWatchResponse.FromString)
            st = law(PB.Empty(), timeout=15)
            if i % 3 == 0:
                self.assertEqual(len(next(st).devices), 30)
            streams.append(st)
        for i, st in enumerate(streams):
            if i % 2 == 0:
                st.cancel()
        pref = channels[0].unary_unary(
            "/v1beta1.DevicePlugin/GetPreferredAllocation",
            request_serializer=PB.PreferredAllocationRequest.SerializeToString,
            response_deserializer=PB.PreferredAllocationResponse.FromString)
        req = PB.PreferredAllocationRequest(container_requests=[
            PB.ContainerPreferredAllocationRequest(available_deviceIDs=ids_of(gpus[0], MEM),
                                                   allocation_size=3)])
        for _ in range(20):
            try:
                pref(req, timeout=0.001)
            except grpc.RpcError:
                pass
        # A health change reaches the streams still open.
        gpus[0]["healthy"] = False
        self.write_gpus(gpus, atomic=True)
        live = streams[1]
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            msg = next(live)
            if all(d.health == "Unhealthy" for d in msg.devices if d.ID.startswith(
                    gpus[0]["uuid"])):
                break
        else:
            self.fail("an open stream never saw the change")
        for ch in channels:
            ch.close()
        self.assertTrue(p.child.alive())
        self.assertEqual(len(self.kubelet.preferred(MEM, ids_of(gpus[1], MEM), (), 2)), 2)

    def test_bad_flags(self):
        for args, text in ((["--memory-unit", "1.5Mi"], "--memory-unit"),
                           (["--log-level", "loud"], "--log-level"),
                           (["--sharing", "timeslice"], "--sharing timeslice: expected sched or mps"),
                           (["--device-list-strategy", "volume-mounts"],
                            "--device-list-strategy: expected cdi-cri or envvar"),
                           (["--device-id-strategy", "serial"], "expected uuid or index"),
                           (["--cdi-kind", "nvidia.com/gpu=all"], "<vendor>/<class>"),
                           (["--bogus"], "--bogus"), (["extra"], "extra")):
            out = subprocess.run([PLUGIN_BIN] + args, capture_output=True, text=True, timeout=20)
            self.assertEqual(out.returncode, 2, args)
            self.assertIn(text, out.stderr)
        out = subprocess.run([PLUGIN_BIN, "--help"], capture_output=True, text=True, timeout=20)
        self.assertEqual(out.returncode, 0)
        self.assertIn("--fake-gpus", out.stdout)
        # An API server but no node name: it cannot know whose pods to look through.
        p = self.start_plugin(["--fake-gpus", self.gpu_file, "--kubeconfig",
                               API.kubeconfig(os.path.join(self.tmp, "kubeconfig"))],
                              gpus=make_gpus(1))
        self.assertEqual(p.child.wait_exit(20), 1)
        p.stopped = True
        self.assertIn("--node-name", p.child.log())
        self.assertEqual(os.listdir(self.plugin_dir), [])
        # A fake file that is missing fails at start, naming it.
        p = self.start_plugin(["--no-api-server", "--fake-gpus",
                               os.path.join(self.tmp, "none.yaml")])
        self.assertIsNotNone(p.child.wait_exit(20))
        p.stopped = True
        self.assertEqual(p.child.proc.returncode, 1)
        self.assertIn("none.yaml", p.child.log())
        self.assertIsNone(p.sanitizer_report())


# ---------------------------------------------------------------------------
# 12. Stress: every thread of the plugin busy at once
# ---------------------------------------------------------------------------

def thread_count(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


# Calls in flight when a kubelet restart makes the plugin serve its socket anew.
CUT_SHORT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED) if grpc else ()


class TestStress(AllocateCase):
    """Health flapping, streams opened and dropped, hostile and good calls, kubelet restarts.

    The plugin's threads (main loop, API thread, one queue thread per socket,
    a worker per unary call) all run at once; afterwards it must still answer
    exactly, hold no more threads than at rest, and stop cleanly with no
    sanitizer report (the build under test is ASan/UBSan).
    """

    def test_everything_at_once(self):
        gpus = self.bring_up(2)
        pid = self.p.child.proc.pid
        time.sleep(0.3)
        rest_threads = thread_count(pid)
        stop = threading.Event()
        errors = []
        counts = {"streams": 0, "calls": 0, "flips": 0, "pods": 0, "refused": 0}

        def guard(fn):
            def run():
                try:
                    fn()
                except Exception as e:  # reported below; the test fails on any
                    errors.append("%s: %r" % (fn.__name__, e))
                    stop.set()
            return run

        def flap():
            healthy = True
            while not stop.is_set():
                healthy = not healthy
                g = [dict(x) for x in gpus]
                g[1]["healthy"] = healthy
                self.write_gpus(g, atomic=True)
                counts["flips"] += 1
                time.sleep(0.05)
            self.write_gpus(gpus, atomic=True)

        def streams():
            path = "unix:" + os.path.join(self.plugin_dir, SOCKETS[MEM])
            while not stop.is_set():
                ch = grpc.insecure_channel(path)
                try:
                    call = ch.unary_stream(
                        "/v1beta1.DevicePlugin/ListAndWatch",
                        request_serializer=PB.Empty.SerializeToString,
                        response_deserializer=PB.ListAndWatchResponse.FromString)(
                        PB.Empty(), timeout=5)
                    first = next(call)
                    if len(first.devices) != 30:
                        raise AssertionError("a stream began with %d devices"
                                             % len(first.devices))
                    call.cancel()
                    counts["streams"] += 1
                except grpc.RpcError as e:
                    if e.code() not in CUT_SHORT:
                        raise
                finally:
                    ch.close()

        def hostile():
            path = "unix:" + os.path.join(self.plugin_dir, SOCKETS[CORE])
            ch = grpc.insecure_channel(path)
            raw = lambda m: ch.unary_unary("/v1beta1.DevicePlugin/" + m,
                                           request_serializer=lambda b: b,
                                           response_deserializer=lambda b: b)
            expect = {"Allocate": grpc.StatusCode.INVALID_ARGUMENT,
                      "GetPreferredAllocation": grpc.StatusCode.INVALID_ARGUMENT,
                      "NoSuchMethod": grpc.StatusCode.UNIMPLEMENTED}
            try:
                i = 0
                while not stop.is_set():
                    m = ("Allocate", "GetPreferredAllocation", "NoSuchMethod")[i % 3]
                    i += 1
                    try:
                        raw(m)(b"\xff\xff\xff" + bytes([i % 256]), timeout=5)
                        raise AssertionError("%s accepted garbage" % m)
                    except grpc.RpcError as e:
                        if e.code() in CUT_SHORT:
                            continue
                        if e.code() != expect[m]:
                            raise AssertionError("%s answered %s: %s" % (m, e.code(),
                                                                         e.details()))
                    try:
                        opts = raw("GetDevicePluginOptions")(b"", timeout=5) if i % 5 == 0 \
                            else None
                    except grpc.RpcError as e:
                        if e.code() not in CUT_SHORT:
                            raise
                        opts = None
                    if opts is not None and PB.DevicePluginOptions.FromString(
                            opts).get_preferred_allocation_available is not True:
                        raise AssertionError("options changed under load")
                    counts["calls"] += 1
            finally:
                ch.close()

        def pods():
            # kubelet's side: pods bound one after another, each admitted and checked.
            k = 0
            while not stop.is_set():
                k += 1
                g = gpus[k % 2]
                units = 1 + k % 4
                name = "s%d" % k
                self.one_gpu_pod(name, g, units=units)
                try:
                    # On the pod's GPU, as GetPreferredAllocation steers kubelet: an
                    # assignment on a GPU kubelet gave no device of is refused.
                    r = self.kubelet.allocate(MEM, ids_of(g, MEM)[:units])
                except grpc.RpcError as e:
                    # GPU 1 flaps: a pod whose GPU is Unhealthy right now is refused, never
                    # handed a broken GPU.
                    flapped = e.code() == grpc.StatusCode.FAILED_PRECONDITION and \
                        g is gpus[1] and "turned unhealthy" in e.details()
                    if e.code() not in CUT_SHORT and not flapped:
                        raise
                    # Cut by a kubelet restart, or refused: kubelet fails this admission.
                    counts["refused"] += flapped
                    API.delete_pod(name)
                    continue
                env = r.container_responses[0].envs
                if env["NVIDIA_VISIBLE_DEVICES"] != g["uuid"] or \
                        env["KGPU_MEMORY_LIMIT_MIB"] != str(units * 1024):
                    raise AssertionError("pod %s got %s" % (name, dict(env)))
                if "kgpu.io/allocated" not in annotations(API.pod(name)):
                    raise AssertionError("pod %s not marked allocated" % name)
                API.delete_pod(name)
                counts["pods"] += 1

        workers = [threading.Thread(target=guard(f), daemon=True)
                   for f in (flap, streams, streams, hostile, hostile, pods)]
        for t in workers:
            t.start()
        # Two kubelet restarts in the middle of it all.
        for _ in range(2):
            time.sleep(1.5)
            since = time.monotonic()
            self.kubelet.restart()
            self.kubelet.wait_registered((MEM, CORE), since=since, timeout=5)
        time.sleep(1.5)
        stop.set()
        for t in workers:
            t.join(20)
        self.assertEqual(errors, [])
        if os.environ.get("KGPU_TEST_VERBOSE"):
            sys.stderr.write("stress: %r\n" % counts)
        for name, n in counts.items():
            if name != "refused":  # depends on timing: GPU 1 is Unhealthy half the time
                self.assertGreater(n, 3, "too little %s happened: %r" % (name, counts))
        # Still exact afterwards: the final health reaches kubelet, a good Allocate works.
        def newest_all_healthy():
            with self.kubelet.cond:
                d = self.kubelet.lists.get(MEM, {})
                return len(d) == 30 and all(x.health == "Healthy" for x in d.values())
        wait_for(newest_all_healthy, 2, what="the final, healthy list at kubelet")
        self.used.clear()
        pod = self.one_gpu_pod("after", gpus[1], units=2)
        _, r = self.admit(MEM, 2)
        self.assert_container_response(r, pod, "main", [(gpus[1], 2048, 100)])
        # Workers and dropped streams left nothing behind.
        wait_for(lambda: thread_count(pid) <= rest_threads + 2, 5,
                 what="threads back to about %d (now %d)" % (rest_threads, thread_count(pid)))


def main():
    global PLUGIN_BIN, FAKE_NVML_DIR, PROTOC, PB
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plugin", default=os.environ.get("KGPU_DEVICE_PLUGIN_BIN"))
    ap.add_argument("--fake-nvml-dir", default=os.environ.get("KGPU_FAKE_NVML_DIR"))
    ap.add_argument("--protoc", default="protoc")
    args, rest = ap.parse_known_args()
    if grpc is None:
        sys.stderr.write("test_device_plugin: cannot import grpc (%s) with %s: skipped\n"
                         % (_IMPORT_ERROR, sys.executable))
        return 77
    if not args.plugin or not os.access(args.plugin, os.X_OK):
        sys.stderr.write("test_device_plugin: kgpu-device-plugin not found (%r): skipped\n"
                         % args.plugin)
        return 77
    protoc = shutil.which(args.protoc)
    if protoc is None:
        sys.stderr.write("test_device_plugin: protoc not found: skipped\n")
        return 77
    PLUGIN_BIN = os.path.abspath(args.plugin)
    FAKE_NVML_DIR = args.fake_nvml_dir or ""
    PROTOC = protoc
    PB = load_messages(SOURCE_DIR, PROTOC)

    return run_tests(sys.argv[0], rest)


if __name__ == "__main__":
    sys.exit(main())
