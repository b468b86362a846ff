#!/usr/bin/env python3
"""kgpu-mig-check (tests/integration/mig_check.c) against the fake NVML.

The fake's MIG profile tables are its own (tests/fake/fake_nvml.c), so a
run where every model matches says kgpu's tables and the fake's agree; the
other cases check what the program does with MIG off, with a GPU kgpu has
no table for, and that it lists existing instances without touching them.
Standard library only.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import unittest

ARGS = None

GPUS = ("GPU-aaaa,NVIDIA A100-SXM4-40GB,40960,00000000:3B:00.0;"
        "GPU-bbbb,NVIDIA H100 80GB HBM3,81559,00000000:3C:00.0,9.0;"
        "GPU-cccc,Tesla T4,15360,00000000:AF:00.0,7.5;"
        "GPU-dddd,NVIDIA H200,143771,00000000:3D:00.0,9.0;"
        "GPU-eeee,NVIDIA A100-SXM4-80GB,81920,00000000:3E:00.0")


class MigCheck(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="kgpu-mig-check-")
        self.state = os.path.join(self.tmp.name, "mig-state")

    def tearDown(self):
        self.tmp.cleanup()

    def run_check(self, gpus=GPUS, mig="0,1,2,3,4"):
        env = dict(os.environ, FAKE_NVML_GPUS=gpus, FAKE_NVML_MIG=mig,
                   FAKE_NVML_MIG_STATE=self.state)
        env.pop("FAKE_NVML_INIT", None)
        p = subprocess.run([ARGS.check, "--nvml-lib", ARGS.fake_nvml], env=env,
                           capture_output=True, text=True, timeout=30)
        return p.returncode, p.stdout + p.stderr

    def test_every_model_matches(self):
        rc, out = self.run_check()
        self.assertEqual(rc, 0, out)
        for table in ("A100-40GB", "H100-80GB", "H200-141GB", "A100-80GB"):
            self.assertIn(f"kgpu's table: {table}", out)
        # Seven profiles per model, each the same, with NVML's figures printed.
        self.assertEqual(out.count(" same\n"), 28, out)
        self.assertIn("7g.141gb   same", out)
        self.assertIn("NVML  profile 9 ID 15 1g.35gb", out)
        self.assertIn("placements 0:2 2:2 4:2 6:2", out)
        self.assertIn("GPU 2: Tesla T4, 15360 MiB, MIG mode not supported", out)
        self.assertNotIn("DIFFERENCE", out)
        self.assertTrue(out.rstrip().endswith("OK: 5 GPU(s)"), out)

    def test_mig_off_is_no_failure(self):
        rc, out = self.run_check(mig="")
        self.assertEqual(rc, 0, out)
        self.assertIn("GPU 3: NVIDIA H200, 143771 MiB, MIG mode disabled", out)
        self.assertEqual(out.count("profiles readable only in MIG mode"), 4, out)

    def test_gpu_without_kgpu_table_fails(self):
        # The fake knows an A100 of 45000 MiB; kgpu's A100-40GB stops at 42000.
        rc, out = self.run_check(
            gpus="GPU-ffff,NVIDIA A100-PCIE-45GB,45000,00000000:3B:00.0", mig="0")
        self.assertEqual(rc, 1, out)
        self.assertIn("kgpu has no table for this GPU", out)
        self.assertIn("DIFFERENCES: 1 GPU(s)", out)

    def test_lists_instances_and_leaves_them(self):
        # A GI (1g.5gb at slice 6, ID 13) with its CI, as a driver made it earlier.
        text = "gi GPU-aaaa 13 0 6\nci GPU-aaaa 13 0 0 6\n"
        with open(self.state, "w") as f:
            f.write(text)
        rc, out = self.run_check()
        self.assertEqual(rc, 0, out)
        self.assertIn("GI 13 CI 0 1g.5gb at 6:1 4864 MiB MIG-", out)
        with open(self.state) as f:
            self.assertEqual(f.read(), text)  # read-only: nothing rewritten

    def test_no_nvml_skips(self):
        env = dict(os.environ)
        p = subprocess.run([ARGS.check, "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"],
                           env=env, capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 77, p.stdout + p.stderr)
        env.pop("KGPU_REAL_NVML", None)
        p = subprocess.run([ARGS.check, "--ctest-gpu"], env=env, capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(p.returncode, 77, p.stdout)
        self.assertIn("KGPU_REAL_NVML", p.stdout)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", required=True)
    ap.add_argument("--fake-nvml", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
