"""Transports: the connections the lobby serves, behind the interfaces of `base` (a leaf that
imports nothing of the server). `websockets` is the default, `picows` the optional one in C
(`--transport picows`); `named` imports the one asked for, so neither is loaded unless used.
`memory` serves clients within the process, without sockets (tests, embedding):
`from lobby.transport.memory import MemoryTransport`.
"""

from lobby.transport.base import Link, Lobby, Transport, TransportSettings, tls_context


def named(name: str) -> Transport:
    """A new transport of `--transport` `name` (websockets or picows)."""
    if name == "picows":
        from lobby.transport.picows import PicowsTransport  # an optional dependency

        return PicowsTransport()
    from lobby.transport.websockets_server import WebsocketsTransport

    return WebsocketsTransport()


__all__ = ["Link", "Lobby", "Transport", "TransportSettings", "named", "tls_context"]
