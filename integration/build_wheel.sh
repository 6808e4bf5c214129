#!/usr/bin/env bash
# Build the plugin library (release) and a wheel that bundles it:
#   integration/build_wheel.sh [OUT_DIR]   (default: integration/dist)
# Then: pip install OUT_DIR/jax_xla_vmm-*.whl && JAX_PLATFORMS=vmm python script.py
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/integration/dist}"
cargo build --release -p xla-vmm-plugin --manifest-path "$ROOT/Cargo.toml"
install -m 0755 "$ROOT/target/release/libxla_vmm_plugin.so" \
  "$ROOT/integration/jax_plugins/xla_vmm/xla_vmm_plugin.so"
# Without build isolation when setuptools + wheel are installed (offline machines).
if python3 -c 'import setuptools, wheel' 2>/dev/null; then
  python3 -m pip wheel --no-deps --no-build-isolation -w "$OUT" "$ROOT/integration"
else
  python3 -m pip wheel --no-deps -w "$OUT" "$ROOT/integration"
fi
rm -rf "$ROOT/integration/build" "$ROOT"/integration/*.egg-info
echo "wheel in $OUT"
