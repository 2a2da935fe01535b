"""Transports: the connections the lobby serves, behind the interfaces of `base` (a leaf that
imports nothing of the server). `websockets` is the default, `picows` the optional one in C
(`--transport picows`); `lobby.server` imports them by name, so neither is loaded unless used.
`memory` serves clients within the process, without sockets (tests, embedding).
Its errors (`MemoryTransportError` and its tree) are drawn in `memory`'s docstring; the
socket transports raise their libraries' own.
"""

from lobby.transport.base import Link, Lobby, Transport, tls_context
from lobby.transport.memory import (
    ConnectionClosed,
    MemoryClient,
    MemoryTransport,
    MemoryTransportError,
    Refused,
)

__all__ = [
    "ConnectionClosed",
    "Link",
    "Lobby",
    "MemoryClient",
    "MemoryTransport",
    "MemoryTransportError",
    "Refused",
    "Transport",
    "tls_context",
]
