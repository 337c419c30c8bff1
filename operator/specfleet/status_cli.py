"""`specfleet status`: read SpeculativeDeployments from any cluster and show each pool's state.

The I/O edge of `status_view` (which is pure): lists or gets the resources through the Kubernetes
API with the usual credentials (in-cluster, else KUBECONFIG), then prints plain lines, or with
`--watch` on a terminal redraws a table in place (rich); without a terminal (CI, a pipe) `--watch`
prints a resource's lines again only when they change.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from specfleet.api.constants import GROUP, PLURAL, VERSION
from specfleet.status_view import POOL_COLUMNS, FleetView, fleet_view, plain_lines, pool_cells

Fetch = Callable[[], list[dict[str, Any]]]


def make_fetch(kubeconfig: str | None, namespace: str | None, name: str | None) -> Fetch:
    """A function returning the selected resources, sorted by namespace and name."""
    from kubernetes import client as k8s

    from specfleet.kube import load_kube_config

    api = k8s.CustomObjectsApi(load_kube_config(kubeconfig))

    def fetch() -> list[dict[str, Any]]:
        answer: Any
        if name is not None:
            answer = api.get_namespaced_custom_object(GROUP, VERSION, namespace or "default", PLURAL, name)
            return [answer]
        if namespace is not None:
            answer = api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        else:
            answer = api.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        items: list[dict[str, Any]] = answer["items"]
        return sorted(items, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))

    return fetch


def rich_renderable(views: list[FleetView]) -> Any:
    """One table per resource plus its conditions, for a terminal."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    for view in views:
        table = Table(
            title=f"{view.namespace}/{view.name}  generation {view.generation}  flips {view.flips}",
            title_justify="left",
            expand=True,
        )
        for column in POOL_COLUMNS:
            table.add_column(column, overflow="fold")
        for row in view.pools:
            style = "green" if row.mode == "On" else "yellow"
            cells = pool_cells(row)
            table.add_row(*cells[:2], Text(cells[2], style=style), *cells[3:])
        parts.append(table)
        for condition in view.conditions:
            ok = "=True" in condition and not condition.startswith("Degraded")
            parts.append(Text("  " + condition, style="dim" if ok else "bold red"))
    if not views:
        parts.append(Text("no SpeculativeDeployments found"))
    parts.append(Text(f"updated {datetime.now(UTC):%H:%M:%S} UTC (Ctrl-C to stop)", style="dim"))
    return Group(*parts)


def run_status(
    fetch: Fetch, *, watch: bool, interval: float, out: Any = None, terminal: bool | None = None
) -> int:
    """Print once, or keep watching until interrupted."""
    out = out or sys.stdout
    terminal = out.isatty() if terminal is None else terminal
    if not watch:
        views = [fleet_view(o) for o in fetch()]
        if not views:
            print("no SpeculativeDeployments found", file=out)
        for view in views:
            print("\n".join(plain_lines(view)), file=out)
        return 0
    if terminal:
        from rich.console import Console
        from rich.live import Live

        with Live(console=Console(file=out), auto_refresh=False) as live:
            try:
                while True:
                    live.update(rich_renderable([fleet_view(o) for o in fetch()]), refresh=True)
                    time.sleep(interval)
            except KeyboardInterrupt:
                return 0
    last: dict[tuple[str, str], list[str]] = {}
    try:
        while True:
            for view in (fleet_view(o) for o in fetch()):
                lines = plain_lines(view)
                key = (view.namespace, view.name)
                if last.get(key) != lines:
                    print(
                        f"--- {datetime.now(UTC):%H:%M:%S}", "\n".join(lines), sep="\n", file=out, flush=True
                    )
                    last[key] = lines
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def add_parser(sub: Any) -> None:
    """Register `specfleet status` on the CLI's subparsers."""
    status = sub.add_parser("status", help="show each pool's mode, K, load and last decision")
    status.add_argument("name", nargs="?", help="one resource (default: all in the namespace or cluster)")
    status.add_argument("-n", "--namespace", help="namespace (default: all namespaces; 'default' with NAME)")
    status.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then KUBECONFIG)")
    status.add_argument("-w", "--watch", action="store_true", help="keep showing changes until Ctrl-C")
    status.add_argument("--interval", type=float, default=2.0, help="seconds between reads with --watch")
    status.set_defaults(func=_cmd_status)


def _cmd_status(args: argparse.Namespace) -> int:
    import os

    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        fetch = make_fetch(args.kubeconfig or os.environ.get("KUBECONFIG"), args.namespace, args.name)
        return run_status(fetch, watch=args.watch, interval=args.interval)
    except ApiException as err:
        what = f"{args.name!r}" if args.name else "SpeculativeDeployments"
        print(f"error: cannot read {what}: {err.status} {err.reason}", file=sys.stderr)
        return 1
    except (HTTPError, OSError) as err:
        print(f"error: cannot reach the cluster: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # kubeconfig problems raise the client's own ConfigException
        if type(err).__name__ == "ConfigException":
            print(f"error: no usable cluster credentials: {err}", file=sys.stderr)
            return 1
        raise
