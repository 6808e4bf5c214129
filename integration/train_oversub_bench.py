"""Training past the device memory (issue 29's training benchmark; benchmark, not a test).

A llama-family training step (integration/models/llama.py's decoder, float32, Adam) whose state (weights and
Adam's two moments) is 1.25x and 2x a device memory limit, as ms a step:

- `stock`: stock XLA with the whole card (the ceiling on stock);
- `vmm none`: xla-vmm with no limit (the ceiling on us);
- `vmm 2.00x` ...: xla-vmm with XLA_VMM_DEVICE_MEMORY_LIMIT = state / ratio, the program unchanged (the state past
  the limit lives in host memory; the runtime stages it);
- `stock capped 2.00x` ...: stock XLA with XLA_PYTHON_CLIENT_MEM_FRACTION at the same memory, the program unchanged
  (where the state does not fit: out of memory);
- `stock offload 2.00x` ...: stock XLA the way JAX's host-offloading guide writes it by hand: Adam's moments in
  `pinned_host` memory, moved to the device inside the jitted step and back (`jax.device_put` with memory kinds),
  at the same memory fraction. The weights and their gradients stay on the device (a third of the state each),
  so this fits up to about 1.4x (hence 1.25x among the ratios); past it stock has no hand-written way short of
  rewriting the model layer by layer;
- the link bound: the state past the limit must cross the host link both ways every step (the step reads it and
  writes it), at the link's rates (--probe: `xla-vmm probe --json`'s file; else --link-gbps, --link-out-gbps,
  --link-both-gbps). The state alone: the step's gradients and activations need room too;
- the step's least link time: what any staging of the step must move, from the bytes its thunks still need at
  each instant (state, gradients, activations) against the device room (`report()`'s `must_cross_us`, at the
  link rates the plugin planned with). The tighter of the two bounds.

Every row runs the same steps on the same batches from the same initial state; our rows with a limit run the
unlimited row's executable, so their losses must be its, bit for bit (stock's rows are other programs: their
largest difference is shown). One process per row. Prints a Markdown table and writes DIR/train_oversub.md and
.json.

    XLA_VMM_LIBRARY=.dev/perf/lib/libxla_vmm_plugin.so \\
      python3 integration/train_oversub_bench.py --out DIR [--layers 8] [--dim 2048] [--ffn 5632] [--ratios 1.25,2]

`--platform cpu` runs the stock and offload rows on CPU jax (a check of the harness, no GPU; no limit applies
there).

`--trace DIR` (with `--save-exe` and `--cli`, our CLI): each of our limited rows runs `--trace-steps` more steps
after its timed ones under jax.profiler (its process loads the CUDA plugin too, `JAX_PLATFORMS=vmm,cuda`, whose
CUPTI tracer records every kernel and copy), into DIR/ratio_R/; then `xla-vmm inspect train_step.pjrt
--memory-budget LIMIT --as-run --json` at the same link rates estimates the step, and
integration/diag/staging_vs_trace.py sets the traced step beside the estimate (DIR/ratio_R/staging_vs_trace.md,
its lines in the table's notes): where the estimate's split of the step into thunks and waits is off.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
# The jax_plugins package (xla-vmm's registration) and the models next to this file.
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "diag"))

import staging_vs_trace  # noqa: E402
from benchio import (GUARD_WARMUP_STEPS, gpu_memory_bytes, run_json_child, staged_line, staged_of,  # noqa: E402
                     write_results)


def state_bytes(layers, dim, ffn, vocab):
    """Weights and Adam's two moments, float32 (the model's shapes: square attention, SwiGLU, tied embedding)."""
    params = layers * (4 * dim * dim + 3 * dim * ffn + 2 * dim) + vocab * dim + dim
    return 3 * 4 * params


def adam(lr=1e-4, b1=0.9, b2=0.95, eps=1e-8):
    """Adam with optax's interface (`init`, `update` -> updates, state), written out so that the harness's own
    check runs where optax is not installed."""
    import jax
    import jax.numpy as jnp

    class Adam:
        @staticmethod
        def init(params):
            zeros = jax.tree.map(jnp.zeros_like, params)
            return {"mu": zeros, "nu": jax.tree.map(jnp.zeros_like, params), "count": jnp.zeros((), jnp.int32)}

        @staticmethod
        def update(g, s, params=None):
            count = s["count"] + 1
            mu = jax.tree.map(lambda m, x: b1 * m + (1 - b1) * x, s["mu"], g)
            nu = jax.tree.map(lambda v, x: b2 * v + (1 - b2) * x * x, s["nu"], g)
            t = count.astype(jnp.float32)
            c1, c2 = 1 - b1 ** t, 1 - b2 ** t
            upd = jax.tree.map(lambda m, v: -lr * (m / c1) / (jnp.sqrt(v / c2) + eps), mu, nu)
            return upd, {"mu": mu, "nu": nu, "count": count}

    return Adam()


def child(a):
    import hashlib

    import jax
    import numpy as np
    from jax.sharding import SingleDeviceSharding

    from models.llama import make_llama

    dev = jax.devices()[0]
    make_state, train_step = make_llama(a.vocab, a.dim, a.heads, a.heads, a.layers, a.ffn, np.float32, a.scan,
                                        opt=adam())
    params, ostate = make_state(jax.random.PRNGKey(0))
    offload = a.mode == "offload"
    on_dev = SingleDeviceSharding(dev, memory_kind="device")
    if offload:
        on_host = SingleDeviceSharding(dev, memory_kind="pinned_host")
        moments = {k: ostate[k] for k in ("mu", "nu")}
        ostate = dict(ostate, **jax.device_put(moments, on_host))

        def step(state, x):
            p, o = state
            o = dict(o, **jax.device_put({k: o[k] for k in ("mu", "nu")}, on_dev))
            (p, o), loss = train_step((p, o), x)
            return (p, dict(o, **jax.device_put({k: o[k] for k in ("mu", "nu")}, on_host))), loss
    else:
        step = train_step
    state = jax.device_put((params, ostate), dev) if not offload else (jax.device_put(params, dev), ostate)
    del params, ostate
    fn = jax.jit(step, donate_argnums=0)
    rng = np.random.default_rng(0)
    batches = [jax.device_put(rng.integers(0, a.vocab, size=(a.batch, a.seq + 1), dtype=np.int32), dev)
               for _ in range(4)]
    if a.save_exe:
        # The step's serialized executable, for `xla-vmm inspect train_step.pjrt --memory-budget BYTES --as-run`.
        import stock_ref
        stock_ref.save_pjrt(fn.lower(state, batches[0]).compile(), os.path.join(a.save_exe, "train_step.pjrt"))
    n = a.warmup + a.steps
    losses, times, donated = [], [], True
    for i in range(n):
        t = time.perf_counter()
        try:
            state, loss = fn(state, batches[i % len(batches)])
        except Exception as e:  # noqa: BLE001 (jax raises several kinds)
            # Where stock refuses to donate pinned_host buffers (MaxText's offload failed so), the hand-written
            # offload does as a user would: the same step without donation (checked before it runs: the state
            # is intact).
            if not (offload and i == 0 and "onation" in str(e)):
                raise
            fn, donated = jax.jit(step), False
            state, loss = fn(state, batches[i % len(batches)])
        loss = float(loss)  # waits for the step
        if i >= a.warmup:
            times.append(time.perf_counter() - t)
        losses.append(loss)
    times.sort()
    if a.trace:
        import jax.profiler

        # Untimed, after the timed steps; their losses are not compared (the run's are).
        with jax.profiler.trace(a.trace):
            for i in range(n, n + a.trace_steps):
                state, loss = fn(state, batches[i % len(batches)])
                float(loss)
    bits = np.asarray(losses, np.float32)
    out = {"mode": a.mode, "ratio": a.ratio, "ms": 1e3 * times[len(times) // 2], "losses": losses,
           "digest": hashlib.sha256(bits.tobytes()).hexdigest()[:16], "donated": donated}
    if a.mode == "vmm":
        from jax_plugins.xla_vmm import report
        progs = report().get("programs", [])
        out["staged"] = [staged_of(p) for p in progs if p.get("staging")]
        out["not_staged"] = [{"program": p["program"], "runner": p.get("runner"), "why": p["staging_note"]}
                             for p in progs if p.get("staging_note")]
        # Every program's own memory: what the staged step could not plan with.
        out["memory"] = [dict(p["memory"], program=p["program"], id=p.get("id")) for p in progs if p.get("memory")]
        devices = report().get("devices", [])
        out["shared_temporaries"] = [d.get("shared_temporaries") for d in devices]
        # Each device's memory in all (budget counters, the buffer allocator's): where the limit went.
        out["devices"] = [{k: d.get(k) for k in ("device", "memory", "allocator")} for d in devices]
    return out


def link_bound_ms(past, a):
    """Milliseconds the link needs for `past` bytes each way: each direction at its rate, both together at the
    rate of both at once (one way's where not given: the directions take turns)."""
    gin = a.link_gbps * 1e9
    gout = (a.link_out_gbps or a.link_gbps) * 1e9
    both = (a.link_both_gbps or min(a.link_gbps, a.link_out_gbps or a.link_gbps)) * 1e9
    return 1e3 * max(past / gin, past / gout, 2 * past / both)


ROW_ARGS = ("layers", "dim", "ffn", "vocab", "heads", "batch", "seq", "steps")
STOCK_WARMUP = 3


def run(a, mode, ratio, sbytes, total_dev):
    """One row in its own process: (result, None) or (None, why it failed)."""
    env = dict(os.environ)
    # Stock has no guard to warm up: a few untimed steps (compile, allocator) are enough.
    warmup = a.warmup if mode == "vmm" else min(a.warmup, STOCK_WARMUP)
    argv = [sys.executable, HERE, "--child", "--mode", mode, "--ratio", str(ratio), "--warmup=%d" % warmup] + [
        "--%s=%s" % (k, getattr(a, k)) for k in ROW_ARGS] + (["--scan"] if a.scan else [])
    if a.save_exe and mode == "vmm" and not ratio:
        os.makedirs(a.save_exe, exist_ok=True)
        argv += ["--save-exe", a.save_exe]
    limit = int(sbytes / ratio) if ratio else None
    traced = trace_dir(a, mode, ratio)
    if traced:
        argv += ["--trace", traced, "--trace-steps=%d" % a.trace_steps]
    # Deterministic reductions and no timing-based autotuning: every process compiles the same program the same
    # way, so that our limited rows run the unlimited row's executable.
    env.setdefault("XLA_FLAGS", "--xla_gpu_deterministic_ops=true --xla_gpu_autotune_level=0")
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if a.platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
    elif mode == "vmm":
        env["JAX_PLATFORMS"] = "vmm,cuda" if traced else "vmm"
        if limit:
            env["XLA_VMM_DEVICE_MEMORY_LIMIT"] = str(limit)
    else:
        env["JAX_PLATFORMS"] = "cuda"
        if limit:
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "%.4f" % (limit / total_dev)
    return run_json_child(argv, env, a.timeout)


def trace_dir(a, mode, ratio):
    """Where a row's trace goes: our limited rows', with --trace."""
    return os.path.join(a.trace, "ratio_%g" % ratio) if a.trace and mode == "vmm" and ratio else None


def set_beside(a, r, sbytes, load_trace=None):
    """A traced row's step against `xla-vmm inspect`'s estimate of it: the Markdown lines (notes), or why not.
    `load_trace`: the trace's reader (default: trace_timeline.load, which needs jax)."""
    folder = trace_dir(a, r["mode"], r["ratio"])
    exe = os.path.join(a.save_exe or "", "train_step.pjrt")
    if not (a.cli and os.path.exists(exe)):
        return ["- %s: traced in %s; no estimate beside it (needs --cli and --save-exe)" % (r["label"], folder)]
    rates = ["--link-gbps", str(a.link_gbps)] + (["--link-out-gbps", str(a.link_out_gbps)] if a.link_out_gbps else []) \
        + (["--link-both-gbps", str(a.link_both_gbps)] if a.link_both_gbps else [])
    cmd = [a.cli, "inspect", exe, "--memory-budget", str(int(sbytes / r["ratio"])), "--as-run", "--json"] + rates
    try:
        estimate = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True,
                                             timeout=a.timeout).stdout)
        got = staging_vs_trace.compare(estimate, (load_trace or staging_vs_trace.load)(folder))
    except (ImportError, OSError, ValueError, subprocess.SubprocessError, SystemExit) as e:
        return ["- %s: traced in %s; not set beside the estimate: %s" % (r["label"], folder, e)]
    md = staging_vs_trace.markdown(got)
    with open(os.path.join(folder, "staging_vs_trace.md"), "w") as fh:
        fh.write("    %s\n\n%s" % (" ".join(cmd), md))
    with open(os.path.join(folder, "staging_vs_trace.json"), "w") as fh:
        json.dump(got, fh, indent=1)
    f = lambda k: "%.2f / %.2f ms" % (got[k]["estimated"] / 1e3, got[k]["measured"] / 1e3)  # noqa: E731
    return ["- %s, its trace against the estimate (estimated / measured): step %s, kernels running %s, nothing "
            "to run %s (%s)" % (r["label"], f("step_us"), f("thunks_us"), f("idle_us"),
                                os.path.join(folder, "staging_vs_trace.md"))]


def plan_rows(a):
    """(label, mode, ratio) of each row to run."""
    ratios = [float(r) for r in a.ratios.split(",") if r.strip()]
    kinds = a.rows.split(",")
    rows = []
    if "stock" in kinds:
        rows.append(("stock", "stock", 0.0))
    if "vmm" in kinds and a.platform != "cpu":
        rows += [("vmm none", "vmm", 0.0)] + [("vmm %.2fx" % r, "vmm", r) for r in ratios]
    for r in ratios:
        if "capped" in kinds and a.platform != "cpu":
            rows.append(("stock capped %.2fx" % r, "stock", r))
        if "offload" in kinds:
            rows.append(("stock offload %.2fx" % r, "offload", r))
    return rows


def table(a, rows, failed, sbytes):
    """The Markdown lines and the errors (a limited row of ours whose losses differ from the unlimited one's)."""
    ours = next((r for r in rows if r["label"] == "vmm none"), None)
    stock = next((r for r in rows if r["label"] == "stock"), None)
    errors = ["%s: losses differ from vmm none's" % r["label"] for r in rows
              if ours and r["label"].startswith("vmm ") and r is not ours and r["digest"] != ours["digest"]]

    def vs(r):
        ref = ours if r["mode"] == "vmm" else stock
        if ref is None or r is ref:
            return "-"
        if r["mode"] == "vmm":
            return "identical" if r["digest"] == ref["digest"] else "DIFFER"
        n = min(len(r["losses"]), len(ref["losses"]))
        return "max abs %.3g" % max((abs(x - y) for x, y in zip(r["losses"][:n], ref["losses"][:n])), default=0.0)

    md = ["state (weights + Adam's moments, float32) %.2f GiB; %d layers, dim %d, ffn %d, vocab %d, batch %d, seq %d; "
          "median of %d steps after %d (stock's after %d); link %.1f GB/s in%s%s" % (
              sbytes / 2**30, a.layers, a.dim, a.ffn, a.vocab, a.batch, a.seq, a.steps, a.warmup,
              min(a.warmup, STOCK_WARMUP), a.link_gbps,
              ", %.1f out" % a.link_out_gbps if a.link_out_gbps else "",
              ", %.1f both at once" % a.link_both_gbps if a.link_both_gbps else ""), "",
          "| config | device memory | ms/step | vs stock | link bound ms | bound / step | step's least link ms "
          "| least / step | losses |",
          "|---|---|---|---|---|---|---|---|---|"]
    pct = lambda b, ms: "%.0f%%" % (100 * b / ms) if b else "-"  # noqa: E731
    for r in rows:
        past = max(0.0, sbytes - sbytes / r["ratio"]) if r["ratio"] else 0.0
        bound = link_bound_ms(past, a) if past else None
        least = least_link_ms(r)
        md.append("| %s | %s | %.2f | %s | %s | %s | %s | %s | %s |" % (
            r["label"], "%.2f GiB" % (sbytes / r["ratio"] / 2**30) if r["ratio"] else "whole card", r["ms"],
            "%.2fx" % (stock["ms"] / r["ms"]) if stock else "-", "%.1f" % bound if bound else "-",
            pct(bound, r["ms"]), "%.1f" % least if least else "-", pct(least, r["ms"]), vs(r)))
    md += ["| %s | - | - | - | - | - | - | - | %s |" % (label, why.replace("|", "/")[:200]) for label, why in failed]
    md += ["- %s: stock refused to donate its state (pinned_host); it ran without donation" % r["label"]
           for r in rows if not r.get("donated", True)]
    for r in rows:
        md += ["- %s: %s" % (r["label"], staged_line(st)) for st in r.get("staged", [])]
        md += ["- %s, %s (runs as %s): part in host memory, not staged (%s): read in place" % (
            r["label"], st["program"], st.get("runner"), st["why"]) for st in r.get("not_staged", [])]
        md += memory_lines(r)
    return md + ["- ERROR " + e for e in errors], errors


def step_of(r):
    """The train step among a row's staged programs: the one planned longest (the model's initialisation runs
    small staged programs too)."""
    staged = r.get("staged") or [{}]
    return max(staged, key=lambda st: st.get("estimated_step_us", 0))


def least_link_ms(r):
    """The link time the step's own buffers force, ms: what any staging of the step must move at the least, its
    temporaries and gradients included, with its memory where the run put it (`report()`'s `must_cross_us`;
    None where the plugin does not say)."""
    us = step_of(r).get("must_cross_us")
    return us / 1e3 if us else None


def mib(b):
    """Bytes in MiB."""
    return b / 2**20


def memory_lines(r):
    """The device memory the loaded programs hold of their own, beside the staged ones: one line per row with
    a budget, the largest holders named; then each device's memory in all (`device_lines`)."""
    mem = [m for m in r.get("memory", []) if m["device_bytes"] + m["shared_bytes"] > 0]
    if not r.get("ratio") or not mem:
        return device_lines(r)
    # The step is the staged program planned longest (other programs of the same name are others: the model's
    # initialisation runs several `jit_multiply`, for one); a line without an id is matched by name.
    step = step_of(r)
    key = (lambda m: m.get("id")) if step.get("id") is not None else (lambda m: m.get("program"))
    others = [m for m in mem if key(m) != key(step)]
    top = sorted(others, key=lambda m: -(m["device_bytes"] + m["shared_bytes"]))[:4]
    temps = sum(t["bytes"] for t in r.get("shared_temporaries", []) if t)
    return ["- %s: the %d other programs hold %.0f MiB of device memory of their own; the device's shared "
            "temporaries hold %.0f MiB (largest holders, own + shared mapped: %s)" % (
                r["label"], len(others), mib(sum(m["device_bytes"] for m in others)), mib(temps),
                ", ".join("%s %.0f + %.0f MiB" % (m["program"], mib(m["device_bytes"]), mib(m["shared_bytes"]))
                          for m in top))] + device_lines(r)


def device_lines(r):
    """Where each device's memory went at the end of a row with a budget: in use and at its peak, in host
    memory, what was placed on the host for want of room and moved at first runs, and the buffers the
    allocator holds (live and cached)."""
    lines = []
    for d in r.get("devices", []) if r.get("ratio") else []:
        m, a = d.get("memory") or {}, d.get("allocator") or {}
        if not m:
            continue
        line = ("- %s, %s: %.0f MiB of device memory in use (peak %.0f), %.0f MiB in host memory; %d allocations "
                "placed in host memory for want of device room, %d moved at first runs" % (
                    r["label"], d.get("device"), mib(m.get("device_bytes", 0)), mib(m.get("device_peak_bytes", 0)),
                    mib(m.get("host_bytes", 0)), m.get("spilled", 0), m.get("relocated", 0)))
        if a:
            line += "; the buffer allocator: %d buffers live, %.0f MiB, %.0f MiB physical, %d cached blocks" % (
                a.get("buffers_live", 0), mib(a.get("bytes_in_use", 0)), mib(a.get("bytes_physical", 0)),
                a.get("cached_blocks", 0))
        lines.append(line)
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--scan", action="store_true", help="a lax.scan over stacked layers (MaxText's way)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=GUARD_WARMUP_STEPS,
                    help="untimed steps first, on our rows (stock's take 3)")
    ap.add_argument("--ratios", default="1.25,2")
    ap.add_argument("--rows", default="stock,vmm,capped,offload")
    ap.add_argument("--platform", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--link-gbps", type=float, default=55.0)
    ap.add_argument("--link-out-gbps", type=float, default=None)
    ap.add_argument("--link-both-gbps", type=float, default=None)
    ap.add_argument("--probe", default=None, help="`xla-vmm probe --json`'s output: the link rates from its "
                    "`link` (where it has one), in place of the --link-* ones")
    ap.add_argument("--device-gib", type=float, default=None,
                    help="the GPU's memory, for stock's XLA_PYTHON_CLIENT_MEM_FRACTION (default: nvidia-smi's, else "
                         "the H200's 139.8)")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--save-exe", default=None, help="write the training step's serialized executable "
                    "(train_step.pjrt, from our unlimited row) to this folder")
    ap.add_argument("--trace", default=None, help="trace our limited rows' extra steps into this folder and set "
                    "each beside the estimate (see above)")
    ap.add_argument("--trace-steps", type=int, default=3)
    ap.add_argument("--cli", default=None, help="our xla-vmm CLI, for --trace's estimate")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--mode", default="vmm")
    ap.add_argument("--ratio", type=float, default=0.0)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a)), flush=True)
        return 0
    os.makedirs(a.out, exist_ok=True)
    link = {}
    if a.probe and os.path.exists(a.probe):
        with open(a.probe) as fh:
            link = json.load(fh).get("link") or {}
    if link.get("to_device_bytes_per_s"):
        a.link_gbps = link["to_device_bytes_per_s"] / 1e9
        a.link_out_gbps = link.get("to_host_bytes_per_s", 0) / 1e9 or None
        a.link_both_gbps = link.get("both_ways_bytes_per_s", 0) / 1e9 or None
    sbytes = state_bytes(a.layers, a.dim, a.ffn, a.vocab)
    total_dev = a.device_gib * 2**30 if a.device_gib else (gpu_memory_bytes() or 139.8 * 2**30)
    rows, failed = [], []
    for label, mode, ratio in plan_rows(a):
        print("[%s] ..." % label, flush=True)
        r, err = run(a, mode, ratio, sbytes, total_dev)
        if r is None:
            failed.append((label, err))
            print("  failed: %s" % err, flush=True)
            continue
        r["label"] = label
        rows.append(r)
    md, errors = table(a, rows, failed, sbytes)
    for r in rows:
        if trace_dir(a, r["mode"], r["ratio"]):
            md += set_beside(a, r, sbytes)
    # Our rows must run; stock's may fail (that is what the capped row shows).
    errors += ["%s: %s" % (label, why) for label, why in failed if label.startswith("vmm")]
    write_results(a.out, "train_oversub", md, {"state_bytes": sbytes, "rows": rows, "failed": failed,
                                                "errors": errors})
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
