"""Deadlines against a real lobby (PROTOCOL.md §5.2): `request(timeout=)` goes out as
`timeout_ms`; past the deadline the lobby answers `timeout` (RemoteTimeoutError), CANCELs a
provider at work (its handler is cancelled, `ctx.cancelled` set, and its late RESPONSE refused
without a warning), and drops a REQUEST held for an offline provider; a deadline survives a
restart of the lobby."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent_sdk import Agent, MemoryTokenStore, RemoteTimeoutError, RequestContext, capability
from lobby.server import LobbyServer
from protocol.models import MessageType
from tests.conftest import make_lobby
from tests.sdklogs import sdk_events


class Worker(Agent):
    """Works until told to stop; remembers what it was asked and how it ended."""

    agent_id = "worker"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.started = asyncio.Event()
        self.stopped = asyncio.Event()
        self.contexts: list[RequestContext] = []

    @capability("work")
    async def work(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        self.contexts.append(ctx)
        self.started.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.stopped.set()
        return {}  # pragma: no cover


async def test_a_deadline_passing_while_the_provider_works_cancels_it(
    lobby: LobbyServer,
) -> None:
    async with Worker(lobby_url=lobby.url) as worker, Agent("caller", lobby_url=lobby.url) as me:
        with sdk_events() as events:
            with pytest.raises(RemoteTimeoutError) as caught:
                await me.request("worker", "work", {}, timeout=0.3, conversation_id="c-1")
            assert caught.value.code == "timeout"
            assert caught.value.message.endswith("within 300 ms")
            await asyncio.wait_for(worker.stopped.wait(), 5)
            (ctx,) = worker.contexts
            assert ctx.cancelled.is_set()
            assert ctx.deadline is not None
            # A RESPONSE sent anyway is refused (`unknown_conversation`), and quietly: the
            # worker's next question to the lobby is answered after that refusal.
            await worker.send(
                "caller", MessageType.RESPONSE, {"status": "success"}, conversation_id="c-1"
            )
            await worker.discover("work")
        assert [e for e in events if e["event"] == "LOBBY_ERROR"] == []
        cancelled = [e for e in events if e["event"] == "REQUEST_CANCELLED"]
        assert cancelled[0]["reason"] == "deadline"
        assert lobby.router.conversations == {}


async def test_a_request_held_for_an_offline_provider_is_dropped_at_its_deadline(
    lobby: LobbyServer,
) -> None:
    tokens = MemoryTokenStore()
    async with Worker(lobby_url=lobby.url, token_store=tokens):
        pass  # registered, now offline
    async with Agent("caller", lobby_url=lobby.url) as me:
        with pytest.raises(RemoteTimeoutError):
            await me.request("worker", "work", {}, timeout=0.2)
    received: list[MessageType] = []

    class Back(Worker):
        async def on_message(self, message: Any) -> None:
            received.append(message.message_type)

    async with Back(lobby_url=lobby.url, token_store=tokens) as back:
        await back.discover("work")  # answered after anything held was written
        assert back.contexts == []
        assert received == []  # no CANCEL either: it never had the REQUEST


async def test_a_final_response_in_time_is_the_answer(lobby: LobbyServer) -> None:
    class Quick(Agent):
        agent_id = "quick"

        @capability("now")
        async def now(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
            return {"deadline": ctx.deadline}

    async with Quick(lobby_url=lobby.url), Agent("caller", lobby_url=lobby.url) as me:
        answer = await me.request("quick", "now", {}, timeout=30)
        assert answer["deadline"] is not None
        assert (await me.request("quick", "now", {})) == {"deadline": None}
    assert lobby.router.requests.deadlines.open == {}


async def test_a_deadline_survives_a_restart_of_the_lobby(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = make_lobby(data_dir)
    await first.start()
    tokens = MemoryTokenStore()
    async with Worker(lobby_url=first.url, token_store=tokens):
        pass  # registered, now offline
    async with Agent("caller", lobby_url=first.url, token_store=tokens) as me:
        call = asyncio.create_task(me.request("worker", "work", {}, timeout=1.0))
        await asyncio.sleep(0.1)  # the REQUEST is in (a commit is 2 ms), held for the worker
        port = int(first.url.rsplit(":", 1)[1].strip("/"))
        await first.stop()
        second = make_lobby(data_dir, port=port)
        await second.start()
        try:
            assert second.router.requests.deadlines.open != {}
            with pytest.raises(RemoteTimeoutError):
                await asyncio.wait_for(call, 10)  # the caller resumed; the deadline fired
            async with Worker(lobby_url=second.url, token_store=tokens) as worker:
                await worker.discover("work")
                assert worker.contexts == []
        finally:
            await second.stop()
