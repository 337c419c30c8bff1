#!/usr/bin/env bash
# prometheus-operator's CRDs (PodMonitor, PrometheusRule, ServiceMonitor, ...) generated from its Go API
# module (see generate-crds.sh); prints the directory holding them as the last line of stdout.
set -euo pipefail
exec bash "$(dirname "$0")/generate-crds.sh" prometheus-operator \
  github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring v0.88.0 \
  monitoring.coreos.com_prometheusrules.yaml ./v1/... ./v1alpha1/...
