#!/usr/bin/env bash
# What one runner leaves behind for the next (issue 30): training loops of the stock references, each in its
# own process, their steps in the modes a schedule names (`xla-vmm run --schedule`, the guard off), each step
# waited for; prints the median step of steps 2-11, 16-30 and 31-49 per schedule (and of the last 100 steps
# where a schedule is longer), then the GPU's clocks while the process ran (integration/gpu_clocks.py, polled
# every 10 ms: does the GPU clock down after eager steps?).
#     bash integration/diag/schedules.sh [XLA_VMM_CLI] [REF_DIR]     (on the GPU machine)
# REF_DIR: where integration/stock_ref.py writes NAME.pjrt / NAME.npz (made there when missing).
# SCHEDULES_MODELS: the models (default llama_scan_bf16 llama_sgd_f32); SCHEDULES_LONG=0 leaves out the two
# 1000-step rows of llama_scan_bf16 (does the slowdown last, and does a process without eager steps drift?).
set -u
V=${1:-xla-vmm}
R=${2:-/tmp/schedules_ref}
HERE=$(cd "$(dirname "$0")/.." && pwd)
models=${SCHEDULES_MODELS:-llama_scan_bf16 llama_sgd_f32}
for f in $models; do
  [ -f "$R/$f.pjrt" ] || { XLA_FLAGS=--xla_gpu_deterministic_ops=true python3 "$HERE/stock_ref.py" --out "$R" \
    --steps 10 $models > /tmp/schedules_ref.log 2>&1 || { tail -5 /tmp/schedules_ref.log; exit 1; }; }
done
for f in $models; do
  # FIRST-MODE:SCHEDULE (the first run is in FIRST-MODE, the loop's steps as scheduled)
  rows=("graph-recapture:graph-recapture:49" "graph-recapture:graph-recapture:12,eager:3,graph-recapture:34"
        "graph-recapture:graph-recapture:12,eager:1,graph-recapture:36" "graph-recapture:eager:3,graph-recapture:46"
        "graph:graph:12,graph-recapture:37" "graph:graph:12,eager:3,graph:34" "graph:graph:49"
        "graph-recapture:graph-recapture:12,graph:3,graph-recapture:34")
  if [ "$f" = llama_scan_bf16 ] && [ "${SCHEDULES_LONG:-1}" != 0 ]; then
    rows+=("graph-recapture:graph-recapture:12,eager:3,graph-recapture:1000" "graph-recapture:graph-recapture:1015")
  fi
  for s in "${rows[@]}"; do
    mode=${s%%:*}; sched=${s#*:}
    steps=1; IFS=, read -r -a parts <<<"$sched"
    for p in "${parts[@]}"; do steps=$(( steps + ${p##*:} )); done
    out=$(XLA_VMM_GUARD=0 python3 "$HERE/gpu_clocks.py" --period-ms 10 -- \
      "$V" run "$R/$f.pjrt" --inputs "$R/$f.npz" --mode "$mode" --loop-steps "$steps" --schedule "$sched" 2>&1) \
      || { echo "$f $sched: failed"; echo "$out" | tail -3; continue; }
    python3 - "$f" "$mode" "$sched" "$out" <<'PY'
import re, sys
f, mode, sched, out = sys.argv[1:]
ms = [float(m) for m in re.findall(r"loss\[\d+\] = \S+ \(0x[0-9a-f]+\) ([0-9.]+) ms", out)]  # steps 1..
med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")  # noqa: E731
tail = "  last 100 %.3f" % med(ms[-100:]) if len(ms) > 100 else ""
print("%-16s first %-15s %-55s steps 2-11 %.3f  16-30 %.3f  31-49 %.3f%s" % (f, mode, sched, med(ms[1:11]),
                                                                            med(ms[15:30]), med(ms[30:49]), tail))
clocks = [ln for ln in out.splitlines() if ln.startswith("gpu clocks:")]
print("    " + (clocks[-1] if clocks else "gpu clocks: -"))
PY
  done
done
