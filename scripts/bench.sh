#!/usr/bin/env bash
# One-run benchmark of opkernel against raw Docker (release build):
# start/running latency vs bare API exec and `docker exec -d`, exit-to-report
# delay, 1,000 concurrent ops (CPU, RSS, exactly-once), and recovery of 500
# running ops over 50 containers after SIGKILL, and a new run's first command
# with the warm pool on and off, an interactive op's write -> echo
# beside `docker exec -i` doing the same, and a large file up and down the
# files API beside `docker cp` (kernel memory meanwhile) and forks of a
# 200 MiB workspace, and a request and a download through the egress proxy
# beside the same made directly.
# Usage: [OPKERNEL_STORE=postgres://…] scripts/bench.sh [--quick] [--json] [--check]
# (with a PostgreSQL URL each kernel it starts gets a fresh database there;
# the JSON says "store": "sqlite" or "postgres")
#        scripts/bench.sh --recovery-only OPS CONTAINERS
#        scripts/bench.sh --cpu-only [OPS] [RUNS]: the kernel CPU (and PostgreSQL commits) per op
#        scripts/bench.sh --interactive-only [SAMPLES]: write_stdin -> echo vs docker exec -i
#        scripts/bench.sh --runtimes [SAMPLES]: runc beside gVisor (runsc): running,
#        first output, stdin echo, a pooled first command, an idle container's CPU
#        scripts/bench.sh --files-only [--quick]: 1 GiB (256 MiB) up and down vs docker cp; forks
#        scripts/bench.sh --egress-only [--quick]: a request through the egress
#        proxy vs directly on an open network, and 256 MiB (64) downloaded both
#        ways (needs the Debian image and openssl)
#        scripts/bench.sh --cluster [--quick] [--json]: the cluster's figures on
#        scripts/cluster.sh nodes (start on the run's node vs through another,
#        throughput of 3,000 ops over 30 runs on 1 node vs 3, docker kill to
#        dead over 10 trials, ops lost on a kill, PostgreSQL commits per op)
# --check: exit non-zero when a correctness figure is off (an op lost or
# duplicated, an op started by docker exec in the launcher path, kernel
# peak RSS over 150 MB, a measuring client that failed, a file that came
# back changed or grew the kernel's memory past 64 MB); timings are
# reported, never asserted (the machine is noisy).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [ "${1:-}" = --runtimes ]; then scripts/docker-up.sh --runsc; else scripts/docker-up.sh; fi
scripts/build-image.sh >&2
# OPKERNEL_BENCH_BUILD=debug measures the debug build instead (as .ci/run
# does, whose test run built it already: the correctness figures hold for
# any build; its timings are not the release figures and say so)
profile=release
if [ "${OPKERNEL_BENCH_BUILD:-release}" = debug ]; then
  profile=debug
  cargo build --quiet -p opkernel -p opkernel-tests --bins
  echo "bench: the debug build (correctness figures; timings are not the release build's)" >&2
else
  cargo build --release --quiet -p opkernel -p opkernel-tests --bins
fi
export OPKERNEL_BIN="$root/target/$profile/opkernel"
exec "$root/target/$profile/opkernel-bench" "$@"
