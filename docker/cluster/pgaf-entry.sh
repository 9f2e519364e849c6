#!/bin/sh
# PID 1 of one member of the cluster's replicated store (scripts/cluster.sh
# up N --store ha, SPEC §31): Debian's pg_auto_failover. $ROLE is
# `monitor` (the arbiter that watches the data nodes and orders failovers)
# or `data` (a PostgreSQL server the monitor makes primary or synchronous
# standby). Everything lives in /var/lib/pgaf, made on the first start and
# kept across a stop and start, so a killed node started again rejoins
# through its own pg_autoctl, as the monitor tells it (a former primary as
# a standby, rewound).
#
# pg_autoctl's own connections (the monitor's health checks, the keepers'
# reports, replication) are trusted from the store's own addresses only
# (pg_autoctl writes those rules, peer by peer); the kernels' role
# `opkernel` logs in with a password from anywhere.
set -eu
home=/var/lib/pgaf
export PGDATA=$home/data HOME=$home XDG_CONFIG_HOME=$home/config XDG_DATA_HOME=$home/share
mkdir -p "$home" /var/run/postgresql
chown postgres:postgres "$home" /var/run/postgresql
# this is PID 1 of a container just started: no pg_autoctl and no postgres
# of the last life runs, so their pid and socket lock files (pids are
# reused from 1 in a container) are stale; left in place, they stop the
# start (postgres takes a live process of this life for the old postmaster)
rm -rf /tmp/pg_autoctl "$PGDATA/postmaster.pid" /var/run/postgresql/.s.PGSQL.*

as_postgres() { setpriv --reuid postgres --regid postgres --init-groups "$@"; }

# the kernels' rule, added once the server answers (on a standby it came
# with pg_basebackup's copy of the primary's) and read again at once
password_rule() {
  until as_postgres pg_isready -q -h /var/run/postgresql; do sleep 0.2; done
  if ! grep -q '^host all opkernel ' "$PGDATA/pg_hba.conf"; then
    echo "host all opkernel 0.0.0.0/0 scram-sha-256" >>"$PGDATA/pg_hba.conf"
  fi
  as_postgres pg_ctl reload -D "$PGDATA" >/dev/null
}

case $ROLE in
  monitor)
    exec setpriv --reuid postgres --regid postgres --init-groups \
      pg_autoctl create monitor --hostname "$(hostname)" --auth trust --no-ssl --run
    ;;
  data)
    password_rule &
    exec setpriv --reuid postgres --regid postgres --init-groups \
      pg_autoctl create postgres --hostname "$(hostname)" --name "$(hostname)" \
      --auth trust --no-ssl --username opkernel --dbname opkernel \
      --monitor "postgres://autoctl_node@monitor:5432/pg_auto_failover?sslmode=disable" --run
    ;;
  *)
    echo "pgaf-entry: ROLE must be monitor or data, not '$ROLE'" >&2
    exit 2
    ;;
esac
