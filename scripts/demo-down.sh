#!/usr/bin/env bash
# Stops exactly what scripts/demo.sh started (PIDs and start times recorded in $DEMO_DIR/sandbox.json,
# the control plane's in $DEMO_DIR/cluster/state.json).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export DEMO_DIR=${DEMO_DIR:-${TMPDIR:-/tmp}/specfleet-demo}
venv=$(bash "$root/scripts/bootstrap.sh" | tail -n 1)
"$venv/bin/specfleet" sandbox down --dir "$DEMO_DIR"
