#!/usr/bin/env bash
# Build everything the GPU check needs (here, where cargo is) and stage it in
# .dev/gpu/ for the device machine: release binaries, GPU test binaries and the
# fixtures. Then, on the GPU machine, from the repo root:
#     bash integration/gpu_check.sh .dev/gpu
# With the device tool: run(command="bash integration/gpu_check.sh .dev/gpu", carry=[".dev/gpu"]).
set -euo pipefail
cd "$(dirname "$0")/.."
stage=.dev/gpu
rm -rf "$stage"; mkdir -p "$stage/bin" "$stage/fixtures"
cargo build --release -p xla-vmm-cli -p xla-vmm-plugin
cp target/release/xla-vmm "$stage/bin/"
mkdir -p "$stage/lib"
cp target/release/libxla_vmm_plugin.so "$stage/lib/"
# Test binaries whose #[ignore] tests need a GPU.
for pkg in xla-vmm-device xla-vmm-runtime; do
  cargo test --release -p "$pkg" --no-run --message-format=json 2>/dev/null \
    | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] != ["bin"]:
        print(m["target"]["name"], m["executable"])' \
    | while read -r name exe; do
        # Host-only checks (the HIP kernels' clang compile) need no GPU: not carried.
        [ "$name" = hip_kernel_source ] && continue
        cp "$exe" "$stage/bin/test-$pkg-$name"
      done
done
strip "$stage"/bin/* "$stage"/lib/* 2>/dev/null || true
fx=../shared/fixtures
for f in small loop mlp_adam_donated llama_scan_bf16; do cp "$fx/$f.pjrt" "$fx/$f.npz" "$stage/fixtures/"; done
cp "$fx/llama_sgd_f32.pjrt" "$stage/fixtures/"
du -sh "$stage"; ls -la "$stage/bin"
