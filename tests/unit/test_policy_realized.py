"""What followed a change: a flip's or a retune's history entry gains the throughput per replica before
and after it, once its rollout settled and a whole window was measured since, and only then."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from specfleet.api.conditions import rfc3339
from specfleet.api.status import Decision, PoolRollout, PoolStatus, PoolStatuses
from specfleet.policy.decision.realized import realized_change, with_realized_changes
from specfleet.policy.inputs.observation import PoolObservation

DECIDED = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SETTLED = DECIDED + timedelta(seconds=200)
WINDOW = 60.0


def _flip(**numbers: str) -> Decision:
    observations = {
        "generationTokensPerSecond": "4e+03",
        "replicasReporting": "2",
        "runningPerReplica": "80",
        "predictedSpeedup": "1.250",
        **numbers,
    }
    return Decision.model_validate(
        {
            "time": rfc3339(DECIDED),
            "pool": "latency",
            "from": "Off",
            "to": "On",
            "reason": "GoodputBetter",
            "observations": observations,
        }
    )


def _pools(settled: datetime | None = SETTLED, decided: datetime = DECIDED) -> PoolStatuses:
    rollout = PoolRollout(time=rfc3339(decided), settled_time=None if settled is None else rfc3339(settled))
    return PoolStatuses(latency=PoolStatus(speculation="On", settled=settled is not None, rollout=rollout))


def _after(at: datetime, tokens: float | None = 5000.0, **kw: object) -> PoolObservation:
    values: dict[str, object] = {"running_per_replica": 75.0, "replicas_reporting": 2, **kw}
    return PoolObservation(pool="latency", at=at, generation_tokens_per_second=tokens, **values)  # type: ignore[arg-type]


def test_a_flip_gains_before_after_and_their_ratio_once_a_window_after_its_settling_is_measured():
    now = SETTLED + timedelta(seconds=WINDOW)
    told = realized_change(_flip(), _pools(), _after(now), WINDOW, now)
    assert told is not None
    assert told.tokens_per_second_per_replica_before == "2000"
    assert told.tokens_per_second_per_replica_after == "2500"
    assert told.realized_speedup == "1.250"
    assert (told.running_per_replica_before, told.running_per_replica_after) == ("80", "75")
    assert told.time == rfc3339(now)
    wire = _flip().model_copy(update={"realized": told}).to_wire()
    assert wire["realized"]["realizedSpeedup"] == "1.250"
    assert wire["observations"]["predictedSpeedup"] == "1.250"


def test_a_retune_is_told_and_a_canary_scaling_is_not():
    now = SETTLED + timedelta(seconds=WINDOW)
    retune = _flip(numSpeculativeTokens="3->1").model_copy(update={"to_mode": "Off", "from_mode": "Off"})
    assert realized_change(retune, _pools(), _after(now), WINDOW, now) is not None
    canaries = _flip(canaryReplicas="spec->0").model_copy(update={"to_mode": "Off", "from_mode": "Off"})
    assert realized_change(canaries, _pools(), _after(now), WINDOW, now) is None


def test_nothing_while_the_rollout_has_not_settled():
    now = DECIDED + timedelta(seconds=600)
    assert realized_change(_flip(), _pools(settled=None), _after(now), WINDOW, now) is None


def test_nothing_until_a_whole_window_after_the_settling_has_passed():
    now = SETTLED + timedelta(seconds=WINDOW - 1)
    assert realized_change(_flip(), _pools(), _after(now), WINDOW, now) is None


def test_nothing_without_a_measurement_on_either_side():
    now = SETTLED + timedelta(seconds=WINDOW)
    pools = _pools()
    assert realized_change(_flip(), pools, None, WINDOW, now) is None
    assert realized_change(_flip(), pools, _after(now, tokens=None), WINDOW, now) is None
    assert realized_change(_flip(), pools, _after(now, problem="Prometheus down"), WINDOW, now) is None
    assert realized_change(_flip(), pools, _after(now, replicas_reporting=0), WINDOW, now) is None
    unmeasured = _flip()
    unmeasured = unmeasured.model_copy(update={"observations": {"runningPerReplica": "80"}})
    assert realized_change(unmeasured, pools, _after(now), WINDOW, now) is None
    idle = _flip(generationTokensPerSecond="0")
    assert realized_change(idle, pools, _after(now), WINDOW, now) is None


def test_an_entry_a_later_change_superseded_is_never_told():
    now = SETTLED + timedelta(seconds=WINDOW)
    later = _pools(decided=DECIDED + timedelta(seconds=100))
    assert realized_change(_flip(), later, _after(now), WINDOW, now) is None


def test_told_once_and_never_overwritten():
    first = SETTLED + timedelta(seconds=WINDOW)
    history = with_realized_changes([_flip()], _pools(), {"latency": _after(first)}, WINDOW, first)
    assert history[0].realized is not None
    later = first + timedelta(seconds=30)
    again = with_realized_changes(history, _pools(), {"latency": _after(later, 9000.0)}, WINDOW, later)
    assert again[0].realized == history[0].realized
