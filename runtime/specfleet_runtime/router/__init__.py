"""The fast loop: an OpenAI-compatible router in front of a deployment's latency and batch pools.

Modules, pure first:
- `classify`: request -> pool and reason (tenant/API key, header, shape, auto-segmentation, default).
- `endpoints`: EndpointSlices -> ready URLs, pool fallback, least-outstanding endpoint choice.
- `paths`: the allow-list of served paths, matched on the normalized path.
- `errors`, `metrics`: OpenAI-format errors and the `specfleet_router_*` Prometheus metrics.
- `kube`, `sources`: I/O at the edge (Kubernetes list/watch, config file polling).
- `configuration` (the config in force), `backends` (endpoints, load, ejection), `intake` (bounded
  body reads), `admission` (body checks and classification), `proxy` (the engine leg), `server` (the
  HTTP server and its connection guards), `app` (`Router`, which wires them); `__main__`: the CLI;
  `build`: whether this process runs the source or the mypyc-compiled request path.
"""
