"""`specfleet profile` without vLLM: the output it parses, the files it writes, its errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from specfleet.cli.main import main
from specfleet.cli.profile import PROFILE_KEY, ProfileError, config_map, parse_output, profile_document
from specfleet_runtime.cost_profile import StepTimeProfile, load_profile

DOC = {
    "name": "x",
    "batchSizes": [1, 4],
    "numSpeculativeTokens": [0, 1],
    "stepTimeMs": [[1.0, 1.5], [2.0, 3.0]],
    "prefillMsPerToken": 0.0,
    "measuredWith": {"model": "m"},
}


def test_parse_output_takes_the_last_json_line_after_vllm_logs():
    profile, doc = parse_output("INFO starting\n" + json.dumps(DOC) + "\n")
    assert profile.step_time_ms(4, 1) == 3.0
    assert doc["measuredWith"] == {"model": "m"}


@pytest.mark.parametrize(
    ("stdout", "message"),
    [
        ("nothing here\n", "printed no profile"),
        (json.dumps({**DOC, "numSpeculativeTokens": [1, 2]}), "invalid profile"),
    ],
)
def test_parse_output_refuses_what_is_not_a_profile(stdout, message):
    with pytest.raises(ProfileError, match=message):
        parse_output(stdout)


def test_documents_round_trip(tmp_path: Path):
    profile = StepTimeProfile.from_dict(DOC)
    text = profile_document(profile, {"model": "m"})
    path = tmp_path / "p.yaml"
    path.write_text(text)
    assert load_profile(path) == profile
    cm = config_map("h100-profile", "inference", text)
    assert cm["metadata"]["namespace"] == "inference"
    assert StepTimeProfile.from_dict(yaml.safe_load(cm["data"][PROFILE_KEY])) == profile


def test_cli_reports_a_failed_measurement(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    # The current python has no vllm: the measurement fails and says why, nothing is written.
    out = tmp_path / "p.yaml"
    code = main(["profile", "--vllm-python", sys.executable, "--model", "m", "--ks", "0", "-o", str(out)])
    assert code == 1
    assert "the measurement failed" in capsys.readouterr().err
    assert not out.exists()


def test_cli_reports_a_missing_interpreter(capsys: pytest.CaptureFixture[str]):
    assert main(["profile", "--vllm-python", "/nonexistent/python", "--model", "m"]) == 1
    assert "no such interpreter" in capsys.readouterr().err


def test_the_profile_config_map_is_what_the_policy_reads():
    from specfleet.policy.inputs.profile_source import profile_from_config_map

    text = profile_document(StepTimeProfile.from_dict(DOC), DOC["measuredWith"])
    read = profile_from_config_map(config_map("p", "ns", text), "ns", "p")
    assert read.step_time_ms(4, 1) == 3.0
    assert read.name == "x"


def _job(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, dict]:
    argv = ["profile", "--job", "measure-h200", "--config-map", "h200-profile", "-n", "team-a"]
    argv += ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--drafter", "yuhuili/EAGLE3", *extra]
    assert main(argv) == 0
    return {d["kind"]: d for d in yaml.safe_load_all(capsys.readouterr().out)}


def test_job_measures_on_a_gpu_and_publishes_the_config_map(capsys: pytest.CaptureFixture[str]):
    from specfleet.cli.profile import SCRIPT

    docs = _job(capsys, "--gpus", "2", "--ks", "0,1,3")
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Job"}
    assert all(d["metadata"]["namespace"] == "team-a" for d in docs.values())
    pod = docs["Job"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "measure-h200"
    assert pod["restartPolicy"] == "Never"
    measure = pod["initContainers"][0]
    assert measure["image"].startswith("vllm/vllm-openai:")
    assert measure["resources"]["limits"]["nvidia.com/gpu"] == 2
    args = measure["args"]
    assert args[args.index("--model") + 1] == "meta-llama/Llama-3.1-8B-Instruct"
    assert args[args.index("--drafter") + 1] == "yuhuili/EAGLE3"
    assert args[args.index("--ks") + 1] == "0,1,3"
    # The script the init container runs is this version's, mounted from the ConfigMap.
    assert docs["ConfigMap"]["data"][SCRIPT.name] == SCRIPT.read_text()
    assert any(v.get("configMap", {}).get("name") == "measure-h200-script" for v in pod["volumes"])
    publish = pod["containers"][0]
    assert publish["command"][:3] == ["specfleet", "profile", "--publish"]
    assert publish["args"] == ["--config-map", "h200-profile", "--namespace", "team-a"]
    # The Role reaches only the profile ConfigMap by name (create cannot be limited by name).
    rules = docs["Role"]["rules"]
    assert {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]} in rules
    named = [r for r in rules if "resourceNames" in r]
    assert named == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["h200-profile"],
            "verbs": ["get", "patch"],
        }
    ]
    assert docs["RoleBinding"]["subjects"][0]["name"] == "measure-h200"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["profile", "--job", "j", "--model", "m"], "--job needs --config-map, --namespace and --model"),
        (
            ["profile", "--publish", "/nonexistent", "--config-map", "c", "-n", "ns"],
            "cannot read /nonexistent",
        ),
        (["profile", "--publish", "/dev/null"], "--publish needs --config-map and --namespace"),
        (["profile", "--model", "m"], "--vllm-python required"),
    ],
)
def test_profile_modes_say_what_is_missing(argv, message, capsys: pytest.CaptureFixture[str]):
    assert main(argv) != 0
    assert message in capsys.readouterr().err


def test_publish_refuses_a_measurement_that_is_not_a_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    out = tmp_path / "measurement.txt"
    out.write_text("INFO vllm crashed\n")
    assert main(["profile", "--publish", str(out), "--config-map", "c", "-n", "ns"]) == 1
    assert "printed no profile" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("requested", "cap", "measured"),
    [
        # The cap is measured too: the table reaches the largest batch the engine runs.
        ([1, 8, 32, 64, 128, 256], 512, [1, 8, 32, 64, 128, 256, 512]),
        ([1, 8, 32, 64, 128, 256], 256, [1, 8, 32, 64, 128, 256]),
        # Sizes the engine would queue rather than run at once are left out.
        ([1, 64, 256], 100, [1, 64, 100]),
        ([64, 1, 64], 1, [1]),
        # No cap: what was asked for, its largest the engine's cap.
        ([64, 1, 8], None, [1, 8, 64]),
    ],
)
def test_the_batches_measured_reach_max_num_seqs(requested, cap, measured):
    from specfleet_runtime.vllm_profile import batch_sizes

    assert batch_sizes(requested, cap) == measured


def test_the_measurement_runs_to_max_num_seqs(monkeypatch: pytest.MonkeyPatch):
    """With a stand-in for vllm: every engine starts with --max-num-seqs and runs that batch."""
    import types

    from specfleet_runtime import vllm_profile

    engines: list[dict] = []
    batches: list[int] = []
    clock = [0.0]  # seconds: each generated token of a request takes 1 ms
    monkeypatch.setattr(vllm_profile, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    class Metric:
        def __init__(self, name: str, value: float = 0.0, labels: dict | None = None) -> None:
            self.name, self.value, self.labels = name, value, labels or {}

    class LLM:
        def __init__(self, **kwargs) -> None:
            engines.append(kwargs)
            self.drafts = 0.0
            self.k = (kwargs.get("speculative_config") or {}).get("num_speculative_tokens", 0)
            config = types.SimpleNamespace(
                model_config=types.SimpleNamespace(max_model_len=4096),
                parallel_config=types.SimpleNamespace(tensor_parallel_size=1),
            )
            self.llm_engine = types.SimpleNamespace(vllm_config=config)

        def get_metrics(self) -> list[Metric]:
            info = {"engine": "0", "kv_cache_size_tokens": "1000", "block_size": "16"}
            return [
                Metric("vllm:cache_config_info", 1.0, info),
                Metric("vllm:spec_decode_num_drafts", self.drafts),
            ]

        def generate(self, prompts, params, use_tqdm=False) -> None:
            batches.append(len(prompts))
            clock[0] += params.max_tokens / 1000
            self.drafts += len(prompts) * params.max_tokens / 2 if self.k else 0.0

    fake = types.SimpleNamespace(LLM=LLM, SamplingParams=types.SimpleNamespace)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    args = vllm_profile.build_parser().parse_args(
        [
            "--model",
            "m",
            "--drafter",
            "d",
            "--ks",
            "0,1",
            "--batch-sizes",
            "1,64,256,1024",
            "--max-num-seqs",
            "384",
        ]
    )
    doc = vllm_profile.measure(args)
    assert doc["batchSizes"] == [1, 64, 256, 384]
    assert [e["max_num_seqs"] for e in engines] == [384, 384]
    assert max(batches) == 384
    assert StepTimeProfile.from_dict(doc).batch_sizes[-1] == 384


def test_profile_passes_max_num_seqs_to_the_measurement(capsys: pytest.CaptureFixture[str]):
    args = _job(capsys, "--max-num-seqs", "512")["Job"]["spec"]["template"]["spec"]["initContainers"][0][
        "args"
    ]
    assert args[args.index("--max-num-seqs") + 1] == "512"
    # Unset: the batch cap the operator assumes of an engine whose spec leaves maxNumSeqs unset.
    args = _job(capsys)["Job"]["spec"]["template"]["spec"]["initContainers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "256"
