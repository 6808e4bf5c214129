"""Step-time benchmark (not a test): stock XLA in every configuration vs xla-vmm in every mode, one run.

Stock XLA: the serialized executable of integration/stock_ref.py (`--ref DIR`: default flags = XLA command
buffers on) and, compiled afresh, the other configurations of stock_configs.py (command buffers off,
SKIP_TEMP, SKIP_PROFILED). xla-vmm: `xla-vmm run --steps N` on the same `.pjrt` as stock's default row,
in each mode: `graph` (VA-stable, auto threshold: the default), `graph t=0`, `graph-recapture`, `eager`,
plus rows given with --vmm-env. Medians over the timed steps; every step waits for its result on both sides.
Prints a Markdown table with the GPU time of our default step (stream time between events around it) and
the ceiling it sets (best stock / that time), and writes --json for integration/perf_gate.py.

Usage: python3 integration/bench.py --vmm target/release/xla-vmm --ref DIR [--steps 30] [--json F] NAME...
       [--vmm-env 'graph copy=batch:XLA_VMM_COPY_PATH=batch'] [--stock-configs all|on]
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from stock_configs import STOCK_CONFIGS, with_flags  # noqa: E402

# (row name, --mode, --threshold or None)
VMM_MODES = [
    ("vmm graph (default)", "graph", None),
    ("vmm graph t=0", "graph", 0),
    ("vmm graph-recapture", "graph-recapture", None),
    ("vmm eager", "eager", None),
]
DEFAULT_ROW = VMM_MODES[0][0]


def vmm_run(vmm, ref, name, mode, threshold, steps, env=None, warmup=0):
    """(median wall ms, median stream ms, the `phases:` line or None) of `xla-vmm run --steps`, or
    (None, None, error). wall = host time of a step; stream = GPU time between events around it."""
    cmd = [vmm, "run", os.path.join(ref, name + ".pjrt"), "--inputs", os.path.join(ref, name + ".npz"),
           "--mode", mode, "--steps", str(steps), "--warmup", str(warmup)]
    if threshold is not None:
        cmd += ["--threshold", str(threshold)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **(env or {})))
    m = re.search(r"wall ms: median ([0-9.]+)", p.stdout)
    g = re.search(r"stream ms: median ([0-9.]+)", p.stdout)
    # The timed steps' phases (the first run's setup left out), else all steps'.
    ph = re.search(r"^timed phases: (.*)$", p.stdout, re.M) or re.search(r"^phases: (.*)$", p.stdout, re.M)
    if p.returncode != 0 or not m:
        err = "rc %d: %s" % (p.returncode, (p.stderr or p.stdout).strip()[-300:])
        print("  %s %s failed (%s)" % (name, mode, err), flush=True)
        return None, None, err
    return float(m.group(1)), (float(g.group(1)) if g else None), (ph.group(1) if ph else None)


def stock_run(name, steps, extra_flags, tag):
    """Median step ms of a fresh stock compile with `extra_flags`, or (None, error)."""
    out = "/tmp/xla-vmm-bench-" + tag
    env = dict(os.environ, XLA_FLAGS=with_flags(os.environ.get("XLA_FLAGS", ""), extra_flags))
    p = subprocess.run([sys.executable, os.path.join(HERE, "stock_ref.py"), "--out", out, "--steps", str(steps), name],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        err = "rc %d: %s" % (p.returncode, p.stderr.strip()[-300:])
        print("  stock %s %s failed (%s)" % (tag, name, err), flush=True)
        return None, err
    return json.load(open(os.path.join(out, name + ".loop.json")))["median_step_ms"], None


def parse_env_rows(specs):
    """--vmm-env 'ROW NAME:K=V,K=V' -> [(row, {K: V})] (graph mode, default threshold)."""
    rows = []
    for s in specs:
        label, _, kv = s.partition(":")
        env = dict(x.split("=", 1) for x in kv.split(",") if "=" in x)
        rows.append(("vmm " + label.strip(), env))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vmm", required=True)
    ap.add_argument("--ref", required=True, help="stock_ref.py output dir")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=20,
                    help="untimed steps of ours before the timed ones (the never-slower guard decides in them)")
    ap.add_argument("--json", default=None, help="write the rows here (for perf_gate.py)")
    ap.add_argument("--stock-configs", default="all", choices=["all", "on"])
    ap.add_argument("--vmm-env", action="append", default=[], help="extra graph-mode row: 'NAME:K=V,K=V'")
    ap.add_argument("names", nargs="+")
    a = ap.parse_args()
    rows, errors = [], []

    def add(program, config, ms, gpu_ms=None, phases=None, err=None):
        rows.append({"program": program, "config": config, "ms": ms, "gpu_ms": gpu_ms, "phases": phases})
        if err:
            errors.append("%s %s: %s" % (program, config, err))

    for name in a.names:
        stock = json.load(open(os.path.join(a.ref, name + ".loop.json")))["median_step_ms"]
        print("bench %s: stock (default flags) %.3f ms" % (name, stock), flush=True)
        add(name, STOCK_CONFIGS[0][0], stock)
        if a.stock_configs == "all":
            for config, flags, tag in STOCK_CONFIGS[1:]:
                ms, err = stock_run(name, a.steps, flags, tag)
                add(name, config, ms, err=err)
        for config, mode, t in VMM_MODES:
            wall, gpu, ph = vmm_run(a.vmm, a.ref, name, mode, t, a.steps, warmup=a.warmup)
            add(name, config, wall, gpu, ph if wall is not None else None, None if wall is not None else ph)
        for config, env in parse_env_rows(a.vmm_env):
            wall, gpu, ph = vmm_run(a.vmm, a.ref, name, "graph", None, a.steps, env, warmup=a.warmup)
            add(name, config, wall, gpu, ph if wall is not None else None, None if wall is not None else ph)
    print()
    print(markdown(rows))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"steps": a.steps, "rows": rows, "errors": errors}, fh, indent=1)
    for e in errors:
        print("ERROR", e)
    return 1 if errors else 0


def markdown(rows):
    """One line per program: every configuration's ms, the default's ratio against the best stock, its GPU
    time and the ceiling (best stock / default GPU time: what launch-side work can give at most)."""
    fmt = lambda v: "%.3f" % v if isinstance(v, (int, float)) else "n/a"  # noqa: E731
    configs = []
    for r in rows:
        if r["config"] not in configs:
            configs.append(r["config"])
    out = ["| program | " + " | ".join("%s ms" % c for c in configs) +
           " | default vs best stock | default GPU ms | ceiling: best stock / default GPU |",
           "|---|" + "---|" * (len(configs) + 3)]
    for program in dict.fromkeys(r["program"] for r in rows):
        by = {r["config"]: r for r in rows if r["program"] == program}
        stock = [r["ms"] for c, r in by.items() if c.startswith("stock") and isinstance(r["ms"], (int, float))]
        best = min(stock) if stock else None
        d = by.get(DEFAULT_ROW, {})
        ratio = lambda v: "%.2fx" % (best / v) if best and isinstance(v, (int, float)) and v > 0 else "n/a"  # noqa: E731
        out.append("| %s | %s | %s | %s | %s |" % (program, " | ".join(fmt(by.get(c, {}).get("ms")) for c in configs),
                                                   ratio(d.get("ms")), fmt(d.get("gpu_ms")), ratio(d.get("gpu_ms"))))
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
