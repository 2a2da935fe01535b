"""The lobby with an experimental change applied at run time, to measure a change before it is
made in lobby/: `python -m benchmarks.patched PATCH[,PATCH...] serve --port ...` (the rest of
the arguments are `lobby`'s own). `benchmarks.experiments` runs these next to the plain lobby.

Patches:
- `switch`: the interpreter's thread switch interval at 0.5 ms instead of 5 ms, so the store's
  writer thread waits less for the GIL while the event loop is busy.
- `gc`: `gc.freeze()` once the lobby is up and a young-generation threshold of 20,000
  allocations instead of 700, so the collector runs (and walks young objects) less often.
- `none`: nothing (the plain lobby, started the same way).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

from websockets.protocol import State

from lobby import server as lobby_server
from lobby.cli import main as lobby_main

_OPEN = State.OPEN


def tune_gc() -> None:
    cls = lobby_server.LobbyServer
    start = cls.start

    async def started(self: lobby_server.LobbyServer) -> None:
        await start(self)
        gc.freeze()
        gc.set_threshold(20_000, 10, 10)

    cls.start = started  # type: ignore[method-assign]


def short_switch() -> None:
    sys.setswitchinterval(0.0005)


PATCHES: dict[str, Callable[[], None]] = {
    "gc": tune_gc,
    "switch": short_switch,
    "none": lambda: None,
}


def main(argv: list[str]) -> int:
    for name in argv[0].split(","):
        PATCHES[name]()
    return lobby_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
