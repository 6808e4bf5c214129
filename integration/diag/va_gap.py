"""Where the default (VA-stable) step loses to graph-recapture on the A/B models (a diagnostic, not a test).

The perf gate's A/B rows have the default mode 2-4% slower than graph-recapture through JAX, while the
CLI bench on the fixtures has them equal. This runs, for each model, the same saved executable
  - through the CLI (`xla-vmm run --steps N`: host wall and GPU stream time per step, each step waited
    for), in each mode, and VA-stable with the batch copy path (no copy nodes in the graph);
  - through the plugin (integration/ab.py's vmm child, JAX's loop, each step waited for), the same rows;
and prints one table, so that the gap is placed: GPU time or host time, CLI or plugin, copy nodes or not.

Usage (GPU machine): python3 integration/diag/va_gap.py --vmm BIN --out DIR [--steps 30] MODEL...
It first runs ab.py for MODEL (stock cmdbuf on/off, to save the executable and its inputs in DIR).
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
INTEG = os.path.dirname(HERE)
sys.path.insert(0, INTEG)
from bench import vmm_run  # noqa: E402

ROWS = [
    # (row, mode, threshold, extra environment)
    ("graph (default)", "graph", None, {}),
    ("graph t=0", "graph", 0, {}),
    ("graph copy=batch", "graph", None, {"XLA_VMM_COPY_PATH": "batch"}),
    ("graph-recapture", "graph-recapture", None, {}),
    ("eager", "eager", None, {}),
]
# --rows completion: how the step's completion reaches JAX (the plugin's completion thread, its plain
# backoff, or a synchronous execute), for both graph modes; plugin only.
COMPLETION_ROWS = [
    (row + poll, mode, None, env)
    for row, mode in [("graph (default)", "graph"), ("graph-recapture", "graph-recapture")]
    for poll, env in [("", {}), (" poll=backoff", {"XLA_VMM_COMPLETION_POLL": "backoff"}),
                      (" sync execute", {"XLA_VMM_SYNC_EXECUTE": "1"})]
]


def median(xs):
    xs = sorted(xs[3:] if len(xs) > 6 else xs)
    return xs[len(xs) // 2] if xs else float("nan")


def plugin_run(out, model, steps, mode, threshold, extra):
    env = dict(os.environ, JAX_PLATFORMS="vmm", XLA_VMM_EXEC_MODE=mode, **extra)
    env.pop("XLA_VMM_TMP_COPY_THRESHOLD", None)
    if threshold is not None:
        env["XLA_VMM_TMP_COPY_THRESHOLD"] = str(threshold)
    p = subprocess.run([sys.executable, os.path.join(INTEG, "ab.py"), "--out", out, "--steps", str(steps),
                        "--child", "vmm", "--name", model], env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return None, (p.stderr or p.stdout).strip()[-200:]
    r = json.loads(lines[-1])
    return r, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vmm", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rows", choices=["modes", "completion"], default="modes")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    table = ["| model | row | CLI wall ms | CLI GPU ms | plugin (JAX) ms | plugin host µs/step (all steps) |",
             "|---|---|---|---|---|---|"]
    result = []
    for model in a.models:
        if not os.path.exists(os.path.join(out, model + ".pjrt")):
            subprocess.run([sys.executable, os.path.join(INTEG, "ab.py"), "--out", out, "--steps", "5",
                            "--models", model, "--stock-configs", "onoff", "--thresholds", "", "--modes", ""],
                           check=False, timeout=400)
        for row, mode, t, extra in (ROWS if a.rows == "modes" else COMPLETION_ROWS):
            wall, gpu = (None, None)
            if a.rows == "modes":
                wall, gpu, _ = vmm_run(a.vmm, out, model, mode, t, a.steps, env=extra)
            r, err = plugin_run(out, model, a.steps, mode, t, extra)
            pm = median(r["step_ms"]) if r else None
            st = (r or {}).get("stats") or {}
            host = st.get("host_binding_ns", 0) / 1e3 / max(st.get("steps", 0), 1) if st else None
            rec = {"model": model, "row": row, "cli_wall_ms": wall, "cli_gpu_ms": gpu, "plugin_ms": pm,
                   "plugin_host_us": host, "plugin_err": err, "step_ms": (r or {}).get("step_ms"),
                   "stats": st}
            result.append(rec)
            f = lambda v, k=3: "-" if v is None else ("%.*f" % (k, v))  # noqa: E731
            table.append("| %s | %s | %s | %s | %s | %s |" % (model, row, f(wall), f(gpu), f(pm) if r else
                                                              "failed: " + (err or "")[-60:], f(host, 1)))
            print(table[-1], flush=True)
    with open(os.path.join(out, "va_gap.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    with open(os.path.join(out, "va_gap.md"), "w") as fh:
        fh.write("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
