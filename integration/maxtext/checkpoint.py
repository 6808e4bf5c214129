"""MaxText checkpoint and resume through the plugin, against stock XLA (issue 34 item 5; a test on the GPU
machine, not a benchmark).

    python3 integration/maxtext/checkpoint.py --mt DIR [--out OUT] [--config tiny] [--steps N]

Eight MaxText runs of one config (synthetic data, orbax checkpoints in a local folder), one process each:

    stock_full, vmm_full        2N steps, no checkpoint
    stock_save, vmm_save        N steps, then the final state saved (MaxText's save_checkpoint_on_completion)
    stock_resume, vmm_resume    2N steps from the same folder: restored at step N, steps N..2N-1 run (and
                                saved at step N asynchronously while the next steps run, period N)
    vmm_from_stock              2N steps from a copy of stock_save's folder: stock's checkpoint resumed on us
    stock_from_vmm              2N steps from a copy of vmm_save's folder: ours resumed on stock

Every run writes each step's loss with all its bits (MaxText's `metrics_file`: float32 as a JSON double). The
checks, each over steps N..2N-1 unless it says otherwise, bit for bit:

    completed       every run exited 0 with all of its steps
    first half      vmm_save's steps 0..N-1 equal vmm_full's (the run that saves computed what the plain run did)
    resume on us    vmm_resume equals vmm_full (the issue's target: resuming loses nothing)
    resume on stock stock_resume equals stock_full (stock's own resume; if it fails, stock is not deterministic)
    as stock        vmm_resume equals stock_resume
    stock -> us     vmm_from_stock equals stock_resume (stock's saved state continued on us)
    us -> stock     stock_from_vmm equals vmm_resume (our saved state continued on stock)

and, for context, whether vmm_full equals stock_full over all 2N steps. Every run has one learning-rate schedule
(learning_rate_schedule_steps=2N) and, by default, deterministic reductions and no autotuning (--xla-flags): without
them a run differs from another of the same platform and steps (a first GPU run: stock's resume against stock's
uninterrupted run, 0.24 apart at step N). A failed check says its first differing
step and the largest |dloss|. Exit status 0 when every check passes. Writes OUT/ckpt.json, OUT/ckpt.md and every
run's log into OUT/ckpt_logs.tar.gz. The next run's process imports MaxText while the current one runs (run.py's
Prepared); a save run and its resume share one folder and so one JAX compilation cache, as a resumed job would.
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import CONFIGS, Prepared, first_error, install_site, trainer_args, variant_env  # noqa: E402

# Bit-for-bit comparisons between processes need the same numbers from the same state: reductions without
# atomics (the embedding's gradient is a scatter-add) and one GEMM algorithm choice (autotuning may pick
# another in another process).
DETERMINISTIC = "--xla_gpu_deterministic_ops=true --xla_gpu_autotune_level=0"

# (run, platform variant, lineage folder, steps: "half" or "full", checkpointing, folder copied from before it runs)
RUNS = [
    ("stock_full", "cuda", "stock_full", "full", False, None),
    ("vmm_full", "vmm_t1", "vmm_full", "full", False, None),
    ("stock_save", "cuda", "stock_ckpt", "half", True, None),
    ("vmm_save", "vmm_t1", "vmm_ckpt", "half", True, None),
    # The cross runs' folders are copied before the resumes below write their later checkpoints.
    ("vmm_from_stock", "vmm_t1", "stock_to_vmm", "full", True, "stock_ckpt"),
    ("stock_from_vmm", "cuda", "vmm_to_stock", "full", True, "vmm_ckpt"),
    ("stock_resume", "cuda", "stock_ckpt", "full", True, None),
    ("vmm_resume", "vmm_t1", "vmm_ckpt", "full", True, None),
]
# (check, run, reference run, first step: 0 or "half")
CHECKS = [
    ("first half", "vmm_save", "vmm_full", 0),
    ("resume on us", "vmm_resume", "vmm_full", "half"),
    ("resume on stock", "stock_resume", "stock_full", "half"),
    ("as stock", "vmm_resume", "stock_resume", "half"),
    ("stock -> us", "vmm_from_stock", "stock_resume", "half"),
    ("us -> stock", "stock_from_vmm", "vmm_resume", "half"),
]


def read_losses(path):
    """{step: loss} from a MaxText metrics file (JSON lines with `step` and `learning/loss`)."""
    out = {}
    if not os.path.isfile(path):
        return out
    with open(path, errors="replace") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
                out[int(rec["step"])] = float(rec["learning/loss"])
            except (ValueError, KeyError, TypeError):
                continue
    return out


def bits(x):
    """The float32 bits of a loss (MaxText's losses are float32 written as doubles)."""
    return struct.unpack("<I", struct.pack("<f", x))[0] if math.isfinite(x) else repr(x)


def compare(run, ref, steps):
    """(equal, first differing step or None, max |dloss| or None, missing steps) over `steps`."""
    missing = [s for s in steps if s not in run or s not in ref]
    common = [s for s in steps if s in run and s in ref]
    diff = [s for s in common if bits(run[s]) != bits(ref[s])]
    dmax = max((abs(run[s] - ref[s]) for s in diff), default=0.0) if common else None
    return not diff and not missing and bool(common), (diff[0] if diff else None), dmax, missing


def evaluate(losses, rcs, n):
    """The check rows (name, passed, detail) for runs' `losses` ({run: {step: loss}}) and exit statuses."""
    rows = []
    expected = {name: (n if steps == "half" else 2 * n) for name, _, _, steps, _, _ in RUNS}
    # A resumed run's metrics start at step N.
    start = {name: (n if steps == "full" and ckpt else 0) for name, _, _, steps, ckpt, _ in RUNS}
    bad = ["%s (rc %s, %d of %d steps)" % (r, rcs.get(r), len([s for s in losses.get(r, {}) if s >= start[r]]),
                                          expected[r] - start[r])
           for r in expected
           if rcs.get(r) != 0 or any(s not in losses.get(r, {}) for s in range(start[r], expected[r]))]
    rows.append(("completed", not bad, "; ".join(bad) or "all %d runs" % len(RUNS)))
    for name, run, ref, first in CHECKS:
        lo = n if first == "half" else 0
        hi = n if run.endswith("_save") else 2 * n
        ok, at, dmax, missing = compare(losses.get(run, {}), losses.get(ref, {}), range(lo, hi))
        if ok:
            detail = "steps %d..%d bit-identical" % (lo, hi - 1)
        elif missing and at is None:
            detail = "steps missing: %s" % ",".join(map(str, missing[:8]))
        else:
            detail = "first differs at step %s, max |dloss| %.3g%s" % (
                at, dmax or 0.0, ", missing steps %s" % ",".join(map(str, missing[:8])) if missing else "")
        rows.append((name, ok, "%s vs %s: %s" % (run, ref, detail)))
    return rows


def table(rows, context):
    out = ["| check | result | detail |", "|---|---|---|"]
    out += ["| %s | %s | %s |" % (c, "PASS" if ok else "FAIL", d.replace("|", "\\|")) for c, ok, d in rows]
    return "\n".join(out + ["", context])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mt", required=True, help="folder with .mt and .wheels (prepare.sh)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/mt_ckpt"))
    ap.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    ap.add_argument("--steps", type=int, default=10, help="N: the save runs run N steps, the others 2N")
    ap.add_argument("--timeout", type=int, default=150, help="per run, seconds")
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--wheel", default=None)
    ap.add_argument("--site", default="/tmp/mt_site")
    ap.add_argument("--work", default="/tmp/mt_ckpt_work")
    ap.add_argument("--extra", default="", help="more MaxText key=value args for every run")
    ap.add_argument("--xla-flags", default=DETERMINISTIC,
                    help="XLA_FLAGS added for every run (default: deterministic reductions, no autotuning)")
    a = ap.parse_args()
    if a.steps < 2:
        sys.exit("--steps must be at least 2 (MaxText saves no checkpoint of step 0)")
    # Every run of every platform (stock's variants add theirs to these).
    os.environ["XLA_FLAGS"] = " ".join(x for x in (os.environ.get("XLA_FLAGS", ""), a.xla_flags) if x)
    t0 = time.time()
    say = lambda msg: print("[ckpt %4ds] %s" % (time.time() - t0, msg), flush=True)  # noqa: E731
    src, env0, have_vmm = install_site(a.mt, a.wheel, a.site, say)
    shutil.rmtree(a.work, ignore_errors=True)
    logd = os.path.join(a.work, "logs")
    os.makedirs(logd)
    os.makedirs(a.out, exist_ok=True)
    losses, rcs, errors = {}, {}, {}

    def metrics(name):
        return os.path.join(a.work, "metrics_%s.jsonl" % name)

    def prepare(k):
        if k >= len(RUNS):
            return None
        name, var, folder, steps, ckpt, _ = RUNS[k]
        env = variant_env(var)
        if env["JAX_PLATFORMS"] == "vmm" and not have_vmm:
            return None
        # A fixed run name, so that a resume (or a copied folder) finds the checkpoints of the run that saved.
        # Period N: a save run's last state is saved on completion (step N-1); a resumed run also saves at
        # step N, asynchronously, while the steps after it run on (and donate) the state being written.
        extra = ["enable_checkpointing=true", "async_checkpointing=true", "save_checkpoint_on_completion=true",
                 "checkpoint_period=%d" % a.steps] if ckpt else ["enable_checkpointing=false"]
        # One learning-rate schedule for all (MaxText's follows `steps` otherwise: a save run's N steps
        # would decay faster than the 2N-step runs it is compared with).
        args = trainer_args(src, a.config, "ckpt", os.path.join(a.work, folder),
                            a.steps if steps == "half" else 2 * a.steps, a.extra,
                            checkpointing=extra + ["learning_rate_schedule_steps=%d" % (2 * a.steps),
                                                   "metrics_file=" + metrics(name)])
        return Prepared(args, dict(env0, **env), os.path.join(logd, name + ".log"))

    def save(rows):
        with open(os.path.join(a.out, "ckpt.json"), "w") as fh:
            json.dump({"config": a.config, "steps": a.steps, "rc": rcs, "errors": errors,
                       "losses": {r: {str(s): v for s, v in sorted(x.items())} for r, x in losses.items()},
                       "checks": [{"check": c, "pass": ok, "detail": d} for c, ok, d in rows]}, fh, indent=1)
        same = compare(losses.get("vmm_full", {}), losses.get("stock_full", {}), range(2 * a.steps))
        context = "Context: vmm_full %s stock_full over steps 0..%d%s. Config %s, N = %d, runs' errors: %s." % (
            "equals" if same[0] else "differs from", 2 * a.steps - 1,
            "" if same[0] else " (first at step %s, max |dloss| %.3g)" % (same[1], same[2] or 0.0), a.config,
            a.steps, "; ".join("%s: %s" % kv for kv in errors.items() if kv[1]) or "none")
        with open(os.path.join(a.out, "ckpt.md"), "w") as fh:
            fh.write(table(rows, context) + "\n")
        with tarfile.open(os.path.join(a.out, "ckpt_logs.tar.gz"), "w:gz") as tf:
            tf.add(logd, arcname="ckpt_logs")
        return context

    ahead = prepare(0)
    for k, (name, var, folder, _, _, copy_from) in enumerate(RUNS):
        current, ahead = ahead, None
        left = a.budget_s - (time.time() - t0) - 15
        if current is None or left < 40:
            if current is not None:
                current.cancel()
            rcs[name], errors[name] = "skip", "no xla-vmm wheel" if current is None else "budget spent"
            say("%s: skipped (%s)" % (name, errors[name]))
            ahead = prepare(k + 1)
            continue
        if copy_from:
            dst = os.path.join(a.work, folder, "out")
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(os.path.join(a.work, copy_from, "out"), dst)
        say("%s: go (%s, timeout %ds)" % (name, var, min(a.timeout, left)))
        ahead = prepare(k + 1)
        rc, _ = current.go(int(min(a.timeout, left)))
        with open(current.log, errors="replace") as fh:
            lines = fh.read().splitlines()
        rcs[name], errors[name], losses[name] = rc, first_error(lines, rc), read_losses(metrics(name))
        say("%s: rc=%s, %d steps in its metrics file%s" % (name, rc, len(losses[name]),
                                                             ", " + errors[name] if errors[name] else ""))
        save(evaluate(losses, rcs, a.steps))
    if ahead is not None:
        ahead.cancel()
    rows = evaluate(losses, rcs, a.steps)
    context = save(rows)
    print(table(rows, context))
    return 0 if all(ok for _, ok, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
