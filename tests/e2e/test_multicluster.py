"""The multicluster suite: Kueue's MultiKueue dispatching through kgpu-dispatcher.

A manager and two workers, each a real control plane (etcd, kube-apiserver)
with Kueue built from its module; each worker runs kgpu's extender with
kube-scheduler and kube-controller-manager over Node objects of its own GPU
mix (worker-a: A100s, worker-b: T4s). Jobs are submitted to the manager;
kgpu-dispatcher nominates the worker, MultiKueue copies the Job there, the
worker's Kueue admits it, the Job controller makes its pods and
kube-scheduler binds them through kgpu. Each test checks where the
workload was admitted (the manager Workload's .status.clusterName) and
where its pods were bound (a node of the expected GPU model). Tests leave
the clusters as they found them, so they run one at a time too
(`scripts/e2e.sh --suite multicluster -k burst`).
"""

import json
import os
import time
import unittest
import urllib.request

import cluster
import harness
import multicluster
from cluster import MEM, WHOLE, node_object, wait_for
from multicluster import TEAM_NS, Manager, Worker, delete_jobs

CONFIG = {}  # filled by e2e.py: bin dir, build dir, work dir
A100, T4 = "NVIDIA A100-SXM4-80GB", "Tesla T4"


class MultiClusterSuite(unittest.TestCase):
    workers = []
    manager = None

    @classmethod
    def setUpClass(cls):
        kdir = multicluster.kueue_dir(CONFIG["bin"])
        if kdir is None:
            raise unittest.SkipTest("Kueue is not built (scripts/upstream.sh builds it)")
        work, bindir, build = CONFIG["work"], CONFIG["bin"], CONFIG["build"]
        try:
            cls.a = Worker("worker-a", work, bindir, build, kdir,
                           [node_object("a100-0", A100, 2, 81920)])
            cls.workers.append(cls.a)
            cls.b = Worker("worker-b", work, bindir, build, kdir,
                           [node_object("t4-0", T4, 4, 15360)])
            cls.workers.append(cls.b)
            cls.manager = Manager(work, bindir, kdir, cls.workers)
            cls.bench = os.path.join(work, "throughput.prom")
            cls.write_bench({})
            # A nomination unadmitted for 10 s is given up (test_7), not after the shipped 300.
            cls.manager.start_dispatcher(build, cls.workers, ["--benchmarks", cls.bench,
                                                              "--renominate-after", "10"])
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        if cls.manager is not None:
            cls.manager.stop()
        for w in cls.workers:
            w.stop()
        cls.workers = []

    @classmethod
    def write_bench(cls, figures):
        """figures: {(workload, model, cluster): value}."""
        tmp = cls.bench + ".tmp"
        with open(tmp, "w") as f:
            f.write("# TYPE kgpu_workload_throughput gauge\n")
            for (w, m, c), v in figures.items():
                f.write('kgpu_workload_throughput{workload="%s",gpu_model="%s",cluster="%s"} %s\n'
                        % (w, m, c, v))
        os.replace(tmp, cls.bench)

    def tearDown(self):
        delete_jobs(self.manager.cp)
        for w in self.workers:
            delete_jobs(w.cp)
        self.write_bench({})
        for w in self.workers:
            report = w.ext.sanitizer_report()
            self.assertIsNone(report, "%s: sanitizer report:\n%s" % (w.name, report))
        self.assertTrue(self.manager.dispatcher.alive(),
                        "kgpu-dispatcher exited:\n" + self.manager.dispatcher.log_tail(40))

    # -- helpers ------------------------------------------------------------

    def worker(self, name):
        return {w.name: w for w in self.workers}[name]

    def admitted(self, job, timeout=90):
        """The worker the manager's Workload for `job` was admitted to."""
        def where():
            w = self.manager.workload_of(job)
            return w and (w.get("status") or {}).get("clusterName")
        try:
            return wait_for(where, timeout, "job %s admitted to a worker" % job, interval=0.3)
        except AssertionError:
            raise AssertionError("%s\nworkload: %s\ndispatcher log:\n%s\nmanager kueue:\n%s" % (
                "job %s not admitted" % job,
                json.dumps((self.manager.workload_of(job) or {}).get("status"))[:2000],
                self.manager.dispatcher.log_tail(30), self.manager.kueue.log_tail(20)))

    def bound_models(self, worker, job, pods=1, timeout=90):
        """The GPU models of the nodes the job's pods were bound to in `worker`."""
        w = self.worker(worker)

        def bound():
            ps = w.pods_of(job)
            nodes = [p["spec"].get("nodeName") for p in ps]
            return nodes if len(nodes) == pods and all(nodes) else None
        try:
            nodes = wait_for(bound, timeout, "%s: pods of %s bound" % (worker, job),
                             interval=0.3)
        except AssertionError:
            ps = w.pods_of(job)
            raise AssertionError("%s: pods of %s not bound: %s\nevents: %s" % (
                worker, job, [p.get("status") for p in ps],
                [e.get("message") for p in ps
                 for e in w.cp.events_for(TEAM_NS, p["metadata"]["name"])]))
        return sorted(w.models[n] for n in nodes)

    def nominated_never(self, job, seconds=4):
        """The job's Workload gets no nomination and no cluster for `seconds`."""
        def settled():
            return self.manager.workload_of(job) is not None
        wait_for(settled, 30, "workload of %s" % job)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            st = (self.manager.workload_of(job) or {}).get("status") or {}
            self.assertFalse(st.get("clusterName") or st.get("nominatedClusterNames"),
                             "%s was dispatched: %s" % (job, st))
            time.sleep(0.3)

    def dispatcher_metric(self, text):
        port = self.manager.metrics_port
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
            body = r.read().decode()
        return text in body

    # -- tests --------------------------------------------------------------

    def test_1_a_gpu_type_only_one_worker_has(self):
        self.manager.create_job("wants-a100", {WHOLE: 1}, annotations={"kgpu.io/gpu-type": "*A100*"})
        self.manager.create_job("wants-t4", {WHOLE: 1}, annotations={"kgpu.io/gpu-type": "*T4*"})
        self.assertEqual(self.admitted("wants-a100"), "worker-a")
        self.assertEqual(self.admitted("wants-t4"), "worker-b")
        self.assertEqual(self.bound_models("worker-a", "wants-a100"), [A100])
        self.assertEqual(self.bound_models("worker-b", "wants-t4"), [T4])
        # The job ran only where it was nominated: worker-b never saw wants-a100.
        self.assertEqual(self.worker("worker-b").pods_of("wants-a100"), [])
        self.assertTrue(self.dispatcher_metric(
            'kgpu_dispatcher_nominations_total{cluster="worker-a",reason="only"}'))

    def test_2_a_share_that_fits_only_one_workers_free_gpus(self):
        # 20 GiB: no 15 GiB T4 holds it, an 80 GiB A100 does.
        self.manager.create_job("share-20", {MEM: 20})
        self.assertEqual(self.admitted("share-20"), "worker-a")
        self.assertEqual(self.bound_models("worker-a", "share-20"), [A100])
        # The other A100 taken whole: a 10 GiB share now fits only worker-b's free T4s...
        self.manager.create_job("whole-a100", {WHOLE: 1}, annotations={"kgpu.io/gpu-type": "*A100*"})
        self.assertEqual(self.admitted("whole-a100"), "worker-a")
        self.bound_models("worker-a", "whole-a100")
        # ... and a 70 GiB share fits nowhere: never dispatched, never admitted.
        self.manager.create_job("share-70", {MEM: 70})
        self.manager.create_job("share-10", {MEM: 10}, annotations={"kgpu.io/gpu-type-exclude": "*A100*"})
        self.assertEqual(self.admitted("share-10"), "worker-b")
        self.assertEqual(self.bound_models("worker-b", "share-10"), [T4])
        self.nominated_never("share-70")

    def test_3_a_burst_spreads_by_capacity(self):
        for i in range(6):
            self.manager.create_job("burst-%d" % i, {WHOLE: 1})
        where = [self.admitted("burst-%d" % i) for i in range(6)]
        self.assertEqual(sorted(where), ["worker-a"] * 2 + ["worker-b"] * 4, where)
        models = [m for i in range(6) for m in self.bound_models(where[i], "burst-%d" % i)]
        self.assertEqual(sorted(models), sorted([A100] * 2 + [T4] * 4))
        # Full: a seventh waits, dispatched nowhere.
        self.manager.create_job("burst-6", {WHOLE: 1})
        self.nominated_never("burst-6")

    def test_4_benchmarks_change_the_choice(self):
        key = {"kgpu.io/workload": "tracksim"}
        self.write_bench({("tracksim", A100, "worker-a"): 50, ("tracksim", T4, "worker-b"): 80})
        self.manager.create_job("tracksim-1", {WHOLE: 1}, labels=key)
        self.assertEqual(self.admitted("tracksim-1"), "worker-b")
        self.write_bench({("tracksim", A100, "worker-a"): 400, ("tracksim", T4, "worker-b"): 80})
        time.sleep(1.5)  # the dispatcher reads the figures each round (0.5 s)
        self.manager.create_job("tracksim-2", {WHOLE: 1}, labels=key)
        self.assertEqual(self.admitted("tracksim-2"), "worker-a")
        self.assertEqual(self.bound_models("worker-a", "tracksim-2"), [A100])

    def test_5_a_worker_that_goes_away_is_not_nominated(self):
        a = self.worker("worker-a")
        a.ext.kill()
        try:
            self.manager.create_job("any-gpu", {WHOLE: 1})
            self.manager.create_job("a100-only", {WHOLE: 1},
                                    annotations={"kgpu.io/gpu-type": "*A100*"})
            self.assertEqual(self.admitted("any-gpu"), "worker-b")
            self.nominated_never("a100-only")
            self.assertTrue(self.dispatcher_metric(
                'kgpu_dispatcher_cluster_up{cluster="worker-a"} 0'))
        finally:
            a.ext.start()
            wait_for(a.ext.ready, 60, "worker-a's extender back")
        # Back: the waiting one goes there once its pause is over.
        self.assertEqual(self.admitted("a100-only", timeout=120), "worker-a")
        self.assertEqual(self.bound_models("worker-a", "a100-only"), [A100])

    def test_6_a_worker_whose_api_server_stops_is_not_nominated(self):
        """worker-a's kube-apiserver killed (its extender still answers /estimate, from what
        it last saw): Kueue marks the MultiKueueCluster inactive, the dispatcher leaves the
        cluster out, an A100 job waits and any-GPU jobs go to worker-b; the API server back
        (same etcd), the waiting job goes to worker-a."""
        a = self.worker("worker-a")
        old = a.cp.children["kube-apiserver"]
        old.stop()
        try:
            t0 = time.monotonic()
            wait_for(lambda: not self.manager.cluster_active("worker-a"), 120,
                     "MultiKueueCluster worker-a inactive", interval=0.5)
            print("    (Kueue marked worker-a inactive %.1f s after its API server stopped)"
                  % (time.monotonic() - t0))
            self.manager.create_job("any-gpu-2", {WHOLE: 1})
            self.manager.create_job("a100-only-2", {WHOLE: 1},
                                    annotations={"kgpu.io/gpu-type": "*A100*"})
            self.assertEqual(self.admitted("any-gpu-2"), "worker-b")
            self.nominated_never("a100-only-2")
        finally:
            # The same command line on the same etcd: the cluster as it was.
            a.cp.children["kube-apiserver"] = harness.Child(
                old.argv, a.cp.p("kube-apiserver.2.log"))
            wait_for(lambda: a.cp.admin.raw("GET", "/readyz")[0] == 200, 90,
                     "worker-a's API server back", interval=0.5)
            # kube-scheduler (leader election on, as shipped) exits when it cannot renew
            # its Lease; kubelet would restart its static pod.
            if not a.cp.scheduler.alive():
                a.cp.stop_scheduler()
                a.cp.start_scheduler(a.cp.scheduler_config_text, name="kube-scheduler-2")
        t1 = time.monotonic()
        wait_for(lambda: self.manager.cluster_active("worker-a"), 120,
                 "MultiKueueCluster worker-a active again", interval=0.5)
        print("    (active again %.1f s after its API server answered)" % (time.monotonic() - t1))
        self.assertEqual(self.admitted("a100-only-2", timeout=120), "worker-a")
        self.assertEqual(self.bound_models("worker-a", "a100-only-2"), [A100])

    def test_7_a_worker_whose_kueue_holds_its_queue_is_given_up(self):
        """worker-a's ClusterQueue on hold (stopPolicy Hold: its Kueue admits nothing new),
        its extender and MultiKueueCluster fine. A job preferring A100s but fitting a T4 is
        nominated to worker-a, where it is never admitted, and Kueue never withdraws a
        nomination by itself; the dispatcher gives worker-a up after --renominate-after
        (10 s here) and nominates worker-b, where it is admitted and bound."""
        a = self.worker("worker-a")
        cq = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/cq"
        a.cp.admin.merge_patch(cq, {"spec": {"stopPolicy": "Hold"}})
        try:
            self.manager.create_job("prefers-a100", {WHOLE: 1}, annotations={
                "kgpu.io/gpu-type-preference": "*A100*"})

            def nominated():
                st = (self.manager.workload_of("prefers-a100") or {}).get("status") or {}
                return st.get("nominatedClusterNames")
            self.assertEqual(wait_for(nominated, 30, "prefers-a100 nominated"), ["worker-a"])
            self.assertEqual(self.admitted("prefers-a100", timeout=60), "worker-b")
            self.assertEqual(self.bound_models("worker-b", "prefers-a100"), [T4])
            self.assertTrue(self.dispatcher_metric("kgpu_dispatcher_renominations_total 1"))
        finally:
            a.cp.admin.merge_patch(cq, {"spec": {"stopPolicy": "None"}})


if __name__ == "__main__":
    unittest.main()
