#!/usr/bin/env bash
# Run the copy-path diagnostic (copy_paths.cu) on the GPU machine:
#     bash integration/diag/copy_paths.sh [STAGE_DIR] [OUT_DIR]
# Uses STAGE_DIR/diag/copy_paths when staged (integration/stage_gpu.sh --perf builds it where nvcc is),
# else builds it here with nvcc. Prints a Markdown table (and writes OUT_DIR/copy_paths.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
S=${1:-.dev/gpu}
OUTD=${2:-/tmp/xla-vmm-diag}
mkdir -p "$OUTD"
bin=$S/diag/copy_paths
if [ ! -x "$bin" ]; then
  bin=$OUTD/copy_paths
  nvcc -O2 -arch=sm_90 -o "$bin" integration/diag/copy_paths.cu -lcuda
fi
"$bin" | tee "$OUTD/copy_paths.md"
