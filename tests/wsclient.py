"""A raw JSON WebSocket client for tests, and a lobby with changed settings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection

from lobby.server import LobbyServer
from tests.conftest import make_lobby


@asynccontextmanager
async def running(data_dir: Path, **overrides: Any) -> AsyncIterator[LobbyServer]:
    server = make_lobby(data_dir, **overrides)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def frame(sender: str, message_type: str, payload: dict[str, Any], **extra: Any) -> str:
    body = {
        "sender_id": sender,
        "receiver_id": extra.pop("receiver_id", "global_lobby"),
        "message_type": message_type,
        "payload": payload,
        **extra,
    }
    return orjson.dumps(body).decode()


async def reply(ws: ClientConnection) -> dict[str, Any]:
    message: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), 5))
    return message


async def register(ws: ClientConnection, agent_id: str, **payload: Any) -> dict[str, Any]:
    await ws.send(frame(agent_id, "REGISTER", payload))
    return await reply(ws)
