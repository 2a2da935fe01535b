"""A lobby stopped by SIGTERM under hundreds of connections (`LobbyServer.stop`, the transports'
`stop`): every agent is told 1001, a peer that answers and one that reads nothing until the
lobby is gone alike; the lobby logs one line for them all and exits; what it ACCEPTED is kept."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import orjson
import pytest
import websocket
import websockets.asyncio.client
from websockets.asyncio.client import ClientConnection

from tests.conftest import TRANSPORTS, LobbyProcess, start_lobby_process
from tests.waiting import BOUND

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
