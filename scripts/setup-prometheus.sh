#!/usr/bin/env bash
# Installs Debian's Prometheus (2.42) once, for the e2e tier. The package starts nothing by itself
# here; tests run the binary with their own config and a temporary data dir. Prints the binary path.
set -euo pipefail
bin=/usr/bin/prometheus
if [ ! -x "$bin" ]; then
  echo "setup-prometheus: installing Debian's prometheus package" >&2
  export DEBIAN_FRONTEND=noninteractive
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd=sudo
  $sudo_cmd apt-get update -qq >&2
  $sudo_cmd apt-get install -y -qq --no-install-recommends prometheus >&2
fi
"$bin" --version 2>&1 | head -1 >&2
echo "$bin"
