"""agent_sdk/serving.py against a real lobby: a capability's `timeout` bounds its handler; one
without a timeout runs as long as it needs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_sdk import (
    Agent,
    RemoteTimeoutError,
    RequestContext,
    RequestTimeoutError,
    capability,
)
from lobby.server import LobbyServer


class Slow(Agent):
    agent_id = "slow"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.release = asyncio.Event()

    @capability("bounded", timeout=0.2)
    async def bounded(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        await self.release.wait()
        return {"done": True}

    @capability("unbounded")
    async def unbounded(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        await self.release.wait()
        return {"done": True}


async def test_a_capability_past_its_timeout_answers_timeout_and_one_without_waits(
    lobby: LobbyServer,
) -> None:
    async with Slow(lobby_url=lobby.url) as slow, Agent("caller", lobby_url=lobby.url) as me:
        with pytest.raises(RemoteTimeoutError) as caught:
            await me.request("slow", "bounded", {}, timeout=10)
        assert isinstance(caught.value, RequestTimeoutError)
        assert caught.value.code == "timeout"
        assert "did not finish in 0.2 s" in caught.value.message
        waiting = asyncio.create_task(me.request("slow", "unbounded", {}, timeout=10))
        await asyncio.sleep(0.5)  # longer than the other capability's timeout
        slow.release.set()
        assert await waiting == {"done": True}
