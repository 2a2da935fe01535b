"""The SDK's side of the delivery promise against a real lobby: it acknowledges a message only
once every message before it is done, so a message still being handled when the agent goes
away comes again when it is back, even if a later one finished first."""

from __future__ import annotations

import asyncio
from typing import Any

from agent_sdk import Agent, Message
from lobby.server import LobbyServer
from tests.waiting import until


class Worker(Agent):
    """Handles TEXTs; "slow" ones wait for `release`. Records what it started, in order."""

    agent_id = "worker"

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(lobby_url=url, **kwargs)
        self.release = asyncio.Event()
        self.started: list[tuple[str, bool | None]] = []
        self.finished: list[str] = []

    async def on_text(self, message: Message, content: str) -> None:
        self.started.append((content, message.redelivered))
        if content.startswith("slow"):
            await self.release.wait()
        self.finished.append(content)


async def test_a_message_still_being_handled_comes_again_after_a_later_one_finished(
    lobby: LobbyServer,
) -> None:
    async with Agent("writer", lobby_url=lobby.url) as writer:
        first = Worker(lobby.url)
        async with first:
            await writer.send_text("worker", "slow 1")
            await writer.send_text("worker", "fast 2")
            await until(lambda: first.finished == ["fast 2"], "message 2 to finish")
            assert [content for content, _ in first.started] == ["slow 1", "fast 2"]
        # Gone (its last ACK sent) with message 1 unfinished, as in a crash; back with its token.
        again = Worker(lobby.url)
        again.release.set()
        async with again:
            await writer.send_text("worker", "fast 3")
            await until(lambda: "fast 3" in again.finished, "message 3")
            assert again.stats.resumes == 1
            assert again.started == [("slow 1", True), ("fast 2", True), ("fast 3", None)]
