"""An agent goes offline the moment its connection stops being open, whatever closed it.

Each close the lobby sends (1008, 1009, 1002, 4001, 4002, 4003), and a close the agent sends
itself, is tried with a client that answers the close frame but leaves closing TCP to the
server, as RFC 6455 allows (websocket-client does this): the agent must be offline at once, a
message sent to it meanwhile must reach it when it resumes, and the lobby must drop the TCP
connection within its close bound instead of waiting for keepalive.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from lobby.server import LobbyServer
from tests.conftest import TRANSPORTS
from tests.wsclient import frame, register, reply, running

BOUND = 5.0
"""Seconds a test waits for what must happen (the lobby's close bound is 1 s here)."""
FLOOD = "z" * 8000


class Stubborn:
    """A sans-I/O websockets client over a raw stream that never closes its TCP side: it
    answers the lobby's close frame (websockets' protocol does so by itself) and then waits."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.protocol: ClientProtocol | None = None
        self.close_code: int | None = None
        self._texts: list[dict[str, Any]] = []

    @classmethod
    @asynccontextmanager
    async def connect(cls, lobby: LobbyServer) -> AsyncIterator[Stubborn]:
        reader, writer = await asyncio.open_connection(lobby.settings.host, lobby.port)
        client = cls(reader, writer)
        client.protocol = ClientProtocol(parse_uri(lobby.url))
        client.protocol.send_request(client.protocol.connect())
        client._write()
        try:
            while client.protocol.state is not State.OPEN:
                await client._read()
            yield client
        finally:
            writer.close()

    def _write(self) -> None:
        assert self.protocol is not None
        # An empty chunk asks to half-close TCP: a stubborn client never does.
        self.writer.write(b"".join(self.protocol.data_to_send()))

    async def _read(self) -> bool:
        """Read once; False at the end of the stream."""
        assert self.protocol is not None
        data = await asyncio.wait_for(self.reader.read(65536), BOUND)
        if not data:
            return False
        self.protocol.receive_data(data)
        for event in self.protocol.events_received():
            if isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                self._texts.append(orjson.loads(event.data))
            elif isinstance(event, Frame) and event.opcode is Opcode.CLOSE:
                self.close_code = Close.parse(bytes(event.data)).code
        self._write()
        return True

    def send(self, text: str) -> None:
        assert self.protocol is not None
        self.protocol.send_text(text.encode())
        self._write()

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def recv(self) -> dict[str, Any]:
        while not self._texts:
            assert await self._read(), "the lobby closed the stream"
        return self._texts.pop(0)

    async def closed_by_lobby(self) -> int:
        """Read until the lobby's close frame has come (and been answered); its code."""
        while self.close_code is None:
            assert await self._read(), "the stream ended before a close frame"
        return self.close_code

    def close(self, code: int) -> None:
        """Send a close frame, and nothing more: TCP stays up."""
        assert self.protocol is not None
        self.protocol.send_close(code)
        self._write()


async def until(condition: Any, what: str) -> None:
    """Wait for `condition()` to hold, at most `BOUND` seconds."""
    async with asyncio.timeout(BOUND):
        while not condition():
            await asyncio.sleep(0.01)
    assert condition(), what


def online(lobby: LobbyServer, agent_id: str) -> bool:
    agent = lobby.router.registry.agents.get(agent_id)
    return agent is not None and agent.session is not None


async def held_text_reaches(lobby: LobbyServer, agent_id: str, token: str) -> None:
    """While `agent_id` is offline another agent sends it a TEXT: no ERROR comes back, and the
    agent gets it when it resumes."""
    async with connect(lobby.url) as sender:
        sender_token = (await register(sender, f"to-{agent_id}"))["payload"]["auth_token"]
        await sender.send(
            frame(
                f"to-{agent_id}",
                "TEXT",
                {"content": "sent while you were away"},
                receiver_id=agent_id,
                auth_token=sender_token,
            )
        )
        # A DISCOVER behind it proves the TEXT was routed without an ERROR.
        await sender.send(frame(f"to-{agent_id}", "DISCOVER_SERVICES", {}, auth_token=sender_token))
        answer = await reply(sender)
        assert answer["message_type"] == "SERVICES_AVAILABLE", answer
    async with connect(lobby.url) as again:
        await again.send(frame(agent_id, "REGISTER", {}, auth_token=token))
        assert (await reply(again))["payload"]["status"] == "success_resumed"
        held = await reply(again)
        while (
            held["payload"]["content"] == "z" * 8000
        ):  # a flood sent after the close decision comes first
            held = await reply(again)
    assert held["message_type"] == "TEXT"
    assert held["payload"] == {"content": "sent while you were away"}


def oversized(_: str, __: str) -> bytes:
    text = frame("x", "TEXT", {"blob": "y" * 2000}, receiver_id="x")
    return Frame(Opcode.TEXT, text.encode()).serialize(mask=True, extensions=[])


def reserved_bit(_: str, __: str) -> bytes:
    data = bytearray(Frame(Opcode.TEXT, b"{}").serialize(mask=True, extensions=[]))
    data[0] |= 0x40  # RSV1, with no extension negotiated: a protocol error
    return bytes(data)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("bad_frame", "code"), [(oversized, 1009), (reserved_bit, 1002)], ids=["1009", "1002"]
)
async def test_a_connection_the_lobby_fails_takes_its_agent_offline_at_once(
    tmp_path: Path, transport: str, bad_frame: Any, code: int
) -> None:
    async with (
        running(tmp_path, max_message_bytes=1000, transport=transport) as lobby,
        Stubborn.connect(lobby) as b,
    ):
        b.send(frame("b", "REGISTER", {}))
        token = (await b.recv())["payload"]["auth_token"]
        b.send_raw(bad_frame(token, "b"))
        assert await b.closed_by_lobby() == code
        await until(lambda: not online(lobby, "b"), "b stayed online after its close")
        assert lobby.health()["agents_online"] == 0
        await held_text_reaches(lobby, "b", token)
        await until(lambda: lobby.connections == 0, "the stubborn connection was never dropped")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_agent_that_sends_a_close_is_offline_before_its_tcp_closes(
    tmp_path: Path, transport: str
) -> None:
    async with running(tmp_path, transport=transport) as lobby, Stubborn.connect(lobby) as b:
        b.send(frame("b", "REGISTER", {}))
        token = (await b.recv())["payload"]["auth_token"]
        b.close(1000)
        assert await b.closed_by_lobby() == 1000
        assert not online(lobby, "b")
        await held_text_reaches(lobby, "b", token)
        await until(lambda: lobby.connections == 0, "the stubborn connection was never dropped")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_no_register_in_time_closes_1008_and_drops_the_connection(
    tmp_path: Path, transport: str
) -> None:
    async with (
        running(tmp_path, handshake_timeout=0.2, transport=transport) as lobby,
        Stubborn.connect(lobby) as idle,
    ):
        assert await idle.closed_by_lobby() == 1008
        await until(lambda: lobby.connections == 0, "the stubborn connection was never dropped")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_replaced_connection_closes_4001_and_messages_go_to_the_new_one(
    tmp_path: Path, transport: str
) -> None:
    async with (
        running(tmp_path, transport=transport) as lobby,
        Stubborn.connect(lobby) as old,
        connect(lobby.url) as new,
        connect(lobby.url) as sender,
    ):
        old.send(frame("b", "REGISTER", {}))
        token = (await old.recv())["payload"]["auth_token"]
        await new.send(frame("b", "REGISTER", {}, auth_token=token))
        assert (await reply(new))["payload"]["status"] == "success_resumed"
        assert await old.closed_by_lobby() == 4001
        sender_token = (await register(sender, "s"))["payload"]["auth_token"]
        text = {"content": "to the new connection"}
        await sender.send(frame("s", "TEXT", text, receiver_id="b", auth_token=sender_token))
        assert (await reply(new))["payload"] == text
        assert online(lobby, "b")
        await until(lambda: lobby.connections == 2, "the stubborn connection was never dropped")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_unregister_closes_4003_and_drops_the_connection(
    tmp_path: Path, transport: str
) -> None:
    async with running(tmp_path, transport=transport) as lobby, Stubborn.connect(lobby) as b:
        b.send(frame("b", "REGISTER", {}))
        token = (await b.recv())["payload"]["auth_token"]
        b.send(frame("b", "UNREGISTER", {}, auth_token=token))
        assert await b.closed_by_lobby() == 4003
        assert "b" not in lobby.router.registry.agents
        await until(lambda: lobby.connections == 0, "the stubborn connection was never dropped")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_stalled_agent_without_acks_is_closed_4002_and_gets_later_messages_on_resume(
    tmp_path: Path, transport: str
) -> None:
    """A receiver that stops reading is closed with 4002; what is sent after that decision is
    held for it (it never acknowledges, so only what was written before counts as
    delivered)."""
    async with (
        running(tmp_path, max_outbound_bytes=64 * 1024, transport=transport) as lobby,
        Stubborn.connect(lobby) as b,
        connect(lobby.url) as flooder,
    ):
        b.send(frame("b", "REGISTER", {}))
        token = (await b.recv())["payload"]["auth_token"]
        flooder_token = (await register(flooder, "flooder"))["payload"]["auth_token"]
        sent = 0
        while online(lobby, "b") and sent < 5000:
            await flooder.send(
                frame(
                    "flooder", "TEXT", {"content": FLOOD}, receiver_id="b", auth_token=flooder_token
                )
            )
            sent += 1
            if sent % 20 == 0:
                await asyncio.sleep(0.01)
        assert not online(lobby, "b"), "never dropped"
        await held_text_reaches(lobby, "b", token)
        await until(lambda: lobby.connections == 1, "the stalled connection was never dropped")
