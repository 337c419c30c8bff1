"""The sandbox's SpeculativeDeployment: examples/02-two-pools-routing-policy.yaml, adapted to a laptop.

What changes and why (everything else is the example as a user would apply it, Goodput mode and its
margin included):
- one replica per pool, no canaries, `maxNumSeqs` 64: each engine is a local emulator process;
- no node selector, model cache volume or HF token: the test bed's fake GPU nodes need none;
- Prometheus is the sandbox's own;
- policy timings shortened about 10x (evaluate every 2 s over 10 s windows, 30 s dwell, 10 s
  cooldown) so a flip and its way back fit in minutes;
- `policy.goodput.costProfileConfigMap` names the profile the sandbox measured on its own engines
  before applying this (specfleet_sandbox.profiling): they play a device whose verification turns
  compute-bound at a few dozen running requests, so the break-even the policy predicts from the
  measurement lies within the load two cores can drive, where the published H100 profile's lies
  beyond the engines' 64-request cap.

No pool flips by Standby here, and that is measured, not overlooked. A Standby flip must repay its
dip: (gain - 1) x dwell > one replica's flip seconds, whatever the replica count (`policy.rules.dip`).
The emulators sleep and wake 10x slower like the rest of the device they play, so one replica's flip
measures 18 s idle and 35-48 s under the surge (the drain), against the 30 s dwell: a gain above
1.6 to 2.6. Tried on 2026-12-07 (two-replica pools; a single-replica Standby pool flips only while
idle): the latency pool's content shift retunes to K 1 first (1.10x), leaving Off too little; the
batch pool with a static K under an 80-stream surge did flip Off by Standby (1.67x predicted against
1.60; 84 s to settle), then stayed Off through the calm (1.60x needed more than 2.13x).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from specfleet_sandbox.profiling import PROFILE_CONFIG_MAP

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "02-two-pools-routing-policy.yaml"
DEFAULT_NAMESPACE = "sandbox"
SERVED_MODEL = "llama-3.1-8b"


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def sandbox_fleet(namespace: str, prometheus_url: str) -> dict[str, Any]:
    """The resource the sandbox applies."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    engine = doc["spec"]["engine"]
    for key in ("nodeSelector", "modelCache", "hfTokenSecretRef"):
        engine.pop(key, None)
    return _merge(
        doc,
        {
            "metadata": {"namespace": namespace},
            "spec": {
                "engine": {"maxNumSeqs": 64},
                "pools": {
                    "latency": {"replicas": 1},
                    "batch": {"replicas": 1, "engine": {"maxNumSeqs": 64}},
                },
                "routing": {"router": {"replicas": 1}},
                "policy": {
                    "prometheus": {"url": prometheus_url, "timeoutSeconds": 2},
                    "evaluationIntervalSeconds": 2,
                    "windowSeconds": 10,
                    "goodput": {"costProfileConfigMap": PROFILE_CONFIG_MAP},
                    "minDwellSeconds": 30,
                    "cooldownSeconds": 10,
                    "maxFlipsPerHour": 20,
                    "reentry": {"canaryReplicas": 0},
                },
                "monitoring": {"podMonitor": False},
            },
        },
    )
