"""The API models: every example is valid, every case of the invalid table is rejected with its message."""

from __future__ import annotations

import pytest

from specfleet.api.spec import SpeculativeDeploymentSpec
from specfleet.api.validation import InvalidResourceError, parse_resource, parse_status
from specfleet.cli.main import main
from support.manifests import EXAMPLES, InvalidCase, invalid_cases, load_yaml

CASES = invalid_cases()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_parse(path):
    sd = parse_resource(load_yaml(path))
    assert sd.name == load_yaml(path)["metadata"]["name"]


def test_invalid_table_is_large_enough():
    assert len(CASES) >= 15
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_invalid_case_rejected_by_models(case: InvalidCase):
    with pytest.raises(InvalidResourceError) as err:
        parse_resource(case.manifest)
    assert any(case.message in m for m in err.value.messages), err.value.messages


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_invalid_case_rejected_by_render_cli(case: InvalidCase, tmp_path, capsys):
    import yaml

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(case.manifest))
    assert main(["render", "-f", str(path)]) == 1
    captured = capsys.readouterr()
    assert case.message in captured.err
    assert captured.out == ""


def test_defaults_are_filled():
    spec = SpeculativeDeploymentSpec.model_validate({"model": {"name": "m"}, "drafter": {"model": "d"}})
    assert spec.drafter.method == "eagle3"
    assert spec.drafter.num_speculative_tokens == 3
    assert spec.pools.latency.speculation == "Auto"
    assert spec.policy.mode == "Goodput"
    # Threshold values left unset are derived from the cost profile's break-even point.
    assert spec.policy.thresholds.stop_below_acceptance_length_milli is None
    assert spec.engine.resources.gpus == 1


def test_strict_types_refuse_coercion():
    with pytest.raises(InvalidResourceError):
        parse_resource(
            {
                "apiVersion": "specfleet.io/v1alpha1",
                "kind": "SpeculativeDeployment",
                "metadata": {"name": "x"},
                "spec": {
                    "model": {"name": "m"},
                    "drafter": {"model": "d"},
                    "pools": {"latency": {"replicas": True}},
                },
            }
        )


def test_wrong_kind_and_missing_spec_are_reported():
    with pytest.raises(InvalidResourceError) as err:
        parse_resource({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}})
    text = str(err.value)
    assert "expected apiVersion specfleet.io/v1alpha1" in text
    assert "metadata.name: Required value" in text
    assert "spec: Required value" in text


def test_damaged_status_is_replaced_not_fatal():
    status = parse_status({"pools": {"latency": {"speculation": "Sideways"}}, "conditions": "nonsense"})
    assert status.pools.latency.speculation == "On"
    assert status.conditions == []
