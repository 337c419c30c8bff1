"""One policy evaluation: the operator writes what `evaluate_policy` returns, and the simulator runs it
too (drift, the cost-profile condition, the measurement times)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from specfleet.api import reasons
from specfleet.api.validation import parse_resource
from specfleet.controller.control import Controller, policy_schedule
from specfleet.policy.decision.evaluation import evaluate_policy
from specfleet.policy.inputs.profile_source import CostProfileError, profile_from_config_map
from specfleet.render import RenderOptions
from specfleet.sim.fleet import SimOptions, simulate
from specfleet.sim.workload import ACCEPTANCE_PROFILES, ClosedLoop
from specfleet_runtime.cost_profile import default_profile
from support.fake_cluster import FakeCluster
from support.fake_prometheus import FakePrometheus
from support.manifests import CLASSIC_THRESHOLDS, ROOT, two_pool_example

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
KEY = ("SpeculativeDeployment", "default", "llama")
RETRAIN = {
    "template": {"spec": {"containers": [{"name": "train", "image": "registry.example/eagle-trainer:1"}]}},
    "periodSeconds": 3600,
}
# A baseline from one window, and drift that counts at once: drift shows within a short run.
QUICK_DRIFT = {"thresholdPercent": 20, "forSeconds": 0, "baselineSamples": 1}


def _resource(profile_config_map: str | None) -> dict[str, Any]:
    policy: dict[str, Any] = {
        "mode": "Threshold",
        "thresholds": CLASSIC_THRESHOLDS,
        "evaluationIntervalSeconds": 5,
        "windowSeconds": 30,
        "minDwellSeconds": 60,
        "cooldownSeconds": 60,
        "acceptanceDrift": QUICK_DRIFT,
    }
    if profile_config_map:
        policy["goodput"] = {"costProfileConfigMap": profile_config_map}
    return two_pool_example(policy)


@pytest.mark.parametrize(
    ("running", "profile_config_map", "flips"),
    [
        (10.0, None, False),  # a hold that measures: baseline, measurements, conditions
        (80.0, None, True),  # a flip: rolled out from the evaluation's status
        (80.0, "missing-profile", False),  # no cost profile: every pool holds, the condition says why
    ],
)
def test_the_operator_writes_what_evaluate_policy_returns(
    running: float, profile_config_map: str | None, flips: bool
) -> None:
    cluster = FakeCluster()
    cluster.objects[KEY] = _resource(profile_config_map)
    prom = FakePrometheus("default", "llama", 30)
    prom.set_pool("latency", drafts=10.0, accepted=14.0, per_pos=[8.0, 4.0, 2.0], running=running)
    controller = Controller(cluster, RenderOptions(), lambda url, timeout: prom, clock=lambda: T0)
    controller.reconcile_object("default", "llama")
    cluster.roll_out()
    controller.reconcile_object("default", "llama")
    now = T0 + timedelta(seconds=5)
    body = cluster.objects[KEY]
    target = policy_schedule(body).target
    assert target is not None
    answers = controller.observe_target(target, ["default"])

    # The same inputs, by hand: the parsed resource, its status, the answers, the profile, the time.
    sd = parse_resource(body)
    profile, problem = default_profile(), None
    if profile_config_map:
        with pytest.raises(CostProfileError) as err:
            profile_from_config_map(None, "default", profile_config_map)
        profile, problem = None, str(err.value)
    expected = evaluate_policy(sd, sd.status, answers, profile, problem, now)

    assert bool(expected.flipped) == flips
    outcome = controller.decide_policy("default", "llama", target, answers, now)
    assert outcome.decisions == expected.decisions
    assert [(e.type, e.reason, e.message) for e in outcome.events[: len(expected.events)]] == expected.events
    written = cluster.objects[KEY]["status"]
    wanted = expected.status.to_wire()
    if flips:
        # Reconcile rolled the flip out from that status: the policy's part is written as evaluated.
        assert written["history"] == wanted["history"]
        assert (
            written["pools"]["latency"]["speculation"] == wanted["pools"]["latency"]["speculation"] == "Off"
        )
        assert {c["type"]: c for c in written["conditions"]}[reasons.ACCEPTANCE_DRIFT] == {
            c["type"]: c for c in wanted["conditions"]
        }[reasons.ACCEPTANCE_DRIFT]
    else:
        assert written == wanted
    assert wanted["pools"]["latency"]["acceptanceBaseline"]
    conditions = {c["type"]: c for c in wanted["conditions"]}
    assert (reasons.COST_PROFILE_LOADED in conditions) == bool(profile_config_map)
    if profile_config_map:
        assert [d.reason for d in expected.decisions] == [reasons.COST_PROFILE_UNAVAILABLE]


def test_the_simulator_tracks_drift_and_asks_for_a_retrain() -> None:
    # A strong drafter's acceptance falls to a weak one's at 5 min: the simulated operator sets its
    # baseline, sees the drift and asks for a retrain Job, as the operator would.
    doc = yaml.safe_load((ROOT / "examples" / "02-two-pools-routing-policy.yaml").read_text())
    doc["spec"]["pools"]["latency"]["replicas"] = 2
    doc["spec"]["pools"]["batch"]["replicas"] = 2
    doc["spec"]["policy"]["acceptanceDrift"] = QUICK_DRIFT
    doc["spec"]["drafter"]["retrain"] = RETRAIN
    load = ClosedLoop(
        points=((0, 2 * 16), (600, 2 * 16)),
        sizes=((200, 300),),
        acceptance_changes=((0.0, ACCEPTANCE_PROFILES["strong"]), (300.0, ACCEPTANCE_PROFILES["weak"])),
    )
    result = simulate(parse_resource(doc), load, options=SimOptions(startup_seconds=30))

    latency = result.status.pools.latency
    assert latency.acceptance_baseline
    assert float(latency.acceptance_drift_percent or 0) > 20
    drift = {c.type: c for c in result.status.conditions}[reasons.ACCEPTANCE_DRIFT]
    assert drift.status == "True"
    assert [t.pool for t in result.retrains] == ["latency"]
    assert result.retrains[0].at >= datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=300)
    assert latency.last_retrain_time is not None
