"""Long runs (issue 34): a training loop interrupted, a training loop run for thousands of steps, and
threads dispatching at once.

    python3 integration/long_runs.py interrupt [--platform vmm] [--trials 50] [--seed 0] [--out DIR]
    python3 integration/long_runs.py soak [--platforms cuda,vmm] [--steps 20000] [--every 1000] [--out DIR]
    python3 integration/long_runs.py churn [--platform vmm] [--programs 2000] [--every 200] [--reference] [--out DIR]
    python3 integration/long_runs.py threads [--platform vmm] [--threads 8] [--seconds 120] [--out DIR]

The loop: a two-layer MLP regression trained by SGD under `jax.jit` with its parameters donated, the
batch made on the device by a second jitted program from the step number (two programs per step, as a
data pipeline would). `--platform` / `--platforms`: `vmm` (the plugin: JAX_PLATFORMS=vmm,cpu; the
library from XLA_VMM_LIBRARY or the installed package), `cuda` (stock), `cpu` (stock, no GPU: how CI
checks this script).

interrupt: each trial starts the loop in a child process, waits until its first step has run, waits a
random 0-500 ms more and sends SIGINT. The child sets Python's SIGINT handler first, as a terminal has it (a
SIGINT that came in ignored, as from a background job without job control, would never raise; the trial
records which it was; a SIGINT that lands while Python runs a gc callback or a finalizer, where Python
drops the exception, raises at the loop's next step, and the results count those). A trial passes when the child
exits within 5 s with Python's KeyboardInterrupt (it raises in Python, the plugin's teardown does not
hang); a child still alive at 5 s is killed and counted as hung, after its threads' states (/proc: name,
state, kernel wait), their native stacks (gdb, where installed) and its Python stacks (faulthandler, on
SIGUSR1) are taken into the results. With `nvidia-smi` on the machine, no trial's process may still hold
the GPU afterwards. `--reference`: a platform measured for comparison (stock's), its results written as
long_runs_interrupt_PLATFORM, exit status 0.

soak: the loop for --steps steps per platform, one child each (--model: the MLP above, or a llama config of
integration/models/llama.py, llama_small_f32 being the A/B model: its step compiled by the first platform's
child with deterministic ops, saved in --out and loaded by the others, adamw where optax is installed, else
SGD); every --every steps the child samples
its host RSS, open file descriptors and threads (checked flat on the plugin), the device bytes in use (the
plugin: report()'s device budget; stock: memory_stats()),
the bytes of its log (stderr to a file, the plugin's at info level: no line per step), and on vmm how many
entries report() and stats() hold (keys and list items, nested: no map or list may
grow with steps; a counter's digits may) and, where the plugin
counts them, its live allocations, reserved address space and library plans (which must not move), and the window's
mean step time. A platform passes when, after the first two windows, RSS and device bytes stay within 1%
(or 4 MiB) of their value then, and the step time of the last window is within 25% of the third's
(checked where a window lasts at least 0.5 s);
the losses of all platforms must be bit-identical (a checksum of every step's loss bits, and the
losses every --every steps).

churn: --programs distinct jitted programs (input shapes and constants varied) compiled, run once (an exact
integer result checked against numpy) and dropped, one after another in one process; every --every programs,
after a garbage collection and jax.clear_caches(), its host RSS and on vmm the plugin's counters (the programs
report() lists, live buffers, live allocations, reserved address ranges and bytes, device bytes, library plans,
the entries of stats()), counted after the plugin's buffer allocator has released its cache
(jax_plugins.xla_vmm.trim(); what it held is recorded: a granule per small-buffer size class used so far).
Passes when every result is right, every counter is back at its value after the first --every programs (stats()
keeps the last 256 programs dropped: from the sample past them), and RSS stays within 5% (or 64 MiB) of it or,
where a --reference run of stock over the same programs wrote its results in OUT first, grew no more than
stock's plus 64 MiB (the vendor compiler, the same in both processes, keeps what it compiled).

threads: --threads Python threads in one process dispatch on the same device at once for --seconds, each
its own kind of work (worker w does kind w % 4): an SGD step with its parameters donated; a chain of
matrix products on fresh inputs; transfers (a host array put on the device, reduced there, the result
read back, each result also checked against the host's sum, each upload read back bit for bit, and every 16th
run repeated on the same input, bit for bit; worker 2's arrays are large, 1024 x 64 float32, worker 6's small,
64 x 96); programs of three shapes in turn (a fori_loop
over a growing input). Every worker folds the bits of each of its results into a checksum, one per block of
1,024 iterations and one of them all. Then, in the same process, each worker runs again alone, one after another,
for the iterations it made, from its first, with the same compiled programs (the vendor compiler need not give
the same executable twice: on stock, a transfers worker's results differed between two processes from the first
iteration on, each right to rounding). A worker passes when it raised nothing, no result was wrong, and its
checksum equals its serial replay's (else the table names the first block that
differs); a worker still running 60 s past the deadline is a hang (the process reports it and exits).

Writes OUT/long_runs_{interrupt,soak,churn,threads}.{md,json}; exit status 0 when every check passed, 1 otherwise.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchio import run_json_child, write_results  # noqa: E402

# What the children sample: host RSS, and on vmm the plugin's report(): its devices' memory counters (device
# bytes; where the plugin counts them, live allocations, reserved address space, library plans), the
# programs it lists, and how many entries report() and stats() hold (keys and list items, nested).
COUNTERS = r'''
import json, os

def status(field):
    """A number of this process's /proc/self/status (`VmRSS` in kB, `Threads`), 0 when absent."""
    with open("/proc/self/status") as f:
        return next((int(ln.split()[1]) for ln in f if ln.startswith(field + ":")), 0)

def rss():
    return status("VmRSS") * 1024

def handles():
    """Open file descriptors (the driver's device files among them) and threads of this process."""
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": status("Threads")}

def entries(x):
    """How many keys and items a JSON value holds, nested: what grows when a map or a list grows (the
    digits of a counter that counts steps do not)."""
    if isinstance(x, dict):
        return len(x) + sum(entries(v) for v in x.values())
    if isinstance(x, list):
        return len(x) + sum(entries(v) for v in x)
    return 0

def plugin_counters():
    import jax_plugins.xla_vmm as v
    from benchio import memory_sums  # on vmm the children's path has integration/ (platform_env)
    r = v.report()
    # Newer plugins count live allocations and reserved address space too.
    out = {"device_bytes": 0, "programs": len(r.get("programs", [])),
           **memory_sums(r, ("device_bytes", "allocations", "va_ranges", "va_bytes"))}
    # The buffer allocator: live buffers, and what it keeps cached for reuse (blocks, small-buffer granules).
    alloc = [d["allocator"] for d in r.get("devices", []) if "allocator" in d]
    if alloc:
        out["buffers_live"] = sum(a["buffers_live"] for a in alloc)
        out["pooled"] = sum(a["cached_blocks"] + a["granules"] for a in alloc)
    plans = [d["library_plans"] for d in r.get("devices", []) if "library_plans" in d]
    if plans:
        out["library_plans"] = sum(p["gemm"] + p["conv"] + p.get("fft", 0) for p in plans)
    out["report_entries"] = entries(r)
    out["stats_entries"] = entries(v.stats())
    return out
'''

# The child: the training loop. argv: steps (0: forever), every (sampling), platform, and for the soak the
# model ("mlp", or a config of integration/models/llama.py) and a folder for its executable: the first child
# compiles the step and writes it there, later ones load that executable (stock's and the plugin's run the
# same one, so that their losses compare bit for bit, as the A/B does).
CHILD = COUNTERS + r'''
import faulthandler, json, os, signal, sys, time
# A hung interrupt trial asks for every Python thread's stack before it kills the child.
faulthandler.register(signal.SIGUSR1, all_threads=True)
# Ctrl-C raises KeyboardInterrupt, as in a terminal, even where SIGINT came in ignored (Python keeps an ignored
# SIGINT: a parent started in the background without job control, for one, passes it on so).
sigint_inherited = "ignored" if signal.getsignal(signal.SIGINT) == signal.SIG_IGN else "default"
# Python drops an exception raised while it runs a gc callback (jax registers one) or a finalizer: a SIGINT
# landing there prints "Exception ignored in: <function _xla_gc_callback ...> KeyboardInterrupt" and the loop
# goes on. The handler notes the signal, and the loop raises at its next step where the first raise was dropped.
sigint_at = []
def on_sigint(signum, frame):
    sigint_at.append(time.perf_counter())
    raise KeyboardInterrupt
signal.signal(signal.SIGINT, on_sigint)
steps, every, platform = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
model = sys.argv[4] if len(sys.argv) > 4 else "mlp"
import jax, jax.numpy as jnp, numpy as np
from functools import partial

optimizer = "sgd"
if model == "mlp":
    def loss(p, x, y):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    @partial(jax.jit, donate_argnums=0)
    def step(p, xy):
        l, g = jax.value_and_grad(loss)(p, *xy)
        return jax.tree.map(lambda a, b: a - 0.05 * b, p, g), l

    @jax.jit
    def batch(i):
        k = jax.random.fold_in(jax.random.PRNGKey(1), i)
        x = jax.random.normal(k, (64, 32), jnp.float32)
        return x, jnp.sin(x[:, :8] * 3.0)

    k = jax.random.PRNGKey(0)
    p = {"w1": jax.random.normal(k, (32, 256), jnp.float32) * 0.1, "b1": jnp.zeros((256,), jnp.float32),
         "w2": jax.random.normal(jax.random.fold_in(k, 1), (256, 8), jnp.float32) * 0.1}
else:
    # The llama model by file (integration/ on the path would show stock JAX the plugin's package).
    import importlib.util, inspect, pickle
    from jax.experimental.serialize_executable import deserialize_and_load, serialize
    models, exe_dir = sys.argv[5], sys.argv[6]
    spec = importlib.util.spec_from_file_location("soak_llama", os.path.join(models, "llama.py"))
    llama = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(llama)
    vocab, d, heads, kv, layers, ffn, dtype, scan, B, T = llama.CONFIGS[model]
    try:
        import optax  # noqa: F401 (the model's own optimizer, adamw, as the A/B runs it)
        opt = None
    except ImportError:  # CI's CPU venv: plain SGD, what the soak's own checks need
        class opt:
            init = staticmethod(lambda params: ())
            update = staticmethod(lambda g, s, params: (jax.tree.map(lambda x: -1e-3 * x, g), s))
    make_state, train_step = llama.make_llama(vocab, d, heads, kv, layers, ffn, dtype, scan, opt)
    optimizer = "adamw" if opt is None else "sgd"
    p = make_state(jax.random.PRNGKey(0))

    @jax.jit
    def batch(i):
        return jax.random.randint(jax.random.fold_in(jax.random.PRNGKey(1), i), (B, T + 1), 0, vocab)

    exe = os.path.join(exe_dir, model + ".exe.pkl")
    if os.path.exists(exe):
        with open(exe, "rb") as f:
            payload, in_tree, out_tree = pickle.load(f)
        # Onto the platform's first device only (a machine with several GPUs would take them all).
        kw = {"execution_devices": [jax.devices()[0]]} \
            if "execution_devices" in inspect.signature(deserialize_and_load).parameters else {}
        step = deserialize_and_load(payload, in_tree, out_tree, backend=platform, **kw)
    else:
        step = jax.jit(train_step, donate_argnums=0).lower(p, batch(0)).compile()
        with open(exe + ".tmp", "wb") as f:
            pickle.dump(serialize(step), f)
        os.replace(exe + ".tmp", exe)

def log_bytes():
    """Bytes written to stderr so far, where it is a file (the soak's): the log must not grow with steps."""
    import stat
    st = os.fstat(2)
    return st.st_size if stat.S_ISREG(st.st_mode) else None

def sample(n, window_s):
    out = {"step": n, "rss": rss(), "step_ms": 1e3 * window_s / every, "log_bytes": log_bytes(), **handles()}
    if platform == "vmm":
        out.update(plugin_counters())
    else:
        s = jax.devices()[0].memory_stats() or {}
        out["device_bytes"] = s.get("bytes_in_use", 0)
    return out

p, l = step(p, batch(0))
l.block_until_ready()
print("READY sigint=%s" % sigint_inherited, flush=True)
checksum, kept, samples, pending = 0, [], [], []
t = time.perf_counter()
n = 1
while steps == 0 or n < steps:
    if sigint_at:
        raise KeyboardInterrupt("SIGINT's first KeyboardInterrupt was dropped where Python ignores exceptions")
    p, l = step(p, batch(n))
    pending.append(l)
    n += 1
    if n % every == 0 or n == steps:
        vals = np.asarray(jax.device_get(pending), dtype=np.float32)
        pending = []
        for b in vals.view(np.uint32).tolist():
            checksum = (checksum * 1000003 + b) % (1 << 61)
        kept.append(vals[-1].view(np.uint32).item())
        now = time.perf_counter()
        samples.append(sample(n, now - t))
        t = now
print(json.dumps({"checksum": checksum, "losses": kept, "samples": samples, "steps": n, "optimizer": optimizer}))
'''

# The churn child. argv: programs, every (sampling), platform. Program k: a jitted function of an int32
# (n, m) input, (n, m) distinct for k < 2013, its constants k's: compiled, run once, checked, dropped.
CHURN_CHILD = COUNTERS + r'''
import gc, sys, time
programs, every, platform = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
import jax, jax.numpy as jnp, numpy as np

def one(k):
    n, m = 8 + k % 61, 1 + (k // 61) % 33
    x = np.arange(n * m, dtype=np.int32).reshape(n, m)
    f = lambda a: ((a * (k + 1) + 3).sum(axis=0),
                   jnp.tanh(a.astype(jnp.float32) @ jnp.full((m, 4), 1e-3, jnp.float32)))
    c = jax.jit(f).lower(x).compile()
    exact, small = c(x)
    ok = np.array_equal(np.asarray(exact), (x * (k + 1) + 3).sum(axis=0)) and np.asarray(small).shape == (n, 4)
    return ok

def sample(k):
    # Every program of this loop dropped: nothing of theirs may be left. On vmm the buffer allocator's cache
    # (freed blocks and small-buffer granules kept for reuse: one granule per size class the inputs have
    # used) is counted, then released, as clear_caches releases JAX's.
    gc.collect()
    jax.clear_caches()
    gc.collect()
    out = {"programs_run": k}
    if platform == "vmm":
        import jax_plugins.xla_vmm as v
        out["pooled_before_trim"] = plugin_counters().get("pooled")
        out["trimmed_bytes"] = v.trim()
        out.update(plugin_counters())
    out["rss"] = rss()
    out["elapsed_s"] = time.perf_counter() - T0
    return out

T0 = time.perf_counter()
warm = min(every, programs)
bad = [k for k in range(warm) if not one(k)]
samples = [sample(warm)]
t = time.perf_counter()
for k in range(warm, programs):
    if not one(k):
        bad.append(k)
    if (k + 1) % every == 0 or k + 1 == programs:
        samples.append(sample(k + 1))
print(json.dumps({"programs": programs, "wrong": bad, "samples": samples,
                  "seconds": time.perf_counter() - t}))
'''

# The threads child. argv: platform, threads, seconds. The workers run in parallel for that long, then each is
# replayed serially, one after another, for the iterations it made, with the same compiled programs.
THREADS_CHILD = r'''
import json, os, sys, threading, time, traceback
platform, nthreads, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
import jax, jax.numpy as jnp, numpy as np
KINDS = ["sgd, donated", "matmul chain", "transfers", "three shapes"]

def fold(c, arrays):
    for arr in jax.device_get(arrays):
        for b in np.ascontiguousarray(np.asarray(arr)).view(np.uint8).tobytes():
            c = (c * 257 + b) % (1 << 61)
    return c

# Each worker's jitted programs, made once: the serial replay runs the executables the parallel run ran.
JITS = {}
def jit(w, name, fn, **kw):
    return JITS.setdefault((w, name), jax.jit(fn, **kw))

def make(w, rec):
    """Worker w's iteration, from its first: one(i) runs iteration i and returns what it made (on the device or
    the host); wrong results go to rec["wrong"]."""
    kind, width = w % 4, 48 + 8 * w
    key = jax.random.PRNGKey(w)
    if kind == 0:
        def sgd(p, x):
            l, g = jax.value_and_grad(lambda p: jnp.mean(jnp.tanh(x @ p) ** 2))(p)
            return p - 0.1 * g, l
        step = jit(w, "step", sgd, donate_argnums=0)
        state = [jax.random.normal(key, (width, width), jnp.float32) * 0.1]
        def one(i):
            state[0], l = step(state[0], jnp.full((16, width), (i % 7) * 0.25, jnp.float32))
            return l
        return one
    if kind == 1:
        def chain4(a, b):
            for _ in range(4):
                a = jnp.tanh(a @ b)
            return a.sum(axis=0)
        chain = jit(w, "chain", chain4)
        b = jax.random.normal(key, (width, width), jnp.float32) / width ** 0.5
        return lambda i: chain(jax.random.normal(jax.random.fold_in(key, i), (32, width), jnp.float32), b)
    if kind == 2:
        f = jit(w, "f", lambda x: (x * 2.0 + 1.0).sum(axis=1))
        # The first transfers worker's arrays are large (a block of their own, past the allocator's 64 KiB
        # small-buffer pool), the others' small (a slot in a pooled granule).
        rows = 1024 if w < 4 else 64
        def wrong(i, what):
            if len(rec["wrong"]) < 20:
                rec["wrong"].append([i, what])
        def one(i):
            x = np.random.default_rng((w, i)).standard_normal((rows, width), dtype=np.float32)
            xd = jax.device_put(x)
            got = np.asarray(f(xd))
            # The upload read back, bit for bit (what an exact round trip must give).
            if not np.array_equal(np.asarray(xd), x):
                wrong(i, "round trip")
            # The program run again on the same input gives the same bits (every 16th iteration).
            if i % 16 == 0 and not np.array_equal(np.asarray(f(xd)), got):
                wrong(i, "rerun differs")
            # Checked against the host's sum (float64; the device's float32 order differs in the last bits): an
            # upload or download that lost or mixed bytes is off by whole units, not by rounding.
            err = float(np.abs(got - (x.astype(np.float64) * 2.0 + 1.0).sum(axis=1)).max())
            if err > 1e-3 * width:
                wrong(i, err)
            return got
        return one
    loop = jit(w, "loop", lambda x: jax.lax.fori_loop(0, 8, lambda k, v: jnp.sin(v) + k * 0.01, x))
    return lambda i: loop(jnp.linspace(0.0, 1.0, width + 8 * (i % 3), dtype=jnp.float32))

# Per worker and phase: the checksum of all its results, and of each block of BLOCK iterations (where the run and
# its serial replay first part ways), and the transfers' wrong results (iteration, what).
BLOCK = 1024
def records():
    return [{"worker": w, "kind": KINDS[w % 4], "iterations": 0, "checksum": 0, "blocks": [], "wrong": [],
             "error": ""} for w in range(nthreads)]
out, replay = records(), records()

def run(w, rec, stop, limit, warm=None):
    """Worker w until `stop` is set (or for `limit` iterations); results folded 16 at a time. `warm`: a
    barrier met after the first iteration (its compilation), so that the clock starts with all warm."""
    try:
        one, pending, c, block, i = make(w, rec), [], 0, 0, 0
        while (i < limit) if limit is not None else (i == 0 or not stop.is_set()):
            pending.append(one(i))
            i += 1
            if i == 1 and warm is not None:
                warm.wait()
            if len(pending) == 16:
                block, pending = fold(block, pending), []
            if i % BLOCK == 0:
                rec["blocks"].append(block)
                c, block = (c * 1000003 + block) % (1 << 61), 0
        block = fold(block, pending)
        rec["blocks"].append(block)
        rec["checksum"], rec["iterations"] = (c * 1000003 + block) % (1 << 61), i
    except Exception as e:
        if warm is not None:
            warm.abort()
        rec["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        traceback.print_exc()

stop, warm = threading.Event(), threading.Barrier(nthreads + 1, timeout=600)
ts = [threading.Thread(target=run, args=(w, out[w], stop, None, warm), daemon=True) for w in range(nthreads)]
for t in ts:
    t.start()
try:
    warm.wait()
except threading.BrokenBarrierError:
    pass  # a worker failed (its error says why) or never compiled: the others run on
t0 = time.perf_counter()
time.sleep(seconds)
stop.set()
for w, t in enumerate(ts):
    t.join(timeout=max(0.0, 60.0 - (time.perf_counter() - t0 - seconds)))
    if t.is_alive():
        out[w]["error"] = "hung: still running 60 s past the deadline"
if any(t.is_alive() for t in ts):
    print("hung workers: %s" % [w for w, t in enumerate(ts) if t.is_alive()], file=sys.stderr, flush=True)
    os._exit(3)
parallel_s = time.perf_counter() - t0
t1 = time.perf_counter()
for w in range(nthreads):
    if not out[w]["error"]:
        run(w, replay[w], None, out[w]["iterations"])
print(json.dumps({"workers": out, "serial": replay, "seconds": parallel_s, "serial_seconds": time.perf_counter() - t1,
                  "block": BLOCK}))
'''


def platform_env(platform):
    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env["JAX_PLATFORMS"] = {"vmm": "vmm,cpu", "cuda": "cuda,cpu", "cpu": "cpu"}[platform]
    if platform == "vmm":
        env["PYTHONPATH"] = os.pathsep.join([HERE] + [v for v in [env.get("PYTHONPATH")] if v])
    return env


def gpu_processes():
    """PIDs holding the GPU (nvidia-smi), or None without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return None
    p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                       capture_output=True, text=True)
    return {int(x) for x in p.stdout.split() if x.strip().isdigit()}


def thread_states(pid):
    """What each thread of a process is doing, from /proc: `name state wchan` with how many threads share it
    (a hung exit: which threads wait, and in which kernel function)."""
    counts = {}
    for tid in sorted(os.listdir("/proc/%d/task" % pid)) if os.path.isdir("/proc/%d/task" % pid) else []:
        base = "/proc/%d/task/%s/" % (pid, tid)
        try:
            with open(base + "comm") as fh:
                name = fh.read().strip()
            with open(base + "stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
            with open(base + "wchan") as fh:
                wchan = fh.read().strip() or "-"
        except OSError:
            continue
        key = "%s %s %s" % (name, state, wchan)
        counts[key] = counts.get(key, 0) + 1
    return ["%s x%d" % kv for kv in sorted(counts.items())]


def native_stacks(pid, limit=120):
    """Every thread's native stack (gdb, where the machine has it; else nothing): where in the plugin, jaxlib or
    the driver a hung process waits."""
    if not shutil.which("gdb"):
        return []
    try:
        p = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off",
                            "-ex", "thread apply all bt 25"], capture_output=True, text=True, timeout=30)
    except (subprocess.TimeoutExpired, OSError) as e:
        return ["gdb: %s" % e]
    frames = [x for x in p.stdout.splitlines() if x.startswith(("Thread ", "#"))]
    return ["gdb: " + x[:200] for x in frames[:limit]]


def one_interrupt(platform, delay_s, ready_timeout_s=300, exit_timeout_s=5.0):
    """One trial: (record, pid)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, "0", "1000", platform], env=platform_env(platform),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start = time.time()
    line = ""
    while time.time() - start < ready_timeout_s:
        line = child.stdout.readline()
        if not line or line.startswith("READY"):
            break
    if not line.startswith("READY"):
        child.kill()
        _, err = child.communicate()
        return {"ok": False, "why": "never ready: " + " | ".join(err.strip().splitlines()[-3:])}, child.pid
    inherited = line.split("sigint=", 1)[1].strip() if "sigint=" in line else "?"
    time.sleep(delay_s)
    child.send_signal(signal.SIGINT)
    t = time.time()
    try:
        _, err = child.communicate(timeout=exit_timeout_s)
    except subprocess.TimeoutExpired:
        took = time.time() - t
        threads = thread_states(child.pid) + native_stacks(child.pid)
        child.send_signal(signal.SIGUSR1)  # faulthandler: the Python stacks, to stderr
        time.sleep(0.5)
        child.kill()
        _, err = child.communicate()
        return {"ok": False, "delay_ms": round(1e3 * delay_s), "exit_s": round(took, 3), "rc": child.returncode,
                "why": "hung (killed after %.0f s)" % exit_timeout_s, "sigint_inherited": inherited, "threads": threads,
                "stderr_tail": err.strip().splitlines()[-40:]}, child.pid
    took = time.time() - t
    raised = "KeyboardInterrupt" in err
    ok = raised and took <= exit_timeout_s
    why = "" if raised else "exit %s without KeyboardInterrupt: %s" % (
        child.returncode, " | ".join(err.strip().splitlines()[-3:]))
    return {"ok": ok, "delay_ms": round(1e3 * delay_s), "exit_s": round(took, 3), "rc": child.returncode,
            "why": why, "sigint_inherited": inherited,
            "dropped": "dropped where Python ignores exceptions" in err}, child.pid


def interrupt(args):
    rng = random.Random(args.seed)
    trials, pids = [], []
    for i in range(args.trials):
        rec, pid = one_interrupt(args.platform, rng.uniform(0.0, 0.5))
        trials.append(rec)
        pids.append(pid)
        print("trial %d: %s" % (i, rec), flush=True)
    left = gpu_processes()
    still = sorted(set(pids) & left) if left is not None else []
    passed = sum(t["ok"] for t in trials)
    worst = max((t.get("exit_s", 0) for t in trials), default=0)
    md = ["# Interrupted training loops (%s)" % args.platform, "",
          "| trials | exited with KeyboardInterrupt within 5 s | hung | slowest exit s | processes left on the GPU |",
          "|---|---|---|---|---|",
          "| %d | %d | %d | %.3f | %s |" % (len(trials), passed, sum("hung" in t["why"] for t in trials), worst,
                                       "n/a (no nvidia-smi)" if left is None else len(still))]
    dropped = sum(bool(t.get("dropped")) for t in trials)
    if dropped:
        md += ["", "In %d of %d trials SIGINT landed while Python ran a gc callback or a finalizer, where it drops "
               "the exception (Python's rule, stock's too): the loop raised at its next step." % (dropped, len(trials))]
    ignored = sum(t.get("sigint_inherited") == "ignored" for t in trials)
    if ignored:
        md += ["", "SIGINT came in ignored in %d of %d children (each sets Python's handler, as a terminal has it)."
               % (ignored, len(trials))]
    bad = [t for t in trials if not t["ok"]]
    if bad:
        md += ["", "Failed trials:"] + ["- %s" % {k: v for k, v in t.items() if k not in ("threads", "stderr_tail")}
                                        for t in bad]
        # The first hang in full: its threads and the end of its stderr (Python's stacks among them).
        hung = [t for t in bad if "threads" in t]
        if hung:
            md += ["", "The first hung trial's threads (name, state, kernel wait: count; native stacks where gdb is):", ""]
            md += ["    " + x for x in hung[0]["threads"]]
            md += ["", "and the end of its stderr (the Python stacks faulthandler wrote on SIGUSR1):", ""]
            md += ["    " + x for x in hung[0]["stderr_tail"]]
    name = results_name("interrupt", args)
    write_results(args.out, name, md, {"platform": args.platform, "trials": trials,
                                                         "left_on_gpu": still})
    return 0 if args.reference or (passed == len(trials) and not still) else 1


def results_name(what, args):
    """The results' file name: a reference run's is named after its platform (beside the plugin's run in the
    same folder)."""
    return "long_runs_" + what + ("_" + args.platform if args.reference else "")


def flat(values, tol_frac=0.01, tol_abs=4 << 20):
    """Do `values` stay within tol of the first?"""
    base = values[0]
    return all(abs(v - base) <= max(tol_frac * base, tol_abs) for v in values)


def soak(args):
    platforms = [p.strip() for p in args.platforms.split(",") if p.strip()]
    results, rows, ok = {}, [], True
    # The first platform's run compiles the step afresh (not an earlier soak's executable).
    exe = os.path.join(args.out, args.model + ".exe.pkl")
    if args.model != "mlp" and os.path.exists(exe):
        os.remove(exe)
    for n, plat in enumerate(platforms):
        key = plat if plat not in results else "%s#%d" % (plat, n)
        # Its log (the plugin's at info) to a file the child measures at every sample.
        env = dict(platform_env(plat), **({"XLA_VMM_LOG": "info"} if plat == "vmm" else {}))
        if args.model != "mlp":
            # Stock must reproduce its own losses for a bitwise comparison (no atomics' order).
            env["XLA_FLAGS"] = " ".join(x for x in [env.get("XLA_FLAGS"), "--xla_gpu_deterministic_ops=true"] if x)
        r, err = run_json_child([sys.executable, "-c", CHILD, str(args.steps), str(args.every), plat, args.model,
                                 os.path.join(HERE, "models"), args.out], env,
                                args.timeout_s, stderr_path=os.path.join(args.out, "long_runs_soak_%s.log" % key))
        if r is None:
            results[key] = {"error": err}
            rows.append("| %s | failed: %s | | | | |" % (key, err))
            ok = False
            continue
        results[key] = r
        s = r["samples"][2:] if len(r["samples"]) > 3 else r["samples"]
        checks = {"rss": flat([x["rss"] for x in s]), "device": flat([x["device_bytes"] for x in s])}
        # What must not move at all (where the child sampled it).
        exact = {"allocations": "allocations", "va_bytes": "va_bytes", "report": "report_entries",
                 "stats": "stats_entries", "library plans": "library_plans"}
        for label, k in exact.items():
            if k in s[0]:
                checks[label] = flat([x[k] for x in s], 0.0, 0)
        # The plugin's open handles: file descriptors and threads (stock's are recorded, not checked: its
        # thread pools are its own).
        if plat == "vmm":
            for k in ("fds", "threads"):
                if k in s[0]:
                    checks[k] = flat([x[k] for x in s], 0.0, 0)
        # No log line per step: within 4 KiB over the rest of the soak (a line a step would be thousands).
        if s[0].get("log_bytes") is not None:
            checks["log"] = flat([x["log_bytes"] for x in s], 0.0, 4096)
        # Drift, where a window is long enough (0.5 s) for its mean not to be noise.
        if len(r["samples"]) >= 4 and args.every * r["samples"][2]["step_ms"] >= 500:
            third, last = r["samples"][2]["step_ms"], r["samples"][-1]["step_ms"]
            checks["step time"] = last <= 1.25 * third
        r["checks"] = checks
        ok &= all(checks.values())
        rows.append("| %s | %d | %.1f -> %.1f | %.1f -> %.1f | %.3f -> %.3f | %s |" % (
            key, r["steps"], s[0]["rss"] / 2**20, s[-1]["rss"] / 2**20, s[0]["device_bytes"] / 2**20,
            s[-1]["device_bytes"] / 2**20, r["samples"][min(2, len(r["samples"]) - 1)]["step_ms"],
            r["samples"][-1]["step_ms"], ", ".join("%s %s" % (k, "flat" if v else "MOVED")
                                                    for k, v in checks.items())))
    sums = {p: r.get("checksum") for p, r in results.items() if "checksum" in r}
    same = len(set(sums.values())) <= 1 and len(sums) == len(platforms)
    ok &= same
    opts = sorted({r["optimizer"] for r in results.values() if "optimizer" in r})
    what = "a two-layer MLP" if args.model == "mlp" else "llama `%s` (integration/models/llama.py, %s), its " \
        "step compiled once by the first platform's run and loaded by the others" % (args.model, "/".join(opts))
    md = ["# Soak: %d steps, sampled every %d" % (args.steps, args.every), "", "The loop: %s; a second program "
          "makes each step's batch on the device from the step number." % what, "",
          "| platform | steps | host RSS MiB (after warm-up -> end) | device MiB | step ms (window 3 -> last) | checks |",
          "|---|---|---|---|---|---|"] + rows + [
          "", "Losses: %s (checksums %s)." % ("bit-identical across platforms" if same else "DIFFER", sums)]
    write_results(args.out, "long_runs_soak", md, results)
    return 0 if ok else 1


# The plugin keeps the binding stats of the last 256 programs dropped (xla_vmm_runtime::binding::KEPT_DROPPED):
# stats() grows until that many were dropped, then stays.
KEPT_DROPPED = 256


def read_json(path):
    """The JSON at `path`, or None (missing or unreadable)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def per_program_ms(prev, x):
    """Milliseconds a program took (compile, run, check, drop and the sample's own work) between two churn
    samples: whether a program costs more as the run goes on. `-` for the first sample, or where not
    recorded."""
    if prev is None or "elapsed_s" not in x or "elapsed_s" not in prev:
        return "-"
    return "%.1f" % (1e3 * (x["elapsed_s"] - prev["elapsed_s"]) / max(1, x["programs_run"] - prev["programs_run"]))


def rss_growth(samples):
    return samples[-1]["rss"] - samples[0]["rss"]


def churn(args):
    name = results_name("churn", args)
    r, err = run_json_child([sys.executable, "-c", CHURN_CHILD, str(args.programs), str(args.every), args.platform],
                            platform_env(args.platform), args.timeout_s)
    if r is None:
        write_results(args.out, name, ["# Churn: failed: %s" % err], {"error": err})
        return 0 if args.reference else 1
    s = r["samples"]
    # The plugin's counters back at their value after the warm-up, exactly (its allocator's cache released
    # first); stats() from the sample where it holds its bound on.
    checks = {"results": not r["wrong"], "rss": flat([x["rss"] for x in s], 0.05, 64 << 20)}
    # Host RSS within 5% (or 64 MiB) of its value after the warm-up, or, where stock ran the same programs
    # (--reference, in the same folder), grown by no more than stock's growth plus 64 MiB: the vendor
    # compiler (the same in both processes) keeps what it compiled.
    ref_path = os.path.join(args.out, "long_runs_churn_cuda.json")
    # Stock's run beside this one (the same programs at the same time, one device call for both): wait for it.
    deadline = time.time() + args.reference_wait_s
    ref = read_json(ref_path)
    while ref is None and not args.reference and time.time() < deadline:
        time.sleep(2)
        ref = read_json(ref_path)
    ref_s = (ref or {}).get("samples") or []
    same = [x["programs_run"] for x in ref_s] == [x["programs_run"] for x in s]
    if not checks["rss"] and same and not args.reference:
        r["rss_growth_vs_stock"] = [rss_growth(s), rss_growth(ref_s)]
        checks["rss"] = rss_growth(s) <= rss_growth(ref_s) + (64 << 20)
    for k in ("programs", "allocations", "va_ranges", "va_bytes", "device_bytes", "library_plans", "buffers_live",
              "pooled"):
        if k in s[0]:
            checks[k] = flat([x[k] for x in s], 0.0, 0)
    if "stats_entries" in s[0]:
        full = [x["stats_entries"] for x in s if x["programs_run"] > KEPT_DROPPED] or [s[0]["stats_entries"]]
        checks["stats_entries"] = flat(full, 0.0, 0) and max(x["stats_entries"] for x in s) <= full[0]
    r["checks"] = checks
    cols = [k for k in ("programs", "buffers_live", "pooled_before_trim", "allocations", "va_ranges", "va_bytes",
                        "device_bytes", "library_plans", "stats_entries") if k in s[0]]
    md = ["# Churn: %d programs compiled, run, checked and dropped in one process (%s), %.0f s" % (
              r["programs"], args.platform, r["seconds"]), "",
          "| " + " | ".join(["programs run", "ms a program since the last sample", "host RSS MiB"] + cols) + " |",
          "|---" * (3 + len(cols)) + "|"]
    md += ["| " + " | ".join([str(x["programs_run"]), per_program_ms(prev, x), "%.1f" % (x["rss"] / 2**20)]
                             + [str(x[k]) for k in cols]) + " |" for prev, x in zip([None] + s, s)]
    md += ["", "Checks: %s." % ", ".join("%s %s" % (k, "ok" if v else "FAILED") for k, v in checks.items())]
    if "pooled_before_trim" in s[0]:
        md.append("On the plugin each sample counts its allocator's cache (`pooled_before_trim`: freed blocks and "
                  "small-buffer granules kept for reuse), releases it (`jax_plugins.xla_vmm.trim()`), then counts the "
                  "rest.")
    if "rss_growth_vs_stock" in r:
        md.append("Host RSS grew %.1f MiB, stock's over the same programs %.1f MiB." % tuple(
            b / 2**20 for b in r["rss_growth_vs_stock"]))
    if r["wrong"]:
        md.append("Wrong results: programs %s." % r["wrong"][:20])
    write_results(args.out, name, md, r)
    return 0 if args.reference or all(checks.values()) else 1


def threads(args):
    cmd = [sys.executable, "-c", THREADS_CHILD, args.platform, str(args.threads), "%g" % args.seconds]
    r, err = run_json_child(cmd, platform_env(args.platform), args.seconds * 5 + 600)
    rows, ok = [], r is not None
    for w in (r or {}).get("workers", []):
        s = r["serial"][w["worker"]]
        same = bool(s) and s.get("checksum") == w["checksum"] and s.get("iterations") == w["iterations"]
        wrong = w.get("wrong", []) + s.get("wrong", [])
        good = same and not wrong and not w["error"] and not s.get("error")
        ok &= good and w["iterations"] > 0
        why = w["error"] or s.get("error") or ""
        if wrong:
            why = ("wrong results (iteration, error from the host's sum or what differed): parallel %s, serial %s; " % (
                w.get("wrong", [])[:5], s.get("wrong", [])[:5]) + why).rstrip("; ")
        elif not same:
            # The first block of iterations whose results differ (the serial replay made the same iterations).
            first = next((b for b, (x, y) in enumerate(zip(w.get("blocks", []), s.get("blocks", []))) if x != y), None)
            block = r["block"]
            why = why or ("results differ from iteration %d on (blocks of %d)" % (first * block, block)
                          if first is not None else "checksums differ")
        rows.append("| %d | %s | %d | %s | %s |" % (
            w["worker"], w["kind"], w["iterations"], "equal" if same else "DIFFER", why.replace("|", "\\|")))
    md = ["# %d threads dispatching at once for %g s (%s)" % (args.threads, args.seconds, args.platform), "",
          "| worker | work | iterations | results vs the same work run serially | error |",
          "|---|---|---|---|---|"] + rows
    if r is None:
        md += ["", "Failed: %s" % err]
    write_results(args.out, "long_runs_threads", md, {"platform": args.platform, "run": r, "error": err})
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    i = sub.add_parser("interrupt")
    i.add_argument("--platform", default="vmm", choices=["vmm", "cuda", "cpu"])
    i.add_argument("--trials", type=int, default=50)
    i.add_argument("--seed", type=int, default=0)
    i.add_argument("--reference", action="store_true",
                   help="a reference run (stock's): its results are written, its exit status is 0")
    s = sub.add_parser("soak")
    s.add_argument("--platforms", default="cuda,vmm")
    s.add_argument("--steps", type=int, default=20000)
    s.add_argument("--every", type=int, default=1000)
    s.add_argument("--timeout-s", type=int, default=1800)
    s.add_argument("--model", default="mlp",
                   help='"mlp", or a config of integration/models/llama.py (llama_small_f32: the A/B model)')
    c = sub.add_parser("churn")
    c.add_argument("--platform", default="vmm", choices=["vmm", "cuda", "cpu"])
    c.add_argument("--programs", type=int, default=2000)
    c.add_argument("--every", type=int, default=200)
    c.add_argument("--timeout-s", type=int, default=1800)
    c.add_argument("--reference", action="store_true",
                   help="a reference run (stock's): its results are written, its exit status is 0")
    c.add_argument("--reference-wait-s", type=float, default=0.0,
                   help="seconds to wait for stock's results in --out when its run goes on beside this one")
    t = sub.add_parser("threads")
    t.add_argument("--platform", default="vmm", choices=["vmm", "cuda", "cpu"])
    t.add_argument("--threads", type=int, default=8)
    t.add_argument("--seconds", type=float, default=120.0)
    for p in (i, s, c, t):
        p.add_argument("--out", default=".")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    return {"interrupt": interrupt, "soak": soak, "churn": churn, "threads": threads}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
