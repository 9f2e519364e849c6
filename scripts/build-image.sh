#!/usr/bin/env bash
# Builds the sandbox image opkernel-sandbox:latest offline: Debian's
# busybox-static and bash-static are downloaded with apt, unpacked into a
# rootfs and copied onto an empty (FROM scratch) base. Idempotent: the image
# carries a hash of its recipe and is not rebuilt while the recipe is unchanged.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
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
