#!/usr/bin/env python3
"""kubelet's side of the device plugin API v1beta1, for integration tests.

A stand-in written on Python's grpcio (a gRPC stack other than the plugin's
gRPC core C API), so that the tests check the wire, not one library against
itself. It plays the parts of kubelet that a device plugin meets:

  - serves /v1beta1.Registration/Register on <plugin_dir>/kubelet.sock and
    records every RegisterRequest;
  - after a Register, like kubelet's endpoint manager, dials
    <plugin_dir>/<endpoint>, calls GetDevicePluginOptions and keeps a
    ListAndWatch stream open in a thread, holding the newest device list per
    resource and a history of every list with its arrival time;
  - restarts as kubelet does: stops serving, deletes every socket in the
    plugin folder, serves kubelet.sock again;
  - makes kubelet's calls on demand: Allocate, GetPreferredAllocation,
    PreStartContainer, and raw bytes for malformed requests.

Message classes come from proto/deviceplugin.proto, compiled at start with
`protoc --python_out` into a temporary folder (messages only; methods are
called generically by their paths). Needs grpcio and protobuf (Debian's
python3-grpcio and python3-protobuf) and protoc.
"""

import importlib.util
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time

import grpc

SERVICE = "/v1beta1.DevicePlugin/"


def load_messages(source_dir, protoc="protoc"):
    """Compiles proto/deviceplugin.proto for Python; returns the generated module."""
    out = tempfile.mkdtemp(prefix="kgpu-pb-")
    try:
        proto_dir = os.path.join(source_dir, "proto")
        subprocess.run([protoc, "--python_out=" + out, "-I", proto_dir,
                        os.path.join(proto_dir, "deviceplugin.proto")],
                       check=True, capture_output=True)
        path = os.path.join(out, "deviceplugin_pb2.py")
        spec = importlib.util.spec_from_file_location("deviceplugin_pb2", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        shutil.rmtree(out, ignore_errors=True)


class Device:
    """One device of a ListAndWatch answer."""

    __slots__ = ("id", "health", "numa")

    def __init__(self, id, health, numa):
        self.id = id
        self.health = health
        self.numa = numa  # None when the device carries no topology, else [node IDs]

    def __repr__(self):
        return "Device(%r, %r, %r)" % (self.id, self.health, self.numa)


class Endpoint:
    """kubelet's connection to one registered resource."""

    def __init__(self, kubelet, request):
        self.kubelet = kubelet
        self.request = request
        self.resource = request.resource_name
        self.path = os.path.join(kubelet.plugin_dir, request.endpoint)
        self.channel = grpc.insecure_channel("unix:" + self.path)
        self.options = None
        self.error = None   # what ended the stream, if it ended
        self.stream = None
        self.ended = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name="ListAndWatch " + self.resource)
        self.thread.start()

    def _run(self):
        pb = self.kubelet.pb
        try:
            opts = self.channel.unary_unary(
                SERVICE + "GetDevicePluginOptions",
                request_serializer=pb.Empty.SerializeToString,
                response_deserializer=pb.DevicePluginOptions.FromString)
            self.options = opts(pb.Empty(), timeout=10)
            law = self.channel.unary_stream(
                SERVICE + "ListAndWatch",
                request_serializer=pb.Empty.SerializeToString,
                response_deserializer=pb.ListAndWatchResponse.FromString)
            self.stream = law(pb.Empty())
            for resp in self.stream:
                devices = {}
                for d in resp.devices:
                    numa = [n.ID for n in d.topology.nodes] if d.HasField("topology") else None
                    devices[d.ID] = Device(d.ID, d.health, numa)
                self.kubelet._got_list(self, devices, len(resp.devices))
        except grpc.RpcError as e:
            self.error = "%s: %s" % (e.code(), e.details())
        except Exception as e:  # a decoding error is a finding too
            self.error = "%s: %s" % (type(e).__name__, e)
        finally:
            self.ended.set()
            self.kubelet._notify()

    def close(self):
        if self.stream is not None:
            self.stream.cancel()
        self.channel.close()
        self.ended.wait(5)


class KubeletStandin:
    """kubelet's device plugin manager, as far as a plugin can tell."""

    def __init__(self, plugin_dir, source_dir, protoc="protoc", pb=None):
        self.plugin_dir = plugin_dir
        self.sock = os.path.join(plugin_dir, "kubelet.sock")
        self.pb = pb or load_messages(source_dir, protoc)
        self.cond = threading.Condition()
        self.registrations = []  # (monotonic time, RegisterRequest)
        self.endpoints = {}      # resource -> Endpoint (the newest registration)
        self.lists = {}          # resource -> {id: Device} (newest list)
        self.history = []        # (monotonic time, resource, {id: Device})
        self.server = None
        self.register_status = None  # (grpc.StatusCode, details) to refuse registrations

    # Serving Registration.

    def start(self):
        """Serves kubelet.sock. Like kubelet's device manager at start, it first removes every
        socket in the folder (a stale kubelet.sock, the plugins' own), which is how a
        plugin learns that kubelet restarted."""
        os.makedirs(self.plugin_dir, exist_ok=True)
        for name in os.listdir(self.plugin_dir):
            path = os.path.join(self.plugin_dir, name)
            try:
                if stat.S_ISSOCK(os.stat(path).st_mode):
                    os.unlink(path)
            except FileNotFoundError:
                pass
        pb = self.pb
        handler = grpc.method_handlers_generic_handler("v1beta1.Registration", {
            "Register": grpc.unary_unary_rpc_method_handler(
                self._register, request_deserializer=pb.RegisterRequest.FromString,
                response_serializer=pb.Empty.SerializeToString)})
        from concurrent.futures import ThreadPoolExecutor
        self.server = grpc.server(ThreadPoolExecutor(max_workers=8), handlers=(handler,))
        if self.server.add_insecure_port("unix:" + self.sock) == 0:
            raise RuntimeError("cannot serve " + self.sock)
        self.server.start()
        return self

    def stop(self):
        """Stops serving and drops every plugin connection. The sockets stay, kubelet.sock
        included, as a stopped kubelet leaves them (the e2e node suite saw it): a plugin
        started meanwhile finds a kubelet.sock that refuses connections."""
        if self.server is not None:
            self.server.stop(0).wait(5)
            self.server = None
        with self.cond:
            endpoints = list(self.endpoints.values())
            self.endpoints.clear()
        for ep in endpoints:
            ep.close()

    def restart(self, pause=0.0):
        """What a kubelet restart looks like to a plugin: its streams end, and (after `pause`
        seconds down) every socket in the folder is removed and kubelet.sock served anew."""
        self.stop()
        if pause:
            time.sleep(pause)
        return self.start()

    def _register(self, request, context):
        with self.cond:
            self.registrations.append((time.monotonic(), request))
            self.cond.notify_all()
            refuse = self.register_status
        if refuse is not None:
            context.abort(refuse[0], refuse[1])
        # kubelet answers first and connects to the plugin in the background.
        threading.Thread(target=self._connect, args=(request,), daemon=True).start()
        return self.pb.Empty()

    def _connect(self, request):
        with self.cond:
            old = self.endpoints.get(request.resource_name)
        if old is not None:
            old.close()
        ep = Endpoint(self, request)
        with self.cond:
            self.endpoints[request.resource_name] = ep
            self.cond.notify_all()

    def _got_list(self, ep, devices, raw_count):
        with self.cond:
            if len(devices) != raw_count:
                ep.error = "ListAndWatch sent %d devices, only %d distinct IDs" % (
                    raw_count, len(devices))
            self.lists[ep.resource] = devices
            self.history.append((time.monotonic(), ep.resource, devices))
            self.cond.notify_all()

    def _notify(self):
        with self.cond:
            self.cond.notify_all()

    # Waiting.

    def wait(self, predicate, timeout, what="condition"):
        """Waits until predicate() (called under the lock) is true; returns its value."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                value = predicate()
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("kubelet stand-in: timed out after %.1f s waiting for %s"
                                         % (timeout, what))
                self.cond.wait(min(left, 0.05))

    def registered(self, since=0.0):
        """{resource: RegisterRequest} of registrations after `since` (monotonic)."""
        with self.cond:
            return {r.resource_name: r for t, r in self.registrations if t >= since}

    def wait_registered(self, resources, since=0.0, timeout=5.0):
        def done():
            got = {r.resource_name: r for t, r in self.registrations if t >= since}
            return got if all(r in got for r in resources) else None
        return self.wait(done, timeout, "registration of %s" % ", ".join(resources))

    def wait_list(self, resource, predicate=lambda devices: True, since=0.0, timeout=5.0):
        """The newest list of `resource` that arrived after `since` and satisfies predicate."""
        def found():
            for t, r, devices in reversed(self.history):
                if t < since:
                    break
                if r == resource and predicate(devices):
                    return (t, devices)
            return None
        return self.wait(found, timeout, "a ListAndWatch list of %s" % resource)

    def endpoint(self, resource, timeout=5.0):
        return self.wait(lambda: self.endpoints.get(resource), timeout,
                         "kubelet's connection to %s" % resource)

    # kubelet's calls.

    def _call(self, resource, method, request, response_class, timeout=15.0):
        ep = self.endpoint(resource)
        fn = ep.channel.unary_unary(
            SERVICE + method,
            request_serializer=(lambda b: b) if isinstance(request, bytes)
            else type(request).SerializeToString,
            response_deserializer=response_class.FromString)
        return fn(request, timeout=timeout)

    def allocate(self, resource, *containers):
        """Allocate with one ContainerAllocateRequest per list of IDs; the AllocateResponse."""
        pb = self.pb
        req = pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=list(ids)) for ids in containers])
        return self._call(resource, "Allocate", req, pb.AllocateResponse)

    def allocate_raw(self, resource, data):
        return self._call(resource, "Allocate", bytes(data), self.pb.AllocateResponse)

    def preferred(self, resource, available, must_include=(), size=1):
        """GetPreferredAllocation for one container: the preferred IDs."""
        pb = self.pb
        req = pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=list(available),
                                                   must_include_deviceIDs=list(must_include),
                                                   allocation_size=size)])
        resp = self._call(resource, "GetPreferredAllocation", req,
                          pb.PreferredAllocationResponse)
        if len(resp.container_responses) != 1:
            raise AssertionError("GetPreferredAllocation answered %d containers for 1"
                                 % len(resp.container_responses))
        return list(resp.container_responses[0].deviceIDs)

    def options(self, resource):
        return self._call(resource, "GetDevicePluginOptions", self.pb.Empty(),
                          self.pb.DevicePluginOptions)

    def prestart(self, resource, ids):
        return self._call(resource, "PreStartContainer",
                          self.pb.PreStartContainerRequest(devices_ids=list(ids)),
                          self.pb.PreStartContainerResponse)


def socket_alive(path):
    """Whether something accepts connections on the unix socket `path`."""
    s = socket.socket(socket.AF_UNIX)
    try:
        s.settimeout(1)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()
