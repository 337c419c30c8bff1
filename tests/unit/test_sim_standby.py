"""The simulator's Standby flips (`rollout.flip: Standby`): each replica in turn leaves the endpoints,
finishes what it holds, is down only for its sleep + wake + check, then serves the other setting with
an empty KV cache; nothing is lost, and a Restart pool's run is what it was."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from specfleet.api.validation import SpeculativeDeployment, parse_resource
from specfleet.policy.predict.kv_cache import ASSUMED_MEMORY
from specfleet.policy.predict.rollout_time import (
    STANDBY_CHECK_SECONDS,
    standby_startup_seconds,
    standby_switch_seconds,
)
from specfleet.sim.accounts import RunResult
from specfleet.sim.fleet import SimOptions, Strategy, _Fleet, simulate
from specfleet.sim.options import strategy_spec
from specfleet.sim.prom import answers
from specfleet.sim.workload import Trace, TraceRequest
from specfleet_runtime.cost_profile import default_profile
from specfleet_runtime.sleep_mode import HOST_LINK_BYTES_PER_S

EXAMPLE = Path(__file__).parents[2] / "examples" / "02-two-pools-routing-policy.yaml"
STARTUP = 60.0
TRACE = Trace(tuple(TraceRequest(arrival=i / 10, prompt_tokens=200, output_tokens=300) for i in range(6000)))
FLIP = Strategy("flip", "schedule", schedule=((0.0, "latency", "On", 3), (30.0, "latency", "Off", None)))


def _resource(rollout: dict[str, object], grace_seconds: int = 3600) -> SpeculativeDeployment:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["pools"]["latency"]["replicas"] = 3
    doc["spec"]["pools"]["latency"]["rollout"] = (
        {**rollout, "standbyHostMemory": "20Gi"} if rollout.get("flip") == "Standby" else rollout
    )
    doc["spec"]["engine"] = {**doc["spec"].get("engine", {}), "terminationGracePeriodSeconds": grace_seconds}
    return parse_resource(doc)


def _fleet(rollout: dict[str, object]) -> _Fleet:
    """3 latency engines under steady load (10 requests/s for 10 min), turned off at 30 s, run."""
    sd = _resource(rollout)
    options = SimOptions(startup_seconds=STARTUP).resolved(sd.spec)
    fleet = _Fleet(
        dataclasses.replace(sd, spec=strategy_spec(sd.spec, FLIP)), FLIP, TRACE, options, default_profile()
    )
    fleet.result_ = fleet.run()  # type: ignore[attr-defined]
    return fleet


def _retune_then_flip() -> tuple[_Fleet, RunResult]:
    """3 Standby latency engines under the steady load: K 3 -> 1 at 30 s (new pods), Off at 60 s, run."""
    retune_then_flip = Strategy(
        "retune-then-flip",
        "schedule",
        schedule=((0.0, "latency", "On", 3), (30.0, "latency", "On", 1), (60.0, "latency", "Off", None)),
    )
    sd = _resource({"strategy": "Surge", "flip": "Standby"})
    options = SimOptions(startup_seconds=STARTUP).resolved(sd.spec)
    fleet = _Fleet(
        dataclasses.replace(sd, spec=strategy_spec(sd.spec, retune_then_flip)),
        retune_then_flip,
        TRACE,
        options,
        default_profile(),
    )
    return fleet, fleet.run()


def test_the_switch_is_the_weights_over_the_host_link_each_way_plus_the_check() -> None:
    # Llama-3.1-8B (16.06 GB) with its EAGLE-3 drafter (0.85 GB) one way, without it the other, at
    # 64 GiB / 3 s (21.3 GiB/s): 0.738 + 0.701 s.
    expected = (16.06e9 + 0.85e9) / HOST_LINK_BYTES_PER_S + 16.06e9 / HOST_LINK_BYTES_PER_S
    assert standby_switch_seconds(ASSUMED_MEMORY) == pytest.approx(expected)
    assert expected == pytest.approx(1.44, abs=0.01)


def test_a_standby_flip_goes_replica_by_replica_each_down_only_for_its_switch() -> None:
    fleet = _fleet({"strategy": "Surge", "flip": "Standby"})
    run = fleet.result_  # type: ignore[attr-defined]
    switch = standby_switch_seconds(ASSUMED_MEMORY) + STANDBY_CHECK_SECONDS
    pods = sorted(fleet.rollouts.pool_pods("latency"), key=lambda p: p.serial)
    before = [p for p in pods if p.config.speculative]
    after = [p for p in pods if not p.config.speculative]
    # Three flipped in place: no pod beyond the spec (no surge), no restart.
    assert (len(before), len(after)) == (3, 3)
    assert max(row["latency"]["replicas"] for row in run.timeline) <= 3
    previous_ready = 30.0
    for old, new in zip(before, after, strict=True):
        # One at a time: a replica leaves the endpoints once the one before serves again ...
        assert old.draining_since is not None
        assert old.gone_at is not None
        assert old.draining_since == pytest.approx(previous_ready)
        # ... finishes what it holds (300 tokens at the engine's pace: seconds, not the grace period) ...
        assert 0 < old.gone_at - old.draining_since < 30
        # ... and is down only for sleep + wake + check, then serves the other setting, its KV empty.
        assert new.ready_at - old.gone_at == pytest.approx(switch, abs=1e-3)
        assert new.kv_blocks == new.config.kv_capacity_tokens // new.config.block_size
        previous_ready = new.ready_at
    assert previous_ready - 30.0 < 3 * (30 + switch)
    # No request lost: the drained ones finished, none failed or was refused.
    assert run.failed == 0
    assert run.completed == run.submitted == 6000
    # Status carries one replica's switch as the operator measures it (sleep, wake, check: its drain is
    # the load's, estimated at each flip).
    status = fleet.rollouts.observed_status(run.status, 600.0).pools.latency
    assert status.standby_flip_seconds == max(1, round(switch))
    # The start-up, as the operator measures it (pod created to Ready), is a Standby pod's: two engines'
    # and the supervisor's sleep check.
    assert status.startup_seconds == round(standby_startup_seconds(STARTUP, ASSUMED_MEMORY))


def test_an_engine_a_standby_flip_parks_is_still_scraped_asleep() -> None:
    # Both engines of a Standby pod are scraped (render/monitoring.py's PodMonitor): the engine a flip
    # puts to sleep keeps its series, so the pool's served tokens over a window that spans the flips
    # do not dip while the woken engines' rates fill it (beyond rate()'s own extrapolation over a
    # counter that stops mid-window, up to about 10%), and only awake engines count as replicas.
    sd = _resource({"strategy": "Surge", "flip": "Standby"})
    late = Strategy("flip", "schedule", schedule=((0.0, "latency", "On", 3), (300.0, "latency", "Off", None)))
    options = SimOptions(startup_seconds=STARTUP).resolved(sd.spec)
    fleet = _Fleet(
        dataclasses.replace(sd, spec=strategy_spec(sd.spec, late)), late, TRACE, options, default_profile()
    )
    fleet.run()
    latency = [s for s in fleet.prometheus.series.values() if s.pool == "latency"]
    arriving = 10 * 300.0  # the trace's generated tokens per second
    for t in range(240, 600, 15):
        out = answers(latency, float(t), 120.0)
        assert float(out["generation_tps"][0]["value"][1]) == pytest.approx(arriving, rel=0.15), t
        assert float(out["replicas"][0]["value"][1]) in (2.0, 3.0), t
    asleep = [s for s in latency if s.samples and not s.samples[-1].awake]
    assert len(asleep) == 3
    # Scraped on, asleep, until the pods go at the run's end.
    assert all(s.samples[-1].t >= 585 for s in asleep)


def test_a_standby_pod_starts_two_engines_and_checks_the_sleep() -> None:
    # One engine's start-up twice, and sleep + wake + sleep of the engine with the drafter
    # (16.91 GB at 64 GiB / 3 s: 0.738 s each way): 2 x 60 + 2.21 s.
    expected = 2 * STARTUP + 3 * (16.06e9 + 0.85e9) / HOST_LINK_BYTES_PER_S
    assert standby_startup_seconds(STARTUP, ASSUMED_MEMORY) == pytest.approx(expected)
    assert expected == pytest.approx(122.2, abs=0.05)


def test_a_standby_flip_never_dips_below_one_engine_out() -> None:
    run = _fleet({"strategy": "Replace", "maxUnavailable": 2, "flip": "Standby"}).result_  # type: ignore[attr-defined]
    ready = [row["latency"]["readyReplicas"] for row in run.timeline]
    assert min(ready) >= 2
    assert run.failed == 0


def test_restart_pools_simulate_as_before() -> None:
    # `flip: Restart` is the default: the same run, request for request, as a resource without it.
    plain = simulate(_resource({"strategy": "Surge"}), TRACE, FLIP, SimOptions(startup_seconds=STARTUP))
    restart = simulate(
        _resource({"strategy": "Surge", "flip": "Restart"}), TRACE, FLIP, SimOptions(startup_seconds=STARTUP)
    )
    assert plain.timeline == restart.timeline
    assert plain.status.pools.latency.standby_flip_seconds is None
    # And a Restart flip still pays the start-up: a surge pod starts and replaces one engine a minute.
    assert max(row["latency"]["replicas"] for row in restart.timeline) == 4


def test_a_standby_pod_still_starting_when_the_pool_flips_is_not_restarted() -> None:
    # A retune at 30 s (K 3 -> 1) starts new pods (two engines each); the flip Off at 60 s meets them
    # starting. The template is the same whatever the mode, so they come up when they would have, now
    # serving without the drafter, instead of starting over.
    fleet, run = _retune_then_flip()
    startup = standby_startup_seconds(STARTUP, ASSUMED_MEMORY)
    pods = sorted(fleet.rollouts.pool_pods("latency"), key=lambda p: p.serial)
    started = [p for p in pods if 30.0 <= p.created < 60.0]
    assert started, "the retune started pods"
    for p in started:
        if p.gone_at is not None and p.gone_at <= 60.0 and p.ready_at > 60.0:
            # Replaced at the flip by a pod of the new mode, created when it was and Ready as it would be.
            twin = next(q for q in pods if q.created == p.created and q is not p)
            assert not twin.config.speculative
            assert twin.ready_at == pytest.approx(p.created + startup)
    assert not any(
        p.created >= 60.0 and not p.config.speculative and p.ready_at - p.created > startup / 2 for p in pods
    )
    assert run.failed == 0


def test_a_flip_during_a_restart_rollout_flips_the_ready_pods_in_place_beside_its_surge_pod() -> None:
    # A retune at 30 s (K 3 -> 1) starts a surge pod (two engines: a Standby pod's start-up); the flip
    # Off at 60 s changes no pod template (the driver wakes each pod's other engine), so the surge pod
    # keeps its place and the three ready pods flip in place beside it, one at a time, each down only
    # for its switch: none waits for the surge pod's start-up, none leaves without its other engine.
    fleet, run = _retune_then_flip()
    pods = sorted(fleet.rollouts.pool_pods("latency"), key=lambda p: p.serial)
    startup = standby_startup_seconds(STARTUP, ASSUMED_MEMORY)
    # (The flip replaces the starting pod by one of the new mode, created when it was.)
    surge = [p for p in pods if p.created == 30.0 and (p.gone_at is None or p.gone_at > 60.0)]
    assert len(surge) == 1, "the retune's surge pod, carried over the flip"
    assert surge[0].ready_at - surge[0].created >= startup
    original = [p for p in pods if p.created == 0.0]
    twins = [p for p in pods if p.created >= 60.0 and p.ready_at - p.created < startup / 2]
    assert len(original) == len(twins) == 3
    for old, twin in zip(original, twins, strict=True):
        assert old.draining_since is not None
        assert old.draining_since < surge[0].ready_at
        assert twin.ready_at < surge[0].ready_at
        assert not twin.config.speculative
    # Beside the surge pod the pool never had fewer than replicas - 1 engines serving.
    assert min(row["latency"]["readyReplicas"] for row in run.timeline if row["t"] > 0) >= 2
    assert run.failed == 0
