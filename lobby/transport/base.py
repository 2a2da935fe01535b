"""What a transport and the lobby promise each other; a leaf: it imports nothing of the server.

A transport carries connections: it accepts them, parses their messages and writes frames.
The lobby (`lobby.server.LobbyServer`) decides everything else. They meet at three things here:
- `Lobby`: what the lobby offers a transport; the transport calls it as connections come,
  speak and go.
- `Link`: one connection, as the transport gives it to the lobby, which pairs it with a
  session of its own: `connected` answers an opaque handle the transport passes back with
  every later call for that connection.
- `TransportSettings`: the lobby's settings a transport reads, in plain values.
- `Transport`: what the lobby asks of a transport: start listening, stop.

The order of calls, for one connection: `admit(path, authorization)` (None: accept, else an
`HttpAnswer` to send instead), `connected(link, host, path)` once it is open, then
`received(handle, binary, data)` for each message, as the parser produces it inside the read
that brought it, and `end_of_batch()` when that read is done (so what it routed is written at
once, one write per receiver); `closing(handle, code)` as soon as the connection stops being
open (the peer's close frame, or a close the transport sent for a fault of the peer's: 1009,
1007, 1002), and `disconnected(handle, code)` once it is gone.

The lobby writes with `Link.put` and, at the end of a batch, `Link.flush`: the bytes `flush`
reports still waiting are the connection's outbound queue. Past `outbound_window` bytes the
lobby writes no more messages to it; the transport calls `drained(handle)` once the queue,
having passed `outbound_window`, falls to `outbound_low_water` (asyncio's `resume_writing`, with
the transport's write buffer limits set to these two), and the lobby writes again. It closes a
connection with 4002 whose queue, and what it holds for the agent beyond the window, pass
`max_outbound_bytes`. `Link.shut` sends a close frame; the
transport cuts off a peer that does not finish the closing handshake within `close_timeout`.
The registration deadline (`handshake_timeout`, 1008) is the lobby's own.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

import orjson


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """An HTTP answer to a request the lobby does not upgrade: /healthz, /metrics, a refusal."""

    status: HTTPStatus
    body: bytes
    content_type: str = "application/json"

    @classmethod
    def json(cls, status: HTTPStatus, body: object) -> HttpAnswer:
        return cls(status, orjson.dumps(body))


class Link(Protocol):
    """One connection, as the transport gives it to the lobby (the core keeps it in
    `Session.link`)."""

    remote: str

    def put(self, frame: bytes) -> bool:
        """Frame one text message for this connection (written by `flush`, or at once);
        False if the connection is closing."""

    def flush(self) -> int:
        """Write what was framed; return the bytes still waiting to be written."""

    def shut(self, code: int, reason: str) -> Awaitable[None] | None:
        """Start the closing handshake; what to await for it to finish, if anything."""

    def pause(self, seconds: float) -> None:
        """Read nothing more from this connection for `seconds` (its sender is past a rate
        limit): its frames wait in TCP's buffers, and the sender's writes stall there."""


GOING_AWAY: Final = "the lobby is shutting down"
"""The reason in the 1001 close frame every connection gets when the lobby stops."""

STOP_GRACE: Final = 0.5
"""Seconds the peers have, once the lobby stops, to answer its 1001 close frame before their
connections are closed from this side (at most `close_timeout`): the frames go out to all in one
pass, so this is one wait for every connection, not one per connection."""

LISTEN_BACKLOG: Final = 65535
"""Connections the kernel may hold, handshake done, for the lobby to accept: the kernel caps it
at `net.core.somaxconn` (4096 by default), the operator's knob. asyncio's default of 100
dropped SYNs when thousands of agents connected at once (a restart, a failover), each dropped
one retried only after a second or more."""

IDENTITY_HEADER: Final = "Agent-Lobby-Id"
"""The handshake response header that carries the lobby's identity (`lobby.identity`): agents
learn from it, before they send REGISTER, which token to offer."""


@dataclass(frozen=True, slots=True)
class TransportSettings:
    """What a transport reads of the lobby's settings (`lobby.config.Settings`, which names
    each): where to listen, and the limits of a connection."""

    host: str
    port: int
    max_message_bytes: int
    handshake_timeout: float
    ping_interval: float
    ping_timeout: float
    close_timeout: float
    outbound_window: int
    outbound_low_water: int
    tls_cert: Path | None = None
    tls_key: Path | None = None


Handle = TypeVar("Handle")
"""What the lobby answers `connected` with, and the transport hands back with each call about
that connection; the transport never looks inside it."""


class Lobby(Protocol[Handle]):
    """What the lobby offers a transport. A transport calls these from the event loop, never
    from another thread."""

    @property
    def identity(self) -> str:
        """The lobby's identity: every accepted WebSocket's handshake response carries it in
        `IDENTITY_HEADER`."""

    @property
    def transport_settings(self) -> TransportSettings:
        """Where the transport listens, and its limits (`max_message_bytes`, ...)."""

    def admit(self, path: str, authorization: str | None = None) -> HttpAnswer | None:
        """Call for each HTTP request (`path` with its query string, `authorization` the
        request's Authorization header): None to accept the WebSocket, else what to answer
        instead (/healthz, /metrics, a full lobby, a refused /admin, another path)."""

    def connected(self, link: Link, host: str, path: str = "/") -> Handle:
        """Call once the WebSocket is open; `host` is the peer's address without the port,
        `path` the one `admit` accepted."""

    def received(self, handle: Handle, binary: bool, data: bytes) -> None:
        """Call with each whole message, from within the read that brought it."""

    def end_of_batch(self) -> None:
        """Call when a read is done: what it routed is written out now."""

    def drained(self, handle: Handle) -> None:
        """Call when the connection's outbound queue, having passed `outbound_window` bytes,
        has fallen to `outbound_low_water`."""

    def closing(self, handle: Handle, code: int | None) -> None:
        """Call as soon as the connection stops being open, though TCP may stay up."""

    def disconnected(self, handle: Handle, code: int | None = None) -> None:
        """Call once the connection is gone (TCP closed or aborted)."""


class Transport(Protocol):
    """Owns the listening socket (if any) and every connection it accepts: hands each message to
    the `Lobby` and carries out what it writes. `start` once, `stop` once."""

    name: str
    """As /healthz reports it: websockets, picows, memory."""

    async def start(self, lobby: Lobby[Any]) -> int | None:
        """Listen for connections; return the bound port (None for a transport without one:
        memory)."""

    async def stop(self) -> None:
        """Stop listening and close every connection with 1001: every close frame written in
        one pass, then one wait, `STOP_GRACE` at most, for all the peers; those still there
        are closed from this side (the lobby bounds the whole by `shutdown_timeout`)."""


def tls_context(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """The server-side TLS context `--tls-cert`/`--tls-key` ask for; None without them."""
    if cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


__all__ = ["HttpAnswer", "Link", "Lobby", "Transport", "TransportSettings", "tls_context"]
