"""Acceptance drift: the baseline, the drift, the AcceptanceDrift condition, the retrain Job (pure and wired)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from specfleet.api.status import SpeculativeDeploymentStatus
from specfleet.api.validation import parse_resource
from specfleet.controller.control import Controller
from specfleet.observe.resource_metrics import (
    POOL_ACCEPTANCE_BASELINE,
    POOL_ACCEPTANCE_DRIFT,
    resource_samples,
)
from specfleet.policy.inputs.observation import PoolObservation, PoolState
from specfleet.policy.rules.drift import drift_percent, median_baseline, track_drift
from specfleet.reconcile.apply import stale_children
from specfleet.render import RenderOptions
from specfleet.render.retrain import render_retrain_job, retrain_job_name
from support.fake_cluster import FakeCluster
from support.fake_prometheus import FakePrometheus
from support.manifests import ROOT, load_yaml, merge

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
RETRAIN = {
    "template": {
        "metadata": {"labels": {"team": "ml"}},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "registry.example/eagle-trainer:1",
                    "env": [{"name": "A", "value": "1"}],
                }
            ]
        },
    },
    "periodSeconds": 3600,
}


def _sd(drift=None, retrain=None):
    doc = merge(
        load_yaml(ROOT / "examples" / "01-minimal-eagle3.yaml"),
        {
            "metadata": {"uid": "u1", "generation": 1, "name": "llama", "namespace": "default"},
            "spec": {
                "pools": {"latency": {"speculation": "Auto"}, "batch": {"speculation": "Off"}},
                "policy": {
                    "windowSeconds": 10,
                    "acceptanceDrift": {
                        "thresholdPercent": 20,
                        "forSeconds": 60,
                        "baselineSamples": 3,
                        "baselineRefreshSeconds": 3600,
                        **(drift or {}),
                    },
                },
            },
        },
    )
    if retrain is not None:
        doc["spec"]["drafter"]["retrain"] = retrain
    return parse_resource(doc)


def _obs(per_position, at=T0):
    return PoolObservation(
        pool="latency", at=at, acceptance_length=1 + sum(per_position), per_position=tuple(per_position)
    )


class Run:
    """Feeds measurements to track_drift as the policy would, one evaluation at a time."""

    def __init__(self, sd):
        self.sd = sd
        self.status = SpeculativeDeploymentStatus()
        self.events: list[tuple[str, str, str]] = []
        self.triggers = []

    def step(self, at, per_position):
        observations = {"latency": _obs(per_position, at)} if per_position is not None else {}
        out = track_drift(self.sd.spec, self.status, {"latency": PoolState(mode="On")}, observations, 1, at)
        # The policy's record keeps the measured per-position memory; drift reads only its own fields.
        self.status = out.status
        self.events += out.events
        self.triggers += out.retrain
        return out

    @property
    def latency(self):
        return self.status.pools.latency

    def condition(self):
        return next(c for c in self.status.conditions if c.type == "AcceptanceDrift")


def test_median_and_drift_arithmetic():
    assert median_baseline([(0.7, 0.4), (0.9, 0.5, 0.3), (0.8, 0.1)]) == (0.8, 0.4)
    assert drift_percent((0.7, 0.4, 0.2), (0.35, 0.2, 0.1)) == pytest.approx((2.3 - 1.65) / 2.3 * 100)
    # A pool retuned to K=1 compares only the first position: the same acceptance is no drift.
    assert drift_percent((0.7, 0.4, 0.2), (0.7,)) == 0.0
    assert drift_percent((0.5,), (0.6, 0.3)) < 0  # above the baseline


def test_baseline_is_the_median_of_the_first_samples_and_not_set_before():
    run = Run(_sd())
    run.step(T0, [0.7, 0.4, 0.2])
    assert run.latency.acceptance_baseline is None
    assert run.condition().status == "False"
    assert "no baseline yet (1/3 measured windows)" in run.condition().message
    run.step(T0 + timedelta(seconds=30), [0.1, 0.0, 0.0])  # one odd window
    run.step(T0 + timedelta(seconds=60), [0.68, 0.39, 0.2])
    assert run.latency.acceptance_baseline == "0.680,0.390,0.200"
    assert run.latency.acceptance_baseline_samples is None
    assert [e[1] for e in run.events] == ["AcceptanceBaselineSet"]
    assert "acceptance baseline 2.27 tokens per step over 3 positions" in run.events[0][2]


def test_lasting_drift_turns_the_condition_true_and_back():
    run = Run(_sd())
    for i in range(3):
        run.step(T0 + timedelta(seconds=10 * i), [0.7, 0.4, 0.2])
    t = T0 + timedelta(seconds=100)
    run.step(t, [0.35, 0.2, 0.1])  # 28% below
    assert run.latency.acceptance_drift_percent == "28.3"
    assert run.latency.acceptance_drift_since is not None
    assert run.condition().status == "False", "not yet for forSeconds"
    run.step(t + timedelta(seconds=30), None)  # nothing measured (the pool may be off): drift stays
    run.step(t + timedelta(seconds=60), [0.36, 0.2, 0.1])
    cond = run.condition()
    assert (cond.status, cond.reason) == ("True", "AcceptanceBelowBaseline")
    # The message holds what stays true while the state lasts (no status write per evaluation) ...
    assert cond.message == (
        f"latency: acceptance length more than 20% below its baseline 2.30 since {run.latency.acceptance_drift_since}"
    )
    # ... and the Event sent at the change carries the live numbers.
    assert [e[1:] for e in run.events if e[0] == "Warning"] == [
        ("AcceptanceDrift", "latency: acceptance length 1.66 is 27.8% below its baseline 2.30 for 60 s")
    ]
    assert run.triggers == []  # no drafter.retrain in this spec
    run.step(t + timedelta(seconds=90), [0.69, 0.4, 0.2])
    cond = run.condition()
    assert (cond.status, cond.reason) == ("False", "AcceptanceNearBaseline")
    assert run.latency.acceptance_drift_since is None
    assert run.events[-1][1] == "AcceptanceRecovered"


def test_a_refresh_never_takes_in_a_drifting_acceptance():
    run = Run(_sd())
    for i in range(3):
        run.step(T0 + timedelta(seconds=10 * i), [0.7, 0.4, 0.2])
    later = T0 + timedelta(hours=2)  # refresh due
    run.step(later, [0.68, 0.4, 0.2])
    assert len(run.latency.acceptance_baseline_samples or []) == 1
    run.step(later + timedelta(seconds=10), [0.2, 0.1, 0.0])  # drift: the refresh drops its samples
    assert run.latency.acceptance_baseline_samples is None
    for i in range(5):
        run.step(later + timedelta(seconds=20 + 10 * i), [0.2, 0.1, 0.0])
    assert run.latency.acceptance_baseline == "0.700,0.400,0.200"


def test_retrain_once_per_period_with_the_numbers():
    run = Run(_sd(retrain=RETRAIN))
    for i in range(3):
        run.step(T0 + timedelta(seconds=10 * i), [0.7, 0.4, 0.2])
    t = T0 + timedelta(seconds=100)
    for i in range(20):  # drift lasting 10 minutes, measured every 30 s
        run.step(t + timedelta(seconds=30 * i), [0.35, 0.2, 0.1])
    (trigger,) = run.triggers
    assert trigger.at == t + timedelta(seconds=60)
    assert trigger.pool == "latency"
    assert trigger.baseline == (0.7, 0.4, 0.2)
    assert (round(trigger.baseline_length, 2), round(trigger.current_length, 2)) == (2.3, 1.65)
    assert round(trigger.drift_percent, 1) == 28.3
    assert run.latency.last_retrain_time == "2026-11-30T12:02:40Z"
    # A period later, still drifting: once more.
    run.step(t + timedelta(seconds=60 + 3600), [0.35, 0.2, 0.1])
    assert len(run.triggers) == 2


def test_retrain_job_render():
    sd = _sd(retrain=RETRAIN)
    run = Run(sd)
    for i in range(3):
        run.step(T0 + timedelta(seconds=10 * i), [0.7, 0.4, 0.2])
    for i in range(4):
        run.step(T0 + timedelta(seconds=100 + 30 * i), [0.35, 0.2, 0.1])
    job = render_retrain_job(sd, run.triggers[0])
    assert job["apiVersion"] == "batch/v1"
    assert job["metadata"]["name"] == f"llama-latency-retrain-{int(run.triggers[0].at.timestamp())}"
    assert job["metadata"]["labels"]["app.kubernetes.io/instance"] == "llama"
    assert job["metadata"]["labels"]["app.kubernetes.io/component"] == "retrain"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert job["spec"]["ttlSecondsAfterFinished"] == 3600
    pod = job["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["spec"]["restartPolicy"] == "Never"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["A"] == "1"
    assert {k: env[k] for k in env if k.startswith("SPECFLEET_") and k != "SPECFLEET_TRIGGERED_AT"} == {
        "SPECFLEET_NAMESPACE": "default",
        "SPECFLEET_NAME": "llama",
        "SPECFLEET_POOL": "latency",
        "SPECFLEET_MODEL": sd.spec.model.name,
        "SPECFLEET_DRAFTER": sd.spec.drafter.model,
        "SPECFLEET_DRAFTER_METHOD": "eagle3",
        "SPECFLEET_BASELINE_ACCEPTANCE_LENGTH": "2.300",
        "SPECFLEET_CURRENT_ACCEPTANCE_LENGTH": "1.650",
        "SPECFLEET_DRIFT_PERCENT": "28.3",
        "SPECFLEET_BASELINE_PER_POSITION": "0.700,0.400,0.200",
    }
    long = dataclasses.replace(_sd(retrain=RETRAIN), name="x" * 200)
    assert len(retrain_job_name(long, "latency", T0)) <= 63
    # Never stale while drafter.retrain is set (prune skips the kind); the owner reference is ours.
    assert stale_children([], [job], "u1") == [job]


def test_gauges_carry_baseline_and_drift():
    body = {
        "metadata": {"namespace": "ns", "name": "a"},
        "spec": {},
        "status": {
            "pools": {"latency": {"acceptanceBaseline": "0.7,0.4,0.2", "acceptanceDriftPercent": "28.3"}}
        },
    }
    samples = {(s.name, s.labels[2]): s.value for s in resource_samples(body)}
    assert samples[(POOL_ACCEPTANCE_BASELINE, "latency")] == pytest.approx(2.3)
    assert samples[(POOL_ACCEPTANCE_DRIFT, "latency")] == pytest.approx(28.3)
    assert (POOL_ACCEPTANCE_DRIFT, "batch") not in samples


def test_controller_creates_the_retrain_job_once_and_says_so():
    cluster = FakeCluster()
    key = ("SpeculativeDeployment", "default", "llama")
    doc = merge(
        load_yaml(ROOT / "examples" / "01-minimal-eagle3.yaml"),
        {
            "metadata": {"uid": "u1", "generation": 1, "name": "llama", "namespace": "default"},
            "spec": {
                "pools": {"latency": {"replicas": 2, "speculation": "Auto"}, "batch": {"speculation": "Off"}},
                "policy": {
                    "mode": "Threshold",
                    "thresholds": {
                        "stopBelowAcceptanceLengthMilli": 1200,
                        "resumeAboveAcceptanceLengthMilli": 1700,
                        "stopAboveConcurrencyPerReplica": 48,
                        "resumeBelowConcurrencyPerReplica": 32,
                    },
                    "evaluationIntervalSeconds": 5,
                    "windowSeconds": 30,
                    "acceptanceDrift": {"baselineSamples": 2, "forSeconds": 10},
                },
            },
        },
    )
    doc["spec"]["drafter"]["retrain"] = RETRAIN
    cluster.objects[key] = doc
    prom = FakePrometheus("default", "llama", 30)
    now = [T0]
    controller = Controller(cluster, RenderOptions(), lambda url, timeout: prom, clock=lambda: now[0])
    controller.reconcile_object("default", "llama")
    cluster.roll_out()
    controller.reconcile_object("default", "llama")

    def evaluate(seconds):
        now[0] += timedelta(seconds=seconds)
        return controller.evaluate_policy("default", "llama")

    prom.set_pool("latency", drafts=10.0, accepted=13.0, per_pos=[7.0, 4.0, 2.0], running=2.0)
    evaluate(5)
    evaluate(30)  # baseline samples come from windows that do not overlap
    latency = cluster.objects[key]["status"]["pools"]["latency"]
    assert latency["acceptanceBaseline"] == "0.700,0.400,0.200"
    prom.set_pool("latency", drafts=10.0, accepted=6.5, per_pos=[3.5, 2.0, 1.0], running=2.0)
    outcomes = [evaluate(5) for _ in range(10)]
    jobs = [k for k in cluster.objects if k[0] == "Job"]
    assert len(jobs) == 1, jobs
    created = [e for o in outcomes for e in o.events if e.reason == "RetrainJobCreated"]
    assert len(created) == 1
    assert "28.3% below its baseline 2.30" in created[0].message
    status = cluster.objects[key]["status"]
    assert status["pools"]["latency"]["lastRetrainJob"] == jobs[0][2]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["AcceptanceDrift"]["status"] == "True"


def test_another_drafter_starts_a_new_baseline():
    run = Run(_sd())
    for i in range(3):
        run.step(T0 + timedelta(seconds=10 * i), [0.7, 0.4, 0.2])
    run.step(T0 + timedelta(seconds=40), [0.3, 0.1, 0.0])
    assert run.latency.acceptance_drift_since is not None
    assert run.latency.acceptance_baseline_drafter == "eagle3:" + (run.sd.spec.drafter.model or "")
    retrained = _sd()
    retrained.spec.drafter.model = "org/eagle3-retrained"
    run.sd = retrained
    run.step(T0 + timedelta(seconds=50), [0.5, 0.3, 0.1])
    assert run.latency.acceptance_baseline is None
    assert run.latency.acceptance_drift_since is None
    assert run.latency.acceptance_baseline_samples == ["2026-11-30T12:00:50Z=0.500,0.300,0.100"]
    assert run.condition().status == "False"
