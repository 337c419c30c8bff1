#!/usr/bin/env bash
# The Gateway API's standard-channel CRDs (HTTPRoute, Gateway, ...) as the module publishes them (see
# fetch-module-crds.sh); prints the directory holding them as the last line of stdout. The version is
# the one specfleet.api.gateway.GATEWAY_API_VERSION names (a unit test holds them equal).
set -euo pipefail
exec bash "$(dirname "$0")/fetch-module-crds.sh" gateway-api sigs.k8s.io/gateway-api v1.6.3 \
  config/crd/standard gateway.networking.k8s.io_httproutes.yaml
