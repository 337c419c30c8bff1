"""The Controller's loops over the in-memory cluster and a scripted Prometheus: flips, holds, restarts."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta

import pytest

from specfleet.api.status import SpeculativeDeploymentStatus
from specfleet.api.validation import parse_status
from specfleet.controller.control import Controller
from specfleet.policy.decision.status_writes import MEASUREMENT_WRITE_EVALUATIONS, shown_numbers_differ
from specfleet.render import RenderOptions
from support.fake_cluster import FakeCluster
from support.fake_prometheus import FakePrometheus
from support.manifests import CLASSIC_THRESHOLDS, two_pool_example

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
KEY = ("SpeculativeDeployment", "default", "llama")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def world():
    cluster = FakeCluster()
    doc = two_pool_example(
        {
            # The controller's plumbing, with the simplest rule to script.
            "mode": "Threshold",
            "thresholds": CLASSIC_THRESHOLDS,
            "evaluationIntervalSeconds": 5,
            "windowSeconds": 30,
            "minDwellSeconds": 60,
            "cooldownSeconds": 60,
        }
    )
    cluster.objects[KEY] = doc
    prom = FakePrometheus("default", "llama", 30)
    clock = Clock()
    controller = Controller(cluster, RenderOptions(), lambda url, timeout: prom, clock=clock)
    return cluster, prom, clock, controller


def _status(cluster):
    return cluster.objects[KEY]["status"]


def _rolled_out(cluster, controller):
    """Reconcile, let the fake cluster finish every rollout, and reconcile what it reports."""
    controller.reconcile_object("default", "llama")
    cluster.roll_out()
    controller.reconcile_object("default", "llama")


def _latency_args(cluster):
    deploy = cluster.objects[("Deployment", "default", "llama-latency")]
    return deploy["spec"]["template"]["spec"]["containers"][0]["args"]


def _conditions(cluster):
    return {c["type"]: c for c in _status(cluster)["conditions"]}


def test_reconcile_writes_status_once(world):
    cluster, _, clock, controller = world
    first = controller.reconcile_object("default", "llama")
    assert first.status_written
    cluster.roll_out()
    controller.reconcile_object("default", "llama")
    cluster.writes.clear()
    clock.advance(30)
    again = controller.reconcile_object("default", "llama")
    assert not again.status_written
    assert cluster.writes == []


def test_high_load_flips_off_then_holds_then_back_on(world):
    cluster, prom, clock, controller = world
    _rolled_out(cluster, controller)
    assert "--speculative-config" in _latency_args(cluster)

    prom.set_pool("latency", drafts=10.0, accepted=14.0, per_pos=[8.0, 4.0, 2.0], running=80.0)
    outcome = controller.evaluate_policy("default", "llama")
    assert [d.flip for d in outcome.decisions] == [True]
    assert outcome.next_seconds == 5
    assert "--speculative-config" not in _latency_args(cluster)
    status = _status(cluster)
    assert status["pools"]["latency"]["speculation"] == "Off"
    assert status["pools"]["latency"]["reason"] == "ConcurrencyAboveThreshold"
    assert status["history"][-1]["from"] == "On"
    assert status["history"][-1]["observations"]["runningPerReplica"] == "80"
    assert any(e.reason == "SpeculationOff" and "80" in e.message for e in outcome.events)

    # Load falls at once, but the rollout is unfinished and then the dwell holds.
    prom.set_pool("latency", drafts=0.0, accepted=0.0, running=2.0)
    clock.advance(5)
    assert controller.evaluate_policy("default", "llama").decisions[0].reason == "RolloutInProgress"
    cluster.roll_out()
    controller.reconcile_object("default", "llama")
    clock.advance(5)
    assert controller.evaluate_policy("default", "llama").decisions[0].reason == "MinDwell"
    clock.advance(60)
    back = controller.evaluate_policy("default", "llama")
    assert back.decisions[0].flip
    assert back.decisions[0].reason == "ConditionsRecovered"
    assert back.decisions[0].observations["reentryAcceptanceSource"] == "lastMeasured"
    assert "--speculative-config" in _latency_args(cluster)
    assert len(_status(cluster)["history"]) == 2


def test_a_flips_history_entry_gains_what_followed_once_its_rollout_settled_and_a_window_passed(world):
    cluster, prom, clock, controller = world
    _rolled_out(cluster, controller)
    prom.set_pool("latency", drafts=10.0, accepted=14.0, per_pos=[8.0, 4.0, 2.0], running=80.0, gen=100.0)
    assert controller.evaluate_policy("default", "llama").decisions[0].flip
    prom.set_pool("latency", drafts=0.0, accepted=0.0, running=70.0, gen=130.0)
    clock.advance(5)
    controller.evaluate_policy("default", "llama")  # still rolling out
    assert "realized" not in _status(cluster)["history"][-1]
    cluster.roll_out()
    controller.reconcile_object("default", "llama")
    clock.advance(5)
    controller.evaluate_policy("default", "llama")  # sees the pool settled: the window starts
    settled = _status(cluster)["pools"]["latency"]["rollout"]["settledTime"]
    clock.advance(25)
    controller.evaluate_policy("default", "llama")
    assert "realized" not in _status(cluster)["history"][-1]  # 25 s of a 30 s window
    clock.advance(5)
    controller.evaluate_policy("default", "llama")
    realized = _status(cluster)["history"][-1]["realized"]
    assert realized == {
        "time": "2026-11-29T12:00:40Z",
        "tokensPerSecondPerReplicaBefore": "50",
        "tokensPerSecondPerReplicaAfter": "65",
        "runningPerReplicaBefore": "80",
        "runningPerReplicaAfter": "70",
        "realizedSpeedup": "1.300",
    }
    assert settled == "2026-11-29T12:00:10Z"
    prom.set_pool("latency", drafts=0.0, accepted=0.0, running=70.0, gen=200.0)
    clock.advance(5)
    controller.evaluate_policy("default", "llama")
    assert _status(cluster)["history"][-1]["realized"] == realized  # told once


@pytest.mark.parametrize(
    ("running", "why"),
    [
        (None, ""),
        (float("nan"), " (running_per_replica sample rejected: value nan is not a finite number)"),
        (float("inf"), " (running_per_replica sample rejected: value inf is not a finite number)"),
        (-1000.0, " (running_per_replica sample rejected: negative value -1000)"),
    ],
)
def test_an_off_pool_without_a_measured_load_holds_and_never_reads_it_as_idle(world, running, why):
    cluster, prom, clock, controller = world
    _rolled_out(cluster, controller)
    prom.set_pool("latency", drafts=10.0, accepted=14.0, per_pos=[8.0, 4.0, 2.0], running=80.0)
    assert controller.evaluate_policy("default", "llama").decisions[0].target == "Off"
    cluster.roll_out()
    controller.reconcile_object("default", "llama")
    clock.advance(120)  # past dwell and cooldown: 2 running per replica would turn it back on
    prom.set_pool("latency", drafts=0.0, accepted=0.0, running=running)

    outcome = controller.evaluate_policy("default", "llama")

    decision = outcome.decisions[0]
    assert (decision.flip, decision.target, decision.reason) == (False, "Off", "MetricsUnavailable")
    assert decision.message == f"no running-request count for pool latency in Prometheus{why}"
    assert _status(cluster)["pools"]["latency"]["speculation"] == "Off"
    condition = _conditions(cluster)["MetricsAvailable"]
    assert condition["status"] == "False"
    assert decision.message in condition["message"]
    assert len(_status(cluster)["history"]) == 1


def test_prometheus_down_holds_and_reports(world):
    cluster, prom, clock, controller = world
    controller.reconcile_object("default", "llama")
    prom.set_pool("latency", running=99.0)
    prom.down = True
    outcome = controller.evaluate_policy("default", "llama")
    assert [d.flip for d in outcome.decisions] == [False]
    cond = _conditions(cluster)["MetricsAvailable"]
    assert cond["status"] == "False"
    assert "Prometheus query failed" in cond["message"]
    assert [e.reason for e in outcome.events] == ["MetricsUnavailable"]
    clock.advance(5)
    assert controller.evaluate_policy("default", "llama").events == []  # no event storm
    prom.down = False
    cluster.roll_out()
    controller.reconcile_object("default", "llama")
    clock.advance(5)
    recovered = controller.evaluate_policy("default", "llama")
    assert _conditions(cluster)["MetricsAvailable"]["status"] == "True"
    assert recovered.decisions[0].flip


def test_restart_between_decision_and_rollout_end_does_not_flip_again(world):
    cluster, prom, clock, controller = world
    _rolled_out(cluster, controller)
    prom.set_pool("latency", drafts=10.0, accepted=20.0, per_pos=[8.0, 7.0, 5.0], running=80.0)
    assert controller.evaluate_policy("default", "llama").decisions[0].reason == "ConcurrencyAboveThreshold"
    # Load falls right after the decision, so the numbers would ask to flip back.
    prom.set_pool("latency", drafts=0.0, accepted=0.0, running=2.0)
    # A new operator process: fresh Controller, same cluster and status.
    restarted = Controller(cluster, RenderOptions(), lambda url, timeout: prom, clock=clock)
    cluster.writes.clear()
    restarted.reconcile_object("default", "llama")
    assert [w for w in cluster.writes if not w.endswith("/status")] == []
    clock.advance(5)
    held = restarted.evaluate_policy("default", "llama")
    assert (held.decisions[0].flip, held.decisions[0].reason) == (False, "RolloutInProgress")
    assert len(_status(cluster)["history"]) == 1


def test_pinned_pools_are_not_evaluated(world):
    cluster, prom, _, controller = world
    controller.reconcile_object("default", "llama")
    prom.set_pool("latency", running=1.0)
    # The batch pool (pinned Off) has stale data: it must not hold the Auto pool.
    prom.set_pool("batch", age=600.0)
    outcome = controller.evaluate_policy("default", "llama")
    assert [d.pool for d in outcome.decisions] == ["latency"]
    assert _conditions(cluster)["MetricsAvailable"]["status"] == "True"


def test_slo_attainment_is_written_for_a_pool_with_an_slo_and_not_for_one_without(world):
    cluster, prom, clock, controller = world
    # On the batch pool, pinned Off: attainment is measured whatever the pool's speculation setting.
    slo = {"timeToFirstTokenMilliseconds": 300, "timePerOutputTokenMilliseconds": 50}
    cluster.objects[KEY]["spec"]["pools"]["batch"]["slo"] = slo
    _rolled_out(cluster, controller)
    histograms = {
        "ttft_buckets": {"0.1": 2.0, "0.5": 6.0, "+Inf": 10.0},
        "tpot_buckets": {"0.025": 1.0, "0.05": 8.0, "+Inf": 10.0},
    }
    prom.set_pool("latency", running=1.0, **histograms)
    prom.set_pool("batch", running=1.0, **histograms)
    controller.evaluate_policy("default", "llama")
    pools = _status(cluster)["pools"]
    batch = {k: v for k, v in pools["batch"].items() if k.endswith("AttainmentPercent")}
    # TTFT 300 ms: 2 + (6 - 2) / 2 of 10 requests; TPOT 50 ms: 8 of 10; the SLO: the smaller.
    assert batch == {
        "ttftAttainmentPercent": "40.0",
        "tpotAttainmentPercent": "80.0",
        "sloAttainmentPercent": "40.0",
    }
    assert not [k for k in pools["latency"] if k.endswith("AttainmentPercent")]
    # An SLO taken away takes its attainment with it (at the next write).
    del cluster.objects[KEY]["spec"]["pools"]["batch"]["slo"]
    clock.advance(60)
    controller.evaluate_policy("default", "llama")
    assert not [k for k in _status(cluster)["pools"]["batch"] if k.endswith("AttainmentPercent")]


def test_degraded_resource_is_not_evaluated(world):
    cluster, prom, _, controller = world
    cluster.objects[KEY]["spec"]["engine"] = {"image": "vllm/vllm-openai:v0.6.0"}
    outcome = controller.evaluate_policy("default", "llama")
    assert outcome.decisions == []
    assert prom.queries == []


def test_deleted_resource_is_a_no_op(world):
    cluster, _, _, controller = world
    del cluster.objects[KEY]
    assert controller.reconcile_object("default", "llama").applied == []
    assert controller.evaluate_policy("default", "llama").decisions == []


def test_goodput_retune_rolls_out_the_chosen_k(world):
    cluster, prom, _, controller = world
    cluster.objects[KEY]["spec"]["policy"]["mode"] = "Goodput"
    cluster.objects[KEY]["spec"]["policy"]["goodput"] = {"engineSchedule": False}
    _rolled_out(cluster, controller)
    prom.set_pool("latency", drafts=10.0, accepted=12.7, per_pos=[6.8, 3.9, 2.0], running=128.0)
    outcome = controller.evaluate_policy("default", "llama")
    assert [(d.reason, d.target_k) for d in outcome.decisions] == [("GoodputRetune", 1)]
    args = _latency_args(cluster)
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config["num_speculative_tokens"] == 1
    status = _status(cluster)
    assert status["pools"]["latency"]["numSpeculativeTokens"] == 1
    assert status["history"][-1]["observations"]["numSpeculativeTokens"] == "3->1"
    assert any(e.reason == "SpeculationRetuned" for e in outcome.events)


def test_goodput_gives_a_speculating_pool_a_dynamic_sd_schedule(world):
    """With engineSchedule (here forced on; unset it needs an image naming vLLM >= 0.32), the same
    load past K 3's best gives the pool a schedule (K per batch size inside the engine) instead of a
    lower K: K stays the drafter's, and the rendered --speculative-config carries the schedule."""
    cluster, prom, _, controller = world
    cluster.objects[KEY]["spec"]["policy"]["mode"] = "Goodput"
    cluster.objects[KEY]["spec"]["policy"]["goodput"] = {"engineSchedule": True}
    _rolled_out(cluster, controller)
    prom.set_pool(
        "latency", drafts=10.0, draft_tokens=30.0, accepted=12.7, per_pos=[6.8, 3.9, 2.0], running=128.0
    )
    outcome = controller.evaluate_policy("default", "llama")
    assert [d.reason for d in outcome.decisions] == ["GoodputRetune"]
    schedule = outcome.decisions[0].target_schedule
    assert schedule is not None
    assert schedule[0][:1] == (1,)
    assert schedule[0][2] == 3
    args = _latency_args(cluster)
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config["num_speculative_tokens"] == 3
    assert config["num_speculative_tokens_per_batch_size"] == [list(row) for row in schedule]
    assert [k for _, _, k in schedule] == [3, 1, 0]
    status = _status(cluster)
    assert status["pools"]["latency"]["dynamicSchedule"][0] == {
        "minBatchSize": 1,
        "maxBatchSize": schedule[0][1],
        "numSpeculativeTokens": 3,
    }
    assert "dynamicSchedule" in status["history"][-1]["observations"]
    assert any(e.reason == "SpeculationRetuned" and "schedule" in e.message for e in outcome.events)
    # The same measurement again: the schedule is the one it runs, nothing changes.
    cluster.roll_out()
    controller.reconcile_object("default", "llama")
    again = controller.evaluate_policy("default", "llama")
    assert not any(d.changes for d in again.decisions)


def _until_baseline(cluster, clock, controller):
    """Evaluate until the acceptance baseline is set (policy/rules/drift.py): setting it is a write."""
    for _ in range(200):
        if _status(cluster)["pools"]["latency"].get("acceptanceBaseline"):
            return
        clock.advance(5)
        controller.evaluate_policy("default", "llama")
    raise AssertionError("no acceptance baseline after 1000 s")


def test_the_same_measurement_again_writes_nothing(world):
    cluster, prom, clock, controller = world
    _rolled_out(cluster, controller)
    prom.set_pool("latency", drafts=10.0, accepted=14.0, per_pos=[0.8, 0.4, 0.2], running=4.0)
    assert controller.evaluate_policy("default", "llama").status_written
    _until_baseline(cluster, clock, controller)
    before = copy.deepcopy(_status(cluster))
    # Flat load for well past the measurement write period and the acceptance refresh period: the
    # trend samples and refreshed times stay in the operator's memory, status is not written.
    for _ in range(80):
        clock.advance(5)
        assert not controller.evaluate_policy("default", "llama").status_written
    assert _status(cluster) == before


def test_new_numbers_are_written_a_few_evaluations_after_the_last_write(world):
    cluster, prom, clock, controller = world
    _rolled_out(cluster, controller)
    prom.set_pool("latency", drafts=10.0, accepted=14.0, per_pos=[0.8, 0.4, 0.2], running=4.0)
    assert controller.evaluate_policy("default", "llama").status_written
    measured = _status(cluster)["pools"]["latency"]["acceptanceMeasuredAt"]
    prom.set_pool("latency", drafts=10.0, accepted=15.0, per_pos=[0.8, 0.5, 0.2], running=6.0)
    written = []
    for _ in range(MEASUREMENT_WRITE_EVALUATIONS):
        clock.advance(5)
        written.append(controller.evaluate_policy("default", "llama").status_written)
    # Written once MEASUREMENT_WRITE_EVALUATIONS intervals (5 s each) have passed since the last write.
    assert written == [False] * (MEASUREMENT_WRITE_EVALUATIONS - 1) + [True]
    pool = _status(cluster)["pools"]["latency"]
    assert (pool["acceptanceLength"], pool["runningPerReplica"]) == ("2.50", "6")
    assert pool["acceptanceMeasuredAt"] != measured
    # The trend samples of the evaluations that wrote nothing were kept and are written along.
    assert [v.partition("=")[2] for v in pool["recentLoad"]] == ["4"] + ["6"] * MEASUREMENT_WRITE_EVALUATIONS
    # And the served tokens' samples (the arrivals' trend), one per evaluation beside each load's.
    assert [v.partition("=")[0] for v in pool["recentTokensPerSecond"]] == [
        v.partition("=")[0] for v in pool["recentLoad"]
    ]


def test_a_restarted_operator_starts_from_the_written_measurements(world):
    cluster, prom, clock, controller = world
    _rolled_out(cluster, controller)
    prom.set_pool("latency", drafts=10.0, accepted=14.0, per_pos=[0.8, 0.4, 0.2], running=4.0)
    controller.evaluate_policy("default", "llama")
    for _ in range(3):
        clock.advance(5)
        controller.evaluate_policy("default", "llama")
    restarted = Controller(cluster, RenderOptions(), lambda url, timeout: prom, clock=clock)
    prom.set_pool("latency", drafts=10.0, accepted=14.0, per_pos=[0.8, 0.4, 0.2], running=9.0)
    clock.advance(5)
    # No memory of when measurements were last written: a changed number is written at once.
    assert restarted.evaluate_policy("default", "llama").status_written
    loads = [v.partition("=")[2] for v in _status(cluster)["pools"]["latency"]["recentLoad"]]
    assert loads == ["4", "9"]  # the unwritten samples of the old process are gone, nothing else


def test_a_jitter_in_the_last_digits_is_not_written(world):
    cluster, prom, clock, controller = world
    _rolled_out(cluster, controller)
    prom.set_pool("latency", drafts=10.0, accepted=14.0, per_pos=[0.8, 0.4, 0.2], running=40.0)
    controller.evaluate_policy("default", "llama")
    _until_baseline(cluster, clock, controller)
    # Rates over a window move a little from one evaluation to the next: 41 running, 2.41 accepted.
    prom.set_pool("latency", drafts=10.0, accepted=14.1, per_pos=[0.81, 0.4, 0.2], running=41.0)
    for _ in range(3 * MEASUREMENT_WRITE_EVALUATIONS):
        clock.advance(5)
        before = copy.deepcopy(_status(cluster))
        if controller.evaluate_policy("default", "llama").status_written:
            after = _status(cluster)
            raise AssertionError({k: (before[k], after[k]) for k in after if before.get(k) != after[k]})
    assert _status(cluster)["pools"]["latency"]["runningPerReplica"] == "40"


def test_an_slo_attainment_moves_by_points_not_by_a_fraction_of_itself():
    # 95 against 99.5 decides whether a 99% objective holds: a 5% fraction of itself would hide it.
    def attaining(percent: str) -> SpeculativeDeploymentStatus:
        return parse_status({"pools": {"latency": {"sloAttainmentPercent": percent}}})

    assert shown_numbers_differ(attaining("99.5"), attaining("95.0"))
    assert not shown_numbers_differ(attaining("99.5"), attaining("99.2"))


# A profile under which drafting never pays: every K costs three times a plain step.
SLOW_DRAFTER_PROFILE = """name: slow-drafter
batchSizes: [1, 64, 256]
numSpeculativeTokens: [0, 1, 3]
stepTimeMs:
- [6.0, 18.0, 30.0]
- [8.0, 24.0, 40.0]
- [15.0, 45.0, 75.0]
"""


def _profile_config_map(text: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"namespace": "default", "name": "h200-profile"},
        "data": {"profile.yaml": text},
    }


def _goodput_with_profile(cluster, prom, controller):
    cluster.objects[KEY]["spec"]["policy"]["mode"] = "Goodput"
    cluster.objects[KEY]["spec"]["policy"]["goodput"] = {"costProfileConfigMap": "h200-profile"}
    _rolled_out(cluster, controller)
    # Low load, published acceptance: the default profile predicts about 1.5x (stay On).
    prom.set_pool("latency", drafts=10.0, accepted=12.7, per_pos=[6.8, 3.9, 2.0], running=8.0)


def test_the_policy_decides_with_the_profile_in_the_named_config_map(world):
    cluster, prom, _, controller = world
    cluster.objects[("ConfigMap", "default", "h200-profile")] = _profile_config_map(SLOW_DRAFTER_PROFILE)
    _goodput_with_profile(cluster, prom, controller)
    outcome = controller.evaluate_policy("default", "llama")
    assert [(d.flip, d.reason) for d in outcome.decisions] == [(True, "GoodputBelowBreakEven")]
    assert "--speculative-config" not in _latency_args(cluster)
    cond = _conditions(cluster)["CostProfileLoaded"]
    assert (cond["status"], cond["reason"]) == ("True", "ProfileFromConfigMap")
    assert "h200-profile" in cond["message"]


def test_the_default_profile_keeps_the_same_pool_on(world):
    """The control for the test above: same numbers, no ConfigMap named, no flip, no new condition."""
    cluster, prom, _, controller = world
    _goodput_with_profile(cluster, prom, controller)
    del cluster.objects[KEY]["spec"]["policy"]["goodput"]
    outcome = controller.evaluate_policy("default", "llama")
    assert [d.flip for d in outcome.decisions] == [False]
    assert "CostProfileLoaded" not in _conditions(cluster)


@pytest.mark.parametrize(
    ("config_map", "message"),
    [
        (None, "ConfigMap default/h200-profile (policy.goodput.costProfileConfigMap) does not exist"),
        (_profile_config_map("batchSizes: [1, 64\n"), "profile.yaml is not YAML"),
        (_profile_config_map("batchSizes: [1]\n"), "invalid profile: profile lacks 'numSpeculativeTokens'"),
        (
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "h200-profile"},
                "data": {"x": "1"},
            },
            "has no key 'profile.yaml' (keys: x)",
        ),
    ],
)
def test_a_missing_or_malformed_profile_config_map_holds_and_says_why(world, config_map, message):
    cluster, prom, clock, controller = world
    if config_map is not None:
        cluster.objects[("ConfigMap", "default", "h200-profile")] = config_map
    _goodput_with_profile(cluster, prom, controller)
    prom.set_pool("latency", drafts=10.0, accepted=10.5, per_pos=[0.5, 0.0, 0.0], running=200.0)
    outcome = controller.evaluate_policy("default", "llama")
    assert [(d.flip, d.reason) for d in outcome.decisions] == [(False, "CostProfileUnavailable")]
    assert message in outcome.decisions[0].message
    assert "--speculative-config" in _latency_args(cluster)
    cond = _conditions(cluster)["CostProfileLoaded"]
    assert cond["status"] == "False"
    assert cond["reason"] == "CostProfileUnavailable"
    assert message in cond["message"]
    assert [e.reason for e in outcome.events] == ["CostProfileUnavailable"]
    clock.advance(5)
    assert controller.evaluate_policy("default", "llama").events == []  # one Warning, not one per evaluation
    # Fixed: the next evaluation uses it.
    cluster.objects[("ConfigMap", "default", "h200-profile")] = _profile_config_map(SLOW_DRAFTER_PROFILE)
    clock.advance(5)
    fixed = controller.evaluate_policy("default", "llama")
    assert fixed.decisions[0].flip
    assert _conditions(cluster)["CostProfileLoaded"]["status"] == "True"


def _standby(cluster):
    doc = cluster.objects[KEY]
    doc["spec"]["pools"]["latency"]["rollout"] = {"flip": "Standby", "standbyHostMemory": "20Gi"}
    doc["metadata"]["generation"] = 2
    return doc


def test_a_standby_switch_that_failed_makes_the_pool_flip_by_restart(world):
    from specfleet.api.validation import parse_resource
    from specfleet.controller.standby_flips import Tick

    cluster, _, _, controller = world
    _rolled_out(cluster, controller)
    sd = parse_resource(_standby(cluster))
    _rolled_out(cluster, controller)
    template = cluster.objects[("Deployment", "default", "llama-latency")]["spec"]["template"]
    assert template["metadata"]["labels"]["specfleet.io/flip"] == "Standby"
    outcome = controller.record_standby(
        sd, "latency", Tick(reverted=[("llama-latency-0", "POST /sleep answered 404")])
    )
    (event,) = [e for e in outcome.events if e.reason == "StandbyUnavailable"]
    assert event.type == "Warning"
    assert "llama-latency-0" in event.message
    assert "POST /sleep answered 404" in event.message
    standby = _status(cluster)["pools"]["latency"]["standby"]
    assert standby["available"] is False
    assert standby["observedGeneration"] == 2
    # From then on the pool renders one engine per pod and flips by restart.
    _rolled_out(cluster, controller)
    template = cluster.objects[("Deployment", "default", "llama-latency")]["spec"]["template"]
    assert "specfleet.io/flip" not in template["metadata"]["labels"]
    assert _conditions(cluster)["Degraded"]["reason"] == "StandbyUnavailable"


def test_a_finished_standby_flip_is_an_event_and_refreshes_status(world):
    from specfleet.api.validation import parse_resource
    from specfleet.controller.standby_flips import Tick

    cluster, _, _, controller = world
    sd = parse_resource(_standby(cluster))
    outcome = controller.record_standby(
        sd, "latency", Tick(finished=[("llama-latency-0", 4.25)], switched=[2.4], settled=True)
    )
    (event,) = [e for e in outcome.events if e.reason == "StandbyFlipped"]
    assert event.message == "latency: pod llama-latency-0 serves speculation On after 4.2 s"
    assert outcome.status_written
    # What the policy prices the pool's next flip with: one replica's switch, measured (the drain is
    # the load's, estimated at each flip).
    assert _status(cluster)["pools"]["latency"]["standbyFlipSeconds"] == 2


def test_a_standby_pool_is_settled_only_once_its_pods_serve_the_decided_mode(world):
    from specfleet.api.validation import parse_resource
    from specfleet.render import owner_labels

    cluster, _, _, controller = world
    _standby(cluster)
    cluster.objects[KEY]["spec"]["pools"]["latency"]["speculation"] = "On"
    _rolled_out(cluster, controller)
    # The pods start serving without the drafter (label Off): the pool's flip to On is not done.
    labels = {**owner_labels(parse_resource(cluster.objects[KEY])), "specfleet.io/pool": "latency"}
    labels["specfleet.io/speculation"] = "Off"
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    for i in range(2):
        name = f"llama-latency-{i}"
        meta = {"name": name, "namespace": "default", "labels": dict(labels)}
        cluster.objects[("Pod", "default", name)] = {"kind": "Pod", "metadata": meta, "status": ready}
    controller.reconcile_object("default", "llama")
    assert _status(cluster)["pools"]["latency"]["settled"] is False
    for i in range(2):
        cluster.objects[("Pod", "default", f"llama-latency-{i}")]["metadata"]["labels"][
            "specfleet.io/speculation"
        ] = "On"
    controller.reconcile_object("default", "llama")
    assert _status(cluster)["pools"]["latency"]["settled"] is True


def test_engines_vllm_cannot_start_make_the_resource_degraded_with_nothing_created(world):
    # Llama-3.1-70B in BF16 on one H100 given 60% of it: 141 GB of weights for 51.3 GB.
    cluster, _, _, controller = world
    doc = cluster.objects[KEY]
    doc["spec"]["model"]["name"] = "meta-llama/Llama-3.1-70B-Instruct"
    doc["spec"]["engine"] = {
        "gpuMemoryUtilizationPercent": 60,
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    }
    outcome = controller.reconcile_object("default", "llama")
    degraded = _conditions(cluster)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "InsufficientGPUMemory")
    assert "No available memory for the cache blocks" in degraded["message"]
    assert degraded["message"].endswith("troubleshooting/#insufficientgpumemory)")
    assert [e.reason for e in outcome.events] == ["Degraded"]
    assert not [key for key in cluster.objects if key[0] == "Deployment"]
