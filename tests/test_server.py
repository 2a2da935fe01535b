"""The lobby over real sockets on 127.0.0.1: the behaviours of the router, through websockets."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close, Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from lobby.server import LobbyServer
from tests.conftest import TRANSPORTS, make_lobby
from tests.wsclient import frame, register, reply, running

CAP = {"name": "price", "description": "", "input_schema": {}, "output_schema": {}}


async def expect_silence(ws: ClientConnection, seconds: float = 0.2) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(ws.recv(), seconds)


async def token_of(ws: ClientConnection, agent_id: str, **payload: Any) -> str:
    ack = await register(ws, agent_id, **payload)
    assert ack["payload"]["status"] == "success_registered_finalized"
    return str(ack["payload"]["auth_token"])


async def test_the_seed_flow_over_sockets(lobby: LobbyServer) -> None:
    hunter_cap = {**CAP, "authorized_requester_ids": ["searcher"]}
    async with (
        connect(lobby.url) as hunter,
        connect(lobby.url) as searcher,
        connect(lobby.url) as rogue,
    ):
        hunter_token = await token_of(hunter, "hunter", capabilities=[hunter_cap])
        searcher_token = await token_of(searcher, "searcher")
        rogue_token = await token_of(rogue, "rogue")
        await searcher.send(
            frame(
                "searcher",
                "DISCOVER_SERVICES",
                {"capability_name": "price"},
                auth_token=searcher_token,
            )
        )
        found = await reply(searcher)
        assert found["payload"]["services_found"][0]["agent_id"] == "hunter"
        request = {"capability_name": "price", "item": "x"}
        await searcher.send(
            frame(
                "searcher",
                "REQUEST",
                request,
                receiver_id="hunter",
                conversation_id="k",
                auth_token=searcher_token,
            )
        )
        delivered = await reply(hunter)
        assert delivered["payload"] == request
        assert "auth_token" not in delivered
        await hunter.send(
            frame(
                "hunter",
                "RESPONSE",
                {"status": "success", "price": 1},
                receiver_id="searcher",
                conversation_id="k",
                auth_token=hunter_token,
            )
        )
        answer = await reply(searcher)
        assert answer["payload"] == {"status": "success", "price": 1}
        assert "auth_token" not in answer
        await rogue.send(
            frame(
                "rogue",
                "REQUEST",
                request,
                receiver_id="hunter",
                conversation_id="r",
                auth_token=rogue_token,
            )
        )
        refused = await reply(rogue)
        assert refused["payload"]["code"] == "unauthorized"
        await expect_silence(hunter)


@pytest.mark.parametrize(
    "bad",
    [
        b"\x00binary",
        "{not json",
        "[1, 2]",
        '{"sender_id": "a", "receiver_id": "b", "message_type": "NOPE", "payload": {}}',
        '{"sender_id": 5, "receiver_id": "b", "message_type": "REQUEST", "payload": {}}',
        '{"sender_id": "a", "message_type": "REQUEST"}',
    ],
)
async def test_bad_input_gets_malformed_and_the_connection_stays_usable(
    lobby: LobbyServer, bad: str | bytes
) -> None:
    async with connect(lobby.url) as ws, connect(lobby.url) as bystander:
        token = await token_of(ws, "clumsy")
        bystander_token = await token_of(bystander, "bystander")
        await ws.send(bad)
        error = await reply(ws)
        assert error["message_type"] == "ERROR"
        assert error["payload"]["code"] == "malformed"
        assert error["payload"]["error"]
        await ws.send(frame("clumsy", "DISCOVER_SERVICES", {}, auth_token=token))
        assert (await reply(ws))["message_type"] == "SERVICES_AVAILABLE"
        await bystander.send(
            frame("bystander", "DISCOVER_SERVICES", {}, auth_token=bystander_token)
        )
        assert (await reply(bystander))["message_type"] == "SERVICES_AVAILABLE"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    "message",
    [
        frame("big", "DISCOVER_SERVICES", {"x": "y" * 5000}),
        ["{" + " " * 600, " " * 600 + "}"],  # fragments, each under the limit
    ],
    ids=["one-frame", "fragmented"],
)
async def test_a_message_over_the_limit_closes_only_that_connection_with_1009(
    tmp_path: Path, transport: str, message: str | list[str]
) -> None:
    async with (
        running(tmp_path, max_message_bytes=1000, transport=transport) as lobby,
        connect(lobby.url) as big,
        connect(lobby.url) as other,
    ):
        await token_of(big, "big")
        other_token = await token_of(other, "other")
        await big.send(message)
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(big.recv(), 5)
        assert big.close_code == 1009
        await other.send(frame("other", "DISCOVER_SERVICES", {}, auth_token=other_token))
        assert (await reply(other))["message_type"] == "SERVICES_AVAILABLE"


async def test_resume_closes_the_old_connection_with_4001(lobby: LobbyServer) -> None:
    async with connect(lobby.url) as old, connect(lobby.url) as new:
        token = await token_of(old, "twin")
        await new.send(frame("twin", "REGISTER", {}, auth_token=token))
        assert (await reply(new))["payload"]["status"] == "success_resumed"
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(old.recv(), 5)
        assert old.close_code == 4001


async def test_unregister_closes_with_4003(lobby: LobbyServer) -> None:
    async with connect(lobby.url) as ws:
        token = await token_of(ws, "leaver")
        await ws.send(frame("leaver", "UNREGISTER", {}, auth_token=token))
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)
        assert ws.close_code == 4003
    assert "leaver" not in lobby.router.registry.agents


async def test_held_messages_arrive_on_resume(lobby: LobbyServer) -> None:
    async with connect(lobby.url) as sender:
        async with connect(lobby.url) as receiver:
            receiver_token = await token_of(receiver, "receiver", capabilities=[CAP])
        sender_token = await token_of(sender, "sender")
        for n in range(3):
            await sender.send(
                frame(
                    "sender",
                    "REQUEST",
                    {"capability_name": "price", "n": n},
                    receiver_id="receiver",
                    conversation_id=f"k{n}",
                    auth_token=sender_token,
                )
            )
        await asyncio.sleep(0.1)
        async with connect(lobby.url) as again:
            await again.send(frame("receiver", "REGISTER", {}, auth_token=receiver_token))
            assert (await reply(again))["payload"]["status"] == "success_resumed"
            assert [(await reply(again))["payload"]["n"] for _ in range(3)] == [0, 1, 2]


async def test_healthz(lobby: LobbyServer) -> None:
    def get() -> tuple[int, str, dict[str, Any]]:
        url = f"http://127.0.0.1:{lobby.port}/healthz"
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers["Content-Type"], orjson.loads(response.read())

    status, content_type, body = await asyncio.to_thread(get)
    assert status == 200
    assert content_type == "application/json"
    assert body["status"] == "ok"
    assert body["lobby_id"] == "global_lobby"


async def test_a_fragmented_message_is_routed_whole(lobby: LobbyServer) -> None:
    async with connect(lobby.url) as ws:
        token = await token_of(ws, "chunky")
        text = frame("chunky", "DISCOVER_SERVICES", {}, auth_token=token)
        # websockets sends an iterable as one message in several frames.
        await ws.send([text[:10], text[10:25], text[25:]])
        assert (await reply(ws))["message_type"] == "SERVICES_AVAILABLE"


async def test_a_message_in_the_same_packet_as_the_handshake_is_routed(
    lobby: LobbyServer,
) -> None:
    """A client may send its first frame right behind the upgrade request, before the
    handshake response: the lobby routes it once the connection is set up."""
    client = ClientProtocol(parse_uri(lobby.url))
    client.send_request(client.connect())
    register = frame("eager", "REGISTER", {"capabilities": []}, receiver_id="global_lobby")
    masked = Frame(Opcode.TEXT, register.encode()).serialize(mask=True, extensions=[])
    reader, writer = await asyncio.open_connection(lobby.settings.host, lobby.port)
    try:
        writer.write(b"".join(client.data_to_send()) + masked)
        texts: list[Frame] = []
        while not texts:
            client.receive_data(await asyncio.wait_for(reader.read(65536), 5))
            events = client.events_received()
            texts = [e for e in events if isinstance(e, Frame) and e.opcode is Opcode.TEXT]
        assert client.state is State.OPEN
        ack = orjson.loads(texts[0].data)
        assert ack["message_type"] == "REGISTER_ACK"
        assert ack["payload"]["status"] == "success_registered_finalized"
    finally:
        writer.close()


async def test_a_message_is_confirmed_once_its_group_commit_is_done(tmp_path: Path) -> None:
    """ACCEPTED comes after the commit that holds the message, which starts at most
    `commit_interval` after it was accepted."""
    async with (
        running(tmp_path, commit_interval=0.3) as lobby,
        connect(lobby.url) as sender,
        connect(lobby.url) as receiver,
    ):
        assert lobby.committer.stats()["commit_interval_ms"] == 300
        token = await token_of(sender, "sender", acks=True)
        await token_of(receiver, "receiver", capabilities=[CAP])
        started = asyncio.get_running_loop().time()
        await sender.send(
            frame(
                "sender",
                "REQUEST",
                {"capability_name": "price"},
                receiver_id="receiver",
                conversation_id="c1",
                message_id="m1",
                auth_token=token,
            )
        )
        assert (await reply(receiver))["message_type"] == "REQUEST"  # delivered at once
        accepted = await reply(sender)
        assert accepted["message_type"] == "ACCEPTED"
        assert accepted["payload"] == {"message_id": "m1"}
        assert asyncio.get_running_loop().time() - started >= 0.25


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_stop_closes_every_connection_with_1001(tmp_path: Path, transport: str) -> None:
    server = make_lobby(tmp_path, transport=transport)
    await server.start()
    try:
        async with connect(server.url) as ws:
            await token_of(ws, "leaving")
            await server.stop()
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
            assert ws.close_code == 1001
    finally:
        await server.stop()


async def test_a_close_without_a_code_is_answered_with_a_valid_close(lobby: LobbyServer) -> None:
    """Echoing "no code" must not put an invalid code (0) on the wire."""
    client = ClientProtocol(parse_uri(lobby.url))
    client.send_request(client.connect())
    reader, writer = await asyncio.open_connection(lobby.settings.host, lobby.port)
    try:
        writer.write(b"".join(client.data_to_send()))
        while client.state is not State.OPEN:
            client.receive_data(await asyncio.wait_for(reader.read(65536), 5))
        client.events_received()
        client.send_close()  # no code: an empty close frame
        writer.write(b"".join(client.data_to_send()))
        closes: list[Frame] = []
        while not closes:
            data = await asyncio.wait_for(reader.read(65536), 5)
            assert data, "the lobby dropped the connection without a close frame"
            client.receive_data(data)
            closes = [e for e in client.events_received() if isinstance(e, Frame)]
        assert closes[0].opcode is Opcode.CLOSE
        # Close.parse refuses invalid codes; an empty frame reads as 1005.
        assert Close.parse(bytes(closes[0].data)).code in (1000, 1005)
    finally:
        writer.close()
