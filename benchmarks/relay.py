"""The baseline: a dumb relay on the same `websockets` version, compression off.

It speaks just enough of the protocol for the same load generator to drive it: the first frame
of a connection (its REGISTER) is answered with a canned REGISTER_ACK, and connections are
paired by arrival order (1st with 2nd, 3rd with 4th, ...; the load generators open a pair's two
connections one after the other). Every later frame is forwarded to the partner as it came,
without being parsed: no JSON, no auth, no routing table, no store. What it costs per message
is what the transport itself costs on this machine.

Run as `python -m benchmarks.relay PORT [--coalesce]`. With `--coalesce` (an experiment, see
`benchmarks.experiments`), frames are written to each connection once per event-loop
iteration instead of one `write()` per frame (still through websockets' receive queue and a
handler task): a reference for what that one of the lobby's transport changes is worth.
"""

from __future__ import annotations

import asyncio
import sys

from websockets.asyncio.server import ServerConnection, broadcast, serve
from websockets.protocol import State

ACK = (
    b'{"sender_id":"global_lobby","receiver_id":"x","message_type":"REGISTER_ACK",'
    b'"payload":{"status":"success_registered_finalized","lobby_id":"global_lobby",'
    b'"auth_token":"00000000-0000-4000-8000-000000000000"}}'
)


class Relay:
    def __init__(self, coalesce: bool = False) -> None:
        self.coalesce = coalesce
        self.waiting: ServerConnection | None = None
        self.partner: dict[ServerConnection, ServerConnection] = {}
        self.paired: dict[ServerConnection, asyncio.Event] = {}
        self.pending: set[ServerConnection] = set()

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
            partner = self.partner[ws]
            if self.coalesce:
                async for frame in ws:
                    self.forward(partner, frame)
            else:
                async for frame in ws:
                    broadcast([partner], frame)
        finally:
            self.partner.pop(ws, None)
            self.paired.pop(ws, None)
            if self.waiting is ws:
                self.waiting = None

    def forward(self, partner: ServerConnection, frame: str | bytes) -> None:
        if partner.protocol.state is not State.OPEN:
            return
        partner.protocol.send_text(frame.encode() if isinstance(frame, str) else frame)
        if not self.pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self.pending.add(partner)

    def flush(self) -> None:
        pending, self.pending = self.pending, set()
        for ws in pending:
            ws.transport.write(b"".join(ws.protocol.data_to_send()))


async def main(port: int, coalesce: bool) -> None:
    relay = Relay(coalesce)
    async with serve(relay.handle, "127.0.0.1", port, compression=None, max_size=None):
        await asyncio.Future()


if __name__ == "__main__":
    coro = main(int(sys.argv[1]), "--coalesce" in sys.argv[2:])
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        asyncio.run(coro)
    else:
        uvloop.run(coro)
