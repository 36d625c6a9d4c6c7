#!/usr/bin/env bash
# Installs Debian packages the test suite needs, refreshing the package
# lists first (a fresh machine's may be empty or old).
#
#   scripts/apt-install.sh PACKAGE...
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
apt-get install -y -q "$@" >&2
