#!/usr/bin/env bash
# Installs the system packages hexmq runs and tests with, if they are missing:
# redis-server (one per node), mosquitto (the benchmark's baseline), mosquitto-clients, and
# haproxy (the load balancer of deploy/compose: `make deploy-check` and the PROXY protocol tests),
# and what the fault suite cuts and bends a private network and a node's clock with (iptables,
# iproute2's ip, util-linux's unshare, faketime: docs/faults.md; its namespace self-test runs
# in `make test`).
# Debian/Ubuntu only; elsewhere it says what to install and fails.
set -euo pipefail

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || missing+=(mosquitto)
command -v mosquitto_pub >/dev/null || missing+=(mosquitto-clients)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || missing+=(iptables)
command -v ip >/dev/null || [ -x /usr/sbin/ip ] || missing+=(iproute2)
command -v unshare >/dev/null || missing+=(util-linux)
command -v faketime >/dev/null || missing+=(faketime)
((${#missing[@]})) || exit 0

. "$(dirname "$0")/apt-install.sh"
apt_install "${missing[@]}"
