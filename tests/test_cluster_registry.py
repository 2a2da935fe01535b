"""Lobby nodes sharing one registry (KV bucket `agents`): real `lobby serve --cluster` node
processes on one real `nats-server -js`, agents on each talking raw WebSocket."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import websockets.asyncio.client
import websockets.exceptions
from websockets.asyncio.client import ClientConnection

from lobby.cluster.keys import AGENTS, agent_key
from lobby.identity import PATTERN
from tests.conftest import LobbyProcess
from tests.natskit import connect, nats_server
from tests.routerkit import cap
from tests.test_cluster_node import node
from tests.test_durability import stop
from tests.test_metrics import http_get
from tests.wsclient import frame, register, reply

WAIT = 30.0
"""Seconds a change may take to reach another node (a bound, not a timing claim)."""


@asynccontextmanager
async def agent(proc: LobbyProcess, agent_id: str, **payload: Any) -> AsyncIterator[Agent]:
    async with websockets.asyncio.client.connect(proc.url) as ws:
        ack = await register(ws, agent_id, **payload)
        assert ack["message_type"] == "REGISTER_ACK", ack
        yield Agent(ws, agent_id, ack["payload"]["auth_token"])


class Agent:
    def __init__(self, ws: ClientConnection, agent_id: str, token: str) -> None:
        self.ws, self.agent_id, self.token = ws, agent_id, token

    async def ask(self, message_type: str, payload: dict[str, Any]) -> dict[str, Any]:
        await self.ws.send(frame(self.agent_id, message_type, payload, auth_token=self.token))
        return await reply(self.ws)

    async def discovered(self) -> dict[str, list[str]]:
        """agent id -> its capability names, as DISCOVER_SERVICES on this agent's node says."""
        answer = await self.ask("DISCOVER_SERVICES", {})
        assert answer["message_type"] == "SERVICES_AVAILABLE", answer
        return {
            s["agent_id"]: sorted(c["name"] for c in s["relevant_capabilities"])
            for s in answer["payload"]["services_found"]
        }

    async def until_discovered(self, expected: dict[str, list[str]]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while (found := await self.discovered()) != expected:
            assert loop.time() < deadline, f"{self.agent_id} still sees {found}"
            await asyncio.sleep(0.05)


async def test_discover_on_one_node_lists_the_agents_of_every_node(tmp_path: Path) -> None:
    async with nats_server(tmp_path) as nats:
        a = node(tmp_path / "a", nats, "a")
        b: LobbyProcess | None = None
        try:
            async with agent(a, "early.bird", capabilities=[cap("sing")]):
                # A node started later reads what the bucket already holds before it listens.
                b = node(tmp_path / "b", nats, "b")
                async with (
                    agent(a, "viewer", capabilities=[cap("watch")]) as viewer,
                    agent(b, "seller:7@b", capabilities=[cap("quote"), cap("sell")]) as seller,
                ):
                    await viewer.until_discovered(
                        {"early.bird": ["sing"], "seller:7@b": ["quote", "sell"]}
                    )
                    await seller.until_discovered({"early.bird": ["sing"], "viewer": ["watch"]})
                    await seller.ws.send(
                        frame(
                            seller.agent_id,
                            "UPDATE_CAPABILITIES",
                            {"capabilities": [cap("appraise")]},
                            auth_token=seller.token,
                        )
                    )
                    await viewer.until_discovered(
                        {"early.bird": ["sing"], "seller:7@b": ["appraise"]}
                    )
                    await seller.ws.send(
                        frame(seller.agent_id, "UNREGISTER", {}, auth_token=seller.token)
                    )
                    await viewer.until_discovered({"early.bird": ["sing"]})
                # The bucket holds hashes, never a token.
                client = await connect(nats.url)
                try:
                    kv = await client.jetstream().key_value(AGENTS)
                    entry = await kv.get(agent_key("early.bird"))
                    assert entry.value is not None
                    value = orjson.loads(entry.value)
                    assert set(value) == {"token_hash", "capabilities", "acks", "node"}
                    assert value["node"] == "a"
                    assert len(bytes.fromhex(value["token_hash"])) == 32
                finally:
                    await client.close()
        finally:
            stop(a)
            if b is not None:
                stop(b)


async def test_one_id_registered_on_two_nodes_at_once_is_won_by_exactly_one(
    tmp_path: Path,
) -> None:
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        try:
            ids = [f"contested-{n}" for n in range(20)]
            answers = await asyncio.gather(*(race(a, b, agent_id) for agent_id in ids))
            for agent_id, (first, second) in zip(ids, answers, strict=True):
                kinds = sorted([kind(first), kind(second)])
                assert kinds == ["agent_id_taken", "registered"], (agent_id, first, second)
            # Every contested id is known to both nodes, with the winner's capability.
            async with agent(a, "look-a") as look_a, agent(b, "look-b") as look_b:
                await look_a.until_discovered({i: ["c"] for i in ids})
                await look_b.until_discovered({i: ["c"] for i in ids})
        finally:
            stop(a)
            stop(b)


async def race(a: LobbyProcess, b: LobbyProcess, agent_id: str) -> tuple[dict[str, Any], ...]:
    async with (
        websockets.asyncio.client.connect(a.url) as on_a,
        websockets.asyncio.client.connect(b.url) as on_b,
    ):
        register_frame = frame(agent_id, "REGISTER", {"capabilities": [cap("c")]})
        await asyncio.gather(on_a.send(register_frame), on_b.send(register_frame))
        return tuple(await asyncio.gather(reply(on_a), reply(on_b)))


def kind(answer: dict[str, Any]) -> str:
    if answer["message_type"] == "REGISTER_ACK":
        return "registered"
    return str(answer["payload"]["code"])


async def test_a_resume_on_another_node_closes_the_old_connection_with_4001(
    tmp_path: Path,
) -> None:
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        try:
            async with agent(a, "mover", capabilities=[cap("c")]) as on_a:
                assert await online(a) == 1
                async with websockets.asyncio.client.connect(b.url) as on_b:
                    resume = frame("mover", "REGISTER", {}, auth_token=on_a.token)
                    await on_b.send(resume)
                    ack = await reply(on_b)
                    assert ack["message_type"] == "REGISTER_ACK", ack
                    assert ack["payload"]["auth_token"] == on_a.token
                    with pytest.raises(websockets.exceptions.ConnectionClosed):
                        await asyncio.wait_for(on_a.ws.recv(), WAIT)
                    assert on_a.ws.close_code == 4001
                    assert on_a.ws.close_reason == "replaced by a newer connection on node b"
                    # Online on its home only.
                    assert (await online(a), await online(b)) == (0, 1)
                    # And back: the connection on b is the one replaced now.
                    async with websockets.asyncio.client.connect(a.url) as again:
                        await again.send(resume)
                        assert (await reply(again))["message_type"] == "REGISTER_ACK"
                        with pytest.raises(websockets.exceptions.ConnectionClosed):
                            await asyncio.wait_for(on_b.recv(), WAIT)
                        assert on_b.close_code == 4001
                        assert (await online(a), await online(b)) == (1, 0)
        finally:
            stop(a)
            stop(b)


async def online(proc: LobbyProcess) -> int:
    return int((await healthz(proc))["agents_online"])


async def test_healthz_lists_the_live_nodes_and_drops_a_stopped_or_killed_one(
    tmp_path: Path,
) -> None:
    async with nats_server(tmp_path) as nats:
        a, b = node(tmp_path / "a", nats, "a"), node(tmp_path / "b", nats, "b")
        c = node(tmp_path / "c", nats, "c")
        try:
            await until_nodes(a, ["a", "b", "c"])
            health = await healthz(b)
            assert health["node_id"] == "b"
            # One lobby to its agents: every node announces the identity the first one made.
            identities = {(await healthz(proc))["lobby_identity"] for proc in (a, b, c)}
            assert len(identities) == 1
            assert PATTERN.fullmatch(str(health["lobby_identity"]))
            stop(b)  # a clean stop deletes its key
            await until_nodes(a, ["a", "c"])
            c.signal(signal.SIGKILL)  # a killed node's key expires (NODE_TTL)
            c.wait(10)
            await until_nodes(a, ["a"])
        finally:
            for proc in (a, b, c):
                stop(proc)


async def healthz(proc: LobbyProcess) -> dict[str, Any]:
    _, _, body = await http_get(f"http://127.0.0.1:{proc.port}/healthz")
    health: dict[str, Any] = orjson.loads(body)
    return health


async def until_nodes(proc: LobbyProcess, expected: list[str]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while (nodes := (await healthz(proc))["nodes"]) != expected:
        assert loop.time() < deadline, f"still {nodes}, waiting for {expected}"
        await asyncio.sleep(0.1)
