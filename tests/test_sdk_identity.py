"""An agent keeps its id across restarts (agent_sdk/identity.py), and a clean stop leaves
nothing behind: durable lobbies, real sockets, real agent processes."""

from __future__ import annotations

import asyncio
import stat
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent_sdk import (
    Agent,
    EnvTokenStore,
    FileTokenStore,
    MemoryTokenStore,
    MessageType,
    ReplacedError,
    RequestContext,
    TokenRefusedError,
    capability,
)
from agent_sdk.identity import lobby_key, state_dir
from lobby.admin import mailbox, open_readonly
from lobby.server import LobbyServer
from tests.conftest import LobbyProcess, make_lobby
from tests.sdklogs import sdk_events


def wait_for(predicate: Callable[[], bool], limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.05)


async def until(predicate: Callable[[], bool], limit: float = 10.0) -> None:
    async with asyncio.timeout(limit):
        while not predicate():
            await asyncio.sleep(0.02)


def arrivals(lobby: LobbyProcess, agent_id: str) -> list[str]:
    """How each connection of `agent_id` was admitted, in order, from the lobby's log."""
    kinds = ("AGENT_REGISTERED", "AGENT_RESUMED")
    return [
        str(e["event"])
        for e in lobby.events()
        if e.get("agent_id") == agent_id and e.get("event") in kinds
    ]


def held(data_dir: Path, agent_id: str) -> list[dict[str, Any]]:
    """`lobby mailbox AGENT_ID`: what the store still holds for the agent."""
    db = open_readonly(data_dir)
    try:
        return mailbox(db, agent_id)
    finally:
        db.close()


async def test_the_token_file_is_private_and_keyed_by_lobby(
    lobby: LobbyServer, tmp_path: Path, agent_state_dir: Path
) -> None:
    other = make_lobby(tmp_path / "other-lobby")
    await other.start()
    try:
        for url in (lobby.url, other.url):
            async with Agent("keeper", lobby_url=url) as first:
                assert first.stats.resumes == 0
            async with Agent("keeper", lobby_url=url) as again:
                assert again.stats.resumes == 1
    finally:
        await other.stop()
    assert state_dir() == agent_state_dir
    tokens = agent_state_dir / "tokens"
    files = sorted(tokens.glob("*/keeper.token"))
    assert [f.parent.name for f in files] == sorted([lobby.identity, other.identity])
    assert files[0].read_text() != files[1].read_text()
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o700
    assert [p.name for p in files[0].parent.iterdir()] == ["keeper.token"]  # no temporary left


def test_the_state_directory_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("AGENT_LOBBY_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_dir() == tmp_path / "xdg" / "agent-lobby"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")  # the XDG spec: absolute only
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state_dir() == tmp_path / "home" / ".local" / "state" / "agent-lobby"
    assert lobby_key("wss://lobby.example:9443/") == "lobby.example_9443"
    assert lobby_key("wss://lobby.example/") == "lobby.example_443"
    assert FileTokenStore(tmp_path).path("ws://[::1]:8765/", "a:b@c").name == "a%3Ab%40c.token"
    assert FileTokenStore(tmp_path).path("ws://h:1/", "..").parent == tmp_path / "tokens" / "h_1"


async def test_an_explicit_token_and_a_token_in_the_environment_resume(
    lobby: LobbyServer, monkeypatch: pytest.MonkeyPatch, agent_state_dir: Path
) -> None:
    memory = MemoryTokenStore()
    async with Agent("holder", lobby_url=lobby.url, token_store=memory) as first:
        assert first.stats.resumes == 0
    token = memory.load(lobby.identity, "holder")
    assert token is not None
    async with Agent("holder", lobby_url=lobby.url, token=token, token_store=None) as given:
        assert given.stats.resumes == 1
    monkeypatch.setenv("HOLDER_TOKEN", token)
    from_env = Agent("holder", lobby_url=lobby.url, token_store=EnvTokenStore("HOLDER_TOKEN"))
    async with from_env:
        assert from_env.stats.resumes == 1
    assert not agent_state_dir.exists()  # noqa: ASYNC240  # none of them wrote a file


async def test_a_refused_saved_token_names_the_file_and_what_to_do(lobby: LobbyServer) -> None:
    async with Agent("claimed", lobby_url=lobby.url, token_store=None):
        pass  # registered under a token nobody saved
    store = FileTokenStore()
    wrong = str(uuid.uuid4())
    store.save(lobby.identity, "claimed", wrong)
    with sdk_events() as logs, pytest.raises(TokenRefusedError) as caught:
        async with Agent("claimed", lobby_url=lobby.url):
            pass
    refused = caught.value
    assert (refused.code, refused.agent_id) == ("agent_id_taken", "claimed")
    assert refused.source == f"file {store.path(lobby.identity, 'claimed')}"
    assert str(store.path(lobby.identity, "claimed")) in str(refused)
    assert "another id" in str(refused)
    assert "`lobby remove claimed`" in str(refused)
    assert "no command" not in str(refused)
    assert wrong not in str(refused)
    assert wrong not in repr(logs)
    assert store.load(lobby.identity, "claimed") == wrong  # left as it was, for the user to judge


async def test_a_lobby_that_forgot_the_agent_issues_a_token_that_replaces_the_saved_one(
    lobby: LobbyServer,
) -> None:
    store = FileTokenStore()
    stale = str(uuid.uuid4())
    store.save(lobby.identity, "returning", stale)
    async with Agent("returning", lobby_url=lobby.url) as agent:
        assert agent.stats.resumes == 0
    fresh = store.load(lobby.identity, "returning")
    assert fresh is not None
    assert fresh != stale
    async with Agent("returning", lobby_url=lobby.url) as agent:
        assert agent.stats.resumes == 1


async def test_unregistering_deletes_the_saved_token(lobby: LobbyServer) -> None:
    store = FileTokenStore()
    agent = Agent("leaving", lobby_url=lobby.url)
    async with agent:
        assert store.load(lobby.identity, "leaving") is not None
        await agent.unregister()
    assert not store.path(lobby.identity, "leaving").exists()
    async with Agent("leaving", lobby_url=lobby.url) as back:  # a new agent under the id
        assert back.stats.resumes == 0


class Echo(Agent):
    @capability("echo", description="Returns its input.")
    async def echo(self, request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return request


async def test_a_second_copy_with_the_same_store_takes_over_and_the_first_stops(
    lobby: LobbyServer,
) -> None:
    first = Echo("twin", lobby_url=lobby.url)
    running = asyncio.create_task(first.run())
    await first.wait_connected(10)
    async with Echo("twin", lobby_url=lobby.url) as second, Agent("c", lobby_url=lobby.url) as c:
        assert second.stats.resumes == 1
        with pytest.raises(ReplacedError):
            await asyncio.wait_for(running, 10)
        assert first.stats.connects == 1  # it did not come back to take the id again
        assert await c.request("twin", "echo", {"n": 1}) == {"n": 1}


async def test_a_caller_that_exits_after_its_answer_leaves_an_empty_mailbox(
    lobby: LobbyServer,
) -> None:
    async with Echo("echo", lobby_url=lobby.url):
        for _ in range(3):
            async with Agent("my_client", lobby_url=lobby.url) as me:
                assert await me.request("echo", "echo", {"text": "hi"}) == {"text": "hi"}
            record = lobby.router.registry.get("my_client")
            assert record is not None
            assert list(record.mailbox) == []
    await lobby.stop()  # everything committed
    assert held(lobby.settings.data_dir, "my_client") == []


async def test_a_clean_stop_waits_for_the_lobby_to_accept_what_was_sent(
    lobby: LobbyServer,
) -> None:
    async with Agent("listener", lobby_url=lobby.url):
        pass  # registered, now offline: the lobby holds what it is sent
    talker = Agent("talker", lobby_url=lobby.url)
    async with talker:
        for n in range(50):
            await talker.send("listener", MessageType.TEXT, {"content": str(n)})
    assert len(talker._dispatcher.outbound) == 0  # every one ACCEPTED before the connection closed
    record = lobby.router.registry.get("listener")
    assert record is not None
    assert len(record.mailbox) == 50


async def test_the_clean_stop_wait_is_bounded_when_the_lobby_never_confirms(
    tmp_path: Path,
) -> None:
    lobby = make_lobby(tmp_path / "data")
    await lobby.start()
    talker = Agent("talker", lobby_url=lobby.url, stop_timeout=0.3, reconnect_max_delay=0.5)
    try:
        await talker.__aenter__()
        async with Agent("listener", lobby_url=lobby.url):
            pass
    finally:
        await lobby.stop()
    await until(lambda: not talker._sender.connected.is_set())
    await talker.send("listener", MessageType.TEXT, {"content": "never confirmed"})
    with sdk_events() as logs:
        async with asyncio.timeout(10):  # a hang guard: the wait itself is 0.3 s
            await talker.stop()
    assert len(talker._dispatcher.outbound) == 1
    assert {"event": "STOPPED_UNCONFIRMED", "agent_id": "talker", "count": 1} in [
        {k: e[k] for k in ("event", "agent_id", "count") if k in e} for e in logs
    ]
