"""A ticker on one lobby node sends numbered TEXTs to a tally on another; kill a node while
it runs and watch its agent resume on the other, with every tick counted once, in order.

    .venv/bin/python -m examples.failover.run \\
        --lobby-url ws://127.0.0.1:8765/,ws://127.0.0.1:8766/ --seconds 30

The ticker starts on the first node, the tally on the second; each has both addresses and
moves to the other when its node is gone (docs/cluster.md: a killed node's agents resume on a
survivor within about 5 s). Ends with "received N of N ticks, each once, in order", or exits 1
saying what is missing. With one address, both agents share one lobby.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
import uuid
from typing import Any

from agent_sdk import Agent, Message
from examples import spread
from lobby.options import positive_seconds

SETTLE = 60.0
"""Seconds the tally may take, after the last tick, to have them all (a failover takes ~5)."""


class Tally(Agent):
    """Counts the ticks of one run (`run_id`), checking that each comes once and in order."""

    agent_id = "tally"

    def __init__(self, run_id: str, **options: Any) -> None:
        super().__init__(**options)
        self.run_id = run_id
        self.ticks: list[int] = []
        self.out_of_order = 0
        self.connections = 0
        self.changed = asyncio.Event()

    async def on_connected(self) -> None:
        self.connections += 1
        if self.connections > 1:
            print(f"tally: resumed (connection {self.connections}), {len(self.ticks)} ticks so far")

    async def on_disconnected(self) -> None:
        print(f"tally: connection lost after {len(self.ticks)} ticks")

    async def on_text(self, message: Message, content: str) -> None:
        run_id, _, number = content.partition(" ")
        if run_id != self.run_id:
            return  # a tick of an earlier run, held for this agent while it was away
        if self.ticks and int(number) != self.ticks[-1] + 1:
            self.out_of_order += 1
        self.ticks.append(int(number))
        self.changed.set()


class Ticker(Agent):
    agent_id = "ticker"

    async def on_connected(self) -> None:
        print("ticker: connected")

    async def on_disconnected(self) -> None:
        print("ticker: connection lost")


async def main(lobby_url: str, seconds: float, rate: float = 10.0) -> bool:
    """Tick for `seconds` at `rate` ticks a second; True when the tally got every tick once,
    in order."""
    run_id = uuid.uuid4().hex[:8]
    total = int(seconds * rate)
    tally = Tally(run_id, lobby_url=spread(lobby_url, 1))
    async with tally, Ticker(lobby_url=spread(lobby_url, 0)) as ticker:
        started = time.monotonic()
        for n in range(total):
            await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
            await ticker.send_text("tally", f"{run_id} {n}")
            if n % int(rate) == 0:
                print(f"sent {n}, tally has {len(tally.ticks)}", flush=True)
        deadline = time.monotonic() + SETTLE
        while len(tally.ticks) < total and time.monotonic() < deadline:
            tally.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tally.changed.wait(), deadline - time.monotonic())
    ticks = tally.ticks
    exact = ticks == list(range(total))
    if exact:
        print(f"received {total} of {total} ticks, each once, in order")
    else:
        missing = sorted(set(range(total)) - set(ticks))
        repeated = len(ticks) - len(set(ticks))
        print(
            f"received {len(ticks)} of {total} ticks: {len(missing)} missing "
            f"(first {missing[:5]}), {repeated} repeated, {tally.out_of_order} out of order"
        )
    return exact


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lobby-url", default=os.environ.get("LOBBY_URL", "ws://127.0.0.1:8765/"))
    parser.add_argument("--seconds", type=positive_seconds, default=30.0, help="how long to tick")
    options = parser.parse_args()
    sys.exit(0 if asyncio.run(main(options.lobby_url, options.seconds)) else 1)
