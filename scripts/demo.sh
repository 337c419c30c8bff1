#!/usr/bin/env bash
# The main job on a fresh machine: set everything up, start a local control plane (real apiserver,
# controller-manager, scheduler, etcd; kwok plays three GPU nodes), install the CRD, run the
# operator and reconcile the two-pool example. Leaves it all running; `make demo-down` stops exactly
# the processes it started (PIDs recorded under $DEMO_DIR).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
DEMO_DIR=${DEMO_DIR:-${TMPDIR:-/tmp}/specfleet-demo}
venv=$(bash "$root/scripts/bootstrap.sh" | tail -n 1)
py="$venv/bin/python"

if [ -f "$DEMO_DIR/operator.pid" ] || [ -f "$DEMO_DIR/cluster/state.json" ]; then
  echo "a demo is already running in $DEMO_DIR: run 'make demo-down' first" >&2
  exit 1
fi
mkdir -p "$DEMO_DIR"
echo "== building (or reusing) the test bed binaries; a cold build takes ~35 minutes" >&2
"$py" -m specfleet_testbed bin >/dev/null
echo "== starting the local cluster" >&2
eval "$("$py" -m specfleet_testbed up --dir "$DEMO_DIR/cluster")"

kubectl apply --server-side -f "$root/crds/specfleet.io_speculativedeployments.yaml" >/dev/null
kubectl wait --for=condition=Established --timeout=60s crd/speculativedeployments.specfleet.io >/dev/null

echo "== starting the operator (log: $DEMO_DIR/operator.log)" >&2
setsid "$py" -m specfleet run --resync-seconds 5 --liveness-port 0 --metrics-port 0 \
  >"$DEMO_DIR/operator.log" 2>&1 < /dev/null &
echo $! >"$DEMO_DIR/operator.pid"

echo "== applying examples/02-two-pools-routing-policy.yaml" >&2
kubectl create namespace inference --dry-run=client -o yaml | kubectl apply -f - >/dev/null
# The demo cluster has no prometheus-operator, Prometheus, H100 node labels or hf-cache PVC: use
# scrape annotations, a loopback Prometheus URL (MetricsAvailable will say it is unreachable), the
# fake GPU nodes as they are, and an emptyDir model cache.
"$py" - "$root/examples/02-two-pools-routing-policy.yaml" <<'PY' | kubectl apply -f -
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
spec = doc["spec"]
spec["monitoring"]["podMonitor"] = False
spec["policy"]["prometheus"]["url"] = "http://127.0.0.1:9090"
del spec["engine"]["nodeSelector"], spec["engine"]["modelCache"]
print(yaml.safe_dump(doc))
PY
kubectl wait -n inference --for=condition=Ready --timeout=120s sd/assistant

echo
kubectl get sd -n inference
echo
kubectl get deployments,services,pods -n inference -o wide
echo
kubectl get sd assistant -n inference -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}): {.message}{"\n"}{end}'
cat <<EOT

The operator keeps running. Try:
  export KUBECONFIG=$KUBECONFIG PATH=$(dirname "$(command -v kubectl)"):\$PATH
  kubectl -n inference patch sd assistant --type=merge -p '{"spec":{"pools":{"batch":{"speculation":"Off"}}}}'
  kubectl -n inference get deploy -w          # only the batch pool rolls
  $py -m specfleet render -f examples/04-dynamic-sd.yaml
The closed loop with load, Prometheus and flips runs in: make test-e2e
Stop everything with: make demo-down
EOT
