"""What RFC 6455 asks a receiver to check that the transports' libraries leave to their user:
a text message is UTF-8 (8.1: else close 1007), a close frame's code is one a peer may send
(7.4: else 1002); and `lone_close_frame`, how the websockets transport tells a peer's answer
to the lobby's 1001 without parsing it. Pure functions; the socket transports use them.

Most of the lobby's traffic is ASCII JSON, for which `bytes.isascii` settles the UTF-8 check
at memory speed; only other text is decoded (docs/conformance.md has the cost measured).
"""

from __future__ import annotations

import codecs
from typing import Final

_SENDABLE_BELOW_3000: Final = frozenset(
    {1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014}
)
"""RFC 6455's, and 1012-1014, registered with IANA since (the lobby sends 1012 and 1013)."""


def valid_utf8(data: bytes) -> bool:
    """Whether a whole text message is UTF-8."""
    if data.isascii():
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


class Utf8Stream:
    """Checks a fragmented text message one fragment at a time, so a bad byte fails it at the
    fragment that brings it; a sequence cut by a fragment boundary waits for its end."""

    __slots__ = ("_decoder",)

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")()

    def feed(self, data: bytes, final: bool) -> bool:
        """Whether the message is UTF-8 so far (`final`: and complete)."""
        try:
            self._decoder.decode(data, final)
        except UnicodeDecodeError:
            return False
        return True


def sendable_close_code(code: int) -> bool:
    """Whether a peer may put `code` in a close frame (RFC 6455 7.4.1-7.4.2): not 1005, 1006,
    1015 (reserved for reporting), not an unassigned code below 3000, nor one past 4999."""
    return code in _SENDABLE_BELOW_3000 or 3000 <= code <= 4999


def lone_close_frame(data: bytes) -> bool:
    """Whether `data` is one masked close frame and nothing else: a client's answer to the
    server's close frame as it nearly always comes (5.5.1: a payload within 125 bytes)."""
    return len(data) >= 6 and data[0] == 0x88 and len(data) == 6 + (data[1] & 0x7F)


__all__ = ["Utf8Stream", "lone_close_frame", "sendable_close_code", "valid_utf8"]
