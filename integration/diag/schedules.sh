#!/usr/bin/env bash
# What one runner leaves behind for the next (issue 30): training loops of the stock references, each in its
# own process, their steps in the modes a schedule names (`xla-vmm run --schedule`, the guard off), each step
# waited for; prints the median step of steps 2-11, 16-30 and 31-49 per schedule.
#     bash integration/diag/schedules.sh [XLA_VMM_CLI] [REF_DIR]     (on the GPU machine)
# REF_DIR: where integration/stock_ref.py writes NAME.pjrt / NAME.npz (made there when missing).
set -u
V=${1:-xla-vmm}
R=${2:-/tmp/schedules_ref}
models="llama_scan_bf16 llama_sgd_f32"
for f in $models; do
  [ -f "$R/$f.pjrt" ] || { XLA_FLAGS=--xla_gpu_deterministic_ops=true python3 integration/stock_ref.py --out "$R" \
    --steps 10 $models > /tmp/schedules_ref.log 2>&1 || { tail -5 /tmp/schedules_ref.log; exit 1; }; }
done
for f in $models; do
  # FIRST-MODE:SCHEDULE (the first run is in FIRST-MODE, the loop's 49 steps as scheduled)
  for s in "graph-recapture:graph-recapture:49" "graph-recapture:graph-recapture:12,eager:3,graph-recapture:34" \
           "graph-recapture:eager:3,graph-recapture:46" "graph:graph:12,graph-recapture:37" \
           "graph:graph:12,eager:3,graph:34" "graph:graph:49" "graph-recapture:graph-recapture:12,graph:3,graph-recapture:34"; do
    mode=${s%%:*}; sched=${s#*:}
    out=$(XLA_VMM_GUARD=0 "$V" run "$R/$f.pjrt" --inputs "$R/$f.npz" --mode "$mode" --loop-steps 50 --schedule "$sched" 2>&1) \
      || { echo "$f $sched: failed"; echo "$out" | tail -3; continue; }
    python3 - "$f" "$mode" "$sched" "$out" <<'PY'
import re, sys
f, mode, sched, out = sys.argv[1:]
ms = [float(m) for m in re.findall(r"loss\[\d+\] = \S+ \(0x[0-9a-f]+\) ([0-9.]+) ms", out)]  # steps 1..49
med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")  # noqa: E731
print("%-16s first %-15s %-55s steps 2-11 %.3f  16-30 %.3f  31-49 %.3f" % (f, mode, sched, med(ms[1:11]),
                                                                          med(ms[15:30]), med(ms[30:])))
PY
  done
done
