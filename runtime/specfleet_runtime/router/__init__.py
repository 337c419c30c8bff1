"""The fast loop: an OpenAI-compatible router in front of a deployment's latency and batch pools.

Modules, pure first:
- `classify`: request -> pool and reason (header, tenant/API key, shape, auto-segmentation, default).
- `endpoints`: EndpointSlices -> ready URLs, pool fallback, least-outstanding endpoint choice.
- `errors`, `metrics`: OpenAI-format errors and the `specfleet_router_*` Prometheus metrics.
- `kube`, `sources`: I/O at the edge (Kubernetes list/watch, config file polling).
- `app`: the aiohttp proxy; `__main__`: the command line.
"""
