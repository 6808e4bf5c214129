"""A/B: the same serialized llama training executable on stock XLA and on xla-vmm.

Side `stock` (JAX_PLATFORMS=cuda): compile `models.llama_sgd_f32.step_fn` (or a `models.llama`
config) with jax, write the serialized executable (jax.experimental.serialize_executable) and the
inputs, run STEPS training steps, write the loss bits.
Side `vmm` (JAX_PLATFORMS=vmm): load that same executable through the xla-vmm plugin
(PJRT_Executable_DeserializeAndLoad: no recompilation, so autotuning cannot differ), run the
same STEPS steps from the same inputs, and compare the loss bits with the stock side.

    python3 integration/tests/llama_ab.py stock DIR [--name llama_sgd_f32] [--steps 100]
    python3 integration/tests/llama_ab.py vmm DIR   # exits 1 unless every loss matches bit for bit

The stock side runs the loop twice and records whether stock XLA reproduces itself; without
XLA_FLAGS=--xla_gpu_deterministic_ops=true it may not (atomics), and then the vmm side exits 2.
"""
import argparse
import json
import os
import pickle
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def program(name):
    import jax
    import jax.numpy as jnp
    from models import llama, llama_sgd_f32

    if name == "llama_sgd_f32":
        cfg = llama_sgd_f32.cfg
        p0 = llama_sgd_f32.init(jax.random.PRNGKey(0))
        x0 = jax.random.randint(jax.random.PRNGKey(1), (cfg["batch"], cfg["seq"] + 1), 0, cfg["vocab"])
        # params are fed back each step; tokens and lr stay
        return llama_sgd_f32.step_fn, (p0, x0, jnp.float32(1e-2)), (0,)
    make_state, train_step, batch, seq, vocab = llama.build(name)
    x = jax.random.randint(jax.random.PRNGKey(1), (batch, seq + 1), 0, vocab)
    return train_step, (make_state(jax.random.PRNGKey(0)), x), (0,)


def loop(compiled, args, steps, device, fresh_batch=False, stamps=None, after_step=None):
    """Run `steps` steps, state = all outputs but the last (the loss); return (loss bits, ms).
    stamps: a list that gets each step's start (time.monotonic(), seconds), and the end of the last step.
    after_step: called after each step's timer, with the step's number.

    fresh_batch: the inputs that are not state (the batch) are put on the device anew before every
    step, as a training loop puts each step's batch: same values (so losses stay comparable), new
    buffers (so a VA-stable slot rebinds them every step). The put is waited for outside the timer."""
    import jax
    import numpy as np

    cur = jax.device_put(args, device)
    treedef = jax.tree.structure(cur)
    bits, times, host_batch = [], [], None
    for _ in range(steps):
        if stamps is not None:
            stamps.append(time.monotonic())
        t = time.perf_counter()
        res = compiled(*cur)
        leaves = jax.tree.leaves(res)
        loss = leaves[-1].block_until_ready()
        times.append((time.perf_counter() - t) * 1e3)
        bits.append(int(np.asarray(loss, dtype=np.float32).view(np.uint32)))
        if after_step is not None:
            after_step(len(times) - 1)
        n_state = len(leaves) - 1
        batch = jax.tree.leaves(cur)[n_state:]
        if fresh_batch:
            if host_batch is None:
                host_batch = [np.asarray(x) for x in batch]
            batch = jax.block_until_ready([jax.device_put(h, device) for h in host_batch])
        cur = jax.tree.unflatten(treedef, leaves[:n_state] + batch)
    if stamps is not None:
        stamps.append(time.monotonic())
    return bits, times


def deserialize_on(payload, in_tree, out_tree, dev):
    """jax's deserialize_and_load onto the vmm device `dev` only: on a machine with several GPUs jax would
    otherwise deserialize onto all of the backend's devices."""
    import inspect

    from jax.experimental.serialize_executable import deserialize_and_load

    kw = {"execution_devices": [dev]} if "execution_devices" in inspect.signature(deserialize_and_load).parameters else {}
    return deserialize_and_load(payload, in_tree, out_tree, backend="vmm", **kw)


def save_exe(d, name, compiled, args):
    """DIR/NAME.exe.pkl (jax's serialized executable) and DIR/NAME.args.pkl (the inputs, on the host):
    what `load_on_vmm` reads."""
    import jax
    import numpy as np
    from jax.experimental.serialize_executable import serialize

    payload, in_tree, out_tree = serialize(compiled)
    with open(os.path.join(d, name + ".exe.pkl"), "wb") as fh:
        pickle.dump((payload, in_tree, out_tree), fh)
    with open(os.path.join(d, name + ".args.pkl"), "wb") as fh:
        pickle.dump(jax.tree.map(np.asarray, args), fh)


def load_on_vmm(d, name):
    """The executable and inputs `save_exe` wrote, loaded through the xla-vmm plugin (no recompilation):
    (compiled, args, device)."""
    import jax
    from jax_plugins import xla_vmm

    xla_vmm.initialize()
    dev = jax.devices("vmm")[0]
    with open(os.path.join(d, name + ".exe.pkl"), "rb") as fh:
        payload, in_tree, out_tree = pickle.load(fh)
    compiled = deserialize_on(payload, in_tree, out_tree, dev)
    with open(os.path.join(d, name + ".args.pkl"), "rb") as fh:
        args = pickle.load(fh)
    return compiled, args, dev


def stock(d, name, steps):
    import jax
    import numpy as np

    f, args, donate = program(name)
    compiled = jax.jit(f, donate_argnums=donate).lower(*args).compile()
    save_exe(d, name, compiled, args)
    # Host copies: device_put of an array already on the device is the same array, which the
    # first loop's donation would delete before the second loop.
    args = jax.tree.map(np.asarray, args)
    bits, times = loop(compiled, args, steps, jax.devices()[0])
    # Stock XLA must reproduce its own losses, else a bitwise A/B means nothing (executables
    # with atomics differ run to run; compile with XLA_FLAGS=--xla_gpu_deterministic_ops=true).
    again, _ = loop(compiled, args, steps, jax.devices()[0])
    differ = [i for i, (a, b) in enumerate(zip(bits, again)) if a != b]
    json.dump({"loss_bits": bits, "step_ms": times, "stock_differs_at": differ},
              open(os.path.join(d, name + ".stock.json"), "w"))
    print("stock %s: %d steps, median %.3f ms, final loss bits %08x, second stock run %s" %
          (name, steps, sorted(times)[len(times) // 2], bits[-1],
           "identical" if not differ else "differs from step %d" % differ[0]))


def vmm(d, name, steps):
    compiled, args, dev = load_on_vmm(d, name)
    ref = json.load(open(os.path.join(d, name + ".stock.json")))
    if ref.get("stock_differs_at"):
        print("stock XLA does not reproduce its own losses (first difference at step %d): "
              "no bitwise reference; compile with XLA_FLAGS=--xla_gpu_deterministic_ops=true"
              % ref["stock_differs_at"][0])
        return 2
    steps = min(steps, len(ref["loss_bits"]))
    bits, times = loop(compiled, args, steps, dev)
    bad = [i for i, (a, b) in enumerate(zip(bits, ref["loss_bits"])) if a != b]
    med = sorted(times)[len(times) // 2]
    ref_med = sorted(ref["step_ms"])[len(ref["step_ms"]) // 2]
    print("vmm %s: %d steps, median %.3f ms (stock %.3f ms), %d/%d losses bit-identical" %
          (name, steps, med, ref_med, steps - len(bad), steps))
    if bad:
        i = bad[0]
        print("first mismatch at step %d: vmm %08x stock %08x" % (i, bits[i], ref["loss_bits"][i]))
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("side", choices=["stock", "vmm"])
    ap.add_argument("dir")
    ap.add_argument("--name", default="llama_sgd_f32")
    ap.add_argument("--steps", type=int, default=100)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    if a.side == "stock":
        stock(a.dir, a.name, a.steps)
        return 0
    return vmm(a.dir, a.name, a.steps)


if __name__ == "__main__":
    sys.exit(main())
