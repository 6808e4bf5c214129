"""Multi-device fixtures: compile programs over a 2-device mesh with the stock XLA GPU plugin and save, per
program, NAME.pjrt (PJRT_Executable_Serialize bytes, IFRT header stripped), NAME.hlo.txt (optimized HLO),
NAME.npz (per-device shards: in_<arg>_<dev>, out_<out>_<dev>, where <dev> is the position of the device in the
executable's device assignment) and NAME.json (replicas, partitions, device ids, whether two stock runs agree
bit for bit per output). Usage: python3 make_fixtures.py OUTDIR  (needs >= 2 GPUs)."""
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

try:
    from jax import shard_map
except ImportError:  # older jax
    from jax.experimental.shard_map import shard_map

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from models.llama import CONFIGS, make_llama  # noqa: E402
from stock_ref import pjrt_bytes  # noqa: E402  (strips jax's IFRT header)

jax.config.update("jax_hlo_source_file_canonicalization_regex", r".*/")
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
devs = jax.devices()
assert len(devs) >= 2, "needs 2 GPUs, found %d" % len(devs)
mesh = Mesh(np.array(devs[:2]), ("d",))


def shards(a):
    """Per-device data of a jax.Array, in mesh device order."""
    by_dev = {s.device.id: np.asarray(s.data) for s in a.addressable_shards}
    return [by_dev[d.id] for d in mesh.devices.flat]


def save(name, jf, args, summary):
    c = jf.lower(*args).compile()
    blob = pjrt_bytes(c.runtime_executable().serialize())
    open(os.path.join(out, name + ".pjrt"), "wb").write(blob)
    open(os.path.join(out, name + ".hlo.txt"), "w").write(c.as_text())
    flat_in = jax.tree.leaves(args)
    arrs = {}
    for i, a in enumerate(flat_in):
        for k, s in enumerate(shards(a)):
            arrs["in_%d_%d" % (i, k)] = s
    host_in = [[np.asarray(s) for s in shards(a)] for a in flat_in]
    r1 = jax.tree.leaves(jf(*args))
    r1 = [shards(o) for o in r1]
    r2 = [shards(o) for o in jax.tree.leaves(jf(*args))]
    for i, per in enumerate(r1):
        for k, s in enumerate(per):
            arrs["out_%d_%d" % (i, k)] = s
    np.savez(os.path.join(out, name + ".npz"), **arrs)
    stable = [all(np.array_equal(np.atleast_1d(a).view(np.uint8), np.atleast_1d(b).view(np.uint8)) for a, b in zip(x, y)) for x, y in zip(r1, r2)]
    meta = dict(devices=[d.id for d in mesh.devices.flat], n_in=len(flat_in), n_out=len(r1), bytes=len(blob),
                stock_deterministic_outputs=stable)
    json.dump(meta, open(os.path.join(out, name + ".json"), "w"), indent=1)
    summary[name] = meta
    print(name, meta["bytes"], "bytes,", meta["n_in"], "in,", meta["n_out"], "out, stable:", all(stable), flush=True)
    del host_in


summary = {}
x = jax.device_put(jnp.arange(2 * 1024, dtype=jnp.float32).reshape(2, 1024) / 7.0, NamedSharding(mesh, P("d")))
xb = jax.device_put(x.astype(jnp.bfloat16), NamedSharding(mesh, P("d")))
sm = lambda f, o=P("d"): jax.jit(shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=o))
save("coll_all_reduce", sm(lambda v: jax.lax.psum(v * 3.0, "d") + 1.0), (x,), summary)
save("coll_all_reduce_bf16", sm(lambda v: jax.lax.psum(v, "d")), (xb,), summary)
save("coll_all_gather", sm(lambda v: jax.lax.all_gather(v + 1.0, "d", tiled=True)), (x,), summary)
save("coll_reduce_scatter", sm(lambda v: jax.lax.psum_scatter(v * 2.0, "d", scatter_dimension=1, tiled=True)), (x,), summary)
save("coll_permute", sm(lambda v: jax.lax.ppermute(v + 2.0, "d", perm=[(0, 1), (1, 0)])), (x,), summary)
save("coll_all_to_all", sm(lambda v: jax.lax.all_to_all(v.reshape(2, 512) * 1.5, "d", 0, 0, tiled=True)), (x,), summary)
save("coll_partition_id", sm(lambda v: v + jax.lax.axis_index("d").astype(jnp.float32)), (x,), summary)

# FSDP llama: every weight sharded over the mesh on its largest divisible dimension, batch sharded too.
for cfg in ("llama_scan_bf16", "llama_small_f32"):
    vocab, d, heads, kv, layers, ffn, dtype, scan, batch, seq = CONFIGS[cfg]
    make_state, step = make_llama(vocab, d, heads, kv, layers, ffn, dtype, scan)
    state = make_state(jax.random.PRNGKey(0))

    def spec(a):
        dims = [i for i, n in enumerate(a.shape) if n % 2 == 0 and n >= 2]
        if not dims:
            return P()
        i = max(dims, key=lambda j: a.shape[j])
        return P(*([None] * i + ["d"]))
    st_sh = jax.tree.map(lambda a: NamedSharding(mesh, spec(a)), state)
    state = jax.device_put(state, st_sh)
    toks = jax.device_put(jax.random.randint(jax.random.PRNGKey(1), (batch, seq + 1), 0, vocab), NamedSharding(mesh, P("d")))
    jf = jax.jit(step, in_shardings=(st_sh, NamedSharding(mesh, P("d"))), out_shardings=(st_sh, NamedSharding(mesh, P())))
    save("fsdp_" + cfg, jf, (state, toks), summary)

json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
