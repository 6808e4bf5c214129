"""integration/diag/kernel_times.py's trace reading on a CPU trace (CI: the jax venv of .ci/test, `python -m
unittest discover -s integration/tests -p 'nogpu_*.py'`): a trace with no GPU plane says so; kernel names
with numbered suffixes fold into one family; the tables show both sides."""
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
        side = lambda k: {"wall_ms_per_step": 2.0, "span_ms": 1.5, "busy_ms": 1.2, "idle": 0.2,  # noqa: E731
                          "kernels": k}
        md = "\n".join(kernel_times.table("m", side({"a": [1.0, 2], "b": [0.2, 1]}),
                                          side({"a": [1.1, 2], "c": [0.1, 1]}), 10))
        self.assertIn("| xla-vmm | 2.000 | 1.500 | 1.200 | 20.0% | 3 |", md)
        self.assertIn("| `b` | 0.2000 (1) | 0.0000 (0) | -0.2000 |", md)
        # The largest difference first.
        self.assertLess(md.index("`b`"), md.index("`c`"))
        no_gpu = "\n".join(kernel_times.table("m", {"wall_ms_per_step": 1.0}, side({}), 5))
        self.assertIn("no GPU plane", no_gpu)


if __name__ == "__main__":
    unittest.main()
