"""Frames the lobby writes reach a plain websockets client intact, at each length where the
RFC 6455 header changes form (7-bit, 16-bit, 64-bit), and in order with the frames websockets
itself writes (pong, close)."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from lobby.server import LobbyServer
from lobby.transport.base import Link
from lobby.transport.websockets import LobbyConnection
from tests.conftest import TRANSPORTS
from tests.waiting import until
from tests.wsclient import frame, reply, running, token_of

LENGTHS = [0, 1, 125, 126, 127, 65535, 65536, 70000]


def text_of(length: int, seed: int) -> bytes:
    """`length` bytes of ASCII text, different for each seed."""
    pattern = bytes(range(ord("a") + seed % 20, ord("z") + 1)) + b"0123456789"
    return (pattern * (length // len(pattern) + 1))[:length]


def link_of(lobby: LobbyServer, agent_id: str) -> Link:
    record = lobby.router.registry.get(agent_id)
    assert record is not None
    assert record.session is not None
    link: Link = record.session.link  # type: ignore[assignment]
    return link


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_frames_of_every_header_length_arrive_intact(tmp_path: Path, transport: str) -> None:
    async with (
        running(tmp_path, transport=transport) as lobby,
        connect(lobby.url, max_size=None) as ws,
    ):
        token = await token_of(ws, "reader")
        record = lobby.router.registry.get("reader")
        assert record is not None
        session = record.session
        assert session is not None
        texts = [text_of(n, i) for i, n in enumerate(LENGTHS)]
        for text in texts:  # one batch: one write
            lobby.send(session, text)
        for text in texts:
            assert await asyncio.wait_for(ws.recv(decode=False), 5) == text
        # One at a time, each in its own write.
        for text in texts:
            lobby.send(session, text)
            assert await asyncio.wait_for(ws.recv(decode=False), 5) == text
        # The stream is still in step: the lobby's own answers come through.
        await ws.send(frame("reader", "DISCOVER_SERVICES", {}, auth_token=token))
        assert (await reply(ws))["message_type"] == "SERVICES_AVAILABLE"


class RawClient:
    """A sans-I/O websockets client that records every frame it gets, control frames too, in
    the order they came."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.protocol: ClientProtocol | None = None
        self.frames: list[Frame] = []

    @classmethod
    @asynccontextmanager
    async def connect(cls, lobby: LobbyServer) -> AsyncIterator[RawClient]:
        reader, writer = await asyncio.open_connection(lobby.settings.host, lobby.port)
        client = cls(reader, writer)
        client.protocol = ClientProtocol(parse_uri(lobby.url), max_size=None)
        client.protocol.send_request(client.protocol.connect())
        client.write()
        try:
            while client.protocol.state is not State.OPEN:
                await client.read()
            yield client
        finally:
            writer.close()

    def write(self) -> None:
        assert self.protocol is not None
        self.writer.write(b"".join(self.protocol.data_to_send()))

    async def read(self) -> bool:
        assert self.protocol is not None
        data = await asyncio.wait_for(self.reader.read(1 << 20), 5)
        if not data:
            return False
        self.protocol.receive_data(data)
        self.frames += [e for e in self.protocol.events_received() if isinstance(e, Frame)]
        self.write()
        return True

    async def until(self, opcode: Opcode) -> list[Frame]:
        """Read until a frame with `opcode` came; every frame so far."""
        while not any(f.opcode is opcode for f in self.frames):
            assert await self.read(), "the stream ended first"
        return self.frames

    async def register(self, agent_id: str) -> str:
        """REGISTER `agent_id`; its token."""
        assert self.protocol is not None
        self.protocol.send_text(frame(agent_id, "REGISTER", {}).encode())
        self.write()
        (ack,) = texts(await self.until(Opcode.TEXT))
        self.frames.clear()
        return str(orjson.loads(ack)["payload"]["auth_token"])


def texts(frames: list[Frame]) -> list[bytes]:
    return [bytes(f.data) for f in frames if f.opcode is Opcode.TEXT]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_close_goes_out_after_the_frames_put_before_it(
    tmp_path: Path, transport: str
) -> None:
    async with running(tmp_path, transport=transport) as lobby, RawClient.connect(lobby) as client:
        await client.register("closed")
        link = link_of(lobby, "closed")
        queued = [text_of(n, i) for i, n in enumerate([10, 200, 70000])]
        for text in queued:
            assert link.put(text)  # not flushed: the close must still come after them
        closing = link.shut(4000, "bye")
        if closing is not None:
            await closing
        frames = await client.until(Opcode.CLOSE)
        assert texts(frames) == queued
        assert frames[-1].opcode is Opcode.CLOSE
        assert Close.parse(bytes(frames[-1].data)).code == 4000


async def test_a_pong_goes_out_after_the_frames_put_before_it(tmp_path: Path) -> None:
    # websockets only: picows answers a ping on its own, ahead of what waits for a flush
    # (RFC 6455 lets a control frame come between messages, so it is no error there).
    async with (
        running(tmp_path, transport="websockets") as lobby,
        RawClient.connect(lobby) as client,
    ):
        await client.register("pinger")
        queued = [text_of(n, i) for i, n in enumerate([5, 300])]
        for text in queued:
            assert link_of(lobby, "pinger").put(text)  # not flushed
        assert client.protocol is not None
        client.protocol.send_ping(b"p")
        client.write()
        frames = await client.until(Opcode.PONG)
        assert texts(frames) == queued
        assert frames[-1].opcode is Opcode.PONG


def masked(opcode: Opcode, data: bytes, fin: bool = True) -> bytes:
    return Frame(opcode, data, fin).serialize(mask=True, extensions=[])


def text_to(receiver: str, token: str, size: int) -> str:
    """A TEXT from "raw" to `receiver` whose frame payload is exactly `size` bytes."""
    bare = frame("raw", "TEXT", {"content": ""}, auth_token=token, receiver_id=receiver)
    padding = size - len(bare.encode())
    assert padding >= 0
    return frame("raw", "TEXT", {"content": "p" * padding}, auth_token=token, receiver_id=receiver)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_frames_split_anywhere_or_packed_together_are_routed_whole(
    tmp_path: Path, transport: str
) -> None:
    """Frames of each header length (REGISTER is under 126 bytes; a TEXT is longer), a ping
    and a fragmented message among them, written in pieces that end anywhere in a header or a
    payload: each message arrives whole, in order."""
    async with (
        running(tmp_path, transport=transport) as lobby,
        RawClient.connect(lobby) as raw,
        connect(lobby.url, max_size=None) as reader,
    ):
        token = await raw.register("raw")
        await token_of(reader, "reader")
        texts = [text_to("reader", token, n) for n in [160, 65535, 65536, 65537, 200, 300]]
        split = texts[5].encode()
        wire = b"".join(
            [
                masked(Opcode.TEXT, texts[0].encode()),
                masked(Opcode.PING, b"between"),
                *(masked(Opcode.TEXT, t.encode()) for t in texts[1:5]),
                masked(Opcode.TEXT, split[:100], fin=False),
                masked(Opcode.CONT, split[100:]),
            ]
        )
        sizes = [1, 2, 3, 5, 7, 11, 4000, 1, 70000]
        at = 0
        for size in sizes * (len(wire) // sum(sizes) + 1):
            raw.writer.write(wire[at : at + size])
            await raw.writer.drain()
            await asyncio.sleep(0)
            at += size
            if at >= len(wire):
                break
        for text in texts:
            got = orjson.loads(await asyncio.wait_for(reader.recv(), 5))
            assert got["payload"] == orjson.loads(text)["payload"]
        pongs = [f for f in await raw.until(Opcode.PONG) if f.opcode is Opcode.PONG]
        assert [bytes(p.data) for p in pongs] == [b"between"]


async def test_a_frame_begun_with_the_handshake_is_routed(tmp_path: Path) -> None:
    """The handshake may come with the start of a frame, which websockets' parser then holds:
    the rest of it, and what follows, are routed all the same."""
    async with running(tmp_path) as lobby:
        client = ClientProtocol(parse_uri(lobby.url))
        client.send_request(client.connect())
        register = masked(Opcode.TEXT, frame("begun", "REGISTER", {}).encode())
        reader, writer = await asyncio.open_connection(lobby.settings.host, lobby.port)
        try:
            # Two bytes: websockets takes the header and waits for the rest, buffering nothing.
            writer.write(b"".join(client.data_to_send()) + register[:2])
            await writer.drain()
            while client.state is not State.OPEN:
                client.receive_data(await asyncio.wait_for(reader.read(65536), 5))
            writer.write(register[2:])
            got: list[Frame] = []
            while not got:
                client.receive_data(await asyncio.wait_for(reader.read(65536), 5))
                got = [e for e in client.events_received() if isinstance(e, Frame)]
            ack = orjson.loads(got[0].data)
            assert ack["payload"]["status"] == "success_registered_finalized"
            token = ack["payload"]["auth_token"]
            discover = frame("begun", "DISCOVER_SERVICES", {}, auth_token=token)
            writer.write(masked(Opcode.TEXT, discover.encode()))
            got = []
            while not got:
                client.receive_data(await asyncio.wait_for(reader.read(65536), 5))
                got = [e for e in client.events_received() if isinstance(e, Frame)]
            assert orjson.loads(got[0].data)["message_type"] == "SERVICES_AVAILABLE"
        finally:
            writer.close()


def data_segments_in(sock: socket.socket) -> int:
    """tcp_info's tcpi_data_segs_in (Linux >= 4.6): TCP segments with data the socket got."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    (segments,) = struct.unpack_from("I", info, 152)
    return int(segments)


async def test_a_register_sent_with_the_upgrade_gets_the_101_and_its_ack_in_one_write(
    tmp_path: Path,
) -> None:
    """The 101 waits for what came with the upgrade to be routed: an agent that sends its
    REGISTER right behind the upgrade request gets the 101 and the REGISTER_ACK in one TCP
    segment (a write, and a read, less on each side of every registration)."""
    async with running(tmp_path) as lobby:
        client = ClientProtocol(parse_uri(lobby.url))
        client.send_request(client.connect())
        register = masked(Opcode.TEXT, frame("onewrite", "REGISTER", {}).encode())
        reader, writer = await asyncio.open_connection(lobby.settings.host, lobby.port)
        try:
            writer.write(b"".join(client.data_to_send()) + register)
            texts: list[Frame] = []
            while not texts:
                client.receive_data(await asyncio.wait_for(reader.read(65536), 5))
                texts = [e for e in client.events_received() if isinstance(e, Frame)]
            assert orjson.loads(texts[0].data)["message_type"] == "REGISTER_ACK"
            assert data_segments_in(writer.get_extra_info("socket")) == 1
        finally:
            writer.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_what_follows_a_close_frame_in_the_same_read_is_not_routed(
    tmp_path: Path, transport: str
) -> None:
    async with (
        running(tmp_path, transport=transport) as lobby,
        RawClient.connect(lobby) as raw,
        connect(lobby.url) as reader,
    ):
        token = await raw.register("raw")
        reader_token = await token_of(reader, "reader")
        before, after = text_to("reader", token, 150), text_to("reader", token, 170)
        close = Frame(Opcode.CLOSE, Close(1000, "").serialize())
        raw.writer.write(
            masked(Opcode.TEXT, before.encode())
            + close.serialize(mask=True, extensions=[])
            + masked(Opcode.TEXT, after.encode())
        )
        frames = await raw.until(Opcode.CLOSE)
        assert Close.parse(bytes(frames[-1].data)).code == 1000
        got = orjson.loads(await asyncio.wait_for(reader.recv(), 5))
        assert got["payload"] == orjson.loads(before)["payload"]
        # Had `after` been routed, it would have come before this answer.
        await reader.send(frame("reader", "DISCOVER_SERVICES", {}, auth_token=reader_token))
        assert (await reply(reader))["message_type"] == "SERVICES_AVAILABLE"


async def test_websockets_reads_on_from_where_the_lobby_stopped_once_closing(
    tmp_path: Path,
) -> None:
    """The lobby sends a close while the start of a frame waits here: websockets takes over
    from there, reads that frame and then the client's answering close frame."""
    async with running(tmp_path) as lobby, RawClient.connect(lobby) as raw:
        token = await raw.register("raw")
        connection = link_of(lobby, "raw")
        assert isinstance(connection, LobbyConnection)
        discover = masked(Opcode.TEXT, frame("raw", "PING", {}, auth_token=token).encode())
        raw.writer.write(discover[:5])
        await raw.writer.drain()
        await until(lambda: connection._pending, "the start of the frame held by the lobby")
        assert connection.shut(4000, "bye") is not None
        await until(lambda: connection.protocol.state is not State.OPEN, "the close frame sent")
        raw.writer.write(discover[5:])
        frames = await raw.until(Opcode.CLOSE)  # and answered
        assert Close.parse(bytes(frames[-1].data)).code == 4000
        await asyncio.wait_for(connection.wait_closed(), 5)
        assert connection.protocol.close_rcvd is not None
        assert connection.protocol.close_rcvd.code == 4000


async def test_an_idle_registered_connection_keeps_nothing_of_its_handshake(
    tmp_path: Path,
) -> None:
    """Once registered, the connection holds neither the parsed upgrade request (its headers)
    nor websockets' handshake parser, whose frame would keep it; the frame parser that took its
    place reads on from the same boundary: a ping is answered, a fragmented message routed
    whole, a close answered."""
    async with running(tmp_path) as lobby, RawClient.connect(lobby) as raw:
        token = await raw.register("raw")
        connection = link_of(lobby, "raw")
        assert isinstance(connection, LobbyConnection)
        assert connection.request is not None
        assert list(connection.request.headers.raw_items()) == []
        assert connection.response is None
        parser = connection.protocol.parser
        assert parser.gi_code.co_name == "parse"  # type: ignore[attr-defined]
        assert parser.gi_frame.f_locals.keys() <= {"self"}  # type: ignore[attr-defined]
        raw.writer.write(masked(Opcode.PING, b"still there"))
        pong = [f for f in await raw.until(Opcode.PONG) if f.opcode is Opcode.PONG]
        assert bytes(pong[0].data) == b"still there"
        text = frame("raw", "DISCOVER_SERVICES", {}, auth_token=token).encode()
        raw.writer.write(masked(Opcode.TEXT, text[:7], fin=False) + masked(Opcode.CONT, text[7:]))
        answers = [f for f in await raw.until(Opcode.TEXT) if f.opcode is Opcode.TEXT]
        assert orjson.loads(answers[-1].data)["message_type"] == "SERVICES_AVAILABLE"
        raw.writer.write(masked(Opcode.CLOSE, Close(1000, "bye").serialize()))
        frames = await raw.until(Opcode.CLOSE)
        assert Close.parse(bytes(frames[-1].data)).code == 1000
