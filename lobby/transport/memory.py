"""An in-memory transport: the lobby without sockets, for tests and for a program that runs
the lobby and its clients in one process.

    transport = MemoryTransport()
    lobby = LobbyServer(Settings(store="memory"), transport=transport)
    await lobby.start()
    async with transport.connect() as client:
        await client.send(frame)  # routed before it returns, as if a read had brought it
        answer = await client.recv(timeout=5)

It keeps the contract of the socket transports (`lobby.transport.base`), with memory for the
wire:
- A frame the lobby `put`s reaches the client when the lobby flushes it (at the end of the
  batch). `flush` reports the bytes the client has not read yet, the connection's outbound
  queue: past `outbound_window` the lobby holds what is sent to it, and once `recv` has brought
  the queue down to `outbound_low_water` the lobby is told (`drained`), as a socket's write
  buffer would; a client that stops reading is closed with 4002, as it would be over a socket.
- A message over `max_message_bytes` closes its connection with 1009.
- The lobby's close (`shut`) follows the frames written before it: the client reads those,
  then `recv` raises `ConnectionClosed` with the code. There is no closing handshake to wait
  for: the connection is gone (`disconnected`) on the next pass of the event loop.
- `client.close(code)`: the lobby sees `closing`, then `disconnected`, as for a close frame.
- No port and no HTTP: `connect(path)` is asked of `admit` as an upgrade request would be,
  and an answer instead of a connection (503 when full, 404 for another path, /healthz's 200)
  raises `Refused`. No fragments, pings or TLS; binary messages pass as they would over a
  socket (the lobby refuses them).

The lobby's registration deadline (1008) and every other rule are the lobby's own, the same on
every transport. Not a `--transport` choice: `lobby serve` with no socket would serve nobody.

Exceptions:

    MemoryTransportError
    ├── Refused: connect() was answered with an HTTP status, not a connection
    └── ConnectionClosed: the connection is closed (its close code and reason)

`connect()` to a lobby that is not running raises `ConnectionRefusedError`, as a socket does.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from typing import Any

import orjson

from lobby.transport.base import HttpAnswer, Lobby
from protocol.models import CloseCode


class MemoryTransportError(Exception):
    """The root of this transport's errors."""


class Refused(MemoryTransportError):
    """The lobby answered `connect()` with an HTTP status instead of a connection."""

    def __init__(self, answer: HttpAnswer) -> None:
        json = answer.content_type == "application/json"
        body: Any = orjson.loads(answer.body) if json else answer.body.decode()
        super().__init__(f"{int(answer.status)} {answer.status.phrase}: {body}")
        self.status = answer.status
        self.content_type = answer.content_type
        self.body = body
        """The answer's JSON, decoded; or its text, for another content type (/metrics)."""


class ConnectionClosed(MemoryTransportError):
    """The connection is closed: by the lobby (`code` is its close code) or by the client."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"closed with {code}" + (f" ({reason})" if reason else ""))
        self.code = code
        self.reason = reason


class MemoryTransport:
    """Connections within this process: `connect()` once the lobby has started."""

    name = "memory"

    def __init__(self) -> None:
        self._lobby: Lobby[Any] | None = None
        self._links: set[MemoryLink] = set()
        self._numbers = itertools.count(1)

    async def start(self, lobby: Lobby[Any]) -> None:
        self._lobby = lobby

    async def stop(self) -> None:
        self._lobby = None
        for link in list(self._links):
            link.shut(CloseCode.GOING_AWAY, "the lobby is shutting down")
            link.gone()  # now: the lobby's stop returns with every connection gone

    def connect(self, path: str = "/", authorization: str | None = None) -> MemoryClient:
        """Open a connection to the lobby (call from its event loop); use it with `async with`,
        or `close()` it. `authorization` stands for the Authorization header (/admin wants
        `Bearer TOKEN`). Raises `Refused` if the lobby answers with an HTTP status instead."""
        lobby = self._lobby
        if lobby is None:
            raise ConnectionRefusedError("the lobby is not running")
        answer = lobby.admit(path, authorization)
        if answer is not None:
            raise Refused(answer)
        link = MemoryLink(lobby, f"memory:{next(self._numbers)}", self._links)
        link.handle = lobby.connected(link, "memory", path)
        self._links.add(link)
        return link.client


class MemoryLink:
    """The lobby's side of one connection: its `Link`."""

    def __init__(self, lobby: Lobby[Any], remote: str, links: set[MemoryLink]) -> None:
        self.remote = remote
        self.handle: object | None = None
        self.client = MemoryClient(self)
        self.lobby = lobby
        self.open = True
        """Until either side closes: frames are written and messages read only while open."""
        self._links = links
        self._framed: list[bytes] = []
        self._gone = False
        self.over_window = False
        """The unread bytes passed the window at a flush: the lobby is told when the client
        has read them down to the low-water mark."""
        self.readable = asyncio.Event()
        """Clear while the lobby reads nothing from this connection (`pause`): the client's
        `send` waits, as a socket's writer would once TCP's buffers are full."""
        self.readable.set()

    def put(self, frame: bytes) -> bool:
        if not self.open:
            return False
        self._framed.append(frame)
        return True

    def flush(self) -> int:
        if not self.open:
            return 0
        self._write()
        unread = self.client.unread
        if unread > self.lobby.transport_settings.outbound_window:
            self.over_window = True
        return unread

    def shut(self, code: int, reason: str) -> None:
        """Write what was framed, then the close: the client reads both, and the connection is
        gone on the next pass of the event loop."""
        if not self.open:
            return
        self.open = False
        self._write()
        self.client.closed(code, reason)
        asyncio.get_running_loop().call_soon(self.gone)

    def pause(self, seconds: float) -> None:
        if self.open and self.readable.is_set():
            self.readable.clear()
            asyncio.get_running_loop().call_later(seconds, self.readable.set)

    def gone(self) -> None:
        """The connection no longer exists: tell the lobby, once."""
        if self._gone:
            return
        self._gone = True
        self.open = False
        self._links.discard(self)
        self.client.ended()
        assert self.handle is not None
        self.lobby.disconnected(self.handle, self.client.close_code)

    def read(self) -> None:
        """The client read a frame: tell the lobby if the queue has drained."""
        if (
            self.over_window
            and self.open
            and self.client.unread <= self.lobby.transport_settings.outbound_low_water
        ):
            self.over_window = False
            assert self.handle is not None
            self.lobby.drained(self.handle)

    def _write(self) -> None:
        if self._framed:
            framed, self._framed = self._framed, []
            self.client.arrived(framed)

    # -- what the client does ---------------------------------------------------------------

    def received(self, binary: bool, data: bytes) -> None:
        assert self.handle is not None
        if len(data) > self.lobby.transport_settings.max_message_bytes:
            # The peer's fault: its agent goes offline at once, as on a socket.
            self.lobby.closing(self.handle, CloseCode.MESSAGE_TOO_BIG)
            self.shut(CloseCode.MESSAGE_TOO_BIG, "message too big")
        else:
            self.lobby.received(self.handle, binary, data)
        self.lobby.end_of_batch()

    def peer_closing(self, code: int, reason: str) -> None:
        """The client closed: the lobby answers with the same code (as a WebSocket server
        echoes a close frame), and the connection is gone on the next pass of the loop."""
        if not self.open:
            return
        self.open = False
        self._write()  # what was framed before the close still reaches the client
        self.client.closed(code, reason)
        assert self.handle is not None
        self.lobby.closing(self.handle, code)
        self.lobby.end_of_batch()
        asyncio.get_running_loop().call_soon(self.gone)


class MemoryClient:
    """The client's side of one connection, shaped like a `websockets` client connection:
    `await send(message)`, `await recv()`, `close_code`."""

    def __init__(self, link: MemoryLink) -> None:
        self._link = link
        self._inbox: deque[bytes] = deque()
        self.unread = 0
        """Bytes the lobby has written that `recv` has not taken yet."""
        self.close_code: int | None = None
        self.close_reason = ""
        self._changed = asyncio.Event()
        self._ended = asyncio.Event()

    async def send(self, message: str | bytes) -> None:
        """Send one message (`bytes` as a binary one); it is routed before this returns.
        Raises `ConnectionClosed` once the connection is closed."""
        if not self._link.open:
            raise self._closed_error()
        await self._link.readable.wait()
        if not self._link.open:
            raise self._closed_error()
        if isinstance(message, str):
            self._link.received(False, message.encode())
        else:
            self._link.received(True, bytes(message))

    async def recv(self, timeout: float | None = None) -> str:
        """The next message from the lobby, waiting at most `timeout` seconds for it
        (`TimeoutError`); after what was written before a close, `ConnectionClosed`."""
        async with asyncio.timeout(timeout):
            while not self._inbox:
                if self.close_code is not None:
                    raise self._closed_error()
                self._changed.clear()
                await self._changed.wait()
        frame = self._inbox.popleft()
        self.unread -= len(frame)
        self._link.read()
        return frame.decode()

    async def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> None:
        """Close the connection and wait until the lobby has let go of it."""
        self._link.peer_closing(code, reason)
        await self._ended.wait()

    async def __aenter__(self) -> MemoryClient:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    # -- what the lobby's side does -----------------------------------------------------------

    def arrived(self, frames: list[bytes]) -> None:
        self._inbox.extend(frames)
        self.unread += sum(map(len, frames))
        self._changed.set()

    def closed(self, code: int, reason: str) -> None:
        if self.close_code is None:
            self.close_code, self.close_reason = code, reason
        self._changed.set()

    def ended(self) -> None:
        self._ended.set()
        self._changed.set()

    def _closed_error(self) -> ConnectionClosed:
        return ConnectionClosed(self.close_code or CloseCode.NORMAL, self.close_reason)


__all__ = ["ConnectionClosed", "MemoryClient", "MemoryTransport", "MemoryTransportError", "Refused"]
