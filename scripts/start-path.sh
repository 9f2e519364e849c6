#!/usr/bin/env bash
# Where a background op's start goes, stage by stage: runs the latency
# bench (release build) under a system-wide `perf trace` of fsync, rename,
# execve and writev, and prints each stage's p50 and p90 (see
# scripts/start-path.py): the admission's commit, the exec claim's, the
# request's filing, the launcher's claim, the shim's start, its pid file,
# the command's exec; and of these, the kernel's syncs' own time and the
# command's PATH search. The trace slows each traced call: the stages add up
# to more than the bench's untraced "running" figure, their shares hold.
# Usage: scripts/start-path.sh [SAMPLES]   (needs perf: apt-get install linux-perf)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
samples=${1:-60}
command -v perf >/dev/null || {
  echo "start-path: needs perf (apt-get install -y linux-perf)" >&2
  exit 2
}
perf trace -a -e fsync -- true >/dev/null 2>&1 || {
  echo "start-path: perf cannot trace the whole system here (needs root or CAP_PERFMON, and tracefs)" >&2
  exit 2
}
# the release build: the stages of the figures the README gives
unset OPKERNEL_BENCH_BUILD
# builds what the bench needs (engine, image, release binaries) and warms up
scripts/bench.sh --latency-only 3 >/dev/null
trace=$(mktemp -d)
trap 'rm -rf "$trace"' EXIT
export OPKERNEL_BIN="$root/target/release/opkernel"
perf trace -a -o "$trace/trace.txt" -e fsync,rename,execve,writev -- \
  target/release/opkernel-bench --latency-only "$samples" >"$trace/bench.txt" 2>&1 || true
# perf does not pass on the bench's exit status: its last line tells
if ! grep -q '^ratio running/api' "$trace/bench.txt"; then
  cat "$trace/bench.txt" >&2
  echo "start-path: the latency bench failed" >&2
  exit 1
fi
tail -n 4 "$trace/bench.txt"
python3 scripts/start-path.py "$trace/trace.txt"
