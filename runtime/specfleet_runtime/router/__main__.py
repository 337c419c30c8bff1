"""Command line: `python -m specfleet_runtime.router --config-file PATH | --configmap NS/NAME ...`.

Serves until SIGTERM or SIGINT, then shuts down: /readyz fails at once while requests are still served
for `--shutdown-delay-seconds`; then the listening socket closes, in-flight requests (streams included)
get up to `--drain-seconds` to finish, and the process exits.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import importlib.metadata
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specfleet_runtime.router.app import Router, RouterSettings
from specfleet_runtime.router.build import router_build
from specfleet_runtime.router.endpoints import IPNetwork, parse_address_map
from specfleet_runtime.router.kube import config_map_client, default_namespace, load_api_client
from specfleet_runtime.router.metrics import RouterMetrics
from specfleet_runtime.router.serving import serve_router
from specfleet_runtime.router.sources import (
    ConfigFileSource,
    ConfigMapSource,
    ConfigSource,
    KubeSliceWatchFactory,
)
from specfleet_runtime.router.workers import auto_workers, metrics_dir, supervise

log = logging.getLogger("specfleet_runtime.router")


def _address_map(text: str) -> tuple[IPNetwork, IPNetwork]:
    try:
        return parse_address_map(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specfleet-router", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config-file", type=Path, help="routing.json on disk, re-read every --poll-seconds")
    source.add_argument("--configmap", metavar="NAMESPACE/NAME", help="ConfigMap watched through the API")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    parser.add_argument(
        "--namespace", help="namespace of pool Services (default: the ConfigMap's, or the pod's)"
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--poll-seconds", type=float, default=2.0, help="config file poll interval")
    parser.add_argument("--resync-seconds", type=int, default=300, help="Kubernetes watch resync period")
    defaults = RouterSettings()
    parser.add_argument("--connect-timeout", type=float, default=defaults.connect_timeout)
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=defaults.read_timeout,
        help="longest wait for the next byte from an engine",
    )
    parser.add_argument(
        "--stall-seconds",
        type=float,
        default=defaults.stall_seconds,
        help="no byte from an engine this long before its first: probe it; a failed probe ejects it "
        "and the request is retried elsewhere",
    )
    parser.add_argument("--probe-timeout", type=float, default=defaults.probe_timeout)
    parser.add_argument(
        "--stream-stall-timeout",
        type=float,
        default=defaults.stream_stall_timeout,
        help="an answer that started and then gives no byte for this long is ended (a stream with an "
        "OpenAI-format error event) and its engine probed, ejected if the probe fails; 0: --read-timeout",
    )
    parser.add_argument(
        "--max-body-bytes", type=int, default=defaults.max_body_bytes, help="larger bodies get 413"
    )
    parser.add_argument(
        "--max-bytes-in-flight",
        type=int,
        default=defaults.max_bytes_in_flight,
        help="request bytes all requests may hold together (beyond: 503 + Retry-After); 0: no cap",
    )
    parser.add_argument(
        "--body-timeout", type=float, default=defaults.body_timeout, help="whole body within this (else 408)"
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=defaults.idle_timeout,
        help="close a connection without a complete request head for this long (idle or slow headers)",
    )
    parser.add_argument(
        "--write-timeout",
        type=float,
        default=defaults.write_timeout,
        help="drop a client that takes no byte of its answer for this long (its engine leg closes); 0: never",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=defaults.max_connections,
        help="open client connections (beyond: 503 and close); 0: no cap",
    )
    parser.add_argument(
        "--max-in-flight", type=int, default=defaults.max_in_flight, help="0: no cap (else 429)"
    )
    parser.add_argument(
        "--max-attempts",
        type=int,
        default=defaults.max_attempts,
        help="endpoints tried per request on connection failures and stalls",
    )
    parser.add_argument("--eject-seconds", type=float, default=defaults.eject_seconds)
    parser.add_argument(
        "--shutdown-delay-seconds",
        type=float,
        default=defaults.shutdown_delay_seconds,
        help="after SIGTERM, keep serving this long with /readyz failing before the listener closes "
        "(the time the Service needs to stop sending new connections here)",
    )
    parser.add_argument("--drain-seconds", type=float, default=defaults.drain_seconds)
    parser.add_argument(
        "--warm-timeout",
        type=float,
        default=defaults.warm_timeout,
        help="with --reuse-port (each worker of --workers): listen once the routing config and every "
        "pool's first endpoint list are in, or after this many seconds",
    )
    parser.add_argument(
        "--endpoint-address-map",
        metavar="FROM_CIDR=TO_CIDR",
        type=_address_map,
        action="append",
        default=[],
        help="rewrite EndpointSlice addresses, keeping host bits (test beds: 10.0.0.0/8=127.0.0.0/8)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="router processes sharing the port (SO_REUSEPORT); default: the pod's CPU count (its CPU "
        "limit, else the CPUs it may run on), at most 4. Each worker keeps its own least-outstanding "
        "counts; connection, in-flight and body-byte caps are divided among them",
    )
    parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--event-loop",
        choices=["auto", "uvloop", "asyncio"],
        default="auto",
        help="auto: uvloop where it is installed, else asyncio's own loop",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser.parse_args(argv)


def build_router(args: argparse.Namespace) -> Router:
    config_source: ConfigSource
    metrics = RouterMetrics()
    namespace = args.namespace
    api_client: Any = None
    if args.configmap:
        cm_namespace, sep, name = args.configmap.partition("/")
        if not sep or not cm_namespace or not name:
            raise SystemExit("--configmap must be NAMESPACE/NAME")
        # Fail fast: without the API there is no config at all.
        api_client = load_api_client(args.kubeconfig)
        config_source = ConfigMapSource(
            config_map_client(api_client, cm_namespace, name),
            cm_namespace,
            name,
            args.resync_seconds,
            on_error=lambda _: metrics.watch_errors.labels("configmap").inc(),
        )
        namespace = namespace or cm_namespace
    else:
        config_source = ConfigFileSource(args.config_file, args.poll_seconds)
    settings = RouterSettings(
        namespace=namespace or default_namespace(),
        connect_timeout=args.connect_timeout,
        read_timeout=args.read_timeout,
        stall_seconds=args.stall_seconds,
        probe_timeout=args.probe_timeout,
        stream_stall_timeout=args.stream_stall_timeout,
        max_body_bytes=args.max_body_bytes,
        max_bytes_in_flight=args.max_bytes_in_flight,
        body_timeout=args.body_timeout,
        idle_timeout=args.idle_timeout,
        write_timeout=args.write_timeout,
        max_connections=args.max_connections,
        max_in_flight=args.max_in_flight,
        max_attempts=args.max_attempts,
        eject_seconds=args.eject_seconds,
        shutdown_delay_seconds=args.shutdown_delay_seconds,
        drain_seconds=args.drain_seconds,
        warm_timeout=args.warm_timeout,
        endpoint_address_map=tuple(args.endpoint_address_map),
    )
    # In file mode the API client is only created if a pool names a Service.
    provider = (
        (lambda: api_client)
        if api_client is not None
        else functools.partial(load_api_client, args.kubeconfig)
    )
    slice_watches = KubeSliceWatchFactory(
        provider,
        args.resync_seconds,
        on_error=lambda _: metrics.watch_errors.labels("endpointslice").inc(),
    )
    return Router(settings, config_source, slice_watches, metrics)


async def serve(router: Router, host: str, port: int, reuse_port: bool = False) -> None:
    """Run until SIGTERM/SIGINT; then fail /readyz while serving `shutdown_delay_seconds` more, stop
    accepting, and drain in-flight requests."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with serve_router(router, host, port, reuse_port=reuse_port):
        await stop.wait()
        # Readiness drops first: connections the Service still sends here are served until it stops.
        router.draining = True
        delay = router.settings.shutdown_delay_seconds
        drain = router.settings.drain_seconds
        log.info("signal received: not ready; serving for %gs, then draining for up to %gs", delay, drain)
        await asyncio.sleep(delay)
    log.info("router stopped")


def loop_factory(name: str) -> tuple[Callable[[], asyncio.AbstractEventLoop], str]:
    """The event loop to run on: uvloop (libuv; less CPU per request) unless asked not to or absent."""
    if name == "asyncio":
        return asyncio.new_event_loop, "asyncio"
    try:
        import uvloop
    except ImportError:
        if name == "uvloop":
            raise SystemExit("--event-loop uvloop: uvloop is not installed") from None
        return asyncio.new_event_loop, "asyncio (uvloop is not installed)"
    return uvloop.new_event_loop, "uvloop " + importlib.metadata.version("uvloop")


def process_count(workers: int | None, port: int) -> int:
    """How many router processes serve: `--workers` if given, else one per CPU (see `auto_workers`).

    A port picked by the kernel (`--port 0`) can only be one process's: then one, and an explicit
    `--workers` above 1 is an error.
    """
    if workers is not None and workers > 1 and port == 0:
        raise SystemExit("--workers above 1 needs a fixed --port")
    if workers is not None:
        return workers
    return auto_workers() if port else 1


# Young-generation collections after this many net container allocations (CPython's default: 700).
GC_YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """Make the cyclic garbage collector cheap per request (perf showed it among the top costs).

    Everything built at start-up (modules, config, metrics) is moved out of the collector's sight
    (`gc.freeze`), so full collections stop re-walking it, and young collections run less often;
    nearly every per-request object is freed by reference counting anyway.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    workers = process_count(args.workers, args.port)
    if workers > 1:
        caps = {
            "--max-connections": args.max_connections,
            "--max-in-flight": args.max_in_flight,
            "--max-bytes-in-flight": args.max_bytes_in_flight,
        }
        directory = metrics_dir()
        if directory is not None:
            argv_list = list(sys.argv[1:] if argv is None else argv)
            raise SystemExit(supervise(argv_list, workers, caps, directory))
    factory, loop_name = loop_factory(args.event_loop)
    log.info("event loop: %s; request path: %s", loop_name, router_build())
    router = build_router(args)
    tune_gc()
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(router, args.host, args.port, reuse_port=args.reuse_port))


if __name__ == "__main__":
    main()
