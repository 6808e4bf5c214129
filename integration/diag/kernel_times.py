"""Kernel by kernel: the same training executable on stock XLA and on xla-vmm, GPU time per kernel, the
step's span on the GPU and its idle fraction (issue 30, items 1-2: where a compute-bound step loses).

For each model: a stock child (JAX_PLATFORMS=cuda) compiles the A/B program (integration/tests/llama_ab.py),
saves the executable, runs --warmup steps and then --steps steps under jax.profiler.trace; a vmm child
(JAX_PLATFORMS=vmm,cuda: the CUDA plugin's profiler, CUPTI, records every kernel of the process, ours
included) loads the same executable through the plugin (no recompilation) and does the same after the
never-slower guard's trial. Each trace's GPU planes give, per step: the sum of kernel time (per kernel
name, numbered suffixes folded), the span from the first kernel's start to the last one's end, and the
idle fraction 1 - busy / span (busy: the union of the kernels' intervals over all streams).

    python3 integration/diag/kernel_times.py --out DIR [--models maxtext_tiny_bf16] [--steps 10] [--warmup 30]
        [--sides stock,vmm,vmm-recapture]

--sides: stock (always first: it compiles and saves the executable) and any of `vmm` (the default mode, the
guard on), `vmm-recapture`, `vmm-va-stable` (the guard off), `vmm-eager`, each its own process: so that the
A/B rows' gap between the default process and a recapture-only one (issue 30) shows up kernel by kernel,
or as idle time between kernels.

Prints a Markdown table per model (DIR/kernel_times.md) and writes DIR/kernel_times.json. A diagnostic, not a
test: it needs the GPU machine, and XLA_VMM_LIBRARY (or an installed wheel) for the vmm side. It parses
traces with jax.profiler.ProfileData, which also reads a CPU trace (then there are no GPU planes, and it
says so).
"""
import argparse
import glob
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

import trace_timeline  # noqa: E402
from benchio import GUARD_WARMUP_STEPS, run_json_child, write_results  # noqa: E402


def kernel_family(name):
    """`fusion.123` and `fusion_123` are one row: numbered suffixes folded."""
    return re.sub(r"([._]\d+)+$", "", name)


def gpu_summary(xplane_path, steps):
    """Per-step figures of the GPU planes of one trace: {"kernels": {family: [ms, count]}, "busy_ms",
    "span_ms", "idle", "planes"} (all per step), or {"planes": 0} when the trace has no GPU plane."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(xplane_path)
    intervals, kernels, planes = [], {}, 0
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        planes += 1
        for line in plane.lines:
            # Stream lines carry the kernels and copies; the per-device summary lines repeat them.
            if not re.search(r"[Ss]tream", line.name or ""):
                continue
            for ev in line.events:
                start, dur = float(ev.start_ns), float(ev.duration_ns)
                if dur <= 0:
                    continue
                intervals.append((start, start + dur))
                k = kernels.setdefault(kernel_family(ev.name), [0.0, 0])
                k[0] += dur / 1e6
                k[1] += 1
    if not intervals:
        return {"planes": planes}
    intervals.sort()
    busy = trace_timeline.busy(intervals)
    span = intervals[-1][1] - intervals[0][0]
    n = max(steps, 1)
    return {
        "planes": planes,
        "kernels": {k: [v[0] / n, v[1] / n] for k, v in kernels.items()},
        "busy_ms": busy / 1e6 / n,
        "span_ms": span / 1e6 / n,
        "idle": 1.0 - busy / span if span > 0 else 0.0,
    }


def child(a):
    """One side: run, trace, summarize; prints one JSON line."""
    import jax
    import numpy as np
    from llama_ab import load_on_vmm, program, save_exe

    trace_dir = os.path.join(a.out, "%s_%s" % (a.side, a.model))
    if a.side == "stock":
        f, args, donate = program(a.model)
        compiled = jax.jit(f, donate_argnums=donate).lower(*args).compile()
        save_exe(a.out, a.model, compiled, args)
        dev = jax.devices()[0]
        args = jax.tree.map(np.asarray, args)
    else:
        compiled, args, dev = load_on_vmm(a.out, a.model)
    cur = jax.device_put(args, dev)
    treedef = jax.tree.structure(cur)

    def steps(n):
        # The queue kept full, as a training loop does (no wait per step).
        nonlocal cur
        for _ in range(n):
            leaves = jax.tree.leaves(compiled(*cur))
            n_state = len(leaves) - 1
            cur = jax.tree.unflatten(treedef, leaves[:n_state] + jax.tree.leaves(cur)[n_state:])
        jax.block_until_ready(cur)

    steps(a.warmup)
    t = time.perf_counter()
    with jax.profiler.trace(trace_dir):
        steps(a.steps)
    wall = (time.perf_counter() - t) * 1e3 / a.steps
    found = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    out = {"side": a.side, "model": a.model, "wall_ms_per_step": wall}
    out.update(gpu_summary(max(found, key=os.path.getmtime), a.steps) if found else {"planes": 0})
    if a.side != "stock":
        from jax_plugins import xla_vmm
        out["report"] = [(p["program"], p["runner"], p["steps"]) for p in xla_vmm.report().get("programs", [])]
    print(json.dumps(out), flush=True)
    return 0


# The sides a run may compare: the plugin's variables for each of ours.
SIDES = {"stock": None, "vmm": {}, "vmm-recapture": {"XLA_VMM_EXEC_MODE": "graph-recapture"},
         "vmm-va-stable": {"XLA_VMM_GUARD": "0"}, "vmm-eager": {"XLA_VMM_EXEC_MODE": "eager"}}


def run_side(a, side, model):
    env = dict(os.environ)
    if side == "stock":
        env["JAX_PLATFORMS"] = "cuda"
    else:
        # The CUDA backend is there for its profiler (CUPTI); it must not take the GPU's memory.
        env["JAX_PLATFORMS"] = "vmm,cuda"
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        env.update(SIDES[side])
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--side", side, "--model", model, "--out", a.out,
            "--steps", str(a.steps), "--warmup", str(a.warmup)]
    return run_json_child(argv, env, a.timeout)


def table(model, sides, top):
    """Markdown: each side's totals, then the kernel families whose time differs most between the sides
    (`sides`: (name, result) in order, stock first)."""
    md = ["## %s" % model, "",
          "| side | wall ms/step | GPU span ms/step | kernel busy ms/step | idle fraction | kernels/step |",
          "|---|---|---|---|---|---|"]
    for name, r in sides:
        if not r.get("kernels"):
            md.append("| %s | %.3f | no GPU plane in the trace | | | |" % (name, r["wall_ms_per_step"]))
            continue
        md.append("| %s | %.3f | %.3f | %.3f | %.1f%% | %.0f |" % (
            name, r["wall_ms_per_step"], r["span_ms"], r["busy_ms"], 100 * r["idle"],
            sum(v[1] for v in r["kernels"].values())))
    traced = [(n, r["kernels"]) for n, r in sides if r.get("kernels")]
    if len(traced) >= 2:
        names = set().union(*(k for _, k in traced))
        ms = lambda k: [t.get(k, [0.0, 0])[0] for _, t in traced]  # noqa: E731
        rows = sorted(names, key=lambda k: -(max(ms(k)) - min(ms(k))))
        md += ["", "| kernel family | " + " | ".join("%s ms/step (count)" % n for n, _ in traced) + " | spread ms |",
               "|---|" + "---|" * (len(traced) + 1)]
        for k in rows[:top]:
            cells = ["%.4f (%.0f)" % tuple(t.get(k, [0.0, 0])) for _, t in traced]
            md.append("| `%s` | %s | %.4f |" % (k, " | ".join(cells), max(ms(k)) - min(ms(k))))
    return md


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="maxtext_tiny_bf16")
    ap.add_argument("--steps", type=int, default=10, help="traced steps")
    ap.add_argument("--warmup", type=int, default=GUARD_WARMUP_STEPS, help="untraced steps first")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--sides", default="stock,vmm", help="stock first, then any of " + ", ".join(SIDES))
    ap.add_argument("--side", choices=list(SIDES))
    ap.add_argument("--model")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.child:
        return child(a)
    sides = [x for x in a.sides.split(",") if x]
    unknown = [x for x in sides if x not in SIDES]
    if unknown or not sides or sides[0] != "stock":
        ap.error("--sides: stock first, then any of %s (%s)" % (", ".join(SIDES), ", ".join(unknown) or a.sides))
    md, results, failed = [], {}, False
    for model in [m for m in a.models.split(",") if m]:
        done, err = [], None
        for side in sides:
            r, err = run_side(a, side, model)
            if r is None:
                err = "%s: %s" % (side, err)
                break
            done.append((side, r))
        if err:
            md += ["## %s" % model, "", "- ERROR %s" % err, ""]
            failed = True
        if len(done) >= 2:
            results[model] = dict(done)
            md += table(model, done, a.top) + [""]
    write_results(a.out, "kernel_times", md, results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
