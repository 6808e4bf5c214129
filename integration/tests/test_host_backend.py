"""jaxlib <-> plugin interplay without a GPU: the plugin on its host backend (XLA_VMM_BACKEND=host).

Client creation, devices and attributes, memory stats, buffer round trips for every dtype,
strided host arrays, deletion, copies to the CPU backend, and a compile that fails cleanly
when no vendor compiler is installed. Runs in a subprocess (the backend is chosen at client
creation). Works with any jax >= 0.10 and the plugin library (XLA_VMM_LIBRARY).
"""
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, %r)
    import numpy as np, jax, jax.numpy as jnp
    from jax_plugins import xla_vmm
    xla_vmm.initialize()
    d = jax.devices("vmm")[0]
    assert str(d) == "cuda:0" and repr(d) == "CudaDevice(id=0)", (str(d), repr(d))
    assert d.client.platform in ("cuda", "gpu")
    dtypes = [np.float32, np.float16, jnp.bfloat16, np.int8, np.int16, np.int32, np.uint8,
              np.uint32, np.bool_, np.complex64]
    for dt in dtypes:
        x = (np.arange(24).reshape(2, 3, 4) %% 5).astype(dt)
        y = jax.device_put(x, d)
        assert y.dtype == x.dtype and y.shape == x.shape
        np.testing.assert_array_equal(np.asarray(y), x)
    xt = np.arange(12, dtype=np.float32).reshape(3, 4).T
    np.testing.assert_array_equal(np.asarray(jax.device_put(xt, d)), xt)
    stats = d.memory_stats()
    assert stats["num_allocs"] >= 1 and stats["bytes_in_use"] > 0, stats
    z = jax.device_put(np.ones(4, np.float32), d)
    np.testing.assert_array_equal(np.asarray(jax.device_put(z, jax.devices("cpu")[0])), np.ones(4))
    z.delete()
    try:
        np.asarray(z)
        raise SystemExit("read of a deleted array succeeded")
    except RuntimeError as e:
        assert "deleted" in str(e), e
    try:
        jax.jit(lambda v: v + 1)(jax.device_put(np.ones(2, np.float32), d))
        print("compiled (a vendor compiler is installed)")
    except Exception as e:
        assert "vendor" in str(e) or "decod" in str(e) or "runtime" in str(e), e
        print("compile error:", str(e)[:120])
    print("HOST-BACKEND-OK")
""") % os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def test_jaxlib_drives_the_plugin_on_the_host_backend():
    env = dict(os.environ, XLA_VMM_BACKEND="host", JAX_PLATFORMS="vmm,cpu")
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "HOST-BACKEND-OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
