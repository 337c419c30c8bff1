"""The `specfleet` command: its parser and the commands without a module of their own. `simulate` and
`plan` live in simulate.py, `status` in status.py, the measurement behind `profile` in profile.py; the
sandbox is its own program (specfleet_sandbox), started in this process's place."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specfleet import __version__
from specfleet.api.crd import crd_yaml
from specfleet.api.validation import InvalidResourceError, parse_resource
from specfleet.cli.common import (
    CommandParser,
    CredentialsError,
    InputError,
    cluster_client,
    describe_subcommands,
    load_documents,
    shown,
    write_output,
)
from specfleet.cli.local_models import architecture_of
from specfleet.cli.simulate import add_parsers as add_simulation_parsers
from specfleet.cli.status import add_parser as add_status_parser
from specfleet.controller.logs import configure_json_logging
from specfleet.policy.predict.kv_cache import DEFAULT_MAX_NUM_SEQS
from specfleet.reconcile import decided_plan
from specfleet.reconcile.desired import spec_problems
from specfleet.render import RenderOptions, render_children
from specfleet.render.common import to_yaml


def _cmd_crd(args: argparse.Namespace) -> int:
    return write_output(args.output, crd_yaml())


def _cmd_render(args: argparse.Namespace) -> int:
    try:
        documents = load_documents(args.filename)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if not documents:
        print(
            f"error: {shown(args.filename)} holds no resources (it is empty or only comments)",
            file=sys.stderr,
        )
        return 1
    options = RenderOptions(monitoring_labels=tuple(args.monitoring_label or ()))
    if args.router_image:
        options = RenderOptions(router_image=args.router_image, monitoring_labels=options.monitoring_labels)
    rendered: list[dict[str, Any]] = []
    failed = False
    for number, doc in enumerate(documents, 1):
        if not isinstance(doc, dict):
            kind = type(doc).__name__
            print(
                f"error: {shown(args.filename)}: document {number} is a {kind}, not a mapping",
                file=sys.stderr,
            )
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
        unrunnable = spec_problems(sd.spec, architecture_of)
        if unrunnable is not None:
            print(f'error: SpeculativeDeployment "{name}" cannot work:', file=sys.stderr)
            for problem in unrunnable.problems:
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

    from specfleet.controller.handlers import OperatorConfig, build_registry
    from specfleet.observe.prometheus import PrometheusAuth

    if args.kubeconfig:
        # Kopf logs in through the Kubernetes client library, which reads this variable.
        os.environ["KUBECONFIG"] = args.kubeconfig
    config = OperatorConfig(
        kubeconfig=args.kubeconfig or os.environ.get("KUBECONFIG"),
        resync_seconds=args.resync_seconds,
        router_image=args.router_image or RenderOptions().router_image,
        monitoring_labels=tuple(args.monitoring_label or ()),
        max_workers=args.max_workers,
        resync_workers=args.resync_workers,
        engine_address_map=tuple(args.engine_address_map or ()),
        operator_namespace=os.environ.get("POD_NAMESPACE") or None,
        prometheus_auth=PrometheusAuth(
            ca_file=args.prometheus_ca_file,
            insecure_skip_verify=args.prometheus_insecure_skip_verify,
            bearer_token_file=args.prometheus_bearer_token_file,
            basic_auth_file=args.prometheus_basic_auth_file,
        ),
    )
    # Kopf would log the failed login as a traceback and retry it forever: check the credentials first.
    try:
        api_client = cluster_client(config.kubeconfig)
    except CredentialsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
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
    from specfleet.controller.kube import KubeLease
    from specfleet.controller.leader import LeaderElector, run_as_leader

    lease = KubeLease(api_client, args.leader_election_namespace, args.leader_election_name)
    identity = args.identity or f"{socket.gethostname()}-{os.getpid()}"
    elector = LeaderElector(lease, lease.name, lease.namespace, identity)
    return run_as_leader(elector, run_kopf)


def _run_sandbox(argv: list[str]) -> int:
    # The sandbox is a local harness above the operator (it runs one), not part of the operator image:
    # its own program (`python -m specfleet_sandbox`, `specfleet-sandbox`) replaces this process, so the
    # operator never imports it (.importlinter forbids it).
    if importlib.util.find_spec("specfleet_sandbox") is None:
        print(
            "error: specfleet_sandbox is not installed (it ships with the source, not the image)",
            file=sys.stderr,
        )
        return 1
    os.execv(sys.executable, [sys.executable, "-m", "specfleet_sandbox", *argv])


def _cmd_profile(args: argparse.Namespace) -> int:
    from specfleet.cli.profile import ProfileError, config_map, measure, profile_document

    if args.job:
        return _profile_job(args)
    if args.publish:
        return _profile_publish(args)
    missing = [
        flag for flag, value in (("--vllm-python", args.vllm_python), ("--model", args.model)) if not value
    ]
    if missing:
        print(f"error: {' and '.join(missing)} required (or --job / --publish)", file=sys.stderr)
        return 2
    options = _measure_options(args)
    try:
        profile, doc = measure(args.vllm_python, options, timeout_seconds=args.timeout_seconds)
    except ProfileError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    text = profile_document(profile, doc.get("measuredWith"))
    if args.config_map:
        text = to_yaml([config_map(args.config_map, args.namespace, text)])
    return write_output(args.output, text)


def _profile_job(args: argparse.Namespace) -> int:
    """Print the Job (and its RBAC and script) that measures on a GPU node and fills the ConfigMap."""
    from specfleet.cli.profile import profile_job
    from specfleet.render import RenderOptions

    if not (args.config_map and args.namespace and args.model):
        print("error: --job needs --config-map, --namespace and --model", file=sys.stderr)
        return 2
    manifests = profile_job(
        args.job,
        args.namespace,
        args.config_map,
        _measure_options(args),
        vllm_image=args.vllm_image,
        specfleet_image=args.specfleet_image or RenderOptions().router_image,
        gpus=args.gpus,
    )
    return write_output(args.output, to_yaml(manifests))


def _profile_publish(args: argparse.Namespace) -> int:
    """Check a measurement's output and apply it as the profile ConfigMap (the Job's second step)."""
    from specfleet.cli.profile import ProfileError, config_map, parse_output, profile_document
    from specfleet.controller.kube import KubeCluster
    from specfleet.reconcile import ApplyRejectedError

    if not (args.config_map and args.namespace):
        print("error: --publish needs --config-map and --namespace", file=sys.stderr)
        return 2
    try:
        profile, doc = parse_output(Path(args.publish).read_text(encoding="utf-8"))
    except OSError as err:
        print(f"error: cannot read {args.publish}: {err.strerror or err}", file=sys.stderr)
        return 1
    except ProfileError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    manifest = config_map(args.config_map, args.namespace, profile_document(profile, doc.get("measuredWith")))
    try:
        KubeCluster(cluster_client(args.kubeconfig)).apply(manifest)
    except CredentialsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except ApplyRejectedError as err:
        print(
            f"error: the cluster refused configmap/{args.config_map} in {args.namespace}: {err}",
            file=sys.stderr,
        )
        return 1
    print(f"configmap/{args.config_map} in {args.namespace}: profile {profile.name} applied")
    return 0


def _measure_options(args: argparse.Namespace) -> list[str]:
    """The measurement script's options from `specfleet profile`'s."""
    options = ["--model", args.model, "--method", args.method, "--name", args.name]
    options += ["--ks", args.ks, "--batch-sizes", args.batch_sizes, "--tokens", str(args.tokens)]
    options += ["--max-num-seqs", str(args.max_num_seqs)]
    options += ["--repeats", str(args.repeats), "--load-format", args.load_format]
    options += ["--engine-args", args.engine_args]
    if args.max_model_len:
        options += ["--max-model-len", str(args.max_model_len)]
    if args.drafter:
        options += ["--drafter", args.drafter]
    if args.dtype:
        options += ["--dtype", args.dtype]
    if args.enforce_eager:
        options.append("--enforce-eager")
    return options


# What `specfleet --help` says: for users, so it names what each command does, not where its code lives.
DESCRIPTION = """\
specfleet runs vLLM fleets with speculative decoding on Kubernetes and turns speculation on or off per
pool as load changes. Print the CRD, render what a SpeculativeDeployment produces, run the operator,
show status, simulate and plan a fleet, measure a cost profile, or try it all in a local sandbox."""


def installed_version() -> str:
    """The installed package's version (its metadata), or the source tree's when run uninstalled."""
    try:
        return importlib.metadata.version("specfleet")
    except importlib.metadata.PackageNotFoundError:
        return __version__


def _cmd_version(_: argparse.Namespace) -> int:
    print(installed_version())
    return 0


def _address_map(text: str) -> tuple[Any, Any]:
    """An `--engine-address-map FROM=TO` argument (two networks of one size)."""
    from specfleet_runtime.router.endpoints import parse_address_map

    try:
        return parse_address_map(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _label(text: str) -> tuple[str, str]:
    """A `--monitoring-label KEY=VALUE` argument."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _add_monitoring_label_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--monitoring-label",
        metavar="KEY=VALUE",
        type=_label,
        action="append",
        help="label every PodMonitor and PrometheusRule (repeatable; a resource's monitoring.labels win), "
        "e.g. release=kube-prometheus-stack for that chart's Prometheus",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="specfleet", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"specfleet {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    crd = sub.add_parser("crd", help="print (or write) the CustomResourceDefinition")
    crd.add_argument("-o", "--output", help="write to this file instead of stdout")
    crd.set_defaults(func=_cmd_crd)

    render = sub.add_parser("render", help="print the manifests a SpeculativeDeployment produces")
    render.add_argument("-f", "--filename", required=True, help="YAML file with one or more resources, or -")
    render.add_argument("--router-image", help="router image (default: the operator's own)")
    _add_monitoring_label_flag(render)
    render.set_defaults(func=_cmd_render)

    run = sub.add_parser("run", help="run the operator")
    run.add_argument(
        "-n",
        "--namespace",
        action="append",
        help="watch this namespace (repeatable; default: all namespaces)",
    )
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then KUBECONFIG)")
    run.add_argument(
        "--resync-seconds", type=float, default=30.0, help="seconds between drift-correction resyncs"
    )
    run.add_argument("--router-image", help="router image (default: the operator's own)")
    run.add_argument("--max-workers", type=int, default=16, help="reconciles of changes that may run at once")
    run.add_argument("--resync-workers", type=int, default=2, help="periodic resyncs that may run at once")
    run.add_argument("--liveness-port", type=int, default=8080, help="0 disables the liveness endpoint")
    run.add_argument("--liveness-address", default="0.0.0.0", help="address the liveness endpoint listens on")
    run.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port; 0 disables")
    run.add_argument(
        "--engine-address-map",
        metavar="FROM=TO",
        type=_address_map,
        action="append",
        help="dial engine pod IPs in FROM at the same host bits in TO, for Standby flips (repeatable; "
        "a test bed whose pod IPs are not routable: 10.0.0.0/8=127.0.0.0/8)",
    )
    run.add_argument("--metrics-address", default="0.0.0.0", help="address the metrics endpoint listens on")
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
    _add_monitoring_label_flag(run)
    run.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    run.set_defaults(func=_cmd_run)

    add_status_parser(sub)

    # Listed here for `specfleet --help`; `main` hands its arguments (--help included) to the sandbox's parser.
    sub.add_parser(
        "sandbox",
        help="local sandbox: control plane, Prometheus, operator, router, emulated engines, load",
        add_help=False,
    )

    profile = sub.add_parser(
        "profile",
        help="measure a cost profile (step times by batch size x K, KV cache without and with the drafter) with vLLM",
    )
    profile.add_argument("--vllm-python", help="python of a vLLM installation (venv or image)")
    profile.add_argument("--model", help="target model (HF id or local folder)")
    profile.add_argument("--method", default="eagle3", help="vLLM speculative method")
    profile.add_argument("--drafter", help="drafter model (eagle3, eagle, draft_model, medusa)")
    profile.add_argument("--ks", default="0,1,3,5", help="K values, comma-separated, 0 first")
    profile.add_argument(
        "--batch-sizes", default="1,8,32,64,128,256", help="batch sizes to measure, comma-separated"
    )
    profile.add_argument(
        "--max-num-seqs",
        type=int,
        default=DEFAULT_MAX_NUM_SEQS,
        help="the serving engines' --max-num-seqs (engine.maxNumSeqs; unset there: "
        f"{DEFAULT_MAX_NUM_SEQS}): measured too, as the largest batch, so the profile covers every batch "
        "they run",
    )
    profile.add_argument("--tokens", type=int, default=32, help="decode steps of the short run")
    profile.add_argument("--repeats", type=int, default=3, help="measurements per point (median)")
    profile.add_argument("--load-format", default="dummy", help="'dummy' (random weights) or 'auto'")
    profile.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    profile.add_argument("--dtype", help="model dtype (default: the model's)")
    profile.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs / torch.compile")
    profile.add_argument("--engine-args", default="{}", help="more vllm.LLM keyword arguments, as JSON")
    profile.add_argument("--name", default="measured", help="profile name")
    profile.add_argument(
        "--timeout-seconds", type=float, default=3600, help="give up the measurement after this long"
    )
    profile.add_argument("--config-map", help="print a ConfigMap of this name holding the profile")
    profile.add_argument("-n", "--namespace", help="namespace of the ConfigMap")
    profile.add_argument("-o", "--output", help="write to this file instead of stdout")
    profile.add_argument(
        "--job",
        metavar="NAME",
        help="print a Job (with its ServiceAccount, Role and script) that measures on a GPU node and "
        "applies the --config-map, instead of measuring here",
    )
    profile.add_argument(
        "--vllm-image", default="vllm/vllm-openai:v0.32.0", help="--job: the measuring image"
    )
    profile.add_argument("--specfleet-image", help="--job: specfleet's image (default: this version's)")
    profile.add_argument("--gpus", type=int, default=1, help="--job: GPUs of the measuring container")
    profile.add_argument(
        "--publish",
        metavar="FILE",
        help="(the Job's second step) check a measurement's output in FILE and apply it as --config-map",
    )
    profile.add_argument("--kubeconfig", help="--publish: kubeconfig (default: in-cluster)")
    profile.set_defaults(func=_cmd_profile)

    add_simulation_parsers(sub)

    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=_cmd_version)
    describe_subcommands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sandbox"]:
        return _run_sandbox(argv[1:])
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
