"""DISCOVER_SERVICES answers are pages, synchronously through the Router: default and largest
counts, paging to the end reaching every capability once (lookups, filtered, simple, lexical),
the byte bound, the refusals, the cursor, and the work of a page at 100,000 capabilities."""

from __future__ import annotations

import asyncio
import base64
from collections import deque
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect

from lobby.core import Router, Send
from lobby.core.discovery import ranking
from lobby.core.discovery.discover import (
    BadDiscovery,
    decode_cursor,
    encode_cursor,
    services_available,
    with_presence,
)
from lobby.core.discovery.listing import Position
from lobby.core.discovery.registry import Registry
from lobby.core.discovery.search import SIMPLE_WINDOW
from lobby.core.limits import Limits
from lobby.core.session import AgentRecord
from lobby.server import LobbyServer
from protocol.payloads import MAX_RANK, Capability, DiscoverServicesPayload
from tests.conftest import TRANSPORTS
from tests.routerkit import Clock, Peer, join
from tests.transport.test_closing import Stubborn
from tests.wsclient import frame, register, reply, running

Key = tuple[str, str]


def caps(agent: int, count: int, **extra: Any) -> list[dict[str, Any]]:
    """`count` capabilities; every one has keyword "all" and the word "task", every third
    keyword "third" and attribute price below 10."""
    return [
        {
            "name": f"cap{n:03d}",
            "description": f"does task {agent}-{n}",
            "keywords": ["all", *(["third"] if n % 3 == 0 else [])],
            "attributes": {"price": n % 30},
            **extra,
        }
        for n in range(count)
    ]


def lobby(count_per_agent: int = 150, agents: int = 3, **limits: Any) -> tuple[Router, Peer]:
    router = Router(
        limits=Limits(message_rate=0, registration_rate=0, discover_rate=0, **limits), clock=Clock()
    )
    for agent in range(agents):
        join(router, f"agent{agent}", capabilities=caps(agent, count_per_agent))
    me = join(router, "me", capabilities=caps(9, 5))  # its own are never listed
    return router, me


def ask(me: Peer, payload: dict[str, Any]) -> dict[str, Any]:
    me.send("DISCOVER_SERVICES", payload)
    answer = me.last()
    assert answer["message_type"] == "SERVICES_AVAILABLE", answer["payload"]
    return dict(answer["payload"])


def keys_of(payload: dict[str, Any]) -> list[Key]:
    return [
        (s["agent_id"], c["name"])
        for s in payload["services_found"]
        for c in s["relevant_capabilities"]
    ]


def every_page(me: Peer, payload: dict[str, Any]) -> list[list[Key]]:
    pages, answer = [], ask(me, payload)
    pages.append(keys_of(answer))
    while answer["next"] is not None:
        answer = ask(me, {**payload, "cursor": answer["next"]})
        pages.append(keys_of(answer))
        assert len(pages) < 1000
    return pages


def refusal(me: Peer, payload: dict[str, Any]) -> str:
    me.send("DISCOVER_SERVICES", payload)
    error = me.last()
    assert error["message_type"] == "ERROR"
    assert error["payload"]["code"] == "malformed"
    return str(error["payload"]["error"])


ALL = sorted((f"agent{a}", f"cap{n:03d}") for a in range(3) for n in range(150))


def test_a_lookup_answers_100_by_default_and_at_most_200() -> None:
    _, me = lobby()
    first = ask(me, {})
    assert keys_of(first) == ALL[:100]
    assert first["next"] is not None
    assert "total" not in first  # a lookup, as in the seed: no count
    assert keys_of(ask(me, {"limit": 200})) == ALL[:200]
    assert (
        keys_of(ask(me, {"limit": 7, "keywords": ["THIRD"]}))
        == [k for k in ALL if int(k[1][3:]) % 3 == 0][:7]
    )
    ranked = ask(me, {"algorithm": "filtered"})
    assert len(keys_of(ranked)) == 50  # a ranked search: 50, as before
    assert ranked["total"] == 450


def test_a_small_lobby_answers_as_before_with_next_null() -> None:
    _, me = lobby(count_per_agent=10)
    answer = ask(me, {"query_keywords": ["all"]})
    assert keys_of(answer) == [(f"agent{a}", f"cap{n:03d}") for a in range(3) for n in range(10)]
    assert [s["agent_id"] for s in answer["services_found"]] == ["agent0", "agent1", "agent2"]
    assert answer["next"] is None


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"keywords": ["all"]},
        {"keywords": ["third", "ALL"]},
        {"capability_name": "cap004"},
        {"capability_name": "cap003", "keywords": ["third"]},
        {"algorithm": "filtered"},
        {"algorithm": "filtered", "filters": [{"attribute": "price", "op": "lt", "value": 10}]},
        {"algorithm": "simple", "query": "task"},
        {"algorithm": "simple", "query": "cap01"},
        {"algorithm": "lexical", "query": "task"},
        {"algorithm": "lexical", "query": ""},
    ],
)
def test_paging_with_the_cursor_reaches_every_capability_once(payload: dict[str, Any]) -> None:
    _, me = lobby()
    for limit in (1, 37, 200):
        pages = every_page(me, {**payload, "limit": limit})
        found = [key for page in pages for key in page]
        assert len(found) == len(set(found)), "a capability came twice"
        assert all(len(page) <= limit for page in pages)
        one_shot = ask(me, {**payload, "limit": 200})
        expected = set(keys_of(one_shot))
        if one_shot["next"] is None:
            assert set(found) == expected
        assert expected <= set(found)
        assert all(agent != "me" for agent, _ in found)
    if "algorithm" not in payload:
        assert found == sorted(found)  # lookups come in key order, page after page


def test_simple_ranks_a_window_at_a_time_and_a_small_lobby_at_once() -> None:
    _, small = lobby(count_per_agent=20)
    answer = ask(small, {"algorithm": "simple", "query": "cap00", "limit": 200})
    scores = [c["score"] for s in answer["services_found"] for c in s["relevant_capabilities"]]
    assert scores == sorted(scores, reverse=True)
    assert answer["total"] == 30  # one window held them all: counted
    _, big = lobby(count_per_agent=400)  # 1,200 capabilities: three windows
    first = ask(big, {"algorithm": "simple", "query": "task", "limit": 200})
    assert first["total"] is None  # not counted past one window
    pages = every_page(big, {"algorithm": "simple", "query": "task", "limit": 200})
    assert sum(map(len, pages)) == 1200
    assert SIMPLE_WINDOW < 1200


def test_lexical_pages_by_rank_up_to_the_deepest_rank() -> None:
    _, me = lobby(count_per_agent=400)
    pages = every_page(me, {"query": "task", "limit": 200})
    assert [len(page) for page in pages] == [200, 200, 100]  # ranks 0-499 of 1,200 matches
    assert MAX_RANK == 500
    assert ask(me, {"query": "task"})["total"] == 1200
    ranked = [k for page in pages for k in page]
    one_by_one = keys_of(ask(me, {"query": "task", "limit": 200, "offset": 300}))
    assert ranked[300:] == one_by_one


def test_an_answer_never_passes_the_byte_bound_and_always_moves_on() -> None:
    router, me = lobby(max_discover_bytes=3000)
    agent = join(router, "wordy", capabilities=caps(7, 30, description="x" * 700))
    huge = join(router, "huge", capabilities=caps(8, 1, description="y" * 5000))
    found: list[Key] = []
    cursor = None
    while True:
        payload: dict[str, Any] = {"limit": 200, **({"cursor": cursor} if cursor else {})}
        frame = me_frame(router, me, payload)
        answer = orjson.loads(frame)["payload"]
        page = keys_of(answer)
        assert page, "every page holds at least one capability"
        if ("huge", "cap000") not in page:
            assert len(frame) <= 3000
        else:
            assert page == [("huge", "cap000")]  # alone past the bound, never cut
        found += page
        cursor = answer["next"]
        if cursor is None:
            break
    assert sorted(found) == sorted(set(found))
    assert len(found) == 450 + 30 + 1
    assert agent.agent_id in {a for a, _ in found}
    assert huge.agent_id in {a for a, _ in found}


def me_frame(router: Router, me: Peer, payload: dict[str, Any]) -> bytes:
    frame = {
        "sender_id": me.agent_id,
        "receiver_id": "global_lobby",
        "message_type": "DISCOVER_SERVICES",
        "payload": payload,
        "auth_token": me.token,
    }
    assert router.handle(me.session, orjson.dumps(frame).decode()) == []
    (send,) = router.answer_query()
    assert isinstance(send, Send)
    return send.frame


def test_bad_limits_cursors_and_queries_are_refused_naming_the_field() -> None:
    _, me = lobby(count_per_agent=5)
    assert "limit" in refusal(me, {"limit": 0})
    assert "limit" in refusal(me, {"limit": 201})
    assert "limit" in refusal(me, {"limit": "many"})
    assert "cursor" in refusal(me, {"cursor": "not a cursor!"})
    assert "cursor" in refusal(me, {"cursor": 7})
    junk = base64.urlsafe_b64encode(b'{"rank": 1}').decode()
    assert "cursor" in refusal(me, {"cursor": junk})
    assert "cursor" in refusal(me, {"cursor": encode_cursor(Position(None, 5000))})
    good = ask(me, {"limit": 2})["next"]
    assert "offset" in refusal(me, {"query": "task", "cursor": good, "offset": 3})
    assert "offset" in refusal(me, {"query": "task", "offset": 400, "limit": 200})
    assert "offset" in refusal(me, {"query": "task", "offset": 500, "limit": 1})
    assert "keywords" in refusal(me, {"keywords": [f"k{n}" for n in range(33)]})
    assert "filters" in refusal(me, {"filters": [{"attribute": "a", "value": 1}] * 9})
    words = " ".join(f"w{n}" for n in range(17))
    assert "query" in refusal(me, {"query": words, "algorithm": "lexical"})
    assert ask(me, {"limit": 2, "cursor": good})["services_found"]  # nothing was changed


def test_cursors_round_trip_and_anything_else_is_refused() -> None:
    for position in (Position(), Position(None, 499), Position(("a", 'b\x00"é'), 0)):
        assert decode_cursor(encode_cursor(position)) == position
    wrong = [b'[1, "a"]', b"[1, 2, 3]", b'[1, 2, "x"]', b"[-1]", b'["1"]', b"[1.0]"]
    for bad in ("", "%%%", "W10", *(base64.urlsafe_b64encode(raw).decode() for raw in wrong)):
        with pytest.raises(BadDiscovery, match="cursor"):
            decode_cursor(bad)


def test_a_cursor_is_url_safe_base64_without_padding_and_nothing_else() -> None:
    tilde = Position(("a", "~~~"), 0)  # its base64 has "+" where the URL-safe one has "-"
    cursor = encode_cursor(tilde)
    assert cursor == "WzAsImEiLCJ-fn4iXQ"
    assert decode_cursor(cursor) == tilde
    # Characters outside the alphabet are refused, not skipped (four keep the padding right).
    for bad in (cursor[:6] + "...." + cursor[6:], cursor + "!"):
        with pytest.raises(BadDiscovery, match="cursor"):
            decode_cursor(bad)


def test_a_lookup_at_100000_capabilities_reads_only_its_page() -> None:
    """Counted, not timed: the entries each page read, from its start anywhere in the key order,
    with the requester's own capabilities in the way."""
    registry = Registry()
    for agent in range(100):
        record = AgentRecord(f"agent{agent:03d}", b"")
        capabilities = [
            Capability(name=f"cap{n:03d}", keywords=["all", f"kw{n % 10}"]) for n in range(1000)
        ]
        registry.add(record)
        registry.set_capabilities(record, capabilities)
    assert len(registry.search) == 100_000
    index = registry.search
    starts: list[Key | None] = [None, ("agent050", "cap500"), ("agent099", "cap990")]
    for after in starts:
        for page in (
            index.lookup(capability_name=None, keywords=None, exclude_agent="agent001",
                         after=after, limit=200),
            index.lookup(capability_name=None, keywords=["ALL"], exclude_agent="agent051",
                         after=after, limit=200),
            index.lookup(capability_name="cap007", keywords=None, exclude_agent=None,
                         after=after, limit=200),
            index.lookup(capability_name="cap007", keywords=["kw7"], exclude_agent=None,
                         after=after, limit=200),
            index.search(query=None, algorithm="filtered", keywords=["kw3"], limit=200,
                         after=after),
        ):  # fmt: skip
            assert page.examined is not None
            assert page.examined <= 201
            assert len(page.hits) == min(200, page.examined)


# -- queries wait in line ----------------------------------------------------------------------


def test_queries_wait_in_line_at_most_four_per_agent_and_are_answered_oldest_first() -> None:
    """A DISCOVER is answered after the routed messages of its pass (`Router.answer_query`,
    one per pass of the server's loop); an agent may have four waiting, the fifth is refused."""
    router, me = lobby()
    for limit in (1, 2, 3, 4):
        assert router.handle(me.session, me_frame_bytes(me, {"limit": limit})) == []
    assert len(router.queries) == 4
    world_actions = router.handle(me.session, me_frame_bytes(me, {"limit": 5}))
    (refused,) = [orjson.loads(a.frame) for a in world_actions if isinstance(a, Send)]
    assert refused["payload"]["code"] == "rate_limited"
    assert "4 DISCOVER_SERVICES waiting" in refused["payload"]["error"]
    sizes = []
    while router.queries:
        (send,) = router.answer_query()
        assert isinstance(send, Send)
        sizes.append(len(keys_of(orjson.loads(send.frame)["payload"])))
    assert sizes == [1, 2, 3, 4]
    # Answered, they no longer count: the agent may queue four again.
    for limit in (1, 2, 3, 4):
        assert router.handle(me.session, me_frame_bytes(me, {"limit": limit})) == []


def test_a_query_whose_connection_closed_meanwhile_is_dropped() -> None:
    router, me = lobby()
    assert router.handle(me.session, me_frame_bytes(me, {})) == []
    router.close(me.session)
    assert router.answer_query() == []
    assert router.queries == deque()
    assert router.registry.agents["me"].queries_waiting == 0


def test_a_bad_cursor_found_when_answering_is_refused_as_malformed() -> None:
    router, me = lobby()
    assert router.handle(me.session, me_frame_bytes(me, {"cursor": "????"})) == []
    (error,) = router.answer_query()
    assert isinstance(error, Send)
    payload = orjson.loads(error.frame)["payload"]
    assert payload["code"] == "malformed"
    assert "cursor" in payload["error"]


def me_frame_bytes(me: Peer, payload: dict[str, Any]) -> str:
    return frame(me.agent_id, "DISCOVER_SERVICES", payload, auth_token=me.token)


# -- over real sockets --------------------------------------------------------------------------


async def socket_pages(
    ws: ClientConnection, agent_id: str, token: str, payload: dict[str, Any]
) -> list[tuple[int, dict[str, Any]]]:
    """Every answer to `payload`, following `next`: (frame bytes, payload) each."""
    answers: list[tuple[int, dict[str, Any]]] = []
    cursor = None
    while True:
        body = {**payload, **({"cursor": cursor} if cursor else {})}
        await ws.send(frame(agent_id, "DISCOVER_SERVICES", body, auth_token=token))
        raw = await asyncio.wait_for(ws.recv(), 5)
        answer = orjson.loads(raw)
        assert answer["message_type"] == "SERVICES_AVAILABLE", answer["payload"]
        answers.append((len(raw), answer["payload"]))
        cursor = answer["payload"]["next"]
        if cursor is None:
            return answers
        assert len(answers) < 100


async def test_pages_over_a_real_connection(lobby: LobbyServer) -> None:
    async with connect(lobby.url) as hunters, connect(lobby.url) as ws:
        await register(hunters, "hunters", capabilities=caps(0, 250))
        token = (await register(ws, "me"))["payload"]["auth_token"]
        answers = await socket_pages(ws, "me", token, {})
        assert [len(keys_of(a)) for _, a in answers] == [100, 100, 50]  # the default, 100
        found = [key for _, a in answers for key in keys_of(a)]
        assert found == [("hunters", f"cap{n:03d}") for n in range(250)]  # each once, in order
        answers = await socket_pages(ws, "me", token, {"keywords": ["third"], "limit": 200})
        assert [len(keys_of(a)) for _, a in answers] == [84]
        ranked = await socket_pages(ws, "me", token, {"query": "task", "limit": 200})
        assert sorted(k for _, a in ranked for k in keys_of(a)) == sorted(found)
        assert ranked[0][1]["total"] == 250
        for payload, field in (
            ({"limit": 201}, "limit"),
            ({"limit": 0}, "limit"),
            ({"cursor": "????"}, "cursor"),
            ({"query": "task", "offset": 999, "limit": 2}, "offset"),
        ):
            await ws.send(frame("me", "DISCOVER_SERVICES", payload, auth_token=token))
            error = await reply(ws)
            assert error["message_type"] == "ERROR"
            assert error["payload"]["code"] == "malformed"
            assert field in error["payload"]["error"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_byte_bound_over_a_real_connection(tmp_path: Path, transport: str) -> None:
    async with (
        running(tmp_path, max_discover_bytes=4096, transport=transport) as lobby,
        connect(lobby.url) as wordy,
        connect(lobby.url) as ws,
    ):
        await register(wordy, "wordy", capabilities=caps(1, 40, description="z" * 600))
        token = (await register(ws, "me"))["payload"]["auth_token"]
        answers = await socket_pages(ws, "me", token, {"limit": 200})
        assert all(size <= 4096 for size, _ in answers)
        assert all(keys_of(a) for _, a in answers)  # fewer, never none
        found = [key for _, a in answers for key in keys_of(a)]
        assert found == [("wordy", f"cap{n:03d}") for n in range(40)]
        assert len(answers) > 5


def test_a_lexical_page_cut_short_is_marked_approximate(monkeypatch: pytest.MonkeyPatch) -> None:
    router = Router(
        limits=Limits(message_rate=0, registration_rate=0, discover_rate=0), clock=Clock()
    )
    for agent in range(3):
        join(
            router,
            f"agent{agent}",
            capabilities=[
                {"name": f"c{n}", "description": "alpha " * (n % 4 + 1) + "beta " * (n % 3 + 1)}
                for n in range(200)
            ],
        )
    me = join(router, "me")
    assert "approximate" not in ask(me, {"query": "alpha beta"})
    monkeypatch.setattr(ranking, "THRESHOLD_READS", 0)
    monkeypatch.setattr(ranking, "_MULTI", 0)
    answer = ask(me, {"query": "alpha beta", "limit": 5})
    assert answer["approximate"] is True
    assert len(keys_of(answer)) == 5


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_read_routes_its_messages_before_answering_its_queries(
    tmp_path: Path, transport: str
) -> None:
    """Two frames in one TCP write: a DISCOVER, then a frame answered at once (here a query
    refused for its limit). The lobby answers the second first: a query waits until what
    its read brought has been routed, so it never holds other agents' messages back."""
    async with running(tmp_path, transport=transport) as lobby, Stubborn.connect(lobby) as me:
        me.send(frame("me", "REGISTER", {}))
        token = (await me.recv())["payload"]["auth_token"]
        assert me.protocol is not None
        for payload in ({}, {"limit": 0}):
            query = frame("me", "DISCOVER_SERVICES", payload, auth_token=token)
            me.protocol.send_text(query.encode())
        me.send_raw(b"".join(me.protocol.data_to_send()))
        first, second = await me.recv(), await me.recv()
        assert first["message_type"] == "ERROR"
        assert first["payload"]["code"] == "malformed"
        assert second["message_type"] == "SERVICES_AVAILABLE"


def test_each_refusal_says_what_is_wrong_word_for_word() -> None:
    _, me = lobby(count_per_agent=5)
    good = ask(me, {"limit": 2})["next"]
    not_a_cursor = "invalid DISCOVER_SERVICES cursor: not the 'next' of an answer"
    assert refusal(me, {"cursor": "not a cursor!"}) == not_a_cursor
    assert refusal(me, {"cursor": encode_cursor(Position(None, MAX_RANK))}) == not_a_cursor
    both = {"query": "task", "cursor": good, "offset": 3}
    assert refusal(me, both) == "DISCOVER_SERVICES takes 'cursor' or 'offset', not both"
    assert refusal(me, {"query": "task", "offset": 301, "limit": 200}) == (
        "invalid DISCOVER_SERVICES offset: offset + limit must be at most 500"
    )
    assert refusal(me, {"filters": [{"attribute": "a", "op": "near", "value": 1}]}) == (
        "invalid DISCOVER_SERVICES filters: filters[0] has unknown op 'near' "
        "(one of eq, ne, lt, le, gt, ge, in, contains)"
    )
    words = " ".join(f"w{n}" for n in range(17))
    assert refusal(me, {"query": words}) == (
        "invalid DISCOVER_SERVICES query: the query has 17 distinct words; at most 16"
    )
    # Both sides of the deepest rank: offset + limit exactly 500 is answered.
    assert ask(me, {"query": "task", "offset": 300, "limit": 200})["services_found"] == []


def test_presence_marks_are_filled_in_order_and_must_match_the_services() -> None:
    router, _ = lobby(count_per_agent=1)
    router.close(router.registry.agents["agent1"].session)  # type: ignore[arg-type]
    registry, query = router.registry, DiscoverServicesPayload()
    marked = orjson.dumps(services_available(registry, "me", query, room=4096, marked=True))
    assert marked.count(b"\x01") == 3
    filled = orjson.loads(with_presence(registry, marked, ["agent0", "agent1", "agent2"]))
    assert [s["online"] for s in filled["services_found"]] == [True, False, True]
    assert filled == services_available(registry, "me", query, room=4096)
    with pytest.raises(ValueError, match=r"^an answer's presence marks do not match its services$"):
        with_presence(registry, marked, ["agent0", "agent1"])


def test_a_page_holds_as_many_capabilities_as_its_bytes_allow_to_the_byte() -> None:
    """The lobby sizes a page without encoding it: each service and capability counted with a
    comma after it, `online` as `false`. So a page of n capabilities takes its own bytes plus
    one comma per service, one for the list, and one per online service: with exactly that
    room it is answered, with a byte less it holds fewer (for lookups and ranked pages, with
    `next` or without)."""
    router, _ = lobby(count_per_agent=2)
    join(router, "wordy", capabilities=caps(5, 3, description="w" * 40))
    router.close(router.registry.agents["agent1"].session)  # type: ignore[arg-type]
    registry = router.registry
    for raw in ({}, {"query": "task"}, {"keywords": ["third"]}, {"query": "task", "limit": 20}):
        query = DiscoverServicesPayload.model_validate(raw)
        full = services_available(registry, "me", query, room=1 << 20)
        taken: list[int] = []
        for room in range(200, len(orjson.dumps(full)) + 40):
            answer = services_available(registry, "me", query, room=room)
            services = answer["services_found"]
            count = sum(len(s["relevant_capabilities"]) for s in services)
            slack = 1 + len(services) + sum(s["online"] is True for s in services)
            fits = len(orjson.dumps(answer)) + slack
            assert fits <= room or count == 1, (raw, room)
            if fits == room and count > 1:
                fewer = services_available(registry, "me", query, room=room - 1)
                assert sum(len(s["relevant_capabilities"]) for s in fewer["services_found"]) < count
                taken.append(count)
        assert taken == list(range(2, len(keys_of(full)) + 1)), raw  # each size met exactly


def test_a_ranked_service_carries_the_score_of_its_best_capability() -> None:
    _, me = lobby(count_per_agent=4)
    answer = ask(me, {"query": "task 1-2 0-3", "limit": 20})
    services = answer["services_found"]
    assert [set(s) for s in services] == [
        {"agent_id", "relevant_capabilities", "online", "score"}
    ] * len(services)
    for service in services:
        scores = [c["score"] for c in service["relevant_capabilities"]]
        assert service["score"] == scores[0] == max(scores)
    assert all(s["score"] > 0 for s in services)
    assert "score" not in ask(me, {})["services_found"][0]


def test_a_page_gives_back_capabilities_until_its_cursor_fits_across_agents() -> None:
    """A long key in the middle of a page: cut after it, the cursor naming it does not fit, so
    the page gives back that capability too and ends one earlier, on another agent. Whatever
    the room, the answer fits it and is a head of the whole answer, in order."""
    router, _ = lobby(count_per_agent=1, agents=0)
    long_id = "b" * 100
    names = {"a": ["c1", "c2"], long_id: ["n" * 100], "c": ["c1"], "d": ["c1"]}
    for agent_id, named in names.items():
        join(
            router, agent_id, capabilities=[{"name": n, "description": "does task"} for n in named]
        )
    registry = router.registry
    for raw in ({}, {"query": "task"}):
        query = DiscoverServicesPayload.model_validate(raw)
        full = keys_of(services_available(registry, "me", query, room=1 << 20))
        counts: dict[int, int] = {}  # room -> capabilities listed
        size_of: dict[int, int] = {}  # capabilities listed -> the bytes they take
        for room in range(100, 1200):
            answer = services_available(registry, "me", query, room=room)
            services = answer["services_found"]
            listed = keys_of(answer)
            slack = 1 + len(services) + sum(s["online"] is True for s in services)
            fits = len(orjson.dumps(answer)) + slack
            assert fits <= room or len(listed) == 1, (raw, room)
            assert listed == full[: len(listed)], (raw, room)
            counts[room] = len(listed)
            assert size_of.setdefault(len(listed), fits) == fits
        if not raw:  # key-ordered: three would end on the long key's cursor, never the longest
            assert 3 not in size_of
        for room, count in counts.items():  # the longest head that fits, given back or not
            assert count == max([1, *(n for n, size in size_of.items() if size <= room)])


def test_a_ranked_discovery_keeps_to_the_name_and_keywords_asked_for() -> None:
    _, me = lobby(count_per_agent=9)
    named = keys_of(ask(me, {"query": "task", "capability_name": "cap003"}))
    assert named == [("agent0", "cap003"), ("agent1", "cap003"), ("agent2", "cap003")]
    tagged = keys_of(ask(me, {"algorithm": "filtered", "keywords": ["third"], "limit": 20}))
    assert sorted(tagged) == [(f"agent{a}", f"cap{n:03d}") for a in range(3) for n in (0, 3, 6)]


def test_filters_alone_rank_by_key_and_score_every_hit_one() -> None:
    _, me = lobby(count_per_agent=4)
    answer = ask(me, {"filters": [{"attribute": "price", "op": "lt", "value": 2}]})
    assert keys_of(answer) == [(f"agent{a}", f"cap{n:03d}") for a in range(3) for n in (0, 1)]
    scores = [c["score"] for s in answer["services_found"] for c in s["relevant_capabilities"]]
    assert scores == [1.0] * 6
