"""`lax.top_k(..., is_stable=False)` programs that XLA's GPU compiler turns into a `select_k` thunk (raft's
select_k in the vendor plugin), run on inputs chosen to tell tie orders apart: distinct values, many ties,
signed zeros, NaNs, rows of nearly all NaN; XLA's own TopK kernel (f32, n >= 1024, small k) too. A diagnostic for issue 12, not a test.

  python3 integration/diag/select_k_probe.py OUT            # on stock (JAX_PLATFORMS=cuda): writes OUT/
  JAX_PLATFORMS=vmm python3 integration/diag/select_k_probe.py OUT2 --ref OUT   # ours, compared with stock
  (--time CALLS: ms per call of each program, CALLS calls enqueued back to back)

For each case OUT/NAME.pjrt is the serialized executable (`xla-vmm inspect` shows whether it holds a
select_k thunk) and OUT/NAME.npz its inputs and outputs (in_KIND, val_KIND, idx_KIND). With --ref, one line per
case and input kind: whether values and indices are bit-identical to the reference run's.
"""
import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import stock_ref  # noqa: E402

# (dtype, shape, k): f32 n > 1024 with k >= 8, n == 1024 with k > 12, bf16 k >= 8 route to select_k in
# XLA's emitter; the small ones show where the compiler sends the rest.
CASES = [
    ("f32", (2000,), 8),          # lax_test testTopK (2000,), k=8, is_stable=False
    ("f32", (8, 2000), 8),
    ("f32", (16, 1024), 13),
    ("f32", (4, 1500), 3),
    ("f32", (2, 32000), 16),
    ("f32", (4, 32000), 64),
    ("f32", (2, 5000), 200),
    ("f32", (2, 6000), 300),
    ("f32", (3, 70000), 9),
    ("f32", (8, 20), 3),
    ("bf16", (4, 2048), 8),
    ("bf16", (2, 32000), 32),
    ("bf16", (2, 1500), 3),
]
KINDS = ("distinct", "ties", "zeros", "nan", "mostly_nan")


def name_of(dtype, shape, k):
    return f"{dtype}_{'x'.join(map(str, shape))}_k{k}"


def make_input(kind, dtype, shape, seed):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if kind == "distinct":
        # Distinct in bf16 too: a permutation of integers < 256 scaled, plus offsets per row.
        base = rng.permutation(n).astype(np.float64)
        if dtype == "bf16":
            base = np.floor(base / max(1, n // 200))  # bf16 keeps 8 bits: ties are unavoidable at large n
        x = base - n / 2
    elif kind == "ties":
        x = rng.integers(-3, 4, size=n).astype(np.float64)
    elif kind == "zeros":
        x = rng.choice(np.array([0.0, -0.0, 1.0, -1.0]), size=n)
    elif kind == "mostly_nan":  # fewer numbers than k in most rows of XLA's TopK kernel shapes
        x = np.where(rng.random(n) < 0.998, np.nan, rng.standard_normal(n))
    else:  # nan
        x = rng.standard_normal(n)
        x[rng.random(n) < 0.05] = np.nan
        x[rng.random(n) < 0.02] = -np.nan
    x = x.reshape(shape)
    return jnp.asarray(x, dtype=jnp.bfloat16 if dtype == "bf16" else jnp.float32)


def bits(a):
    a = np.asarray(a)
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ref", help="directory of a stock run of this script to compare with")
    ap.add_argument("--time", type=int, default=0, metavar="CALLS",
                    help="also time CALLS calls of each program, enqueued back to back (ms per call)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print("backend", jax.default_backend(), jax.devices()[0].device_kind)
    for ci, (dtype, shape, k) in enumerate(CASES):
        name = name_of(dtype, shape, k)
        f = jax.jit(lambda x, k=k: jax.lax.top_k(x, k, is_stable=False))
        x0 = make_input("distinct", dtype, shape, ci)
        try:
            compiled = f.lower(x0).compile()
        except Exception as e:  # noqa: BLE001 (under XLA_VMM_STRICT=1 what our runtime refuses)
            print(name, "UNSUPPORTED", str(e).replace("\n", " ")[:300])
            continue
        try:
            stock_ref.save_pjrt(compiled, os.path.join(args.out, name + ".pjrt"))
        except Exception as e:  # noqa: BLE001 (our plugin may not serialize)
            print(name, "serialize:", type(e).__name__, str(e)[:200])
        arrays = {}
        for kind in KINDS:
            x = make_input(kind, dtype, shape, 1000 * ci + KINDS.index(kind))
            val, idx = compiled(x)
            arrays[f"in_{kind}"] = bits(x)
            arrays[f"val_{kind}"] = bits(val)
            arrays[f"idx_{kind}"] = np.asarray(idx)
        np.savez(os.path.join(args.out, name + ".npz"), **arrays)
        if args.time:
            import time
            jax.block_until_ready(compiled(x0))
            t0 = time.perf_counter()
            for _ in range(args.time):
                out = compiled(x0)
            jax.block_until_ready(out)
            print(name, "time %.4f ms per call" % ((time.perf_counter() - t0) * 1e3 / args.time))
        if not args.ref:
            print(name, "ok")
            continue
        ref = np.load(os.path.join(args.ref, name + ".npz"))
        cells = []
        for kind in KINDS:
            same_in = np.array_equal(ref[f"in_{kind}"], arrays[f"in_{kind}"])
            v = np.array_equal(ref[f"val_{kind}"], arrays[f"val_{kind}"])
            i = np.array_equal(ref[f"idx_{kind}"], arrays[f"idx_{kind}"])
            cells.append(f"{kind}: values {'=' if v else 'DIFF'} indices {'=' if i else 'DIFF'}"
                         + ("" if same_in else " (inputs differ!)"))
        print(name, " | ".join(cells))


if __name__ == "__main__":
    main()
