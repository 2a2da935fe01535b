"""The default transport's server (`WebsocketsTransport`): websockets' asyncio server with
`LobbyConnection`s (lobby/transport/websockets.py), the handshake's answers, and the lobby's stop.

The stop is ours: websockets' own `Server.close` runs a closing task per connection, each with
its timers, which at 20,000 connections took seconds; here every 1001 is written in one pass
and one wait covers every peer's answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from lobby.transport.base import (
    GOING_AWAY,
    IDENTITY_HEADER,
    LISTEN_BACKLOG,
    STOP_GRACE,
    HttpAnswer,
    Lobby,
    tls_context,
)
from lobby.transport.websockets import LobbyConnection
from protocol.models import CloseCode


class WebsocketsTransport:
    """The default `Transport`, over websockets' asyncio server: owns its server and connections."""

    name = "websockets"

    def __init__(self) -> None:
        self._server: Server | None = None
        self._lobby: Lobby[Any] | None = None
        self._close_timeout = 0.0

    async def start(self, lobby: Lobby[Any]) -> int:
        s = lobby.transport_settings
        self._lobby = lobby
        self._close_timeout = s.close_timeout
        self._server = await serve(
            self._handle,
            s.host,
            s.port,
            compression=None,
            max_size=s.max_message_bytes,
            ping_interval=s.ping_interval,
            ping_timeout=s.ping_timeout,
            # A peer that never answers our close frame is dropped in time for shutdown.
            close_timeout=s.close_timeout,
            # The lobby paces delivery by this buffer: `resume_writing` tells it to write more.
            write_limit=(s.outbound_window, s.outbound_low_water),
            process_request=self._process_request,
            process_response=self._process_response,
            server_header=None,
            ssl=tls_context(s.tls_cert, s.tls_key),
            create_connection=LobbyConnection,
            backlog=LISTEN_BACKLOG,
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and close every connection with 1001, the frames written in one
        pass (websockets' own `Server.close` runs a closing task per connection, each waiting
        on its peer); then wait, all at once, `STOP_GRACE` (at most `close_timeout`) for the
        peers to answer, let go of the rest (`LobbyConnection.let_go`), and return once every
        connection's handler has."""
        server = self._server
        if server is None:
            return
        server.server.close()  # new connections are refused; a handshake under way gets 503
        connections = [c for c in server.all_connections if isinstance(c, LobbyConnection)]
        for connection in connections:
            connection.going_away(GOING_AWAY)
        lost = [c.connection_lost_waiter for c in connections]
        pending = [waiter for waiter in lost if not waiter.done()]
        if pending:
            grace = min(STOP_GRACE, self._close_timeout)
            await asyncio.wait(pending, timeout=grace)
        for connection in connections:
            if not connection.connection_lost_waiter.done():
                connection.let_go()
        server.close(close_connections=False)  # its task ends once every handler has
        await server.wait_closed()

    async def _handle(self, ws: ServerConnection) -> None:
        assert isinstance(ws, LobbyConnection)
        assert self._lobby is not None
        handle = ws.attach(self._lobby)
        try:
            await ws.wait_closed()
        finally:
            code = CloseCode.GOING_AWAY if ws.went_away else ws.protocol.close_code
            self._lobby.disconnected(handle, None if code is None else int(code))

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        assert self._lobby is not None
        answer = self._lobby.admit(request.path, request.headers.get("Authorization"))
        if answer is None:
            return None
        return _http(connection, answer)

    def _process_response(
        self, connection: ServerConnection, request: Request, response: Response
    ) -> None:
        assert self._lobby is not None
        if response.status_code == 101:
            response.headers[IDENTITY_HEADER] = self._lobby.identity


def _http(connection: ServerConnection, answer: HttpAnswer) -> Response:
    response = connection.respond(answer.status, "")
    response.body = answer.body
    # Headers is a multidict: replace, not add.
    del response.headers["Content-Type"], response.headers["Content-Length"]
    response.headers["Content-Type"] = answer.content_type
    response.headers["Content-Length"] = str(len(answer.body))
    return response
