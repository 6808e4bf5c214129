"""The GPU harness scripts' own logic, without a GPU (CI runs this with the standard library's unittest):
the runs themselves are replaced by fakes, the tables, budgets, resume and merge are real.

    python3 -m unittest discover -s integration/unit -v
"""
import importlib.util
import io
import json
import os
import re
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
INTEGRATION = os.path.dirname(HERE)


def load(name, path):
    sys.path.insert(0, os.path.dirname(path))
    sys.path.insert(0, os.path.join(INTEGRATION, "tests"))
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def read_json(path):
    with open(path) as fh:
        return json.load(fh)


def quiet(f, argv):
    """Run main() with `argv`; (exit code, stdout)."""
    out = io.StringIO()
    old = sys.argv
    sys.argv = argv
    try:
        with redirect_stdout(out):
            try:
                code = f()
            except SystemExit as e:
                code = e.code
    finally:
        sys.argv = old
    return code, out.getvalue()


class Compare(unittest.TestCase):
    def setUp(self):
        self.m = load("compare", os.path.join(INTEGRATION, "multi", "compare.py"))
        self.calls = []

        def fake(mode, platform, args, threshold=None, cmdbuf_off=False):
            self.calls.append((mode, platform, threshold, cmdbuf_off))
            time.sleep(0.05)
            if (mode, platform, threshold) == ("dist", "vmm", 1):
                return None, "rc 1: boom"
            bits = ["a", "b"] if platform == "cuda" or threshold != 4096 else ["a", "c"]
            return {"median_ms": 5.0 if platform == "cuda" else 4.0, "loss_bits": bits, "final_loss": 1.5}, None

        self.m.run_one = fake

    def test_budget_leaves_runs_pending_and_resume_makes_only_those(self):
        with tempfile.TemporaryDirectory() as d:
            code, _ = quiet(self.m.main, ["compare.py", "--out", d, "--steps", "5", "--thresholds", "0,4096",
                                          "--budget-s", "0.12"])
            self.assertEqual(code, 2, "pending runs: exit 2")
            first = read_json(os.path.join(d, "compare.json"))
            self.assertTrue(first["pending"])
            made = len(self.calls)
            self.assertEqual(made + len(first["pending"]), 10)  # 2 modes x (3 stock + 2 thresholds)
            self.calls.clear()
            code, text = quiet(self.m.main, ["compare.py", "--out", d, "--steps", "5", "--thresholds", "0,4096",
                                             "--resume", os.path.join(d, "compare.json")])
            self.assertEqual(len(self.calls), len(first["pending"]), "resume remade finished runs")
            self.assertEqual(code, 1, "threshold 4096's loss bits differ: a problem")
            self.assertIn("DIFFERS from step 1", text)
            self.assertIn("| single | 0 | 4.000 | 1.5 | 1.25x | identical |", text.replace("llama_small_f32 ", ""))

    def test_a_failed_run_is_a_problem_and_is_remade_on_resume(self):
        with tempfile.TemporaryDirectory() as d:
            code, text = quiet(self.m.main, ["compare.py", "--out", d, "--steps", "5", "--thresholds", "1"])
            self.assertEqual(code, 1)
            self.assertIn("PROBLEM: dist threshold 1: rc 1: boom", text)
            self.calls.clear()
            quiet(self.m.main, ["compare.py", "--out", d, "--steps", "5", "--thresholds", "1",
                                "--resume", os.path.join(d, "compare.json")])
            self.assertEqual(self.calls, [("dist", "vmm", 1, False)])

    def test_resume_of_another_config_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            quiet(self.m.main, ["compare.py", "--out", d, "--steps", "5", "--thresholds", "0"])
            code, _ = quiet(self.m.main, ["compare.py", "--out", d, "--steps", "7", "--thresholds", "0",
                                          "--resume", os.path.join(d, "compare.json")])
            self.assertIn("--resume", str(code))


class AB(unittest.TestCase):
    def setUp(self):
        self.m = load("ab", os.path.join(INTEGRATION, "ab.py"))

        def fake(argv, env, timeout, clocks_ms=None):
            name, d = argv[argv.index("--name") + 1], argv[argv.index("--out") + 1]
            if "--save" in argv:
                with open(os.path.join(d, name + ".exe.pkl"), "w") as fh:
                    fh.write("x")
            time.sleep(0.05)
            stock = env.get("JAX_PLATFORMS") == "cuda"
            ms = 5.0 if stock else 4.0
            return {"step_ms": [9, 9, 9, ms, ms], "loss_bits": [1065353216],
                    "stats": {"steps": 5, "remaps": 5, "copies": 0, "skips": 10}}, None

        self.m.run_child = fake

    def test_budget_then_merge_gives_the_whole_table_with_ratios_against_best_stock(self):
        with tempfile.TemporaryDirectory() as d:
            code, _ = quiet(self.m.main, ["ab.py", "--out", d, "--steps", "5", "--models", "a,b",
                                          "--thresholds", "0,1", "--budget-s", "0.1"])
            self.assertEqual(code, 2)
            first = read_json(os.path.join(d, "ab.json"))
            self.assertEqual(first["pending"], ["b"])
            self.assertEqual({r["model"] for r in first["rows"]}, {"a"})
            code, text = quiet(self.m.main, ["ab.py", "--out", d, "--steps", "5", "--models", "b",
                                             "--thresholds", "0,1", "--merge", os.path.join(d, "ab.json")])
            self.assertEqual(code, 0)
            rows = read_json(os.path.join(d, "ab.json"))["rows"]
            self.assertEqual(sorted({r["model"] for r in rows}), ["a", "b"])
            self.assertIn("| b | vmm t=0 | plugin | 4.000 | 1.25x | 1.00x |", text)


class ABClocks(unittest.TestCase):
    def test_each_rows_clocks_are_kept_per_step_window_and_listed_under_the_table(self):
        m = load("ab", os.path.join(INTEGRATION, "ab.py"))
        asked = []

        def fake(argv, env, timeout, clocks_ms=None):
            asked.append(clocks_ms)
            name, d = argv[argv.index("--name") + 1], argv[argv.index("--out") + 1]
            if "--save" in argv:
                with open(os.path.join(d, name + ".exe.pkl"), "w") as fh:
                    fh.write("x")
            s = {"n": 3, "sm_mhz": 1980, "sm_mhz_min": 1900, "sm_mhz_max": 1980, "mem_mhz": 2619,
                 "reasons": {"sw_power_cap": 0.5}}
            return {"step_ms": [9, 9, 9, 4, 4], "loss_bits": [7],
                    "gpu_clocks": {"first_steps": s, "measured_steps": dict(s, sm_mhz=1755)}}, None

        m.run_child = fake
        with tempfile.TemporaryDirectory() as d:
            code, _ = quiet(m.main, ["ab.py", "--out", d, "--steps", "5", "--models", "a", "--thresholds", "1",
                                     "--modes", "", "--stock-configs", "onoff", "--gpu-clocks-ms", "10"])
            self.assertEqual(code, 0)
            self.assertEqual(asked, [10, 10, 10])
            with open(os.path.join(d, "ab.md")) as fh:
                md = fh.read()
            self.assertIn("- a vmm t=1, measured steps: gpu clocks: 3 readings, SM 1755 MHz (min 1900, max 1980)", md)
            self.assertIn("reasons sw_power_cap 50%", md)
            rows = read_json(os.path.join(d, "ab.json"))["rows"]
            self.assertEqual(rows[-1]["gpu_clocks"]["first_steps"]["sm_mhz"], 1980)

    def test_the_windows_split_at_the_first_measured_step(self):
        m = load("ab", os.path.join(INTEGRATION, "ab.py"))
        m.MEASURE_FROM = 2
        g = load("gpu_clocks", os.path.join(INTEGRATION, "gpu_clocks.py"))
        s = g.Sampler()
        s.readings = [{"t": t, "sm_mhz": mhz, "mem_mhz": 1} for t, mhz in [(0.5, 1900), (1.5, 1800), (2.5, 1700),
                                                                            (3.5, 1600)]]
        s.why = None
        w = m.clock_windows(s, [0.0, 1.0, 2.0, 3.0, 4.0])
        self.assertEqual((w["first_steps"]["n"], w["first_steps"]["sm_mhz_max"]), (2, 1900))
        self.assertEqual((w["measured_steps"]["n"], w["measured_steps"]["sm_mhz_min"]), (2, 1600))
        self.assertEqual(list(m.clock_windows(s, [])), ["child"])


class ABStepCounters(unittest.TestCase):
    def test_each_steps_page_table_changes_from_the_cumulative_counters(self):
        m = load("ab", os.path.join(INTEGRATION, "ab.py"))
        mem = lambda n: {"maps": 10 + 2 * n, "unmaps": 4 + n * n, "allocations_made": 5 + n,  # noqa: E731
                         "va_ranges_made": 3, "device_bytes": 1}
        samples = [m.counters_now({"devices": [{"memory": mem(n)}, {"memory": mem(n)}]}) for n in range(4)]
        self.assertEqual(samples[0], {"maps": 20, "unmaps": 8, "allocations_made": 10, "va_ranges_made": 6})
        per = m.per_step(samples)
        self.assertEqual([p["unmaps"] for p in per], [2, 6, 10])
        self.assertEqual(per[0], {"maps": 4, "unmaps": 2, "allocations_made": 2, "va_ranges_made": 0})
        # An older plugin without the counters: nothing.
        self.assertEqual(m.counters_now({"devices": [{"memory": {"device_bytes": 1}}]}), {})
        # The busiest program's binding counters: the step that re-planned.
        st = lambda n: {"a#0": {"steps": 1, "copies": 0}, "b#1": {"steps": n + 2, "copies": 3 * n,  # noqa: E731
                                                               "replanned": n >= 2}}
        binding = m.per_step([m.counters_now({}, st(n)) for n in range(4)])
        self.assertEqual([(p["copies"], p["replanned"]) for p in binding], [(3, 0), (3, 1), (3, 0)])
        rows = [{"model": "a", "config": "vmm t=1", "step_counters": per}, {"model": "a", "config": "stock"}]
        self.assertEqual(m.counter_lines(rows), ["- a vmm t=1: 0:4/2/2/0 1:4/6/2/0 2:4/10/2/0"])


class ABRepeat(unittest.TestCase):
    def setUp(self):
        self.m = load("ab", os.path.join(INTEGRATION, "ab.py"))
        self.order = []
        self.ms = {"0": iter([4.0, 4.4, 4.2]), "1": iter([3.0, 3.3, 3.1])}

        def fake(argv, env, timeout, clocks_ms=None):
            name, d = argv[argv.index("--name") + 1], argv[argv.index("--out") + 1]
            if "--save" in argv:
                with open(os.path.join(d, name + ".exe.pkl"), "w") as fh:
                    fh.write("x")
            if env.get("JAX_PLATFORMS") == "cuda":
                return {"step_ms": [9, 9, 9, 5.0, 5.0], "loss_bits": [7]}, None
            t = env["XLA_VMM_TMP_COPY_THRESHOLD"]
            self.order.append(t)
            ms = next(self.ms[t])
            return {"step_ms": [9, 9, 9, ms, ms], "loss_bits": [7],
                    "stats": {"steps": 5, "remaps": 5, "copies": 0, "skips": 10}}, None

        self.m.run_child = fake

    def test_rows_run_in_turn_and_show_the_median_of_their_runs(self):
        with tempfile.TemporaryDirectory() as d:
            code, text = quiet(self.m.main, ["ab.py", "--out", d, "--steps", "5", "--models", "a",
                                             "--thresholds", "0,1", "--modes", "", "--repeat", "3"])
            self.assertEqual(code, 0)
            self.assertEqual(self.order, ["0", "1"] * 3, "interleaved")
            rows = {r["config"]: r for r in read_json(os.path.join(d, "ab.json"))["rows"]}
            self.assertEqual(rows["vmm t=0"]["median_ms"], 4.2)
            self.assertEqual(rows["vmm t=1"]["run_medians_ms"], [3.0, 3.3, 3.1])
            self.assertIn("| a | vmm t=1 | plugin | 3.100 |", text)

    def test_runs_whose_losses_differ_are_an_error(self):
        r = {"step_ms": [1, 1, 1, 2], "loss_bits": [1]}
        got, err = self.m.combine_repeats([r, dict(r, loss_bits=[2])])
        self.assertIsNone(got)
        self.assertIn("differ", err)


class Feed(unittest.TestCase):
    def test_rows_per_read_interval_against_stock_of_the_same_interval(self):
        m = load("feed_bench", os.path.join(INTEGRATION, "feed_bench.py"))

        def fake(platform, t, every, a):
            ms = (3.0 if platform == "cuda" else 2.5) + (0.5 if every == 1 else 0.0)
            return {"steps": 10, "seconds": ms / 100, "steps_per_s": 1000 / ms, "ms_per_step": ms,
                    "losses": []}, None

        m.run = fake
        with tempfile.TemporaryDirectory() as d:
            code, text = quiet(m.main, ["feed_bench.py", "--out", d, "--thresholds", "1"])
            self.assertEqual(code, 0)
            self.assertIn("| llama_small_f32 | 50 | xla-vmm t=1 | 2.500 | 400.0 | 1.20x |", text)
            self.assertIn("| llama_small_f32 | 1 | xla-vmm t=1 | 3.000 | 333.3 | 1.17x |", text)


class PerfGate(unittest.TestCase):
    def setUp(self):
        self.m = load("perf_gate", os.path.join(INTEGRATION, "perf_gate.py"))

    def run_gate(self, **suites):
        with tempfile.TemporaryDirectory() as d:
            argv = ["perf_gate.py", "--out", os.path.join(d, "gate.md")]
            for suite, data in suites.items():
                path = os.path.join(d, suite + ".json")
                with open(path, "w") as fh:
                    json.dump(data, fh)
                argv += ["--" + suite, path]
            code, text = quiet(self.m.main, argv)
            with open(os.path.join(d, "gate.md")) as fh:
                self.assertEqual(fh.read().strip(), text.strip())
            return code, text

    def test_default_must_beat_best_stock_and_our_other_modes(self):
        bench = {"rows": [
            {"program": "p", "config": "stock cmdbuf on", "ms": 2.0},
            {"program": "p", "config": "stock SKIP_TEMP", "ms": 1.5},
            {"program": "p", "config": "vmm eager", "ms": 3.0},
            {"program": "p", "config": "vmm graph-recapture", "ms": 1.2},
            {"program": "p", "config": "vmm graph (default)", "ms": 1.0},
            {"program": "q", "config": "stock cmdbuf on", "ms": 2.0},
            {"program": "q", "config": "vmm eager", "ms": 1.0},
            {"program": "q", "config": "vmm graph (default)", "ms": 1.5}]}
        code, text = self.run_gate(bench=bench)
        self.assertEqual(code, 1)
        self.assertIn("| bench | p | 1.500 (stock SKIP_TEMP) | 3.000 | 1.200 | 1.000 | 1.50x | 3.00x | - | PASS |", text)
        self.assertIn("| bench | q | 2.000 (stock cmdbuf on) | 1.000 | - | 1.500 | 1.33x | 0.67x | - | FAIL; "
                      "slower than eager (1.500 > 1.000 ms) |", text)

    def test_within_tolerance_passes_and_a_missing_default_fails(self):
        ab = {"rows": [{"model": "m", "config": "stock cmdbuf off", "median_ms": 1.0},
                       {"model": "m", "config": "vmm t=0", "median_ms": 0.9},
                       {"model": "m", "config": "vmm t=1", "median_ms": 1.015}]}
        mt = {"rows": [{"config": "tiny", "variant": "cuda", "median_ms": 12.0},
                       {"config": "tiny", "variant": "vmm_t1", "median_ms": None}]}
        code, text = self.run_gate(ab=ab, mt=mt)
        self.assertEqual(code, 1)
        self.assertIn("| ab | m | 1.000 (stock cmdbuf off) | - | - | 1.015 | 0.99x | - | vmm t=0 0.900 | PASS |", text)
        self.assertIn("| maxtext | maxtext tiny | 12.000 (cuda) | - | - | - | - | - | - | FAIL; default did not run |",
                      text)

    def test_losses_that_moved_fail_the_row(self):
        ab = {"rows": [{"model": "m", "config": "stock cmdbuf on", "median_ms": 2.0, "loss_bits": [1, 2]},
                       {"model": "m", "config": "stock SKIP_TEMP", "median_ms": 2.0, "loss_bits": [1, 3]},
                       {"model": "m", "config": "vmm eager", "median_ms": 2.0, "loss_bits": [1, 2]},
                       {"model": "m", "config": "vmm t=1", "median_ms": 1.0, "loss_bits": [1, 2]},
                       {"model": "n", "config": "stock cmdbuf on", "median_ms": 2.0, "loss_bits": [1, 2]},
                       {"model": "n", "config": "vmm eager", "median_ms": 2.0, "loss_bits": [1, 2]},
                       {"model": "n", "config": "vmm t=1", "median_ms": 1.0, "loss_bits": [1, 4]}]}
        mt = {"rows": [{"config": "tiny", "variant": "cuda", "median_ms": 12.0, "losses": {"0": 10.9}},
                       {"config": "tiny", "variant": "vmm_t1", "median_ms": 6.0, "losses": {"0": 10.92},
                        "max_dloss": 0.02}]}
        code, text = self.run_gate(ab=ab, mt=mt)
        self.assertEqual(code, 1)
        # Another compile (stock SKIP_TEMP) may round differently: not compared.
        self.assertRegex(text, r"\| ab \| m \|.*\| PASS \|")
        self.assertIn("FAIL; losses differ from stock cmdbuf on; losses differ from vmm eager |", text)
        self.assertIn("FAIL; loss differs from stock's by 0.020 (> 0.010) |", text)

    def test_a_balanced_configs_rows_are_the_means_of_their_two_rounds(self):
        row = lambda var, ms, **kw: dict({"config": "1B", "variant": var, "median_ms": ms}, **kw)  # noqa: E731
        mt = {"rows": [row("cuda", 55.0, losses={"40": 2.0}),
                       row("cuda@MT_ROUND=2", 55.4, repeats="cuda", losses={"40": 2.0}),
                       row("vmm_t1", 55.4, max_dloss=0.001, losses={"40": 2.001}),
                       row("vmm_t1@MT_ROUND=2", 55.2, repeats="vmm_t1", max_dloss=0.004, losses={"40": 2.004}),
                       row("vmm_eager", 55.5),
                       row("cuda", 12.0, config="tiny"), row("vmm_t1", 6.0, config="tiny")]}
        code, text = self.run_gate(mt=mt)
        self.assertEqual(code, 0)
        # One row per config, its rounds' means (55.2 and 55.3), the rounds' larger loss drift.
        self.assertIn("| maxtext | maxtext 1B (A B B A) | 55.200 (cuda) | 55.500 | - | 55.300 | 1.00x | 1.00x | - "
                      "| PASS |", text)
        self.assertIn("| maxtext | maxtext tiny | 12.000 (cuda) |", text)
        mt["rows"][3]["max_dloss"] = 0.02
        code, text = self.run_gate(mt=mt)
        self.assertIn("FAIL; loss differs from stock's by 0.020 (> 0.010) |", text)
        # A round with no median: the other's.
        mt["rows"][3].update(max_dloss=None, median_ms=None)
        code, text = self.run_gate(mt=mt)
        self.assertIn("| 55.200 (cuda) | 55.500 | - | 55.400 | 1.00x | 1.00x |", text)

    def test_no_input_is_not_a_pass(self):
        code, _ = quiet(self.m.main, ["perf_gate.py", "--bench", "/nonexistent.json"])
        self.assertEqual(code, 3)


class MaxText(unittest.TestCase):
    def setUp(self):
        self.m = load("mt_run", os.path.join(INTEGRATION, "maxtext", "run.py"))

    def test_step_time_from_tokens_per_second_and_variants(self):
        lines = ["I1201 completed step: 3, seconds: 0.003, TFLOP/s/device: 1.234, Tokens/s/device: 40000.000, "
                 "total_weights: 128, loss: 10.123, lm_loss: 10.123",
                 "\x1b[0mcompleted step: 4, seconds: 0.004, TFLOP/s/device: 1.0, Tokens/s/device: 32000.000, "
                 "total_weights: 128, loss: 9.5, lm_loss: 9.5"]
        st = self.m.parse_log(lines, 128)
        self.assertAlmostEqual(st[3][0], 3.2)
        self.assertAlmostEqual(st[4][0], 4.0)
        self.assertEqual(st[4][1], 9.5)
        env = self.m.variant_env("cuda_skip_temp")
        self.assertEqual(env["JAX_PLATFORMS"], "cuda")
        self.assertIn("--xla_gpu_command_buffer_update_mode=SKIP_TEMP", env["XLA_FLAGS"])
        env = self.m.variant_env("vmm_t4096@XLA_VMM_COPY_PATH=batch")
        self.assertEqual((env["JAX_PLATFORMS"], env["XLA_VMM_TMP_COPY_THRESHOLD"], env["XLA_VMM_COPY_PATH"]),
                         ("vmm", "4096", "batch"))
        self.assertEqual(self.m.variant_env("vmm_eager")["XLA_VMM_EXEC_MODE"], "eager")
        self.assertIsNone(self.m.variant_env("nonsense"))
        spec = "cuda,tiny:cuda_skip_profiled,vmm_t1,1B:vmm_t0@XLA_VMM_COPY_PATH=batch"
        self.assertEqual(self.m.variants_of(spec, "tiny"), ["cuda", "cuda_skip_profiled", "vmm_t1"])
        self.assertEqual(self.m.variants_of(spec, "1B"), ["cuda", "vmm_t1", "vmm_t0@XLA_VMM_COPY_PATH=batch"])
        # The gate's rows first (stock and the default of every config), our other modes after.
        order = self.m.run_order("tiny,1B", "cuda,cuda_skip_temp,vmm_t1,vmm_eager,vmm_recapture")
        self.assertEqual(order, [("tiny", "cuda"), ("tiny", "cuda_skip_temp"), ("tiny", "vmm_t1"),
                                 ("1B", "cuda"), ("1B", "cuda_skip_temp"), ("1B", "vmm_t1"),
                                 ("tiny", "vmm_eager"), ("tiny", "vmm_recapture"),
                                 ("1B", "vmm_eager"), ("1B", "vmm_recapture")])
        # A balanced config runs its gate rows again right after, in the other order (A B B A).
        order = self.m.run_order("tiny,1B", "cuda,vmm_t1@XLA_VMM_COPY_PATH=batch,vmm_eager", ["1B"])
        self.assertEqual(order, [("tiny", "cuda"), ("tiny", "vmm_t1@XLA_VMM_COPY_PATH=batch"),
                                 ("1B", "cuda"), ("1B", "vmm_t1@XLA_VMM_COPY_PATH=batch"),
                                 ("1B", "vmm_t1@XLA_VMM_COPY_PATH=batch,MT_ROUND=2"), ("1B", "cuda@MT_ROUND=2"),
                                 ("tiny", "vmm_eager"), ("1B", "vmm_eager")])
        for var in ("cuda", "vmm_t1@XLA_VMM_COPY_PATH=batch"):
            self.assertEqual(self.m.first_round(self.m.again(var)), var)
            self.assertIsNone(self.m.first_round(var))
            self.assertTrue(self.m.essential(self.m.again(var)))
        # The second round's environment is the first's (plus an entry nothing reads).
        self.assertEqual(self.m.variant_env("vmm_t1@XLA_VMM_COPY_PATH=batch,MT_ROUND=2"),
                         dict(self.m.variant_env("vmm_t1@XLA_VMM_COPY_PATH=batch"), MT_ROUND="2"))

    def test_a_diagnostic_row_the_budget_left_out_does_not_fail_the_run(self):
        row = lambda var, rc, error="": {"variant": var, "rc": rc, "error": error}  # noqa: E731
        spent = "budget spent (--budget-s 264)"
        ran = [row("cuda", 0), row("vmm_t1", 0)]
        self.assertEqual(self.m.exit_status(ran + [row("vmm_eager", "skip", spent)]), 0)
        # The gate's own rows must run; a diagnostic row that failed fails.
        self.assertEqual(self.m.exit_status(ran + [row("vmm_t1", "skip", spent)]), 1)
        self.assertEqual(self.m.exit_status(ran + [row("vmm_recapture", 1, "Traceback")]), 1)
        self.assertEqual(self.m.exit_status(ran + [row("vmm_eager", "skip", "no xla-vmm wheel")]), 1)
        # With --required, only those rows count (stock's failures are results).
        self.assertEqual(self.m.exit_status([row("cuda", 1), row("vmm_t1", 0)], ("vmm",)), 0)
        self.assertEqual(self.m.exit_status([row("cuda", 0), row("vmm_t1", 137)], ("vmm",)), 1)


    def test_programs_are_matched_against_jaxs_compile_log(self):
        lines = ["WARNING:jax._src.interpreters.pxla:Compiling train_step with global shapes and types [...]",
                 "\x1b[33mWARNING\x1b[0m Compiling _multi_slice with global shapes and types [...]",
                 "W1205 Compiling shard_batch with global shapes and types",
                 # jax 0.11's form: jit(NAME); a lambda's module is jit__lambda_
                 "W1205 18:04:10 pxla.py:1874] Compiling jit(<lambda>) with global shapes and types [...]",
                 "W1205 18:04:11 pxla.py:1874] Compiling jit(_where) with global shapes and types [...]",
                 "completed step: 3, seconds: 0.003"]
        reports = [{"programs": [
            {"program": "jit_train_step", "runner": "va-stable graph", "steps": 60},
            {"program": "jit__lambda_", "runner": "va-stable graph", "steps": 1},
            {"program": "jit__where", "runner": "va-stable graph", "steps": 1},
            {"program": "jit__multi_slice", "runner": "eager", "steps": 2,
             "reason": "conditional c reads its branch index on the host"}]}]
        p = self.m.programs_of(lines, reports)
        self.assertEqual((p["listed"], p["compiled"]), (4, 5))
        self.assertEqual(p["by_runner"], {"va-stable graph": 3, "eager": 1})
        self.assertEqual(p["unlisted"], ["shard_batch"])
        self.assertEqual(p["not_graph"], [("jit__multi_slice", "eager",
                                           "conditional c reads its branch index on the host")])
        row = {"config": "tiny", "variant": "vmm_t1", "rc": 0, "steps_done": 0, "median_ms": None,
               "max_dloss": None, "vmm_lines": 0, "error": "", "programs": p}
        md = self.m.summarize([row])
        self.assertIn("- tiny vmm_t1: 4 programs listed (JAX compiled 5): 1 eager, 3 va-stable graph; not a graph: "
                      "jit__multi_slice (eager: conditional c reads its branch index on the host); "
                      "NOT LISTED: shard_batch", md)

    def test_traced_rows_show_gpu_work_against_the_step(self):
        gpu = {"planes": 1, "kernels": {"fusion": [30.0, 100], "gemm": [20.0, 40]}, "busy_ms": 48.0,
               "span_ms": 52.0, "idle": 0.077}
        rows = [{"config": "1B", "variant": v, "rc": 0, "steps_done": 40, "median_ms": ms, "max_dloss": None,
                 "vmm_lines": 0, "error": "", **extra}
                for v, ms, extra in [("cuda", 50.0, {"gpu": gpu}), ("vmm_t1", 60.0, {"gpu": gpu}),
                                     ("vmm_eager", 55.0, {})]]
        md = self.m.summarize(rows)
        self.assertIn("| 1B | cuda | 50.000 | 50.000 | 48.000 | 52.000 | 4.0% |", md)
        self.assertIn("| 1B | vmm_t1 | 60.000 | 50.000 | 48.000 | 52.000 | 20.0% |", md)
        self.assertNotIn("| 1B | vmm_eager | 55.000 | 50", md)
        self.assertEqual(self.m.gpu_table(rows[2:]), [])

    def test_programs_dropped_before_exit_are_listed(self):
        # MaxText's train_step is a local of its loop: dropped before the report at exit.
        lines = ["W1205 Compiling jit(train_step) with global shapes and types [...]",
                 "W1205 Compiling jit(add) with global shapes and types [...]"]
        reports = [{"programs": [{"program": "jit_add", "runner": "eager", "steps": 3}],
                    "dropped": [{"program": "jit_train_step", "runner": "va-stable graph", "steps": 20}],
                    "dropped_total": 1}]
        p = self.m.programs_of(lines, reports)
        self.assertEqual((p["listed"], p["compiled"], p["unlisted"]), (2, 2, []))
        self.assertEqual(p["by_runner"], {"va-stable graph": 1, "eager": 1})

    def test_graph_recapture_programs_that_capture_again_are_listed(self):
        lines = ["W1205 Compiling jit(train_step) with global shapes and types [...]",
                 "W1205 Compiling jit(clip) with global shapes and types [...]",
                 "W1205 Compiling jit(cos) with global shapes and types [...]"]
        reports = [{"programs": [{"program": "jit_train_step", "runner": "graph-recapture", "steps": 60,
                                  "graph_captures": 2},
                                 {"program": "jit_clip", "runner": "graph-recapture", "steps": 60,
                                  "graph_captures": 41},
                                 {"program": "jit_cos", "runner": "va-stable graph", "steps": 60}]}]
        p = self.m.programs_of(lines, reports)
        self.assertEqual(p["recapturing"], [("jit_clip", 41, 60)])
        line = self.m.programs_line({"config": "tiny", "variant": "vmm_t1", "programs": p})
        self.assertIn("1 va-stable graph; graph-recapture capturing again: jit_clip 41 of 60 steps", line)
        self.assertNotIn("not on graph-recapture", line)  # jit_cos: no guard (its runner was configured)

    def test_programs_off_graph_recapture_say_what_the_guard_measured(self):
        lines = ["W1205 Compiling jit(mul) with global shapes and types [...]"]
        guard = {"runner": "va-stable", "decided_at_step": 14, "va_stable_us": 2510.0, "recapture_us": 2790.0,
                 "eager_us": None, "second_look": {"decided_at_step": 27, "va_stable_us": 2600.0,
                                                   "recapture_us": 2750.0, "eager_us": None}}
        reports = [{"programs": [{"program": "jit_mul", "runner": "va-stable graph", "steps": 100, "guard": guard},
                                 {"program": "jit_add", "runner": "graph-recapture", "steps": 100}]}]
        p = self.m.programs_of(lines, reports)
        self.assertEqual(p["off_recapture"], [{
            "program": "jit_mul", "runner": "va-stable graph", "steps": 100,
            "guard": {"at": 14, "va_stable": 2.51, "recapture": 2.79, "eager": None,
                      "second": {"at": 27, "va_stable": 2.6, "recapture": 2.75, "eager": None}}}])
        line = self.m.programs_line({"config": "tiny", "variant": "vmm_t1", "programs": p})
        self.assertIn("not on graph-recapture: jit_mul va-stable graph, 100 steps, decided at step 14 "
                      "(va-stable 2.510, recapture 2.790 ms), second look at step 27 (va-stable 2.600, "
                      "recapture 2.750 ms)", line)

    def test_a_program_past_the_budget_says_what_it_moved(self):
        lines = ["W1205 Compiling jit(train_step) with global shapes and types [...]"]
        staging = {"area_bytes": 2 << 30, "staged": 40, "staged_bytes": 9 << 30, "kept": 0, "kept_bytes": 0,
                   "refills": 0, "carried": 0, "carried_bytes": 0, "in_place": 0, "in_place_bytes": 0,
                   "device_bytes": 7 << 30, "bytes_in_per_step": 8 << 30, "bytes_out_per_step": 6 << 30,
                   "estimated_step_us": 290e3, "unbudgeted_step_us": 55e3, "timed_steps": 3, "gpu_step_us": 330e3,
                   "copy_in_gbps": 50.0, "waited_us": 250e3, "link_utilisation": 0.9,
                   "link_bytes_per_s": 47e9, "link_out_bytes_per_s": 44e9, "link_both_bytes_per_s": 67e9}
        reports = [{"programs": [{"program": "jit_train_step", "runner": "va-stable graph", "steps": 20,
                                  "staging": staging},
                                 {"program": "jit_add", "runner": "eager", "steps": 20}]}]
        p = self.m.programs_of(lines, reports)
        self.assertEqual([x["program"] for x in p["staged"]], ["jit_train_step"])
        self.assertEqual(p["staged"][0]["bytes_in_per_step"], 8 << 30)
        row = {"config": "1B", "variant": "vmm_t1@XLA_VMM_DEVICE_MEMORY_LIMIT=10G", "programs": p}
        line = self.m.programs_line(row)
        self.assertIn("jit_train_step (va-stable graph, 20 steps): past the budget, 9216 MiB staged, 7168 MiB on "
                      "the device; per step 8192 MiB in, 6144 MiB out; last timed step 330.0 ms on the device, "
                      "copies in at 50.0 GB/s, compute waited 250.0 ms, link 90% busy", line)
        # 14 GiB at 50 GB/s
        self.assertIn("both ways at that rate 300.6 ms; planned 290.0 ms (55.0 with no budget) with the link at "
                      "47.0 GB/s in, 44.0 out, 67.0 both at once", line)
        # The inference bench says the same of its stagings; an older plugin's summary has no link.
        ob = load("oversub_bench", os.path.join(INTEGRATION, "oversub_bench.py"))
        self.assertEqual(ob.link_planned(staging), "; planned with the link at 47.0 GB/s in, 44.0 out, 67.0 both at once")
        self.assertEqual(ob.link_planned({"bytes_in_per_step": 1}), "")

    def test_the_error_named_is_the_one_that_ended_the_run(self):
        # A traceback logged and caught earlier (an optional import) is not why the run died.
        lines = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
                 "ModuleNotFoundError: No module named 'transformer_engine'", "completed step: 0",
                 "Traceback (most recent call last):", '  File "train.py", line 9, in main',
                 "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 7.63GiB."]
        self.assertEqual(self.m.first_error(lines, 1),
                         "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 7.63GiB.")
        self.assertEqual(self.m.first_error(["completed step: 3"], 0), "")
        self.assertEqual(self.m.first_error(["ERROR xla_vmm: bad", "Traceback (most recent call last):", "E: x"], 1),
                         "ERROR xla_vmm: bad")

    def test_a_prepared_run_waits_for_its_go(self):
        # The harness's prelude without MaxText: import, say so, wait for the go, run with the arguments.
        prelude = ("import sys\nprint('imported', flush=True)\nif sys.stdin.readline().strip() != 'go':\n"
                   "    sys.exit(0)\nprint('ran', sys.argv[1:], flush=True)\n")
        with tempfile.TemporaryDirectory() as d, mock.patch.object(self.m, "PRELUDE", prelude):
            run = self.m.Prepared(["a=1", "b=2"], dict(os.environ), os.path.join(d, "run.log"))
            self.assertEqual(run.go(30), (0, False))
            with open(run.log) as fh:
                self.assertEqual(fh.read().splitlines(), ["imported", "ran ['a=1', 'b=2']"])
            never = self.m.Prepared([], dict(os.environ), os.path.join(d, "never.log"))
            never.cancel()
            self.assertIsNotNone(never.proc.returncode)
            with open(never.log) as fh:
                self.assertNotIn("ran", fh.read())


    def test_a_next_process_still_importing_is_stopped_while_this_run_steps(self):
        # This run completes a step, then runs on a little; beside it, the next run's process: still
        # importing (it never says it imported), or imported and waiting for its go.
        steps = ("import sys, time\nif sys.stdin.readline().strip() != 'go':\n    sys.exit(0)\n"
                 "print('completed step: 0', flush=True)\ntime.sleep(0.5)\n")
        importing = "import time\nwhile True:\n    time.sleep(0.01)\n"
        waiting = "import sys\nprint(%r, flush=True)\nsys.stdin.readline()\n" % self.m.IMPORTED

        def start(d, name, prelude):
            with mock.patch.object(self.m, "PRELUDE", prelude):
                return self.m.Prepared([], dict(os.environ), os.path.join(d, name + ".log"))

        def state(proc):
            with open("/proc/%d/stat" % proc.pid) as fh:
                return fh.read().rsplit(")", 1)[1].split()[0]

        with tempfile.TemporaryDirectory() as d:
            slow = start(d, "slow", importing)
            try:
                run = start(d, "run", steps)
                self.assertEqual(run.go(30, beside=slow), (0, True))
                self.assertGreater(sum(run.cpus.values()), 0, "its CPU sampled while it stepped")
                self.assertTrue(all(isinstance(c, int) and c >= 0 for c in run.cpus))
                self.assertNotEqual(state(slow.proc), "T", "continued once the run exited")
            finally:
                slow.cancel()
            ready = start(d, "ready", waiting)
            try:
                for _ in range(200):
                    if ready.said(re.escape(self.m.IMPORTED)):
                        break
                    time.sleep(0.05)
                ready.read_to = 0  # let go() read the line again
                self.assertEqual(start(d, "run2", steps).go(30, beside=ready), (0, False))
            finally:
                ready.cancel()
            self.assertEqual(start(d, "run3", steps).go(30), (0, False))


class MaxTextCheckpoint(unittest.TestCase):
    # A stand-in for MaxText's trainer: its loss is a function of a state that it saves (JSON, one file per
    # step) where MaxText would, and restores from the newest file; FAKE_BAD=PLATFORM perturbs a restored
    # state on that platform. As MaxText's, its schedule follows `steps` unless learning_rate_schedule_steps
    # is given, and without deterministic ops its numbers differ from process to process.
    TRAINER = """import json, os, random, sys
print('imported', flush=True)
if sys.stdin.readline().strip() != 'go':
    sys.exit(0)
kv = dict(x.split('=', 1) for x in sys.argv[2:] if '=' in x)
steps, ck = int(kv['steps']), kv.get('enable_checkpointing') == 'true'
d = os.path.join(kv['base_output_directory'], kv['run_name'], 'checkpoints')
state, start = 1.0, 0
if ck and os.path.isdir(d) and os.listdir(d):
    last = max(int(x) for x in os.listdir(d))
    with open(os.path.join(d, str(last))) as fh:
        state, start = json.load(fh)['state'], last + 1
if start and os.environ.get('FAKE_BAD') == os.environ['JAX_PLATFORMS']:
    state += 1e-3
with open(kv['metrics_file'], 'a') as f:
    sched = int(kv.get('learning_rate_schedule_steps', '-1'))
    noisy = 'xla_gpu_deterministic_ops=true' not in os.environ.get('XLA_FLAGS', '')
    for s in range(start, steps):
        state = state * (1 - 0.1 * s / (sched if sched > 0 else steps)) + 0.01 + (random.random() * 1e-6 if noisy else 0)
        f.write(json.dumps({'step': float(s), 'learning/loss': state, 'run_name': kv['run_name']}) + '\\n')
        if ck and ((s and s % int(kv['checkpoint_period']) == 0) or s == steps - 1):
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, str(s)), 'w') as fh:
                json.dump({'state': state}, fh)
"""

    def setUp(self):
        self.m = load("mt_checkpoint", os.path.join(INTEGRATION, "maxtext", "checkpoint.py"))
        self.run = sys.modules["run"]

    def main(self, d, bad=None):
        extra = {"FAKE_BAD": bad} if bad else {}
        # As install_site does: the runs' environment is the process's when the runs are prepared.
        site = mock.patch.object(self.m, "install_site", lambda *a: (d, dict(os.environ, **extra), True))
        with site, mock.patch.object(self.run, "PRELUDE", self.TRAINER), mock.patch.dict(os.environ):
            code, _ = quiet(self.m.main, ["checkpoint.py", "--mt", d, "--out", d + "/out", "--work", d + "/work",
                                          "--steps", "3"])
        with open(d + "/out/ckpt.md") as fh:
            return code, read_json(d + "/out/ckpt.json"), fh.read()

    def test_resumes_that_continue_exactly_pass_and_a_perturbed_restore_fails_where_it_shows(self):
        with tempfile.TemporaryDirectory() as d:
            code, res, md = self.main(d)
            self.assertEqual(code, 0, md)
            self.assertTrue(all(c["pass"] for c in res["checks"]), md)
            self.assertEqual(sorted(res["losses"]["vmm_resume"]), ["3", "4", "5"])
            self.assertEqual(sorted(res["losses"]["vmm_save"]), ["0", "1", "2"])
            self.assertIn("vmm_full equals stock_full over steps 0..5", md)
        with tempfile.TemporaryDirectory() as d:
            code, res, md = self.main(d, bad="vmm")
            self.assertEqual(code, 1)
            verdict = {c["check"]: c["pass"] for c in res["checks"]}
            self.assertEqual(verdict, {"completed": True, "first half": True, "resume on us": False,
                                       "resume on stock": True, "as stock": False, "stock -> us": False,
                                       "us -> stock": False}, md)
            self.assertIn("| resume on us | FAIL | vmm_resume vs vmm_full: first differs at step 3", md)

    def test_missing_steps_and_failed_runs_are_named(self):
        losses = {"stock_full": {s: 1.0 for s in range(4)}, "vmm_full": {s: 1.0 for s in range(4)},
                  "vmm_save": {0: 1.0, 1: 1.0}, "vmm_resume": {2: 1.0}}
        rows = self.m.evaluate(losses, {"vmm_resume": 1, "stock_full": 0}, 2)
        done = dict((c, (ok, d)) for c, ok, d in rows)
        self.assertFalse(done["completed"][0])
        self.assertIn("vmm_resume (rc 1, 1 of 2 steps)", done["completed"][1])
        self.assertIn("steps missing: 3", done["resume on us"][1])
        self.assertEqual(self.m.bits(1.0), 0x3F800000)


class Bench(unittest.TestCase):
    def test_table_has_every_config_and_the_default_against_best_stock(self):
        m = load("bench", os.path.join(INTEGRATION, "bench.py"))
        rows = [{"program": "p", "config": "stock cmdbuf on", "ms": 2.0, "gpu_ms": None},
                {"program": "p", "config": "stock cmdbuf off", "ms": 1.6, "gpu_ms": None},
                {"program": "p", "config": "vmm graph (default)", "ms": 0.8, "gpu_ms": 0.5}]
        text = m.markdown(rows)
        self.assertIn("| program | stock cmdbuf on ms | stock cmdbuf off ms | vmm graph (default) ms |", text)
        self.assertIn("| p | 2.000 | 1.600 | 0.800 | 2.00x | 0.500 | 3.20x |", text)
        self.assertEqual(m.parse_env_rows(["graph copy=batch:XLA_VMM_COPY_PATH=batch,A=b"]),
                         [("vmm graph copy=batch", {"XLA_VMM_COPY_PATH": "batch", "A": "b"})])


class OversubBench(unittest.TestCase):
    def test_a_budgeted_run_whose_outputs_differ_fails_and_stock_offload_may_differ(self):
        m = load("oversub_bench", os.path.join(INTEGRATION, "oversub_bench.py"))

        def rows(budgeted_digest):
            def run(a, mode, ratio, wbytes, total_dev):
                d = "same" if (mode == "vmm" and not ratio) else (budgeted_digest if mode == "vmm" else "other")
                phase = {"ms": 10.0, "tokens_per_s": 100.0, "digest": d}
                return {"mode": mode, "ratio": ratio, "prefill": phase, "decode": dict(phase)}, None
            return run

        for budgeted, code in (("same", 0), ("diff", 1)):
            with tempfile.TemporaryDirectory() as out, mock.patch.object(m, "run", rows(budgeted)):
                got, text = quiet(m.main, ["oversub_bench.py", "--out", out, "--rows", "vmm,offload",
                                           "--ratios", "2", "--layers", "1", "--dim", "128", "--ffn", "256",
                                           "--vocab", "64"])
                self.assertEqual(got, code, text)
                table = read_json(os.path.join(out, "oversub.json"))
                self.assertEqual(len(table["rows"]), 3)
                if code:
                    self.assertEqual(table["errors"], ["vmm 2.00x: outputs differ from vmm none's"])


class OversubBenchRows(unittest.TestCase):
    def test_only_the_unbudgeted_row_saves_the_executables_and_stock_gets_the_cards_share(self):
        m = load("oversub_bench", os.path.join(INTEGRATION, "oversub_bench.py"))
        seen = []
        m.run_json_child = lambda argv, env, timeout: (seen.append((argv, env)), ({}, None))[1]
        a = mock.Mock(layers=1, dim=2, ffn=3, vocab=4, batch=1, seq=8, steps=1, warmup=1, timeout=9,
                      save_exe="/tmp/x_exe_dir_test")
        with mock.patch("os.makedirs"):
            m.run(a, "vmm", 0.0, 8 << 30, 80 << 30)
            m.run(a, "vmm", 2.0, 8 << 30, 80 << 30)
            m.run(a, "offload", 2.0, 8 << 30, 80 << 30)
        self.assertEqual(["--save-exe" in argv for argv, _ in seen], [True, False, False])
        self.assertEqual(seen[1][1]["XLA_VMM_DEVICE_MEMORY_LIMIT"], str(4 << 30))
        self.assertEqual(seen[2][1]["XLA_PYTHON_CLIENT_MEM_FRACTION"], "0.0500")


class TrainOversubBench(unittest.TestCase):
    def setUp(self):
        self.m = load("train_oversub_bench", os.path.join(INTEGRATION, "train_oversub_bench.py"))

    def args(self, **changes):
        import argparse
        return argparse.Namespace(**dict(
            dict(layers=1, dim=2, ffn=3, heads=1, vocab=4, batch=1, seq=8, steps=3, warmup=2, scan=False, timeout=9,
                 ratios="2", rows="stock,vmm,capped,offload", platform="gpu", link_gbps=50.0, link_out_gbps=None,
                 link_both_gbps=None, save_exe=None, trace=None, trace_steps=3, cli=None), **changes))

    def test_the_state_is_weights_and_two_moments_in_float32(self):
        # 1 layer of dim 2, ffn 3: 4*4 + 3*6 + 2*2 = 38, and vocab 4 x 2 + 2 = 10 -> 48 parameters, 3 x 4 bytes each.
        self.assertEqual(self.m.state_bytes(1, 2, 3, 4), 48 * 12)

    def test_rows_environments_and_link_bound(self):
        a = self.args(warmup=30)
        self.assertEqual([r[0] for r in self.m.plan_rows(a)],
                         ["stock", "vmm none", "vmm 2.00x", "stock capped 2.00x", "stock offload 2.00x"])
        # On CPU jax: stock's rows that need no limit.
        self.assertEqual([r[0] for r in self.m.plan_rows(self.args(platform="cpu"))], ["stock", "stock offload 2.00x"])
        seen = []
        self.m.run_json_child = lambda argv, env, timeout: (seen.append((argv, env)), ({}, None))[1]
        for mode, ratio in (("vmm", 0.0), ("vmm", 2.0), ("stock", 2.0), ("offload", 2.0)):
            self.m.run(a, mode, ratio, 8 << 30, 80 << 30)
        envs = [e for _, e in seen]
        self.assertNotIn("XLA_VMM_DEVICE_MEMORY_LIMIT", envs[0])
        self.assertEqual(envs[1]["XLA_VMM_DEVICE_MEMORY_LIMIT"], str(4 << 30))
        self.assertEqual((envs[2]["JAX_PLATFORMS"], envs[2]["XLA_PYTHON_CLIENT_MEM_FRACTION"]), ("cuda", "0.0500"))
        self.assertEqual(envs[3]["XLA_PYTHON_CLIENT_MEM_FRACTION"], "0.0500")
        # Our rows warm the guard up; stock's need only a few steps.
        warm = [[x for x in argv if x.startswith("--warmup=")] for argv, _ in seen]
        self.assertEqual(warm, [["--warmup=30"], ["--warmup=30"], ["--warmup=3"], ["--warmup=3"]])
        # --save-exe: only our unlimited row writes the step's executable.
        seen.clear()
        with tempfile.TemporaryDirectory() as d:
            exe = os.path.join(d, "exe")
            for mode, ratio in (("vmm", 0.0), ("vmm", 2.0), ("stock", 0.0)):
                self.m.run(self.args(save_exe=exe), mode, ratio, 8 << 30, 80 << 30)
            self.assertTrue(os.path.isdir(exe))
        saves = [argv[argv.index("--save-exe") + 1] if "--save-exe" in argv else None for argv, _ in seen]
        self.assertEqual(saves, [exe, None, None])
        # 1 GB each way: 20 ms in at 50 GB/s, directions taking turns: 40 ms; full duplex at 80: 25 ms.
        self.assertAlmostEqual(self.m.link_bound_ms(1e9, a), 40.0)
        self.assertAlmostEqual(self.m.link_bound_ms(1e9, self.args(link_both_gbps=80.0)), 25.0)

    def test_a_traced_row_is_set_beside_the_estimate_of_its_step(self):
        seen = []
        self.m.run_json_child = lambda argv, env, timeout: (seen.append((argv, env)), ({}, None))[1]
        with tempfile.TemporaryDirectory() as d:
            a = self.args(trace=os.path.join(d, "tr"), save_exe=os.path.join(d, "exe"))
            for mode, ratio in (("vmm", 0.0), ("vmm", 2.0), ("stock", 2.0)):
                self.m.run(a, mode, ratio, 8 << 30, 80 << 30)
            # Only our limited row traces, in a process with the CUDA plugin too (its profiler).
            traced = [argv[argv.index("--trace") + 1] if "--trace" in argv else None for argv, _ in seen]
            self.assertEqual(traced, [None, os.path.join(d, "tr", "ratio_2"), None])
            self.assertEqual([e["JAX_PLATFORMS"] for _, e in seen], ["vmm", "vmm,cuda", "cuda"])
            r = {"label": "vmm 2.00x", "mode": "vmm", "ratio": 2.0}
            self.assertIn("no estimate beside it", self.m.set_beside(a, r, 8 << 30)[0])
            # The CLI's estimate (a made-up one, with the arguments it was given) against a made-up trace.
            est = StagingVsTrace()
            est.setUp()
            cli = os.path.join(d, "cli")
            with open(cli, "w") as fh:
                fh.write("#!%s\nimport json, sys\nprint(json.dumps(dict(%r, argv=sys.argv[1:])))\n"
                         % (sys.executable, est.estimate))
            os.chmod(cli, 0o755)
            with open(os.path.join(d, "exe", "train_step.pjrt"), "wb") as fh:
                fh.write(b"x")
            os.makedirs(a.trace + "/ratio_2")
            a.cli = cli
            ms = 1e6
            kernels = [(name, t0 + at * ms, dur * ms) for t0 in (0, 5 * ms, 10 * ms)
                       for name, at, dur in (("b_2", 0, 1.5), ("a_1", 2, 1), ("c", 3, 0.1))]
            lines = [("/device:GPU:0", "Stream #1", kernels)]
            note = self.m.set_beside(a, r, 8 << 30, load_trace=lambda folder: lines)
            self.assertRegex(note[0], r"^- vmm 2.00x, its trace against the estimate \(estimated / measured\): "
                                      r"step 6.00 / 5.00 ms, kernels running 4.60 / 2.60 ms, "
                                      r"nothing to run 1.40 / 2.40 ms")
            with open(os.path.join(d, "tr", "ratio_2", "staging_vs_trace.md")) as fh:
                text = fh.read()
            self.assertIn("inspect %s --memory-budget %d --as-run --json --link-gbps 50.0" % (
                os.path.join(d, "exe", "train_step.pjrt"), 4 << 30), text)
            self.assertIn("| step | 6.00 ms | 5.00 ms |", text)
            # A trace that cannot be read: said, not raised.
            bad = self.m.set_beside(a, r, 8 << 30, load_trace=lambda folder: [])
            self.assertIn("not set beside the estimate", bad[0])

    def test_a_limited_row_says_what_other_programs_hold_on_the_device(self):
        mem = lambda name, i, dev, shared: dict(program=name, id=i, device_bytes=dev << 20,  # noqa: E731
                                                host_bytes=0, shared_bytes=shared << 20)
        # Staged programs of other names are others too (the initialisation's `jit_multiply` runs staged).
        r = dict(label="vmm 2.00x", ratio=2.0,
                 staged=[{"program": "jit_multiply", "id": 2, "estimated_step_us": 3e3},
                         {"program": "jit_train_step", "id": 7, "estimated_step_us": 160e3}],
                 memory=[mem("jit_train_step", 7, 1, 0), mem("jit__normal", 1, 2, 250), mem("jit_multiply", 2, 4, 44),
                         mem("jit_idle", 3, 0, 0)],
                 shared_temporaries=[{"memories": 2, "bytes": 294 << 20}])
        line, = self.m.memory_lines(r)
        self.assertIn("the 2 other programs hold 6 MiB of device memory of their own; the device's shared "
                      "temporaries hold 294 MiB", line)
        self.assertIn("jit__normal 2 + 250 MiB, jit_multiply 4 + 44 MiB", line)
        # Lines without ids (an older plugin's) are matched by name.
        no_ids = dict(r, staged=[{"program": "jit_train_step"}],
                      memory=[dict(m, id=None) for m in r["memory"]])
        self.assertIn("the 2 other programs hold 6 MiB", self.m.memory_lines(no_ids)[0])
        # No budget, or nothing held: no line.
        self.assertEqual(self.m.memory_lines(dict(r, ratio=0.0)), [])
        self.assertEqual(self.m.memory_lines(dict(r, memory=[mem("jit_idle", 3, 0, 0)])), [])

    def test_a_limited_row_says_where_each_devices_memory_went(self):
        dev = dict(device="cuda#0", memory=dict(device_bytes=700 << 20, device_peak_bytes=1000 << 20,
                                                host_bytes=3 << 30, spilled=41, relocated=6),
                   allocator=dict(buffers_live=70, bytes_in_use=2 << 30, bytes_physical=2200 << 20, cached_blocks=3))
        r = dict(label="vmm 2.00x", ratio=2.0, memory=[], devices=[dev])
        line, = self.m.memory_lines(r)
        self.assertEqual(line, "- vmm 2.00x, cuda#0: 700 MiB of device memory in use (peak 1000), 3072 MiB in host "
                               "memory; 41 allocations placed in host memory for want of device room, 6 moved at "
                               "first runs; the buffer allocator: 70 buffers live, 2048 MiB, 2200 MiB physical, "
                               "3 cached blocks")
        # After the other programs' line where there is one; none without a budget or a device entry.
        held = dict(program="jit__normal", id=1, device_bytes=2 << 20, host_bytes=0, shared_bytes=0)
        self.assertEqual(len(self.m.memory_lines(dict(r, memory=[held], staged=[{"program": "jit_train_step"}]))), 2)
        self.assertEqual(self.m.memory_lines(dict(r, ratio=0.0)), [])
        self.assertEqual(self.m.memory_lines(dict(r, devices=[dict(dev, memory=None)])), [])

    def test_a_limited_run_whose_losses_differ_fails_and_stocks_failures_are_results(self):
        a = self.args()
        row = lambda label, mode, ratio, ms, losses, digest: dict(  # noqa: E731
            label=label, mode=mode, ratio=ratio, ms=ms, losses=losses, digest=digest)
        rows = [row("stock", "stock", 0.0, 10.0, [2.0, 1.5], "s"), row("vmm none", "vmm", 0.0, 9.0, [2.0, 1.4], "v"),
                row("vmm 2.00x", "vmm", 2.0, 80.0, [2.0, 1.4], "x"),
                row("stock offload 2.00x", "offload", 2.0, 100.0, [2.0, 1.25], "o")]
        rows[2]["staged"] = [{"program": "jit_step", "runner": "va-stable graph", "steps": 30, "staged_bytes": 1 << 30,
                              "device_bytes": 0, "bytes_in_per_step": 1 << 30, "bytes_out_per_step": 1 << 30}]
        failed = [("stock capped 2.00x", "rc 1: RESOURCE_EXHAUSTED: Out of memory | x")]
        md, errors = self.m.table(a, rows, failed, 8 << 30)
        text = "\n".join(md)
        self.assertEqual(errors, ["vmm 2.00x: losses differ from vmm none's"])
        self.assertIn("| vmm 2.00x | 4.00 GiB | 80.00 | 0.12x |", text)
        self.assertIn("| DIFFER |", text)
        self.assertIn("| stock offload 2.00x | 4.00 GiB | 100.00 | 0.10x |", text)
        self.assertIn("max abs 0.25 |", text)
        self.assertIn("| stock capped 2.00x | - | - | - | - | - | - | - | "
                      "rc 1: RESOURCE_EXHAUSTED: Out of memory / x |", text)
        self.assertIn("- vmm 2.00x: jit_step (va-stable graph, 30 steps): past the budget, 1024 MiB staged", text)
        # 4 GiB each way at 50 GB/s, the directions taking turns: 171.8 ms; 80 ms a step is faster than that
        # bound's share, 215%.
        self.assertIn("| 171.8 | 215% | - | - |", text)
        # The step's own least link time, from report(): 60 ms of 80.
        rows[2]["staged"][0]["must_cross_us"] = 60e3
        self.assertIn("| 171.8 | 215% | 60.0 | 75% |", "\n".join(self.m.table(a, rows, failed, 8 << 30)[0]))
        rows[2]["digest"] = "v"
        rows[3]["donated"] = False
        md, errors = self.m.table(a, rows, failed, 8 << 30)
        self.assertEqual(errors, [])
        self.assertIn("- stock offload 2.00x: stock refused to donate its state (pinned_host); it ran without donation",
                      md)


class JaxSliceLastWords(unittest.TestCase):
    def test_the_plugins_crash_report_comes_whole_then_the_python_stack(self):
        m = load("jax_tests", os.path.join(INTEGRATION, "jax_tests.py"))
        frames = ["/x/libxla_vmm_plugin.so(+0x%x)[0x7f00]" % i for i in range(30)]
        text = "\n".join(["collected 1 item", "*** xla-vmm crash report: signal 11 at address 0x0, thread 7 ***"]
                         + frames + ["*** end of xla-vmm crash report ***", "noise",
                                     "Fatal Python error: Segmentation fault", "Current thread 0x1"])
        words = m.last_words(text)
        self.assertEqual(words[0], "*** xla-vmm crash report: signal 11 at address 0x0, thread 7 ***")
        self.assertEqual(words[1:31], frames)
        self.assertEqual(words[31:], ["*** end of xla-vmm crash report ***",
                                      "Fatal Python error: Segmentation fault", "Current thread 0x1"])
        # Without a report: from the first signal line on.
        self.assertEqual(m.last_words("a\nb\nFatal Python error: x\nc"), ["Fatal Python error: x", "c"])

    def test_programs_are_counted_by_how_they_run_last_and_eager_ones_by_reason(self):
        m = load("jax_tests", os.path.join(INTEGRATION, "jax_tests.py"))
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "f.jsonl")
            lines = [
                {"start": "t1"},
                {"prog": "7:0", "program": "jit_a", "runner": "guard trial", "reason": None, "test": "t1"},
                {"id": "t1", "outcome": "passed", "msg": ""},
                {"prog": "7:0", "program": "jit_a", "runner": "va-stable graph", "reason": None, "test": "t2"},
                {"prog": "7:1", "program": "jit_solve", "runner": "eager", "test": "t2",
                 "reason": "custom call 'cusolver_getrf_ffi' (custom-call.3) has an FFI handler that is not "
                           "command-buffer compatible"},
                {"prog": "8:1", "program": "jit_lu", "runner": "eager", "test": "t3",
                 "reason": "custom call 'cusolver_getrf_ffi' (custom-call.12) has an FFI handler that is not "
                           "command-buffer compatible"},
                {"prog": "8:2", "program": "jit_f", "runner": "vendor fallback", "reason": "unsupported: x",
                 "test": "t3"},
                {"prog": "8:3", "program": "jit_add", "runner": "eager", "test": "t3",
                 "reason": "guard: eager measured fastest (va-stable 0.012, recapture 0.011, eager 0.009 ms)"},
            ]
            with open(log, "w") as f:
                f.write("\n".join(json.dumps(r) for r in lines) + "\ncut-by-a-dea")
            progs = m.read_programs(log)
        self.assertEqual(progs["7:0"], ["jit_a", "va-stable graph", None, "t1"])
        res = {"outcomes": {}, "deaths": [], "fallback_lines": 0, "cut": False, "programs": progs}
        md = "\n".join(m.programs_section({("linalg_test", "vmm"): res, ("linalg_test", "cuda"): res}, "vmm"))
        self.assertIn("| linalg_test | 5 | 1 (20.0%) | 3 | 1 | 1 | 0 |", md)
        self.assertIn("Of 5 programs loaded, 1 (20.0%) run as one graph, 3 eager (1 of them because the never-slower "
                      "guard measured eager fastest: 40.0% one graph or the guard's choice), 1 on the vendor runtime",
                      md)
        self.assertIn("| 1 | eager | guard: eager measured fastest (va-stable N.N, recapture N.N, eager N.N ms)", md)
        # The two solver programs are one reason (numbers normalized), with both as examples.
        self.assertIn("| 2 | eager | custom call 'cusolver_getrf_ffi' (custom-call.N) has an FFI handler", md)
        self.assertIn("`jit_solve`, `jit_lu`", md)
        self.assertEqual(m.programs_section({("f", "vmm"): dict(res, programs={})}, "vmm"), [])

    def test_the_pytest_plugin_names_the_guards_eager_choice_as_the_runner_recognizes_it(self):
        plugin = load("jaxslice_plugin", os.path.join(INTEGRATION, "jaxslice", "plugin.py"))
        m = load("jax_tests", os.path.join(INTEGRATION, "jax_tests.py"))
        guard = {"va_stable_us": 12.0, "recapture_us": None, "eager_us": 9.0}
        why = plugin.guard_choice({"runner": "eager", "guard": guard})
        self.assertEqual(why, "guard: eager measured fastest (va-stable 0.012, recapture -, eager 0.009 ms)")
        self.assertTrue(why.startswith(m.GUARD_CHOICE))
        # A graph the guard chose, or an eager program without the guard's figures: no such reason.
        self.assertIsNone(plugin.guard_choice({"runner": "va-stable graph", "guard": guard}))
        self.assertIsNone(plugin.guard_choice({"runner": "eager"}))

class VaGap(unittest.TestCase):
    def setUp(self):
        self.m = load("va_gap", os.path.join(INTEGRATION, "diag", "va_gap.py"))
        self.calls = []

        def plugin_run(out, model, steps, mode, threshold, extra):
            self.calls.append((mode, extra.get("VA_GAP_LOOP")))
            ms = 3.2 if mode == "graph" else 3.1
            return {"step_ms": [30, 8] + [ms] * (steps - 2), "stats": {"steps": steps, "host_binding_ns": 1e5 * steps}}, None

        def vmm_run(*a, **k):
            raise AssertionError("the loop rows run no CLI row")

        self.m.plugin_run = plugin_run
        self.m.vmm_run = vmm_run

    def test_loop_rows_vary_the_jax_loop_in_both_graph_modes_through_the_plugin_only(self):
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "m.pjrt"), "w").close()  # saved already: no ab.py run
            _, text = quiet(self.m.main, ["va_gap.py", "--vmm", "-", "--out", d, "--steps", "10",
                                          "--rows", "loops", "m"])
            self.assertEqual(sorted(self.calls), sorted(
                (mode, loop) for mode in ["graph", "graph-recapture"] for loop in self.m.LOOPS))
            self.assertIn("| m | graph (default), loop wait-keep | - | - | 3.200 | 100.0 |", text)
            self.assertIn("| m | graph-recapture, loop pipelined | - | - | 3.100 | 100.0 |", text)
            rows = read_json(os.path.join(d, "va_gap.json"))
            self.assertEqual(len(rows), 6)
            self.assertTrue(os.path.exists(os.path.join(d, "va_gap.md")))


class BenchIo(unittest.TestCase):
    def test_a_child_gives_its_last_json_line_or_says_why_not(self):
        b = load("benchio", os.path.join(INTEGRATION, "benchio.py"))
        py = sys.executable
        ok = b.run_json_child([py, "-c", "print('{\"a\": 0}'); print('noise'); print('{\"a\": 1}')"], None, 30)
        self.assertEqual(ok, ({"a": 1}, None))
        none, why = b.run_json_child([py, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"], None, 30)
        self.assertIsNone(none)
        self.assertEqual(why, "rc 3: boom")
        self.assertEqual(b.run_json_child([py, "-c", "import time; time.sleep(5)"], None, 1),
                         (None, "timeout after 1s"))

    def test_byte_counts_and_the_share_of_the_cards_memory(self):
        b = load("benchio", os.path.join(INTEGRATION, "benchio.py"))
        self.assertEqual([b.parse_bytes(t) for t in ("16G", "512m", "1.5GiB", "1048576", "2KB")],
                         [16 << 30, 512 << 20, 3 << 29, 1 << 20, 2048])
        self.assertAlmostEqual(b.memory_fraction("10G", 80 << 30), 0.125)
        with tempfile.TemporaryDirectory() as d:
            smi = os.path.join(d, "nvidia-smi")
            with open(smi, "w") as fh:
                fh.write("#!/bin/sh\necho 81559\n")
            os.chmod(smi, 0o755)
            with mock.patch.dict(os.environ, {"PATH": d + os.pathsep + os.environ["PATH"]}):
                self.assertEqual(b.gpu_memory_bytes(), 81559 << 20)
            with mock.patch.dict(os.environ, {"PATH": d}):
                os.remove(smi)
                self.assertIsNone(b.gpu_memory_bytes())

    def test_results_are_printed_and_written(self):
        b = load("benchio", os.path.join(INTEGRATION, "benchio.py"))
        with tempfile.TemporaryDirectory() as d:
            out = io.StringIO()
            with redirect_stdout(out):
                b.write_results(d, "x", ["| a |", "|---|"], {"rows": [1]})
            self.assertEqual(out.getvalue(), "| a |\n|---|\n")
            with open(os.path.join(d, "x.md")) as fh:
                self.assertEqual(fh.read(), "| a |\n|---|\n")
            self.assertEqual(read_json(os.path.join(d, "x.json")), {"rows": [1]})


class TraceTimeline(unittest.TestCase):
    """integration/diag/trace_timeline.py's window and rows (its trace reading: tests/nogpu_jax.py)."""

    def setUp(self):
        self.m = load("trace_timeline", os.path.join(INTEGRATION, "diag", "trace_timeline.py"))

    def test_nested_spans_go_one_row_deeper_each(self):
        evs = [("step a", 0.0, 100.0), ("bind: plan", 10.0, 20.0), ("launch", 40.0, 30.0), ("inner", 45.0, 5.0),
               ("step b", 150.0, 10.0)]
        rows = self.m.by_depth(evs)
        self.assertEqual([[e[0] for e in r] for r in rows], [["step a", "step b"], ["bind: plan", "launch"], ["inner"]])

    def test_the_window_is_the_longest_step_to_the_same_programs_next(self):
        ours, gpu = self.m.OURS, "/device:GPU:0"
        lines = [(ours, "thread 1", [("step jit_train", 0.0, 50.0), ("step jit_add", 60.0, 5.0),
                                     ("step jit_train", 100.0, 40.0)]),
                 (gpu, "Stream #1", [("fusion", 10.0, 70.0), ("fusion", 110.0, 60.0)])]
        self.assertEqual(self.m.window(lines, "step", None), (0.0, 100.0))
        # The program's last step: until the device work that began in it ends.
        self.assertEqual(self.m.window(lines, "step", -1), (100.0, 170.0))
        self.assertEqual(self.m.window(lines, "step jit_add", None), (60.0, 65.0))
        with self.assertRaises(SystemExit):
            self.m.window(lines, "transfer", None)

    def test_the_picture_has_a_row_per_line_with_events_in_the_window(self):
        lines = [(self.m.OURS, "thread 1", [("step x", 0.0, 1e6)]),
                 ("/device:GPU:0", "Stream #2", [("k<1>", 2e5, 1e5), ("late", 5e6, 1e5)])]
        svg, summary = self.m.svg(lines, 0.0, 1e6, "t & u")
        self.assertIn("t &amp; u", svg)
        self.assertIn("<title>k&lt;1&gt; 100.0 us</title>", svg)
        self.assertNotIn("late", svg)
        self.assertEqual(len(summary), 2)
        self.assertRegex(summary[1], r"GPU:0 Stream #2 +1 events  busy +0.100 ms")


class StagingVsTrace(unittest.TestCase):
    """integration/diag/staging_vs_trace.py: a staged step's trace against its estimate (made-up trace)."""

    def setUp(self):
        self.m = load("staging_vs_trace", os.path.join(INTEGRATION, "diag", "staging_vs_trace.py"))
        # Estimated: a.1 waits 1 ms for its copy, runs 1 ms; the matmul 2 ms; b.2 1 ms; a copy home after it.
        th = lambda name, s, e: {"name": name, "start_us": s, "end_us": e}  # noqa: E731
        cp = lambda home, s, e: {"home": home, "allocation": 1, "offset": 0, "bytes": 1, "started_us": s,  # noqa: E731
                                 "done_us": e}
        timeline = {"step_us": 6000.0,
                    "thunks": [th("custom_kernel 'a.1'", 1000.0, 2000.0), th("cublas_lt_matmul 'mm'", 2000.0, 4000.0),
                               th("custom_kernel 'b.2'", 4000.0, 5000.0), th("custom_kernel 'a.1'", 5000.0, 5500.0),
                               th("kernel 'c'", 5500.0, 5600.0)],
                    "copies": [cp(False, 0.0, 1000.0), cp(True, 5000.0, 6000.0)]}
        self.estimate = {"as_run": {"staging": {"timeline": {"step_us": 1.0, "thunks": [], "copies": []}},
                                    "first_run_moves": {"staging": {"timeline": timeline}}}}

    def test_kernel_names_come_from_the_thunks_profile_annotation(self):
        self.assertEqual(self.m.kernel_key("custom_kernel 'loop_add_fusion.5'"), "loop_add_fusion_5")
        self.assertEqual(self.m.kernel_key("kernel 'fusion.2'"), "fusion_2")
        self.assertIsNone(self.m.kernel_key("cublas_lt_matmul 'custom-call.19'"))
        self.assertEqual(self.m.busy([(0, 2), (1, 3), (5, 6)]), 4)

    def test_a_step_of_the_trace_is_set_beside_the_estimate(self):
        us = 1e3  # ns
        ms = 1e6

        def period(t0):
            # b_2 starts the step: 'a_1' occurs twice (no anchor); 'c' once. The matmul's kernel is unnamed.
            return [("b_2", t0, 1.5 * ms), ("a_1", t0 + 2 * ms, 0.5 * ms), ("c", t0 + 3 * ms, 100 * us),
                    ("a_1", t0 + 4 * ms, 1 * ms), ("sm90_gemm", t0 + 5 * ms, 2 * ms)]
        kernels = period(0) + period(8 * ms) + period(16 * ms) + period(24 * ms)
        copies = [("MemcpyD2D", 8.5 * ms, 1 * ms), ("MemcpyD2D", 10 * ms, 1 * ms)]
        lines = [("/device:CUSTOM:xla-vmm", "t", [("step x", 0.0, 1.0)]),
                 ("/device:GPU:0", "Stream #1", kernels), ("/device:GPU:0", "Stream #7", copies)]
        r = self.m.compare(self.estimate, lines, 0)
        self.assertEqual(r["steps_in_trace"], 2)
        # The window: from the end of the step before (its matmul: 7 ms) to this one's matmul's end (15 ms).
        self.assertAlmostEqual(r["step_us"]["measured"], 8000.0)
        self.assertAlmostEqual(r["thunks_us"]["measured"], 5100.0)
        self.assertAlmostEqual(r["idle_us"]["measured"], 2900.0)
        self.assertAlmostEqual(r["thunks_us"]["estimated"], 4600.0)
        self.assertAlmostEqual(r["idle_us"]["estimated"], 1400.0)
        self.assertEqual(r["kernels"], 5)
        self.assertEqual([(m["thunk"], m["measured_us"], m["estimated_us"]) for m in r["matched"]],
                         [(2, 1500.0, 1000.0), (4, 100.0, 100.0)])
        # Two copies on their stream, as many as the estimate's copies of neither way alone: no rate.
        self.assertEqual(r["copies"]["measured"], {"Stream #7 MemcpyD2D": {"count": 2, "busy_us": 2000.0}})
        # One: the estimate's copy in (1 byte in 1 ms estimated; 1 byte in 0.5 ms measured).
        g = self.m.copy_group([(0.0, 0.5e6)], [{"bytes": 1, "started_us": 0.0, "done_us": 1000.0}], [])
        self.assertEqual((g["way"], g["gbps"], g["estimated_gbps"]), ("in", 2e-6, 1e-6))
        self.assertEqual(r["copies"]["estimated"], {"in": 1, "home": 1, "in_busy_us": 1000.0, "home_busy_us": 1000.0})
        md = self.m.markdown(r)
        self.assertIn("| step | 6.00 ms | 8.00 ms |", md)
        self.assertIn("| 2 | custom_kernel 'b.2' | 1.000 | 1.500 | 4.00 / 1.00 |", md)
        # The last whole step by default; a trace with one start has none.
        self.assertAlmostEqual(self.m.compare(self.estimate, lines)["step_us"]["measured"], 8000.0)
        with self.assertRaises(SystemExit):
            self.m.compare(self.estimate, [("/device:GPU:0", "Stream #1", period(0) + period(8 * ms))])


class LongRunCounters(unittest.TestCase):
    def test_report_size_counts_entries_not_digits(self):
        # A soak's report() grows by a digit when a step counter passes 10,000: not a leak. A list or map
        # that gains an item is.
        m = load("long_runs", os.path.join(INTEGRATION, "long_runs.py"))
        ns = {}
        exec(m.COUNTERS, ns)
        entries = ns["entries"]
        early = {"programs": [{"program": "jit_step", "steps": 3000}], "devices": [{"maps": 7}]}
        late = {"programs": [{"program": "jit_step", "steps": 20000}], "devices": [{"maps": 7}]}
        self.assertEqual(entries(early), entries(late))
        grown = {"programs": [{"program": "jit_step", "steps": 20000}, {"program": "jit_new", "steps": 1}],
                 "devices": [{"maps": 7}]}
        self.assertGreater(entries(grown), entries(late))
        self.assertEqual(entries({"a": {"b": [1, 2]}}), 4)

    def churn_checks(self, samples, ref_samples=None, ref_late_s=None):
        """The churn check's verdicts on `samples` (and stock's reference samples, written first, or
        `ref_late_s` seconds after our run ends, as when stock's run goes on beside ours)."""
        m = load("long_runs", os.path.join(INTEGRATION, "long_runs.py"))
        with tempfile.TemporaryDirectory() as d:
            def write_ref():
                with open(os.path.join(d, "long_runs_churn_cuda.json"), "w") as fh:
                    json.dump({"samples": ref_samples}, fh)
            late = None
            if ref_samples is not None and ref_late_s is None:
                write_ref()
            elif ref_samples is not None:
                late = threading.Timer(ref_late_s, write_ref)
            args = m.argparse.Namespace(programs=samples[-1]["programs_run"], every=200, platform="vmm",
                                        timeout_s=60, reference=False, out=d,
                                        reference_wait_s=0 if late is None else 30)
            run = {"programs": args.programs, "wrong": [], "samples": samples, "seconds": 1.0}
            with mock.patch.object(m, "run_json_child", return_value=(run, "")):
                if late:
                    late.start()
                code = m.churn(args)
            with open(os.path.join(d, "long_runs_churn.json")) as fh:
                return code, json.load(fh)["checks"]

    def test_churn_counters_come_back_and_stats_stay_within_their_bound(self):
        mib = 1 << 20

        def sample(k, stats, rss=900 * mib, allocations=3):
            return {"programs_run": k, "rss": rss, "programs": 0, "allocations": allocations, "buffers_live": 1,
                    "pooled_before_trim": 4, "pooled": 0, "stats_entries": stats}

        # stats() fills up to the last 256 programs dropped, then stays: passes.
        code, checks = self.churn_checks([sample(200, 9400), sample(400, 12032), sample(600, 12032)])
        self.assertEqual(code, 0, checks)
        # What a program took between samples, where the samples have their times.
        m = load("long_runs", os.path.join(INTEGRATION, "long_runs.py"))
        self.assertEqual(m.per_program_ms({"programs_run": 200, "elapsed_s": 10.0},
                                          {"programs_run": 400, "elapsed_s": 60.0}), "250.0")
        self.assertEqual(m.per_program_ms(None, {"programs_run": 200, "elapsed_s": 10.0}), "-")
        self.assertEqual(m.per_program_ms({"programs_run": 200}, {"programs_run": 400}), "-")
        # Past the bound it must not grow, nor may an allocation stay behind.
        code, checks = self.churn_checks([sample(200, 9400), sample(400, 12032), sample(600, 12040)])
        self.assertFalse(checks["stats_entries"])
        code, checks = self.churn_checks([sample(200, 9400), sample(400, 12032, allocations=4)])
        self.assertEqual((code, checks["allocations"]), (1, False))
        # Host RSS grown 150 MiB: a failure alone, within stock's growth over the same programs plus 64 MiB not.
        grown = [sample(200, 9400), sample(400, 12032, rss=1050 * mib)]
        self.assertFalse(self.churn_checks(grown)[1]["rss"])
        stock = [dict(programs_run=200, rss=1000 * mib), dict(programs_run=400, rss=1100 * mib)]
        self.assertTrue(self.churn_checks(grown, stock)[1]["rss"])
        # Stock's run beside ours: its results, written after ours ended, are waited for.
        self.assertTrue(self.churn_checks(grown, stock, ref_late_s=0.5)[1]["rss"])
        stock[1]["rss"] = 1050 * mib
        self.assertFalse(self.churn_checks(grown, stock)[1]["rss"])

    def test_a_threads_worker_that_parts_from_its_serial_replay_says_where(self):
        m = load("long_runs", os.path.join(INTEGRATION, "long_runs.py"))

        def worker(w, blocks, wrong=()):
            return {"worker": w, "kind": "transfers", "iterations": 2500, "checksum": sum(blocks),
                    "blocks": blocks, "wrong": list(wrong), "error": ""}
        run = {"workers": [worker(0, [1, 2, 3]), worker(1, [1, 2, 3]), worker(2, [1, 2, 3], [[7, 40.0]])],
               "serial": [worker(0, [1, 2, 3]), worker(1, [1, 5, 3]), worker(2, [1, 2, 3], [[9, "rerun differs"]])],
               "seconds": 1.0, "serial_seconds": 1.0, "block": 1024}
        with tempfile.TemporaryDirectory() as d:
            args = m.argparse.Namespace(platform="vmm", threads=3, seconds=1.0, out=d)
            with mock.patch.object(m, "run_json_child", return_value=(run, "")):
                self.assertEqual(m.threads(args), 1)
            with open(os.path.join(d, "long_runs_threads.md")) as fh:
                rows = [l for l in fh.read().splitlines() if l.startswith("| ") and l[2].isdigit()]
        self.assertIn("| equal |  |", rows[0])
        self.assertIn("DIFFER | results differ from iteration 1024 on (blocks of 1024)", rows[1])
        self.assertIn("wrong results (iteration, error from the host's sum or what differed): parallel [[7, 40.0]], "
                      "serial [[9, 'rerun differs']]", rows[2])

    def test_the_stats_bound_is_the_runtimes(self):
        m = load("long_runs", os.path.join(INTEGRATION, "long_runs.py"))
        with open(os.path.join(INTEGRATION, "..", "crates", "runtime", "src", "binding.rs")) as fh:
            self.assertIn("pub const KEPT_DROPPED: usize = %d;" % m.KEPT_DROPPED, fh.read())

    def test_a_hung_interrupt_trial_says_what_its_threads_were_doing(self):
        m = load("long_runs", os.path.join(INTEGRATION, "long_runs.py"))
        # A child that ignores SIGINT (a hang as the trial sees one) and waits in Python.
        child = ("import faulthandler, signal, sys, time\n"
                 "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
                 "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                 "print('READY', flush=True)\n"
                 "def waiting_here():\n    time.sleep(60)\n"
                 "waiting_here()\n")
        with mock.patch.object(m, "CHILD", child):
            rec, _ = m.one_interrupt("cpu", 0.0, ready_timeout_s=60, exit_timeout_s=1.0)
        self.assertFalse(rec["ok"])
        self.assertIn("hung", rec["why"])
        self.assertTrue(any(t.startswith("python") for t in rec["threads"]), rec["threads"])
        self.assertTrue(any("waiting_here" in line for line in rec["stderr_tail"]), rec["stderr_tail"])


class StepTimes(unittest.TestCase):
    def test_rows_of_several_runs_side_by_side_with_the_guards_decision(self):
        m = load("step_times", os.path.join(INTEGRATION, "diag", "step_times.py"))
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for tag, rows in (("guard", [
                    {"model": "m", "config": "vmm t=1 (auto)", "step_ms": [9.0, 3.0, 3.0, 3.4, 3.4],
                     "report": {"runner": "va-stable graph",
                                "guard": {"runner": "va-stable", "decided_at_step": 14,
                                          "second_look": {"decided_at_step": 32}}}},
                    {"model": "m", "config": "vmm graph-recapture", "step_ms": [8.0, 3.0, 3.0, 3.0, 3.0],
                     "report": {"runner": "graph-recapture"}}]),
                    ("remap_only", [{"model": "m", "config": "vmm va-stable", "step_ms": [9.0, 3.1, 3.1, 3.1]},
                                    {"model": "other", "config": "vmm va-stable", "step_ms": [1.0]}])):
                os.makedirs(os.path.join(d, tag))
                paths.append(os.path.join(d, tag, "ab.json"))
                with open(paths[-1], "w") as fh:
                    json.dump({"steps": 5, "rows": rows, "errors": [], "pending": []}, fh)
            code, text = quiet(m.main, ["step_times.py"] + paths + ["--model", "m", "--last", "2"])
        self.assertEqual(code, 0)
        self.assertIn("- guard vmm t=1 (auto): 9.00 3.00 3.00 | 3.400 va-stable from step 14, second look at step 32",
                      text)
        self.assertIn("- guard vmm graph-recapture: 8.00 3.00 3.00 | 3.000 graph-recapture", text)
        self.assertIn("- remap_only vmm va-stable: 9.00 3.10 3.10 | 3.100 ", text)
        self.assertNotIn("other", text)


if __name__ == "__main__":
    unittest.main()
