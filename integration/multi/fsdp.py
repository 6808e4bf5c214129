"""FSDP llama training over a 2-device mesh, on the stock XLA GPU plugin or on xla-vmm.

Every weight (and optimizer slot) is sharded over the mesh on its largest even dimension, the
batch too (the sharding of make_fixtures.py); the step donates its state. Prints one line per step
(`step I loss LOSS_HEX MS ms`), the median step time (steps after the first), the plugin's binding
stats per device (xla-vmm), and as its last line a JSON summary (compare.py reads it).

    python3 fsdp.py --platform vmm|cuda --steps 20 --config llama_small_f32 [--threshold N]

`--platform vmm` registers the plugin like integration/tests/conftest.py: XLA_VMM_LIBRARY names the
plugin library, JAX_PLATFORMS=vmm, XLA_VMM_STRICT=1 unless set, XLA_VMM_TMP_COPY_THRESHOLD from
--threshold, XLA_VMM_EXEC_MODE from --exec-mode (default graph: the thresholds apply there).
dist.py runs the same training with one process per GPU (`run(args, distributed=...)`).
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None, extra=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", choices=("vmm", "cuda"), required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--config", default="llama_small_f32")
    ap.add_argument("--threshold", type=int, default=None,
                    help="xla-vmm: XLA_VMM_TMP_COPY_THRESHOLD (0 remap all, 1 auto, N bytes)")
    ap.add_argument("--exec-mode", default="graph", choices=("graph", "graph-recapture", "eager"),
                    help="xla-vmm: XLA_VMM_EXEC_MODE (default graph)")
    if extra is not None:
        extra(ap)
    return ap.parse_args(argv)


def setup_env(args):
    """Environment for the chosen platform; must run before jax is imported."""
    if args.platform == "vmm":
        os.environ["JAX_PLATFORMS"] = "vmm"
        os.environ.setdefault("XLA_VMM_STRICT", "1")
        if args.threshold is not None:
            os.environ["XLA_VMM_TMP_COPY_THRESHOLD"] = str(args.threshold)
        if args.exec_mode == "eager":
            os.environ.pop("XLA_VMM_EXEC_MODE", None)
        else:
            os.environ["XLA_VMM_EXEC_MODE"] = args.exec_mode
    else:
        os.environ["JAX_PLATFORMS"] = "cuda"
    sys.path.insert(0, os.path.join(HERE, ".."))


def register_plugin(args):
    if args.platform != "vmm":
        return None
    from jax_plugins import xla_vmm

    if xla_vmm.library_path() is None:
        sys.exit("xla-vmm: no plugin library (set XLA_VMM_LIBRARY)")
    xla_vmm.initialize()
    return xla_vmm


def spec_of(shape):
    """make_fixtures.py's FSDP spec: shard the largest even dimension over "d"."""
    from jax.sharding import PartitionSpec as P

    dims = [i for i, n in enumerate(shape) if n % 2 == 0 and n >= 2]
    if not dims:
        return P()
    i = max(dims, key=lambda j: shape[j])
    return P(*([None] * i + ["d"]))


def run(args, distributed=False):
    """Train; returns the summary dict (also printed as the last line)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from models.llama import CONFIGS, make_llama

    devs = jax.devices()
    if len(devs) < 2:
        sys.exit("needs 2 devices, %s has %d: %s" % (args.platform, len(devs), devs))
    mesh = Mesh(np.array(devs[:2]), ("d",))
    vocab, d, heads, kv, layers, ffn, dtype, scan, batch, seq = CONFIGS[args.config]
    make_state, step = make_llama(vocab, d, heads, kv, layers, ffn, dtype, scan)
    key = jax.random.PRNGKey(0)
    shapes = jax.eval_shape(make_state, key)
    st_sh = jax.tree.map(lambda a: NamedSharding(mesh, spec_of(a.shape)), shapes)
    tok_sh = NamedSharding(mesh, P("d"))
    # Made directly in its sharding (works with one process per device too).
    state = jax.jit(make_state, out_shardings=st_sh)(key)
    jf = jax.jit(step, in_shardings=(st_sh, tok_sh), out_shardings=(st_sh, NamedSharding(mesh, P())),
                 donate_argnums=(0,))
    rng = np.random.default_rng(1)
    host_toks = [rng.integers(0, vocab, size=(batch, seq + 1), dtype=np.int32) for _ in range(args.steps)]

    def tokens(i):
        h = host_toks[i]
        return jax.make_array_from_callback(h.shape, tok_sh, lambda idx: h[idx])

    bits, times = [], []
    for i in range(args.steps):
        toks = tokens(i)
        t = time.perf_counter()
        state, loss = jf(state, toks)
        loss = jax.block_until_ready(loss)
        ms = (time.perf_counter() - t) * 1e3
        value = float(np.asarray(loss.addressable_data(0)))
        bits.append(value.hex())
        times.append(ms)
        print("step %d loss %s %.3f ms" % (i, value.hex(), ms), flush=True)
    median = statistics.median(times[1:]) if len(times) > 1 else times[0]
    print("median step %.3f ms (steps 1..%d)" % (median, args.steps - 1), flush=True)
    summary = {
        "platform": args.platform,
        "config": args.config,
        "mode": "dist" if distributed else "single",
        "threshold": args.threshold,
        "exec_mode": args.exec_mode if args.platform == "vmm" else None,
        "process": jax.process_index(),
        "steps": args.steps,
        "loss_bits": bits,
        "step_ms": times,
        "median_ms": median,
        "final_loss": float.fromhex(bits[-1]) if bits else None,
        "devices": [str(x) for x in devs[:2]],
    }
    if args.platform == "vmm":
        from jax_plugins import xla_vmm

        stats = xla_vmm.stats()
        per_device = {}
        for name, s in stats.items():
            per_device.setdefault(str(s.get("device", "?")), {})[name] = s
        for dev, entries in sorted(per_device.items()):
            for name, s in sorted(entries.items()):
                print("stats device %s %s: steps %s remaps %s copies %s bytes_copied %s fallbacks %s"
                      % (dev, name, s.get("steps"), s.get("remaps"), s.get("copies"),
                         s.get("bytes_copied"), s.get("fallbacks")), flush=True)
        summary["stats"] = per_device
    print(json.dumps(summary), flush=True)
    return summary


def main():
    args = parse_args()
    setup_env(args)
    register_plugin(args)
    run(args)


if __name__ == "__main__":
    main()
