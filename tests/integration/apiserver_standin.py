#!/usr/bin/env python3
"""A Kubernetes API server stand-in for integration tests (stdlib only).

It keeps the semantics kgpu relies on: one global resourceVersion bumped on
every change, list then watch from a resourceVersion with bookmarks and
410 Gone for versions older than the event history, field and label
selectors (a watched object that stops matching is DELETED, one that starts
matching is ADDED), JSON merge patch, and pod binding with its conflicts.
Tests inject faults over a side channel (POST /_control), see usage below.

Lists page as the real server's do from etcd: `limit=N` answers at most N
items of one snapshot (the store at the list's resourceVersion, objects in
key order "namespace/name"), with `metadata.continue`, a token encoding that
resourceVersion and the last key, and `metadata.remainingItemCount` when the
list has no selector; `continue=TOKEN` (the same selectors repeated, no
resourceVersion: 400 otherwise) reads on in that snapshot. Snapshots live
until a compaction (--compaction-interval, etcd's 5 minutes; or
`compact`): then a token of an older resourceVersion answers 410 Expired,
its Status carrying in metadata.continue an inconsistent token that reads on
in the newest state. No limit, `resourceVersion=0` (the watch cache) or
`ignore_limit` answer the whole list at once, as older servers do.

    python3 apiserver_standin.py --port 0 --portfile FILE [--token T]
                                 [--bookmark-interval S] [--history N]
                                 [--compaction-interval S] [--load FILE] [-v]

--load FILE creates the objects of a JSON file {"nodes": [...], "pods": [...]}
before serving (pods in their metadata.namespace, default "default"), each as
a POST would: a large cluster in a second instead of one request per object.

/_control (JSON, no token needed) takes any of:
    bind_status: N       answer binds with this HTTP status instead of binding
    bind_count: N        ...for the next N binds (-1: until changed; default 1)
    bind_delay_ms: D     sleep D ms before answering every bind (0: off); the bind is
                         applied after the sleep even if the client has gone, as a
                         request the real server has started goes on
    bind_lost: N         apply the next N binds, then answer 504, as kube-apiserver's
                         timeout filter does while the handler goes on: an answer lost
    bind_late: N         answer the next N binds 504 at once and apply them bind_late_ms
                         (default 300) later, as a handler that goes on past the timeout
                         filter's answer; stats' late_applied names those applied
    patch_delay_ms: D    sleep D ms before answering every PATCH (0: off): a slow or
                         overloaded server, as a daemon that writes annotations sees it
    drop_watches: true   cut every open watch stream now, mid-stream
    expire_history: true forget the event history: a watch from an older
                         resourceVersion gets the 410 ERROR event
    expire_watches: true send every open watch the 410 ERROR event and end it,
                         as the server does to a watcher that fell behind
    fail_lists: N        answer the next N lists with 500 (each page is a list request)
    ignore_limit: B      answer every list whole, ignoring limit and continue (B true)
    expire_continues: N  answer the next N continued list pages 410 Expired, as if
                         etcd had compacted their snapshot (it has not: see compact)
    hold_continues: K    hold every continued page of kind K ("pods", "nodes") until
                         set to "" again; stats' continues_held counts the held ones
    compact: true        compact now at the current resourceVersion, as etcd does:
                         every older list snapshot is gone (its tokens get 410)
    load: {...}          create objects as --load does
    reset_stats: true    zero the counters and forget the request log
    crd_absent: B        answer 404 for GPUQueues (/apis/kgpu.io/v1alpha1/gpuqueues) while B
                         is true, as a server without the CRD does
    dra_absent: B        answer 404 for everything under /apis/resource.k8s.io/v1 while B is
                         true, as a server without DRA does
    evict_status: {"NS/NAME": N}  answer evictions of these pods with N (429: a
                         PodDisruptionBudget refuses; any other) instead of evicting
    evict_keep: B        an accepted eviction (201) leaves the pod in place, as one with a
                         long grace period: the test deletes it later

Besides nodes and pods it serves namespaces (/api/v1/namespaces), GPUQueues
(kgpu.io/v1alpha1, cluster-scoped, generation bumped on spec changes, status
written only through the /status subresource with a merge patch) and pod
evictions (POST .../pods/NAME/eviction: 201 and the pod deleted, 404 without
the pod); GET /_control/evictions lists the evictions asked for. For DRA it
serves resource.k8s.io/v1 ResourceSlices (cluster-scoped; field selectors
spec.driver, spec.nodeName, spec.pool.name as the real server) and
ResourceClaims (namespaced, listed and watched across namespaces too); a
claim's status is written with PUT or a merge patch of the claim itself.
GET /_control/stats returns the counters and the current resourceVersion;
GET /_control/requests the last 5000 list and watch requests, each with the
query it came with and, for lists, what it was answered.
"""

import argparse
import base64
import bisect
import copy
import datetime
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import uuid
from collections import OrderedDict, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


class ApiError(Exception):
    """An error answered as a Kubernetes Status object."""

    REASONS = {400: "BadRequest", 401: "Unauthorized", 404: "NotFound", 405: "MethodNotAllowed",
               409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType",
               422: "Invalid", 500: "InternalError"}

    def __init__(self, code, message, reason=None, body=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or self.REASONS.get(code, "Unknown")
        self.body = body

    def status(self):
        return self.body or status_object(self.code, self.reason, self.message)


def status_object(code, reason, message):
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def field_value(obj, dotted):
    cur = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    return "" if cur is None else str(cur)


def parse_selector(text, kind):
    """'a=b,c!=d' into [(key, op, value)]; label selectors also take 'k' and '!k'."""
    terms = []
    for term in filter(None, (t.strip() for t in (text or "").split(","))):
        for op in ("!=", "==", "="):
            if op in term:
                key, value = term.split(op, 1)
                terms.append((key.strip(), "!=" if op == "!=" else "=", value.strip()))
                break
        else:
            if kind == "field":
                raise ApiError(400, "invalid field selector: %r" % term)
            terms.append((term.lstrip("!"), "absent" if term.startswith("!") else "exists", ""))
    return terms


FIELDS = {"pods": {"metadata.name", "metadata.namespace", "spec.nodeName", "spec.schedulerName",
                   "status.phase"},
          "nodes": {"metadata.name", "spec.unschedulable"},
          "namespaces": {"metadata.name"},
          "gpuqueues": {"metadata.name"},
          "events": {"metadata.name", "involvedObject.name"},
          "resourceslices": {"metadata.name", "spec.driver", "spec.nodeName", "spec.pool.name"},
          "resourceclaims": {"metadata.name", "metadata.namespace"}}

# apiVersion, kind and list kind of each kind served.
KINDS = {"pods": ("v1", "Pod", "PodList"), "nodes": ("v1", "Node", "NodeList"),
         "namespaces": ("v1", "Namespace", "NamespaceList"),
         "gpuqueues": ("kgpu.io/v1alpha1", "GPUQueue", "GPUQueueList"),
         "events": ("v1", "Event", "EventList"),
         "resourceslices": ("resource.k8s.io/v1", "ResourceSlice", "ResourceSliceList"),
         "resourceclaims": ("resource.k8s.io/v1", "ResourceClaim", "ResourceClaimList")}
NAMESPACED = {"pods", "events", "resourceclaims"}
RESOURCE_V1 = ["apis", "resource.k8s.io", "v1"]
GPUQUEUES = ["apis", "kgpu.io", "v1alpha1", "gpuqueues"]


class Selector:
    def __init__(self, kind, namespace, field_text, label_text):
        self.kind = kind
        self.namespace = namespace
        self.fields = parse_selector(field_text, "field")
        self.labels = parse_selector(label_text, "label")
        for key, _, _ in self.fields:
            if key not in FIELDS[kind]:
                raise ApiError(400, 'field label not supported: %s' % key)

    def matches(self, kind, obj):
        if obj is None or kind != self.kind:
            return False
        meta = obj.get("metadata", {})
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        for key, op, value in self.fields:
            if (field_value(obj, key) == value) != (op == "="):
                return False
        labels = meta.get("labels") or {}
        for key, op, value in self.labels:
            if op == "exists" and key not in labels:
                return False
            if op == "absent" and key in labels:
                return False
            if op == "=" and labels.get(key) != value:
                return False
            if op == "!=" and labels.get(key) == value:
                return False
        return True


SNAPSHOTS_MAX = 64  # list snapshots kept; an older one is gone as if compacted
REQUEST_LOG_MAX = 5000
INCONSISTENT_CONTINUE = -1  # a token's resourceVersion for "read on in the newest state"
CONTINUE_EXPIRED = ("The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter, or use the "
                    "continue token in this response to retrieve the remainder of the results. "
                    "Continuing with the provided token results in an inconsistent list - objects "
                    "that were created, modified, or deleted between the time the first chunk was "
                    "returned and now may show up in the list.")


def encode_continue(rv, start):
    """The real server's token: base64url (no padding) of {"v", "rv", "start"}."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_continue(token):
    """(rv, start key relative to the list's prefix) of a token; ApiError 400 if malformed."""
    try:
        doc = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, TypeError) as e:
        raise ApiError(400, "invalid continue token: continue key is not valid: %s" % e)
    if not isinstance(doc, dict) or doc.get("v") != "meta.k8s.io/v1":
        raise ApiError(400, "invalid continue token: continue key is not valid: server does not "
                       "recognize this encoded key")
    rv, start = doc.get("rv"), doc.get("start")
    if not isinstance(rv, int) or isinstance(rv, bool) or (rv <= 0 and
                                                           rv != INCONSISTENT_CONTINUE):
        raise ApiError(400, "invalid continue token: continue key is not valid: incorrect "
                       "encoded start resourceVersion (version meta.k8s.io/v1)")
    if not isinstance(start, str) or not start or start.startswith("/") or ".." in start:
        raise ApiError(400, "invalid continue token: continue key is not valid: encoded start "
                       "key is not valid")
    return rv, start


def key_of(kind, key):
    """The object's storage key within its kind, sorted as etcd sorts: ns/name or name."""
    ns, name = key
    return "%s/%s" % (ns, name) if kind in NAMESPACED else name


class Store:
    """Nodes and pods, the resourceVersion counter, event history and faults.

    Everything is guarded by one condition variable; watchers wait on it.
    Stored objects are replaced, never changed in place, so a list snapshot
    may hold them by reference.
    """

    def __init__(self, history, compaction_interval=300.0):
        self.cond = threading.Condition()
        self.rv = 0
        self.objects = {k: {} for k in KINDS}   # kind -> {(ns, name): obj}
        self.evictions = []                       # {"pod": "ns/name", "status": N}
        self.late_applied = []                    # "ns/name" of late binds that were applied
        self.history = deque()                     # (rv, type, kind, obj, old_obj)
        self.history_max = history
        self.floor = 0          # history holds every event after this rv; older watches get 410
        self.drop_gen = 0       # bumped by drop_watches
        self.expire_gen = 0     # bumped by expire_watches
        self.closing = False
        self.faults = {"bind_status": 0, "bind_count": 0, "bind_delay_ms": 0, "bind_lost": 0,
                       "bind_late": 0, "bind_late_ms": 300, "fail_lists": 0,
                       "patch_delay_ms": 0, "ignore_limit": False, "expire_continues": 0,
                       "hold_continues": "", "crd_absent": False, "evict_status": {},
                       "evict_keep": False, "dra_absent": False}
        # List snapshots by (kind, resourceVersion): (sorted keys, objects), oldest first.
        self.snapshots = OrderedDict()
        self.compacted = 0      # snapshots older than this resourceVersion are gone
        self.compaction_interval = compaction_interval
        self.compact_mark = 0   # compacted to at the next interval, as kube-apiserver does
        self.last_compaction = time.monotonic()
        self.stats = {}
        self.request_log = deque(maxlen=REQUEST_LOG_MAX)
        self.reset_stats()

    def reset_stats(self):
        self.stats = {k: 0 for k in ("requests", "unauthorized", "lists", "gets", "watches_opened",
                                     "watches_active", "binds", "binds_ok", "binds_failed",
                                     "creates", "updates", "patches", "deletes", "list_continues",
                                     "lists_expired", "continues_held", "compactions",
                                     "status_patches")}
        self.request_log.clear()

    def log_request(self, entry):
        with self.cond:
            self.request_log.append(entry)

    def count(self, key, delta=1):
        with self.cond:
            self.stats[key] += delta

    # Changes. Each bumps rv once and records one event; callers hold no lock.

    def _record(self, etype, kind, obj, old):
        self.history.append((self.rv, etype, kind, obj, old))  # stored objects never change
        while len(self.history) > self.history_max:
            self.floor = self.history.popleft()[0]
        self.cond.notify_all()

    def _bump(self, obj):
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)

    def create(self, kind, ns, obj, copy_out=True):
        """Stores obj (taken over: the caller must not change it) and returns a copy of it."""
        meta = obj.setdefault("metadata", {})
        with self.cond:
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            name = meta.get("name")
            if not name:
                raise ApiError(422, "metadata.name: Required value")
            if kind in NAMESPACED:
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
            key = (ns, name)
            if key in self.objects[kind]:
                raise ApiError(409, '%s "%s" already exists' % (kind, name), "AlreadyExists")
            obj.setdefault("apiVersion", KINDS[kind][0])
            obj.setdefault("kind", KINDS[kind][1])
            if kind == "gpuqueues":
                meta["generation"] = 1
                obj.pop("status", None)  # written through /status only
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = datetime.datetime.now(datetime.timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%SZ")
            if kind == "pods":
                obj.setdefault("spec", {})
                obj.setdefault("status", {}).setdefault("phase", "Pending")
            self._bump(obj)
            self.objects[kind][key] = obj
            self._record("ADDED", kind, obj, None)
            return copy.deepcopy(obj) if copy_out else None

    def get(self, kind, ns, name):
        with self.cond:
            obj = self.objects[kind].get((ns, name))
            if obj is None:
                raise ApiError(404, '%s "%s" not found' % (kind, name))
            return copy.deepcopy(obj)

    def _modify(self, kind, ns, name, change, status_write=False):
        """Applies change(copy) -> new object; one MODIFIED event unless it is a no-op.

        A GPUQueue's status changes only through its /status subresource (status_write).
        """
        with self.cond:
            old = self.objects[kind].get((ns, name))
            if old is None:
                raise ApiError(404, '%s "%s" not found' % (kind, name))
            new = change(copy.deepcopy(old))
            meta = new.setdefault("metadata", {})
            for field in ("name", "namespace", "uid", "creationTimestamp", "generation"):
                if field in old["metadata"]:
                    meta[field] = old["metadata"][field]
            if kind == "gpuqueues" and not status_write:
                new.pop("status", None)
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
            if kind == "gpuqueues" and new.get("spec") != old.get("spec"):
                meta["generation"] = old["metadata"].get("generation", 0) + 1
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            if new == old:
                return copy.deepcopy(old)
            self._bump(new)
            self.objects[kind][(ns, name)] = new
            self._record("MODIFIED", kind, new, copy.deepcopy(old))
            return copy.deepcopy(new)

    def replace(self, kind, ns, name, obj):
        want_rv = obj.get("metadata", {}).get("resourceVersion")

        def change(old):
            if want_rv and want_rv != old["metadata"]["resourceVersion"]:
                raise ApiError(409, 'Operation cannot be fulfilled on %s "%s": the object has '
                               'been modified; please apply your changes to the latest version '
                               'and try again' % (kind, name))
            return copy.deepcopy(obj)
        return self._modify(kind, ns, name, change)

    def patch_status(self, kind, ns, name, patch):
        """The /status subresource: only status changes, whatever the patch holds."""
        if not isinstance(patch, dict):
            raise ApiError(400, "a merge patch must be a JSON object")

        def change(old):
            new = merge_patch(copy.deepcopy(old), {"status": patch.get("status")})
            new["spec"] = old.get("spec")
            return new
        return self._modify(kind, ns, name, change, status_write=True)

    def evict(self, ns, name, body):
        """POST .../eviction: 201 and the pod deleted, or the status a fault says."""
        if not isinstance(body, dict) or body.get("kind") != "Eviction" or \
                (body.get("metadata") or {}).get("name") != name:
            raise ApiError(400, "an Eviction object naming the pod is required")
        key = "%s/%s" % (ns, name)
        with self.cond:
            status = int(self.faults["evict_status"].get(key, 0))
            keep = self.faults["evict_keep"]
            exists = (ns, name) in self.objects["pods"]
            code = status or (201 if exists else 404)
            self.evictions.append({"pod": key, "status": code})
        if status == 429:
            raise ApiError(429, "Cannot evict pod as it would violate the pod's disruption "
                           "budget.", "TooManyRequests")
        if status:
            raise ApiError(status, "injected eviction failure")
        if not exists:
            raise ApiError(404, 'pods "%s" not found' % name)
        if not keep:
            try:
                self.delete("pods", ns, name)
            except ApiError:
                pass
        return code

    def patch(self, kind, ns, name, patch):
        if not isinstance(patch, dict):
            raise ApiError(400, "a merge patch must be a JSON object")
        want_uid = (patch.get("metadata") or {}).get("uid")

        def change(old):
            # A uid in a patch is a precondition, as in the real server.
            if want_uid and want_uid != old["metadata"].get("uid"):
                raise ApiError(409, 'Operation cannot be fulfilled on %s "%s": Precondition '
                               'failed: UID in precondition: %s, UID in object meta: %s'
                               % (kind, name, want_uid, old["metadata"].get("uid")))
            return merge_patch(old, patch)
        return self._modify(kind, ns, name, change)

    def delete(self, kind, ns, name):
        with self.cond:
            obj = self.objects[kind].pop((ns, name), None)
            if obj is None:
                raise ApiError(404, '%s "%s" not found' % (kind, name))
            obj = copy.deepcopy(obj)  # list snapshots may still hold the stored one
            self._bump(obj)
            self._record("DELETED", kind, obj, None)
            return copy.deepcopy(obj)

    def bind(self, ns, name, binding):
        """What the real BindingREST does: preconditions, nodeName, annotations, condition."""
        meta = binding.get("metadata") or {}
        target = binding.get("target") or {}
        node = target.get("name")
        if not node:
            raise ApiError(422, "target.name: Required value")
        if meta.get("name") not in (None, name):
            raise ApiError(400, "binding name %r does not match the pod %r" % (meta.get("name"),
                                                                              name))

        def change(pod):
            uid = meta.get("uid")
            if uid and uid != pod["metadata"].get("uid"):
                raise ApiError(409, 'Operation cannot be fulfilled on pods "%s": Precondition '
                               'failed: UID in precondition: %s, UID in object meta: %s'
                               % (name, uid, pod["metadata"].get("uid")))
            if pod["metadata"].get("deletionTimestamp"):
                raise ApiError(409, 'Operation cannot be fulfilled on pods/binding "%s": pod %s '
                               'is being deleted, cannot be assigned to a host' % (name, name))
            bound = pod.get("spec", {}).get("nodeName")
            if bound:
                raise ApiError(409, 'Operation cannot be fulfilled on pods/binding "%s": pod %s '
                               'is already assigned to node "%s"' % (name, name, bound))
            pod.setdefault("spec", {})["nodeName"] = node
            annotations = meta.get("annotations") or {}
            if annotations:
                pod["metadata"].setdefault("annotations", {}).update(annotations)
            conditions = pod.setdefault("status", {}).setdefault("conditions", [])
            conditions[:] = [c for c in conditions if c.get("type") != "PodScheduled"]
            conditions.append({"type": "PodScheduled", "status": "True"})
            return pod
        return self._modify("pods", ns, name, change)

    def list(self, sel):
        with self.cond:
            items = [o for o in self.objects[sel.kind].values() if sel.matches(sel.kind, o)]
            return items, str(self.rv)

    # Paged lists: snapshots and compaction, as etcd keeps revisions.

    def _snapshot(self, kind):
        """The snapshot of kind at the current resourceVersion (lock held)."""
        at = (kind, self.rv)
        snap = self.snapshots.get(at)
        if snap is None:
            pairs = sorted(((key_of(kind, k), o) for k, o in self.objects[kind].items()),
                           key=lambda p: p[0])
            snap = ([p[0] for p in pairs], [p[1] for p in pairs])
            self.snapshots[at] = snap
            while len(self.snapshots) > SNAPSHOTS_MAX:
                self.snapshots.popitem(last=False)
        else:
            self.snapshots.move_to_end(at)
        return snap

    def compact(self, rv):
        """Forgets every snapshot older than rv (lock held)."""
        self.compacted = max(self.compacted, rv)
        for at in [at for at in self.snapshots if at[1] < self.compacted]:
            del self.snapshots[at]
        self.stats["compactions"] += 1

    def _maybe_compact(self):
        """kube-apiserver compacts every interval to the revision it saw the interval before."""
        now = time.monotonic()
        if self.compaction_interval > 0 and now - self.last_compaction >= self.compaction_interval:
            self.compact(self.compact_mark)
            self.compact_mark = self.rv
            self.last_compaction = now

    def _hold_continue(self, kind):
        """Waits while continued pages of kind are held (lock held)."""
        if self.faults["hold_continues"] != kind:
            return
        self.stats["continues_held"] += 1
        try:
            while self.faults["hold_continues"] == kind and not self.closing:
                self.cond.wait(0.1)
        finally:
            self.stats["continues_held"] -= 1

    def list_page(self, sel, limit, token):
        """One page: (items, rv, continue token or None, remainingItemCount or None).

        Raises ApiError 410 Expired (with an inconsistent token) when the token's
        snapshot is gone, 400 for a token that is not one.
        """
        kind = sel.kind
        with self.cond:
            self._maybe_compact()
            if token:
                rv, start = decode_continue(token)
                self.stats["list_continues"] += 1
                self._hold_continue(kind)
                snap = None
                if rv == INCONSISTENT_CONTINUE:
                    rv, snap = self.rv, self._snapshot(kind)
                elif self.faults["expire_continues"] > 0:
                    self.faults["expire_continues"] -= 1
                elif rv >= self.compacted:
                    snap = self.snapshots.get((kind, rv))
                    if snap is not None:
                        self.snapshots.move_to_end((kind, rv))
                if snap is None:
                    self.stats["lists_expired"] += 1
                    st = status_object(410, "Expired", CONTINUE_EXPIRED)
                    st["metadata"]["continue"] = encode_continue(INCONSISTENT_CONTINUE, start)
                    raise ApiError(410, CONTINUE_EXPIRED, "Expired", st)
            else:
                rv, start, snap = self.rv, "", self._snapshot(kind)
        keys, objs = snap
        prefix = sel.namespace + "/" if kind in NAMESPACED and sel.namespace is not None else ""
        i = bisect.bisect_left(keys, prefix + start)
        # The first key past the prefix: "ns0" follows every "ns/..." ('0' follows '/').
        end = bisect.bisect_left(keys, prefix[:-1] + "0") if prefix else len(keys)
        items = []
        while i < end and len(items) < limit:
            if sel.matches(kind, objs[i]):
                items.append(objs[i])
            i += 1
        if i >= end:
            return items, str(rv), None, None
        cont = encode_continue(rv, keys[i - 1][len(prefix):] + "\x00")
        # Counted only without selectors, as the real server does (it would have to filter).
        remaining = end - i if not sel.fields and not sel.labels else None
        return items, str(rv), cont, remaining

    def load(self, doc):
        """Creates the nodes and pods of {"nodes": [...], "pods": [...]}; returns the count."""
        if not isinstance(doc, dict):
            raise ApiError(400, "load takes {\"nodes\": [...], \"pods\": [...]}")
        n = 0
        for kind in ("nodes", "pods"):
            for obj in doc.get(kind) or []:
                if not isinstance(obj, dict):
                    raise ApiError(400, "load: %s holds a non-object" % kind)
                ns = (obj.get("metadata") or {}).get("namespace") or "default"
                self.create(kind, ns if kind == "pods" else None, obj, copy_out=False)
                n += 1
        return n

    def control(self, req):
        if "load" in req:
            self.load(req["load"])
        with self.cond:
            for key in ("bind_status", "bind_delay_ms", "bind_lost", "bind_late", "bind_late_ms",
                        "fail_lists", "patch_delay_ms", "expire_continues"):
                if key in req:
                    self.faults[key] = int(req[key])
            if "ignore_limit" in req:
                self.faults["ignore_limit"] = bool(req["ignore_limit"])
            if "hold_continues" in req:
                self.faults["hold_continues"] = str(req["hold_continues"] or "")
            if req.get("compact"):
                self.compact(self.rv)
            if "bind_status" in req:
                self.faults["bind_count"] = int(req.get("bind_count", 1))
            elif "bind_count" in req:
                self.faults["bind_count"] = int(req["bind_count"])
            if req.get("drop_watches"):
                self.drop_gen += 1
            if req.get("expire_watches"):
                self.expire_gen += 1
            if req.get("expire_history"):
                self.history.clear()
                self.floor = self.rv
            if req.get("reset_stats"):
                self.reset_stats()
            for key in ("crd_absent", "evict_keep", "dra_absent"):
                if key in req:
                    self.faults[key] = bool(req[key])
            if "evict_status" in req:
                self.faults["evict_status"] = dict(req["evict_status"] or {})
            self.cond.notify_all()
            return dict(self.faults)

    def take_bind_fault(self):
        """(status or 0, delay seconds, answer lost, applied how much later or None)."""
        with self.cond:
            status = 0
            if self.faults["bind_status"] and self.faults["bind_count"] != 0:
                status = self.faults["bind_status"]
                if self.faults["bind_count"] > 0:
                    self.faults["bind_count"] -= 1
            lost = not status and self.faults["bind_lost"] > 0
            if lost:
                self.faults["bind_lost"] -= 1
            late = None
            if not status and not lost and self.faults["bind_late"] > 0:
                self.faults["bind_late"] -= 1
                late = self.faults["bind_late_ms"] / 1000.0
            return status, self.faults["bind_delay_ms"] / 1000.0, lost, late

    def bind_later(self, ns, name, body, seconds):
        """Applies a Binding `seconds` from now, if it still can be (a handler going on)."""
        def apply():
            try:
                self.bind(ns, name, body)
            except ApiError:
                return  # deleted, or bound meanwhile: the late Binding fails as a real one would
            with self.cond:
                self.late_applied.append("%s/%s" % (ns, name))
        t = threading.Timer(seconds, apply)
        t.daemon = True
        t.start()

    def take_list_fault(self):
        with self.cond:
            if self.faults["fail_lists"] > 0:
                self.faults["fail_lists"] -= 1
                return True
            return False


class Handler(BaseHTTPRequestHandler):
    """Routes /api/v1/... requests to the store; one instance per connection."""

    protocol_version = "HTTP/1.1"
    server_version = "kgpu-apiserver-standin/1"
    store = None            # set by main()
    token = None
    bookmark_interval = 1.0
    verbose = False

    def log_message(self, fmt, *args):
        if self.verbose:
            sys.stderr.write("standin: " + (fmt % args) + "\n")

    # Plumbing.

    def send_json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise ApiError(400, "request body is not JSON: %s" % e)

    def authorized(self):
        if self.token is None or self.path.startswith("/_control"):
            return True
        if self.headers.get("Authorization") == "Bearer " + self.token:
            return True
        self.store.count("unauthorized")
        self.send_json(401, status_object(401, "Unauthorized", "Unauthorized"))
        return False

    def route(self):
        """(kind, namespace or None, name or None, subresource or None) of /api/v1 paths."""
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/") if p]
        if parts[:4] == GPUQUEUES and len(parts) <= 6:
            with self.store.cond:
                absent = self.store.faults["crd_absent"]
            if absent:
                raise ApiError(404, "the server could not find the requested resource")
            return ("gpuqueues", None, parts[4] if len(parts) >= 5 else None,
                    parts[5] if len(parts) == 6 else None)
        if parts[:3] == RESOURCE_V1:
            return self.route_resource_v1(parts[3:])
        if parts[:2] != ["api", "v1"]:
            raise ApiError(404, "the server could not find the requested resource")
        rest = parts[2:]
        if rest[:1] == ["namespaces"] and len(rest) <= 2:
            return "namespaces", None, rest[1] if len(rest) == 2 else None, None
        if rest[:1] == ["nodes"] and len(rest) <= 2:
            return "nodes", None, rest[1] if len(rest) == 2 else None, None
        if rest[:1] == ["pods"] and len(rest) == 1:
            return "pods", None, None, None
        if len(rest) in (3, 4) and rest[0] == "namespaces" and rest[2] == "events":
            return "events", rest[1], rest[3] if len(rest) == 4 else None, None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] == "pods" and len(rest) <= 5:
            return ("pods", rest[1], rest[3] if len(rest) >= 4 else None,
                    rest[4] if len(rest) == 5 else None)
        raise ApiError(404, "the server could not find the requested resource")

    def route_resource_v1(self, rest):
        """resource.k8s.io/v1: resourceslices[/NAME], resourceclaims (every namespace),
        namespaces/NS/resourceclaims[/NAME]."""
        with self.store.cond:
            absent = self.store.faults["dra_absent"]
        if absent:
            raise ApiError(404, "the server could not find the requested resource")
        if rest[:1] == ["resourceslices"] and len(rest) <= 2:
            return "resourceslices", None, rest[1] if len(rest) == 2 else None, None
        if rest == ["resourceclaims"]:
            return "resourceclaims", None, None, None
        if len(rest) in (3, 4) and rest[0] == "namespaces" and rest[2] == "resourceclaims":
            return "resourceclaims", rest[1], rest[3] if len(rest) == 4 else None, None
        raise ApiError(404, "the server could not find the requested resource")

    def dispatch(self, method):
        self.store.count("requests")
        if not self.authorized():
            return
        try:
            if self.path.startswith("/_control"):
                return self.control(method)
            if self.path.startswith("/apis/coordination.k8s.io/v1/"):
                return self.lease(method)
            kind, ns, name, sub = self.route()
            getattr(self, "do_" + method.lower() + "_api")(kind, ns, name, sub)
        except ApiError as e:
            self.send_json(e.code, e.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def do_PUT(self):
        self.dispatch("PUT")

    def do_PATCH(self):
        self.dispatch("PATCH")

    def do_DELETE(self):
        self.dispatch("DELETE")

    # The API.

    def key_ns(self, kind, ns):
        return ns if kind in NAMESPACED else None

    def do_get_api(self, kind, ns, name, sub):
        if sub is not None:
            raise ApiError(405, "GET is not supported on %s" % sub)
        if name is not None:
            self.store.count("gets")
            return self.send_json(200, self.store.get(kind, self.key_ns(kind, ns), name))
        query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        one = {k: v[-1] for k, v in query.items()}
        sel = Selector(kind, ns, one.get("fieldSelector"), one.get("labelSelector"))
        if one.get("watch") in ("1", "true"):
            return self.watch(sel, one)
        self.store.count("lists")
        entry = {"type": "list", "kind": kind, "namespace": ns, "limit": one.get("limit"),
                 "continue": bool(one.get("continue")),
                 "fieldSelector": one.get("fieldSelector"),
                 "labelSelector": one.get("labelSelector"),
                 "resourceVersion": one.get("resourceVersion"), "status": 200}
        try:
            meta, items = self.list_answer(sel, one)
        except ApiError as e:
            entry["status"] = e.code
            raise
        finally:
            self.store.log_request(entry)
        entry.update(rv=meta["resourceVersion"], items=len(items), more="continue" in meta,
                     remainingItemCount=meta.get("remainingItemCount"))
        self.send_json(200, {"kind": KINDS[kind][2], "apiVersion": KINDS[kind][0],
                             "metadata": meta, "items": items})

    def list_answer(self, sel, one):
        """(list metadata, items) for a list request's query `one`."""
        if self.store.take_list_fault():
            raise ApiError(500, "injected list failure")
        token, rv_param = one.get("continue") or "", one.get("resourceVersion") or ""
        try:
            limit = int(one.get("limit") or 0)
        except ValueError:
            raise ApiError(400, "invalid limit %r" % one.get("limit"))
        with self.store.cond:
            whole = self.store.faults["ignore_limit"]
        if token and rv_param not in ("", "0") and not whole:
            raise ApiError(400, "specifying resource version is not allowed when using continue")
        if whole or limit <= 0 or (rv_param == "0" and not token):
            items, rv = self.store.list(sel)
            return {"resourceVersion": rv}, items
        items, rv, cont, remaining = self.store.list_page(sel, limit, token)
        meta = {"resourceVersion": rv}
        if cont:
            meta["continue"] = cont
        if remaining is not None:
            meta["remainingItemCount"] = remaining
        return meta, items

    def do_post_api(self, kind, ns, name, sub):
        body = self.read_body()
        if sub == "binding" and name is not None:
            return self.bind(ns, name, body)
        if sub == "eviction" and name is not None and kind == "pods":
            code = self.store.evict(ns, name, body)
            return self.send_json(code, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                         "status": "Success", "code": code})
        if name is not None or sub is not None or (kind in NAMESPACED and ns is None):
            raise ApiError(405, "POST is not supported here")
        if not isinstance(body, dict):
            raise ApiError(400, "a %s object is required" % kind)
        self.store.count("creates")
        self.send_json(201, self.store.create(kind, self.key_ns(kind, ns), body))

    def do_put_api(self, kind, ns, name, sub):
        if name is None or sub is not None:
            raise ApiError(405, "PUT needs an object name")
        body = self.read_body()
        if not isinstance(body, dict):
            raise ApiError(400, "a %s object is required" % kind)
        self.store.count("updates")
        self.send_json(200, self.store.replace(kind, self.key_ns(kind, ns), name, body))

    def do_patch_api(self, kind, ns, name, sub):
        if name is None or (sub is not None and (sub, kind) != ("status", "gpuqueues")):
            raise ApiError(405, "PATCH needs an object name")
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype != "application/merge-patch+json":
            raise ApiError(415, "the body of the request was in an unknown format - accepted "
                           "media types include: application/merge-patch+json")
        self.store.count("patches")
        body = self.read_body()
        with self.store.cond:
            delay = self.store.faults["patch_delay_ms"] / 1000.0
        if delay:
            time.sleep(delay)
        if sub == "status":
            self.store.count("status_patches")
            return self.send_json(200, self.store.patch_status(kind, None, name, body))
        self.send_json(200, self.store.patch(kind, self.key_ns(kind, ns), name, body))

    def do_delete_api(self, kind, ns, name, sub):
        if name is None or sub is not None:
            raise ApiError(405, "DELETE needs an object name")
        self.read_body()
        self.store.count("deletes")
        self.send_json(200, self.store.delete(kind, self.key_ns(kind, ns), name))

    def bind(self, ns, name, body):
        self.store.count("binds")
        status, delay, lost, late = self.store.take_bind_fault()
        if delay:
            time.sleep(delay)
        try:
            if status:
                raise ApiError(status, "injected bind failure")
            if not isinstance(body, dict) or body.get("kind") not in (None, "Binding"):
                raise ApiError(400, "a Binding object is required")
            if late is not None:
                self.store.bind_later(ns, name, body, late)
                raise ApiError(504, "The request timed out (injected: the binding is applied "
                               "later)", "Timeout")
            self.store.bind(ns, name, body)
        except ApiError:
            self.store.count("binds_failed")
            raise
        self.store.count("binds_ok")
        if lost:
            raise ApiError(504, "The request timed out (injected: the binding was applied)",
                           "Timeout")
        self.send_json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                             "status": "Success", "code": 201})

    # Leases (coordination.k8s.io/v1), for leader election: get, create, and
    # update with the optimistic concurrency of resourceVersion (409 when stale).

    def lease(self, method):
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/") if p]
        # apis coordination.k8s.io v1 namespaces NS leases [NAME]
        if len(parts) not in (6, 7) or parts[3] != "namespaces" or parts[5] != "leases":
            raise ApiError(404, "the server could not find the requested resource")
        ns, name = parts[4], parts[6] if len(parts) == 7 else None
        store = self.store
        with store.cond:
            leases = store.objects.setdefault("leases", {})
            if method == "GET" and name is not None:
                if (ns, name) not in leases:
                    raise ApiError(404, 'leases.coordination.k8s.io "%s" not found' % name,
                                   "NotFound")
                return self.send_json(200, leases[(ns, name)])
            body = self.read_body()
            if not isinstance(body, dict):
                raise ApiError(400, "a Lease object is required")
            meta = body.setdefault("metadata", {})
            if method == "POST" and name is None:
                key = (ns, meta.get("name"))
                if key in leases:
                    raise ApiError(409, 'leases.coordination.k8s.io "%s" already exists'
                                   % key[1], "AlreadyExists")
            elif method == "PUT" and name is not None:
                key = (ns, name)
                if key not in leases:
                    raise ApiError(404, 'leases.coordination.k8s.io "%s" not found' % name,
                                   "NotFound")
                if meta.get("resourceVersion") != leases[key]["metadata"]["resourceVersion"]:
                    raise ApiError(409, "Operation cannot be fulfilled on leases.coordination."
                                   "k8s.io \"%s\": the object has been modified" % name,
                                   "Conflict")
            else:
                raise ApiError(405, "%s is not supported on leases here" % method)
            meta["namespace"] = ns
            store._bump(body)
            leases[key] = body
            return self.send_json(201 if method == "POST" else 200, body)

    def control(self, method):
        if method == "GET" and urlsplit(self.path).path == "/_control/stats":
            with self.store.cond:
                stats = dict(self.store.stats, resourceVersion=str(self.store.rv),
                             late_applied=list(self.store.late_applied))
            return self.send_json(200, stats)
        if method == "GET" and urlsplit(self.path).path == "/_control/evictions":
            with self.store.cond:
                return self.send_json(200, list(self.store.evictions))
        if method == "GET" and urlsplit(self.path).path == "/_control/requests":
            with self.store.cond:
                log = list(self.store.request_log)
            return self.send_json(200, {"lists": [e for e in log if e["type"] == "list"],
                                        "watches": [e for e in log if e["type"] == "watch"]})
        if method != "POST":
            raise ApiError(405, "use POST /_control or GET /_control/stats")
        body = self.read_body()
        if not isinstance(body, dict):
            raise ApiError(400, "a JSON object is required")
        self.send_json(200, self.store.control(body))

    # Watches.

    def write_chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def send_event(self, etype, obj):
        self.write_chunk(json.dumps({"type": etype, "object": obj}).encode() + b"\n")

    def client_gone(self):
        """True when the client closed its end (readable, and a peek finds EOF)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def expired(self, rv):
        with self.store.cond:  # "(Y)": the oldest version the server could replay from
            message = "too old resource version: %d (%d)" % (rv, max(rv, self.store.floor) + 1)
        self.send_event("ERROR", status_object(410, "Expired", message))

    def watch(self, sel, query):
        store = self.store
        timeout = float(query.get("timeoutSeconds") or 0)
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true")
        start_rv = query.get("resourceVersion") or ""
        store.log_request({"type": "watch", "kind": sel.kind, "namespace": sel.namespace,
                           "fieldSelector": query.get("fieldSelector"),
                           "labelSelector": query.get("labelSelector"),
                           "resourceVersion": query.get("resourceVersion")})
        if start_rv and not start_rv.isdigit():
            raise ApiError(400, "invalid resourceVersion %r" % start_rv)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self.stream(sel, start_rv, timeout, bookmarks)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    def stream(self, sel, start_rv, timeout, bookmarks):
        try:
            self.stream_events(sel, start_rv, timeout, bookmarks)
        finally:
            self.store.count("watches_active", -1)

    def stream_events(self, sel, start_rv, timeout, bookmarks):
        store = self.store
        kind_name = "Pod" if sel.kind == "pods" else "Node"
        with store.cond:
            # Counted as open only once it will see a drop or expiry asked for after this.
            store.stats["watches_opened"] += 1
            store.stats["watches_active"] += 1
            drop_gen, expire_gen = store.drop_gen, store.expire_gen
            if start_rv in ("", "0"):
                # "Any version": the current objects as ADDED, then changes.
                initial = [copy.deepcopy(o) for o in store.objects[sel.kind].values()
                           if sel.matches(sel.kind, o)]
                pos = store.rv
            else:
                initial, pos = [], int(start_rv)
                if pos < store.floor:
                    initial = None
        if initial is None:
            self.expired(pos)
            return self.end_stream()
        for obj in initial:
            self.send_event("ADDED", obj)
        deadline = time.monotonic() + timeout if timeout > 0 else None
        next_bookmark = time.monotonic() + self.bookmark_interval
        while True:
            now = time.monotonic()
            waits = [0.25, next_bookmark - now if bookmarks else 0.25]
            if deadline is not None:
                waits.append(deadline - now)
            with store.cond:
                if not [e for e in store.history if e[0] > pos]:
                    store.cond.wait(max(0.0, min(waits)))
                if store.closing or store.drop_gen != drop_gen:
                    self.close_connection = True
                    return  # cut mid-stream, no final chunk: a broken stream
                if store.expire_gen != expire_gen or pos < store.floor:
                    events = None  # told to expire, or events it needs were forgotten
                else:
                    events = [e for e in store.history if e[0] > pos]
                    pos = store.rv
            if events is None:
                self.expired(pos)
                return self.end_stream()
            for rv, etype, kind, obj, old in events:
                seen = self.translate(sel, etype, kind, obj, old)
                if seen == "DELETED" and etype == "MODIFIED":
                    # Left the selector: the old content at the new version, as the real cacher.
                    obj = copy.deepcopy(old)
                    obj["metadata"]["resourceVersion"] = str(rv)
                if seen:
                    self.send_event(seen, obj)
            now = time.monotonic()
            if bookmarks and now >= next_bookmark:
                self.send_event("BOOKMARK", {"kind": kind_name, "apiVersion": "v1",
                                             "metadata": {"resourceVersion": str(pos)}})
                next_bookmark = now + self.bookmark_interval
            if deadline is not None and now >= deadline:
                return self.end_stream()
            if self.client_gone():
                self.close_connection = True
                return

    @staticmethod
    def translate(sel, etype, kind, obj, old):
        """The event a watcher with this selector sees, or None."""
        now = sel.matches(kind, obj)
        if etype != "MODIFIED":
            return etype if now else None
        before = sel.matches(kind, old)
        if now and before:
            return "MODIFIED"
        if now:
            return "ADDED"
        return "DELETED" if before else None

    def end_stream(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--portfile", help="write the port here once listening")
    ap.add_argument("--token", help="require 'Authorization: Bearer TOKEN'")
    ap.add_argument("--bookmark-interval", type=float, default=1.0)
    ap.add_argument("--history", type=int, default=1000, help="events kept for watches")
    ap.add_argument("--compaction-interval", type=float, default=300.0,
                    help="seconds between compactions of list snapshots (0: never)")
    ap.add_argument("--load", help="create the objects of this JSON file before serving")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()

    store = Store(args.history, args.compaction_interval)
    if args.load:
        with open(args.load) as f:
            store.load(json.load(f))
    Handler.store = store
    Handler.token = args.token
    Handler.bookmark_interval = args.bookmark_interval
    Handler.verbose = args.verbose
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.allow_reuse_address = True
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)

    def on_term(signum, frame):
        with store.cond:
            store.closing = True
            store.cond.notify_all()
        threading.Thread(target=server.shutdown, daemon=True).start()
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    if args.portfile:
        tmp = args.portfile + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % server.server_address[1])
        os.replace(tmp, args.portfile)  # readers never see half a number
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
