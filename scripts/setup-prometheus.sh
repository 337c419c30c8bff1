#!/usr/bin/env bash
# Installs Debian's Prometheus (2.42, which also ships promtool) once, for the e2e tier, the demo and
# rule checks. The package starts nothing by itself here; callers run the binaries with their own
# config and a temporary data dir. Prints the directory holding `prometheus` and `promtool` as the
# last line of stdout; everything else goes to stderr.
set -euo pipefail
bin_dir=/usr/bin
cache=${SPECFLEET_CACHE:-$HOME/.cache/specfleet}

installed() { [ -x "$bin_dir/prometheus" ] && [ -x "$bin_dir/promtool" ]; }

if ! installed; then
  mkdir -p "$cache"
  # One installer at a time: two test sessions starting together would race on dpkg's lock.
  exec 9>"$cache/.prometheus-install.lock"
  flock 9
  if ! installed; then
    echo "setup-prometheus: installing Debian's prometheus package" >&2
    export DEBIAN_FRONTEND=noninteractive
    sudo_cmd=""
    [ "$(id -u)" = 0 ] || sudo_cmd=sudo
    $sudo_cmd apt-get update -qq >&2
    $sudo_cmd apt-get install -y -qq --no-install-recommends prometheus >&2
    # Debian's postinst may start the packaged service where an init system runs; tests never use it.
  fi
fi
installed || { echo "setup-prometheus: prometheus/promtool still missing from $bin_dir" >&2; exit 1; }
"$bin_dir/prometheus" --version 2>&1 | head -1 >&2
echo "$bin_dir"
