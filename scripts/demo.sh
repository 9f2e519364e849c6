#!/usr/bin/env bash
# Starts opkernel on a fresh home and shows it working: a foreground command,
# background operations, a report, a note, a kill and finishing the run;
# then, when the Debian image exists (scripts/build-image.sh --debian), a
# Python command in it. Starts Docker and builds the sandbox image if needed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

scripts/docker-up.sh
scripts/build-image.sh
cargo build --quiet -p opkernel
bin="$root/target/debug/opkernel"

export OPKERNEL_HOME=${OPKERNEL_HOME:-$(mktemp -d /tmp/opkernel-demo.XXXXXX)}
port=${OPKERNEL_DEMO_PORT:-7878}
export OPKERNEL_URL="http://127.0.0.1:$port"
"$bin" serve --listen "127.0.0.1:$port" >"$OPKERNEL_HOME/kernel.log" 2>&1 &
kernel=$!
debian_kernel=
# a graceful stop (SIGTERM) removes the kernels' idle warm-pool containers:
# the demo returns only once its kernels have exited, leaving nothing running
stop_kernels() {
  local pid
  for pid in $kernel $debian_kernel; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in $kernel $debian_kernel; do wait "$pid" 2>/dev/null || true; done
  echo
  echo "kernel stopped; its home (control plane, scratch, logs) is $OPKERNEL_HOME"
}
trap stop_kernels EXIT
for _ in $(seq 1 100); do "$bin" ps >/dev/null 2>&1 && break; sleep 0.1; done

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
run=demo-$$
step opkernel run --run $run -- bash -c 'uname -a; id; echo hello from the sandbox'
"$bin" run --run $run -- bash -c 'uname -a; id; echo hello from the sandbox'
step opkernel run --run $run --background -- sh -c 'sleep 2; echo built; exit 0'
"$bin" run --run $run --background -- sh -c 'sleep 2; echo built; exit 0'
step opkernel run --run $run --background --timeout 60 -- sleep 600
long=$("$bin" run --run $run --background --timeout 60 --json -- sleep 600 | sed -n 's/.*"operation_id": "\([^"]*\)".*/\1/p')
echo "$long"
step opkernel ps --run $run
"$bin" ps --run $run
step opkernel report --run $run --wait 30
"$bin" report --run $run --wait 30
step opkernel note --run $run "please wrap up"
"$bin" note --run $run "please wrap up"
step opkernel kill "$long"
"$bin" kill "$long"
step opkernel finish --run $run
"$bin" finish --run $run
step opkernel reap
"$bin" reap

debian=opkernel-sandbox:debian
if docker image inspect "$debian" >/dev/null 2>&1; then
  # a second kernel on its own home, its run containers made from the Debian image
  debian_home=$OPKERNEL_HOME/debian
  mkdir -p "$debian_home"
  # on a port of its own choosing (the next port may be a client's
  # ephemeral one), read back from its log
  OPKERNEL_HOME=$debian_home OPKERNEL_IMAGE=$debian "$bin" serve --listen 127.0.0.1:0 \
    >"$debian_home/kernel.log" 2>&1 &
  debian_kernel=$!
  debian_url=
  for _ in $(seq 1 300); do
    debian_url=$(sed -n 's/^opkernel listening on \(http:[^ ]*\).*/\1/p' "$debian_home/kernel.log" | head -n 1)
    [ -n "$debian_url" ] && break
    kill -0 "$debian_kernel" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$debian_url" ]; then
    echo "the Debian kernel did not start:" >&2
    tail -n 5 "$debian_home/kernel.log" >&2
    exit 1
  fi
  export OPKERNEL_URL=$debian_url
  dk() { OPKERNEL_HOME=$debian_home "$bin" "$@"; }
  py='import os, sys; print("python", sys.version.split()[0], "as uid", os.getuid(), "home", os.environ["HOME"])'
  step "OPKERNEL_IMAGE=$debian opkernel run --run py-$$ -- python3 -c '$py'"
  dk run --run py-$$ -- python3 -c "$py"
  dk finish --run py-$$ >/dev/null
  dk reap >/dev/null
else
  echo
  echo "(scripts/build-image.sh --debian builds a Debian image with python3 and git; the demo then runs Python in it)"
fi
