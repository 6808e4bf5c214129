"""The GPU's clocks, power, temperature and clock-event (throttle) reasons while something runs (issue 30: is a
process slower after its first steps because the GPU clocks down?). `nvidia-smi` is polled in the background
every PERIOD ms; each reading is stamped with this machine's monotonic clock (`time.monotonic()`, the same clock
in every process), so that a child's step times can be matched with the readings taken while they ran. Where
there is no `nvidia-smi`, nothing is sampled and the summary says so.

    python3 integration/gpu_clocks.py [--period-ms 10] [--gpu 0] [--out FILE.json] -- CMD ARGS...

runs CMD under the sampler, prints one summary line on stderr and exits with CMD's status. As a module:
`with Sampler(period_ms=10) as s: ...` then `s.summary()` (or `s.summary(t0, t1)` for a window) and
`summary_line(...)`.

Polling costs the host a little (each reading is one NVML query by a separate process): use it to explain a
slowdown, not in a timed row that is compared with an unsampled one.
"""
import argparse
import json
import shutil
import subprocess
import sys
import threading
import time

# The fields asked for, in order. The reasons field has two names (renamed in recent drivers); the first that
# nvidia-smi accepts is used, and without either the readings have no reasons.
FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu")
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")

# NVML's clocks event reasons (nvmlClocksEventReason*), bit by bit.
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def reason_names(mask):
    """The names of the bits set in `mask` (unknown bits as hex)."""
    names = [n for bit, n in REASONS.items() if mask & bit]
    rest = mask & ~sum(REASONS)
    return names + (["0x%x" % rest] if rest else [])


def parse_line(line, with_reasons):
    """One `--format=csv,noheader,nounits` line -> a reading (None: not a reading, e.g. "[N/A]" clocks)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(FIELDS) + (1 if with_reasons else 0):
        return None
    try:
        sm, mem = int(float(parts[0])), int(float(parts[1]))
    except ValueError:
        return None

    def num(s):
        try:
            return float(s)
        except ValueError:
            return None
    r = {"sm_mhz": sm, "mem_mhz": mem, "power_w": num(parts[2]), "temp_c": num(parts[3])}
    if with_reasons:
        try:
            r["reasons"] = int(parts[4], 16)
        except ValueError:
            r["reasons"] = None
    return r


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else None


def summarize(readings, t0=None, t1=None):
    """Readings (dicts with `t`) inside [t0, t1) -> {n, sm_mhz median/min/max, mem_mhz, power_w median/max,
    temp_c max, reasons: {name: share of readings}}; n 0 when none."""
    w = [r for r in readings if (t0 is None or r["t"] >= t0) and (t1 is None or r["t"] < t1)]
    out = {"n": len(w)}
    if not w:
        return out
    sm = [r["sm_mhz"] for r in w]
    out.update(sm_mhz=median(sm), sm_mhz_min=min(sm), sm_mhz_max=max(sm),
               mem_mhz=median([r["mem_mhz"] for r in w]))
    power = [r["power_w"] for r in w if r.get("power_w") is not None]
    if power:
        out.update(power_w=median(power), power_w_max=max(power))
    temp = [r["temp_c"] for r in w if r.get("temp_c") is not None]
    if temp:
        out["temp_c_max"] = max(temp)
    masks = [r["reasons"] for r in w if r.get("reasons") is not None]
    if masks:
        counts = {}
        for m in masks:
            for n in reason_names(m):
                counts[n] = counts.get(n, 0) + 1
        out["reasons"] = {n: round(c / len(masks), 3) for n, c in sorted(counts.items())}
    return out


def summary_line(s):
    """One line of a summary (`summarize`'s dict)."""
    if not s.get("n"):
        return "gpu clocks: no readings" + (" (%s)" % s["why"] if s.get("why") else "")
    text = "gpu clocks: %d readings, SM %d MHz (min %d, max %d), memory %d MHz" % (
        s["n"], s["sm_mhz"], s["sm_mhz_min"], s["sm_mhz_max"], s["mem_mhz"])
    if "power_w" in s:
        text += ", power %.0f W (max %.0f)" % (s["power_w"], s["power_w_max"])
    if "temp_c_max" in s:
        text += ", up to %.0f C" % s["temp_c_max"]
    if s.get("reasons"):
        text += ", reasons " + " ".join("%s %.0f%%" % (n, 100 * f) for n, f in s["reasons"].items())
    return text


class Sampler:
    """Polls nvidia-smi from entry to exit (see the module's docs). `readings`: dicts with `t` (monotonic s)."""

    def __init__(self, period_ms=10, gpu=0, exe="nvidia-smi"):
        self.period_ms = max(int(period_ms), 1)
        self.gpu = gpu
        self.exe = shutil.which(exe)
        self.readings = []
        self.why = None
        self._proc = None
        self._thread = None
        self._reasons = None

    def _query(self, fields):
        return [self.exe, "-i", str(self.gpu), "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]

    def _fields(self):
        """The fields this nvidia-smi accepts (a reasons field when it takes one); None: it answers nothing."""
        for reason in REASON_FIELDS + (None,):
            fields = FIELDS + ((reason,) if reason else ())
            try:
                p = subprocess.run(self._query(fields), capture_output=True, text=True, timeout=20)
            except (OSError, subprocess.TimeoutExpired) as e:
                self.why = "nvidia-smi: %s" % e
                return None
            if p.returncode == 0 and parse_line(p.stdout.strip().splitlines()[0] if p.stdout.strip() else "",
                                                reason is not None):
                self._reasons = reason is not None
                return fields
            self.why = "nvidia-smi: %s" % (p.stderr or p.stdout).strip()[:200]
        return None

    def __enter__(self):
        if self.exe is None:
            self.why = "no nvidia-smi"
            return self
        fields = self._fields()
        if fields is None:
            return self
        self.why = None
        self._proc = subprocess.Popen(self._query(fields) + ["-lms", str(self.period_ms)],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self):
        for line in self._proc.stdout:
            r = parse_line(line, self._reasons)
            if r is not None:
                r["t"] = time.monotonic()
                self.readings.append(r)

    def __exit__(self, *exc):
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._thread.join(timeout=5)
        return False

    def summary(self, t0=None, t1=None):
        s = summarize(self.readings, t0, t1)
        if self.why:
            s["why"] = self.why
        return s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--period-ms", type=int, default=10)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--out", help="write every reading and the summary here (JSON)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command")
    with Sampler(a.period_ms, a.gpu) as s:
        rc = subprocess.call(cmd)
    summary = s.summary()
    print(summary_line(summary), file=sys.stderr)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"cmd": cmd, "summary": summary, "readings": s.readings}, fh)
    return rc


if __name__ == "__main__":
    sys.exit(main())
