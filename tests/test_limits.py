"""Limits against abuse and backpressure, each answered as PROTOCOL.md documents."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from agent_sdk import Agent
from lobby.transport.memory import MemoryLink
from lobby.transport.picows import PicowsLink
from lobby.transport.websockets import LobbyConnection
from tests.conftest import TRANSPORTS
from tests.waiting import until
from tests.wsclient import frame, register, reply, running, serving, token_of


def capability(name: str) -> dict[str, Any]:
    return {"name": name, "description": "", "input_schema": {}, "output_schema": {}}


async def test_message_rate_is_limited_per_agent(tmp_path: Path) -> None:
    async with (
        running(tmp_path, message_rate=1, message_burst=3) as lobby,
        connect(lobby.url) as ws,
        connect(lobby.url) as other,
    ):
        token = (await register(ws, "chatty"))["payload"]["auth_token"]
        other_token = (await register(other, "quiet"))["payload"]["auth_token"]
        for n in range(5):
            query = frame(
                "chatty", "DISCOVER_SERVICES", {}, auth_token=token, conversation_id=f"q{n}"
            )
            await ws.send(query)
        # A refusal is answered at once, a query after the rest of its read: match by id.
        replies = {r["conversation_id"]: r for r in [await reply(ws) for _ in range(5)]}
        kinds = [replies[f"q{n}"]["message_type"] for n in range(5)]
        assert kinds == ["SERVICES_AVAILABLE"] * 3 + ["ERROR", "ERROR"]
        assert replies["q3"]["payload"]["code"] == "rate_limited"
        # Another agent has its own allowance.
        await other.send(frame("quiet", "DISCOVER_SERVICES", {}, auth_token=other_token))
        assert (await reply(other))["message_type"] == "SERVICES_AVAILABLE"


async def test_capabilities_per_agent_are_limited(tmp_path: Path) -> None:
    async with running(tmp_path, max_capabilities=2) as lobby, connect(lobby.url) as ws:
        caps = [capability(f"c{i}") for i in range(3)]
        refused = await register(ws, "greedy", capabilities=caps)
        assert refused["payload"]["code"] == "limit_exceeded"
        token = (await register(ws, "greedy", capabilities=caps[:2]))["payload"]["auth_token"]
        await ws.send(
            frame("greedy", "UPDATE_CAPABILITIES", {"capabilities": caps}, auth_token=token)
        )
        assert (await reply(ws))["payload"]["code"] == "limit_exceeded"
        assert sorted(lobby.router.registry.agents["greedy"].capabilities) == ["c0", "c1"]


async def test_open_requests_and_dialogues_per_agent_are_limited(tmp_path: Path) -> None:
    async with (
        running(tmp_path, max_open_requests=1, max_open_dialogues=1) as lobby,
        connect(lobby.url) as asker,
        connect(lobby.url) as server,
    ):
        token = (await register(asker, "asker"))["payload"]["auth_token"]
        server_token = (await register(server, "server", capabilities=[capability("c")]))[
            "payload"
        ]["auth_token"]

        def to_server(kind: str, payload: dict[str, Any], conversation: str) -> str:
            return frame(
                "asker",
                kind,
                payload,
                receiver_id="server",
                conversation_id=conversation,
                message_id=f"{kind}-{conversation}",
                auth_token=token,
            )

        await asker.send(to_server("REQUEST", {"capability_name": "c"}, "k1"))
        assert (await reply(server))["conversation_id"] == "k1"
        await asker.send(to_server("REQUEST", {"capability_name": "c"}, "k2"))
        assert (await reply(asker))["payload"]["code"] == "limit_exceeded"
        await server.send(
            frame(
                "server",
                "RESPONSE",
                {"status": "success"},
                receiver_id="asker",
                conversation_id="k1",
                auth_token=server_token,
            )
        )
        assert (await reply(asker))["message_type"] == "RESPONSE"
        await asker.send(to_server("REQUEST", {"capability_name": "c"}, "k2"))
        assert (await reply(server))["conversation_id"] == "k2"  # k1 answered: room again

        await asker.send(to_server("CFP", {"query": {}}, "d1"))
        assert (await reply(server))["message_type"] == "CFP"
        await asker.send(to_server("CFP", {"query": {}}, "d2"))
        refused = await reply(asker)
        assert refused["payload"]["code"] == "limit_exceeded"
        assert refused["payload"]["original_message_type"] == "CFP"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_connections_are_limited(tmp_path: Path, transport: str) -> None:
    async with (
        running(tmp_path, max_connections=2, transport=transport) as lobby,
        connect(lobby.url),
        connect(lobby.url),
    ):
        with pytest.raises(InvalidStatus) as refused:
            await connect(lobby.url)
        assert refused.value.response.status_code == 503


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_connection_that_does_not_register_is_closed(
    tmp_path: Path, transport: str
) -> None:
    async with (
        running(tmp_path, handshake_timeout=0.2, transport=transport) as lobby,
        connect(lobby.url) as ws,
    ):
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)
        assert ws.close_code == 1008


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_connection_that_registers_drops_its_deadline_at_once(
    tmp_path: Path, transport: str
) -> None:
    """The registration deadline's timer goes at REGISTER_ACK (not when it would have run, a
    timer per connection held while a fleet registers); a refused REGISTER keeps it."""
    async with (
        running(tmp_path, handshake_timeout=0.3, transport=transport) as lobby,
        connect(lobby.url) as ws,
    ):
        await until(lambda: len(lobby._deadlines) == 1, "the connection's deadline set")
        refused = await register(ws, "")
        assert refused["message_type"] == "ERROR"
        assert len(lobby._deadlines) == 1
        assert (await register(ws, "kept"))["message_type"] == "REGISTER_ACK"
        assert lobby._deadlines == {}


async def test_registration_attempts_per_address_are_limited(tmp_path: Path) -> None:
    async with running(tmp_path, registration_rate=0.01, registration_burst=2) as lobby:
        outcomes = []
        for i in range(3):
            async with connect(lobby.url) as ws:
                outcomes.append((await register(ws, f"agent{i}"))["message_type"])
        assert outcomes == ["REGISTER_ACK", "REGISTER_ACK", "ERROR"]
        assert "agent2" not in lobby.router.registry.agents


async def test_registration_key(tmp_path: Path) -> None:
    async with (
        running(tmp_path, registration_key="s3cret") as lobby,
        connect(lobby.url) as ws,
    ):
        assert (await register(ws, "a"))["payload"]["code"] == "auth_failed"
        wrong = await register(ws, "a", registration_key="nope")
        assert wrong["payload"]["code"] == "auth_failed"
        assert "nope" not in wrong["payload"]["error"]
        ok = await register(ws, "a", registration_key="s3cret")
        assert ok["payload"]["status"] == "success_registered_finalized"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_tls(tmp_path: Path, transport: str) -> None:
    authority = trustme.CA()
    cert = authority.issue_cert("127.0.0.1")
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(cert_path)
    cert.private_key_pem.write_to_path(key_path)
    client_context = ssl.create_default_context()
    authority.configure_trust(client_context)
    async with running(
        tmp_path / "data", tls_cert=cert_path, tls_key=key_path, transport=transport
    ) as lobby:
        assert lobby.url.startswith("wss://")
        async with Agent("secure", lobby_url=lobby.url, ssl_context=client_context) as agent:
            assert await agent.discover() == []
        with pytest.raises(InvalidHandshake):  # plain ws:// to a TLS port
            async with connect(lobby.url.replace("wss://", "ws://"), open_timeout=2) as plain:
                await plain.recv()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_stalled_receiver_is_dropped_and_loses_nothing(
    tmp_path: Path, transport: str
) -> None:
    big = "x" * 60_000
    async with (
        running(
            tmp_path, max_outbound_bytes=200_000, max_message_bytes=1_000_000, transport=transport
        ) as lobby,
        connect(lobby.url, max_queue=1) as stalled,
        connect(lobby.url) as sender,
        connect(lobby.url) as bystander,
    ):
        caps = [capability("sink")]
        stalled_token = (await register(stalled, "stalled", capabilities=caps, acks=True))[
            "payload"
        ]["auth_token"]
        sender_token = (await register(sender, "sender"))["payload"]["auth_token"]
        bystander_token = (await register(bystander, "bystander"))["payload"]["auth_token"]
        sent = 0
        while lobby.router.registry.agents["stalled"].session is not None and sent < 2000:
            await sender.send(
                frame(
                    "sender",
                    "REQUEST",
                    {"capability_name": "sink", "n": sent, "blob": big},
                    receiver_id="stalled",
                    conversation_id=f"c{sent}",
                    auth_token=sender_token,
                )
            )
            sent += 1
            if sent % 20 == 0:
                await asyncio.sleep(0.01)
        assert lobby.router.registry.agents["stalled"].session is None, "never dropped"
        # Senders and other agents are unaffected.
        await bystander.send(
            frame("bystander", "DISCOVER_SERVICES", {}, auth_token=bystander_token)
        )
        assert (await reply(bystander))["message_type"] == "SERVICES_AVAILABLE"
        # The stalled agent resumes and gets every message, in order.
        async with connect(lobby.url, max_size=None) as again:
            await again.send(frame("stalled", "REGISTER", {"acks": True}, auth_token=stalled_token))
            assert (await reply(again))["payload"]["status"] == "success_resumed"
            numbers = [(await reply(again))["payload"]["n"] for _ in range(sent)]
        assert numbers == list(range(sent))
        # Reading again, the stalled connection finds the lobby's close frame behind its data.
        with pytest.raises(ConnectionClosed):
            await drain(stalled)
        assert stalled.close_code == 4002


async def drain(ws: ClientConnection) -> None:
    while True:
        await asyncio.wait_for(ws.recv(), 5)


async def test_discovery_has_its_own_lower_rate_per_agent(tmp_path: Path) -> None:
    """A DISCOVER costs the lobby about a hundred routed messages: an agent past its discovery
    rate is refused `rate_limited`, while its other messages and other agents' queries pass."""
    async with (
        running(tmp_path, discover_rate=1, discover_burst=2) as lobby,
        connect(lobby.url) as ws,
        connect(lobby.url) as other,
    ):
        token = (await register(ws, "seeker"))["payload"]["auth_token"]
        other_token = (await register(other, "calm"))["payload"]["auth_token"]
        for n in range(3):
            query = frame(
                "seeker", "DISCOVER_SERVICES", {}, auth_token=token, conversation_id=f"q{n}"
            )
            await ws.send(query)
        by_id = {r["conversation_id"]: r for r in [await reply(ws) for _ in range(3)]}
        replies = [by_id[f"q{n}"] for n in range(3)]
        assert [r["message_type"] for r in replies] == ["SERVICES_AVAILABLE"] * 2 + ["ERROR"]
        refusal = replies[2]["payload"]
        assert refusal["code"] == "rate_limited"
        assert "more than 1 DISCOVER_SERVICES a second" in refusal["error"]
        # Its other messages are not counted against discovery.
        await ws.send(frame("seeker", "LIST_TRANSACTIONS", {}, auth_token=token))
        assert (await reply(ws))["message_type"] == "TRANSACTIONS"
        await other.send(frame("calm", "DISCOVER_SERVICES", {}, auth_token=other_token))
        assert (await reply(other))["message_type"] == "SERVICES_AVAILABLE"


def _read(link: object) -> bool:
    """Whether the lobby reads `link`'s connection now: the socket's own transport says."""
    if isinstance(link, MemoryLink):
        return link.readable.is_set()
    if isinstance(link, LobbyConnection):
        return link.transport.is_reading()
    assert isinstance(link, PicowsLink)
    assert link._transport is not None
    return bool(link._transport.underlying_transport.is_reading())


@pytest.mark.parametrize("transport", ["memory", *TRANSPORTS])
async def test_past_its_rate_an_agent_is_not_read_until_it_has_a_token_again(
    tmp_path: Path, transport: str
) -> None:
    """A flooder would cost a refusal per frame: after `rate_limited` the lobby stops reading
    its connection (TCP's backpressure holds the rest), then reads on, losing nothing."""
    async with (
        serving(tmp_path, transport, discover_rate=0.5, discover_burst=1) as served,
        served.connect() as ws,
        served.connect() as other,
    ):
        token = await token_of(ws, "flooder")
        other_token = await token_of(other, "calm")
        for _ in range(2):
            await ws.send(frame("flooder", "DISCOVER_SERVICES", {}, auth_token=token))
            answer = await reply(ws)
        assert answer["payload"]["code"] == "rate_limited"
        link = served.lobby.router.registry.agents["flooder"].session.link  # type: ignore[union-attr]
        assert not _read(link)
        # Nobody else waits for it.
        await other.send(frame("calm", "LIST_TRANSACTIONS", {}, auth_token=other_token))
        assert (await reply(other))["message_type"] == "TRANSACTIONS"
        await until(lambda: _read(link), "the flooder's connection read again")
        await ws.send(frame("flooder", "LIST_TRANSACTIONS", {}, auth_token=token))
        assert (await reply(ws))["message_type"] == "TRANSACTIONS"
