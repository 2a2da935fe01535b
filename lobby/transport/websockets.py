"""The default transport, on `websockets` (asyncio API).

`LobbyConnection` takes messages from websockets' sans-I/O protocol as they are parsed, inside
`data_received`, instead of through its receive queue and a handler task: a read that brings
several frames routes them all in one go, and what they produced is flushed when the read is
done, one `transport.write` per receiver. Control frames (ping, pong, close), the handshake,
`max_size` over a whole fragmented message and keepalive stay websockets' own.

Data frames are parsed here too, once the handshake is done and websockets' parser waits for a
frame: a whole, final text or binary frame within `max_size` goes to the lobby; any other frame
(control, fragment, one websockets refuses) is handed to websockets whole, so its parser stays
at a frame boundary and it answers, assembles or fails it as before. Outgoing text frames are
framed here as well (no extension is negotiated, and a server does not mask): websockets'
generator-based parser, its `Frame` objects and their serialization cost about five times as
much per frame.

The lobby's stop is ours too (`lobby.transport.websockets_server`): each connection is told
1001 (`going_away`) in one pass, and let go of (`let_go`) if its peer does not answer in time.
"""

from __future__ import annotations

import asyncio
import struct
import sys
from collections import deque
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import Event, Protocol, State
from websockets.server import ServerProtocol

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - websockets built without its C extension
    from websockets.utils import apply_mask

from lobby.transport.base import Lobby
from lobby.transport.rfc6455 import Utf8Stream, lone_close_frame, valid_utf8
from protocol.models import CloseCode

_OPEN = State.OPEN
_TEXT, _BINARY, _CONT = Opcode.TEXT, Opcode.BINARY, Opcode.CONT

# RFC 6455 5.2 headers of an unmasked, final text frame, by payload length.
_SHORT = tuple(bytes((0x81, n)) for n in range(126))
_MEDIUM = struct.Struct("!BBH").pack
_LONG = struct.Struct("!BBQ").pack
_U16 = struct.Struct("!H").unpack_from
_U64 = struct.Struct("!Q").unpack_from

_HANDSHAKE_PARSER = ServerProtocol.parse.__code__
_HANDSHAKE_DONE = Request("/", Headers())
"""Stands for the handshake request once the lobby has what it needs of it (the path): the
parsed headers of the request and the response cost about 2.5 KiB an idle connection."""
_NEVER_READ: deque[Frame] = deque(maxlen=0)
"""Stands for the deque of websockets' receive queue, which data frames never reach here (they
go to the lobby as they are parsed): an empty deque costs about 600 bytes a connection."""


class LobbyConnection(ServerConnection):
    """A connection whose messages go to the lobby as they are parsed; also the lobby's
    `Link` to it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # websockets' drain() only appends, removes and iterates its waiters: an empty list
        # costs 56 bytes where an empty deque costs about 600 (one per idle connection).
        self.drain_waiters = []  # type: ignore[assignment]
        self.remote = ""
        self.handle: object | None = None
        self._lobby: Lobby[Any] | None = None
        self._early: list[tuple[bool, bytes]] = []
        """Messages that came with the handshake, before the lobby attached (rare)."""
        self._fragments: list[bytes] = []
        self._utf8: Utf8Stream | None = None
        """The UTF-8 check of the fragmented text message under way (None: binary)."""
        self._invalid = False
        """Set once a text message that is not UTF-8 failed the connection."""
        self._closing = False
        """Set once the lobby knows this connection is no longer open."""
        self._going_away = False
        """Set once the lobby stops (`going_away`)."""
        self._abort: asyncio.TimerHandle | None = None
        self._paused = False
        self._out: list[bytes] = []
        """Frames put and not yet written: they go out before anything websockets queues."""
        self._own_framing = False
        self._direct = False
        """Frames are parsed here (`_read_frames`), not by websockets."""
        self._pending = bytearray()
        """The start of a frame whose end has not come yet."""

    def attach(self, lobby: Lobby[Any]) -> object:
        address = self.remote_address
        self.remote = f"{address[0]}:{address[1]}" if address else ""
        path = self.request.path if self.request is not None else "/"
        self.request, self.response = _HANDSHAKE_DONE, None
        self._own_framing = not self.protocol.extensions
        self.handle = handle = lobby.connected(self, address[0] if address else "", path)
        self._lobby = lobby
        early, self._early = self._early, []
        for binary, data in early:
            lobby.received(handle, binary, data)
        lobby.end_of_batch()
        if self._out and not self.transport.is_closing():  # the 101, if nothing came with it
            out, self._out = self._out, []
            self.transport.write(b"".join(out))
        self._parser_waits_for_frame()  # an agent that stays idle leaves the handshake's parser
        return handle

    # -- Link -----------------------------------------------------------------------------

    def put(self, frame: bytes) -> bool:
        if self.protocol.state is not _OPEN:
            return False
        if not self._own_framing:  # an extension would transform the frame: websockets frames it
            self.protocol.send_text(frame)
            return True
        n = len(frame)
        out = self._out
        out.append(
            _SHORT[n] if n < 126 else _MEDIUM(0x81, 126, n) if n < 65536 else _LONG(0x81, 127, n)
        )
        out.append(frame)
        return True

    def flush(self) -> int:
        if self.protocol.state is not _OPEN:
            self.send_data()  # websockets' own path also handles the end of the stream
            return 0
        out, self._out = self._out, []
        out += self.protocol.data_to_send()
        transport = self.transport
        transport.write(b"".join(out))
        return transport.get_write_buffer_size()

    def send_data(self) -> None:
        """websockets writes what it queued (pong, close frame, a frame sent through its own
        API) here: the frames put before it go first. The handshake's 101 waits for `attach`,
        which comes next in the same step: an agent that sent its REGISTER with the upgrade
        gets the 101 and the REGISTER_ACK in one write (one syscall less on both sides)."""
        if self._lobby is None and self.protocol.state is _OPEN:
            self._out += self.protocol.data_to_send()
            return
        if self._out:
            out, self._out = self._out, []
            self.transport.write(b"".join(out))
        super().send_data()

    def shut(self, code: int, reason: str) -> asyncio.Task[None] | None:
        """Send the close frame; the connection is aborted if it is not gone within
        `close_timeout` (websockets' own `close` waits that long for the peer, but first for
        the write buffer to drain, which a peer that stopped reading never lets happen)."""
        self._closing = True
        self._abort_later()
        if self.protocol.state is not _OPEN:
            return None
        return asyncio.get_running_loop().create_task(self.close(code, reason))

    def going_away(self, reason: str) -> None:
        """The lobby stops: write the 1001 close frame now, after what was put, and wait for
        nothing (`WebsocketsTransport.stop` waits for every connection at once); the peer's
        answer closes TCP (`data_received`)."""
        self._closing = self._going_away = True
        if self.transport.is_closing():
            return
        if self._paused:  # what waits unread would turn our close into a reset
            self.transport.resume_reading()
        if self.protocol.state is _OPEN:
            self.protocol.send_close(CloseCode.GOING_AWAY, reason)
            self.send_data()

    def let_go(self) -> None:
        """The peer has not answered the 1001 in time: close TCP after what is written (the
        kernel still delivers the close frame once the process is gone), or, if it is not all
        written (a peer that stopped reading), cut the connection off."""
        transport = self.transport
        if transport.get_write_buffer_size():
            transport.abort()
        else:
            transport.close()

    @property
    def went_away(self) -> bool:
        """Closed by the lobby's stop (1001), whether or not the peer answered."""
        return self._going_away

    async def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> None:
        """websockets' own, except on a connection already closed, where it has nothing to do
        (every handler's exit calls it) but would raise and catch an exception, and on one the
        lobby's stop closes (`going_away`), which it would wait for with a timer each."""
        if not self._going_away and self.protocol.state is not State.CLOSED:
            await super().close(code, reason)

    def pause(self, seconds: float) -> None:
        # Data frames never enter websockets' receive queue (`process_event`), so its own
        # flow control never pauses or resumes reading: the pause is ours alone.
        if self._paused or self._closing or self.transport.is_closing():
            return
        self._paused = True
        self.transport.pause_reading()
        asyncio.get_running_loop().call_later(seconds, self._resume)

    def _resume(self) -> None:
        self._paused = False
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def resume_writing(self) -> None:
        """The write buffer fell to its low-water mark (`outbound_low_water`): the lobby
        writes what it held back."""
        super().resume_writing()
        if self.handle is not None and self._lobby is not None and not self._closing:
            self._lobby.drained(self.handle)

    def _abort_later(self) -> None:
        if self._abort is None and self.close_timeout is not None:
            self._abort = self.loop.call_later(self.close_timeout, self.transport.abort)

    # -- receiving --------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._going_away and lone_close_frame(data):
            # The peer's answer to our 1001, alone in this read (a masked close frame, as it
            # nearly always comes): the closing handshake is done, TCP closes now (RFC 6455
            # 7.1.1: the server first), without websockets parsing it. Anything else is read
            # as below (an ACK sent before the peer saw the 1001 still counts).
            self.transport.close()
            return
        lobby = self._lobby
        if lobby is None:
            super().data_received(data)
            return
        if self._direct and self.protocol.state is not _OPEN:
            # Closing (websockets may discard what comes now): websockets reads on from the
            # frame boundary where the parsing here stopped.
            self._direct = False
            data, self._pending = bytes(self._pending) + data, bytearray()
        if self._direct or self._parser_waits_for_frame():
            self._read_frames(data)
        else:
            super().data_received(data)
        if self.protocol.state is not _OPEN and not self._closing:
            self._peer_closing(lobby)
        # Everything this read brought is routed: write it out now, one write per receiver,
        # rather than an event-loop iteration later (which would add to every round trip).
        lobby.end_of_batch()

    def _parser_waits_for_frame(self) -> bool:
        """websockets' parser is between frames with nothing buffered (it may hold the start
        of a frame that came with the handshake): from here on frames may be parsed here."""
        protocol = self.protocol
        if protocol.state is not _OPEN or protocol.reader.buffer:
            return False
        parser: Any = protocol.parser
        while parser.gi_yieldfrom is not None:
            parser = parser.gi_yieldfrom
        self._direct = parser.gi_code.co_name == "at_eof"
        if self._direct and protocol.parser.gi_code is _HANDSHAKE_PARSER:  # type: ignore[attr-defined]
            # The handshake's parser holds the request it parsed (its headers: about 2 KiB) in
            # a local for as long as the connection lives; the frame parser it ends in, started
            # afresh at this frame boundary (its state is the protocol's), holds nothing.
            protocol.parser = Protocol.parse(protocol)
            next(protocol.parser)
        return self._direct

    def _read_frames(self, data: bytes) -> None:
        """Route the whole data frames in what has come, hand the others to websockets, and
        keep the start of an unfinished frame for the next read."""
        buf: bytes | bytearray = data
        if self._pending:
            self._pending += data
            buf = self._pending
        protocol = self.protocol
        limit = protocol.max_message_size
        if limit is None or protocol.max_fragment_size is not None:
            limit = min(limit or sys.maxsize, protocol.max_fragment_size or sys.maxsize)
        whole = protocol.current_size is None  # no fragmented message under way
        end, i = len(buf), 0
        while end - i >= 2:
            head1, head2 = buf[i], buf[i + 1]
            length, at = head2 & 0x7F, i + 2
            if length == 126:
                if end - at < 2:
                    break
                (length,) = _U16(buf, at)
                at += 2
            elif length == 127:
                if end - at < 8:
                    break
                (length,) = _U64(buf, at)
                at += 8
            if length > limit:  # websockets fails it (1009) on its header alone
                self._direct = False
                super().data_received(bytes(buf[i:]))
                i = end
                break
            masked = head2 & 0x80
            stop = at + 4 + length if masked else at + length
            if stop > end:
                break
            if whole and masked and (head1 == 0x81 or head1 == 0x82):
                self._message(head1 == 0x82, apply_mask(buf[at + 4 : stop], buf[at : at + 4]))
                i = stop
                if self._invalid:  # failed (1007): websockets discards the rest
                    self._direct = False
                    super().data_received(bytes(buf[i:]))
                    i = end
                    break
                continue
            # A control frame, a fragment, or a frame websockets refuses: websockets gets it
            # whole, and what follows it once the connection is no longer open (to discard).
            super().data_received(bytes(buf[i:stop]))
            i = stop
            if protocol.state is not _OPEN:
                self._direct = False
                if i < end:
                    super().data_received(bytes(buf[i:]))
                i = end
                break
            whole = protocol.current_size is None
        if buf is self._pending:
            del buf[:i]
        elif i < end:
            self._pending = bytearray(buf[i:])

    def _peer_closing(self, lobby: Lobby[Any]) -> None:
        """The peer sent a close frame, or websockets failed the connection (1009 for a
        message over `max_size`, 1002 for a frame that breaks RFC 6455) and sent its own:
        the agent goes offline now. websockets then waits for the peer to close TCP, which a
        client may leave to the server (RFC 6455 7.1.1), and nothing here would wait on it but
        keepalive: so the connection is aborted once `close_timeout` has passed."""
        self._closing = True
        assert self.handle is not None
        close = self.protocol.close_sent or self.protocol.close_rcvd
        lobby.closing(self.handle, None if close is None else int(close.code))
        self._abort_later()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.recv_messages.frames.queue = _NEVER_READ

    def eof_received(self) -> None:
        if self._going_away:
            self._unread_end()
            return  # asyncio closes the transport
        super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._abort is not None:
            self._abort.cancel()
        if self._going_away:
            self._unread_end()
        super().connection_lost(exc)

    def _unread_end(self) -> None:
        """After the 1001, the end of the stream closes the connection as it is, without
        websockets' parser failing it (1006) and discarding the rest."""
        protocol = self.protocol
        if not protocol.reader.eof:
            protocol.reader.feed_eof()
            protocol.state = State.CLOSED

    def process_event(self, event: Event) -> None:
        if self.request is None or type(event) is not Frame:
            super().process_event(event)  # the handshake request
            return
        opcode = event.opcode
        if (opcode is _TEXT or opcode is _BINARY or opcode is _CONT) and self._invalid:
            return  # parsed in the same read as the text that failed the connection
        if opcode is _TEXT or opcode is _BINARY:
            data = bytes(event.data)  # no copy: websockets' parser makes bytes
            if event.fin:
                self._message(opcode is _BINARY, data)
            else:
                self._fragments = [data]
                self._utf8 = None if opcode is _BINARY else Utf8Stream()
                self._fragment_utf8(data, False)
        elif opcode is _CONT:
            data = bytes(event.data)
            self._fragments.append(data)
            if self._fragment_utf8(data, event.fin) and event.fin:
                data = b"".join(self._fragments)
                self._fragments = []
                self._message(self._utf8 is None, data, checked=True)
        else:
            super().process_event(event)

    def _fragment_utf8(self, data: bytes, final: bool) -> bool:
        """Check a text fragment as it comes (a binary one passes), so the connection fails at
        the first fragment with a byte that cannot be UTF-8."""
        if self._utf8 is None or self._utf8.feed(data, final):
            return True
        self._fail_invalid_data()
        return False

    def _message(self, binary: bool, data: Any, checked: bool = False) -> None:
        if not (binary or checked or valid_utf8(data)):
            self._fail_invalid_data()
            return
        handle, lobby = self.handle, self._lobby
        if handle is None or lobby is None:
            self._early.append((binary, bytes(data)))
        else:
            lobby.received(handle, binary, data)

    def _fail_invalid_data(self) -> None:
        """A text message is not UTF-8: fail the connection with 1007 (RFC 6455 8.1), as
        websockets' own receive path does; the lobby hears of it in `_peer_closing`."""
        self._invalid = True
        self._fragments = []
        self.protocol.fail(CloseCode.INVALID_DATA, "invalid UTF-8 in a text message")
        self.send_data()
