#!/usr/bin/env bash
# A real opkernel cluster on this machine (SPEC §20):
#
#   scripts/cluster.sh up N [--store ha]
#                              N nodes (1..9) and the PostgreSQL they share
#   scripts/cluster.sh store-nodes
#                              the replicated store's data nodes and roles now
#   scripts/cluster.sh down    removes everything `up` made
#
# Each node is a Docker-in-Docker container of opkernel-node:latest (a
# Debian bookworm with Debian's docker.io, built once by build-image.sh
# --node and cached by its recipe hash): its own dockerd (vfs storage
# driver), the sandbox image moved in by `docker save | docker load`, and
# the host's kernel binary ($OPKERNEL_BIN, default target/debug/opkernel)
# mounted in and run as `opkernel serve --node nI`. The store is a
# PostgreSQL container of the same image. All sit on a private network the
# script creates (static addresses, so a cut and healed link keeps its
# address); each node's API and the store are published on host loopback
# ports. Every node serves its API over TLS (SPEC §29): a CA made here
# signs each node's certificate (its name, its address, and host
# loopback), nodes advertise https://nI:7700 and check each other with
# OPKERNEL_CA. The last line of `up` is one JSON object:
#   {"store", "operator_token", "network", "ca", "nodes": [{"name", "container", "url"}]}
# With --store ha (SPEC §31) the store is replicated: Debian's
# pg_auto_failover, a monitor ($name-pgmon) and two data nodes ($name-pg1,
# $name-pg2) in synchronous replication, the monitor promoting the standby
# when the primary is lost. Nodes connect with a multi-host URL
# (target_session_attrs=read-write), and the JSON line gains
#   "store_nodes": [{"container", "role"}]   (role: primary, secondary, ...)
# Every OPKERNEL_* variable of the caller's environment is passed to every
# node (any setting can be tried on a cluster), but for the harness's own
# (OPKERNEL_BIN, OPKERNEL_CLUSTER*) and those a node sets for itself
# (its store, home, listen address, node name, advertised URL and TLS).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

name=${OPKERNEL_CLUSTER:-opkernel-cluster}
net=$name
subnet_prefix=${OPKERNEL_CLUSTER_SUBNET:-10.213.7}
state="$root/target/cluster"
bin=${OPKERNEL_BIN:-$root/target/debug/opkernel}
label="opkernel.cluster=$name"

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

random_hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

down() {
  local ids
  ids=$(docker ps -aq --filter "label=$label")
  # shellcheck disable=SC2086 # one id per word
  [ -z "$ids" ] || docker rm -f -v $ids >/dev/null
  docker network rm "$net" >/dev/null 2>&1 || true
  rm -rf "$state"
}

# waits up to $2 seconds for the command $1 (a string) to succeed
wait_for() {
  local deadline=$((SECONDS + $2))
  until eval "$1" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "cluster: gave up waiting for: $1" >&2
      return 1
    fi
    sleep 0.2
  done
}

# the cluster's CA, and a certificate it signs for node $1 at address $2
make_ca() {
  mkdir -p "$state/tls"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=opkernel cluster CA" \
    -keyout "$state/tls/ca.key" -out "$state/tls/ca.pem" 2>/dev/null
}
make_cert() {
  local node=$1 ip=$2 t="$state/tls"
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$node" \
    -keyout "$t/$node.key" -out "$t/$node.csr" 2>/dev/null
  echo "subjectAltName=DNS:$node,DNS:localhost,IP:$ip,IP:127.0.0.1" >"$t/$node.ext"
  openssl x509 -req -days 2 -in "$t/$node.csr" -CA "$t/ca.pem" -CAkey "$t/ca.key" \
    -CAcreateserial -extfile "$t/$node.ext" -out "$t/$node.pem" 2>/dev/null
}

start_store() {
  local port=$1 password=$2
  docker run -d --name "$name-pg" --hostname pg --label "$label" \
    --network "$net" --ip "$subnet_prefix.2" --network-alias pg \
    -p "127.0.0.1:$port:5432" -e "PGPASSWORD=$password" \
    -v "$root/docker/cluster/store-entry.sh:/entry.sh:ro" \
    opkernel-node:latest /entry.sh >/dev/null
  wait_for "docker exec $name-pg pg_isready -q -h 127.0.0.1 -U opkernel -d opkernel" 60 || {
    docker logs "$name-pg" >&2
    return 1
  }
}

# the replicated store (--store ha): a member $1 (pgmon, pg1, pg2) of role
# $2 at address $3, published on host loopback port $4 (data nodes only)
start_store_member() {
  local member=$1 role=$2 ip=$3 port=${4:-}
  local publish=()
  [ -z "$port" ] || publish=(-p "127.0.0.1:$port:5432")
  local alias=$member
  [ "$member" != pgmon ] || alias=monitor
  docker run -d --name "$name-$member" --hostname "$alias" --label "$label" \
    --network "$net" --ip "$ip" --network-alias "$alias" "${publish[@]}" \
    -e "ROLE=$role" \
    -v "$root/docker/cluster/pgaf-entry.sh:/entry.sh:ro" \
    opkernel-node:latest /entry.sh >/dev/null
}

# the monitor's view, one line per data node: name, reported state, goal
monitor_states() {
  docker exec "$name-pgmon" runuser -u postgres -- psql -h /var/run/postgresql -d pg_auto_failover -AtF' ' \
    -c "SELECT nodename, reportedstate, goalstate FROM pgautofailover.node ORDER BY nodeid"
}

# the data nodes as JSON: [{"container", "role"}], role `primary` for the
# one that takes writes, `secondary` for a standby in sync, else the
# monitor's reported state (catchingup, demoted, ...)
store_nodes() {
  local out="" sep="" node reported goal role
  while read -r node reported goal; do
    [ -n "$node" ] || continue
    case "$reported:$goal" in
      primary:primary | wait_primary:wait_primary | primary:apply_settings | apply_settings:primary) role=primary ;;
      secondary:secondary) role=secondary ;;
      *) role=$reported ;;
    esac
    out+="$sep{\"container\": \"$name-$node\", \"role\": \"$role\"}"
    sep=", "
  done < <(monitor_states)
  echo "[$out]"
}

# the replicated store: monitor, then pg1 (primary), then pg2 (standby);
# prints the kernels' URL tail (hosts and query) after the role's password
# is set on the primary
start_ha_store() {
  local password=$1 p1=$2 p2=$3
  start_store_member pgmon monitor "$subnet_prefix.3"
  wait_for "docker exec $name-pgmon runuser -u postgres -- psql -h /var/run/postgresql -d pg_auto_failover -c 'SELECT 1'" 90 || {
    docker logs "$name-pgmon" >&2
    return 1
  }
  # the monitor's watch, tightened for a harness on one machine (the
  # defaults: a check every 5 s, unhealthy after 20 s, and 30 s for a lost
  # primary to demote itself before its standby takes writes). With
  # synchronous replication an old primary cut off from its standby cannot
  # acknowledge a commit, so a short demote wait loses nothing acknowledged
  docker exec -i "$name-pgmon" runuser -u postgres -- psql -q -h /var/run/postgresql -d pg_auto_failover \
    -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
ALTER SYSTEM SET pgautofailover.health_check_period = 1000;
ALTER SYSTEM SET pgautofailover.health_check_timeout = 2000;
ALTER SYSTEM SET pgautofailover.health_check_retry_delay = 1000;
ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = 5000;
ALTER SYSTEM SET pgautofailover.primary_demote_timeout = 10000;
SELECT pg_reload_conf();
SQL
  start_store_member pg1 data "$subnet_prefix.4" "$p1"
  wait_for "monitor_states | grep -q '^pg1 single single'" 120 || {
    docker logs "$name-pg1" >&2
    return 1
  }
  # a standby is made by pg_basebackup, which waits for a spread checkpoint
  # (minutes on an idle server): a checkpoint asked for now ends that wait,
  # and a short checkpoint interval bounds it when a node is made again
  docker exec "$name-pg1" runuser -u postgres -- psql -q -h /var/run/postgresql -d opkernel \
    -c "ALTER SYSTEM SET checkpoint_timeout = '30s'" -c 'SELECT pg_reload_conf()' >/dev/null
  start_store_member pg2 data "$subnet_prefix.5" "$p2"
  wait_for "docker exec $name-pg1 runuser -u postgres -- psql -h /var/run/postgresql -d opkernel -c CHECKPOINT \
    && [ \"\$(monitor_states | tr '\n' ' ')\" = 'pg1 primary primary pg2 secondary secondary ' ]" 180 || {
    monitor_states >&2 || true
    docker logs "$name-pg2" >&2
    return 1
  }
  docker exec -i "$name-pg1" runuser -u postgres -- psql -q -h /var/run/postgresql -d opkernel \
    -v ON_ERROR_STOP=1 -v "pw=$password" <<'SQL'
ALTER ROLE opkernel LOGIN CREATEDB PASSWORD :'pw';
SQL
}

start_node() {
  local node=$1 index=$2 port=$3 store=$4
  local pass=() var
  while IFS= read -r var; do
    case $var in
      OPKERNEL_BIN | OPKERNEL_CLUSTER* | OPKERNEL_STORE | OPKERNEL_HOME | OPKERNEL_URL | OPKERNEL_TOKEN \
        | OPKERNEL_NODE | OPKERNEL_ADVERTISE | OPKERNEL_DOCKER_SOCKET | OPKERNEL_TEST_* | OPKERNEL_MCP_PYTHON \
        | OPKERNEL_TLS_* | OPKERNEL_CA) ;;
      *) pass+=(-e "$var=${!var}") ;;
    esac
  done < <(compgen -e | grep '^OPKERNEL_' || true)
  make_cert "$node" "$subnet_prefix.$((10 + index))"
  docker run -d --name "$name-$node" --hostname "$node" --label "$label" \
    --network "$net" --ip "$subnet_prefix.$((10 + index))" --network-alias "$node" \
    -p "127.0.0.1:$port:7700" \
    --cap-add SYS_ADMIN --cap-add NET_ADMIN --cap-add SYS_PTRACE --cap-add DAC_READ_SEARCH \
    --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
    --cgroupns host -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
    --tmpfs /run:rw,exec,size=64m \
    -e "NODE=$node" -e "ADVERTISE=https://$node:7700" -e "OPKERNEL_STORE=$store" \
    -e "OPKERNEL_TLS_CERT=/run/cluster/tls/$node.pem" -e "OPKERNEL_TLS_KEY=/run/cluster/tls/$node.key" \
    -e "OPKERNEL_CA=/run/cluster/tls/ca.pem" -v "$state/tls:/run/cluster/tls:ro" \
    "${pass[@]}" \
    -v "$bin:/usr/local/bin/opkernel:ro" \
    -v "$root/docker/cluster/node-entry.sh:/entry.sh:ro" \
    -v "$state/images:/images:ro" \
    -v "$state/operator.token:/run/cluster/operator.token:ro" \
    opkernel-node:latest /entry.sh >/dev/null
}

up() {
  local n=$1 store_kind=${2:-single}
  case $store_kind in single | ha) ;; *) echo "cluster: --store takes single or ha, not '$store_kind'" >&2; exit 2 ;; esac
  case $n in [1-9]) ;; *) echo "cluster: up takes a node count from 1 to 9, not '$n'" >&2; exit 2 ;; esac
  [ -x "$bin" ] || { echo "cluster: no kernel binary at $bin (cargo build first, or set OPKERNEL_BIN)" >&2; exit 1; }
  down
  scripts/docker-up.sh >&2
  scripts/build-image.sh >&2
  scripts/build-image.sh --node >&2
  if ! command -v openssl >/dev/null; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
  fi
  mkdir -p "$state/images"
  docker save opkernel-sandbox:latest -o "$state/images/sandbox.tar"
  local token password pg_port
  token=$(random_hex 32)
  password=$(random_hex 16)
  (umask 077 && echo "$token" >"$state/operator.token")
  make_ca
  docker network create --subnet "$subnet_prefix.0/24" --label "$label" "$net" >/dev/null
  local inner outer extra=""
  if [ "$store_kind" = ha ]; then
    local p1 p2
    p1=$(free_port)
    p2=$(free_port)
    start_ha_store "$password" "$p1" "$p2"
    inner="postgres://opkernel:$password@pg1:5432,pg2:5432/opkernel?target_session_attrs=read-write"
    outer="postgres://opkernel:$password@127.0.0.1:$p1,127.0.0.1:$p2/opkernel?target_session_attrs=read-write"
    extra=", \"store_nodes\": $(store_nodes)"
  else
    pg_port=$(free_port)
    start_store "$pg_port" "$password"
    inner="postgres://opkernel:$password@pg:5432/opkernel"
    outer="postgres://opkernel:$password@127.0.0.1:$pg_port/opkernel"
  fi
  local i ports=()
  for i in $(seq 1 "$n"); do
    ports[i]=$(free_port)
    start_node "n$i" "$i" "${ports[i]}" "$inner"
  done
  local nodes="" sep=""
  for i in $(seq 1 "$n"); do
    local url="https://127.0.0.1:${ports[i]}"
    wait_for "curl -fsS --cacert $state/tls/ca.pem $url/v1/health" 120 || {
      docker logs "$name-n$i" >&2
      docker exec "$name-n$i" tail -30 /var/lib/opkernel/serve.out >&2 || true
      exit 1
    }
    nodes+="$sep{\"name\": \"n$i\", \"container\": \"$name-n$i\", \"url\": \"$url\"}"
    sep=", "
  done
  # every node sees every other as an active member
  wait_for "[ \$(curl -fsS --cacert $state/tls/ca.pem -H 'Authorization: Bearer $token' https://127.0.0.1:${ports[1]}/v1/nodes | grep -o '\"state\":\"active\"' | wc -l) -eq $n ]" 60
  echo "{\"store\": \"$outer\", \"operator_token\": \"$token\", \"network\": \"$net\", \"ca\": \"$state/tls/ca.pem\", \"nodes\": [$nodes]$extra}"
}

case "${1:-}" in
  up)
    n=${2:-3}
    store_kind=single
    if [ "${3:-}" = --store ]; then store_kind=${4:-}; fi
    up "$n" "$store_kind"
    ;;
  store-nodes) store_nodes ;;
  down) down ;;
  *) echo "usage: scripts/cluster.sh up N [--store ha] | store-nodes | down" >&2; exit 2 ;;
esac
