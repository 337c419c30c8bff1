#!/usr/bin/env bash
# KEDA's CRDs (ScaledObject, ScaledJob, TriggerAuthentication, ...) generated from its Go module's
# apis/keda/v1alpha1 (see generate-crds.sh), as its own `make manifests` does; prints the directory
# holding them as the last line of stdout.
set -euo pipefail
# Only the API package is loaded: with -mod=mod Go fetches just the modules its imports need.
CONTROLLER_GEN_GOFLAGS=-mod=mod exec bash "$(dirname "$0")/generate-crds.sh" keda \
  github.com/kedacore/keda/v2 v2.21.0 keda.sh_scaledobjects.yaml ./apis/keda/v1alpha1/...
