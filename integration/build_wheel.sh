#!/usr/bin/env bash
# The main job: build everything a user runs and package it in one wheel.
#   bash integration/build_wheel.sh [--install] [OUT_DIR]     (default OUT_DIR: integration/dist)
# Builds (release) the PJRT plugin (libxla_vmm_plugin.so) and the `xla-vmm` CLI, bundles both in the
# Python package jax_plugins.xla_vmm, and writes integration/dist/jax_xla_vmm-*.whl. Both carry the CUDA
# and, where HIP's headers are ($HIP_PATH, else /usr: Debian's libamdhip64-dev), the HIP backend: the
# HIP runtime and hipBLASLt are loaded at run time, so the one wheel needs no ROCm library to load and
# runs on ROCm where they are (the package picks the HIP backend when a ROCm vendor plugin is installed).
# Without the headers it is CUDA-only, and says so. The wheel's
# console script `xla-vmm` runs the bundled CLI. --install then installs the wheel into this python
# (`--no-deps`: running JAX programs needs Python 3.12+ and jax[cuda13] 0.11.2 besides; `xla-vmm` and
# the package import do not, so on an older python, Debian 12's 3.11, the wheel is installed for its
# CLI with --ignore-requires-python and a note says what JAX needs). Takes ~3 minutes from a clean checkout on 2
# cores; prints the wheel's path.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
install=0
if [ "${1:-}" = --install ]; then install=1; shift; fi
OUT="${1:-$ROOT/integration/dist}"
features=()
hip_root="${HIP_PATH:-/usr}"
if [ -f "$hip_root/include/hip/hip_runtime_api.h" ]; then
  export HIP_PATH="$hip_root"
  features=(--features xla-vmm-plugin/hip,xla-vmm-cli/hip)
else
  echo "build_wheel: no HIP headers under $hip_root (set HIP_PATH, or install libamdhip64-dev): CUDA-only wheel" >&2
fi
cargo build --release -p xla-vmm-plugin -p xla-vmm-cli "${features[@]}" --manifest-path "$ROOT/Cargo.toml"
# Loading either must not need a ROCm or CUDA library (both are opened at run time).
for f in "$ROOT/target/release/libxla_vmm_plugin.so" "$ROOT/target/release/xla-vmm"; do
  if command -v readelf >/dev/null && readelf -d "$f" | grep -E 'NEEDED.*(amdhip|hipblas|hiprtc|libcuda|cublas|nccl|rccl)'; then
    echo "build_wheel: $f links a GPU library at load time" >&2
    exit 1
  fi
done
pkg="$ROOT/integration/jax_plugins/xla_vmm"
install -m 0755 "$ROOT/target/release/libxla_vmm_plugin.so" "$pkg/xla_vmm_plugin.so"
install -D -m 0755 "$ROOT/target/release/xla-vmm" "$pkg/bin/xla-vmm"
strip "$pkg/xla_vmm_plugin.so" "$pkg/bin/xla-vmm" 2>/dev/null || true
rm -f "$OUT"/jax_xla_vmm-*.whl
# Without build isolation when setuptools + wheel are installed (offline machines). The wheel is
# py3-none-<platform>, the same whichever python builds it: --ignore-requires-python lets an older one
# (Debian 12's 3.11) build it; the wheel's requires-python (>=3.12, jax 0.11.2's) is checked where it
# is installed.
if python3 -c 'import setuptools, wheel' 2>/dev/null; then
  python3 -m pip wheel -q --no-deps --ignore-requires-python --no-build-isolation -w "$OUT" "$ROOT/integration"
else
  python3 -m pip wheel -q --no-deps --ignore-requires-python -w "$OUT" "$ROOT/integration"
fi
rm -rf "$ROOT/integration/build" "$ROOT"/integration/*.egg-info
whl=$(ls "$OUT"/jax_xla_vmm-*.whl)
echo "wheel: $whl"
if [ $install = 1 ]; then
  pipflags=(--no-deps --force-reinstall)
  if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
    echo "build_wheel: $(command -v python3) is Python $(python3 -c 'import platform; print(platform.python_version())'):" \
         "installing the wheel for its xla-vmm CLI only. Running JAX programs on it needs Python 3.12+" \
         "with jax 0.11.2 (python3.12 -m venv .venv && . .venv/bin/activate && pip install \"$whl[cuda13]\")." >&2
    pipflags+=(--ignore-requires-python)
  fi
  python3 -m pip install -q "${pipflags[@]}" "$whl" || {
    echo "pip could not install into $(command -v python3) (an externally managed python? use a venv:" \
         "python3 -m venv .venv && . .venv/bin/activate, then this command again)" >&2
    exit 1
  }
  echo "installed: $(command -v xla-vmm || echo 'xla-vmm (not on PATH: add pip'"'"'s scripts folder)')"
fi
