"""Throughput of a training loop fed a fresh batch every step (benchmark, not a test).

The A/B (ab.py) times one step at a time (each step waits for its loss). A real training loop does not:
it `device_put`s the next batch from host memory and dispatches the next step while the GPU still runs
the previous one, and looks at a loss now and then. That overlap is what this measures, stock XLA vs
xla-vmm in the same run, one process each:

    steps/s = STEPS / (time from the first timed dispatch until the last loss is ready)

with `jax.device_put(numpy batch)` + `step(state, batch)` per step (state donated), a loss read on the host
every --log-every steps (50, and 1 as naive loops do: then each read should wait for its own step only, not
for the next one already queued). Prints a Markdown table and writes DIR/feed.json.

    python3 integration/feed_bench.py --out DIR [--model llama_small_f32] [--steps 200] [--thresholds 1,0]
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "tests"))

from benchio import run_json_child, write_results  # noqa: E402


def child(model, steps, log_every):
    import jax
    import numpy as np
    from llama_ab import program

    f, args, donate = program(model)
    dev = jax.devices()[0]
    step = jax.jit(f, donate_argnums=donate)
    # (state, tokens, constants...): the state is fed back, the tokens are a fresh host batch per step.
    state, x, rest = args[0], args[1], tuple(jax.device_put(c, dev) for c in args[2:])
    state = jax.device_put(state, dev)
    rng = np.random.default_rng(0)
    vocab = int(np.asarray(x).max()) + 1
    batches = [rng.integers(0, vocab, size=x.shape, dtype=np.asarray(x).dtype) for _ in range(8)]
    # Warm-up: compile, first VA-stable steps, auto's re-plan.
    def one(state, i):
        res = step(state, jax.device_put(batches[i % 8], dev), *rest)
        return res[0], res[-1]

    for i in range(8):
        state, loss = one(state, i)
    loss.block_until_ready()
    losses = []
    t = time.perf_counter()
    for i in range(steps):
        state, loss = one(state, i)
        if (i + 1) % log_every == 0:
            losses.append(float(loss))  # a host read now and then, as training loops log
    loss.block_until_ready()
    dt = time.perf_counter() - t
    return {"steps": steps, "seconds": dt, "steps_per_s": steps / dt, "ms_per_step": dt * 1e3 / steps,
            "losses": losses}


def run(platform, threshold, log_every, a):
    env = dict(os.environ, JAX_PLATFORMS=platform)
    if platform == "vmm":
        env["XLA_VMM_TMP_COPY_THRESHOLD"] = str(threshold)
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--model", a.model, "--steps", str(a.steps),
            "--log-every", str(log_every), "--out", a.out]
    return run_json_child(argv, env, a.timeout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama_small_f32")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--log-every", default="50,1",
                    help="read the loss on the host every N steps; a list runs each (1 = every step, as naive loops do)")
    ap.add_argument("--thresholds", default="1,0")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.model, a.steps, int(a.log_every))), flush=True)
        return 0
    os.makedirs(a.out, exist_ok=True)
    rows, errors = [], []
    configs = [("stock XLA", "cuda", None)] + [("xla-vmm t=%s" % t, "vmm", int(t))
                                                for t in a.thresholds.split(",") if t.strip()]
    for every in [int(x) for x in a.log_every.split(",") if x.strip()]:
        for label, platform, t in configs:
            print("[%s, loss read every %d] %s ..." % (a.model, every, label), flush=True)
            r, err = run(platform, t, every, a)
            if r is None:
                errors.append("%s (every %d): %s" % (label, every, err))
                print("  failed: %s" % err, flush=True)
                continue
            print("  %.3f ms/step (%.1f steps/s)" % (r["ms_per_step"], r["steps_per_s"]), flush=True)
            rows.append(dict(r, config=label, log_every=every))
    md = ["| model | loss read every | config | ms/step (fed, not blocking) | steps/s | vs stock |",
          "|---|---|---|---|---|---|"]
    for r in rows:
        stock = next((s for s in rows if s["config"] == "stock XLA" and s["log_every"] == r["log_every"]), None)
        vs = "%.2fx" % (stock["ms_per_step"] / r["ms_per_step"]) if stock else "-"
        md.append("| %s | %d | %s | %.3f | %.1f | %s |" % (a.model, r["log_every"], r["config"], r["ms_per_step"],
                                                          r["steps_per_s"], vs))
    md += ["- ERROR " + e for e in errors]
    write_results(a.out, "feed", md, {"model": a.model, "rows": rows, "errors": errors})
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
