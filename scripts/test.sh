#!/usr/bin/env bash
# The whole test suite: makes sure a Docker engine answers and both run
# images exist (the busybox image and a real Debian, see build-image.sh),
# builds the kernel (which builds and embeds the static shim), then runs
# every unit, end-to-end and drill test against the real engine, the
# lifecycle tests and drills once per image.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

scripts/docker-up.sh
scripts/build-image.sh
scripts/build-image.sh --debian
# the no-shell image test compiles one static C program
if ! command -v gcc >/dev/null || [ ! -e /usr/lib/x86_64-linux-gnu/libc.a ]; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null
fi
cargo build --workspace --bins
export OPKERNEL_BIN="$root/target/debug/opkernel"
cargo test --workspace -- --test-threads "${OPKERNEL_TEST_THREADS:-4}"
