"""Properties of the renderer that golden files alone would not make obvious."""

from __future__ import annotations

import json

import pytest

from specfleet.api.constants import ANNOTATION_RENDER_HASH, LABEL_POOL, LABEL_SPECULATION
from specfleet.api.validation import InvalidResourceError, parse_resource
from specfleet.render import plan_of, render_children
from specfleet.render.engine import engine_args
from specfleet.render.router import ROUTER_FALLBACK, routing_config
from specfleet_runtime.vllm_args import parse_vllm_args
from support.manifests import ROOT, load_yaml, merge

TWO_POOLS = ROOT / "examples" / "02-two-pools-routing-policy.yaml"
DYNAMIC = ROOT / "examples" / "04-dynamic-sd.yaml"
ON = plan_of({"latency": "On", "batch": "On"})


def _sd(path=TWO_POOLS, patch=None, uid="uid-1"):
    doc = load_yaml(path)
    doc["metadata"]["uid"] = uid
    if patch:
        doc = merge(doc, patch)
    return parse_resource(doc)


def _by_key(children):
    return {(c["kind"], c["metadata"]["name"]): c for c in children}


def _container(deploy):
    return deploy["spec"]["template"]["spec"]["containers"][0]


def test_render_is_deterministic():
    assert render_children(_sd(), ON) == render_children(_sd(), ON)


def test_speculative_config_only_when_on():
    children = _by_key(render_children(_sd(), plan_of({"latency": "On", "batch": "Off"})))
    latency = _container(children[("Deployment", "assistant-latency")])
    batch = _container(children[("Deployment", "assistant-batch")])
    assert "--speculative-config" in latency["args"]
    assert "--speculative-config" not in batch["args"]
    config = json.loads(latency["args"][latency["args"].index("--speculative-config") + 1])
    assert config == {
        "method": "eagle3",
        "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "num_speculative_tokens": 3,
    }
    assert children[("Deployment", "assistant-batch")]["metadata"]["labels"][LABEL_SPECULATION] == "Off"


def test_dynamic_schedule_reaches_the_command_line_sorted():
    sd = _sd(DYNAMIC)
    args = engine_args(sd, "latency", "On")
    assert args.speculative is not None
    rows = [(r.start, r.end, r.k) for r in args.speculative.dynamic_schedule]
    assert rows == [(1, 16, 5), (17, 32, 4), (33, 64, 3), (65, 128, 1), (129, 512, 0)]
    config = json.loads(args.speculative.to_json())
    assert config["num_speculative_tokens_per_batch_size"][0] == [1, 16, 5]
    assert "disable_by_batch_size" not in config


def test_command_line_round_trips_through_the_runtime_parser():
    sd = _sd()
    for pool in ("latency", "batch"):
        deploy = _by_key(render_children(sd, ON))[("Deployment", f"assistant-{pool}")]
        parsed, rest = parse_vllm_args(_container(deploy)["args"])
        assert parsed == engine_args(sd, pool, "On")
        assert rest == []


def test_pool_override_changes_only_that_pool():
    before = _by_key(render_children(_sd(), ON))
    after = _by_key(
        render_children(_sd(patch={"spec": {"pools": {"batch": {"engine": {"maxNumSeqs": 64}}}}}), ON)
    )
    changed = sorted(k for k in before if before[k] != after[k])
    assert changed == [("Deployment", "assistant-batch"), ("Deployment", "assistant-batch-canary")]
    assert "64" in _container(after[("Deployment", "assistant-batch")])["args"]


def test_flip_changes_only_that_pools_deployment():
    before = _by_key(render_children(_sd(), ON))
    after = _by_key(render_children(_sd(), plan_of({"latency": "Off", "batch": "On"})))
    changed = sorted(k for k in before if before[k] != after[k])
    assert changed == [("Deployment", "assistant-latency"), ("Deployment", "assistant-latency-canary")]


def test_canary_keeps_speculating_while_its_pool_is_off():
    children = _by_key(render_children(_sd(), plan_of({"latency": "Off", "batch": "On"})))
    stable = children[("Deployment", "assistant-latency")]
    canary = children[("Deployment", "assistant-latency-canary")]
    assert (stable["spec"]["replicas"], canary["spec"]["replicas"]) == (2, 1)
    assert "--speculative-config" not in _container(stable)["args"]
    assert "--speculative-config" in _container(canary)["args"]
    # Both tracks sit behind the pool's Service, each Deployment selects only its own pods.
    service = children[("Service", "assistant-latency")]
    assert "specfleet.io/track" not in service["spec"]["selector"]
    assert stable["spec"]["selector"]["matchLabels"]["specfleet.io/track"] == "stable"
    assert canary["spec"]["selector"]["matchLabels"]["specfleet.io/track"] == "canary"
    on = _by_key(render_children(_sd(), ON))
    assert on[("Deployment", "assistant-latency-canary")]["spec"]["replicas"] == 0
    assert on[("Deployment", "assistant-latency")]["spec"]["replicas"] == 3


def test_hash_annotation_tracks_content():
    a = _by_key(render_children(_sd(), ON))
    b = _by_key(render_children(_sd(), plan_of({"latency": "Off", "batch": "On"})))
    key = ("Deployment", "assistant-latency")
    assert (
        a[key]["metadata"]["annotations"][ANNOTATION_RENDER_HASH]
        != b[key]["metadata"]["annotations"][ANNOTATION_RENDER_HASH]
    )
    svc = ("Service", "assistant-latency")
    assert a[svc]["metadata"]["annotations"] == b[svc]["metadata"]["annotations"]


def test_hf_token_only_through_secret_ref():
    deploy = _by_key(render_children(_sd(), ON))[("Deployment", "assistant-latency")]
    container = _container(deploy)
    token = next(e for e in container["env"] if e["name"] == "HF_TOKEN")
    assert token == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    assert not any("hf-token" in a or a == "token" for a in container["args"])


def test_engine_pod_shape():
    deploy = _by_key(render_children(_sd(), ON))[("Deployment", "assistant-latency")]
    spec = deploy["spec"]
    assert spec["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    assert LABEL_SPECULATION not in spec["selector"]["matchLabels"]
    assert spec["selector"]["matchLabels"][LABEL_POOL] == "latency"
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 1800
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
    assert pod["volumes"][0] == {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}
    assert pod["terminationGracePeriodSeconds"] == 120
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]


def test_the_prestop_sleep_stays_below_a_short_grace_period():
    """The apiserver refuses a preStop sleep that is not below terminationGracePeriodSeconds."""

    def lifecycle(grace):
        patch = {"spec": {"engine": {"terminationGracePeriodSeconds": grace}}}
        deploy = _by_key(render_children(_sd(patch=patch), ON))[("Deployment", "assistant-latency")]
        return _container(deploy).get("lifecycle")

    assert lifecycle(120) == {"preStop": {"sleep": {"seconds": 10}}}
    assert lifecycle(3) == {"preStop": {"sleep": {"seconds": 2}}}
    assert lifecycle(1) is None
    assert lifecycle(0) is None


def test_engine_pods_are_locked_down():
    deploy = _by_key(render_children(_sd(), ON))[("Deployment", "assistant-latency")]
    pod = deploy["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
    }
    # Non-root and read-only root on request; every writable path is then an explicit volume.
    patch = {"spec": {"engine": {"security": {"runAsUser": 1000, "readOnlyRootFilesystem": True}}}}
    deploy = _by_key(render_children(_sd(patch=patch), ON))[("Deployment", "assistant-latency")]
    pod = deploy["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["fsGroup"] == 1000
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert set(mounts) == {"/tmp", "/dev/shm", "/root/.cache/huggingface"}
    assert {v["name"] for v in pod["volumes"]} == set(mounts.values())
    assert {"name": "HOME", "value": "/tmp"} in container["env"]


def test_router_role_reads_only_its_config_map():
    role = _by_key(render_children(_sd(), ON))[("Role", "assistant-router")]
    config_rule = next(r for r in role["rules"] if r["resources"] == ["configmaps"])
    assert config_rule["resourceNames"] == ["assistant-routing"]
    assert set(config_rule["verbs"]) == {"get", "list", "watch"}


def test_every_routing_field_reaches_the_router():
    """Each `spec.routing` field (but `router`) is copied into routing.json, none left at its default."""
    routing = {
        "defaultPool": "batch",
        "poolHeader": "x-gateway-pool",
        "poolHeaderTrust": "Always",
        "tenantHeader": "x-gateway-tenant",
        "tenantHeaderTrust": "Trusted",
        "clientHeader": "x-gateway-client",
        "clientHeaderTrust": "Trusted",
        "tenantRules": [{"pool": "batch", "tenants": ["etl"], "apiKeySha256": ["a" * 64]}],
        "shape": {"batchIfMaxTokensAtLeast": 9, "batchIfNAtLeast": 3, "batchIfNotStreaming": True},
        "autoSegmentation": {"enabled": False, "inFlightThreshold": 3, "calmSeconds": 7},
        "fallback": "Reject",
        "endpointSelection": {
            "latency": {"strategy": "PrefixAffinity", "loadBoundPercent": 150},
            "batch": {"strategy": "PrefixAffinity"},
        },
    }
    sd = _sd(patch={"spec": {"routing": routing}})
    spec = sd.spec.routing.model_dump(by_alias=True, exclude={"router", "gateway"})
    defaults = type(sd.spec.routing)().model_dump(by_alias=True)
    rendered = json.loads(routing_config(sd).to_json())
    assert set(spec) == set(routing)
    for key, value in spec.items():
        assert value != defaults[key], key
        assert rendered[key] == (ROUTER_FALLBACK[value] if key == "fallback" else value), key


@pytest.mark.parametrize(("old", "new"), [("otherPool", "OtherPool"), ("reject", "Reject")])
def test_a_deprecated_fallback_spelling_is_read_as_the_new_one(old, new):
    sd = _sd(patch={"spec": {"routing": {"fallback": old}}})
    assert sd.spec.routing.fallback == new
    renewed = _sd(patch={"spec": {"routing": {"fallback": new}}})
    assert render_children(sd, ON) == render_children(renewed, ON)
    with pytest.raises(InvalidResourceError, match="fallback"):
        _sd(patch={"spec": {"routing": {"fallback": "Otherpool"}}})


def test_the_routing_spec_declares_the_routing_contract_fields_with_its_defaults():
    """`routing_config` passes `spec.routing` through as it is: the API's routing models have the
    contract's fields (but the router Deployment's) and take their defaults from it."""
    import dataclasses

    from specfleet.api import routing
    from specfleet_runtime import routing_config as contract

    pairs = [
        (routing.RoutingSpec, contract.RoutingConfig, {"router", "gateway"}, {"served_model_name", "pools"}),
        (routing.TenantRule, contract.TenantRule, set(), set()),
        (routing.ShapeRules, contract.ShapeRules, set(), set()),
        (routing.AutoSegmentation, contract.AutoSegmentation, set(), set()),
        (routing.PoolEndpointSelection, contract.PoolEndpointSelection, set(), set()),
        (routing.EndpointSelection, contract.EndpointSelection, set(), set()),
    ]
    for api, runtime, api_only, runtime_only in pairs:
        declared = {f.name: f for f in dataclasses.fields(runtime) if f.name not in runtime_only}
        assert set(api.model_fields) - api_only == set(declared), api.__name__
        for name, field in declared.items():
            if field.default is not dataclasses.MISSING:
                default = api.model_fields[name].get_default(call_default_factory=True)
                default = tuple(default) if isinstance(default, list) else default
                if api is routing.RoutingSpec and name == "fallback":
                    # The API spells it UpperCamel; the router's routing.json keeps its old spelling.
                    from specfleet.render.router import ROUTER_FALLBACK

                    default = ROUTER_FALLBACK[default]
                assert default == field.default, f"{api.__name__}.{name}"


def test_owner_references_and_no_uid_means_none():
    children = render_children(_sd(), ON)
    assert all(c["metadata"]["ownerReferences"][0]["uid"] == "uid-1" for c in children)
    assert all("ownerReferences" not in c["metadata"] for c in render_children(_sd(uid=""), ON))


def test_pod_monitor_only_when_asked():
    kinds = [c["kind"] for c in render_children(_sd(), ON)]
    assert "PodMonitor" in kinds
    no_monitor = _sd(patch={"spec": {"monitoring": {"podMonitor": False}}})
    assert "PodMonitor" not in [c["kind"] for c in render_children(no_monitor, ON)]


def test_monitoring_labels_of_the_installation_yield_to_the_resources():
    from specfleet.render import RenderOptions

    options = RenderOptions(monitoring_labels=(("release", "kube-prometheus-stack"), ("team", "ml")))
    sd = _sd(patch={"spec": {"monitoring": {"prometheusRule": True, "labels": {"release": "mine"}}}})
    monitors = [c for c in render_children(sd, ON, options) if c["kind"] in ("PodMonitor", "PrometheusRule")]
    assert len(monitors) == 2
    for monitor in monitors:
        assert monitor["metadata"]["labels"]["release"] == "mine"
        assert monitor["metadata"]["labels"]["team"] == "ml"
    engines = [c for c in render_children(sd, ON, options) if c["kind"] == "Deployment"]
    assert all("team" not in c["metadata"]["labels"] for c in engines)


def test_pdb_defaults_to_one_disruption():
    pdb = _by_key(render_children(_sd(), ON))[("PodDisruptionBudget", "assistant-latency")]
    assert pdb["spec"]["minAvailable"] == 2


def test_drafter_preflight_runs_before_every_engine_that_loads_a_drafter():
    from specfleet.render.common import RenderOptions

    options = RenderOptions(router_image="registry.example/specfleet:9.9")
    children = _by_key(render_children(_sd(), plan_of({"latency": "On", "batch": "Off"}), options))
    latency = children[("Deployment", "assistant-latency")]["spec"]["template"]["spec"]
    (init,) = latency["initContainers"]
    assert init["name"] == "drafter-preflight"
    # The operator's image carries specfleet_runtime; the vLLM image does not.
    assert init["image"] == "registry.example/specfleet:9.9"
    assert init["command"] == ["python", "-m", "specfleet_runtime.drafter_preflight"]
    assert init["args"] == [
        "--method",
        "eagle3",
        "--target",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--drafter",
        "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "--cache-dir",
        "/root/.cache/huggingface",
        "--skip-missing",
        "--target-revision",
        "main",
    ]
    # It reads the engine's own model cache volume, and its stderr becomes the termination message.
    assert init["volumeMounts"] == [{"name": "model-cache", "mountPath": "/root/.cache/huggingface"}]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}} in latency["volumes"]
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert (
        init["securityContext"]
        == _container(children[("Deployment", "assistant-latency")])["securityContext"]
    )
    # Pods that load no drafter (a pool that is off) and methods without a checkpoint get none.
    batch = children[("Deployment", "assistant-batch")]["spec"]["template"]["spec"]
    assert "initContainers" not in batch
    canary = children[("Deployment", "assistant-batch-canary")]["spec"]["template"]["spec"]
    assert [c["name"] for c in canary["initContainers"]] == ["drafter-preflight"]
    ngram = render_children(_sd(ROOT / "examples" / "03-ngram.yaml"), ON)
    assert not any("initContainers" in c.get("spec", {}).get("template", {}).get("spec", {}) for c in ngram)


def test_cpu_limit_only_when_asked():
    deploy = _by_key(render_children(_sd(), ON))[("Deployment", "assistant-latency")]
    resources = _container(deploy)["resources"]
    assert resources["requests"]["cpu"] == "8"
    assert "cpu" not in resources["limits"]
    patch = {"spec": {"engine": {"resources": {"gpus": 1, "cpu": "8", "cpuLimit": "12", "memory": "64Gi"}}}}
    deploy = _by_key(render_children(_sd(patch=patch), ON))[("Deployment", "assistant-latency")]
    resources = _container(deploy)["resources"]
    assert resources["requests"]["cpu"] == "8"
    assert resources["limits"] == {"nvidia.com/gpu": 1, "cpu": "12", "memory": "64Gi"}


def test_replace_rollout_rolls_within_the_pools_gpus():
    """Replace: no surge pod (maxSurge 0), `maxUnavailable` engines stop first; Surge stays as it was."""
    patch = {"spec": {"pools": {"batch": {"rollout": {"strategy": "Replace", "maxUnavailable": 1}}}}}
    children = _by_key(render_children(_sd(patch=patch), ON))
    batch = children[("Deployment", "assistant-batch")]["spec"]["strategy"]
    latency = children[("Deployment", "assistant-latency")]["spec"]["strategy"]
    assert batch == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    assert latency["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
