#!/usr/bin/env bash
# apt_install PACKAGE...: installs Debian packages with apt, as root or with sudo; elsewhere
# says what to install and fails. Sourced by system-deps.sh and deploy-deps.sh.
apt_install() {
  if ! command -v apt-get >/dev/null; then
    echo "hexmq needs: $* (install them with your package manager)" >&2
    return 1
  fi
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "installing $* needs root or sudo" >&2; return 1; }
    sudo="sudo"
  fi
  echo "installing system packages: $*" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
