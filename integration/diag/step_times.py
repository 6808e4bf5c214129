"""Step by step, the A/B rows of one or more ab.py runs (issue 30: where in a process the steps get slower).

    python3 integration/diag/step_times.py AB.json [AB.json ...] [--model M] [--first 0] [--last 20]

Prints, per model, one line per row: its step times (ms) for steps FIRST..LAST, then its median over the steps
after LAST, and what the guard decided where the row says (the training program's report line). Rows of
several files are told apart by the file's folder name.
"""
import argparse
import json
import os
import statistics


def rows_of(path):
    with open(path) as fh:
        data = json.load(fh)
    tag = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return [dict(r, source=tag) for r in data["rows"] if r.get("step_ms")]


def guard_of(row):
    rep = row.get("report") or {}
    g = rep.get("guard") or {}
    if not g:
        return rep.get("runner") or ""
    said = "%s from step %s" % (g.get("runner"), g.get("decided_at_step"))
    look = g.get("second_look")
    if look:
        said += ", second look at step %s" % look.get("decided_at_step")
    return said


def table(rows, first, last):
    out = []
    for model in sorted({r["model"] for r in rows}):
        out += ["", "%s: steps %d-%d (ms), then the median after step %d" % (model, first, last, last)]
        for r in (x for x in rows if x["model"] == model):
            times = r["step_ms"]
            shown = " ".join("%.2f" % t for t in times[first:last + 1])
            after = times[last + 1:]
            med = "%.3f" % statistics.median(after) if after else "-"
            out.append("- %s %s: %s | %s %s" % (r["source"], r["config"], shown, med, guard_of(r)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--model", default=None)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--last", type=int, default=20)
    a = ap.parse_args(argv)
    rows = [r for f in a.files for r in rows_of(f) if a.model in (None, r["model"])]
    print("\n".join(table(rows, a.first, a.last)))
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
