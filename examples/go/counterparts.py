"""The SDK agents the Go agent (examples/go) works with, over a real lobby:

- `doubler` serves `double` (one `in_progress` update, then the result): the Go agent calls it;
- `go_caller` finds the Go agent's `reverse` capability and calls it.

    .venv/bin/python -m examples.go.counterparts [--lobby-url ws://127.0.0.1:8765/]

then, in another terminal, `cd examples/go && go run .` (see examples/go/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from agent_sdk import Agent
from examples.js.counterparts import Doubler

GO_AGENT = "go_agent"


async def call_go_agent(caller: Agent, text: str, *, timeout: float = 30.0) -> dict[str, Any]:
    """Wait until the Go agent offers `reverse`, then call it; its success payload."""
    async with asyncio.timeout(timeout):
        while True:
            services = await caller.discover("reverse")
            if any(s.agent_id == GO_AGENT and s.online for s in services):
                break
            await asyncio.sleep(0.05)  # a lobby announces no registrations: ask again
    result: dict[str, Any] = await caller.request(GO_AGENT, "reverse", {"text": text}, timeout=10)
    return result


async def main(lobby_url: str) -> None:
    async with (
        Doubler(lobby_url=lobby_url) as doubler,
        Agent("go_caller", lobby_url=lobby_url) as caller,
    ):
        print("doubler and go_caller are registered; start `go run .` in examples/go")
        try:
            print(f"go_caller called reverse: {await call_go_agent(caller, 'hello lobby')}")
        finally:
            # Leave for good, so that the next run can register these ids again.
            for agent in (doubler, caller):
                await agent.unregister()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lobby-url", default=os.environ.get("LOBBY_URL", "ws://127.0.0.1:8765/"))
    asyncio.run(main(parser.parse_args().lobby_url))
