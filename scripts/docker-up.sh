#!/usr/bin/env bash
# Makes sure a Docker engine answers. Returns at once when one does; otherwise,
# as root on Debian, installs docker.io if missing, starts dockerd and waits.
set -euo pipefail

answers() { docker info >/dev/null 2>&1; }

if answers; then exit 0; fi

if ! command -v dockerd >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "docker-up: no Docker engine answers and dockerd is not installed; install docker.io (needs root and apt-get)" >&2
    exit 1
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "docker-up: no Docker engine answers and starting dockerd needs root" >&2
  exit 1
fi

log=/var/log/opkernel-dockerd.log
nohup dockerd >"$log" 2>&1 &
for _ in $(seq 1 60); do
  if answers; then echo "docker-up: dockerd started"; exit 0; fi
  sleep 0.5
done
echo "docker-up: dockerd did not answer within 30s; see $log" >&2
exit 1
