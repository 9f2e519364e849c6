#!/usr/bin/env bash
# Makes sure a Docker engine answers. Returns at once when one does; otherwise,
# as root on Debian, installs docker.io if missing, starts dockerd and waits.
#
# --runsc also makes gVisor's `runsc` a runtime of that engine (SPEC §30):
# installs Debian's runsc when absent, adds it to /etc/docker/daemon.json's
# "runtimes" (ptrace platform, gVisor's network off) and has dockerd read the
# file again with SIGHUP: no engine restart, containers keep running. Running
# it again changes nothing.
set -euo pipefail

runsc=0
for arg in "$@"; do
  case "$arg" in
    --runsc) runsc=1 ;;
    *) echo "docker-up: unknown argument $arg (only --runsc)" >&2; exit 2 ;;
  esac
done

answers() { docker info >/dev/null 2>&1; }

need_root() {
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "docker-up: $1 (needs root and apt-get)" >&2
    exit 1
  fi
}

start_engine() {
  if ! command -v dockerd >/dev/null 2>&1; then
    need_root "no Docker engine answers and dockerd is not installed; install docker.io"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "docker-up: no Docker engine answers and starting dockerd needs root" >&2
    exit 1
  fi
  local log=/var/log/opkernel-dockerd.log
  nohup dockerd >"$log" 2>&1 &
  for _ in $(seq 1 60); do
    if answers; then echo "docker-up: dockerd started"; return 0; fi
    sleep 0.5
  done
  echo "docker-up: dockerd did not answer within 30s; see $log" >&2
  exit 1
}

registered() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }

register_runsc() {
  if registered; then return 0; fi
  if ! command -v runsc >/dev/null 2>&1; then
    need_root "runsc is not installed; install Debian's runsc"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >/dev/null
  fi
  need_root "registering runsc with dockerd edits /etc/docker/daemon.json"
  local conf=/etc/docker/daemon.json path
  path=$(command -v runsc)
  mkdir -p /etc/docker
  [ -s "$conf" ] || echo '{}' >"$conf"
  python3 - "$conf" "$path" <<'PY'
import json, sys
conf, path = sys.argv[1], sys.argv[2]
with open(conf) as f:
    doc = json.load(f)
doc.setdefault("runtimes", {})["runsc"] = {
    "path": path,
    "runtimeArgs": ["--platform=ptrace", "--network=none"],
}
tmp = conf + ".opkernel.tmp"
with open(tmp, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
import os
os.replace(tmp, conf)
PY
  pkill -HUP -x dockerd
  for _ in $(seq 1 40); do
    if registered; then echo "docker-up: runsc registered"; return 0; fi
    sleep 0.25
  done
  echo "docker-up: dockerd did not pick up runsc from $conf" >&2
  exit 1
}

answers || start_engine
if [ "$runsc" = 1 ]; then register_runsc; fi
