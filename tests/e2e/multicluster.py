"""Kueue MultiKueue on loopback: a manager and worker control planes, for the multicluster suite.

Each cluster is a cluster.ControlPlane (etcd + kube-apiserver). Every cluster
runs the real Kueue (scripts/upstream.sh builds it, its CRDs beside it) as a
process; each worker also runs kube-scheduler with kgpu's extender (installed
from the Helm chart as the control-plane suite does), kube-controller-manager
(its Job controller makes the pods) and Node objects of fake GPU nodes. The
manager runs MultiKueue with an external dispatcher name, so nothing is sent
to a worker until something writes the manager Workload's
status.nominatedClusterNames.

No Kueue webhook is registered with any API server (the webhook server runs,
on a certificate of its own, but nothing calls it): tests create Jobs already
suspended, with the queue label and, on the manager, spec.managedBy.
"""

import base64
import json
import os
import time
import urllib.request

import cluster
import harness
import kgpu_deploy
from cluster import wait_for

KUEUE_NS = "kueue-system"
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
DISPATCHER = "kgpu.io/dispatcher"
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
LOCAL_QUEUE, CLUSTER_QUEUE, FLAVOR = "gpu", "gpu", "default"
GPU_RESOURCES = (cluster.WHOLE, cluster.CORE, cluster.MEM)


def kueue_dir(bindir):
    """Kueue's folder in the upstream bin dir (scripts/upstream.sh --kueue-bin)."""
    names = sorted(n for n in os.listdir(bindir) if n.startswith("kueue-"))
    if not names:
        raise RuntimeError("no kueue-* folder in %s: run scripts/upstream.sh" % bindir)
    return os.path.join(bindir, names[-1])


def inline_kubeconfig(path, cp, user):
    """A kubeconfig with every credential inline, as MultiKueue's Secret must hold (Kueue
    refuses file paths there): a client certificate of the worker's CA in group
    system:masters."""
    crt, key = cp.pki.issue(user, user, orgs=("system:masters",))

    def b64(p):
        with open(p, "rb") as f:
            return base64.b64encode(f.read()).decode()
    doc = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "worker", "cluster": {
               "server": cp.server, "certificate-authority-data": b64(cp.pki.ca_crt)}}],
           "users": [{"name": user, "user": {"client-certificate-data": b64(crt),
                                             "client-key-data": b64(key)}}],
           "contexts": [{"name": "worker", "context": {"cluster": "worker", "user": user}}],
           "current-context": "worker"}
    text = json.dumps(doc, indent=1)
    with open(path, "w") as f:
        f.write(text)
    return text


class Kueue:
    """One Kueue controller manager as a process, on `cp`'s API server as the admin."""

    def __init__(self, cp, kdir, dispatcher=None, feature_gates=None):
        self.cp, self.kdir = cp, kdir
        self.dispatcher, self.feature_gates = dispatcher, dict(feature_gates or {})
        self.child = None

    def install_crds(self):
        """Kueue's CRDs (created, not applied: the Workload CRD is past the size of
        client-side apply's annotation), then kueue-system; waits until they serve."""
        crds = os.path.join(self.kdir, "crds")
        self.cp.kubectl("create", "-f", crds)
        self.cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", crds)
        self.cp.ensure_namespace(KUEUE_NS)

    def start(self):
        cp = self.cp
        d = cp.p("kueue")
        certs = os.path.join(d, "certs")
        os.makedirs(certs, exist_ok=True)
        # The webhook server's own serving certificate, under the names controller-runtime
        # reads from certDir (tls.crt, tls.key).
        pki = cluster.Pki(os.path.join(d, "pki"), cn="kueue-webhook-ca",
                          service_account_keys=False)
        crt, key = pki.issue("webhook", "kueue-webhook-service.kueue-system.svc", server=True,
                             sans=["DNS:kueue-webhook-service.kueue-system.svc",
                                   "IP:127.0.0.1"])
        os.replace(crt, os.path.join(certs, "tls.crt"))
        os.replace(key, os.path.join(certs, "tls.key"))
        self.health_port = cluster.free_port()
        gates = dict(self.feature_gates)
        # Its visibility API server would want a port and delegated authentication.
        gates.setdefault("VisibilityOnDemand", False)
        conf = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
            "namespace": KUEUE_NS, "manageJobsWithoutQueueName": False,
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": cluster.free_port(), "certDir": certs},
            "metrics": {"bindAddress": "127.0.0.1:%d" % cluster.free_port()},
            "health": {"healthProbeBindAddress": "127.0.0.1:%d" % self.health_port},
            "leaderElection": {"leaderElect": False},
            "integrations": {"frameworks": ["batch/job"]},
            "featureGates": gates,
        }
        if self.dispatcher:
            conf["multiKueue"] = {"dispatcherName": self.dispatcher,
                                  # A lost worker's workloads go back to the queue soon.
                                  "workerLostTimeout": "30s"}
        path = os.path.join(d, "config.yaml")
        with open(path, "w") as f:
            json.dump(conf, f, indent=1)
        env = dict(os.environ, KUBECONFIG=cp.admin_kubeconfig)
        # Without internal certificate management Kueue v0.17 reads its metrics serving
        # certificate from the fixed path /etc/kueue/metrics/certs and exits without one.
        # It gets one there in a private mount namespace: /etc overlaid, in that
        # namespace only, by a tmpfs holding kueue/metrics/certs (nothing on this machine's
        # /etc changes; the namespace ends with the process).
        crt, key = pki.issue("metrics", "kueue-metrics", server=True, sans=["IP:127.0.0.1"])
        over = os.path.join(d, "etc-overlay")
        os.makedirs(over, exist_ok=True)
        script = ('set -e; mount -t tmpfs tmpfs "$O"; mkdir -p "$O/u/kueue/metrics/certs" "$O/w"; '
                  'cp "$CRT" "$O/u/kueue/metrics/certs/tls.crt"; '
                  'cp "$KEY" "$O/u/kueue/metrics/certs/tls.key"; '
                  'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$O/u,workdir=$O/w" /etc; '
                  'exec "$@"')
        env.update(O=over, CRT=crt, KEY=key)
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "kueue",
                os.path.join(self.kdir, "kueue"), "--config", path, "--zap-log-level", "3"]
        self.child = harness.Child(argv, cp.p("kueue.log"), env=env)
        cp.children["kueue"] = self.child
        url = "http://127.0.0.1:%d/readyz" % self.health_port
        deadline = time.monotonic() + 90
        while True:
            if not self.child.alive():
                raise RuntimeError("kueue on %s exited:\n%s" % (cp.server,
                                                                self.child.log()[-3000:]))
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("kueue on %s not ready after 90 s:\n%s" % (
                    cp.server, self.child.log()[-3000:]))
            time.sleep(0.3)
        return self

    def log(self):
        return self.child.log() if self.child else ""


def queue_objects(quota, admission_check=None):
    """ResourceFlavor, ClusterQueue (quota: {resource: amount}) and its LocalQueue in
    cluster.E2E_NS, all named as the manager's and workers' must match."""
    cq = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
          "metadata": {"name": CLUSTER_QUEUE},
          "spec": {"namespaceSelector": {},
                   "resourceGroups": [{
                       "coveredResources": sorted(quota),
                       "flavors": [{"name": FLAVOR, "resources": [
                           {"name": r, "nominalQuota": str(quota[r])}
                           for r in sorted(quota)]}]}]}}
    if admission_check:
        cq["spec"]["admissionChecksStrategy"] = {
            "admissionChecks": [{"name": admission_check}]}
    return [
        ("/resourceflavors", {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                              "metadata": {"name": FLAVOR}, "spec": {}}),
        ("/clusterqueues", cq),
        ("/namespaces/%s/localqueues" % cluster.E2E_NS,
         {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
          "metadata": {"name": LOCAL_QUEUE, "namespace": cluster.E2E_NS},
          "spec": {"clusterQueue": CLUSTER_QUEUE}}),
    ]


def create_all(cp, objs):
    for path, obj in objs:
        cp.admin.post(KUEUE_API + path, obj)


class Worker:
    """A worker cluster: control plane, kgpu's extender behind kube-scheduler,
    kube-controller-manager, fake GPU nodes, Kueue with a queue covering its GPUs."""

    def __init__(self, name, workdir, bindir, build, nodes, log=print):
        self.name, self.build, self.nodes, self.log = name, build, nodes, log
        self.cp = cluster.ControlPlane(workdir, bindir, log=log)
        self.kdir = kueue_dir(bindir)
        self.ext = None

    def capacity(self):
        """{resource: total} of its nodes' GPUs."""
        tot = {r: 0 for r in GPU_RESOURCES}
        for node in self.nodes:
            alloc = node["status"]["allocatable"]
            for r in GPU_RESOURCES:
                tot[r] += int(alloc[r])
        return tot

    def start(self):
        cp = self.cp.start()
        sched, ext_config = kgpu_deploy.install(cp, self.build, values=[
            # No kubelet or device plugin: nothing would mark a pod allocated.
            "extender.config.allocateWaitSeconds=0"])
        cp.ensure_namespace(cluster.E2E_NS)
        for node in self.nodes:
            cp.add_node(node)
        self.ext = kgpu_deploy.Extender(cp, self.build, ext_config,
                                        name="kgpu-extender-%s" % self.name)
        self.ext.start()
        wait_for(self.ext.ready, 60, "%s extender /readyz" % self.name)
        cp.start_scheduler(sched, extender_url=self.ext.url)
        cp.start_controller_manager()
        self.kueue = Kueue(cp, self.kdir)
        self.kueue.install_crds()
        self.kueue.start()
        quota = dict(self.capacity(), cpu="1000", memory="4Ti")
        create_all(cp, queue_objects(quota))
        return self

    def stop(self):
        self.cp.stop()


class Manager:
    """The manager cluster: control plane and Kueue with MultiKueue and an external
    dispatcher name; one ClusterQueue whose admission check sends to `workers`."""

    def __init__(self, workdir, bindir, log=print, feature_gates=None):
        self.cp = cluster.ControlPlane(workdir, bindir, log=log)
        self.kdir = kueue_dir(bindir)
        self.feature_gates = feature_gates

    def start(self, workers):
        cp = self.cp.start()
        self.kueue = Kueue(cp, self.kdir, dispatcher=DISPATCHER,
                           feature_gates=self.feature_gates)
        self.kueue.install_crds()
        cp.ensure_namespace(cluster.E2E_NS)
        for w in workers:
            text = inline_kubeconfig(cp.p("kubeconfig-%s" % w.name), w.cp,
                                     "multikueue-%s" % w.name)
            cp.admin.post("/api/v1/namespaces/%s/secrets" % KUEUE_NS, {
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "kubeconfig-%s" % w.name, "namespace": KUEUE_NS},
                "data": {"kubeconfig": base64.b64encode(text.encode()).decode()}})
            cp.admin.post(KUEUE_API + "/multikueueclusters", {
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueCluster",
                "metadata": {"name": w.name},
                "spec": {"clusterSource": {"kubeConfig": {
                    "locationType": "Secret", "location": "kubeconfig-%s" % w.name}}}})
        cp.admin.post(KUEUE_API + "/multikueueconfigs", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueConfig",
            "metadata": {"name": "workers"},
            "spec": {"clusters": [w.name for w in workers]}})
        cp.admin.post(KUEUE_API + "/admissionchecks", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
            "metadata": {"name": "multikueue"},
            "spec": {"controllerName": MULTIKUEUE_CONTROLLER,
                     "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig",
                                    "name": "workers"}}})
        quota = {r: 0 for r in GPU_RESOURCES}
        for w in workers:
            for r, v in w.capacity().items():
                quota[r] += v
        quota.update(cpu="1000", memory="4Ti")
        self.kueue.start()
        create_all(cp, queue_objects(quota, admission_check="multikueue"))
        # Kueue marks the clusters Active once it has connected to them.
        for w in workers:
            wait_for(lambda w=w: self.cluster_active(w.name), 90,
                     "MultiKueueCluster %s Active" % w.name, interval=0.5)
        return self

    def cluster_active(self, name):
        mk = self.cp.admin.get(KUEUE_API + "/multikueueclusters/" + name)
        for c in (mk.get("status") or {}).get("conditions") or []:
            if c["type"] == "Active":
                return c["status"] == "True"
        return False

    # -- workloads ----------------------------------------------------------

    def workload_for(self, job_name, ns=cluster.E2E_NS):
        """The manager's Workload of Job ns/job_name (owned by it), or None."""
        for wl in self.cp.admin.get(KUEUE_API + "/namespaces/%s/workloads" % ns)["items"]:
            for ref in wl["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == "Job" and ref.get("name") == job_name:
                    return wl
        return None

    def stop(self):
        self.cp.stop()


def job_object(name, containers, annotations=None, labels=None, managed_by=True,
               ns=cluster.E2E_NS, parallelism=1):
    """A Job already as Kueue's webhook would leave it: suspended, queued in LOCAL_QUEUE,
    and (managed_by) handed to MultiKueue. containers: [(name, {resource: amount})]."""
    pod = cluster.pod_object(name, containers, ns=ns, annotations=annotations,
                             labels=labels)
    tmpl = {"metadata": {"labels": pod["metadata"]["labels"]}, "spec": pod["spec"]}
    if annotations:
        tmpl["metadata"]["annotations"] = dict(annotations)
    tmpl["spec"]["restartPolicy"] = "Never"
    spec = {"suspend": True, "parallelism": parallelism, "completions": parallelism,
            "backoffLimit": 0, "template": tmpl}
    if managed_by:
        spec["managedBy"] = MULTIKUEUE_CONTROLLER
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": ns, "labels": {QUEUE_LABEL: LOCAL_QUEUE}},
            "spec": spec}


def job_path(ns=cluster.E2E_NS, name=None):
    return "/apis/batch/v1/namespaces/%s/jobs" % ns + ("/" + name if name else "")


def now_ms():
    return int(time.time() * 1000)
