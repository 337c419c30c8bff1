"""`specfleet`: print the CRD, render manifests, run the operator, measure a profile, print the version."""

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


def _cmd_profile(args: argparse.Namespace) -> int:
    from specfleet.profiling import ProfileError, config_map, measure, profile_document

    options = ["--model", args.model, "--method", args.method, "--name", args.name]
    options += ["--ks", args.ks, "--batch-sizes", args.batch_sizes, "--tokens", str(args.tokens)]
    options += ["--repeats", str(args.repeats), "--load-format", args.load_format]
    options += ["--max-model-len", str(args.max_model_len), "--engine-args", args.engine_args]
    if args.drafter:
        options += ["--drafter", args.drafter]
    if args.dtype:
        options += ["--dtype", args.dtype]
    if args.enforce_eager:
        options.append("--enforce-eager")
    try:
        profile, doc = measure(args.vllm_python, options, timeout_seconds=args.timeout_seconds)
    except ProfileError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    text = profile_document(profile, doc.get("measuredWith"))
    if args.config_map:
        text = to_yaml([config_map(args.config_map, args.namespace, text)])
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
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

    profile = sub.add_parser(
        "profile",
        help="measure a step-time profile (batch sizes x K) with vLLM and print it in the policy's format",
    )
    profile.add_argument("--vllm-python", required=True, help="python of a vLLM installation (venv or image)")
    profile.add_argument("--model", required=True, help="target model (HF id or local folder)")
    profile.add_argument("--method", default="eagle3", help="vLLM speculative method (default eagle3)")
    profile.add_argument("--drafter", help="drafter model (eagle3, eagle, draft_model, medusa)")
    profile.add_argument("--ks", default="0,1,3,5", help="K values, comma-separated, 0 first")
    profile.add_argument("--batch-sizes", default="1,8,32,64,128,256", help="comma-separated")
    profile.add_argument("--tokens", type=int, default=32, help="decode steps of the short run")
    profile.add_argument("--repeats", type=int, default=3, help="measurements per point (median)")
    profile.add_argument("--load-format", default="dummy", help="'dummy' (random weights) or 'auto'")
    profile.add_argument("--max-model-len", type=int, default=1024)
    profile.add_argument("--dtype", help="model dtype (default: the model's)")
    profile.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs / torch.compile")
    profile.add_argument("--engine-args", default="{}", help="more vllm.LLM keyword arguments, as JSON")
    profile.add_argument("--name", default="measured", help="profile name")
    profile.add_argument("--timeout-seconds", type=float, default=3600)
    profile.add_argument("--config-map", help="print a ConfigMap of this name holding the profile")
    profile.add_argument("-n", "--namespace", help="namespace of the ConfigMap")
    profile.add_argument("-o", "--output", help="write to this file instead of stdout")
    profile.set_defaults(func=_cmd_profile)

    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=_cmd_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
