"""A lobby stopped by SIGTERM under hundreds of connections (`LobbyServer.stop`, the transports'
`stop`): every agent is told 1001, a peer that answers and one that reads nothing until the
lobby is gone alike; the lobby logs one line for them all and exits; what it ACCEPTED is kept.
In process, on the websockets transport: an answer to the 1001 cut into small reads, and a
message that comes with it (still handled)."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

import orjson
import pytest
import websocket
import websockets.asyncio.client
from websockets.asyncio.client import ClientConnection
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.uri import parse_uri

from tests.conftest import TRANSPORTS, LobbyProcess, start_lobby_process
from tests.waiting import BOUND
from tests.wsclient import running

AGENTS = 300


def register_frame(agent_id: str, token: str | None = None) -> str:
    body: dict[str, Any] = {
        "sender_id": agent_id,
        "receiver_id": "global_lobby",
        "message_type": "REGISTER",
        "payload": {"acks": True},
    }
    if token is not None:
        body["auth_token"] = token
    return orjson.dumps(body).decode()


async def registered(
    url: str, agent_id: str, token: str | None = None
) -> tuple[ClientConnection, dict[str, Any]]:
    """A connection whose agent has its REGISTER_ACK; the ACK's payload and the token."""
    ws = await websockets.asyncio.client.connect(url, max_queue=None)
    await ws.send(register_frame(agent_id, token))
    ack = orjson.loads(await ws.recv())
    assert ack["message_type"] == "REGISTER_ACK", ack
    return ws, ack["payload"]


async def told(ws: ClientConnection) -> int | None:
    """Read until the lobby closes the connection (1000 and 1001 end the iteration, another
    code raises); the close code it sent."""
    async for _ in ws:
        pass
    return ws.close_code


async def hold_one_for(url: str, receiver_id: str) -> None:
    """Send `receiver_id` (offline) a TEXT, as an acknowledging sender; return once ACCEPTED."""
    ws, payload = await registered(url, "sender")
    text = {
        "sender_id": "sender",
        "receiver_id": receiver_id,
        "message_type": "TEXT",
        "payload": {"content": "kept across the stop"},
        "message_id": "held-1",
        "auth_token": payload["auth_token"],
    }
    await ws.send(orjson.dumps(text).decode())
    answer = orjson.loads(await ws.recv())
    assert answer["message_type"] == "ACCEPTED", answer
    await ws.close()


def silent_agent(url: str) -> websocket.WebSocket:
    """A registered agent that then reads nothing (until the test says)."""
    ws = websocket.create_connection(url, timeout=BOUND)
    ws.send(register_frame("silent"))
    assert orjson.loads(ws.recv())["message_type"] == "REGISTER_ACK"
    return ws


def close_code_read_late(ws: websocket.WebSocket) -> int:
    """The close frame waiting in the socket, read now."""
    opcode, frame = ws.recv_data_frame(True)
    assert opcode == websocket.ABNF.OPCODE_CLOSE
    return int.from_bytes(frame.data[:2], "big")


def start(data: Path, transport: str, port: int = 0) -> LobbyProcess:
    return start_lobby_process(
        data, "--transport", transport, "--registration-rate", "0", port=port
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_sigterm_tells_every_connection_1001_and_keeps_what_was_accepted(
    tmp_path: Path, transport: str
) -> None:
    data = tmp_path / "data"
    lobby = start(data, transport)
    silent: websocket.WebSocket | None = None
    try:
        later, payload = await registered(lobby.url, "later")
        later_token = payload["auth_token"]
        await later.close()
        await hold_one_for(lobby.url, "later")
        opened = await asyncio.gather(*(registered(lobby.url, f"a{n}") for n in range(AGENTS)))
        agents = [ws for ws, _ in opened]
        silent = await asyncio.to_thread(silent_agent, lobby.url)

        lobby.signal(signal.SIGTERM)
        codes = await asyncio.gather(*(told(ws) for ws in agents))
        assert await asyncio.to_thread(lobby.wait, BOUND) == 0
        assert codes == [1001] * AGENTS
        # Read only now: the close frame was delivered though this peer never answered it.
        assert close_code_read_late(silent) == 1001
        events = lobby.events()
        names = [e["event"] for e in events]
        closing = names.index("LOBBY_CLOSING")
        assert events[closing]["connections"] == AGENTS + 1
        assert "AGENT_DISCONNECTED" not in names[closing:]  # one line for them all
        assert names[-1] == "LOBBY_STOPPED"

        lobby = start(data, transport, port=lobby.port)
        ws, payload = await registered(lobby.url, "later", later_token)
        assert payload["status"] == "success_resumed"
        held = orjson.loads(await ws.recv())
        assert held["message_type"] == "TEXT"
        assert held["payload"] == {"content": "kept across the stop"}
        await ws.close()
    finally:
        if silent is not None:
            silent.shutdown()  # type: ignore[no-untyped-call]
        if lobby.process.poll() is None:
            lobby.signal(signal.SIGKILL)
        lobby.process.wait(BOUND)


class RawClient:
    """An agent on websockets' sans-I/O client protocol over a plain socket, so a test decides
    how its bytes reach the lobby (how the answer to the 1001 is cut into writes)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, url: str
    ) -> None:
        self.reader, self.writer = reader, writer
        self.protocol = ClientProtocol(parse_uri(url))
        self.token = ""

    @classmethod
    async def registered(cls, url: str, agent_id: str) -> RawClient:
        uri = parse_uri(url)
        reader, writer = await asyncio.open_connection(uri.host, uri.port)
        client = cls(reader, writer, url)
        client.protocol.send_request(client.protocol.connect())
        register = Frame(Opcode.TEXT, register_frame(agent_id).encode())
        handshake = b"".join(client.protocol.data_to_send())
        writer.write(handshake + register.serialize(mask=True, extensions=[]))
        ack = await client.next_frame()
        assert ack is not None
        answer = orjson.loads(ack.data)
        assert answer["message_type"] == "REGISTER_ACK"
        client.token = answer["payload"]["auth_token"]
        return client

    async def next_frame(self) -> Frame | None:
        """The next frame from the lobby; None once the lobby closed the connection."""
        while True:
            for event in self.protocol.events_received():
                if isinstance(event, Frame):
                    return event
            data = await asyncio.wait_for(self.reader.read(65536), BOUND)
            if not data:
                return None
            self.protocol.receive_data(data)

    async def answer_close(self, before: bytes, split: bool) -> None:
        """Answer the lobby's close frame: `before` (frames to send first) and the close frame,
        in one write, or a byte a write."""
        answer = before + b"".join(self.protocol.data_to_send())
        if not split:
            self.writer.write(answer)
            return
        for i in range(len(answer)):
            self.writer.write(answer[i : i + 1])
            # The lobby runs on this loop: one pass of it reads this byte alone.
            await asyncio.sleep(0)

    async def closed_by_lobby(self) -> bool:
        """Read to the end of the stream: the lobby closed TCP (then close this side too)."""
        rest = await asyncio.wait_for(self.reader.read(), BOUND)
        self.writer.close()
        await self.writer.wait_closed()
        return rest == b""


async def test_an_answer_to_the_1001_cut_into_one_byte_writes_closes_cleanly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """websockets transport (picows closes TCP behind its close frame and reads no answer): an
    answer that does not come whole in one read is read as any other frame."""
    async with running(tmp_path) as lobby:
        client = await RawClient.registered(lobby.url, "cutter")
        stopping = asyncio.create_task(lobby.stop())
        close = await client.next_frame()
        assert close is not None
        assert close.opcode is Opcode.CLOSE
        assert Close.parse(close.data).code == 1001
        await client.answer_close(b"", split=True)
        assert await client.closed_by_lobby()
        await stopping
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_message_sent_with_the_answer_to_the_1001_is_still_handled(
    tmp_path: Path,
) -> None:
    """websockets transport: a TEXT that reaches the lobby with the agent's close frame (sent
    before it read the 1001) is ACCEPTED, so it is kept for its receiver."""
    async with running(tmp_path) as lobby:
        later, payload = await registered(lobby.url, "later")
        token = payload["auth_token"]
        await later.close()
        client = await RawClient.registered(lobby.url, "sender")
        stopping = asyncio.create_task(lobby.stop())
        close = await client.next_frame()
        assert close is not None
        assert Close.parse(close.data).code == 1001
        text = orjson.dumps(
            {
                "sender_id": "sender",
                "receiver_id": "later",
                "message_type": "TEXT",
                "payload": {"content": "sent as the lobby stopped"},
                "message_id": "last-1",
                "auth_token": client.token,
            }
        )
        # Frames the client may still send while closing (websockets queues them first).
        masked = Frame(Opcode.TEXT, text).serialize(mask=True, extensions=[])
        await client.answer_close(masked, split=False)
        assert await client.closed_by_lobby()
        await stopping
    async with running(tmp_path) as lobby:
        ws, payload = await registered(lobby.url, "later", token)
        assert payload["status"] == "success_resumed"
        held = orjson.loads(await ws.recv())
        assert held["payload"] == {"content": "sent as the lobby stopped"}
        await ws.close()
