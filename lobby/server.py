"""The lobby's I/O layer, and the only server module that imports websockets.

It accepts connections and hands each message to `Router.handle` as websockets' protocol
parses it, inside `data_received` (`LobbyConnection`): no receive queue and no task switch per
message, and a read that brings several frames routes them all in one go. It never awaits on a
receiver: a `Send` frames the message on the receiver's protocol, and once per event-loop
iteration every connection written to gets what was framed for it in one `transport.write`
(one syscall for a burst, not one per message). The bytes that wait in a transport are that
connection's outbound queue, bounded by `max_outbound_bytes`: a receiver whose queue overflows
is closed with 4002 rather than slowing its senders. (A writer task per connection would cost a
task switch per message; the transport's own buffer gives the same bound for free.) Closes run
as tracked tasks, awaited on shutdown.

`GET /healthz` is answered on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any, Protocol

import orjson
import structlog
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import Event, State

from lobby.committer import Committer
from lobby.config import Settings
from lobby.core.router import Router
from lobby.core.session import Action, Send, Session
from lobby.store import Store, open_store
from protocol.codec import encode
from protocol.models import LOBBY_ID, CloseCode, ErrorCode, Message, MessageType

log = structlog.get_logger("lobby.server")

_OPEN = State.OPEN
_TEXT, _BINARY, _CONT = Opcode.TEXT, Opcode.BINARY, Opcode.CONT


class Inbox(Protocol):
    def received(self, session: Session, binary: bool, data: bytes) -> None:
        """One message from `session`."""

    def end_of_batch(self) -> None:
        """The messages of one read are in: flush what they produced."""


class LobbyConnection(ServerConnection):
    """A connection whose messages go to the lobby as they are parsed, not through websockets'
    receive queue. Control frames (ping, pong, close) are websockets' as usual; the protocol
    still enforces `max_size` over a whole fragmented message."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.session: Session | None = None
        self._inbox: Inbox | None = None
        self._early: list[tuple[bool, bytes]] = []
        """Messages that came with the handshake, before the lobby attached (rare)."""
        self._fragments: list[bytes] = []
        self._fragmented_binary = False

    def attach(self, session: Session, inbox: Inbox) -> None:
        self.session, self._inbox = session, inbox
        early, self._early = self._early, []
        for binary, data in early:
            inbox.received(session, binary, data)
        inbox.end_of_batch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # Everything this read brought is routed: write it out now, one write per receiver,
        # rather than an event-loop iteration later (which would add to every round trip).
        if self._inbox is not None:
            self._inbox.end_of_batch()

    def process_event(self, event: Event) -> None:
        if self.request is None or type(event) is not Frame:
            super().process_event(event)  # the handshake request
            return
        opcode = event.opcode
        if opcode is _TEXT or opcode is _BINARY:
            if event.fin:
                self._message(opcode is _BINARY, event.data)
            else:
                self._fragments = [bytes(event.data)]
                self._fragmented_binary = opcode is _BINARY
        elif opcode is _CONT:
            self._fragments.append(bytes(event.data))
            if event.fin:
                data = b"".join(self._fragments)
                self._fragments = []
                self._message(self._fragmented_binary, data)
        else:
            super().process_event(event)

    def _message(self, binary: bool, data: Any) -> None:
        session = self.session
        if session is None or self._inbox is None:
            self._early.append((binary, bytes(data)))
        else:
            self._inbox.received(session, binary, data)


class LobbyServer:
    """One lobby process: `await start()`, then `await stop()` (or `serve_until(event)`)."""

    def __init__(
        self, settings: Settings, router: Router | None = None, store: Store | None = None
    ) -> None:
        self.settings = settings
        self.router = router or Router(
            limits=settings.limits(),
            trace=settings.log_level.lower() == "debug",
            dialogue_timeout=settings.dialogue_timeout,
            mailbox_limit=settings.mailbox_limit,
            dedupe_horizon=settings.dedupe_horizon,
            dedupe_max=settings.dedupe_max,
        )
        self.store: Store = store or open_store(settings)
        self.committer = Committer(
            self.store, self.router.delivery, self._confirm, interval=settings.commit_interval
        )
        self._compactor: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._server: Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections = 0
        self._started = time.monotonic()
        self._written: dict[ServerConnection, Session] = {}
        """Connections with frames waiting to be flushed at the end of this loop iteration."""
        self._batch_due = False

    @property
    def port(self) -> int:
        """The bound port (useful with `port=0`)."""
        assert self._server is not None, "start() first"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        scheme = "wss" if self.settings.tls_cert else "ws"
        return f"{scheme}://{self.settings.host}:{self.port}/"

    async def start(self) -> None:
        s = self.settings
        self.router.restore(self.store.load())
        self._server = await serve(
            self._handle_connection,
            s.host,
            s.port,
            compression=None,
            max_size=s.max_message_bytes,
            ping_interval=s.ping_interval,
            ping_timeout=s.ping_timeout,
            # A peer that never answers our close frame is dropped in time for shutdown.
            close_timeout=s.shutdown_timeout / 2,
            process_request=self._process_request,
            server_header=None,
            ssl=_tls_context(s),
            create_connection=LobbyConnection,
        )
        self._started = time.monotonic()
        self._compactor = asyncio.create_task(self._compact_periodically())
        self._ticker = asyncio.create_task(self._tick_periodically())
        log.info("LOBBY_LISTENING", lobby_id=LOBBY_ID, host=s.host, port=self.port, url=self.url)

    async def stop(self) -> None:
        """Close every connection with 1001 and stop listening, within `shutdown_timeout`."""
        if self._server is None:
            return
        self._server.close(close_connections=True)
        try:
            async with asyncio.timeout(self.settings.shutdown_timeout):
                await self._server.wait_closed()
                if self._tasks:
                    await asyncio.gather(*self._tasks, return_exceptions=True)
        except TimeoutError:
            log.warning("LOBBY_SHUTDOWN_TIMEOUT", pending_closes=len(self._tasks))
            for task in self._tasks:
                task.cancel()
        for background in (self._compactor, self._ticker):
            if background is not None:
                background.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await background
        await self.committer.close()
        self._server = None
        log.info("LOBBY_STOPPED")

    async def serve_until(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    # -- connections ----------------------------------------------------------------------

    async def _handle_connection(self, ws: ServerConnection) -> None:
        assert isinstance(ws, LobbyConnection)
        address = ws.remote_address
        session = self.router.open(remote=_remote(ws), link=ws, host=address[0] if address else "")
        self._connections += 1
        deadline = asyncio.get_running_loop().call_later(
            self.settings.handshake_timeout, self._registration_deadline, session
        )
        try:
            ws.attach(session, self)
            await ws.wait_closed()
        finally:
            deadline.cancel()
            self._connections -= 1
            self._execute(self.router.close(session))
            self._batch()

    def received(self, session: Session, binary: bool, data: bytes) -> None:
        """One message from `session` (called from `data_received`; `end_of_batch` follows)."""
        self._batch_due = True  # that call is the flush: nothing to schedule
        router = self.router
        try:
            actions = router.binary(session) if binary else router.handle(session, data)
        except Exception:
            # A bug in the core must cost this one message, not the connection.
            log.exception("ROUTER_FAILED", session=session.id)
            actions = [Send(session, _internal_error())]
        if actions:
            self._execute(actions)

    def _batch(self) -> None:
        """Make sure `end_of_batch` runs soon (for frames sent outside `data_received`: timers,
        commit confirmations, closes)."""
        if not self._batch_due:
            self._batch_due = True
            asyncio.get_running_loop().call_soon(self.end_of_batch)

    def end_of_batch(self) -> None:
        """Flush what was framed for each connection in one write, and let the committer see
        the journal."""
        self._batch_due = False
        written, self._written = self._written, {}
        limit = self.settings.max_outbound_bytes
        for ws, session in written.items():
            if ws.protocol.state is not _OPEN:
                ws.send_data()  # websockets' own path also handles the end of the stream
                continue
            transport = ws.transport
            try:
                transport.write(b"".join(ws.protocol.data_to_send()))
            except Exception:
                log.debug("SEND_FAILED", exc_info=True)
                continue
            if transport.get_write_buffer_size() > limit:
                # Detach at once so nothing more is written to it: an acknowledging agent finds
                # its unacknowledged messages in its mailbox when it resumes.
                log.warning("CONNECTION_TOO_SLOW", remote=_remote(ws))
                self._execute(self.router.close(session))
                self._close(ws, CloseCode.TOO_SLOW, "too slow: outbound queue overflowed")
        self.committer.kick()

    def _execute(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self._send(action.session, action.frame)
            else:
                ws: ServerConnection = action.session.link  # type: ignore[assignment]
                self._close(ws, action.code, action.reason)

    def _send(self, session: Session, frame: bytes) -> None:
        ws: ServerConnection = session.link  # type: ignore[assignment]
        protocol = ws.protocol
        if protocol.state is not _OPEN:
            return
        try:
            protocol.send_text(frame)
        except Exception:
            log.debug("SEND_FAILED", exc_info=True)
            return
        self._written[ws] = session
        self._batch()

    def _registration_deadline(self, session: Session) -> None:
        if session.agent is None:
            ws: ServerConnection = session.link  # type: ignore[assignment]
            self._close(ws, CloseCode.POLICY_VIOLATION, "no REGISTER in time")

    def _close(self, ws: ServerConnection, code: int, reason: str) -> None:
        if ws.protocol.state is not _OPEN:
            return
        task = asyncio.get_running_loop().create_task(ws.close(code, reason))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _confirm(self, accepted: dict[Session, str]) -> None:
        """Tell each acknowledging sender the last of its messages now committed."""
        for session, message_id in accepted.items():
            agent = session.agent
            if agent is None:
                continue
            frame = encode(
                Message(
                    LOBBY_ID,
                    agent.agent_id,
                    MessageType.ACCEPTED,
                    {"message_id": message_id},
                )
            )
            self._send(session, frame)

    async def _tick_periodically(self) -> None:
        """Deadlines (dialogue expiry) are checked twice a second."""
        while True:
            await asyncio.sleep(0.5)
            try:
                self._execute(self.router.tick())
            except Exception:
                log.exception("TICK_FAILED")
            self.committer.kick()

    async def _compact_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.settings.compact_interval)
            try:
                await self.committer.compact(self.router.compaction())
            except Exception:
                log.exception("STORE_COMPACTION_FAILED")

    # -- HTTP -----------------------------------------------------------------------------

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == "/healthz":
            return self._json(connection, HTTPStatus.OK, self.health())
        if self._connections >= self.settings.max_connections:
            return self._json(
                connection,
                HTTPStatus.SERVICE_UNAVAILABLE,
                {"error": f"the lobby is full ({self.settings.max_connections} connections)"},
            )
        if path != "/":
            return self._json(
                connection,
                HTTPStatus.NOT_FOUND,
                {"error": f"no such path {path!r}: agents connect to '/'"},
            )
        return None

    def health(self) -> dict[str, object]:
        agents = self.router.registry.agents
        return {
            "status": "ok",
            "lobby_id": LOBBY_ID,
            "agents": len(agents),
            "agents_online": sum(1 for a in agents.values() if a.session is not None),
            "connections": self._connections,
            "uptime_s": round(time.monotonic() - self._started, 3),
            "store": self.committer.stats(),
        }

    @staticmethod
    def _json(connection: ServerConnection, status: HTTPStatus, body: object) -> Response:
        response = connection.respond(status, orjson.dumps(body).decode())
        del response.headers["Content-Type"]  # Headers is a multidict: replace, not add
        response.headers["Content-Type"] = "application/json"
        return response


def _tls_context(settings: Settings) -> ssl.SSLContext | None:
    if settings.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_cert, settings.tls_key)
    return context


def _remote(ws: ServerConnection) -> str:
    address = ws.remote_address
    return f"{address[0]}:{address[1]}" if address else ""


def _internal_error() -> bytes:
    payload = {
        "error": "the lobby failed to process this message; nothing was routed",
        "code": ErrorCode.INTERNAL,
        "original_message_type": None,
        "original_conversation_id": None,
    }
    return encode(Message(LOBBY_ID, "", MessageType.ERROR, payload))


__all__ = ["LobbyServer", "Session"]
