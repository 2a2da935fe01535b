"""agent_sdk/tasks.py: handler tasks bounded and tracked (an event loop, no socket)."""

from __future__ import annotations

import asyncio

from agent_sdk.stats import AgentStats
from agent_sdk.tasks import Handlers
from tests.sdklogs import sdk_events
from tests.waiting import until


async def test_handlers_fill_their_slots_then_the_backlog_then_refuse() -> None:
    handlers = Handlers("me", AgentStats(), max_concurrency=1, backlog=1)
    release = asyncio.Event()
    running: list[int] = []
    ended: list[int] = []

    async def work(n: int) -> None:
        running.append(n)
        await release.wait()

    handlers.run(work(1), lambda: ended.append(1))
    assert not handlers.full
    handlers.run(work(2), lambda: ended.append(2))
    assert handlers.full
    await asyncio.sleep(0.01)
    assert running == [1]  # the second waits for the one slot
    release.set()
    while len(ended) < 2:
        await asyncio.sleep(0.01)
    assert running == [1, 2]
    assert not handlers.full


async def test_a_failing_handler_is_counted_and_logged_and_still_ends() -> None:
    stats = AgentStats()
    handlers = Handlers("me", stats, max_concurrency=2, backlog=0)
    ended = asyncio.Event()

    async def fail() -> None:
        raise RuntimeError("boom")

    with sdk_events() as logs:
        handlers.run(fail(), ended.set)
        await asyncio.wait_for(ended.wait(), 5)
    assert stats.handler_errors == 1
    assert [e["event"] for e in logs] == ["CALLBACK_FAILED"]


async def test_cancel_all_ends_every_task_and_a_cancelled_handler_does_not_end() -> None:
    handlers = Handlers("me", AgentStats(), max_concurrency=1, backlog=5)
    ended: list[str] = []
    forever = asyncio.Event()

    async def hang() -> None:
        await forever.wait()

    handlers.run(hang(), lambda: ended.append("handler"))
    handlers.spawn(hang())
    await asyncio.sleep(0.01)
    await handlers.cancel_all()
    assert ended == []
    assert not handlers.full


async def test_every_failure_is_counted_and_logged_with_the_agent() -> None:
    stats = AgentStats()
    handlers = Handlers("me", stats, max_concurrency=2, backlog=0)
    ended: list[int] = []

    async def fail() -> None:
        raise RuntimeError("boom")

    with sdk_events() as logs:
        handlers.run(fail(), ended.append, 1)
        handlers.run(fail(), ended.append, 2)
        await until(lambda: len(ended) == 2)
    assert stats.handler_errors == 2
    assert [(e["event"], e["agent_id"]) for e in logs] == [("CALLBACK_FAILED", "me")] * 2


async def test_a_cancelled_handler_calls_its_cancelled_callback_with_its_arguments() -> None:
    handlers = Handlers("me", AgentStats(), max_concurrency=1, backlog=1)
    abandoned: list[str] = []
    running: list[str] = []
    forever = asyncio.Event()

    async def hang(name: str) -> None:
        running.append(name)
        await forever.wait()

    handlers.run(hang("running"), lambda _: None, "running", cancelled=abandoned.append)
    handlers.run(hang("waiting"), lambda _: None, "waiting", cancelled=abandoned.append)
    await until(lambda: running == ["running"])  # the other started after it, to wait for a slot
    await handlers.cancel_all()
    assert sorted(abandoned) == ["running", "waiting"]


async def test_a_finished_task_leaves_room_for_the_next() -> None:
    handlers = Handlers("me", AgentStats(), max_concurrency=1, backlog=0)
    done = asyncio.Event()

    async def quick() -> None:
        done.set()

    handlers.spawn(quick())
    assert handlers.full
    await done.wait()
    await until(lambda: not handlers.full)
