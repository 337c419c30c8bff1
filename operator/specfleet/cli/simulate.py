"""`specfleet simulate` and `specfleet plan`: read a resource, a trace and a profile, run the fleet
simulator, print its comparison (a table or JSON) or the plan derived from it (YAML or JSON)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

from specfleet.api.validation import InvalidResourceError, parse_resource
from specfleet.cli.common import InputError, load_documents, shown
from specfleet.cli.local_models import architecture_of
from specfleet.cli.progress import TerminalProgress
from specfleet.reconcile.desired import spec_problems


class _UsageError(Exception):
    """Bad input to a command: printed as one `error:` line, never a traceback."""


def _load_one_resource(path: str) -> Any:
    """The first SpeculativeDeployment in a file, validated as the apiserver and operator would."""
    try:
        documents = load_documents(path)
    except InputError as err:
        raise _UsageError(str(err)) from None
    if not documents:
        raise _UsageError(f"{shown(path)} holds no resources (it is empty or only comments)")
    docs = [d for d in documents if isinstance(d, dict) and d.get("kind") == "SpeculativeDeployment"]
    if not docs:
        kinds = sorted({str(d.get("kind")) for d in documents if isinstance(d, dict)})
        found = f" (found kind {', '.join(kinds)})" if kinds else ""
        raise _UsageError(f"{shown(path)} holds no SpeculativeDeployment{found}")
    try:
        sd = parse_resource(docs[0])
    except InvalidResourceError as err:
        raise _UsageError("the SpeculativeDeployment is invalid: " + "; ".join(err.messages)) from None
    unrunnable = spec_problems(sd.spec, architecture_of)
    if unrunnable is not None:
        raise _UsageError("the SpeculativeDeployment cannot work: " + "; ".join(unrunnable.problems))
    return sd


def _profile_file(path: str) -> Any:
    """A profile file, or the ConfigMap holding one (as `specfleet profile --config-map` writes it):
    the same parsing the operator applies to `costProfileConfigMap`."""
    from specfleet.policy.inputs.profile_source import profile_from_config_map
    from specfleet_runtime.cost_profile import load_profile

    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
        meta = doc.get("metadata") or {}
        return profile_from_config_map(
            doc, str(meta.get("namespace", "default")), str(meta.get("name", path))
        )
    return load_profile(path)


def _simulation_inputs(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    from specfleet.sim.fleet import SimOptions, simulated_engines_that_cannot_start
    from specfleet.sim.workload import WorkloadError, parse_acceptance, read_trace
    from specfleet_runtime.cost_profile import default_profile

    sd = _load_one_resource(args.filename)
    try:
        acceptance = parse_acceptance(args.acceptance)
        trace = read_trace(args.trace, time_scale=args.time_scale)
    except WorkloadError as err:
        raise _UsageError(str(err)) from None
    try:
        profile = _profile_file(args.profile) if args.profile else default_profile(sd.spec.drafter.method)
    except (OSError, ValueError, yaml.YAMLError) as err:
        raise _UsageError(f"cannot use cost profile {args.profile}: {err}") from None
    named = sd.spec.policy.goodput.cost_profile_config_map
    if named and not args.profile:
        print(
            f"note: the resource decides with ConfigMap {named} (costProfileConfigMap); pass its YAML "
            "with --profile to simulate with it: this run uses the published profile of its drafter method",
            file=sys.stderr,
        )
    for name in ("startup_seconds", "scrape_interval"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise _UsageError(f"--{name.replace('_', '-')} must be > 0")
    if not 0 <= args.k0_penalty < 10:
        raise _UsageError("--k0-penalty must be within [0, 10)")
    for name in ("prefill_ms_per_token", "drafter_prefill_fraction"):
        value = getattr(args, name)
        if value is not None and not value >= 0:
            raise _UsageError(f"--{name.replace('_', '-')} must be >= 0")
    # The profile's own figures reach the simulated engines unless an option overrides them.
    options = SimOptions(
        seed=args.seed,
        acceptance=acceptance,
        startup_seconds=args.startup_seconds,
        scrape_interval=args.scrape_interval,
        k0_penalty=args.k0_penalty,
        prefill_ms_per_token=args.prefill_ms_per_token,
        drafter_prefill_fraction=args.drafter_prefill_fraction,
    )
    cannot_start = simulated_engines_that_cannot_start(sd.spec, options, profile)
    if cannot_start:
        raise _UsageError("the simulated engines cannot start: " + "; ".join(cannot_start))
    return sd, trace, options, profile


def _progress() -> TerminalProgress | contextlib.nullcontext[None]:
    """A progress line on stderr while simulating, when stderr is a terminal."""
    return TerminalProgress(sys.stderr, "simulating") if sys.stderr.isatty() else contextlib.nullcontext()


def _num(value: Any, fmt: str = "") -> str:
    """A table cell: `-` where the simulation has no value (a pool without requests)."""
    return "-" if value is None else format(value, fmt)


def _simulation_table(doc: dict[str, Any]) -> str:
    width = max(16, *(len(name) for name in doc["results"]))
    lines = [
        f"{'strategy':<{width}} {'tokens/s':>10} {'tok/req-s':>10} {'x oracle':>9} {'worst min':>9} "
        f"{'flips':>5} {'retunes':>7} {'GPU-s':>9}"
    ]
    for name, r in doc["results"].items():
        setting = f" ({r['setting']})" if "setting" in r else ""
        lines.append(
            f"{name:<{width}} {r['tokensPerSecond']:>10.1f} {_num(r['tokensPerRequestSecond'], '.2f'):>10} "
            f"{_num(r['ratioToPerLevelOracle'], '.3f'):>9} {_num(r['worstMinuteRatioToPerLevelOracle'], '.3f'):>9} "
            f"{r['flips']:>5} {r['retunes']:>7} {_num(r.get('gpuSeconds'), '.0f'):>9}{setting}"
        )
    policy = doc["results"]["policy"]
    lines.append("")
    lines.append("policy, per pool:")
    for pool, p in policy["pools"].items():
        lines.append(
            f"  {pool:<8} {p['tokensPerSecond']:>9.1f} tokens/s  {p['requests']} requests ({p['rejected']} rejected)  "
            f"TTFT p50/p99 {_num(p['ttftP50Seconds'])}/{_num(p['ttftP99Seconds'])} s  TPOT p50/p99 "
            f"{_num(p['tpotP50Seconds'])}/{_num(p['tpotP99Seconds'])} s  {p['gpuSeconds']:.0f} GPU-s"
        )
    for change in policy.get("changes", []):
        lines.append(
            f"  t={change['timeSeconds']:>7.0f}s {change['pool']:<8} {change['kind']:<6} "
            f"{change['from']} -> {change['to']} ({change['reason']})"
        )
    lines += _slo_lines(doc.get("sloAttainment", {}))
    lines.append("")
    lines += textwrap.wrap(
        "x oracle: generated tokens per request-second relative to the per-level oracle's (1.000 = as good "
        "as the best static setting per evaluation window, in hindsight); worst min: the same ratio in the "
        "worst minute; tok/req-s: generated tokens per request-second (over the time requests spend in the "
        "fleet). "
        "rolloutPayingOracle: the best hindsight schedule of static settings that pays each change's surge "
        "rollout (simulated).",
        width=100,
    )
    return "\n".join(lines) + "\n"


def _slo_attainment(sd: Any, comparison: Any) -> dict[str, Any]:
    """Per pool with an SLO: the share of its requests that met both targets in each strategy's run
    and in the SLO's per-level oracle (`specfleet.sim.slo`)."""
    from specfleet.api.constants import POOLS
    from specfleet.sim.compare import SMOOTH
    from specfleet.sim.slo import Targets, attainment, oracle_attainment

    out: dict[str, Any] = {}
    statics = [n for n, r in comparison.runs.items() if r.strategy.kind == "static"]
    for pool in POOLS:
        slo = getattr(sd.spec.pools, pool).slo
        if slo is None:
            continue
        targets = Targets.of(slo)
        shares = {name: attainment(run, pool, targets) for name, run in comparison.runs.items()}
        shares["perLevelOracle"] = oracle_attainment(
            comparison.runs, statics, pool, targets, SMOOTH
        ).attainment
        out[pool] = {
            "targets": targets.text(),
            "percentile": slo.percentile,
            "byStrategy": {name: None if v is None else round(v, 4) for name, v in shares.items()},
        }
    return out


def _slo_lines(slo: dict[str, Any]) -> list[str]:
    lines = []
    for pool, entry in slo.items():
        shares = "  ".join(f"{name} {_num(v, '.3f')}" for name, v in entry["byStrategy"].items())
        lines += ["", f"SLO attainment, {pool} ({entry['targets']}, promised to {entry['percentile']}%):"]
        lines += textwrap.wrap(shares, width=100, initial_indent="  ", subsequent_indent="  ")
    return lines


def _compared(args: argparse.Namespace) -> tuple[Any, ...] | None:
    """The inputs of `simulate`/`plan` and their comparison; None (after saying why) on bad input."""
    from specfleet.sim.compare import compare

    try:
        sd, trace, options, profile = _simulation_inputs(args)
    except _UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return None
    with _progress() as progress:
        comparison = compare(sd, trace, options, profile, progress=progress)
    return sd, trace, options, profile, comparison


def _cmd_simulate(args: argparse.Namespace) -> int:
    compared = _compared(args)
    if compared is None:
        return 1
    sd, trace, options, _, comparison = compared
    comparison.extra.update(
        {
            "trace": trace.name,
            "requests": len(trace.requests),
            "acceptance": list(options.acceptance),
            "seed": args.seed,
        }
    )
    doc = comparison.to_json()
    slo = _slo_attainment(sd, comparison)
    if slo:
        doc["sloAttainment"] = slo
    if args.plot:
        from specfleet.sim.plot import PlotUnavailableError, plot_timeline

        try:
            plot_timeline(comparison, args.plot, title=f"{sd.name}: {trace.name}")
        except (PlotUnavailableError, OSError) as err:
            print(f"error: cannot write {args.plot}: {err}", file=sys.stderr)
            return 1
    if args.output == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(_simulation_table(doc))
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from specfleet.sim.plan import plan

    compared = _compared(args)
    if compared is None:
        return 1
    sd, trace, options, profile, comparison = compared
    n = len(trace.requests)
    lengths = (
        (sum(r.prompt_tokens for r in trace.requests) / n, sum(r.output_tokens for r in trace.requests) / n)
        if n
        else None
    )
    doc = plan(sd, comparison, profile, options.acceptance, lengths, options.resolved(sd.spec).startup)
    if args.output == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
    return 0


def _add_simulation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", required=True, help="YAML file with a SpeculativeDeployment")
    parser.add_argument(
        "--trace", required=True, help="CSV trace: TIMESTAMP,ContextTokens,GeneratedTokens[,tenant,pool,...]"
    )
    parser.add_argument(
        "--acceptance",
        default="published",
        help="drafter acceptance: published, weak, strong, or per-position values like 0.7;0.4;0.2",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same result)")
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="divide arrival times by this (2 = twice the rate)"
    )
    parser.add_argument(
        "--profile",
        help="step-time profile file, or the ConfigMap holding one (default: the published H100 Llama-3.1-8B one for the resource's drafter method)",
    )
    parser.add_argument(
        "--startup-seconds",
        type=float,
        default=None,
        help="seconds an engine takes to start (default: estimated from the model's size and tensor "
        "parallel size, see docs/policy.md)",
    )
    parser.add_argument(
        "--scrape-interval", type=float, default=15.0, help="Prometheus scrape interval, seconds"
    )
    parser.add_argument(
        "--k0-penalty",
        type=float,
        default=0.10,
        help="step-time penalty of K=0 in a speculating engine, as a fraction",
    )
    parser.add_argument(
        "--prefill-ms-per-token",
        type=float,
        default=None,
        help="the target's prefill per prompt token, ms (default: the profile's prefillMsPerToken)",
    )
    parser.add_argument(
        "--drafter-prefill-fraction",
        type=float,
        default=None,
        help="the drafter's prefill as a share of the target's (default: the profile's drafterPrefillFraction)",
    )


def add_parsers(sub: Any) -> None:
    """Register `specfleet simulate` and `specfleet plan` on the CLI's subparsers."""
    simulate = sub.add_parser(
        "simulate", help="replay a trace through a simulated fleet: the policy against baselines and oracles"
    )
    _add_simulation_arguments(simulate)
    simulate.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format")
    simulate.add_argument("--plot", help="write a PNG timeline to this file")
    simulate.set_defaults(func=_cmd_simulate)

    plan_cmd = sub.add_parser("plan", help="recommend speculation settings for a workload (simulated)")
    _add_simulation_arguments(plan_cmd)
    plan_cmd.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="output format")
    plan_cmd.set_defaults(func=_cmd_plan)
