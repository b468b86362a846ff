#!/usr/bin/env python3
"""kgpu's scores on DRA nodes (stdlib only; issue 16).

The real kgpu-extender against the API server stand-in, which serves
resource.k8s.io/v1 ResourceSlices and ResourceClaims (list and watch), as
test_extender.py drives it (its helpers are reused). Nodes labelled
kgpu.io/gpu-allocator=dra take their GPUs from their slice of gpu.kgpu.io;
claims allocated there charge the devices they got; a pod with
resourceClaims reaches the prioritize-gpuless entry and is scored there by
its claim's request with the configured policy:

- a 30 % share packs onto the DRA node whose GPU is partly used
  (bestfit, kgpu, fgd), a whole-GPU claim goes to the node with a free GPU;
- a claim deleted or deallocated releases, and the scores change back;
- a relist of the claims charges nothing twice;
- a pod whose claim is missing (or not yet resolved from its template)
  scores 0 everywhere, with a log line naming pod and claim, and the
  extender goes on serving;
- a node that is not labelled keeps its device-plugin inventory, whatever
  slice or claim names it;
- without resource.k8s.io/v1 (404) the extender runs as before, says so
  once, and reads DRA as soon as it is served.

    test_extender_dra.py --extender PATH --kgpu PATH [unittest arguments...]

Exit status: unittest's; 77 when the binaries are missing.
"""

import sys
import time

import test_extender as te
from harness import wait_for
from test_extender import ExtenderTest, container, gpu_list, node_object, pod_object, share

RES = "/apis/resource.k8s.io/v1"
DRA_LABEL = {"kgpu.io/gpu-allocator": "dra"}
GIB = 1024


def dra_slice(node, gpus, generation=1, driver="gpu.kgpu.io"):
    """The slice kgpu-dra-plugin publishes: gpus is [(model, memory MiB)]."""
    devices = []
    for i, (model, mib) in enumerate(gpus):
        devices.append({
            "name": "gpu-%d" % i, "allowMultipleAllocations": True,
            "attributes": {"index": {"int": i}, "uuid": {"string": "GPU-%s-%d" % (node, i)},
                           "model": {"string": model}, "productName": {"string": model},
                           "memoryMiB": {"int": mib}},
            "capacity": {
                "memory": {"value": "%dMi" % mib,
                           "requestPolicy": {"default": "%dMi" % mib,
                                             "validRange": {"min": "1Mi", "step": "1Mi"}}},
                "cores": {"value": "100",
                          "requestPolicy": {"default": "0",
                                            "validRange": {"min": "0", "max": "100",
                                                           "step": "1"}}}}})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "%s-%s" % (node, driver)},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": devices}}


def claim_object(name, memory=None, cores=None, count=None, cls="gpu.kgpu.io"):
    exactly = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count or 1}
    reqs = {}
    if memory is not None:
        reqs["memory"] = memory
    if cores is not None:
        reqs["cores"] = str(cores)
    if reqs:
        exactly["capacity"] = {"requests": reqs}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def allocation(node, device, memory=None, cores=None, driver="gpu.kgpu.io"):
    """status of a claim as kube-scheduler writes it; memory None: no consumedCapacity."""
    res = {"request": "gpu", "driver": driver, "pool": node, "device": device,
           "shareID": "00000000-0000-0000-0000-00000000000%d" % len(device)}
    if memory is not None:
        res["consumedCapacity"] = {"memory": memory, "cores": str(cores or 0)}
    return {"allocation": {"devices": {"results": [res]},
                           "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                               {"key": "metadata.name", "operator": "In",
                                "values": [node]}]}]}}}


def dra_pod(name, claim=None, template=None, resolved=None, policy=None):
    """A pod whose container uses claim entry "gpu": by claim name or from a template."""
    c = container("main")
    c["resources"]["claims"] = [{"name": "gpu"}]
    p = pod_object(name, [c], annotations={"kgpu.io/policy": policy} if policy else None)
    entry = {"name": "gpu"}
    if claim is not None:
        entry["resourceClaimName"] = claim
    else:
        entry["resourceClaimTemplateName"] = template
    p["spec"]["resourceClaims"] = [entry]
    if resolved is not None:
        p["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": resolved}]}
    return p


class DRATest(ExtenderTest):

    NODES = ["dA", "dB", "n0"]

    def setUp(self):
        super().setUp()
        self.s = self.start_standin()
        # Two DRA nodes of one A100 each, and a device-plugin node of four V100s.
        for n in ("dA", "dB"):
            self.s.api("POST", "/api/v1/nodes", node_object(n, labels=DRA_LABEL), expect=201)
            self.add_slice(n, [("A100-SXM4-40GB", 40 * GIB)])
        self.s.add_node("n0", gpu_list("n0", "V100", 16 * GIB, 4))

    def start(self, extra=()):
        self.ext = self.start_extender_for(self.s, extra)
        return self.ext

    def add_slice(self, node, gpus, **kw):
        self.s.api("POST", RES + "/resourceslices", dra_slice(node, gpus, **kw), expect=201)

    def add_claim(self, name, ns="default", **kw):
        return self.s.api("POST", RES + "/namespaces/%s/resourceclaims" % ns,
                          claim_object(name, **kw), expect=201)[1]

    def claim_path(self, name, ns="default"):
        return RES + "/namespaces/%s/resourceclaims/%s" % (ns, name)

    def allocate(self, name, node, device, memory=None, cores=None, ns="default", pod=None):
        """pod: the pod object it is reserved for (status.reservedFor), as kube-scheduler does."""
        _, c = self.s.api("GET", self.claim_path(name, ns), expect=200)
        c["status"] = allocation(node, device, memory, cores)
        if pod is not None:
            c["status"]["reservedFor"] = [{"resource": "pods", "name": pod["metadata"]["name"],
                                           "uid": pod["metadata"]["uid"]}]
        self.s.api("PUT", self.claim_path(name, ns), c, expect=200)

    def deallocate(self, name, ns="default"):
        _, c = self.s.api("GET", self.claim_path(name, ns), expect=200)
        c.pop("status", None)
        self.s.api("PUT", self.claim_path(name, ns), c, expect=200)

    def delete_claim(self, name, ns="default"):
        self.s.api("DELETE", self.claim_path(name, ns), expect=200)

    def scores(self, pod, names=None):
        """prioritize-gpuless, as kube-scheduler calls the entry without managedResources."""
        args = {"Pod": pod, "Nodes": None, "NodeNames": list(names or self.NODES)}
        status, res = self.ext.post_json("prioritize-gpuless", args)
        self.assertEqual(status, 200, res)
        return {r["Host"]: r["Score"] for r in te.full_scores(res, args["NodeNames"])}

    def held(self):
        return self.ext.held()

    def wait_held(self, want, what):
        return wait_for(lambda: self.held() == want, 15,
                        what="%s: /inspect holds %s (last %s)" % (what, want, self.held()))

    def wait_inventory(self):
        def ready():
            doc = self.ext.inspect()
            names = {n["name"]: len(n["gpus"]) for n in doc["nodes"]}
            return names.get("dA") == 1 and names.get("dB") == 1 and names.get("n0") == 4
        wait_for(ready, 15, what="dA, dB from their slices and n0 in the inventory")

    def partly_used(self):
        """One claim of 8 GiB and 20 % on dA's GPU."""
        self.add_claim("used", memory="8Gi", cores=20)
        self.allocate("used", "dA", "gpu-0", memory="8Gi", cores=20)
        self.wait_held({("dA", 0): (8 * GIB, 200)}, "the allocated claim charged")


class TestDRAScores(DRATest):

    def test_share_packs_and_whole_gpu_goes_to_the_free_one(self):
        self.start()
        self.wait_inventory()
        self.partly_used()
        self.add_claim("share", memory="4Gi", cores=30)
        self.add_claim("whole")
        self.add_claim("two", count=2)
        time.sleep(0.3)  # the claims reach the extender's watch
        for policy in ("bestfit", "kgpu", "fgd"):
            with self.subTest(policy=policy):
                sc = self.scores(dra_pod("share-" + policy, "share", policy=policy))
                self.assertGreater(sc["dA"], sc["dB"], sc)  # packed beside the used share
                self.assertEqual(sc["n0"], 0, sc)  # no claim is allocated on a plugin node
                sc = self.scores(dra_pod("whole-" + policy, "whole", policy=policy))
                self.assertGreater(sc["dB"], sc["dA"], sc)  # only dB has a whole GPU free
                self.assertEqual((sc["dA"], sc["n0"]), (0, 0), sc)
                # Two GPUs fit no DRA node here: 0 everywhere, and no refusal anywhere.
                self.assertEqual(set(self.scores(dra_pod("two-" + policy, "two",
                                                         policy=policy)).values()), {0})
        # filter passes DRA pods on every node: the DRA plugin is the authority on fit.
        res = self.ext.filter(dra_pod("f", "share"), self.NODES)
        self.assertEqual(sorted(res["NodeNames"]), sorted(self.NODES), res)
        self.assertEqual(self.held(), {("dA", 0): (8 * GIB, 200)})  # scoring charged nothing

    def test_template_claim_resolved_from_the_pod_status(self):
        self.start()
        self.wait_inventory()
        self.partly_used()
        self.add_claim("tmpl-gpu-x1y2z", memory="4Gi", cores=30)
        time.sleep(0.3)
        sc = self.scores(dra_pod("t", template="share-tmpl", resolved="tmpl-gpu-x1y2z",
                                 policy="bestfit"))
        self.assertGreater(sc["dA"], sc["dB"], sc)
        # Not resolved yet: 0 everywhere, said with the pod and the claim entry.
        sc = self.scores(dra_pod("t2", template="share-tmpl"))
        self.assertEqual(set(sc.values()), {0}, sc)
        self.assertIn("pod default/t2: claim gpu (template share-tmpl) has no ResourceClaim",
                      self.ext.log())

    def test_delete_and_deallocate_release(self):
        self.start()
        self.wait_inventory()
        self.partly_used()
        self.add_claim("share", memory="4Gi", cores=30)
        time.sleep(0.3)
        pod = dra_pod("p", "share", policy="bestfit")
        sc = self.scores(pod)
        self.assertGreater(sc["dA"], sc["dB"], sc)
        self.delete_claim("used")
        self.wait_held({}, "the deleted claim released")
        sc = self.scores(pod)
        self.assertEqual(sc["dA"], sc["dB"], sc)  # both GPUs empty again
        # Allocated again, then deallocated (status gone): charged, then released.
        self.add_claim("used", memory="8Gi", cores=20)
        self.allocate("used", "dB", "gpu-0", memory="8Gi", cores=20)
        self.wait_held({("dB", 0): (8 * GIB, 200)}, "charged on dB")
        self.assertGreater(self.scores(pod)["dB"], self.scores(pod)["dA"])
        self.deallocate("used")
        self.wait_held({}, "the deallocated claim released")
        # A whole-GPU allocation (no consumedCapacity) holds all of the GPU.
        self.add_claim("w")
        self.allocate("w", "dA", "gpu-0")
        self.wait_held({("dA", 0): (40 * GIB, 1000)}, "a whole GPU charged")
        sc = self.scores(pod)
        self.assertEqual(sc["dA"], 0, sc)  # nothing fits beside a whole GPU
        self.assertGreater(sc["dB"], 0, sc)

    def test_relist_does_not_double_charge(self):
        self.start()
        self.wait_inventory()
        self.partly_used()
        lists = self.ext.log().count("ResourceClaims of gpu.kgpu.io")
        for how in ({"expire_watches": True}, {"drop_watches": True}):
            self.s.control(**how)
            wait_for(lambda: self.ext.log().count("ResourceClaims of gpu.kgpu.io") > lists, 15,
                     what="the claims relisted after %s" % how)
            lists = self.ext.log().count("ResourceClaims of gpu.kgpu.io")
            self.wait_held({("dA", 0): (8 * GIB, 200)}, "still charged once after %s" % how)
        # A claim deleted while the watch was down is released by the relist.
        self.s.control(fail_lists=2, drop_watches=True)
        self.delete_claim("used")
        self.wait_held({}, "released after the relist")
        # The slices relisted too: the inventory is the same, the charge is made once again.
        self.add_claim("used2", memory="8Gi", cores=20)
        self.allocate("used2", "dB", "gpu-0", memory="8Gi", cores=20)
        self.wait_held({("dB", 0): (8 * GIB, 200)}, "charged on dB")
        self.s.control(expire_watches=True)
        time.sleep(1.5)
        self.wait_held({("dB", 0): (8 * GIB, 200)}, "charged once after the slices relisted")

    def test_missing_claim_scores_zero_and_serving_goes_on(self):
        self.start()
        self.wait_inventory()
        self.partly_used()
        sc = self.scores(dra_pod("lost", "nope"))
        self.assertEqual(sc, {"dA": 0, "dB": 0, "n0": 0})
        wait_for(lambda: "pod default/lost: ResourceClaim default/nope is not known to kgpu"
                 in self.ext.log(), 5, what="the log line naming pod and claim")
        # A claim of another class is not kept, and scores 0 the same way.
        self.add_claim("nic", cls="nic.example.com")
        time.sleep(0.3)
        self.assertEqual(set(self.scores(dra_pod("nic", "nic")).values()), {0})
        # A claim of ours that cannot be read: 0, and why in the log.
        bad = claim_object("bad", memory="lots")
        self.s.api("POST", RES + "/namespaces/default/resourceclaims", bad, expect=201)
        wait_for(lambda: "ResourceClaim default/bad cannot be read" in self.ext.log(), 5,
                 what="the unreadable claim logged")
        self.assertEqual(set(self.scores(dra_pod("bad", "bad")).values()), {0})
        # Still serving: scores, filter, and device-plugin pods are scheduled as before.
        self.add_claim("share", memory="4Gi", cores=30)
        time.sleep(0.3)
        sc = self.scores(dra_pod("ok", "share", policy="bestfit"))
        self.assertGreater(sc["dA"], sc["dB"], sc)
        p = self.s.add_pod(pod_object("gpu-pod", [container("main", share(mem=4))]))
        node, err = self.ext.schedule(p, self.NODES)
        self.assertEqual((node, err), ("n0", ""))
        self.assertEqual(self.ext.get("/healthz")[0], 200)


GQ = "/apis/kgpu.io/v1alpha1/gpuqueues"


class TestDRAQueues(DRATest):
    """Issue 24 item 12: claims of gpu.kgpu.io count in GPU queues, charged at
    allocation to the queue of the pod they are reserved for, and
    filter-gpuless refuses a DRA pod whose claims would pass its queue's limit."""

    def setUp(self):
        super().setUp()
        self.s.api("POST", "/api/v1/namespaces", {"metadata": {
            "name": "ml-a", "annotations": {"kgpu.io/queue": "team-a"}}}, expect=201)
        for name, ns in (("team-a", "ml-a"), ("team-b", "ml-a"), ("other", "elsewhere")):
            self.s.api("POST", GQ, {"apiVersion": "kgpu.io/v1alpha1", "kind": "GPUQueue",
                                    "metadata": {"name": name},
                                    "spec": {"limit": {"gpu": 1}, "namespaces": [ns]}},
                       expect=201)

    def used(self):
        return {q["name"]: q["used"]["gpu_milli"] for q in self.ext.inspect()["queues"]}

    def wait_used(self, want, what):
        return wait_for(lambda: all(self.used().get(k) == v for k, v in want.items()), 15,
                        what="%s: queues use %s (last %s)" % (what, want, self.used()))

    def filter_gpuless(self, pod, names=None):
        args = {"Pod": pod, "Nodes": None, "NodeNames": list(names or self.NODES)}
        status, res = self.ext.post_json("filter-gpuless", args)
        self.assertEqual(status, 200, res)
        return res

    def gpu_pod(self, name, ns="ml-a"):
        return self.s.add_pod(pod_object(name, [container("main", te.whole(1))]), ns)

    def test_claim_charged_at_allocation_and_filter_gpuless(self):
        self.start()
        self.wait_inventory()
        consumer = self.s.add_pod(dra_pod("c", "w"), "ml-a")
        self.add_claim("w", ns="ml-a")
        self.allocate("w", "dA", "gpu-0", ns="ml-a", pod=consumer)
        self.wait_held({("dA", 0): (40 * GIB, 1000)}, "the whole GPU charged")
        # (a) the claim's GPU counts in team-a: its next GPU pod is refused at filter.
        self.wait_used({"team-a": 1000}, "the claim charged to its namespace's queue")
        res = self.ext.filter(self.gpu_pod("g"), ["n0"])
        self.assertEqual(res["FailedNodes"]["n0"], "queue team-a would use 2 GPUs of its limit 1")
        # (b) filter-gpuless: a DRA pod whose claim would pass the limit fails every node...
        self.add_claim("w2", ns="ml-a")
        time.sleep(0.3)  # the claim reaches the extender's watch
        pod = dra_pod("d2", "w2")
        pod["metadata"]["namespace"] = "ml-a"
        res = self.filter_gpuless(pod)
        self.assertEqual(res["NodeNames"], [], res)
        self.assertEqual(sorted(res["FailedAndUnresolvableNodes"]), sorted(self.NODES), res)
        self.assertIn("queue team-a would use 2 GPUs of its limit 1",
                      res["FailedAndUnresolvableNodes"]["dB"])
        # ...a pod without claims passes every node, whatever its namespace's queue holds...
        plain = pod_object("plain", [container("main")])
        plain["metadata"]["namespace"] = "ml-a"
        self.assertEqual(self.filter_gpuless(plain)["NodeNames"], self.NODES)
        # ...and a pod whose claim is allocated already (charged) passes too.
        again = dra_pod("c", "w")
        again["metadata"]["namespace"] = "ml-a"
        self.assertEqual(self.filter_gpuless(again)["NodeNames"], self.NODES)
        # (c) deleting the claim uncharges: the DRA pod within the limit passes now.
        self.delete_claim("w", ns="ml-a")
        self.wait_used({"team-a": 0}, "the deleted claim uncharged")
        res = self.filter_gpuless(pod)
        self.assertEqual(res["NodeNames"], self.NODES, res)
        # Allocated, then deallocated: charged, then uncharged.
        self.allocate("w2", "dB", "gpu-0", ns="ml-a")
        self.wait_used({"team-a": 1000}, "w2 charged")
        self.deallocate("w2", ns="ml-a")
        self.wait_used({"team-a": 0}, "the deallocated claim uncharged")

    def test_the_consumers_label_picks_among_its_namespaces_queues(self):
        self.start()
        self.wait_inventory()
        b = dra_pod("b", "cb")
        b["metadata"]["labels"]["kgpu.io/queue"] = "team-b"
        b = self.s.add_pod(b, "ml-a")
        x = dra_pod("x", "cx")
        x["metadata"]["labels"]["kgpu.io/queue"] = "other"  # not a queue ml-a may use
        x = self.s.add_pod(x, "ml-a")
        self.add_claim("cb", ns="ml-a", memory="8Gi", cores=50)
        self.add_claim("cx", ns="ml-a", memory="8Gi", cores=50)
        time.sleep(0.3)
        self.allocate("cb", "dA", "gpu-0", memory="8Gi", cores=50, ns="ml-a", pod=b)
        self.allocate("cx", "dB", "gpu-0", memory="8Gi", cores=50, ns="ml-a", pod=x)
        self.wait_used({"team-b": 500, "team-a": 500, "other": 0},
                       "cb in team-b by its pod's label, cx in ml-a's queue")
        # The queues rebuilt (a new GPUQueue): charged again, once.
        self.s.api("POST", GQ, {"apiVersion": "kgpu.io/v1alpha1", "kind": "GPUQueue",
                                "metadata": {"name": "new"}, "spec": {}}, expect=201)
        wait_for(lambda: "new" in self.used(), 15, what="the new queue")
        self.assertEqual({k: self.used()[k] for k in ("team-a", "team-b")},
                         {"team-a": 500, "team-b": 500})


class TestNotDRA(DRATest):

    def test_a_node_that_is_not_labelled_is_unaffected(self):
        # n0 (device plugin, 4 x V100) also has a slice and a claim allocated on it.
        self.add_slice("n0", [("A100-SXM4-40GB", 40 * GIB)])
        self.start()
        self.wait_inventory()
        self.add_claim("stray", memory="8Gi", cores=20)
        self.allocate("stray", "n0", "gpu-0", memory="8Gi", cores=20)
        self.partly_used()
        doc = self.ext.inspect()
        n0 = [n for n in doc["nodes"] if n["name"] == "n0"][0]
        self.assertEqual([(g["model"], g["memory_mib"]) for g in n0["gpus"]],
                         [("V100", 16 * GIB)] * 4)
        self.assertEqual(self.held(), {("dA", 0): (8 * GIB, 200)})  # nothing charged on n0
        # A device-plugin pod is placed and scored on n0 as before; DRA nodes are not its.
        p = self.s.add_pod(pod_object("gpu-pod", [container("main", share(mem=4))]))
        sc = {r["Host"]: r["Score"] for r in self.ext.prioritize(p, self.NODES)}
        self.assertEqual((sc["dA"], sc["dB"]), (0, 0), sc)
        self.assertGreater(sc["n0"], 0, sc)
        res = self.ext.filter(p, self.NODES)
        self.assertEqual(res["NodeNames"], ["n0"], res)
        self.assertEqual(self.ext.bind(p, "n0"), "")
        # A pod without claims is scored by its CPU, on every inventory node, as before.
        plain = self.s.add_pod(pod_object("cpu-pod", [container("main", cpu="2")]))
        sc = self.scores(plain)
        self.assertTrue(all(v >= 0 for v in sc.values()), sc)
        # Labelled later (its device-plugin pod gone first): n0 becomes a DRA node with its
        # slice's GPU, and the claim on it counts.
        self.s.delete_pod("default", "gpu-pod")
        self.wait_held({("dA", 0): (8 * GIB, 200)}, "the device-plugin pod gone")
        self.s.api("PATCH", "/api/v1/nodes/n0",
                   {"metadata": {"labels": DRA_LABEL}}, "application/merge-patch+json",
                   expect=200)

        def n0_dra():
            g = self.ext.gpu("n0", 0)
            return g is not None and g["model"] == "A100-SXM4-40GB" and \
                self.held().get(("n0", 0)) == (8 * GIB, 200)
        wait_for(n0_dra, 15, what="n0's GPU from its slice, the stray claim charged")

    def test_a_dra_nodes_gpu_annotation_is_not_read(self):
        """Found against the real kube-scheduler: a DRA node that carries kgpu.io/gpus
        (empty, as a node object written with no GPUs has it, or left broken by a device
        plugin that ran there before) was dropped from the inventory whole, so its claims
        were never charged. A DRA node's GPUs are its slice's: the annotation is not read."""
        for name, text in (("dE", "[]"), ("dF", "{not json")):
            node = node_object(name, labels=DRA_LABEL)
            node["metadata"].setdefault("annotations", {})["kgpu.io/gpus"] = text
            self.s.api("POST", "/api/v1/nodes", node, expect=201)
            self.add_slice(name, [("A100-SXM4-40GB", 40 * GIB)])
        self.start()
        self.wait_inventory()
        self.add_claim("on-e", memory="8Gi", cores=20)
        self.allocate("on-e", "dE", "gpu-0", memory="8Gi", cores=20)
        self.add_claim("on-f", memory="4Gi", cores=10)
        self.allocate("on-f", "dF", "gpu-0", memory="4Gi", cores=10)
        self.wait_held({("dE", 0): (8 * GIB, 200), ("dF", 0): (4 * GIB, 100)},
                       "both claims charged on the annotated DRA nodes")
        # And by a watch event too: a label change re-reads the node.
        self.s.api("PATCH", "/api/v1/nodes/dE", {"metadata": {"labels": {"x": "y"}}},
                   "application/merge-patch+json", expect=200)
        time.sleep(0.5)
        self.assertEqual(self.held().get(("dE", 0)), (8 * GIB, 200))

    def test_no_resource_api_runs_as_before(self):
        self.s.control(dra_absent=True)
        self.start()
        time.sleep(1.5)  # a few relists
        doc = self.ext.inspect()
        self.assertEqual(sorted(n["name"] for n in doc["nodes"]), ["n0"])
        log = self.ext.log()
        self.assertEqual(log.count("no ResourceSlice resource"), 1, log)
        self.assertEqual(log.count("no ResourceClaim resource"), 1, log)
        p = self.s.add_pod(pod_object("gpu-pod", [container("main", share(mem=4))]))
        self.assertEqual(self.ext.schedule(p, self.NODES), ("n0", ""))
        self.assertEqual(set(self.scores(dra_pod("d", "share")).values()), {0})
        # Served again: DRA nodes appear, claims count.
        self.s.control(dra_absent=False)
        self.add_claim("used", memory="8Gi", cores=20)
        self.allocate("used", "dA", "gpu-0", memory="8Gi", cores=20)
        wait_for(lambda: self.held().get(("dA", 0)) == (8 * GIB, 200), 40,
                 what="DRA read once served")
        self.assertIn("resource.k8s.io/v1 ResourceSlices are served now", self.ext.log())


def main():
    return te.main_with_binaries("test_extender_dra", __doc__)


if __name__ == "__main__":
    sys.exit(main())
