"""The request/response throughput between two `agent_sdk.Agent` subclasses."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from agent_sdk import Agent, RequestContext, capability


class Echo(Agent):
    @capability("echo", description="Returns n.")
    async def echo(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return {"echo": request.get("n")}


async def throughput(url: str, seconds: float, window: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    done = 0
    async with (
        Echo(f"{tag}echo", lobby_url=url, max_concurrency=window * 2),
        Agent(f"{tag}caller", lobby_url=url) as caller,
    ):
        stop = time.monotonic() + seconds

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < stop:
                await caller.request(f"{tag}echo", "echo", {"n": done})
                done += 1

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(window)))
        elapsed = time.monotonic() - started
    return {"round_trips": done, "seconds": elapsed, "messages_per_s": 2 * done / elapsed}
