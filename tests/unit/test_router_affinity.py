"""Prefix affinity: the leading text and turns a body gives, the conversation table and the ring they map to,
and the pool config that turns it on."""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from specfleet_runtime.router.affinity import (
    MEMO_TEXTS,
    VIRTUAL_NODES,
    Affinity,
    Limits,
    Placements,
    PrefixKeys,
    Ring,
    choose,
    load_limit,
    load_limits,
    prefix_key,
    prefix_keys,
)
from specfleet_runtime.router.backends import Backends
from specfleet_runtime.router.body import MAX_TURNS, BodyFields, read_body_fields
from specfleet_runtime.router.conversations import (
    PLACEMENTS_FILE,
    SIZE,
    TABLE_FILE,
    ConversationTable,
    PlacedBoard,
    endpoint_hash,
    shared_board,
    shared_table,
)
from specfleet_runtime.router.metrics import RouterMetrics
from specfleet_runtime.router.workers import MULTIPROC_ENV, WORKER_INDEX_ENV
from specfleet_runtime.routing_config import LOAD_BOUND_SLACK, PREFIX_CHARS, PREFIX_TOKENS, RoutingConfig

URLS = tuple(f"http://10.0.0.{i}:8000" for i in range(1, 5))
KEYS = [prefix_key(f"conversation {i}") for i in range(4000)]


def read(doc: dict[str, Any] | bytes) -> BodyFields:
    """The body read whole and scanned; both ways must agree on its leading text and turns."""
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    whole = read_body_fields(body, whole_parse_max=len(body), prefix=True)
    scanned = read_body_fields(body, whole_parse_max=0, prefix=True)
    assert (whole.prefix, whole.turns, whole.first_user) == (
        scanned.prefix,
        scanned.turns,
        scanned.first_user,
    )
    return whole


def prefix(doc: dict[str, Any] | bytes) -> str:
    return read(doc).prefix


def keys(doc: dict[str, Any]) -> PrefixKeys:
    fields = read(doc)
    found = prefix_keys(fields.prefix, fields.turns, fields.first_user)
    assert found is not None
    return found


# ---- the leading text ----------------------------------------------------------------------------


def test_a_completion_prompt_gives_its_leading_characters() -> None:
    assert prefix({"model": "m", "prompt": "Once upon a time"}) == "Once upon a time"
    assert prefix({"prompt": ["first prompt", "second"]}) == "first prompt"
    assert prefix({"prompt": "x" * 10_000}) == "x" * PREFIX_CHARS
    assert prefix({"prompt": [1, 2, 3]}) == "\x001,2,3"
    assert prefix({"prompt": list(range(5000))}) == "\x00" + ",".join(map(str, range(PREFIX_TOKENS)))
    # Only leading ids count; a list of id lists, or no prompt at all, has none.
    assert prefix({"prompt": [7, 8.5, 9]}) == "\x007"
    assert prefix({"prompt": [[1, 2], [3]]}) == ""
    assert prefix({"prompt": []}) == ""
    assert prefix({"model": "m"}) == ""
    # Not asked for, not read.
    assert read_body_fields(json.dumps({"prompt": "p"}).encode()).prefix == ""


def test_chat_messages_give_the_turns_up_to_the_first_user_message() -> None:
    system = {"role": "system", "content": "You are terse."}
    first = {"role": "user", "content": "What is a KV cache?"}
    turn1 = {"messages": [system, first]}
    turn2 = {
        "messages": [
            system,
            first,
            {"role": "assistant", "content": "A cache."},
            {"role": "user", "content": "More?"},
        ]
    }
    assert prefix(turn1) == "system\x1fYou are terse.\x1euser\x1fWhat is a KV cache?\x1e"
    assert prefix(turn2) == prefix(turn1)  # every turn of a conversation: one key
    other = {"messages": [system, {"role": "user", "content": "Something else"}]}
    assert prefix(other) != prefix(turn1)
    # Keys in any order, a non-string content counts as empty, a non-object message ends the text.
    assert prefix({"messages": [{"content": "hi", "role": "user"}]}) == "user\x1fhi\x1e"
    parts = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    assert prefix({"messages": [parts]}) == "user\x1f\x1e"
    assert prefix({"messages": [system, "junk", first]}) == "system\x1fYou are terse.\x1e"
    assert prefix({"messages": []}) == ""
    # messages beat a prompt; a messages that is not a list does not.
    assert prefix({"prompt": "p", "messages": [first]}) == "user\x1fWhat is a KV cache?\x1e"
    assert prefix({"messages": "nope", "prompt": "p"}) == "p"
    # A long system prompt fills the text by itself.
    long = {"messages": [{"role": "system", "content": "s" * 9000}, first]}
    assert prefix(long) == ("system\x1f" + "s" * 9000)[:PREFIX_CHARS]


@pytest.mark.parametrize("filler", ["é", "\\u00e9", "\\ud83d\\ude00", "\\n", "\\\\", "😀"])
def test_a_long_string_cut_inside_an_escape_or_character_reads_as_when_parsed_whole(filler: str) -> None:
    """The scan decodes a bounded slice of a long string; wherever the cut falls, it reads the same
    characters as a whole parse."""
    for pad in range(8):
        raw = '{"prompt": "' + "a" * pad + filler * 30_000 + '"}'
        body = raw.encode()
        text = prefix(body)
        assert len(text) == PREFIX_CHARS
        assert text == json.loads(raw)["prompt"][:PREFIX_CHARS]


def test_reading_the_text_of_a_huge_body_is_bounded() -> None:
    """8 MiB of system prompt and 400k token ids: the scan checks them all but decodes only a slice."""
    huge = json.dumps(
        {"messages": [{"role": "system", "content": "z" * (8 << 20)}, {"role": "user", "content": "q"}]}
    )
    ids = json.dumps({"prompt": list(range(400_000))})
    for body in (huge.encode(), ids.encode()):
        started = time.perf_counter()
        read = read_body_fields(body, prefix=True)
        assert time.perf_counter() - started < 5.0
        assert 0 < len(read.prefix) <= PREFIX_CHARS + 1 + 7 * PREFIX_TOKENS


def test_a_chat_keys_every_message_boundary_from_its_first_user_message_on() -> None:
    system = {"role": "system", "content": "S" * 9000}  # longer than the leading text holds
    turn1 = {"messages": [system, {"role": "user", "content": "first question"}]}
    turn2 = {
        "messages": [
            *turn1["messages"],
            {"role": "assistant", "content": "answer"},
            {"role": "user", "content": "more"},
        ]
    }
    one, two = keys(turn1), keys(turn2)
    assert one.leading == two.leading  # the ring sees the system prompt: the tenant's place
    assert len(one.conversation) == 1
    assert len(two.conversation) == 3
    # Turn 2 repeats turn 1, so turn 1's key is a prefix of turn 2's: the engine that served it is found.
    assert two.conversation[0] == one.conversation[0]
    # Another conversation of the same tenant shares the leading key but none of the conversation keys.
    other = keys({"messages": [system, {"role": "user", "content": "other question"}]})
    assert other.leading == one.leading
    assert not set(other.conversation) & set(two.conversation)
    # A completion, or a chat with no user message, has the leading key only.
    assert keys({"prompt": "hello"}).conversation == ()
    assert keys({"messages": [system]}).conversation == ()
    # A long conversation is read only to MAX_TURNS messages, whole or scanned alike.
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(3 * MAX_TURNS)]
    assert len(read({"messages": many}).turns) == MAX_TURNS
    assert len(keys({"messages": many}).conversation) == MAX_TURNS
    # Turns joined alike but split differently are different conversations.
    a = keys({"messages": [{"role": "user", "content": "ab"}, {"role": "user", "content": "c"}]})
    b = keys({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "bc"}]})
    assert a.conversation[-1] != b.conversation[-1]


def test_remembered_leading_texts_give_the_keys_hashed_afresh() -> None:
    """The request path remembers recent leading texts and first messages; the keys stay the blake2b
    of the text and of each turn's length and bytes, whatever the memo holds or has forgotten."""

    def afresh(text: str, turns: tuple[str, ...], first_user: int) -> PrefixKeys:
        digest = hashlib.blake2b(digest_size=8)
        conversation = []
        for i, turn in enumerate(turns):
            data = turn.encode("utf-8", "surrogatepass")
            digest.update(len(data).to_bytes(4, "big") + data)
            if i >= first_user:
                conversation.append(int.from_bytes(digest.copy().digest(), "big"))
        leading = int.from_bytes(
            hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big"
        )
        return PrefixKeys(leading, tuple(conversation), 10)

    system = "tenant rules \ud800 " * 50
    asked = [("system" + system, ("system" + system, "user\x1fq1", "assistant\x1fa1", "user\x1fq2"), 1)]
    asked += [(f"p{i}", (), 0) for i in range(MEMO_TEXTS + 5)]  # past the memo's size: forgotten
    asked += [asked[0], ("system" + system, ("system" + system, "user\x1fother"), 0)]
    for text, turns, first_user in asked + asked[:3]:
        assert prefix_keys(text, turns, first_user, 10) == afresh(text, turns, first_user)


# ---- the conversation table ----------------------------------------------------------------------


def test_the_table_gives_the_endpoint_of_the_longest_usable_key() -> None:
    recent = ConversationTable()
    recent.record((1, 2), URLS[0])
    recent.record((1, 2, 3), URLS[1])  # the next turn went elsewhere: its keys follow it
    assert recent.longest((1, 2, 3, 4), URLS, {}, (), 10) == URLS[1]
    assert recent.longest((1, 2), URLS, {}, (), 10) == URLS[1]
    assert recent.longest((9,), URLS, {}, (), 10) is None
    # An endpoint loaded to the limit, excluded or gone is passed over for the next shorter key.
    recent.record((1,), URLS[2])
    assert recent.longest((1, 2, 3), URLS, {URLS[1]: 10}, (), 10) == URLS[2]
    assert recent.longest((1, 2, 3), URLS, {}, {URLS[1]}, 10) == URLS[2]
    assert recent.longest((1, 2, 3), URLS[2:], {}, (), 10) == URLS[2]
    assert recent.longest((1, 2, 3), URLS[3:], {}, (), 10) is None


def test_the_table_forgets_the_least_recently_written_key_of_a_full_set_first() -> None:
    recent = ConversationTable(sets=1)  # one set of WAYS (4) entries: every key lands in it
    recent.record((1, 2), URLS[0])
    recent.record((3,), URLS[1])
    recent.record((1,), URLS[2])  # written again: now the newest
    recent.record((4,), URLS[3])
    recent.record((5,), URLS[0])  # the set is full: 2, the oldest, goes
    assert [recent.endpoint(k, URLS) for k in (1, 2, 3, 4, 5)] == [URLS[2], None, URLS[1], URLS[3], URLS[0]]


def test_a_table_lookup_matches_keys_only_and_reads_the_endpoint_of_its_own_entry() -> None:
    """Each way of a full set answers its own key's endpoint, in every set; a number that is only some
    entry's endpoint hash is not a key; a table closes (its view of the memory let go first)."""
    recent = ConversationTable(sets=8)
    for first in (0, 3, 7):  # keys of sets 0, 3 and 7, WAYS (4) of each: the set full
        keys = tuple(first + 8 * way for way in range(4))
        for key, url in zip(keys, URLS, strict=True):
            recent.record((key,), url)
        assert [recent.endpoint(key, URLS) for key in keys] == list(URLS)
        assert recent.endpoint(first + 32, URLS) is None  # the same set, not written
    recent.close()
    one = ConversationTable(sets=1)  # every key in one set, beside every endpoint hash written
    one.record((1,), URLS[0])
    served = endpoint_hash(URLS[0])
    assert one.endpoint(served, URLS) is None
    one.record((served,), URLS[1])  # now a key too: its own entry's endpoint, not the number's
    assert [one.endpoint(key, URLS) for key in (1, served)] == [URLS[0], URLS[1]]
    one.close()


def test_the_workers_of_a_router_share_one_table(tmp_path: Path) -> None:
    """Two processes' tables on the same file (the workers' shared directory): what one records the
    other finds, and the next turn's record by the other moves the conversation for both."""
    path = str(tmp_path / TABLE_FILE)
    first, second = ConversationTable(path), ConversationTable(path)
    first.record((11, 12), URLS[1])
    assert second.longest((11, 12, 13), URLS, {}, (), 10) == URLS[1]
    second.record((11, 12, 13), URLS[2])
    assert first.longest((11, 12, 13, 14), URLS, {}, (), 10) == URLS[2]
    # A worker started later maps the same entries; an endpoint it does not know is not an answer.
    assert ConversationTable(path).endpoint(13, URLS) == URLS[2]
    assert ConversationTable(path).endpoint(13, URLS[:2]) is None


def test_a_router_process_maps_the_table_in_its_workers_directory(tmp_path: Path) -> None:
    shared_table({MULTIPROC_ENV: str(tmp_path)}).record((7,), URLS[0])
    assert (tmp_path / TABLE_FILE).stat().st_size == SIZE
    assert shared_table({MULTIPROC_ENV: str(tmp_path)}).endpoint(7, URLS) == URLS[0]
    assert shared_table({}).endpoint(7, URLS) is None  # one process: a table of its own


def test_each_worker_publishes_its_placements_in_its_own_row(tmp_path: Path) -> None:
    """The placements board: a worker's row holds what it placed (rewritten whole, not added to), and
    each worker reads the others' rows, not its own; an endpoint it does not ask about is not counted."""
    path = str(tmp_path / PLACEMENTS_FILE)
    first, second, third = PlacedBoard(path, 0), PlacedBoard(path, 1), PlacedBoard(path, 2)
    first.publish({URLS[0]: 500, URLS[1]: 0})
    second.publish({URLS[0]: 7, URLS[2]: 40})
    assert third.others(URLS) == {URLS[0]: 507, URLS[1]: 0, URLS[2]: 40, URLS[3]: 0}
    assert first.others(URLS) == {URLS[0]: 7, URLS[1]: 0, URLS[2]: 40, URLS[3]: 0}
    second.publish({URLS[3]: 1})
    assert first.others(URLS[2:]) == {URLS[2]: 0, URLS[3]: 1}
    # A worker of the same index started again (a new router run) clears what the old one left.
    PlacedBoard(path, 0)
    assert third.others(URLS) == {URLS[0]: 0, URLS[1]: 0, URLS[2]: 0, URLS[3]: 1}
    assert shared_board({}) is None  # one process: its own placements are all there is
    board = shared_board({MULTIPROC_ENV: str(tmp_path), WORKER_INDEX_ENV: "3"})
    assert board is not None
    assert board.row == 3


def test_workers_sharing_a_board_place_new_leading_texts_evenly_for_the_pod(tmp_path: Path) -> None:
    """Two workers taking new leading texts in turns: with their placements on one board, the pod's
    engines are never more than one text apart; each worker evening out only its own (no board) can put
    both workers' next texts on the same engine, two apart."""
    path = str(tmp_path / PLACEMENTS_FILE)
    ring = Ring(URLS)

    def spread(workers: list[Placements]) -> int:
        """The largest difference between the pod's most and least loaded engines, placement by placement."""
        recent = ConversationTable()
        widest = 0
        for i, key in enumerate(KEYS[:40]):
            affinity = Affinity(recent, workers[i % 2])
            assert affinity.pick(ring, PrefixKeys(key or 0, size=100), {}, (), 125) is not None
            pod: Counter[str] = Counter()
            for worker in workers:
                pod.update(worker.held)
            widest = max(widest, max(pod[url] for url in URLS) - min(pod[url] for url in URLS))
        return widest

    assert spread([Placements(board=PlacedBoard(path, 0)), Placements(board=PlacedBoard(path, 1))]) <= 100
    assert spread([Placements(), Placements()]) >= 200


# ---- the ring ------------------------------------------------------------------------------------


def owners(ring: Ring, outstanding: dict[str, int] | None = None) -> list[str | None]:
    return [ring.choose(k, outstanding or {}, (), 125) for k in KEYS if k is not None]


def test_the_same_key_goes_to_the_same_endpoint_and_keys_spread() -> None:
    ring = Ring(URLS)
    first = owners(ring)
    assert first == owners(Ring(URLS))  # another worker, another replica: the same map
    assert first == [ring.owner(k) for k in KEYS if k is not None]
    shares = Counter(first)
    assert set(shares) == set(URLS)
    assert max(shares.values()) < 1.35 * len(KEYS) / len(URLS)


def test_removing_one_of_four_endpoints_moves_only_its_keys() -> None:
    before = owners(Ring(URLS))
    after = owners(Ring(URLS[1:]))
    for old, new in zip(before, after, strict=True):
        if old != URLS[0]:
            assert new == old
    assert URLS[0] not in after


def test_adding_a_fifth_endpoint_moves_about_a_fifth_of_the_keys_all_to_it() -> None:
    grown = (*URLS, "http://10.0.0.5:8000")
    before = owners(Ring(URLS))
    after = owners(Ring(grown))
    moved = [new for old, new in zip(before, after, strict=True) if old != new]
    assert set(moved) == {grown[-1]}
    assert 0.12 < len(moved) / len(KEYS) < 0.28


def test_a_hot_key_spills_at_the_load_bound() -> None:
    ring = Ring(URLS)
    key = KEYS[0]
    assert key is not None
    home = ring.owner(key)
    assert home is not None
    outstanding: dict[str, int] = {}
    for _ in range(40):
        url = ring.choose(key, outstanding, (), 125)
        assert url is not None
        outstanding[url] = outstanding.get(url, 0) + 1
        # ceil(1.25 * requests / endpoints): no endpoint past it, however hot the key.
        assert max(outstanding.values()) <= -(-(125 * sum(outstanding.values())) // (100 * len(URLS)))
    assert outstanding[home] == max(outstanding.values())
    assert len(outstanding) == len(URLS)
    # With room, the key goes home again.
    assert ring.choose(key, {}, (), 125) == home
    # A looser bound keeps more at home: 40 requests, bound 400%, the home endpoint takes up to 40.
    assert ring.choose(key, {home: 39, URLS[0] if home != URLS[0] else URLS[1]: 0}, (), 400) == home


def test_the_limits_have_a_slack_at_small_counts_and_the_percentage_at_large() -> None:
    assert LOAD_BOUND_SLACK == 8  # the figures below
    # An empty pool: the ring takes one per endpoint before moving on, a leading text's engine and a
    # conversation's up to 9.
    assert load_limits(URLS, {}, (), 125) == Limits(1, 9, 9)
    # 2 in flight, both on one engine: 125% of the mean is one request, the slack keeps 9.
    assert load_limits(URLS, {URLS[0]: 2}, (), 125) == Limits(1, 9, 9)
    # 20 per engine: the mean plus the slack (21 + 8 = 29) is past 125% of the mean (ceil(1.25 * 81 / 4)
    # = 26); a conversation stays up to twice the percentage (ceil(2.5 * 81 / 4) = 51).
    busy = dict.fromkeys(URLS, 20)
    assert load_limits(URLS, busy, (), 125) == Limits(26, 29, 51)
    # At 32 per engine the slack and the percentage meet: the percentage binds from there on.
    assert load_limits(URLS, dict.fromkeys(URLS, 32), (), 125) == Limits(41, 41, 81)
    # Excluded endpoints count neither their requests nor themselves; none left: nothing.
    assert load_limits(URLS, busy, {URLS[0], URLS[1]}, 125) == Limits(26, 29, 52)
    assert load_limits(URLS, {URLS[0]: 9}, URLS[1:], 100) == Limits(10, 18, 20)
    assert load_limits(URLS, busy, URLS, 125) == Limits(0, 0, 0)
    assert load_limit(URLS, busy, (), 125) == 26


def test_conversations_all_remembered_on_one_engine_spread_past_its_limit() -> None:
    # 200 conversations whose earlier turns all went to one engine, none finishing: each turn goes home
    # while home is under the conversation limit, so home never holds more than the limit allows.
    ring = Ring(URLS)
    recent = ConversationTable()
    placements = Placements()
    turns = [PrefixKeys(k or 0, (k or 0,)) for k in KEYS[:200]]
    for t in turns:
        recent.record(t.conversation, URLS[0])
    outstanding: dict[str, int] = {}
    for t in turns:
        before = dict(outstanding)
        choice = choose(ring, recent, placements, t, outstanding, (), 125)
        assert choice is not None
        if choice.url != URLS[0]:
            # Sent elsewhere only at the limit (the mean plus the slack at first, 250% of it later).
            assert choice.how == "moved"
            assert before.get(URLS[0], 0) >= load_limits(URLS, before, (), 125).conversation
        else:
            assert choice.how == "conversation"
        outstanding[choice.url] = outstanding.get(choice.url, 0) + 1
    # At 200 in flight the percentage binds: home holds 250% of the mean (124 or 125), not everything.
    assert 120 <= outstanding[URLS[0]] <= 125


def test_excluded_endpoints_are_skipped_and_nothing_left_is_none() -> None:
    ring = Ring(URLS)
    key = KEYS[1]
    assert key is not None
    home = ring.owner(key)
    other = ring.choose(key, {}, {home}, 125)
    assert other is not None
    assert other != home
    assert ring.choose(key, {}, set(URLS), 125) is None
    assert Ring(()).choose(key, {}, (), 125) is None
    assert len(ring.points) == VIRTUAL_NODES * len(URLS)


# ---- the config and the router's pick ------------------------------------------------------------


def config_doc(**selection: Any) -> dict[str, Any]:
    return {
        "servedModelName": "m",
        "pools": {"latency": {"staticUrls": list(URLS)}, "batch": {"staticUrls": [URLS[0]]}},
        "endpointSelection": selection,
    }


def test_the_config_reads_and_writes_endpoint_selection() -> None:
    config = RoutingConfig.from_json(
        json.dumps(
            config_doc(
                latency={"strategy": "PrefixAffinity", "loadBoundPercent": 150},
                batch={"strategy": "LeastOutstanding"},
            )
        )
    )
    assert config.endpoint_selection.latency.strategy == "PrefixAffinity"
    assert config.endpoint_selection.latency.bound_percent == 150
    assert config.endpoint_selection.of("batch").strategy == "LeastOutstanding"
    assert config.endpoint_selection.of("batch").bound_percent == 125
    written = json.loads(config.to_json())["endpointSelection"]
    assert written["latency"] == {"strategy": "PrefixAffinity", "loadBoundPercent": 150}
    assert RoutingConfig.from_json(config.to_json()) == config
    # A config without it (an older operator's) reads as the default, prefix affinity, everywhere.
    old = RoutingConfig.from_json(
        json.dumps({k: v for k, v in config_doc().items() if k != "endpointSelection"})
    )
    assert old.endpoint_selection.latency.strategy == "PrefixAffinity"
    assert old.endpoint_selection.of("batch") == old.endpoint_selection.latency


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        ({"latency": {"strategy": "RoundRobin"}}, "endpointSelection.latency.strategy must be one of"),
        (
            {"batch": {"strategy": "PrefixAffinity", "loadBoundPercent": 99}},
            "loadBoundPercent must be an integer",
        ),
        (
            {"batch": {"strategy": "PrefixAffinity", "loadBoundPercent": True}},
            "loadBoundPercent must be an integer",
        ),
        ({"canary": {}}, "invalid routing config"),
        ({"latency": {"strategy": "PrefixAffinity", "weight": 1}}, "invalid routing config"),
    ],
)
def test_a_bad_endpoint_selection_is_refused(selection: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RoutingConfig.from_json(json.dumps(config_doc(**selection)))


def backends(**selection: Any) -> Backends:
    b = Backends("ns", 10.0, (), RouterMetrics(), clock=lambda: 100.0)
    b.apply_config(RoutingConfig.from_json(json.dumps(config_doc(**selection))))
    return b


def test_pick_follows_the_prefix_only_where_the_pool_asks_for_it() -> None:
    key = KEYS[2]
    assert key is not None
    affine = backends(latency={"strategy": "PrefixAffinity"})
    home = Ring(URLS).owner(key)
    assert {affine.pick("latency", set(), PrefixKeys(key)) for _ in range(8)} == {home}
    # No key: least outstanding, which rotates over idle endpoints.
    assert len({affine.pick("latency", set(), None) for _ in range(8)}) == len(URLS)
    plain = backends(latency={"strategy": "LeastOutstanding"})
    assert len({plain.pick("latency", set(), PrefixKeys(key, (5,))) for _ in range(8)}) == len(URLS)
    assert plain.recent.endpoint(5, URLS) is None  # only a pool with affinity learns conversations


def test_pick_by_prefix_skips_tried_and_ejected_endpoints() -> None:
    found = KEYS[3]
    assert found is not None
    key = PrefixKeys(found)
    b = backends(latency={"strategy": "PrefixAffinity"})
    home = b.pick("latency", set(), key)
    assert home is not None
    retry = b.pick("latency", {home}, key)
    assert retry not in (None, home)
    b.ejected_until[home] = 200.0  # ejected until after the clock's 100
    assert b.pick("latency", set(), key) == retry
    # Every endpoint ejected: one is tried rather than none, its home first.
    for url in URLS:
        b.ejected_until[url] = 200.0
    assert b.pick("latency", set(), key) == home
    assert b.pick("latency", set(URLS), key) is None
    # The load bound counts what this worker has outstanding: its leading text's engine takes it up to
    # the mean plus the slack (ceil(12 / 4) + 8 = 11 with 11 in flight).
    b.ejected_until.clear()
    for _ in range(10):
        b.acquire(home)
    assert b.pick("latency", set(), key) == home
    b.acquire(home)
    assert b.pick("latency", set(), key) == retry


def repool(b: Backends, urls: list[str]) -> None:
    """The latency pool's endpoints become `urls` (a flip, a scale-up or -down)."""
    doc = config_doc(latency={"strategy": "PrefixAffinity"})
    doc["pools"]["latency"]["staticUrls"] = urls
    b.apply_config(RoutingConfig.from_json(json.dumps(doc)))


def conversation(number: int, turns: int) -> list[PrefixKeys]:
    """The keys of each turn of one conversation of a tenant whose system prompt fills the leading text."""
    messages: list[dict[str, str]] = [{"role": "system", "content": "tenant rules " * 400}]
    out = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"conversation {number} question {turn}"})
        out.append(keys({"messages": messages}))
        messages.append({"role": "assistant", "content": f"answer {turn}"})
    return out


def test_a_conversation_sticks_to_its_engine_across_turns_even_off_its_ring_place() -> None:
    b = backends(latency={"strategy": "PrefixAffinity"})
    turns = conversation(1, 4)
    home = b.pick("latency", set(), turns[0])
    assert home == Ring(URLS).owner(turns[0].leading)
    # Its engine holds the pool's only 10 requests: past 125% of the mean, but within the slack above it
    # (ceil(11 / 4) + 8 = 11), so turn 2 stays with its cache.
    for _ in range(10):
        b.acquire(home)
    assert b.pick("latency", set(), turns[1]) == home
    # One more and the conversation limit (ceil(12 / 4) + 8 = 11) is reached: turn 2 spills, and sticks
    # to where it went.
    b.acquire(home)
    moved = b.pick("latency", set(), turns[1])
    assert moved not in (None, home)
    assert moved is not None
    for _ in range(11):
        b.release(home)
    # With room at home again the conversation stays where its history now is; a new conversation of the
    # same tenant starts where the tenant's system prompt is.
    assert b.pick("latency", set(), turns[2]) == moved
    assert b.pick("latency", set(), turns[3]) == moved
    assert b.pick("latency", set(), conversation(2, 1)[0]) == home


def test_a_conversation_spills_at_the_load_bound_and_goes_back_to_its_tenant_when_its_engine_leaves() -> None:
    b = backends(latency={"strategy": "PrefixAffinity", "loadBoundPercent": 150})
    first, second = conversation(3, 2)
    engine = b.pick("latency", set(), first)
    assert engine is not None
    # 40 outstanding on its engine and 4 on each other, 52 in all: a conversation's limit is twice the
    # percentage, ceil(3 * 53 / 4) = 40, so the next turn spills; its system prompt's engine is past its
    # own (ceil(53 / 4) + 8 = 22) too, so it goes to the next engine of the ring under the ring's
    # (ceil(1.5 * 53 / 4) = 20).
    for url in URLS:
        for _ in range(40 if url == engine else 4):
            b.acquire(url)
    spilled = b.pick("latency", set(), second)
    assert spilled not in (None, engine)
    assert spilled == Ring(URLS).choose_under(first.leading, b.outstanding, {engine}, 20)
    for url in URLS:
        for _ in range(40 if url == engine else 4):
            b.release(url)
    # Its engine leaves the pool: the conversation, whose history was there only, goes where its
    # system prompt is cached.
    assert spilled is not None
    repool(b, [u for u in URLS if u != spilled])
    assert b.pick("latency", set(), second) == engine


def test_an_endpoint_joining_moves_no_conversation_and_takes_new_leading_texts() -> None:
    # Nothing is acquired here, so nothing is over the load bound.
    b = backends(latency={"strategy": "PrefixAffinity"})
    started = [conversation(n, 2) for n in range(200)]
    before = [b.pick("latency", set(), turns[0]) for turns in started]
    assert len(set(before)) == 1  # one tenant: its system prompt's engine
    # Seven more tenants: two placed on each engine.
    others = [PrefixKeys(k) for k in KEYS[400:407] if k is not None]
    assert sorted(Counter([*before[:1], *(b.pick("latency", set(), k) for k in others)]).values()) == [2] * 4
    grown = [*URLS, "http://10.0.0.5:8000"]
    repool(b, grown)
    # Every conversation under way keeps its engine: its history is cached there.
    assert [b.pick("latency", set(), turns[1]) for turns in started] == before
    # New leading texts (other tenants) are placed where the fewest are: the new endpoint holds none,
    # so it takes the first two of them, and then every endpoint its share.
    fresh = [PrefixKeys(k) for k in KEYS[:400] if k is not None]
    placed = [b.pick("latency", set(), k) for k in fresh]
    assert placed[:2] == [grown[-1]] * 2
    held = Counter(placed)
    held.update(dict.fromkeys(URLS, 2))
    assert max(held.values()) - min(held.values()) <= 1


def test_new_leading_texts_are_placed_evenly_and_then_stay() -> None:
    """24 tenants hashed onto 4 engines are lumpy (one engine often holds 9 or 10); placed where the
    fewest are, each engine holds 6, and a tenant's later requests go where it was placed."""
    b = backends(latency={"strategy": "PrefixAffinity"})
    tenants = [PrefixKeys(k) for k in KEYS[:24] if k is not None]
    placed = {t.leading: b.pick("latency", set(), t) for t in tenants}
    assert sorted(Counter(placed.values()).values()) == [6, 6, 6, 6]
    assert max(Counter(Ring(URLS).owner(t.leading) for t in tenants).values()) > 6  # what hashing alone does
    assert all(b.pick("latency", set(), t) == placed[t.leading] for t in tenants)


def test_a_placed_leading_text_weighs_the_size_of_the_request_that_brought_it() -> None:
    """A 4,000-byte system prompt holds as much of its engine's cache as four of 1,000: the next twelve
    small ones fill the three other engines first."""
    assert prefix_keys("rules", size=4000) == PrefixKeys(prefix_key("rules") or 0, (), 4000)
    keys = prefix_keys("rules")
    assert keys is not None
    assert keys.size == 1
    b = backends(latency={"strategy": "PrefixAffinity"})
    found = [k for k in KEYS if k is not None]
    big = b.pick("latency", set(), PrefixKeys(found[0], size=4000))
    small = [b.pick("latency", set(), PrefixKeys(k, size=1000)) for k in found[1:13]]
    assert big not in small
    assert sorted(Counter(small).values()) == [4, 4, 4]


def test_a_turn_reaching_another_worker_goes_where_the_first_worker_sent_its_conversation(
    tmp_path: Path,
) -> None:
    """Two workers (two Backends on one shared table), each seeing only its own requests in flight:
    worker A, its ring owner loaded, sends a conversation's first turn elsewhere; the next turn
    reaches worker B, which sees nothing loaded and whose ring points at the owner, and follows the
    table to where the history is cached."""
    path = str(tmp_path / TABLE_FILE)
    config = RoutingConfig.from_json(json.dumps(config_doc(latency={"strategy": "PrefixAffinity"})))
    a, b = (
        Backends("ns", 10.0, (), RouterMetrics(), lambda: 100.0, None, ConversationTable(path)) for _ in "ab"
    )
    for worker in (a, b):
        worker.apply_config(config)
    leading = KEYS[1]
    assert leading is not None
    owner = Ring(URLS).owner(leading)
    assert owner is not None
    a.outstanding[owner] = 5  # past the ring's limit with 5 of 5 in flight on 4 endpoints: 2
    first = a.pick("latency", set(), PrefixKeys(leading, (21,)))
    assert first not in (None, owner)
    assert b.pick("latency", set(), PrefixKeys(leading, (21, 22, 23))) == first
    # A's placement of the leading text is B's too: a new conversation of it goes there.
    assert b.pick("latency", set(), PrefixKeys(leading, (24,))) == first
    # With a table of its own, B would have sent it to the owner.
    alone = backends(latency={"strategy": "PrefixAffinity"})
    assert alone.pick("latency", set(), PrefixKeys(leading, (21, 22, 23))) == owner


def test_the_router_counts_where_each_affine_request_went() -> None:
    """specfleet_router_prefix_affinity_choices: a new leading text placed, a conversation's engine, a
    move off it, a spill past the leading text's engine at the bound, and that engine."""
    leading = KEYS[1]
    assert leading is not None
    b = backends(latency={"strategy": "PrefixAffinity"})
    owner = Ring(URLS).owner(leading)
    assert owner is not None

    def count(choice: str) -> float:
        value = b.metrics.registry.get_sample_value(
            "specfleet_router_prefix_affinity_choices_total", {"pool": "latency", "choice": choice}
        )
        return value or 0.0

    assert b.pick("latency", set(), PrefixKeys(leading, (31,))) == owner  # nothing placed yet: the ring's
    assert b.pick("latency", set(), PrefixKeys(leading, (31, 32))) == owner
    b.outstanding[owner] = 12  # past every limit (ring 5; home and conversation ceil(13 / 4) + 8 = 12)
    elsewhere = b.pick("latency", set(), PrefixKeys(leading, (31, 32, 33)))
    assert elsewhere != owner
    assert b.pick("latency", set(), PrefixKeys(leading, (41,))) != owner
    del b.outstanding[owner]
    assert b.pick("latency", set(), PrefixKeys(leading, (51,))) == owner
    assert [count(c) for c in ("placed", "conversation", "moved", "spilled", "home")] == [1, 1, 1, 1, 1]


def test_each_pool_counts_its_own_affine_requests() -> None:
    """Two PrefixAffinity pools: each request counted once under its pool and its choice."""
    b = backends(latency={"strategy": "PrefixAffinity"}, batch={"strategy": "PrefixAffinity"})
    keys = [k for k in KEYS[:4] if k is not None]

    def count(pool: str, choice: str) -> float:
        value = b.metrics.registry.get_sample_value(
            "specfleet_router_prefix_affinity_choices_total", {"pool": pool, "choice": choice}
        )
        return value or 0.0

    for key in keys[:3]:
        b.pick("latency", set(), PrefixKeys(key))
    for _ in range(2):
        b.pick("latency", set(), PrefixKeys(keys[0]))
    for _ in range(2):
        b.pick("batch", set(), PrefixKeys(keys[3]))  # its own leading text: latency placed the others
    assert [count("latency", c) for c in ("placed", "home")] == [3, 2]
    assert [count("batch", c) for c in ("placed", "home")] == [1, 1]
