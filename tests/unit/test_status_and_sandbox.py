"""`specfleet status` rows, the sandbox fleet and the scenario report: pure parts, no cluster."""

from __future__ import annotations

import copy
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from specfleet.api.semantics import find_problems
from specfleet.api.validation import parse_resource
from specfleet.cli.status import run_status
from specfleet.cli.status_view import fleet_view, plain_lines
from specfleet_sandbox.cli import build_parser
from specfleet_sandbox.fleet import sandbox_fleet
from specfleet_sandbox.load import LoadStats
from specfleet_sandbox.scenario import (
    SCENARIOS,
    TENANT_HEADER,
    PhaseRecord,
    Rollout,
    RolloutKey,
    ScenarioResult,
    observe_rollouts,
    phase_rows,
    summary_lines,
)
from support.ports import free_port

RESOURCE = {
    "metadata": {"namespace": "inference", "name": "assistant", "generation": 3},
    "spec": {
        "drafter": {"numSpeculativeTokens": 3},
        "pools": {
            "latency": {"replicas": 2, "speculation": "Auto"},
            "batch": {"replicas": 1, "speculation": "Auto"},
        },
    },
    "status": {
        "observedGeneration": 3,
        "pools": {
            "latency": {
                "speculation": "On",
                "readyReplicas": 2,
                "acceptanceLength": "2.27",
                "runningPerReplica": "2.1",
                "generationTokensPerSecond": "812",
                "numSpeculativeTokens": 2,
            },
            "batch": {"speculation": "Off", "readyReplicas": 1, "runningPerReplica": "38"},
        },
        "history": [
            {
                "time": "2026-11-30T12:00:00Z",
                "pool": "batch",
                "from": "On",
                "to": "Off",
                "reason": "ConcurrencyAboveThreshold",
                "message": "38 running per replica exceed 12",
                "observations": {"runningPerReplica": "38", "acceptanceLength": "2.3"},
            }
        ],
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "AllPoolsReady", "message": "all ready"},
        ],
    },
}


def test_fleet_view_shows_mode_k_load_and_the_last_decision_per_pool() -> None:
    view = fleet_view(RESOURCE)
    latency, batch = view.pools
    assert (latency.mode, latency.k, latency.replicas, latency.acceptance) == ("On", "2", "2/2", "2.27")
    assert latency.tokens_per_second == "812"
    assert (batch.mode, batch.k, batch.replicas, batch.running_per_replica) == ("Off", "-", "1/1", "38")
    assert "On->Off ConcurrencyAboveThreshold" in batch.decision
    assert "runningPerReplica=38" in batch.decision
    assert latency.decision == "-"
    assert view.flips == 1
    assert view.conditions == ("Ready=True (AllPoolsReady): all ready",)


def test_status_shows_each_recent_change_with_its_predicted_and_realized_speedup() -> None:
    resource = copy.deepcopy(RESOURCE)
    goodput = {
        "time": "2026-11-30T12:10:00Z",
        "pool": "latency",
        "from": "Off",
        "to": "On",
        "reason": "GoodputBetter",
        "observations": {"runningPerReplica": "6", "predictedSpeedup": "1.400"},
        "realized": {
            "time": "2026-11-30T12:13:00Z",
            "tokensPerSecondPerReplicaBefore": "300",
            "tokensPerSecondPerReplicaAfter": "390",
            "runningPerReplicaBefore": "6",
            "runningPerReplicaAfter": "5.5",
            "realizedSpeedup": "1.300",
        },
    }
    retune = {**goodput, "time": "2026-11-30T12:20:00Z", "from": "On", "reason": "GoodputRetuned"}
    retune["observations"] = {"numSpeculativeTokens": "3->2", "predictedSpeedup": "1.050"}
    del retune["realized"]
    resource["status"]["history"] += [goodput, retune]
    view = fleet_view(resource)
    assert view.changes == (
        "2026-11-30T12:00:00Z batch On->Off ConcurrencyAboveThreshold: predicted -, realized -",
        "2026-11-30T12:10:00Z latency Off->On GoodputBetter: predicted 1.400, realized 1.300 "
        "(tok/s per replica 300 -> 390, running per replica 6 -> 5.5)",
        "2026-11-30T12:20:00Z latency K 3->2 GoodputRetuned: predicted 1.050, realized -",
    )
    assert "realizedSpeedup" not in view.pools[0].decision  # the last one is not measured yet
    resource["status"]["history"].pop()
    assert "predictedSpeedup=1.400, realizedSpeedup=1.300" in fleet_view(resource).pools[0].decision
    lines = plain_lines(view)
    assert any(line.startswith("  recent changes") for line in lines)
    assert lines.index("    " + view.changes[0]) < lines.index("  Ready=True (AllPoolsReady): all ready")
    # A flip off predicted speculation at 0.800x: the change itself, no drafter over it, 1.250x.
    off = {**goodput, "time": "2026-11-30T12:30:00Z", "from": "On", "to": "Off"}
    off["observations"] = {"predictedSpeedup": "0.800", "predictedChangeSpeedup": "1.250"}
    resource["status"]["history"].append(off)
    assert (
        fleet_view(resource)
        .changes[-1]
        .startswith("2026-11-30T12:30:00Z latency On->Off GoodputBetter: predicted 1.250, realized 1.300")
    )


def test_an_autoscaled_pool_shows_the_autoscalers_count_and_range() -> None:
    resource = copy.deepcopy(RESOURCE)
    resource["spec"]["pools"]["latency"]["autoscaling"] = {"minReplicas": 2, "maxReplicas": 8}
    resource["status"]["pools"]["latency"].update(readyReplicas=4, desiredReplicas=5)
    latency, _ = fleet_view(resource).pools
    assert latency.replicas == "4/5 (2-8)"


def test_fleet_view_of_a_fresh_resource_without_status() -> None:
    view = fleet_view({"metadata": {"name": "new"}, "spec": {"pools": {"latency": {"speculation": "Off"}}}})
    assert [p.mode for p in view.pools] == ["Off", "On"]
    assert view.observed_generation is None
    assert plain_lines(view)[0].startswith("default/new (generation 0, observed -")


def test_status_prints_plain_lines_without_a_terminal() -> None:
    out = io.StringIO()
    assert run_status(lambda: [RESOURCE], watch=False, interval=0, out=out) == 0
    text = out.getvalue()
    assert "inference/assistant" in text
    assert "POOL" in text
    assert "LAST DECISION" in text
    assert "Ready=True" in text
    empty = io.StringIO()
    run_status(list, watch=False, interval=0, out=empty)
    assert "no SpeculativeDeployments found" in empty.getvalue()


def test_the_sandbox_fleet_is_a_valid_resource_that_can_work() -> None:
    doc = sandbox_fleet("sandbox", "http://127.0.0.1:9090")
    doc["metadata"]["name"] = "assistant"
    sd = parse_resource(doc)
    assert find_problems(sd.spec) == []
    assert sd.spec.policy.prometheus.url == "http://127.0.0.1:9090"
    assert sd.spec.pools.latency.replicas == 1
    assert any("nightly-evals" in rule.tenants for rule in sd.spec.routing.tenant_rules)
    # The demo's batch tenant is routed by its header, which the resource must trust.
    assert sd.spec.routing.tenant_header == TENANT_HEADER
    assert sd.spec.routing.tenant_header_trust == "Trusted"


def _stats(ok: int, failed: int, latency_tokens: int, batch_tokens: int) -> LoadStats:
    return LoadStats(
        ok=ok,
        failed=failed,
        tokens=latency_tokens + batch_tokens,
        tokens_by_pool={"latency": latency_tokens, "batch": batch_tokens},
    )


def test_phase_rows_are_per_phase_differences_of_cumulative_counters() -> None:
    scenario = SCENARIOS["demo"]
    first, second = scenario.phases[:2]
    result = ScenarioResult(scenario, started_wall=0.0)
    result.phases = [
        PhaseRecord(first, 0.0, 10.0, _stats(10, 0, 1000, 0), _stats(5, 0, 0, 500)),
        PhaseRecord(second, 10.0, 30.0, _stats(30, 1, 3000, 0), _stats(45, 0, 0, 4500)),
    ]
    rows = phase_rows(result)
    assert [r["served"] for r in rows] == [15, 60]
    assert [r["failed"] for r in rows] == [0, 1]
    assert rows[0]["latencyTokensPerSecond"] == 100.0
    assert rows[1]["batchTokensPerSecond"] == 200.0
    history = [
        {"time": "1970-01-01T00:00:20Z", "pool": "batch", "from": "On", "to": "Off", "reason": "X"},
        {"time": "1969-12-31T00:00:00Z", "pool": "latency", "from": "On", "to": "Off", "reason": "Old"},
    ]
    lines = summary_lines(result, history)
    assert lines[0] == "scenario demo: 75 requests served, 1 failed"
    assert any("batch" in line and "On -> Off" in line and "X" in line for line in lines)
    assert not any("Old" in line for line in lines), "decisions before the scenario are not its own"


def test_every_scenario_starts_on_the_usual_topic_and_is_minutes_long() -> None:
    for scenario in SCENARIOS.values():
        assert scenario.phases[0].shifted is False
        assert 60 <= scenario.seconds <= 400
    assert 240 <= SCENARIOS["demo"].seconds <= 380  # about six minutes, the long-prompt phase included


def test_sandbox_cli_refuses_an_unknown_scenario_and_a_missing_sandbox(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = build_parser()
    args = parser.parse_args(["info", "--dir", str(tmp_path)])
    from specfleet_sandbox.cli import main

    assert main(["info", "--dir", str(tmp_path)]) == 1
    assert "run `specfleet sandbox up` first" in capsys.readouterr().err
    assert args.command == "info"
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["load", "--scenario", "nope"])
    assert exit_.value.code == 2


def _kubeconfig(path: Path, server: str) -> str:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
    )
    return str(path)


def _status_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    from specfleet.cli.main import main

    assert main(["status", *argv]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert "urllib3" not in err
    return err


def test_status_names_the_kubeconfig_it_tried(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    err = _status_error(capsys, "--kubeconfig", str(tmp_path / "missing"))
    assert f"error: no usable cluster credentials (tried kubeconfig {tmp_path / 'missing'})" in err
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "from-env"))
    assert f"(tried kubeconfig {tmp_path / 'from-env'})" in _status_error(capsys)


def test_status_says_in_one_line_that_the_server_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    config = _kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}")
    err = _status_error(capsys, "--kubeconfig", config)
    assert f"error: cannot connect to https://127.0.0.1:{port}: connection refused" in err


@pytest.fixture
def apiserver_without_the_crd() -> Iterator[str]:
    """An HTTP server answering as an apiserver does for an API it does not serve, except that one
    named object is "not found" the way it is when the CRD is there."""
    import http.server
    import json
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.endswith("/speculativedeployments/gone"):
                status = {"kind": "Status", "reason": "NotFound", "code": 404, "details": {"name": "gone"}}
                body, kind = json.dumps(status).encode(), "application/json"
            else:
                body, kind = b"404 page not found\n", "text/plain"
            self.send_response(404)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def test_status_on_a_404_hints_at_installing_the_crd(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], apiserver_without_the_crd: str
) -> None:
    config = _kubeconfig(tmp_path / "kubeconfig", apiserver_without_the_crd)
    err = _status_error(capsys, "--kubeconfig", config)
    assert f"{apiserver_without_the_crd} does not serve speculativedeployments.specfleet.io" in err
    assert "install the CRD with `specfleet crd | kubectl apply -f -`" in err
    err = _status_error(capsys, "--kubeconfig", config, "-n", "inference", "gone")
    assert 'error: SpeculativeDeployment "gone" not found in namespace "inference"' in err


def _pools_status(batch_rollout: dict[str, str], batch_mode: str, latency_rollout: dict[str, str]) -> dict:
    return {
        "spec": {"pools": {"batch": {"rollout": {"flip": "Standby", "standbyHostMemory": "20Gi"}}}},
        "status": {
            "pools": {
                "batch": {"speculation": batch_mode, "rollout": batch_rollout},
                "latency": {"speculation": "On", "rollout": latency_rollout},
            }
        },
    }


def test_each_change_shows_how_it_rolled_out_and_its_seconds_from_decision_to_settled() -> None:
    seen: dict[RolloutKey, Rollout] = {}
    flip = {"time": "1970-01-01T00:00:20Z", "fromMode": "On"}
    retune = {"time": "1970-01-01T00:00:21Z", "fromMode": "On"}
    observe_rollouts(_pools_status(flip, "Off", retune), seen)
    assert seen[("batch", flip["time"])] == Rollout("Standby flip")
    assert seen[("latency", retune["time"])] == Rollout("restart")
    observe_rollouts(_pools_status({**flip, "settledTime": "1970-01-01T00:00:26Z"}, "Off", retune), seen)
    assert seen[("batch", flip["time"])] == Rollout("Standby flip", 6.0)
    # A later read (the pool flipped back meanwhile, the same change still named) keeps what was seen.
    observe_rollouts(_pools_status({**flip, "settledTime": "1970-01-01T00:00:26Z"}, "On", retune), seen)
    assert seen[("batch", flip["time"])] == Rollout("Standby flip", 6.0)
    # A Standby pool whose engines cannot sleep flips by restarting.
    unavailable = _pools_status({"time": "1970-01-01T00:01:00Z", "fromMode": "Off"}, "On", retune)
    unavailable["status"]["pools"]["batch"]["standby"] = {"available": False}
    observe_rollouts(unavailable, seen)
    assert seen[("batch", "1970-01-01T00:01:00Z")] == Rollout("restart flip")

    scenario = SCENARIOS["demo"]
    result = ScenarioResult(scenario, started_wall=0.0)
    result.phases = [PhaseRecord(scenario.phases[0], 0.0, 10.0, _stats(1, 0, 10, 0), _stats(1, 0, 0, 10))]
    history = [
        {"time": flip["time"], "pool": "batch", "from": "On", "to": "Off", "reason": "X"},
        {"time": retune["time"], "pool": "latency", "from": "On", "to": "On", "reason": "Y"},
    ]
    lines = summary_lines(result, history, seen)
    assert any("batch" in line and "(Standby flip, settled in 6 s)" in line for line in lines)
    assert any("latency" in line and "(restart, not settled by the end)" in line for line in lines)
