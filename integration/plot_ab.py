"""PNG of integration/ab.py's results: median step time per configuration, one panel per model,
bars labelled with the speedup vs threshold 0.

    python3 integration/plot_ab.py DIR/ab.json [-o DIR/ab.png]
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("json")
    ap.add_argument("-o", "--out")
    a = ap.parse_args()
    data = json.load(open(a.json))
    rows = data["rows"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    if not models:
        raise SystemExit("no rows in %s" % a.json)
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        rs = [r for r in rows if r["model"] == model and r["median_ms"] == r["median_ms"]]
        names = [r["config"] + (" [cli]" if r["path"] == "cli" else "") for r in rs]
        ms = [r["median_ms"] for r in rs]
        colors = ["#888888" if r["config"].startswith("stock") else "#1f77b4" for r in rs]
        bars = ax.bar(range(len(rs)), ms, color=colors)
        for b, r in zip(bars, rs):
            s = r.get("speedup_vs_t0")
            if s:
                ax.annotate("%.2fx" % s, (b.get_x() + b.get_width() / 2, b.get_height()),
                            ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(rs)))
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("median step ms (steps >= 3)")
        ax.set_title(model)
    fig.suptitle("xla-vmm VA-stable graph mode vs stock XLA (%d steps)" % data.get("steps", 0))
    fig.tight_layout()
    out = a.out or os.path.join(os.path.dirname(os.path.abspath(a.json)), "ab.png")
    fig.savefig(out, dpi=120)
    print(out)


if __name__ == "__main__":
    main()
