#!/bin/sh
# PID 1 of a cluster node (scripts/cluster.sh): the node's own Docker
# engine, the images the harness handed in, then `opkernel serve --node`,
# restarted when it exits (as a service manager would: a rolling restart
# is a SIGTERM to the kernel). Settings come from the environment:
# NODE, ADVERTISE, OPKERNEL_STORE and any other OPKERNEL_* setting.
set -eu
home=/var/lib/opkernel
mkdir -p "$home"

# /run is a tmpfs (scripts/cluster.sh): a node started again after a kill
# boots like a host, with no stale pid file of its engine
# the run containers' cgroups nest under this node's own, so a paused
# node is paused whole (its runs too), as a frozen host would be
parent=$(awk -F: '$2 == "freezer" { print $3 }' /proc/self/cgroup)
cgroup_parent=${parent:+--cgroup-parent $parent/engine}
# shellcheck disable=SC2086 # an optional flag and its value
dockerd --storage-driver vfs $cgroup_parent >/var/log/dockerd.log 2>&1 &
tries=0
until docker info >/dev/null 2>&1; do
  tries=$((tries + 1))
  if [ "$tries" -gt 600 ]; then
    echo "node $NODE: dockerd did not answer in 60 s" >&2
    tail -20 /var/log/dockerd.log >&2
    exit 1
  fi
  sleep 0.1
done

# the sandbox images, moved from the host's engine (docker save | docker load)
for tar in /images/*.tar; do
  [ -e "$tar" ] && docker load -q -i "$tar" >/dev/null
done

# the cluster's one operator token (every node's home holds the same)
install -m 600 /run/cluster/operator.token "$home/operator.token"

kernel=
trap '[ -n "$kernel" ] && kill -TERM "$kernel" 2>/dev/null; wait; exit 0' TERM INT
while :; do
  opkernel serve --home "$home" --listen 0.0.0.0:7700 --allow-remote \
    --store "$OPKERNEL_STORE" --node "$NODE" --advertise "$ADVERTISE" \
    >>"$home/serve.out" 2>&1 &
  kernel=$!
  wait "$kernel" || true
  sleep 0.5
done
