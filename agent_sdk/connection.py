"""The SDK's link to the lobby; with `agent_sdk.wire` (its frames), the only SDK modules that
import websockets.

`registered_links()` is the reconnect loop: it connects (retrying with capped, jittered
exponential backoff on network errors, moving on to the next of the lobby's addresses after each
failed attempt), registers or resumes with the agent's token, and yields one registered `Link`
per successful connection. When the caller is done with a link (the connection dropped),
iterating again reconnects: to the same address first, unless the lobby closed it with 1012
(a cluster node stepping down to rejoin) or refused REGISTER with `node_unavailable`; then to
the next address.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Generator,
    Sequence,
)
from dataclasses import dataclass
from functools import partial
from typing import Any

from websockets.asyncio.client import connect
from websockets.client import backoff, process_exception
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from agent_sdk.errors import LobbyUnreachableError, RegistrationError
from agent_sdk.identity import IDENTITY_HEADER, announced_identity
from agent_sdk.logs import log
from agent_sdk.wire import AgentConnection, text_frames
from protocol.codec import decode, encode
from protocol.errors import DecodeError
from protocol.models import (
    LOBBY_ID,
    CloseCode,
    ErrorCode,
    Message,
    MessageType,
    RegisterStatus,
)

WRITE_HIGH = 64 * 1024
"""Bytes waiting in the transport past which `Link.send` waits for them to drain."""
MAX_FRAME_BYTES = 16 * 1024 * 1024
"""Frames from the lobby can be large (a discovery over many capabilities)."""


@dataclass(frozen=True, slots=True)
class Registration:
    """The lobby's REGISTER_ACK: the token to send with every message, and whether it resumed
    this agent."""

    token: str
    resumed: bool
    """True when the lobby still knew this agent and re-attached it (same token)."""


INTERNAL_ERROR = 1011
"""The close code of a connection whose agent failed handling a message (RFC 6455)."""


class _RetryLater(Exception):
    """The lobby refused REGISTER for now (e.g. `rate_limited`): back off and try again."""


class Link:
    """One open, registered connection. `serve()` hands incoming frames to the reader.

    `send` keeps the messages of one event-loop iteration and `_flush` frames them
    (`wire.text_frames`) and writes them at once (many calls in flight send many messages at
    once: one write() each was the largest single cost of a busy agent). They are kept here,
    not framed on websockets' protocol at once, because websockets writes whatever is framed,
    one write() per frame, whenever a frame arrives before the flush. Past `WRITE_HIGH` bytes
    kept or waiting, `send` flushes and waits for the connection to drain, as websockets' own
    `send` does; `send_now`, for code that may not wait, is used only while `ready`."""

    def __init__(self, ws: AgentConnection) -> None:
        self._ws = ws
        self._receive: Callable[[str | bytes], None] | None = None
        self._failure: Exception | None = None
        """What `receive` raised, if it did: `serve()` raises it once the connection closed."""
        self._pending: list[bytes] = []
        """Messages sent since the last flush, in order."""
        self._kept = 0
        """Their bytes."""

    async def send(self, frame: bytes) -> None:
        """Send one frame; raises `ConnectionClosed` if the connection is gone."""
        ws = self._ws
        if ws.protocol.state is not State.OPEN:
            self._flush()
            await ws.send(frame, text=True)  # raises the connection's own ConnectionClosed
            return
        pending = self._pending
        if not pending:
            asyncio.get_running_loop().call_soon(self._flush)
        pending.append(frame)
        self._kept += len(frame)
        if self._kept + ws.transport.get_write_buffer_size() > WRITE_HIGH:
            self._flush()
            await ws.drain()  # websockets' own wait for a paused transport to resume

    @property
    def ready(self) -> bool:
        """True when `send_now` may be used: the connection is open and below `WRITE_HIGH`."""
        ws = self._ws
        return (
            ws.protocol.state is State.OPEN
            and self._kept + ws.transport.get_write_buffer_size() <= WRITE_HIGH
        )

    def send_now(self, frame: bytes) -> None:
        """`send`, for a caller that may not wait: only while `ready` (past `WRITE_HIGH` this
        writes at once, and `ready` is False until the connection drained)."""
        pending = self._pending
        if not pending:
            asyncio.get_running_loop().call_soon(self._flush)
        pending.append(frame)
        self._kept += len(frame)
        if self._kept > WRITE_HIGH:
            self._flush()

    def _flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        self._kept = 0
        ws = self._ws
        protocol = ws.protocol
        if protocol.state is not State.OPEN:
            return  # closing: the lobby reads nothing after its close frame
        if protocol.extensions or protocol.expect_continuation_frame:
            for frame in pending:
                protocol.send_text(frame)
            ws.transport.write(b"".join(protocol.data_to_send()))
            return
        ws.transport.write(text_frames(pending))

    async def serve(self, receive: Callable[[str | bytes], None]) -> None:
        """Hand each incoming frame to `receive`, in order, until the connection closes
        (normally or not); if `receive` raised, the connection is failed (1011) and this
        raises what it raised."""
        ws = self._ws
        self._receive = receive
        ws.on_frame = self._received
        try:
            # What websockets queued (see `AgentConnection`); `recv()`, not `async for` over
            # the connection: its generator is one more layer a frame.
            recv = ws.recv
            while True:
                frame = await recv()
                if self._failure is not None:
                    break
                self._received(frame)
        except ConnectionClosed:
            pass
        finally:
            ws.on_frame = None
        if self._failure is not None:
            raise self._failure

    def _received(self, frame: str | bytes) -> None:
        try:
            self._receive(frame)  # type: ignore[misc]  # set by `serve()` before this
        except Exception as exc:
            self._failure = exc
            ws = self._ws
            ws.on_frame = None  # frames after it are dropped, as after a raise in `serve()`
            ws.protocol.fail(INTERNAL_ERROR, "the agent failed handling a message")
            ws.send_data()

    async def close(self) -> None:
        """Close, reading and dropping whatever still arrives meanwhile: websockets stops
        reading once its receive queue is full, and the lobby's answer to our close frame may
        be queued behind what it was still sending (messages an acknowledging agent did not
        acknowledge are delivered again next time)."""
        self._flush()
        self._ws.on_frame = None  # what arrives from now on is read and dropped
        discard = asyncio.ensure_future(self._discard())
        try:
            await self._ws.close()
        finally:
            discard.cancel()

    async def _discard(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for _ in self._ws:
                pass

    @property
    def close_code(self) -> int | None:
        return self._ws.close_code


def reconnect_delays(max_delay: float) -> Callable[[], Generator[float]]:
    """Backoff for reconnecting to a lobby: a jittered first try within 0.5 s, then 0.5 s
    growing by the golden ratio up to `max_delay`."""
    return partial(backoff, initial_delay=0.5, min_delay=0.5, max_delay=max_delay)


def _retryable(exc: Exception) -> Exception | None:
    """None to retry a failed connection attempt, else the exception to raise."""
    if isinstance(exc, ConnectionClosed):
        return None
    return process_exception(exc)


def lobby_urls(given: str | Sequence[str]) -> tuple[str, ...]:
    """The lobby addresses `given` as one string (comma-separated for several) or a list."""
    parts = given.split(",") if isinstance(given, str) else list(given)
    urls = tuple(url.strip() for url in parts if url.strip())
    if not urls:
        raise ValueError(f"no lobby URL in {given!r}")
    return urls


async def registered_links(
    urls: Sequence[str],
    *,
    agent_id: str,
    register_payload: Callable[[], dict[str, Any]],
    token: Callable[[str | None], Awaitable[str | None]],
    max_delay: float = 10.0,
    open_timeout: float = 10.0,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncGenerator[tuple[Link, Registration]]:
    """Connect, register (or resume with `await token(identity)`), yield; reconnect when
    iterated again. `identity` is the one the lobby announced in its handshake response
    (`Agent-Lobby-Id`), None when it announced none: asked after each handshake, before
    REGISTER, so a token is offered only to the lobby it is for.

    `urls` are the lobby's addresses (one, or the nodes of a cluster, which share their
    state): a reconnect tries the address that last worked first, and every failed attempt
    (no connection, or dropped during REGISTER) moves on to the next, backing off with capped,
    jittered exponential delays; but a resume closed with 1013 is tried on the same node
    again: it is alive, and holds resumes while the agent's dead home is failed over (moving
    on would spend every other attempt on the dead node). Raises `RegistrationError` when
    the lobby refuses the agent (not retried), and what websockets deems fatal (a bad URL, a
    4xx handshake) at once.
    """
    delays = reconnect_delays(max_delay)
    waits = delays()
    at = 0
    while True:
        url = urls[at % len(urls)]
        try:
            ws: AgentConnection = await connect(  # type: ignore[assignment]  # create_connection
                url,
                compression=None,
                max_size=MAX_FRAME_BYTES,
                open_timeout=open_timeout,
                ssl=ssl_context,
                create_connection=AgentConnection,
            )
        except Exception as exc:
            fatal = _retryable(exc)
            if fatal is not None:
                raise LobbyUnreachableError(f"cannot connect to {url}: {fatal}") from fatal
            log.info("CONNECT_FAILED", agent_id=agent_id, url=url, error=repr(exc))
            at += 1
            await asyncio.sleep(next(waits))
            continue
        try:
            response = ws.response
            header = None if response is None else response.headers.get(IDENTITY_HEADER)
            presented = await token(announced_identity(header))
            registration = await _register(
                ws, agent_id, register_payload(), presented, open_timeout
            )
        except (ConnectionClosed, TimeoutError, OSError, _RetryLater) as exc:
            # Connected but dropped during REGISTER (e.g. the lobby is shutting down).
            log.info("REGISTER_INTERRUPTED", agent_id=agent_id, url=url, error=repr(exc))
            await ws.close()
            if ws.close_code != CloseCode.TRY_AGAIN:
                at += 1  # else a live node holds the resume while a dead home fails over
            await asyncio.sleep(next(waits))
            continue
        except BaseException:
            await ws.close()
            raise
        waits = delays()
        link = Link(ws)
        try:
            yield link, registration
        finally:
            await link.close()
        if link.close_code == CloseCode.SERVICE_RESTART:
            at += 1  # that node is rejoining its cluster: another one serves meanwhile


async def _register(
    ws: AgentConnection,
    agent_id: str,
    payload: dict[str, Any],
    token: str | None,
    timeout: float,
) -> Registration:
    register = Message(agent_id, LOBBY_ID, MessageType.REGISTER, payload, auth_token=token)
    await ws.send(encode(register), text=True)
    async with asyncio.timeout(timeout):
        frame = await ws.recv()
    try:
        reply = decode(frame)
    except DecodeError as exc:
        raise RegistrationError("malformed", f"unreadable reply to REGISTER: {exc}") from None
    if reply.message_type is MessageType.REGISTER_ACK:
        status = reply.payload.get("status")
        new_token = reply.payload.get("auth_token")
        if not isinstance(new_token, str):
            raise RegistrationError("malformed", "REGISTER_ACK carried no auth_token")
        return Registration(new_token, resumed=status == RegisterStatus.RESUMED)
    code = str(reply.payload.get("code", "error"))
    message = str(reply.payload.get("error", "REGISTER was refused"))
    if code in (ErrorCode.RATE_LIMITED, ErrorCode.NODE_UNAVAILABLE):
        raise _RetryLater(message)
    raise RegistrationError(code, message)
