"""Inference past the device memory (issue 29's benchmark; benchmark, not a test).

A llama-family forward pass whose bf16 weights are 1.5x, 1.75x and 2x a device budget, as tokens/s:

- `vmm none`: xla-vmm with no budget (the ceiling);
- `vmm 2.00x` ...: xla-vmm with XLA_VMM_DEVICE_MEMORY_LIMIT = weights / ratio (the weights past it live in host
  memory and the runtime stages them);
- `stock offload 2.00x` ...: stock XLA the way a JAX user writes it by hand: weights in `pinned_host`, each
  layer's moved to the device inside the jitted function (`jax.device_put` to device memory), with
  XLA_PYTHON_CLIENT_MEM_FRACTION set to the same budget;
- the link bound: the bytes that must cross per step (weights past the budget) at the measured host link
  rate (--link-gbps, 55 on the H200).

Two phases, each its own jitted program: prefill (--batch x --seq tokens) and decode (--batch tokens of one
position each; attention over that one position, so the step is the weights' traffic, as decode is). One
process per row. Prints a Markdown table, writes DIR/oversub.json; --save-exe DIR keeps the two programs'
serialized executables (the `vmm none` row's compile; every row compiles the same) for `xla-vmm inspect
PHASE.pjrt --memory-budget BYTES --as-run`, so that their plans can be studied without a GPU.

    XLA_VMM_LIBRARY=.dev/perf/lib/libxla_vmm_plugin.so \
      python3 integration/oversub_bench.py --out DIR [--layers 8] [--dim 4096] [--ffn 14336] [--ratios 1.5,1.75,2]
"""
import argparse
import hashlib
import json
import os
import sys
import time

HERE = os.path.abspath(__file__)
# The jax_plugins package (xla-vmm's registration) next to this file; XLA_VMM_LIBRARY names the plugin.
sys.path.insert(0, os.path.dirname(HERE))

from benchio import GUARD_WARMUP_STEPS, gpu_memory_bytes, run_json_child, write_results  # noqa: E402


def weight_bytes(layers, dim, ffn, vocab):
    per_layer = 4 * dim * dim + 3 * dim * ffn + 2 * dim
    return 2 * (layers * per_layer + 2 * vocab * dim + dim)


def child(a):
    import jax
    import jax.numpy as jnp
    import numpy as np

    dev = jax.devices()[0]
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[0])).astype(jnp.bfloat16)

    # One layer's weights drawn, every layer a copy of them (each its own device buffer): drawing
    # gigabytes of normals per process would take longer than the measurement.
    one = dict(wq=w(a.dim, a.dim), wk=w(a.dim, a.dim), wv=w(a.dim, a.dim), wo=w(a.dim, a.dim),
               w1=w(a.dim, a.ffn), w3=w(a.dim, a.ffn), w2=w(a.ffn, a.dim),
               n1=np.ones(a.dim, jnp.bfloat16), n2=np.ones(a.dim, jnp.bfloat16))
    layers = [{k: v.copy() for k, v in one.items()} for _ in range(a.layers)]
    params = dict(emb=w(a.vocab, a.dim), out=w(a.dim, a.vocab), norm=np.ones(a.dim, jnp.bfloat16),
                  layers=layers)
    offload = a.mode == "offload"
    if offload:
        from jax.sharding import SingleDeviceSharding
        on_host = SingleDeviceSharding(dev, memory_kind="pinned_host")
        on_dev = SingleDeviceSharding(dev, memory_kind="device")
        params = dict(params, layers=jax.device_put(params["layers"], on_host))
        params = dict(params, **{k: jax.device_put(params[k], on_dev) for k in ("emb", "out", "norm")})
    else:
        params = jax.device_put(params, dev)

    def rms(x, g):
        x32 = x.astype(jnp.float32)
        return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(x.dtype) * g

    def block(p, x):
        h = rms(x, p["n1"])
        q, k, v = h @ p["wq"], h @ p["wk"], h @ p["wv"]
        b, s, d = q.shape
        heads = d // 128
        q, k, v = (t.reshape(b, s, heads, 128) for t in (q, k, v))
        att = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.sqrt(128.0)
        mask = jnp.tril(jnp.ones((s, s), bool))
        att = jax.nn.softmax(jnp.where(mask, att, -1e30), -1).astype(x.dtype)
        o = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, d)
        x = x + o @ p["wo"]
        h = rms(x, p["n2"])
        return x + (jax.nn.silu(h @ p["w1"]) * (h @ p["w3"])) @ p["w2"]

    def forward(params, tokens):
        x = params["emb"][tokens]
        for p in params["layers"]:
            if offload:
                p = jax.device_put(p, on_dev)  # the explicit way: this layer's weights to the device
            x = block(p, x)
        return (rms(x[:, -1], params["norm"]) @ params["out"]).astype(jnp.float32)

    fwd = jax.jit(forward)
    out = {"mode": a.mode, "ratio": a.ratio}
    for phase, shape in (("prefill", (a.batch, a.seq)), ("decode", (a.batch, 1))):
        tokens = jax.device_put(rng.integers(0, a.vocab, size=shape, dtype=np.int32), dev)
        if a.save_exe:
            # The serialized executable, for `xla-vmm inspect PHASE.pjrt --memory-budget BYTES`.
            import stock_ref
            stock_ref.save_pjrt(fwd.lower(params, tokens).compile(), os.path.join(a.save_exe, phase + ".pjrt"))
        for _ in range(a.warmup):
            fwd(params, tokens).block_until_ready()
        times = []
        for _ in range(a.steps):
            t = time.perf_counter()
            fwd(params, tokens).block_until_ready()
            times.append(time.perf_counter() - t)
        times.sort()
        med = times[len(times) // 2]
        # Every bit of the outputs: the same executable with a budget must give them exactly.
        digest = hashlib.sha256(np.asarray(fwd(params, tokens)).tobytes()).hexdigest()[:16]
        out[phase] = {"ms": med * 1e3, "tokens_per_s": shape[0] * shape[1] / med, "digest": digest}
    if a.mode == "vmm":
        # What the runtime staged, per program (its report): where a step's time goes.
        from jax_plugins.xla_vmm import report
        rep = report()
        out["staging"] = [dict(p["staging"], program=p["program"], runner=p.get("runner"))
                          for p in rep.get("programs", []) if p.get("staging")]
        out["not_staged"] = [dict(program=p["program"], runner=p.get("runner"), why=p["staging_note"])
                             for p in rep.get("programs", []) if p.get("staging_note")]
        # The rest: every program's memory on the device, or a program on the vendor runtime (why).
        out["other_programs"] = [dict(program=p["program"], runner=p.get("runner"), reason=p.get("reason"),
                                      steps=p.get("steps"))
                                 for p in rep.get("programs", []) if not p.get("staging") and not p.get("staging_note")]
        out["memory"] = [d["memory"] for d in rep.get("devices", [])]
    return out


def run(a, mode, ratio, wbytes, total_dev):
    env = dict(os.environ)
    argv = [sys.executable, HERE, "--child", "--mode", mode, "--ratio", str(ratio)] + [
        "--%s=%s" % (k, getattr(a, k)) for k in ("layers", "dim", "ffn", "vocab", "batch", "seq", "steps", "warmup")]
    if a.save_exe and mode == "vmm" and not ratio:
        os.makedirs(a.save_exe, exist_ok=True)
        argv += ["--save-exe", a.save_exe]
    budget = int(wbytes / ratio) if ratio else None
    # Every row compiles the same programs the same way (no timing-based autotuning, deterministic
    # reductions), so that outputs can be compared bit for bit across the rows' processes.
    env.setdefault("XLA_FLAGS", "--xla_gpu_deterministic_ops=true --xla_gpu_autotune_level=0")
    if mode == "vmm":
        env["JAX_PLATFORMS"] = "vmm"
        if budget:
            env["XLA_VMM_DEVICE_MEMORY_LIMIT"] = str(budget)
    else:
        env["JAX_PLATFORMS"] = "cuda"
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "%.4f" % (budget / total_dev)
    return run_json_child(argv, env, a.timeout)


def link_planned(st):
    """The host link a staging planned with (newer plugins say: the device's measured one, else the H200's)."""
    if not st.get("link_bytes_per_s"):
        return ""
    return "; planned with the link at %.1f GB/s in, %.1f out, %.1f both at once" % (
        st["link_bytes_per_s"] / 1e9, st.get("link_out_bytes_per_s", 0) / 1e9, st.get("link_both_bytes_per_s", 0) / 1e9)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=14336)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=GUARD_WARMUP_STEPS, help="untimed steps first")
    ap.add_argument("--ratios", default="1.5,1.75,2")
    ap.add_argument("--rows", default="vmm,offload", help="which of vmm (with no budget and each ratio) "
                    "and offload (stock, each ratio) to run")
    ap.add_argument("--link-gbps", type=float, default=55.0)
    ap.add_argument("--device-gib", type=float, default=None,
                    help="the GPU's memory, for stock's XLA_PYTHON_CLIENT_MEM_FRACTION (default: nvidia-smi's, else "
                         "the H200's 139.8)")
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--save-exe", default=None, help="write each phase's serialized executable to this folder "
                    "(PHASE.pjrt; the `vmm none` row's)")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--mode", default="vmm")
    ap.add_argument("--ratio", type=float, default=0.0)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a)), flush=True)
        return 0
    os.makedirs(a.out, exist_ok=True)
    wbytes = weight_bytes(a.layers, a.dim, a.ffn, a.vocab)
    total_dev = a.device_gib * 2**30 if a.device_gib else (gpu_memory_bytes() or 139.8 * 2**30)
    ratios = [float(r) for r in a.ratios.split(",") if r.strip()]
    kinds = a.rows.split(",")
    plan = ([("vmm", 0.0)] + [("vmm", r) for r in ratios] if "vmm" in kinds else []) + (
        [("offload", r) for r in ratios] if "offload" in kinds else [])
    rows, errors = [], []
    for mode, ratio in plan:
        label = ("vmm" if mode == "vmm" else "stock offload") + (" %.2fx" % ratio if ratio else " none")
        print("[%s] ..." % label, flush=True)
        r, err = run(a, mode, ratio, wbytes, total_dev)
        if r is None:
            errors.append("%s: %s" % (label, err))
            print("  failed: %s" % err, flush=True)
            continue
        r["label"] = label
        past = max(0.0, wbytes - wbytes / ratio) if ratio else 0.0
        r["link_bound_ms"] = past / (a.link_gbps * 1e9) * 1e3
        rows.append(r)
    md = ["weights %.2f GiB (bf16); link %.0f GB/s" % (wbytes / 2**30, a.link_gbps), "",
          "| config | prefill ms | prefill tokens/s | decode ms | decode tokens/s | link bound ms | decode vs link bound "
          "| outputs = vmm none (every bit) |",
          "|---|---|---|---|---|---|---|---|"]
    ref = next((r for r in rows if r["label"] == "vmm none"), None)

    def same(r):
        if ref is None or r is ref:
            return "-"
        return "yes" if all(r[p]["digest"] == ref[p]["digest"] for p in ("prefill", "decode")) else "NO"

    # Our runs under a budget run the unbudgeted run's executables: their outputs must be its, bit for bit
    # (stock's offload rows are other programs: shown, not required).
    errors += ["%s: outputs differ from vmm none's" % r["label"] for r in rows
               if r["label"].startswith("vmm ") and same(r) == "NO"]

    for r in rows:
        lb = r["link_bound_ms"]
        md.append("| %s | %.2f | %.0f | %.2f | %.0f | %s | %s | %s |" % (
            r["label"], r["prefill"]["ms"], r["prefill"]["tokens_per_s"], r["decode"]["ms"],
            r["decode"]["tokens_per_s"], "%.2f" % lb if lb else "-",
            "%.0f%%" % (100 * lb / r["decode"]["ms"]) if lb else "-", same(r)))
    for r in rows:
        for st in r.get("not_staged", []):
            md.append("- %s, %s (runs as %s): part in host memory, not staged (%s): read in place" % (
                r["label"], st["program"], st.get("runner"), st["why"]))
        for p in r.get("other_programs", []):
            md.append("- %s, %s (runs as %s%s, %s steps): no part staged or read in place" % (
                r["label"], p["program"], p.get("runner"), ": " + p["reason"] if p.get("reason") else "",
                p.get("steps")))
        for st in r.get("staging", []):
            md.append("- %s, %s (runs as %s): %d buffers (%.0f MiB) staged through a %.0f MiB area (%d, %.0f MiB, kept there "
                      "from step to step; %d, %.0f MiB, fetched by the step before; copied in before %d steps), %d "
                      "(%.0f MiB) read in place, %.0f MiB on the device; per step %.0f MiB in, %.0f MiB out" % (
                          r["label"], st["program"], st.get("runner"), st["staged"], st["staged_bytes"] / 2**20,
                          st["area_bytes"] / 2**20, st.get("kept", 0), st.get("kept_bytes", 0) / 2**20,
                          st.get("carried", 0), st.get("carried_bytes", 0) / 2**20,
                          st.get("refills", 0), st["in_place"], st["in_place_bytes"] / 2**20,
                          st["device_bytes"] / 2**20, st["bytes_in_per_step"] / 2**20,
                          st["bytes_out_per_step"] / 2**20) + link_planned(st))
            if st.get("timed_steps"):
                md.append("  - last step timed: %.2f ms on the device, copies in %.2f ms at %.1f GB/s, "
                          "compute waited %.2f ms, link %.0f%% busy" % (
                              st["gpu_step_us"] / 1e3, st["copy_in_us"] / 1e3, st["copy_in_gbps"],
                              st["waited_us"] / 1e3, 100 * st["link_utilisation"]))
    md += ["- ERROR " + e for e in errors]
    write_results(a.out, "oversub", md, {"weight_bytes": wbytes, "rows": rows, "errors": errors})
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
