#!/usr/bin/env bash
# VA-stable graph mode on the GPU, quick (~75 s on H200): fixtures at thresholds 0/1, 20-step llama
# loops at eager / 0 / 1 / 4096 against stock losses (deterministic ops), step timings, and a small
# A/B (integration/ab.py, llama_small_f32). Staged by integration/stage_gpu.sh; results in $OUT.
#   run(command="OUT=$OUT bash integration/gpu_binding.sh .dev/gpu", carry=[".dev/gpu"])
set -u
S=${1:-.dev/gpu}; OUT=${OUT:-/tmp/b/out}; VMM=$S/bin/xla-vmm; FX=$S/fixtures; W=/tmp/b; mkdir -p $W/logs $OUT
export PYTHONUNBUFFERED=1 XLA_VMM_LIBRARY=$PWD/$S/lib/libxla_vmm_plugin.so
CU13=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)
[ -n "$CU13" ] && export LD_LIBRARY_PATH="$CU13:${LD_LIBRARY_PATH:-}"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
r() { local n=$1; shift; if timeout 60 "$@" >$W/logs/$n.log 2>&1; then s=PASS; else s="FAIL($?)"; fi
  echo "$s $n [$(el)s] $(grep -h '^LOSSES\|BIT-IDENTICAL\|DIFFER' $W/logs/$n.log | tail -1) $(grep -h '^binding:' $W/logs/$n.log)" | tee -a $OUT/summary.txt; }
echo "stock-ref [$(el)s]" | tee -a $OUT/summary.txt
XLA_FLAGS=--xla_gpu_deterministic_ops=true timeout 100 python3 integration/stock_ref.py --out $W/ref-det --steps 20 llama_sgd_f32 llama_scan_bf16 > $W/logs/stock.log 2>&1; echo "stock rc=$? [$(el)s]" | tee -a $OUT/summary.txt
timeout 60 python3 integration/stock_ref.py --out $W/ref --steps 3 llama_scan_bf16 > $W/logs/stock-nd.log 2>&1
for f in small loop mlp_adam_donated llama_scan_bf16; do
  for t in 0 1; do r "fx:$f:graph:t$t" $VMM run $FX/$f.pjrt --inputs $FX/$f.npz --compare $FX/$f.npz --mode graph --threshold $t $( [ $f = llama_scan_bf16 ] && echo --nondeterministic $W/ref/llama_scan_bf16.loop.json); done
done
for f in llama_sgd_f32 llama_scan_bf16; do
  for m in "eager" "graph --threshold 0" "graph --threshold 1" "graph --threshold 4096"; do
    r "loop20:$f:${m// /_}" $VMM run $W/ref-det/$f.pjrt --inputs $W/ref-det/$f.npz --mode $m --loop-steps 20 --loop-ref $W/ref-det/$f.loop.json
  done
  r "time:$f:graph-recapture" $VMM run $W/ref-det/$f.pjrt --inputs $W/ref-det/$f.npz --mode graph-recapture --steps 30
  for t in 0 1; do r "time:$f:graph:t$t" $VMM run $W/ref-det/$f.pjrt --inputs $W/ref-det/$f.npz --mode graph --threshold $t --steps 30; done
done
grep -h "steps=30" $W/logs/time*.log | tee -a $OUT/summary.txt
left=$(( 225 - $(el) ))
if [ $left -gt 40 ]; then
  timeout $left python3 integration/ab.py --out $W/ab --vmm $VMM --steps 12 --models llama_small_f32 --thresholds 0,1,4096 --timeout 60 > $W/logs/ab.log 2>&1
  echo "ab rc=$? [$(el)s]" | tee -a $OUT/summary.txt
  cp $W/ab/ab.md $W/ab/ab.json $OUT/ 2>/dev/null
  python3 integration/plot_ab.py $W/ab/ab.json -o $OUT/ab.png >/dev/null 2>&1
fi
tar -czf $OUT/logs.tgz -C $W logs ref-det/llama_sgd_f32.loop.json ref-det/llama_scan_bf16.loop.json 2>/dev/null
tail -5 $W/logs/ab.log 2>/dev/null
