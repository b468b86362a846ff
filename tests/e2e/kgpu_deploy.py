"""kgpu on the real control plane: installed from its Helm chart, the extender as a process.

- install(): `helm template` of deploy/helm/kgpu (the real helm), applied with
  the real kubectl as the admin. Without kube-controller-manager and kubelets
  the Deployment and DaemonSet never get pods: the extender runs here as a
  process instead, with what its pod would have — the rendered config.yaml,
  its ServiceAccount's token (TokenRequest API) in a service-account folder,
  KUBERNETES_SERVICE_HOST/PORT, POD_NAME/POD_NAMESPACE.
- ExtenderTls: what the operator does for the shipped defaults (HTTPS with
  client certificates): a CA of their own, the extender's serving
  certificate and kube-scheduler's client certificate; the Secret
  kgpu-extender-tls the chart mounts, written out as kubelet would mount it;
  kube-scheduler's tlsConfig files, as copied to a control-plane node. The
  shipped configurations are changed only in their file paths (the
  /etc/kgpu-tls/ and /etc/kubernetes/kgpu/ prefixes) and addresses.
- DevicePluginPod: on the node suite's real node, the device plugin runs in a
  pod made from the chart's DaemonSet template (image built by node_images).
- ServiceVip: what kube-proxy and the endpoints controller do for the
  kgpu-extender Service: TCP connections go, unchanged (TLS passes through),
  to a ready replica (kubelet's probe: GET /readyz 200 without a client
  certificate), and the Service's EndpointSlice names the ready replica
  (through a Pod object), so the API server's service proxy reaches them.
"""

import base64
import json
import os
import re
import select
import ssl
import subprocess
import socket
import threading
import time
import urllib.request

import cluster
import harness

NS = "kgpu-system"
SA = "kgpu-extender"
SERVICE_DNS = "kgpu-extender.%s.svc" % NS
# Where the shipped configurations expect their TLS files: the Secret's mount in the
# extender's pod, and kube-scheduler's folder on a control-plane node.
POD_TLS_DIR = "/etc/kgpu-tls/"
NODE_SCHED_DIR = "/etc/kubernetes/kgpu/"


class ExtenderTls:
    """The certificates of the shipped defaults, as scripts/make-extender-certs.sh makes
    them: a CA of the operator's (not the cluster's), the extender's serving certificate
    for its Service name (and 127.0.0.1, as the script does for port-forwarding), a
    client certificate for kube-scheduler and one for this harness (an operator's tool,
    like `kgpu inspect --cert`)."""

    def __init__(self, cp):
        self.cp = cp
        self.pki = cluster.Pki(cp.p("extender-pki"), cn="kgpu-extender-ca",
                               service_account_keys=False)
        self.ca = self.pki.ca_crt
        self.server_crt, self.server_key = self.pki.issue(
            "tls", SERVICE_DNS, server=True,
            sans=["DNS:" + SERVICE_DNS, "DNS:%s.cluster.local" % SERVICE_DNS, "DNS:localhost",
                  "IP:127.0.0.1"])
        self.scheduler_crt, self.scheduler_key = self.pki.issue("client", "kube-scheduler")
        self.harness_crt, self.harness_key = self.pki.issue("harness", "kgpu-e2e-harness")
        self.pod_dir = cp.p("kgpu-tls-mount")
        self.node_dir = cp.p("kgpu-scheduler-node")

    def create_secret(self):
        """The Secret kgpu-extender-tls as the docs have the operator create it; then its
        keys written to pod_dir, as kubelet mounts a Secret volume."""
        data = {}
        for key, path in (("tls.crt", self.server_crt), ("tls.key", self.server_key),
                          ("ca.crt", self.ca)):
            with open(path, "rb") as f:
                data[key] = base64.b64encode(f.read()).decode()
        base = "/api/v1/namespaces/%s/secrets" % NS
        self.cp.admin.delete(base + "/kgpu-extender-tls")
        self.cp.admin.post(base, {"apiVersion": "v1", "kind": "Secret",
                                  "type": "kubernetes.io/tls",
                                  "metadata": {"name": "kgpu-extender-tls", "namespace": NS},
                                  "data": data})
        secret = self.cp.admin.get(base + "/kgpu-extender-tls")
        os.makedirs(self.pod_dir, exist_ok=True)
        for key, b64 in secret["data"].items():
            with open(os.path.join(self.pod_dir, key), "wb") as f:
                f.write(base64.b64decode(b64))
        os.makedirs(self.node_dir, exist_ok=True)
        for name, src in (("ca.crt", self.ca), ("client.crt", self.scheduler_crt),
                          ("client.key", self.scheduler_key)):
            with open(src, "rb") as f, open(os.path.join(self.node_dir, name), "wb") as d:
                d.write(f.read())

    def extender_config(self, text):
        return text.replace(POD_TLS_DIR, self.pod_dir + "/")

    def scheduler_config(self, text):
        return text.replace(NODE_SCHED_DIR, self.node_dir + "/")

    def context(self, cert=True, ca=None):
        """A client's TLS context: the extender's CA, this harness's client certificate
        (cert=True), another one (cert=(crt, key)) or none (cert=False)."""
        ctx = ssl.create_default_context(cafile=ca or self.ca)
        if cert is True:
            ctx.load_cert_chain(self.harness_crt, self.harness_key)
        elif cert:
            ctx.load_cert_chain(*cert)
        return ctx


_probe_listen = {}


def supports_probe_listen(binary):
    """Whether this kgpu-extender has the probe listener (--probe-listen)."""
    if binary not in _probe_listen:
        r = subprocess.run([binary, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=30)
        _probe_listen[binary] = "--probe-listen" in r.stdout
    return _probe_listen[binary]


def uses_tls(config_text):
    """Whether an extender config.yaml serves HTTPS (a top-level tls: block)."""
    return re.search(r"(?m)^tls:\s*$", config_text) is not None


def render(cp, build_dir, values=(), files=()):
    """Rendered manifests of the chart, as a list of objects read back as JSON."""
    chart = os.path.join(cluster.REPO, "deploy", "helm", "kgpu")
    argv = [cp.tool("helm"), "template", "kgpu", chart, "--namespace", NS]
    for v in values:
        argv += ["--set", v]
    for v in files:  # KEY=PATH: the value is the file's text (helm's --set-file)
        argv += ["--set-file", v]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=120)
    if r.returncode != 0:
        raise AssertionError("helm template failed:\n" + r.stderr)
    return r.stdout


def install(cp, build_dir, values=(), files=()):
    """Applies the chart's objects and, when its extender serves HTTPS (the default), does
    the operator's part: certificates, the Secret, kube-scheduler's files (cp.kgpu_tls).
    Returns (scheduler-config text, extender config text) as read back from their
    ConfigMaps, with the TLS file paths pointing at this machine's copies; the texts as
    shipped are kept in cp.kgpu_shipped."""
    if os.environ.get("KGPU_E2E_KUSTOMIZE"):  # while developing the chart: the kustomize tree
        sched, ext = install_kustomize(cp)
    else:
        text = render(cp, build_dir, values, files)
        with open(cp.p("kgpu-rendered.yaml"), "w") as f:
            f.write(text)
        cp.kubectl("apply", "-f", cp.p("kgpu-rendered.yaml"))
        sched = cp.admin.get("/api/v1/namespaces/%s/configmaps/kgpu-scheduler-config" % NS)
        ext = cp.admin.get("/api/v1/namespaces/%s/configmaps/kgpu-extender" % NS)
        sched, ext = sched["data"]["scheduler-config.yaml"], ext["data"]["config.yaml"]
    cp.kgpu_shipped = (sched, ext)
    cp.kgpu_tls = None
    if uses_tls(ext):
        cp.kgpu_tls = ExtenderTls(cp)
        cp.kgpu_tls.create_secret()
        sched, ext = cp.kgpu_tls.scheduler_config(sched), cp.kgpu_tls.extender_config(ext)
    return sched, ext


def install_kustomize(cp):
    for d in ("extender", "device-plugin"):
        cp.kubectl("apply", "-k", os.path.join(cluster.REPO, "deploy", d))
    sched = cp.admin.get("/api/v1/namespaces/%s/configmaps/kgpu-scheduler-config" % NS)
    ext = cp.admin.get("/api/v1/namespaces/%s/configmaps/kgpu-extender" % NS)
    text = re.sub(r"(?m)^(\s*allocateWaitSeconds:).*$", r"\1 0", ext["data"]["config.yaml"])
    return sched["data"]["scheduler-config.yaml"], text


class Extender:
    """One kgpu-extender replica, run as its pod would run it."""

    def __init__(self, cp, build_dir, config_text, name="kgpu-extender-a", leader_elect=False,
                 extra=()):
        self.cp, self.name = cp, name
        self.binary = os.path.join(build_dir, "kgpu-extender")
        self.port = cluster.free_port()
        # HTTPS when its config says so; the harness then speaks as an operator's tool
        # with a client certificate from the extender's CA.
        self.tls = getattr(cp, "kgpu_tls", None) if uses_tls(config_text) else None
        self.url = "%s://127.0.0.1:%d" % ("https" if self.tls else "http", self.port)
        # kubelet's probes go to the probe listener where the extender has one (the
        # shipped probes name its port), else to the scheduling port.
        self.probe_port = cluster.free_port() if supports_probe_listen(self.binary) else None
        self.sa_dir = cp.p(name + "-sa")
        os.makedirs(self.sa_dir, exist_ok=True)
        self.config = cp.p(name + "-config.yaml")
        with open(self.config, "w") as f:
            f.write(config_text)
        self.leader_elect, self.extra = leader_elect, list(extra)
        self.child = None
        self.token = None
        self.starts = 0

    def write_identity(self):
        self.token = self.cp.service_account_token(NS, SA)
        for fname, content in (("token", self.token), ("namespace", NS)):
            tmp = os.path.join(self.sa_dir, "." + fname)
            with open(tmp, "w") as f:
                f.write(content)
            os.replace(tmp, os.path.join(self.sa_dir, fname))
        with open(self.cp.pki.ca_crt) as src, open(os.path.join(self.sa_dir, "ca.crt"), "w") as d:
            d.write(src.read())

    def start(self, wait_ready=True):
        for attempt in range(3):
            self._spawn()
            if not wait_ready:
                return self
            deadline = time.monotonic() + 60
            while self.child.alive():
                if self.probe("/healthz") == 200:
                    return self
                if time.monotonic() > deadline:
                    raise AssertionError("%s: no /healthz after 60 s:\n%s" %
                                         (self.name, self.child.log_tail(60)))
                time.sleep(0.1)
            if attempt == 2 or "address in use" not in self.child.log_tail(20):
                self.alive_or_raise()
            # free_port() found the ports free a moment ago; on a busy machine another
            # process can take one before the extender binds. Other ports, then.
            self.port = cluster.free_port()
            self.url = "%s://127.0.0.1:%d" % ("https" if self.tls else "http", self.port)
            if self.probe_port is not None:
                self.probe_port = cluster.free_port()
        return self

    def _spawn(self):
        self.write_identity()
        env = dict(os.environ, KUBERNETES_SERVICE_HOST="127.0.0.1",
                   KUBERNETES_SERVICE_PORT=str(self.cp.api_port),
                   POD_NAME=self.name, POD_NAMESPACE=NS)
        argv = [self.binary, "--config", self.config, "--listen", "0.0.0.0:%d" % self.port,
                "--service-account-dir", self.sa_dir]
        if self.probe_port is not None:
            argv += ["--probe-listen", "127.0.0.1:%d" % self.probe_port]
        if self.leader_elect:
            argv.append("--leader-elect")
        self.starts += 1
        log = self.cp.p("%s.%d.log" % (self.name, self.starts))  # each run keeps its log
        self.child = harness.Child(argv + self.extra, log, env=env)
        self.cp.children["%s.%d" % (self.name, self.starts)] = self.child

    def alive_or_raise(self):
        if not self.child.alive():
            raise RuntimeError("%s exited with %s:\n%s" % (self.name, self.child.proc.returncode,
                                                            self.child.log_tail(60)))
        return True

    def context(self):
        return self.tls.context() if self.tls else None

    def get(self, path, timeout=10, context=None):
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout,
                                        context=context or self.context()) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return 0, b""

    def post(self, path, doc, timeout=10, context=None):
        req = urllib.request.Request(self.url + path, data=json.dumps(doc).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout,
                                        context=context or self.context()) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def probe(self, path, timeout=2, method="GET"):
        """kubelet's httpGet probe: plain HTTP to the probe listener; without one, to the
        scheduling port with no client certificate and (HTTPS) no check of the serving
        certificate. The status, 0 when none came."""
        ctx, url = None, self.url
        if self.probe_port is not None:
            url = "http://127.0.0.1:%d" % self.probe_port
        elif self.tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        req = urllib.request.Request(url + path, method=method,
                                     data=b"{}" if method == "POST" else None)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 0

    def ready(self):
        return self.probe("/readyz") == 200

    def inspect(self):
        st, body = self.get("/inspect")
        if st != 200:
            raise AssertionError("%s /inspect answered %d" % (self.name, st))
        return json.loads(body)

    def metrics(self):
        st, body = self.get("/metrics")
        if st != 200:
            raise AssertionError("%s /metrics answered %d" % (self.name, st))
        return body.decode()

    def metric(self, name, labels=""):
        """Sum of the samples of `name` whose label text contains `labels`."""
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith(name) and (line[len(name)] in " {") and labels in line:
                total += float(line.rsplit(" ", 1)[1])
        return total

    def held(self):
        """{(node, gpu index): (memory MiB, milli)} allocated, zeros left out."""
        out = {}
        for n in self.inspect()["nodes"]:
            for g in n["gpus"]:
                v = (g["memory_allocated_mib"], g["milli_allocated"])
                if v != (0, 0):
                    out[(n["name"], g["index"])] = v
        return out

    def kill(self):
        self.child.kill()

    def stop(self):
        return self.child.stop()

    def sanitizer_report(self):
        return self.child.sanitizer_report() if self.child else None


class ServiceVip:
    """kube-proxy for the kgpu-extender Service: a loopback port forwarding each new
    connection to a ready replica, plus the Service's endpoints kept to the ready set."""

    def __init__(self, cp, replicas, publish_ip=None, pod_node=None):
        self.cp, self.replicas = cp, list(replicas)
        self.publish_ip = publish_ip
        # The node the replicas' Pod objects are bound to: one without a kubelet, or a
        # real kubelet would try to run them (default: the first node listed).
        self.pod_node = pod_node
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        tls = any(r.tls for r in self.replicas)
        self.url = "%s://127.0.0.1:%d" % ("https" if tls else "http", self.port)
        self.ready = []
        self.lock = threading.Lock()
        self.stopping = False
        self.published = None
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Thread(target=self._probe, daemon=True).start()

    def set_replicas(self, replicas):
        with self.lock:
            self.replicas = list(replicas)

    def _probe(self):
        while not self.stopping:
            with self.lock:
                reps = list(self.replicas)
            ready = [r for r in reps if r.child is not None and r.child.alive() and r.ready()]
            with self.lock:
                self.ready = ready
            try:
                self._publish(ready)
            except Exception as e:  # noqa: BLE001 -- the API may be going down at the end
                if not self.stopping:
                    print("service vip: publishing endpoints failed: %s" % e)
            time.sleep(0.2)

    def _publish(self, ready):
        """The Service's EndpointSlice names the first ready replica, through a Pod object made
        from the Deployment's template: kube-apiserver proxies only to an endpoint whose
        targetRef is a Pod in the Service's namespace with that address among its podIPs."""
        if self.publish_ip is None:
            return
        ports = tuple(r.port for r in ready[:1])
        if ports == self.published:
            return
        api = self.cp.admin
        endpoints = []
        for r in ready[:1]:
            self._ensure_pod(r.name)
            endpoints.append({"addresses": [self.publish_ip], "conditions": {"ready": True},
                              "targetRef": {"kind": "Pod", "namespace": NS, "name": r.name}})
        sbase = "/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices" % NS
        sl = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
              "metadata": {"name": "kgpu-extender-e2e", "namespace": NS,
                           "labels": {"kubernetes.io/service-name": "kgpu-extender",
                                      "endpointslice.kubernetes.io/managed-by": "kgpu-e2e"}},
              "addressType": "IPv4", "endpoints": endpoints,
              "ports": [{"name": "http", "port": p, "protocol": "TCP"} for p in ports]}
        old = api.try_get(sbase + "/kgpu-extender-e2e")
        if old is None:
            api.post(sbase, sl)
        else:
            sl["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            api.req("PUT", sbase + "/kgpu-extender-e2e", sl)
        self.published = ports

    def _ensure_pod(self, name):
        """A Pod standing for replica `name`: the Deployment's pod template, bound to a node,
        its status saying what kubelet would (Running, Ready, podIP = this machine's address)."""
        api = self.cp.admin
        path = "/api/v1/namespaces/%s/pods/%s" % (NS, name)
        if api.try_get(path) is None:
            dep = api.get("/apis/apps/v1/namespaces/%s/deployments/kgpu-extender" % NS)
            tmpl = dep["spec"]["template"]
            node = (self.pod_node or
                    api.get("/api/v1/nodes?limit=1")["items"][0]["metadata"]["name"])
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": dict(tmpl["metadata"], name=name, namespace=NS),
                   "spec": dict(tmpl["spec"], nodeName=node)}
            api.post("/api/v1/namespaces/%s/pods" % NS, pod)
        cur = api.get(path)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cur["status"] = {"phase": "Running", "podIP": self.publish_ip,
                         "podIPs": [{"ip": self.publish_ip}], "hostIP": self.publish_ip,
                         "conditions": [{"type": "Ready", "status": "True",
                                         "lastTransitionTime": now}]}
        api.req("PUT", path + "/status", cur)

    def _accept(self):
        while not self.stopping:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                target = self.ready[0] if self.ready else None
            if target is None:
                c.close()  # no ready endpoint: connection refused, as with kube-proxy
                continue
            threading.Thread(target=self._pipe, args=(c, target.port), daemon=True).start()

    @staticmethod
    def _pipe(c, port):
        try:
            u = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            c.close()
            return
        u.settimeout(None)
        socks = [c, u]
        try:
            while True:
                r, _, _ = select.select(socks, [], [], 60)
                if not r:
                    break
                done = False
                for s in r:
                    data = s.recv(65536)
                    if not data:
                        done = True
                        break
                    (u if s is c else c).sendall(data)
                if done:
                    break
        except OSError:
            pass
        finally:
            c.close()
            u.close()

    def wait_ready(self, replica=None, timeout=60):
        def ok():
            with self.lock:
                return (replica in self.ready) if replica else bool(self.ready)
        cluster.wait_for(ok, timeout, "a ready extender behind the Service")

    def stop(self):
        self.stopping = True
        self.sock.close()


DP_NS = "kgpu-node"


class DevicePluginPod:
    """kgpu-device-plugin as the chart's DaemonSet runs it, in a pod on a real node: the
    pod the DaemonSet controller (not run here) would make from its template, bound to
    the node, with two changes standing in for components that do not run either:
    hostNetwork, and KUBERNETES_SERVICE_HOST/PORT naming the API server's loopback
    address (kube-proxy would carry the `kubernetes` Service's address there). Also the
    kube-root-ca.crt ConfigMap of its namespace, which kube-controller-manager publishes
    and the pod's token volume needs. The GPUs come from the chart's fakeGpus ConfigMap,
    which write_gpus() replaces (kubelet carries the change into the pod's volume)."""

    def __init__(self, cp, node, state_dir):
        self.cp, self.node, self.state_dir = cp, node, state_dir
        self.starts = 0
        self.name = None
        self.logs = []  # the log of every run that has ended, for sanitizer reports

    def start(self, wait_registered=True):
        self.cp.publish_root_ca(DP_NS)
        ds = self.cp.admin.get("/apis/apps/v1/namespaces/%s/daemonsets/kgpu-device-plugin"
                               % DP_NS)
        tmpl = ds["spec"]["template"]
        self.starts += 1
        self.name = "kgpu-device-plugin-%s-%d" % (self.node.name, self.starts)
        spec = dict(tmpl["spec"], nodeName=self.node.name, hostNetwork=True)
        for c in spec["containers"]:
            if c["name"] == "kgpu-device-plugin":
                c["env"] = list(c.get("env") or []) + [
                    {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                    {"name": "KUBERNETES_SERVICE_PORT", "value": str(self.cp.api_port)}]
        meta = dict(tmpl["metadata"], name=self.name, namespace=DP_NS)
        self.cp.admin.post("/api/v1/namespaces/%s/pods" % DP_NS,
                           {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
        if wait_registered:
            cluster.wait_for(lambda: self.running() and "registered kgpu.io/gpu-mem"
                             in self.log(), 90, "pod %s to register" % self.name, interval=0.5)
        return self

    def pod(self):
        return self.cp.admin.try_get("/api/v1/namespaces/%s/pods/%s" % (DP_NS, self.name))

    def running(self):
        p = self.pod()
        if p and p.get("status", {}).get("phase") == "Failed":
            raise AssertionError("%s failed: %s" % (self.name, json.dumps(p["status"])[:1500]))
        return bool(p) and p.get("status", {}).get("phase") == "Running"

    def log(self):
        """The running plugin's log, through the API (kube-apiserver asks kubelet)."""
        if self.name is None:
            return ""
        st, text = self.cp.admin.raw(
            "GET", "/api/v1/namespaces/%s/pods/%s/log?container=kgpu-device-plugin"
            % (DP_NS, self.name))
        return text.decode("utf-8", "replace") if st == 200 else ""

    def log_tail(self, n=40):
        return "\n".join(self.log().splitlines()[-n:])

    def stop(self):
        """Deletes the pod as a rollout or drain would (gracefully), keeping its log."""
        if self.name is None:
            return
        self.logs.append(self.log())
        # Kept in the scratch folder, as the other components' logs are.
        with open(self.cp.p("kgpu-device-plugin.%d.log" % self.starts), "w") as f:
            f.write(self.logs[-1])
        self.cp.admin.delete("/api/v1/namespaces/%s/pods/%s" % (DP_NS, self.name))
        cluster.wait_for(lambda: self.pod() is None, 60, "pod %s to go" % self.name,
                         interval=0.3)
        self.name = None

    def restart(self):
        self.stop()
        return self.start()

    def write_gpus(self, gpus):
        """Replaces the fakeGpus ConfigMap's file."""
        path = "/api/v1/namespaces/%s/configmaps/kgpu-device-plugin-fake-gpus" % DP_NS
        self.cp.admin.merge_patch(path, {"data": {"gpus.yaml": fake_gpus_yaml(gpus)}})

    def sanitizer_reports(self):
        out = []
        for text in self.logs + [self.log()]:
            for mark in harness.SANITIZER_MARKS:
                at = text.find(mark)
                if at >= 0:
                    out.append(text[max(0, at - 300):at + 4000])
                    break
        return out


def fake_gpus_yaml(gpus):
    """A --fake-gpus file (examples/gpus.yaml's form) for [{uuid, model, memory_mib,
    healthy?}]."""
    lines = ["gpus:"]
    for i, g in enumerate(gpus):
        lines += ["  - index: %d" % i, "    uuid: %s" % g["uuid"],
                  "    model: %s" % g["model"], "    memory_mib: %d" % g["memory_mib"],
                  "    numa: 0", "    healthy: %s" % ("true" if g.get("healthy", True)
                                                    else "false")]
    return "\n".join(lines) + "\n"
