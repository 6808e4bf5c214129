"""Step time of host-offloaded compute (`compute_on("device_host")`) on stock XLA and on xla-vmm, in
the same call (GPU machine). A benchmark, not a test: it prints one Markdown table.

    python3 integration/host_compute_bench.py [--steps 50] [--out FILE.md]

Each platform runs in its own process (stock: JAX_PLATFORMS=cuda; vmm: the plugin, XLA_VMM_LIBRARY or
the installed package, XLA_VMM_STRICT=1 so that nothing runs on the vendor fallback). Per program:
compile, 5 warm-up steps, then --steps steps, each waited for (`block_until_ready`); the median wall
time per step. The outputs of the two platforms' last steps are compared bit for bit.
"""
import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, {integration!r})
import numpy as np, jax, jax.numpy as jnp
from jax.experimental.compute_on import compute_on
if {vmm!r}:
    from jax_plugins import xla_vmm
    xla_vmm.initialize()
    dev = jax.devices("vmm")[0]
else:
    dev = jax.devices("cuda")[0]

DEV = jax.memory.Space.Device
host = lambda f: compute_on(compute_type="device_host", out_memory_spaces=DEV)(f)

def scan(c, xs):
    return jax.lax.scan(lambda c, x: (host(lambda c, v: c + v * 2)(c, x), None), c, xs)[0]

r = np.random.default_rng(0)
programs = [
    ("elementwise f32[1024]", lambda x: host(lambda v: v * 2)(x) * 3, (r.standard_normal(1024, np.float32),)),
    ("sin f32[512,512] (1 MiB)", lambda x: host(jnp.sin)(x) + 1, (r.standard_normal((512, 512), np.float32),)),
    ("scan of 16 host calls s32[16,16]", scan,
     (np.zeros((16, 16), np.int32), np.arange(16 ** 3, dtype=np.int32).reshape(16, 16, 16))),
]
rows = []
for name, f, args in programs:
    args = [jax.device_put(a, dev) for a in args]
    g = jax.jit(f)
    for _ in range(5):
        out = g(*args).block_until_ready()
    times = []
    for _ in range({steps}):
        t = time.perf_counter()
        out = g(*args).block_until_ready()
        times.append(time.perf_counter() - t)
    rows.append(dict(name=name, ms=1e3 * float(np.median(times)), out=np.asarray(out).tobytes().hex()))
print("RESULT " + json.dumps(rows))
"""


def child(vmm, steps):
    env = dict(os.environ)
    if vmm:
        env["XLA_VMM_STRICT"] = "1"
    else:
        env.update(JAX_PLATFORMS="cuda", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    code = CHILD.format(integration=os.path.dirname(os.path.abspath(__file__)), vmm=vmm, steps=steps)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit(f"{'vmm' if vmm else 'stock'} child failed (rc {r.returncode}):\n{r.stderr[-3000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--out")
    a = ap.parse_args()
    stock, ours = child(False, a.steps), child(True, a.steps)
    lines = [f"host-offloaded compute, median of {a.steps} waited steps", "",
             "| program | stock ms/step | xla-vmm ms/step | xla-vmm vs stock | outputs |", "|---|---|---|---|---|"]
    for s, o in zip(stock, ours):
        same = "bit-identical" if s["out"] == o["out"] else "DIFFER"
        lines.append(f"| {s['name']} | {s['ms']:.3f} | {o['ms']:.3f} | {s['ms'] / o['ms']:.2f}x | {same} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
