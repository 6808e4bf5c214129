"""A/B harness (issue 6): llama training on stock XLA vs xla-vmm's VA-stable graph mode at several
copy thresholds, on the same serialized executable.

Per model:
  * stock XLA in every configuration of stock_configs.py (command buffers on = default flags, off,
    SKIP_TEMP, SKIP_PROFILED; --stock-configs onoff for the first two only), each with
    --xla_gpu_deterministic_ops=true so losses are comparable bit for bit; the "on" compile is
    serialized and reused by every xla-vmm row (no recompilation: autotuning cannot differ between rows);
  * xla-vmm through the PJRT plugin (JAX_PLATFORMS=vmm, jax_plugins.xla_vmm, XLA_VMM_EXEC_MODE=graph)
    at XLA_VMM_TMP_COPY_THRESHOLD = 0, 1 (auto), 4096, 65536, 1048576, binding stats from
    jax_plugins.xla_vmm.stats(); then our other modes (--modes, default eager and graph-recapture:
    XLA_VMM_EXEC_MODE), which the default mode must not be slower than;
  * if the plugin path fails for a row, the fallback `xla-vmm run EXE.pjrt --mode graph
    --threshold N --loop-steps STEPS` on the same executable (column `path` says which).
Every row runs in its own process. Writes DIR/ab.md (Markdown table) and DIR/ab.json;
integration/plot_ab.py makes the PNG.

    python3 integration/ab.py --out DIR [--steps 20] [--models llama_small_f32,...] [--vmm BIN]
        [--budget-s 480] [--merge DIR_OF_AN_EARLIER_CALL/ab.json]

ab.md / ab.json are rewritten after every model, so a call cut short keeps the models it finished;
--budget-s starts no model after that many seconds (exit 2, the rest listed as not run), and --merge
keeps an earlier call's rows of the other models, so the A/B can be split over several device calls.
Columns: median step time, the ratio against the best stock configuration (command buffers on or off)
measured in the same run, the speedup against threshold 0, loss bits against threshold 0, binding stats.
"""
import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "tests"))
from llama_ab import load_on_vmm, loop, program, save_exe  # noqa: E402  (the pytest A/B's programs and loop)
from stock_configs import STOCK_CONFIGS  # noqa: E402
from benchio import memory_sums, run_json_child  # noqa: E402
from gpu_clocks import Sampler, summary_line  # noqa: E402

MODELS = ["llama_small_f32", "llama_110m_bf16", "maxtext_tiny_bf16"]
THRESHOLDS = [0, 1, 4096, 65536, 1048576]
DET = "--xla_gpu_deterministic_ops=true"


# The first step the medians count (--measure-from): later than the warm-up of every row (xla-vmm's
# never-slower guard decides within its first ~19 steps of a program, its second look by ~step 40).
MEASURE_FROM = 3


def median_from(times, first=None):
    first = MEASURE_FROM if first is None else first
    t = sorted(times[first:] if len(times) > first else times)
    return t[len(t) // 2] if t else float("nan")


def child_stock(name, d, steps, save, fresh_batch):
    """Compile on stock XLA (flags from the environment), optionally save the executable."""
    import jax
    import numpy as np
    import stock_ref

    f, args, donate = program(name)
    t = time.perf_counter()
    compiled = jax.jit(f, donate_argnums=donate).lower(*args).compile()
    compile_s = time.perf_counter() - t
    if save:
        save_exe(d, name, compiled, args)
        # The same bytes for the CLI fallback (stock_ref.py's format).
        stock_ref.save_pjrt(compiled, os.path.join(d, name + ".pjrt"))
        np.savez(os.path.join(d, name + ".npz"),
                 **{"in_%d" % i: np.asarray(a) for i, a in enumerate(jax.tree.leaves(args))})
    stamps = []
    bits, times = loop(compiled, jax.tree.map(np.asarray, args), steps, jax.devices()[0], fresh_batch, stamps)
    return {"loss_bits": bits, "step_ms": times, "compile_s": compile_s, "step_t": stamps}


# The plugin's device counters the A/B can follow step by step (report()'s devices; cumulative).
STEP_COUNTERS = ("maps", "unmaps", "allocations_made", "va_ranges_made")


# The busiest program's binding counters (stats()), per step with the memory ones: which step re-planned, and
# what each step copied and remapped.
BINDING_COUNTERS = ("copies", "copies_elided", "remaps", "mode_switches", "captures", "replanned")


def counters_now(report, stats=None):
    """The STEP_COUNTERS of `report` (report() data) summed over its devices (those it has), and the
    BINDING_COUNTERS of the program in `stats` (stats() data) with the most steps, when given."""
    out = memory_sums(report, STEP_COUNTERS)
    if stats:
        best = max(stats.values(), key=lambda s: s.get("steps", 0))
        out.update({k: int(best[k]) for k in BINDING_COUNTERS if k in best})
    return out


def per_step(samples):
    """Each step's counter changes from cumulative samples (the first: before step 0)."""
    return [{k: b[k] - a[k] for k in b if k in a} for a, b in zip(samples, samples[1:])]


def child_vmm(name, d, steps, fresh_batch, step_counters=False):
    from jax_plugins import xla_vmm

    compiled, args, dev = load_on_vmm(d, name)
    stamps, counted = [], []
    hook = None
    if step_counters:
        counted.append(counters_now(xla_vmm.report(), xla_vmm.stats()))
        hook = lambda _step: counted.append(counters_now(xla_vmm.report(), xla_vmm.stats()))  # noqa: E731
    bits, times = loop(compiled, args, steps, dev, fresh_batch, stamps, hook)
    st = xla_vmm.stats()
    best = max(st.values(), key=lambda s: s.get("steps", 0)) if st else {}
    # The training step's report line: the runner it ended on, the guard, graph-recapture's captures.
    programs = xla_vmm.report().get("programs", [])
    line = max(programs, key=lambda p: p.get("steps", 0)) if programs else {}
    return {"loss_bits": bits, "step_ms": times, "stats": best, "step_t": stamps,
            **({"step_counters": per_step(counted)} if step_counters else {}),
            "report": {k: line.get(k) for k in ("program", "runner", "steps", "graph_captures", "guard")}}


def run_child(argv, env, timeout, clocks_ms=None):
    """Run this script as a child; its last stdout line is a JSON result. clocks_ms: poll the GPU's clocks
    that often while it runs (gpu_clocks.py), kept per step window in the result's `gpu_clocks`."""
    t = time.perf_counter()
    sampler = Sampler(clocks_ms) if clocks_ms else contextlib.nullcontext()
    with sampler:
        r, err = run_json_child([sys.executable, os.path.abspath(__file__)] + argv, env, timeout)
    if r is None:
        return None, err
    r["wall_s"] = time.perf_counter() - t
    if clocks_ms:
        r["gpu_clocks"] = clock_windows(sampler, r.get("step_t") or [])
    return r, None


def clock_windows(sampler, stamps):
    """The GPU's clocks over the first steps (0 to MEASURE_FROM - 1) and over the steps the medians count
    (stamps: each step's start and the last one's end, time.monotonic()); without stamps, the whole child."""
    if len(stamps) < 2:
        return {"child": sampler.summary()}
    k = min(MEASURE_FROM, len(stamps) - 1)
    return {"first_steps": sampler.summary(stamps[0], stamps[k]),
            "measured_steps": sampler.summary(stamps[k], stamps[-1])}


def run_cli(vmm, d, name, threshold, steps, timeout):
    """Fallback row: `xla-vmm run --mode graph --loop-steps` on the saved executable."""
    cmd = [vmm, "run", os.path.join(d, name + ".pjrt"), "--inputs", os.path.join(d, name + ".npz"),
           "--mode", "graph", "--threshold", str(threshold), "--loop-steps", str(steps)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    if p.returncode != 0:
        return None, "rc %d: %s" % (p.returncode, p.stderr.strip().splitlines()[-1:])
    bits, times, stats = [], [], {}
    for ln in p.stdout.splitlines():
        m = re.match(r"loss\[\d+\] = \S+ \(0x([0-9a-f]{8})\)(?: ([0-9.]+) ms)?", ln)
        if m:
            bits.append(int(m.group(1), 16))
            if m.group(2):
                times.append(float(m.group(2)))
        if ln.startswith("binding:"):
            stats = {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", ln)}
            stats["host_binding_ns"] = stats.get("host_us_per_step", 0) * 1e3 * stats.get("steps", 0)
    return {"loss_bits": bits, "step_ms": times, "stats": stats}, None


def combine_repeats(results):
    """One result from the same row run several times, interleaved with the other rows: the median of the
    runs' medians (what the table shows), every run's median, the steps of all runs; the losses must be the
    same bits in every run (else the row is an error, returned as its text)."""
    if len(results) == 1:
        return results[0], None
    first = results[0]
    for k, r in enumerate(results[1:], 1):
        if r["loss_bits"] != first["loss_bits"]:
            return None, "run %d's losses differ from run 0's" % k
    meds = [median_from(r["step_ms"]) for r in results]
    srt = sorted(meds)
    return dict(first, step_ms=[t for r in results for t in r["step_ms"]], run_medians_ms=meds,
                median_ms=srt[len(srt) // 2], stats=results[-1].get("stats")), None


def row(model, config, path, r, base_ms):
    ms = r["median_ms"] if "median_ms" in r else median_from(r["step_ms"])
    st = r.get("stats") or {}
    steps = max(st.get("steps", 0), 1)
    bits = r["loss_bits"]
    return {
        "model": model, "config": config, "path": path, "median_ms": ms,
        "speedup_vs_t0": (base_ms / ms) if base_ms and ms == ms and ms > 0 else None,
        "final_loss": float(__import__("struct").unpack("<f", bits[-1].to_bytes(4, "little"))[0]) if bits else None,
        "final_loss_bits": "%08x" % bits[-1] if bits else None,
        "loss_bits": bits,
        "remaps_per_step": st.get("remaps", 0) / steps if st else None,
        "copies_per_step": st.get("copies", 0) / steps if st else None,
        "skips_per_step": st.get("skips", 0) / steps if st else None,
        "host_us_per_step": st.get("host_binding_ns", 0) / steps / 1e3 if st else None,
        "stats": st, "report": r.get("report"), "step_ms": r["step_ms"],
        **({"gpu_clocks": r["gpu_clocks"]} if "gpu_clocks" in r else {}),
        **({"step_counters": r["step_counters"]} if "step_counters" in r else {}),
        **({"run_medians_ms": r["run_medians_ms"]} if "run_medians_ms" in r else {}),
    }


def best_stock_ms(rows, model):
    """The fastest stock XLA configuration measured for `model` (None if none ran)."""
    ms = [r["median_ms"] for r in rows if r["model"] == model and r["config"].startswith("stock")
          and isinstance(r["median_ms"], (int, float)) and r["median_ms"] > 0]
    return min(ms) if ms else None


def markdown(rows, steps):
    out = ["| model | config | path | median ms (steps>=%d of %d) | vs best stock | speedup vs t=0 | final loss | "
           "losses = t0 | remaps/step | copies/step | host µs/step |" % (MEASURE_FROM, steps),
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    t0 = {r["model"]: r["loss_bits"] for r in rows if r["config"] == "vmm t=0"}
    f = lambda v, fmt: (fmt % v) if isinstance(v, (int, float)) else "-"  # noqa: E731
    for r in rows:
        same = t0.get(r["model"])
        eq = "-" if same is None else ("yes" if r["loss_bits"] == same else "NO")
        best = best_stock_ms(rows, r["model"])
        vs = best / r["median_ms"] if best and isinstance(r["median_ms"], (int, float)) and r["median_ms"] > 0 else None
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["model"], r["config"], r["path"], f(r["median_ms"], "%.3f"), f(vs, "%.2fx"),
            f(r["speedup_vs_t0"], "%.2fx"), f(r["final_loss"], "%.6f"), eq,
            f(r["remaps_per_step"], "%.2f"), f(r["copies_per_step"], "%.2f"),
            f(r["host_us_per_step"], "%.1f")))
    return "\n".join(out)


def clock_lines(rows):
    """A line per row and step window that has clock readings."""
    out = []
    for r in rows:
        for window, s in (r.get("gpu_clocks") or {}).items():
            out.append("- %s %s, %s: %s" % (r["model"], r["config"], window.replace("_", " "), summary_line(s)))
    return out


def counter_lines(rows, first=16):
    """A line per row whose steps were counted: each of its first steps' map / unmap / allocation / VA range
    changes (what the process does to the device's page tables step by step)."""
    out = []
    for r in rows:
        per = r.get("step_counters")
        if not per:
            continue
        cell = lambda c: "/".join(str(c.get(k, "-")) for k in STEP_COUNTERS)  # noqa: E731
        out.append("- %s %s: %s" % (r["model"], r["config"], " ".join("%d:%s" % (i, cell(c))
                                                                   for i, c in enumerate(per[:first]))))
    return out


def write(d, steps, rows, errors, pending):
    """ab.md and ab.json as far as the run got (rewritten after every model)."""
    table = markdown(rows, steps)
    with open(os.path.join(d, "ab.md"), "w") as fh:
        fh.write(table + "\n")
        if errors:
            fh.write("\nErrors:\n" + "\n".join("- " + e for e in errors) + "\n")
        if pending:
            fh.write("\nNot run (time budget): %s\n" % ", ".join(pending))
        counted = counter_lines(rows)
        if counted:
            fh.write("\nPer step (step:maps/unmaps/allocations made/VA ranges made), the first steps:\n"
                     + "\n".join(counted) + "\n")
        clocks = clock_lines(rows)
        if clocks:
            fh.write("\nThe GPU's clocks while each row ran (gpu_clocks.py):\n" + "\n".join(clocks) + "\n")
    with open(os.path.join(d, "ab.json"), "w") as fh:
        json.dump({"steps": steps, "rows": rows, "errors": errors, "pending": pending}, fh, indent=1)
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--measure-from", type=int, default=3,
                    help="medians over the steps from this one on (every row the same)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--thresholds", default=",".join(map(str, THRESHOLDS)))
    ap.add_argument("--modes", default="eager,graph-recapture",
                    help="our other execution modes (XLA_VMM_EXEC_MODE), one row each; empty for none; "
                         "`va-stable`: graph mode without the never-slower guard (XLA_VMM_GUARD=0)")
    ap.add_argument("--stock-configs", default="all", choices=["all", "onoff"])
    ap.add_argument("--vmm", default=os.path.join(HERE, "..", ".dev", "gpu", "bin", "xla-vmm"),
                    help="xla-vmm CLI for the fallback path")
    ap.add_argument("--timeout", type=int, default=300, help="per row, seconds")
    ap.add_argument("--no-fallback", action="store_true")
    ap.add_argument("--fresh-batch", action="store_true",
                    help="put the batch (the inputs that are not state) on the device anew before every step, "
                         "as training does: a VA-stable slot rebinds it every step (no CLI fallback then)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run our rows this many times, in turn (t=0, t=1, ..., t=0, t=1, ...): each shows the "
                         "median of its runs' medians (the rows' spread between runs is 1-4%%)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no model after this many seconds (the rest is listed as not run)")
    ap.add_argument("--gpu-clocks-ms", type=int, default=None,
                    help="poll the GPU's clocks, power and throttle reasons this often (ms) during every row, "
                         "reported for its first steps and its measured ones (issue 30's slowdown: a diagnostic; "
                         "polling costs the host a little)")
    ap.add_argument("--step-counters", action="store_true",
                    help="our rows record report()'s map / unmap / allocation counters after every step (outside "
                         "the timer), listed under the table: what the process does to the page tables per step")
    ap.add_argument("--merge", default=None,
                    help="an ab.json of an earlier call (same --steps): its rows of models not run here are kept")
    # internal: child processes
    ap.add_argument("--child", choices=["stock", "vmm"])
    ap.add_argument("--name")
    ap.add_argument("--save", action="store_true")
    a = ap.parse_args()
    global MEASURE_FROM
    MEASURE_FROM = a.measure_from
    d = os.path.abspath(a.out)
    os.makedirs(d, exist_ok=True)
    if a.child == "stock":
        print(json.dumps(child_stock(a.name, d, a.steps, a.save, a.fresh_batch)))
        return 0
    if a.child == "vmm":
        print(json.dumps(child_vmm(a.name, d, a.steps, a.fresh_batch, a.step_counters)))
        return 0

    rows, errors, pending = [], [], []
    models = [m for m in a.models.split(",") if m]
    if a.merge:
        with open(a.merge) as fh:
            old = json.load(fh)
        if old.get("steps") != a.steps:
            sys.exit("--merge %s has %s steps, this call %d" % (a.merge, old.get("steps"), a.steps))
        rows = [r for r in old.get("rows", []) if r["model"] not in models]
        errors = [e for e in old.get("errors", []) if e.split(" ")[0] not in models]
        print("merging %d row(s) of %s" % (len(rows), a.merge), flush=True)
    flags = os.environ.get("XLA_FLAGS", "")
    child_flags = ["--fresh-batch"] if a.fresh_batch else []
    t_start = time.perf_counter()
    for model in models:
        if a.budget_s is not None and time.perf_counter() - t_start > a.budget_s:
            pending.append(model)
            continue
        base = dict(os.environ, JAX_PLATFORMS="cuda")
        base.pop("XLA_VMM_TMP_COPY_THRESHOLD", None)
        results = []
        stock = STOCK_CONFIGS if a.stock_configs == "all" else STOCK_CONFIGS[:2]
        for i, (config, extra, _) in enumerate(stock):
            extra, save = (DET + " " + extra).strip(), i == 0
            env = dict(base, XLA_FLAGS=(flags + " " + extra).strip())
            print("[%s] %s ..." % (model, config), flush=True)
            r, err = run_child(["--out", d, "--steps", str(a.steps), "--child", "stock", "--name", model]
                               + (["--save"] if save else []) + child_flags, env, a.timeout, a.gpu_clocks_ms)
            if r is None:
                errors.append("%s %s: %s" % (model, config, err))
                print("  failed: %s" % err, flush=True)
                if save:
                    break
                continue
            results.append((config, "jax", r))
            print("  median %.3f ms" % median_from(r["step_ms"]), flush=True)
        if not os.path.exists(os.path.join(d, model + ".exe.pkl")):
            continue
        vrows = []
        runs = [("vmm t=%d%s" % (t, " (auto)" if t == 1 else ""), "graph", t)
                for t in [int(x) for x in a.thresholds.split(",") if x]]
        runs += [("vmm %s" % m, m, None) for m in a.modes.split(",") if m]
        got = {}
        for rep in range(max(a.repeat, 1)):
            for config, mode, t in runs:
                print("[%s] %s%s ..." % (model, config, " (run %d)" % rep if a.repeat > 1 else ""), flush=True)
                env = dict(os.environ, JAX_PLATFORMS="vmm", XLA_VMM_EXEC_MODE=mode, XLA_FLAGS=flags)
                if mode == "va-stable":
                    env.update(XLA_VMM_EXEC_MODE="graph", XLA_VMM_GUARD="0")
                if t is not None:
                    env["XLA_VMM_TMP_COPY_THRESHOLD"] = str(t)
                r, err = run_child(["--out", d, "--steps", str(a.steps), "--child", "vmm", "--name", model]
                                   + child_flags + (["--step-counters"] if a.step_counters else []), env,
                                   a.timeout, a.gpu_clocks_ms)
                path = "plugin"
                # The CLI's loop binds the same buffers every step: no stand-in for a fresh batch.
                fallback = not a.no_fallback and not a.fresh_batch
                if r is None and t is not None and fallback and os.path.exists(a.vmm):
                    print("  plugin failed (%s); falling back to xla-vmm run" % err, flush=True)
                    r, err = run_cli(a.vmm, d, model, t, a.steps, a.timeout)
                    path = "cli"
                if r is None:
                    errors.append("%s %s: %s" % (model, config, err))
                    print("  failed: %s" % err, flush=True)
                    continue
                print("  median %.3f ms (%s)" % (median_from(r["step_ms"]), path), flush=True)
                got.setdefault(config, (path, []))[1].append(r)
        for config, _, _ in runs:
            if config not in got:
                continue
            path, of_config = got[config]
            r, err = combine_repeats(of_config)
            if r is None:
                errors.append("%s %s: %s" % (model, config, err))
                continue
            vrows.append((config, path, r))
        base_ms = next((r.get("median_ms", median_from(r["step_ms"]))
                        for c, _, r in vrows if c == "vmm t=0"), None)
        for config, path, r in results:
            rows.append(row(model, config, path, r, base_ms))
        for config, path, r in vrows:
            rows.append(row(model, config.replace(" (auto)", ""), path, r, base_ms))
        write(d, a.steps, rows, errors, [])
    table = write(d, a.steps, rows, errors, pending)
    print(table)
    for e in errors:
        print("ERROR", e)
    if pending:
        print("NOT RUN (time budget):", ", ".join(pending))
    return 1 if errors else (2 if pending else 0)


if __name__ == "__main__":
    sys.exit(main())
