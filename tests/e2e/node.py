"""A real Kubernetes node on this machine, for the node suite: kubelet (built by
scripts/upstream.sh) with containerd, runc and the CNI plugins from Debian's
packages, joined to a cluster.ControlPlane.

Everything lives in one work folder: containerd's root and state (and the pods'
network namespaces, netns_mounts_under_state_dir), runc's state, kubelet's root,
the pod logs, the CNI configuration and IP allocations. Outside it the node
needs, and gives back at the end:

  - /var/lib/kubelet/device-plugins, the device plugin folder, which kubelet
    keeps there whatever its --root-dir (removed at the end if it was made
    here; the suite is skipped where another kubelet's socket is in it);
  - a cgroup /kgpu-e2e in every cgroup hierarchy (kubelet's cgroupRoot, with
    the cgroupfs driver that this machine's cgroup v1 calls for);
  - the bridge kgpue2e0 of the pods' network (no address, no gateway, no
    masquerading: pods reach nothing but each other); with gateway=True (the
    install suite) the bridge is the pods' gateway and default route, so that
    they reach this machine and, through kube-proxy, cluster IPs, and two
    rules first in this machine's FORWARD chain let the bridge's traffic
    through (Docker's policy there is DROP), removed at the end with
    kube-proxy's nftables tables;
  - the kernel settings kubelet insists on (vm.overcommit_memory, kernel.panic,
    ...), saved before kubelet starts and put back after;
  - kubelet's links to container logs in /var/log/containers and the CNI
    library's cache in /var/lib/cni (fixed paths): the entries made here are
    removed, and the folders when they were made here. (kubelet's iptables
    chains are turned off: makeIPTablesUtilChains false.)

The runtime is containerd's CRI with node/fake-nvidia-runtime in place of runc:
like NVIDIA's container runtime it mounts the (fake) driver libraries into
containers whose NVIDIA_VISIBLE_DEVICES names GPUs. Images come from
node_images (built here, imported with ctr: no registry).

By default containerd is Debian's (1.6, no CDI). Node(containerd_bin=DIR) runs
the containerd, shim and ctr in DIR instead (scripts/upstream.sh builds 2.x
there, whose CRI injects CDI devices), and cdi_dirs=[...] names the folders its
CDI cache reads (kept in the work folder, not the host's /etc/cdi or
/var/run/cdi). The DRA suite runs its node that way; the node suite stays on
1.6, which it was written and checked against (test_11 relies on 1.6 making
a missing bind-mount source a directory; not checked on 2.x).

cleanup() undoes all of it from any state, without needing containerd or
kubelet to answer: it kills what runs in the node's cgroups and the node's
runtime shims (found by this node's socket path in their command line),
unmounts what is mounted under the work folder, removes the cgroups, the bridge
and the kernel settings. e2e.py calls emergency_cleanup() on SIGINT/SIGTERM.
"""

import json
import os
import shutil
import signal
import subprocess
import time
import unittest

import cluster
import harness
import node_images

HERE = os.path.dirname(os.path.abspath(__file__))
CGROUP_ROOT = "kgpu-e2e"
BRIDGE = "kgpue2e0"
POD_SUBNET = "10.244.0.0/24"
# What kubelet's container manager sets when protectKernelDefaults is off.
KUBELET_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
                   "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                   "kernel/keys/root_maxbytes")
FAKE_DRIVER_DIR = "/usr/lib/x86_64-linux-gnu"  # where the NVIDIA toolkit puts libcuda.so.1
KUBELET_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
# Fixed paths kubelet and containerd write to whatever their configuration says:
# kubelet's links to container logs, and the CNI library's cache of results.
CONTAINER_LOG_LINKS = "/var/log/containers"
CNI_CACHE = "/var/lib/cni"

_ACTIVE = []


def emergency_cleanup():
    """Undo every node started in this process (signal handlers, the end of e2e.py)."""
    for n in list(_ACTIVE):
        n.cleanup()


def cannot_run(message):
    """A suite this machine cannot run: skipped, but under CI=true an error, since CI must
    run every suite and a skip would pass unseen."""
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI=true: " + message)
    raise unittest.SkipTest(message)


def cannot_run_reason(bindir):
    """Why this machine cannot run the node, or None when it can."""
    if os.geteuid() != 0:
        return "not root: kubelet and containerd need root"
    for tool in ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "cc", "ldd", "ip",
                 "mount"):
        if shutil.which(tool) is None and not os.path.exists("/usr/sbin/" + tool):
            return "%s is missing (scripts/deps.sh installs containerd, runc, " \
                   "containernetworking-plugins)" % tool
    for plugin in ("bridge", "host-local", "loopback"):
        if not os.path.exists(os.path.join(cni_bin_dir() or "/nonexistent", plugin)):
            return "the CNI plugin %s is missing (Debian's containernetworking-plugins)" % plugin
    if not os.path.exists(os.path.join(bindir, "kubelet")):
        return "kubelet is not built (scripts/upstream.sh)"
    if shutil.which("docker") is None or subprocess.run(
            ["docker", "info"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
        return "no Docker engine answers: kgpu's image is built by scripts/image.sh"
    with open("/proc/filesystems") as f:
        if "overlay" not in f.read():
            return "the kernel has no overlay file system (containerd's snapshotter)"
    if not cgroup_dirs():
        return "no cgroup hierarchy is mounted under /sys/fs/cgroup"
    sock = os.path.join(KUBELET_PLUGIN_DIR, "kubelet.sock")
    if os.path.exists(sock):
        return "%s exists: another kubelet runs on this machine" % sock
    if cluster.host_ip() is None:
        return "no non-loopback IPv4 address for the node (kubelet refuses loopback)"
    return None


def cni_bin_dir():
    for d in ("/usr/lib/cni", "/opt/cni/bin"):
        if os.path.exists(os.path.join(d, "bridge")):
            return d
    return None


def cgroup_dirs():
    """Mount points of every cgroup hierarchy (v1 controllers, named and v2)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype = right.split()[0] if right else ""
            if fstype in ("cgroup", "cgroup2"):
                out.append(left.split()[4])
    return out


CAP_SYS_RESOURCE = 24


def has_cap(bit):
    """Whether this process has capability `bit` in its effective set."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def cgroup_v2_only():
    return os.path.exists("/sys/fs/cgroup/cgroup.controllers")


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def _run(argv, check=True, timeout=120):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError("%s: exit %d\n%s" % (" ".join(argv), r.returncode, r.stdout))
    return r


class Node:
    """kubelet + containerd on this machine as node `name` of the control plane `cp`."""

    def __init__(self, cp, workdir, build_dir, name="kgpu-e2e-node", gpus=(), labels=None,
                 containerd_bin=None, cdi_dirs=None, gateway=False, mig_gpus=()):
        self.cp, self.dir, self.build, self.name = cp, workdir, build_dir, name
        # gateway: the bridge is the pods' gateway (POD_GATEWAY), so that pods reach this
        # machine and, through kube-proxy, cluster IPs; this machine's FORWARD chain gets
        # rules that let the bridge's traffic through (Docker's policy there is DROP).
        self.gateway = gateway
        self.forward_rules = []
        # containerd_bin: a folder with containerd, containerd-shim-runc-v2 and ctr to run
        # instead of the PATH's; cdi_dirs: CDI spec folders (containerd 1.7+ only).
        self.containerd_bin, self.cdi_dirs = containerd_bin, list(cdi_dirs or [])
        self.gpus = list(gpus)  # [{uuid, model, memory_mib}] the fake driver shows
        # mig_gpus: indexes of self.gpus in MIG mode; the fake NVML keeps their instances in
        # mig_state, which deleting is a reboot of the node's GPUs.
        self.mig_gpus = list(mig_gpus)
        self.mig_state = os.path.join(workdir, "fake-mig", "state")
        self.labels = dict(labels or {})
        os.makedirs(workdir, exist_ok=True)
        self.ip = cluster.host_ip()
        self.kubelet = self.containerd = None
        self.kubelet_starts = 0
        self.saved_sysctls = {}
        self.made_run_containerd = not os.path.exists("/run/containerd")
        self.made_var_lib_kubelet = not os.path.exists("/var/lib/kubelet")
        self.made_plugin_dir = not os.path.exists(KUBELET_PLUGIN_DIR)
        self.made_log_links = not os.path.exists(CONTAINER_LOG_LINKS)
        self.made_cni_cache = not os.path.exists(CNI_CACHE)
        self.cni_results_before = set(_listdir(os.path.join(CNI_CACHE, "results")))
        self.cleaned = False
        _ACTIVE.append(self)

    def p(self, *names):
        return os.path.join(self.dir, *names)

    # kubelet's device plugin folder is a constant of kubelet's (pluginapi.DevicePluginPath),
    # not under --root-dir: the one path of the node outside the work folder.
    plugin_dir = KUBELET_PLUGIN_DIR

    @property
    def containerd_sock(self):
        return self.p("containerd", "containerd.sock")

    # kubelet's DRA plugin folders under its --root-dir (the work folder's kubelet/).
    @property
    def dra_plugin_dir(self):
        return self.p("kubelet", "plugins")

    @property
    def dra_registry_dir(self):
        return self.p("kubelet", "plugins_registry")

    def _tool(self, name):
        """containerd, its shim or ctr: the configured folder's, else the PATH's."""
        return os.path.join(self.containerd_bin, name) if self.containerd_bin else name

    def ctr(self, *args, check=True):
        return _run([self._tool("ctr"), "--address", self.containerd_sock] + list(args),
                    check=check)

    # -- start ------------------------------------------------------------------

    def start(self, preloaded=(), kgpu_image=False, dra_image=False, extra_images=()):
        """preloaded: shared objects the job image must carry the C library for;
        kgpu_image: also the image the Helm chart's pods name, from self.build;
        dra_image: that image with kgpu-dra-plugin in it too (deploy/dra's DaemonSet);
        extra_images: further (name, docker-archive path) to import."""
        t0 = time.monotonic()
        self._save_sysctls()
        self._make_cgroups()
        if self.gateway:
            self._open_forward()
        self._start_containerd()
        self.images = node_images.build_all(self.p("images"), preloaded=preloaded)
        if kgpu_image or dra_image:
            self.images.append(node_images.kgpu_image(self.p("images"), self.build,
                                                      dra=dra_image))
        self.images += list(extra_images)
        for name, path in self.images:
            self.ctr("-n", "k8s.io", "images", "import", path)
        self._write_kubelet_files()
        self.start_kubelet()
        self.wait_ready()
        self.cp.log("node %s up in %.1f s" % (self.name, time.monotonic() - t0))
        return self

    def _open_forward(self):
        """Lets the pods' bridge through this machine's FORWARD chain, first in it (before
        Docker's rules and its DROP policy): routed traffic between pods and cluster IPs,
        and bridged traffic, which br_netfilter also passes through the chain."""
        for rule in (["-i", BRIDGE, "-j", "ACCEPT"], ["-o", BRIDGE, "-j", "ACCEPT"]):
            if shutil.which("iptables") is None:
                return
            if _run(["iptables", "-w", "-I", "FORWARD", "1"] + rule, check=False).returncode == 0:
                self.forward_rules.append(rule)

    def _close_forward(self):
        for rule in self.forward_rules:
            _run(["iptables", "-w", "-D", "FORWARD"] + rule, check=False)
        self.forward_rules = []

    def _save_sysctls(self):
        for key in KUBELET_SYSCTLS:
            try:
                with open("/proc/sys/" + key) as f:
                    self.saved_sysctls[key] = f.read().strip()
            except OSError:
                pass

    def _make_cgroups(self):
        for d in cgroup_dirs():
            path = os.path.join(d, CGROUP_ROOT)
            os.makedirs(path, exist_ok=True)
            # A cpuset cgroup takes no task until it has CPUs and memory nodes.
            for knob in ("cpuset.cpus", "cpuset.mems"):
                src = os.path.join(d, knob)
                if os.path.exists(src) and not cgroup_v2_only():
                    with open(src) as f, open(os.path.join(path, knob), "w") as g:
                        g.write(f.read().strip() or "0")

    def _start_containerd(self):
        d = self.p("containerd")
        for sub in ("root", "state", "net.d", "cni-ipam", "runc"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        libs = {}
        for lib, path in (("libcuda.so.1", self.fake_cuda), ("libnvidia-ml.so.1", self.fake_nvml)):
            libs[os.path.join(FAKE_DRIVER_DIR, lib)] = path
        runtime_conf = {"runc": shutil.which("runc") or "/usr/sbin/runc", "mounts": libs,
                        "gpus": self.gpus, "log": os.path.join(d, "fake-nvidia-runtime.log")}
        if self.mig_gpus:
            os.makedirs(os.path.dirname(self.mig_state), exist_ok=True)
            runtime_conf["mig"] = {"gpus": self.mig_gpus, "state": self.mig_state}
        with open(os.path.join(d, "runtime.json"), "w") as f:
            json.dump(runtime_conf, f, indent=1)
        cni = {"cniVersion": "0.4.0", "name": "kgpu-e2e", "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": self.gateway, "ipMasq": False,
             "ipam": dict({"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                           "dataDir": os.path.join(d, "cni-ipam")},
                          # The pods' default route, through the bridge (the gateway).
                          **({"routes": [{"dst": "0.0.0.0/0"}]} if self.gateway else {}))}]}
        with open(os.path.join(d, "net.d", "10-kgpu-e2e.conflist"), "w") as f:
            json.dump(cni, f, indent=1)
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        conf = "\n".join([
            "version = 2",
            'root = "%s"' % os.path.join(d, "root"),
            'state = "%s"' % os.path.join(d, "state"),
            "[grpc]", '  address = "%s"' % self.containerd_sock,
            '[plugins."io.containerd.internal.v1.opt"]',
            '  path = "%s"' % os.path.join(d, "opt"),
        ] + ([
            # containerd 2.x serves NRI on /var/run/nri/nri.sock by default: outside the
            # work folder, and nothing here uses it.
            '[plugins."io.containerd.nri.v1.nri"]',
            "  disable = true",
        ] if self.containerd_bin else []) + [
            "[%s]" % cri,
            '  sandbox_image = "%s"' % node_images.PAUSE_IMAGE,
            "  netns_mounts_under_state_dir = true",
        ] + ([
            # containerd 2.x has CDI on by default; said anyway, with this run's folders.
            "  enable_cdi = true",
            "  cdi_spec_dirs = [%s]" % ", ".join('"%s"' % c for c in self.cdi_dirs),
        ] if self.cdi_dirs else []) + [
            # Without CAP_SYS_RESOURCE (this machine's sandbox lacks it) runc cannot lower
            # oom_score_adj to kubelet's -998 for the sandbox: keep it at containerd's own.
            "  restrict_oom_score_adj = %s" % ("true" if not has_cap(CAP_SYS_RESOURCE)
                                                else "false"),
            "[%s.containerd]" % cri,
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            "[%s.containerd.runtimes.runc]" % cri,
            '  runtime_type = "io.containerd.runc.v2"',
            "[%s.containerd.runtimes.runc.options]" % cri,
            '  BinaryName = "%s"' % os.path.join(HERE, "node", "fake-nvidia-runtime"),
            '  Root = "%s"' % os.path.join(d, "runc"),
            "  SystemdCgroup = false",
            "[%s.cni]" % cri,
            '  bin_dir = "%s"' % cni_bin_dir(),
            '  conf_dir = "%s"' % os.path.join(d, "net.d"),
            ""])
        path = os.path.join(d, "config.toml")
        with open(path, "w") as f:
            f.write(conf)
        # Nothing is pulled here: should a pod ever name an image that is not imported,
        # the pull goes to a closed loopback port, never to a registry.
        env = dict(os.environ, KGPU_E2E_RUNTIME_CONFIG=os.path.join(d, "runtime.json"),
                   HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9",
                   NO_PROXY="")
        if self.containerd_bin:  # containerd starts containerd-shim-runc-v2 from its PATH
            env["PATH"] = self.containerd_bin + os.pathsep + env.get("PATH", "")
        for sub in self.cdi_dirs:
            os.makedirs(sub, exist_ok=True)
        self.containerd = harness.Child([self._tool("containerd"), "--config", path,
                                         "--log-level", "info"],
                                        self.p("containerd.log"), env=env)
        self.cp.children["containerd"] = self.containerd

        def up():
            if not self.containerd.alive():
                raise RuntimeError("containerd exited:\n" + self.containerd.log_tail(30))
            return self.ctr("version", check=False).returncode == 0
        cluster.wait_for(up, 60, "containerd", interval=0.2)

    @property
    def fake_cuda(self):
        return os.path.join(self.build, "fake-cuda", "full", "libcuda.so.1")

    @property
    def fake_nvml(self):
        return os.path.join(self.build, "tests", "fake-nvml-plain", "libnvidia-ml.so.1")

    def _write_kubelet_files(self):
        pki = self.cp.pki
        crt, key = pki.issue("node-" + self.name, "system:node:" + self.name,
                             orgs=["system:nodes"])
        self.kubeconfig = cluster.kubeconfig(self.p("kubelet.kubeconfig"), self.cp.server,
                                             pki.ca_crt, crt, key, user=self.name)
        self.serving_crt, self.serving_key = pki.issue(
            "kubelet-serving-" + self.name, "system:node:" + self.name, server=True,
            sans=["IP:" + self.ip, "DNS:" + self.name])
        self.kubelet_port = cluster.free_port()
        self.healthz_port = cluster.free_port()
        os.makedirs(self.plugin_dir, exist_ok=True)
        conf = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.ip, "port": self.kubelet_port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": pki.ca_crt}},
            "authorization": {"mode": "AlwaysAllow"},
            "tlsCertFile": self.serving_crt, "tlsPrivateKeyFile": self.serving_key,
            "containerRuntimeEndpoint": "unix://" + self.containerd_sock,
            # This machine has cgroup v1 and no systemd: cgroupfs, and v1 allowed.
            "cgroupDriver": "cgroupfs", "cgroupRoot": "/" + CGROUP_ROOT,
            "failCgroupV1": False, "failSwapOn": False,
            "podLogsDir": self.p("pod-logs"),
            "volumePluginDir": self.p("volume-plugins"),
            "resolvConf": "/etc/resolv.conf",
            # Nothing can be pulled here: never collect the imported images, and
            # do not evict on a machine whose disk others fill.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "2s", "syncFrequency": "10s",
            "fileCheckFrequency": "10s", "maxPods": 50,
            "enableServer": True, "rotateCertificates": False, "serverTLSBootstrap": False,
            # No KUBE-FIREWALL and canary chains in the machine's iptables: they are for
            # kube-proxy, which does not run here.
            "makeIPTablesUtilChains": False,
        }
        with open(self.p("kubelet-config.json"), "w") as f:
            json.dump(conf, f, indent=1)

    def start_kubelet(self):
        self.kubelet_starts += 1
        labels = ",".join("%s=%s" % kv for kv in sorted(self.labels.items()))
        argv = [self.cp.tool("kubelet"), "--config", self.p("kubelet-config.json"),
                "--kubeconfig", self.kubeconfig, "--root-dir", self.p("kubelet"),
                "--hostname-override", self.name, "--node-ip", self.ip, "--v", "2"]
        if labels:
            argv += ["--node-labels", labels]
        log = self.p("kubelet.%d.log" % self.kubelet_starts)
        self.kubelet = harness.Child(argv, log)
        self.cp.children["kubelet.%d" % self.kubelet_starts] = self.kubelet
        return self.kubelet

    def stop_kubelet(self):
        if self.kubelet is not None:
            self.kubelet.stop()
            self.kubelet = None

    def restart_kubelet(self):
        self.stop_kubelet()
        self.start_kubelet()

    def kubelet_log(self):
        return self.kubelet.log() if self.kubelet else ""

    def node(self):
        return self.cp.admin.try_get("/api/v1/nodes/" + self.name)

    def wait_ready(self, timeout=120):
        """kubelet registered the node and says Ready; then the not-ready taint is taken
        off, as the node lifecycle controller (not run here) would."""
        def ready():
            if self.kubelet is None or not self.kubelet.alive():
                raise RuntimeError("kubelet exited:\n" + (self.kubelet.log_tail(40)
                                                          if self.kubelet else ""))
            n = self.node()
            if n is None:
                return False
            for c in n.get("status", {}).get("conditions") or []:
                if c["type"] == "Ready":
                    return c["status"] == "True"
            return False
        try:
            cluster.wait_for(ready, timeout, "node %s Ready" % self.name, interval=0.5)
        except AssertionError as e:
            raise AssertionError("%s\nkubelet log:\n%s" % (e, self.kubelet.log_tail(40)))
        n = self.node()
        taints = [t for t in (n["spec"].get("taints") or [])
                  if not t["key"].startswith("node.kubernetes.io/")]
        self.cp.admin.merge_patch("/api/v1/nodes/" + self.name,
                                  {"spec": {"taints": taints or None}})
        return n

    # -- reading a container's output ---------------------------------------

    def logs(self, ns, pod, container=None):
        """The container's log through the API (kube-apiserver asks kubelet)."""
        q = "?container=" + container if container else ""
        st, text = self.cp.admin.raw("GET", "/api/v1/namespaces/%s/pods/%s/log%s" % (ns, pod, q))
        if st != 200:
            raise AssertionError("logs of %s/%s: %d %s" % (ns, pod, st, text[:300]))
        return text.decode("utf-8", "replace")

    # -- the end ------------------------------------------------------------------

    def stop(self):
        """Takes every pod off the node through kubelet first (so the runtime tears
        sandboxes down as it would), then cleanup()."""
        try:
            if self.kubelet is not None and self.kubelet.alive():
                q = "fieldSelector=spec.nodeName%3D" + self.name
                pods = self.cp.admin.get("/api/v1/pods?" + q)["items"]
                for pod in pods:
                    m = pod["metadata"]
                    self.cp.admin.delete(cluster.pod_path(m["namespace"], m["name"]), grace=0)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    if not self.cp.admin.get("/api/v1/pods?" + q)["items"]:
                        break
                    time.sleep(0.5)
        except Exception as e:  # noqa: BLE001 -- cleanup goes on whatever the API says
            print("node %s: deleting pods: %s" % (self.name, e))
        self.cleanup()

    def cleanup(self):
        if self.cleaned:
            return
        self.cleaned = True
        for c in (self.kubelet, self.containerd):
            if c is not None:
                c.stop(timeout=15)
        for _ in range(10):
            if not self._kill_leftovers():
                break
            time.sleep(0.3)
        self._unmount_all()
        self._remove_cgroups()
        _run(["ip", "link", "del", BRIDGE], check=False)
        self._close_forward()
        if self.gateway:
            cluster.remove_proxy_tables()  # kube-proxy ran for this node's pods
        for key, value in self.saved_sysctls.items():
            try:
                with open("/proc/sys/" + key, "w") as f:
                    f.write(value)
            except OSError:
                pass
        if self.made_run_containerd:
            shutil.rmtree("/run/containerd", ignore_errors=True)
        if self.made_var_lib_kubelet:
            shutil.rmtree("/var/lib/kubelet", ignore_errors=True)
        elif self.made_plugin_dir:
            shutil.rmtree(KUBELET_PLUGIN_DIR, ignore_errors=True)
        base = os.path.realpath(self.dir) + "/"
        for name in _listdir(CONTAINER_LOG_LINKS):
            link = os.path.join(CONTAINER_LOG_LINKS, name)
            if os.path.islink(link) and os.readlink(link).startswith(base):
                os.unlink(link)
        if self.made_log_links and not _listdir(CONTAINER_LOG_LINKS):
            shutil.rmtree(CONTAINER_LOG_LINKS, ignore_errors=True)
        if self.made_cni_cache:
            shutil.rmtree(CNI_CACHE, ignore_errors=True)
        else:
            results = os.path.join(CNI_CACHE, "results")
            for name in set(_listdir(results)) - self.cni_results_before:
                if "kgpu-e2e" in name or name.startswith("cni-loopback-"):
                    try:
                        os.unlink(os.path.join(results, name))
                    except OSError:
                        pass
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    def _our_pids(self):
        """Processes in the node's cgroups, and runtime shims of its containerd."""
        pids = set()
        for d in cgroup_dirs():
            for root, _, files in os.walk(os.path.join(d, CGROUP_ROOT)):
                if "cgroup.procs" in files:
                    try:
                        with open(os.path.join(root, "cgroup.procs")) as f:
                            pids.update(int(x) for x in f.read().split())
                    except OSError:
                        pass
        sock = self.containerd_sock.encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if b"containerd-shim" in cmd and sock in cmd:
                pids.add(int(entry))
        pids.discard(os.getpid())
        return pids

    def _kill_leftovers(self):
        pids = self._our_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return bool(pids)

    def _unmount_all(self):
        """Everything mounted at or under the work folder, deepest first (lazily)."""
        base = os.path.realpath(self.dir)
        for _ in range(5):
            points = []
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    mp = line.split()[4].replace("\\040", " ")
                    if mp == base or mp.startswith(base + "/"):
                        points.append(mp)
            if not points:
                return
            for mp in sorted(points, key=len, reverse=True):
                _run(["umount", "-l", mp], check=False)

    def _remove_cgroups(self):
        for d in cgroup_dirs():
            top = os.path.join(d, CGROUP_ROOT)
            if not os.path.isdir(top):
                continue
            for root, dirs, _ in sorted(os.walk(top), key=lambda w: len(w[0]), reverse=True):
                for attempt in range(20):
                    try:
                        os.rmdir(root)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.1)
