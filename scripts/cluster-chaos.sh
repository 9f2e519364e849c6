#!/usr/bin/env bash
# Drill `cluster-chaos` (SPEC §24) for as long as an operator wants: the
# cluster drills on a fresh `scripts/cluster.sh up 3` harness (webhooks to
# the drill's own receiver, an approval rule, the warm pool, short
# retentions), then random faults over a steady workload for SECONDS
# (default 600), and every invariant checked at the end; the figures (ops,
# faults by kind, lost, duplicated webhook posts) are printed.
#   scripts/cluster-chaos.sh [SECONDS] [SEED]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export OPKERNEL_CHAOS_SECONDS=${1:-600}
[ -z "${2:-}" ] || export OPKERNEL_CHAOS_SEED=$2
cargo build --workspace --bins --quiet
export OPKERNEL_BIN="$root/target/debug/opkernel"
exec cargo test -p opkernel-tests --test cluster_drills -- --nocapture
