"""Metrics in and out: the Prometheus queries the policy reads (`prometheus`), the operator's own
per-resource gauges (`resource_metrics`, pure, exported by `gauges`) and the Grafana dashboard built
from the same names (`dashboard`). The alerts are rendered with the children (`render.monitoring`)."""
