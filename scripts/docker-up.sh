#!/usr/bin/env bash
# Makes sure a Docker engine answers. Returns at once when one does; otherwise,
# as root on Debian, installs docker.io if missing, starts dockerd and waits.
#
# --runsc also makes gVisor's `runsc` a runtime of that engine (SPEC §30):
# installs Debian's runsc when absent, adds it to /etc/docker/daemon.json's
# "runtimes" (ptrace platform, gVisor's network off, no overlay of its own
# over the root file system, which the files API reads on the host) and has
# dockerd read the file again with SIGHUP: no engine restart, containers keep
# running. Running it again changes nothing.
set -euo pipefail

runsc=0
for arg in "$@"; do
  case "$arg" in
    --runsc) runsc=1 ;;
    *) echo "docker-up: unknown argument $arg (only --runsc)" >&2; exit 2 ;;
  esac
done

answers() { docker info >/dev/null 2>&1; }

# until CHECK TRIES PAUSE OK FAIL: runs CHECK until it succeeds (says OK),
# at most TRIES times PAUSE seconds apart (then says FAIL and exits 1)
until_ok() {
  local check=$1 tries=$2 pause=$3 ok=$4 fail=$5
  for _ in $(seq 1 "$tries"); do
    if "$check"; then echo "docker-up: $ok"; return 0; fi
    sleep "$pause"
  done
  echo "docker-up: $fail" >&2
  exit 1
}

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
  until_ok answers 60 0.5 "dockerd started" "dockerd did not answer within 30s; see $log"
}

registered() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }

register_runsc() {
  local conf=/etc/docker/daemon.json path
  # registered with today's arguments: nothing to do
  if registered && grep -q -- '"--overlay2=none"' "$conf" 2>/dev/null; then return 0; fi
  if ! command -v runsc >/dev/null 2>&1; then
    need_root "runsc is not installed; install Debian's runsc"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >/dev/null
  fi
  need_root "registering runsc with dockerd edits /etc/docker/daemon.json"
  path=$(command -v runsc)
  mkdir -p /etc/docker
  [ -s "$conf" ] || echo '{}' >"$conf"
  python3 - "$conf" "$path" <<'PY'
import json, os, sys
conf, path = sys.argv[1], sys.argv[2]
with open(conf) as f:
    doc = json.load(f)
doc.setdefault("runtimes", {})["runsc"] = {
    "path": path,
    "runtimeArgs": ["--platform=ptrace", "--network=none", "--overlay2=none"],
}
tmp = conf + ".opkernel.tmp"
with open(tmp, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
os.replace(tmp, conf)
PY
  pkill -HUP -x dockerd
  until_ok registered 40 0.25 "runsc registered" "dockerd did not pick up runsc from $conf"
}

answers || start_engine
if [ "$runsc" = 1 ]; then register_runsc; fi
