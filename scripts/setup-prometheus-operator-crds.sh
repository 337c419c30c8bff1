#!/usr/bin/env bash
# Generates prometheus-operator's CRDs (PodMonitor, PrometheusRule, ServiceMonitor, ...) from its Go API
# module with controller-gen, both from the Go module proxy, once; the cluster tier installs them to
# check what specfleet renders for prometheus-operator against the real schema. No YAML is copied from
# the project: the schema is generated from its types, as its own build does. Prints the directory
# holding the CRD files as the last line of stdout; everything else goes to stderr.
set -euo pipefail
PROMETHEUS_OPERATOR_VERSION=v0.88.0
CONTROLLER_TOOLS_VERSION=v0.20.0
module=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring
cache=${SPECFLEET_CACHE:-$HOME/.cache/specfleet}
out="$cache/prometheus-operator-crds-$PROMETHEUS_OPERATOR_VERSION"

if [ ! -f "$out/.complete" ]; then
  # Go from PATH, else where these machines install it (as testbed/build.sh finds it).
  go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
  [ -x "$go" ] || { echo "setup-prometheus-operator-crds: needs Go (set GO=/path/to/go)" >&2; exit 1; }
  mkdir -p "$out"
  exec 9>"$out/.lock"
  flock 9
  if [ ! -f "$out/.complete" ]; then
    echo "setup-prometheus-operator-crds: controller-gen $CONTROLLER_TOOLS_VERSION, $module@$PROMETHEUS_OPERATOR_VERSION" >&2
    GOBIN="$out/bin" GOFLAGS=-buildvcs=false "$go" install "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_TOOLS_VERSION" >&2
    src_dir=$("$go" mod download -json "$module@$PROMETHEUS_OPERATOR_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [ -d "$src_dir" ] || { echo "setup-prometheus-operator-crds: module download failed" >&2; exit 1; }
    rm -rf "$out/src" "$out/crds"
    cp -r "$src_dir" "$out/src"
    chmod -R u+w "$out/src"
    (cd "$out/src" && "$out/bin/controller-gen" crd:allowDangerousTypes=true,maxDescLen=0 \
      paths=./v1/... paths=./v1alpha1/... output:crd:dir="$out/crds" >&2)
    ls "$out/crds/monitoring.coreos.com_prometheusrules.yaml" >/dev/null
    touch "$out/.complete"
  fi
fi
echo "$out/crds"
