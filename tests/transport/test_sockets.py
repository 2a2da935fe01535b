"""What only a socket shows, on each socket transport (websockets, picows): messages over the
size limit whole or in fragments, fragments joined, a frame that comes with the handshake,
HTTP on the same port, and a close frame without a code."""

from __future__ import annotations

import asyncio
import selectors
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close, Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from lobby.server import LobbyServer
from tests.conftest import TRANSPORTS
from tests.wsclient import frame, register, reply, running, token_of


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


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 300_000])
def test_picows_text_frame_headers_are_the_minimal_rfc_6455_ones(size: int) -> None:
    """The picows transport frames its own text frames (to write a batch at once): header
    and payload must be byte for byte what websockets frames for an unmasked server frame."""
    from lobby.transport.picows import text_frame_header

    payload = b"x" * size
    expected = Frame(Opcode.TEXT, payload).serialize(mask=False)
    assert text_frame_header(size) + payload == expected


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_burst_of_messages_of_every_size_arrives_whole_and_in_order(
    tmp_path: Path, transport: str
) -> None:
    """Frames written together (one write per connection and batch) stay whole and in order,
    whatever their length field's size: under 126 bytes, up to 65,535, and beyond."""
    sizes = [1, 60, 200, 65_000, 66_000, 150_000, 5, 1_000]
    async with (
        running(tmp_path, max_message_bytes=1_000_000, transport=transport) as lobby,
        connect(lobby.url, max_size=None) as a,
        connect(lobby.url, max_size=None) as b,
    ):
        token = await token_of(a, "a")
        await token_of(b, "b")
        for n in sizes:
            text = {"content": str(n) * n}
            await a.send(frame("a", "TEXT", text, auth_token=token, receiver_id="b"))
        received = [await reply(b) for _ in sizes]
        assert [m["payload"]["content"] for m in received] == [str(n) * n for n in sizes]


def somaxconn() -> int:
    """net.core.somaxconn: the kernel holds any listen backlog to it (4096 since Linux 5.4,
    128 before)."""
    return int(Path("/proc/sys/net/core/somaxconn").read_text())


async def test_agents_connecting_at_once_while_the_lobby_is_busy_all_get_in(
    lobby: LobbyServer,
) -> None:
    """While the lobby's loop is busy (this test holds it: no await), the kernel completes the
    TCP handshakes of connecting agents and queues them for the lobby, up to the listen backlog:
    300 agents connecting at once all get in and register, none waiting for a SYN retried a
    second later (asyncio's default backlog of 100 dropped the rest)."""
    agents = min(300, somaxconn())
    sockets: list[socket.socket] = []
    try:
        with selectors.DefaultSelector() as selector:
            for _ in range(agents):
                sock = socket.socket()
                sockets.append(sock)
                sock.setblocking(False)
                sock.connect_ex((lobby.settings.host, lobby.port))
                selector.register(sock, selectors.EVENT_WRITE)
            connected = 0
            deadline = time.monotonic() + 0.9  # a dropped SYN is retried after 1 s
            while connected < agents and time.monotonic() < deadline:
                for key, _ in selector.select(0.05):
                    selector.unregister(key.fileobj)
                    connected += 1
        assert connected == agents
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 for s in sockets)
        links = [
            await connect(lobby.url, sock=sock, open_timeout=10) for sock in sockets
        ]  # fmt: skip
        acks = await asyncio.gather(
            *(register(ws, f"crowd{n}", capabilities=[]) for n, ws in enumerate(links))
        )
        assert {a["payload"]["status"] for a in acks} == {"success_registered_finalized"}
        for ws in links:
            await ws.close()
    finally:
        for sock in sockets:
            sock.close()
