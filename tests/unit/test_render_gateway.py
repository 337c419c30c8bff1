"""Gateway mode: what it renders (InferencePools, pickers, objectives, the HTTPRoute), how the route
carries the router's rules, and the GatewayAccepted condition through a reconcile."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from specfleet.api import reasons
from specfleet.api.constants import LABEL_SPECULATION, LABEL_TRACK
from specfleet.api.validation import parse_resource
from specfleet.reconcile import reconcile
from specfleet.render import GATEWAY_KINDS, plan_of, render_children
from specfleet.render.common import RenderOptions
from specfleet.render.gateway import (
    OBJECTIVE_HEADER,
    http_route_rules,
    render_picker_deployment,
    unexpressed_rules,
)
from specfleet.render.router import render_router_deployment, routing_config
from specfleet_runtime.router.classify import classify, extract_facts
from support.fake_cluster import FakeCluster
from support.manifests import EXAMPLES, ROOT, load_yaml, merge

GATEWAY = ROOT / "examples" / "09-gateway.yaml"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
GATEWAY_KIND_NAMES = {kind for _, kind in GATEWAY_KINDS}


def _doc(patch=None):
    doc = load_yaml(GATEWAY)
    doc["metadata"].update(uid="uid-1", generation=1)
    return merge(doc, patch) if patch else doc


def _sd(patch=None):
    return parse_resource(_doc(patch))


def _by_key(children):
    return {(c["kind"], c["metadata"]["name"]): c for c in children}


@pytest.mark.parametrize("path", [p for p in EXAMPLES if "degraded" not in p.stem], ids=lambda p: p.stem)
def test_router_mode_renders_no_gateway_object_and_gateway_mode_no_router(path):
    sd = parse_resource(load_yaml(path))
    kinds = {c["kind"] for c in render_children(sd, plan_of({"latency": "On", "batch": "On"}))}
    names = {c["metadata"]["name"] for c in render_children(sd, plan_of({"latency": "On", "batch": "On"}))}
    if sd.spec.routing.gateway is None:
        assert not kinds & GATEWAY_KIND_NAMES
        assert f"{sd.name}-router" in names
    else:
        assert kinds >= GATEWAY_KIND_NAMES
        assert f"{sd.name}-router" not in names
        assert f"{sd.name}-routing" not in names


def _matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("modes", list(itertools.product(["On", "Off"], repeat=2)))
def test_each_inference_pool_selects_its_pools_pods_across_flips_and_canaries(modes):
    """Stable and canary pods, speculating or not, all match their own pool's InferencePool and no other."""
    sd = _sd({"spec": {"policy": {"reentry": {"canaryReplicas": 1}}}})
    children = render_children(sd, plan_of(dict(zip(["latency", "batch"], modes, strict=True))))
    by_key = _by_key(children)
    engine_pods = [
        c
        for c in children
        if c["kind"] == "Deployment" and c["metadata"]["labels"].get(LABEL_TRACK) is not None
    ]
    assert {track for c in engine_pods for track in [c["metadata"]["labels"][LABEL_TRACK]]} == {
        "stable",
        "canary",
    }
    for pool in ("latency", "batch"):
        ip = by_key[("InferencePool", f"assistant-{pool}")]
        selector = ip["spec"]["selector"]["matchLabels"]
        assert LABEL_SPECULATION not in selector
        assert LABEL_TRACK not in selector
        assert selector == by_key[("Service", f"assistant-{pool}")]["spec"]["selector"]
        assert ip["spec"]["targetPorts"] == [{"number": 8000}]
        for deploy in engine_pods:
            labels = deploy["spec"]["template"]["metadata"]["labels"]
            assert _matches(selector, labels) == (f"-{pool}" in deploy["metadata"]["name"])
    for pool in ("latency", "batch"):  # the pickers are engines of no pool
        picker = by_key[("Deployment", f"assistant-{pool}-epp")]
        for other in ("latency", "batch"):
            selector = by_key[("InferencePool", f"assistant-{other}")]["spec"]["selector"]["matchLabels"]
            assert not _matches(selector, picker["spec"]["template"]["metadata"]["labels"])


def test_inference_pools_name_their_pickers_with_the_failure_mode():
    children = _by_key(render_children(_sd(), plan_of({"latency": "On", "batch": "On"})))
    for pool in ("latency", "batch"):
        ref = children[("InferencePool", f"assistant-{pool}")]["spec"]["endpointPickerRef"]
        assert ref == {
            "kind": "Service",
            "name": f"assistant-{pool}-epp",
            "port": {"number": 9002},
            "failureMode": "FailOpen",
        }
        service = children[("Service", f"assistant-{pool}-epp")]
        assert service["spec"]["ports"][0]["port"] == 9002
    assert children[("InferenceObjective", "assistant-latency")]["spec"]["priority"] > 0
    assert children[("InferenceObjective", "assistant-batch")]["spec"]["priority"] < 0


def test_an_existing_picker_service_replaces_the_operators_for_that_pool_only():
    patch = {
        "spec": {
            "routing": {
                "gateway": {
                    "endpointPicker": {
                        "failureMode": "FailClose",
                        "services": {"batch": {"name": "my-epp", "port": 9100}},
                    }
                }
            }
        }
    }
    children = _by_key(render_children(_sd(patch), plan_of({"latency": "On", "batch": "On"})))
    ref = children[("InferencePool", "assistant-batch")]["spec"]["endpointPickerRef"]
    assert ref == {"kind": "Service", "name": "my-epp", "port": {"number": 9100}, "failureMode": "FailClose"}
    assert not any(name == "assistant-batch-epp" for _, name in children)
    assert ("Deployment", "assistant-latency-epp") in children


def test_the_picker_has_least_privilege_and_the_routers_hardening():
    sd = _sd()
    children = _by_key(render_children(sd, plan_of({"latency": "On", "batch": "On"})))
    role = children[("Role", "assistant-batch-epp")]
    assert {v for r in role["rules"] for v in r["verbs"]} == {"get", "list", "watch"}
    pools_rule = next(r for r in role["rules"] if "inferencepools" in r["resources"])
    assert pools_rule["resourceNames"] == ["assistant-batch"]
    assert {res for r in role["rules"] for res in r["resources"]} == {
        "pods",
        "inferencepools",
        "inferenceobjectives",
        "inferencemodelrewrites",
    }
    router_mode = parse_resource(load_yaml(ROOT / "examples" / "02-two-pools-routing-policy.yaml"))
    router = render_router_deployment(router_mode, RenderOptions())["spec"]["template"]["spec"]
    picker = render_picker_deployment(sd, "batch")["spec"]["template"]["spec"]
    assert picker["securityContext"] == router["securityContext"]
    assert picker["containers"][0]["securityContext"] == router["containers"][0]["securityContext"]
    args = picker["containers"][0]["args"]
    assert args[:4] == ["--pool-name", "assistant-batch", "--pool-namespace", "inference"]
    assert args[-2:] == ["--v", "2"]


# --- The route carries the router's header rules -------------------------------------------------


def _gateway_pick(rules, headers):
    """The Gateway API's choice among the matches of one route: most header matches, then the first
    rule in list order; a rule without matches matches every request (with no headers)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    best = None
    for index, rule in enumerate(rules):
        for match in rule.get("matches") or [{"headers": []}]:
            wanted = match.get("headers") or []
            if all(lowered.get(h["name"].lower()) == h["value"] for h in wanted):
                key = (-len(wanted), index)
                best = min(best, (key, rule)) if best else (key, rule)
    assert best is not None
    rule = best[1]
    backend = rule["backendRefs"][0]
    objective = rule["filters"][0]["requestHeaderModifier"]["set"][0]
    assert objective == {"name": OBJECTIVE_HEADER, "value": backend["name"]}
    return backend["name"].rsplit("-", 1)[1]


ROUTING_CASES = [
    {"poolHeaderTrust": trust, "tenantHeaderTrust": tenant_trust, "defaultPool": default}
    for trust in ("Always", "AfterTenantRules", "Ignored")
    for tenant_trust in ("Trusted", "Ignored")
    for default in ("latency", "batch")
]


@pytest.mark.parametrize("routing", ROUTING_CASES, ids=lambda r: "-".join(r.values()))
def test_the_route_sends_every_header_combination_where_the_router_would(routing):
    rules_spec = [
        {"pool": "batch", "tenants": ["etl", "evals"]},
        {"pool": "latency", "tenants": ["chat", "etl"]},  # etl: the first rule wins
    ]
    tenant_rules = rules_spec if routing["tenantHeaderTrust"] == "Trusted" else []
    patch = {"spec": {"routing": {**routing, "tenantRules": tenant_rules, "fallback": "Reject"}}}
    sd = _sd(patch)
    rules = http_route_rules(sd)
    config = routing_config(sd)
    pool_values = [None, "latency", "batch"]
    tenants = [None, "etl", "evals", "chat", "nobody"]
    for pool_value, tenant in itertools.product(pool_values, tenants):
        headers = {}
        if pool_value:
            headers["X-Specfleet-Pool"] = pool_value
        if tenant:
            headers["x-specfleet-tenant"] = tenant
        facts = extract_facts(
            config, {k.lower(): v for k, v in headers.items()}, {"stream": True}, "10.0.0.1"
        )
        assert _gateway_pick(rules, headers) == classify(config, facts, False).pool, headers


def test_many_tenants_split_into_rules_within_the_gateway_api_limits():
    tenants = [f"t{i}" for i in range(100)]
    sd = _sd({"spec": {"routing": {"tenantRules": [{"pool": "batch", "tenants": tenants}]}}})
    rules = http_route_rules(sd)
    assert len(rules) <= 16
    assert all(len(r.get("matches", [])) <= 64 for r in rules)
    assert sum(len(r.get("matches", [])) for r in rules) <= 128
    assert len({r["name"] for r in rules}) == len(rules)
    for tenant in tenants:
        assert _gateway_pick(rules, {"x-specfleet-tenant": tenant}) == "batch"


def test_what_a_route_cannot_express_is_named():
    assert unexpressed_rules(_sd()) == []
    sd = _sd(
        {
            "spec": {
                "routing": {
                    "shape": {"batchIfMaxTokensAtLeast": 4096, "batchIfNotStreaming": True},
                    "autoSegmentation": {"enabled": True},
                    "fallback": "OtherPool",
                    "tenantRules": [{"pool": "batch", "apiKeySha256": ["a" * 64]}],
                }
            }
        }
    )
    lost = "; ".join(unexpressed_rules(sd))
    for word in (
        "batchIfMaxTokensAtLeast",
        "batchIfNotStreaming",
        "auto-segmentation",
        "apiKeySha256",
        "OtherPool",
    ):
        assert word in lost


# --- GatewayAccepted -----------------------------------------------------------------------------


def _conditions(status):
    return {c["type"]: c for c in status["conditions"]}


def _report(cluster, kind, name, conditions, generation=None):
    live = cluster.objects[(kind, "inference", name)]
    gen = generation if generation is not None else live["metadata"]["generation"]
    live["status"] = {
        "parents": [
            {
                "parentRef": {"name": "inference-gateway", "namespace": "gateway-system"},
                "controllerName": "example.com/gateway",
                "conditions": [
                    {"type": t, "status": s, "reason": r, "message": m, "observedGeneration": gen}
                    for t, s, r, m in conditions
                ],
            }
        ]
    }


ACCEPTED = [("Accepted", "True", "Accepted", ""), ("ResolvedRefs", "True", "ResolvedRefs", "")]
CHILDREN = [
    ("HTTPRoute", "assistant"),
    ("InferencePool", "assistant-latency"),
    ("InferencePool", "assistant-batch"),
]


def test_gateway_accepted_is_unknown_until_the_gateway_reports_then_true_then_false():
    cluster = FakeCluster()
    first = reconcile(_doc(), cluster, NOW)
    condition = _conditions(first.status)[reasons.GATEWAY_ACCEPTED]
    assert (condition["status"], condition["reason"]) == ("Unknown", reasons.ROUTES_PENDING)
    for kind, name in CHILDREN:
        _report(cluster, kind, name, ACCEPTED)
    second = reconcile(_doc() | {"status": first.status}, cluster, NOW + timedelta(seconds=30))
    condition = _conditions(second.status)[reasons.GATEWAY_ACCEPTED]
    assert (condition["status"], condition["reason"]) == ("True", reasons.ROUTES_ACCEPTED)
    assert "gateway-system/inference-gateway" in condition["message"]
    refused = [("Accepted", "False", "NotAllowedByListeners", "no listener allows inference"), ACCEPTED[1]]
    _report(cluster, "HTTPRoute", "assistant", refused)
    third = reconcile(_doc() | {"status": second.status}, cluster, NOW + timedelta(seconds=60))
    condition = _conditions(third.status)[reasons.GATEWAY_ACCEPTED]
    assert (condition["status"], condition["reason"]) == ("False", reasons.ROUTES_NOT_ACCEPTED)
    assert "NotAllowedByListeners" in condition["message"]
    assert "HTTPRoute/assistant" in condition["message"]
    # A report on an older generation is not an answer about this one.
    _report(cluster, "HTTPRoute", "assistant", ACCEPTED, generation=0)
    fourth = reconcile(_doc() | {"status": third.status}, cluster, NOW + timedelta(seconds=90))
    assert _conditions(fourth.status)[reasons.GATEWAY_ACCEPTED]["status"] == "Unknown"


def test_gateway_accepted_names_the_rules_the_route_drops():
    cluster = FakeCluster()
    patch = {"spec": {"routing": {"autoSegmentation": {"enabled": True}, "shape": {"batchIfNAtLeast": 4}}}}
    result = reconcile(_doc(patch), cluster, NOW)
    message = _conditions(result.status)[reasons.GATEWAY_ACCEPTED]["message"]
    assert "not expressed by the route" in message
    assert "auto-segmentation" in message
    assert "batchIfNAtLeast" in message


def test_leaving_gateway_mode_prunes_the_gateway_objects_and_drops_the_condition():
    cluster = FakeCluster()
    first = reconcile(_doc(), cluster, NOW)
    assert ("HTTPRoute", "inference", "assistant") in cluster.objects
    body = merge(_doc(), {"spec": {"routing": {"gateway": None}}})
    body["metadata"]["generation"] = 2
    second = reconcile(body | {"status": first.status}, cluster, NOW + timedelta(seconds=30))
    assert not [k for k in cluster.objects if k[0] in GATEWAY_KIND_NAMES]
    assert not [k for k in cluster.objects if k[2].endswith("-epp")]
    assert ("Deployment", "inference", "assistant-router") in cluster.objects
    assert reasons.GATEWAY_ACCEPTED not in _conditions(second.status)


def test_router_mode_never_lists_gateway_kinds():
    """A cluster without the Gateway CRDs or RBAC must not see a list of those kinds in router mode."""

    class Recording(FakeCluster):
        listed: list[str] = []

        def list_children(self, api_version, kind, namespace, labels):
            self.listed.append(kind)
            return super().list_children(api_version, kind, namespace, labels)

    cluster = Recording()
    doc = load_yaml(ROOT / "examples" / "02-two-pools-routing-policy.yaml")
    doc["metadata"].update(uid="uid-1", generation=1)
    first = reconcile(doc, cluster, NOW)
    doc2 = merge(doc, {"spec": {"pools": {"batch": {"replicas": 3}}}})
    doc2["metadata"]["generation"] = 2
    reconcile(doc2 | {"status": first.status}, cluster, NOW + timedelta(seconds=30))
    assert "Deployment" in cluster.listed
    assert not set(cluster.listed) & GATEWAY_KIND_NAMES


# --- The chart's RBAC for gateway mode -----------------------------------------------------------

CHART_RBAC = ROOT / "charts" / "specfleet" / "templates" / "rbac.yaml"
GATEWAY_BLOCK = "{{- if .Values.gatewayMode.enabled }}"


def _cluster_role_rules(gateway_mode: bool):
    """The operator ClusterRole's rules with the gateway block kept or dropped (template lines removed)."""
    first = CHART_RBAC.read_text().split("\n---")[0]
    before, _, rest = first.partition(GATEWAY_BLOCK)
    block, _, after = rest.partition("{{- end }}")
    text = before + (block if gateway_mode else "") + after
    plain = "\n".join(line for line in text.splitlines() if "{{" not in line)
    return yaml.safe_load(plain)["rules"]


def _allowed(rules, group, resource):
    return {v for r in rules if group in r["apiGroups"] and resource in r["resources"] for v in r["verbs"]}


@pytest.mark.parametrize(("api_version", "kind"), GATEWAY_KINDS, ids=[k for _, k in GATEWAY_KINDS])
def test_the_chart_grants_the_gateway_kinds_only_with_gateway_mode(api_version, kind):
    group, plural = api_version.rpartition("/")[0], kind.lower() + "s"
    assert {"get", "list", "create", "patch", "delete"} <= _allowed(_cluster_role_rules(True), group, plural)
    assert not _allowed(_cluster_role_rules(False), group, plural)


def test_the_operator_holds_everything_it_grants_a_picker():
    """RBAC forbids granting what one does not hold: every picker rule is within the gateway-mode
    ClusterRole (resourceNames only narrow it), and without gateway mode it would not be."""
    role = render_children(_sd(), plan_of({"latency": "On", "batch": "On"}))
    picker_rules = next(c for c in role if c["kind"] == "Role" and c["metadata"]["name"].endswith("-epp"))[
        "rules"
    ]
    wanted = {
        (g, res, v)
        for r in picker_rules
        for g in r["apiGroups"]
        for res in r["resources"]
        for v in r["verbs"]
    }
    held = {(g, res, v) for g, res, v in wanted if v in _allowed(_cluster_role_rules(True), g, res)}
    assert held == wanted
    assert {
        (g, res, v) for g, res, v in wanted if v in _allowed(_cluster_role_rules(False), g, res)
    } != wanted


def test_the_crd_scripts_fetch_the_versions_the_renderer_targets():
    from specfleet.api.gateway import DEFAULT_PICKER_IMAGE, GATEWAY_API_VERSION, INFERENCE_EXTENSION_VERSION

    gateway = (ROOT / "scripts" / "setup-gateway-api-crds.sh").read_text()
    inference = (ROOT / "scripts" / "setup-inference-extension-crds.sh").read_text()
    assert f"sigs.k8s.io/gateway-api {GATEWAY_API_VERSION} " in gateway
    assert f"sigs.k8s.io/gateway-api-inference-extension {INFERENCE_EXTENSION_VERSION} " in inference
    # The endpoint picker the cluster tier runs is the one the default image carries.
    assert f"\nversion={INFERENCE_EXTENSION_VERSION}\n" in (ROOT / "scripts" / "build-epp.sh").read_text()
    # The ext_proc client that plays the gateway against it is built against the same picker's pins.
    client_script = (ROOT / "scripts" / "build-extproc-client.sh").read_text()
    assert f"\nepp_version={INFERENCE_EXTENSION_VERSION}\n" in client_script
    client_mod = (ROOT / "testbed" / "extproc-client" / "go.mod").read_text()
    assert f"\tsigs.k8s.io/gateway-api-inference-extension {INFERENCE_EXTENSION_VERSION}\n" in client_mod
    assert DEFAULT_PICKER_IMAGE.endswith(f":{INFERENCE_EXTENSION_VERSION}")
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"Gateway API Inference Extension {INFERENCE_EXTENSION_VERSION}" in readme
    assert f"Gateway API {GATEWAY_API_VERSION}" in readme
