"""Serialized executables of host-offloaded compute (`compute_on("device_host")`), compiled by stock
JAX on the GPU machine, for reading their `host_execute_start` thunks here (a diagnostic, not a test;
issue 12). For each case: NAME.pjrt (the PJRT executable bytes, as integration/stock_ref.py writes
them), NAME.npz (in_i / out_i of one stock run) and NAME.hlo.txt (the optimized HLO).

Usage (GPU machine): python3 integration/diag/host_compute_dump.py OUT_DIR
Then here: xla-vmm inspect OUT_DIR/NAME.pjrt
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.compute_on import compute_on

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import stock_ref  # noqa: E402

DEV = jax.memory.Space.Device
HOST = jax.memory.Space.Host


def cases():
    """(name, function, args): the single-device shapes of JAX's memories_test ComputeOffload."""
    @compute_on(compute_type="device_host", out_memory_spaces=DEV)
    def times2(x):
        return x * 2

    @compute_on(compute_type="device_host", out_memory_spaces=DEV)
    def total(x):
        return jnp.sum(x)

    @compute_on(compute_type="device_host", out_memory_spaces=(DEV, DEV))
    def pair(x, y):
        return x * x, y + y

    def scan_body(carry, x):
        @compute_on(compute_type="device_host", out_memory_spaces=DEV)
        def h(c, v):
            return c + v * 2
        return h(carry, x), None

    @compute_on(compute_type="device_host", out_memory_spaces=DEV)
    def twice4(x):
        return x + x

    i8 = jnp.arange(8, dtype=jnp.int32)
    yield "basic_i32", lambda x: times2(x) * 3, (i8,)
    yield "twod_f32", lambda x: times2(x) * 3, (jnp.linspace(0, 1, 61 * 163, dtype=jnp.float32).reshape(61, 163),)
    yield "reduce_i32", lambda x: total(x) + 1, (i8,)
    yield "pair_f32", lambda x, y: pair(x, y), (jnp.arange(1024, dtype=jnp.float32),) * 2
    yield "scan_i32", lambda c, xs: jax.lax.scan(scan_body, c, xs)[0], (
        jnp.zeros((16, 16), jnp.int32), jnp.arange(16 * 16 * 16, dtype=jnp.int32).reshape(16, 16, 16))
    yield "u4", lambda x: twice4(x), (jnp.array([0, 1, 2, 3], dtype=jnp.uint4),)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, f, args in cases():
        try:
            compiled = jax.jit(f).lower(*args).compile()
            stock_ref.save_pjrt(compiled, os.path.join(out, name + ".pjrt"))
            with open(os.path.join(out, name + ".hlo.txt"), "w") as fh:
                fh.write(compiled.as_text())
            res = jax.tree.leaves(compiled(*args))
            arrays = {f"in_{i}": np.asarray(a) for i, a in enumerate(args)}
            arrays.update({f"out_{i}": np.asarray(r) for i, r in enumerate(res)})
            if name != "u4":  # npz has no uint4
                np.savez(os.path.join(out, name + ".npz"), **arrays)
            print(name, "ok", [r.dtype for r in res])
        except Exception as e:  # noqa: BLE001
            print(name, "FAILED", type(e).__name__, str(e)[:400])


if __name__ == "__main__":
    main()
