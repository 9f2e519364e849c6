#!/usr/bin/env bash
# Builds the sandbox image opkernel-sandbox:latest offline: Debian's
# busybox-static and bash-static are downloaded with apt, unpacked into a
# rootfs and copied onto an empty (FROM scratch) base. Idempotent: the image
# carries a hash of its recipe and is not rebuilt while the recipe is unchanged.
#
# scripts/build-image.sh --debian builds opkernel-sandbox:debian instead: a
# real Debian bookworm (minbase, with python3, git and procps) made by
# debootstrap from Debian's package registry and `docker import`ed; cached
# by the same recipe hash.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)

# one build of an image at a time (.ci/run starts them in the background
# while the kernel compiles; test.sh then finds them built)
mkdir -p "$root/target"
exec 9>"$root/target/build-image${1:-}.lock"
flock 9

# a Debian bookworm (minbase plus $2) in $1/rootfs, by debootstrap
debootstrap_rootfs() {
  local work=$1 packages=$2
  if ! command -v debootstrap >/dev/null; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  rm -rf "$work" && mkdir -p "$work"
  debootstrap --variant=minbase --include="$packages" bookworm "$work/rootfs" \
    http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log" >&2
    exit 1
  }
}

build_debian() {
  local image=opkernel-sandbox:debian
  local packages=python3,git,procps,ca-certificates,curl
  local recipe current work="$root/target/debian-image"
  recipe=$(printf 'bookworm minbase %s\n' "$packages" | cat - <(declare -f build_debian debootstrap_rootfs) | sha256sum | cut -c1-16)
  current=$(docker image inspect -f '{{ index .Config.Labels "opkernel.recipe" }}' "$image" 2>/dev/null || true)
  if [ "$current" = "$recipe" ]; then
    echo "image $image is up to date (recipe $recipe)"
    return 0
  fi
  debootstrap_rootfs "$work" "$packages"
  # the run user, as the project's own image has it; nothing else is added
  chroot "$work/rootfs" /usr/sbin/groupadd -g 1000 agent
  chroot "$work/rootfs" /usr/sbin/useradd -u 1000 -g 1000 -d /scratch -s /bin/bash -M agent
  mkdir -p "$work/rootfs/scratch"
  rm -rf "$work/rootfs"/var/cache/apt/archives/*.deb "$work/rootfs"/var/lib/apt/lists/*
  tar -C "$work/rootfs" -c . | docker import \
    --change "LABEL opkernel.recipe=$recipe" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' - "$image" >/dev/null
  rm -rf "$work"
  echo "built $image (recipe $recipe, $(docker image inspect -f '{{ .Size }}' "$image") bytes)"
}

# scripts/build-image.sh --node builds opkernel-node:latest, the image of a
# cluster node (scripts/cluster.sh): a Debian bookworm with Debian's
# docker.io (each node runs its own engine) and postgresql (the cluster's
# shared store runs in the same image); cached by the same recipe hash.
build_node() {
  local image=opkernel-node:latest
  local packages=docker.io,postgresql,postgresql-15-auto-failover,pg-auto-failover-cli,procps,iptables,ca-certificates
  local recipe current work="$root/target/node-image"
  recipe=$(printf 'node bookworm minbase %s\n' "$packages" | cat - <(declare -f build_node debootstrap_rootfs) | sha256sum | cut -c1-16)
  current=$(docker image inspect -f '{{ index .Config.Labels "opkernel.recipe" }}' "$image" 2>/dev/null || true)
  if [ "$current" = "$recipe" ]; then
    echo "image $image is up to date (recipe $recipe)"
    return 0
  fi
  debootstrap_rootfs "$work" "$packages"
  # the package's own cluster is not used: the store's entry makes its own
  rm -rf "$work/rootfs/var/lib/postgresql/15/main" "$work/rootfs/etc/postgresql/15/main"
  rm -rf "$work/rootfs"/var/cache/apt/archives/*.deb "$work/rootfs"/var/lib/apt/lists/*
  tar -C "$work/rootfs" -c . | docker import \
    --change "LABEL opkernel.recipe=$recipe" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/lib/postgresql/15/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/sh"]' - "$image" >/dev/null
  rm -rf "$work"
  echo "built $image (recipe $recipe, $(docker image inspect -f '{{ .Size }}' "$image") bytes)"
}

case "${1:-}" in
  --debian) build_debian; exit 0 ;;
  --node) build_node; exit 0 ;;
esac

image=${OPKERNEL_IMAGE:-opkernel-sandbox:latest}
packages=(busybox-static bash-static)
work="$root/target/sandbox-image"

recipe=$(cat "$root/docker/Dockerfile" "$0" | sha256sum | cut -c1-16)
current=$(docker image inspect -f '{{ index .Config.Labels "opkernel.recipe" }}' "$image" 2>/dev/null || true)
if [ "$current" = "$recipe" ]; then
  echo "image $image is up to date (recipe $recipe)"
  exit 0
fi

command -v apt-get >/dev/null || { echo "build-image: apt-get is required to fetch ${packages[*]}" >&2; exit 1; }
rm -rf "$work" && mkdir -p "$work/debs" "$work/rootfs"
cp "$root/docker/Dockerfile" "$work/Dockerfile"
(
  cd "$work/debs"
  if ! apt-get download "${packages[@]}" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    apt-get download "${packages[@]}" >/dev/null
  fi
)
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/unpacked"; done

fs="$work/rootfs"
mkdir -p "$fs"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,scratch,proc,sys,dev,root}
install -m 0755 "$work/unpacked/bin/busybox" "$fs/bin/busybox"
install -m 0755 "$work/unpacked/bin/bash-static" "$fs/bin/bash"
# one symlink per busybox applet, in the directory busybox itself names
"$fs/bin/busybox" --list-full | while read -r applet; do
  [ -e "$fs/$applet" ] || ln -s /bin/busybox "$fs/$applet"
done
ln -sf busybox "$fs/bin/sh"
chmod 1777 "$fs/tmp"
cat >"$fs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
agent:x:1000:1000:agent:/scratch:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
cat >"$fs/etc/group" <<'GROUP'
root:x:0:
agent:x:1000:
nogroup:x:65534:
GROUP

if ! DOCKER_BUILDKIT=0 docker build -q --label "opkernel.recipe=$recipe" -t "$image" "$work" >"$work/build.log" 2>&1; then
  cat "$work/build.log" >&2
  exit 1
fi
echo "built $image (recipe $recipe, $(docker image inspect -f '{{ .Size }}' "$image") bytes)"
