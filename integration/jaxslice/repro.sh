#!/usr/bin/env bash
# Run one of JAX's tests through the plugin again and again, to catch a rare process death with its
# native stack: under gdb where the machine has it (every thread's backtrace at the signal), else with
# Python's faulthandler and the plugin's crash report (XLA_VMM_CRASH_REPORT: the native stack, each
# frame as module(+offset), which `addr2line -f -e <module>` names).
#     bash integration/jaxslice/repro.sh TESTS_DIR PLUGIN_LIB 'api_test.py::APITest::test_x' [RUNS] [OUT]
# Stops at the first death; exit status 0 when every run passed, 1 when one died or failed.
set -u
tests=$1 lib=$2 test=$3 runs=${4:-10} out=${5:-/tmp/jax-repro}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
export JAX_PLATFORMS=vmm,cpu XLA_VMM_LIBRARY=$lib XLA_PYTHON_CLIENT_PREALLOCATE=false
export JAX_NUM_GENERATED_CASES=2 PYTHONFAULTHANDLER=1 RUST_BACKTRACE=1 XLA_VMM_CRASH_REPORT=1
export PYTHONPATH="$here/jaxslice:$here${PYTHONPATH:+:$PYTHONPATH}"
cmd=(python3 -m pytest -q -s -p no:cacheprovider "$test")
gdb_cmd=()
if command -v gdb >/dev/null; then
  gdb_cmd=(gdb -q -batch -ex 'handle SIGPIPE nostop noprint' -ex 'handle SIG32 nostop noprint'
    -ex 'handle SIG33 nostop noprint' -ex run -ex 'bt 40' -ex 'info sharedlibrary'
    -ex 'thread apply all bt 16' --args)
fi
cd "$tests"
for i in $(seq 1 "$runs"); do
  log="$out/run$i.log"
  "${gdb_cmd[@]}" "${cmd[@]}" >"$log" 2>&1
  rc=$?
  # Under gdb the exit status is the debugger's: the signal shows in its log.
  if grep -q "received signal\|SIGSEGV\|SIGABRT\|Fatal Python error" "$log" || [ "$rc" -ne 0 ]; then
    echo "run $i of $runs: died or failed (rc $rc), log $log"
    sed -n "/xla-vmm crash report: signal/,/end of xla-vmm crash report/p" "$log"
    grep -n -A40 "received signal\|Fatal Python error" "$log" | grep -B2 -A25 "Current thread" | head -60
    exit 1
  fi
  echo "run $i of $runs: passed"
done
exit 0
