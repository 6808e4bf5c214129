"""Stock XLA vs xla-vmm on FSDP llama over 2 GPUs: same loss bits, step times.

Runs fsdp.py (one process, 2 devices) and dist.py --launch (2 processes, 1 GPU each): stock twice
(`--platform cuda`) and once with XLA's command buffers off, then xla-vmm at each threshold (default 0, 1,
4096, 65536, 1 MiB, as the single-GPU A/B; XLA_VMM_EXEC_MODE=graph). A plot goes to compare.png.
Per mode, every xla-vmm run must give the loss bits of stock, unless stock's own two runs differ
(then stock is nondeterministic there: reported, not a failure). Writes compare.md (config, mode,
threshold, median step ms, final loss, speedup vs stock) and compare.json to --out.

    XLA_VMM_LIBRARY=.../libxla_vmm_plugin.so python3 compare.py --out results/multi \\
        [--config llama_small_f32] [--steps 20] [--thresholds 0,1,4096] [--modes single,dist]

Exit status 1 if any xla-vmm run fails or its loss bits differ from (deterministic) stock.
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", default="llama_small_f32")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--thresholds", default="0,1,4096,65536,1048576")
    ap.add_argument("--modes", default="single,dist")
    ap.add_argument("--timeout", type=int, default=1800)
    args = ap.parse_args()
    thresholds = [int(t) for t in args.thresholds.split(",") if t.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("single", "dist"):
            sys.exit("unknown mode %r (single, dist)" % m)
    os.makedirs(args.out, exist_ok=True)

    rows, problems, notes, results = [], [], [], {}
    for mode in modes:
        stock = [run_one(mode, "cuda", args) for _ in range(2)]
        s1, s2 = stock[0][0], stock[1][0]
        results[mode] = {"stock": [s for s, _ in stock], "vmm": {}}
        if s1 is None or s2 is None:
            problems.append("%s: stock failed: %s" % (mode, stock[0][1] or stock[1][1]))
            continue
        stock_deterministic = s1["loss_bits"] == s2["loss_bits"]
        if not stock_deterministic:
            diverge = next(i for i, (a, b) in enumerate(zip(s1["loss_bits"], s2["loss_bits"])) if a != b)
            notes.append("%s: stock is nondeterministic (its two runs differ from step %d: %s vs %s); "
                         "loss bits not compared" % (mode, diverge, s1["loss_bits"][diverge], s2["loss_bits"][diverge]))
        # Stock with XLA's command buffers off too: the speedup column is against the better of the two.
        off, off_err = run_one(mode, "cuda", args, cmdbuf_off=True)
        results[mode]["stock_cmdbuf_off"] = off if off is not None else {"error": off_err}
        stock_ms = min(s1["median_ms"], s2["median_ms"])
        best_ms = min(stock_ms, off["median_ms"]) if off is not None else stock_ms
        rows.append((args.config, mode, "stock", stock_ms, s1["final_loss"], best_ms / stock_ms, "reference"))
        if off is None:
            problems.append("%s: stock with command buffers off failed: %s" % (mode, off_err))
        else:
            rows.append((args.config, mode, "stock, cmd buffers off", off["median_ms"], off["final_loss"],
                         best_ms / off["median_ms"],
                         "identical" if off["loss_bits"] == s1["loss_bits"] else "differs"))
        stock_ms = best_ms
        for t in thresholds:
            r, err = run_one(mode, "vmm", args, threshold=t)
            results[mode]["vmm"][str(t)] = r if r is not None else {"error": err}
            if r is None:
                problems.append("%s threshold %d: %s" % (mode, t, err))
                rows.append((args.config, mode, str(t), None, None, None, "failed"))
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
            label = "1 (auto)" if t == 1 else str(t)
            rows.append((args.config, mode, label, r["median_ms"], r["final_loss"], stock_ms / r["median_ms"], same))

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
        json.dump({"config": args.config, "steps": args.steps, "results": results, "notes": notes,
                   "problems": problems}, fh, indent=1)
    print(text)
    plot(rows, os.path.join(args.out, "compare.png"), args)
    sys.exit(1 if problems else 0)


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
