"""A raw JSON WebSocket client for tests, a lobby with changed settings, and a lobby on any
transport (the memory one too) with a way to open clients to it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import orjson
import websockets.asyncio.client
import websockets.exceptions

from lobby.server import LobbyServer
from lobby.transport import memory
from tests.conftest import SETTINGS, make_lobby

CLOSED = (websockets.exceptions.ConnectionClosed, memory.ConnectionClosed)
"""What `recv` raises on a closed connection, over a socket or in memory."""


class Client(Protocol):
    """A client connection as the tests use it: websockets' or the memory transport's."""

    @property
    def close_code(self) -> int | None: ...

    async def send(self, message: str | bytes) -> None: ...

    async def recv(self) -> str | bytes: ...


@dataclass
class Served:
    """A running lobby and how to open a client connection to it."""

    lobby: LobbyServer
    connect: Callable[[], AbstractAsyncContextManager[Client]]


@asynccontextmanager
async def running(data_dir: Path, **overrides: Any) -> AsyncIterator[LobbyServer]:
    server = make_lobby(data_dir, **overrides)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@asynccontextmanager
async def serving(data_dir: Path, transport: str, **overrides: Any) -> AsyncIterator[Served]:
    """A lobby on `transport`: "memory" (no sockets) or a socket one (`TRANSPORTS`)."""
    connect: Callable[[], AbstractAsyncContextManager[Client]]
    if transport == "memory":
        in_memory = memory.MemoryTransport()
        settings = replace(SETTINGS, data_dir=data_dir, **overrides)
        server = LobbyServer(settings, transport=in_memory)
        connect = in_memory.connect
    else:
        server = make_lobby(data_dir, transport=transport, **overrides)

        def connect() -> AbstractAsyncContextManager[Client]:
            return websockets.asyncio.client.connect(server.url)

    await server.start()
    try:
        yield Served(server, connect)
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


async def reply(ws: Client) -> dict[str, Any]:
    message: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), 5))
    return message


async def register(ws: Client, agent_id: str, **payload: Any) -> dict[str, Any]:
    await ws.send(frame(agent_id, "REGISTER", payload))
    return await reply(ws)


async def token_of(ws: Client, agent_id: str, **payload: Any) -> str:
    """REGISTER `agent_id` as a new agent; its token."""
    ack = await register(ws, agent_id, **payload)
    assert ack["payload"]["status"] == "success_registered_finalized"
    return str(ack["payload"]["auth_token"])
