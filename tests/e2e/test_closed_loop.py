"""The adaptive loop closed end to end: real control plane, real Prometheus, real operator and
router processes, emulated engines started from the pods' own command lines, and load through the
router with the official openai client.

Durations are seconds-scale (evaluation every 2 s, 6 s rate windows, 15 s dwell) so the tier fits CI.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from specfleet.api.validation import parse_resource
from specfleet.observe.dashboard import AFTER_A_CHANGE, CHANGE_PANEL, dashboard
from specfleet.render.monitoring import alert_groups
from specfleet_sandbox.load import LoadGenerator
from specfleet_sandbox.processes import wait_for, wait_for_event
from support.argocd import argocd_health
from support.e2e_env import PUBLISHED_ACCEPTANCE, Env, print_dump_if_failed, running_env
from support.e2e_env import engine_args as _engine_args
from support.e2e_env import fleet as _fleet
from support.e2e_env import latency as _latency
from support.e2e_env import wait_metrics as _wait_metrics
from support.e2e_env import wait_mode as _wait_mode
from support.e2e_env import wait_settled as _wait_settled
from support.manifests import merge

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def env(cluster, tmp_path_factory) -> Iterator[Env]:
    with running_env(cluster, tmp_path_factory.mktemp("e2e")) as e:
        yield e


@pytest.fixture(autouse=True)
def dump_on_failure(env: Env, request: pytest.FixtureRequest) -> Iterator[None]:
    """When a test fails, print the operator log, events, pod processes and Prometheus log."""
    yield
    print_dump_if_failed(env, request)


def test_concurrency_turns_speculation_off_and_back_on_without_failed_requests(env):
    name = _fleet(env, "busy")
    load = LoadGenerator(env.router_url(name), "llama", max_tokens=48).start(concurrency=2)
    try:
        _wait_metrics(env, name)
        assert _latency(env, name)["speculation"] == "On"
        load.set_concurrency(28)
        off = _wait_mode(env, name, "Off", timeout=90)
        assert off["reason"] == "ConcurrencyAboveThreshold"
        _wait_settled(env, name)
        assert "--speculative-config" not in _engine_args(env, name)
        decided_off = time.monotonic()
        load.set_concurrency(2)
        on = _wait_mode(env, name, "On", timeout=120)
        assert time.monotonic() - decided_off >= 10  # held by the dwell time, not flipped at once
        assert on["reason"] == "ConditionsRecovered"
        _wait_settled(env, name)
        assert "--speculative-config" in _engine_args(env, name)
        # What followed the flip back on, once a window was measured after it settled, reaches the
        # dashboard: the operator's gauge, scraped by the real Prometheus, in the panel's own query.
        variables = {"$namespace": env.namespace, "$deployment": name, "$__rate_interval": "30s"}
        panel = next(p for p in dashboard()["panels"] if p["title"] == CHANGE_PANEL)
        realized = _panel_exprs(panel, variables)[1]
        assert env.prometheus is not None
        answer = wait_for(
            "the flip back on's realized speedup on the dashboard",
            lambda: [
                r
                for r in env.prometheus.query(realized)  # type: ignore[union-attr]
                if r["metric"]["reason"] == "ConditionsRecovered"
            ],
            timeout=60,
        )
        assert float(answer[0]["value"][1]) > 0
    finally:
        stats = load.stop()
    history = env.sd(name)["status"]["history"]
    assert [(h["from"], h["to"]) for h in history] == [("On", "Off"), ("Off", "On")]
    assert history[1]["realized"]["realizedSpeedup"] == f"{float(answer[0]['value'][1]):.3f}"
    # The threshold compares the load expected when the flip takes effect (running + waiting,
    # projected along the trend) with 12; the measured running count can sit below it.
    seen = history[0]["observations"]
    assert float(seen.get("expectedRunningPerReplica", seen["runningPerReplica"])) > 12
    assert stats.ok > 50
    assert stats.failed == 0, stats.errors


def _load_alert_rules(env: Env, name: str, alerts: dict[str, Any]) -> None:
    """Render the resource's PrometheusRule groups (as prometheus-operator would hand them to
    Prometheus) and load them; the test bed has no prometheus-operator, so the resource itself keeps
    monitoring.prometheusRule off and the test writes the rule file."""
    assert env.prometheus is not None
    doc = merge(env.sd(name), {"spec": {"monitoring": {"prometheusRule": True, "alerts": alerts}}})
    (env.rules_dir / f"{name}.yaml").write_text(yaml.safe_dump({"groups": alert_groups(parse_resource(doc))}))
    env.prometheus.reload()
    wait_for(
        f"{name}'s rules loaded",
        lambda: any(
            g["name"] == f"specfleet.{env.namespace}.{name}.alerts" for g in env.prometheus.rule_groups()
        ),
        timeout=30,
    )


def _alert_fired(env: Env, name: str, alert: str, within: str) -> list[dict[str, Any]]:
    """ALERTS samples of a firing alert of this resource within the last `within` (Prometheus' own record)."""
    assert env.prometheus is not None
    selector = f'alertname="{alert}",alertstate="firing",specfleet_io_deployment="{name}"'
    return env.prometheus.query(f"max_over_time(ALERTS{{{selector}}}[{within}])")


def test_content_shift_turns_speculation_off_with_that_reason(env):
    name = _fleet(env, "shift")
    load = LoadGenerator(env.router_url(name), "llama", max_tokens=48).start(concurrency=2)
    try:
        _wait_metrics(env, name)
        # The alert holds for no time here: the policy turns the pool off within seconds of the drop,
        # after which no speculating engine is left to measure.
        _load_alert_rules(env, name, {"forSeconds": 0})
        # The emulators draft with acceptance (0.68, 0.39, 0.2): 2.27 tokens per step in steady state; the
        # first windows after start-up hold only a few drafts, so wait for the measured value to settle.
        wait_for(
            "acceptance measured above the resume value",
            lambda: float(_latency(env, name).get("acceptanceLength") or 0) > 1.7,
            timeout=45,
        )
        assert _alert_fired(env, name, "SpecfleetAcceptanceBelowStop", "1m") == []
        env.runner.set_acceptance([0.05, 0.01, 0.0])
        # Argo CD's view of every state the operator writes during the flip (the health script on the
        # object as read from the apiserver): Progressing while it rolls out, never Degraded.
        seen: list[tuple[str, str]] = []

        def off_and_settled() -> dict[str, Any] | None:
            sd = env.sd(name)
            seen.append(argocd_health(sd))
            pool: dict[str, Any] = sd["status"]["pools"]["latency"]
            settled = any(
                c["type"] == "SpeculationSettled" and c["status"] == "True"
                for c in sd["status"]["conditions"]
            )
            return pool if pool["speculation"] == "Off" and settled else None

        off = wait_for("latency pool Off and settled", off_and_settled, timeout=90, interval=0.2)
        assert off["reason"] == "AcceptanceBelowThreshold"
        assert "fell below 1.40" in off["message"]
        health = [state for state, _ in seen]
        assert "Degraded" not in health, seen
        assert ("Progressing", "RollingOut: rolling out: latency") in seen, seen
        assert health[-1] == "Healthy", seen
        # Prometheus' own rule evaluation saw the same drop: the acceptance alert fired for the latency pool.
        fired = wait_for(
            "SpecfleetAcceptanceBelowStop fired",
            lambda: _alert_fired(env, name, "SpecfleetAcceptanceBelowStop", "2m"),
            timeout=30,
        )
        assert [f["metric"]["specfleet_io_pool"] for f in fired] == ["latency"]
    finally:
        stats = load.stop()
        env.runner.set_acceptance(PUBLISHED_ACCEPTANCE)
    assert stats.failed == 0, stats.errors


RETRAIN_TEMPLATE = {
    "metadata": {"labels": {"team": "ml"}},
    "spec": {
        "containers": [
            {"name": "train", "image": "registry.example/eagle-trainer:1", "args": ["--epochs", "1"]}
        ]
    },
}


def _retrain_jobs(env: Env, name: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=retrain"
    out = env.kubectl("get", "jobs", "-n", env.namespace, "-l", selector, "-o", "json").stdout
    jobs: list[dict[str, Any]] = json.loads(out)["items"]
    return jobs


def test_acceptance_drift_sets_the_condition_and_starts_one_retrain_job(env):
    # Baseline from three 6 s windows; 15% below it for 4 s is drift; one retrain Job per hour.
    patch = {
        "spec": {
            "policy": {
                "acceptanceDrift": {
                    "thresholdPercent": 15,
                    "forSeconds": 4,
                    "baselineSamples": 3,
                    "baselineRefreshSeconds": 3600,
                }
            },
            "drafter": {"retrain": {"periodSeconds": 3600, "template": RETRAIN_TEMPLATE}},
        }
    }
    name = _fleet(env, "drift", patch)
    load = LoadGenerator(env.router_url(name), "llama", max_tokens=48).start(concurrency=2)
    try:
        _wait_metrics(env, name)
        baseline = wait_for(
            "an acceptance baseline near the emulators' (0.68, 0.39, 0.2)",
            lambda: (b := _latency(env, name).get("acceptanceBaseline")) and b,
            timeout=90,
        )
        assert env.conditions(name)["AcceptanceDrift"]["status"] == "False"
        assert _retrain_jobs(env, name) == []
        # The usage shifts: 1.68 tokens per step instead of 2.27, still above the stop value (1.40), so
        # the pool keeps speculating and measuring.
        env.runner.set_acceptance([0.4, 0.2, 0.08])
        drift = wait_for(
            "AcceptanceDrift=True",
            lambda: (c := env.conditions(name).get("AcceptanceDrift", {})).get("status") == "True" and c,
            timeout=90,
        )
        assert drift["reason"] == "AcceptanceBelowBaseline"
        assert drift["message"].startswith("latency: acceptance length ")
        (job,) = wait_for("the retrain Job", lambda: _retrain_jobs(env, name), timeout=30)
        owners = job["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"]) for o in owners] == [("SpeculativeDeployment", name)]
        pod = job["spec"]["template"]
        assert pod["metadata"]["labels"]["team"] == "ml"
        environment = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert environment["SPECFLEET_POOL"] == "latency"
        assert environment["SPECFLEET_MODEL"] == env.sd(name)["spec"]["model"]["name"]
        assert environment["SPECFLEET_DRAFTER"] == env.sd(name)["spec"]["drafter"]["model"]
        base, current = (
            float(environment["SPECFLEET_BASELINE_ACCEPTANCE_LENGTH"]),
            float(environment["SPECFLEET_CURRENT_ACCEPTANCE_LENGTH"]),
        )
        assert 1.9 < base < 2.5, baseline
        assert 1.4 < current < 1.9
        assert float(environment["SPECFLEET_DRIFT_PERCENT"]) > 15
        status = _latency(env, name)
        assert status["lastRetrainJob"] == job["metadata"]["name"]
        # The drift lasts: no second Job within the period, however many evaluations see it.
        env.wait_sweeps(5)
        assert [j["metadata"]["name"] for j in _retrain_jobs(env, name)] == [job["metadata"]["name"]]
        assert _latency(env, name)["lastRetrainTime"] == status["lastRetrainTime"]
        wait_for_event(env.cluster.kubectl, env.namespace, "RetrainJobCreated")
        wait_for_event(env.cluster.kubectl, env.namespace, "AcceptanceBaselineSet")
        # The operator's gauge, scraped by Prometheus, says the same.
        assert env.prometheus is not None
        scraped = wait_for(
            "the drift gauge in Prometheus",
            lambda: env.prometheus.query(
                f'specfleet_pool_acceptance_drift_percent{{name="{name}",pool="latency"}} > 15'
            ),
            timeout=30,
        )
        assert len(scraped) == 1
    finally:
        stats = load.stop()
        env.runner.set_acceptance(PUBLISHED_ACCEPTANCE)
    assert stats.failed == 0, stats.errors


def _panel_exprs(panel: dict[str, Any], variables: dict[str, str]) -> list[str]:
    """A panel's PromQL with Grafana's variables set."""
    exprs = []
    for target in panel["targets"]:
        expr = target["expr"]
        for variable, value in variables.items():
            expr = expr.replace(variable, value)
        exprs.append(expr)
    return exprs


def test_every_dashboard_panel_has_data_after_load(env):
    """Each panel's PromQL, with Grafana's variables set to this resource, returns data from the real
    Prometheus (engines, router and the operator's own metrics) while load runs; and the latency pool's
    SLO attainment, measured from the engines' histograms through that Prometheus, reaches status."""
    assert env.prometheus is not None
    # With an SLO: its attainment, read from the engines' histograms in the real Prometheus, reaches status.
    slo = {"timeToFirstTokenMilliseconds": 1000, "timePerOutputTokenMilliseconds": 200}
    name = _fleet(env, "dash", {"spec": {"pools": {"latency": {"slo": slo}}}})
    variables = {"$namespace": env.namespace, "$deployment": name, "$__rate_interval": "30s"}
    load = LoadGenerator(env.router_url(name), "llama", max_tokens=48).start(concurrency=4)
    missing: dict[str, list[str]] = {}

    def every_panel_has_data() -> bool:
        missing.clear()
        for panel in dashboard()["panels"]:
            if panel["title"] in AFTER_A_CHANGE:
                continue  # data once a change was measured: test_concurrency_turns_speculation_off...
            exprs = _panel_exprs(panel, variables)
            answers = [env.prometheus.query(e) for e in exprs]  # type: ignore[union-attr]
            if not any(math.isfinite(float(r["value"][1])) for answer in answers for r in answer):
                missing[panel["title"]] = exprs
        return not missing

    try:
        _wait_metrics(env, name)
        try:
            wait_for("every dashboard panel has data", every_panel_has_data, timeout=90, interval=2)
        except AssertionError:
            pytest.fail("dashboard panels without data:\n" + json.dumps(missing, indent=1))
        attained = wait_for(
            "the latency pool's SLO attainment in status",
            lambda: _latency(env, name).get("sloAttainmentPercent"),
            timeout=60,
        )
        assert 0 <= float(attained) <= 100
        assert 0 <= float(_latency(env, name)["ttftAttainmentPercent"]) <= 100
        assert "sloAttainmentPercent" not in env.sd(name)["status"]["pools"]["batch"]  # no SLO there
    finally:
        stats = load.stop()
    assert stats.failed == 0, stats.errors
    # The router pods served that load with the request path the image ships (mypyc-compiled).
    builds = env.prometheus.query(f'specfleet_router_build_info{{namespace="{env.namespace}"}}')
    assert builds, "no specfleet_router_build_info from the router pods"
    assert {r["metric"]["build"] for r in builds} == {"compiled"}, builds


def test_prometheus_outage_holds_and_recovers(env):
    name = _fleet(env, "outage")
    load = LoadGenerator(env.router_url(name), "llama", max_tokens=32).start(concurrency=2)
    try:
        _wait_metrics(env, name)
        history_before = env.sd(name)["status"].get("history", [])
        env.prometheus.stop()
        cond = wait_for(
            "MetricsAvailable=False",
            lambda: (c := env.conditions(name).get("MetricsAvailable", {})).get("status") == "False" and c,
            timeout=30,
        )
        assert "Prometheus query failed" in cond["message"]
        load.set_concurrency(28)  # would flip, but the policy must hold without metrics
        env.wait_sweeps(4)
        assert env.sd(name)["status"].get("history", []) == history_before
        assert env.operator.alive()
        load.set_concurrency(2)
        env.prometheus.start()
        _wait_metrics(env, name)
    finally:
        stats = load.stop()
    assert stats.failed == 0, stats.errors


def test_operator_restart_mid_rollout_does_not_flip_twice(env):
    name = _fleet(env, "restart")
    load = LoadGenerator(env.router_url(name), "llama", max_tokens=48).start(concurrency=2)
    try:
        _wait_metrics(env, name)
        load.set_concurrency(28)
        wait_for(
            "flip recorded", lambda: _latency(env, name)["speculation"] == "Off", timeout=90, interval=0.1
        )
        settled_at_restart = env.conditions(name).get("SpeculationSettled", {}).get("status")
        env.operator.stop()
        env.operator.start()
        _wait_settled(env, name, timeout=90)
        env.wait_sweeps(3)  # several evaluations after the restart
        # Read while the load runs: once it stops, the pool may rightly turn back on.
        history = env.sd(name)["status"]["history"]
    finally:
        stats = load.stop()
    assert [(h["from"], h["to"]) for h in history] == [("On", "Off")]
    assert "--speculative-config" not in _engine_args(env, name)
    assert settled_at_restart == "False", "the restart came after the rollout ended; the test proved less"
    assert stats.failed == 0, stats.errors


def _sim_truth_workload(load: LoadGenerator, points: list[tuple[float, int]]) -> Any:
    """The LoadGenerator's requests as the simulator sees them: its prompts, the emulator's lengths."""
    from specfleet.sim.workload import ClosedLoop
    from specfleet_runtime.emulator.config import EmulatorConfig
    from specfleet_runtime.emulator.text import Prompt, natural_length

    shortest, longest = EmulatorConfig(served_model_name="x").natural_length
    sizes = []
    for n in range(1, 4001):
        prompt = Prompt.from_chat([("user", load.message(n))])
        sizes.append(
            (prompt.num_tokens, min(load.max_tokens, natural_length(prompt.seed, shortest, longest)))
        )
    return ClosedLoop(points=tuple((t, float(c)) for t, c in points), sizes=tuple(sizes), name="e2e")


def test_simulator_tells_the_truth_about_this_loop(env):
    """The same fleet and load, run here and in the simulator: tokens/s within 10%, flips within 2
    evaluation intervals of each other."""
    from datetime import UTC, datetime

    from specfleet.api.validation import parse_resource
    from specfleet.policy.inputs.status import parse_time
    from specfleet.sim.fleet import SimOptions, simulate
    from specfleet_runtime.cost_profile import default_profile

    name = _fleet(env, "truth")
    max_tokens = 48
    phases = [(2, 20.0), (28, 60.0), (2, 60.0)]
    load = LoadGenerator(env.router_url(name), "llama", max_tokens=max_tokens).start(concurrency=2)
    try:
        _wait_metrics(env, name)
        start_wall = datetime.now(UTC)
        start = time.monotonic()
        before = load.snapshot()
        points: list[tuple[float, int]] = []
        for concurrency, seconds in phases:
            at = time.monotonic() - start
            load.set_concurrency(concurrency)
            points += [(at, concurrency), (at + seconds - 0.001, concurrency)]
            time.sleep(seconds)
        elapsed = time.monotonic() - start
        delivered = load.snapshot().tokens - before.tokens
        assert env.prometheus is not None
        selector = f'namespace="{env.namespace}",specfleet_io_deployment="{name}",specfleet_io_pool="latency"'
        window = f"{int(elapsed)}s"
        answer = env.prometheus.query(
            f"sum(max_over_time(vllm:generation_tokens_total{{{selector}}}[{window}]) - "
            f"min_over_time(vllm:generation_tokens_total{{{selector}}}[{window}]))"
        )
    finally:
        stats = load.stop()
    assert stats.failed == 0, stats.errors
    # Tokens the clients received (each request's usage, counted as it ends): the engines' own counter
    # through Prometheus misses what a pod served before its first scrape and after its last, about a
    # second of a replica at each flip, so it is reported beside it, not compared.
    real_tps = delivered / elapsed
    scraped_tps = float(answer[0]["value"][1]) / elapsed if answer else float("nan")
    body = env.sd(name)
    real_flips = [
        ((t - start_wall).total_seconds(), h["to"])
        for h in body["status"]["history"]
        if (t := parse_time(h["time"])) is not None and t >= start_wall
    ]

    # The simulator: the same resource, the emulator's pace (its profile x --time-scale 10), the
    # e2e Prometheus' 1 s scrape, no prefill cost (the emulator charges none).
    base = default_profile()
    profile = dataclasses.replace(base, step_ms=tuple(tuple(t * 10 for t in row) for row in base.step_ms))
    body.pop("status", None)
    sim = simulate(
        parse_resource(body),
        _sim_truth_workload(load, points),
        options=SimOptions(
            seed=0,
            scrape_interval=1.0,
            startup_seconds=5.0,
            prefill_ms_per_token=0.0,
            acceptance=tuple(PUBLISHED_ACCEPTANCE),
        ),
        profile=profile,
    )
    sim_tps = sim.pools["latency"].tokens / sim.duration
    sim_flips = [(c.time, c.to_mode) for c in sim.changes if c.kind == "flip"]
    evidence = (
        f"real {real_tps:.1f} tokens/s delivered ({scraped_tps:.1f} scraped), flips {real_flips}; "
        f"simulated {sim_tps:.1f}, flips {sim_flips}"
    )
    print(evidence)
    assert abs(sim_tps - real_tps) <= 0.10 * real_tps, evidence
    assert [m for _, m in sim_flips] == [m for _, m in real_flips], evidence
    every = 2.0  # evaluationIntervalSeconds of _fleet
    for (t_sim, _), (t_real, _) in zip(sim_flips, real_flips, strict=True):
        assert abs(t_sim - t_real) <= 2 * every, evidence


# The KV cache of the memory test's engines, in tokens: 25 blocks of 16 with the drafter (6 to 8 of
# the load's requests, 18 prompt tokens and up to 48 of output each, plus K lookahead slots), 250
# without (more than maxNumSeqs). Given to the emulators on their command line and to the operator as a cost profile's
# memory section, so the capacity it predicts for the setting it does not run is what that setting has.
KV_TOKENS, KV_TOKENS_WITH_DRAFTER = 4000, 400


def test_goodput_turns_a_pool_off_when_the_drafter_s_kv_cache_runs_out_without_failed_requests(env):
    """Goodput, memory-bound: the speculating engines' KV cache holds about 8 of 32 clients' requests
    (the rest wait or are preempted) while the engine without the drafter would hold them all, so the
    pool turns off with reason GoodputMemoryBound, and no client sees an error. Deleted at its end, so
    its load does not weigh on the schedule test after it."""
    from specfleet.cli.profile import config_map, profile_document
    from specfleet_runtime.cost_profile import default_profile
    from specfleet_runtime.names import SERIES_SPECULATION

    published = default_profile()
    assert published.memory is not None
    memory = dataclasses.replace(
        published.memory,
        kv_cache_tokens=KV_TOKENS,
        kv_cache_tokens_with_drafter=KV_TOKENS_WITH_DRAFTER,
        max_model_len=256,
    )
    profile = config_map(
        "memory-profile", env.namespace, profile_document(dataclasses.replace(published, memory=memory))
    )
    env.kubectl("apply", "-f", "-", input=yaml.safe_dump(profile))
    name = _fleet(
        env,
        "memory",
        {
            "spec": {
                "engine": {
                    # A context the small cache holds (the emulator, as vLLM, refuses one it cannot).
                    "maxModelLen": 256,
                    # The emulator's own flags (a real vLLM would refuse them): its KV cache.
                    "extraArgs": [
                        "--kv-cache-tokens",
                        str(KV_TOKENS),
                        "--kv-cache-tokens-with-drafter",
                        str(KV_TOKENS_WITH_DRAFTER),
                    ],
                },
                "policy": {
                    "mode": "Goodput",
                    # Without a Dynamic SD schedule: the one way out is the turn-off under test.
                    "goodput": {"costProfileConfigMap": "memory-profile", "engineSchedule": False},
                },
            }
        },
    )
    load = LoadGenerator(env.router_url(name), "llama", max_tokens=48).start(concurrency=2)
    try:
        _wait_metrics(env, name)
        assert env.conditions(name)["CostProfileLoaded"]["status"] == "True"
        assert _latency(env, name)["speculation"] == "On"
        load.set_concurrency(32)
        off = _wait_mode(env, name, "Off", timeout=150)
        assert off["reason"] == "GoodputMemoryBound", off
        assert "memory-bound" in off["message"], off
        _wait_settled(env, name, timeout=120)
        assert "--speculative-config" not in _engine_args(env, name)
        # The speculating engines did run out of KV: they preempted requests (vLLM's counter, scraped).
        assert env.prometheus is not None
        sel = (
            f'namespace="{env.namespace}",specfleet_io_deployment="{name}",specfleet_io_pool="latency",'
            f'{SERIES_SPECULATION}="On"'
        )
        preempted = env.prometheus.query(f"sum(max_over_time(vllm:num_preemptions_total{{{sel}}}[5m]))")
        assert preempted, "no vllm:num_preemptions_total of the speculating engines in Prometheus"
        assert float(preempted[0]["value"][1]) > 0, preempted
        # The engines without the drafter hold the whole load: later sweeps keep the pool off. Read
        # while the load still runs: once it stops, the pool rightly turns back on (below 1 per replica).
        env.wait_sweeps(3)
        history = env.sd(name)["status"].get("history", [])
        pool = _latency(env, name)
    finally:
        stats = load.stop()
        env.kubectl("delete", "sd", name, "-n", env.namespace, "--wait=false")
        env.kubectl("delete", "configmap", "memory-profile", "-n", env.namespace, "--wait=false")
    # As the demand measured climbs, K 3's lookahead slots cost a request of the cache before K 1's do:
    # the policy may retune to K 1 on the way (at 9 per replica in one run), then turns the pool off.
    changes = [(h["from"], h["to"], h["reason"]) for h in history]
    assert changes[-1] == ("On", "Off", "GoodputMemoryBound"), history
    assert set(changes[:-1]) <= {("On", "On", "GoodputRetune")}, history
    seen = history[-1]["observations"]
    assert seen["memoryBound"] == "true", seen
    assert seen["kvCacheTokens"] == f"off={KV_TOKENS}(profile),on={KV_TOKENS_WITH_DRAFTER}(measured)", seen
    assert pool["speculation"] == "Off"
    assert stats.ok > 20
    assert stats.failed == 0, stats.errors


def _tokens_per_draft(env: Env, name: str) -> float | None:
    """Draft tokens per draft of the pool's engines over the last 6 s, through the real Prometheus."""
    assert env.prometheus is not None
    sel = f'specfleet_io_deployment="{name}",specfleet_io_pool="latency"'
    result = env.prometheus.query(
        f"sum(rate(vllm:spec_decode_num_draft_tokens_total{{{sel}}}[6s])) / "
        f"sum(rate(vllm:spec_decode_num_drafts_total{{{sel}}}[6s]))"
    )
    if not result:
        return None
    value = float(result[0]["value"][1])
    return None if math.isnan(value) else value


def test_goodput_gives_the_pool_a_schedule_and_k_then_follows_load_without_a_rollout(env):
    """Goodput with engineSchedule: past the batch size where K 3 stops paying, the operator gives the
    pool a Dynamic SD schedule (one rollout, status kept by the apiserver, the engines started from
    it); afterwards K follows the load inside the engines, with no further change of the pool. Last in
    the module (and deleted at its end): its 100 clients must not weigh on the simulator's check."""
    name = _fleet(
        env,
        "sched",
        {
            "spec": {
                "engine": {"maxNumSeqs": 128},
                "policy": {"mode": "Goodput", "goodput": {"engineSchedule": True}},
            }
        },
    )
    load = LoadGenerator(env.router_url(name), "llama", max_tokens=48).start(concurrency=2)
    try:
        _wait_metrics(env, name)
        assert "dynamicSchedule" not in _latency(env, name)
        # Well above the published drafter's K 3 / K 1 crossing (batch 45): K 1 predicts 7% more at 100.
        load.set_concurrency(100)
        retuned = wait_for(
            f"{name} schedule", lambda: (s := _latency(env, name)).get("dynamicSchedule") and s, timeout=120
        )
        assert retuned["speculation"] == "On"
        assert retuned["reason"] == "GoodputRetune"
        assert [r["numSpeculativeTokens"] for r in retuned["dynamicSchedule"]] == [3, 1, 0]
        _wait_settled(env, name)
        args = _engine_args(env, name)
        config = json.loads(args[args.index("--speculative-config") + 1])
        assert config["num_speculative_tokens"] == 3
        assert config["num_speculative_tokens_per_batch_size"] == [
            [r["minBatchSize"], r["maxBatchSize"], r["numSpeculativeTokens"]]
            for r in retuned["dynamicSchedule"]
        ]
        # The engines draft one token per step at these batch sizes, three once the load falls.
        wait_for(
            f"{name} drafts of 1", lambda: (t := _tokens_per_draft(env, name)) is not None and t < 1.5, 60
        )
        load.set_concurrency(2)
        wait_for(
            f"{name} drafts of 3", lambda: (t := _tokens_per_draft(env, name)) is not None and t > 2.5, 60
        )
        # What the pool did while K followed the load. Read now: left running at 2 clients, steady
        # windows of the emulated engines (slower than the profile they declare) can meet the realized
        # guard's three-window shortfall (RealizedBelowPrediction) a few seconds later, which is that
        # guard's work, not this test's subject.
        history = env.sd(name)["status"]["history"]
        pool = _latency(env, name)
    finally:
        stats = load.stop()
        # Its engines and router stop with it: no load left behind for anything that runs later.
        env.kubectl("delete", "sd", name, "-n", env.namespace, "--wait=false")
    assert [h["reason"] for h in history] == ["GoodputRetune"], history
    assert pool["speculation"] == "On"
    assert stats.failed == 0, stats.errors
