"""Reference runs on stock XLA, for comparing xla-vmm bit for bit on the *same* serialized executable.

For each program: compile with stock jax, write NAME.pjrt (the PJRT_Executable_Serialize bytes: the
IFRT header jax adds is stripped), run one step (NAME.npz: in_i / out_i), then run a training loop of
--steps steps with the state fed back (NAME.loop.json: losses, step times, the output->input feedback
map). Autotuning differs between compiles, so numerics are only comparable on these exact bytes.

Usage (on the GPU machine): python3 integration/stock_ref.py --out DIR [--steps 50] NAME...
NAME: llama_sgd_f32 | llama_scan_bf16 | llama_small_f32 | llama_110m_bf16 | maxtext_tiny_bf16
"""
import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import llama, llama_sgd_f32  # noqa: E402

jax.config.update("jax_hlo_source_file_canonicalization_regex", r".*/")
RIEGELI_SIGNATURE = bytes([0x83, 0xAF, 0x70, 0xD1])


def pjrt_bytes(blob):
    """Strip the IFRT header (a varint length and that many bytes) jax puts before the PJRT bytes."""
    n, shift, p = 0, 0, 0
    while True:
        b = blob[p]
        n |= (b & 0x7F) << shift
        p += 1
        shift += 7
        if b < 0x80:
            break
    if blob[p + n:p + n + 4] != RIEGELI_SIGNATURE:
        raise ValueError("no riegeli signature after the IFRT header")
    return blob[p + n:]


def save_pjrt(compiled, path):
    """Write a jax compiled executable's PJRT bytes (`xla-vmm inspect` reads them) to `path`."""
    with open(path, "wb") as fh:
        fh.write(pjrt_bytes(compiled.runtime_executable().serialize()))


def program(name):
    """(step_fn, args, donate_argnums, make_next_args) for a named program."""
    if name == "llama_sgd_f32":
        cfg = llama_sgd_f32.cfg
        p0 = llama_sgd_f32.init(jax.random.PRNGKey(0))
        x0 = jax.random.randint(jax.random.PRNGKey(1), (cfg["batch"], cfg["seq"] + 1), 0, cfg["vocab"])
        args = (p0, x0, jnp.float32(1e-2))
        return llama_sgd_f32.step_fn, args, ()
    make_state, train_step, batch, seq, vocab = llama.build(name)
    if name == "llama_scan_bf16":  # the fixture's inputs
        x = jax.random.randint(jax.random.PRNGKey(0), (batch, seq + 1), 0, vocab)
    else:
        x = jax.random.randint(jax.random.PRNGKey(1), (batch, seq + 1), 0, vocab)
    return train_step, (make_state(jax.random.PRNGKey(0)), x), (0,)


def run(name, out, steps):
    f, args, donate = program(name)
    compiled = jax.jit(f, donate_argnums=donate).lower(*args).compile()
    save_pjrt(compiled, os.path.join(out, name + ".pjrt"))
    flat_in = [np.asarray(a) for a in jax.tree.leaves(args)]
    n_in = len(flat_in)
    # donation consumes the arguments: run on copies
    res = compiled(*jax.tree.map(jnp.copy, args))
    flat_out = [np.asarray(a) for a in jax.tree.leaves(res)]
    # run-to-run determinism of stock XLA itself on this executable: outputs written with atomics
    # (e.g. scatter-add with duplicate indices) differ between two identical runs
    res2 = compiled(*jax.tree.map(jnp.copy, args))
    nondet = [i for i, (a, b) in enumerate(zip(flat_out, jax.tree.leaves(res2)))
              if a.tobytes() != np.asarray(b).tobytes()]
    np.savez(os.path.join(out, name + ".npz"), **{"in_%d" % i: a for i, a in enumerate(flat_in)},
             **{"out_%d" % i: a for i, a in enumerate(flat_out)})
    # training loop: every output but the last (the loss) is the next step's state
    n_state = len(flat_out) - 1
    feedback = [[i, i] for i in range(n_state)]
    cur = jax.tree.map(jnp.copy, args)
    treedef = jax.tree.structure(args)
    losses, times = [], []
    for _ in range(steps):
        t = time.perf_counter()
        res = compiled(*cur)
        loss = jax.tree.leaves(res)[-1]
        loss.block_until_ready()
        times.append((time.perf_counter() - t) * 1e3)
        losses.append(float(loss))
        leaves = jax.tree.leaves(res)[:n_state] + jax.tree.leaves(cur)[n_state:]
        cur = jax.tree.unflatten(treedef, leaves)
    # exact loss bits, so comparisons are bit for bit
    loss_bits = [np.float32(v).view(np.uint32).item() for v in losses]
    med = sorted(times[3:])[len(times[3:]) // 2] if len(times) > 3 else float("nan")
    json.dump({"name": name, "steps": steps, "stock_nondeterministic_outputs": nondet, "inputs": n_in, "outputs": len(flat_out), "feedback": feedback,
               "losses": losses, "loss_bits": loss_bits, "step_ms": times, "median_step_ms": med,
               "xla_flags": os.environ.get("XLA_FLAGS", "")},
              open(os.path.join(out, name + ".loop.json"), "w"), indent=1)
    print("stock %-18s %d inputs %d outputs  %d steps  median %.3f ms  final loss %.6f  "
          "outputs differing between two stock runs: %s" %
          (name, n_in, len(flat_out), steps, med, losses[-1] if losses else float("nan"), nondet or "none"),
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("names", nargs="+")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name in a.names:
        run(name, a.out, a.steps)


if __name__ == "__main__":
    main()
