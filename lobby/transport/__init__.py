"""Transports: the connections the lobby serves, behind the interfaces of `base` (a leaf that
imports nothing of the server). `websockets` is the default, `picows` the optional one in C
(`--transport picows`); `lobby.server` imports them by name, so neither is loaded unless used.
`memory` serves clients within the process, without sockets (tests, embedding):
`from lobby.transport.memory import MemoryTransport`.
"""

from lobby.transport.base import Link, Lobby, Transport, TransportSettings, tls_context

__all__ = ["Link", "Lobby", "Transport", "TransportSettings", "tls_context"]
