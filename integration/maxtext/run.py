"""MaxText synthetic llama training on the GPU machine: stock XLA in every configuration vs xla-vmm in
every mode, one process per run, then a table (benchmark, not a test).

    python3 integration/maxtext/run.py --mt DIR [--out OUT] [--configs tiny,1B] [--variants ...] [--balance 1B]

Configs: `tiny` (launch bound), `1B` (llama2-7b widths, 4 layers, seq 2048), `8L` (the same, 8 layers),
`1B_offload` (MaxText's own host offload). DIR holds `.mt` (MaxText's source) and `.wheels` (what MaxText
needs that the GPU machine lacks), made by integration/maxtext/prepare.sh; the xla-vmm wheel is --wheel
(default integration/dist/*.whl or DIR/*.whl). Variants: the stock configurations of stock_configs.py by key
(`cuda` = command buffers on, `cuda_nocb`, `cuda_skip_temp`, `cuda_skip_profiled`; stock runs see the vmm
package but not its library), and `vmm_t1` (the default: VA-stable graphs, auto), `vmm_t0`, `vmm_tN`,
`vmm_eager`, `vmm_recapture`; any variant may carry extra environment after `@`:
`vmm_t1@XLA_VMM_COPY_PATH=batch`, and a `CONFIG:` prefix to run for that config only
(`tiny:cuda_skip_profiled`). --balance: configs whose stock rows and default run twice, the second round in
the other order (A B B A; perf_gate.py takes each row's mean).

Step time: MaxText prints `seconds:` with 3 decimals, too coarse for the tiny config, and
`Tokens/s/device:` with 3 decimals of tokens/s, which is exact enough: ms/step = tokens per step /
(tokens/s). Median over steps >= --measure-from (default 3; the gate: 40 of 60, after every row's warm-up). Losses (3 decimals, as MaxText prints them) are compared per step
against the same config's `cuda` run. Writes OUT/mt.json and OUT/mt.md after every run (a call cut short
keeps what it finished), and every run's log into OUT/mt_logs.tar.gz. --budget-s: no run starts once
that many seconds have passed, and a run's timeout is cut to what is left.

Our runs write the plugin's `report()` at exit (XLA_VMM_REPORT) with JAX logging its compiles
(JAX_LOG_COMPILES=1): each vmm row gets `programs`, what ran how, and the programs JAX compiled that the report
does not list (issue 32: it must list every one); mt.md has a line per run.

Half of a run's ~35 s is Python importing MaxText (no GPU work). So the next run's process is started, at
low CPU priority, while the current one runs: it imports MaxText, says so, and waits; it is let go (its
environment set from the start) once the current run has exited. A run's wall time counts from its go. The
import overlaps the current run's start (its compile) but not its steps: from the current run's first
completed step until it exits, a next process still importing is stopped (SIGSTOP, then SIGCONT). MaxText
tiny's step is bound by the host, and its 60 steps take ~0.2 s some 15 s after the go, about when an import
started with it ends: in two gates whole tiny runs of every mode, stock's included, ran up to 1.8x slower than
in the other call, or changed speed mid-run (`integration/results/perf_gate_cf9c1b4.md`). Each row says
whether it paused one, on which CPUs the run's main thread was seen from its first completed step (sampled
every 50 ms) and the load average at its end.
"""
import argparse
import glob
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from benchio import staged_line, staged_of  # noqa: E402
from stock_configs import STOCK_CONFIGS, with_flags  # noqa: E402

CONFIGS = {
    # (MaxText args, tokens per step at per_device_batch_size=1)
    "tiny": ("base_num_decoder_layers=2 base_emb_dim=256 base_mlp_dim=512 base_num_query_heads=4 "
             "base_num_kv_heads=4 head_dim=64 max_target_length=128", 128),
    "1B": ("base_num_decoder_layers=4 max_target_length=2048", 2048),  # llama2-7b widths, ~1B params
    # The same widths, 8 layers: the ROCm PR's benchmark shape (issue 30's table; 0.995x stock at 1f6f0d4).
    "8L": ("base_num_decoder_layers=8 max_target_length=2048", 2048),
    # The same with MaxText's own host offload of parameters and optimizer state (issue 29's training
    # baseline, with a memory fraction on stock: `1B_offload:cuda@XLA_PYTHON_CLIENT_MEM_FRACTION=0.07`, against
    # `1B:vmm_t1@XLA_VMM_DEVICE_MEMORY_LIMIT=10G`; ../shared/maxtext/README.md says how it failed on stock).
    "1B_offload": ("base_num_decoder_layers=4 max_target_length=2048 param_scan_axis=0 "
                   "parameter_memory_host_offload=true optimizer_memory_host_offload=true", 2048),
}
STEP_RE = re.compile(r"completed step: (\d+), seconds: ([0-9.]+).*?Tokens/s/device: ([0-9.]+).*?loss: ([0-9.eE+-]+|nan|inf)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
VMM_LINE = re.compile(r"\b(WARN|ERROR)\b\s+(xla_vmm\S*)")
COMPILING = re.compile(r"Compiling (\S+) with global shapes")
# --profile traces this many steps (MaxText's profiler_steps).
PROFILER_STEPS = 2
DEFAULT_VARIANTS = "cuda,cuda_nocb,cuda_skip_temp,cuda_skip_profiled,vmm_t1,vmm_t0,vmm_eager,vmm_recapture"


def variant_env(variant):
    """The environment of `variant` (None when unknown)."""
    base, _, extra = variant.partition("@")
    env = dict(x.split("=", 1) for x in extra.split(",") if "=" in x)
    stock = {short: flags for _, flags, short in STOCK_CONFIGS}
    if base in stock:
        return dict(env, JAX_PLATFORMS="cuda", XLA_VMM_LIBRARY="/nonexistent",
                    XLA_FLAGS=with_flags(os.environ.get("XLA_FLAGS", ""), stock[base]))
    modes = {"vmm_eager": {"XLA_VMM_EXEC_MODE": "eager"}, "vmm_recapture": {"XLA_VMM_EXEC_MODE": "graph-recapture"}}
    # The plugin's binding stats and decisions go to the log (info) unless XLA_VMM_LOG says otherwise.
    vmm = {"JAX_PLATFORMS": "vmm", "XLA_VMM_LOG": os.environ.get("XLA_VMM_LOG", "info")}
    if base in modes:
        return {**vmm, **modes[base], **env}
    m = re.fullmatch(r"vmm_t(\d+)", base)
    if m:
        return {**vmm, "XLA_VMM_EXEC_MODE": "graph", "XLA_VMM_TMP_COPY_THRESHOLD": m.group(1), **env}
    return None


def variants_of(spec, cfg):
    """The variants of a comma list that apply to config `cfg`: plain entries apply to every config,
    `CONFIG:VARIANT` entries to that config only."""
    out = []
    for v in (x.strip() for x in spec.split(",")):
        c, sep, rest = v.partition(":")
        if not v or (sep and c != cfg):
            continue
        out.append(rest if sep else v)
    return out


def essential(var):
    """A row the gate compares: a stock configuration or our default (`vmm_t1`); the others diagnose."""
    base = var.partition("@")[0]
    return base in {short for _, _, short in STOCK_CONFIGS} or base == "vmm_t1"


# A balanced config's second round (--balance) runs each gate row again, told apart by an environment entry
# that nothing reads (its own work folder and log).
ROUND_TWO = "MT_ROUND=2"


def again(var):
    """`var`'s run in the second round."""
    return var + ("," if "@" in var else "@") + ROUND_TWO


def first_round(var):
    """The variant a second-round run repeats (None for a first-round one)."""
    for sep in (",", "@"):
        if var.endswith(sep + ROUND_TWO):
            return var[:-len(sep + ROUND_TWO)]
    return None


def run_order(configs, variants, balance=()):
    """The runs (config, variant) in the order they are made: every config's stock rows and the default
    (`vmm_t1`) first, then our other modes, so that a budget cut short still measures what the gate
    compares (each config's best stock against the default) before the diagnostic rows. A config in
    `balance` runs its gate rows a second time right after the first, in the other order (A B B A): a run
    pays something for coming later (in 17 of 19 gates MaxText 1B's default, run after stock, came
    0.2-1.4% behind it; with the order balanced, twice, 0.1%: `integration/results/perf_gate_678393f.md`)."""
    cfgs = [c for c in configs.split(",") if c]
    gate = []
    for cfg in cfgs:
        mine = [(cfg, v) for v in variants_of(variants, cfg) if essential(v)]
        gate += mine + ([(cfg, again(v)) for _, v in reversed(mine)] if cfg in balance else [])
    return gate + [(cfg, v) for cfg in cfgs for v in variants_of(variants, cfg) if not essential(v)]


def exit_status(rows, required=()):
    """0 when every run that counts succeeded: with `required` (variant prefixes) only their rows count;
    a diagnostic row the budget left out does not (the gate's rows run first: `run_order`)."""
    def counts(r):
        if required and not r["variant"].startswith(required):
            return False
        return not (r["rc"] == "skip" and r["error"].startswith("budget spent") and not essential(r["variant"]))
    return 0 if all(r["rc"] == 0 for r in rows if counts(r)) else 1


def parse_log(lines, tokens):
    """{step: (ms, loss)} from a MaxText log."""
    steps = {}
    for line in lines:
        m = STEP_RE.search(ANSI.sub("", line))
        if m:
            tps = float(m.group(3))
            ms = tokens / tps * 1e3 if tps > 0 else float(m.group(2)) * 1e3
            steps[int(m.group(1))] = (ms, float(m.group(4)))
    return steps


# The process of one run: import MaxText's trainer (CPU only: jax creates no backend at import), say so
# on stdout, wait for a line on stdin (the go), then run the trainer with argv[1:] as its arguments.
PRELUDE = """
import os, sys
os.nice(10)
import maxtext.trainers.pre_train.train as train
print("xla-vmm harness: MaxText imported, waiting", flush=True)
go = sys.stdin.readline()
if go.strip() != "go":
    sys.exit(0)
os.nice(-10) if os.geteuid() == 0 else None
from absl import app
sys.argv = ["train"] + sys.argv[1:]
app.run(train.main)
"""


IMPORTED = "xla-vmm harness: MaxText imported, waiting"
STEPPING = re.compile(r"completed step: \d+")


def cpu_of(pid):
    """The CPU a process's main thread last ran on (None when it is gone): `/proc/PID/stat`'s field 39."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None


class Prepared:
    """A run's process, started ahead and waiting for its go (see PRELUDE)."""

    def __init__(self, cmd, env, log):
        self.log = log
        self.fh = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-c", PRELUDE] + cmd, env=env, stdin=subprocess.PIPE,
                                     stdout=self.fh, stderr=subprocess.STDOUT, text=True)
        self.read_to = 0  # how far `said` has read the log
        self.cpus = {}  # CPU -> samples of its main thread's, from its first completed step (`go`)

    def said(self, pattern):
        """Whether the log written since the last call matches `pattern` (a line is read once)."""
        with open(self.log, "rb") as fh:
            fh.seek(self.read_to)
            data = fh.read()
        whole = data[:data.rfind(b"\n") + 1]  # a line still being written is read next time, whole
        self.read_to += len(whole)
        return re.search(pattern, whole.decode(errors="replace")) is not None

    def go(self, timeout, beside=None):
        """Let it run; (its exit status, 124 when it outlived `timeout` seconds and was killed; whether
        `beside`, the next run's process, was stopped while it still imported: from this run's first
        completed step until it exited, see the module's doc)."""
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # it died while importing: its log says why
        deadline = time.monotonic() + timeout
        importing = beside is not None and beside.proc.poll() is None
        paused = stepping = False
        rc = None
        try:
            while rc is None:
                try:
                    rc = self.proc.wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    if time.monotonic() > deadline:
                        self.proc.kill()
                        self.proc.wait()
                        rc = 124
                        continue
                    stepping = stepping or self.said(STEPPING)
                    if not stepping:
                        continue
                    cpu = cpu_of(self.proc.pid)
                    if cpu is not None:
                        self.cpus[cpu] = self.cpus.get(cpu, 0) + 1
                    if importing and not paused:
                        importing = not beside.said(re.escape(IMPORTED)) and beside.proc.poll() is None
                        if importing:
                            os.kill(beside.proc.pid, signal.SIGSTOP)
                            paused = True
        finally:
            if paused:
                os.kill(beside.proc.pid, signal.SIGCONT)
        self.fh.close()
        return rc, paused

    def cancel(self):
        """Not to run after all: ended without its go."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.fh.close()


def programs_of(lines, reports):
    """What the plugin's reports (`report()` data written at exit) say of the programs JAX compiled (its
    `Compiling NAME` log lines): how many each runner ran, those not on a graph with why, and the compiled
    names no report lists. JAX logs `jit(f)` (older releases `f`) where the HLO module is `jit_f`, its
    name's other characters made `_` (`jit(<lambda>)`: `jit__lambda_`)."""
    # Alive at exit, and dropped before it (a loop's train_step is a local of MaxText's loop).
    listed = [p for r in reports for p in r.get("programs", []) + r.get("dropped", [])]
    compiled = [m.group(1) for m in (COMPILING.search(ANSI.sub("", x)) for x in lines) if m]
    def key(name):
        inner = re.fullmatch(r"jit\((.*)\)", name)
        name = inner.group(1) if inner else re.sub(r"^jit_", "", name)
        return re.sub(r"[^A-Za-z0-9_]", "_", name).strip("_")

    names = {key(p["program"]) for p in listed}
    runners = {}
    for p in listed:
        runners[p["runner"]] = runners.get(p["runner"], 0) + 1
    return {"listed": len(listed), "compiled": len(compiled), "by_runner": runners,
            "not_graph": sorted({(p["program"], p["runner"], p.get("reason") or "") for p in listed
                                 if p["runner"] not in ("va-stable graph", "graph-recapture")}),
            "unlisted": sorted({c for c in compiled if key(c) not in names}),
            # Graph-recapture programs that captured at more than two steps: their parameters' addresses changed,
            # each capture a cost on the host (where the default and graph-recapture mode part on a
            # launch-bound step).
            "recapturing": sorted((p["program"], p["graph_captures"], p["steps"]) for p in listed
                                  if p["runner"] == "graph-recapture" and p.get("graph_captures", 0) > 2),
            # Programs the never-slower guard gave another runner than graph-recapture, with what it measured (where
            # the default and graph-recapture mode part on a launch-bound step: each such program's runner costs the
            # host its own time a step).
            "off_recapture": [guard_of(p) for p in listed if p["runner"] != "graph-recapture" and p.get("guard")],
            "staged": [staged_of(p) for p in listed if p.get("staging")]}


def guard_of(p):
    """A program's runner and steps, with its guard's decision: the step it was taken at, the medians (ms) it
    compared, and its second look's (`None` where it had none)."""
    g = p["guard"]
    def ms(d, k):
        return None if d.get(k) is None else round(d[k] / 1e3, 3)
    def look(d):
        return {"at": d.get("decided_at_step"), "va_stable": ms(d, "va_stable_us"),
                "recapture": ms(d, "recapture_us"), "eager": ms(d, "eager_us")}
    return {"program": p["program"], "runner": p["runner"], "steps": p.get("steps", 0),
            "guard": dict(look(g), second=look(g["second_look"]) if g.get("second_look") else None)}


def guard_text(g):
    """`guard_of`'s record in a few words."""
    def look(d):
        figs = ", ".join("%s %.3f" % (k.replace("_", "-"), d[k]) for k in ("va_stable", "recapture", "eager")
                         if d[k] is not None)
        return "at step %s (%s ms)" % (d["at"], figs)
    text = "%s %s, %d steps, decided %s" % (g["program"], g["runner"], g["steps"], look(g["guard"]))
    return text + (", second look " + look(g["guard"]["second"]) if g["guard"]["second"] else "")


def programs_line(row):
    """One line of mt.md: a run's programs (`programs_of`)."""
    p = row["programs"]
    text = "- %s %s: %d programs listed (JAX compiled %d): %s" % (
        row["config"], row["variant"], p["listed"], p["compiled"],
        ", ".join("%d %s" % (n, r) for r, n in sorted(p["by_runner"].items())) or "none")
    if p["not_graph"]:
        text += "; not a graph: " + "; ".join("%s (%s%s)" % (n, r, ": " + why[:120] if why else "")
                                              for n, r, why in p["not_graph"])
    if p.get("recapturing"):
        text += "; graph-recapture capturing again: " + ", ".join("%s %d of %d steps" % r for r in p["recapturing"])
    if p["unlisted"]:
        text += "; NOT LISTED: " + ", ".join(p["unlisted"])
    for g in p.get("off_recapture", []):
        text += "\n  - not on graph-recapture: " + guard_text(g)
    for st in p.get("staged", []):
        text += "\n  - " + staged_line(st)
    return text


def first_error(lines, rc):
    for line in lines:
        if re.search(r"\bERROR\b\s+xla_vmm", line) or "panicked at" in line:
            return line.strip()
    # The last traceback's exception: the one that ended the process (an earlier one may have been
    # caught and logged, or chained under it).
    for i in reversed([i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]):
        for m in lines[i + 1:]:
            if m.strip() and not m[0].isspace():
                return m.strip()
    for line in lines:
        if re.search(r"Fatal Python error|Segmentation fault|core dumped|Check failed|F\d{4} ", line):
            return line.strip()
    if rc in (124, 137, -9, -15):
        return "timeout (killed)"
    if rc not in (0, None):
        tail = [x.strip() for x in lines if x.strip()]
        return tail[-1] if tail else "no output"
    return ""


def gpu_table(rows):
    """Markdown lines (none when no row was traced): per traced run, the GPU's work per step (the traced
    steps' kernels and copies: their sum, and their union over the streams) against the run's step time
    (the median of its untraced steps), and the idle fraction 1 - union / step (issue 30: a step is no
    faster than its GPU work; what the GPU idles is launch and host time)."""
    traced = [r for r in rows if r.get("gpu") and r["median_ms"]]
    if not traced:
        return []
    out = ["", "GPU time per step (--profile: %d traced steps; CUPTI records the kernels and copies of every "
           "stream):" % PROFILER_STEPS, "",
           "| config | variant | step ms (median) | GPU work, sum ms | GPU busy, union ms | traced span ms "
           "| idle (1 - busy / step) |", "|---|---|---|---|---|---|---|"]
    for r in traced:
        g = r["gpu"]
        out.append("| %s | %s | %.3f | %.3f | %.3f | %.3f | %.1f%% |" % (
            r["config"], r["variant"], r["median_ms"], sum(v[0] for v in g["kernels"].values()), g["busy_ms"],
            g["span_ms"], 100.0 * (1.0 - g["busy_ms"] / r["median_ms"])))
    return out


def summarize(rows, first=3):
    """Markdown: per run the median ms/step, the ratio against the best stock of its config, loss drift."""
    out = ["| config | variant | rc | steps | median ms/step (steps >= %d) | vs best stock | max abs dloss vs cuda "
           "| vmm WARN/ERROR lines | first error |" % first, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        stock = [x["median_ms"] for x in rows if x["config"] == r["config"] and x["variant"].startswith("cuda")
                 and x["median_ms"]]
        best = min(stock) if stock else None
        vs = "%.2fx" % (best / r["median_ms"]) if best and r["median_ms"] else "-"
        f = lambda v, p: ("%%.%df" % p) % v if isinstance(v, (int, float)) else "-"  # noqa: E731
        err = (r["error"] or "").replace("|", "\\|")[:200]
        out.append("| %s | %s | %s | %d | %s | %s | %s | %d | %s |" % (
            r["config"], r["variant"], r["rc"], r["steps_done"], f(r["median_ms"], 3), vs, f(r["max_dloss"], 3),
            r["vmm_lines"], err))
    out += gpu_table(rows)
    progs = [programs_line(r) for r in rows if r.get("programs")]
    if progs:
        out += ["", "Programs of our runs (the plugin's report() at exit, against JAX's compile log):"] + progs
    return "\n".join(out)


def install_site(mt, wheel, site, say):
    """Installs MaxText's missing wheels (MT/.wheels) and the xla-vmm wheel (`wheel`, default
    integration/dist/*.whl or MT/*.whl) into `site`; (MaxText's source folder, the runs' base environment,
    whether the xla-vmm plugin is there). Exits when MaxText's source is missing or pip fails."""
    src = os.path.join(mt, ".mt", "src")
    if not os.path.isdir(os.path.join(src, "maxtext")):
        sys.exit("no %s/maxtext (run integration/maxtext/prepare.sh, carry its folder)" % src)
    wheels = glob.glob(os.path.join(mt, ".wheels", "*.whl"))
    vmm = wheel or next(iter(sorted(glob.glob(os.path.join(HERE, "..", "dist", "*.whl")) +
                                    glob.glob(os.path.join(mt, "*.whl")))), None)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--upgrade", "--target", site]
    if subprocess.run(pip + wheels + ([vmm] if vmm else [])).returncode != 0:
        sys.exit("pip install of %s/.wheels%s failed" % (mt, " and " + vmm if vmm else ""))
    have_vmm = os.path.isfile(os.path.join(site, "jax_plugins", "xla_vmm", "xla_vmm_plugin.so"))
    say("wheels installed into %s; xla-vmm wheel %s" % (site, vmm if have_vmm else "MISSING"))
    env0 = dict(os.environ, PYTHONPATH=":".join([site, src, os.path.join(mt, ".mt", "stubs")]),
                DECOUPLE_GCLOUD="TRUE", PYTHONUNBUFFERED="1", NO_COLOR="1")
    return src, env0, have_vmm


def trainer_args(src, cfg, run_name, work, steps, extra="", checkpointing=()):
    """MaxText's trainer arguments for one run of config `cfg` whose output and compilation cache live
    under `work`; `checkpointing`: more key=value arguments (none: checkpointing off)."""
    args, _ = CONFIGS[cfg]
    os.makedirs(work + "/cache", exist_ok=True)
    return [os.path.join(src, "maxtext", "configs", "base.yml"), "run_name=" + run_name,
            "base_output_directory=" + work + "/out", "jax_cache_dir=" + work + "/cache",
            "model_name=llama2-7b", "override_model_config=true", "per_device_batch_size=1",
            "dataset_type=synthetic", "hardware=gpu", "attention=dot_product", "steps=%d" % steps] + \
        (list(checkpointing) or ["enable_checkpointing=false"]) + args.split() + extra.split()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mt", required=True, help="folder with .mt and .wheels (prepare.sh)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/mt_ab"))
    ap.add_argument("--configs", default="tiny,1B")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--measure-from", type=int, default=3, help="medians over the steps from this one on")
    ap.add_argument("--timeout", type=int, default=150, help="per run, seconds")
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--wheel", default=None)
    ap.add_argument("--site", default="/tmp/mt_site")
    ap.add_argument("--extra", default="", help="more MaxText key=value args for every run")
    ap.add_argument("--profile", type=int, default=None, metavar="STEP",
                    help="trace steps STEP and STEP+1 of every run with jax.profiler (MaxText's profiler=xplane; "
                         "our runs as JAX_PLATFORMS=vmm,cuda so that the CUDA plugin's tracer records the kernels) "
                         "and draw the longest step as OUT/CONFIG_VARIANT_step.svg (diag/trace_timeline.py); mt.md "
                         "gets each run's GPU work per step against its step time (the median leaves the traced "
                         "steps out)")
    ap.add_argument("--balance", default="",
                    help="comma list of configs whose gate rows (stock and vmm_t1) run twice, A B B A; "
                         "perf_gate.py takes each row's mean")
    ap.add_argument("--required", default="",
                    help="comma list of variant prefixes whose runs must succeed for exit status 0 (default: all "
                         "runs); the others are measured, their failures reported")
    a = ap.parse_args()
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    logd = "/tmp/mt_ab_logs"
    os.makedirs(logd, exist_ok=True)
    say = lambda msg: print("[mt %4ds] %s" % (time.time() - t0, msg), flush=True)  # noqa: E731
    src, env0, have_vmm = install_site(a.mt, a.wheel, a.site, say)
    rows = []

    plan = run_order(a.configs, a.variants, [c for c in a.balance.split(",") if c])
    # Rows are shown in the order asked for (config by config, a second round's run after its first), whatever
    # order they ran in.
    asked = {p: i for i, p in enumerate(sorted(plan, key=lambda p: (
        a.configs.split(",").index(p[0]), variants_of(a.variants, p[0]).index(first_round(p[1]) or p[1]),
        first_round(p[1]) is not None)))}

    def save():
        shown = sorted(rows, key=lambda r: asked.get((r["config"], r["variant"]), len(asked)))
        with open(os.path.join(a.out, "mt.json"), "w") as fh:
            json.dump({"steps": a.steps, "measure_from": a.measure_from, "rows": shown}, fh, indent=1)
        with open(os.path.join(a.out, "mt.md"), "w") as fh:
            fh.write(summarize(shown, a.measure_from) + "\n")
        with tarfile.open(os.path.join(a.out, "mt_logs.tar.gz"), "w:gz") as tf:
            tf.add(logd, arcname="mt_logs")

    def work_of(cfg, var):
        return "/tmp/mt_ab_work/%s_%s" % (cfg, re.sub(r"[^A-Za-z0-9_]", "_", var))

    extra = a.extra
    if a.profile is not None:
        extra += " profiler=xplane skip_first_n_steps_for_profiler=%d profiler_steps=%d" % (a.profile, PROFILER_STEPS)

    def traced_step(k):
        """Whether step k ran under the profiler, or wrote its trace: not a timed step."""
        return a.profile is not None and a.profile <= k <= a.profile + PROFILER_STEPS

    def command(cfg, var):
        return trainer_args(src, cfg, "mt_%s_%s" % (cfg, var.split("@")[0]), work_of(cfg, var), a.steps, extra)

    def run_env(var):
        env = variant_env(var)
        if env is not None and a.profile is not None and env["JAX_PLATFORMS"] == "vmm":
            # The CUDA plugin loaded beside ours (not preallocating) records every kernel of the process.
            env = dict(env, JAX_PLATFORMS="vmm,cuda", XLA_PYTHON_CLIENT_PREALLOCATE="false")
        return env

    def traced(cfg, var, row):
        """The traced run's GPU time per step (`row["gpu"]`, kernel_times.gpu_summary over the profiler's
        two steps) and its longest step as an SVG in OUT (its trace copied beside it)."""
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "diag"))
        import kernel_times
        import trace_timeline

        name = os.path.basename(work_of(cfg, var))
        found = glob.glob(os.path.join(work_of(cfg, var), "**", "*.xplane.pb"), recursive=True)
        if not found:
            return "no trace written"
        trace = max(found, key=os.path.getmtime)
        shutil.copy(trace, os.path.join(a.out, name + ".xplane.pb"))
        gpu = kernel_times.gpu_summary(trace, PROFILER_STEPS)
        if gpu.get("planes"):
            row["gpu"] = gpu
        try:
            lines = trace_timeline.load(trace)
            start, end = trace_timeline.window(lines, "step", None)
        except SystemExit as e:
            return str(e)
        title = "MaxText %s, %s: one training step, %.3f ms" % (cfg, var, (end - start) / 1e6)
        svg, summary = trace_timeline.svg(lines, start, end, title)
        with open(os.path.join(a.out, name + "_step.svg"), "w") as fh:
            fh.write(svg)
        return "\n".join([title] + summary)

    def prepare(k):
        """Start run k's process ahead (None when its variant cannot run)."""
        if k >= len(plan):
            return None
        cfg, var = plan[k]
        env = run_env(var)
        if env is None or (env["JAX_PLATFORMS"].startswith("vmm") and not have_vmm):
            return None
        log = os.path.join(logd, "mt_%s_%s.log" % (cfg, re.sub(r"[^A-Za-z0-9_=.-]", "_", var)))
        cmd = command(cfg, var)
        if env["JAX_PLATFORMS"].startswith("vmm"):
            for old in glob.glob(os.path.join(work_of(cfg, var), "report_*.json")):
                os.remove(old)
            env = dict(env, XLA_VMM_REPORT=os.path.join(work_of(cfg, var), "report_%p.json"),
                       JAX_LOG_COMPILES="1")
        return Prepared(cmd, dict(env0, **env), log)

    ahead = prepare(0)
    for k, (cfg, var) in enumerate(plan):
        _, tokens = CONFIGS[cfg]
        env = run_env(var)
        current, ahead = ahead, None
        row = {"config": cfg, "variant": var, "rc": "skip", "steps_done": 0, "median_ms": None,
               "max_dloss": None, "vmm_lines": 0, "error": "", "ms": {}, "losses": {}}
        if first_round(var):
            row["repeats"] = first_round(var)
        left = a.budget_s - (time.time() - t0) - 15
        if env is None:
            row["error"] = "unknown variant"
        elif env["JAX_PLATFORMS"].startswith("vmm") and not have_vmm:
            row["error"] = "no xla-vmm wheel"
        elif left < 40:
            row["error"] = "budget spent (--budget-s %g)" % a.budget_s
        if row["error"] or current is None:
            if current is not None:
                current.cancel()
            row["error"] = row["error"] or "could not start"
            ahead = prepare(k + 1)
            say("%s %s: skipped (%s)" % (cfg, var, row["error"]))
            rows.append(row)
            save()
            continue
        tmo = int(min(a.timeout, left))
        say("%s %s: go (%s, timeout %ds)" % (cfg, var, " ".join("%s=%s" % kv for kv in env.items()
                                                                 if kv[0] != "XLA_FLAGS" or kv[1]), tmo))
        t1 = time.time()
        # The next run imports MaxText while this one runs (see the module's doc).
        ahead = prepare(k + 1)
        rc, paused = current.go(tmo, beside=ahead)
        lines = open(current.log, errors="replace").read().splitlines()
        st = parse_log(lines, tokens)
        later = [v[0] for k2, v in st.items() if k2 >= a.measure_from and not traced_step(k2)]
        base = next((r for r in rows if r["config"] == cfg and r["variant"] == "cuda"), None)
        common = sorted(set(st) & set(int(k2) for k2 in base["losses"])) if base and var != "cuda" else []
        row.update(rc=rc, steps_done=len(st), wall_s=round(time.time() - t1, 1),
                   median_ms=statistics.median(later) if later else None,
                   ms={k2: v[0] for k2, v in st.items()}, losses={k2: v[1] for k2, v in st.items()},
                   max_dloss=max(abs(st[k2][1] - base["losses"][k2]) for k2 in common) if common else None,
                   vmm_lines=sum(1 for x in lines if VMM_LINE.search(x)), error=first_error(lines, rc),
                   paused_next_import=paused, main_thread_cpus=current.cpus, loadavg=os.getloadavg())
        if env["JAX_PLATFORMS"].startswith("vmm"):
            reports = []
            for f in glob.glob(os.path.join(work_of(cfg, var), "report_*.json")):
                try:
                    with open(f) as fh:
                        reports.append(json.load(fh))
                except (OSError, ValueError) as e:
                    say("%s %s: report %s unreadable: %s" % (cfg, var, f, e))
            if reports:
                row["programs"] = programs_of(lines, reports)
        rows.append(row)
        save()
        say("%s %s: rc=%s in %.0fs, %d steps, median %s ms/step" % (
            cfg, var, rc, row["wall_s"], len(st), "%.3f" % row["median_ms"] if row["median_ms"] else "-"))
        if a.profile is not None:
            say("%s %s: trace: %s" % (cfg, var, traced(cfg, var, row)))
            save()
    if ahead is not None:
        ahead.cancel()
    print(summarize(rows, a.measure_from))
    return exit_status(rows, tuple(p for p in a.required.split(",") if p))


if __name__ == "__main__":
    sys.exit(main())
