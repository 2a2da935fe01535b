"""Waiting for a condition, never for a while: a test waits until the state it needs holds,
checking often, with a generous bound that only stops a hang (it never decides a pass: a
test that needs "nothing else arrived" sends a message behind and waits for that instead).
Durations are measured in `make bench`, not asserted here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

BOUND = 30.0
"""Seconds before a wait gives up: far beyond what any condition here needs, even on a
loaded machine."""

_POLL = 0.01


async def until(condition: Callable[[], object], what: str = "", limit: float = BOUND) -> None:
    """Return once `condition()` is true; fail (naming `what`) if it is not within `limit`."""
    try:
        async with asyncio.timeout(limit):
            while not condition():
                await asyncio.sleep(_POLL)
    except TimeoutError:
        raise AssertionError(f"gave up waiting for {what or condition}") from None


def wait_until(condition: Callable[[], object], what: str = "", limit: float = BOUND) -> None:
    """`until` for a test without an event loop (a child process, a file being written)."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what or condition}")
        time.sleep(_POLL)
