#!/usr/bin/env bash
# The whole test suite: makes sure a Docker engine answers and the sandbox
# image exists, builds the kernel, then runs every unit, end-to-end and
# drill test against the real engine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

scripts/docker-up.sh
scripts/build-image.sh
cargo build --workspace --bins
export OPKERNEL_BIN="$root/target/debug/opkernel"
cargo test --workspace -- --test-threads "${OPKERNEL_TEST_THREADS:-4}"
