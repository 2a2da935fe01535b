"""`Handlers`: the tasks an agent runs for what it receives, bounded, and every one tracked."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from agent_sdk.logs import log
from agent_sdk.stats import AgentStats


class Handlers:
    """Owns every task the agent starts. Handler tasks (`run()`) hold one of `max_concurrency`
    slots while they work, with at most `backlog` more waiting for one (`full` says when no
    more fit); a handler that hangs holds only its own slot. Other tasks (`spawn()`: an ACK, a
    refusal) are only tracked. `cancel_all()` ends them all when the agent stops."""

    def __init__(self, agent_id: str, stats: AgentStats, *, max_concurrency: int, backlog: int):
        self.agent_id = agent_id
        self.stats = stats
        self._limit = max_concurrency + backlog
        self._slots = asyncio.Semaphore(max_concurrency)
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def full(self) -> bool:
        """True when another handler would exceed `max_concurrency` + `backlog`."""
        return len(self._tasks) >= self._limit

    @property
    def free(self) -> bool:
        """True when a handler would get a slot at once (`run()` would not wait)."""
        return not self._slots.locked()

    def run(
        self,
        work: Coroutine[Any, Any, None],
        then: Callable[..., None],
        *args: Any,
        cancelled: Callable[..., None] | None = None,
    ) -> None:
        """Run `work` in a slot, then `then(*args)` (even if it failed: a failure is counted
        in `stats.handler_errors` and logged, not retried); if it is cancelled instead (the
        agent stops), `cancelled(*args)`."""
        task = asyncio.create_task(self._in_slot(work, then, cancelled, args))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` as a tracked task, without a slot."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _in_slot(
        self,
        work: Coroutine[Any, Any, None],
        then: Callable[..., None],
        cancelled: Callable[..., None] | None,
        args: tuple[Any, ...],
    ) -> None:
        try:
            async with self._slots:
                await work
        except asyncio.CancelledError:
            work.close()  # cancelled while waiting for a slot: never started
            if cancelled is not None:
                cancelled(*args)
            raise
        except Exception:
            self.stats.handler_errors += 1
            log.exception("CALLBACK_FAILED", agent_id=self.agent_id)
        then(*args)

    async def cancel_all(self) -> None:
        """Cancel every task and wait for them to end."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
