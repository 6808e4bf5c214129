#!/usr/bin/env bash
# Issue 30: from about step 8 of a JAX process the default mode's steps run ~0.1 ms slower than in a process
# that runs graph-recapture alone, recapture's trial steps included (perf_gate_297751e.md). Which of the
# guard's trial and the binding's re-plan starts it? One model through the plugin (ab.py), one process per
# row: the guard on at thresholds 0 and 1, the guard off (XLA_VMM_GUARD=0: VA-stable only) at the automatic
# threshold and at 0 (remap only, never a copy), graph-recapture alone, VA-stable with one reservation and with
# the completion thread's plain backoff; then every row's steps 0-20 side by side
# (integration/diag/step_times.py) with its per-step map/unmap counts.
#     bash integration/diag/step8.sh OUT [MODEL]       (on the GPU machine; MODEL default llama_small_f32)
set -u
OUT=${1:?usage: step8.sh OUT [MODEL]}
MODEL=${2:-llama_small_f32}
HERE=$(cd "$(dirname "$0")/.." && pwd)
steps=${STEP8_STEPS:-40}
ab() { python3 "$HERE/ab.py" --models "$MODEL" --steps "$steps" --stock-configs onoff --step-counters "$@"; }
ab --out "$OUT/guard" --thresholds 0,1 --modes graph-recapture,va-stable || exit 1
XLA_VMM_TMP_COPY_THRESHOLD=0 ab --out "$OUT/remap_only" --thresholds "" --modes va-stable || exit 1
# The jump came with the guard off and at threshold 0 too (check_b446d5d/step8): what the VA-stable runner leaves in
# the process. One VA reservation instead of two (each maps every buffer again), and the completion thread's
# plain backoff instead of its paced polling.
XLA_VMM_RESERVATIONS=1 ab --out "$OUT/one_reservation" --thresholds "" --modes va-stable || exit 1
XLA_VMM_COMPLETION_POLL=backoff ab --out "$OUT/poll_backoff" --thresholds "" --modes va-stable,graph-recapture || exit 1
# A process that ran graph-recapture alone was never slow; every slow one had made the VA-stable runner, even for
# one step (guard_recapture_first_865279c.md). What of it: the in-process binding cost probe (its own stream, two
# mappings of up to PROBE_COPY_BYTES, copies) or the runner itself (reservations, captures)?
XLA_VMM_PROBE=0 ab --out "$OUT/no_probe" --thresholds "" --modes va-stable,graph-recapture || exit 1
python3 "$HERE/diag/step_times.py" "$OUT/guard/ab.json" "$OUT/remap_only/ab.json" "$OUT/one_reservation/ab.json" \
  "$OUT/poll_backoff/ab.json" "$OUT/no_probe/ab.json" --model "$MODEL" --last 20 | tee "$OUT/step_times.md"
