"""`plan`'s capacity answer (`sim.slo_replicas`): the replicas each setting needs to meet a pool's SLO at the
trace's p95 load, the GPUs speculation saves or costs, the setting the policy would run, and an SLO no
replica count reaches reported as such."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from specfleet.api.pools import LatencySlo
from specfleet.cli.main import main
from specfleet.policy import PoolObservation
from specfleet.policy.predict.throughput import OFF, PoolModel, pool_model
from specfleet.sim.slo_replicas import SloCandidate, SloLoad, predicted_share, slo_replicas
from specfleet_runtime.cost_profile import PUBLISHED_ACCEPTANCE, default_profile

ACC = tuple(PUBLISHED_ACCEPTANCE[:3])
EXAMPLE = Path(__file__).parents[2] / "examples" / "02-two-pools-routing-policy.yaml"
# A simulated spread: each request's TTFT and TPOT within +-50% of the mean (the scale's reference is the mean).
SPREAD = [(0.5 + i / 100, 0.5 + i / 100) for i in range(101)]
# High load: 50,000 generated tokens per second, in requests of 1,000 prompt and 200 output tokens.
HIGH = SloLoad(50_000.0, 1000.0, 200.0)


def _model() -> PoolModel:
    obs = PoolObservation(
        pool="latency",
        at=datetime(2026, 12, 6, tzinfo=UTC),
        running_per_replica=0.0,
        replicas_reporting=1,
        mean_prompt_tokens=1000.0,
        mean_output_tokens=200.0,
    )
    return pool_model(default_profile(), obs, [1, 3], mode="Off", current_k=0)


def _candidates(samples: list[tuple[float, float | None]] = SPREAD) -> list[SloCandidate]:
    m = _model()
    return [SloCandidate("off", m, OFF, samples), *(SloCandidate(k, m, k, samples) for k in ("K1", "K3"))]


def _slo(ttft: int | None = None, tpot: int | None = None) -> LatencySlo:
    return LatencySlo(
        time_to_first_token_milliseconds=ttft, time_per_output_token_milliseconds=tpot, percentile=95
    )


def test_a_ttft_tight_slo_needs_more_replicas_with_speculation_at_high_load() -> None:
    doc = slo_replicas(_slo(ttft=300), _candidates(), ACC, HIGH, gpus_per_replica=1)
    needed = doc["replicasForSlo"]
    # The drafter's prefill, its longer steps and its lower capacity at a large batch all cost TTFT.
    assert needed["off"] < needed["K1"] <= needed["K3"]
    assert doc["gpusSavedBySpeculation"] == needed["off"] - needed["K1"] < 0
    assert doc["policySetting"] == {"replicas": needed["off"], "setting": "off", "predictedAttainment": 1.0}
    assert "unreachable" not in doc


def test_a_tpot_tight_slo_needs_fewer_replicas_with_speculation_and_counts_gpus_per_replica() -> None:
    doc = slo_replicas(_slo(tpot=20), _candidates(), ACC, HIGH, gpus_per_replica=2)
    needed = doc["replicasForSlo"]
    best = min(needed["K1"], needed["K3"])
    assert best < needed["off"]
    # Tensor parallel 2: each replica saved is two GPUs.
    assert doc["gpusSavedBySpeculation"] == 2 * (needed["off"] - best) > 0
    chosen = doc["policySetting"]
    assert chosen["replicas"] == best
    assert chosen["setting"] in {"K1", "K3"}
    assert chosen["predictedAttainment"] >= 0.95


def test_where_off_and_speculation_meet_a_loose_slo_alike_the_plan_runs_the_one_with_more_capacity() -> None:
    # A light load (2,000 tokens/s) and targets every setting meets: the rule's headroom, off (the drafter
    # costs capacity at the largest batch), where throughput alone would pick a K.
    light = SloLoad(2_000.0, 1000.0, 200.0)
    doc = slo_replicas(_slo(ttft=5000, tpot=200), _candidates(), ACC, light, gpus_per_replica=1)
    assert doc["policySetting"]["setting"] == "off"
    # A margin wider than off's lead in capacity: throughput's pick, a K.
    wide = slo_replicas(_slo(ttft=5000, tpot=200), _candidates(), ACC, light, gpus_per_replica=1, margin=0.5)
    assert wide["policySetting"]["setting"] in {"K1", "K3"}


def test_the_simulated_tail_decides_how_far_under_the_target_the_mean_must_be() -> None:
    """The same means, a wider simulated spread: more replicas for the same share."""
    narrow = [(1.0, 1.0)] * 10
    wide = [(0.1, 1.0)] * 8 + [(4.6, 1.0)] * 2  # mean 1.0, a fifth of the requests 4.6 times the mean
    slo = _slo(ttft=300)
    n_narrow = slo_replicas(slo, _candidates(narrow), ACC, HIGH, 1)["replicasForSlo"]["off"]
    n_wide = slo_replicas(slo, _candidates(wide), ACC, HIGH, 1)["replicasForSlo"]["off"]
    assert n_narrow < n_wide
    # A request of one output token has no TPOT: its TTFT alone judges it.
    one_token = [(1.0, None)] * 10
    assert predicted_share(_slo(ttft=300, tpot=1), _candidates(one_token)[0], ACC, HIGH, n_narrow) == 1.0


def test_an_unreachable_slo_is_null_with_a_reason_never_an_error() -> None:
    # 50 ms TTFT: a 1,000-token prompt's prefill alone takes longer.
    doc = slo_replicas(_slo(ttft=50), _candidates(), ACC, HIGH, gpus_per_replica=1, max_replicas=32)
    assert doc["replicasForSlo"] == {"off": None, "K1": None, "K3": None}
    assert doc["gpusSavedBySpeculation"] is None
    assert "up to 32 replicas" in doc["unreachable"]["off"]
    assert doc["unreachable"]["gpusSavedBySpeculation"] == "no setting meets the SLO"
    assert "policySetting" not in doc
    # 10 ms TPOT: only speculation's several tokens per step get there.
    doc = slo_replicas(_slo(tpot=10), _candidates(), ACC, HIGH, gpus_per_replica=1)
    assert doc["replicasForSlo"]["off"] is None
    assert doc["replicasForSlo"]["K3"] is not None
    assert doc["gpusSavedBySpeculation"] is None
    assert doc["unreachable"]["gpusSavedBySpeculation"] == "off cannot meet the SLO, speculation can"
    # A setting the simulation has no request of has no tail to read.
    empty = slo_replicas(_slo(tpot=20), _candidates([]), ACC, HIGH, 1)
    assert empty["replicasForSlo"]["off"] is None
    assert "no request" in empty["unreachable"]["off"]


def test_plan_gives_the_capacity_answer_only_for_a_pool_with_an_slo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["pools"]["latency"]["slo"] = {
        "timeToFirstTokenMilliseconds": 800,
        "timePerOutputTokenMilliseconds": 50,
    }
    (tmp_path / "sd.yaml").write_text(yaml.safe_dump(doc))
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens,tenant"]
    lines += [
        f"{i * 0.05:.3f},{200 + i % 300},{50 + (i * 7) % 200},{'nightly-evals' if i % 5 == 0 else ''}"
        for i in range(400)
    ]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    argv = ["plan", "-f", str(tmp_path / "sd.yaml"), "--trace", str(tmp_path / "t.csv"), "-o", "json"]
    assert main(argv) == 0
    pools = json.loads(capsys.readouterr().out)["pools"]
    slo = pools["latency"]["slo"]
    assert set(slo["replicasForSlo"]) == {"off", "K1", "K3", "dynamicSchedule"}
    assert all(isinstance(n, int) and n >= 1 for n in slo["replicasForSlo"].values())
    assert slo["p95TokensPerSecond"] > 0
    assert slo["policySetting"]["setting"] in slo["replicasForSlo"]
    assert isinstance(slo["gpusSavedBySpeculation"], int)
    assert "slo" not in pools["batch"]


def test_a_pool_the_policy_does_not_steer_by_its_slo_gets_replicas_but_no_setting() -> None:
    """The batch pool's SLO is measured, never steered by: its replicas, no `policySetting`."""
    doc = slo_replicas(_slo(tpot=20), _candidates(), ACC, HIGH, gpus_per_replica=1, steered=False)
    assert doc["replicasForSlo"]["off"] is not None
    assert "policySetting" not in doc
