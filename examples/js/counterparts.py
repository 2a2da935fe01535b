"""The SDK agents the Node.js agent (agent.mjs) works with, over a real lobby:

- `doubler` serves `double` (one `in_progress` update, then the result): the JS agent calls it;
- `js_caller` finds the JS agent's `reverse` capability and calls it;
- `s` sells in a FIPA haggle (asks 20, then 15: examples/fipa_haggle): the JS agent buys.

    .venv/bin/python -m examples.js.counterparts [--lobby-url ws://127.0.0.1:8765/]

then, in another terminal, `node examples/js/agent.mjs` (see examples/js/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from pydantic import BaseModel

from agent_sdk import Agent, RequestContext, ServiceRecord, capability
from examples.fipa_haggle.run import Seller

JS_AGENT = "js_agent"
REVERSE = "reverse"


class DoubleRequest(BaseModel):
    n: int


class DoubleReply(BaseModel):
    n: int


class Doubler(Agent):
    agent_id = "doubler"

    @capability("double", description="Doubles n.", keywords=["math"])
    async def double(self, request: DoubleRequest, ctx: RequestContext) -> DoubleReply:
        await ctx.progress({"working_on": request.n})
        return DoubleReply(n=2 * request.n)


async def find_js_agent(caller: Agent, *, timeout: float = 30.0) -> ServiceRecord:
    """Wait until the JS agent offers `reverse`, and return its service record."""
    async with asyncio.timeout(timeout):
        while True:
            for service in await caller.discover(REVERSE):
                if service.agent_id == JS_AGENT and service.online:
                    return service
            await asyncio.sleep(0.05)


async def call_js_agent(caller: Agent, text: str) -> dict[str, Any]:
    """Call the JS agent's `reverse` once it is there; return its success payload."""
    await find_js_agent(caller)
    result: dict[str, Any] = await caller.request(JS_AGENT, REVERSE, {"text": text}, timeout=10)
    return result


async def main(lobby_url: str) -> None:
    async with (
        Doubler(lobby_url=lobby_url) as doubler,
        Seller(lobby_url=lobby_url) as seller,
        Agent("js_caller", lobby_url=lobby_url) as caller,
    ):
        print("doubler, s and js_caller are registered; start `node examples/js/agent.mjs`")
        try:
            print(f"js_caller called reverse: {await call_js_agent(caller, 'hello lobby')}")
            sold = await seller.confirmed
            print(f"s sold {sold['goods']} to {sold['buyer']} at {sold['amount']}")
        finally:
            # Leave for good, so that the next run can register these ids again.
            for agent in (doubler, seller, caller):
                await agent.unregister()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lobby-url", default=os.environ.get("LOBBY_URL", "ws://127.0.0.1:8765/"))
    asyncio.run(main(parser.parse_args().lobby_url))
