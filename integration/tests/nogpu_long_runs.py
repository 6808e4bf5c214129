"""integration/long_runs.py's own logic on the CPU jax of CI's venv (.ci/test runs the `nogpu_*.py`
files there): the interrupt trials, the soak, the churn and the threads run their work on `cpu`, as they run it on
`vmm` and `cuda` on the GPU machine."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "long_runs.py")


def run(*args, sigint_ignored=False):
    with tempfile.TemporaryDirectory() as out:
        # sigint_ignored: started as from a shell's background job without job control (SIGINT ignored).
        ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
        p = subprocess.run([sys.executable, SCRIPT, *args, "--out", out], capture_output=True, text=True,
                           timeout=600, preexec_fn=ignore)
        name = "long_runs_%s" % args[0]
        with open(os.path.join(out, name + ".json")) as f:
            data = json.load(f)
        with open(os.path.join(out, name + ".md")) as f:
            md = f.read()
        return p, data, md


class LongRuns(unittest.TestCase):
    def test_interrupted_loops_raise_and_exit_within_five_seconds(self):
        p, data, md = run("interrupt", "--platform", "cpu", "--trials", "3", "--seed", "1")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual([t["ok"] for t in data["trials"]], [True] * 3, data)
        self.assertTrue(all(t["exit_s"] <= 5 for t in data["trials"]))
        self.assertIn("| 3 | 3 | 0 |", md)
        self.assertEqual({t["sigint_inherited"] for t in data["trials"]}, {"default"})

    def test_a_sigint_python_drops_in_a_gc_callback_still_ends_the_loop(self):
        # A gc callback that, once the loop runs, sends SIGINT and sleeps: the handler raises inside the
        # callback, where Python drops the exception ("Exception ignored in"), as it did to one CI trial.
        sigint_in_gc = r"""
import gc, os, signal, time
def _sigint_in_gc(phase, info):
    g = globals()
    if phase == "start" and "checksum" in g and not g.get("_fired"):
        g["_fired"] = True
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
gc.callbacks.append(_sigint_in_gc)
gc.set_threshold(50)
"""
        sys.path.insert(0, os.path.dirname(SCRIPT))
        import long_runs
        p = subprocess.run([sys.executable, "-c", sigint_in_gc + long_runs.CHILD, "20000", "1000", "cpu"],
                           capture_output=True, text=True, timeout=300, env=long_runs.platform_env("cpu"))
        self.assertIn("Exception ignored in: <function _sigint_in_gc", p.stderr)
        self.assertIn("dropped where Python ignores exceptions", p.stderr)
        self.assertNotIn('"checksum"', p.stdout)

    def test_the_loop_raises_on_sigint_even_where_it_came_in_ignored(self):
        p, data, md = run("interrupt", "--platform", "cpu", "--trials", "2", "--seed", "2", sigint_ignored=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr + md)
        self.assertEqual([t["ok"] for t in data["trials"]], [True] * 2, data)
        self.assertEqual({t["sigint_inherited"] for t in data["trials"]}, {"ignored"})
        self.assertIn("SIGINT came in ignored in 2 of 2", md)

    def test_a_soak_samples_flat_counters_and_equal_losses(self):
        p, data, md = run("soak", "--platforms", "cpu,cpu", "--steps", "500", "--every", "100")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(sorted(data), ["cpu", "cpu#1"])
        self.assertEqual(data["cpu"]["checksum"], data["cpu#1"]["checksum"])
        self.assertEqual(len(data["cpu"]["samples"]), 5)
        self.assertTrue(all(data["cpu"]["checks"].values()), data["cpu"]["checks"])
        # Its log went to a file the child measured: checked for growth.
        self.assertIn("log", data["cpu"]["checks"])
        self.assertTrue(all(x["log_bytes"] is not None for x in data["cpu"]["samples"]))
        self.assertIn("bit-identical across platforms", md)
        # Open handles sampled (checked flat on the plugin only).
        self.assertTrue(all(x["fds"] > 0 and x["threads"] > 0 for x in data["cpu"]["samples"]))

    def test_a_llama_soak_runs_one_executable_on_every_platform(self):
        # The first platform's child compiles the step and saves it; the second loads it (no compile).
        # Forty steps on a CPU are too few for the compiling child's RSS to settle: the flatness checks
        # are the MLP soak's test; here both children ran and agree.
        p, data, md = run("soak", "--platforms", "cpu,cpu", "--steps", "40", "--every", "10",
                          "--model", "llama_scan_bf16")
        self.assertIn(p.returncode, (0, 1), p.stdout + p.stderr + md)
        self.assertNotIn("failed:", md)
        self.assertEqual(data["cpu"]["checksum"], data["cpu#1"]["checksum"])
        self.assertEqual(data["cpu"]["steps"], 40)
        self.assertIn(data["cpu"]["optimizer"], ("adamw", "sgd"))
        self.assertIn("llama `llama_scan_bf16`", md)
        self.assertIn("bit-identical across platforms", md)

    def test_programs_compiled_run_and_dropped_leave_flat_counters(self):
        p, data, md = run("churn", "--platform", "cpu", "--programs", "60", "--every", "20")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(data["wrong"], [])
        self.assertEqual([x["programs_run"] for x in data["samples"]], [20, 40, 60])
        self.assertEqual(data["checks"], {"results": True, "rss": True})
        self.assertIn("Checks: results ok, rss ok.", md)

    def test_eight_threads_at_once_compute_what_the_same_work_computes_serially(self):
        p, data, md = run("threads", "--platform", "cpu", "--threads", "8", "--seconds", "3")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        workers, serial = data["run"]["workers"], data["run"]["serial"]
        self.assertEqual(len(workers), 8)
        self.assertTrue(all(w["iterations"] > 0 and not w["error"] and not w["wrong"] for w in workers), workers)
        self.assertEqual([w["iterations"] for w in workers], [w["iterations"] for w in serial])
        self.assertEqual([w["checksum"] for w in workers], [w["checksum"] for w in serial])
        self.assertEqual(md.count("| equal |"), 8)


if __name__ == "__main__":
    unittest.main()
