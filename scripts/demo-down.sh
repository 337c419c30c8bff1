#!/usr/bin/env bash
# Stops exactly what scripts/demo.sh started: the operator by its recorded PID, the cluster by the
# PIDs recorded in its state file.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
DEMO_DIR=${DEMO_DIR:-${TMPDIR:-/tmp}/specfleet-demo}
venv=$(bash "$root/scripts/bootstrap.sh" | tail -n 1)
if [ -f "$DEMO_DIR/operator.pid" ]; then
  pid=$(cat "$DEMO_DIR/operator.pid")
  # Only if that PID is still our operator (PIDs get reused).
  if grep -q "specfleet" "/proc/$pid/cmdline" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$DEMO_DIR/operator.pid"
fi
if [ -f "$DEMO_DIR/cluster/state.json" ]; then
  "$venv/bin/python" -m specfleet_testbed down --dir "$DEMO_DIR/cluster"
fi
echo "demo stopped" >&2
