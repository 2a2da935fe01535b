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


async def test_an_agent_stopped_mid_handler_and_started_again_handles_the_redelivery(
    lobby: LobbyServer,
) -> None:
    async with Agent("writer", lobby_url=lobby.url) as writer:
        worker = Worker(lobby.url)
        async with worker:
            await writer.send_text("worker", "slow 1")
            await writer.send_text("worker", "fast 2")
            await until(lambda: worker.finished == ["fast 2"], "message 2 to finish")
        # Stopped with "slow 1" cancelled mid-handler; the same object starts again.
        worker.release.set()
        async with worker:
            await until(lambda: "slow 1" in worker.finished, "the redelivery of message 1")
            await writer.send_text("worker", "fast 3")
            await until(lambda: "fast 3" in worker.finished, "message 3")
        # Run once, not twice (a duplicate is dropped), and everything acknowledged.
        assert [content for content, _ in worker.started] == [
            "slow 1",
            "fast 2",
            "slow 1",
            "fast 3",
        ]
        fresh = Worker(lobby.url)
        async with fresh:
            await writer.send_text("worker", "fast 4")
            await until(lambda: "fast 4" in fresh.finished, "message 4")
        assert fresh.started == [("fast 4", None)]
