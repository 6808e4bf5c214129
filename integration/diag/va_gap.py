"""Where the default (VA-stable) step loses to graph-recapture on the A/B models (a diagnostic, not a test).

The perf gate's A/B rows have the default mode 2-4% slower than graph-recapture through JAX, while the
CLI bench on the fixtures has them equal. This runs, for each model, the same saved executable
  - through the CLI (`xla-vmm run --steps N`: host wall and GPU stream time per step, each step waited
    for), in each mode, and VA-stable with the batch copy path (no copy nodes in the graph);
  - through the plugin (integration/ab.py's vmm child, JAX's loop, each step waited for), the same rows;
and prints one table, so that the gap is placed: GPU time or host time, CLI or plugin, copy nodes or not.

Usage (GPU machine): python3 integration/diag/va_gap.py --vmm BIN --out DIR [--steps 30]
                     [--rows modes|completion|loops|timing] MODEL...
--rows timing: VA-stable with XLA_VMM_STEP_TIMING=1, the default through the CLI and the plugin, and the
plugin at threshold 0, at a cutoff that copies every slot it can and with one reservation, next to the
plugin in graph-recapture (each step waited for): every step's GPU time (first binding copy to last copy-back)
and the stream time since the previous step's end, medians over steps 2-7 and 8 on (where the
plugin's gap starts), the host step time and the remaps and copies per step; each row's log (with the
policy's plans) in DIR.
It first runs ab.py for MODEL (stock cmdbuf on/off, to save the executable and its inputs in DIR).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

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

# --rows loops: the JAX loop varied, both graph modes: each step waited for (as the A/B), each step
# waited for with every output kept alive (nothing freed: is it the frees?), and pipelined (no wait
# per step, one at the end: does the gap matter where steps overlap?). Plugin only.
LOOPS = ["wait", "wait-keep", "pipelined"]
# Steps a pipelined loop waits for before the timed ones.
PIPELINED_WARMUP = 5
LOOP_ROWS = [("%s, loop %s" % (row, loop), mode, None, {"VA_GAP_LOOP": loop})
             for row, mode in [("graph (default)", "graph"), ("graph-recapture", "graph-recapture")]
             for loop in LOOPS]


# --rows timing: what XLA_VMM_STEP_TIMING logs, parsed (each step waited for), with the policy's decisions
# (its info logs: the first plan and auto's re-plan) kept in DIR/va_gap.<row>.log.
TIMING_ENV = {"XLA_VMM_STEP_TIMING": "1", "XLA_VMM_LOG": "xla_vmm_runtime=debug,xla_vmm::policy=info"}
TIMED = re.compile(r"step timed.*?step=(\d+) gpu_us=([0-9.]+)(?: since_previous_us=([0-9.]+))?")
# (row, path, environment): the default through the CLI and the plugin, then the plugin at threshold 0
# (every changed slot remapped), at a cutoff that copies every slot the shadow cap admits, and in
# graph-recapture (no step timing there: its host step time is the reference for the others').
# VA_GAP_TIMING_ROWS (comma-separated row names) runs a subset.
TIMING_ROWS = [
    ("CLI", "cli", {}),
    ("plugin", "plugin", {}),
    ("plugin t0", "plugin", {"XLA_VMM_TMP_COPY_THRESHOLD": "0"}),
    ("plugin t1G", "plugin", {"XLA_VMM_TMP_COPY_THRESHOLD": str(1 << 30)}),
    ("plugin r1", "plugin", {"XLA_VMM_RESERVATIONS": "1"}),
    ("plugin t0 r1", "plugin", {"XLA_VMM_TMP_COPY_THRESHOLD": "0", "XLA_VMM_RESERVATIONS": "1"}),
    ("plugin recapture", "plugin", {"XLA_VMM_EXEC_MODE": "graph-recapture"}),
]


def timed_steps(text):
    """{step: (gpu µs, µs since the previous step's end or None)} from a log (ANSI colours stripped)."""
    out = {}
    for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines():
        m = TIMED.search(line)
        if m:
            out[int(m.group(1))] = (float(m.group(2)), float(m.group(3)) if m.group(3) else None)
    return out


def timing_rows(vmm, out, model, steps):
    """Median GPU µs and µs-between of steps 2-7 and 8+, and the host step ms, per TIMING_ROWS row."""
    rows = []
    only = [r for r in os.environ.get("VA_GAP_TIMING_ROWS", "").split(",") if r]
    for row, path, extra in TIMING_ROWS:
        if only and row not in only:
            continue
        env = dict(os.environ, **TIMING_ENV)
        # VA_GAP_LOG: another log filter (it must keep the step timing's xla_vmm_runtime=debug), e.g.
        # with xla_vmm_device::vmm=trace for every allocation, in step order with the timed steps.
        env["XLA_VMM_LOG"] = os.environ.get("VA_GAP_LOG", env["XLA_VMM_LOG"])
        env.pop("XLA_VMM_TMP_COPY_THRESHOLD", None)
        if path == "cli":
            argv = [vmm, "run", os.path.join(out, model + ".pjrt"), "--inputs",
                    os.path.join(out, model + ".npz"), "--mode", "graph", "--steps", str(steps)]
        else:
            env.update(JAX_PLATFORMS="vmm", XLA_VMM_EXEC_MODE="graph")
            argv = [sys.executable, os.path.join(INTEG, "ab.py"), "--out", out, "--steps", str(steps),
                    "--child", "vmm", "--name", model]
        env.update(extra)
        p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
        with open(os.path.join(out, "va_gap.%s.%s.log" % (model, row.replace(" ", "_"))), "w") as fh:
            fh.write(p.stderr + p.stdout)
        t = timed_steps(p.stderr + p.stdout)
        res = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
        step_ms = res[-1].get("step_ms") if res and path == "plugin" else None
        st = res[-1].get("stats", {}) if res and path == "plugin" else {}

        def med(lo, hi, k):
            v = sorted(x[k] for s, x in t.items() if lo <= s < hi and x[k] is not None)
            return v[len(v) // 2] if v else None
        rows.append({"model": model, "path": row, "rc": p.returncode, "steps_timed": len(t),
                     "gpu_us_2_7": med(2, 8, 0), "gpu_us_8_on": med(8, 10**9, 0),
                     "between_us_2_7": med(2, 8, 1), "between_us_8_on": med(8, 10**9, 1),
                     "host_ms": median(step_ms) if step_ms else None,
                     "remaps_per_step": st.get("remaps", 0) / max(st.get("steps", 0), 1) if st else None,
                     "copies_per_step": st.get("copies", 0) / max(st.get("steps", 0), 1) if st else None,
                     "per_step": {str(s): x for s, x in sorted(t.items())}})
    return rows


def child_loop(out, model, steps, loop):
    """One JAX loop over the saved executable on the vmm device; per-step ms (pipelined: the mean)."""
    sys.path.insert(0, os.path.join(INTEG, "tests"))
    import jax
    from jax_plugins import xla_vmm
    from llama_ab import load_on_vmm

    compiled, args, dev = load_on_vmm(out, model)
    cur = jax.device_put(args, dev)
    treedef = jax.tree.structure(cur)

    def step(cur):
        leaves = jax.tree.leaves(compiled(*cur))
        n_state = len(leaves) - 1
        return leaves, jax.tree.unflatten(treedef, leaves[:n_state] + jax.tree.leaves(cur)[n_state:])

    # Pipelined: the first steps (initialize, recording, warm-up) are waited for and left out, as the
    # other loops' median leaves them out; timing them in the mean made every mode look slower and
    # VA-stable (the longest initialize) the slowest.
    if loop == "pipelined":
        for _ in range(PIPELINED_WARMUP):
            _, cur = step(cur)
        jax.block_until_ready(cur)
    kept, times = [], []
    t_all = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        leaves, cur = step(cur)
        if loop != "pipelined":
            leaves[-1].block_until_ready()
            times.append((time.perf_counter() - t) * 1e3)
        if loop == "wait-keep":
            kept.append(leaves[-1])
    jax.block_until_ready(cur)
    if loop == "pipelined":
        times = [(time.perf_counter() - t_all) * 1e3 / steps] * steps
    st = xla_vmm.stats()
    best = max(st.values(), key=lambda x: x.get("steps", 0)) if st else {}
    return {"step_ms": times, "stats": best}


def median(xs):
    xs = sorted(xs[3:] if len(xs) > 6 else xs)
    return xs[len(xs) // 2] if xs else float("nan")


def plugin_run(out, model, steps, mode, threshold, extra):
    env = dict(os.environ, JAX_PLATFORMS="vmm", XLA_VMM_EXEC_MODE=mode, **extra)
    env.pop("XLA_VMM_TMP_COPY_THRESHOLD", None)
    if threshold is not None:
        env["XLA_VMM_TMP_COPY_THRESHOLD"] = str(threshold)
    if "VA_GAP_LOOP" in extra:
        cmd = [sys.executable, os.path.abspath(__file__), "--child-loop", extra["VA_GAP_LOOP"], "--out", out,
               "--vmm", "-", "--steps", str(steps), model]
    else:
        cmd = [sys.executable, os.path.join(INTEG, "ab.py"), "--out", out, "--steps", str(steps),
               "--child", "vmm", "--name", model]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
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
    ap.add_argument("--rows", choices=["modes", "completion", "loops", "timing"], default="modes")
    ap.add_argument("--child-loop", choices=LOOPS, help=argparse.SUPPRESS)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    if a.child_loop:
        print(json.dumps(child_loop(out, a.models[0], a.steps, a.child_loop)))
        return
    os.makedirs(out, exist_ok=True)
    table = ["| model | row | CLI wall ms | CLI GPU ms | plugin (JAX) ms | plugin host µs/step (all steps) |",
             "|---|---|---|---|---|---|"]
    result = []
    for model in a.models:
        if not os.path.exists(os.path.join(out, model + ".pjrt")):
            subprocess.run([sys.executable, os.path.join(INTEG, "ab.py"), "--out", out, "--steps", "5",
                            "--models", model, "--stock-configs", "onoff", "--thresholds", "", "--modes", ""],
                           check=False, timeout=400)
        if a.rows == "timing":
            if len(table) == 2:
                table = ["| model | path | steps timed | GPU µs/step, steps 2-7 | steps 8+ | "
                         "µs between steps, 2-7 | 8+ | host ms/step (median) | remaps/step | copies/step |",
                         "|---|---|---|---|---|---|---|---|---|---|"]
            f = lambda v: "-" if v is None else "%.1f" % v  # noqa: E731
            for r in timing_rows(a.vmm, out, model, a.steps):
                result.append(r)
                table.append("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |" % (
                    model, r["path"], r["steps_timed"], f(r["gpu_us_2_7"]), f(r["gpu_us_8_on"]),
                    f(r["between_us_2_7"]), f(r["between_us_8_on"]),
                    "-" if r["host_ms"] is None else "%.3f" % r["host_ms"],
                    f(r["remaps_per_step"]), f(r["copies_per_step"])))
                print(table[-1], flush=True)
            continue
        for row, mode, t, extra in {"modes": ROWS, "completion": COMPLETION_ROWS, "loops": LOOP_ROWS}[a.rows]:
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
