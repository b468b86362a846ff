"""A real Kubernetes control plane on loopback, for the end-to-end suites and benchmarks.

etcd, kube-apiserver (TLS, service-account keys, Node+RBAC authorization,
the default admission plugins) and kube-scheduler, all upstream binaries
built by scripts/upstream.sh; kgpu installed from its Helm chart (rendered
with the real helm, applied with the real kubectl); kgpu-extender run as a
process authenticated as its ServiceAccount with a TokenRequest token, the
way it runs in a pod. Nothing of the stand-ins in tests/integration is used.

Only the standard library: the API is spoken over http.client with the
admin client certificate. Every process is a harness.Child, so run_tests()
and the signal handlers in e2e.py take them all down whatever happens.
"""

import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse

import harness

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
E2E_NS = "e2e"
# kube-scheduler on its defaults, no extender (its DRA plugin included): the DRA suites'.
PLAIN_SCHEDULER_CONFIG = """apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: set-by-cluster.py
leaderElection:
  leaderElect: false
"""
MEM, CORE, WHOLE, COUNT = ("kgpu.io/gpu-mem", "kgpu.io/gpu-core", "nvidia.com/gpu",
                           "kgpu.io/gpu-count")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_ip():
    """A non-loopback IPv4 address of this machine: the API server refuses to proxy to loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent for UDP connect
            ip = s.getsockname()[0]
            if not ip.startswith("127."):
                return ip
        except OSError:
            pass
    return None


def wait_healthz(child, port, name):
    """Waits for component `name` (harness.Child `child`) to answer /healthz on its secure
    port on loopback; raises with its log if it exits first."""
    def healthy():
        if not child.alive():
            raise RuntimeError("%s exited:\n%s" % (name, child.log()[-3000:]))
        try:
            ctx = ssl._create_unverified_context()  # its self-signed serving certificate
            c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=2)
            c.request("GET", "/healthz")
            return c.getresponse().status == 200
        except OSError:
            return False
    wait_for(healthy, 60, "%s /healthz" % name, interval=0.2)


def remove_proxy_tables():
    """kube-proxy's nftables tables (mode nftables), gone; nothing if there are none."""
    for family in ("ip", "ip6"):
        subprocess.run(["nft", "delete", "table", family, "kube-proxy"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_for(fn, timeout, what, interval=0.05):
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = fn()
        except Exception as e:  # noqa: BLE001 -- keep polling, report the last error
            last = e
            if time.monotonic() >= deadline:
                raise AssertionError("timed out after %.0f s waiting for %s: %r" %
                                     (timeout, what, e)) from e
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after %.0f s waiting for %s (last: %r)" %
                                 (timeout, what, last))
        time.sleep(interval)


# ---------------------------------------------------------------------------
# The API, spoken directly
# ---------------------------------------------------------------------------

class ApiError(Exception):
    def __init__(self, status, body, method, path):
        self.status, self.body = status, body
        reason = body.get("message") if isinstance(body, dict) else body
        super().__init__("%s %s: %d %s" % (method, path, status, reason))


class Api:
    """One identity talking to kube-apiserver; a keep-alive connection per thread."""

    def __init__(self, host, port, ca, cert=None, key=None, token=None):
        self.host, self.port, self.token = host, port, token
        self.ctx = ssl.create_default_context(cafile=ca)
        if cert:
            self.ctx.load_cert_chain(cert, key)
        self._local = threading.local()

    def _conn(self, fresh=False):
        c = getattr(self._local, "conn", None)
        if c is None or fresh:
            if c is not None:
                c.close()
            c = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=60)
            self._local.conn = c
        return c

    def raw(self, method, path, body=None, ctype="application/json", headers=None):
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            if isinstance(data, str):
                data = data.encode()
        h = {"Accept": "application/json"}
        if data is not None:
            h["Content-Type"] = ctype
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        h.update(headers or {})
        for attempt in (0, 1):
            c = self._conn(fresh=attempt > 0)
            try:
                c.request(method, path, body=data, headers=h)
                r = c.getresponse()
                text = r.read()
                return r.status, text
            except (http.client.HTTPException, ConnectionError, OSError):
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def req(self, method, path, body=None, ctype="application/json", ok=(200, 201, 202),
            headers=None):
        status, text = self.raw(method, path, body, ctype, headers)
        try:
            doc = json.loads(text) if text else None
        except ValueError:
            doc = text.decode("utf-8", "replace")
        if status not in ok:
            raise ApiError(status, doc, method, path)
        return doc

    def get(self, path):
        return self.req("GET", path)

    def try_get(self, path):
        try:
            return self.get(path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list_all(self, path, limit=500):
        """Every item of a list, page by page."""
        items, cont = [], None
        sep = "&" if "?" in path else "?"
        while True:
            q = "%slimit=%d" % (sep, limit) + ("&continue=" + urllib.parse.quote(cont)
                                                 if cont else "")
            doc = self.get(path + q)
            items.extend(doc.get("items") or [])
            cont = (doc.get("metadata") or {}).get("continue")
            if not cont:
                return items

    def post(self, path, body):
        return self.req("POST", path, body)

    def merge_patch(self, path, body):
        return self.req("PATCH", path, body, ctype="application/merge-patch+json")

    def delete(self, path, grace=None, missing_ok=True):
        body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        try:
            return self.req("DELETE", path, body)
        except ApiError as e:
            if missing_ok and e.status == 404:
                return None
            raise


def pod_path(ns, name=None):
    return "/api/v1/namespaces/%s/pods" % ns + ("/" + name if name else "")


# ---------------------------------------------------------------------------
# Objects
# ---------------------------------------------------------------------------

def gpu_inventory(name, model, count, memory_mib, numa=None):
    """The kgpu.io/gpus annotation the device plugin would write for this node."""
    out = []
    for i in range(count):
        out.append({"index": i, "uuid": "GPU-%s-%d" % (name, i), "model": model,
                    "memory_mib": memory_mib,
                    "numa": (numa[i] if numa else 0), "healthy": True})
    return out


def node_object(name, model, count, memory_mib, numa=None, cpu="64", memory="512Gi",
                unit_mib=1024, labels=None, gpus=None):
    """A Node as kubelet plus kgpu's device plugin (with --whole-gpus) would leave it."""
    gpus = gpus if gpus is not None else gpu_inventory(name, model, count, memory_mib, numa)
    units = sum(g["memory_mib"] // unit_mib for g in gpus)
    res = {"cpu": cpu, "memory": memory, "pods": "250", WHOLE: str(len(gpus)),
           MEM: str(units), CORE: str(100 * len(gpus))}
    lab = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
           "kubernetes.io/arch": "amd64",
           "kgpu.io/gpu-model": re.sub(r"[^A-Za-z0-9_.-]", "-", model) if gpus else "none",
           "kgpu.io/gpu-count": str(len(gpus))}
    lab.update(labels or {})
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": lab,
                     "annotations": {"kgpu.io/gpus": json.dumps(gpus, separators=(",", ":"))}},
        "spec": {},
        "status": {"capacity": res, "allocatable": dict(res),
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "message": "e2e node without a kubelet"}]},
    }


def pod_object(name, containers, ns=E2E_NS, annotations=None, priority_class=None,
               init=None, labels=None):
    """containers: [(name, {resource: amount})]; every container also asks a little CPU."""
    def c(cname, limits):
        lim = {k: str(v) for k, v in limits.items()}
        return {"name": cname, "image": "registry.invalid/kgpu-e2e:none",
                "resources": {"limits": lim, "requests": dict(lim, cpu="10m")}}
    spec = {"containers": [c(n, l) for n, l in containers],
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False}
    if init:
        spec["initContainers"] = [c(n, l) for n, l in init]
    if priority_class:
        spec["priorityClassName"] = priority_class
    meta = {"name": name, "namespace": ns, "labels": labels or {"app": "kgpu-e2e"}}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


# ---------------------------------------------------------------------------
# The control plane
# ---------------------------------------------------------------------------

def _run(argv, **kw):
    return subprocess.run(argv, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          **kw)


class Pki:
    """A CA and the certificates signed by it, made with the openssl tool: the control
    plane's (with the service-account signing keys), or another CA of its own (`cn`)."""

    def __init__(self, d, cn="kgpu-e2e-ca", service_account_keys=True):
        self.d = d
        os.makedirs(d, exist_ok=True)
        self.ca_crt, self.ca_key = self.p("ca.crt"), self.p("ca.key")
        _run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
              "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", self.ca_key, "-out",
              self.ca_crt, "-subj", "/CN=%s" % cn, "-days", "3",
              "-addext", "basicConstraints=critical,CA:TRUE",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"])
        if service_account_keys:
            # Service-account token signing: RSA, as every issuer supports it.
            self.sa_key, self.sa_pub = self.p("sa.key"), self.p("sa.pub")
            _run(["openssl", "genrsa", "-out", self.sa_key, "2048"])
            _run(["openssl", "rsa", "-in", self.sa_key, "-pubout", "-out", self.sa_pub])

    def p(self, name):
        return os.path.join(self.d, name)

    def issue(self, name, cn, orgs=(), sans=None, server=False):
        key, csr, crt, ext = (self.p(name + s) for s in (".key", ".csr", ".crt", ".ext"))
        subj = "".join("/O=%s" % o for o in orgs) + "/CN=%s" % cn
        _run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt",
              "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", csr,
              "-subj", subj])
        lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature",
                 "extendedKeyUsage=%s" % ("serverAuth" if server else "clientAuth")]
        if sans:
            lines.append("subjectAltName=" + ",".join(sans))
        with open(ext, "w") as f:
            f.write("\n".join(lines) + "\n")
        _run(["openssl", "x509", "-req", "-in", csr, "-CA", self.ca_crt, "-CAkey", self.ca_key,
              "-CAcreateserial", "-out", crt, "-days", "3", "-extfile", ext])
        return crt, key


def kubeconfig(path, server, ca, cert=None, key=None, token=None, user="user"):
    u = {}
    if cert:
        u = {"client-certificate": cert, "client-key": key}
    if token:
        u = {"token": token}
    doc = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "e2e", "cluster": {"server": server,
                                                    "certificate-authority": ca}}],
           "users": [{"name": user, "user": u}],
           "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
           "current-context": "e2e"}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)  # JSON is YAML: every client reads it
    return path


class ControlPlane:
    """etcd + kube-apiserver + kube-scheduler on loopback, in `workdir`."""

    def __init__(self, workdir, bindir, log=print):
        self.dir, self.bin, self.log = workdir, bindir, log
        os.makedirs(workdir, exist_ok=True)
        self.children = {}
        self.scheduler = None

    def tool(self, name):
        return os.path.join(self.bin, name)

    def start(self, apiserver_args=(), reachable=False):
        """reachable: the API server listens on every address and publishes this machine's
        (the `kubernetes` Service's endpoints, for kube-proxy), so that pods reach it at
        10.96.0.1:443 as in a cluster; otherwise on loopback only, with no endpoints."""
        t0 = time.monotonic()
        self.pki = Pki(os.path.join(self.dir, "pki"))
        self.api_port = free_port()
        self.server = "https://127.0.0.1:%d" % self.api_port
        self.reachable_ip = host_ip() if reachable else None
        if reachable and self.reachable_ip is None:
            raise RuntimeError("no non-loopback IPv4 address to publish the API server on")
        crt, key = self.pki.issue("apiserver", "kube-apiserver", server=True,
                                  sans=["IP:127.0.0.1", "DNS:localhost", "IP:10.96.0.1",
                                        "DNS:kubernetes", "DNS:kubernetes.default.svc"]
                                  + (["IP:" + self.reachable_ip] if reachable else []))
        self.admin_crt, self.admin_key = self.pki.issue("admin", "kgpu-e2e-admin",
                                                        orgs=["system:masters"])
        sched_crt, sched_key = self.pki.issue("scheduler", "system:kube-scheduler")
        # kube-apiserver's client certificate towards kubelets (logs, exec), for suites
        # that run a real kubelet; kubelets' serving certificates come from the same CA.
        kubelet_crt, kubelet_key = self.pki.issue("apiserver-kubelet-client",
                                                  "kube-apiserver-kubelet-client",
                                                  orgs=["system:masters"])
        self.admin_kubeconfig = kubeconfig(self.p("admin.kubeconfig"), self.server,
                                           self.pki.ca_crt, self.admin_crt, self.admin_key)
        self.scheduler_kubeconfig = kubeconfig(self.p("scheduler.kubeconfig"), self.server,
                                               self.pki.ca_crt, sched_crt, sched_key)
        etcd_port, peer_port = free_port(), free_port()
        self.etcd_url = "http://127.0.0.1:%d" % etcd_port
        self.spawn("etcd", [
            self.tool("etcd"), "--name", "e2e", "--data-dir", self.p("etcd-data"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", "http://127.0.0.1:%d" % peer_port,
            "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer_port,
            "--initial-cluster", "e2e=http://127.0.0.1:%d" % peer_port,
            "--unsafe-no-fsync", "--quota-backend-bytes", str(4 << 30),
            "--listen-metrics-urls", "http://127.0.0.1:%d" % free_port(),
            "--log-level", "warn"])
        if reachable:
            where = ["--bind-address", "0.0.0.0", "--advertise-address", self.reachable_ip]
        else:
            # No kube-apiserver Endpoints for 127.0.0.1 (validation forbids loopback there).
            where = ["--bind-address", "127.0.0.1", "--endpoint-reconciler-type", "none"]
        self.spawn("kube-apiserver", [
            self.tool("kube-apiserver"), "--etcd-servers", self.etcd_url,
            "--secure-port", str(self.api_port)] + where + [
            "--tls-cert-file", crt, "--tls-private-key-file", key,
            "--client-ca-file", self.pki.ca_crt,
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", self.pki.sa_pub,
            "--service-account-signing-key-file", self.pki.sa_key,
            "--service-cluster-ip-range", "10.96.0.0/16",
            "--authorization-mode", "Node,RBAC",
            "--kubelet-client-certificate", kubelet_crt, "--kubelet-client-key", kubelet_key,
            "--kubelet-certificate-authority", self.pki.ca_crt,
            # A node's name need not resolve; its InternalIP is what kubelet listens on.
            "--kubelet-preferred-address-types", "InternalIP,Hostname",
            "--audit-policy-file", self._audit_policy(), "--audit-log-path", self.p("audit.log"),
            "--audit-log-format", "json", "--audit-log-maxsize", "0",
            "--profiling=false", "--v", "1"] + list(apiserver_args))
        self.admin = Api("127.0.0.1", self.api_port, self.pki.ca_crt, self.admin_crt,
                         self.admin_key)

        def ready():
            self.check_alive()
            st, text = self.admin.raw("GET", "/readyz")
            return st == 200
        wait_for(ready, 120, "kube-apiserver /readyz", interval=0.2)
        # RBAC's bootstrap roles and the system priority classes come with readiness.
        wait_for(lambda: self.admin.try_get(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/system:kube-scheduler"),
            60, "bootstrap RBAC")
        self.log("control plane up in %.1f s (api %s)" % (time.monotonic() - t0, self.server))
        return self

    def p(self, name):
        return os.path.join(self.dir, name)

    def _audit_policy(self):
        """Lists and watches by kgpu's ServiceAccounts, so tests can see how kgpu asked, and
        the evictions they create (with the answer's code)."""
        path = self.p("audit-policy.yaml")
        with open(path, "w") as f:
            f.write("apiVersion: audit.k8s.io/v1\nkind: Policy\n"
                    "omitStages: [RequestReceived]\nrules:\n"
                    "  - level: Metadata\n    verbs: [list, watch]\n"
                    "    userGroups: [system:serviceaccounts:kgpu-system]\n"
                    "  - level: Metadata\n    verbs: [create]\n"
                    "    resources: [{group: \"\", resources: [pods/eviction]}]\n"
                    "    userGroups: [system:serviceaccounts:kgpu-system]\n"
                    "  - level: None\n")
        return path

    def audit_size(self):
        try:
            return os.path.getsize(self.p("audit.log"))
        except OSError:
            return 0

    def audit_events(self, offset=0):
        """Audit events written after byte `offset` (kube-apiserver writes them as it answers)."""
        out = []
        try:
            with open(self.p("audit.log"), "rb") as f:
                f.seek(offset)
                for line in f:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
        except OSError:
            pass
        return out

    def spawn(self, name, argv, env=None):
        c = harness.Child(argv, self.p(name + ".log"), env=env)
        self.children[name] = c
        return c

    def check_alive(self):
        for name, c in self.children.items():
            if name in ("etcd", "kube-apiserver") and not c.alive():
                raise RuntimeError("%s exited with %s:\n%s" % (name, c.proc.returncode,
                                                                c.log()[-3000:]))

    def kubectl(self, *args, kubeconfig_path=None, input=None, check=True):
        argv = [self.tool("kubectl"), "--kubeconfig", kubeconfig_path or self.admin_kubeconfig]
        argv += list(args)
        r = subprocess.run(argv, input=input, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=120)
        if check and r.returncode != 0:
            raise AssertionError("kubectl %s: exit %d\n%s%s" % (" ".join(args), r.returncode,
                                                               r.stdout, r.stderr))
        return r

    # -- objects ----------------------------------------------------------

    def ensure_namespace(self, ns, labels=None):
        if self.admin.try_get("/api/v1/namespaces/" + ns) is None:
            self.admin.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": ns,
                                                                "labels": labels or {}}})
        # No kube-controller-manager: the ServiceAccount admission plugin still wants `default`.
        # (Where one runs, it may make it first.)
        if self.admin.try_get("/api/v1/namespaces/%s/serviceaccounts/default" % ns) is None:
            try:
                self.admin.post("/api/v1/namespaces/%s/serviceaccounts" % ns,
                                {"apiVersion": "v1", "kind": "ServiceAccount",
                                 "metadata": {"name": "default"}})
            except ApiError as e:
                if e.status != 409:
                    raise

    def service_account_token(self, ns, name, seconds=7200, pod=None):
        """A token of ServiceAccount ns/name; given `pod` (a Pod object of ns), bound to
        it as kubelet's projected tokens are (then it names the pod's node)."""
        spec = {"expirationSeconds": seconds}
        if pod is not None:
            spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1",
                                      "name": pod["metadata"]["name"],
                                      "uid": pod["metadata"]["uid"]}
        doc = self.admin.post("/api/v1/namespaces/%s/serviceaccounts/%s/token" % (ns, name),
                              {"apiVersion": "authentication.k8s.io/v1",
                               "kind": "TokenRequest", "spec": spec})
        return doc["status"]["token"]

    def add_node(self, node):
        """Creates the Node; then does what the node lifecycle controller would once kubelet
        reports Ready: the TaintNodesByCondition admission plugin gives every new Node the
        node.kubernetes.io/not-ready:NoSchedule taint, and nothing here would remove it."""
        self.admin.post("/api/v1/nodes", node)
        path = "/api/v1/nodes/" + node["metadata"]["name"]
        return self.admin.merge_patch(path, {"spec": {"taints": None}})

    def create_pod(self, pod):
        return self.admin.post(pod_path(pod["metadata"]["namespace"]), pod)

    def get_pod(self, ns, name):
        return self.admin.try_get(pod_path(ns, name))

    def wait_phase(self, ns, name, phases=("Succeeded",), timeout=90, component=None):
        """Waits for pod ns/name to reach one of `phases` and returns it; one that Failed
        when that was not asked for fails at once. On a failure the pod's status, its events
        and the last log lines of `component` ((name, log_tail callable), the node's kgpu
        part) say why."""
        def done():
            p = self.get_pod(ns, name)
            ph = p and p.get("status", {}).get("phase")
            if ph == "Failed" and "Failed" not in phases:
                raise AssertionError("pod %s failed: %s" % (name, json.dumps(p["status"])[:1500]))
            return p if ph in phases else None
        try:
            return wait_for(done, timeout, "pod %s in %s" % (name, phases), interval=0.3)
        except AssertionError as e:
            p = self.get_pod(ns, name)
            tail = "\n%s log:\n%s" % (component[0], component[1](15)) if component else ""
            raise AssertionError("%s\nstatus: %s\nevents: %s%s" % (
                e, json.dumps((p or {}).get("status"))[:1500],
                [ev.get("message") for ev in self.events_for(ns, name)], tail))

    def publish_root_ca(self, ns):
        """The kube-root-ca.crt ConfigMap of namespace ns, which kube-controller-manager (not
        run by the suites) publishes and a pod's service account token volume needs."""
        path = "/api/v1/namespaces/%s/configmaps" % ns
        if self.admin.try_get(path + "/kube-root-ca.crt") is None:
            with open(self.pki.ca_crt) as f:
                self.admin.post(path, {"apiVersion": "v1", "kind": "ConfigMap",
                                       "metadata": {"name": "kube-root-ca.crt"},
                                       "data": {"ca.crt": f.read()}})

    def drop_claim(self, path):
        """Deletes the ResourceClaim at `path` as kube-controller-manager's resourceclaim
        controller (which the suites do not run) lets it go once its pods are gone: the
        reservation and allocation dropped, then the finalizer kube-scheduler put on it."""
        if self.admin.try_get(path) is None:
            return
        self.admin.delete(path)
        c = self.admin.try_get(path)
        if c is not None and c.get("status"):
            self.admin.req("PUT", path + "/status", dict(c, status={}))
        if self.admin.try_get(path) is not None:
            self.admin.merge_patch(path, {"metadata": {"finalizers": None}})
        wait_for(lambda: self.admin.try_get(path) is None, 30, "%s to go" % path)

    def delete_pod(self, ns, name, force=True):
        """As a kubelet would finish it: with no kubelet, a bound pod needs grace 0."""
        return self.admin.delete(pod_path(ns, name), grace=0 if force else None)

    def events_for(self, ns, name):
        q = urllib.parse.quote("involvedObject.name=%s" % name)
        return self.admin.get("/api/v1/namespaces/%s/events?fieldSelector=%s" % (ns, q))["items"]

    # -- kube-scheduler ---------------------------------------------------

    def start_scheduler(self, config_text, extender_url=None, extra=(), name="kube-scheduler"):
        """kube-scheduler with the given KubeSchedulerConfiguration, changing only addresses
        and file paths: clientConnection.kubeconfig, and the host and port of each
        extender's urlPrefix (its scheme stays: https in the shipped file). Other file
        paths (tlsConfig's) are the caller's to point at this machine's copies."""
        text = re.sub(r"(?m)^(\s*kubeconfig:\s*).*$",
                      lambda m: m.group(1) + self.scheduler_kubeconfig, config_text)
        if extender_url:
            netloc = urllib.parse.urlsplit(extender_url).netloc

            def readdress(m):
                old = urllib.parse.urlsplit(m.group(2).strip("'\""))
                return m.group(1) + urllib.parse.urlunsplit(old._replace(netloc=netloc))
            text, n = re.subn(r"(?m)^(\s*-?\s*urlPrefix:\s*)(\S+)\s*$", readdress, text)
            if n == 0:
                raise AssertionError("the scheduler configuration has no urlPrefix")
        path = self.p(name + "-config.yaml")
        with open(path, "w") as f:
            f.write(text)
        self.scheduler_config_text = text
        port = free_port()
        self.scheduler = self.spawn(name, [
            self.tool("kube-scheduler"), "--config", path,
            "--authentication-kubeconfig", self.scheduler_kubeconfig,
            "--authorization-kubeconfig", self.scheduler_kubeconfig,
            "--bind-address", "127.0.0.1", "--secure-port", str(port), "--v", "2"]
            + list(extra))
        self.scheduler_port = port

        wait_healthz(self.scheduler, port, "kube-scheduler")
        return self.scheduler

    # -- kube-controller-manager and kube-proxy (the install suite) -------------

    def start_controller_manager(self, controllers=None):
        """kube-controller-manager with the controllers a cluster runs by default
        (Deployments, DaemonSets, ReplicaSets, EndpointSlices, namespaces, garbage
        collection, ServiceAccounts, the kube-root-ca.crt publisher, ...), as the admin;
        or only `controllers` (its --controllers names): where Nodes have no kubelet, the
        node lifecycle controller would taint them unreachable and evict their pods."""
        port = free_port()
        c = self.spawn("kube-controller-manager", [
            self.tool("kube-controller-manager"), "--kubeconfig", self.admin_kubeconfig,
            "--authentication-kubeconfig", self.admin_kubeconfig,
            "--authorization-kubeconfig", self.admin_kubeconfig,
            "--root-ca-file", self.pki.ca_crt,
            "--service-account-private-key-file", self.pki.sa_key,
            "--use-service-account-credentials=false", "--leader-elect=false",
            "--bind-address", "127.0.0.1", "--secure-port", str(port),
            "--concurrent-deployment-syncs", "2", "--v", "1"]
            + (["--controllers", ",".join(controllers)] if controllers else []))
        wait_healthz(c, port, "kube-controller-manager")
        return c

    def start_proxy(self, node_name, cluster_cidr):
        """kube-proxy in nftables mode for node `node_name`: cluster IPs reach their
        endpoints from pods (its table `kube-proxy`, removed by stop_proxy). Its identity
        is system:kube-proxy, whom the bootstrap policy gives system:node-proxier."""
        crt, key = self.pki.issue("kube-proxy", "system:kube-proxy")
        kc = kubeconfig(self.p("kube-proxy.kubeconfig"), self.server, self.pki.ca_crt, crt, key)
        conf = self.p("kube-proxy-config.yaml")
        with open(conf, "w") as f:
            f.write("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                    "kind: KubeProxyConfiguration\n"
                    "mode: nftables\n"
                    "clientConnection: {kubeconfig: %s}\n"
                    "hostnameOverride: %s\n"
                    "clusterCIDR: %s\n"
                    "healthzBindAddress: 127.0.0.1:%d\n"
                    "metricsBindAddress: 127.0.0.1:%d\n"
                    # Leave this machine's conntrack settings alone.
                    "conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s,"
                    " tcpCloseWaitTimeout: 0s}\n"
                    % (kc, node_name, cluster_cidr, free_port(), free_port()))
        self.proxy = self.spawn("kube-proxy", [self.tool("kube-proxy"), "--config", conf,
                                               "--v", "1"])
        return self.proxy

    def stop_proxy(self):
        """Stops kube-proxy and removes its nftables tables, whatever state it left."""
        c = self.children.pop("kube-proxy", None)
        if c is not None:
            c.stop()
        remove_proxy_tables()

    def stop_scheduler(self):
        if self.scheduler is not None:
            self.scheduler.stop()
            self.children = {k: v for k, v in self.children.items() if v is not self.scheduler}
            self.scheduler = None

    def stop(self):
        for name in reversed(list(self.children)):
            self.children[name].stop()
        self.children.clear()

