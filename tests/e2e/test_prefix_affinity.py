"""Prefix affinity in the e2e tier: multi-turn conversations through the operator's router (compiled, as
the image ships it) to a pool of three emulated engines, once per endpoint selection; the engines' own
vllm:prefix_cache_hits_total, as the real Prometheus scraped it, tells which strategy sent each
conversation back to the engine that holds its prefix (real control plane, operator, emulators)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from specfleet_runtime import vllm_metrics as vm
from specfleet_sandbox.processes import wait_for
from support.e2e_env import Env, fleet, latency, print_dump_if_failed, running_env

pytestmark = pytest.mark.e2e

ENGINES = 3
# Not a multiple of ENGINES: conversations in lockstep would otherwise meet least outstanding's rotation
# at the same engine every turn, a stickiness real traffic does not have.
CONVERSATIONS = 8
TURNS = 4


@pytest.fixture(scope="module")
def env(cluster, tmp_path_factory) -> Iterator[Env]:
    with running_env(cluster, tmp_path_factory.mktemp("affinity")) as e:
        yield e


@pytest.fixture(autouse=True)
def dump_on_failure(env: Env, request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_dump_if_failed(env, request)


async def _converse(client: openai.AsyncOpenAI, number: int) -> None:
    """One conversation: a system prompt of its own, then TURNS user turns, each sent with the history."""
    system = f"You are assistant number {number}. " + " ".join(f"rule{number}x{i}" for i in range(60))
    messages: list[Any] = [{"role": "system", "content": system}]
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"Question {turn} of conversation {number}, please."})
        reply = await client.chat.completions.create(model="llama", messages=messages, max_tokens=8)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})


async def _conversations(url: str) -> None:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60) as client:
        await asyncio.gather(*(_converse(client, n) for n in range(CONVERSATIONS)))


def _scraped(env: Env, metric: str, name: str) -> float:
    assert env.prometheus is not None
    rows = env.prometheus.query(f'sum({metric}{{namespace="{env.namespace}",pod=~"{name}-latency-.*"}})')
    return float(rows[0]["value"][1]) if rows else 0.0


def _hit_rate(env: Env, name: str, strategy: str) -> float:
    """Runs the conversations through resource `name`'s router with `strategy` on the latency pool and
    returns the share of prompt tokens its engines found in their prefix caches."""
    # PrefixAffinity's bound at its widest: which early turn a tighter one spills while 8 conversations
    # start at once is the machine's timing (the bound is unit-tested); it also checks that the field
    # reaches the router through the operator's rendered config.
    selection: dict[str, dict[str, Any]] = {"latency": {"strategy": strategy}}
    if strategy == "PrefixAffinity":
        selection["latency"]["loadBoundPercent"] = 1000
    fleet(
        env,
        name,
        {
            "spec": {
                "pools": {"latency": {"replicas": ENGINES, "speculation": "On"}},
                "routing": {"endpointSelection": selection},
            }
        },
    )
    wait_for(
        f"{name} {ENGINES} ready", lambda: latency(env, name).get("readyReplicas") == ENGINES, timeout=90
    )
    asyncio.run(_conversations(env.router_url(name)))
    sent = CONVERSATIONS * TURNS
    # Every request's prompt was looked up; wait until Prometheus (1 s scrapes) holds the final counts.

    def settled() -> float | None:
        first = _scraped(env, vm.PREFIX_CACHE_QUERIES, name)
        time.sleep(3)
        return first if first > 0 and _scraped(env, vm.PREFIX_CACHE_QUERIES, name) == first else None

    queried = wait_for(f"{name} prefix-cache lookups scraped", settled, timeout=45)
    hits = _scraped(env, vm.PREFIX_CACHE_HITS, name)
    env.kubectl("delete", "sd", name, "-n", env.namespace, "--wait=false")
    assert sent > 0
    return hits / queried


def test_prefix_affinity_sends_each_conversation_back_to_the_engine_that_cached_it(env: Env) -> None:
    least = _hit_rate(env, "least", "LeastOutstanding")
    affinity = _hit_rate(env, "affinity", "PrefixAffinity")
    # Every turn after a conversation's first finds its history cached where affinity sent it before:
    # (TURNS - 1) / TURNS of the turns, less the uncached tail of each prompt (0.625 in every run seen).
    # Least outstanding spreads the turns over the engines; how often it lands on the engine of a
    # conversation's last turn is the machine's timing (0.34-0.54 in runs seen), so it is only shown
    # beside affinity, never held to a margin.
    assert affinity > 0.55, (least, affinity)
    assert affinity >= least, (least, affinity)
