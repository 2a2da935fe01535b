"""Request/response throughput between two `agent_sdk.Agent` subclasses: one caller keeping
`window` calls outstanding (one asyncio task per slot, each awaiting `Agent.request()` in a
loop) and one `Echo` agent serving them. Measured like `load.throughput` (warm-up, then a
window timed inside this process, the server's CPU read from /proc), so the two compare."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import structlog

from agent_sdk import Agent, RequestContext, capability
from benchmarks.load import Snapshot


class Echo(Agent):
    @capability("echo", description="Returns n.")
    async def echo(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return {"echo": request.get("n"), "item": request.get("item")}


async def throughput(
    url: str, server_pid: int, seconds: float, window: int, warmup: float = 0.3
) -> dict[str, Any]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    tag = uuid.uuid4().hex[:6]
    round_trips = 0
    options: dict[str, Any] = {"reconnect": False, "token_store": None}  # fresh ids: keep no files
    async with (
        Echo(f"{tag}echo", lobby_url=url, max_concurrency=window * 2, **options),
        Agent(f"{tag}caller", lobby_url=url, **options) as caller,
    ):

        async def worker() -> None:
            nonlocal round_trips
            while True:
                payload = {"n": round_trips, "item": "Bose QuietComfort 45"}
                await caller.request(f"{tag}echo", "echo", payload)
                round_trips += 1

        tasks = [asyncio.create_task(worker()) for _ in range(window)]
        await asyncio.sleep(warmup)
        start = Snapshot(server_pid, 2 * round_trips)
        await asyncio.sleep(seconds)
        end = Snapshot(server_pid, 2 * round_trips)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return end.since(start)
