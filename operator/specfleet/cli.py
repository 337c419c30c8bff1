"""`specfleet`: print the CRD, render manifests, run the operator, show status, run the sandbox, print the version."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from specfleet import __version__
from specfleet.api.semantics import find_problems
from specfleet.api.validation import InvalidResourceError, parse_resource
from specfleet.crd import crd_yaml
from specfleet.logs import configure_json_logging
from specfleet.reconcile import decided_plan
from specfleet.render import RenderOptions, render_children
from specfleet.render.common import to_yaml
from specfleet.status_cli import add_parser as add_status_parser


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
        rendered += render_children(sd, decided_plan(sd), options)
    if failed:
        return 1
    sys.stdout.write(to_yaml(rendered))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    configure_json_logging(logging.DEBUG if args.verbose else logging.INFO)
    # Imported here: the other commands need neither Kopf nor a Kubernetes client.
    import kopf
    from prometheus_client import start_http_server

    from specfleet.handlers import OperatorConfig, build_registry
    from specfleet.metrics.prometheus import PrometheusAuth

    if args.kubeconfig:
        # Kopf logs in through the Kubernetes client library, which reads this variable.
        os.environ["KUBECONFIG"] = args.kubeconfig
    config = OperatorConfig(
        kubeconfig=args.kubeconfig or os.environ.get("KUBECONFIG"),
        resync_seconds=args.resync_seconds,
        router_image=args.router_image or RenderOptions().router_image,
        max_workers=args.max_workers,
        resync_workers=args.resync_workers,
        prometheus_auth=PrometheusAuth(
            ca_file=args.prometheus_ca_file,
            insecure_skip_verify=args.prometheus_insecure_skip_verify,
            bearer_token_file=args.prometheus_bearer_token_file,
            basic_auth_file=args.prometheus_basic_auth_file,
        ),
    )
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_address)
    namespaces = args.namespace or []

    def run_kopf() -> None:
        kopf.run(
            registry=build_registry(config),
            memo=kopf.Memo(config=config),
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=f"http://{args.liveness_address}:{args.liveness_port}/healthz"
            if args.liveness_port
            else None,
            standalone=True,
        )

    if not args.leader_election_namespace:
        run_kopf()
        return 0
    from specfleet.kube import KubeLease, load_kube_config
    from specfleet.leader import LeaderElector, run_as_leader

    lease = KubeLease(
        load_kube_config(config.kubeconfig), args.leader_election_namespace, args.leader_election_name
    )
    identity = args.identity or f"{socket.gethostname()}-{os.getpid()}"
    elector = LeaderElector(lease, lease.name, lease.namespace, identity)
    return run_as_leader(elector, run_kopf)


def _cmd_sandbox(args: argparse.Namespace) -> int:
    # The sandbox is a local harness (test bed, emulated engines, load), not part of the operator image.
    from specfleet_sandbox.cli import main as sandbox_main

    return sandbox_main(args.sandbox_args)


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
    run.add_argument("--resync-seconds", type=float, default=30.0, help="drift-correction timer interval")
    run.add_argument("--router-image", help="router image (default: the operator's own)")
    run.add_argument("--max-workers", type=int, default=16, help="reconciles of changes that may run at once")
    run.add_argument("--resync-workers", type=int, default=2, help="periodic resyncs that may run at once")
    run.add_argument("--liveness-port", type=int, default=8080, help="0 disables the liveness endpoint")
    run.add_argument("--liveness-address", default="0.0.0.0")
    run.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port; 0 disables")
    run.add_argument("--metrics-address", default="0.0.0.0")
    run.add_argument(
        "--leader-election-namespace",
        help="hold a Lease in this namespace so that of several replicas exactly one runs (default: off)",
    )
    run.add_argument("--leader-election-name", default="specfleet-operator", help="the Lease's name")
    run.add_argument("--identity", help="this replica's name in the Lease (default: hostname-pid)")
    run.add_argument("--prometheus-ca-file", help="CA bundle that signs Prometheus' certificate")
    run.add_argument(
        "--prometheus-insecure-skip-verify",
        action="store_true",
        help="do not verify Prometheus' TLS certificate (verification is on by default)",
    )
    run.add_argument("--prometheus-bearer-token-file", help="send this file's token to Prometheus")
    run.add_argument("--prometheus-basic-auth-file", help="file with one line 'username:password'")
    run.add_argument("-v", "--verbose", action="store_true")
    run.set_defaults(func=_cmd_run)

    add_status_parser(sub)

    sandbox = sub.add_parser(
        "sandbox",
        help="local sandbox: control plane, Prometheus, operator, router, emulated engines, load",
        add_help=False,
    )
    sandbox.add_argument("sandbox_args", nargs=argparse.REMAINDER)
    sandbox.set_defaults(func=_cmd_sandbox)

    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=_cmd_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
