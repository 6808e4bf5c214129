#!/usr/bin/env bash
# Every GPU check of xla-vmm, in one script, ending with a summary table.
# Run on a machine with an NVIDIA GPU and jax (CUDA plugin) installed, from the
# repo root, on artifacts staged by integration/stage_gpu.sh:
#     bash integration/gpu_check.sh .dev/gpu [SECTION...]
# SECTION: device stock runtime plugin perf memcheck (default, in that order; runtime and perf need
# stock's reference data in $WORK, made by `stock` or by perf itself; `multi compare` too when the machine
# has 2+ GPUs). `perf` is the perf gate, one run of at most 9 minutes: bench.py (every stock configuration
# vs every mode of ours), a short A/B through the plugin (ab.py) and real MaxText tiny and 1B when its folder
# is staged ($S/mt: stage_gpu.sh --perf); it FAILs when the default mode is slower than the best stock
# configuration or than our eager or graph-recapture mode on any row, or its losses moved (perf_gate.py).
# `perf-bench` and `perf-mt` are its halves, for narrow runs. Opt-in, only when named: `bench` (bench.py alone), `sanitize` (compute-sanitizer memcheck on a 200-step VA-stable loop at thresholds 0 / 1 / 4096),
# `sanitize-jax` (memcheck over a short llama training through the plugin under JAX),
# `copy-paths` (the VA-stable copy paths' diagnostic), `schedules` (integration/diag/schedules.sh), `step8` (integration/diag/step8.sh: the guard on and off, remap only, recapture alone, step by step), `budget` (programs past a device memory budget,
# bit-identical to stock), `multi` (2+ GPUs: NCCL collectives, the multi-device fixtures through the runtime on every device),
# `jax` (a slice of JAX's own test suite, stock then vmm, side by side: integration/jax_tests.py on the
# tests staged at $S/jaxtests by `JAX_SRC=... stage_gpu.sh --perf`; JAX_SLICE_FILES / JAX_SLICE_BUDGET_S /
# JAX_SLICE_REF (an earlier jax_tests.json[.gz] whose stock half is reused), JAX_SLICE_RESUME (an earlier
# one of the same code: finished files reused, cut ones continued), JAX_SLICE_JOBS (processes at once; default
# the machine's cores: the longest files run as several shards)),
# `ab-rocm` (the A/B with ROCm's remap cost emulated: XLA_VMM_EMULATE_REMAP_MS, issue 15),
# `compare` (2+ GPUs: FSDP llama through the plugin, one process and jax.distributed, every threshold
# against stock: integration/multi/compare.py), `ab` (integration/ab.py), `feed` (integration/feed_bench.py:
# a loop fed a fresh batch per step, steps/s against stock), `long` (integration/long_runs.py: SIGINT at
# random points of 50 training loops, a 20,000-step soak on stock and the plugin, 2,000 programs compiled and dropped, 8 threads at once;
# LONG_PARTS names some of interrupt soak churn threads), `checkpoint`
# (integration/maxtext/checkpoint.py: MaxText saved and resumed with orbax, on us, on stock and across),
# `train-oversub` (MaxText 1B past a device memory limit on us, against stock capped to the same memory with and
# without MaxText's own host offload), `oversub` (a llama forward whose weights are 1.5x and 2x the device
# memory limit, through the plugin: integration/oversub_bench.py), `train-jax` (a JAX llama training step past the
# limit on us, against stock capped and stock with Adam's moments offloaded by hand: integration/train_oversub_bench.py),
# `hip-shim` (our HIP backend's conformance suite on
# the NVIDIA GPU through the test shim integration/hipshim: HIP runtime -> CUDA driver, hiprtc -> NVRTC; it
# checks our HIP code, not AMD's runtime).
# GPU_CHECK_BUDGET_S: start no check after that many seconds (later ones are listed as SKIP), so that a
# run under a time limit still ends with its summary (exit 2 when any was skipped). A TERM (a timeout) also
# prints and saves the summary.
# Artifacts (logs, reference data, probe JSON) go to $XLA_VMM_GPU_WORK (default /tmp/xla-vmm-gpu).
# GPU_CHECK_ALT=1: our CLI and plugin from $S/alt (a second build staged by `stage_gpu.sh --perf --alt REF`)
# instead of $S/bin and $S/lib, so that one device call can run the same sections on two builds (a
# baseline and a change); the wheel of perf-mt's MaxText stays $S/wheel's.
set -u
S=${1:-.dev/gpu}
shift || true
DEFAULT="device stock runtime plugin perf memcheck"
# With two or more GPUs the multi-device checks are part of the default run.
[ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ] && DEFAULT="$DEFAULT multi compare"
SECTIONS=" ${*:-$DEFAULT} "
want() { [[ "$SECTIONS" == *" $1 "* ]]; }
BIN=$S/bin
LIB=$S/lib
if [ "${GPU_CHECK_ALT:-0}" = 1 ]; then
  [ -x "$S/alt/bin/xla-vmm" ] || { echo "GPU_CHECK_ALT=1: no $S/alt (stage_gpu.sh --perf --alt REF)"; exit 1; }
  BIN=$S/alt/bin; LIB=$S/alt/lib
  echo "== alternative build: $(cat "$S/alt/COMMIT" 2>/dev/null || echo '?')"
fi
FX=$S/fixtures
WORK=${XLA_VMM_GPU_WORK:-/tmp/xla-vmm-gpu}
STEPS=${STEPS:-50}
mkdir -p "$WORK/logs" "$WORK/ref"
export PYTHONUNBUFFERED=1
# cuBLASLt from the nvidia-cublas wheel that jax's CUDA plugin brings.
CU13=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)
[ -n "$CU13" ] && export LD_LIBRARY_PATH="$CU13:${LD_LIBRARY_PATH:-}"
VMM="$BIN/xla-vmm"
# Untimed steps before timed ones on our rows: the never-slower guard decides by ~40 (one number, benchio's).
GUARD_WARMUP=$(cd "$(dirname "$0")" && python3 -c 'import benchio; print(benchio.GUARD_WARMUP_STEPS)')
# NCCL from the nvidia-nccl wheel jax brings (our loader also finds it in-process under jax).
NCCL_SO=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
[ -n "$NCCL_SO" ] && [ -f "$NCCL_SO" ] && export XLA_VMM_NCCL_LIBRARY="$NCCL_SO"

# A fixture's executable and its inputs / outputs: the staged ones, else (llama_scan_bf16, whose 15 MB
# .npz is not in the repository) the fresh stock reference of section `stock`; nothing when neither is there.
fx_pair() {
  if [ -f "$FX/$1.npz" ]; then echo "$FX/$1.pjrt $FX/$1.npz"
  elif [ -f "$WORK/ref/$1.npz" ]; then echo "$WORK/ref/$1.pjrt $WORK/ref/$1.npz"
  fi
}

# fx_setup NAME: pj, nz and nd (--nondeterministic for the outputs stock XLA does not reproduce itself)
# of a fixture; false when it has neither a staged .npz nor a stock reference.
fx_setup() {
  read -r pj nz <<<"$(fx_pair "$1")"
  [ -n "$pj" ] || return 1
  nd=()
  [ "$1" = llama_scan_bf16 ] && [ -f "$WORK/ref/$1.loop.json" ] && nd=(--nondeterministic "$WORK/ref/$1.loop.json")
  return 0
}

declare -a SUMMARY=()
pass=0; fail=0; skipped=0
START_NS=$(date +%s%N)
secs() { local d=$(( ($(date +%s%N) - $1) / 100000000 )); printf '%d.%d' $((d / 10)) $((d % 10)); }
# check NAME CMD...: run CMD, log to $WORK/logs/NAME.log, record PASS/FAIL with the last line
# (SKIP, without running it, once GPU_CHECK_BUDGET_S has passed; `ALWAYS=1 check ...` runs whatever the
# budget: the few-second report steps that turn a section's rows into its table).
check() {
  local name=$1; shift
  local log="$WORK/logs/$name.log"
  local t0=$(date +%s%N)
  if [ -z "${ALWAYS:-}" ] && [ -n "${GPU_CHECK_BUDGET_S:-}" ] && [ $(( (t0 - START_NS) / 1000000000 )) -ge "$GPU_CHECK_BUDGET_S" ]; then
    SUMMARY+=("SKIP  $name  (GPU_CHECK_BUDGET_S=$GPU_CHECK_BUDGET_S s spent)")
    skipped=$((skipped + 1))
    echo "== $name: SKIP"
    return 0
  fi
  # In the background and waited for, so that a TERM reaches the trap below at once.
  CURRENT=$name
  "$@" >"$log" 2>&1 </dev/null &
  CHILD=$!
  local rc=0
  wait "$CHILD" || rc=$?
  CHILD=
  if [ "$rc" -eq 0 ]; then
    SUMMARY+=("PASS  $name  ($(secs "$t0") s)  $(tail -n 1 "$log" | cut -c1-110)")
    pass=$((pass + 1))
  else
    SUMMARY+=("FAIL  $name  (rc $rc)  $(tail -n 3 "$log" | tr '\n' ' ' | cut -c1-200)")
    fail=$((fail + 1))
  fi
  echo "== $name: ${SUMMARY[-1]%%  *}"
}
# The summary table (and $SAVE_TO/summary.txt + logs.tar.gz), at the end or on a TERM.
summary() {
echo
echo "================ xla-vmm GPU check summary ================"
printf '%s\n' "${SUMMARY[@]}"
echo "$pass passed, $fail failed, $skipped skipped"
[ -f "$WORK/logs/bench.log" ] && { echo; grep -A20 '^| program' "$WORK/logs/bench.log"; }
for g in "$WORK"/perf/gate.md; do [ -f "$g" ] && { echo; cat "$g"; }; done
[ -f "$WORK/perf/copy_paths.md" ] && { echo; cat "$WORK/perf/copy_paths.md"; }
[ -f "$WORK/ab/ab.md" ] && { echo; cat "$WORK/ab/ab.md"; }
[ -f "$WORK/ab_rocm/ab.md" ] && { echo; echo "A/B under ROCm's remap cost (XLA_VMM_EMULATE_REMAP_MS):"; cat "$WORK/ab_rocm/ab.md"; }
[ -f "$WORK/multi/compare.md" ] && { echo; cat "$WORK/multi/compare.md"; }
[ -f "$WORK/feed/feed.md" ] && { echo; cat "$WORK/feed/feed.md"; }
for l in "$WORK"/logs/loop*:graph*.log; do
  [ -f "$l" ] && echo "$(basename "$l" .log): $(grep -h '^LOSSES' "$l") | $(grep -h '^binding:' "$l")"
done
# Keep the logs next to the summary (a tarball in $SAVE_TO, when set).
if [ -n "${SAVE_TO:-}" ]; then
  mkdir -p "$SAVE_TO"
  printf '%s\n' "${SUMMARY[@]}" "$pass passed, $fail failed, $skipped skipped" >"$SAVE_TO/summary.txt"
  tar -czf "$SAVE_TO/logs.tar.gz" -C "$WORK" logs $(cd "$WORK" && ls -d probe.json ref/*.json ref-det/*.json ab/ab.* multi/* mfx/*.json feed/* perf/*.md perf/*.json perf/ab/ab.* perf/mt/mt.* perf/mt/mt_logs.tar.gz va_gap/va_gap.* ab_rocm/ab.* oversub/oversub.* train_jax/train_oversub.* train_jax/trace/*/staging_vs_trace.* train_oversub/mt.* train_oversub/mt_logs.tar.gz long/long_runs_* step8/step_times.md step8/*/ab.* ckpt/ckpt.* ckpt/ckpt_logs.tar.gz 2>/dev/null)
  # The oversub programs' executables on their own (their size should not cost the logs).
  [ -d "$WORK/oversub/exe" ] && tar -czf "$SAVE_TO/oversub_exe.tar.gz" -C "$WORK/oversub" exe
  [ -d "$WORK/train_jax/exe" ] && tar -czf "$SAVE_TO/train_jax_exe.tar.gz" -C "$WORK/train_jax" exe
fi
}
CHILD=; CURRENT=
# A timeout (TERM) or ^C: stop the running check, then print and save the summary as far as it got.
on_term() {
  trap - TERM INT
  [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null
  SUMMARY+=("STOP  ${CURRENT:-?}  (terminated after $(secs "$START_NS") s; later checks not run)")
  fail=$((fail + 1))
  summary
  exit 124
}
trap on_term TERM INT

echo "== device"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# 1. Device layer: conformance suite, allocator soak, remap data check (issue 3).
want device && for t in "$BIN"/test-xla-vmm-device-*; do
  [ -x "$t" ] && check "device:$(basename "$t" | sed 's/test-xla-vmm-device-//')" "$t" --include-ignored --test-threads=1
done
if want device; then
  check probe "$VMM" probe --json
  cp "$WORK/logs/probe.log" "$WORK/probe.json" 2>/dev/null
fi

# 2. Stock-XLA references (integration/stock_ref.py): the same serialized executable run by stock XLA,
#    one step + a training loop, with default flags and with deterministic ops. Each also records
#    which outputs stock XLA itself does not reproduce run to run (atomics).
want stock && check "stock-ref" python3 integration/stock_ref.py --out "$WORK/ref" --steps "$STEPS" llama_sgd_f32 llama_scan_bf16
want stock && check "stock-ref-det" env XLA_FLAGS=--xla_gpu_deterministic_ops=true \
  python3 integration/stock_ref.py --out "$WORK/ref-det" --steps "$STEPS" llama_sgd_f32 llama_scan_bf16

# 3. Runtime on the fixtures: bit-identical to the stock-XLA outputs, both modes (issue 4).
if want runtime; then
for t in "$BIN"/test-xla-vmm-runtime-*; do
  [ -x "$t" ] && check "runtime:$(basename "$t" | sed 's/test-xla-vmm-runtime-//')" "$t" --include-ignored --test-threads=1
done
for f in small loop mlp_adam_donated llama_scan_bf16 fft_kinds; do
  # (llama_scan_bf16 has outputs written by atomic scatter-adds; which ones stock XLA does not
  # reproduce comes from the fresh stock compile of the same program above.)
  fx_setup "$f" || { echo "== fixture:$f: no .npz staged and no stock reference (section stock)"; continue; }
  for mode in eager graph; do
    check "fixture:$f:$mode" "$VMM" run "$pj" --inputs "$nz" --compare "$nz" --mode "$mode" "${nd[@]}"
  done
done
for ref in ref ref-det; do
  for f in llama_sgd_f32 llama_scan_bf16; do
    for mode in eager graph; do
      check "$ref:$f:$mode" "$VMM" run "$WORK/$ref/$f.pjrt" --inputs "$WORK/$ref/$f.npz" --compare "$WORK/$ref/$f.npz" \
        --mode "$mode" --nondeterministic "$WORK/$ref/$f.loop.json"
    done
  done
done
# Training loops, state fed back: losses bit-identical to stock for every step. Deterministic-ops
# executables only: with atomics, stock XLA does not reproduce its own losses either.
for f in llama_sgd_f32 llama_scan_bf16; do
  for mode in eager graph; do
    check "loop$STEPS:$f:$mode" "$VMM" run "$WORK/ref-det/$f.pjrt" --inputs "$WORK/ref-det/$f.npz" --mode "$mode" \
      --loop-steps "$STEPS" --loop-ref "$WORK/ref-det/$f.loop.json"
  done
  # VA-stable graph mode at every kind of threshold: the same loss bits as stock (the last log
  # line is the binding stats).
  for t in 0 1 4096; do
    check "loop$STEPS:$f:graph:t$t" "$VMM" run "$WORK/ref-det/$f.pjrt" --inputs "$WORK/ref-det/$f.npz" --mode graph \
      --threshold "$t" --loop-steps "$STEPS" --loop-ref "$WORK/ref-det/$f.loop.json"
  done
done
fi

# 4. The PJRT plugin under JAX (JAX_PLATFORMS=vmm): pytest suite incl. a llama A/B against stock XLA.
export XLA_VMM_LIBRARY="$LIB/libxla_vmm_plugin.so"
want plugin && check "plugin:pytest" python3 -m pytest -q -rs -p no:cacheprovider integration/tests

# 5. Benchmark (not a test, opt in: section `bench`): every stock configuration vs our modes, same executable.
want bench && check "bench" python3 integration/bench.py --vmm "$VMM" --ref "$WORK/ref" llama_sgd_f32 llama_scan_bf16

# 5b. The perf gate (section `perf`, default): one run of at most 9 minutes that measures the default mode
#     against the best stock configuration of the same run and against our own eager and graph-recapture
#     modes on bench.py (the stock reference executables through the CLI), a short A/B through the plugin
#     (ab.py) and real MaxText tiny and 1B when its folder is staged ($S/mt: stage_gpu.sh --perf), then ONE
#     verdict over all of them (perf_gate.py -> $PERF/gate.md; FAIL: a default row slower than a reference,
#     or its losses moved). GATE_BUDGET_S (default 530): the whole gate's seconds; the MaxText part gets
#     what bench and A/B left. `perf-bench` and `perf-mt` are its halves, for narrow runs.
#     Every row is measured after its warm-up (our never-slower guard decides within a program's first ~16
#     steps, and takes its second look by ~step 35): bench.py times 30 steps after 40 untimed ones, the A/B
#     and MaxText take the median of steps 40-59 of 60 (PERF_MEASURE_FROM), stock's rows the same.
#     PERF_BENCH_ENV: extra bench rows ('NAME:K=V,K=V;NAME2:...'); MT_CONFIGS / MT_VARIANTS / MT_STEPS /
#     MT_PROFILE (a step: trace it and the next with the profiler, GPU time per step in mt.md; a diagnostic) /
#     MT_BALANCE (default 1B: configs whose stock rows and default run twice, A B B A, the gate taking each
#     row's mean; a run pays for coming later, and stock's come first; empty: once each):
#     the MaxText part (integration/maxtext/run.py); PERF_AB_MODELS / PERF_AB_STEPS / PERF_AB_THRESHOLDS /
#     PERF_AB_REPEAT (our rows run that many times in turn, the median shown) / PERF_AB_MODES (our other rows;
#     add `va-stable` for graph mode without the guard) / PERF_AB_GPU_CLOCKS_MS (poll the GPU's clocks that often
#     during each row: a diagnostic, the rows then cost the host a little more) / PERF_AB_STEP_COUNTERS=1 (our
#     rows record the plugin's map / unmap / allocation counters after every step): the A/B.
PERF=$WORK/perf
GATE_T0=$(date +%s)
if want perf || want perf-bench; then
  mkdir -p "$PERF"
  [ -f "$WORK/ref/llama_scan_bf16.loop.json" ] && [ -f "$WORK/ref/llama_sgd_f32.loop.json" ] || \
    check "perf:stock-ref" python3 integration/stock_ref.py --out "$WORK/ref" --steps 30 llama_sgd_f32 llama_scan_bf16
  benv=()
  IFS=';' read -r -a _rows <<<"${PERF_BENCH_ENV:-}"
  for r in "${_rows[@]}"; do [ -n "$r" ] && benv+=(--vmm-env "$r"); done
  check "perf:bench" python3 integration/bench.py --vmm "$VMM" --ref "$WORK/ref" --steps 30 --warmup 40 \
    --json "$PERF/bench.json" "${benv[@]}" llama_sgd_f32 llama_scan_bf16
  check "perf:ab" python3 integration/ab.py --out "$PERF/ab" --vmm "$VMM" --steps "${PERF_AB_STEPS:-60}" \
    --measure-from "${PERF_MEASURE_FROM:-40}" \
    --repeat "${PERF_AB_REPEAT:-1}" --models "${PERF_AB_MODELS:-llama_small_f32,maxtext_tiny_bf16}" \
    --thresholds "${PERF_AB_THRESHOLDS:-1}" --modes "${PERF_AB_MODES:-eager,graph-recapture}" \
    ${PERF_AB_GPU_CLOCKS_MS:+--gpu-clocks-ms "$PERF_AB_GPU_CLOCKS_MS"} ${PERF_AB_STEP_COUNTERS:+--step-counters}
fi
if want perf || want perf-mt; then
  MT=${PERF_MT:-$S/mt}
  if [ -d "$MT/.mt" ]; then
    mkdir -p "$PERF/mt"
    wheel=$(ls "$S"/wheel/*.whl 2>/dev/null | head -1)
    mt_budget=${MT_BUDGET_S:-$(( ${GATE_BUDGET_S:-530} - ($(date +%s) - GATE_T0) ))}
    check "perf:maxtext" python3 integration/maxtext/run.py --mt "$MT" --out "$PERF/mt" ${wheel:+--wheel "$wheel"} \
      --configs "${MT_CONFIGS:-tiny,1B}" --variants "${MT_VARIANTS:-cuda,cuda_skip_temp,vmm_t1,vmm_eager,vmm_recapture}" \
      --steps "${MT_STEPS:-60}" --measure-from "${PERF_MEASURE_FROM:-40}" --budget-s "$mt_budget" \
      --balance "${MT_BALANCE-1B}" \
      ${MT_PROFILE:+--profile "$MT_PROFILE"}
  else
    check "perf:maxtext" sh -c "echo 'no MaxText folder at $MT (integration/maxtext/prepare.sh, then stage_gpu.sh --perf)'; exit 1"
  fi
fi
if want perf || want perf-bench || want perf-mt; then
  gate_in=()
  [ -f "$PERF/bench.json" ] && gate_in+=(--bench "$PERF/bench.json")
  [ -f "$PERF/ab/ab.json" ] && gate_in+=(--ab "$PERF/ab/ab.json")
  [ -f "$PERF/mt/mt.json" ] && gate_in+=(--mt "$PERF/mt/mt.json")
  ALWAYS=1 check "perf:gate" python3 integration/perf_gate.py "${gate_in[@]}" --out "$PERF/gate.md" \
    --json "$PERF/gate.json" --title "perf gate, $(cat "$BIN/../COMMIT" 2>/dev/null || echo '?') ($(( $(date +%s) - GATE_T0 )) s)"
fi
# The copy-path diagnostic (opt in: section `copy-paths`): the VA-stable copies' paths on this device.
want copy-paths && check "copy-paths" bash integration/diag/copy_paths.sh "$S" "$WORK/perf"
# 5b'. Where the default (VA-stable) step loses to graph-recapture (opt in: section `va-gap`): the A/B
#      models' saved executables through the CLI and through the plugin, by mode, copy path and
#      completion path (integration/diag/va_gap.py; results/va_gap_f66ded2.md). VA_GAP_MODELS, VA_GAP_ROWS.
want va-gap && check "va-gap" python3 integration/diag/va_gap.py --vmm "$VMM" --out "$WORK/va_gap" --steps 30 \
  --rows "${VA_GAP_ROWS:-modes}" ${VA_GAP_MODELS:-llama_small_f32 maxtext_tiny_bf16}
# 5b'''. What one runner leaves behind for the next (opt in: section `schedules`, issue 30): training loops of
#       the stock references with their steps in the modes a schedule names, the GPU's clocks per row
#       (integration/diag/schedules.sh; SCHEDULES_MODELS, SCHEDULES_LONG=0 leaves out its 1000-step rows).
want schedules && check "schedules" bash integration/diag/schedules.sh "$VMM" "$WORK/schedules_ref"
want step8 && check "step8" bash integration/diag/step8.sh "$WORK/step8" "${STEP8_MODEL:-llama_small_f32}"
# 5b''. Programs past a device memory budget (opt in: section `budget`, issue 29): the fixtures and the
#       stock references with XLA_VMM_DEVICE_MEMORY_LIMIT far below their buffers, so that most of them live
#       in host memory mapped for the device (cuMemCreate, host NUMA) and what the staging reserve allows is
#       staged through device memory: outputs bit-identical to stock's in eager and VA-stable graph mode at
#       each of BUDGET_LIMITS (default 8M 64M), the 50-step loops' losses too, and the step time at each of
#       BUDGET_TIME_LIMITS (default none 8M 128M 384M; `none`: no budget) with staging and, at each limit,
#       with the whole budget for ordinary allocations (XLA_VMM_STAGING_RESERVE=0: read in place).
if want budget; then
  for lim in ${BUDGET_LIMITS:-8M 64M}; do
    for f in small loop mlp_adam_donated llama_scan_bf16; do
      fx_setup "$f" || continue
      for mode in eager graph; do
        check "budget:$lim:$f:$mode" env XLA_VMM_DEVICE_MEMORY_LIMIT="$lim" \
          "$VMM" run "$pj" --inputs "$nz" --compare "$nz" --mode "$mode" "${nd[@]}"
      done
    done
  done
  for f in llama_sgd_f32 llama_scan_bf16; do
    [ -f "$WORK/ref-det/$f.pjrt" ] || continue
    for lim in ${BUDGET_LIMITS:-8M 64M}; do
      check "budget:$lim:loop$STEPS:$f:graph" env XLA_VMM_DEVICE_MEMORY_LIMIT="$lim" \
        "$VMM" run "$WORK/ref-det/$f.pjrt" --inputs "$WORK/ref-det/$f.npz" --mode graph \
        --loop-steps "$STEPS" --loop-ref "$WORK/ref-det/$f.loop.json"
    done
    for lim in ${BUDGET_TIME_LIMITS:-none 8M 128M 384M}; do
      for reserve in ${BUDGET_RESERVES:-25 0}; do
        benv=(XLA_VMM_STAGING_RESERVE=$reserve); [ "$lim" != none ] && benv+=(XLA_VMM_DEVICE_MEMORY_LIMIT="$lim")
        [ "$lim" = none ] && [ $reserve = 0 ] && continue
        check "budget:time:$f:$lim:reserve$reserve" env "${benv[@]}" "$VMM" run "$WORK/ref-det/$f.pjrt" \
          --inputs "$WORK/ref-det/$f.npz" --steps 30 --warmup "$GUARD_WARMUP"
      done
    done
    check "budget:plan:$f" "$VMM" inspect "$WORK/ref-det/$f.pjrt" --memory-budget "${BUDGET_LIMIT:-8M}"
  done
  # compute-sanitizer memcheck over 20 staged steps (llama_scan_bf16 at 64M: 86 buffers staged through a
  # 16 MiB area; llama_sgd_f32 at 384M: 65 through 96 MiB), losses against stock's.
  if command -v compute-sanitizer >/dev/null; then
    for fl in llama_scan_bf16:64M llama_sgd_f32:384M; do
      f=${fl%%:*}; lim=${fl#*:}
      [ -f "$WORK/ref-det/$f.pjrt" ] || continue
      check "budget:memcheck20:$f:$lim" env XLA_VMM_DEVICE_MEMORY_LIMIT="$lim" compute-sanitizer --tool memcheck \
        --report-api-errors no --error-exitcode 9 "$VMM" run "$WORK/ref-det/$f.pjrt" --inputs "$WORK/ref-det/$f.npz" \
        --mode graph --loop-steps 20 --loop-ref "$WORK/ref-det/$f.loop.json"
    done
  fi
fi

# 5c. JAX's own tests, stock vs vmm (opt in: section `jax`). Exit status 0 whatever the tests did: the
#     table (jax_tests.md) is the result; process deaths are listed there with their last words.
if want jax; then
  if [ -d "$S/jaxtests" ]; then
    jref=(); [ -n "${JAX_SLICE_REF:-}" ] && jref=(--ref-from "$JAX_SLICE_REF")
    [ -n "${JAX_SLICE_RESUME:-}" ] && jref+=(--resume-from "$JAX_SLICE_RESUME")
    check "jax:slice" python3 integration/jax_tests.py --tests "$S/jaxtests" --vmm-lib "$LIB/libxla_vmm_plugin.so" \
      --out "$WORK/jax" --budget-s "${JAX_SLICE_BUDGET_S:-900}" --jobs "${JAX_SLICE_JOBS:-$(nproc)}" \
      ${JAX_SLICE_FILES:+--files "$JAX_SLICE_FILES"} "${jref[@]}"
  else
    check "jax:slice" sh -c "echo 'no JAX tests at $S/jaxtests (JAX_SRC=<jax git dir> stage_gpu.sh --perf)'; exit 1"
  fi
fi

# 6. compute-sanitizer memcheck on the fixture suite.
if want memcheck && command -v compute-sanitizer >/dev/null; then
  for f in small loop mlp_adam_donated llama_scan_bf16; do
    fx_setup "$f" || continue
    for mode in eager graph; do
      check "memcheck:$f:$mode" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
        "$VMM" run "$pj" --inputs "$nz" --compare "$nz" --mode "$mode" "${nd[@]}"
    done
  done
fi

# 6b. compute-sanitizer memcheck over a 200-step VA-stable training loop at thresholds 0 / 1 / 4096
#     (opt in: section `sanitize`): every remap, shadow copy and graph replay of a long run checked.
if [[ "$SECTIONS" == *" sanitize "* ]] && command -v compute-sanitizer >/dev/null; then
  check "sanitize:stock-ref200" env XLA_FLAGS=--xla_gpu_deterministic_ops=true \
    python3 integration/stock_ref.py --out "$WORK/ref200" --steps 200 llama_scan_bf16
  for t in 0 1 4096; do
    check "sanitize:loop200:llama_scan_bf16:t$t" compute-sanitizer --tool memcheck --report-api-errors no \
      --error-exitcode 9 "$VMM" run "$WORK/ref200/llama_scan_bf16.pjrt" --inputs "$WORK/ref200/llama_scan_bf16.npz" \
      --mode graph --threshold "$t" --loop-steps 200 --loop-ref "$WORK/ref200/llama_scan_bf16.loop.json"
  done
fi

# 6b'. compute-sanitizer memcheck over JAX training through the plugin (opt in: section `sanitize-jax`):
#     the stock side writes a llama executable and its inputs, the vmm side loads it through the plugin
#     (JAX_PLATFORMS=vmm) and runs SANITIZE_JAX_STEPS steps under memcheck, losses checked against stock
#     (first run at dd0ce23: 0 errors, integration/results/sanitize_jax_dd0ce23.md).
if [[ "$SECTIONS" == *" sanitize-jax "* ]] && command -v compute-sanitizer >/dev/null; then
  export XLA_VMM_LIBRARY="$LIB/libxla_vmm_plugin.so"
  check "sanitize-jax:stock" env JAX_PLATFORMS=cuda XLA_FLAGS=--xla_gpu_deterministic_ops=true \
    python3 integration/tests/llama_ab.py stock "$WORK/sanjax" --steps "${SANITIZE_JAX_STEPS:-10}"
  check "sanitize-jax:vmm" env JAX_PLATFORMS=vmm compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    --target-processes all python3 integration/tests/llama_ab.py vmm "$WORK/sanjax" --steps "${SANITIZE_JAX_STEPS:-10}"
  # The vmm side's own verdict (steps, losses against stock) next to memcheck's summary.
  check "sanitize-jax:losses" grep -h "^vmm " "$WORK/logs/sanitize-jax:vmm.log"
fi

# 6c. Several GPUs (opt in: section `multi`; issue 7). NCCL collectives in the device layer, the multi-device
#     fixtures (regenerated here: the FSDP inputs are too big to carry) through the runtime on every device at
#     once, then FSDP llama through the plugin, single process and jax.distributed, against stock XLA.
if [[ "$SECTIONS" == *" multi "* ]]; then
  NGPU=$(nvidia-smi -L | wc -l)
  echo "== multi: $NGPU GPUs"
  for t in "$BIN"/test-xla-vmm-device-cuda_collectives*; do
    [ -x "$t" ] && check "multi:device:collectives" "$t" --include-ignored --test-threads=1 --nocapture
  done
  # Deterministic ops: every output of the FSDP steps must then match stock bit for bit (with XLA's default
  # atomics, stock does not reproduce the embedding gradient run to run).
  check "multi:fixtures" env XLA_FLAGS=--xla_gpu_deterministic_ops=true python3 integration/multi/make_fixtures.py "$WORK/mfx"
  for f in coll_all_reduce coll_all_reduce_bf16 coll_all_gather coll_reduce_scatter coll_permute coll_all_to_all \
           coll_partition_id fsdp_llama_scan_bf16 fsdp_llama_small_f32; do
    [ -f "$WORK/mfx/$f.pjrt" ] || continue
    for mode in eager graph; do
      check "multi:$f:$mode" "$VMM" run "$WORK/mfx/$f.pjrt" --inputs "$WORK/mfx/$f.npz" --compare "$WORK/mfx/$f.npz" \
        --devices 2 --mode "$mode"
    done
  done
  fi

# 6d. The 2-GPU A/B (section `compare`, on by default with 2+ GPUs): FSDP llama through the plugin, one
#     process and jax.distributed, every threshold, against stock twice and stock without command buffers.
#     Deterministic ops: with the embedding gradient's atomics stock XLA does not reproduce its own losses.
#     COMPARE_BUDGET_S: start no run after that many seconds (the rest is listed as pending in compare.json);
#     COMPARE_RESUME=path/compare.json: keep the runs an earlier call finished, make only the others.
if want compare; then
  resume=(); [ -n "${COMPARE_RESUME:-}" ] && resume=(--resume "$COMPARE_RESUME")
  budget=(); [ -n "${COMPARE_BUDGET_S:-}" ] && budget=(--budget-s "$COMPARE_BUDGET_S")
  check "multi:compare" env XLA_FLAGS=--xla_gpu_deterministic_ops=true \
    python3 integration/multi/compare.py --out "$WORK/multi" --steps "${MULTI_STEPS:-20}" --timeout 120 \
    "${budget[@]}" "${resume[@]}"
fi

# 7. A/B harness (not a test, opt in: section `ab`): llama training through the plugin at thresholds
#    0/1/4096/65536/1M vs stock XLA with command buffers on/off. AB_MODELS / AB_STEPS override;
#    AB_BUDGET_S: start no model after that many seconds; AB_MERGE=path/ab.json keeps an earlier call's
#    rows of the other models (the A/B split over several device calls).
want_ab() { [[ "$SECTIONS" == *" ab "* ]]; }
ab_extra=()
[ -n "${AB_BUDGET_S:-}" ] && ab_extra+=(--budget-s "$AB_BUDGET_S")
[ -n "${AB_MERGE:-}" ] && ab_extra+=(--merge "$AB_MERGE")
[ -n "${AB_REPEAT:-}" ] && ab_extra+=(--repeat "$AB_REPEAT")
want_ab && check "ab" python3 integration/ab.py --out "$WORK/ab" --vmm "$VMM" --steps "${AB_STEPS:-20}" \
  --models "${AB_MODELS:-llama_small_f32,llama_110m_bf16,maxtext_tiny_bf16}" "${ab_extra[@]}"
want_ab && [ -f "$WORK/ab/ab.json" ] && python3 integration/plot_ab.py "$WORK/ab/ab.json" >/dev/null 2>&1

# 7b. What the copy threshold buys where a remap costs what it does on ROCm (opt in: section `ab-rocm`;
#     issue 15): the A/B with XLA_VMM_EMULATE_REMAP_MS (ROCM_REMAP_MS, default 3: every remap synchronizes
#     the device and lasts that long; copies as they are) at thresholds 0, auto and fixed cutoffs, with a
#     fresh batch put before every step (--fresh-batch: else the loop binds the same buffers every step and
#     nothing is remapped after the first steps).
#     AB_ROCM_MODELS / AB_STEPS override; AB_REPEAT (default 3): each of our rows runs that many times,
#     interleaved, and shows the median of its runs (auto and the fixed cutoffs make the same plan on these
#     models, so one run each compares noise: 1-3% between calls).
[[ "$SECTIONS" == *" ab-rocm "* ]] && check "ab-rocm" env XLA_VMM_EMULATE_REMAP_MS="${ROCM_REMAP_MS:-3}" \
  python3 integration/ab.py --out "$WORK/ab_rocm" --vmm "$VMM" --steps "${AB_STEPS:-30}" --stock-configs onoff \
  --models "${AB_ROCM_MODELS:-llama_small_f32,maxtext_tiny_bf16}" --thresholds 0,1,4096,65536 --modes "" \
  --fresh-batch --repeat "${AB_REPEAT:-3}"

# 8. A training loop fed a fresh batch per step, not blocking on each step (opt in: section `feed`):
#    steps/s of stock XLA vs xla-vmm (auto, 0) in one run: asynchronous Execute and device_put.
[[ "$SECTIONS" == *" feed "* ]] && check "feed" python3 integration/feed_bench.py --out "$WORK/feed" \
  --model "${FEED_MODEL:-llama_small_f32}" --steps "${FEED_STEPS:-200}"

# 8b. Long runs (opt in: section `long`, issue 34): 50 training loops interrupted by SIGINT through the plugin
#     (each must raise KeyboardInterrupt and exit within 5 s, leaving nothing on the GPU), and a soak of
#     LONG_STEPS (default 20,000) steps on stock then the plugin of the A/B's llama (LONG_SOAK_MODEL, default
#     llama_small_f32, stock's executable loaded by the plugin; `mlp` for the earlier soak's MLP) (host RSS,
#     device bytes, report() and stats() flat after warm-up, step time without drift, losses bit-identical),
#     and 8 Python threads dispatching
#     different programs and transfers at once for LONG_THREADS_S (120) s, each worker's results equal to the
#     same work run serially; 2,000 distinct programs compiled, run and dropped (LONG_CHURN_PROGRAMS), the
#     plugin's counters back where they were once its allocator's cache is released, host RSS against stock's
#     over the same programs (run first, or beside ours with LONG_CHURN_BESIDE=1; LONG_CHURN_STOCK=0 skips it):
#     integration/long_runs.py.
if want long; then
  # LONG_PARTS: which of them (default all four; the first GPU run of all four did not fit one device call).
  part() { [[ " ${LONG_PARTS:-interrupt soak churn threads} " == *" $1 "* ]]; }
  part interrupt && check "long:interrupt" env XLA_VMM_LIBRARY="$LIB/libxla_vmm_plugin.so" python3 integration/long_runs.py interrupt \
    --platform vmm --trials "${LONG_TRIALS:-50}" --out "$WORK/long"
  # Stock's exit under the same interrupts, for reference (long_runs_interrupt_cuda.md; never a FAIL).
  part interrupt && [ "${LONG_STOCK_TRIALS:-10}" -gt 0 ] && check "long:interrupt:stock" python3 integration/long_runs.py interrupt \
    --platform cuda --trials "${LONG_STOCK_TRIALS:-10}" --reference --out "$WORK/long"
  part soak && check "long:soak" env XLA_VMM_LIBRARY="$LIB/libxla_vmm_plugin.so" python3 integration/long_runs.py soak \
    --platforms cuda,vmm --steps "${LONG_STEPS:-20000}" --every 1000 --model "${LONG_SOAK_MODEL:-llama_small_f32}" --out "$WORK/long"
  # Stock over the same programs first, for reference (its host RSS: the vendor compiler's caches; never a FAIL).
  # LONG_CHURN_BESIDE=1: stock's run goes on beside ours instead, at the same time (the two fit one device call;
  # ours waits for stock's results at its end, and its log is long:churn:stock.log all the same).
  churn_args=(churn --programs "${LONG_CHURN_PROGRAMS:-2000}" --every 200 --out "$WORK/long")
  if part churn && [ "${LONG_CHURN_STOCK:-1}" = 1 ]; then
    if [ "${LONG_CHURN_BESIDE:-0}" = 1 ]; then
      mkdir -p "$WORK/long"
      python3 integration/long_runs.py "${churn_args[@]}" --platform cuda --reference \
        >"$WORK/logs/long:churn:stock.log" 2>&1 </dev/null &
      churn_args+=(--reference-wait-s 900)
    else
      check "long:churn:stock" python3 integration/long_runs.py "${churn_args[@]}" --platform cuda --reference
    fi
  fi
  part churn && check "long:churn" env XLA_VMM_LIBRARY="$LIB/libxla_vmm_plugin.so" python3 integration/long_runs.py \
    "${churn_args[@]}" --platform vmm
  part threads && check "long:threads" env XLA_VMM_LIBRARY="$LIB/libxla_vmm_plugin.so" python3 integration/long_runs.py threads \
    --platform vmm --threads 8 --seconds "${LONG_THREADS_S:-120}" --out "$WORK/long"
fi
# 8c. Checkpoint and resume (opt in: section `checkpoint`, issue 34 item 5): MaxText (staged at $S/mt) saved
#     with orbax after N steps and resumed, on stock, on us and across; every loss after the resume must equal
#     the uninterrupted run's, bit for bit: integration/maxtext/checkpoint.py (8 runs, about 4 minutes).
if want checkpoint; then
  MT=${PERF_MT:-$S/mt}
  wheel=$(ls "$S"/wheel/*.whl 2>/dev/null | head -1)
  check "checkpoint" python3 integration/maxtext/checkpoint.py --mt "$MT" --out "$WORK/ckpt" ${wheel:+--wheel "$wheel"} \
    --config "${CKPT_CONFIG:-tiny}" --steps "${CKPT_STEPS:-10}"
fi
# 8d. Training past the device memory (opt in: section `train-oversub`, issue 29's training benchmark): MaxText
#     1B (staged at $S/mt) on stock uncapped (the losses' reference and the ceiling), on us with no limit and with
#     XLA_VMM_DEVICE_MEMORY_LIMIT=$TRAIN_OVERSUB_LIMIT (default 10G: its parameters, optimizer state and
#     activations are about twice that), and on stock capped to the same memory (XLA_PYTHON_CLIENT_MEM_FRACTION=
#     $TRAIN_OVERSUB_FRACTION, default the limit over the card's memory: 0.07 of an H200, 0.125 of an H100)
#     without and with MaxText's own parameter and
#     optimizer host offload (../shared/maxtext/README.md: both failed on stock GPU when tried). The check
#     fails when one of our runs fails; stock's failures are results, shown in the table.
if want train-oversub; then
  MT=${PERF_MT:-$S/mt}
  wheel=$(ls "$S"/wheel/*.whl 2>/dev/null | head -1)
  lim=${TRAIN_OVERSUB_LIMIT:-10G}
  # The limit as a share of the card's memory (XLA_PYTHON_CLIENT_MEM_FRACTION is one of the total).
  frac=${TRAIN_OVERSUB_FRACTION:-$(python3 integration/benchio.py memory-fraction "$lim" 0.07)}
  check "train-oversub" python3 integration/maxtext/run.py --mt "$MT" --out "$WORK/train_oversub" \
    ${wheel:+--wheel "$wheel"} --configs 1B,1B_offload --steps "${TRAIN_OVERSUB_STEPS:-20}" --measure-from 5 \
    --budget-s "${TRAIN_OVERSUB_BUDGET_S:-400}" --required vmm --variants "1B:cuda,1B:vmm_t1,1B:vmm_t1@XLA_VMM_DEVICE_MEMORY_LIMIT=$lim,\
1B:cuda@XLA_PYTHON_CLIENT_MEM_FRACTION=$frac,1B_offload:cuda@XLA_PYTHON_CLIENT_MEM_FRACTION=$frac"
fi

# 8e. Inference past the device memory (opt in: section `oversub`, issue 29's inference benchmark): a llama
#     forward (prefill and decode) whose weights are OVERSUB_RATIOS (default 1.5,2) times the device memory
#     limit, through the plugin with no limit and at each ratio (integration/oversub_bench.py, rows vmm;
#     OVERSUB_ROWS=vmm,offload adds stock's hand-written offload). It fails when a budgeted run's outputs are
#     not the unbudgeted run's, bit for bit. OVERSUB_ENV: variables for the plugin (an A/B of an option).
if want oversub; then
  check "oversub" env ${OVERSUB_ENV:-} XLA_VMM_LIBRARY="$LIB/libxla_vmm_plugin.so" PYTHONPATH=integration \
    python3 integration/oversub_bench.py --out "$WORK/oversub" --rows "${OVERSUB_ROWS:-vmm}" \
    --ratios "${OVERSUB_RATIOS:-1.5,2}" --steps "${OVERSUB_STEPS:-6}" --warmup "$GUARD_WARMUP" --timeout 60 \
    --save-exe "$WORK/oversub/exe"
fi

# 8f. Training past the device memory, a model of our own (opt in: section `train-jax`, issue 29's training
#     benchmark against an explicit offload stock can run): a llama training step in JAX (float32, Adam) whose
#     state is TRAIN_JAX_RATIOS (default 1.25,2: stock's hand-written offload fits the first) times the limit,
#     on stock uncapped, on us with no limit and at each ratio, on stock capped to the same memory, and on stock
#     with Adam's moments in pinned_host moved by hand (integration/train_oversub_bench.py; TRAIN_JAX_ARGS: its
#     model arguments). The link bound from the `device` section's probe when it ran. It fails when one of our
#     runs fails or a limited run's losses are not the unlimited run's, bit for bit. TRAIN_JAX_TRACE (set): our
#     limited rows trace a few more steps and each is set beside `inspect --as-run`'s estimate of the step
#     (integration/diag/staging_vs_trace.py: train_jax/trace/ratio_R/staging_vs_trace.md).
if want train-jax; then
  check "train-jax" env XLA_VMM_LIBRARY="$LIB/libxla_vmm_plugin.so" python3 integration/train_oversub_bench.py \
    --out "$WORK/train_jax" --ratios "${TRAIN_JAX_RATIOS:-1.25,2}" --probe "$WORK/probe.json" \
    --save-exe "$WORK/train_jax/exe" ${TRAIN_JAX_TRACE:+--trace "$WORK/train_jax/trace" --cli "$VMM"} \
    ${TRAIN_JAX_ARGS:-}
fi

# 9. Our HIP backend on the NVIDIA GPU (opt in: section `hip-shim`): the HIP conformance test binary with the
#    test shim as its HIP runtime (XLA_VMM_HIP_LIBRARY: the H200 machine has ROCm 5.7's libamdhip64.so.5,
#    which would come first and finds no device), as its hiprtc (NVRTC from the CUDA wheels' lib folder) and
#    as its hipBLASLt (cuBLASLt, XLA_VMM_HIPBLASLT_LIBRARY).
#    This checks our HIP code through CUDA, not AMD's runtime or driver.
if want hip-shim; then
  if [ -x "$BIN/hip-conformance" ] && [ -f "$S/lib/hipshim/libamdhip64.so" ]; then
    HS=$(cd "$S/lib/hipshim" && pwd)
    hs_env=(env LD_LIBRARY_PATH="$HS:${LD_LIBRARY_PATH:-}" XLA_VMM_HIP_LIBRARY="$HS/libamdhip64.so"
      XLA_VMM_HIPRTC_LIBRARY="$HS/libamdhip64.so" XLA_VMM_HIPBLASLT_LIBRARY="$HS/libamdhip64.so")
    check "hip-shim:conformance" "${hs_env[@]}" "$BIN/hip-conformance" --include-ignored --test-threads=1
    # The runtime on the HIP backend (the staged CLI carries both backends, as the wheel's does): the CUDA
    # fixtures, bit-identical to stock XLA's outputs, eager and VA-stable. The llama programs are compiled
    # here by stock XLA with HIP_SHIM_XLA_FLAGS (default: Triton GEMMs off), as ROCm programs are made:
    # their GEMMs are cublas_lt_matmul thunks, which run through our hipBLASLt engine (forwarded by the
    # shim to cuBLASLt), and their kernels use no TMA descriptors, which HIP does not have (the staged
    # llama fixtures' Triton GEMMs on Hopper do).
    check "hip-shim:stock-ref" env XLA_FLAGS="${HIP_SHIM_XLA_FLAGS:---xla_gpu_enable_triton_gemm=false}" \
      python3 integration/stock_ref.py --out "$WORK/ref-hip" --steps 5 llama_sgd_f32 llama_scan_bf16
    for f in small loop mlp_adam_donated llama_sgd_f32 llama_scan_bf16; do
      read -r pj nz <<<"$(fx_pair "$f")"
      nd=()
      if [[ $f == llama_* ]]; then
        pj=$WORK/ref-hip/$f.pjrt nz=$WORK/ref-hip/$f.npz
        nd=(--nondeterministic "$WORK/ref-hip/$f.loop.json")
      fi
      [ -f "$pj" ] || { echo "== hip-shim:fixture:$f: no executable staged or made"; continue; }
      # A compile whose kernels take TMA descriptors (on an H100, llama_scan_bf16 had some with Triton GEMMs
      # off; this jax's XLA has no flag that turns TMA off) is not a program HIP can run, nor one a ROCm
      # compile makes: listed as N/A, not run, not failed.
      tma=$("$VMM" inspect "$pj" --json 2>/dev/null | python3 -c \
        'import json, sys; print(json.load(sys.stdin)["load_check"].get("tma_kernels", 0))' 2>/dev/null)
      if [ "${tma:-0}" -gt 0 ]; then
        SUMMARY+=("N/A   hip-shim:fixture:$f  ($tma of its kernels compiled here take TMA descriptors; HIP has none)")
        echo "== hip-shim:fixture:$f: N/A ($tma kernels take TMA descriptors)"
        continue
      fi
      for mode in eager graph; do
        check "hip-shim:fixture:$f:$mode" "${hs_env[@]}" "$VMM" run "$pj" --backend hip \
          --inputs "$nz" --compare "$nz" --mode "$mode" "${nd[@]}"
      done
    done
    # The plugin's HIP client under JAX (XLA_VMM_BACKEND=hip; the vendor compiler stays the CUDA plugin, whose
    # cubins HIP's NVIDIA platform loads): the plugin's pytest suite, as section `plugin` runs it on CUDA.
    check "hip-shim:plugin" "${hs_env[@]}" XLA_VMM_BACKEND=hip python3 -m pytest -q -rs -p no:cacheprovider integration/tests
  else
    check "hip-shim:conformance" sh -c "echo 'no HIP shim staged at $S/lib/hipshim or no $BIN/hip-conformance (integration/stage_gpu.sh)'; exit 1"
  fi
fi

summary
[ "$fail" -eq 0 ] || exit 1
# Skipped checks are not a pass.
[ "$skipped" -eq 0 ] || exit 2
