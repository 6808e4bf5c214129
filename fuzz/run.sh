#!/usr/bin/env bash
# Fuzz the decoder, one command: installs what it needs (the nightly toolchain, cargo-fuzz), seeds the
# corpus from the repository's fixtures, then runs each target for a while.
#     bash fuzz/run.sh [SECONDS_PER_TARGET]      (default 60)
# Targets: `decode` (whole serialized executables, as PJRT_Executable_Serialize returns them) and
# `decode_message` (the reassembled GpuExecutableProto messages, past riegeli's checksums). A crash is
# saved under fuzz/artifacts/<target>/ and the script exits non-zero.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-60}
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
[ -d corpus/decode ] || cargo run -q --bin seed
for t in decode decode_message; do
  echo "== fuzz $t for ${secs}s"
  cargo +nightly fuzz run "$t" -- -max_total_time="$secs"
done
