"""An agent's WebSocket frames, read and written here rather than by websockets where that is
the hot path (with `agent_sdk.connection`, the only SDK modules that import websockets).

`AgentConnection` is websockets' client connection handing each whole, final text frame to
`on_frame` as it comes, inside `data_received`: not through websockets' parser (a generator,
a `Frame` object per frame), its receive queue and the reading task (a future and a task switch
per read). Once the handshake is done and websockets' parser waits at a frame boundary, frames
are parsed here; any frame not handed over (a control frame, a fragment, a binary or masked
one, one over `max_size`, or any data frame while `on_frame` is unset or one of those is
queued) goes to websockets whole, so its parser stays at a boundary and it answers, assembles,
queues or fails it as before, and messages reach the reader in order. `text_frames` frames
what an agent sends. Both apply only without extensions (the SDK connects with
`compression=None`).
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from secrets import token_bytes
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.frames import Frame, Opcode
from websockets.protocol import Event, State

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - websockets built without its C extension
    from websockets.utils import apply_mask

_OPEN = State.OPEN
_TEXT = Opcode.TEXT
_DATA = (Opcode.TEXT, Opcode.BINARY, Opcode.CONT)
_U16 = struct.Struct("!H").unpack_from
_U64 = struct.Struct("!Q").unpack_from

# Headers of a final, masked text frame, by payload length (RFC 6455 5.2).
_SHORT = tuple(bytes((0x81, 0x80 | n)) for n in range(126))
_MEDIUM = struct.Struct("!BBH").pack
_LONG = struct.Struct("!BBQ").pack


class AgentConnection(ClientConnection):
    """See the module docstring. The bytes of a text frame go to `on_frame` as they are:
    `protocol.codec.decode` (orjson) refuses what is not UTF-8."""

    on_frame: Callable[[bytes], None] | None = None
    _direct = False
    """Frames are parsed here (websockets' parser waits at a frame boundary)."""
    _assembling = False
    """A fragmented message is being queued: its remaining frames go to the queue too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending = bytearray()
        """The start of a frame not yet whole, while `_direct`."""

    def data_received(self, data: bytes) -> None:
        if self._direct and self.protocol.state is not _OPEN:
            # Closing: websockets reads on from the frame boundary where parsing here stopped.
            self._direct = False
            data, self._pending = bytes(self._pending) + data, bytearray()
        if self._direct or self._parser_waits_for_frame():
            self._read_frames(data)
        else:
            super().data_received(data)

    def _parser_waits_for_frame(self) -> bool:
        """websockets' parser is between frames with nothing buffered (it may hold the start
        of a frame that came with the handshake): from here on frames may be parsed here."""
        protocol = self.protocol
        if protocol.state is not _OPEN or protocol.reader.buffer or protocol.extensions:
            return False
        parser: Any = protocol.parser
        while parser.gi_yieldfrom is not None:
            parser = parser.gi_yieldfrom
        self._direct = parser.gi_code.co_name == "at_eof"
        return self._direct

    def _read_frames(self, data: bytes) -> None:
        """Hand over the whole text frames in what has come, give websockets the others, and
        keep the start of an unfinished frame for the next read."""
        buf: bytes | bytearray = data
        if self._pending:
            self._pending += data
            buf = self._pending
        protocol = self.protocol
        limit = protocol.max_message_size
        if limit is None or protocol.max_fragment_size is not None:
            limit = min(limit or sys.maxsize, protocol.max_fragment_size or sys.maxsize)
        queued = self.recv_messages.frames
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
            stop = at + 4 + length if head2 & 0x80 else at + length
            if stop > end:
                break
            on_frame = self.on_frame
            if (
                head1 == 0x81
                and not head2 & 0x80
                and on_frame is not None
                and not self._assembling
                and not len(queued)
            ):
                on_frame(bytes(buf[at:stop]))
            else:  # websockets gets it whole (`process_event` below may still hand it over)
                super().data_received(bytes(buf[i:stop]))
            i = stop
            if protocol.state is not _OPEN:  # closing, or failed: websockets reads the rest
                self._direct = False
                if i < end:
                    super().data_received(bytes(buf[i:]))
                i = end
                break
        if buf is self._pending:
            del self._pending[:i]
        elif i < end:
            self._pending = bytearray(buf[i:])

    def process_event(self, event: Event) -> None:
        """What websockets parsed: a whole text frame goes to `on_frame` as above."""
        on_frame = self.on_frame
        if (
            on_frame is not None
            and type(event) is Frame
            and event.opcode is _TEXT
            and event.fin
            and not self._assembling
            and not len(self.recv_messages.frames)
        ):
            on_frame(bytes(event.data))  # no copy: websockets' parser makes bytes
            return
        if type(event) is Frame and event.opcode in _DATA:
            self._assembling = not event.fin
        super().process_event(event)


def text_frames(messages: list[bytes]) -> bytes:
    """`messages` as final, masked text frames (RFC 6455 5.2, as a client sends them without
    extensions), ready to write: websockets' `Frame` objects and their serialization cost
    several times as much per frame. Each has its own random masking key."""
    keys = token_bytes(4 * len(messages))
    parts: list[bytes] = []
    append = parts.append
    for at, data in enumerate(messages):
        n = len(data)
        if n < 126:
            append(_SHORT[n])
        elif n < 65536:
            append(_MEDIUM(0x81, 0xFE, n))
        else:
            append(_LONG(0x81, 0xFF, n))
        key = keys[4 * at : 4 * at + 4]
        append(key)
        append(apply_mask(data, key))
    return b"".join(parts)
