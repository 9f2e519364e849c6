#!/bin/sh
# PID 1 of the cluster's PostgreSQL (scripts/cluster.sh): a server of its
# own in /var/lib/opkernel-pg (made on first start, kept across a stop and
# start), listening on the cluster's network with a password
# ($PGPASSWORD) for the role and database `opkernel`.
set -eu
data=/var/lib/opkernel-pg
if [ ! -s "$data/PG_VERSION" ]; then
  mkdir -p "$data" && chown postgres:postgres "$data"
  printf '%s\n' "$PGPASSWORD" >/tmp/pw && chown postgres /tmp/pw
  runuser -u postgres -- initdb -D "$data" -U opkernel --pwfile=/tmp/pw \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f /tmp/pw
  echo "host all all 0.0.0.0/0 scram-sha-256" >>"$data/pg_hba.conf"
  runuser -u postgres -- pg_ctl -D "$data" -o "-c listen_addresses=''" -w start >/dev/null
  runuser -u postgres -- psql -q -U opkernel -d postgres -c 'CREATE DATABASE opkernel'
  runuser -u postgres -- pg_ctl -D "$data" -w stop >/dev/null
fi
mkdir -p /var/run/postgresql && chown postgres /var/run/postgresql
exec setpriv --reuid postgres --regid postgres --init-groups postgres -D "$data" -c listen_addresses='*' \
  -c max_connections=300 -c fsync=on
