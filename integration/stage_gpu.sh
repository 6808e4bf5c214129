#!/usr/bin/env bash
# Build everything the GPU check needs (here, where cargo is) and stage it for the device machine.
#     bash integration/stage_gpu.sh          -> .dev/gpu: release binaries, GPU test binaries, fixtures, the
#                                               HIP test shim (lib/hipshim) and the HIP conformance binary
#     bash integration/stage_gpu.sh --perf --alt REF  -> the same as --perf, plus .dev/perf/alt: the CLI and
#                                               plugin of git REF (a branch to measure against this tree's
#                                               build in the same device call: gpu_check.sh with
#                                               GPU_CHECK_ALT=1), ~11 MB
#     bash integration/stage_gpu.sh --perf   -> .dev/perf: what the `perf` section needs (the CLI, the
#                                               plugin and its wheel, the copy-path diagnostic, MaxText
#                                               from .dev/mt when prepared) and the fixtures that
#                                               `stock runtime plugin` compare with, no test binaries: ~50 MB
#                                               (STAGE_HIP=1: also what section `hip-shim` needs, +9 MB)
# Then, on the GPU machine, from the repo root:
#     bash integration/gpu_check.sh .dev/gpu            (or .dev/perf perf)
# With the device tool: run(command="bash integration/gpu_check.sh .dev/gpu", carry=[".dev/gpu"]).
set -euo pipefail
cd "$(dirname "$0")/.."
perf=0
[ "${1:-}" = --perf ] && perf=1
alt=
if [ "${2:-}" = --alt ]; then
  [ $perf = 1 ] && [ -n "${3:-}" ] || { echo "usage: stage_gpu.sh --perf --alt GIT_REF" >&2; exit 2; }
  alt=$(git rev-parse --verify "$3^{commit}") || { echo "--alt $3: not a commit" >&2; exit 2; }
fi
stage=.dev/gpu
[ $perf = 1 ] && stage=.dev/perf
rm -rf "$stage"; mkdir -p "$stage/bin" "$stage/lib" "$stage/fixtures"
# The repository's fixtures (integration/fixtures; llama_scan_bf16.npz only where it was regenerated:
# gpu_check uses the stock reference of its `stock` section instead).
stage_fixtures() {
  local fx=integration/fixtures f
  for f in small loop mlp_adam_donated llama_scan_bf16 llama_sgd_f32 fft_kinds; do
    cp "$fx/$f.pjrt" "$stage/fixtures/"
    [ -f "$fx/$f.npz" ] && cp "$fx/$f.npz" "$stage/fixtures/"
  done
  return 0
}
# The HIP backend on the NVIDIA GPU through the test shim (integration/hipshim: the HIP runtime on the
# CUDA driver, hiprtc on NVRTC; gpu_check section `hip-shim`): the shim, the device crate's HIP
# conformance test binary (named outside test-xla-vmm-device-* so that section `device` leaves it alone).
# The CLI and the plugin carry the HIP backend already (built as the wheel is). Always in .dev/gpu; in
# .dev/perf with STAGE_HIP=1 (+3 MB).
stage_hip() {
  export HIP_PATH="${HIP_PATH:-/usr}"
  cargo build --release -p xla-vmm-hipshim
  mkdir -p "$stage/lib/hipshim"
  cp target/release/libamdhip64.so "$stage/lib/hipshim/"
  cargo test --release -p xla-vmm-device --no-default-features --features hip --no-run --message-format=json 2>/dev/null \
    | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "hip_conformance":
        print(m["executable"])' \
    | while read -r exe; do cp "$exe" "$stage/bin/hip-conformance"; done
  [ -x "$stage/bin/hip-conformance" ] || { echo "stage_gpu: no hip_conformance test binary built" >&2; exit 1; }
}
# The CLI and the plugin as the wheel has them (both backends where HIP's headers are), and the wheel.
wheel_dir="$PWD/target/stage-wheel"
[ $perf = 1 ] && wheel_dir="$PWD/$stage/wheel"
bash integration/build_wheel.sh "$wheel_dir" >/dev/null
cp target/release/xla-vmm "$stage/bin/"
cp target/release/libxla_vmm_plugin.so "$stage/lib/"
if [ $perf = 1 ]; then
  # The copy-path diagnostic, where nvcc is (else gpu_check builds it there).
  # NVCC / NVCC_FLAGS: a compiler elsewhere (e.g. pip's nvidia-cuda-nvcc, with -I/-L for its headers).
  if command -v "${NVCC:-nvcc}" >/dev/null; then
    mkdir -p "$stage/diag"
    # shellcheck disable=SC2086
    "${NVCC:-nvcc}" ${NVCC_FLAGS:-} -O2 -arch=sm_90 -o "$stage/diag/copy_paths" integration/diag/copy_paths.cu -lcuda
  fi
  # The fixtures the `runtime` section compares against.
  stage_fixtures
  if [ "${STAGE_HIP:-0}" = 1 ]; then stage_hip; fi
  # JAX's own tests for integration/jax_tests.py (JAX_SRC: a jax-ml/jax git directory, e.g. the
  # `fetch github:jax-ml/jax` mirror; the commit of the installed jax's release).
  if [ -n "${JAX_SRC:-}" ]; then
    mkdir -p "$stage/jaxtests"
    git --git-dir="$JAX_SRC" archive "${JAX_COMMIT:-HEAD}" tests | tar -x -C "$stage/jaxtests" --strip-components=1
  fi
  if [ -d .dev/mt/.mt ]; then
    mkdir -p "$stage/mt"
    cp -r .dev/mt/.mt .dev/mt/.wheels "$stage/mt/"
  fi
else
  # Test binaries whose #[ignore] tests need a GPU (only those: the rest run in CI, and all of them
  # would exceed the device tool's 64 MiB carry).
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
          # Host-only checks (the HIP kernels' clang compile) need no GPU: not carried. The HIP
          # conformance test is empty without the hip feature (built with it below).
          [ "$name" = hip_kernel_source ] && continue
          [ "$name" = hip_conformance ] && continue
          listed=$("$exe" --list --ignored 2>/dev/null || true)
          grep -q ': test$' <<<"$listed" || continue
          cp "$exe" "$stage/bin/test-$pkg-$name"
        done
  done
  stage_hip
  stage_fixtures
fi
# The alternative build: REF checked out in a worktree, built into its own target folder (the
# dependencies are built once there and reused by later --alt stages).
if [ -n "$alt" ]; then
  wt=target/alt-src
  git worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
  git worktree add --detach "$wt" "$alt" >/dev/null
  (cd "$wt" && CARGO_TARGET_DIR="$PWD/../alt-target" cargo build --release -p xla-vmm-cli -p xla-vmm-plugin)
  mkdir -p "$stage/alt/bin" "$stage/alt/lib"
  cp target/alt-target/release/xla-vmm "$stage/alt/bin/"
  cp target/alt-target/release/libxla_vmm_plugin.so "$stage/alt/lib/"
  git rev-parse --short "$alt" >"$stage/alt/COMMIT"
  git worktree remove --force "$wt"
  strip "$stage"/alt/bin/* "$stage"/alt/lib/* 2>/dev/null || true
fi
# What was built: the commit, "+dirty" when the tree had changes.
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!integration/results' || echo +dirty)" >"$stage/COMMIT"
strip "$stage"/bin/* "$stage"/lib/* "$stage"/lib/hipshim/* "$stage"/diag/* 2>/dev/null || true
du -sh "$stage"; ls -la "$stage/bin"
