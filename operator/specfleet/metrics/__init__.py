"""Observations from Prometheus (the only place the operator queries metrics)."""
