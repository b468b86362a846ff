#!/usr/bin/env python3
"""Checks the Helm chart deploy/helm/kgpu against the kustomize manifests.

Renders the chart with `helm template` and deploy/extender,
deploy/device-plugin and deploy/dra with `kubectl kustomize` (no cluster
involved), then:

- with default values, the chart renders exactly the objects of
  deploy/extender and deploy/device-plugin (kind, namespace, name) with equal
  contents: everything but labels compared as parsed YAML (ConfigMap data
  too), labels a superset of kustomize's where the extra keys are Helm's
  standard ones only; with dra.enabled=true it adds exactly deploy/dra's
  objects, compared the same way;
- in every variant rendered, each Role and ClusterRole has exactly the
  kustomize rules, and no other RBAC object exists (least privilege);
- one owner per node: the device plugin's DaemonSet (kustomize's and the
  chart's, whatever devicePlugin.affinity says) is never scheduled on a node
  labelled kgpu.io/gpu-allocator=dra, and the DRA driver's only there;
- in every variant, the KubeSchedulerConfiguration in the ConfigMap
  kgpu-scheduler-config parses and its urlPrefix names the rendered Service
  (name, namespace, port) and the extender's listen port;
- in every variant, a NetworkPolicy selects the extender's pods, names only
  its container's ports, and holds a rule without peers (which admits
  everyone) for the probe port alone; the probes use the probe port, which
  the extender's probeListen serves;
- the defaults are authenticated: HTTPS with client certificates on both
  ends, probes that need no certificate, a NetworkPolicy;
- the admission policies (docs/security.md) are on by default and name the
  service accounts the chart renders, whatever the namespaces;
- value overrides (replicas, policy, port, TLS, network policy, namespaces,
  device plugin switches, leader election) change what they should and
  nothing else; the DRA driver's values (image, flags, namespace, node
  selection) reach its DaemonSet.

helm and kubectl are taken from --helm/--kubectl, else from the bin dir that
`scripts/upstream.sh --bin` names (which builds nothing), else from PATH.
This test never builds them. 77 = skipped (helm, kubectl or PyYAML missing).
"""
import argparse
import copy
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from urllib.parse import urlparse

try:
    import yaml
except ImportError:
    print("PyYAML is not installed (Debian: python3-yaml): skipped")
    sys.exit(77)

ARGS = None
HELM = KUBECTL = None
HELM_ENV = None
CHART = KUSTOMIZE_DIRS = None

# Labels the chart may add to what the kustomize manifests carry.
HELM_LABELS = {
    "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of", "app.kubernetes.io/component",
    "helm.sh/chart",
}
# Pod template annotations the chart may add: the config checksum that rolls
# the extender's pods when its ConfigMap changes.
HELM_POD_ANNOTATIONS = {"checksum/config"}
RBAC_KINDS = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}

EXT_NS, DP_NS, DRA_NS = "kgpu-system", "kgpu-node", "kgpu-dra"
DRA_LABEL = {"kgpu.io/gpu-allocator": "dra"}
QUEUE_CRD = "gpuqueues.kgpu.io"


def find_tool(name, explicit):
    """The tool's path, or None. Never builds anything."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    script = os.path.join(ARGS.source, "scripts", "upstream.sh")
    if os.path.exists(script):
        r = subprocess.run(["bash", script, "--bin"], capture_output=True, text=True)
        cand = os.path.join(r.stdout.strip(), name)
        if r.returncode == 0 and r.stdout.strip() and os.access(cand, os.X_OK):
            return cand
    return shutil.which(name)


def load_docs(text):
    return [d for d in yaml.safe_load_all(text) if d]


def key(obj):
    md = obj["metadata"]
    return (obj["kind"], md.get("namespace", ""), md["name"])


def index(objs):
    out = {}
    for o in objs:
        k = key(o)
        assert k not in out, "rendered twice: %s" % (k,)
        out[k] = o
    return out


_helm_cache = {}


def helm(*values, files=(), values_yaml=None):
    """`helm template kgpu deploy/helm/kgpu` with --set VALUES, --set-file FILES
    and, given values_yaml (YAML text), a values file, as a dict keyed by
    (kind, namespace, name). Raises on a failed render."""
    cache_key = (values, tuple(files), values_yaml)
    if cache_key not in _helm_cache:
        cmd = [HELM, "template", "kgpu", CHART]
        for v in values:
            cmd += ["--set", v]
        for f in files:
            cmd += ["--set-file", f]
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as vf:
            if values_yaml is not None:
                vf.write(values_yaml)
                vf.flush()
                cmd += ["-f", vf.name]
            r = subprocess.run(cmd, capture_output=True, text=True, env=HELM_ENV)
        if r.returncode != 0:
            raise AssertionError("%s failed:\n%s" % (" ".join(cmd), r.stderr))
        _helm_cache[cache_key] = index(load_docs(r.stdout))
    return copy.deepcopy(_helm_cache[cache_key])


def helm_error(*values):
    """stderr of a render that must fail."""
    cmd = [HELM, "template", "kgpu", CHART]
    for v in values:
        cmd += ["--set", v]
    r = subprocess.run(cmd, capture_output=True, text=True, env=HELM_ENV)
    if r.returncode == 0:
        raise AssertionError("%s rendered, expected a refusal" % " ".join(cmd))
    return r.stderr


_kustomize = {}


def kustomize(*dirs):
    """`kubectl kustomize` of deploy/DIRS (default: what the chart renders with
    default values, extender and device-plugin), keyed as helm()'s."""
    dirs = dirs or KUSTOMIZE_DIRS
    if dirs not in _kustomize:
        objs = []
        for d in dirs:
            path = os.path.join(ARGS.source, "deploy", d)
            r = subprocess.run([KUBECTL, "kustomize", path], capture_output=True, text=True)
            if r.returncode != 0:
                raise AssertionError("kubectl kustomize %s failed:\n%s" % (path, r.stderr))
            objs += load_docs(r.stdout)
        _kustomize[dirs] = index(objs)
    return copy.deepcopy(_kustomize[dirs])


def comparable(obj):
    """The object without labels and Helm's pod annotations, ConfigMap data parsed."""
    o = copy.deepcopy(obj)
    o["metadata"].pop("labels", None)
    tmpl = o.get("spec", {}).get("template")
    if tmpl:
        tmpl["metadata"].pop("labels", None)
        ann = tmpl["metadata"].get("annotations", {})
        for a in HELM_POD_ANNOTATIONS:
            ann.pop(a, None)
        if not ann:
            tmpl["metadata"].pop("annotations", None)
    if o["kind"] == "ConfigMap":
        o["data"] = {k: yaml.safe_load(v) for k, v in o.get("data", {}).items()}
    return o


def diffs(a, b, path=""):
    """Every path where a and b differ, e.g. 'spec.replicas: 2 != 3'."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            p = "%s.%s" % (path, k) if path else str(k)
            if k not in a:
                out.append("%s: only in second (%r)" % (p, b[k]))
            elif k not in b:
                out.append("%s: only in first (%r)" % (p, a[k]))
            else:
                out += diffs(a[k], b[k], p)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += diffs(x, y, "%s[%d]" % (path, i))
        return out
    return [] if a == b else ["%s: %r != %r" % (path, a, b)]


def changed(base, other):
    """{object key: [differing paths]} between two renders, comparable() form."""
    out = {}
    for k in set(base) | set(other):
        if k not in base or k not in other:
            out[k] = ["only in %s" % ("second" if k not in base else "first")]
            continue
        d = diffs(comparable(base[k]), comparable(other[k]))
        if d:
            out[k] = d
    return out


def strings(x):
    if isinstance(x, dict):
        for k, v in x.items():
            yield str(k)
            yield from strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from strings(v)
    elif isinstance(x, str):
        yield x


def extender_container(objs, ns=EXT_NS):
    return objs[("Deployment", ns, "kgpu-extender")]["spec"]["template"]["spec"]["containers"][0]


def plugin_pod(objs, ns=DP_NS):
    return objs[("DaemonSet", ns, "kgpu-device-plugin")]["spec"]["template"]["spec"]


def dra_pod(objs, ns=DRA_NS):
    return objs[("DaemonSet", ns, "kgpu-dra-plugin")]["spec"]["template"]["spec"]


def expr_matches(e, labels):
    op, k = e["operator"], e["key"]
    if op == "In":
        return labels.get(k) in e["values"]
    if op == "NotIn":
        return labels.get(k) not in e["values"]
    if op == "Exists":
        return k in labels
    if op == "DoesNotExist":
        return k not in labels
    raise AssertionError("operator %s not handled here" % op)


def schedulable(pod, labels):
    """Whether kube-scheduler could place POD (a pod spec) on a node with
    LABELS, as far as nodeSelector and the required node affinity say."""
    if not pod.get("nodeSelector", {}).items() <= labels.items():
        return False
    req = (pod.get("affinity", {}).get("nodeAffinity", {})
           .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not req:
        return True
    return any(all(expr_matches(e, labels) for e in t.get("matchExpressions", []))
               for t in req["nodeSelectorTerms"])


def extender_config(objs, ns=EXT_NS):
    return yaml.safe_load(objs[("ConfigMap", ns, "kgpu-extender")]["data"]["config.yaml"])


def scheduler_config(objs, ns=EXT_NS):
    cm = objs[("ConfigMap", ns, "kgpu-scheduler-config")]
    return yaml.safe_load(cm["data"]["scheduler-config.yaml"])


class HelmChartTest(unittest.TestCase):
    maxDiff = None

    # --- invariants, checked on every variant rendered -----------------------

    def check_invariants(self, objs, url_from_service=True):
        self.check_rbac(objs)
        self.check_wiring(objs, url_from_service)

    def check_rbac(self, objs):
        """Every Role/ClusterRole has kustomize's rules; no other RBAC object;
        bindings name the rendered service accounts."""
        k = kustomize("extender", "device-plugin", "dra", "dispatcher")
        k_rbac = {(kind, name): o for (kind, _, name), o in k.items() if kind in RBAC_KINDS}
        accounts = {(ns, name) for (kind, ns, name) in objs if kind == "ServiceAccount"}
        for (kind, ns, name), o in objs.items():
            if kind not in RBAC_KINDS:
                continue
            with self.subTest(rbac=(kind, ns, name)):
                self.assertIn((kind, name), k_rbac, "RBAC object the kustomize manifests lack")
                ref = k_rbac[(kind, name)]
                if kind in ("Role", "ClusterRole"):
                    self.assertEqual(o["rules"], ref["rules"])
                else:
                    self.assertEqual(o["roleRef"], ref["roleRef"])
                    self.assertEqual(len(o["subjects"]), len(ref["subjects"]))
                    for s, rs in zip(o["subjects"], ref["subjects"]):
                        self.assertEqual((s["kind"], s["name"]), (rs["kind"], rs["name"]))
                        self.assertIn((s["namespace"], s["name"]), accounts)
                    if kind == "RoleBinding":
                        self.assertIn(("Role", ns, o["roleRef"]["name"]), objs)

    def check_wiring(self, objs, url_from_service):
        """The scheduler config parses; its urlPrefix reaches the Service,
        the Service reaches the extender's pods and listen port."""
        svcs = [o for (kind, _, name), o in objs.items()
                if kind == "Service" and name != "kgpu-expander"]  # not kube-scheduler's
        self.assertEqual(len(svcs), 1)
        svc = svcs[0]
        ns = svc["metadata"]["namespace"]
        cfg = scheduler_config(objs, ns)
        # filter-gpuless comes with the DRA driver (scheduler.filterDraPods: auto).
        filter_verb = "filter-gpuless" if any(k[0] == "DeviceClass" for k in objs) else None
        self.assertEqual(cfg["kind"], "KubeSchedulerConfiguration")
        self.assertTrue(cfg["apiVersion"].startswith("kubescheduler.config.k8s.io/"))
        self.assertIn(len(cfg["extenders"]), (1, 2))
        ext = cfg["extenders"][0]
        for verb in ("filter", "prioritize", "bind", "preempt"):
            self.assertEqual(ext[verb + "Verb"], verb)
        self.assertTrue(ext["managedResources"])
        for other in cfg["extenders"][1:]:
            # The entry for pods without a GPU: the same extender, reached the same way,
            # for every pod (no managedResources), scoring, and filtering DRA pods by their
            # queue (issue 24) only where DRA is deployed (issue 27), never in the way.
            self.assertEqual(other["prioritizeVerb"], "prioritize-gpuless")
            self.assertEqual(other.get("filterVerb"), filter_verb)
            for key in ("bindVerb", "preemptVerb", "managedResources"):
                self.assertNotIn(key, other)
            self.assertIs(other["ignorable"], True)
            for key in ("urlPrefix", "enableHTTPS", "tlsConfig", "nodeCacheCapable", "weight"):
                self.assertEqual(other.get(key), ext.get(key), key)
            # Its own short timeout: kube-scheduler waits for it for every pod, one at a time.
            self.assertEqual(other["httpTimeout"], "300ms")
            self.assertNotEqual(ext["httpTimeout"], other["httpTimeout"])
        port = svc["spec"]["ports"][0]
        self.assertEqual(port["targetPort"], "http")
        if url_from_service:
            u = urlparse(ext["urlPrefix"])
            self.assertEqual(u.scheme, "https" if ext["enableHTTPS"] else "http")
            self.assertEqual(u.hostname, "%s.%s.svc" % (svc["metadata"]["name"], ns))
            self.assertEqual(u.port, port["port"])
        dep = objs[("Deployment", ns, "kgpu-extender")]
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        for sel in (svc["spec"]["selector"], dep["spec"]["selector"]["matchLabels"]):
            self.assertLessEqual(sel.items(), pod_labels.items())
        cport = [p for p in extender_container(objs, ns)["ports"] if p["name"] == "http"]
        self.assertEqual(len(cport), 1)
        listen = extender_config(objs, ns)["listen"]
        self.assertEqual(int(listen.rsplit(":", 1)[1]), cport[0]["containerPort"])
        self.assertEqual(dep["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"],
                         "kgpu-extender")
        self.check_network_policy(objs, ns, pod_labels)
        self.check_probes(objs, ns)

    def check_network_policy(self, objs, ns, pod_labels):
        np = objs.get(("NetworkPolicy", ns, "kgpu-extender"))
        if np is None:
            return
        spec = np["spec"]
        self.assertLessEqual(spec["podSelector"]["matchLabels"].items(), pod_labels.items())
        self.assertEqual(spec["policyTypes"], ["Ingress"])
        names = {p["name"] for p in extender_container(objs, ns)["ports"]}
        for rule in spec.get("ingress") or []:
            ports = [p["port"] for p in rule.get("ports") or []]
            self.assertTrue(ports, "a rule for every port: %r" % rule)
            for port in ports:
                self.assertIn(port, names)
            if not rule.get("from"):
                self.assertEqual(ports, ["probe"], "a rule without peers admits everyone")

    def check_probes(self, objs, ns):
        c = extender_container(objs, ns)
        probe = [p for p in c["ports"] if p["name"] == "probe"]
        self.assertEqual(len(probe), 1)
        listen = extender_config(objs, ns)["probeListen"]
        self.assertEqual(int(listen.rsplit(":", 1)[1]), probe[0]["containerPort"])
        for kind, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            self.assertEqual(c[kind]["httpGet"], {"path": path, "port": "probe"})

    # --- defaults against kustomize -------------------------------------------

    def assert_matches_kustomize(self, h, k):
        """H holds exactly K's objects, with equal contents and labels, Helm's added."""
        self.assertEqual(sorted(h), sorted(k), "objects (kind, namespace, name)")
        for obj_key in sorted(k):
            with self.subTest(object=obj_key):
                self.assertEqual(diffs(comparable(k[obj_key]), comparable(h[obj_key])), [],
                                 "kustomize != helm")
                kl = k[obj_key]["metadata"].get("labels", {})
                hl = h[obj_key]["metadata"].get("labels", {})
                self.assertLessEqual(kl.items(), hl.items(), "kustomize labels kept")
                self.assertLessEqual(set(hl) - set(kl), HELM_LABELS, "only Helm's labels added")
                self.assertEqual(hl.get("app.kubernetes.io/managed-by"), "Helm")
                self.assertEqual(hl.get("app.kubernetes.io/instance"), "kgpu")
                tmpl = k[obj_key].get("spec", {}).get("template")
                if tmpl:
                    htm = h[obj_key]["spec"]["template"]["metadata"]
                    self.assertLessEqual(tmpl["metadata"]["labels"].items(), htm["labels"].items())
                    self.assertLessEqual(set(htm["labels"]) - set(tmpl["metadata"]["labels"]),
                                         HELM_LABELS)

    def test_defaults_match_kustomize(self):
        h = helm()
        self.assertEqual(helm("dra.enabled=false"), h, "dra.enabled is false by default")
        self.assert_matches_kustomize(h, kustomize())
        self.check_invariants(h)

    def test_scheduler_config_is_the_shipped_file(self):
        # The kustomize ConfigMap is generated from scheduler-config.yaml, so
        # this ties the chart to the file operators copy by hand.
        with open(os.path.join(ARGS.source, "deploy", "extender", "scheduler-config.yaml")) as f:
            shipped = yaml.safe_load(f)
        self.assertEqual(scheduler_config(helm()), shipped)

    def test_scheduler_client_limits(self):
        # 0 leaves kube-scheduler's defaults (the shipped file sets none).
        self.assertNotIn("qps", scheduler_config(helm())["clientConnection"])
        conf = scheduler_config(helm("scheduler.clientQPS=1000", "scheduler.clientBurst=2000"))
        self.assertEqual(conf["clientConnection"], {"kubeconfig": "/etc/kubernetes/scheduler.conf",
                                                    "qps": 1000, "burst": 2000})
        conf = scheduler_config(helm("scheduler.clientQPS=500", "scheduler.kubeconfig="))
        self.assertEqual(conf["clientConnection"], {"qps": 500})
        own_on = ("ownScheduler.enabled=true", "extender.tls.certManager.enabled=true")
        own = scheduler_config(helm(*own_on, "scheduler.clientQPS=800",
                                    "scheduler.clientBurst=1600"))
        self.assertEqual(own["clientConnection"], {"qps": 800, "burst": 1600})
        self.assertNotIn("clientConnection", scheduler_config(helm(*own_on)))

    def test_lint(self):
        r = subprocess.run([HELM, "lint", "--strict", CHART], capture_output=True, text=True,
                           env=HELM_ENV)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    # --- overrides --------------------------------------------------------------

    def test_replicas(self):
        h = helm("extender.replicas=3")
        self.assertEqual(changed(helm(), h), {
            ("Deployment", EXT_NS, "kgpu-extender"): ["spec.replicas: 2 != 3"]})
        self.check_invariants(h)

    def test_policy(self):
        base, h = helm(), helm("extender.config.policy=binpack")
        self.assertEqual(changed(base, h), {
            ("ConfigMap", EXT_NS, "kgpu-extender"):
                ["data.config.yaml.policy: 'kgpu' != 'binpack'"]})
        ann = lambda o: o[("Deployment", EXT_NS, "kgpu-extender")]["spec"]["template"][
            "metadata"]["annotations"]["checksum/config"]
        self.assertNotEqual(ann(base), ann(h), "a config change must roll the extender's pods")
        self.check_invariants(h)

    def test_prices(self):
        base = helm()
        self.assertNotIn("prices", extender_config(base))
        self.assertNotIn("prices.yaml", base[("ConfigMap", EXT_NS, "kgpu-extender")]["data"])
        h = helm(values_yaml="extender:\n  prices:\n    currency: EUR\n    gpu:\n"
                             "      \"Tesla T4\": {onDemand: 0.35, spot: 0.12}\n")
        diff = changed(base, h)
        self.assertEqual(sorted(diff), [("ConfigMap", EXT_NS, "kgpu-extender")])
        self.assertEqual([d.split(":")[0] for d in diff[("ConfigMap", EXT_NS, "kgpu-extender")]],
                         ["data.config.yaml.prices", "data.prices.yaml"])
        ann = lambda o: o[("Deployment", EXT_NS, "kgpu-extender")]["spec"]["template"][
            "metadata"]["annotations"]["checksum/config"]
        self.assertNotEqual(ann(base), ann(h), "new prices must roll the extender's pods")
        # The extender reads it from the ConfigMap's folder, in the prices format.
        self.assertEqual(extender_config(h)["prices"], "/etc/kgpu/prices.yaml")
        mounts = extender_container(h)["volumeMounts"]
        self.assertIn({"name": "config", "mountPath": "/etc/kgpu"},
                      [{k: m[k] for k in ("name", "mountPath")} for m in mounts])
        prices = yaml.safe_load(h[("ConfigMap", EXT_NS, "kgpu-extender")]["data"]["prices.yaml"])
        self.assertEqual(prices, {"prices": {"currency": "EUR", "gpu": {
            "Tesla T4": {"onDemand": 0.35, "spot": 0.12}}}})
        self.check_invariants(h)

    def test_cluster_name_and_node_groups(self):
        """For kgpu-dispatcher (docs/multicluster.md): the cluster's name and its node groups
        reach the extender's configuration, the groups as node-groups.yaml beside it."""
        base = helm()
        self.assertNotIn("clusterName", extender_config(base))
        self.assertNotIn("node-groups.yaml", base[("ConfigMap", EXT_NS, "kgpu-extender")]["data"])
        h = helm(values_yaml="extender:\n  clusterName: worker-a\n  nodeGroups:\n"
                             "    - name: a100-spot\n      maxNodes: 8\n"
                             "      nodeLabels: {pool: a100}\n"
                             "      gpus: {model: NVIDIA A100-SXM4-80GB, count: 8,"
                             " memoryMiB: 81920}\n")
        cfg = extender_config(h)
        self.assertEqual(cfg["clusterName"], "worker-a")
        self.assertEqual(cfg["nodeGroups"], "/etc/kgpu/node-groups.yaml")
        groups = yaml.safe_load(h[("ConfigMap", EXT_NS, "kgpu-extender")]["data"]
                                ["node-groups.yaml"])
        self.assertEqual(groups["nodeGroups"][0]["gpus"]["count"], 8)
        self.assertEqual(sorted(changed(base, h)), [("ConfigMap", EXT_NS, "kgpu-extender")])
        self.check_invariants(h)

    def test_prometheus_rule(self):
        self.assertNotIn("PrometheusRule", {k[0] for k in helm()})
        h = helm("monitoring.prometheusRule.enabled=true",
                 "monitoring.prometheusRule.labels.release=prometheus")
        self.assertEqual(sorted(changed(helm(), h)), [("PrometheusRule", EXT_NS, "kgpu-cost")])
        rule = h[("PrometheusRule", EXT_NS, "kgpu-cost")]
        self.assertEqual(rule["metadata"]["labels"]["release"], "prometheus")
        # The same groups as the plain rules file Prometheus loads without the operator.
        with open(os.path.join(ARGS.source, "deploy", "prometheus", "kgpu-rules.yaml")) as f:
            self.assertEqual(rule["spec"], yaml.safe_load(f))
        records = [r["record"] for g in rule["spec"]["groups"] for r in g["rules"]]
        self.assertIn("kgpu:namespace_gpu_cost:increase30d", records)
        self.check_invariants(h)

    def test_port(self):
        h = helm("extender.config.port=8443")
        self.assertEqual(h[("Service", EXT_NS, "kgpu-extender")]["spec"]["ports"][0]["port"], 8443)
        self.assertEqual(extender_container(h)["ports"][0]["containerPort"], 8443)
        self.assertEqual(extender_config(h)["listen"], "0.0.0.0:8443")
        self.assertEqual(extender_config(h)["probeListen"], "0.0.0.0:12347")
        self.assertEqual(scheduler_config(h)["extenders"][0]["urlPrefix"],
                         "https://kgpu-extender.kgpu-system.svc:8443")
        self.check_invariants(h)

    def test_probe_port(self):
        h = helm("extender.config.probePort=9000")
        self.assertEqual(sorted(changed(helm(), h)), [("ConfigMap", EXT_NS, "kgpu-extender"),
                                                      ("Deployment", EXT_NS, "kgpu-extender")])
        self.assertEqual(extender_config(h)["probeListen"], "0.0.0.0:9000")
        self.check_invariants(h)

    def test_url_prefix_override(self):
        h = helm("scheduler.urlPrefix=https://10.96.12.34:12346")
        self.assertEqual(changed(helm(), h), {
            ("ConfigMap", EXT_NS, "kgpu-scheduler-config"): [
                "data.scheduler-config.yaml.extenders[%d].urlPrefix: "
                "'https://kgpu-extender.kgpu-system.svc:12346' != 'https://10.96.12.34:12346'"
                % i for i in (0, 1)]})
        self.check_invariants(h, url_from_service=False)

    def test_service_cluster_ip(self):
        """A fixed cluster IP is the one change (so it can go into urlPrefix beforehand)."""
        self.assertNotIn("clusterIP", helm()[("Service", EXT_NS, "kgpu-extender")]["spec"])
        h = helm("extender.service.clusterIP=10.96.200.200")
        self.assertEqual(changed(helm(), h), {
            ("Service", EXT_NS, "kgpu-extender"): [
                "spec.clusterIP: only in second ('10.96.200.200')"]})
        self.check_invariants(h)

    def test_gpuless_pods_entry_can_be_left_out(self):
        """scheduler.scoreGpulessPods=false: the GPU entry alone, nothing else changes."""
        base, h = helm(), helm("scheduler.scoreGpulessPods=false")
        d = changed(base, h)
        self.assertEqual(list(d), [("ConfigMap", EXT_NS, "kgpu-scheduler-config")])
        self.assertEqual([p.split(":")[0] for p in d[("ConfigMap", EXT_NS,
                                                      "kgpu-scheduler-config")]],
                         ["data.scheduler-config.yaml.extenders"])
        self.assertEqual([e["prioritizeVerb"] for e in scheduler_config(base)["extenders"]],
                         ["prioritize", "prioritize-gpuless"])
        self.assertEqual(scheduler_config(h)["extenders"], scheduler_config(base)["extenders"][:1])
        self.check_invariants(h)

    def test_queue_crd(self):
        crd = helm()[("CustomResourceDefinition", "", QUEUE_CRD)]
        # Deleting the CRD deletes every GPUQueue: `helm uninstall` must leave it.
        self.assertEqual(crd["metadata"]["annotations"].get("helm.sh/resource-policy"), "keep")
        self.assertEqual((crd["spec"]["group"], crd["spec"]["scope"]), ("kgpu.io", "Cluster"))
        self.assertEqual(crd["spec"]["names"]["kind"], "GPUQueue")
        [v] = crd["spec"]["versions"]
        self.assertEqual((v["name"], v["served"], v["storage"]), ("v1alpha1", True, True))
        self.assertIn("status", v["subresources"])
        # The spec has the keys of one entry of the extender's `queues:` file, less the name.
        spec = v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        self.assertEqual(sorted(spec), ["guarantee", "limit", "models", "namespaceSelector",
                                        "namespaces", "parent", "weight"])
        sel = spec["namespaceSelector"]["properties"]
        self.assertEqual(sorted(sel), ["matchExpressions", "matchLabels"])
        self.assertEqual(sel["matchExpressions"]["items"]["properties"]["operator"]["enum"],
                         ["In", "NotIn", "Exists", "DoesNotExist"])
        for amount in (spec["guarantee"], spec["limit"]):
            self.assertEqual(sorted(amount["properties"]), ["gpu", "memory"])
            for dim in amount["properties"].values():
                self.assertIs(dim["x-kubernetes-int-or-string"], True)
        h = helm("queues.installCRD=false")
        self.assertEqual(changed(helm(), h),
                         {("CustomResourceDefinition", "", QUEUE_CRD): ["only in first"]})
        self.check_invariants(h)

    def test_device_plugin_disabled(self):
        h = helm("devicePlugin.enabled=false")
        k = kustomize()
        extender_only = {kk for kk in k if kk[1] == EXT_NS or
                         (kk[1] == "" and kk[2] in ("kgpu-extender", EXT_NS, QUEUE_CRD)) or
                         kk[0].startswith("ValidatingAdmissionPolicy")}
        self.assertEqual(sorted(h), sorted(extender_only))
        self.assertEqual(changed(helm(), h),
                         {kk: ["only in first"] for kk in set(k) - extender_only})
        self.check_invariants(h)

    def test_defaults_are_authenticated(self):
        """HTTPS with client certificates both ways, probes without one, a NetworkPolicy."""
        h = helm()
        self.assertEqual(extender_config(h)["tls"],
                         {"cert": "/etc/kgpu-tls/tls.crt", "key": "/etc/kgpu-tls/tls.key",
                          "clientCA": "/etc/kgpu-tls/ca.crt"})
        c = extender_container(h)
        self.assertIn({"name": "tls", "mountPath": "/etc/kgpu-tls", "readOnly": True},
                      c["volumeMounts"])
        pod = h[("Deployment", EXT_NS, "kgpu-extender")]["spec"]["template"]["spec"]
        self.assertIn({"name": "tls", "secret": {"secretName": "kgpu-extender-tls"}},
                      pod["volumes"])
        # kubelet has no client certificate: the probes use the plain-HTTP probe port
        # (checked by check_probes). Not tcpSocket: the standby must stay not ready.
        ext = scheduler_config(h)["extenders"][0]
        self.assertEqual(ext["urlPrefix"], "https://kgpu-extender.kgpu-system.svc:12346")
        self.assertIs(ext["enableHTTPS"], True)
        self.assertEqual(ext["tlsConfig"], {
            "caFile": "/etc/kubernetes/kgpu/ca.crt",
            "serverName": "kgpu-extender.kgpu-system.svc",
            "certFile": "/etc/kubernetes/kgpu/client.crt",
            "keyFile": "/etc/kubernetes/kgpu/client.key"})
        np = h[("NetworkPolicy", EXT_NS, "kgpu-extender")]["spec"]
        self.assertEqual(np["ingress"], [
            {"ports": [{"port": "http", "protocol": "TCP"}],
             "from": [{"namespaceSelector": {"matchLabels": {
                 "kubernetes.io/metadata.name": "kube-system"}}}]},
            {"ports": [{"port": "probe", "protocol": "TCP"}]}])
        self.check_invariants(h)

    def test_tls_off(self):
        """One value turns TLS off for a try: plain HTTP everywhere, no Secret needed."""
        base, h = helm(), helm("extender.tls.enabled=false")
        self.assertEqual(sorted(changed(base, h)), sorted([
            ("ConfigMap", EXT_NS, "kgpu-extender"),
            ("ConfigMap", EXT_NS, "kgpu-scheduler-config"),
            ("Deployment", EXT_NS, "kgpu-extender")]))
        self.assertNotIn("tls", extender_config(h))
        c = extender_container(h)
        self.assertNotIn("tls", [m["name"] for m in c["volumeMounts"]])
        pod = h[("Deployment", EXT_NS, "kgpu-extender")]["spec"]["template"]["spec"]
        self.assertEqual([v["name"] for v in pod["volumes"]], ["config"])
        ext = scheduler_config(h)["extenders"][0]
        self.assertEqual(ext["urlPrefix"], "http://kgpu-extender.kgpu-system.svc:12346")
        self.assertIs(ext["enableHTTPS"], False)
        self.assertNotIn("tlsConfig", ext)
        self.check_invariants(h)

    def test_tls_without_client_certificates(self):
        h = helm("extender.tls.requireClientCert=false")
        self.assertEqual(sorted(changed(helm(), h)), sorted([
            ("ConfigMap", EXT_NS, "kgpu-extender"),
            ("ConfigMap", EXT_NS, "kgpu-scheduler-config")]))
        self.assertEqual(extender_config(h)["tls"],
                         {"cert": "/etc/kgpu-tls/tls.crt", "key": "/etc/kgpu-tls/tls.key"})
        self.assertEqual(scheduler_config(h)["extenders"][0]["tlsConfig"],
                         {"caFile": "/etc/kubernetes/kgpu/ca.crt",
                          "serverName": "kgpu-extender.kgpu-system.svc"})
        self.check_invariants(h)

    def test_cert_manager(self):
        """cert-manager's objects instead of a Secret the operator makes: a CA, the Secret
        the Deployment mounts (serving certificate for the name kube-scheduler checks),
        kube-scheduler's client certificate from the same CA. Nothing else changes."""
        h = helm("extender.tls.certManager.enabled=true")
        added = changed(helm(), h)
        self.assertEqual(sorted(added), sorted([
            ("Certificate", EXT_NS, "kgpu-extender-ca"),
            ("Certificate", EXT_NS, "kgpu-extender-tls"),
            ("Certificate", EXT_NS, "kgpu-extender-scheduler-client"),
            ("Issuer", EXT_NS, "kgpu-extender-selfsigned"),
            ("Issuer", EXT_NS, "kgpu-extender-ca")]))
        self.assertTrue(all(v == ["only in second"] for v in added.values()))
        for o in (o for k, o in h.items() if k[0] in ("Certificate", "Issuer")):
            self.assertEqual(o["apiVersion"], "cert-manager.io/v1")
        ca = h[("Certificate", EXT_NS, "kgpu-extender-ca")]["spec"]
        self.assertIs(ca["isCA"], True)
        self.assertEqual(h[("Issuer", EXT_NS, "kgpu-extender-ca")]["spec"],
                         {"ca": {"secretName": ca["secretName"]}})
        server = h[("Certificate", EXT_NS, "kgpu-extender-tls")]["spec"]
        pod = h[("Deployment", EXT_NS, "kgpu-extender")]["spec"]["template"]["spec"]
        self.assertIn({"name": "tls", "secret": {"secretName": server["secretName"]}},
                      pod["volumes"])
        self.assertIn(scheduler_config(h)["extenders"][0]["tlsConfig"]["serverName"],
                      server["dnsNames"])
        self.assertIn("server auth", server["usages"])
        client = h[("Certificate", EXT_NS, "kgpu-extender-scheduler-client")]["spec"]
        self.assertEqual(client["usages"], ["client auth", "digital signature"])
        for cert in (server, client):
            self.assertEqual(cert["issuerRef"], {"name": "kgpu-extender-ca", "kind": "Issuer"})
        self.check_invariants(h)
        h = helm("extender.tls.certManager.enabled=true", "extender.tls.requireClientCert=false")
        self.assertNotIn(("Certificate", EXT_NS, "kgpu-extender-scheduler-client"), h)
        h = helm("extender.tls.certManager.enabled=true", "extender.tls.enabled=false")
        self.assertFalse([k for k in h if k[0] in ("Certificate", "Issuer")])
        self.assertIn("whole hours", helm_error("extender.tls.certManager.enabled=true",
                                                "extender.tls.certManager.duration=30d"))

    def test_network_policy(self):
        h = helm("extender.networkPolicy.controlPlaneCIDRs={10.0.0.0/24,fd00::/64}")
        self.assertEqual(sorted(changed(helm(), h)), [("NetworkPolicy", EXT_NS, "kgpu-extender")])
        peers = h[("NetworkPolicy", EXT_NS, "kgpu-extender")]["spec"]["ingress"][0]["from"]
        self.assertEqual(peers[:2], [{"ipBlock": {"cidr": "10.0.0.0/24"}},
                                     {"ipBlock": {"cidr": "fd00::/64"}}])
        self.assertEqual(len(peers), 3, "the kube-system selector stays")
        self.check_invariants(h)
        # No peers at all: nothing is admitted but the node, never everyone.
        h = helm("extender.networkPolicy.from=null")
        self.assertEqual(h[("NetworkPolicy", EXT_NS, "kgpu-extender")]["spec"]["ingress"],
                         [{"ports": [{"port": "probe", "protocol": "TCP"}]}])
        self.check_invariants(h)
        h = helm("extender.networkPolicy.enabled=false")
        self.assertEqual(changed(helm(), h),
                         {("NetworkPolicy", EXT_NS, "kgpu-extender"): ["only in first"]})
        self.check_invariants(h)

    def test_device_plugin_network_policy(self):
        """The watcher's /metrics (pods and namespaces named) admits only the configured
        peers; no other port of the plugin's pods is open; the pod is not on the host
        network, where a NetworkPolicy would not apply."""
        h = helm()
        pod = plugin_pod(h)
        self.assertNotIn("hostNetwork", pod)
        ds = h[("DaemonSet", DP_NS, "kgpu-device-plugin")]
        spec = h[("NetworkPolicy", DP_NS, "kgpu-device-plugin")]["spec"]
        self.assertLessEqual(spec["podSelector"]["matchLabels"].items(),
                             ds["spec"]["template"]["metadata"]["labels"].items())
        self.assertEqual(spec["policyTypes"], ["Ingress"])
        self.assertEqual(spec["ingress"], [{
            "ports": [{"port": "metrics", "protocol": "TCP"}],
            "from": [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": "monitoring"}}}]}])
        self.assertEqual([p["name"] for p in pod["containers"][0]["ports"]], ["metrics"])
        # Other peers replace the default; none admits no one (a rule without peers
        # would admit everyone, so none is rendered).
        h2 = helm(values_yaml="devicePlugin:\n  networkPolicy:\n    from:\n"
                              "      - podSelector: {matchLabels: {app: prometheus}}\n")
        self.assertEqual(sorted(changed(h, h2)), [("NetworkPolicy", DP_NS, "kgpu-device-plugin")])
        self.assertEqual(h2[("NetworkPolicy", DP_NS, "kgpu-device-plugin")]["spec"]["ingress"][0]
                         ["from"], [{"podSelector": {"matchLabels": {"app": "prometheus"}}}])
        h3 = helm("devicePlugin.networkPolicy.from=null")
        self.assertNotIn("ingress", h3[("NetworkPolicy", DP_NS, "kgpu-device-plugin")]["spec"])
        h4 = helm("devicePlugin.networkPolicy.enabled=false")
        self.assertEqual(changed(h, h4),
                         {("NetworkPolicy", DP_NS, "kgpu-device-plugin"): ["only in first"]})

    def test_dra_network_policy(self):
        """The DRA driver listens on no port: its pods admit no one."""
        h = helm("dra.enabled=true")
        spec = h[("NetworkPolicy", DRA_NS, "kgpu-dra-plugin")]["spec"]
        self.assertLessEqual(spec["podSelector"]["matchLabels"].items(),
                             h[("DaemonSet", DRA_NS, "kgpu-dra-plugin")]["spec"]["template"]
                             ["metadata"]["labels"].items())
        self.assertEqual(spec["policyTypes"], ["Ingress"])
        self.assertNotIn("ingress", spec)
        self.assertNotIn("ports", dra_pod(h)["containers"][0])
        self.assertNotIn(("NetworkPolicy", DRA_NS, "kgpu-dra-plugin"),
                         helm("dra.enabled=true", "dra.networkPolicy.enabled=false"))

    def test_state_filesystem_flags(self):
        """Both agents check their state folder's filesystem (warned by default)."""
        h = helm("dra.enabled=true")
        for pod in (plugin_pod(h), dra_pod(h)):
            cmd = pod["containers"][0]["command"]
            self.assertIn("--state-limit=1Gi", cmd)
            self.assertIn("--state-check=warn", cmd)
        h = helm("dra.enabled=true", "devicePlugin.stateFilesystem.limit=256Mi",
                 "devicePlugin.stateFilesystem.check=refuse", "dra.stateFilesystem.check=refuse")
        self.assertIn("--state-limit=256Mi", plugin_pod(h)["containers"][0]["command"])
        self.assertIn("--state-check=refuse", plugin_pod(h)["containers"][0]["command"])
        self.assertIn("--state-check=refuse", dra_pod(h)["containers"][0]["command"])

    def test_custom_namespaces(self):
        h = helm("namespaces.extender.name=gpu-sched", "namespaces.devicePlugin.name=gpu-node")
        k = kustomize()
        rename = {EXT_NS: "gpu-sched", DP_NS: "gpu-node"}
        expected = set()
        for kind, ns, name in k:
            if kind == "Namespace":
                name = rename[name]
            expected.add((kind, rename.get(ns, ns), name))
        self.assertEqual(sorted(h), sorted(expected))
        for o in h.values():
            for s in strings(o):
                self.assertNotIn(EXT_NS, s, "%s still names kgpu-system" % (key(o),))
                self.assertNotIn(DP_NS, s, "%s still names kgpu-node" % (key(o),))
        ns = h[("Namespace", "", "gpu-sched")]["metadata"]["labels"]
        self.assertEqual(ns["pod-security.kubernetes.io/enforce"], "restricted")
        ns = h[("Namespace", "", "gpu-node")]["metadata"]["labels"]
        self.assertEqual(ns["pod-security.kubernetes.io/enforce"], "privileged")
        self.assertEqual(scheduler_config(h, "gpu-sched")["extenders"][0]["urlPrefix"],
                         "https://kgpu-extender.gpu-sched.svc:12346")
        self.assertEqual(scheduler_config(h, "gpu-sched")["extenders"][0]["tlsConfig"]
                         ["serverName"], "kgpu-extender.gpu-sched.svc")
        self.check_invariants(h)
        self.assertIn("must differ", helm_error("namespaces.devicePlugin.name=kgpu-system"))

    def test_no_namespaces(self):
        h = helm("createNamespaces=false")
        self.assertEqual(sorted(changed(helm(), h)),
                         [("Namespace", "", DP_NS), ("Namespace", "", EXT_NS)])
        self.check_invariants(h)

    def test_admission_policies(self):
        """On by default (docs/security.md), naming the service accounts the chart renders,
        whatever the namespaces; off and report-only on request."""
        import re
        policies = ("kgpu-pod-bookkeeping", "kgpu-agents-own-node", "kgpu-extender-node-guard")
        for h in (helm(), helm("dra.enabled=true"),
                  helm("namespaces.extender.name=gpu-sched",
                       "namespaces.devicePlugin.name=gpu-node", "dra.enabled=true",
                       "namespaces.dra.name=gpu-dra")):
            accounts = {"system:serviceaccount:%s:%s" % (ns, name)
                        for (kind, ns, name) in h if kind == "ServiceAccount"}
            for p in policies:
                pol = h[("ValidatingAdmissionPolicy", "", p)]
                binding = h[("ValidatingAdmissionPolicyBinding", "", p)]
                self.assertEqual(binding["spec"], {"policyName": p, "validationActions": ["Deny"]})
                self.assertEqual(pol["spec"]["failurePolicy"], "Fail")
                named = set(re.findall(r"system:serviceaccount:[a-z0-9-]+:[a-z0-9-]+",
                                       str(pol["spec"])))
                self.assertTrue(named)
                # Every account a policy names that this release runs is the rendered one.
                kgpu_named = {n for n in named if n.split(":")[3] in
                              {a.split(":")[3] for a in accounts}}
                self.assertLessEqual(kgpu_named, accounts | {
                    n for n in named if n.endswith(":kgpu-dra-plugin")}, p)
            extender = next(a for a in accounts if a.endswith(":kgpu-extender"))
            bookkeeping = h[("ValidatingAdmissionPolicy", "", policies[0])]
            self.assertIn(extender, str(bookkeeping["spec"]["matchConditions"]))
            # The node guard binds the extender's own account, whatever its namespace.
            guard = h[("ValidatingAdmissionPolicy", "", policies[2])]
            self.assertIn("'%s'" % extender, str(guard["spec"]["matchConditions"]))
        off = helm("admissionPolicies.enabled=false")
        self.assertEqual(sorted(changed(helm(), off)),
                         sorted((kind, "", p) for p in policies for kind in (
                             "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")))
        warn = helm("admissionPolicies.validationActions={Warn,Audit}")
        self.assertEqual(warn[("ValidatingAdmissionPolicyBinding", "", policies[1])]["spec"]
                         ["validationActions"], ["Warn", "Audit"])
        self.check_invariants(off)

    def test_leader_election_off(self):
        h = helm("extender.leaderElection.enabled=false", "extender.replicas=1")
        self.assertEqual(changed(helm(), h), {
            ("Deployment", EXT_NS, "kgpu-extender"): [
                "spec.replicas: 2 != 1",
                "spec.template.spec.containers[0].command: "
                "['kgpu-extender', '--config', '/etc/kgpu/config.yaml', '--leader-elect'] != "
                "['kgpu-extender', '--config', '/etc/kgpu/config.yaml']"],
            ("Role", EXT_NS, "kgpu-extender-leader-election"): ["only in first"],
            ("RoleBinding", EXT_NS, "kgpu-extender-leader-election"): ["only in first"]})
        self.check_invariants(h)
        self.assertIn("leaderElection", helm_error("extender.leaderElection.enabled=false"))

    def test_memory_unit_reaches_both(self):
        h = helm("extender.config.memoryUnit=512Mi")
        self.assertEqual(extender_config(h)["memoryUnit"], "512Mi")
        self.assertIn("--memory-unit=512Mi", plugin_pod(h)["containers"][0]["command"])
        self.check_invariants(h)

    def test_device_plugin_flags(self):
        h = helm("devicePlugin.args.wholeGpus=true", "devicePlugin.args.gpushareAlias=true",
                 "devicePlugin.args.shim=false", "devicePlugin.args.logLevel=debug")
        self.assertEqual(sorted(changed(helm(), h)), [("DaemonSet", DP_NS, "kgpu-device-plugin")])
        pod = plugin_pod(h)
        cmd = pod["containers"][0]["command"]
        for flag in ("--whole-gpus", "--gpushare-alias", "--shim-lib=none", "--log-level=debug"):
            self.assertIn(flag, cmd)
        self.assertNotIn("initContainers", pod)
        self.check_invariants(h)

    def test_device_plugin_mps(self):
        h = helm("devicePlugin.args.sharing=mps", "devicePlugin.args.mpsPipeDir=/run/nvidia-mps")
        self.assertEqual(sorted(changed(helm(), h)), [("DaemonSet", DP_NS, "kgpu-device-plugin")])
        pod = plugin_pod(h)
        c = pod["containers"][0]
        self.assertIn("--sharing=mps", c["command"])
        self.assertIn("--mps-pipe-dir=/run/nvidia-mps", c["command"])
        self.assertIn({"name": "mps-pipes", "mountPath": "/run/nvidia-mps", "readOnly": True},
                      c["volumeMounts"])
        self.assertIn({"name": "mps-pipes",
                       "hostPath": {"path": "/run/nvidia-mps", "type": "Directory"}},
                      pod["volumes"])
        self.check_invariants(h)
        # The default mode passes no flag; anything else fails the render.
        self.assertFalse([a for a in plugin_pod(helm())["containers"][0]["command"]
                          if a.startswith("--sharing")])
        self.assertIn("expected sched or mps", helm_error("devicePlugin.args.sharing=timeslice"))

    def test_fake_gpus(self):
        gpus = os.path.join(ARGS.source, "examples", "gpus.yaml")
        h = helm(files=["devicePlugin.args.fakeGpus=" + gpus])
        cm = h[("ConfigMap", DP_NS, "kgpu-device-plugin-fake-gpus")]
        with open(gpus) as f:
            self.assertEqual(yaml.safe_load(cm["data"]["gpus.yaml"]), yaml.safe_load(f))
        pod = plugin_pod(h)
        self.assertIn("--fake-gpus=/etc/kgpu-fake-gpus/gpus.yaml", pod["containers"][0]["command"])
        self.assertIn({"name": "fake-gpus", "mountPath": "/etc/kgpu-fake-gpus", "readOnly": True},
                      pod["containers"][0]["volumeMounts"])
        self.assertIn({"name": "fake-gpus",
                       "configMap": {"name": "kgpu-device-plugin-fake-gpus"}}, pod["volumes"])
        self.check_invariants(h)

    def test_watcher_off(self):
        h = helm("devicePlugin.watcher.enabled=false")
        self.assertEqual(sorted(changed(helm(), h)),
                         [("ConfigMap", DP_NS, "kgpu-device-plugin-watch"),
                          ("DaemonSet", DP_NS, "kgpu-device-plugin")])
        self.assertNotIn(("ConfigMap", DP_NS, "kgpu-device-plugin-watch"), h)
        pod = plugin_pod(h)
        c = pod["containers"][0]
        self.assertNotIn("hostPID", pod)
        self.assertNotIn("ports", c)
        self.assertFalse([a for a in c["command"] if a.startswith("--watch-config")])
        self.assertNotIn("watch-config", [v["name"] for v in pod["volumes"]])
        self.check_invariants(h)

    def test_watcher_enforce_kill(self):
        h = helm("devicePlugin.watcher.enforce=kill", "devicePlugin.watcher.metricsPort=9500",
                 "devicePlugin.watcher.intervalSeconds=0.5")
        cfg = yaml.safe_load(
            h[("ConfigMap", DP_NS, "kgpu-device-plugin-watch")]["data"]["watch.yaml"])
        self.assertEqual(cfg["enforce"], "kill")
        self.assertEqual(cfg["intervalSeconds"], 0.5)
        self.assertEqual(cfg["metricsListen"], "0.0.0.0:9500")
        c = plugin_pod(h)["containers"][0]
        # Killing another user's processes takes CAP_KILL, and only then is it given.
        self.assertEqual(c["securityContext"]["capabilities"], {"drop": ["ALL"], "add": ["KILL"]})
        self.assertEqual(c["ports"], [{"name": "metrics", "containerPort": 9500, "protocol": "TCP"}])
        self.assertNotIn("add", plugin_pod(helm())["containers"][0]["securityContext"]
                         ["capabilities"])
        # The config's checksum rolls the plugin's pods when the config changes.
        ann = lambda objs: objs[("DaemonSet", DP_NS, "kgpu-device-plugin")]["spec"]["template"][
            "metadata"]["annotations"]["checksum/config"]
        self.assertNotEqual(ann(h), ann(helm()))
        self.check_invariants(h)

    def test_image(self):
        h = helm("image.repository=registry.example/kgpu", "image.tag=dev")
        self.assertEqual(extender_container(h)["image"], "registry.example/kgpu:dev")
        pod = plugin_pod(h)
        self.assertEqual({c["image"] for c in pod["containers"] + pod["initContainers"]},
                         {"registry.example/kgpu:dev"})

    # --- kgpu's own scheduler (ownScheduler) --------------------------------------

    def test_own_scheduler(self):
        """ownScheduler.enabled: a second kube-scheduler, the upstream image at the
        cluster's version, runs the rendered configuration under its own profile name,
        with in-cluster credentials, a Lease of its own and the files its tlsConfig names;
        the routing policy names it. Off by default."""
        base = helm()
        self.assertFalse([k for k in base if k[0].startswith("MutatingAdmissionPolicy")
                          or k[2] == "kgpu-scheduler"])
        h = helm("ownScheduler.enabled=true", "extender.tls.certManager.enabled=true",
                 "ownScheduler.routing.via=policy")
        cfg = scheduler_config(h)
        self.assertEqual([p["schedulerName"] for p in cfg["profiles"]], ["kgpu-scheduler"])
        self.assertNotIn("clientConnection", cfg)  # in-cluster credentials
        self.assertEqual(cfg["leaderElection"], {"leaderElect": True,
                                                 "resourceName": "kgpu-scheduler",
                                                 "resourceNamespace": EXT_NS})
        dep = h[("Deployment", EXT_NS, "kgpu-scheduler")]["spec"]["template"]["spec"]
        c = dep["containers"][0]
        self.assertRegex(c["image"], r"^registry\.k8s\.io/kube-scheduler:v1\.\d+\.\d+$")
        self.assertEqual(c["command"], ["kube-scheduler", "--config=/etc/kubernetes/"
                                        "kgpu-scheduler/scheduler-config.yaml"])
        self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"])
        self.assertTrue(dep["securityContext"]["runAsNonRoot"])
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        vols = {v["name"]: v for v in dep["volumes"]}
        self.assertEqual(vols["config"]["configMap"]["name"], "kgpu-scheduler-config")
        # The extender's NetworkPolicy admits its pods to the scheduling port, and they
        # are the pods the Deployment makes.
        peers = h[("NetworkPolicy", EXT_NS, "kgpu-extender")]["spec"]["ingress"][0]["from"]
        own = [p["podSelector"]["matchLabels"] for p in peers if "podSelector" in p]
        self.assertEqual(own, [h[("Deployment", EXT_NS, "kgpu-scheduler")]["spec"]["selector"]
                               ["matchLabels"]])
        self.assertFalse([p for p in base[("NetworkPolicy", EXT_NS, "kgpu-extender")]["spec"]
                          ["ingress"][0]["from"] if "podSelector" in p])
        # The tlsConfig's files, from cert-manager's client certificate.
        ext = cfg["extenders"][0]["tlsConfig"]
        tls = vols["tls"]["secret"]
        self.assertEqual(tls["secretName"], "kgpu-extender-scheduler-client")
        files = {os.path.join(mounts["tls"], i["path"]) for i in tls["items"]}
        self.assertEqual(files, {ext["caFile"], ext["certFile"], ext["keyFile"]})
        # Its RBAC: the cluster's scheduler roles, and its own Lease only.
        roles = {o["roleRef"]["name"] for (kind, _, name), o in h.items()
                 if kind in ("ClusterRoleBinding", "RoleBinding") and
                 name.startswith("kgpu-scheduler")}
        self.assertEqual(roles, {"system:kube-scheduler", "system:volume-scheduler",
                                 "extension-apiserver-authentication-reader",
                                 "kgpu-scheduler-lease"})
        lease = h[("Role", EXT_NS, "kgpu-scheduler-lease")]["rules"]
        self.assertEqual([r.get("resourceNames") for r in lease], [None, ["kgpu-scheduler"]])
        self.assertEqual(lease[0]["verbs"], ["create"])
        # The routing names the profile, for every managed resource.
        pol = h[("MutatingAdmissionPolicy", "", "kgpu-scheduler-routing")]["spec"]
        self.assertIn('schedulerName: "kgpu-scheduler"',
                      pol["mutations"][0]["applyConfiguration"]["expression"])
        cond = {m["name"]: m["expression"] for m in pol["matchConditions"]}
        for r in scheduler_config(base)["extenders"][0]["managedResources"]:
            self.assertIn("'%s'" % r["name"], cond["asks-for-a-gpu"])
        binding = h[("MutatingAdmissionPolicyBinding", "", "kgpu-scheduler-routing")]
        self.assertEqual(binding["spec"]["policyName"], "kgpu-scheduler-routing")
        # Another name, a namespace selector, a pinned tag.
        h2 = helm("ownScheduler.enabled=true", "ownScheduler.schedulerName=gpu-sched",
                  "ownScheduler.tlsSecretName=my-tls", "ownScheduler.image.tag=v1.37.2",
                  "ownScheduler.routing.via=policy",
                  "ownScheduler.routing.namespaceSelector.matchLabels.gpu=yes")
        self.assertEqual([p["schedulerName"] for p in scheduler_config(h2)["profiles"]],
                         ["gpu-sched"])
        self.assertEqual(h2[("Deployment", EXT_NS, "gpu-sched")]["spec"]["template"]["spec"]
                         ["containers"][0]["image"], "registry.k8s.io/kube-scheduler:v1.37.2")
        self.assertEqual(h2[("MutatingAdmissionPolicyBinding", "", "gpu-sched-routing")]
                         ["spec"]["matchResources"]["namespaceSelector"],
                         {"matchLabels": {"gpu": "yes"}})
        self.assertNotIn("routePodsTo", h[("ConfigMap", EXT_NS, "kgpu-extender")]["data"]
                         ["config.yaml"])
        # The webhook instead: same conditions, the extender answers it.
        w = helm("ownScheduler.enabled=true", "extender.tls.certManager.enabled=true",
                 "ownScheduler.routing.via=webhook")
        self.assertFalse([k for k in w if k[0].startswith("MutatingAdmissionPolicy")])
        hook = w[("MutatingWebhookConfiguration", "", "kgpu-scheduler-routing")]
        self.assertEqual(hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
                         EXT_NS + "/kgpu-extender-tls")
        wh = hook["webhooks"][0]
        self.assertEqual(wh["clientConfig"]["service"],
                         {"name": "kgpu-extender", "namespace": EXT_NS,
                          "port": extender_container(w)["ports"][0]["containerPort"],
                          "path": "/mutate/pods"})
        self.assertEqual((wh["failurePolicy"], wh["sideEffects"]), ("Fail", "None"))
        self.assertEqual(wh["matchConditions"], pol["matchConditions"])
        ext_cfg = yaml.safe_load(w[("ConfigMap", EXT_NS, "kgpu-extender")]["data"]["config.yaml"])
        self.assertEqual(ext_cfg["routePodsTo"], "kgpu-scheduler")
        # auto: the policy where the API server serves it, else the webhook.
        for api, kind in ((["--api-versions",
                            "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"],
                           "MutatingAdmissionPolicy"), ([], "MutatingWebhookConfiguration")):
            r = subprocess.run([HELM, "template", "kgpu", CHART, "--set",
                                "ownScheduler.enabled=true", "--set",
                                "extender.tls.certManager.enabled=true"] + api,
                               capture_output=True, text=True, env=HELM_ENV)
            self.assertEqual(r.returncode, 0, r.stderr)
            kinds = {o["kind"] for o in load_docs(r.stdout)}
            self.assertIn(kind, kinds)
            self.assertEqual(len(kinds & {"MutatingAdmissionPolicy",
                                          "MutatingWebhookConfiguration"}), 1)
        self.assertIn("caBundle", helm_error("ownScheduler.enabled=true",
                                             "ownScheduler.tlsSecretName=x",
                                             "ownScheduler.routing.via=webhook"))
        self.assertIn("extender.tls.enabled", helm_error(
            "ownScheduler.enabled=true", "extender.tls.enabled=false",
            "ownScheduler.routing.via=webhook"))
        self.assertIn("expected auto, policy or webhook", helm_error(
            "ownScheduler.enabled=true", "ownScheduler.tlsSecretName=x",
            "ownScheduler.routing.via=both"))
        # TLS without a Secret for it, nor cert-manager to make one: refused by name.
        self.assertIn("ownScheduler.tlsSecretName", helm_error("ownScheduler.enabled=true"))
        r = subprocess.run([HELM, "lint", "--strict", CHART, "--set", "ownScheduler.enabled=true",
                            "--set", "ownScheduler.tlsSecretName=x",
                            "--set", "ownScheduler.routing.caBundle=eA=="],
                           capture_output=True, text=True, env=HELM_ENV)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    # --- the DRA driver -----------------------------------------------------------

    def test_dra_matches_kustomize(self):
        """dra.enabled=true adds exactly deploy/dra's objects, as kustomize renders
        them, and changes nothing else but the filterVerb of the scheduler
        configuration's second entry (scheduler.filterDraPods: auto)."""
        h, k = helm("dra.enabled=true"), kustomize("dra")
        added = changed(helm(), h)
        cm = ("ConfigMap", EXT_NS, "kgpu-scheduler-config")
        self.assertIn(cm, added)
        del added[cm]
        self.assertEqual(sorted(added), sorted(k))
        self.assertTrue(all(v == ["only in second"] for v in added.values()), added)
        with_dra, without = scheduler_config(h), scheduler_config(helm())
        self.assertEqual(with_dra["extenders"][1].pop("filterVerb"), "filter-gpuless")
        self.assertEqual(with_dra, without)
        self.assert_matches_kustomize({kk: h[kk] for kk in k}, k)
        self.check_invariants(h)

    def test_filter_dra_pods(self):
        """filter-gpuless costs every pod a round trip in kube-scheduler's cycle, so it is
        in the configuration only where it has DRA pods to hold to their queues: auto
        follows dra.enabled, true and false force it (a driver installed apart)."""
        def second(*values):
            return scheduler_config(helm(*values))["extenders"][1]
        self.assertNotIn("filterVerb", second())
        self.assertNotIn("filterVerb", second("scheduler.filterDraPods=auto"))
        self.assertEqual(second("scheduler.filterDraPods=true")["filterVerb"], "filter-gpuless")
        self.assertNotIn("filterVerb", second("dra.enabled=true", "scheduler.filterDraPods=false"))
        self.assertEqual(second("dra.enabled=true")["filterVerb"], "filter-gpuless")
        # The shipped file has the line commented, for the operator who adds deploy/dra.
        with open(os.path.join(ARGS.source, "deploy", "extender", "scheduler-config.yaml")) as f:
            self.assertIn("#   filterVerb: filter-gpuless", f.read())

    def test_benchmarks(self):
        """A Job per workload and GPU model when asked: the workload pinned to the model by
        kgpu.io/gpu-type, the sidecar kgpu bench-export with the labels the chart sets (never
        the workload), as a native sidecar, no ServiceAccount token; bad values refused."""
        self.assertFalse([k for k in helm() if k[0] == "Job"])
        values = ("benchmarks:\n  enabled: true\n  cluster: worker-a\n"
                  "  gpuModels: [{name: NVIDIA A100-SXM4-80GB, type: '*A100*'},"
                  " {name: Tesla T4, type: '*T4*'}]\n"
                  "  workloads:\n    - name: tracksim\n      image: reg.example/tracksim:1\n"
                  "      args: [--events, '1000']\n"
                  "      resources: {limits: {nvidia.com/gpu: 1}}\n")
        h = helm(values_yaml=values)
        jobs = {name: o for (kind, ns, name), o in h.items() if kind == "Job"}
        self.assertEqual(sorted(jobs), ["kgpu-bench-tracksim-0", "kgpu-bench-tracksim-1"])
        pod = jobs["kgpu-bench-tracksim-1"]["spec"]["template"]
        self.assertEqual(pod["metadata"]["annotations"]["kgpu.io/gpu-type"], "*T4*")
        self.assertEqual(pod["metadata"]["labels"]["kgpu.io/benchmark-gpu-model"], "Tesla-T4")
        spec = pod["spec"]
        self.assertIs(spec["automountServiceAccountToken"], False)
        side = spec["initContainers"][0]
        self.assertEqual(side["restartPolicy"], "Always")
        cmd = side["command"]
        self.assertEqual(cmd[:2], ["kgpu", "bench-export"])
        self.assertEqual(cmd[cmd.index("--gpu-model") + 1], "Tesla T4")
        self.assertEqual(cmd[cmd.index("--cluster") + 1], "worker-a")
        self.assertEqual(cmd[cmd.index("--workload") + 1], "tracksim")
        work = spec["containers"][0]
        self.assertEqual(work["image"], "reg.example/tracksim:1")
        self.assertEqual(work["resources"]["limits"]["nvidia.com/gpu"], 1)
        self.assertIn({"name": "KGPU_BENCH_RESULT", "value": "/kgpu-bench/throughput"},
                      work["env"])
        self.assertIn("benchmarks.cluster is required", helm_error("benchmarks.enabled=true"))
        self.assertIn("is not a DNS label",
                      helm_error("benchmarks.enabled=true", "benchmarks.cluster=A_B"))
        self.assertIn("not a DNS label of at most 40",
                      helm_error("benchmarks.enabled=true", "benchmarks.cluster=c",
                                 "benchmarks.workloads[0].name=Bad", "benchmarks.workloads[0].image=i"))
        self.assertIn("image is required",
                      helm_error("benchmarks.enabled=true", "benchmarks.cluster=c",
                                 "benchmarks.workloads[0].name=w"))

    def test_dispatcher(self):
        """kgpu-dispatcher only when asked: RBAC as deploy/dispatcher (list Kueue's objects,
        patch workloads/status, nothing else), the clusters file from values with each
        worker's certificates from its Secret, the static table; bad values refused."""
        self.assertFalse([k for k in helm() if k[2] == "kgpu-dispatcher"])
        h = helm(values_yaml="dispatcher:\n  enabled: true\n  clusters:\n"
                             "    - {name: worker-a, extender: 'https://10.0.0.5:12346',"
                             " tlsSecret: disp-a}\n"
                             "    - {name: worker-b, extender: 'http://10.0.0.6:12346'}\n"
                             "  benchmarks: 'http://prometheus:9090/federate?match[]=x'\n"
                             "  table: {tracksim: ['NVIDIA A100*']}\n")
        role = h[("ClusterRole", "", "kgpu-dispatcher")]
        self.assertEqual(role["rules"], [
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads", "admissionchecks",
                                                            "multikueueconfigs",
                                                            "multikueueclusters"],
             "verbs": ["list"]},
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"],
             "verbs": ["patch"]}])
        data = h[("ConfigMap", EXT_NS, "kgpu-dispatcher")]["data"]
        clusters = yaml.safe_load(data["clusters.yaml"])["clusters"]
        self.assertEqual(clusters[0], {"name": "worker-a", "extender": "https://10.0.0.5:12346",
                                       "ca": "/etc/kgpu/clusters/worker-a/ca.crt",
                                       "cert": "/etc/kgpu/clusters/worker-a/tls.crt",
                                       "key": "/etc/kgpu/clusters/worker-a/tls.key"})
        self.assertEqual(clusters[1], {"name": "worker-b", "extender": "http://10.0.0.6:12346"})
        self.assertEqual(yaml.safe_load(data["table.yaml"]),
                         {"workloads": {"tracksim": ["NVIDIA A100*"]}})
        pod = h[("Deployment", EXT_NS, "kgpu-dispatcher")]["spec"]["template"]["spec"]
        self.assertEqual(pod["serviceAccountName"], "kgpu-dispatcher")
        c = pod["containers"][0]
        cmd = c["command"]
        self.assertEqual(cmd[0], "kgpu-dispatcher")
        self.assertEqual(cmd[cmd.index("--benchmarks") + 1],
                         "http://prometheus:9090/federate?match[]=x")
        self.assertEqual(cmd[cmd.index("--table") + 1], "/etc/kgpu/dispatcher/table.yaml")
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        self.assertIn("/etc/kgpu/clusters/worker-a", mounts)
        vols = {v["name"]: v for v in pod["volumes"]}
        self.assertEqual(vols[mounts["/etc/kgpu/clusters/worker-a"]]["secret"]["secretName"],
                         "disp-a")
        self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"])
        self.check_invariants(h)
        self.assertIn("dispatcher.clusters is required", helm_error("dispatcher.enabled=true"))
        self.assertIn("not a DNS label",
                      helm_error("dispatcher.enabled=true", "dispatcher.clusters[0].name=A",
                                 "dispatcher.clusters[0].extender=http://x"))
        self.assertIn("must be an http:// or https:// URL",
                      helm_error("dispatcher.enabled=true", "dispatcher.clusters[0].name=a",
                                 "dispatcher.clusters[0].extender=ftp://x"))

    def test_expander(self):
        """kgpu-expander only when asked, TLS from the named Secret, no API token, and a
        NetworkPolicy that lets Cluster Autoscaler's pods alone reach its port (it sends
        no client certificate)."""
        self.assertFalse([kk for kk in helm() if kk[2] == "kgpu-expander"])
        self.assertIn("expander.tls.secretName is required", helm_error("expander.enabled=true"))
        self.assertIn("expander.port must be 1..65535",
                      helm_error("expander.enabled=true", "expander.tls.secretName=t",
                                 "expander.port=0"))
        h = helm("expander.enabled=true", "expander.tls.secretName=exp-tls",
                 "extender.config.memoryUnit=512Mi")
        dep = h[("Deployment", EXT_NS, "kgpu-expander")]
        pod = dep["spec"]["template"]["spec"]
        self.assertIs(pod["automountServiceAccountToken"], False)
        self.assertNotIn("serviceAccountName", pod)
        c = pod["containers"][0]
        cmd = c["command"]
        self.assertEqual(cmd[0], "kgpu-expander")
        self.assertEqual(cmd[cmd.index("--memory-unit") + 1], "512Mi")
        self.assertEqual(cmd[cmd.index("--listen") + 1], "0.0.0.0:8447")
        self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"])
        self.assertEqual([v["secret"]["secretName"] for v in pod["volumes"]], ["exp-tls"])
        svc = h[("Service", EXT_NS, "kgpu-expander")]
        self.assertEqual(svc["spec"]["ports"][0]["port"], 8447)
        np = h[("NetworkPolicy", EXT_NS, "kgpu-expander")]
        peer = np["spec"]["ingress"][0]["from"][0]
        self.assertEqual(peer["podSelector"]["matchLabels"],
                         {"app.kubernetes.io/name": "cluster-autoscaler"})
        self.assertEqual(np["spec"]["ingress"][0]["ports"], [{"port": 8447, "protocol": "TCP"}])
        self.assertNotIn("--prices", cmd)
        # Prices become the file it reads.
        hp = helm("expander.enabled=true", "expander.tls.secretName=exp-tls",
                  values_yaml="expander:\n  prices:\n    currency: EUR\n    gpu:\n"
                              "      Tesla T4: {onDemand: 0.3, spot: 0.1}\n")
        pcmd = hp[("Deployment", EXT_NS, "kgpu-expander")]["spec"]["template"]["spec"][
            "containers"][0]["command"]
        self.assertEqual(pcmd[pcmd.index("--prices") + 1], "/etc/kgpu-prices/prices.yaml")
        text = hp[("ConfigMap", EXT_NS, "kgpu-expander-prices")]["data"]["prices.yaml"]
        prices = yaml.safe_load(text)["prices"]
        self.assertEqual(prices["gpu"]["Tesla T4"], {"onDemand": 0.3, "spot": 0.1})
        # Nothing else changes, and no RBAC comes with it.
        extra = set(h) - set(helm("extender.config.memoryUnit=512Mi"))
        self.assertEqual(extra, {("Deployment", EXT_NS, "kgpu-expander"),
                                 ("Service", EXT_NS, "kgpu-expander"),
                                 ("NetworkPolicy", EXT_NS, "kgpu-expander")})
        self.check_invariants(h)

    def test_dra_only(self):
        """A cluster served by DRA alone: the extender and the driver, no device plugin."""
        h = helm("dra.enabled=true", "devicePlugin.enabled=false")
        self.assertFalse([kk for kk in h if kk[1] == DP_NS or kk[2] in (DP_NS, "kgpu-device-plugin")])
        self.assertLessEqual(set(kustomize("dra")), set(h))
        self.assertEqual(changed(helm("devicePlugin.enabled=false",
                                      "scheduler.filterDraPods=true"), h),
                         {kk: ["only in second"] for kk in kustomize("dra")})
        self.check_invariants(h)

    def test_dra_rbac_least_privilege(self):
        """The driver's ClusterRole is what it does and no more: no watch, no patch,
        claims read only, nothing but slices, claims and nodes. (check_rbac holds it
        equal to deploy/dra's; this holds both to the driver's needs.)"""
        h = helm("dra.enabled=true")
        rbac = sorted(kk for kk in set(h) - set(helm()) if kk[0] in RBAC_KINDS)
        self.assertEqual(rbac, [("ClusterRole", "", "kgpu-dra-plugin"),
                                ("ClusterRoleBinding", "", "kgpu-dra-plugin")])
        self.assertEqual(h[("ClusterRole", "", "kgpu-dra-plugin")]["rules"], [
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
             "verbs": ["get", "list", "create", "update", "delete"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}])
        crb = h[("ClusterRoleBinding", "", "kgpu-dra-plugin")]
        self.assertEqual(crb["subjects"], [{"kind": "ServiceAccount", "name": "kgpu-dra-plugin",
                                            "namespace": DRA_NS}])
        self.assertEqual(dra_pod(h)["serviceAccountName"], "kgpu-dra-plugin")
        self.assertIn(("ServiceAccount", DRA_NS, "kgpu-dra-plugin"), h)

    def test_dra_deviceclass_is_the_shared_file(self):
        """deploy/dra and the chart install one file, so the class cannot drift."""
        for name, fname in (("gpu.kgpu.io", "deviceclass.yaml"),
                            ("mig.gpu.kgpu.io", "deviceclass-mig.yaml")):
            with open(os.path.join(CHART, "files", "dra", fname)) as f:
                shipped = yaml.safe_load(f)
            for objs in (helm("dra.enabled=true"), kustomize("dra")):
                self.assertEqual(comparable(objs[("DeviceClass", "", name)]),
                                 comparable(shipped))

    def test_dra_extended_resource_name(self):
        """dra.extendedResourceName sets the class's extendedResourceName (the e2e DRA suite's
        test_06 serves nvidia.com/gpu through it); unset, the class has none."""
        key = ("DeviceClass", "", "gpu.kgpu.io")
        self.assertNotIn("extendedResourceName", helm("dra.enabled=true")[key]["spec"])
        h = helm("dra.enabled=true", "dra.extendedResourceName=nvidia.com/gpu")
        self.assertEqual(h[key]["spec"]["extendedResourceName"], "nvidia.com/gpu")
        self.assertEqual(h[key]["spec"]["selectors"],
                         helm("dra.enabled=true")[key]["spec"]["selectors"])

    def test_dra_flags(self):
        h = helm("dra.enabled=true", "dra.args.sharing=mps", "dra.args.mpsPipeDir=/run/nvidia-mps",
                 "dra.args.logLevel=debug", "dra.args.shim=false", "dra.args.extraArgs={--resync=600}",
                 "dra.args.stateDir=/data/kgpu-dra", "dra.args.cdiDir=/etc/cdi")
        self.assertEqual(sorted(changed(helm("dra.enabled=true"), h)),
                         [("DaemonSet", DRA_NS, "kgpu-dra-plugin")])
        pod = dra_pod(h)
        c = pod["containers"][0]
        self.assertEqual(c["command"], [
            "kgpu-dra-plugin", "--plugin-dir=/var/lib/kubelet/plugins",
            "--registry-dir=/var/lib/kubelet/plugins_registry", "--state-dir=/data/kgpu-dra",
            "--cdi-dir=/etc/cdi", "--log-level=debug", "--state-limit=1Gi", "--state-check=warn",
            "--shim-lib=none", "--sharing=mps",
            "--mps-pipe-dir=/run/nvidia-mps", "--resync=600"])
        self.assertNotIn("initContainers", pod)
        # Host folders at their host paths: the driver names them in CDI specs.
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        vols = {v["name"]: v["hostPath"] for v in pod["volumes"]}
        for name, path in (("state", "/data/kgpu-dra"), ("cdi", "/etc/cdi"),
                           ("mps-pipes", "/run/nvidia-mps")):
            self.assertEqual((mounts[name], vols[name]["path"]), (path, path))
        self.assertEqual(vols["mps-pipes"]["type"], "Directory")
        self.check_invariants(h)
        # Defaults: no --sharing, the shim installed into the state folder.
        pod = dra_pod(helm("dra.enabled=true"))
        self.assertFalse([a for a in pod["containers"][0]["command"] if a.startswith("--sharing")])
        self.assertIn("dst=/var/lib/kgpu/dra/lib", pod["initContainers"][0]["command"][2])
        self.assertIn("expected sched or mps",
                      helm_error("dra.enabled=true", "dra.args.sharing=timeslice"))

    def test_dra_image_and_pod(self):
        h = helm("dra.enabled=true", "image.repository=registry.example/kgpu", "image.tag=dev",
                 "imagePullSecrets[0].name=regcred", "dra.runtimeClassName=nvidia",
                 "dra.resources.limits.memory=256Mi", "dra.priorityClassName=",
                 "dra.tolerations[0].operator=Exists")
        pod = dra_pod(h)
        self.assertEqual({c["image"] for c in pod["containers"] + pod["initContainers"]},
                         {"registry.example/kgpu:dev"})
        self.assertEqual(pod["imagePullSecrets"], [{"name": "regcred"}])
        self.assertEqual(pod["runtimeClassName"], "nvidia")
        self.assertEqual(pod["containers"][0]["resources"]["limits"], {"memory": "256Mi"})
        self.assertNotIn("priorityClassName", pod)
        self.assertEqual(pod["tolerations"], [{"operator": "Exists"}])
        self.check_invariants(h)

    def test_dra_namespace(self):
        h = helm("dra.enabled=true", "namespaces.dra.name=gpu-dra")
        self.assertEqual(sorted(kk for kk in h if DRA_NS in kk), [])
        for o in h.values():
            for st in strings(o):
                self.assertNotIn(DRA_NS, st.replace("kgpu-dra-plugin", ""),
                                 "%s still names kgpu-dra" % (key(o),))
        self.assertEqual(h[("Namespace", "", "gpu-dra")]["metadata"]["labels"]
                         ["pod-security.kubernetes.io/enforce"], "privileged")
        self.assertIn(("DaemonSet", "gpu-dra", "kgpu-dra-plugin"), h)
        self.assertEqual(h[("ClusterRoleBinding", "", "kgpu-dra-plugin")]["subjects"][0]
                         ["namespace"], "gpu-dra")
        self.check_invariants(h)
        h = helm("dra.enabled=true", "createNamespaces=false")
        self.assertNotIn(("Namespace", "", DRA_NS), h)
        self.assertIn(("DaemonSet", DRA_NS, "kgpu-dra-plugin"), h)
        self.assertIn("must differ", helm_error("dra.enabled=true",
                                                "namespaces.dra.name=kgpu-system"))
        self.assertIn("must differ", helm_error("dra.enabled=true", "namespaces.dra.name=kgpu-node"))
        # With the device plugin off, its namespace's name is free.
        self.assertIn(("DaemonSet", DP_NS, "kgpu-dra-plugin"),
                      helm("dra.enabled=true", "devicePlugin.enabled=false",
                           "namespaces.dra.name=kgpu-node"))

    def test_lint_dra(self):
        for values in (["dra.enabled=true"], ["dra.enabled=true", "devicePlugin.enabled=false"]):
            cmd = [HELM, "lint", "--strict", CHART]
            for v in values:
                cmd += ["--set", v]
            r = subprocess.run(cmd, capture_output=True, text=True, env=HELM_ENV)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def assert_one_owner(self, plugin, driver):
        """The device plugin's pod spec PLUGIN and the DRA driver's DRIVER never
        land on the same GPU node; each lands where its label says."""
        for gpu in ({"kgpu.io/gpu-node": "true"}, {"nvidia.com/gpu.present": "true"},
                    {"feature.node.kubernetes.io/pci-10de.present": "true"}):
            dra_node = dict(gpu, **DRA_LABEL)
            self.assertTrue(schedulable(plugin, gpu), gpu)
            self.assertFalse(schedulable(plugin, dra_node), dra_node)
            if driver is not None:
                self.assertFalse(schedulable(driver, gpu), gpu)
                self.assertTrue(schedulable(driver, dra_node), dra_node)
        self.assertTrue(schedulable(plugin, {"kgpu.io/gpu-node": "true",
                                             "kgpu.io/gpu-allocator": "device-plugin"}))

    def test_device_plugin_avoids_dra_nodes(self):
        # kustomize's manifests, applied side by side.
        k = kustomize("device-plugin", "dra")
        self.assert_one_owner(k[("DaemonSet", DP_NS, "kgpu-device-plugin")]["spec"]["template"]
                              ["spec"], dra_pod(k))
        # The chart, with and without the driver: the rule does not hang on
        # dra.enabled (the driver may come from deploy/dra).
        h = helm("dra.enabled=true")
        self.assert_one_owner(plugin_pod(h), dra_pod(h))
        self.assert_one_owner(plugin_pod(helm()), None)
        self.assertEqual(plugin_pod(h)["affinity"], plugin_pod(helm())["affinity"])
        # An affinity of the operator's own keeps the rule: added to each term...
        own = """
devicePlugin:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions:
              - {key: gpu, operator: Exists}
          - matchExpressions:
              - {key: kgpu.io/gpu-allocator, operator: NotIn, values: [dra]}
              - {key: accel, operator: In, values: [nvidia]}
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 1
          preference:
            matchExpressions: [{key: fast, operator: Exists}]
"""
        aff = plugin_pod(helm(values_yaml=own))["affinity"]["nodeAffinity"]
        not_dra = {"key": "kgpu.io/gpu-allocator", "operator": "NotIn", "values": ["dra"]}
        self.assertEqual(aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"], [
            {"matchExpressions": [{"key": "gpu", "operator": "Exists"}, not_dra]},
            {"matchExpressions": [not_dra, {"key": "accel", "operator": "In",
                                            "values": ["nvidia"]}]}])
        self.assertEqual(aff["preferredDuringSchedulingIgnoredDuringExecution"],
                         yaml.safe_load(own)["devicePlugin"]["affinity"]["nodeAffinity"]
                         ["preferredDuringSchedulingIgnoredDuringExecution"])
        # ...or, with none, the one term.
        for v in ("devicePlugin.affinity=null", "devicePlugin.affinity.nodeAffinity=null"):
            pod = plugin_pod(helm(v))
            self.assertEqual(pod["affinity"], {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [not_dra]}]}}})
        # The driver's label cannot be dropped from its node selector, only added to.
        pod = dra_pod(helm("dra.enabled=true", "dra.nodeSelector.pool=a100",
                           "dra.nodeSelector.kgpu\\.io/gpu-allocator=null"))
        self.assertEqual(pod["nodeSelector"], {"kgpu.io/gpu-allocator": "dra", "pool": "a100"})


def main():
    global ARGS, HELM, KUBECTL, HELM_ENV, CHART, KUSTOMIZE_DIRS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--source", required=True, help="the repository root")
    p.add_argument("--helm", help="helm binary (default: scripts/upstream.sh --bin, then PATH)")
    p.add_argument("--kubectl", help="kubectl binary, for `kubectl kustomize` (same search)")
    ARGS, rest = p.parse_known_args()
    HELM = find_tool("helm", ARGS.helm)
    KUBECTL = find_tool("kubectl", ARGS.kubectl)
    for name, path in (("helm", HELM), ("kubectl", KUBECTL)):
        if not path:
            print("%s not found (build it with scripts/upstream.sh, or pass --%s): skipped"
                  % (name, name))
            sys.exit(77)
    print("helm: %s\nkubectl: %s" % (HELM, KUBECTL))
    CHART = os.path.join(ARGS.source, "deploy", "helm", "kgpu")
    KUSTOMIZE_DIRS = ("extender", "device-plugin")
    home = tempfile.mkdtemp(prefix="kgpu-helm-")
    # Helm's caches and config in a throwaway place: nothing read from or
    # written to the user's home.
    HELM_ENV = dict(os.environ, HELM_CACHE_HOME=os.path.join(home, "cache"),
                    HELM_CONFIG_HOME=os.path.join(home, "config"),
                    HELM_DATA_HOME=os.path.join(home, "data"))
    try:
        prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    sys.exit(0 if prog.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
