"""The lobby's I/O layer, and the only server module that imports websockets.

It accepts connections, pumps each text frame through `Router.handle` and carries out the
actions it returns. It never awaits on a receiver: a `Send` writes the frame to the receiver's
transport at once, and the bytes that wait there are that connection's outbound queue, bounded
by `max_outbound_bytes`; a receiver whose queue overflows is closed with 4002 rather than
slowing its senders. (A writer task per connection would cost a task switch per message; the
transport's own buffer gives the same bound for free.) Closes run as tracked tasks, awaited on
shutdown.

`GET /healthz` is answered on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Iterable
from http import HTTPStatus

import orjson
import structlog
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.protocol import State

from lobby.committer import Committer
from lobby.config import Settings
from lobby.core.router import Router
from lobby.core.session import Action, Send, Session
from lobby.store import Store, open_store
from protocol.codec import encode
from protocol.models import LOBBY_ID, CloseCode, ErrorCode, Message, MessageType

log = structlog.get_logger("lobby.server")

_OPEN = State.OPEN


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
        self.committer = Committer(self.store, self.router.delivery, self._confirm)
        self._compactor: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._server: Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections = 0
        self._started = time.monotonic()

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
        router = self.router
        committer = self.committer
        address = ws.remote_address
        session = router.open(remote=_remote(ws), link=ws, host=address[0] if address else "")
        self._connections += 1
        deadline = asyncio.get_running_loop().call_later(
            self.settings.handshake_timeout, self._registration_deadline, session
        )
        try:
            async for frame in ws:
                try:
                    actions = router.handle(session, frame)
                except Exception:
                    # A bug in the core must cost this one message, not the connection.
                    log.exception("ROUTER_FAILED", session=session.id)
                    actions = [Send(session, _internal_error())]
                if actions:
                    self._execute(actions)
                committer.kick()
        except ConnectionClosed:
            pass
        finally:
            deadline.cancel()
            self._connections -= 1
            self._execute(router.close(session))

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
            ws.send_data()
        except Exception:
            log.debug("SEND_FAILED", exc_info=True)
            return
        if ws.transport.get_write_buffer_size() > self.settings.max_outbound_bytes:
            # Detach at once so nothing more is written to it: an acknowledging agent finds
            # its unacknowledged messages in its mailbox when it resumes.
            log.warning("CONNECTION_TOO_SLOW", remote=_remote(ws))
            self._execute(self.router.close(session))
            self._close(ws, CloseCode.TOO_SLOW, "too slow: outbound queue overflowed")

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
