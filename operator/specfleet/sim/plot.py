"""A PNG timeline of a comparison: load, each pool's mode and K under the policy, tokens/s vs the oracle.

matplotlib is an optional dependency (`pip install specfleet[plot]`); it is imported only here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specfleet.sim.accounts import load_per_replica
from specfleet.sim.compare import Comparison
from specfleet.sim.options import POOLS


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def plot_timeline(comparison: Comparison, path: str | Path, title: str = "") -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - depends on the environment
        raise PlotUnavailableError("--plot needs matplotlib: pip install 'specfleet[plot]'") from None
    policy = comparison.runs["policy"]
    width = comparison.bin_seconds
    t = np.array([row["t"] for row in policy.timeline]) / 60
    active = [p for p in POOLS if policy.bin_request_seconds[p].sum() > 0] or [POOLS[0]]
    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    load_ax, mode_ax, tps_ax, ratio_ax = axes
    for pool in active:
        load_ax.plot(t, load_per_replica(policy, pool), label=f"{pool}: requests per replica (policy run)")
        k = [row[pool]["k"] if row[pool]["mode"] == "On" else 0 for row in policy.timeline]
        mode_ax.step(t, k, where="post", label=f"{pool}: K (0 = speculation off)")
    load_ax.set_ylabel("in system / replica")
    load_ax.legend(loc="upper right", fontsize=8)
    for c in policy.changes:
        mode_ax.axvline(c.time / 60, color="grey", linestyle=":", linewidth=0.8)
    mode_ax.set_ylabel("policy: K")
    mode_ax.set_ylim(
        -0.3, max(comparison.runs["policy"].strategy.k or 0, *(c.to_k or 0 for c in policy.changes), 3) + 0.5
    )
    mode_ax.legend(loc="upper right", fontsize=8)
    n = len(t)
    for name, style in (("policy", "-"), ("perLevelOracle", "--"), ("bestStatic", ":"), ("alwaysOff", "-.")):
        tokens, _ = comparison._bins(name)
        label = name if name != "bestStatic" else f"bestStatic ({comparison.best_static})"
        tps_ax.plot(t, np.asarray(tokens[:n]) / width, style, label=label, linewidth=1)
    tps_ax.set_ylabel("tokens/s (fleet)")
    tps_ax.legend(loc="upper right", fontsize=8)
    for name in ("policy", "bestStatic", "alwaysOff", "engineDynamicSD"):
        ratio = comparison.bin_ratio(name)[:n]
        label = name if name != "bestStatic" else f"bestStatic ({comparison.best_static})"
        ratio_ax.plot(t, ratio, label=label, linewidth=1)
    ratio_ax.axhline(0.95, color="grey", linestyle=":", linewidth=0.8)
    ratio_ax.set_ylabel("tokens per request-s\n/ per-level oracle")
    ratio_ax.set_xlabel("minutes")
    ratio_ax.legend(loc="lower right", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
