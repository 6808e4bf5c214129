"""Stock XLA vs xla-vmm on FSDP llama over 2 GPUs: same loss bits, step times.

Runs fsdp.py (one process, 2 devices) and dist.py --launch (2 processes, 1 GPU each): stock twice
(`--platform cuda`) and once with XLA's command buffers off, then xla-vmm at each threshold (default 0, 1,
4096, 65536, 1 MiB, as the single-GPU A/B; XLA_VMM_EXEC_MODE=graph). A plot goes to compare.png.
Per mode, every xla-vmm run must give the loss bits of stock, unless stock's own two runs differ
(then stock is nondeterministic there: reported, not a failure). Writes compare.md (config, mode,
threshold, median step ms, final loss, speedup vs stock) and compare.json to --out.

    XLA_VMM_LIBRARY=.../libxla_vmm_plugin.so python3 compare.py --out results/multi \\
        [--config llama_small_f32] [--steps 20] [--thresholds 0,1,4096] [--modes single,dist] \\
        [--budget-s 500] [--resume results/multi/compare.json]

Exit status 1 if any run fails or xla-vmm's loss bits differ from (deterministic) stock; 2 if runs were
left for later by --budget-s (compare.json lists them as pending; --resume THAT_FILE makes only those).
compare.json and compare.md are rewritten after every run, so a call cut short keeps what it measured.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


CMDBUF_OFF = "--xla_gpu_enable_command_buffer="


def run_one(mode, platform, args, threshold=None, cmdbuf_off=False):
    script = "fsdp.py" if mode == "single" else "dist.py"
    env = dict(os.environ)
    if cmdbuf_off:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + CMDBUF_OFF).strip()
    argv = [sys.executable, os.path.join(HERE, script), "--platform", platform, "--steps", str(args.steps),
            "--config", args.config]
    if mode == "dist":
        argv.append("--launch")
    if threshold is not None:
        argv += ["--threshold", str(threshold)]
    label = "%s %s%s%s" % (mode, platform, "" if threshold is None else " threshold %d" % threshold,
                           " (command buffers off)" if cmdbuf_off else "")
    print("== %s: %s" % (label, " ".join(argv[1:])), flush=True)
    t = time.perf_counter()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        print("   timeout after %ds" % args.timeout, flush=True)
        return None, "timeout after %ds" % args.timeout
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if mode == "dist" and p.returncode == 3 and lines:
        # dist.py: the steps ran (losses in the summary) but a process hung at exit: keep the losses,
        # report the hang as a problem of its own.
        r = json.loads(lines[-1])
        print("   exit hang: %s" % "; ".join(r.get("exit_hang", [])), flush=True)
        return r, None
    if p.returncode != 0 or not lines:
        tail = (p.stderr or p.stdout).strip().splitlines()[-5:]
        print("   failed (rc %d):\n     %s" % (p.returncode, "\n     ".join(tail)), flush=True)
        return None, "rc %d: %s" % (p.returncode, " | ".join(tail))
    r = json.loads(lines[-1])
    print("   median %.3f ms, final loss %s (%.1f s)" % (r["median_ms"], r["loss_bits"][-1] if r["loss_bits"] else "-",
                                                      time.perf_counter() - t), flush=True)
    return r, None


def planned_runs(modes, thresholds):
    """Every run of the comparison, in order, keyed by a stable label (the key in compare.json)."""
    runs = []
    for mode in modes:
        runs += [("%s/stock/1" % mode, mode, "cuda", None, False), ("%s/stock/2" % mode, mode, "cuda", None, False),
                 ("%s/stock/cmdbuf_off" % mode, mode, "cuda", None, True)]
        runs += [("%s/vmm/%d" % (mode, t), mode, "vmm", t, False) for t in thresholds]
    return runs


def table(modes, thresholds, done, config):
    """Rows (config, mode, threshold label, median ms, final loss, speedup vs best stock, loss bits) and
    the problems and notes, from the finished runs in `done` (label -> summary or {"error": ...})."""
    rows, problems, notes = [], [], []
    ok = lambda label: label in done and "error" not in done[label]
    for mode in modes:
        for label in ("%s/stock/1" % mode, "%s/stock/2" % mode, "%s/stock/cmdbuf_off" % mode):
            if label in done and "error" in done[label]:
                problems.append("%s: %s" % (label, done[label]["error"]))
        if not (ok("%s/stock/1" % mode) and ok("%s/stock/2" % mode)):
            for t in thresholds:
                if ok("%s/vmm/%d" % (mode, t)):
                    notes.append("%s threshold %d ran, but stock's two runs are missing: not compared" % (mode, t))
            continue
        s1, s2 = done["%s/stock/1" % mode], done["%s/stock/2" % mode]
        stock_deterministic = s1["loss_bits"] == s2["loss_bits"]
        if not stock_deterministic:
            diverge = next(i for i, (a, b) in enumerate(zip(s1["loss_bits"], s2["loss_bits"])) if a != b)
            notes.append("%s: stock is nondeterministic (its two runs differ from step %d: %s vs %s); "
                         "loss bits not compared" % (mode, diverge, s1["loss_bits"][diverge], s2["loss_bits"][diverge]))
        stock_ms = min(s1["median_ms"], s2["median_ms"])
        off = done.get("%s/stock/cmdbuf_off" % mode) if ok("%s/stock/cmdbuf_off" % mode) else None
        # The speedup column is against the better of stock with and without XLA's command buffers.
        best_ms = min(stock_ms, off["median_ms"]) if off is not None else stock_ms
        rows.append((config, mode, "stock", stock_ms, s1["final_loss"], best_ms / stock_ms, "reference"))
        if off is not None:
            rows.append((config, mode, "stock, cmd buffers off", off["median_ms"], off["final_loss"],
                         best_ms / off["median_ms"],
                         "identical" if off["loss_bits"] == s1["loss_bits"] else "differs"))
        for t in thresholds:
            label = "%s/vmm/%d" % (mode, t)
            shown = "1 (auto)" if t == 1 else str(t)
            if label not in done:
                rows.append((config, mode, shown, None, None, None, "not run"))
                continue
            r = done[label]
            if "error" in r:
                problems.append("%s threshold %d: %s" % (mode, t, r["error"]))
                rows.append((config, mode, shown, None, None, None, "failed"))
                continue
            if r.get("exit_hang"):
                problems.append("%s threshold %d: ran every step, then hung at exit (%s)"
                                % (mode, t, "; ".join(r["exit_hang"])))
            if not stock_deterministic:
                same = "not compared (stock nondeterministic)"
            elif r["loss_bits"] == s1["loss_bits"]:
                same = "identical"
            else:
                i = next((i for i, (a, b) in enumerate(zip(r["loss_bits"], s1["loss_bits"])) if a != b),
                         min(len(r["loss_bits"]), len(s1["loss_bits"])))
                same = "DIFFERS from step %d" % i
                problems.append("%s threshold %d: loss bits differ from stock from step %d (%s vs %s)"
                                % (mode, t, i, r["loss_bits"][i] if i < len(r["loss_bits"]) else "-",
                                   s1["loss_bits"][i] if i < len(s1["loss_bits"]) else "-"))
            rows.append((config, mode, shown, r["median_ms"], r["final_loss"], best_ms / r["median_ms"], same))
    return rows, problems, notes


def write(args, modes, thresholds, done, pending):
    """compare.json (every finished run: what --resume reads) and compare.md, after every run."""
    rows, problems, notes = table(modes, thresholds, done, args.config)
    if pending:
        notes.append("%d run(s) not made (time budget): %s; rerun with --resume %s"
                     % (len(pending), ", ".join(pending), os.path.join(args.out, "compare.json")))
    md = ["# FSDP llama on 2 GPUs: stock XLA vs xla-vmm", "",
          "%d steps, median step time over steps 1..%d; xla-vmm in XLA_VMM_EXEC_MODE=graph." % (args.steps, args.steps - 1),
          "single: one process, 2 devices; dist: jax.distributed, 2 processes x 1 GPU.", "",
          "| config | mode | threshold | median step ms | final loss | speedup vs best stock | loss bits vs stock |",
          "|---|---|---|---|---|---|---|"]
    for cfg, mode, thr, ms, loss, speedup, same in rows:
        md.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            cfg, mode, thr, "-" if ms is None else "%.3f" % ms, "-" if loss is None else "%.6g" % loss,
            "-" if speedup is None else "%.2fx" % speedup, same))
    if notes or problems:
        md.append("")
    md += ["- note: " + n for n in notes]
    md += ["- PROBLEM: " + p for p in problems]
    text = "\n".join(md) + "\n"
    with open(os.path.join(args.out, "compare.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(args.out, "compare.json"), "w") as fh:
        json.dump({"config": args.config, "steps": args.steps, "runs": done, "pending": pending,
                   "notes": notes, "problems": problems}, fh, indent=1)
    return rows, problems, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", default="llama_small_f32")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--thresholds", default="0,1,4096,65536,1048576")
    ap.add_argument("--modes", default="single,dist")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no run after this many seconds; the rest is listed as pending")
    ap.add_argument("--resume", default=None,
                    help="a compare.json of an earlier, unfinished call (same config and steps): its runs are kept")
    args = ap.parse_args()
    thresholds = [int(t) for t in args.thresholds.split(",") if t.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("single", "dist"):
            sys.exit("unknown mode %r (single, dist)" % m)
    os.makedirs(args.out, exist_ok=True)

    done = {}
    if args.resume:
        with open(args.resume) as fh:
            old = json.load(fh)
        if old.get("config") != args.config or old.get("steps") != args.steps:
            sys.exit("--resume %s is for config %s, %s steps (this call: %s, %d)"
                     % (args.resume, old.get("config"), old.get("steps"), args.config, args.steps))
        # Failed runs are made again; finished ones are kept.
        done = {k: v for k, v in old.get("runs", {}).items() if "error" not in v}
        print("resuming: %d run(s) kept from %s" % (len(done), args.resume), flush=True)

    t0 = time.perf_counter()
    runs = planned_runs(modes, thresholds)
    pending = []
    for label, mode, platform, threshold, cmdbuf_off in runs:
        if label in done:
            continue
        if args.budget_s is not None and time.perf_counter() - t0 > args.budget_s:
            pending.append(label)
            continue
        r, err = run_one(mode, platform, args, threshold=threshold, cmdbuf_off=cmdbuf_off)
        done[label] = r if r is not None else {"error": err}
        write(args, modes, thresholds, done, [])
    rows, problems, text = write(args, modes, thresholds, done, pending)
    print(text)
    plot(rows, os.path.join(args.out, "compare.png"), args)
    sys.exit(1 if problems else (2 if pending else 0))


def plot(rows, path, args):
    """Step time per configuration, one group of bars per mode (single process, jax.distributed)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: no plot)")
        return
    modes = sorted({r[1] for r in rows}, key=["single", "dist"].index)
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        mine = [r for r in rows if r[1] == mode and r[3] is not None]
        labels = [r[2] if not r[2].isdigit() else ("t=%s" % r[2] if r[2] != "1" else "auto") for r in mine]
        colors = ["#888888" if r[2].startswith("stock") else "#2b6cb0" for r in mine]
        ax.bar(range(len(mine)), [r[3] for r in mine], color=colors)
        ax.set_xticks(range(len(mine)))
        ax.set_xticklabels(labels, rotation=30, ha="right")
        ax.set_ylabel("median step ms")
        ax.set_title("%s, %s (%d steps)" % (args.config, {"single": "1 process, 2 GPUs",
                                                          "dist": "2 processes x 1 GPU"}[mode], args.steps))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print("plot:", path)


if __name__ == "__main__":
    main()
