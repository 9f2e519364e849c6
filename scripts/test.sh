#!/usr/bin/env bash
# The whole test suite, on both stores (SQLite, then PostgreSQL): makes
# sure a Docker engine answers and both run
# images exist (the busybox image and a real Debian, see build-image.sh),
# builds the kernel (which builds and embeds the static shim), then runs
# every unit, end-to-end and drill test against the real engine, the
# lifecycle tests and drills once per image.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

scripts/docker-up.sh
scripts/build-image.sh
scripts/build-image.sh --debian
# the cluster drills' node image (Debian's docker.io and postgresql)
scripts/build-image.sh --node
# the no-shell image test compiles one static C program
if ! command -v gcc >/dev/null || [ ! -e /usr/lib/x86_64-linux-gnu/libc.a ]; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null
fi
# the exit code's fsync is seen with strace (Debian's package)
if ! command -v strace >/dev/null; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace >/dev/null
fi
# the egress tests make their outside server's certificates with openssl
# and the kernel's egress proxy keeps its network with iptables rules
if ! command -v openssl >/dev/null || ! command -v iptables >/dev/null; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl iptables >/dev/null
fi
# the panel is tested in a real headless Chromium (Debian's package)
if ! command -v chromium >/dev/null; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
# the metrics are scraped by a real Prometheus and linted by its promtool
# (Debian's package, without the exporters it recommends)
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
# the MCP tests use the official Python client (PyPI `mcp`), the panel's a
# small DevTools client on `websocket-client`, the API document's test
# `openapi-spec-validator` and the `schemathesis` fuzzer, and pytest for
# the Python client's tests (clients/python), all from a
# throwaway virtualenv under target/ (made once, kept while its pins hold)
mcp_pin="mcp==2.3.0 websocket-client==1.8.0 schemathesis==4.32.5 openapi-spec-validator==0.9.0 httpx==0.28.1 pytest==9.2.0"
venv="$root/target/mcp-venv"
if [ "$(cat "$venv/.pin" 2>/dev/null)" != "$mcp_pin" ]; then
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  # shellcheck disable=SC2086 # the pins are separate words
  "$venv/bin/pip" install -q --disable-pip-version-check $mcp_pin
  echo "$mcp_pin" > "$venv/.pin"
fi
export OPKERNEL_MCP_PYTHON="$venv/bin/python"
cargo build --workspace --bins
export OPKERNEL_BIN="$root/target/debug/opkernel"
# a test kernel killed while Docker was still creating a container can leave
# that container behind, created after the test removed its own: at the end,
# remove the run containers whose scratch dir was a test home that is gone
leftovers() {
  local tmp=${TMPDIR:-/tmp} id src
  for id in $(docker ps -aq --filter label=opkernel.managed=true); do
    src=$(docker inspect -f '{{range .Mounts}}{{if eq .Destination "/scratch"}}{{.Source}}{{end}}{{end}}' "$id" 2>/dev/null || true)
    case $src in
      "$tmp"/opkernel-*) [ -d "$src" ] || docker rm -f "$id" >/dev/null ;;
    esac
  done
}
trap 'leftovers; scripts/cluster.sh down; scripts/pg.sh stop' EXIT
# the PostgreSQL store's tests run against a throwaway server (stopped at
# the end, even on failure)
OPKERNEL_TEST_PG=$(scripts/pg.sh start)
export OPKERNEL_TEST_PG
# gVisor registered with the engine (SPEC §30): a run's envelope may ask
# for it in any pass (runc stays the default runtime)
scripts/docker-up.sh --runsc
cargo test --workspace -- --test-threads "${OPKERNEL_TEST_THREADS:-4}"
# again on PostgreSQL (a fresh database per store and per kernel): the
# control plane's own tests, and every end-to-end test and drill on the
# default image (store-outage crashes a server of its own: it ran above;
# the panel's browser test and the API document's fuzz exercise the HTTP
# surfaces, the same on either store, and ran above; the cluster drills
# always run on PostgreSQL, a container of their own, and ran above)
OPKERNEL_TEST_STORE=postgres cargo test -p opkernel --lib store:: -- --test-threads "${OPKERNEL_TEST_THREADS:-4}"
OPKERNEL_TEST_STORE=postgres cargo test -p opkernel-tests -- --test-threads "${OPKERNEL_TEST_THREADS:-4}" --skip debian_image --skip store_outage --skip the_panel_in_a_real_browser --skip the_document_is_valid --skip the_cluster_drills
# gVisor (SPEC §30): the op lifecycle's tests, the files API's and every
# drill once more with every run under it (the default image, two at a
# time; the Debian image's variants ran above on runc and pass on runsc by
# hand)
OPKERNEL_RUNTIME=runsc cargo test -p opkernel-tests --test background_ops --test process_trees --test launcher --test interactive --test interactive_cli --test workspaces --test files_views --test drills -- --test-threads 2 --skip debian_image
