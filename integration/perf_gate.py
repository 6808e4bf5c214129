"""The perf gate's verdict: xla-vmm's default mode against the best stock configuration and against our own
eager and graph-recapture modes, on every row of every benchmark that ran (bench.py, ab.py, MaxText).

    python3 integration/perf_gate.py [--bench bench.json] [--ab ab.json] [--mt mt.json] [--out gate.md]
        [--tolerance 0.02] [--title TEXT]

A row FAILs when the default mode's step time is more than --tolerance (a fraction: run-to-run noise)
above the best stock configuration measured in the same run, or above our eager or graph-recapture mode
(where they ran), or when the default did not run, or when its losses moved: in the A/B (one serialized
executable, deterministic ops) the default's loss bits must equal every other row's of ours and stock's
with command buffers on (the compile they all run); in MaxText (a compile per run, losses printed with 3
decimals) no step's loss may differ from stock's by more than --loss-tolerance. A MaxText config whose gate
rows ran twice, A B B A (maxtext/run.py --balance), is judged on each row's mean of its two rounds. Prints one
Markdown table (also to --out); exit 1 on any FAIL, 3 when no input had rows.
"""
import argparse
import json
import sys

# suite -> (the default mode's row, our eager row, our graph-recapture row), as each benchmark names them
SUITES = {
    "bench": ("vmm graph (default)", "vmm eager", "vmm graph-recapture"),
    "ab": ("vmm t=1", "vmm eager", "vmm graph-recapture"),
    "maxtext": ("vmm_t1", "vmm_eager", "vmm_recapture"),
}


def rows_of(suite, data):
    """[(workload, config, ms, row)] of one benchmark's JSON."""
    out = []
    for r in data.get("rows", []):
        if suite == "bench":
            out.append((r["program"], r["config"], r.get("ms"), r))
        elif suite == "ab":
            out.append((r["model"], r["config"], r.get("median_ms"), r))
        elif "repeats" not in r:
            out.append(("maxtext " + r["config"], r["variant"], r.get("median_ms"), r))
    if suite == "maxtext":
        two = {(r["config"], r["repeats"]): r for r in data.get("rows", []) if "repeats" in r}
        tagged = {c for c, _ in two}
        out = [(w + (" (A B B A)" if r["config"] in tagged else ""),) + balanced(c, ms, r, two.get((r["config"], c)))
               for w, c, ms, r in out]
    return out


def balanced(variant, ms, row, two):
    """(variant, ms, row) of a MaxText row, with its second round `two` when it ran one (maxtext/run.py
    --balance, the order A B B A): the mean of the rounds' medians (of the one that has a median, when
    the other has none), the larger loss drift, both rounds' losses."""
    if two is None:
        return variant, ms, row
    both = [m for m in (num(ms), num(two.get("median_ms"))) if m]
    drift = [d for d in (row.get("max_dloss"), two.get("max_dloss")) if isinstance(d, (int, float))]
    losses = {"%d:%s" % (i, k): v for i, r in enumerate((row, two), 1) for k, v in r.get("losses", {}).items()}
    mean = sum(both) / len(both) if both else None
    return variant, mean, dict(row, median_ms=mean, rounds=[ms, two.get("median_ms")],
                               max_dloss=max(drift) if drift else None, losses=losses)


# The stock row of the A/B whose compile every vmm row runs (its losses are the same bits).
AB_SAME_EXECUTABLE = "stock cmdbuf on"


def loss_problems(suite, default, by_row, loss_tol):
    """Why the default row's losses are not what they must be (empty: they are)."""
    d = by_row.get(default)
    if d is None:
        return []
    if suite == "ab":
        mine = d.get("loss_bits")
        if not mine:
            return []
        return ["losses differ from %s" % c for c, r in by_row.items()
                if c != default and r.get("loss_bits") and (c == AB_SAME_EXECUTABLE or not is_stock(suite, c))
                and r["loss_bits"] != mine]
    if suite == "maxtext":
        dl = d.get("max_dloss")
        if isinstance(dl, (int, float)) and (dl != dl or dl > loss_tol):
            return ["loss differs from stock's by %.3f (> %.3f)" % (dl, loss_tol)]
        if any(v != v for v in d.get("losses", {}).values()):
            return ["loss is NaN"]
    return []


def is_stock(suite, config):
    return config.startswith("cuda") if suite == "maxtext" else config.startswith("stock")


def num(v):
    return v if isinstance(v, (int, float)) and v == v and v > 0 else None


def verdicts(suite, rows, tol, loss_tol=0.01):
    """One dict per workload of `rows`."""
    default, eager, recap = SUITES[suite]
    out = []
    for w in dict.fromkeys(r[0] for r in rows):
        by = {c: num(ms) for wl, c, ms, _ in rows if wl == w}
        by_row = {c: row for wl, c, _, row in rows if wl == w}
        stock = {c: ms for c, ms in by.items() if is_stock(suite, c) and ms}
        best_c = min(stock, key=stock.get) if stock else None
        d = by.get(default)
        problems = []
        if d is None:
            problems.append("default did not run")
        else:
            for label, ref in (("best stock", stock.get(best_c)), ("eager", by.get(eager)),
                               ("graph-recapture", by.get(recap))):
                if ref and d > ref * (1 + tol):
                    problems.append("slower than %s (%.3f > %.3f ms)" % (label, d, ref))
        problems += loss_problems(suite, default, by_row, loss_tol)
        others = {c: ms for c, ms in by.items() if ms and not is_stock(suite, c) and c not in (default, eager, recap)}
        out.append({"suite": suite, "workload": w, "best_stock": best_c, "best_stock_ms": stock.get(best_c),
                    "eager_ms": by.get(eager), "recapture_ms": by.get(recap), "default_ms": d,
                    "vs_best_stock": (stock[best_c] / d) if d and best_c else None,
                    "vs_eager": (by[eager] / d) if d and by.get(eager) else None,
                    "others": others, "verdict": "FAIL" if problems else "PASS", "problems": problems})
    return out


def markdown(vs, tol, title):
    f = lambda v, fmt="%.3f": (fmt % v) if isinstance(v, (int, float)) else "-"  # noqa: E731
    out = ([title, ""] if title else []) + [
        "| suite | workload | best stock (config) ms | vmm eager ms | vmm graph-recapture ms | vmm default ms "
        "| default vs best stock | default vs eager | other vmm rows ms | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for v in vs:
        others = ", ".join("%s %.3f" % kv for kv in v["others"].items()) or "-"
        out.append("| %s | %s | %s (%s) | %s | %s | %s | %s | %s | %s | %s |" % (
            v["suite"], v["workload"], f(v["best_stock_ms"]), v["best_stock"] or "-", f(v["eager_ms"]),
            f(v["recapture_ms"]), f(v["default_ms"]), f(v["vs_best_stock"], "%.2fx"), f(v["vs_eager"], "%.2fx"),
            others, v["verdict"] + ("".join("; " + p for p in v["problems"]))))
    n_fail = sum(v["verdict"] == "FAIL" for v in vs)
    out += ["", "%d rows, %d FAIL (tolerance %.0f%%: a default step more than that above a reference fails)" % (
        len(vs), n_fail, tol * 100)]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", action="append", default=[])
    ap.add_argument("--ab", action="append", default=[])
    ap.add_argument("--mt", action="append", default=[])
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--loss-tolerance", type=float, default=0.01,
                    help="MaxText: largest |loss - stock's loss| of a step (3 printed decimals, another compile)")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    vs = []
    for suite, paths in (("bench", a.bench), ("ab", a.ab), ("maxtext", a.mt)):
        for p in paths:
            try:
                with open(p) as fh:
                    data = json.load(fh)
            except (OSError, ValueError) as e:
                print("perf gate: %s: %s" % (p, e), file=sys.stderr)
                continue
            vs += verdicts(suite, rows_of(suite, data), a.tolerance, a.loss_tolerance)
    text = markdown(vs, a.tolerance, a.title)
    print(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text + "\n")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(vs, fh, indent=1)
    if not vs:
        return 3
    return 1 if any(v["verdict"] == "FAIL" for v in vs) else 0


if __name__ == "__main__":
    sys.exit(main())
