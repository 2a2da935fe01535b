"""Reconnect and resume: dropped connections and a killed lobby, with real processes."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from agent_sdk import Agent, LobbyUnreachableError, RequestContext, Status, capability
from agent_sdk.connection import lobby_urls
from lobby.server import LobbyServer
from lobby.transport.base import Link
from tests.conftest import start_lobby_process
from tests.natskit import free_port
from tests.waiting import until


class SlowWorker(Agent):
    agent_id = "slow_worker"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(reconnect_max_delay=0.5, **kwargs)
        self.started = 0
        self.release = asyncio.Event()

    @capability("work", description="Waits until released, then answers.")
    async def work(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        self.started += 1
        await self.release.wait()
        return {"done": request["job"]}


async def test_pending_request_survives_the_callers_reconnect(lobby: LobbyServer) -> None:
    """The caller's connection drops mid-call; it resumes with its token, the RESPONSE held by
    the lobby meanwhile is delivered, and the waiting request() completes."""
    async with (
        SlowWorker(lobby_url=lobby.url) as worker,
        Agent("caller", lobby_url=lobby.url, reconnect_max_delay=0.5) as caller,
    ):
        call = asyncio.create_task(caller.request("slow_worker", "work", {"job": 7}, timeout=10))
        await until(lambda: worker.started == 1)
        record = lobby.router.registry.get("caller")
        assert record is not None
        assert record.session is not None
        link: Link = record.session.link  # type: ignore[assignment]
        closing = link.shut(1001, "dropped by the test")
        if closing is not None:
            await closing
        worker.release.set()
        assert await call == {"done": 7}
        assert caller.stats.reconnects == 1
        assert caller.stats.resumes == 1
        assert caller.status is Status.CONNECTED
        assert worker.started == 1


async def test_killed_lobby_restarts_and_agents_come_back_by_themselves(tmp_path: Path) -> None:
    """kill -9 of the lobby mid-call: both agents reconnect and resume by themselves, the
    REQUEST's conversation survived in the store, and the pending call completes, once."""
    first = start_lobby_process(tmp_path)
    second = None
    try:
        async with (
            SlowWorker(lobby_url=first.url) as worker,
            Agent("caller", lobby_url=first.url, reconnect_max_delay=0.5) as caller,
        ):
            call = asyncio.create_task(
                caller.request("slow_worker", "work", {"job": 1}, timeout=15)
            )
            await until(lambda: worker.started == 1)
            await until(lambda: len(caller._dispatcher.outbound) == 0)  # the REQUEST is committed
            first.signal(signal.SIGKILL)
            first.wait(5)
            second = start_lobby_process(tmp_path, port=first.port)
            await until(lambda: caller.stats.resumes == 1 and worker.stats.resumes == 1)
            worker.release.set()
            assert await call == {"done": 1}
            assert worker.started == 1
            assert caller.stats.reconnects == worker.stats.reconnects == 1
            assert await caller.request("slow_worker", "work", {"job": 2}) == {"done": 2}
    finally:
        for proc in (first, second):
            if proc is not None and proc.process.poll() is None:
                proc.signal(signal.SIGTERM)
                proc.wait(5)


async def test_agents_given_several_lobby_urls_move_to_the_next_one_and_resume(
    tmp_path: Path,
) -> None:
    """Two addresses of one lobby's state (as the nodes of a cluster are): the first is killed
    mid-call and the state comes up at the second address; both agents fail on the first,
    move on to the second by themselves, resume with their tokens, and the call completes."""
    first = start_lobby_process(tmp_path)
    second_port = free_port()
    urls = [first.url, f"ws://127.0.0.1:{second_port}/"]
    second = None
    try:
        async with (
            SlowWorker(lobby_url=urls) as worker,
            Agent("caller", lobby_url=",".join(urls), reconnect_max_delay=0.5) as caller,
        ):
            assert caller.lobby_urls == worker.lobby_urls == tuple(urls)
            call = asyncio.create_task(
                caller.request("slow_worker", "work", {"job": 1}, timeout=15)
            )
            await until(lambda: worker.started == 1)
            await until(lambda: len(caller._dispatcher.outbound) == 0)  # the REQUEST is committed
            first.signal(signal.SIGKILL)
            first.wait(5)
            second = start_lobby_process(tmp_path, port=second_port)
            await until(lambda: caller.stats.resumes == 1 and worker.stats.resumes == 1)
            worker.release.set()
            assert await call == {"done": 1}
            assert worker.started == 1
            assert await caller.request("slow_worker", "work", {"job": 2}) == {"done": 2}
    finally:
        for proc in (first, second):
            if proc is not None and proc.process.poll() is None:
                proc.signal(signal.SIGTERM)
                proc.wait(5)


def test_lobby_urls_come_as_a_list_or_comma_separated() -> None:
    assert lobby_urls("ws://a:1/, ws://b:2/,") == ("ws://a:1/", "ws://b:2/")
    assert lobby_urls(["ws://a:1/"]) == ("ws://a:1/",)
    with pytest.raises(ValueError, match="no lobby URL"):
        lobby_urls(" , ")


async def test_a_lobby_url_that_cannot_work_fails_at_once(lobby: LobbyServer) -> None:
    """A 4xx answer to the handshake (here: a path the lobby does not serve) is not retried."""
    with pytest.raises(LobbyUnreachableError, match="404"):
        async with Agent("lost", lobby_url=lobby.url + "nowhere", connect_timeout=10):
            pass
