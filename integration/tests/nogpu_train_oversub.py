"""integration/train_oversub_bench.py's own runs on the CPU jax of CI's venv (.ci/test runs the `nogpu_*.py`
files there): the training step, Adam, and the hand-written offload of Adam's moments to `pinned_host` run as on
the GPU machine's stock rows (no device memory limit applies on CPU)."""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train_oversub_bench.py")


class TrainOversubOnCpu(unittest.TestCase):
    def test_stock_and_its_hand_written_offload_train_the_same_model(self):
        with tempfile.TemporaryDirectory() as out:
            p = subprocess.run([sys.executable, SCRIPT, "--platform", "cpu", "--out", out, "--layers", "2",
                                "--dim", "64", "--ffn", "128", "--heads", "4", "--vocab", "256", "--seq", "32",
                                "--steps", "3", "--warmup", "3", "--ratios", "2"],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            with open(os.path.join(out, "train_oversub.json")) as fh:
                data = json.load(fh)
        self.assertEqual(data["failed"], [], data)
        stock, offload = data["rows"]
        self.assertEqual((stock["label"], offload["label"]), ("stock", "stock offload 2.00x"))
        for r in (stock, offload):
            self.assertEqual(len(r["losses"]), 6)
            self.assertTrue(all(math.isfinite(x) for x in r["losses"]), r)
            self.assertLess(r["losses"][-1], r["losses"][0], "Adam lowers the loss on repeated batches")
        # The same arithmetic wherever Adam's moments live: within float32 rounding of each other.
        for x, y in zip(stock["losses"], offload["losses"]):
            self.assertAlmostEqual(x, y, delta=1e-4 * abs(x))
        self.assertIn("| stock offload 2.00x |", p.stdout)


if __name__ == "__main__":
    unittest.main()
