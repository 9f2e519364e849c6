#!/usr/bin/env bash
# What a newcomer does on a fresh machine, checked (CI runs it after the
# suite): a clone under a 0700 directory (as root's home is) starts the
# tests' PostgreSQL server, and the demo returns leaving no container of
# its own behind (its kernels stopped, their warm pools removed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

private=$(mktemp -d /tmp/opkernel-newcomer.XXXXXX)
chmod 700 "$private"
trap 'rm -rf "$private"' EXIT
git clone -q "$root" "$private/opkernel"
"$private/opkernel/scripts/pg.sh" start >/dev/null
"$private/opkernel/scripts/pg.sh" remove
echo "newcomer: the test server starts from a clone under a 0700 directory"

home=$(mktemp -d /tmp/opkernel-demo.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
OPKERNEL_HOME=$home OPKERNEL_DEMO_PORT=$port scripts/demo.sh >"$private/demo.out" 2>&1 || {
  cat "$private/demo.out" >&2
  exit 1
}
left=0
for id in $(docker ps -aq --filter label=opkernel.managed=true); do
  src=$(docker inspect -f '{{range .Mounts}}{{if eq .Destination "/scratch"}}{{.Source}}{{end}}{{end}}' "$id" 2>/dev/null || true)
  case $src in
    "$home"/*) echo "newcomer: the demo left container $id behind ($src)" >&2; left=1 ;;
  esac
done
[ "$left" = 0 ] || exit 1
if pgrep -f "opkernel serve --listen 127.0.0.1:$port" >/dev/null; then
  echo "newcomer: the demo left its kernel running" >&2
  exit 1
fi
rm -rf "$home"
echo "newcomer: the demo left nothing running"
