#!/usr/bin/env bash
# The main job on a fresh machine: set up everything, start the sandbox (local control plane,
# Prometheus, operator, router and one emulated engine per pod), apply the two-pool example adapted
# to the sandbox, drive the ~5 minute demo scenario with live status, print a summary, and leave it
# all running for exploration. `make demo-down` stops exactly the processes it started.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export DEMO_DIR=${DEMO_DIR:-${TMPDIR:-/tmp}/specfleet-demo}
venv=$(bash "$root/scripts/bootstrap.sh" | tail -n 1)
export PATH="$venv/bin:$PATH"
exec "$venv/bin/specfleet" sandbox demo --dir "$DEMO_DIR" "$@"
