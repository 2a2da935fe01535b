"""lobby/discovery_worker.py: the replica of the search index answers every DISCOVER as the
lobby's own `answer_query` does (over a varied registry, synchronously), and over real sockets
a lobby with the worker answers as one without it, sees a REGISTER acknowledged before the
query, keeps answering when the worker is killed, runs it at the lowest CPU priority, and
answers in process what a starved worker leaves waiting."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import structlog

from lobby import discovery_worker
from lobby.config import SettingError
from lobby.core.discovery.discover import BadDiscovery, services_available, with_presence
from lobby.core.router import Router
from lobby.discovery_worker import Replica
from lobby.options import add_serve_options, settings_from
from lobby.server import LobbyServer
from protocol.payloads import DiscoverServicesPayload
from tests.conftest import TRANSPORTS
from tests.routerkit import Peer, join, make_router
from tests.wsclient import Client, frame, register, reply, serving

QUERIES: list[dict[str, Any]] = [
    {},
    {"limit": 7},
    {"keywords": ["all"]},
    {"query_keywords": ["third", "rare"], "limit": 3},
    {"capability_name": "cap004"},
    {"capability_name": "cap001", "keywords": ["third"]},
    {"query": "task"},
    {"query": "task 1-3 rare", "limit": 5},
    {"query": "task", "offset": 4, "limit": 4},
    {"algorithm": "simple", "query": "ask 2"},
    {"algorithm": "filtered", "filters": [{"attribute": "price", "op": "lt", "value": 4}]},
    {"algorithm": "lexical", "filters": [{"attribute": "price", "op": "ne", "value": 1}]},
    {"filters": [{"attribute": "price", "op": "between", "value": 1}]},  # refused
    {"cursor": "not-a-cursor"},  # refused
]


def capabilities(agent: int) -> list[dict[str, Any]]:
    return [
        {
            "name": f"cap{n:03d}",
            "description": f"does task {agent}-{n}" + (" rare" if (agent + n) % 5 == 0 else ""),
            "keywords": ["all", *(["third"] if n % 3 == 0 else [])],
            "attributes": {"price": (agent * n) % 7},
        }
        for n in range(agent % 4 + 2)
    ]


def varied(router: Router) -> list[Peer]:
    """Agents online and offline, one unregistered, one with its capabilities replaced."""
    peers = [join(router, f"agent{a:02d}", capabilities=capabilities(a)) for a in range(12)]
    for peer in peers[::3]:
        router.close(peer.session)
    peers[4].send("UNREGISTER", {})
    peers[5].send("UPDATE_CAPABILITIES", {"capabilities": capabilities(9)})
    return [peer for n, peer in enumerate(peers) if n % 3 and n != 4]


def pages(
    answer: Callable[[dict[str, Any], int], bytes], query: dict[str, Any], room: int
) -> list[bytes]:
    """Every page of `query` (following `next`), as `answer` encodes them."""
    out = [answer(query, room)]
    while True:
        payload = orjson.loads(out[-1])
        if not isinstance(payload, dict) or not payload.get("next"):
            return out
        out.append(answer({**query, "offset": 0, "cursor": payload["next"]}, room))


def test_a_replica_answers_every_query_as_the_lobby_does() -> None:
    router = make_router()
    registry = router.registry
    registry.replicating = True  # from the start: the replica sees the same history
    live = varied(router)
    fed, started = Replica(), Replica()
    for change in registry.changes:
        fed.apply(orjson.loads(orjson.dumps(change)))  # as through the pipe
    for change in registry.snapshot():
        started.apply(orjson.loads(orjson.dumps(change)))
    assert len(fed.registry.search) == len(started.registry.search) == len(registry.search)
    compared = 0
    for requester in (live[0].agent_id, live[-1].agent_id, "nobody"):

        def in_process(payload: dict[str, Any], room: int, requester: str = requester) -> bytes:
            query = DiscoverServicesPayload.model_validate(payload)
            try:
                return orjson.dumps(services_available(registry, requester, query, room=room))
            except BadDiscovery as bad:
                return orjson.dumps(str(bad))

        def from_replica(replica: Replica, requester: str = requester) -> Callable[..., bytes]:
            def answer(payload: dict[str, Any], bound: int) -> bytes:
                meta, body = replica.answer(requester, payload, bound)
                if meta[0] == "bad":
                    return orjson.dumps(meta[1])
                return with_presence(registry, body, meta[1])

            return answer

        for query in QUERIES:
            for room in (1 << 18, 700):
                expected = pages(in_process, query, room)
                assert pages(from_replica(fed), query, room) == expected, (query, room)
                assert pages(from_replica(started), query, room) == expected, (query, room)
                compared += len(expected)
    assert compared > 3 * len(QUERIES) * 2  # paging was followed
    services = orjson.loads(pages(in_process, {}, 1 << 18)[0])["services_found"]
    assert {service["online"] for service in services} == {True, False}


def test_presence_is_filled_in_from_the_lobby_when_the_answer_arrives() -> None:
    router = make_router()
    peer = join(router, "a", capabilities=capabilities(1))
    replica = Replica()
    for change in router.registry.snapshot():
        replica.apply(change)
    meta, body = replica.answer("me", {}, 1 << 18)
    assert orjson.loads(with_presence(router.registry, body, meta[1]))["services_found"][0][
        "online"
    ]
    router.close(peer.session)
    assert not orjson.loads(with_presence(router.registry, body, meta[1]))["services_found"][0][
        "online"
    ]
    with pytest.raises(ValueError, match="presence marks"):
        with_presence(router.registry, body, [])


# -- over real sockets --------------------------------------------------------------------


async def discover(ws: Client, agent_id: str, token: str, payload: dict[str, Any]) -> Any:
    await ws.send(frame(agent_id, "DISCOVER_SERVICES", payload, auth_token=token))
    answer = await reply(ws)
    answer.pop("message_id", None)
    return answer


async def worker_running(lobby: LobbyServer, ws: Client, agent_id: str, token: str) -> None:
    """Send DISCOVERs until the lobby's worker holds the index (the first one starts it)."""
    assert lobby.discovery is not None
    for _ in range(500):
        await discover(ws, agent_id, token, {"capability_name": "none"})
        if lobby.discovery.process is not None:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the discovery worker did not start")


async def fill(connect: Callable[..., Any], agents: int) -> None:
    for a in range(agents):
        async with connect() as ws:
            ack = await register(ws, f"agent{a:02d}", capabilities=capabilities(a))
            assert ack["payload"]["status"] == "success_registered_finalized"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_answers_with_the_worker_are_those_without_it(tmp_path: Path, transport: str) -> None:
    answers = []
    for worker in (True, False):
        async with serving(tmp_path / str(worker), transport, discovery_worker=worker) as served:
            await fill(served.connect, 10)
            async with served.connect() as ws, served.connect() as online:
                await register(online, "online", capabilities=capabilities(3))
                ack = await register(ws, "me", capabilities=capabilities(2))
                token = ack["payload"]["auth_token"]
                if worker:
                    await worker_running(served.lobby, ws, "me", token)
                answers.append(
                    [await discover(ws, "me", token, q) for q in QUERIES for _ in range(2)]
                )
    with_worker, without = answers
    assert with_worker == without
    assert any(a["message_type"] == "ERROR" for a in without)
    assert sum(len(a["payload"].get("services_found", ())) for a in without) > 100


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_discover_after_a_register_ack_finds_the_agent(
    tmp_path: Path, transport: str
) -> None:
    async with serving(tmp_path, transport) as served, served.connect() as ws:
        token = (await register(ws, "me"))["payload"]["auth_token"]
        await worker_running(served.lobby, ws, "me", token)
        for n in range(20):
            async with served.connect() as other:
                name = f"fresh{n}"
                await register(other, name, capabilities=[{"name": name, "description": "new"}])
                found = await discover(ws, "me", token, {"capability_name": name})
                assert [s["agent_id"] for s in found["payload"]["services_found"]] == [name]
                await other.send(frame(name, "UNREGISTER", {}, auth_token="x"))
        found = await discover(ws, "me", token, {"query": "new"})
        assert found["payload"]["services_found"] != []


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_killed_worker_loses_no_answer(
    tmp_path: Path, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker killed with queries waiting in it, three times: every query is answered
    (by the lobby), each death logged once, one new worker started at a time."""
    monkeypatch.setattr(discovery_worker, "SNAPSHOT_SLICE", 1)  # a pass of the loop per agent
    async with serving(tmp_path, transport) as served, served.connect() as ws:
        await fill(served.connect, 6)
        token = (await register(ws, "me"))["payload"]["auth_token"]
        lobby = served.lobby
        assert lobby.discovery is not None
        await worker_running(lobby, ws, "me", token)
        expected = await discover(ws, "me", token, {"query": "task"})
        with structlog.testing.capture_logs() as logs:
            for _ in range(3):  # the first worker, then its replacement, twice
                process = lobby.discovery.process
                assert process is not None
                for _ in range(4):  # waiting in the worker when it dies
                    await ws.send(
                        frame("me", "DISCOVER_SERVICES", {"query": "task"}, auth_token=token)
                    )
                process.kill()
                for _ in range(4):
                    answer = await reply(ws)
                    answer.pop("message_id")
                    assert answer == expected
                await worker_running(lobby, ws, "me", token)
        failures = [e for e in logs if e["event"] == "DISCOVERY_WORKER_FAILED"]
        assert len(failures) == 3
        assert lobby.discovery.deaths == 3
        assert lobby.discovery.started == 4
        assert await discover(ws, "me", token, {"query": "task"}) == expected


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_worker_runs_at_the_lowest_cpu_priority(tmp_path: Path, transport: str) -> None:
    async with serving(tmp_path, transport) as served, served.connect() as ws:
        token = (await register(ws, "me"))["payload"]["auth_token"]
        assert served.lobby.discovery is not None
        await worker_running(served.lobby, ws, "me", token)
        process = served.lobby.discovery.process
        assert process is not None
        if hasattr(os, "SCHED_IDLE"):  # Linux
            assert os.sched_getscheduler(process.pid) == os.SCHED_IDLE
        else:
            assert os.getpriority(os.PRIO_PROCESS, process.pid) == 19
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the lobby itself is not lowered


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_starved_worker_s_queries_are_answered_in_process(
    tmp_path: Path, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker stopped (as if it never got a core) with queries in it: past
    `STARVED_AFTER` the lobby answers them, and the queries after them, itself; once the
    worker has caught up, its late answers are dropped (the agent gets each answer once) and
    it answers again."""
    monkeypatch.setattr(discovery_worker, "STARVED_AFTER", 0.3)
    async with serving(tmp_path, transport) as served, served.connect() as ws:
        await fill(served.connect, 6)
        token = (await register(ws, "me"))["payload"]["auth_token"]
        worker = served.lobby.discovery
        assert worker is not None
        await worker_running(served.lobby, ws, "me", token)
        process = worker.process
        assert process is not None
        queries: list[dict[str, Any]] = [{"query": "task"}, {"keywords": ["third"]}, {"limit": 3}]
        expected = [await discover(ws, "me", token, q) for q in queries]
        with structlog.testing.capture_logs() as logs:
            process.send_signal(signal.SIGSTOP)
            try:
                for query in queries:
                    await ws.send(frame("me", "DISCOVER_SERVICES", query, auth_token=token))
                answers = [await reply(ws) for _ in queries]
                # Those the worker was asked before the first was overdue (all of them, unless
                # the frames came far apart); the rest were answered in process directly.
                taken_back = worker.taken_back
                assert 1 <= taken_back <= len(queries)
                assert worker.behind
                # Asked while the worker is behind: answered in process at once.
                assert await discover(ws, "me", token, queries[0]) == expected[0]
            finally:
                process.send_signal(signal.SIGCONT)
        for answer in answers:
            answer.pop("message_id")
        assert answers == expected
        starved = [e for e in logs if e["event"] == "DISCOVERY_WORKER_STARVED"]
        assert [e["taken_back"] for e in starved] == [taken_back]
        for _ in range(500):
            if not worker.behind:
                break
            await asyncio.sleep(0.01)
        assert not worker.behind
        # The worker answers again; the agent got no second answer to the taken-back queries
        # (asked in the other order, a late answer would be read in place of another's).
        again = [await discover(ws, "me", token, q) for q in reversed(queries)]
        assert again == expected[::-1]
        assert worker.taken_back == taken_back
        assert worker.process is process


def test_the_setting_turns_the_worker_off_and_is_checked() -> None:
    parser = argparse.ArgumentParser()
    add_serve_options(parser)
    assert settings_from(parser.parse_args([]), {}).discovery_worker is True
    settings = settings_from(parser.parse_args(["--no-discovery-worker"]), {})
    assert settings.discovery_worker is False
    assert LobbyServer(replace(settings, store="memory")).discovery is None
    with pytest.raises(SettingError, match="LOBBY_DISCOVERY_WORKER"):
        settings_from(parser.parse_args([]), {"LOBBY_DISCOVERY_WORKER": "maybe"})
