"""The baseline: a dumb relay on the same `websockets` version, compression off.

It speaks just enough of the protocol for the same load generator to drive it: the first frame
of a connection (its REGISTER) is answered with a canned REGISTER_ACK, and connections are
paired by arrival order (1st with 2nd, 3rd with 4th, ...). Every later frame is forwarded to
the partner as it came, without being parsed: no auth, no routing table, no store. What it costs
per message is what the transport itself costs on this machine.

Run as `python -m benchmarks.relay PORT`.
"""

from __future__ import annotations

import asyncio
import sys

from websockets.asyncio.server import ServerConnection, broadcast, serve

ACK = (
    b'{"sender_id":"global_lobby","receiver_id":"x","message_type":"REGISTER_ACK",'
    b'"payload":{"status":"success_registered_finalized","lobby_id":"global_lobby",'
    b'"auth_token":"00000000-0000-4000-8000-000000000000"}}'
)


class Relay:
    def __init__(self) -> None:
        self.waiting: ServerConnection | None = None
        self.partner: dict[ServerConnection, ServerConnection] = {}
        self.paired: dict[ServerConnection, asyncio.Event] = {}

    async def handle(self, ws: ServerConnection) -> None:
        ready = self.paired[ws] = asyncio.Event()
        if self.waiting is None:
            self.waiting = ws
        else:
            other, self.waiting = self.waiting, None
            self.partner[ws], self.partner[other] = other, ws
            ready.set()
            self.paired[other].set()
        try:
            await ws.recv()  # REGISTER
            await ws.send(ACK, text=True)
            await ready.wait()
            partner = [self.partner[ws]]
            async for frame in ws:
                broadcast(partner, frame)
        finally:
            self.partner.pop(ws, None)
            self.paired.pop(ws, None)
            if self.waiting is ws:
                self.waiting = None


async def main(port: int) -> None:
    relay = Relay()
    async with serve(relay.handle, "127.0.0.1", port, compression=None, max_size=None):
        await asyncio.Future()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main(int(sys.argv[1])))
    except ImportError:
        asyncio.run(main(int(sys.argv[1])))
