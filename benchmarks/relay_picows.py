"""The same dumb relay as `benchmarks.relay`, on picows: the limit of that transport on this
machine, the baseline for the lobby's picows transport (`python -m benchmarks.relay_picows
PORT`). The first frame of a connection (its REGISTER) gets the canned REGISTER_ACK;
connections are paired by arrival order; every later frame goes to the partner unparsed."""

from __future__ import annotations

import asyncio
import sys

from picows import WSFrame, WSListener, WSMsgType, WSTransport, WSUpgradeRequest, ws_create_server

from benchmarks.relay import ACK


class RelayLink(WSListener):
    waiting: RelayLink | None = None

    def __init__(self) -> None:
        self.transport: WSTransport | None = None
        self.partner: RelayLink | None = None
        self.registered = False

    def on_ws_connected(self, transport: WSTransport) -> None:
        self.transport = transport
        if RelayLink.waiting is None:
            RelayLink.waiting = self
        else:
            other, RelayLink.waiting = RelayLink.waiting, None
            self.partner, other.partner = other, self

    def on_ws_disconnected(self, transport: WSTransport) -> None:
        if RelayLink.waiting is self:
            RelayLink.waiting = None
        if self.partner is not None:
            self.partner.partner = None

    def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
        msg_type = frame.msg_type
        if msg_type is WSMsgType.CLOSE:
            transport.send_close(frame.get_close_code())
            transport.disconnect()
        elif msg_type is WSMsgType.TEXT or msg_type is WSMsgType.BINARY:
            if not self.registered:
                self.registered = True
                transport.send(WSMsgType.TEXT, ACK)
            elif self.partner is not None and self.partner.transport is not None:
                self.partner.transport.send(msg_type, frame.get_payload_as_bytes())


async def main(port: int) -> None:
    def listener(request: WSUpgradeRequest) -> RelayLink:
        return RelayLink()

    server = await ws_create_server(listener, "127.0.0.1", port, max_frame_size=2**30)
    async with server:
        await asyncio.Future()


if __name__ == "__main__":
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        asyncio.run(main(int(sys.argv[1])))
    else:
        uvloop.run(main(int(sys.argv[1])))
