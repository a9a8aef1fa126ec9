#!/usr/bin/env bash
# Stand-in base images for deploy/compose where the registry images cannot be pulled (no
# registry reachable), made from Debian packages with the machine's own apt sources:
# `mmdebstrap` a bookworm root filesystem, `podman import` it with the image settings the
# upstream image has. deploy/compose/compose.standin.yaml maps compose.yaml's images to them
# (docs/deploy.md, "Running it for real"):
#
#   hexmq-standin/python:bookworm   for python:3.11.11-slim-bookworm (the Dockerfile's base):
#                                   Debian's python3 (3.11.2), venv, pip's wheel, CA certificates
#   hexmq-standin/redis:bookworm    for redis:7.4.1-alpine: Debian's redis-server (7.0) run as
#                                   uid 999 (healthchecks as root), /data its working directory
#   hexmq-standin/haproxy:bookworm  for haproxy:3.0.5-alpine: Debian's haproxy (2.6), its config
#                                   at /usr/local/etc/haproxy, stop signal SIGUSR1 (soft stop),
#                                   BusyBox's wget for the healthcheck (as Alpine has)
#
# Consul has no stand-in image: the override runs `hexmq consul-dev` in the hexmq image. The
# Collector and Jaeger have none either. Images that exist are kept (the engine's own store,
# /var/lib/containers/storage for rootful podman): delete one to make it again.
# Usage: scripts/deploy-images.sh [ENGINE]   (ENGINE: podman, the default, or docker)
set -euo pipefail

engine=${1:-podman}
suite=bookworm
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# name, packages, --change settings (one per line)
make_image() {
  local name=$1 packages=$2 changes=$3 hook=${4:-}
  if "$engine" image inspect "$name" >/dev/null 2>&1; then
    echo "$name: present" >&2
    return
  fi
  echo "$name: mmdebstrap $suite with $packages" >&2
  local args=(--variant=minbase --include="$packages" --dpkgopt=path-exclude=/usr/share/doc/*
    --dpkgopt=path-exclude=/usr/share/man/* --dpkgopt=path-exclude=/usr/share/locale/*
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*')
  [ -z "$hook" ] || args+=(--customize-hook="$hook")
  mmdebstrap -q "${args[@]}" "$suite" "$work/rootfs.tar"
  local change=()
  while IFS= read -r line; do
    [ -z "$line" ] || change+=(--change "$line")
  done <<<"$changes"
  "$engine" import "${change[@]}" "$work/rootfs.tar" "$name" >/dev/null
  rm -f "$work/rootfs.tar"
}

make_image hexmq-standin/python:bookworm \
  python3,python3-venv,python-is-python3,ca-certificates,passwd \
  'ENV LANG=C.UTF-8
CMD ["python3"]'

# The redis image runs Redis as uid 999 (compose.yaml's secrets service gives it the ACL
# files) and everything else as root, its healthcheck too (which reads the password file of
# uid 10001): its entry point drops to 999 for the command, as the image's gosu does.
make_image hexmq-standin/redis:bookworm \
  redis-server \
  'WORKDIR /data
ENTRYPOINT ["setpriv", "--reuid=999", "--regid=999", "--clear-groups", "--"]
CMD ["redis-server"]' \
  'chroot "$1" usermod -u 999 redis && chroot "$1" groupmod -g 999 redis && mkdir -p "$1"/data && chown 999:999 "$1"/data'

make_image hexmq-standin/haproxy:bookworm \
  haproxy,busybox \
  'USER haproxy
STOPSIGNAL SIGUSR1
CMD ["haproxy", "-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]' \
  'mkdir -p "$1"/usr/local/etc/haproxy && ln -s /bin/busybox "$1"/usr/local/bin/wget'
