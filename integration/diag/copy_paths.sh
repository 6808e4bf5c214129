#!/usr/bin/env bash
# Run the copy-path diagnostic (copy_paths.cu) on the GPU machine, on the runtime's own copy kernel:
#     bash integration/diag/copy_paths.sh [STAGE_DIR] [OUT_DIR]
# Uses STAGE_DIR/diag/copy_paths when staged (integration/stage_gpu.sh builds it where nvcc is), else builds
# it here with nvcc. Prints a Markdown table (and writes OUT_DIR/copy_paths.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
S=${1:-.dev/gpu}
OUTD=${2:-/tmp/xla-vmm-diag}
mkdir -p "$OUTD"
ptx=$OUTD/copy_kernel.ptx
# The PTX between `COPY_KERNEL_PTX: &str = r#"` and `"#;` in the runtime's source.
python3 - crates/runtime/src/copykernel.rs "$ptx" <<'PY'
import re, sys
src = open(sys.argv[1]).read()
m = re.search(r'COPY_KERNEL_PTX: &str = r#"(.*?)"#;', src, re.S)
if not m:
    sys.exit("no COPY_KERNEL_PTX in " + sys.argv[1])
open(sys.argv[2], "w").write(m.group(1))
PY
bin=$S/diag/copy_paths
if [ ! -x "$bin" ]; then
  bin=$OUTD/copy_paths
  nvcc -O2 -arch=sm_90 -o "$bin" integration/diag/copy_paths.cu -lcuda
fi
"$bin" "$ptx" | tee "$OUTD/copy_paths.md"
