"""A staged step as it ran against the estimate that planned it (issue 29: where the estimator's split of a
step into thunk time and waiting is off).

    python3 integration/diag/staging_vs_trace.py --estimate INSPECT.json --trace TRACE [--index K] [--out DIR]

INSPECT.json: `xla-vmm inspect STEP.pjrt --memory-budget LIMIT --as-run --json` (with the run's link rates), whose
staging `timeline` has every thunk's and copy's span as the estimate runs the step. TRACE: a jax.profiler
trace (an .xplane.pb, or a folder searched for the newest) of the same step run under that limit, in a process
that loads the CUDA plugin too (`JAX_PLATFORMS=vmm,cuda`: its CUPTI tracer records every kernel and copy).

The step on the device: the kernels of all GPU streams in time order; a step starts at the first kernel named
as the estimate's first kernel thunk whose name occurs once in the step (a fusion's kernel is named as its
profile annotation with `_` for `.`), and the window runs from the end of the kernel before it (the step
before done) to the end of the kernel before the next such start. `--index K`: the Kth step in the trace
(default: the last whole one). Inside the window, each thunk whose name the estimate has once is matched to
its kernel, in order; copies are the `Memcpy*` events.

Prints (and with --out writes DIR/staging_vs_trace.md and .json): the step, the time kernels ran and the time
the compute stream had nothing to run (waiting for copies, or launches) against the estimate's thunks and
waits, the copies' count and busy time, and the matched thunks the estimate misses the most. A diagnostic: it
needs a trace from the GPU machine; the matching is tested on made-up traces (integration/unit).
"""
import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from trace_timeline import busy, load  # noqa: E402

SHOWN = 12


def kernel_key(thunk_name):
    """The kernel name a thunk's launch has in a trace (`custom_kernel 'loop_add_fusion.5'` ->
    `loop_add_fusion_5`), or None for a thunk that does not launch one kernel of its own name (a library call,
    a copy)."""
    m = re.match(r"(custom_kernel|kernel) '(.+)'$", thunk_name)
    return m.group(2).replace(".", "_").replace("-", "_") if m else None


def is_copy(name):
    return name.startswith("Memcpy")


def staging_timeline(estimate):
    """The `timeline` of INSPECT.json's staging: after the first run's moves where it has them."""
    a = estimate.get("as_run") or {}
    moved = a.get("first_run_moves") or {}
    staging = moved.get("staging") or a.get("staging")
    if not staging or "timeline" not in staging:
        raise SystemExit("the estimate has no staging timeline (inspect --as-run --json, under a limit)")
    return staging["timeline"]


def device_events(lines):
    """Kernels and copies of the GPU planes' stream lines: two lists of (name, start_ns, end_ns, line), by
    start."""
    kernels, copies = [], []
    for plane, line, evs in lines:
        if not plane.startswith("/device:GPU"):
            continue
        for name, start, dur in evs:
            (copies if is_copy(name) else kernels).append((name, start, start + dur, line))
    return sorted(kernels, key=lambda e: e[1]), sorted(copies, key=lambda e: e[1])


def anchors(thunks):
    """{kernel name: thunk index} of the thunks whose kernel name occurs once in the step."""
    seen = {}
    for i, t in enumerate(thunks):
        k = kernel_key(t["name"])
        if k:
            seen.setdefault(k, []).append(i)
    return {k: v[0] for k, v in seen.items() if len(v) == 1}


def steps_in(kernels, first):
    """Windows (start_ns, end_ns, first kernel index, end kernel index) of each whole step: from the end of
    the kernel before a `first` kernel to the end of the kernel before the next one."""
    starts = [i for i, k in enumerate(kernels) if k[0] == first and i > 0]
    return [(kernels[a - 1][2], kernels[b - 1][2], a, b) for a, b in zip(starts, starts[1:])]


def copy_group(spans, est_in, est_home):
    """One stream's copies of one kind ((start_ns, end_ns) each, in order): their count and busy time; where
    they are as many as the estimate's copies of one way, taken as those in order (a stream of copies runs
    them in the order issued): the way and the rate each side moved their bytes at, GB/s."""
    out = {"count": len(spans), "busy_us": busy(spans) / 1e3}
    for way, est in (("in", est_in), ("home", est_home)):
        if est and len(est) == len(spans):
            est = sorted(est, key=lambda c: c["started_us"])
            size = sum(c["bytes"] for c in est)
            out.update(way=way, gbps=size / max(sum(e - s for s, e in spans), 1e-9),
                       estimated_gbps=size / max(1e3 * sum(c["done_us"] - c["started_us"] for c in est), 1e-9))
            break
    return out


def compare(estimate, lines, index=None):
    """The measured step against the estimated one: a dict of figures (µs) and the matched thunks."""
    tl = staging_timeline(estimate)
    thunks = tl["thunks"]
    names = anchors(thunks)
    if not names:
        raise SystemExit("no thunk of the estimate launches a kernel named once in the step")
    first = min(names, key=names.get)
    kernels, copies = device_events(lines)
    steps = steps_in(kernels, first)
    if not steps:
        raise SystemExit("fewer than two '%s' kernels in the trace: no whole step" % first)
    start, end, a, b = steps[index if index is not None else -1]
    inside = kernels[a:b]
    matched, at = [], 0
    order = sorted(names.items(), key=lambda kv: kv[1])
    for key, i in order:
        # In order: the next kernel of that name after the last one matched.
        j = next((j for j in range(at, len(inside)) if inside[j][0] == key), None)
        if j is None:
            continue
        at = j + 1
        est = thunks[i]["end_us"] - thunks[i]["start_us"]
        ran = (inside[j][2] - inside[j][1]) / 1e3
        matched.append({"thunk": i, "name": thunks[i]["name"], "estimated_us": est, "measured_us": ran,
                        "estimated_start_us": thunks[i]["start_us"], "measured_start_us": (inside[j][1] - start) / 1e3})
    step_copies = [c for c in copies if start <= c[1] < end]
    est_thunks = sum(t["end_us"] - t["start_us"] for t in thunks)
    est_in = [c for c in tl["copies"] if not c["home"]]
    est_home = [c for c in tl["copies"] if c["home"]]
    span = (end - start) / 1e3
    ran = busy([(k[1], k[2]) for k in inside]) / 1e3
    # Per stream and kind (the staging's copies run on streams of their own, a copy thunk on the compute one).
    by_name = {}
    for name, s, e, line in step_copies:
        n, t = by_name.get((line, name), (0, []))
        by_name[(line, name)] = (n + 1, t + [(s, e)])
    return {
        "step_us": {"estimated": tl["step_us"], "measured": span},
        "thunks_us": {"estimated": est_thunks, "measured": ran},
        "idle_us": {"estimated": tl["step_us"] - est_thunks, "measured": span - ran},
        "kernels": len(inside),
        "copies": {
            "estimated": {"in": len(est_in), "home": len(est_home),
                          "in_busy_us": busy([(c["started_us"], c["done_us"]) for c in est_in]),
                          "home_busy_us": busy([(c["started_us"], c["done_us"]) for c in est_home])},
            "measured": {"%s %s" % k: copy_group(t, est_in, est_home) for k, (_, t) in sorted(by_name.items())},
        },
        "matched": matched,
        "steps_in_trace": len(steps),
    }


def markdown(r):
    out = ["| | estimated | measured |", "|---|---|---|"]
    for key, what in (("step_us", "step"), ("thunks_us", "kernels running (the union over streams)"),
                      ("idle_us", "compute with nothing to run (waits, launches)")):
        out.append("| %s | %.2f ms | %.2f ms |" % (what, r[key]["estimated"] / 1e3, r[key]["measured"] / 1e3))
    e = r["copies"]["estimated"]
    out.append("| copies in | %d, busy %.2f ms | |" % (e["in"], e["in_busy_us"] / 1e3))
    out.append("| copies home | %d, busy %.2f ms | |" % (e["home"], e["home_busy_us"] / 1e3))
    for name, m in r["copies"]["measured"].items():
        way = (" (copies %s: %.1f GB/s, estimated %.1f)" % (m["way"], m["gbps"], m["estimated_gbps"])
               if "way" in m else "")
        out.append("| %s%s | | %d, busy %.2f ms |" % (name, way, m["count"], m["busy_us"] / 1e3))
    out.append("")
    out.append("%d kernels in the step; %d thunks matched by their kernel's name. The ones the estimate misses "
               "the most:" % (r["kernels"], len(r["matched"])))
    out.append("")
    out.append("| thunk | name | estimated ms | measured ms | starts at (est / measured) ms |")
    out.append("|---|---|---|---|---|")
    worst = sorted(r["matched"], key=lambda m: -abs(m["measured_us"] - m["estimated_us"]))[:SHOWN]
    for m in worst:
        out.append("| %d | %s | %.3f | %.3f | %.2f / %.2f |" % (
            m["thunk"], m["name"], m["estimated_us"] / 1e3, m["measured_us"] / 1e3,
            m["estimated_start_us"] / 1e3, m["measured_start_us"] / 1e3))
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--estimate", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--index", type=int, default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    with open(a.estimate) as fh:
        estimate = json.load(fh)
    r = compare(estimate, load(a.trace), a.index)
    md = markdown(r)
    print(md, end="")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "staging_vs_trace.md"), "w") as fh:
            fh.write(md)
        with open(os.path.join(a.out, "staging_vs_trace.json"), "w") as fh:
            json.dump(r, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
