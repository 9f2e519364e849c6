#!/usr/bin/env bash
# Runs every property-based fuzz target ("fuzz_*" tests of the request,
# .pid/.code/probe/signaller/proc/run-as and tail/report parsers) with many
# generated cases, each bounded in time. Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] (default 60).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
export PROPTEST_CASES=${PROPTEST_CASES:-1000000}
status=0
for pkg in opkernel-shim sandbox opkernel; do
  cargo test --release -q -p "$pkg" --lib --no-run
  targets=$(cargo test --release -q -p "$pkg" --lib fuzz_ -- --list 2>/dev/null | sed -n 's/^\(fuzz_tests::fuzz_[a-z_]*\): test$/\1/p')
  for t in $targets; do
    start=$(date +%s%N)
    out=$(timeout -s INT "$seconds" cargo test --release -q -p "$pkg" --lib "$t" -- --exact 2>&1) && rc=0 || rc=$?
    secs=$(( ($(date +%s%N) - start) / 1000000 ))
    case $rc in
      0) verdict="ok: all $PROPTEST_CASES cases" ;;
      124|130) verdict="ok: no failure within the ${seconds}s bound" ;;
      *) verdict="FAILED"; status=1; echo "$out" | tail -30 ;;
    esac
    printf '%-10s %-42s %7.1fs  %s\n' "$pkg" "$t" "$(echo "$secs/1000" | bc -l)" "$verdict"
  done
done
exit $status
