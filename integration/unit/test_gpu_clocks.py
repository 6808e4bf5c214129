"""integration/gpu_clocks.py without a GPU: its parsing and summaries, and the sampler and wrapper against a
stand-in nvidia-smi.

    python3 -m unittest discover -s integration/unit -v
"""
import io
import json
import os
import stat
import sys
import tempfile
import unittest
from contextlib import redirect_stderr
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import gpu_clocks  # noqa: E402

# A stand-in nvidia-smi: the new reasons field's name is refused (an older driver), the old one answered; with
# -lms it prints a reading every period, the SM clock falling by 10 MHz each time, until it is stopped.
FAKE = r'''#!PYTHON
import sys, time
q = [a for a in sys.argv if a.startswith("--query-gpu=")][0].split("=", 1)[1].split(",")
if "clocks_event_reasons.active" in q:
    print('Field "clocks_event_reasons.active" is not a valid field to query.', file=sys.stderr)
    sys.exit(2)
def line(i):
    vals = [str(1980 - 10 * i), "2619", "612.50", "61"] + (["0x0000000000000004"] if len(q) == 5 else [])
    print(", ".join(vals), flush=True)
if "-lms" not in sys.argv:
    line(0)
    sys.exit(0)
period = int(sys.argv[sys.argv.index("-lms") + 1]) / 1e3
i = 0
while True:
    line(i)
    i += 1
    time.sleep(period)
'''


class Parsing(unittest.TestCase):
    def test_a_line_with_and_without_reasons(self):
        r = gpu_clocks.parse_line("1755, 2619, 450.12, 58, 0x0000000000000005", True)
        self.assertEqual(r, {"sm_mhz": 1755, "mem_mhz": 2619, "power_w": 450.12, "temp_c": 58.0, "reasons": 5})
        self.assertEqual(gpu_clocks.parse_line("1755, 2619, [N/A], 58", False)["power_w"], None)
        self.assertIsNone(gpu_clocks.parse_line("[N/A], 2619, 450, 58", False))
        self.assertIsNone(gpu_clocks.parse_line("1755, 2619", False))

    def test_reason_bits_are_named(self):
        self.assertEqual(gpu_clocks.reason_names(0x1 | 0x4), ["gpu_idle", "sw_power_cap"])
        self.assertEqual(gpu_clocks.reason_names(0x1000), ["0x1000"])
        self.assertEqual(gpu_clocks.reason_names(0), [])

    def test_a_window_has_medians_extremes_and_the_share_of_each_reason(self):
        rs = [{"t": t, "sm_mhz": mhz, "mem_mhz": 2619, "power_w": 400.0 + t, "temp_c": 50.0 + t, "reasons": m}
              for t, mhz, m in [(0, 1980, 0), (1, 1900, 4), (2, 1800, 4), (3, 1700, 5)]]
        s = gpu_clocks.summarize(rs, 1, 4)
        self.assertEqual(s["n"], 3)
        self.assertEqual((s["sm_mhz"], s["sm_mhz_min"], s["sm_mhz_max"]), (1800, 1700, 1900))
        self.assertEqual((s["power_w"], s["power_w_max"], s["temp_c_max"]), (402.0, 403.0, 53.0))
        self.assertEqual(s["reasons"], {"gpu_idle": 0.333, "sw_power_cap": 1.0})
        line = gpu_clocks.summary_line(s)
        self.assertIn("SM 1800 MHz (min 1700, max 1900)", line)
        self.assertIn("reasons gpu_idle 33% sw_power_cap 100%", line)
        self.assertEqual(gpu_clocks.summarize(rs, 10, 20), {"n": 0})


class Sampling(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        exe = os.path.join(self.dir.name, "nvidia-smi")
        with open(exe, "w") as fh:
            fh.write(FAKE.replace("PYTHON", sys.executable))
        os.chmod(exe, os.stat(exe).st_mode | stat.S_IEXEC)
        self.path = mock.patch.dict(os.environ, {"PATH": self.dir.name + os.pathsep + os.environ["PATH"]})
        self.path.start()

    def tearDown(self):
        self.path.stop()
        self.dir.cleanup()

    def test_readings_are_stamped_and_the_older_reasons_field_is_used_where_the_new_one_is_refused(self):
        import time
        with gpu_clocks.Sampler(period_ms=5) as s:
            t0 = time.monotonic()
            while len(s.readings) < 4 and time.monotonic() - t0 < 20:
                time.sleep(0.01)
        self.assertGreaterEqual(len(s.readings), 4)
        self.assertEqual(s.readings[0]["sm_mhz"], 1980)
        self.assertEqual(s.readings[3]["sm_mhz"], 1950)
        self.assertTrue(all(a["t"] <= b["t"] for a, b in zip(s.readings, s.readings[1:])))
        self.assertEqual(s.summary()["reasons"], {"sw_power_cap": 1.0})
        self.assertNotIn("why", s.summary())

    def test_the_wrapper_passes_the_commands_status_and_writes_the_readings(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "c.json")
            err = io.StringIO()
            with redirect_stderr(err):
                rc = gpu_clocks.main(["--period-ms", "5", "--out", out, "--",
                                      sys.executable, "-c", "import time, sys; time.sleep(1.5); sys.exit(3)"])
            self.assertEqual(rc, 3)
            self.assertRegex(err.getvalue(), r"gpu clocks: \d+ readings, SM \d+ MHz")
            with open(out) as fh:
                got = json.load(fh)
            self.assertEqual(got["cmd"][-1], "import time, sys; time.sleep(1.5); sys.exit(3)")
            self.assertEqual(got["summary"]["n"], len(got["readings"]))


class NoNvidiaSmi(unittest.TestCase):
    def test_nothing_is_sampled_and_the_summary_says_why(self):
        with gpu_clocks.Sampler(exe="no-such-nvidia-smi-here") as s:
            pass
        self.assertEqual(s.summary(), {"n": 0, "why": "no nvidia-smi"})
        self.assertEqual(gpu_clocks.summary_line(s.summary()), "gpu clocks: no readings (no nvidia-smi)")


if __name__ == "__main__":
    unittest.main()
