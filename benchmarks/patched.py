"""The lobby with an experimental change applied at run time, to measure a change before it is
made in lobby/: `python -m benchmarks.patched PATCH[,PATCH...] serve --port ...` (the rest of
the arguments are `lobby`'s own). `benchmarks.experiments` runs these next to the plain lobby.

Patches:
- `coalesce`: writes are gathered per connection and flushed once per event-loop iteration
  (one `transport.write` of everything framed for it meanwhile) instead of one `write()`
  syscall per message. The outbound bound (4002 past `max_outbound_bytes`) is kept.
- `gc`: `gc.freeze()` once the lobby is up and a young-generation threshold of 20,000
  allocations instead of 700, so the collector runs (and walks young objects) less often.
- `none`: nothing (the plain lobby, started the same way).
"""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Callable

from websockets.asyncio.server import ServerConnection
from websockets.protocol import State

from lobby import server as lobby_server
from lobby.cli import main as lobby_main
from lobby.core.session import Session
from protocol.models import CloseCode

_OPEN = State.OPEN


def coalesce() -> None:
    cls = lobby_server.LobbyServer
    pending: dict[ServerConnection, Session] = {}

    def flush(self: lobby_server.LobbyServer) -> None:
        batch = dict(pending)
        pending.clear()
        limit = self.settings.max_outbound_bytes
        for ws, session in batch.items():
            if ws.protocol.state is not _OPEN:
                continue
            # (Once it is closing, websockets' own close writes whatever is still framed.)
            ws.transport.write(b"".join(ws.protocol.data_to_send()))
            if ws.transport.get_write_buffer_size() > limit:
                self._execute(self.router.close(session))
                self._close(ws, CloseCode.TOO_SLOW, "too slow: outbound queue overflowed")

    def send(self: lobby_server.LobbyServer, session: Session, frame: bytes) -> None:
        ws: ServerConnection = session.link  # type: ignore[assignment]
        protocol = ws.protocol
        if protocol.state is not _OPEN:
            return
        try:
            protocol.send_text(frame)
        except Exception:
            return
        if not pending:
            asyncio.get_running_loop().call_soon(flush, self)
        pending[ws] = session

    cls._send = send  # type: ignore[method-assign]


def tune_gc() -> None:
    cls = lobby_server.LobbyServer
    start = cls.start

    async def started(self: lobby_server.LobbyServer) -> None:
        await start(self)
        gc.freeze()
        gc.set_threshold(20_000, 10, 10)

    cls.start = started  # type: ignore[method-assign]


PATCHES: dict[str, Callable[[], None]] = {"coalesce": coalesce, "gc": tune_gc, "none": lambda: None}


def main(argv: list[str]) -> int:
    for name in argv[0].split(","):
        PATCHES[name]()
    return lobby_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
