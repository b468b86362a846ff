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
- every request of every claim of a pod is scored together (issue 30): a
  node that fits one of two scores 0; CEL selectors pick the models scored,
  and a selector kgpu does not read is not trusted, and said so;
- MIG devices in slices: a profile goes where it costs the least room, a
  GPU used whole offers no MIG instance and a GPU with instances fits no
  whole or share request;
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

import json
import sys
import time

import test_extender as te
from harness import wait_for
from test_extender import ExtenderTest, container, gpu_list, node_object, pod_object, share

RES = "/apis/resource.k8s.io/v1"
MIG_CLASS = "mig.gpu.kgpu.io"  # the DeviceClass of MIG partitions
DRA_LABEL = {"kgpu.io/gpu-allocator": "dra"}
GIB = 1024


def dra_slice(node, gpus, generation=1, driver="gpu.kgpu.io", cc="8.0.0"):
    """The slice kgpu-dra-plugin publishes: gpus is [(model, memory MiB)]; cc their
    computeCapability."""
    devices = []
    for i, (model, mib) in enumerate(gpus):
        devices.append({
            "name": "gpu-%d" % i, "allowMultipleAllocations": True,
            "attributes": {"index": {"int": i}, "uuid": {"string": "GPU-%s-%d" % (node, i)},
                           "model": {"string": model}, "productName": {"string": model},
                           "memoryMiB": {"int": mib}, "computeCapability": {"version": cc}},
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


def request_object(rname="gpu", memory=None, cores=None, count=None, cls="gpu.kgpu.io",
                   cel=None):
    """One request of a claim; cel: a selector expression or a list of them."""
    exactly = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count or 1}
    reqs = {}
    if memory is not None:
        reqs["memory"] = memory
    if cores is not None:
        reqs["cores"] = str(cores)
    if reqs:
        exactly["capacity"] = {"requests": reqs}
    if cel is not None:
        exactly["selectors"] = [{"cel": {"expression": e}}
                                for e in ([cel] if isinstance(cel, str) else cel)]
    return {"name": rname, "exactly": exactly}


def claim_object(name, memory=None, cores=None, count=None, cls="gpu.kgpu.io", cel=None,
                 requests=None):
    """requests: a list of request_object() instead of the one built from the rest."""
    reqs = requests or [request_object("gpu", memory, cores, count, cls, cel)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": reqs}}}


# The MIG profiles of an A100-SXM4-40GB (src/core/mig.c): name, memory slices, memory MiB,
# starts in the order kgpu's driver lists them (kgpu_mig_slice_order).
A100_40GB_MIG = [("1g.5gb", 1, 4864, [6, 5, 4, 3, 2, 1, 0]),
                 ("1g.10gb", 2, 9856, [6, 4, 2, 0]),
                 ("2g.10gb", 2, 9856, [4, 2, 0]),
                 ("3g.20gb", 4, 19968, [4, 0]),
                 ("4g.20gb", 4, 19968, [0]),
                 ("7g.40gb", 8, 40192, [0])]


def mig_name(gpu, profile, start):
    return "gpu-%d-mig-%s-%d" % (gpu, profile.replace(".", "-"), start)


def mig_slice(node, ngpus=1, generation=1):
    """A slice as kgpu-dra-plugin publishes it with MIG on (issue 30): each A100-40GB whole
    as gpu-N, and every placement of every profile as a device with attributes mig, profile,
    migStart, migSize, parentIndex and index (the GPU's) and memoryMiB (the profile's)."""
    s = dra_slice(node, [("A100-SXM4-40GB", 40 * GIB)] * ngpus, generation)
    for g in range(ngpus):
        for profile, size, mib, starts in A100_40GB_MIG:
            for start in starts:
                s["spec"]["devices"].append({
                    "name": mig_name(g, profile, start),
                    "attributes": {"mig": {"bool": True}, "profile": {"string": profile},
                                   "migStart": {"int": start}, "migSize": {"int": size},
                                   "parentIndex": {"int": g}, "index": {"int": g},
                                   "memoryMiB": {"int": mib},
                                   "productName": {"string": "A100-SXM4-40GB"}},
                    "consumesCounters": [{"counterSet": "gpu-%d" % g, "counters": {
                        "memory-slice-%d" % k: {"value": "1"}
                        for k in range(start, start + size)}}]})
    return s


def pool_slices(node, ngpus, generation=1):
    """The same devices as a pool of three slices, as the API requires once devices consume
    counters: the counter sets alone, the whole GPUs, then the MIG devices."""
    whole = mig_slice(node, ngpus, generation)
    devices = whole["spec"]["devices"]
    out = []
    for suffix, spec in (
            ("counters", {"sharedCounters": [
                {"name": "gpu-%d" % g, "counters": {"memory-slice-%d" % k: {"value": "1"}
                                                     for k in range(8)}}
                for g in range(ngpus)]}),
            ("gpus", {"devices": [d for d in devices if "mig" not in d["attributes"]]}),
            ("mig", {"devices": [d for d in devices if "mig" in d["attributes"]]})):
        sl = json.loads(json.dumps(whole))
        sl["metadata"]["name"] = "%s-%s" % (node, suffix)
        sl["spec"].pop("devices")
        sl["spec"].update(spec)
        sl["spec"]["pool"]["resourceSliceCount"] = 3
        out.append(sl)
    return out


def profile_is(name):
    return 'device.attributes["gpu.kgpu.io"].profile == "%s"' % name


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


def dra_pod_claims(name, claims, policy=None):
    """A pod whose container uses every claim of `claims` (by name), one entry each."""
    c = container("main")
    c["resources"]["claims"] = [{"name": "c%d" % i} for i in range(len(claims))]
    p = pod_object(name, [c], annotations={"kgpu.io/policy": policy} if policy else None)
    p["spec"]["resourceClaims"] = [{"name": "c%d" % i, "resourceClaimName": claim}
                                   for i, claim in enumerate(claims)]
    return p


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

    def wait_log(self, text, what):
        wait_for(lambda: text in self.ext.log(), 5, what="%s: the log says %r" % (what, text))

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


class TestDRAEveryRequest(DRATest):
    """Issue 30: every request of class gpu.kgpu.io of every claim of a pod, together."""

    def test_a_claim_of_two_requests_is_scored_as_both(self):
        self.start()
        self.wait_inventory()
        self.partly_used()  # dA: 32 GiB free; dB: 40 GiB
        two = [request_object("a", memory="20Gi", cores=30),
               request_object("b", memory="20Gi", cores=30)]
        self.add_claim("two", requests=two)
        self.add_claim("one", memory="20Gi", cores=30)
        time.sleep(0.3)
        for policy in ("bestfit", "kgpu"):
            with self.subTest(policy=policy):
                # One request alone packs beside the used share on dA...
                sc = self.scores(dra_pod("one-" + policy, "one", policy=policy))
                self.assertGreater(sc["dA"], sc["dB"], sc)
                # ...two of 20 GiB fit dA's one GPU no more: only dB.
                sc = self.scores(dra_pod("two-" + policy, "two", policy=policy))
                self.assertEqual(sc["dA"], 0, sc)
                self.assertGreater(sc["dB"], 0, sc)
        self.assertEqual(self.held(), {("dA", 0): (8 * GIB, 200)})  # scoring charged nothing
        # count 2 of one request is two devices: no node of one GPU fits them.
        self.add_claim("twice", memory="4Gi", cores=10, count=2)
        time.sleep(0.3)
        sc = self.scores(dra_pod("twice", "twice", policy="bestfit"))
        self.assertEqual(set(sc.values()), {0}, sc)
        self.wait_log("pod default/twice: its 1 requests of class gpu.kgpu.io fit none of the "
                      "2 DRA nodes scored; node dA: ", "the reason")

    def test_a_pod_with_two_claims_is_scored_by_both(self):
        self.start()
        self.wait_inventory()
        self.partly_used()
        self.add_claim("c1", memory="20Gi", cores=30)
        self.add_claim("c2", memory="20Gi", cores=30)
        self.add_claim("small", memory="2Gi", cores=10)
        self.add_claim("other", cls="nic.example.com")  # another driver's: not kgpu's to score
        time.sleep(0.3)
        sc = self.scores(dra_pod_claims("both", ["c1", "c2"], policy="bestfit"))
        self.assertEqual(sc["dA"], 0, sc)
        self.assertGreater(sc["dB"], 0, sc)
        sc = self.scores(dra_pod_claims("fits", ["c1", "small", "other"], policy="bestfit"))
        self.assertGreater(sc["dA"], sc["dB"], sc)  # 22 GiB fit beside the used 8 on dA
        # A claim allocated already is charged, not scored again.
        self.allocate("c1", "dB", "gpu-0", memory="20Gi", cores=30)
        self.wait_held({("dA", 0): (8 * GIB, 200), ("dB", 0): (20 * GIB, 300)}, "c1 on dB")
        sc = self.scores(dra_pod_claims("rest", ["c1", "c2"], policy="kgpu"))
        self.assertGreater(min(sc["dA"], sc["dB"]), 0, sc)  # c2 alone: 20 GiB fit either

    def test_a_tainted_gpu_takes_nothing(self):
        # The driver keeps a sick GPU in its slice with a NoSchedule taint on its devices.
        sl = dra_slice("dB", [("A100-SXM4-40GB", 40 * GIB)], generation=2)
        sl["spec"]["devices"][0]["taints"] = [{"key": "gpu.kgpu.io/unhealthy",
                                                "effect": "NoSchedule"}]
        self.s.api("PUT", RES + "/resourceslices/" + sl["metadata"]["name"], sl, expect=200)
        self.start()
        self.wait_inventory()
        wait_for(lambda: self.ext.gpu("dB", 0)["healthy"] is False, 15, what="dB's GPU sick")
        self.add_claim("whole")
        time.sleep(0.3)
        sc = self.scores(dra_pod("w", "whole", policy="bestfit"))
        self.assertEqual((sc["dA"] > 0, sc["dB"]), (True, 0), sc)

    def test_allocation_mode_all_is_refused_with_a_reason(self):
        self.start()
        self.wait_inventory()
        req = request_object("all")
        req["exactly"]["allocationMode"] = "All"
        del req["exactly"]["count"]
        self.add_claim("all", requests=[req])
        time.sleep(0.3)
        self.assertEqual(set(self.scores(dra_pod("all", "all")).values()), {0})
        self.wait_log("request #1 asks for all devices (allocationMode All), which kgpu does "
                      "not score", "All refused")


class TestDRASelectors(DRATest):
    """CEL selectors: the subset kgpu reads picks what is scored; the rest is not trusted."""

    NODES = ["dA", "dB", "dT", "n0"]

    def setUp(self):
        super().setUp()
        self.s.api("POST", "/api/v1/nodes", node_object("dT", labels=DRA_LABEL), expect=201)
        self.add_slice("dT", [("Tesla T4", 15 * GIB)], cc="7.5.0")

    def wait_inventory(self):
        super().wait_inventory()
        wait_for(lambda: self.ext.gpu("dT", 0) is not None, 15, what="dT in the inventory")

    def test_a_selector_on_the_model_picks_only_matching_gpus(self):
        self.start()
        self.wait_inventory()
        attr = 'device.attributes["gpu.kgpu.io"].productName'
        cases = {
            "t4": (attr + ' == "Tesla T4"', {"dT"}),
            "a100": (attr + ' in ["A100-SXM4-40GB", "H100"]', {"dA", "dB"}),
            "not-t4": ('!(%s == "Tesla T4") && device.driver == "gpu.kgpu.io"' % attr,
                       {"dA", "dB"}),
            "big": ('device.capacity["gpu.kgpu.io"].memory.compareTo(quantity("32Gi")) >= 0',
                    {"dA", "dB"}),
            "small": ('device.attributes["gpu.kgpu.io"].memoryMiB < 20000 || '
                      + attr + ' == "nothing"', {"dT"}),
            "ampere": ('device.attributes["gpu.kgpu.io"].computeCapability'
                       '.compareTo(semver("8.0.0")) >= 0', {"dA", "dB"}),
        }
        for name, (cel, _) in cases.items():
            self.add_claim(name, memory="4Gi", cores=10, cel=cel)
        time.sleep(0.3)
        for name, (cel, want) in cases.items():
            with self.subTest(selector=cel):
                sc = self.scores(dra_pod(name, name, policy="kgpu"))
                self.assertEqual({n for n, v in sc.items() if v > 0}, want, sc)
        # What no device matches fits nowhere, and the log says which request.
        self.add_claim("h100", memory="4Gi", cel=attr + ' == "H100"')
        time.sleep(0.3)
        self.assertEqual(set(self.scores(dra_pod("h100", "h100")).values()), {0})
        self.wait_log("ResourceClaim default/h100 request #1: no device of the 3 DRA nodes "
                      "scored matches its selectors", "no match")

    def test_a_selector_kgpu_does_not_read_is_not_trusted(self):
        self.start()
        self.wait_inventory()
        attr = 'device.attributes["gpu.kgpu.io"].productName'
        self.add_claim("method", memory="4Gi", cores=10, cel=attr + '.startsWith("Tesla")')
        self.add_claim("long", memory="4Gi", cores=10,
                       cel=" || ".join([attr + ' == "Tesla T4"'] * 40))  # > 1024 bytes
        self.add_claim("deep", memory="4Gi", cores=10, cel="(" * 30 + "true" + ")" * 30)
        time.sleep(0.3)
        for name, said in (("method", "method startsWith is not read by kgpu"),
                           ("long", "a selector longer than 1024 bytes"),
                           ("deep", "nested deeper than 12")):
            with self.subTest(claim=name):
                sc = self.scores(dra_pod(name, name, policy="kgpu"))
                # Any GPU of the class: every DRA node scores, the plugin node does not.
                self.assertEqual({n for n, v in sc.items() if v > 0}, {"dA", "dB", "dT"}, sc)
                self.wait_log("ResourceClaim default/%s request #1: selector not read (%s): "
                              "scored as any device of its class" % (name, said), name)
        self.assertEqual(self.ext.get("/healthz")[0], 200)


class TestDRAMIG(DRATest):
    """MIG devices in slices (issue 30): where a profile goes, and one kind of use a GPU."""

    NODES = ["mA", "mB", "mC"]

    def setUp(self):
        super().setUp()
        for n in self.NODES:
            self.s.api("POST", "/api/v1/nodes", node_object(n, labels=DRA_LABEL), expect=201)
            self.s.api("POST", RES + "/resourceslices", mig_slice(n), expect=201)

    def wait_inventory(self):
        wait_for(lambda: all(self.ext.gpu(n, 0) is not None for n in self.NODES), 15,
                 what="the MIG nodes in the inventory")

    def mig_claim(self, name, profile, node=None, start=None):
        """A claim of one `profile` instance; allocated at `start` on `node` when given."""
        self.add_claim(name, cls=MIG_CLASS, cel=profile_is(profile))
        if node is not None:
            self.allocate(name, node, mig_name(0, profile, start))

    def test_a_profile_goes_where_it_costs_the_least_room(self):
        self.start()
        self.wait_inventory()
        self.mig_claim("a-1g", "1g.5gb", "mA", 6)  # mA: a 1g at 6: a 3g must go to 0
        self.mig_claim("c-4g", "4g.20gb", "mC", 0)  # mC: a 4g: a 3g at 4 completes the GPU
        # While a GPU has instances, the cluster holds it whole.
        self.wait_held({("mA", 0): (40 * GIB, 1000), ("mC", 0): (40 * GIB, 1000)},
                       "the MIG instances charged")
        self.mig_claim("want-3g", "3g.20gb")
        time.sleep(0.3)
        sc = self.scores(dra_pod("p3g", "want-3g"))
        # mC loses the least room (the 3g fills what its 4g left); of mA and mB, which lose
        # as much (17) and strand nothing, mA is the fuller: the 3g goes beside its 1g
        # (at 0, where the allocator takes it) and mB's GPU stays empty for a 7g.
        self.assertEqual((sc["mC"], sc["mA"], sc["mB"]), (10, 9, 8), sc)
        # Two instances of one claim: a 3g and a 4g fit only the empty GPU.
        both = [request_object("a", cls=MIG_CLASS, cel=profile_is("3g.20gb")),
                request_object("b", cls=MIG_CLASS, cel=profile_is("4g.20gb"))]
        self.add_claim("3g4g", requests=both)
        time.sleep(0.3)
        sc = self.scores(dra_pod("p34", "3g4g"))
        self.assertEqual((sc["mA"], sc["mB"], sc["mC"]), (0, 10, 0), sc)
        # Released: mA's GPU is empty again, and scores as mB does.
        self.delete_claim("a-1g")
        self.wait_held({("mC", 0): (40 * GIB, 1000)}, "mA's instance released")
        sc = self.scores(dra_pod("p3g-2", "want-3g"))
        self.assertEqual(sc["mA"], sc["mB"], sc)

    def test_one_kind_of_use_of_a_gpu(self):
        self.start()
        self.wait_inventory()
        self.add_claim("whole")
        self.allocate("whole", "mA", "gpu-0")  # mA's GPU used whole
        self.add_claim("share", memory="8Gi", cores=20)
        self.allocate("share", "mB", "gpu-0", memory="8Gi", cores=20)  # mB's in a share
        self.mig_claim("inst", "2g.10gb", "mC", 4)  # mC's holds a MIG instance
        self.wait_held({("mA", 0): (40 * GIB, 1000), ("mB", 0): (8 * GIB, 200),
                        ("mC", 0): (40 * GIB, 1000)}, "the three uses charged")
        self.mig_claim("want-1g", "1g.5gb")
        self.add_claim("want-whole")
        self.add_claim("want-share", memory="4Gi", cores=10)
        time.sleep(0.3)
        # A MIG profile fits only beside the instance, not on a GPU used whole or in shares.
        sc = self.scores(dra_pod("p1g", "want-1g"))
        self.assertEqual((sc["mA"], sc["mB"]), (0, 0), sc)
        self.assertGreater(sc["mC"], 0, sc)
        sc = self.scores(dra_pod("p1g-a", "want-1g"), ["mA"])
        self.wait_log("node mA: ResourceClaim default/want-1g request #1: no MIG device it "
                      "selects is free there", "MIG refused beside a whole GPU")
        # A profile asked of class gpu.kgpu.io matches nothing: that class has no partition.
        self.add_claim("wrong-class", cel=profile_is("1g.5gb"))
        time.sleep(0.3)
        self.assertEqual(set(self.scores(dra_pod("pwc", "wrong-class")).values()), {0})
        self.wait_log("ResourceClaim default/wrong-class request #1: no device of the 3 DRA "
                      "nodes scored matches its selectors", "no partition of gpu.kgpu.io")
        # Any partition of mig.gpu.kgpu.io (no selector) fits only beside the instance.
        self.add_claim("any-mig", cls=MIG_CLASS)
        time.sleep(0.3)
        sc = self.scores(dra_pod("pany", "any-mig"))
        self.assertEqual((sc["mA"], sc["mB"]), (0, 0), sc)
        self.assertGreater(sc["mC"], 0, sc)
        # And the reverse: no whole GPU or share where a MIG instance is.
        sc = self.scores(dra_pod("pw", "want-whole", policy="bestfit"))
        self.assertEqual(set(sc.values()), {0}, sc)
        sc = self.scores(dra_pod("ps", "want-share", policy="bestfit"))
        self.assertEqual((sc["mA"], sc["mC"]), (0, 0), sc)
        self.assertGreater(sc["mB"], 0, sc)
        # The instance gone, mC's GPU is whole again.
        self.deallocate("inst")
        self.wait_held({("mA", 0): (40 * GIB, 1000), ("mB", 0): (8 * GIB, 200)}, "released")
        sc = self.scores(dra_pod("pw2", "want-whole", policy="bestfit"))
        self.assertGreater(sc["mC"], 0, sc)

    def test_a_pool_of_several_slices(self):
        self.s.api("POST", "/api/v1/nodes", node_object("mP", labels=DRA_LABEL), expect=201)
        for sl in pool_slices("mP", 2):
            self.s.api("POST", RES + "/resourceslices", sl, expect=201)
        self.start()
        wait_for(lambda: self.ext.gpu("mP", 1) is not None, 15, what="mP's two GPUs")
        # A MIG device of the third slice names a GPU of the second: charged there.
        self.mig_claim("on-1", "3g.20gb")
        self.allocate("on-1", "mP", mig_name(1, "3g.20gb", 4))
        self.wait_held({("mP", 1): (40 * GIB, 1000)}, "an instance on mP's second GPU")
        self.mig_claim("want", "4g.20gb")
        time.sleep(0.3)
        self.assertGreater(self.scores(dra_pod("p", "want"), ["mP"])["mP"], 0)
        # The MIG slice gone: no instance is offered on mP, its GPUs stay.
        self.s.api("DELETE", RES + "/resourceslices/mP-mig", expect=200)
        wait_for(lambda: self.scores(dra_pod("p2", "want"), ["mP"])["mP"] == 0, 15,
                 what="no MIG device on mP")
        self.assertIsNotNone(self.ext.gpu("mP", 1))
        # A new generation of one GPU: the slices of the old one no longer count.
        for sl in pool_slices("mP", 1, generation=2)[:2]:
            self.s.api("PUT", RES + "/resourceslices/" + sl["metadata"]["name"], sl, expect=200)
        wait_for(lambda: self.ext.gpu("mP", 1) is None and self.ext.gpu("mP", 0) is not None,
                 15, what="mP with one GPU")

    def test_mig_devices_of_unknown_profiles_are_skipped(self):
        s = mig_slice("mX")
        s["spec"]["devices"].append({"name": "gpu-0-mig-9g", "attributes": {
            "mig": {"bool": True}, "profile": {"string": "9g.99gb"}, "migStart": {"int": 0},
            "migSize": {"int": 8}, "index": {"int": 0}}})
        self.s.api("POST", "/api/v1/nodes", node_object("mX", labels=DRA_LABEL), expect=201)
        self.s.api("POST", RES + "/resourceslices", s, expect=201)
        self.start()
        wait_for(lambda: self.ext.gpu("mX", 0) is not None, 15, what="mX kept, its GPU read")
        self.wait_log("DRA pool mX: 1 devices not read (the first: gpu-0-mig-9g: profile "
                      "9g.99gb is of no MIG model kgpu knows)", "the skipped device")
        self.mig_claim("x", "3g.20gb", "mX", 4)
        self.wait_held({("mX", 0): (40 * GIB, 1000)}, "a known profile charged on mX")


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
