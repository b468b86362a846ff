#!/usr/bin/env python3
"""TLS and client-certificate checks of kgpu-extender's port.

Makes a throwaway CA, a server certificate for 127.0.0.1 and client
certificates (one from that CA, one from another), starts the real extender
with --tls-cert/--tls-key/--tls-client-ca in --cluster-file mode, and checks
who gets in: a client signed by the CA does; no certificate or a foreign one
does not; probes (/healthz, /readyz) and the API server's call of the
pod-routing webhook (POST /mutate/pods) do without a certificate; plain
HTTP does not work at all. Exit 77 (skipped) when openssl is not installed.
"""
import argparse
import base64
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import unittest

ARGS = None


def run(*cmd, cwd=None):
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_pki(d):
    """CA, server cert (SAN IP 127.0.0.1), a client signed by the CA, a client signed by another CA."""
    for ca in ("ca", "other-ca"):
        run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=%s" % ca, "-keyout", "%s.key" % ca, "-out", "%s.crt" % ca, cwd=d)
    with open(os.path.join(d, "san.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    for name, ca, ext in (("server", "ca", ["-extfile", "san.cnf"]),
                          ("client", "ca", []), ("stranger", "other-ca", [])):
        run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=%s" % name,
            "-keyout", "%s.key" % name, "-out", "%s.csr" % name, cwd=d)
        run("openssl", "x509", "-req", "-in", "%s.csr" % name, "-CA", "%s.crt" % ca,
            "-CAkey", "%s.key" % ca, "-CAcreateserial", "-days", "2", "-out", "%s.crt" % name,
            *ext, cwd=d)


class TlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="kgpu-tls-")
        make_pki(cls.dir)
        portfile = os.path.join(cls.dir, "port")
        p = lambda name: os.path.join(cls.dir, name)
        cls.proc = subprocess.Popen(
            [ARGS.extender, "--cluster-file", os.path.join(ARGS.source, "examples", "cluster.yaml"),
             "--listen", "127.0.0.1:0", "--port-file", portfile, "--log-level", "warn",
             "--tls-cert", p("server.crt"), "--tls-key", p("server.key"),
             "--tls-client-ca", p("ca.crt"), "--route-pods-to", "kgpu-scheduler"],
            start_new_session=True)
        def port_written():
            if not os.path.exists(portfile):
                return ""
            with open(portfile) as f:
                return f.read().strip()
        for _ in range(200):
            if port_written():
                break
            if cls.proc.poll() is not None:
                raise RuntimeError("kgpu-extender exited with %d" % cls.proc.returncode)
            time.sleep(0.05)
        cls.port = int(port_written())

    @classmethod
    def tearDownClass(cls):
        os.killpg(cls.proc.pid, signal.SIGTERM)
        cls.proc.wait(timeout=10)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def context(self, cert=None):
        ctx = ssl.create_default_context(cafile=os.path.join(self.dir, "ca.crt"))
        if cert:
            ctx.load_cert_chain(os.path.join(self.dir, cert + ".crt"),
                                os.path.join(self.dir, cert + ".key"))
        return ctx

    def request(self, method, path, cert=None, body=None):
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context(cert),
                                           timeout=10)
        try:
            conn.request(method, path, body=body,
                         headers={"Content-Type": "application/json"} if body else {})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def test_client_signed_by_ca_gets_in(self):
        status, body = self.request("GET", "/inspect", cert="client")
        self.assertEqual(status, 200)
        self.assertEqual(len(json.loads(body)["nodes"]), 3)
        args = {"Pod": {"metadata": {"name": "p", "namespace": "t", "uid": "u-tls"},
                        "spec": {"containers": [{"name": "c", "resources": {
                            "limits": {"kgpu.io/gpu-mem": "4"}}}]}},
                "Nodes": None, "NodeNames": ["gpu-a100-0"]}
        status, body = self.request("POST", "/filter", cert="client", body=json.dumps(args))
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["NodeNames"], ["gpu-a100-0"])

    def connections_total(self):
        status, body = self.request("GET", "/metrics", cert="client")
        self.assertEqual(status, 200)
        for line in body.decode().splitlines():
            if line.startswith("kgpu_extender_http_connections_total "):
                return int(line.split()[1])
        self.fail("no kgpu_extender_http_connections_total in /metrics")

    def test_kept_connection_keeps_its_verdict(self):
        """The client certificate's verdict is kept per connection (issue 27: verifying
        the chain on every call was a third of the extender's CPU): many calls on one
        connection all get in, are counted as one connection, and a connection with a
        foreign certificate is refused on every call, not only its first."""
        before = self.connections_total()
        self.assertEqual(self.calls_on_one_connection("client", 5), [200] * 5)
        # That connection, and the one that reads the counter.
        self.assertEqual(self.connections_total(), before + 2)
        try:
            self.assertEqual(self.calls_on_one_connection("stranger", 3), [403] * 3)
        except (ssl.SSLError, ConnectionError):
            pass  # refused during the handshake: also right

    def calls_on_one_connection(self, cert, n):
        """The statuses of n GET /inspect on one kept connection."""
        conn = http.client.HTTPSConnection("127.0.0.1", self.port,
                                           context=self.context(cert), timeout=10)
        out = []
        try:
            for _ in range(n):
                conn.request("GET", "/inspect")
                r = conn.getresponse()
                r.read()
                out.append(r.status)
        finally:
            conn.close()
        return out

    def test_no_certificate_is_refused(self):
        for method, path in (("GET", "/inspect"), ("GET", "/metrics"), ("POST", "/filter"),
                             ("POST", "/estimate")):
            status, _ = self.request(method, path, body="{}" if method == "POST" else None)
            self.assertEqual(status, 403, path)

    def test_foreign_certificate_is_refused(self):
        try:
            status, _ = self.request("GET", "/inspect", cert="stranger")
        except (ssl.SSLError, ConnectionError):
            return  # refused during the handshake: also right
        self.assertEqual(status, 403)

    def test_probes_need_no_certificate(self):
        for path in ("/healthz", "/readyz", "/version"):
            status, _ = self.request("GET", path)
            self.assertEqual(status, 200, path)

    def test_the_routing_webhook_needs_no_certificate(self):
        """The API server calls POST /mutate/pods with no client certificate (a managed
        cluster cannot give it one): answered, the GPU pod routed; every other POST still
        needs one (test_no_certificate_is_refused)."""
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "u-1", "operation": "CREATE", "object": {
                      "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                      "spec": {"containers": [{"name": "c", "resources": {
                          "limits": {"kgpu.io/gpu-mem": "4"}}}]}}}}
        status, body = self.request("POST", "/mutate/pods", body=json.dumps(review))
        self.assertEqual(status, 200, body)
        resp = json.loads(body)["response"]
        self.assertEqual((resp["uid"], resp["allowed"], resp["patchType"]),
                         ("u-1", True, "JSONPatch"))
        self.assertEqual(json.loads(base64.b64decode(resp["patch"])),
                         [{"op": "add", "path": "/spec/schedulerName", "value": "kgpu-scheduler"}])
        status, body = self.request("POST", "/mutate/pods", body="{")
        self.assertEqual(status, 400)
        self.assertIn("malformed JSON", json.loads(body)["Error"])
        status, _ = self.request("POST", "/mutate/pods/../filter", body="{}")
        self.assertEqual(status, 403)

    def test_plain_http_does_not_work(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", "/healthz")
            status = conn.getresponse().status
        except (ConnectionError, http.client.HTTPException, OSError):
            return
        finally:
            conn.close()
        self.fail("plain HTTP answered %d on the TLS port" % status)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--extender", required=True)
    parser.add_argument("--source", required=True)
    ARGS, rest = parser.parse_known_args()
    if shutil.which("openssl") is None:
        print("SKIP: openssl is not installed")
        sys.exit(77)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
