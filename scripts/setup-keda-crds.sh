#!/usr/bin/env bash
# Generates KEDA's CRDs (ScaledObject, ScaledJob, TriggerAuthentication, ...) from its Go module
# (apis/keda/v1alpha1) with controller-gen, both from the Go module proxy, once; the cluster tier
# installs them to check the ScaledObject that specfleet renders for an autoscaled pool against the
# real schema. No YAML is copied from the project: the schema is generated from its types, as its own
# `make manifests` does. Prints the directory holding the CRD files as the last line of stdout;
# everything else goes to stderr. Same pattern and cache as setup-prometheus-operator-crds.sh.
set -euo pipefail
KEDA_VERSION=v2.21.0
CONTROLLER_TOOLS_VERSION=v0.20.0
module=github.com/kedacore/keda/v2
cache=${SPECFLEET_CACHE:-$HOME/.cache/specfleet}
out="$cache/keda-crds-$KEDA_VERSION"

if [ ! -f "$out/.complete" ]; then
  # Go from PATH, else where these machines install it (as testbed/build.sh finds it).
  go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
  [ -x "$go" ] || { echo "setup-keda-crds: needs Go (set GO=/path/to/go)" >&2; exit 1; }
  mkdir -p "$out"
  exec 9>"$out/.lock"
  flock 9
  if [ ! -f "$out/.complete" ]; then
    echo "setup-keda-crds: controller-gen $CONTROLLER_TOOLS_VERSION, $module@$KEDA_VERSION" >&2
    GOBIN="$out/bin" GOFLAGS=-buildvcs=false "$go" install "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_TOOLS_VERSION" >&2
    src_dir=$("$go" mod download -json "$module@$KEDA_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [ -d "$src_dir" ] || { echo "setup-keda-crds: module download failed" >&2; exit 1; }
    rm -rf "$out/src" "$out/crds"
    cp -r "$src_dir" "$out/src"
    chmod -R u+w "$out/src"
    # Only the API package is loaded: Go fetches just the modules its imports need.
    (cd "$out/src" && GOFLAGS=-mod=mod "$out/bin/controller-gen" crd:allowDangerousTypes=true,maxDescLen=0 \
      paths=./apis/keda/v1alpha1/... output:crd:dir="$out/crds" >&2)
    ls "$out/crds/keda.sh_scaledobjects.yaml" >/dev/null
    touch "$out/.complete"
  fi
fi
echo "$out/crds"
