"""JAX programs on the xla-vmm plugin (`vmm`), checked against jax's CPU backend.

Covers issue 5's list: elementwise, matmul, reductions, scan, while, cond/switch,
dynamic_update_slice, rng, bf16/f16/int types, donation, pytrees, multiple outputs,
block_until_ready, and errors (deleted buffer, donated-then-reused, shape mismatch,
unsupported op) that must be Python exceptions with the process still alive.
"""
import contextlib
import functools
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

VMM = jax.devices("vmm")[0]
CPU = jax.devices("cpu")[0]


def on(dev, tree):
    return jax.tree.map(lambda x: jax.device_put(x, dev), tree)


def check(f, *args, rtol=1e-5, atol=1e-5, exact=False):
    """Run jit(f) on vmm and cpu with the same inputs; compare; return the vmm result."""
    got = jax.jit(f)(*on(VMM, args))
    want = jax.jit(f)(*on(CPU, args))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.devices() == {VMM}, "result not on the vmm device"
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        if exact:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)
    return got


@contextlib.contextmanager
def x64(enable=True):
    """64-bit types need jax_enable_x64 (off by default)."""
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", bool(enable) or old)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", old)


def rand(shape, dtype=np.float32, seed=0):
    r = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return r.integers(-50, 50, size=shape).astype(dtype)
    return r.standard_normal(shape).astype(dtype)


def test_platform_and_device():
    # The client reports platform "cuda" (JAX applies GPU lowering); JAX shows it as "gpu".
    assert VMM.client.platform in ("cuda", "gpu")
    assert VMM.platform in ("cuda", "gpu")
    devs = jax.devices("vmm")
    assert devs[0] == VMM
    # One device per visible GPU, numbered 0..n-1, all in this process.
    assert [d.id for d in devs] == list(range(len(devs)))
    assert all(d.process_index == 0 for d in devs)


@pytest.mark.parametrize(
    "dtype",
    [np.float32, np.float16, jnp.bfloat16, np.float64, np.int8, np.int16, np.int32, np.int64,
     np.uint8, np.uint16, np.uint32, np.uint64, np.bool_, np.complex64],
)
def test_round_trip_dtypes(dtype):
    x = (rand((3, 5), np.float32) > 0) if dtype == np.bool_ else (rand((3, 5), np.float32) * 10).astype(dtype)
    with x64(np.dtype(dtype).itemsize == 8 or dtype == np.complex64):
        y = jax.device_put(x, VMM)
        assert y.dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(y), x)
        # and through a program
        z = jax.jit(lambda v: v)(y)
        np.testing.assert_array_equal(np.asarray(z), x)


def test_elementwise():
    check(lambda a, b: jnp.tanh(a) * b + jnp.exp(-a * a), rand((64, 33)), rand((64, 33), seed=1))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, jnp.bfloat16])
def test_matmul(dtype):
    a, b = rand((128, 64)).astype(dtype), rand((64, 96), seed=1).astype(dtype)
    if dtype == np.float32:
        # JAX's default precision lets XLA GPU use TF32 for f32 dots (errors ~1e-3, stock XLA
        # too); "highest" asks for true f32, comparable with the CPU at 1e-4.
        with jax.default_matmul_precision("highest"):
            check(lambda a, b: a @ b, a, b, rtol=1e-4, atol=1e-4)
        check(lambda a, b: a @ b, a, b, rtol=2e-2, atol=2e-2)
    else:
        check(lambda a, b: a @ b, a, b, rtol=5e-2, atol=5e-2)


def test_int_ops():
    check(lambda a, b: (a * b + 3) // 2 - jnp.abs(a), rand((40,), np.int32), rand((40,), np.int32, 1), exact=True)
    check(lambda a: jnp.cumsum(a.astype(jnp.int32)), rand((33,), np.int8), exact=True)
    check(lambda a, b: (a & b, a | b, a ^ b, a >> 2), rand((16,), np.uint32), rand((16,), np.uint32, 2), exact=True)
    with x64():
        check(lambda a: jnp.cumsum(a.astype(jnp.int64)) * 3_000_000_000, rand((33,), np.int8), exact=True)


def test_reductions():
    x = rand((17, 300))
    check(lambda x: (x.sum(0), x.max(1), jnp.mean(x), jnp.argmax(x, axis=1)), x, rtol=1e-4, atol=1e-4)


def test_scan():
    def f(xs):
        def body(c, x):
            c = c * 0.9 + x
            return c, c.sum()
        return jax.lax.scan(body, jnp.zeros(xs.shape[1:]), xs)
    check(f, rand((20, 8, 8)), rtol=1e-4, atol=1e-4)


def test_while_loop():
    def f(x):
        return jax.lax.while_loop(lambda s: s[0] < 37, lambda s: (s[0] + 1, s[1] * 1.01 + 1.0), (0, x))
    check(f, rand((16,)), rtol=1e-4)


def test_cond_and_switch():
    def f(p, i, x):
        y = jax.lax.cond(p, lambda x: x * 2.0, lambda x: x - 1.0, x)
        return jax.lax.switch(i, [jnp.sin, jnp.cos, lambda x: x * x], y)
    for p in (True, False):
        for i in (0, 1, 2):
            check(f, np.bool_(p), np.int32(i), rand((10,)))


def test_dynamic_update_slice():
    f = lambda a, u, i: jax.lax.dynamic_update_slice(a, u, (i, 2))
    check(f, rand((10, 10)), rand((3, 4), seed=1), np.int32(5), exact=True)


def test_rng():
    got = check(lambda k: jax.random.normal(k, (1000,)), jax.random.key_data(jax.random.key(0)), rtol=1e-6)
    assert abs(float(np.asarray(got).std()) - 1.0) < 0.1


def test_pytrees_and_multiple_outputs():
    params = {"w": rand((8, 4)), "b": [rand((4,), seed=1), (rand((), seed=2),)]}
    out = check(lambda p, x: {"y": x @ p["w"] + p["b"][0], "s": p["b"][1][0] * 2, "n": jnp.sum(x)}, params, rand((3, 8)))
    assert set(out) == {"y", "s", "n"}


def test_block_until_ready():
    x = jax.device_put(rand((256, 256)), VMM)
    y = jax.jit(lambda x: x @ x)(x).block_until_ready()
    assert y.is_fully_addressable and y.shape == (256, 256)


def test_donation():
    f = jax.jit(lambda x: x * 2.0 + 1.0, donate_argnums=0)
    x = jax.device_put(rand((1024,)), VMM)
    ref = np.asarray(x) * 2.0 + 1.0
    y = f(x)
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-6)
    assert x.is_deleted()
    with pytest.raises(Exception, match="(?i)delete|donat"):
        np.asarray(x)
    # The process keeps working.
    np.testing.assert_allclose(np.asarray(f(y)), ref * 2.0 + 1.0, rtol=1e-6)


def test_deleted_buffer_error():
    x = jax.device_put(rand((4,)), VMM)
    x.delete()
    with pytest.raises(Exception, match="(?i)delete"):
        jax.jit(lambda x: x + 1)(x)
    with pytest.raises(Exception, match="(?i)delete"):
        np.asarray(x)
    assert float(jax.jit(lambda v: v + 1)(jax.device_put(np.float32(1), VMM))) == 2.0


def test_shape_mismatch_error():
    f = jax.jit(lambda a, b: a @ b)
    with pytest.raises(Exception):
        f(jax.device_put(rand((3, 4)), VMM), jax.device_put(rand((5, 6)), VMM))
    assert np.asarray(f(*on(VMM, (rand((3, 4)), rand((4, 2)))))).shape == (3, 2)


def test_device_put_to_and_from_pinned_host_inside_jit():
    """Host offload inside a program (XLA's device-to-host and host-to-device copy thunks) runs on our
    runtime (the suite is strict: a vendor fallback would be an error), in every mode, and the result
    lands in the memory kind the program names."""
    from jax.sharding import SingleDeviceSharding

    dev = SingleDeviceSharding(VMM)
    host = SingleDeviceSharding(VMM, memory_kind="pinned_host")
    want = np.arange(256, dtype=np.float32)
    x = jax.device_put(want, VMM)
    y = jax.jit(lambda v: jax.device_put(v * 2.0, host))(x)
    assert y.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(np.asarray(y), want * 2)
    for _ in range(3):  # repeated: VA-stable binds the host argument each step
        z = jax.jit(lambda v: jax.device_put(v, dev) + 1.0)(y)
        assert z.sharding.memory_kind == "device"
        np.testing.assert_array_equal(np.asarray(z), want * 2 + 1)


def test_host_callbacks_run_on_our_runtime():
    """pure_callback, io_callback (ordered: tokens) and a callback inside a while loop run on our
    runtime through jaxlib's FFI handler (the suite is strict: a vendor fallback would be an error),
    with the callbacks' results, in order."""
    from jax.experimental import io_callback

    x = jax.device_put(np.arange(8, dtype=np.float32), VMM)
    f = jax.jit(lambda v: jax.pure_callback(lambda a: np.asarray(a) * 2 + 1,
                                            jax.ShapeDtypeStruct(v.shape, v.dtype), v) - 1)
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(f(x)), np.arange(8, dtype=np.float32) * 2)
    seen = []

    def record(a):
        seen.append(np.asarray(a).copy())
        return np.asarray(a).sum(dtype=np.float32)

    g = jax.jit(lambda v: io_callback(record, jax.ShapeDtypeStruct((), np.float32), v, ordered=True) * 2)
    assert float(g(x)) == 56.0
    assert float(g(x + 1)) == 72.0
    assert len(seen) == 2 and seen[1][0] == 1.0

    def body(c):
        i, acc = c
        step = jax.pure_callback(lambda a: np.float32(a + 1), jax.ShapeDtypeStruct((), np.float32), acc)
        return i + 1, step

    h = jax.jit(lambda n: jax.lax.while_loop(lambda c: c[0] < n, body, (0, np.float32(0)))[1])
    assert float(h(jax.device_put(np.int32(5), VMM))) == 5.0


def test_a_raising_callback_is_a_python_error_and_the_process_lives():
    def boom(a):
        raise ValueError("callback says no")

    f = jax.jit(lambda v: jax.pure_callback(boom, jax.ShapeDtypeStruct(v.shape, v.dtype), v))
    with pytest.raises(Exception, match="callback says no"):
        np.asarray(f(jax.device_put(rand((4,)), VMM)))
    assert float(jax.jit(lambda v: v * 3)(jax.device_put(np.float32(2), VMM))) == 6.0


def test_debug_print_runs_on_our_runtime(capfd):
    f = jax.jit(lambda v: (jax.debug.print("xla-vmm sees {}", v.sum()), v * 2)[1])
    np.testing.assert_array_equal(np.asarray(f(jax.device_put(np.ones(4, np.float32), VMM))),
                                  np.full(4, 2, np.float32))
    jax.effects_barrier()
    assert "xla-vmm sees 4.0" in capfd.readouterr().out


def test_cusolver_custom_calls_run_on_our_runtime():
    """LU and QR: jaxlib's cuSOLVER typed-FFI handlers with their workspaces
    (XLA_FFI_DeviceMemory_Allocate) on our runtime (strict), matching LAPACK on the CPU."""
    a = rand((16, 16), seed=5) + 4 * np.eye(16, dtype=np.float32)
    lu_v, piv_v = jax.jit(jax.scipy.linalg.lu_factor)(jax.device_put(a, VMM))
    lu_c, piv_c = jax.jit(jax.scipy.linalg.lu_factor)(jax.device_put(a, CPU))
    np.testing.assert_array_equal(np.asarray(piv_v), np.asarray(piv_c))
    np.testing.assert_allclose(np.asarray(lu_v), np.asarray(lu_c), rtol=1e-4, atol=1e-5)
    q, r = jax.jit(jnp.linalg.qr)(jax.device_put(a, VMM))
    np.testing.assert_allclose(np.asarray(q) @ np.asarray(r), a, rtol=1e-4, atol=1e-4)


# Triangular solves of every kind the cuBLAS thunk takes: one matrix and batches, left and right
# side, lower and upper, transposed and adjoint, unit diagonal; f32, f64, c64, c128. `run(dev)`
# returns each case's result as a numpy array.
TRSM_CASES = """
import numpy as np, jax
from jax import lax
jax.config.update("jax_enable_x64", True)

def cases():
    r = np.random.default_rng(11)
    def mat(shape, dtype, diag=0.0):
        v = r.standard_normal(shape)
        if np.issubdtype(dtype, np.complexfloating):
            v = v + 1j * r.standard_normal(shape)
        if diag:
            v = v + diag * np.eye(shape[-1])
        return v.astype(dtype)
    f32, f64, c64, c128 = np.float32, np.float64, np.complex64, np.complex128
    # (a, b, left_side, lower, transpose_a, conjugate_a, unit_diagonal)
    return [
        (mat((8, 8), f32, 32), mat((8, 3), f32), True, True, False, False, False),
        (mat((4, 8, 8), f32, 32), mat((4, 8, 3), f32), True, False, True, False, False),
        (mat((2, 3, 6, 6), f64, 24), mat((2, 3, 5, 6), f64), False, True, False, False, True),
        (mat((5, 5), c64, 20), mat((5, 2), c64), True, True, True, True, False),
        (mat((3, 7, 7), c128, 28), mat((3, 4, 7), c128), False, False, True, False, False),
    ]

def run(dev):
    out = []
    for a, b, left, lower, trans, conj, unit in cases():
        f = jax.jit(lambda a, b: lax.linalg.triangular_solve(
            a, b, left_side=left, lower=lower, transpose_a=trans, conjugate_a=conj,
            unit_diagonal=unit))
        out.append(np.asarray(f(jax.device_put(a, dev), jax.device_put(b, dev))))
    return out
"""


def stock_results(cases_code, tmp_path):
    """`run(dev)` of `cases_code` on stock XLA (a child process with JAX_PLATFORMS=cuda, the same GPU):
    its results as an npz (`arr_0`, `arr_1`, ...)."""
    stock = tmp_path / "stock.npz"
    r = subprocess.run(
        [sys.executable, "-c", cases_code + "\nnp.savez(%r, *run(jax.devices('cuda')[0]))\n" % str(stock)],
        env=dict(os.environ, JAX_PLATFORMS="cuda", XLA_PYTHON_CLIENT_PREALLOCATE="false"),
        capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    return np.load(stock)


def test_triangular_solves_run_on_our_runtime_bit_identical_to_stock(tmp_path):
    """XLA's triangular-solve thunk (cuBLAS trsm, and trsmBatched over the pointer arrays our runtime
    writes) on our runtime (strict: no vendor fallback), every result bit-identical to stock XLA's on
    the same GPU (a child process with JAX_PLATFORMS=cuda) and solving the system."""
    want = stock_results(TRSM_CASES, tmp_path)
    ns = {}
    with x64():
        exec(TRSM_CASES, ns)
        got = ns["run"](VMM)
        cases = ns["cases"]()
    for i, (g, (a, b, left, lower, trans, conj, unit)) in enumerate(zip(got, cases)):
        w = want["arr_%d" % i]
        assert g.dtype == w.dtype and g.shape == w.shape, i
        assert g.tobytes() == w.tobytes(), "case %d differs from stock XLA" % i
        # And it solves op(a) x = b (or x op(a) = b).
        t = np.tril(a) if lower else np.triu(a)
        if unit:
            t = t - np.diagonal(t, axis1=-2, axis2=-1)[..., None] * np.eye(a.shape[-1]) + np.eye(a.shape[-1])
        if trans:
            t = np.swapaxes(t, -1, -2)
        if conj:
            t = np.conj(t)
        lhs = t @ g if left else g @ t
        np.testing.assert_allclose(lhs, b, rtol=1e-3, atol=1e-3, err_msg="case %d" % i)


# FFTs of every kind (complex forward and inverse, real forward and inverse) at ranks 1 to 3, single
# and batched, in single and double precision: XLA's FFT thunk (cuFFT). The multi-dimensional inverse
# real ones are the three cases JAX's fft, scipy.signal tests found failing on our runtime (cuFFT's exec
# returned CUFFT_EXEC_FAILED). `run(dev)` returns each case's result as a numpy array.
FFT_CASES = """
import numpy as np, jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)

def cases():
    r = np.random.default_rng(7)
    c = lambda *s, t=np.complex64: (r.standard_normal(s) + 1j * r.standard_normal(s)).astype(t)
    f = lambda *s, t=np.float32: r.standard_normal(s).astype(t)
    return [
        ("fft", jnp.fft.fft, c(4, 16)),
        ("ifft", jnp.fft.ifft, c(3, 10)),
        ("rfft", jnp.fft.rfft, f(3, 32)),
        ("irfft", lambda x: jnp.fft.irfft(x, n=32), c(3, 17)),
        ("fft2", jnp.fft.fft2, c(2, 8, 8)),
        ("rfft2", jnp.fft.rfft2, f(4, 6)),
        ("irfft2_2x2", jnp.fft.irfft2, c(2, 2)),
        ("irfft2_4x6", lambda x: jnp.fft.irfft2(x, s=(4, 6)), c(4, 4)),
        ("irfft2_batched", lambda x: jnp.fft.irfft2(x, s=(8, 14)), c(16, 4, 8, 8)),
        ("rfftn_3d", jnp.fft.rfftn, f(2, 4, 6, 5)),
        ("irfftn_3d", lambda x: jnp.fft.irfftn(x, s=(4, 6, 8), axes=(1, 2, 3)), c(2, 4, 6, 5)),
        ("ifftn_3d_f64", jnp.fft.ifftn, c(4, 6, 8, t=np.complex128)),
        ("irfft2_f64", lambda x: jnp.fft.irfft2(x, s=(6, 10)), c(3, 6, 6, t=np.complex128)),
    ]

def run(dev):
    return [np.asarray(jax.jit(fn)(jax.device_put(x, dev))) for _, fn, x in cases()]
"""


def test_ffts_run_on_our_runtime_bit_identical_to_stock(tmp_path):
    """XLA's FFT thunk on our runtime (strict: no vendor fallback), every kind at ranks 1 to 3: each
    result bit-identical to stock XLA's on the same GPU (cuFFT is deterministic for a given plan) and
    close to jax's CPU backend's."""
    want = stock_results(FFT_CASES, tmp_path)
    ns = {}
    with x64():
        exec(FFT_CASES, ns)
        cases = ns["cases"]()
        failed = {}
        for i, (name, fn, x) in enumerate(cases):
            try:
                got = np.asarray(jax.jit(fn)(jax.device_put(x, VMM)))
            except Exception as e:  # noqa: BLE001 - every case is tried, the failures listed together
                failed[name] = str(e)[:300]
                continue
            w = want["arr_%d" % i]
            assert got.dtype == w.dtype and got.shape == w.shape, name
            assert got.tobytes() == w.tobytes(), "%s differs from stock XLA" % name
            # And it is the transform: jax's CPU backend's, within the precision's rounding.
            cpu = np.asarray(jax.jit(fn)(jax.device_put(x, CPU)))
            tol = 1e-4 if got.dtype in (np.float32, np.complex64) else 1e-10
            np.testing.assert_allclose(got, cpu, rtol=tol, atol=tol * np.abs(cpu).max(), err_msg=name)
    assert not failed, failed


# The FFT and triangular-solve cases again, each program run for `steps` steps on new inputs (scaled
# by 1 + k/4): on CUDA both are captured into the program's graph (XLA keeps them out of its command
# buffers), so later steps replay them from the graph. `run(dev)` returns every step's result.
REPLAY_CASES = """
import numpy as np, jax
from jax import lax
FFT, TRSM = {}, {}
exec(%r, FFT)
exec(%r, TRSM)

def jobs():
    js = [(n, jax.jit(fn), (x,)) for n, fn, x in FFT["cases"]()]
    for i, (a, b, left, lower, trans, conj, unit) in enumerate(TRSM["cases"]()):
        solve = lambda a, b, left=left, lower=lower, trans=trans, conj=conj, unit=unit: \\
            lax.linalg.triangular_solve(a, b, left_side=left, lower=lower, transpose_a=trans,
                                        conjugate_a=conj, unit_diagonal=unit)
        js.append(("trsm_%%d" %% i, jax.jit(solve), (a, b)))
    return js

def run(dev, steps=4):
    out = []
    for _, f, args in jobs():
        for k in range(steps):
            s = 1 + 0.25 * k
            out.append(np.asarray(f(*[jax.device_put((x * s).astype(x.dtype), dev) for x in args])))
    return out
""" % (FFT_CASES, TRSM_CASES)


@pytest.mark.parametrize("mode", ["graph", "graph-recapture"])
def test_ffts_and_solves_replay_from_graphs_bit_identical_to_stock(tmp_path, mode):
    """FFTs (cuFFT) and triangular solves (cuBLAS) captured into their programs' graphs: four steps
    of each program on new inputs, in each graph mode with no guard, every step bit-identical to stock
    XLA's, and report() says each program runs as a graph, none eager."""
    want = stock_results(REPLAY_CASES, tmp_path)
    ours = tmp_path / "ours.npz"
    out = _python(CHILD_SETUP + REPLAY_CASES + """
import json
np.savez(%r, *run(d))
r = xla_vmm.report()  # (the programs of cases already run are dropped: listed under "dropped")
print(json.dumps([(p["program"], p["runner"], p["reason"], p["steps"])
                  for p in r["programs"] + r["dropped"] if p["steps"] >= 4]))
""" % str(ours), env={"XLA_VMM_EXEC_MODE": mode, "XLA_VMM_GUARD": "0"})
    got = np.load(ours)
    assert sorted(got.files) == sorted(want.files)
    for k in want.files:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert got[k].tobytes() == want[k].tobytes(), "result %s differs from stock XLA" % k
    programs = json.loads(out.strip().splitlines()[-1])
    assert len(programs) >= 18, programs
    runner = {"graph": "va-stable graph", "graph-recapture": "graph-recapture"}[mode]
    assert all(r == runner and why is None for _, r, why, _ in programs), programs


# Convolutions of the kinds our runtime runs: forward (NCHW and NHWC, strides, dilation, feature
# groups, 1D, none; f32, bf16, f16) and the backward-input / backward-filter ones of a vjp (whose forward
# result is unused, so the program holds only those). `run(dev)` prints one line per case: its
# name and the result's bytes in hex, or `UNSUPPORTED` and the error where the program is refused.
CONV_CASES = """
import numpy as np, jax, jax.numpy as jnp
from jax import lax

def cases():
    r = np.random.default_rng(3)
    f = lambda *s: r.standard_normal(s).astype(np.float32)
    conv = lax.conv_general_dilated
    def vjp(dn, strides=(1, 1)):
        def pull(x, w, ct):
            fwd = lambda x, w: conv(x, w, strides, "SAME", dimension_numbers=dn)
            return jax.vjp(fwd, x, w)[1](ct)
        return pull
    return [
        ("nchw", lambda x, w: conv(x, w, (1, 1), "SAME"), f(2, 3, 9, 9), f(4, 3, 3, 3)),
        ("nhwc_stride_dilation", lambda x, w: conv(x, w, (2, 2), "VALID", rhs_dilation=(2, 2),
                                                dimension_numbers=("NHWC", "HWIO", "NHWC")),
         f(2, 12, 12, 3), f(3, 3, 3, 5)),
        ("groups", lambda x, w: conv(x, w, (1, 1), "SAME", feature_group_count=2),
         f(1, 4, 8, 8), f(6, 2, 3, 3)),
        ("one_d", lambda x, w: conv(x, w, (1,), [(1, 1)], dimension_numbers=("NWC", "WIO", "NWC")),
         f(2, 16, 3), f(3, 3, 4)),
        ("zero_d", lambda x, w: conv(x, w, (), []), f(2, 3), f(4, 3)),
        ("vjp_nchw", vjp(None), f(2, 3, 8, 8), f(4, 3, 3, 3), f(2, 4, 8, 8)),
        ("vjp_nhwc", vjp(("NHWC", "HWIO", "NHWC")), f(2, 8, 8, 3), f(3, 3, 3, 4), f(2, 8, 8, 4)),
        ("vjp_stride", vjp(None, (2, 2)), f(2, 3, 8, 8), f(4, 3, 3, 3), f(2, 4, 4, 4)),
        ("bf16", lambda x, w: conv(x, w, (1, 1), "SAME"),
         f(2, 8, 9, 9).astype(jnp.bfloat16), f(8, 8, 3, 3).astype(jnp.bfloat16)),
        ("f16", lambda x, w: conv(x, w, (1, 1), "SAME"),
         f(2, 8, 9, 9).astype(np.float16), f(8, 8, 3, 3).astype(np.float16)),
        # Where XLA fuses a bias (and a relu) into the convolution: cuDNN's forward-activation kind.
        ("bias", lambda x, w, b: conv(x, w, (1, 1), "SAME") + b, f(2, 3, 8, 8), f(4, 3, 3, 3), f(1, 4, 1, 1)),
        ("bias_relu", lambda x, w, b: jax.nn.relu(conv(x, w, (1, 1), "SAME") + b),
         f(2, 3, 8, 8), f(4, 3, 3, 3), f(1, 4, 1, 1)),
        ("bias_relu_nhwc", lambda x, w, b: jax.nn.relu(conv(x, w, (1, 1), "SAME",
                                                         dimension_numbers=("NHWC", "HWIO", "NHWC")) + b),
         f(2, 8, 8, 3), f(3, 3, 3, 4), f(4)),
    ]

def run(dev):
    import re
    for name, fn, *args in cases():
        try:
            args = [jax.device_put(a, dev) for a in args]
            f = jax.jit(fn)
            # The cuDNN custom calls XLA made of the program (conv kinds), from its optimized HLO.
            kinds = sorted(set(re.findall(r'__cudnn\\$(\\w+)', f.lower(*args).compile().as_text())))
            print("#kinds", name, ",".join(kinds), flush=True)
            leaves = jax.tree.leaves(f(*args))
            print(name, "".join(np.asarray(l).tobytes().hex() for l in leaves), flush=True)
        except Exception as e:  # noqa: BLE001
            print(name, "UNSUPPORTED", str(e).replace(chr(10), " ")[:300], flush=True)
"""


def test_convolutions_run_on_our_runtime_bit_identical_to_stock():
    """cuDNN convolution thunks on our runtime (strict: no vendor fallback): the operation graph
    XLA's runner builds, the engine and knobs the autotuner recorded. With autotuning off in both
    processes (the same engine for the same program), every result is bit-identical to stock XLA's
    (JAX_PLATFORMS=cuda) on the same GPU, except where stock does not reproduce itself."""
    flags = {"XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_autotune_level=0").strip()}
    stock_env = dict(flags, JAX_PLATFORMS="cuda", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    runs = [_python(CONV_CASES + "\nrun(jax.devices('cuda')[0])\n", stock_env) for _ in range(2)]
    ours = _python(CHILD_SETUP + CONV_CASES + "\nrun(d)\n", flags)
    parse = lambda out: dict(ln.split(" ", 1) for ln in out.splitlines() if " " in ln and ln[0] != "#")
    s0, s1, got = parse(runs[0]), parse(runs[1]), parse(ours)
    assert set(got) == set(s0), (sorted(got), sorted(s0))
    kinds = {k for ln in ours.splitlines() if ln.startswith("#kinds ") for k in ln.split(" ")[2:3][0].split(",") if k}
    print("cuDNN custom calls in the programs:", sorted(kinds))
    # Every kind our runtime runs is among the cases.
    assert {"convForward", "convBackwardInput", "convBackwardFilter", "convBiasActivationForward"} <= kinds, kinds
    refused = {k: v for k, v in got.items() if v.startswith("UNSUPPORTED")}
    print("refused by our runtime:", refused)
    print("stock not reproducing itself:", [k for k in s0 if s0[k] != s1[k]])
    for k in s0:
        if s0[k] == s1[k] and k not in refused:
            assert got[k] == s0[k], "case %s differs from stock XLA" % k
    # Plain forward convolutions and the backward kinds of a vjp all run on our runtime.
    assert not refused, refused


def test_an_op_our_runtime_lacks_is_a_python_error_under_strict():
    """cuDNN's fused attention (XLA compiles it into a `cudnn` thunk, a kind our runtime does not run;
    FFTs, the case here before, run on it now): under strict a clear error naming it, not a dead process;
    the client keeps working."""
    q = jax.device_put(np.ones((1, 128, 2, 64), dtype=jnp.bfloat16), VMM)
    attention = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="cudnn"))
    try:
        np.asarray(attention(q, q, q))
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        # Our refusal, naming the thunk (or the custom call, were XLA to keep one), not a compile error.
        assert "cudnn" in msg.lower() and ("not executed by this runtime" in msg or "custom call" in msg), msg
    else:
        raise AssertionError("a cuDNN attention program ran under XLA_VMM_STRICT=1")
    assert float(jax.jit(lambda v: v * 3)(jax.device_put(np.float32(2), VMM))) == 6.0


def _all_cases_as_on_stock(cases):
    """Run `cases` (code defining `run(device)`, which prints `name hex-of-outputs` per case, or `name
    UNSUPPORTED why`) on stock XLA and on our runtime under strict: every case runs on both and gives
    stock's bytes."""
    stock = _python(cases + "\nrun(jax.devices('cuda')[0])\n",
                    dict(JAX_PLATFORMS="cuda", XLA_PYTHON_CLIENT_PREALLOCATE="false"))
    ours = _python(CHILD_SETUP + cases + "\nrun(d)\n", {"XLA_VMM_STRICT": "1"})
    parse = lambda out: dict(ln.split(" ", 1) for ln in out.splitlines() if " " in ln)
    s, got = parse(stock), parse(ours)
    assert not [k for k, v in s.items() if v.startswith("UNSUPPORTED")], s
    refused = {k: v for k, v in got.items() if v.startswith("UNSUPPORTED")}
    assert not refused, refused
    assert set(got) == set(s), (sorted(got), sorted(s))
    for k in s:
        assert got[k] == s[k], "case %s differs from stock XLA" % k


HOST_CASES = """
import numpy as np, jax, jax.numpy as jnp
from jax.experimental.compute_on import compute_on
from jax.sharding import SingleDeviceSharding

DEV, HOST = jax.memory.Space.Device, jax.memory.Space.Host

def on_host(f, out=DEV):
    return compute_on(compute_type="device_host", out_memory_spaces=out)(f)

def cases(dev):
    s, p = SingleDeviceSharding(dev), SingleDeviceSharding(dev, memory_kind="pinned_host")
    r = np.random.default_rng(5)
    i8 = np.arange(8, dtype=np.int32)
    f2 = r.standard_normal((61, 163)).astype(np.float32)
    times2 = on_host(lambda x: x * 2)
    def scan(c, xs):
        body = lambda c, x: (on_host(lambda c, v: c + v * 2)(c, x), None)
        return jax.lax.scan(body, c, xs)[0]
    pair = on_host(lambda x, y: (x * x, y + y), (DEV, HOST))
    return [
        # (name, function, args, jit keywords): JAX's memories_test ComputeOffload, one device.
        ("basic", lambda x: times2(x) * 3, (i8,), {}),
        ("two_d", lambda x: times2(x) * 3, (f2,), {}),
        ("reduction", lambda x: on_host(jnp.sum)(x) + 1, (i8,), {}),
        ("sin_grad", jax.grad(lambda x: on_host(jnp.sin)(x).sum()), (f2[0, :8],), {}),
        ("scan", scan, (np.zeros((16, 16), np.int32),
                        np.arange(16 ** 3, dtype=np.int32).reshape(16, 16, 16)), {}),
        ("gather_dot", lambda x, i: on_host(lambda x, i: jnp.einsum("ij,kj->ik", x[i], x))(x, i),
         (f2[:8, :16], np.array([3, 1, 7], np.int32)), {}),
        ("uint4", on_host(lambda x: x + x), (np.array([0, 1, 2, 3, 7, 5, 6], jnp.uint4),), {}),
        ("pinned_in_out_donated", pair, (np.arange(1024, dtype=np.float32),
                                         np.arange(1024, dtype=np.float32)),
         dict(in_shardings=(s, p), out_shardings=(s, p), donate_argnums=(0, 1))),
    ]

def run(dev):
    for name, fn, args, kw in cases(dev):
        try:
            shardings = kw.get("in_shardings") or [None] * len(args)
            args = [jax.device_put(a, sh or dev) for a, sh in zip(args, shardings)]
            leaves = jax.tree.leaves(jax.jit(fn, **kw)(*args))
            print(name, "".join(np.asarray(l).tobytes().hex() + "/" + str(getattr(l.sharding, "memory_kind", ""))
                                for l in leaves), flush=True)
        except Exception as e:  # noqa: BLE001
            print(name, "UNSUPPORTED", str(e).replace(chr(10), " ")[:300], flush=True)
"""


def test_host_offloaded_compute_runs_on_our_runtime_bit_identical_to_stock():
    """`compute_on("device_host")` programs (host_execute thunks) on our runtime under strict: the host
    computation compiled by JAX's CPU client, operands and results staged through pinned host memory
    (pinned_host ones and donated ones too). Every result, and its memory kind, is what stock XLA
    (JAX_PLATFORMS=cuda, its host thunk on XLA:CPU) gives."""
    _all_cases_as_on_stock(HOST_CASES)


MOSAIC_CASES = """
import numpy as np, jax, jax.numpy as jnp
import jax.experimental.pallas.mosaic_gpu as plgpu
from jax.experimental.compute_on import compute_on

@plgpu.kernel(out_type=jax.ShapeDtypeStruct([128], jnp.float32))
def double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0

@plgpu.kernel(out_type=jax.ShapeDtypeStruct([256], jnp.float32))
def add(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]

def on_stream(i):
    return compute_on(double, compute_type="gpu_stream:%d" % i, out_memory_spaces=jax.memory.Space.Device)

def run(dev):
    r = np.random.default_rng(9)
    x = jax.device_put(r.standard_normal(128).astype(np.float32), dev)
    y = jax.device_put(r.standard_normal(256).astype(np.float32), dev)
    z = jax.device_put(r.standard_normal(256).astype(np.float32), dev)
    cases = [
        ("double", lambda: jax.jit(double)(x)),
        ("add_then_xla", lambda: jax.jit(lambda a, b: jnp.tanh(add(a, b)) * 3)(y, z)),
        ("two_streams", lambda: jax.jit(lambda a, b: (on_stream(0)(a), on_stream(1)(b))).lower(x, x).compile(
            {"xla_gpu_experimental_stream_annotation": True})(x, x * 3)),
    ]
    for name, f in cases:
        try:
            print(name, "".join(np.asarray(l).tobytes().hex() for l in jax.tree.leaves(f())), flush=True)
        except Exception as e:  # noqa: BLE001
            print(name, "UNSUPPORTED", str(e).replace(chr(10), " ")[:300], flush=True)
"""


def test_pallas_mosaic_gpu_kernels_run_on_our_runtime_bit_identical_to_stock():
    """Pallas Mosaic GPU kernels (custom call `mosaic_gpu_v2`, whose FFI handler jaxlib keeps inside the
    vendor plugin) on our runtime under strict, compiled by the vendor's exported Mosaic compiler:
    alone, between XLA ops, and on two compute streams. Every result is stock XLA's."""
    _all_cases_as_on_stock(MOSAIC_CASES)


SELECT_K_CASES = """
import numpy as np, jax

# (shape, k, the thunk XLA makes of lax.top_k(..., is_stable=False)): f32 with n < 1024, n == 1024 and k > 12,
# or n > 1024 and k >= 8 is a select_k thunk (raft on stock); other f32 rows of n >= 1024 are XLA's TopK kernel.
SHAPES = [((8, 20), 3, "select_k"), ((2000,), 8, "select_k"), ((16, 1024), 13, "select_k"),
          ((2, 32000), 16, "select_k"), ((4, 32000), 64, "select_k"), ((3, 70000), 9, "select_k"),
          ((4, 1500), 3, "topk_kernel"), ((2, 4096), 7, "topk_kernel"), ((3, 1024), 12, "topk_kernel"),
          ((2000,), 1, "topk_kernel")]

def keys(rows, thunk):
    # Our kernel's order keys: select_k's total order (NaN first), or the TopK kernel's float order (NaN last,
    # -0 == +0).
    b = rows.view(np.uint32).astype(np.int64)
    if thunk == "topk_kernel":
        b = np.where(b & 0x7FFFFFFF == 0, 0, b)
    k = np.where(b >> 31 == 1, 0xFFFFFFFF - b, b | 0x80000000)
    if thunk == "topk_kernel":
        k = np.where(np.isnan(rows), 0, k)
    return k

def run(dev):
    r = np.random.default_rng(3)
    for shape, k, thunk in SHAPES:
        n = shape[-1]
        inputs = {"distinct": (r.permutation(int(np.prod(shape))) - 7.5).astype(np.float32).reshape(shape),
                  "ties": r.integers(-3, 4, size=shape).astype(np.float32),
                  "nan_zeros": r.choice(np.array([0.0, -0.0, 1.0, np.nan, -np.inf], np.float32), size=shape)}
        f = jax.jit(lambda x: jax.lax.top_k(x, k, is_stable=False))
        for kind, x in inputs.items():
            name = "%s_%s_%s_k%d" % (thunk, kind, "x".join(map(str, shape)), k)
            try:
                vals, idx = (np.asarray(a) for a in f(jax.device_put(x, dev)))
                rows = x.reshape(-1, n)
                stable = np.argsort(-keys(rows, thunk), axis=1, kind="stable")[:, :k]
                points = np.array_equal(np.take_along_axis(rows, idx.reshape(-1, k), 1).view(np.uint32),
                                        vals.reshape(-1, k).view(np.uint32))
                print(name, vals.tobytes().hex(), idx.tobytes().hex(),
                      "stable" if np.array_equal(stable, idx.reshape(-1, k)) else "other",
                      "points" if points else "WRONG", flush=True)
            except Exception as e:  # noqa: BLE001
                print(name, "UNSUPPORTED", str(e).replace(chr(10), " ")[:300], flush=True)
"""


def test_top_k_runs_on_our_runtime_with_stocks_results():
    """`lax.top_k(..., is_stable=False)` programs on our kernel under strict: the select_k thunks (raft's
    select_k on stock) and XLA's own TopK kernel (an in-process symbol of the vendor plugin). Our indices are
    the stable order of the thunk's keys (equal keys lowest index first) and point at the values. select_k:
    values are stock's bits on every input, indices on inputs without ties (raft's warp sort orders ties its
    own way). TopK kernel: values and indices are stock's on inputs with and without ties; with NaNs (its
    float comparison leaves a NaN where its insertion sequence puts it) they are reported, not required."""
    stock = _python(SELECT_K_CASES + "\nrun(jax.devices('cuda')[0])\n",
                    dict(JAX_PLATFORMS="cuda", XLA_PYTHON_CLIENT_PREALLOCATE="false"))
    ours = _python(CHILD_SETUP + SELECT_K_CASES + "\nrun(d)\n", {"XLA_VMM_STRICT": "1"})
    parse = lambda out: {ln.split(" ")[0]: ln.split(" ")[1:] for ln in out.splitlines() if " " in ln}
    s, got = parse(stock), parse(ours)
    refused = {k: v for k, v in got.items() if v[0] == "UNSUPPORTED"}
    assert not refused, refused
    assert set(got) == set(s) and len(s) == 30, (sorted(got), sorted(s))
    print("stock's indices in our order:", sorted(k for k in s if s[k][2] == "stable"))
    print("TopK-kernel cases with NaNs as on stock:",
          sorted(k for k in s if k.startswith("topk_kernel_nan") and got[k][:2] == s[k][:2]))
    for k in s:
        assert got[k][2:] == ["stable", "points"], (k, got[k][2:])
        if k.startswith("select_k"):
            assert got[k][0] == s[k][0], "case %s: values differ from stock XLA" % k
            if "_distinct_" in k:
                assert got[k][1] == s[k][1], "case %s: indices differ from stock XLA" % k
        elif "_nan_" not in k:
            assert got[k][:2] == s[k][:2], "case %s differs from stock XLA" % k

def _python(code, env=None, timeout=300):
    """Run `code` in a fresh python with the same plugin setup; return stdout."""
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return r.stdout


# A child program's start: jax with the plugin, `d` the vmm device.
CHILD_SETUP = """
import os, sys
sys.path.insert(0, %r)
import jax, jax.numpy as jnp, numpy as np
from jax_plugins import xla_vmm
xla_vmm.initialize()
d = jax.devices("vmm")[0]
""" % os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

CHILD = CHILD_SETUP + """x = jax.device_put(np.arange(64, dtype=np.float32), d)
y = jax.jit(lambda v: jnp.sin(v) * 3.0 + v.sum())(x)
print(np.asarray(y).tobytes().hex())
"""


def test_persistent_compilation_cache_across_processes(tmp_path):
    env = {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    first = _python(CHILD, env)
    assert any(tmp_path.iterdir()), "nothing was written to the compilation cache"
    second = _python(CHILD, env)  # loads the executable from the cache
    assert first == second


def test_several_processes_share_the_gpu():
    procs = [subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    assert len({o for o, _ in outs}) == 1


@functools.lru_cache
def _loop_step():
    def step(w, x):
        loss, g = jax.value_and_grad(lambda w: jnp.mean((jnp.tanh(x @ w)) ** 2))(w)
        return w - 0.1 * g, loss
    return jax.jit(step, donate_argnums=0)


def test_small_training_loop_matches_cpu():
    x = rand((16, 32), seed=3)
    w_v, w_c = jax.device_put(rand((32, 32), seed=4), VMM), jax.device_put(rand((32, 32), seed=4), CPU)
    for _ in range(10):
        w_v, lv = _loop_step()(w_v, jax.device_put(x, VMM))
        w_c, lc = _loop_step()(w_c, jax.device_put(x, CPU))
        np.testing.assert_allclose(float(lv), float(lc), rtol=1e-4)


def test_compute_offload_with_donation():
    """JAX's memories_test ComputeOffload.test_compute_offload_with_donation on vmm: a host-offload
    program with a donated pinned_host argument that an output aliases, on our runtime (strict)."""
    out = _python(CHILD_SETUP + """
from jax.experimental.compute_on import compute_on
from jax.sharding import SingleDeviceSharding

s = SingleDeviceSharding(d)
p = SingleDeviceSharding(d, memory_kind="pinned_host")

@compute_on(compute_type="device_host",
            out_memory_spaces=(jax.memory.Space.Device, jax.memory.Space.Host))
def host_fn(x, y):
    return x * x, y + y

f = jax.jit(lambda x, y: host_fn(x, y), in_shardings=(s, p), out_shardings=(s, p),
            donate_argnums=(0, 1))
x = jnp.arange(1024, dtype=jnp.float32, device=d)
y = jax.device_put(jnp.arange(1024, dtype=jnp.float32, device=d), p)
xo, yo = f(x, y)
want = np.arange(1024, dtype=np.float32)
np.testing.assert_array_equal(np.asarray(xo), want * want)
np.testing.assert_array_equal(np.asarray(yo), want + want)
assert yo.sharding.memory_kind == "pinned_host"
print("ok")
""", env={"XLA_VMM_STRICT": "1"})
    assert out.strip().endswith("ok")


def test_report_lists_the_programs_and_the_guard_picks_one_runner():
    """report(): every loaded program with its mode and runner; a training loop's program is
    decided by the never-slower guard within its first steps, its results unchanged."""
    import jax_plugins.xla_vmm as vmm

    step = jax.jit(lambda w, x: (w - 0.01 * (x.T @ (x @ w)), jnp.sum(x @ w)), donate_argnums=0)
    # f32 matmuls at full precision on both sides: at the default one the GPU's use TF32, and the
    # losses had drifted 4.3e-3 from the CPU's by the first step past 2e-3 (the same at 784a52d).
    x = jax.device_put(rand((16, 32), seed=5), VMM)
    w = jax.device_put(rand((32, 32), seed=6), VMM)
    losses = []
    with jax.default_matmul_precision("highest"):
        for _ in range(30):
            w, loss = step(w, x)
            losses.append(float(loss))
    r = vmm.report()
    mine = [p for p in r["programs"] if "lambda" in p["program"] and p["steps"] >= 30]
    assert mine, r["programs"]
    p = mine[-1]
    assert p["mode"] == "graph"
    assert p["guard"] is not None and p["runner"] in ("va-stable graph", "graph-recapture", "eager"), p
    assert p["runner"] == {"va-stable": "va-stable graph", "recapture": "graph-recapture",
                           "eager": "eager"}[p["guard"]["runner"]]
    assert r["devices"] and r["devices"][0]["memory"]["device_bytes"] > 0
    assert "runs as" in str(r)
    # Every runner runs the same kernels: the losses follow the CPU's through the trial's switches
    # (bit-identity across the switch is the GPU check's loop50 rows, on one executable).
    wc, xc = jax.device_put(rand((32, 32), seed=6), CPU), jax.device_put(rand((16, 32), seed=5), CPU)
    with jax.default_matmul_precision("highest"):
        for k in range(30):
            wc, lc = step(wc, xc)
            np.testing.assert_allclose(losses[k], float(lc), rtol=2e-3)
