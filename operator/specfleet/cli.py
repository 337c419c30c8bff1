"""`specfleet`: print the CRD, render manifests, run the operator, print the version."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from specfleet import __version__
from specfleet.api.semantics import find_problems
from specfleet.api.validation import InvalidResourceError, parse_resource
from specfleet.crd import crd_yaml
from specfleet.reconcile import decided_canaries, decided_ks, decided_modes
from specfleet.render import RenderOptions, render_children
from specfleet.render.common import to_yaml


def _cmd_crd(args: argparse.Namespace) -> int:
    text = crd_yaml()
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _load_documents(path: str) -> list[Any]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def _cmd_render(args: argparse.Namespace) -> int:
    try:
        documents = _load_documents(args.filename)
    except (OSError, yaml.YAMLError) as err:
        print(f"error: cannot read {args.filename}: {err}", file=sys.stderr)
        return 1
    options = RenderOptions(router_image=args.router_image) if args.router_image else RenderOptions()
    rendered: list[dict[str, Any]] = []
    failed = False
    for doc in documents:
        if not isinstance(doc, dict):
            print("error: a document is not a mapping", file=sys.stderr)
            failed = True
            continue
        name = (doc.get("metadata") or {}).get("name", "?")
        try:
            sd = parse_resource(doc)
        except InvalidResourceError as err:
            print(f'error: SpeculativeDeployment "{name}" is invalid:', file=sys.stderr)
            for message in err.messages:
                print(f"  * {message}", file=sys.stderr)
            failed = True
            continue
        problems = find_problems(sd.spec)
        if problems:
            print(f'error: SpeculativeDeployment "{name}" cannot work:', file=sys.stderr)
            for problem in problems:
                print(f"  * {problem}", file=sys.stderr)
            failed = True
            continue
        rendered += render_children(sd, decided_modes(sd), options, decided_ks(sd), decided_canaries(sd))
    if failed:
        return 1
    sys.stdout.write(to_yaml(rendered))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    if args.resync_seconds is not None:
        os.environ["SPECFLEET_RESYNC_SECONDS"] = str(args.resync_seconds)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format='{"time":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","message":"%(message)s"}',
    )
    # Imported here: the handlers module reads its settings from the environment at import.
    import kopf
    from prometheus_client import start_http_server

    import specfleet.handlers  # noqa: F401  (registers the handlers)

    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_address)
    namespaces = args.namespace or []
    kopf.run(
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=f"http://{args.liveness_address}:{args.liveness_port}/healthz"
        if args.liveness_port
        else None,
        standalone=True,
    )
    return 0


def _cmd_version(_: argparse.Namespace) -> int:
    print(__version__)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specfleet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    crd = sub.add_parser("crd", help="print (or write) the CustomResourceDefinition")
    crd.add_argument("-o", "--output", help="write to this file instead of stdout")
    crd.set_defaults(func=_cmd_crd)

    render = sub.add_parser("render", help="print the manifests a SpeculativeDeployment produces")
    render.add_argument("-f", "--filename", required=True, help="YAML file with one or more resources, or -")
    render.add_argument("--router-image", help="router image (default: the operator's own)")
    render.set_defaults(func=_cmd_render)

    run = sub.add_parser("run", help="run the operator")
    run.add_argument(
        "-n",
        "--namespace",
        action="append",
        help="watch this namespace (repeatable; default: all namespaces)",
    )
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then KUBECONFIG)")
    run.add_argument("--resync-seconds", type=float, help="drift-correction timer interval (default 30)")
    run.add_argument("--liveness-port", type=int, default=8080, help="0 disables the liveness endpoint")
    run.add_argument("--liveness-address", default="0.0.0.0")
    run.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port; 0 disables")
    run.add_argument("--metrics-address", default="0.0.0.0")
    run.add_argument("-v", "--verbose", action="store_true")
    run.set_defaults(func=_cmd_run)

    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=_cmd_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
