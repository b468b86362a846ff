"""kgpu on the real control plane: installed from its Helm chart, the extender as a process.

- install(): `helm template` of deploy/helm/kgpu (the real helm), applied with
  the real kubectl as the admin. Without kube-controller-manager and kubelets
  the Deployment and DaemonSet never get pods: the extender runs here as a
  process instead, with what its pod would have — the rendered config.yaml,
  its ServiceAccount's token (TokenRequest API) in a service-account folder,
  KUBERNETES_SERVICE_HOST/PORT, POD_NAME/POD_NAMESPACE.
- ServiceVip: what kube-proxy and the endpoints controller do for the
  kgpu-extender Service: connections go to a ready replica (GET /readyz 200),
  and the Service's EndpointSlice names the ready replica (through a Pod object), so
  the API server's service proxy (`kubectl kgpu inspect`) reaches them.
"""

import json
import os
import re
import select
import subprocess
import socket
import threading
import time
import urllib.request

import cluster
import harness

NS = "kgpu-system"
SA = "kgpu-extender"


def render(cp, build_dir, values=()):
    """Rendered manifests of the chart, as a list of objects read back as JSON."""
    chart = os.path.join(cluster.REPO, "deploy", "helm", "kgpu")
    argv = [cp.tool("helm"), "template", "kgpu", chart, "--namespace", NS]
    for v in values:
        argv += ["--set", v]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=120)
    if r.returncode != 0:
        raise AssertionError("helm template failed:\n" + r.stderr)
    return r.stdout


def install(cp, build_dir, values=()):
    """Applies the chart's objects; returns (scheduler-config text, extender config text)."""
    if os.environ.get("KGPU_E2E_KUSTOMIZE"):  # while developing the chart: the kustomize tree
        return install_kustomize(cp)
    text = render(cp, build_dir, values)
    with open(cp.p("kgpu-rendered.yaml"), "w") as f:
        f.write(text)
    cp.kubectl("apply", "-f", cp.p("kgpu-rendered.yaml"))
    sched = cp.admin.get("/api/v1/namespaces/%s/configmaps/kgpu-scheduler-config" % NS)
    ext = cp.admin.get("/api/v1/namespaces/%s/configmaps/kgpu-extender" % NS)
    return sched["data"]["scheduler-config.yaml"], ext["data"]["config.yaml"]


def install_kustomize(cp):
    for d in ("extender", "device-plugin"):
        cp.kubectl("apply", "-k", os.path.join(cluster.REPO, "deploy", d))
    with open(os.path.join(cluster.REPO, "deploy", "extender", "scheduler-config.yaml")) as f:
        sched = f.read()
    ext = cp.admin.get("/api/v1/namespaces/%s/configmaps/kgpu-extender" % NS)
    text = re.sub(r"(?m)^(\s*allocateWaitSeconds:).*$", r"\1 0", ext["data"]["config.yaml"])
    return sched, text


class Extender:
    """One kgpu-extender replica, run as its pod would run it."""

    def __init__(self, cp, build_dir, config_text, name="kgpu-extender-a", leader_elect=False,
                 extra=()):
        self.cp, self.name = cp, name
        self.binary = os.path.join(build_dir, "kgpu-extender")
        self.port = cluster.free_port()
        self.url = "http://127.0.0.1:%d" % self.port
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
        self.write_identity()
        env = dict(os.environ, KUBERNETES_SERVICE_HOST="127.0.0.1",
                   KUBERNETES_SERVICE_PORT=str(self.cp.api_port),
                   POD_NAME=self.name, POD_NAMESPACE=NS)
        argv = [self.binary, "--config", self.config, "--listen", "0.0.0.0:%d" % self.port,
                "--service-account-dir", self.sa_dir]
        if self.leader_elect:
            argv.append("--leader-elect")
        self.starts += 1
        log = self.cp.p("%s.%d.log" % (self.name, self.starts))  # each run keeps its log
        self.child = harness.Child(argv + self.extra, log, env=env)
        self.cp.children["%s.%d" % (self.name, self.starts)] = self.child
        if wait_ready:
            cluster.wait_for(lambda: self.alive_or_raise() and self.get("/healthz")[0] == 200,
                             60, "%s /healthz" % self.name, interval=0.1)
        return self

    def alive_or_raise(self):
        if not self.child.alive():
            raise RuntimeError("%s exited with %s:\n%s" % (self.name, self.child.proc.returncode,
                                                            self.child.log_tail(60)))
        return True

    def get(self, path, timeout=10):
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return 0, b""

    def post(self, path, doc, timeout=10):
        req = urllib.request.Request(self.url + path, data=json.dumps(doc).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def ready(self):
        return self.get("/readyz", timeout=2)[0] == 200

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

    def __init__(self, cp, replicas, publish_ip=None):
        self.cp, self.replicas = cp, list(replicas)
        self.publish_ip = publish_ip
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
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
            node = api.get("/api/v1/nodes?limit=1")["items"][0]["metadata"]["name"]
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
