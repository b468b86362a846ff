#!/usr/bin/env python3
"""Stand-ins for the DRA driver's peers, for integration tests.

ApiStandin: the part of the Kubernetes API server a DRA driver meets
(stdlib only, in-process): GET of a Node and of namespaced ResourceClaims
(resource.k8s.io/v1), and ResourceSlices (cluster-scoped) with list (field
selectors spec.nodeName and spec.driver, which the real server supports
for resourceslices), get, create, update and delete. It behaves as the real
server is documented to:
  - create of an existing name: 409 reason AlreadyExists; get or delete of
    a missing one: 404 NotFound;
  - update carrying metadata.resourceVersion that is not the stored one:
    409 Conflict (optimistic concurrency); every write bumps one global
    resourceVersion;
  - a ResourceSlice that breaks resource.k8s.io/v1 validation is refused
    with 422 Invalid. The rules checked are those of Kubernetes v1.37's
    pkg/apis/resource/validation that a driver can break: driver and pool
    name, resourceSliceCount > 0, generation >= 0, exactly one of
    nodeName/nodeSelector/allNodes/perDeviceNodeSelection, at most 128
    devices (ResourceSliceMaxDevices), device names as DNS labels and
    unique, at most 32 attributes and capacities per device, each
    attribute exactly one of int/bool/string/version, requestPolicy only
    on devices with allowMultipleAllocations, and a validRange whose min
    <= capacity, default >= min, max <= capacity, default <= max, step > 0,
    min + step <= capacity and (default - min) and (max - min) multiples
    of step.

DraKubelet: kubelet's side of the plugin registration and DRA APIs on
grpcio (another gRPC stack than the driver's gRPC core): GetInfo and
NotifyRegistrationStatus on the registration socket as kubelet's plugin
watcher calls them, the choice of service as kubelet v1.37 makes it (the
first of the plugin's supported_versions that kubelet knows, of
"v1.DRAPlugin", "v1beta1.DRAPlugin"), and NodePrepareResources /
NodeUnprepareResources on either version. Messages come from the repo's
proto files compiled with protoc at start.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import grpc

KUBELET_SERVICES = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]  # kubelet v1.37, newest first
DRA_PACKAGE = {"v1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1",
               "v1beta1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1beta1"}

SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


def quantity(text):
    """A Kubernetes quantity's value (float for milli values), or raise ValueError."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?", str(text))
    if not m:
        raise ValueError("quantities must match the regular expression "
                         "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': %r" % text)
    number = float(m.group(1)) if "." in m.group(1) else int(m.group(1))
    if m.group(2) == "m":
        return number / 1000.0
    return number * SUFFIX[m.group(2) or ""]


DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
C_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
SEMVER = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$")


def qualified_name(name):
    domain, _, ident = name.rpartition("/")
    return bool(C_IDENT.match(ident)) and len(ident) <= 32 and len(domain) <= 63


def validate_slice(obj):
    """Errors of a ResourceSlice as the v1.37 API server's validation finds them."""
    errs = []
    spec = obj.get("spec") or {}
    if not isinstance(obj.get("metadata", {}).get("name"), str):
        errs.append("metadata.name: Required value")
    if not isinstance(spec.get("driver"), str) or not re.fullmatch(
            r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", spec["driver"]) \
            or len(spec["driver"]) > 63:
        errs.append("spec.driver: Invalid value")
    pool = spec.get("pool") or {}
    if not isinstance(pool.get("name"), str) or not pool["name"]:
        errs.append("spec.pool.name: Required value")
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] <= 0:
        errs.append("spec.pool.resourceSliceCount: must be greater than zero")
    if not isinstance(pool.get("generation"), int) or pool["generation"] < 0:
        errs.append("spec.pool.generation: must be greater than or equal to zero")
    chosen = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
              if spec.get(k) not in (None, False, "")]
    if len(chosen) != 1:
        errs.append("spec: Invalid value: exactly one of nodeName, nodeSelector, allNodes, "
                    "perDeviceNodeSelection is required, got %s" % chosen)
    if spec.get("devices") is not None and spec.get("sharedCounters") is not None:
        errs.append("spec: Invalid value: \"\": only one of `sharedCounters` or `devices` is "
                    "allowed")
    devices = spec.get("devices") or []
    advanced = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    most = 64 if advanced else 128
    if len(devices) > most:
        errs.append("spec.devices: Too many: %d: must have at most %d items" % (len(devices), most))
    sets = spec.get("sharedCounters") or []
    if len(sets) > 8:
        errs.append("spec.sharedCounters: Too many: %d: must have at most 8 items" % len(sets))
    set_names = set()
    for i, cs in enumerate(sets):
        where = "spec.sharedCounters[%d]" % i
        if not isinstance(cs.get("name"), str) or not DNS_LABEL.match(cs["name"]) \
                or len(cs["name"]) > 63 or cs["name"] in set_names:
            errs.append(where + ".name: Invalid value: %r" % cs.get("name"))
        set_names.add(cs.get("name"))
        errs += validate_counters(cs.get("counters"), where + ".counters", required=True)
    names = set()
    for i, dev in enumerate(devices):
        where = "spec.devices[%d]" % i
        name = dev.get("name")
        if not isinstance(name, str) or not DNS_LABEL.match(name) or len(name) > 63:
            errs.append(where + ".name: Invalid value: %r" % name)
        if name in names:
            errs.append(where + ".name: Duplicate value: %r" % name)
        names.add(name)
        attrs, caps = dev.get("attributes") or {}, dev.get("capacity") or {}
        if len(attrs) + len(caps) > 32:
            errs.append(where + ": the total number of attributes and capacities must not "
                        "exceed 32")
        for k, v in attrs.items():
            if not qualified_name(k):
                errs.append(where + ".attributes[%s]: Invalid value" % k)
            kinds = [t for t in ("int", "bool", "string", "version") if t in v]
            if len(kinds) != 1:
                errs.append(where + ".attributes[%s]: exactly one value must be specified" % k)
            elif kinds[0] == "version" and not SEMVER.match(v["version"]):
                errs.append(where + ".attributes[%s].version: must be a semantic version" % k)
            elif kinds[0] == "int" and not isinstance(v["int"], int):
                errs.append(where + ".attributes[%s].int: not an integer" % k)
        taints = dev.get("taints") or []
        if len(taints) > 16:
            errs.append(where + ".taints: Too many: must have at most 16 items")
        for t, taint in enumerate(taints):
            tw = where + ".taints[%d]" % t
            if not isinstance(taint.get("key"), str) or not qualified_name(taint["key"]):
                errs.append(tw + ".key: Invalid value: %r" % taint.get("key"))
            if taint.get("effect") not in ("None", "NoSchedule", "NoExecute"):
                errs.append(tw + ".effect: Unsupported value: %r" % taint.get("effect"))
        consumes = dev.get("consumesCounters") or []
        if len(consumes) > 2:
            errs.append(where + ".consumesCounters: Too many: must have at most 2 items")
        if len({c.get("counterSet") for c in consumes}) != len(consumes):
            errs.append(where + ".consumesCounters: Duplicate value")
        for c, cons in enumerate(consumes):
            cw = where + ".consumesCounters[%d]" % c
            if not isinstance(cons.get("counterSet"), str) or \
                    not DNS_LABEL.match(cons["counterSet"]):
                errs.append(cw + ".counterSet: Invalid value: %r" % cons.get("counterSet"))
            errs += validate_counters(cons.get("counters"), cw + ".counters", required=True)
        multi = dev.get("allowMultipleAllocations") is True
        for k, c in caps.items():
            cw = where + ".capacity[%s]" % k
            if not qualified_name(k):
                errs.append(cw + ": Invalid value")
            try:
                value = quantity(c.get("value"))
            except ValueError as e:
                errs.append(cw + ".value: " + str(e))
                continue
            policy = c.get("requestPolicy")
            if policy is None:
                continue
            if not multi:
                errs.append(cw + ".requestPolicy: Forbidden: allowMultipleAllocations must be "
                            "true to set a requestPolicy")
                continue
            rng = policy.get("validRange")
            if rng is not None and policy.get("validValues"):
                errs.append(cw + ".requestPolicy: exactly one policy can be specified")
            if rng is None:
                continue
            if policy.get("default") is None:
                errs.append(cw + ".requestPolicy.default: Required value")
                continue
            try:
                default = quantity(policy["default"])
                lo = quantity(rng["min"]) if "min" in rng else None
                hi = quantity(rng["max"]) if "max" in rng else None
                step = quantity(rng["step"]) if "step" in rng else None
            except ValueError as e:
                errs.append(cw + ".requestPolicy: " + str(e))
                continue
            if lo is None:
                errs.append(cw + ".requestPolicy.validRange.min: Required value")
                continue
            if lo > value:
                errs.append(cw + ".requestPolicy.validRange.min: min is larger than capacity")
            if default < lo:
                errs.append(cw + ".requestPolicy.default: default is less than min")
            if hi is not None and (lo > hi or hi > value or default > hi):
                errs.append(cw + ".requestPolicy.validRange.max: Invalid value")
            if step is not None:
                if step <= 0:
                    errs.append(cw + ".requestPolicy.validRange.step: must be greater than zero")
                else:
                    if lo + step > value:
                        errs.append(cw + ".requestPolicy.validRange.step: one step is larger "
                                    "than capacity value")
                    for what, x in (("default", default), ("max", hi)):
                        if x is not None and (x - lo) % step != 0:
                            errs.append(cw + ".requestPolicy.validRange.step: %s is not a "
                                        "multiple of a given step from min" % what)
    return errs


def validate_counters(counters, where, required):
    errs = []
    if not counters:
        return [where + ": Required value"] if required else []
    if len(counters) > 32:
        errs.append(where + ": Too many: must have at most 32 items")
    for k, v in counters.items():
        if not DNS_LABEL.match(k) or len(k) > 63:
            errs.append(where + "[%s]: Invalid value" % k)
        try:
            quantity((v or {}).get("value"))
        except ValueError as e:
            errs.append(where + "[%s].value: %s" % (k, e))
    return errs


def validate_pool(slices):
    """What kube-scheduler's allocator checks of a pool before it uses it (v1.37,
    pools_incubating.go): every slice of the newest generation present, device names
    unique, and every counter a device consumes offered by a counter set of the pool,
    with no more consumed than offered by one device."""
    errs = []
    if not slices:
        return ["no slices"]
    gen = max(s["spec"]["pool"]["generation"] for s in slices)
    cur = [s for s in slices if s["spec"]["pool"]["generation"] == gen]
    if any(s["spec"]["pool"]["resourceSliceCount"] != len(cur) for s in cur):
        errs.append("pool incomplete: %d slices of generation %d, resourceSliceCount %s"
                    % (len(cur), gen, [s["spec"]["pool"]["resourceSliceCount"] for s in cur]))
    sets, names = {}, set()
    for s in cur:
        for cs in s["spec"].get("sharedCounters") or []:
            if cs["name"] in sets:
                errs.append("counter set %s twice in the pool" % cs["name"])
            sets[cs["name"]] = {k: quantity(v["value"]) for k, v in cs["counters"].items()}
    for s in cur:
        for d in s["spec"].get("devices") or []:
            if d["name"] in names:
                errs.append("device %s twice in the pool" % d["name"])
            names.add(d["name"])
            for cons in d.get("consumesCounters") or []:
                have = sets.get(cons["counterSet"])
                if have is None:
                    errs.append("device %s: counter set %s not in the pool"
                                % (d["name"], cons["counterSet"]))
                    continue
                for k, v in cons["counters"].items():
                    if k not in have or quantity(v["value"]) > have[k]:
                        errs.append("device %s: counter %s/%s not offered"
                                    % (d["name"], cons["counterSet"], k))
    return errs


class ApiError(Exception):
    REASONS = {404: "NotFound", 405: "MethodNotAllowed", 409: "Conflict", 422: "Invalid",
               401: "Unauthorized", 400: "BadRequest"}

    def __init__(self, code, message, reason=None):
        super().__init__(message)
        self.code, self.message = code, message
        self.reason = reason or self.REASONS.get(code, "InternalError")

    def status(self):
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


class ApiStandin:
    """An in-process API server stand-in on 127.0.0.1 (see the module's doc)."""

    def __init__(self, token="dra-test-token"):
        self.token = token
        self.lock = threading.Lock()
        self.rv = 1
        self.nodes, self.claims, self.slices = {}, {}, {}
        self.requests = []  # (method, path) of every API request
        self.claim_faults = {}  # (ns, name) -> HTTP status to answer GETs with
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):
                pass

            def reply(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def body(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    return json.loads(raw) if raw else None
                except ValueError:
                    raise ApiError(400, "request body is not JSON")

            def handle_any(self, method):
                try:
                    if self.headers.get("Authorization") != "Bearer " + standin.token:
                        raise ApiError(401, "Unauthorized")
                    body = self.body() if method in ("POST", "PUT", "DELETE") else None
                    code, obj = standin.serve(method, self.path, body)
                    self.reply(code, obj)
                except ApiError as e:
                    self.reply(e.code, e.status())

            def do_GET(self):
                self.handle_any("GET")

            def do_POST(self):
                self.handle_any("POST")

            def do_PUT(self):
                self.handle_any("PUT")

            def do_DELETE(self):
                self.handle_any("DELETE")

        ThreadingHTTPServer.daemon_threads = True
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path):
        with open(path, "w") as f:
            f.write("apiVersion: v1\nkind: Config\ncurrent-context: standin\n"
                    "contexts:\n- name: standin\n  context: {cluster: standin, user: tester}\n"
                    "clusters:\n- name: standin\n  cluster: {server: 'http://127.0.0.1:%d'}\n"
                    "users:\n- name: tester\n  user: {token: '%s'}\n" % (self.port, self.token))
        return path

    # Objects the test puts in place.

    def _stamp(self, obj):
        self.rv += 1
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["resourceVersion"] = str(self.rv)
        return obj

    def add_node(self, name):
        with self.lock:
            if name not in self.nodes:
                self.nodes[name] = self._stamp({"apiVersion": "v1", "kind": "Node",
                                                "metadata": {"name": name}})
            return self.nodes[name]

    def put_claim(self, claim):
        with self.lock:
            meta = claim["metadata"]
            self.claims[(meta["namespace"], meta["name"])] = self._stamp(json.loads(
                json.dumps(claim)))
            return self.claims[(meta["namespace"], meta["name"])]

    def delete_claim(self, ns, name):
        with self.lock:
            self.claims.pop((ns, name), None)

    def slice_list(self):
        with self.lock:
            return [json.loads(json.dumps(s)) for s in self.slices.values()]

    def writes(self, method):
        with self.lock:
            return sum(1 for m, p in self.requests
                       if m == method and "/resourceslices" in p)

    # The API.

    def serve(self, method, raw_path, body):
        parts = [unquote(p) for p in urlsplit(raw_path).path.split("/") if p]
        query = {k: v[-1] for k, v in parse_qs(urlsplit(raw_path).query).items()}
        with self.lock:
            self.requests.append((method, raw_path))
            if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4 and method == "GET":
                if parts[3] not in self.nodes:
                    raise ApiError(404, 'nodes "%s" not found' % parts[3])
                return 200, self.nodes[parts[3]]
            if parts[:3] != ["apis", "resource.k8s.io", "v1"]:
                raise ApiError(404, "the server could not find the requested resource")
            rest = parts[3:]
            if len(rest) == 4 and rest[0] == "namespaces" and rest[2] == "resourceclaims" \
                    and method == "GET":
                key = (rest[1], rest[3])
                if key in self.claim_faults:
                    raise ApiError(self.claim_faults[key], "injected failure")
                if key not in self.claims:
                    raise ApiError(404, 'resourceclaims.resource.k8s.io "%s" not found' % rest[3])
                return 200, self.claims[key]
            if rest[:1] == ["resourceslices"]:
                return self.slices_api(method, rest[1] if len(rest) == 2 else None, body, query)
            raise ApiError(404, "the server could not find the requested resource")

    def slices_api(self, method, name, body, query):
        if name is None and method == "GET":
            items = list(self.slices.values())
            for term in (query.get("fieldSelector") or "").split(","):
                if not term:
                    continue
                key, _, want = term.partition("=")
                if key not in ("spec.nodeName", "spec.driver"):
                    raise ApiError(400, '"%s" is not a known field selector' % key)
                field = key.split(".")[1]
                items = [s for s in items if s["spec"].get(field) == want]
            return 200, {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                         "metadata": {"resourceVersion": str(self.rv)}, "items": items}
        if name is None and method == "POST":
            if not isinstance(body, dict):
                raise ApiError(400, "a ResourceSlice is required")
            name = (body.get("metadata") or {}).get("name")
            errs = validate_slice(body)
            if errs:
                raise ApiError(422, 'ResourceSlice.resource.k8s.io "%s" is invalid: %s'
                               % (name, "; ".join(errs)))
            if name in self.slices:
                raise ApiError(409, 'resourceslices.resource.k8s.io "%s" already exists' % name,
                               "AlreadyExists")
            body["metadata"].pop("resourceVersion", None)
            self.slices[name] = self._stamp(body)
            return 201, self.slices[name]
        if name is None:
            raise ApiError(405, "method not allowed")
        if method == "GET":
            if name not in self.slices:
                raise ApiError(404, 'resourceslices.resource.k8s.io "%s" not found' % name)
            return 200, self.slices[name]
        if method == "PUT":
            if name not in self.slices:
                raise ApiError(404, 'resourceslices.resource.k8s.io "%s" not found' % name)
            errs = validate_slice(body)
            if errs:
                raise ApiError(422, 'ResourceSlice.resource.k8s.io "%s" is invalid: %s'
                               % (name, "; ".join(errs)))
            old = self.slices[name]
            rv = body.get("metadata", {}).get("resourceVersion")
            if rv and rv != old["metadata"]["resourceVersion"]:
                raise ApiError(409, 'Operation cannot be fulfilled on resourceslices.resource.k8s.io '
                               '"%s": the object has been modified; please apply your changes to '
                               'the latest version and try again' % name)
            body["metadata"]["uid"] = old["metadata"]["uid"]
            self.slices[name] = self._stamp(body)
            return 200, self.slices[name]
        if method == "DELETE":
            if name not in self.slices:
                raise ApiError(404, 'resourceslices.resource.k8s.io "%s" not found' % name)
            return 200, self.slices.pop(name)
        raise ApiError(405, "method not allowed")


def load_protos(source_dir, protoc="protoc"):
    """Compiles the DRA and registration protos for Python; returns {name: module}."""
    out = tempfile.mkdtemp(prefix="kgpu-dra-pb-")
    try:
        proto_dir = os.path.join(source_dir, "proto")
        names = ["dra_v1", "dra_v1beta1", "pluginregistration"]
        subprocess.run([protoc, "--python_out=" + out, "-I", proto_dir] +
                       [os.path.join(proto_dir, n + ".proto") for n in names],
                       check=True, capture_output=True)
        mods = {}
        sys.path.insert(0, out)
        try:
            for n in names:
                spec = importlib.util.spec_from_file_location(n + "_pb2",
                                                              os.path.join(out, n + "_pb2.py"))
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                mods[n] = mod
        finally:
            sys.path.remove(out)
        return mods
    finally:
        shutil.rmtree(out, ignore_errors=True)


class DraKubelet:
    """kubelet's calls to a DRA driver (see the module's doc)."""

    def __init__(self, protos):
        self.pb = protos

    def _unary(self, socket_path, method, request, reply_class, timeout=10):
        with grpc.insecure_channel("unix:" + socket_path) as ch:
            call = ch.unary_unary(method, request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=reply_class.FromString)
            return call(request, timeout=timeout)

    def raw(self, socket_path, method, data, timeout=10):
        with grpc.insecure_channel("unix:" + socket_path) as ch:
            call = ch.unary_unary(method, request_serializer=lambda b: b,
                                  response_deserializer=lambda b: b)
            return call(data, timeout=timeout)

    def get_info(self, reg_socket):
        reg = self.pb["pluginregistration"]
        return self._unary(reg_socket, "/pluginregistration.Registration/GetInfo",
                           reg.InfoRequest(), reg.PluginInfo)

    def register(self, reg_socket):
        """What kubelet's plugin watcher and DRA manager do: (info, chosen service)."""
        reg = self.pb["pluginregistration"]
        info = self.get_info(reg_socket)
        chosen = next((s for s in info.supported_versions if s in KUBELET_SERVICES), None)
        ok = info.type == "DRAPlugin" and chosen is not None
        self._unary(reg_socket, "/pluginregistration.Registration/NotifyRegistrationStatus",
                    reg.RegistrationStatus(plugin_registered=ok,
                                           error="" if ok else "no supported service"),
                    reg.RegistrationStatusResponse)
        return info, chosen

    def _module(self, service):
        return self.pb["dra_v1" if service == "v1.DRAPlugin" else "dra_v1beta1"]

    def prepare(self, endpoint, service, claims):
        """claims: [(namespace, uid, name)]; returns {uid: NodePrepareResourceResponse}."""
        m = self._module(service)
        req = m.NodePrepareResourcesRequest(claims=[
            m.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims])
        resp = self._unary(endpoint, "/%s.DRAPlugin/NodePrepareResources" % DRA_PACKAGE[service],
                           req, m.NodePrepareResourcesResponse)
        return dict(resp.claims)

    def unprepare(self, endpoint, service, claims):
        m = self._module(service)
        req = m.NodeUnprepareResourcesRequest(claims=[
            m.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims])
        resp = self._unary(endpoint,
                           "/%s.DRAPlugin/NodeUnprepareResources" % DRA_PACKAGE[service],
                           req, m.NodeUnprepareResourcesResponse)
        return dict(resp.claims)
