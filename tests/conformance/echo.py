"""The echo servers Autobahn's fuzzing client is pointed at (`python -m tests.conformance.echo
SERVER PORT`): a lobby transport (websockets, picows) driven by `EchoLobby`, or a plain
websockets server, the control.

`EchoLobby` is the smallest `Lobby` a transport can serve: it accepts every connection and
sends each text message back through `Link.put` and `flush`, the lobby's own write path, so
what is under test is the transport's framing, parsing and closing, not the router. The
lobby never sends binary messages, so `Link` has no way to: a binary message is echoed through
the transport's own library (websockets' protocol, picows' `send`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from contextlib import suppress
from typing import Final

from picows import WSMsgType
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from lobby.config import Settings
from lobby.core.session import Session
from lobby.transport.base import HttpAnswer, Link, Transport, TransportSettings
from lobby.transport.picows import PicowsLink, PicowsTransport
from lobby.transport.websockets import LobbyConnection
from lobby.transport.websockets_server import WebsocketsTransport

MAX_MESSAGE_BYTES: Final = 1 << 24
"""Autobahn's largest messages (cases 9.x) are 16 MiB; every server gets the same limit."""

SERVERS: Final = ("websockets", "picows", "control")


class EchoLobby:
    """A `Lobby` that sends every message back to its sender."""

    def __init__(self, settings: TransportSettings) -> None:
        self._settings = settings
        self._unflushed: set[Link] = set()

    @property
    def transport_settings(self) -> TransportSettings:
        return self._settings

    @property
    def identity(self) -> str:
        return "conformance-echo"

    def admit(self, path: str, authorization: str | None = None) -> HttpAnswer | None:
        return None

    def connected(self, link: Link, host: str, path: str = "/") -> Session:
        return Session(link.remote, link, host)

    def received(self, session: Session, binary: bool, data: bytes) -> None:
        link = session.link
        if binary:
            if isinstance(link, LobbyConnection):
                link.protocol.send_binary(bytes(data))
                link.send_data()
            elif isinstance(link, PicowsLink):
                link.flush()  # the texts before it go first
                transport = link._transport
                assert transport is not None
                transport.send(WSMsgType.BINARY, bytes(data))
        else:
            assert isinstance(link, LobbyConnection | PicowsLink)
            if link.put(bytes(data)):
                self._unflushed.add(link)

    def end_of_batch(self) -> None:
        unflushed, self._unflushed = self._unflushed, set()
        for link in unflushed:
            link.flush()

    def drained(self, session: Session) -> None:
        pass  # nothing is held back: every echo is written at once

    def closing(self, session: Session, code: int | None) -> None:
        pass

    def disconnected(self, session: Session, code: int | None = None) -> None:
        pass


async def _echo(ws: ServerConnection) -> None:
    with suppress(ConnectionClosed):  # the fuzzing client breaks connections on purpose
        async for message in ws:
            await ws.send(message)


async def main(server: str, port: int) -> None:
    stop = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set_result, None)
    if server == "control":
        async with serve(_echo, "127.0.0.1", port, compression=None, max_size=MAX_MESSAGE_BYTES):
            await stop
        return
    settings = Settings(host="127.0.0.1", port=port, max_message_bytes=MAX_MESSAGE_BYTES)
    transport: Transport = WebsocketsTransport() if server == "websockets" else PicowsTransport()
    await transport.start(EchoLobby(settings.for_transport()))
    try:
        await stop
    finally:
        await transport.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("server", choices=SERVERS)
    parser.add_argument("port", type=int)
    args = parser.parse_args()
    # Every case breaks a rule on purpose: the libraries' log of each is noise here.
    logging.basicConfig(level=logging.CRITICAL)
    asyncio.run(main(args.server, args.port))
