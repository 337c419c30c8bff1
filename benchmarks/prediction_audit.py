"""Is the prediction or the simulator wrong? The policy's predicted gain against the gain delivered.

    python benchmarks/prediction_audit.py [--scenario azure-code] [--drafter weak] [--pool latency]

Runs the fleet simulator (`specfleet.sim`) on one of benchmarks/policy.py's scenarios and drafters
(the policy and every static setting, same seed) and prints, per evaluation window of one pool: the
setting the policy ran, the load, the gain over no drafter its last decision predicted
(`predictedSpeedup`), and the gain the simulated engines delivered: the policy's tokens per
request-second over the alwaysOff run's in the same window, and each static setting's over alwaysOff
(so a setting the policy did not run is measured too). A prediction that stays above what the
engines deliver for the setting it holds is the prediction's error (or the simulator's, where the
engine charges a cost the prediction's formula does not name); the summary line gives both means.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from specfleet.sim.compare import compare
from specfleet.sim.fleet import SimOptions
from specfleet.sim.workload import ACCEPTANCE_PROFILES
from specfleet_runtime.cost_profile import PUBLISHED_H100_LLAMA31_8B_EAGLE

sys.path.insert(0, str(Path(__file__).resolve().parent))
import policy as bench

# Upper ends of the load bands (running requests per replica) the summary groups windows into.
LOAD_BANDS = (2.0, 30.0, 80.0)


def per_request_speed(tokens: np.ndarray, reqsec: np.ndarray) -> np.ndarray:
    """Tokens per request-second per window (NaN where the pool held no request)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(reqsec > 0, tokens / reqsec, np.nan)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", default="azure-code", choices=bench.SCENARIOS)
    parser.add_argument("--drafter", default="weak", choices=bench.DRAFTERS)
    parser.add_argument("--pool", default="latency")
    parser.add_argument("--every", type=int, default=1, help="print every Nth window")
    args = parser.parse_args()

    sd = bench.resource()
    replicas = sd.spec.pools.latency.replicas
    conv = bench.TRACES / "AzureLLMInferenceTrace_conv.csv.gz"
    code = bench.TRACES / "AzureLLMInferenceTrace_code.csv.gz"
    makers = bench.scenario_makers(replicas, conv, code, bench.sizes(conv))
    workload = makers[args.scenario](args.drafter)
    options = SimOptions(seed=0, acceptance=ACCEPTANCE_PROFILES[args.drafter])
    comp = compare(sd, workload, options, PUBLISHED_H100_LLAMA31_8B_EAGLE, only=("policy", "engineDynamicSD"))

    pool = args.pool
    speed = {
        name: per_request_speed(run.bin_tokens[pool], run.bin_request_seconds[pool])
        for name, run in comp.runs.items()
    }
    off = speed["alwaysOff"]
    statics = [n for n in comp.runs if n.startswith("alwaysOnK")] + ["engineDynamicSD"]
    policy = comp.runs["policy"]
    print(f"{args.scenario} / {args.drafter}, pool {pool}, windows of {comp.bin_seconds:.0f} s")
    print(
        f"{'t(min)':>6} {'setting':>12} {'req/rep':>7} {'predicted':>9} {'delivered':>9}  "
        + " ".join(f"{n.replace('alwaysOn', ''):>7}" for n in statics)
        + "  reason"
    )
    predicted_all, delivered_all = [], []
    buckets: dict[str, list[tuple[float, float, float, float]]] = {}
    for i, row in enumerate(policy.timeline):
        state = row[pool]
        setting = f"On/K{state['k']}" if state["mode"] == "On" else state["mode"]
        if state.get("schedule"):
            setting += "s"
        predicted = state.get("predictedSpeedup")
        predicted_value = float(predicted) if predicted not in (None, "") else None
        delivered = speed["policy"][i] / off[i] if off[i] and not np.isnan(off[i]) else float("nan")
        load = float(policy.bin_request_seconds[pool][i]) / comp.bin_seconds / max(1, state["replicas"])
        if predicted_value is not None and state["mode"] == "On" and not np.isnan(delivered):
            predicted_all.append(predicted_value)
            delivered_all.append(delivered)
            band = next(f"<{b:g}" for b in (*LOAD_BANDS, np.inf) if load < b)
            ratios = (comp.bin_ratio("policy")[i], comp.bin_ratio("alwaysOff")[i])
            buckets.setdefault(band, []).append((predicted_value, delivered, *ratios))
        if i % args.every:
            continue
        others = " ".join(f"{speed[n][i] / off[i]:7.3f}" if off[i] else f"{'-':>7}" for n in statics)
        print(
            f"{row['t'] / 60:6.1f} {setting:>12} {load:7.2f} "
            f"{predicted_value if predicted_value is not None else float('nan'):9.3f} {delivered:9.3f}  "
            f"{others}  {state.get('reason', '')}"
        )
    for c in policy.changes:
        print(
            f"change at {c.time / 60:.1f} min: {c.kind} {c.from_mode}/K{c.from_k} -> {c.to_mode}/K{c.to_k}"
            f"{' (schedule)' if c.schedule else ''}: {c.reason} (observed {c.observed_load})"
        )
    if predicted_all:
        print(
            f"windows speculating: {len(predicted_all)}; mean predicted gain {np.mean(predicted_all):.3f}, "
            f"mean delivered {np.nanmean(delivered_all):.3f}"
        )
    total = sum(len(v) for v in buckets.values())
    for band in sorted(buckets, key=lambda b: float(b[1:])):
        rows = np.asarray(buckets[band])
        # What the band costs the time-weighted ratio: its windows' policy-minus-alwaysOff, over all.
        cost = float(np.nansum(rows[:, 2] - rows[:, 3])) / total
        print(
            f"load {band:>5} running/replica: {len(rows):3d} windows, predicted {rows[:, 0].mean():.3f}, "
            f"delivered {np.nanmean(rows[:, 1]):.3f}, share of the time-weighted gap {cost:+.4f}"
        )
    for name in ("policy", "alwaysOff", *statics):
        print(f"{name}: time-weighted {comp.ratio(name):.3f} / all requests {comp.request_ratio(name):.3f}")


if __name__ == "__main__":
    main()
