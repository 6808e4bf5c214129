"""One step of a jax.profiler trace as a picture: our runtime's plane (`/device:CUSTOM:xla-vmm`: steps, the
VA-stable binding's plan / apply / launch, staged steps, transfers, a line per host thread) above the GPU's
streams (kernels, copies), on one time axis, written as an SVG (a browser shows it; no plotting library).

    python3 integration/diag/trace_timeline.py TRACE [--out step.svg] [--around step] [--index K]

TRACE: an .xplane.pb, or a folder searched for the newest one (jax.profiler.trace's, MaxText's
`profiler=xplane` output). The window: our plane's longest event named `--around` or `--around NAME`
(default `step`: our steps are `step PROGRAM`, the longest is the training step's), or its `--index`th,
from its start to the next step of the same program (one period of the loop), else until the device work
that began during it has ended. Prints, per line, the events and busy time inside the window. Needs jax
(its ProfileData reads the trace).
"""
import argparse
import glob
import hashlib
import os
import sys
from xml.sax.saxutils import escape

OURS = "/device:CUSTOM:xla-vmm"
WIDTH, LABEL, ROW, TOP = 1500, 300, 20, 40


def busy(intervals):
    """The time covered by the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def load(path):
    """[(plane name, line name, [(name, start_ns, dur_ns)])] for our plane's lines and the GPU planes'
    stream lines."""
    from jax.profiler import ProfileData

    if os.path.isdir(path):
        found = glob.glob(os.path.join(path, "**", "*.xplane.pb"), recursive=True)
        if not found:
            raise SystemExit("no .xplane.pb under %s" % path)
        path = max(found, key=os.path.getmtime)
    lines = []
    for plane in ProfileData.from_file(path).planes:
        gpu = plane.name.startswith("/device:GPU")
        if plane.name != OURS and not gpu:
            continue
        for line in plane.lines:
            if gpu and "tream" not in (line.name or ""):
                continue  # the per-device summary lines repeat the streams' events
            evs = [(ev.name, float(ev.start_ns), float(ev.duration_ns)) for ev in line.events]
            if not evs:
                continue
            if gpu:
                lines.append((plane.name, line.name or "", evs))
            else:  # nested spans (a step's plan / apply / launch) one row deeper each
                for depth, nested in enumerate(by_depth(evs)):
                    lines.append((plane.name, (line.name or "") + (" +%d" % depth if depth else ""), nested))
    return lines


def by_depth(evs):
    """`evs` split into rows by nesting: row k holds the events inside k others."""
    rows, open_ends = [], []
    for ev in sorted(evs, key=lambda e: (e[1], -e[2])):
        while open_ends and open_ends[-1] <= ev[1]:
            open_ends.pop()
        d = len(open_ends)
        if d == len(rows):
            rows.append([])
        rows[d].append(ev)
        open_ends.append(ev[1] + ev[2])
    return rows


def window(lines, around, index):
    """(start_ns, end_ns) of our plane's `index`th event named `around`, or its longest (`index` None)."""
    # Our step spans are named `step PROGRAM`.
    marks = sorted(e for p, _, evs in lines if p == OURS for e in evs
                   if e[0] == around or e[0].startswith(around + " "))
    if not marks:
        raise SystemExit("no '%s' event on %s in this trace" % (around, OURS))
    i = index % len(marks) if index is not None else max(range(len(marks)), key=lambda k: (marks[k][2], k))
    name, start, dur = marks[i]
    later = [m for m in marks[i + 1:] if m[0] == name]
    if later:  # one period of this program's loop
        return start, max(later[0][1], start + dur)
    # Its last step: until the device work that began during it has ended.
    ends = [s + d for p, _, evs in lines if p != OURS for _, s, d in evs if start <= s <= start + dur]
    return start, max(ends + [start + dur, start + 1])


def colour(name):
    """A stable colour per event name (ours warm, kernels by their name's hash)."""
    h = int(hashlib.md5(name.encode()).hexdigest()[:6], 16)
    return "hsl(%d,65%%,%d%%)" % (h % 360, 55 + (h >> 9) % 20)


def svg(lines, start, end, title):
    """The picture of `lines` between `start` and `end` (ns), and a text summary per line."""
    scale = (WIDTH - LABEL - 10) / (end - start)
    rows, summary = [], []
    for plane, line, evs in sorted(lines, key=lambda x: x[0] != OURS):  # ours first
        inside = [(n, s, d) for n, s, d in evs if s < end and s + d > start]
        if inside:
            rows.append((plane, line, inside))
    height = TOP + ROW * len(rows) + 30
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="monospace" '
           'font-size="11">' % (WIDTH, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="4" y="16" font-size="13">%s</text>' % escape(title)]
    span_ms = (end - start) / 1e6
    for k in range(11):  # the time axis, in ms from the window's start
        x = LABEL + k * (WIDTH - LABEL - 10) / 10
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (x, TOP - 8, x, height - 24))
        out.append('<text x="%.1f" y="%d">%.3g ms</text>' % (x - 10, height - 10, span_ms * k / 10))
    for r, (plane, line, inside) in enumerate(rows):
        y = TOP + r * ROW
        who = "xla-vmm" if plane == OURS else plane.replace("/device:", "")
        out.append('<text x="4" y="%d">%s</text>' % (y + 14, escape(("%s %s" % (who, line))[:44])))
        busy = 0.0
        for n, s, d in inside:
            a, b = max(s, start), min(s + d, end)
            busy += b - a
            x, w = LABEL + (a - start) * scale, max((b - a) * scale, 0.8)
            out.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s %.1f us</title></rect>'
                       % (x, y + 2, w, ROW - 4, colour(n), escape(n), d / 1e3))
            if w > 7 * len(n[:40]) * 0.9:
                out.append('<text x="%.1f" y="%d" font-size="10">%s</text>' % (x + 2, y + 14, escape(n[:40])))
        summary.append("%-60s %5d events  busy %8.3f ms" % (("%s %s" % (who, line))[:60], len(inside), busy / 1e6))
    out.append("</svg>")
    return "\n".join(out) + "\n", summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--out", default="step.svg")
    ap.add_argument("--around", default="step")
    ap.add_argument("--index", type=int, default=None)
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    lines = load(a.trace)
    start, end = window(lines, a.around, a.index)
    title = a.title or "one '%s' of %s: %.3f ms" % (a.around, os.path.basename(a.trace.rstrip("/")), (end - start) / 1e6)
    picture, summary = svg(lines, start, end, title)
    with open(a.out, "w") as fh:
        fh.write(picture)
    print(title)
    print("\n".join(summary))
    print("wrote", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
