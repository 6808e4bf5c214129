"""integration/diag/kernel_times.py's trace reading on a CPU trace (CI: the jax venv of .ci/test, `python -m
unittest discover -s integration/tests -p 'nogpu_*.py'`): a trace with no GPU plane says so; kernel names
with numbered suffixes fold into one family; the tables show every side, stock first."""
import glob
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "diag"))

import kernel_times  # noqa: E402


class KernelTimes(unittest.TestCase):
    def test_families_fold_numbered_suffixes(self):
        self.assertEqual(kernel_times.kernel_family("fusion.123"), "fusion")
        self.assertEqual(kernel_times.kernel_family("loop_add_fusion_5"), "loop_add_fusion")
        self.assertEqual(kernel_times.kernel_family("gemm_fusion_dot.96.2"), "gemm_fusion_dot")
        self.assertEqual(kernel_times.kernel_family("cutlass_80_tensorop"), "cutlass_80_tensorop")

    def test_a_cpu_trace_has_no_gpu_plane(self):
        import jax
        import jax.numpy as jnp

        with tempfile.TemporaryDirectory() as d:
            with jax.profiler.trace(d):
                (jnp.ones((64, 64)) @ jnp.ones((64, 64))).block_until_ready()
            found = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
            self.assertEqual(len(found), 1, found)
            self.assertEqual(kernel_times.gpu_summary(found[0], 1), {"planes": 0})

    def test_the_table_compares_the_sides(self):
        side = lambda w, k: {"wall_ms_per_step": w, "span_ms": 1.5, "busy_ms": 1.2, "idle": 0.2,  # noqa: E731
                             "kernels": k}
        sides = [("stock", side(2.0, {"a": [1.0, 2], "b": [0.2, 1]})),
                 ("vmm", side(2.1, {"a": [1.1, 2], "c": [0.1, 1]})),
                 ("vmm-recapture", side(2.05, {"a": [1.0, 2], "b": [0.2, 1]}))]
        md = "\n".join(kernel_times.table("m", sides, 10))
        self.assertIn("| vmm | 2.100 | 1.500 | 1.200 | 20.0% | 3 |", md)
        self.assertIn("| kernel family | stock ms/step (count) | vmm ms/step (count) | "
                      "vmm-recapture ms/step (count) | spread ms |", md)
        self.assertIn("| `b` | 0.2000 (1) | 0.0000 (0) | 0.2000 (1) | 0.2000 |", md)
        # The largest spread first.
        self.assertLess(md.index("`b`"), md.index("`c`"))
        self.assertEqual(len([r for r in md.splitlines() if r.startswith("| `")]), 3)
        no_gpu = "\n".join(kernel_times.table("m", [("stock", {"wall_ms_per_step": 1.0}), ("vmm", side(1.0, {}))],
                                               5))
        self.assertIn("no GPU plane", no_gpu)

    def test_sides_start_with_stock_and_are_known(self):
        import contextlib
        import io
        with tempfile.TemporaryDirectory() as out:
            for sides in ("vmm,stock", "stock,vmm-fast"):
                argv, sys.argv = sys.argv, ["kernel_times.py", "--out", out, "--sides", sides]
                try:
                    with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit) as e:
                        kernel_times.main()
                finally:
                    sys.argv = argv
                self.assertEqual(e.exception.code, 2, sides)

if __name__ == "__main__":
    unittest.main()
