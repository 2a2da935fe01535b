"""agent_sdk/serving.py's REQUESTs served as they are read: a capability whose handler never
awaits (`CapabilitySpec.immediate`, from `never_suspends`) answers as a task-served one does,
against a real lobby: its output, its `CapabilityError`, a failure, an input that does not fit,
and the context it runs in (a copy, as a task's)."""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from typing import Any

import pytest
from pydantic import BaseModel

from agent_sdk import (
    Agent,
    CapabilityError,
    InvalidInputError,
    RemoteError,
    RequestContext,
    capability,
)
from agent_sdk.capability import collect_capabilities, never_suspends
from lobby.server import LobbyServer

SEEN: ContextVar[str] = ContextVar("seen", default="unset")


class Note(BaseModel):
    text: str


class Noted(BaseModel):
    text: str
    before: str


def _task_name() -> str | None:
    """What the running task runs: `_in_slot` for a handler task (`agent_sdk.tasks`)."""
    task = asyncio.current_task()
    return None if task is None else task.get_coro().__name__  # type: ignore[union-attr]


class Now(Agent):
    agent_id = "now"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.ran_in: list[str | None] = []

    @capability("note")
    async def note(self, request: Note, ctx: RequestContext) -> Noted:
        self.ran_in.append(_task_name())
        before = SEEN.get()
        SEEN.set(request.text)  # in the handler's own context: the next one starts unset
        if request.text == "refuse":
            raise CapabilityError("not that one", code="out_of_stock")
        if request.text == "break":
            raise ValueError("a bug")
        if request.text == "give up":
            raise asyncio.CancelledError  # raised, not cancelled: a failure like any other
        if request.text == "wrong":
            return 42  # type: ignore[return-value]  # not a model, a dict or None: a failure
        return Noted(text=request.text, before=before)

    @capability("later")
    async def later(self, request: Note, ctx: RequestContext) -> Noted:
        self.ran_in.append(_task_name())
        await asyncio.sleep(0)
        return Noted(text=request.text, before=SEEN.get())


async def _nothing() -> None:
    pass


def test_never_suspends_tells_a_handler_without_a_suspension_point() -> None:
    async def plain(x: int) -> int:
        return [y for y in range(x)][-1]

    async def awaits() -> None:
        await _nothing()

    async def async_with(lock: asyncio.Lock) -> None:
        async with lock:
            pass

    async def async_for(items: Any) -> None:
        async for _ in items:
            pass

    async def async_comprehension(items: Any) -> list[Any]:
        return [item async for item in items]

    assert never_suspends(plain)
    for suspends in (awaits, async_with, async_for, async_comprehension):
        assert not never_suspends(suspends), suspends.__name__
    assert not never_suspends(print)  # no code object: served in a task
    specs = collect_capabilities(Now)
    assert specs["note"].immediate
    assert not specs["later"].immediate


async def test_a_handler_that_never_awaits_answers_as_one_in_a_task(lobby: LobbyServer) -> None:
    async with Now(lobby_url=lobby.url) as now, Agent("caller", lobby_url=lobby.url) as me:
        for text in ("a", "b"):
            answer = await me.request("now", "note", {"text": text}, output_type=Noted)
            assert answer == Noted(text=text, before="unset")
        later = await me.request("now", "later", {"text": "c"}, output_type=Noted)
        assert later == Noted(text="c", before="unset")
        assert "_in_slot" not in now.ran_in[:2]  # served as read, not in a handler task
        assert now.ran_in[2] == "_in_slot"
        with pytest.raises(RemoteError) as refused:
            await me.request("now", "note", {"text": "refuse"})
        assert (refused.value.code, refused.value.message) == ("out_of_stock", "not that one")
        for failing in ("break", "give up", "wrong"):
            with pytest.raises(RemoteError) as broken:
                await me.request("now", "note", {"text": failing})
            assert broken.value.code == "internal"
        assert now.stats.handler_errors == 3
        with pytest.raises(InvalidInputError, match="text"):
            await me.request("now", "note", {"txt": "a"})
        assert SEEN.get() == "unset"  # nothing leaked into the reader's context either
