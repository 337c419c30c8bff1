"""`specfleet status`: read SpeculativeDeployments from any cluster and show each pool's state.

The I/O edge of `status_view` (which is pure): lists or gets the resources through the Kubernetes
API with the usual credentials (in-cluster, else KUBECONFIG), then prints plain lines, or with
`--watch` on a terminal redraws a table in place (rich); without a terminal (CI, a pipe) `--watch`
prints a resource's lines again only when they change.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from specfleet.api.constants import GROUP, KIND, PLURAL, VERSION
from specfleet.cli.common import CredentialsError, cluster_client, credentials_tried
from specfleet.cli.status_view import (
    CHANGES_HEADING,
    POOL_COLUMNS,
    FleetView,
    fleet_view,
    plain_lines,
    pool_cells,
)

Fetch = Callable[[], list[dict[str, Any]]]


def make_fetch(api_client: Any, namespace: str | None, name: str | None) -> Fetch:
    """A function returning the selected resources, sorted by namespace and name."""
    from kubernetes import client as k8s

    api = k8s.CustomObjectsApi(api_client)

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
        if view.changes:
            parts.append(Text(f"  {CHANGES_HEADING}"))
            parts.extend(Text(f"    {c}") for c in view.changes)
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
    # rich comes with the sandbox extra; without it a terminal gets the plain lines a pipe gets.
    terminal = terminal and importlib.util.find_spec("rich") is not None
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


def _root_cause(err: BaseException) -> str:
    """The innermost OS error's words (`connection refused`), else the error's first line."""
    words, seen = "", set()
    chain: BaseException | None = err
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        if isinstance(chain, OSError) and chain.strerror:
            words = chain.strerror
        reason = getattr(chain, "reason", None)  # urllib3's MaxRetryError keeps its cause here
        chain = reason if isinstance(reason, BaseException) else (chain.__cause__ or chain.__context__)
    words = words or (str(err).splitlines() or [type(err).__name__])[0]
    return words[:1].lower() + words[1:]


def _api_error(err: Any, args: argparse.Namespace, server: str) -> str:
    """One line for an error status from the apiserver, with what to do about the common ones."""
    try:
        body = json.loads(err.body or "{}")
    except (TypeError, ValueError):
        body = {}
    body = body if isinstance(body, dict) else {}
    if err.status == 404 and args.name and (body.get("details") or {}).get("name") == args.name:
        return f'{KIND} "{args.name}" not found in namespace "{args.namespace or "default"}"'
    if err.status == 404:
        return (
            f"{server} does not serve {PLURAL}.{GROUP}/{VERSION} (404 Not Found): install the CRD with "
            "`specfleet crd | kubectl apply -f -` (or the Helm chart) and try again"
        )
    what = f'{KIND} "{args.name}"' if args.name else f"{KIND}s"
    detail = body.get("message") or err.reason
    return f"cannot read {what} from {server}: {err.status} {detail}"


def _cmd_status(args: argparse.Namespace) -> int:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG")
    tried = credentials_tried(kubeconfig)
    try:
        api_client = cluster_client(kubeconfig)
    except CredentialsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    server = str(api_client.configuration.host)
    try:
        fetch = make_fetch(api_client, args.namespace, args.name)
        return run_status(fetch, watch=args.watch, interval=args.interval)
    except ApiException as err:
        print(f"error: {_api_error(err, args, server)}", file=sys.stderr)
        return 1
    except (HTTPError, OSError) as err:
        print(
            f"error: cannot connect to {server}: {_root_cause(err)} (credentials from {tried})",
            file=sys.stderr,
        )
        return 1
