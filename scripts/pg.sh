#!/usr/bin/env bash
# A throwaway PostgreSQL for the tests and the bench (SPEC §19): Debian's
# `postgresql` package (installed when absent), `initdb` as the postgres
# user into a directory that user can reach whatever the checkout's path
# (a clone under root's 0700 home included): /var/tmp/opkernel-pg-<hash of
# the checkout's path>, or $OPKERNEL_PG_DIR; listening on a free loopback port with its own socket
# dir, with pg_stat_statements loaded (the bench counts statements per op);
# no system service. fsync is off (a test server) unless PG_FSYNC=on (the
# bench's figures are taken with it on, as SQLite's are with
# synchronous=FULL). Loopback connections are trusted (a test server that
# only this machine reaches). TLS is on (SPEC §29), with a certificate for
# `localhost` only, signed by a CA of its own (`pg.sh ca` prints its
# file): a client in verify-full must name the host `localhost`; the URL
# printed leaves sslmode at libpq's default (prefer: encrypted, unchecked).
#   scripts/pg.sh start           starts it (idempotent); prints its URL
#   scripts/pg.sh url             prints the URL of the running server
#   scripts/pg.sh ca              prints the path of its TLS CA (PEM)
#   scripts/pg.sh stop [MODE]     stops it (pg_ctl -m MODE, default fast)
#   scripts/pg.sh kill            stops it at once (-m immediate), for drills
#   scripts/pg.sh resume          starts a stopped server on its old port
#   scripts/pg.sh remove          stops it and removes its files
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# the server's files live outside the checkout: the postgres user must be
# able to enter every directory above them, which a checkout under a 0700
# home (/root) does not allow
dir=${OPKERNEL_PG_DIR:-/var/tmp/opkernel-pg-$(printf '%s' "$root" | sha256sum | cut -c1-12)}
data="$dir/data"
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)

as_pg() { runuser -u postgres -- "$@"; }

install_pg() {
  if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  fi
  if ! command -v openssl >/dev/null; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
  fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

url() {
  echo "postgres://opkernel@127.0.0.1:$(cat "$dir/port")/opkernel"
}

running() { [ -f "$data/postmaster.pid" ] && as_pg "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; }

# the server's CA and certificate (for localhost), made once
make_tls() {
  local tls="$dir/tls"
  [ -f "$tls/server.key" ] && return 0
  mkdir -p "$tls"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=opkernel test PostgreSQL CA" \
    -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
    -keyout "$tls/server.key" -out "$tls/server.csr" 2>/dev/null
  echo "subjectAltName=DNS:localhost" >"$tls/san.ext"
  openssl x509 -req -days 3650 -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" \
    -CAcreateserial -extfile "$tls/san.ext" -out "$tls/server.pem" 2>/dev/null
  chown -R postgres:postgres "$tls"
  chmod 600 "$tls/server.key" "$tls/ca.key"
  chmod 644 "$tls/ca.pem" "$tls/server.pem"
}

start_server() {
  make_tls
  as_pg "$bin/pg_ctl" -D "$data" -l "$dir/log" -w -t 30 \
    -o "-c listen_addresses=127.0.0.1 -c port=$(cat "$dir/port") -c unix_socket_directories=$dir/sock -c max_connections=200 -c fsync=${PG_FSYNC:-off} -c shared_preload_libraries=pg_stat_statements -c ssl=on -c ssl_cert_file=$dir/tls/server.pem -c ssl_key_file=$dir/tls/server.key" \
    start >/dev/null
}

case "${1:-}" in
  start)
    install_pg
    if running; then url; exit 0; fi
    if [ ! -f "$data/PG_VERSION" ]; then
      rm -rf "$dir"
      mkdir -p "$dir/sock"
      chown -R postgres:postgres "$dir"
      as_pg "$bin/initdb" -D "$data" -A trust -U postgres >/dev/null
      free_port > "$dir/port"
      start_server
      as_pg "$bin/psql" -h "$dir/sock" -p "$(cat "$dir/port")" -U postgres -qc "CREATE ROLE opkernel LOGIN SUPERUSER" >/dev/null
      as_pg "$bin/psql" -h "$dir/sock" -p "$(cat "$dir/port")" -U postgres -qc "CREATE DATABASE opkernel OWNER opkernel" >/dev/null
    else
      start_server
      # databases earlier test runs made (t_<uuid>) go at the next start
      for db in $(as_pg "$bin/psql" -h "$dir/sock" -p "$(cat "$dir/port")" -U postgres -Atc \
          "SELECT datname FROM pg_database WHERE datname LIKE 't\_%'"); do
        as_pg "$bin/psql" -h "$dir/sock" -p "$(cat "$dir/port")" -U postgres -qc "DROP DATABASE \"$db\"" >/dev/null
      done
    fi
    url
    ;;
  resume)
    start_server
    url
    ;;
  url) url ;;
  ca) echo "$dir/tls/ca.pem" ;;
  stop)
    if running; then as_pg "$bin/pg_ctl" -D "$data" -m "${2:-fast}" -w stop >/dev/null; fi
    ;;
  kill)
    if running; then as_pg "$bin/pg_ctl" -D "$data" -m immediate -w stop >/dev/null; fi
    ;;
  remove)
    if running; then as_pg "$bin/pg_ctl" -D "$data" -m fast -w stop >/dev/null; fi
    rm -rf "$dir"
    ;;
  *)
    echo "usage: $0 start|url|ca|stop [MODE]|kill|resume|remove" >&2
    exit 2
    ;;
esac
