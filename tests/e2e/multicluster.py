"""Several clusters on one machine: Kueue's MultiKueue with kgpu as its dispatcher.

- Kueue: Kueue's manager (`kueue`, built by scripts/upstream.sh at its pinned
  version, with its CustomResourceDefinitions) run as a process against one
  control plane, as its Deployment would run it: its Configuration file,
  the webhook's serving certificate in a folder of its own (internal
  certificate management off: no Service routes to it here, and no webhook
  configuration is registered, so Jobs are created already suspended), the
  admin's kubeconfig, leader election and the visibility server off.
- Worker: a control plane with kgpu installed from its chart, the extender
  as a process (kgpu_deploy.Extender, HTTPS with client certificates, as
  shipped), kube-scheduler calling it, kube-controller-manager (its Job
  controller makes the pods; no node lifecycle controller, which would taint
  Nodes without a kubelet unreachable), Node objects of one GPU mix, and Kueue with a
  ClusterQueue that covers its GPUs.
- Manager: a control plane with Kueue configured for MultiKueue with an
  external dispatcher, a MultiKueueCluster per worker (its kubeconfig in a
  Secret, every file in it embedded, as Kueue requires), and kgpu-dispatcher
  as its ServiceAccount with deploy/dispatcher's RBAC.
"""

import base64
import json
import os
import subprocess

import cluster
import kgpu_deploy
from cluster import CORE, MEM, WHOLE, free_port, wait_for

KUEUE_NS = "kueue-system"
# Kueue reads its metrics server's certificate from this fixed folder when its internal
# certificate management is off (cmd/kueue/main.go), and exits without one. Each Kueue
# gets one there in a mount namespace of its own (metrics_cert_argv): nothing on this
# machine's /etc changes, whoever runs the suite, and nothing is left behind however the
# process ends.
METRICS_CERT_DIR = "/etc/kueue/metrics/certs"
# In its namespace: a tmpfs on the scratch folder $O holding kueue/metrics/certs, laid over
# /etc (overlayfs, /etc itself the lower layer), then Kueue in place of the shell.
_OVERLAY_ETC = ('set -e; mount -t tmpfs tmpfs "$O"; mkdir -p "$O/u/kueue/metrics/certs" "$O/w"; '
                'cp "$CRT" "$O/u/kueue/metrics/certs/tls.crt"; '
                'cp "$KEY" "$O/u/kueue/metrics/certs/tls.key"; '
                'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$O/u,workdir=$O/w" /etc; '
                'exec "$@"')


def metrics_cert_argv(cp, argv, env):
    """argv run in a private mount namespace where METRICS_CERT_DIR holds a serving
    certificate of cp's CA; as root a mount namespace, otherwise a user namespace with one
    (unprivileged overlayfs: Linux 5.11 and later). Sets what the shell reads in env."""
    crt, key = cp.pki.issue("kueue-metrics", "kueue-metrics", server=True,
                            sans=["IP:127.0.0.1", "DNS:localhost"])
    over = cp.p("kueue-etc-overlay")
    os.makedirs(over, exist_ok=True)
    env.update(O=over, CRT=crt, KEY=key)
    ns = ["--mount"] if os.geteuid() == 0 else ["--user", "--map-root-user", "--mount"]
    return (["unshare"] + ns + ["--propagation", "private", "sh", "-c", _OVERLAY_ETC, "kueue"]
            + list(argv))


TEAM_NS = "team-a"
DISPATCHER_NAME = "kgpu.io/dispatcher"
GPU_RESOURCES = ("cpu", "memory", WHOLE, CORE, MEM)


def embedded_kubeconfig(cp):
    """The admin's kubeconfig with every file embedded (MultiKueue refuses file paths)."""
    def b64(path):
        with open(path, "rb") as f:
            return base64.b64encode(f.read()).decode()
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {
            "server": cp.server, "certificate-authority-data": b64(cp.pki.ca_crt)}}],
        "users": [{"name": "u", "user": {"client-certificate-data": b64(cp.admin_crt),
                                         "client-key-data": b64(cp.admin_key)}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]})


class Kueue:
    """Kueue's manager against control plane `cp`."""

    def __init__(self, cp, kueue_dir, dispatcher=None):
        self.cp = cp
        crds = os.path.join(kueue_dir, "crds")
        cp.kubectl("apply", "--server-side", "-f", crds)
        for f in sorted(os.listdir(crds)):
            with open(os.path.join(crds, f)) as fh:
                for line in fh:
                    if line.startswith("  name: "):
                        name = line.split()[1]
                        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                                   "crd/" + name)
                        break
        cp.ensure_namespace(KUEUE_NS)
        cert_dir = cp.p("kueue-certs")
        os.makedirs(cert_dir, exist_ok=True)
        crt, key = cp.pki.issue("kueue-webhook", "kueue-webhook", server=True,
                                sans=["IP:127.0.0.1", "DNS:localhost"])
        for src, dst in ((crt, "tls.crt"), (key, "tls.key")):
            with open(src) as a, open(os.path.join(cert_dir, dst), "w") as b:
                b.write(a.read())
        self.health_port = free_port()
        lines = ["apiVersion: config.kueue.x-k8s.io/v1beta2", "kind: Configuration",
                 "namespace: %s" % KUEUE_NS,
                 "health: {healthProbeBindAddress: '127.0.0.1:%d'}" % self.health_port,
                 "metrics: {bindAddress: '127.0.0.1:%d'}" % free_port(),
                 "webhook: {port: %d, host: 127.0.0.1, certDir: '%s'}" % (free_port(), cert_dir),
                 "leaderElection: {leaderElect: false}",
                 "internalCertManagement: {enable: false}",
                 "manageJobsWithoutQueueName: false",
                 "integrations: {frameworks: [batch/job]}"]
        if dispatcher:
            lines.append("multiKueue: {dispatcherName: '%s', gcInterval: 5s, "
                         "origin: kgpu-e2e}" % dispatcher)
        self.config = cp.p("kueue-config.yaml")
        with open(self.config, "w") as f:
            f.write("\n".join(lines) + "\n")
        env = dict(os.environ, KUBECONFIG=cp.admin_kubeconfig)
        self.child = cp.spawn("kueue", metrics_cert_argv(cp, [
            os.path.join(kueue_dir, "kueue"), "--config", self.config,
            "--feature-gates", "VisibilityOnDemand=false", "--zap-log-level", "3"], env), env=env)

        def healthy():
            if not self.child.alive():
                raise RuntimeError("kueue exited:\n" + self.child.log_tail(40))
            r = subprocess.run(["curl", "-sf", "http://127.0.0.1:%d/readyz" % self.health_port],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return r.returncode == 0
        wait_for(healthy, 120, "kueue /readyz", interval=0.3)

    def log_tail(self, n=40):
        return self.child.log_tail(n)

    def queues(self, admission_check=None):
        """ResourceFlavor, a ClusterQueue covering GPUs (with the check, on the manager), and
        the LocalQueue `lq` of TEAM_NS."""
        api, k = self.cp.admin, "/apis/kueue.x-k8s.io/v1beta2/"
        self.cp.ensure_namespace(TEAM_NS)
        api.post(k + "resourceflavors", {"apiVersion": "kueue.x-k8s.io/v1beta2",
                                         "kind": "ResourceFlavor",
                                         "metadata": {"name": "default"}})
        spec = {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": list(GPU_RESOURCES),
            "flavors": [{"name": "default", "resources": [
                {"name": r, "nominalQuota": "100000"} for r in GPU_RESOURCES]}]}]}
        if admission_check:
            spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": admission_check}]}
        api.post(k + "clusterqueues", {"apiVersion": "kueue.x-k8s.io/v1beta2",
                                       "kind": "ClusterQueue", "metadata": {"name": "cq"},
                                       "spec": spec})
        api.post(k + "namespaces/%s/localqueues" % TEAM_NS, {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": "lq", "namespace": TEAM_NS}, "spec": {"clusterQueue": "cq"}})


class Worker:
    """A worker cluster: kgpu and Kueue on a control plane with GPU nodes."""

    def __init__(self, name, workdir, bindir, build, kueue_dir, nodes, log=print):
        self.name = name
        self.cp = cluster.ControlPlane(os.path.join(workdir, name), bindir, log=log).start()
        try:
            self._bring_up(build, kueue_dir, nodes)
        except BaseException:
            self.stop()
            raise

    def _bring_up(self, build, kueue_dir, nodes):
        cp = self.cp
        sched, ext = kgpu_deploy.install(cp, build, values=[
            # No kubelet and no device plugin: no pod is ever marked kgpu.io/allocated.
            "extender.config.allocateWaitSeconds=0"])
        self.models = {}
        for n in nodes:
            cp.add_node(n)
            self.models[n["metadata"]["name"]] = json.loads(
                n["metadata"]["annotations"]["kgpu.io/gpus"])[0]["model"]
        self.ext = kgpu_deploy.Extender(cp, build, ext, name="kgpu-extender-" + self.name,
                                        extra=["--cluster-name", self.name])
        self.ext.start()
        wait_for(self.ext.ready, 60, "%s: the extender's /readyz" % self.name)
        self.vip = kgpu_deploy.ServiceVip(cp, [self.ext], publish_ip=cluster.host_ip())
        self.vip.wait_ready(self.ext)
        cp.start_scheduler(sched, extender_url=self.vip.url)
        # The Job controller makes the pods; no node lifecycle controller (no kubelets).
        cp.start_controller_manager(controllers=["job-controller",
                                                 "garbage-collector-controller"])
        self.kueue = Kueue(cp, kueue_dir)
        self.kueue.queues()

    def cluster_entry(self):
        """This worker in kgpu-dispatcher's clusters file."""
        tls = self.cp.kgpu_tls
        return ("  - name: %s\n    extender: %s\n    ca: %s\n    cert: %s\n    key: %s\n"
                % (self.name, self.ext.url, tls.ca, tls.harness_crt, tls.harness_key))

    def pods_of(self, job):
        q = "labelSelector=" + "batch.kubernetes.io/job-name%3D" + job
        return self.cp.admin.get("/api/v1/namespaces/%s/pods?%s" % (TEAM_NS, q))["items"]

    def stop(self):
        if getattr(self, "vip", None):
            self.vip.stop()
        self.cp.stop()


class Manager:
    """The manager cluster: Kueue with MultiKueue waiting for kgpu-dispatcher."""

    def __init__(self, workdir, bindir, kueue_dir, workers, log=print):
        self.cp = cluster.ControlPlane(os.path.join(workdir, "manager"), bindir, log=log).start()
        try:
            self.kueue = Kueue(self.cp, kueue_dir, dispatcher=DISPATCHER_NAME)
            api, k = self.cp.admin, "/apis/kueue.x-k8s.io/v1beta2/"
            for w in workers:
                self.add_cluster(w)
            api.post(k + "multikueueconfigs", {
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueConfig",
                "metadata": {"name": "mk-config"},
                "spec": {"clusters": [w.name for w in workers]}})
            api.post(k + "admissionchecks", {
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
                "metadata": {"name": "mk"},
                "spec": {"controllerName": "kueue.x-k8s.io/multikueue",
                         "parameters": {"apiGroup": "kueue.x-k8s.io",
                                        "kind": "MultiKueueConfig", "name": "mk-config"}}})
            self.kueue.queues(admission_check="mk")
            for w in workers:
                wait_for(lambda w=w: self.cluster_active(w.name), 60,
                         "MultiKueueCluster %s Active" % w.name)
        except BaseException:
            self.cp.stop()
            raise
        self.dispatcher = None

    def add_cluster(self, w):
        api, k = self.cp.admin, "/apis/kueue.x-k8s.io/v1beta2/"
        api.post("/api/v1/namespaces/%s/secrets" % KUEUE_NS, {
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": w.name + "-kubeconfig", "namespace": KUEUE_NS},
            "stringData": {"kubeconfig": embedded_kubeconfig(w.cp)}})
        api.post(k + "multikueueclusters", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueCluster",
            "metadata": {"name": w.name},
            "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret",
                                                      "location": w.name + "-kubeconfig"}}}})

    def cluster_active(self, name):
        mkc = self.cp.admin.try_get("/apis/kueue.x-k8s.io/v1beta2/multikueueclusters/" + name)
        for c in ((mkc or {}).get("status") or {}).get("conditions") or []:
            if c.get("type") == "Active":
                return c.get("status") == "True"
        return False

    def dispatcher_kubeconfig(self):
        """kgpu-dispatcher's identity: its ServiceAccount with deploy/dispatcher's RBAC, as
        its Deployment runs it (so the suite fails if the RBAC misses a right)."""
        self.cp.ensure_namespace("kgpu-system")
        self.cp.kubectl("apply", "-k", os.path.join(cluster.REPO, "deploy", "dispatcher"))
        token = self.cp.service_account_token("kgpu-system", "kgpu-dispatcher")
        return cluster.kubeconfig(self.cp.p("dispatcher.kubeconfig"), self.cp.server,
                                  self.cp.pki.ca_crt, token=token, user="kgpu-dispatcher")

    def start_dispatcher(self, build, workers, extra=()):
        kc = self.dispatcher_kubeconfig()
        path = self.cp.p("clusters.yaml")
        with open(path, "w") as f:
            f.write("clusters:\n" + "".join(w.cluster_entry() for w in workers))
        self.metrics_port = free_port()
        self.dispatcher = self.cp.spawn("kgpu-dispatcher", [
            os.path.join(build, "kgpu-dispatcher"), "--kubeconfig", kc,
            "--clusters", path, "--interval", "0.5", "--log-level", "debug",
            "--listen", "127.0.0.1:%d" % self.metrics_port] + list(extra))
        return self.dispatcher

    def stop_dispatcher(self):
        if self.dispatcher is not None:
            self.dispatcher.stop()
            self.cp.children.pop("kgpu-dispatcher", None)
            self.dispatcher = None

    def create_job(self, name, limits, pods=1, annotations=None, labels=None):
        lim = {k: str(v) for k, v in limits.items()}
        tmpl_meta = {"labels": dict(labels or {}), "annotations": dict(annotations or {})}
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": name, "namespace": TEAM_NS,
                            "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
               "spec": {"managedBy": "kueue.x-k8s.io/multikueue", "suspend": True,
                        "parallelism": pods, "completions": pods,
                        "template": {"metadata": tmpl_meta, "spec": {
                            "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                            "automountServiceAccountToken": False,
                            "containers": [{"name": "main",
                                            "image": "registry.invalid/kgpu-e2e:none",
                                            "resources": {"limits": lim,
                                                          "requests": dict(lim, cpu="10m")}}]}}}}
        return self.cp.admin.post("/apis/batch/v1/namespaces/%s/jobs" % TEAM_NS, job)

    def workload_of(self, job):
        items = self.cp.admin.get("/apis/kueue.x-k8s.io/v1beta2/namespaces/%s/workloads"
                                  % TEAM_NS)["items"]
        for w in items:
            for o in w["metadata"].get("ownerReferences") or []:
                if o.get("kind") == "Job" and o.get("name") == job:
                    return w
        return None

    def stop(self):
        self.cp.stop()


def delete_jobs(cp, namespace=TEAM_NS):
    """Every Job of the namespace and its pods, at once (no kubelet finishes them)."""
    api = cp.admin
    for j in api.get("/apis/batch/v1/namespaces/%s/jobs" % namespace)["items"]:
        api.req("DELETE", "/apis/batch/v1/namespaces/%s/jobs/%s" % (namespace,
                                                                   j["metadata"]["name"]),
                {"propagationPolicy": "Background", "gracePeriodSeconds": 0},
                ok=(200, 202, 404))
    for p in api.get("/api/v1/namespaces/%s/pods" % namespace)["items"]:
        cp.delete_pod(namespace, p["metadata"]["name"])
    for w in api.get("/apis/kueue.x-k8s.io/v1beta2/namespaces/%s/workloads"
                     % namespace)["items"]:
        path = "/apis/kueue.x-k8s.io/v1beta2/namespaces/%s/workloads/%s" % (
            namespace, w["metadata"]["name"])
        if w["metadata"].get("finalizers"):
            api.merge_patch(path, {"metadata": {"finalizers": None}})
        api.delete(path)
    wl = "/apis/kueue.x-k8s.io/v1beta2/namespaces/%s/workloads" % namespace
    wait_for(lambda: not api.get("/api/v1/namespaces/%s/pods" % namespace)["items"] and
             not api.get("/apis/batch/v1/namespaces/%s/jobs" % namespace)["items"] and
             not api.get(wl)["items"], 60, "jobs, pods and workloads of %s gone" % namespace)


def kueue_dir(bindir):
    """Kueue's folder beside the other upstream tools (scripts/upstream.sh --kueue-dir)."""
    for name in sorted(os.listdir(bindir)):
        if name.startswith("kueue-") and os.access(os.path.join(bindir, name, "kueue"), os.X_OK):
            return os.path.join(bindir, name)
    return None

