#!/usr/bin/env bash
# The Gateway API Inference Extension's CRDs (InferencePool v1, InferenceObjective v1alpha2, ...) as the
# module publishes them (see fetch-module-crds.sh); prints the directory holding them as the last line
# of stdout. The version is the one specfleet.api.gateway.INFERENCE_EXTENSION_VERSION names (a unit test
# holds them equal).
set -euo pipefail
exec bash "$(dirname "$0")/fetch-module-crds.sh" inference-extension \
  sigs.k8s.io/gateway-api-inference-extension v1.4.0 config/crd/bases \
  inference.networking.k8s.io_inferencepools.yaml
