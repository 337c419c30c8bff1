"""`specfleet simulate` and `specfleet plan`: output shape, plot, and clear errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specfleet.cli.main import main
from specfleet.policy.predict.known_models import KNOWN_MODELS
from specfleet_runtime.cost_profile import default_profile

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "02-two-pools-routing-policy.yaml")


def _trace(path: Path, rows: int = 400, gap: float = 0.05) -> str:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens,tenant"]
    for i in range(rows):
        tenant = "nightly-evals" if i % 5 == 0 else ""
        lines.append(f"{i * gap:.3f},{200 + i % 300},{50 + (i * 7) % 200},{tenant}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_simulate_prints_one_json_object_with_every_strategy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path / "t.csv")
    assert (
        main(
            ["simulate", "-f", EXAMPLE, "--trace", trace, "--acceptance", "weak", "--seed", "2", "-o", "json"]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["acceptance"] == [0.3, 0.1, 0.03, 0.01, 0.0]
    assert doc["requests"] == 400
    for name in ("policy", "alwaysOff", "alwaysOn", "bestStatic", "perLevelOracle", "engineDynamicSD"):
        result = doc["results"][name]
        assert set(result) >= {
            "tokensPerSecond",
            "ratioToPerLevelOracle",
            "worstMinuteRatioToPerLevelOracle",
            "flips",
        }
    pools = doc["results"]["policy"]["pools"]
    # The tenant rule of example 02 sends every fifth request to the batch pool.
    assert pools["batch"]["requests"] == 80
    assert pools["latency"]["requests"] == 320


def test_simulate_timeline_says_what_each_decision_was_based_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Per window: the observed load, the load the policy projected along the trend and decided
    with, its reason, and the setting the oracle took there (how a worst minute is diagnosed)."""
    trace = _trace(tmp_path / "t.csv")
    argv = ["simulate", "-f", EXAMPLE, "--trace", trace, "--time-scale", "0.1", "-o", "json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = [r["latency"] for r in doc["results"]["policy"]["timeline"]]
    decided = [r["decision"] for r in rows if "decision" in r]
    assert decided
    assert all(
        set(d) == {"reason", "observedRunningPerReplica", "expectedRunningPerReplica", "predictedSpeedup"}
        for d in decided
    )
    assert any(d["reason"].startswith("Goodput") for d in decided)
    assert {r["oracleSetting"] for r in rows} <= {None, "alwaysOff", "alwaysOnK1", "alwaysOnK3"}


def test_simulate_table_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _trace(tmp_path / "t.csv")
    png = tmp_path / "timeline.png"
    assert main(["simulate", "-f", EXAMPLE, "--trace", trace, "--time-scale", "2", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "perLevelOracle" in out
    assert "policy, per pool:" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_recommends_settings_schedule_and_thresholds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path / "t.csv")
    assert main(["plan", "-f", EXAMPLE, "--trace", trace, "--acceptance", "published"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    # Example 02 names an eagle3 drafter: the EAGLE-3 default's break-even point (154), below the EAGLE-1
    # table's (issue 12 measured about 169 running per replica) by the EAGLE-3 drafter's longer step.
    assert 145 <= doc["breakEvenConcurrencyPerReplica"] < 160
    schedule = doc["drafter"]["dynamicSchedule"]
    assert schedule[0]["minBatchSize"] == 1
    assert schedule[0]["numSpeculativeTokens"] == 3
    assert schedule[-1]["numSpeculativeTokens"] == 0
    thresholds = doc["policy"]["thresholds"]
    assert thresholds["resumeBelowConcurrencyPerReplica"] < thresholds["stopAboveConcurrencyPerReplica"]
    assert doc["pools"]["latency"]["speculation"] == "On"
    assert doc["predicted"]["policyVsAlwaysOff"] > 0.3
    # What a flip takes with Standby engines and without, and the host memory they park: Llama-3.1-8B
    # (16.06 GB) and its drafter (0.85 GB) per pod, 8 one-GPU pods on an 8-GPU node.
    standby = doc["pools"]["latency"]["standby"]
    assert standby["flipSeconds"]["standby"] < standby["flipSeconds"]["restart"]
    assert standby["pays"] is False  # the pool stays On on this trace: no flip to speed up
    assert (standby["hostMemoryPerPodGB"], standby["podsPerNode"], standby["hostMemoryPerNodeGB"]) == (
        16.9,
        8,
        135.3,
    )


def test_plan_thresholds_and_break_even_are_the_policys_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One source of truth: plan's Threshold values are what the policy derives from the same acceptance."""
    from specfleet.api.validation import parse_resource
    from specfleet.policy.rules.threshold import threshold_values
    from specfleet.sim.compare import static_ks
    from specfleet_runtime.cost_profile import break_even_concurrency, default_profile, speedup

    trace = _trace(tmp_path / "t.csv", rows=100)
    acceptance = (0.6, 0.3, 0.1)
    assert main(["plan", "-f", EXAMPLE, "--trace", trace, "--acceptance", "0.6;0.3;0.1", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    sd = parse_resource(yaml.safe_load(Path(EXAMPLE).read_text()))
    profile = default_profile(sd.spec.drafter.method)  # what plan and the policy pick for it
    k = sd.spec.drafter.num_speculative_tokens
    policy = sd.spec.policy.model_copy(update={"thresholds": type(sd.spec.policy.thresholds)()})
    values = threshold_values(policy, k, profile, acceptance)
    thresholds = doc["policy"]["thresholds"]
    assert thresholds["stopAboveConcurrencyPerReplica"] == int(values.stop_concurrency)
    assert thresholds["resumeBelowConcurrencyPerReplica"] == int(values.resume_concurrency)
    # Break-even: the first whole concurrency where the best K stops paying, from the shared function.
    ks = static_ks(profile, k)
    c = doc["breakEvenConcurrencyPerReplica"]
    assert c == int(break_even_concurrency(profile, acceptance, ks)) + 1
    assert max(speedup(profile, c, kk, acceptance) for kk in ks) < 1.0
    assert max(speedup(profile, c - 1, kk, acceptance) for kk in ks) >= 1.0


def test_plan_takes_the_profile_config_map_the_operator_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specfleet.cli.profile import config_map

    slow = {
        "name": "slow-drafter",
        "batchSizes": [1, 64, 256],
        "numSpeculativeTokens": [0, 1, 3],
        "stepTimeMs": [[6.0, 18.0, 30.0], [8.0, 24.0, 40.0], [15.0, 45.0, 75.0]],
    }
    path = tmp_path / "cm.yaml"
    path.write_text(yaml.safe_dump(config_map("gpu-profile", "team-a", yaml.safe_dump(slow))))
    trace = _trace(tmp_path / "t.csv", rows=100)
    argv = ["plan", "-f", EXAMPLE, "--trace", trace, "--profile", str(path), "-o", "json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["profile"] == "slow-drafter"
    assert doc["breakEvenConcurrencyPerReplica"] == 1  # drafting never pays with this profile
    assert doc["pools"]["latency"]["speculation"] == "Off"
    path.write_text(yaml.safe_dump(config_map("gpu-profile", "team-a", "batchSizes: [1]\n")))
    assert main(argv) == 1
    assert "ConfigMap team-a/gpu-profile (policy.goodput.costProfileConfigMap): invalid profile" in (
        capsys.readouterr().err
    )


def test_plan_with_a_strong_drafter_never_breaks_even(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path / "t.csv", rows=100)
    assert main(["plan", "-f", EXAMPLE, "--trace", trace, "--acceptance", "strong", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["breakEvenConcurrencyPerReplica"] is None or doc["breakEvenConcurrencyPerReplica"] > 256


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trace", "/nonexistent.csv"], "cannot read trace /nonexistent.csv"),
        (["--acceptance", "excellent"], "not a profile name"),
        (["--acceptance", "0.2;0.9"], "cannot increase"),
        (["--time-scale", "0"], "time scale must be a positive number"),
        (["--time-scale", "nan"], "time scale must be a positive number"),
        (["--profile", "/nonexistent.yaml"], "cannot use cost profile"),
        (["--startup-seconds", "-1"], "--startup-seconds must be > 0"),
    ],
)
def test_bad_input_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    trace = _trace(tmp_path / "t.csv", rows=10)
    base = ["simulate", "-f", EXAMPLE, "--trace", trace]
    assert main(base + args) == 1
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("TIMESTAMP,Context\n1,2\n", "trace lacks column(s) ContextTokens, GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,x,2\n", "row 2: ContextTokens 'x' is not a number"),
        (b"\xff\xfe\x00junk", "is not UTF-8 text"),
    ],
)
def test_bad_trace_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes, message: str
) -> None:
    path = tmp_path / "bad.csv"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    assert main(["plan", "-f", EXAMPLE, "--trace", str(path)]) == 1
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_bad_resource_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _trace(tmp_path / "t.csv", rows=10)
    resource = tmp_path / "sd.yaml"
    doc = yaml.safe_load(Path(EXAMPLE).read_text())
    doc["spec"]["policy"]["evaluationIntervalSeconds"] = 0
    resource.write_text(yaml.safe_dump(doc))
    assert main(["simulate", "-f", str(resource), "--trace", trace]) == 1
    err = capsys.readouterr().err
    assert "error: the SpeculativeDeployment is invalid" in err
    assert "evaluationIntervalSeconds" in err
    (tmp_path / "empty.yaml").write_text("kind: ConfigMap\n")
    assert main(["simulate", "-f", str(tmp_path / "empty.yaml"), "--trace", trace]) == 1
    assert "holds no SpeculativeDeployment" in capsys.readouterr().err


def test_simulate_table_shows_a_dash_for_missing_values_and_says_what_ratios_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Example 01 routes nothing to its batch pool: that pool has no latencies to show.
    minimal = str(Path(EXAMPLE).with_name("01-minimal-eagle3.yaml"))
    assert main(["simulate", "-f", minimal, "--trace", _trace(tmp_path / "t.csv", rows=50)]) == 0
    out = capsys.readouterr().out
    assert "None" not in out
    assert "0 requests (0 rejected)  TTFT p50/p99 -/- s  TPOT p50/p99 -/- s" in out
    assert "x oracle: generated tokens per request-second relative to the per-level oracle's" in out


def test_every_trace_the_readme_and_docs_use_ships_in_the_repository() -> None:
    import re

    root = Path(EXAMPLE).parents[1]
    texts = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    used = {
        (doc.name, match)
        for doc in texts
        for match in re.findall(r"--trace[ =]+(\S+)", doc.read_text(encoding="utf-8"))
        if not match.startswith(("FILE", "<", "$"))
    }
    assert used, "the README shows `specfleet plan --trace ...`"
    for doc, path in used:
        where = f"{doc} replays {path}, which a fresh clone lacks"
        assert (root / path).resolve().is_relative_to(root.resolve()), where
        assert (root / path).is_file(), where


def test_a_gzip_trace_reads_as_its_csv(tmp_path: Path) -> None:
    import gzip

    from specfleet.sim.workload import read_trace

    plain = _trace(tmp_path / "t.csv", rows=20)
    packed = tmp_path / "t.csv.gz"
    packed.write_bytes(gzip.compress(Path(plain).read_bytes()))
    assert read_trace(packed) == read_trace(plain)
    shipped = read_trace(Path(EXAMPLE).parent / "traces" / "AzureLLMInferenceTrace_code.csv.gz")
    assert (shipped.name, len(shipped.requests)) == ("AzureLLMInferenceTrace_code", 8819)


def test_progress_is_drawn_only_once_a_run_takes_a_few_seconds_and_then_erased() -> None:
    import io

    from specfleet.cli.progress import TerminalProgress

    now = [0.0]
    out = io.StringIO()
    progress = TerminalProgress(out, "simulating", after_seconds=2, clock=lambda: now[0])
    progress("policy")
    now[0] = 1.5
    progress.tick()
    assert out.getvalue() == ""
    progress("alwaysOff")
    now[0] = 3.2
    progress.tick()
    assert out.getvalue() == "\r\x1b[Ksimulating alwaysOff (step 2), 3 s"
    progress.close()
    assert out.getvalue().endswith("\r\x1b[K")


@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_no_progress_when_stderr_is_not_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    assert main([command, "-f", EXAMPLE, "--trace", _trace(tmp_path / "t.csv", rows=50)]) == 0
    assert capsys.readouterr().err == ""


def test_plan_explains_a_memory_bound_pool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With a profile whose engines with the drafter hold little more than one maxModelLen sequence (any
    less and vLLM would not start them), the plan judges the pool as the policy does (throughput at the
    batch each setting holds) and says it is memory-bound."""
    from specfleet.cli.profile import config_map

    doc = default_profile().to_dict()
    doc["memory"] = {"kvCacheTokens": 400000, "kvCacheTokensWithDrafter": 1024}
    path = tmp_path / "cm.yaml"
    path.write_text(yaml.safe_dump(config_map("gpu-profile", "team-a", yaml.safe_dump(doc))))
    resource = yaml.safe_load(Path(EXAMPLE).read_text())
    resource["spec"]["engine"]["maxModelLen"] = 1024  # the trace's longest request is 748 tokens
    (tmp_path / "sd.yaml").write_text(yaml.safe_dump(resource))
    trace = _trace(tmp_path / "t.csv", rows=300, gap=0.01)
    argv = ["plan", "-f", str(tmp_path / "sd.yaml"), "--trace", trace, "--profile", str(path), "-o", "json"]
    assert main(argv) == 0
    latency = json.loads(capsys.readouterr().out)["pools"]["latency"]
    assert "memory-bound" in latency["why"], latency
    assert "the KV cache holds 2 with the drafter" in latency["why"]


SEVENTY_B_FP8_ON_ONE_H100_AT_60 = {
    "model": {"name": "RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8"},
    "engine": {"gpuMemoryUtilizationPercent": 60, "maxModelLen": 4096},
}


def _resource(tmp_path: Path, spec: dict, gpu: str | None = None) -> str:
    doc = yaml.safe_load(Path(EXAMPLE).read_text())
    for key, value in spec.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value}
    # Example 02 names the H100 in its nodeSelector: the GPU named, or none.
    doc["spec"]["engine"]["nodeSelector"] = {"nvidia.com/gpu.product": gpu} if gpu else {}
    path = tmp_path / "sd.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _fp8_70b_in_the_hub_cache(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The FP8 70B checkpoint (not in the shipped table) in a local Hugging Face cache the CLI reads:
    the 70B's config and an index of 70.6e9 B."""
    snapshot = root / "models--RedHatAI--Meta-Llama-3.1-70B-Instruct-FP8" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    config = {**KNOWN_MODELS["meta-llama/Llama-3.1-70B-Instruct"].config, "quantization_config": {}}
    (snapshot / "config.json").write_text(json.dumps(config))
    (snapshot / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 70_600_000_000}})
    )
    monkeypatch.setenv("HF_HUB_CACHE", str(root))


@pytest.mark.parametrize("command", ["render", "simulate", "plan"])
def test_engines_vllm_cannot_start_are_refused_where_the_gpu_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    _fp8_70b_in_the_hub_cache(tmp_path / "hub", monkeypatch)
    resource = _resource(tmp_path, SEVENTY_B_FP8_ON_ONE_H100_AT_60, gpu="NVIDIA-H100-80GB-HBM3")
    argv = [command, "-f", resource] + (
        [] if command == "render" else ["--trace", _trace(tmp_path / "t.csv", 10)]
    )
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "cannot work" in captured.err
    assert "70.6 GB per GPU at tensorParallelSize 1" in captured.err
    assert "No available memory for the cache blocks" in captured.err


def test_simulate_refuses_engines_its_own_memory_cannot_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No GPU in the spec, but the profile measured this model on an H100 at 90%: at 60% the simulated
    # engines would serve nothing, so the run is refused instead of printing 0 tokens/s.
    resource = _resource(tmp_path, SEVENTY_B_FP8_ON_ONE_H100_AT_60)
    profile = tmp_path / "profile.yaml"
    memory = {
        "kvCacheTokens": 12880,
        "kvCacheTokensWithDrafter": 4256,
        "model": "RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8",
        "tensorParallelSize": 1,
        "gpuMemoryUtilization": 0.9,
    }
    profile.write_text(yaml.safe_dump({**default_profile().to_dict(), "memory": memory}))
    trace = _trace(tmp_path / "t.csv", 10)
    assert main(["simulate", "-f", resource, "--trace", trace, "--profile", str(profile)]) == 1
    err = capsys.readouterr().err
    assert "error: the simulated engines cannot start" in err
    assert "in the simulation (RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8 (not in the table" in err
    assert "No available memory for the cache blocks" in err
    # Given the share it was measured at, it runs.
    fits = _resource(
        tmp_path,
        {
            **SEVENTY_B_FP8_ON_ONE_H100_AT_60,
            "engine": {"gpuMemoryUtilizationPercent": 90, "maxModelLen": 4096},
        },
    )
    assert main(["simulate", "-f", fits, "--trace", trace, "--profile", str(profile), "-o", "json"]) == 0


def test_simulate_reports_each_strategys_slo_attainment_for_a_pool_with_an_slo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load(Path(EXAMPLE).read_text())
    doc["spec"]["pools"]["latency"]["slo"] = {"timeToFirstTokenMilliseconds": 300, "percentile": 90}
    resource = tmp_path / "slo.yaml"
    resource.write_text(yaml.safe_dump(doc))
    trace = _trace(tmp_path / "t.csv")
    assert main(["simulate", "-f", str(resource), "--trace", trace, "-o", "json"]) == 0
    slo = json.loads(capsys.readouterr().out)["sloAttainment"]
    # Only the pool with an SLO, for every strategy and the SLO's own per-level oracle.
    assert set(slo) == {"latency"}
    assert slo["latency"]["targets"] == "TTFT 300 ms"
    shares = slo["latency"]["byStrategy"]
    assert {"policy", "alwaysOff", "alwaysOnK3", "perLevelOracle"} <= set(shares)
    assert all(0.0 <= v <= 1.0 for v in shares.values() if v is not None)
    assert main(["simulate", "-f", str(resource), "--trace", trace]) == 0
    assert "SLO attainment, latency (TTFT 300 ms, promised to 90%):" in capsys.readouterr().out
