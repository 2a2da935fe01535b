"""The memory transport keeps the contract of the socket ones (lobby/transport/base.py), tried
through a real `LobbyServer`: frames go out when the lobby flushes them, `flush` counts what
the client has not read, closes carry their codes both ways, and the limits close with 1009
and 4002 as over a socket. No socket is opened here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from http import HTTPStatus
from typing import Any

import orjson
import pytest

from lobby.server import LobbyServer
from lobby.transport import memory
from lobby.transport.memory import ConnectionClosed, MemoryClient, MemoryLink, MemoryTransport
from tests.conftest import SETTINGS
from tests.wsclient import frame, reply, token_of

BOUND = 5.0
"""Seconds a test waits for what must happen."""


@asynccontextmanager
async def in_memory(**overrides: Any) -> AsyncIterator[tuple[LobbyServer, MemoryTransport]]:
    transport = MemoryTransport()
    lobby = LobbyServer(replace(SETTINGS, store="memory", **overrides), transport=transport)
    await lobby.start()
    try:
        yield lobby, transport
    finally:
        await lobby.stop()


def link_of(lobby: LobbyServer, agent_id: str) -> MemoryLink:
    record = lobby.router.registry.get(agent_id)
    assert record is not None
    assert record.session is not None
    link = record.session.link
    assert isinstance(link, MemoryLink)
    return link


def online(lobby: LobbyServer, agent_id: str) -> bool:
    agent = lobby.router.registry.agents.get(agent_id)
    return agent is not None and agent.session is not None


async def until_closed(client: MemoryClient) -> tuple[list[str], int]:
    """What is left to read before the close, and the close code."""
    messages = []
    while True:
        try:
            messages.append(await client.recv(timeout=BOUND))
        except ConnectionClosed as closed:
            code = closed.code
            break
    assert code == client.close_code
    return messages, code


async def closed_with(client: MemoryClient) -> int:
    return (await until_closed(client))[1]


async def test_a_frame_reaches_the_client_when_the_lobby_flushes_it() -> None:
    async with in_memory() as (lobby, transport), transport.connect() as client:
        await token_of(client, "a")
        link = link_of(lobby, "a")
        assert link.put(b'{"n": 1}')
        assert client.unread == 0  # framed, not written yet
        assert link.flush() == len(b'{"n": 1}')  # written, and waiting for the client
        assert await client.recv(timeout=BOUND) == '{"n": 1}'
        assert link.flush() == 0


async def test_the_lobbys_close_comes_after_what_was_written_before_it() -> None:
    async with in_memory() as (lobby, transport), transport.connect() as client:
        await token_of(client, "a")
        link = link_of(lobby, "a")
        link.put(b'{"last": true}')
        link.shut(4003, "unregistered")
        assert not link.put(b'{"too": "late"}')
        assert await client.recv(timeout=BOUND) == '{"last": true}'
        assert await closed_with(client) == 4003
        assert client.close_reason == "unregistered"
        with pytest.raises(ConnectionClosed):
            await client.send(frame("a", "DISCOVER_SERVICES", {}))
    assert lobby.connections == 0
    assert not online(lobby, "a")


async def test_a_client_close_takes_its_agent_offline_and_is_echoed() -> None:
    async with in_memory() as (lobby, transport):
        client = transport.connect()
        await token_of(client, "a")
        assert lobby.connections == 1
        await client.close(4000, "done")
        assert client.close_code == 4000
        assert not online(lobby, "a")
        assert lobby.connections == 0
        assert lobby.health()["agents_online"] == 0


async def test_a_message_over_the_limit_closes_only_that_connection_with_1009() -> None:
    async with (
        in_memory(max_message_bytes=1000) as (lobby, transport),
        transport.connect() as big,
        transport.connect() as other,
    ):
        await token_of(big, "big")
        other_token = await token_of(other, "other")
        await big.send(frame("big", "DISCOVER_SERVICES", {"x": "y" * 5000}))
        assert await closed_with(big) == 1009
        assert not online(lobby, "big")
        await other.send(frame("other", "DISCOVER_SERVICES", {}, auth_token=other_token))
        assert (await reply(other))["message_type"] == "SERVICES_AVAILABLE"


async def test_a_client_that_stops_reading_is_closed_with_4002() -> None:
    """Past the delivery window unread, what is sent to the client is held; once that and
    the unread pass `max_outbound_bytes`, the lobby closes the connection. The client finds
    what was written before the close, then the code; the rest is held for its resume."""
    async with (
        in_memory(max_outbound_bytes=64 * 1024) as (lobby, transport),
        transport.connect() as stalled,
        transport.connect() as flooder,
    ):
        await token_of(stalled, "stalled")
        flooder_token = await token_of(flooder, "flooder")
        text = frame(
            "flooder",
            "TEXT",
            {"content": "z" * 8000},
            receiver_id="stalled",
            auth_token=flooder_token,
        )
        sent = 0
        while online(lobby, "stalled") and sent < 100:
            await flooder.send(text)
            sent += 1
        assert not online(lobby, "stalled"), "never dropped"
        assert sent > 64 * 1024 // 8000
        for _ in range(3):  # held for its resume, not written to the closed connection
            await flooder.send(text)
        read, code = await until_closed(stalled)
        assert code == 4002
        assert [orjson.loads(text)["message_type"] for text in read] == ["TEXT"] * len(read)
        assert 0 < len(read) * 8000 <= 32 * 1024 + 8000  # the window: half the bound
        held = lobby.router.registry.agents["stalled"].mailbox
        assert len(held) == sent + 3 - len(read)


async def test_a_client_reading_slowly_gets_a_backlog_of_twice_the_bound_as_it_reads() -> None:
    """Resumed to more than `max_outbound_bytes`, the client is written a window at a time:
    the lobby writes more each time its reading brings the unread bytes down to the low-water
    mark, and never cuts it."""
    bound = 64 * 1024
    async with (
        in_memory(max_outbound_bytes=bound) as (lobby, transport),
        transport.connect() as flooder,
    ):
        flooder_token = await token_of(flooder, "flooder")
        async with transport.connect() as reader:
            token = await token_of(reader, "reader", acks=True)
        for n in range(20):
            text = {"content": "z" * 8000, "n": n}
            await flooder.send(
                frame("flooder", "TEXT", text, receiver_id="reader", auth_token=flooder_token)
            )
        async with transport.connect() as reader:
            await reader.send(frame("reader", "REGISTER", {"acks": True}, auth_token=token))
            assert (await reply(reader))["payload"]["status"] == "success_resumed"
            got = []
            for _ in range(20):
                assert reader.unread <= bound // 2 + 8100  # the window, and the one past it
                got.append(orjson.loads(await reader.recv(timeout=BOUND))["payload"]["n"])
            assert online(lobby, "reader")
        assert got == list(range(20))


async def test_no_register_in_time_closes_1008() -> None:
    async with (
        in_memory(handshake_timeout=0.2) as (lobby, transport),
        transport.connect() as idle,
    ):
        assert await closed_with(idle) == 1008
    assert lobby.connections == 0


async def test_connect_is_answered_as_an_upgrade_request() -> None:
    async with in_memory(max_connections=1) as (lobby, transport):
        with pytest.raises(memory.Refused) as health:
            transport.connect("/healthz")
        assert health.value.status == HTTPStatus.OK
        assert health.value.body["transport"] == "memory"
        with pytest.raises(memory.Refused) as elsewhere:
            transport.connect("/agents")
        assert elsewhere.value.status == HTTPStatus.NOT_FOUND
        async with transport.connect():
            with pytest.raises(memory.Refused) as full:
                transport.connect()
            assert full.value.status == HTTPStatus.SERVICE_UNAVAILABLE
        assert lobby.connections == 0


async def test_metrics_and_admin_are_answered_as_over_a_socket() -> None:
    token = "an-admin-token-of-the-test"
    async with in_memory(admin_token=token) as (lobby, transport):
        with pytest.raises(memory.Refused) as metrics:
            transport.connect("/metrics")
        assert metrics.value.status == HTTPStatus.OK
        assert metrics.value.content_type.startswith("text/plain")
        assert "lobby_connections 0.0" in metrics.value.body
        with pytest.raises(memory.Refused) as refused:
            transport.connect("/admin", authorization="Bearer not-it")
        assert refused.value.status == HTTPStatus.UNAUTHORIZED
        async with transport.connect() as agent:
            await token_of(agent, "seller")
            async with transport.connect("/admin", authorization=f"Bearer {token}") as admin:
                await admin.send('{"command": "remove", "agent_id": "seller", "id": 3}')
                answer = orjson.loads(await admin.recv(timeout=BOUND))
            assert answer == {
                "ok": True,
                "command": "remove",
                "agent_id": "seller",
                "was_online": True,
                "id": 3,
            }
            assert await until_closed(agent) == ([], 4003)
        assert lobby.router.registry.agents == {}


async def test_a_lobby_that_is_not_running_refuses_connections() -> None:
    transport = MemoryTransport()
    with pytest.raises(ConnectionRefusedError):
        transport.connect()
    lobby = LobbyServer(replace(SETTINGS, store="memory"), transport=transport)
    await lobby.start()
    client = transport.connect()
    await lobby.stop()
    assert await closed_with(client) == 1001
    with pytest.raises(ConnectionRefusedError):
        transport.connect()


async def test_the_lobby_on_the_memory_transport_has_no_port() -> None:
    async with in_memory() as (lobby, _):
        assert lobby.url == "memory://global_lobby/"
        with pytest.raises(RuntimeError, match="no port"):
            _ = lobby.port
        assert lobby.health()["transport"] == "memory"


async def test_a_message_is_routed_before_send_returns_and_recv_waits_at_most_its_timeout() -> None:
    async with in_memory() as (_, transport), transport.connect() as client:
        with pytest.raises(TimeoutError):
            await client.recv(timeout=0.05)
        await client.send(frame("a", "REGISTER", {}))
        assert client.unread > 0  # the answer is written within the same call
        assert orjson.loads(await client.recv(timeout=BOUND))["message_type"] == "REGISTER_ACK"
