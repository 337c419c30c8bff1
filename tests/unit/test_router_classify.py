"""Router classification: precedence table, request parsing, auto-segmentation state, properties."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specfleet_runtime.router.classify import (
    Classification,
    ClientLoadTracker,
    ClientVerdict,
    InvalidRequest,
    Reason,
    RequestFacts,
    bearer_token,
    classify,
    client_identity,
    extract_facts,
    sha256_hex,
)
from specfleet_runtime.routing_config import (
    AutoSegmentation,
    PoolBackend,
    RoutingConfig,
    ShapeRules,
    TenantRule,
)

KEY = "sk-team-batch"
KEY_HASH = sha256_hex(KEY)
POOLS = {"latency": PoolBackend(static_urls=("http://l",)), "batch": PoolBackend(static_urls=("http://b",))}


def make_config(**overrides: Any) -> RoutingConfig:
    fields: dict[str, Any] = {
        "served_model_name": "m",
        "pools": POOLS,
        "tenant_rules": (
            TenantRule(pool="batch", tenants=("etl",)),
            TenantRule(pool="latency", tenants=("chat",), api_key_sha256=(sha256_hex("sk-vip"),)),
            TenantRule(pool="batch", api_key_sha256=(KEY_HASH,)),
        ),
        "shape": ShapeRules(batch_if_max_tokens_at_least=1024, batch_if_n_at_least=4),
    }
    fields.update(overrides)
    return RoutingConfig(**fields)


CONFIG = make_config()


def facts(**kw: Any) -> RequestFacts:
    return RequestFacts(client_id=kw.pop("client_id", "addr:1.2.3.4"), **kw)


@pytest.mark.parametrize(
    ("request_facts", "segmented", "expected"),
    [
        # 1. tenant and API-key rules, first matching rule wins; they beat the client's own header
        (facts(pool_header="latency", tenant="etl", max_tokens=4096), True, ("batch", Reason.TENANT)),
        (facts(pool_header="batch", tenant="chat"), False, ("latency", Reason.TENANT)),
        (facts(pool_header="latency", api_key_sha256=KEY_HASH), False, ("batch", Reason.API_KEY)),
        # 2. the explicit header, where no rule matched, beats shape and segmentation
        (
            facts(pool_header="latency", tenant="other", max_tokens=4096),
            True,
            ("latency", Reason.POOL_HEADER),
        ),
        (facts(pool_header="batch", stream=True), False, ("batch", Reason.POOL_HEADER)),
        (facts(tenant="etl"), False, ("batch", Reason.TENANT)),
        (facts(tenant="chat", max_tokens=4096, choices=8), True, ("latency", Reason.TENANT)),
        (facts(api_key_sha256=sha256_hex("sk-vip"), max_tokens=4096), False, ("latency", Reason.API_KEY)),
        (facts(api_key_sha256=KEY_HASH), False, ("batch", Reason.API_KEY)),
        (
            facts(tenant="unknown-tenant", api_key_sha256=sha256_hex("other")),
            False,
            ("latency", Reason.DEFAULT),
        ),
        # 3. request shape
        (facts(max_tokens=1024), False, ("batch", Reason.SHAPE_MAX_TOKENS)),
        (facts(max_tokens=1023), False, ("latency", Reason.DEFAULT)),
        (facts(choices=4), False, ("batch", Reason.SHAPE_N)),
        (facts(choices=3, stream=True), False, ("latency", Reason.DEFAULT)),
        (facts(unbounded=True, stream=True), False, ("batch", Reason.SHAPE_MAX_TOKENS)),
        (facts(max_tokens=2048), True, ("batch", Reason.SHAPE_MAX_TOKENS)),
        # 4. auto-segmentation
        (facts(stream=True), True, ("batch", Reason.AUTO_SEGMENTATION)),
        # 5. default
        (facts(), False, ("latency", Reason.DEFAULT)),
    ],
)
def test_precedence_table(request_facts: RequestFacts, segmented: bool, expected: tuple[str, Reason]) -> None:
    assert classify(CONFIG, request_facts, segmented) == Classification(*expected)  # type: ignore[arg-type]


def test_pool_header_trust_settings() -> None:
    etl_wants_latency = facts(pool_header="latency", tenant="etl")
    always = make_config(pool_header_trust="Always")
    assert classify(always, etl_wants_latency, False) == Classification("latency", Reason.POOL_HEADER)
    ignored = make_config(pool_header_trust="Ignored")
    assert classify(ignored, etl_wants_latency, False) == Classification("batch", Reason.TENANT)
    # Ignored: the header is not even read, so a bad value is no error either.
    got = extract_facts(ignored, {"x-specfleet-pool": "gpu", "x-specfleet-tenant": "etl"}, None, "1.2.3.4")
    assert got.pool_header is None
    with pytest.raises(InvalidRequest):
        extract_facts(CONFIG, {"x-specfleet-pool": "gpu"}, None, "1.2.3.4")
    with pytest.raises(ValueError, match="poolHeaderTrust"):
        RoutingConfig.from_json('{"servedModelName": "m", "pools": {"latency": {"staticUrls": ["http://l"]}}, '
                                '"poolHeaderTrust": "Sometimes"}')  # fmt: skip


def test_not_streaming_rule_and_default_pool() -> None:
    config = make_config(shape=ShapeRules(batch_if_not_streaming=True), default_pool="batch")
    assert classify(config, facts(stream=False), False) == Classification("batch", Reason.SHAPE_NOT_STREAMING)
    assert classify(config, facts(stream=True), False) == Classification("batch", Reason.DEFAULT)


def test_segmentation_ignored_when_disabled() -> None:
    config = make_config(auto_segmentation=AutoSegmentation(enabled=False))
    assert classify(config, facts(), True) == Classification("latency", Reason.DEFAULT)


# ---- request parsing -----------------------------------------------------------------------------


def test_extract_facts_reads_headers_and_body() -> None:
    trusted = make_config(tenant_header_trust="Trusted")
    headers = {
        "authorization": f"Bearer {KEY}",
        "x-specfleet-tenant": " etl ",
        "x-specfleet-pool": "BATCH",
    }
    body = {"stream": True, "max_tokens": 10, "max_completion_tokens": 300, "n": 2}
    got = extract_facts(trusted, headers, body, "10.0.0.9")
    assert got == RequestFacts(
        client_id=f"key:{KEY_HASH[:16]}",
        pool_header="batch",
        tenant="etl",
        api_key_sha256=KEY_HASH,
        stream=True,
        max_tokens=300,
        choices=2,
    )


@pytest.mark.parametrize(
    ("body", "prompts", "endpoint", "max_tokens", "unbounded", "choices"),
    [
        ({}, 1, "chat", None, True, 1),  # a chat request without a limit runs to the end of the context
        ({"max_completion_tokens": 9}, 1, "chat", 9, False, 1),
        ({}, 1, "completions", 16, False, 1),  # vLLM's completions default
        ({"n": 3}, 32, "completions", 16, False, 96),  # prompts x n choices
        ({"n": 3}, 1, None, None, False, 3),
    ],
)
def test_extract_facts_shapes_the_output_a_request_asks_for(
    body: dict[str, Any], prompts: int, endpoint: Any, max_tokens: int | None, unbounded: bool, choices: int
) -> None:
    got = extract_facts(CONFIG, {}, body, None, prompts=prompts, endpoint=endpoint)
    assert (got.max_tokens, got.unbounded, got.choices) == (max_tokens, unbounded, choices)


def test_extract_facts_without_body_or_headers() -> None:
    assert extract_facts(CONFIG, {}, None, None) == RequestFacts(client_id="addr:unknown")
    assert extract_facts(CONFIG, {}, {"stream": None}, "1.1.1.1").stream is False


@pytest.mark.parametrize(
    ("body", "headers", "param"),
    [
        ({"stream": "yes"}, {}, "stream"),
        ({"stream": 1}, {}, "stream"),
        ({"max_tokens": "100"}, {}, "max_tokens"),
        ({"max_tokens": 1.5}, {}, "max_tokens"),
        ({"max_completion_tokens": True}, {}, "max_completion_tokens"),
        ({"n": [2]}, {}, "n"),
        ({"n": False}, {}, "n"),
        ({}, {"x-specfleet-pool": "gpu"}, "x-specfleet-pool"),
    ],
)
def test_wrong_types_are_invalid_requests(body: dict[str, Any], headers: dict[str, str], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        extract_facts(CONFIG, headers, body, "1.1.1.1")
    assert info.value.param == param


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer   abc  ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer   ", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_client_identity_precedence() -> None:
    assert client_identity("job-7", KEY_HASH, "1.2.3.4") == "client:job-7"
    assert client_identity(" ", KEY_HASH, "1.2.3.4") == f"key:{KEY_HASH[:16]}"
    assert client_identity(None, None, "1.2.3.4") == "addr:1.2.3.4"


# ---- identity trust ------------------------------------------------------------------------------

# A client claiming a tenant whose rule comes first (etl -> batch) and another client's identity.
CLAIMS = {"x-specfleet-tenant": "etl", "x-specfleet-client": "victim"}
VIP = {**CLAIMS, "authorization": "Bearer sk-vip"}


def test_identity_headers_are_ignored_unless_trusted() -> None:
    assert (CONFIG.tenant_header_trust, CONFIG.client_header_trust) == ("Ignored", "Ignored")
    vip = extract_facts(CONFIG, VIP, None, "10.0.0.9")
    assert (vip.tenant, vip.client_id) == (None, f"key:{sha256_hex('sk-vip')[:16]}")
    # The claimed tenant does not beat the rule of the client's own API key.
    assert classify(CONFIG, vip, False) == Classification("latency", Reason.API_KEY)
    anonymous = extract_facts(CONFIG, CLAIMS, None, "10.0.0.9")
    assert (anonymous.tenant, anonymous.client_id) == (None, "addr:10.0.0.9")
    assert classify(CONFIG, anonymous, False) == Classification("latency", Reason.DEFAULT)


def test_trusted_identity_headers_are_read() -> None:
    both = make_config(tenant_header_trust="Trusted", client_header_trust="Trusted")
    vip = extract_facts(both, VIP, None, "10.0.0.9")
    assert (vip.tenant, vip.client_id) == ("etl", "client:victim")
    assert classify(both, vip, False) == Classification("batch", Reason.TENANT)
    # Each header is trusted on its own, under the name the config gives it; blank is no identity.
    tenant_only = extract_facts(make_config(tenant_header_trust="Trusted"), CLAIMS, None, "10.0.0.9")
    assert (tenant_only.tenant, tenant_only.client_id) == ("etl", "addr:10.0.0.9")
    gateway = make_config(client_header="x-gateway-client", client_header_trust="Trusted")
    got = extract_facts(gateway, {**CLAIMS, "x-gateway-client": " job-7 "}, None, "10.0.0.9")
    assert (got.tenant, got.client_id) == (None, "client:job-7")
    blank = extract_facts(both, {"x-specfleet-tenant": " ", "x-specfleet-client": ""}, None, "10.0.0.9")
    assert (blank.tenant, blank.client_id) == (None, "addr:10.0.0.9")


def test_identity_trust_in_the_routing_document() -> None:
    base = '{"servedModelName": "m", "pools": {"latency": {"staticUrls": ["http://l"]}}'
    parsed = RoutingConfig.from_json(base + "}")
    assert (parsed.tenant_header_trust, parsed.client_header_trust) == ("Ignored", "Ignored")
    both = RoutingConfig.from_json(base + ', "tenantHeaderTrust": "Trusted", "clientHeaderTrust": "Trusted"}')
    assert RoutingConfig.from_json(both.to_json()) == both
    assert (both.tenant_header_trust, both.client_header_trust) == ("Trusted", "Trusted")
    for field in ("tenantHeaderTrust", "clientHeaderTrust"):
        with pytest.raises(ValueError, match=field):
            RoutingConfig.from_json(base + f', "{field}": "Always"}}')


# ---- auto-segmentation state machine --------------------------------------------------------------

POLICY = AutoSegmentation(enabled=True, in_flight_threshold=2, calm_seconds=10)


def test_client_exceeding_threshold_is_segmented_until_calm() -> None:
    tracker = ClientLoadTracker()
    verdicts = [tracker.begin("c", 0.0, POLICY) for _ in range(3)]
    # The request that takes the client over the threshold is already batch.
    assert [v.segmented for v in verdicts] == [False, False, True]
    assert verdicts[2].transition == "to_batch"
    assert tracker.begin("c", 1.0, POLICY) == ClientVerdict(True, None)
    for _ in range(4):
        tracker.end("c", 2.0, POLICY)
    # Idle, but not calm for long enough yet: a new request is still batch.
    assert tracker.begin("c", 11.9, POLICY).segmented
    tracker.end("c", 11.9, POLICY)
    assert tracker.begin("c", 12.0, POLICY).transition == "from_batch"


def test_calm_period_is_measured_from_the_last_drop() -> None:
    tracker = ClientLoadTracker()
    for _ in range(3):
        tracker.begin("c", 0.0, POLICY)
    tracker.end("c", 1.0, POLICY)  # 2 in flight: calm since t=1
    verdict = tracker.begin("c", 5.0, POLICY)  # 3 in flight: above again, calm resets
    assert verdict.segmented
    assert verdict.transition is None
    tracker.end("c", 6.0, POLICY)  # calm since t=6
    tracker.end("c", 7.0, POLICY)
    early = tracker.begin("c", 15.9, POLICY)
    assert early.segmented
    tracker.end("c", 15.9, POLICY)
    released = tracker.begin("c", 16.0, POLICY)
    assert (released.segmented, released.transition) == (False, "from_batch")


def test_idle_clients_are_forgotten_and_expire_releases() -> None:
    tracker = ClientLoadTracker()
    tracker.begin("a", 0.0, POLICY)
    tracker.end("a", 0.0, POLICY)
    assert len(tracker) == 0
    for _ in range(3):
        tracker.begin("b", 0.0, POLICY)
    for _ in range(3):
        tracker.end("b", 1.0, POLICY)
    assert tracker.segmented_count() == 1
    assert tracker.expire(10.9, POLICY) == []
    assert tracker.expire(11.0, POLICY) == ["b"]
    assert len(tracker) == 0


def test_disabled_policy_counts_but_never_segments() -> None:
    tracker = ClientLoadTracker()
    off = AutoSegmentation(enabled=False, in_flight_threshold=0)
    assert not tracker.begin("c", 0.0, off).segmented
    assert tracker.in_flight("c") == 1


# ---- properties -----------------------------------------------------------------------------------

pools = st.sampled_from(["latency", "batch"])
maybe_int = st.none() | st.integers(min_value=0, max_value=10_000)
facts_strategy = st.builds(
    RequestFacts,
    client_id=st.text(max_size=5),
    pool_header=st.none() | pools,
    tenant=st.none() | st.sampled_from(["etl", "chat", "other"]),
    api_key_sha256=st.none() | st.sampled_from([KEY_HASH, sha256_hex("sk-vip"), sha256_hex("x")]),
    stream=st.booleans(),
    max_tokens=maybe_int,
    unbounded=st.booleans(),
    choices=st.integers(min_value=0, max_value=10_000),
)
configs = st.builds(
    make_config,
    default_pool=pools,
    shape=st.builds(
        ShapeRules,
        batch_if_max_tokens_at_least=maybe_int,
        batch_if_n_at_least=maybe_int,
        batch_if_not_streaming=st.booleans(),
    ),
)


@given(config=configs, request_facts=facts_strategy, segmented=st.booleans())
def test_classification_properties(
    config: RoutingConfig, request_facts: RequestFacts, segmented: bool
) -> None:
    result = classify(config, request_facts, segmented)
    assert result.pool in ("latency", "batch")
    # Deterministic: same inputs, same answer.
    assert classify(config, request_facts, segmented) == result
    # The explicit header wins wherever no tenant or API-key rule decided (trust AfterTenantRules).
    if request_facts.pool_header is not None and result.reason not in (Reason.TENANT, Reason.API_KEY):
        assert result == Classification(request_facts.pool_header, Reason.POOL_HEADER)
    # ... and never against a rule: a client cannot leave the pool its rules assign.
    if result.reason == Reason.POOL_HEADER:
        rules = classify(config, replace(request_facts, pool_header=None), segmented)
        assert rules.reason not in (Reason.TENANT, Reason.API_KEY)
    # Shape and segmentation only ever push towards batch.
    if result.reason in (Reason.SHAPE_MAX_TOKENS, Reason.SHAPE_N, Reason.SHAPE_NOT_STREAMING):
        assert result.pool == "batch"
    if result.reason == Reason.AUTO_SEGMENTATION:
        assert segmented
        assert result.pool == "batch"
    # Segmentation never overrides a decision made by a rule above it.
    unsegmented = classify(config, request_facts, False)
    if unsegmented.reason != Reason.DEFAULT:
        assert result == unsegmented


@given(
    events=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.booleans(), st.floats(0, 5)), max_size=60)
)
@settings(max_examples=200)
def test_tracker_counts_and_segments_consistently(events: list[tuple[str, bool, float]]) -> None:
    tracker = ClientLoadTracker()
    in_flight: dict[str, int] = {}
    now = 0.0
    for client, starting, step in events:
        now += step
        if starting:
            in_flight[client] = in_flight.get(client, 0) + 1
            verdict = tracker.begin(client, now, POLICY)
            # Over the threshold means batch, always.
            if in_flight[client] > POLICY.in_flight_threshold:
                assert verdict.segmented
        elif in_flight.get(client):
            in_flight[client] -= 1
            tracker.end(client, now, POLICY)
        assert tracker.in_flight(client) == in_flight.get(client, 0)
    # Once everything ended and the calm period passed, nothing is left behind.
    for client, count in in_flight.items():
        for _ in range(count):
            tracker.end(client, now, POLICY)
    tracker.expire(now + POLICY.calm_seconds + 0.001, POLICY)  # + a hair: float rounding
    assert len(tracker) == 0
