"""Command line: `python -m specfleet_runtime.router --config-file PATH | --configmap NS/NAME ...`.

Serves until SIGTERM or SIGINT, then shuts down: /readyz fails at once while requests are still served
for `--shutdown-delay-seconds`; then the listening socket closes, in-flight requests (streams included)
get up to `--drain-seconds` to finish, and the process exits.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import gc
import importlib.metadata
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specfleet_runtime.names import ROUTER_PORT
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


def settings_flags() -> list[dataclasses.Field[Any]]:
    """The `RouterSettings` fields that are command-line flags: those with help text."""
    return [f for f in dataclasses.fields(RouterSettings) if "help" in f.metadata]


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per settings field with help: `--field-name`, typed and defaulted as the field."""
    for f in settings_flags():
        flag = "--" + f.name.replace("_", "-")
        text = f"{f.metadata['help']} (default: %(default)s)"
        parser.add_argument(flag, type=type(f.default), default=f.default, help=text)


def settings_from_args(args: argparse.Namespace, **others: Any) -> RouterSettings:
    """`RouterSettings` from the parsed flags, plus the fields that are not flags."""
    return RouterSettings(**{f.name: getattr(args, f.name) for f in settings_flags()}, **others)


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
    parser.add_argument("--port", type=int, default=ROUTER_PORT)
    parser.add_argument("--poll-seconds", type=float, default=2.0, help="config file poll interval")
    parser.add_argument("--resync-seconds", type=int, default=300, help="Kubernetes watch resync period")
    add_settings_arguments(parser)
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
    settings = settings_from_args(
        args,
        namespace=namespace or default_namespace(),
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
