"""An optional transport on picows (`make run EXTRAS=picows`, `lobby serve
--transport picows`): WebSocket framing and parsing in C, behind the same `LobbyServer` and
router as the default. Measured next to the default in BENCHMARKS.md.

picows hands over frames, not messages: fragments are joined here (within
`max_message_bytes`, past which the connection is closed with 1009), the client's CLOSE is
answered here, and a frame that is the last of its read ends the batch (`end_of_batch`).
What picows leaves to its user of RFC 6455's checks is done here too: fragments in order and
close codes (1002), text in UTF-8 (1007). Keepalive is picows' own auto-ping.

Outgoing text frames are framed here and written together at `flush`, one write per
connection and batch: picows' own `send` writes each frame at once, one system call per
message, which cost the lobby more than picows' C parser saves (BENCHMARKS.md). A server's
frames are unmasked, so framing is a header in front of the payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Any, Final

from picows import (
    WSCloseCode,
    WSFrame,
    WSListener,
    WSMsgType,
    WSTransport,
    WSUpgradeRequest,
    WSUpgradeResponse,
    WSUpgradeResponseWithListener,
    ws_create_server,
)

from lobby.transport.base import (
    GOING_AWAY,
    IDENTITY_HEADER,
    LISTEN_BACKLOG,
    STOP_GRACE,
    Lobby,
    tls_context,
)
from lobby.transport.rfc6455 import Utf8Stream, sendable_close_code, valid_utf8
from protocol.models import CloseCode

READ_BUFFER_BYTES: Final = 2048
"""picows' read buffer to start with (its least; its default is 16 KiB): it grows as larger
reads come, so an idle connection holds 2 KiB, not 16, and a busy one grows it once."""

_TEXT, _BINARY, _CONT, _CLOSE = (
    WSMsgType.TEXT,
    WSMsgType.BINARY,
    WSMsgType.CONTINUATION,
    WSMsgType.CLOSE,
)


_SHORT: Final = struct.Struct("!BB").pack
_MEDIUM: Final = struct.Struct("!BBH").pack
_LONG: Final = struct.Struct("!BBQ").pack
_FIN_TEXT: Final = 0x81


def text_frame_header(size: int) -> bytes:
    """RFC 6455 5.2: FIN + text opcode, then the payload length (unmasked: sent by a server)."""
    if size < 126:
        return _SHORT(_FIN_TEXT, size)
    if size < 65536:
        return _MEDIUM(_FIN_TEXT, 126, size)
    return _LONG(_FIN_TEXT, 127, size)


class Links:
    """The open connections; `empty` is set while there are none (what `stop` waits for)."""

    def __init__(self) -> None:
        self.open: set[PicowsLink] = set()
        self.empty = asyncio.Event()
        self.empty.set()

    def add(self, link: PicowsLink) -> None:
        self.open.add(link)
        self.empty.clear()

    def discard(self, link: PicowsLink) -> None:
        self.open.discard(link)
        if not self.open:
            self.empty.set()


class PicowsLink(WSListener):
    """One connection: picows' listener, and the lobby's `Link` to it."""

    def __init__(self, lobby: Lobby[Any], links: Links, path: str = "/") -> None:
        self._lobby = lobby
        self._path = path
        self._links = links
        self._transport: WSTransport | None = None
        self.handle: object | None = None
        self.remote = ""
        self._fragments: list[bytes] | None = None
        """The fragments of the message under way, if one is."""
        self._fragmented_size = 0
        self._utf8: Utf8Stream | None = None
        """The UTF-8 check of the text message under way (None: binary)."""
        self._failed = False
        """Set once a frame of the peer's failed the connection (`_fail`)."""
        self._pending: list[bytes] = []
        """Frames (header, payload, header, ...) `put` since the last `flush`."""
        self._paused = False

    def on_ws_connected(self, transport: WSTransport) -> None:
        self._transport = transport
        self._links.add(self)
        peer = transport.underlying_transport.get_extra_info("peername")
        self.remote = f"{peer[0]}:{peer[1]}" if peer else ""
        # The lobby paces delivery by this buffer: `resume_writing` tells it to write more.
        settings = self._lobby.transport_settings
        transport.underlying_transport.set_write_buffer_limits(
            settings.outbound_window, settings.outbound_low_water
        )
        self.handle = self._lobby.connected(self, peer[0] if peer else "", self._path)

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        self._links.discard(self)
        if self.handle is not None:
            self._lobby.disconnected(self.handle)

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        handle = self.handle
        assert handle is not None
        msg_type = frame.msg_type
        if msg_type is _CLOSE and transport.is_close_frame_sent:
            transport.disconnect()  # the answer to our close: never a second close from here
        elif self._failed:
            pass  # nothing after the frame that failed the connection is read (RFC 6455 7.1.7)
        elif frame.rsv1 or frame.rsv2 or frame.rsv3:
            # No extension is negotiated, so a reserved bit is a protocol error (RFC 6455 5.2);
            # picows leaves that check to its user, as it does those of fragments (5.4), UTF-8
            # (8.1) and most close codes (7.4).
            self._fail(CloseCode.PROTOCOL_ERROR, "reserved bits set")
        elif msg_type is _TEXT or msg_type is _BINARY:
            if self._fragments is not None:
                self._fail(CloseCode.PROTOCOL_ERROR, "expected a continuation frame")
            elif frame.fin:
                data = frame.get_payload_as_bytes()
                if msg_type is _TEXT and not valid_utf8(data):
                    self._fail(CloseCode.INVALID_DATA, "invalid UTF-8 in a text message")
                else:
                    self._lobby.received(handle, msg_type is _BINARY, data)
            else:
                data = frame.get_payload_as_bytes()
                self._fragments = [data]
                self._fragmented_size = frame.payload_size
                self._utf8 = None if msg_type is _BINARY else Utf8Stream()
                self._fragment_utf8(data, False)
        elif msg_type is _CONT:
            self._continuation(handle, frame)
        elif msg_type is _CLOSE:
            self._close_received(handle, transport, frame)
        if frame.last_in_buffer:
            self._lobby.end_of_batch()

    def _continuation(self, handle: object, frame: WSFrame) -> None:
        fragments = self._fragments
        if fragments is None:
            self._fail(CloseCode.PROTOCOL_ERROR, "unexpected continuation frame")
            return
        self._fragmented_size += frame.payload_size
        if self._fragmented_size > self._lobby.transport_settings.max_message_bytes:
            self._fail(CloseCode.MESSAGE_TOO_BIG, "message too big")
            return
        data = frame.get_payload_as_bytes()
        fragments.append(data)
        if self._fragment_utf8(data, frame.fin) and frame.fin:
            self._fragments = None
            self._lobby.received(handle, self._utf8 is None, b"".join(fragments))

    def _fragment_utf8(self, data: bytes, final: bool) -> bool:
        """Check a text fragment as it comes (a binary one passes): False, and the connection
        fails, at the first fragment with a byte that cannot be UTF-8."""
        if self._utf8 is None or self._utf8.feed(data, final):
            return True
        self._fail(CloseCode.INVALID_DATA, "invalid UTF-8 in a text message")
        return False

    def _close_received(self, handle: object, transport: WSTransport, frame: WSFrame) -> None:
        """Echo the peer's code (a close without one is answered 1000: picows would put its
        NO_INFO, 0, on the wire); a code no peer may send fails the connection (RFC 6455 7.4)
        and is never echoed. picows has refused a 1-byte payload and a reason not UTF-8."""
        if frame.payload_size < 2:
            code = None
        else:
            code = frame.get_close_code().value
            if not sendable_close_code(code):
                self._fail(CloseCode.PROTOCOL_ERROR, f"invalid close code {code}")
                return
        self._lobby.closing(handle, code)
        self.flush()  # what was put before the close goes first
        transport.send_close(WSCloseCode.OK if code is None else code)  # type: ignore[arg-type]
        transport.disconnect()

    def pause_writing(self) -> None:
        """The write buffer passed `outbound_window`: the lobby saw it in `flush`."""

    def resume_writing(self) -> None:
        """The write buffer fell to `outbound_low_water`: the lobby writes what it held back."""
        transport = self._transport
        if self.handle is not None and transport is not None and not transport.is_close_frame_sent:
            self._lobby.drained(self.handle)

    def _fail(self, code: int, reason: str) -> None:
        """Close for a fault of the peer's: its agent goes offline at once."""
        assert self.handle is not None
        self._failed = True
        self._fragments = None
        self._lobby.closing(self.handle, code)
        self.shut(code, reason)

    # -- Link -----------------------------------------------------------------------------

    def put(self, frame: bytes) -> bool:
        transport = self._transport
        if transport is None or transport.is_close_frame_sent:
            return False
        self._pending += (text_frame_header(len(frame)), frame)
        return True

    def flush(self) -> int:
        transport = self._transport
        if transport is None:
            return 0
        underlying = transport.underlying_transport
        if self._pending:
            pending, self._pending = self._pending, []
            underlying.write(b"".join(pending))
        return int(underlying.get_write_buffer_size())

    def pause(self, seconds: float) -> None:
        transport = self._transport
        if transport is None or self._paused or transport.is_close_frame_sent:
            return
        underlying = transport.underlying_transport
        if underlying.is_closing():
            return
        self._paused = True
        underlying.pause_reading()
        asyncio.get_running_loop().call_later(seconds, self._resume, underlying)

    def _resume(self, underlying: asyncio.Transport) -> None:
        self._paused = False
        if not underlying.is_closing():
            underlying.resume_reading()

    def shut(self, code: int, reason: str) -> None:
        """Send the close frame and close TCP once what is buffered is written; a peer that
        does not read it within `close_timeout` is cut off."""
        transport = self._transport
        if transport is not None and self._send_close(transport, code, reason):
            close_timeout = self._lobby.transport_settings.close_timeout
            asyncio.get_running_loop().call_later(close_timeout, transport.disconnect, False)

    def going_away(self, reason: str) -> None:
        """The lobby stops: as `shut` with 1001, the cut-off left to `PicowsTransport.stop`,
        one sweep for every connection."""
        transport = self._transport
        if transport is not None:
            self._send_close(transport, CloseCode.GOING_AWAY, reason)

    def cut_off(self) -> None:
        """Close TCP now, whatever is still buffered (the peer has stopped reading)."""
        if self._transport is not None:
            self._transport.disconnect(False)

    def _send_close(self, transport: WSTransport, code: int, reason: str) -> bool:
        """Write what was put, then the close frame, and close TCP after them; False if a close
        frame was sent already."""
        if transport.is_close_frame_sent:
            return False
        self.flush()  # what was put before the close goes first
        transport.send_close(code, reason.encode())  # type: ignore[arg-type]  # any close code
        transport.disconnect()
        return True


class PicowsTransport:
    """The `Transport` over picows (`--transport picows`): owns its server and connections."""

    name = "picows"

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._links = Links()
        self._close_timeout = 0.0

    async def start(self, lobby: Lobby[Any]) -> int:
        s = lobby.transport_settings
        self._close_timeout = s.close_timeout

        def listener_for(request: WSUpgradeRequest) -> Any:
            path = request.path.decode("latin-1")
            authorization = request.headers.get("Authorization")
            answer = lobby.admit(path, authorization)
            if answer is None:
                accept = WSUpgradeResponse.create_101_response({IDENTITY_HEADER: lobby.identity})
                return WSUpgradeResponseWithListener(accept, PicowsLink(lobby, self._links, path))
            headers = {"Content-Type": answer.content_type}
            if answer.status < 400:
                response = WSUpgradeResponse.create_ok_response(answer.body, headers)
            else:
                response = WSUpgradeResponse.create_error_response(
                    answer.status, answer.body, headers
                )
            return WSUpgradeResponseWithListener(response, None)

        self._server = await ws_create_server(
            listener_for,
            s.host,
            s.port,
            websocket_handshake_timeout=s.handshake_timeout,
            enable_auto_ping=s.ping_interval > 0,
            auto_ping_idle_timeout=s.ping_interval,
            auto_ping_reply_timeout=s.ping_timeout,
            max_frame_size=s.max_message_bytes,
            read_buffer_init_size=READ_BUFFER_BYTES,
            # The event loop's own transport (uvloop), not aiofastnet's, which picows takes
            # when installed: that one held about 4 KiB more per idle connection and routed
            # no faster here (BENCHMARKS.md, "100,000 agents on one node").
            use_aiofastnet=False,
            ssl=tls_context(s.tls_cert, s.tls_key),
            backlog=LISTEN_BACKLOG,
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and close every connection with 1001 in one pass (each closes TCP
        once its close frame is written); wait, all at once, `STOP_GRACE` (at most
        `close_timeout`) for them to be gone, and cut off the rest (peers that stopped
        reading)."""
        if self._server is not None:
            self._server.close()
        for link in list(self._links.open):
            link.going_away(GOING_AWAY)
        if self._links.open:
            grace = min(STOP_GRACE, self._close_timeout)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._links.empty.wait()
        for link in list(self._links.open):
            link.cut_off()
        if self._server is not None:
            await self._server.wait_closed()


__all__ = ["PicowsLink", "PicowsTransport", "text_frame_header"]
